#include "engine/quant/quantize/gguf_writer.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "common/status.h"
#include "common/strings.h"

namespace pd::engine::quantize {
namespace {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF"
constexpr uint32_t kVersion = 3;

template <typename T>
void Append(std::string* s, T v) {
  s->append(reinterpret_cast<const char*>(&v), sizeof(T));
}
void AppendStr(std::string* s, std::string_view v) {
  Append<uint64_t>(s, v.size());
  s->append(v.data(), v.size());
}


// The payload bytes of a scalar as GgufFile widened it (exact: every narrowing below inverts a
// widening).
void AppendScalar(std::string* s, const GgufValue& v) {
  switch (v.type) {
    case GgufValueType::kUint8:
      Append<uint8_t>(s, static_cast<uint8_t>(v.u));
      break;
    case GgufValueType::kInt8:
      Append<int8_t>(s, static_cast<int8_t>(v.i));
      break;
    case GgufValueType::kBool:
      Append<uint8_t>(s, v.i != 0);
      break;
    case GgufValueType::kUint16:
      Append<uint16_t>(s, static_cast<uint16_t>(v.u));
      break;
    case GgufValueType::kInt16:
      Append<int16_t>(s, static_cast<int16_t>(v.i));
      break;
    case GgufValueType::kUint32:
      Append<uint32_t>(s, static_cast<uint32_t>(v.u));
      break;
    case GgufValueType::kInt32:
      Append<int32_t>(s, static_cast<int32_t>(v.i));
      break;
    case GgufValueType::kFloat32:
      Append<float>(s, static_cast<float>(v.f));
      break;
    case GgufValueType::kUint64:
      Append<uint64_t>(s, v.u);
      break;
    case GgufValueType::kInt64:
      Append<int64_t>(s, v.i);
      break;
    case GgufValueType::kFloat64:
      Append<double>(s, v.f);
      break;
    case GgufValueType::kString:
      AppendStr(s, v.str);
      break;
    case GgufValueType::kArray:
      PD_CHECK(false);
  }
}

absl::Status ErrnoStatus(std::string_view what, const std::string& path, int err) {
  const std::string msg = pd::StrCat("cannot ", what, " '", path, "': ", std::strerror(err));
  switch (err) {
    case EACCES:
    case EPERM:
    case EROFS:
      return absl::PermissionDeniedError(msg);
    case ENOENT:
    case ENOTDIR:
      return absl::NotFoundError(msg);
    case EISDIR:
      return absl::FailedPreconditionError(msg);
    default:
      return absl::InternalError(msg);
  }
}

}  // namespace

GgufWriter::GgufWriter(uint64_t alignment) : alignment_(alignment) {
  PD_CHECK(alignment > 0 && (alignment & (alignment - 1)) == 0);
}

GgufWriter::~GgufWriter() { Abandon(); }

void GgufWriter::Put(std::string_view key, uint32_t type, std::string payload) {
  PD_CHECK_MSG(fd_ < 0, "GgufWriter: metadata changed after Open()");
  for (Kv& kv : kvs_) {
    if (kv.key == key) {
      kv.type = type;
      kv.payload = std::move(payload);
      return;
    }
  }
  kvs_.push_back(Kv{std::string(key), type, std::move(payload)});
}

absl::Status GgufWriter::CopyKv(std::string_view key, const GgufValue& v) {
  std::string p;
  if (v.type != GgufValueType::kArray) {
    AppendScalar(&p, v);
  } else {
    Append<uint32_t>(&p, static_cast<uint32_t>(v.elem_type));
    Append<uint64_t>(&p, v.count);
    if (v.elem_type == GgufValueType::kString) {
      for (std::string_view s : v.strings) AppendStr(&p, s);
    } else if (const size_t es = GgufScalarSize(v.elem_type); es > 0) {
      p.append(reinterpret_cast<const char*>(v.raw), v.count * es);
    } else {
      return absl::UnimplementedError(
          pd::StrCat("GGUF key '", key, "': arrays of arrays cannot be copied"));
    }
  }
  Put(key, static_cast<uint32_t>(v.type), std::move(p));
  return absl::OkStatus();
}

void GgufWriter::SetU32(std::string_view key, uint32_t v) {
  std::string p;
  Append<uint32_t>(&p, v);
  Put(key, static_cast<uint32_t>(GgufValueType::kUint32), std::move(p));
}

void GgufWriter::SetF32(std::string_view key, float v) {
  std::string p;
  Append<float>(&p, v);
  Put(key, static_cast<uint32_t>(GgufValueType::kFloat32), std::move(p));
}

void GgufWriter::SetBool(std::string_view key, bool v) {
  std::string p;
  Append<uint8_t>(&p, v ? 1 : 0);
  Put(key, static_cast<uint32_t>(GgufValueType::kBool), std::move(p));
}

void GgufWriter::SetString(std::string_view key, std::string_view v) {
  std::string p;
  AppendStr(&p, v);
  Put(key, static_cast<uint32_t>(GgufValueType::kString), std::move(p));
}

void GgufWriter::SetU8Array(std::string_view key, std::string_view bytes) {
  std::string p;
  Append<uint32_t>(&p, static_cast<uint32_t>(GgufValueType::kUint8));
  Append<uint64_t>(&p, bytes.size());
  p.append(bytes);
  Put(key, static_cast<uint32_t>(GgufValueType::kArray), std::move(p));
}

void GgufWriter::SetI32Array(std::string_view key, const std::vector<int32_t>& v) {
  std::string p;
  Append<uint32_t>(&p, static_cast<uint32_t>(GgufValueType::kInt32));
  Append<uint64_t>(&p, v.size());
  for (int32_t x : v) Append<int32_t>(&p, x);
  Put(key, static_cast<uint32_t>(GgufValueType::kArray), std::move(p));
}

void GgufWriter::SetF32Array(std::string_view key, const std::vector<float>& v) {
  std::string p;
  Append<uint32_t>(&p, static_cast<uint32_t>(GgufValueType::kFloat32));
  Append<uint64_t>(&p, v.size());
  for (float x : v) Append<float>(&p, x);
  Put(key, static_cast<uint32_t>(GgufValueType::kArray), std::move(p));
}

void GgufWriter::SetStringArray(std::string_view key, const std::vector<std::string>& v) {
  std::string p;
  Append<uint32_t>(&p, static_cast<uint32_t>(GgufValueType::kString));
  Append<uint64_t>(&p, v.size());
  for (const std::string& x : v) AppendStr(&p, x);
  Put(key, static_cast<uint32_t>(GgufValueType::kArray), std::move(p));
}

bool GgufWriter::HasKv(std::string_view key) const {
  for (const Kv& kv : kvs_) {
    if (kv.key == key) return true;
  }
  return false;
}

size_t GgufWriter::AddTensor(std::string_view name, DType type, const std::vector<int64_t>& shape) {
  PD_CHECK_MSG(fd_ < 0, "GgufWriter: tensor added after Open()");
  PD_CHECK(!shape.empty());
  int64_t rows = 1;
  for (size_t d = 1; d < shape.size(); ++d) rows *= shape[d];
  TensorInfo t{std::string(name), type, shape, RowBytes(type, shape[0]) * rows, 0};
  t.offset = (data_bytes_ + alignment_ - 1) / alignment_ * alignment_;
  data_bytes_ = t.offset + t.bytes;
  tensors_.push_back(std::move(t));
  return tensors_.size() - 1;
}

std::string GgufWriter::Header() const {
  std::string h;
  Append<uint32_t>(&h, kMagic);
  Append<uint32_t>(&h, kVersion);
  Append<uint64_t>(&h, tensors_.size());
  Append<uint64_t>(&h, kvs_.size());
  for (const Kv& kv : kvs_) {
    AppendStr(&h, kv.key);
    Append<uint32_t>(&h, kv.type);
    h += kv.payload;
  }
  for (const TensorInfo& t : tensors_) {
    AppendStr(&h, t.name);
    Append<uint32_t>(&h, static_cast<uint32_t>(t.shape.size()));
    for (int64_t d : t.shape) Append<uint64_t>(&h, static_cast<uint64_t>(d));
    Append<uint32_t>(&h, static_cast<uint32_t>(t.type));
    Append<uint64_t>(&h, t.offset);
  }
  return h;
}

uint64_t GgufWriter::DataStart() const {
  const uint64_t n = Header().size();
  return (n + alignment_ - 1) / alignment_ * alignment_;
}

uint64_t GgufWriter::FileSize() const {
  return DataStart() + (data_bytes_ + alignment_ - 1) / alignment_ * alignment_;
}

absl::Status GgufWriter::Open(const std::string& path) {
  PD_CHECK_MSG(fd_ < 0, "GgufWriter: opened twice");
  path_ = path;
  tmp_path_ = path + ".tmp";
  fd_ = ::open(tmp_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) {
    const int err = errno;
    tmp_path_.clear();
    return ErrnoStatus("create", path + ".tmp", err);
  }
  std::string h = Header();
  data_start_ = (h.size() + alignment_ - 1) / alignment_ * alignment_;
  h.resize(data_start_, '\0');
  return WriteAt(0, h.data(), h.size());
}

absl::Status GgufWriter::OpenMemory(const std::string& name) {
  PD_CHECK_MSG(fd_ < 0, "GgufWriter: opened twice");
  fd_ = ::memfd_create(name.c_str(), MFD_CLOEXEC);
  if (fd_ < 0) return ErrnoStatus("create in-memory file", name, errno);
  in_memory_ = true;
  tmp_path_ = name;  // names the file in errors; never unlinked (see Abandon)
  std::string h = Header();
  data_start_ = (h.size() + alignment_ - 1) / alignment_ * alignment_;
  h.resize(data_start_, '\0');
  return WriteAt(0, h.data(), h.size());
}

absl::StatusOr<MappedFile> GgufWriter::CommitToMemory() {
  PD_CHECK_MSG(fd_ >= 0 && in_memory_, "GgufWriter: CommitToMemory without OpenMemory()");
  absl::StatusOr<MappedFile> map;
  if (::ftruncate(fd_, static_cast<off_t>(FileSize())) != 0) {
    map = ErrnoStatus("resize", tmp_path_, errno);
  } else {
    map = MappedFile::MapFd(fd_, tmp_path_);
  }
  ::close(fd_);
  fd_ = -1;
  committed_ = true;
  tmp_path_.clear();
  return map;
}

absl::Status GgufWriter::WriteAt(uint64_t offset, const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::pwrite(fd_, p, n, static_cast<off_t>(offset));
    if (w < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus("write", tmp_path_, errno);
    }
    p += w, n -= static_cast<size_t>(w), offset += static_cast<uint64_t>(w);
  }
  return absl::OkStatus();
}

