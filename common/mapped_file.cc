#include "common/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <utility>

#include "common/strings.h"

namespace pd {

absl::StatusOr<MappedFile> MappedFile::Open(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    int err = errno;
    std::string msg = pd::StrCat("cannot open '", path, "': ", std::strerror(err));
    return err == ENOENT ? absl::NotFoundError(msg) : absl::PermissionDeniedError(msg);
  }
  absl::StatusOr<MappedFile> f = MapFd(fd, path);
  ::close(fd);
  return f;
}

absl::StatusOr<MappedFile> MappedFile::MapFd(int fd, const std::string& what) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    return absl::InternalError(pd::StrCat("cannot stat '", what, "'"));
  }
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(pd::StrCat("'", what, "' is not a regular file"));
  }
  MappedFile f;
  f.size_ = static_cast<size_t>(st.st_size);
  if (f.size_ > 0) {
    void* p = ::mmap(nullptr, f.size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      return absl::InternalError(pd::StrCat("mmap of '", what, "' failed: ", std::strerror(errno)));
    }
    f.data_ = static_cast<const uint8_t*>(p);
    f.owned_ = true;
  }
  return f;
}

void MappedFile::DropPages(const void* p, size_t n) const {
  const auto begin = reinterpret_cast<uintptr_t>(p);
  const auto base = reinterpret_cast<uintptr_t>(data_);
  if (!owned_ || data_ == nullptr || begin < base || n > size_ || begin - base > size_ - n) return;
  const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t first = (begin + page - 1) / page * page;
  const uintptr_t last = (begin + n) / page * page;
  if (last > first) (void)::madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED);
}

MappedFile MappedFile::Borrow(const void* data, size_t size) {
  MappedFile f;
  f.data_ = static_cast<const uint8_t*>(data);
  f.size_ = size;
  return f;
}

MappedFile::MappedFile(MappedFile&& other) noexcept { *this = std::move(other); }

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    if (owned_ && data_) ::munmap(const_cast<uint8_t*>(data_), size_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    owned_ = std::exchange(other.owned_, false);
  }
  return *this;
}

MappedFile::~MappedFile() {
  if (owned_ && data_) ::munmap(const_cast<uint8_t*>(data_), size_);
}

}  // namespace pd
