// Read-only memory map of a whole file. Move-only; unmaps on destruction.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace pd {

class MappedFile {
 public:
  // Maps `path` read-only. NOT_FOUND if missing, INVALID_ARGUMENT if a directory, INTERNAL on
  // mmap failure. An empty file maps to data() == nullptr, size() == 0.
  static absl::StatusOr<MappedFile> Open(const std::string& path);
  // Wraps a caller-owned byte range without mapping (used by the fuzzer and tests).
  static MappedFile Borrow(const void* data, size_t size);
  // Maps the whole of an open file (regular or memfd) read-only; `what` names it in errors. The
  // map does not keep `fd`: the caller still closes it.
  static absl::StatusOr<MappedFile> MapFd(int fd, const std::string& what);

  MappedFile() = default;
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  // Drops this process's pages of the whole 4 KiB pages inside [p, p + n) (MADV_DONTNEED): the
  // file's bytes stay in the page cache and a later read faults them in again, so the contents
  // never change. For bytes copied elsewhere (weights a backend holds in its own memory), so that
  // they do not count twice in the resident set. No-op for borrowed memory or a range outside.
  void DropPages(const void* p, size_t n) const;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  bool owned_ = false;
};

}  // namespace pd