absl::Status GgufWriter::WriteTensor(size_t i, const void* data, size_t n) {
  PD_CHECK_MSG(fd_ >= 0, "GgufWriter: WriteTensor before Open()");
  PD_CHECK(i < tensors_.size());
  PD_CHECK_MSG(n == tensors_[i].bytes, "GgufWriter: tensor data of the wrong size");
  return WriteAt(data_start_ + tensors_[i].offset, data, n);
}

absl::Status GgufWriter::WriteTensorPart(size_t i, uint64_t offset, const void* data, size_t n) {
  PD_CHECK_MSG(fd_ >= 0, "GgufWriter: WriteTensorPart before Open()");
  PD_CHECK(i < tensors_.size());
  PD_CHECK_MSG(offset <= tensors_[i].bytes && n <= tensors_[i].bytes - offset,
               "GgufWriter: tensor part out of range");
  return WriteAt(data_start_ + tensors_[i].offset + offset, data, n);
}

absl::Status GgufWriter::Commit() {
  PD_CHECK_MSG(fd_ >= 0 && !in_memory_, "GgufWriter: Commit before Open()");
  absl::Status s;
  // ftruncate zero-fills the gaps between tensors (never written) and pads the end.
  if (::ftruncate(fd_, static_cast<off_t>(FileSize())) != 0) {
    s = ErrnoStatus("resize", tmp_path_, errno);
  } else if (::fsync(fd_) != 0) {
    s = ErrnoStatus("flush", tmp_path_, errno);
  }
  if (::close(fd_) != 0 && s.ok()) s = ErrnoStatus("close", tmp_path_, errno);
  fd_ = -1;
  if (s.ok() && std::rename(tmp_path_.c_str(), path_.c_str()) != 0) {
    s = ErrnoStatus("rename onto", path_, errno);
  }
  if (!s.ok()) {
    Abandon();
    return s;
  }
  committed_ = true;
  tmp_path_.clear();
  return absl::OkStatus();
}

void GgufWriter::Abandon() {
  if (fd_ >= 0) {
    ::close(fd_);
    fd_ = -1;
  }
  if (!committed_ && !in_memory_ && !tmp_path_.empty()) {
    ::unlink(tmp_path_.c_str());
    tmp_path_.clear();
  }
}

}  // namespace pd::engine::quantize
