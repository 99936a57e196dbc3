// Test-only GGUF writer: builds GGUF files byte by byte so tests can craft valid files and
// precisely malformed ones (wrong counts, lengths, offsets, types). Written from the GGUF spec;
// it validates nothing, by design.
//
// Layout it produces:
//   magic u32 | version u32 | n_tensors u64 | n_kv u64 | kv entries | tensor infos |
//   zero padding to `alignment` | data section (each tensor at data_start + offset)
#pragma once

#include <bit>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/model/gguf.h"

namespace pd::engine::testing {

static_assert(std::endian::native == std::endian::little, "the builder writes host byte order");

inline constexpr uint32_t kGgufMagic = 0x46554747;  // "GGUF"
// ggml type ids used by the tests.
inline constexpr uint32_t kTypeF32 = 0, kTypeF16 = 1, kTypeQ8_0 = 8, kTypeBF16 = 30;

// Little-endian byte builder.
class Bytes {
 public:
  Bytes& Raw(const void* p, size_t n) {
    buf_.append(static_cast<const char*>(p), n);
    return *this;
  }
  template <typename T>
  Bytes& Put(T v) {
    return Raw(&v, sizeof(T));
  }
  Bytes& U8(uint8_t v) { return Put(v); }
  Bytes& U16(uint16_t v) { return Put(v); }
  Bytes& U32(uint32_t v) { return Put(v); }
  Bytes& U64(uint64_t v) { return Put(v); }
  Bytes& I8(int8_t v) { return Put(v); }
  Bytes& I16(int16_t v) { return Put(v); }
  Bytes& I32(int32_t v) { return Put(v); }
  Bytes& I64(int64_t v) { return Put(v); }
  Bytes& F32(float v) { return Put(v); }
  Bytes& F64(double v) { return Put(v); }
  // GGUF string: u64 length, then the bytes (no terminator).
  Bytes& Str(std::string_view s) {
    U64(s.size());
    return Raw(s.data(), s.size());
  }
  Bytes& Append(const Bytes& b) { return Raw(b.buf_.data(), b.buf_.size()); }
  Bytes& Zeros(size_t n) {
    buf_.append(n, '\0');
    return *this;
  }
  Bytes& PadTo(size_t alignment) {
    return Zeros((alignment - buf_.size() % alignment) % alignment);
  }
  size_t size() const { return buf_.size(); }
  const std::string& str() const { return buf_; }

 private:
  std::string buf_;
};

// Bytes of a tensor of the given raw ggml type, or 0 for types the builder does not size.
inline uint64_t TensorBytes(uint32_t type, const std::vector<uint64_t>& dims) {
  uint64_t n = 1;
  for (uint64_t d : dims) n *= d;
  switch (type) {
    case kTypeF32:
      return n * 4;
    case kTypeF16:
    case kTypeBF16:
      return n * 2;
    case kTypeQ8_0:
      return n / 32 * 34;
    default:
      return 0;
  }
}

inline uint64_t AlignUp(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

struct TensorSpec {
  std::string name;
  std::vector<uint64_t> dims;
  uint32_t type = kTypeF32;
  std::optional<uint64_t> offset;   // default: packed after the previous tensor, aligned
  std::optional<std::string> data;  // default: TensorBytes() of a byte pattern
};

class GgufBuilder {
 public:
  explicit GgufBuilder(uint32_t version = 3) : version_(version) {}

  // ---- header overrides (for malformed files) ----
  GgufBuilder& Magic(uint32_t m) {
    magic_ = m;
    return *this;
  }
  GgufBuilder& TensorCount(uint64_t n) {
    n_tensors_ = n;
    return *this;
  }
  GgufBuilder& KvCount(uint64_t n) {
    n_kv_ = n;
    return *this;
  }
  // Alignment used for padding and default offsets. Does NOT write general.alignment.
  GgufBuilder& Alignment(uint64_t a) {
    alignment_ = a;
    return *this;
  }
  // Leaves the data section out entirely (header only).
  GgufBuilder& OmitData() {
    omit_data_ = true;
    return *this;
  }

  // ---- metadata ----
  // A raw entry: key, type id, then `payload` as the value bytes.
  GgufBuilder& Kv(std::string_view key, uint32_t type, const Bytes& payload) {
    Bytes b;
    b.Str(key).U32(type).Append(payload);
    kvs_.push_back(b.str());
    return *this;
  }
  GgufBuilder& Kv(std::string_view key, GgufValueType type, const Bytes& payload) {
    return Kv(key, static_cast<uint32_t>(type), payload);
  }
  GgufBuilder& U8(std::string_view k, uint8_t v) {
    return Kv(k, GgufValueType::kUint8, Bytes().U8(v));
  }
  GgufBuilder& I8(std::string_view k, int8_t v) {
    return Kv(k, GgufValueType::kInt8, Bytes().I8(v));
  }
  GgufBuilder& U16(std::string_view k, uint16_t v) {
    return Kv(k, GgufValueType::kUint16, Bytes().U16(v));
  }
  GgufBuilder& I16(std::string_view k, int16_t v) {
    return Kv(k, GgufValueType::kInt16, Bytes().I16(v));
  }
  GgufBuilder& U32(std::string_view k, uint32_t v) {
    return Kv(k, GgufValueType::kUint32, Bytes().U32(v));
  }
  GgufBuilder& I32(std::string_view k, int32_t v) {
    return Kv(k, GgufValueType::kInt32, Bytes().I32(v));
  }
  GgufBuilder& U64(std::string_view k, uint64_t v) {
    return Kv(k, GgufValueType::kUint64, Bytes().U64(v));
  }
  GgufBuilder& I64(std::string_view k, int64_t v) {
    return Kv(k, GgufValueType::kInt64, Bytes().I64(v));
  }
  GgufBuilder& F32(std::string_view k, float v) {
    return Kv(k, GgufValueType::kFloat32, Bytes().F32(v));
  }
  GgufBuilder& F64(std::string_view k, double v) {
    return Kv(k, GgufValueType::kFloat64, Bytes().F64(v));
  }
  GgufBuilder& Bool(std::string_view k, bool v) {
    return Kv(k, GgufValueType::kBool, Bytes().U8(v));
  }
  GgufBuilder& Str(std::string_view k, std::string_view v) {
    return Kv(k, GgufValueType::kString, Bytes().Str(v));
  }
  // Numeric array: element type id, count, then each value written as T.
  template <typename T>
  GgufBuilder& Array(std::string_view k, GgufValueType elem, const std::vector<T>& values) {
    Bytes b;
    b.U32(static_cast<uint32_t>(elem)).U64(values.size());
    for (const T& v : values) b.Put(v);
    return Kv(k, GgufValueType::kArray, b);
  }
  GgufBuilder& StrArray(std::string_view k, const std::vector<std::string>& values) {
    Bytes b;
    b.U32(static_cast<uint32_t>(GgufValueType::kString)).U64(values.size());
    for (const std::string& v : values) b.Str(v);
    return Kv(k, GgufValueType::kArray, b);
  }

  // ---- tensors ----
  GgufBuilder& Tensor(TensorSpec t) {
    tensors_.push_back(std::move(t));
    return *this;
  }
  GgufBuilder& Tensor(std::string name, std::vector<uint64_t> dims, uint32_t type = kTypeF32) {
    return Tensor(TensorSpec{std::move(name), std::move(dims), type, std::nullopt, std::nullopt});
  }
  // Appends raw bytes in place of a tensor info (for malformed infos).
  GgufBuilder& RawTensorInfo(const Bytes& b) {
    raw_infos_.push_back(b.str());
    return *this;
  }

  // Bytes up to the end of the tensor infos (before padding).
  size_t HeaderSize() const { return Header().size(); }
  // Where the data section starts.
  uint64_t DataStart() const { return AlignUp(HeaderSize(), alignment_); }
  // Offsets the tensors get (explicit or packed).
  std::vector<uint64_t> Offsets() const {
    std::vector<uint64_t> out;
    uint64_t next = 0;
    for (const TensorSpec& t : tensors_) {
      const uint64_t off = t.offset ? *t.offset : AlignUp(next, alignment_);
      out.push_back(off);
      next = off + DataSize(t);
    }
    return out;
  }

  std::string Build() const {
    Bytes b = Header();
    if (tensors_.empty() || omit_data_) return b.str();
    b.PadTo(alignment_);
    std::string data;
    const std::vector<uint64_t> offsets = Offsets();
    for (size_t i = 0; i < tensors_.size(); ++i) {
      const std::string d = DataOf(tensors_[i], i);
      // Offsets far beyond any test file are written into the info only.
      if (offsets[i] > (1u << 24)) continue;
      if (data.size() < offsets[i] + d.size()) data.resize(offsets[i] + d.size(), '\0');
      data.replace(offsets[i], d.size(), d);
    }
    b.Raw(data.data(), data.size());
    return b.str();
  }

  // The pattern byte j of default tensor i holds.
  static char PatternByte(size_t tensor, size_t j) {
    return static_cast<char>(tensor * 31 + j * 7 + 1);
  }

 private:
  // Tensors too large for a test file (the huge-dimension cases) get no data.
  static uint64_t DataSize(const TensorSpec& t) {
    if (t.data) return t.data->size();
    uint64_t numel = 1;
    for (uint64_t d : t.dims) {
      if (d > (1u << 24) || numel * d > (1u << 24)) return 0;
      numel *= d;
    }
    const uint64_t n = TensorBytes(t.type, t.dims);
    return n > (1u << 24) ? 0 : n;
  }
  static std::string DataOf(const TensorSpec& t, size_t index) {
    if (t.data) return *t.data;
    std::string d(DataSize(t), '\0');
    for (size_t j = 0; j < d.size(); ++j) d[j] = PatternByte(index, j);
    return d;
  }

  Bytes Header() const {
    Bytes b;
    b.U32(magic_).U32(version_);
    b.U64(n_tensors_ ? *n_tensors_ : tensors_.size() + raw_infos_.size());
    b.U64(n_kv_ ? *n_kv_ : kvs_.size());
    for (const std::string& kv : kvs_) b.Raw(kv.data(), kv.size());
    const std::vector<uint64_t> offsets = Offsets();
    for (size_t i = 0; i < tensors_.size(); ++i) {
      const TensorSpec& t = tensors_[i];
      b.Str(t.name).U32(static_cast<uint32_t>(t.dims.size()));
      for (uint64_t d : t.dims) b.U64(d);
      b.U32(t.type).U64(offsets[i]);
    }
    for (const std::string& r : raw_infos_) b.Raw(r.data(), r.size());
    return b;
  }

  uint32_t magic_ = kGgufMagic;
  uint32_t version_;
  std::optional<uint64_t> n_tensors_, n_kv_;
  uint64_t alignment_ = 32;
  bool omit_data_ = false;
  std::vector<std::string> kvs_;
  std::vector<TensorSpec> tensors_;
  std::vector<std::string> raw_infos_;
};

// Parses bytes held by `bytes` (which must outlive the result).
inline absl::StatusOr<std::unique_ptr<GgufFile>> ParseBytes(const std::string& bytes) {
  return GgufFile::Parse(MappedFile::Borrow(bytes.data(), bytes.size()));
}

}  // namespace pd::engine::testing
