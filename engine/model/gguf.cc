#include "engine/model/gguf.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <set>
#include <utility>

#include "common/strings.h"
#include "common/status.h"

namespace pd::engine {
namespace {

constexpr uint32_t kGgufMagic = 0x46554747;  // "GGUF" little-endian
// Sanity caps: far above any real model, low enough that a hostile count cannot make us
// allocate gigabytes before the bounds check catches it.
constexpr uint64_t kMaxTensors = 1u << 20;
constexpr uint64_t kMaxKv = 1u << 20;
constexpr uint32_t kMaxDims = 4;
constexpr uint32_t kMaxArrayDepth = 4;
// Fewest bytes one entry can take, to reject counts the file cannot hold before reserving for
// them: a key length, a type and a uint8 value; a name length, n_dims, one dim, a type, an offset.
constexpr uint64_t kMinKvBytes = 8 + 4 + 1;
constexpr uint64_t kMinTensorInfoBytes = 8 + 4 + 8 + 4 + 8;

size_t ScalarSizeImpl(GgufValueType t) {
  switch (t) {
    case GgufValueType::kUint8:
    case GgufValueType::kInt8:
    case GgufValueType::kBool: return 1;
    case GgufValueType::kUint16:
    case GgufValueType::kInt16: return 2;
    case GgufValueType::kUint32:
    case GgufValueType::kInt32:
    case GgufValueType::kFloat32: return 4;
    case GgufValueType::kUint64:
    case GgufValueType::kInt64:
    case GgufValueType::kFloat64: return 8;
    default: return 0;
  }
}

bool IsValidType(uint32_t t) { return t <= static_cast<uint32_t>(GgufValueType::kFloat64); }
bool IsIntType(GgufValueType t) {
  switch (t) {
    case GgufValueType::kUint8: case GgufValueType::kInt8: case GgufValueType::kUint16:
    case GgufValueType::kInt16: case GgufValueType::kUint32: case GgufValueType::kInt32:
    case GgufValueType::kUint64: case GgufValueType::kInt64: return true;
    default: return false;
  }
}
bool IsSigned(GgufValueType t) {
  return t == GgufValueType::kInt8 || t == GgufValueType::kInt16 || t == GgufValueType::kInt32 ||
         t == GgufValueType::kInt64;
}

// Bounds-checked little-endian cursor over the mapped bytes.
class Reader {
 public:
  Reader(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  size_t pos() const { return pos_; }
  size_t remaining() const { return size_ - pos_; }

  absl::Status Need(size_t n, std::string_view what) const {
    if (n > remaining()) {
      return absl::DataLossError(pd::StrCat("GGUF truncated at byte ", pos_, ": reading ", what,
                                              " needs ", n, " bytes, ", remaining(), " left"));
    }
    return absl::OkStatus();
  }
  template <typename T>
  absl::StatusOr<T> Read(std::string_view what) {
    PD_RETURN_IF_ERROR(Need(sizeof(T), what));
    T v;
    std::memcpy(&v, data_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  absl::StatusOr<std::string_view> ReadString(std::string_view what) {
    PD_ASSIGN_OR_RETURN(uint64_t len, Read<uint64_t>(what));
    if (len > remaining()) {
      return absl::DataLossError(pd::StrCat("GGUF truncated at byte ", pos_, ": ", what,
                                              " has length ", len, " but only ", remaining(),
                                              " bytes remain"));
    }
    std::string_view s(reinterpret_cast<const char*>(data_ + pos_), len);
    pos_ += len;
    return s;
  }
  const uint8_t* Skip(size_t n) {  // caller has checked Need(n)
    const uint8_t* p = data_ + pos_;
    pos_ += n;
    return p;
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

absl::Status ReadValue(Reader& r, GgufValueType type, std::string_view key, uint32_t depth,
                       GgufValue& out);

absl::Status ReadScalar(Reader& r, GgufValueType type, std::string_view key, GgufValue& v) {
  v.type = type;
  switch (type) {
    case GgufValueType::kUint8: { PD_ASSIGN_OR_RETURN(v.u, r.Read<uint8_t>(key)); break; }
    case GgufValueType::kInt8: { PD_ASSIGN_OR_RETURN(v.i, r.Read<int8_t>(key)); break; }
    case GgufValueType::kUint16: { PD_ASSIGN_OR_RETURN(v.u, r.Read<uint16_t>(key)); break; }
    case GgufValueType::kInt16: { PD_ASSIGN_OR_RETURN(v.i, r.Read<int16_t>(key)); break; }
    case GgufValueType::kUint32: { PD_ASSIGN_OR_RETURN(v.u, r.Read<uint32_t>(key)); break; }
    case GgufValueType::kInt32: { PD_ASSIGN_OR_RETURN(v.i, r.Read<int32_t>(key)); break; }
    case GgufValueType::kUint64: { PD_ASSIGN_OR_RETURN(v.u, r.Read<uint64_t>(key)); break; }
    case GgufValueType::kInt64: { PD_ASSIGN_OR_RETURN(v.i, r.Read<int64_t>(key)); break; }
    case GgufValueType::kFloat32: { PD_ASSIGN_OR_RETURN(v.f, r.Read<float>(key)); break; }
    case GgufValueType::kFloat64: { PD_ASSIGN_OR_RETURN(v.f, r.Read<double>(key)); break; }
    case GgufValueType::kBool: {
      PD_ASSIGN_OR_RETURN(uint8_t b, r.Read<uint8_t>(key));
      if (b > 1) {
        return absl::InvalidArgumentError(
            pd::StrCat("GGUF key '", key, "': bool value ", int{b}, " is neither 0 nor 1"));
      }
      v.i = b;
      break;
    }
    case GgufValueType::kString: { PD_ASSIGN_OR_RETURN(v.str, r.ReadString(key)); break; }
    case GgufValueType::kArray: PD_CHECK(false);
  }
  return absl::OkStatus();
}

absl::Status ReadValue(Reader& r, GgufValueType type, std::string_view key, uint32_t depth,
                       GgufValue& out) {
  if (type != GgufValueType::kArray) return ReadScalar(r, type, key, out);
  if (depth >= kMaxArrayDepth) {
    return absl::InvalidArgumentError(
        pd::StrCat("GGUF key '", key, "': arrays nested deeper than ", kMaxArrayDepth));
  }
  out.type = GgufValueType::kArray;
  PD_ASSIGN_OR_RETURN(uint32_t et, r.Read<uint32_t>(key));
  if (!IsValidType(et)) {
    return absl::InvalidArgumentError(
        pd::StrCat("GGUF key '", key, "': unknown array element type ", et));
  }
  out.elem_type = static_cast<GgufValueType>(et);
  PD_ASSIGN_OR_RETURN(out.count, r.Read<uint64_t>(key));
  const size_t es = ScalarSizeImpl(out.elem_type);
  if (es > 0) {
    if (out.count > r.remaining() / es) {
      return absl::DataLossError(pd::StrCat("GGUF key '", key, "': array of ", out.count,
                                              " elements runs past the end of the file"));
    }
    out.raw = r.Skip(out.count * es);
    if (out.elem_type == GgufValueType::kBool) {
      for (uint64_t i = 0; i < out.count; ++i) {
        if (out.raw[i] > 1) {
          return absl::InvalidArgumentError(
              pd::StrCat("GGUF key '", key, "': bool element ", i, " is neither 0 nor 1"));
        }
      }
    }
    return absl::OkStatus();
  }
  // Strings and nested arrays: each element takes at least 8 bytes (a length or a header).
  if (out.count > r.remaining() / 8) {
    return absl::DataLossError(pd::StrCat("GGUF key '", key, "': array of ", out.count,
                                            " elements runs past the end of the file"));
  }
  if (out.elem_type == GgufValueType::kString) {
    out.strings.reserve(out.count);
    for (uint64_t i = 0; i < out.count; ++i) {
      PD_ASSIGN_OR_RETURN(std::string_view s, r.ReadString(key));
      out.strings.push_back(s);
    }
    return absl::OkStatus();
  }
  // Nested arrays are validated and skipped; no supported key uses them.
  for (uint64_t i = 0; i < out.count; ++i) {
    GgufValue inner;
    PD_RETURN_IF_ERROR(ReadValue(r, GgufValueType::kArray, key, depth + 1, inner));
  }
  return absl::OkStatus();
}

absl::Status WrongType(std::string_view key, const GgufValue& v, std::string_view wanted) {
  return absl::InvalidArgumentError(pd::StrCat("GGUF key '", key, "' has type ",
                                                 GgufValueTypeName(v.type), ", expected ", wanted));
}

}  // namespace

size_t GgufScalarSize(GgufValueType t) { return ScalarSizeImpl(t); }

std::string_view GgufValueTypeName(GgufValueType t) {
  static const char* kNames[] = {"uint8", "int8",  "uint16", "int16",  "uint32", "int32", "float32",
                                 "bool",  "string", "array", "uint64", "int64",  "float64"};
  const auto i = static_cast<uint32_t>(t);
  return i < 13 ? kNames[i] : "unknown";
}

int64_t GgufTensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

int64_t GgufTensorInfo::rows() const {
  int64_t n = 1;
  for (size_t i = 1; i < shape.size(); ++i) n *= shape[i];
  return n;
}

absl::StatusOr<std::unique_ptr<GgufFile>> GgufFile::Open(const std::string& path) {
  PD_ASSIGN_OR_RETURN(MappedFile map, MappedFile::Open(path));
  auto parsed = Parse(std::move(map));
  if (!parsed.ok()) {
    return absl::Status(parsed.status().code(),
                        pd::StrCat("'", path, "': ", parsed.status().message()));
  }
  return parsed;
}

absl::StatusOr<std::unique_ptr<GgufFile>> GgufFile::Parse(MappedFile map) {
  std::unique_ptr<GgufFile> f(new GgufFile());
  f->map_ = std::move(map);
  PD_RETURN_IF_ERROR(f->ParseAll());
  return f;
}

absl::Status GgufFile::ParseAll() {
  Reader r(map_.data(), map_.size());
  PD_ASSIGN_OR_RETURN(uint32_t magic, r.Read<uint32_t>("magic"));
  if (magic != kGgufMagic) {
    return absl::InvalidArgumentError(pd::StrCat(
        "not a GGUF file: magic is 0x", absl::Hex(magic, absl::kZeroPad8), ", expected 'GGUF'"));
  }
  PD_ASSIGN_OR_RETURN(version_, r.Read<uint32_t>("version"));
  if (version_ != 2 && version_ != 3) {
    return absl::InvalidArgumentError(pd::StrCat(
        "unsupported GGUF version ", version_, " (supported: 2, 3)"));
  }
  PD_ASSIGN_OR_RETURN(uint64_t n_tensors, r.Read<uint64_t>("tensor count"));
  PD_ASSIGN_OR_RETURN(uint64_t n_kv, r.Read<uint64_t>("metadata count"));
  if (n_tensors > kMaxTensors) {
    return absl::InvalidArgumentError(pd::StrCat("GGUF tensor count ", n_tensors,
                                                   " exceeds the limit of ", kMaxTensors));
  }
  if (n_kv > kMaxKv) {
    return absl::InvalidArgumentError(
        pd::StrCat("GGUF metadata count ", n_kv, " exceeds the limit of ", kMaxKv));
  }
  if (n_kv > r.remaining() / kMinKvBytes) {
    return absl::DataLossError(pd::StrCat("GGUF truncated: ", n_kv,
                                          " metadata entries need at least ", n_kv * kMinKvBytes,
                                          " bytes, but only ", r.remaining(), " remain"));
  }

  for (uint64_t i = 0; i < n_kv; ++i) {
    PD_ASSIGN_OR_RETURN(std::string_view key, r.ReadString("metadata key"));
    PD_ASSIGN_OR_RETURN(uint32_t type, r.Read<uint32_t>("metadata value type"));
    if (!IsValidType(type)) {
      return absl::InvalidArgumentError(
          pd::StrCat("GGUF key '", key, "' has unknown value type ", type));
    }
    GgufValue v;
    PD_RETURN_IF_ERROR(ReadValue(r, static_cast<GgufValueType>(type), key, 0, v));
    auto [it, inserted] = kv_.emplace(std::string(key), std::move(v));
    if (!inserted) {
      return absl::InvalidArgumentError(pd::StrCat("GGUF key '", key, "' appears twice"));
    }
  }

  if (const GgufValue* a = Find("general.alignment")) {
    if (a->type != GgufValueType::kUint32 && a->type != GgufValueType::kUint64) {
      return WrongType("general.alignment", *a, "uint32");
    }
    if (a->u == 0 || (a->u & (a->u - 1)) != 0 || a->u > (1u << 20)) {
      return absl::InvalidArgumentError(
          pd::StrCat("general.alignment ", a->u, " is not a power of two <= 1 MiB"));
    }
    alignment_ = a->u;
  }

  // Without this check a 24-byte file claiming 2^20 tensors would reserve ~100 MB of infos.
  if (n_tensors > r.remaining() / kMinTensorInfoBytes) {
    return absl::DataLossError(pd::StrCat("GGUF truncated: ", n_tensors,
                                          " tensor infos need at least ",
                                          n_tensors * kMinTensorInfoBytes, " bytes, but only ",
                                          r.remaining(), " remain"));
  }
  tensors_.reserve(n_tensors);
  for (uint64_t i = 0; i < n_tensors; ++i) {
    GgufTensorInfo t;
    PD_ASSIGN_OR_RETURN(std::string_view name, r.ReadString("tensor name"));
    t.name = std::string(name);
    PD_ASSIGN_OR_RETURN(uint32_t n_dims, r.Read<uint32_t>("tensor dims"));
    if (n_dims == 0 || n_dims > kMaxDims) {
      return absl::InvalidArgumentError(
          pd::StrCat("tensor '", t.name, "' has ", n_dims, " dimensions (1..4 supported)"));
    }
    uint64_t numel = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      PD_ASSIGN_OR_RETURN(uint64_t dim, r.Read<uint64_t>("tensor dim"));
      if (dim == 0 || dim > (uint64_t{1} << 40) || numel > (uint64_t{1} << 50) / dim) {
        return absl::InvalidArgumentError(
            pd::StrCat("tensor '", t.name, "' dimension ", d, " = ", dim, " is out of range"));
      }
      numel *= dim;
      t.shape.push_back(static_cast<int64_t>(dim));
    }
    PD_ASSIGN_OR_RETURN(uint32_t raw_type, r.Read<uint32_t>("tensor type"));
    std::optional<DType> type = DTypeFromGgml(raw_type);
    if (!type) {
      return absl::InvalidArgumentError(pd::StrCat("tensor '", t.name, "' has type ",
                                                     RawGgmlTypeName(raw_type),
                                                     ", which this engine does not support"));
    }
    t.type = *type;
    const DTypeTraits& tr = Traits(t.type);
    if (t.shape[0] % tr.block_size != 0) {
      return absl::InvalidArgumentError(
          pd::StrCat("tensor '", t.name, "' of type ", tr.name, " has row length ", t.shape[0],
                       ", not a multiple of its block size ", tr.block_size));
    }
    t.nbytes = RowBytes(t.type, t.shape[0]) * static_cast<size_t>(numel / t.shape[0]);
    PD_ASSIGN_OR_RETURN(t.offset, r.Read<uint64_t>("tensor offset"));
    if (t.offset % alignment_ != 0) {
      return absl::InvalidArgumentError(pd::StrCat("tensor '", t.name, "' offset ", t.offset,
                                                     " is not a multiple of the alignment ",
                                                     alignment_));
    }
    if (tensor_index_.count(t.name)) {
      return absl::InvalidArgumentError(pd::StrCat("tensor '", t.name, "' appears twice"));
    }
    tensor_index_.emplace(t.name, tensors_.size());
    tensors_.push_back(std::move(t));
  }

  // The data section starts at the next multiple of the alignment.
  const uint64_t header_end = r.pos();
  const uint64_t data_start = (header_end + alignment_ - 1) / alignment_ * alignment_;
  if (tensors_.empty()) return absl::OkStatus();  // vocabulary-only files end here
  if (data_start > map_.size()) {
    return absl::DataLossError(pd::StrCat("GGUF truncated: data section would start at byte ",
                                            data_start, " of a ", map_.size(), "-byte file"));
  }
  const uint64_t data_size = map_.size() - data_start;
  // Tensors must lie inside the data section and must not overlap one another.
  std::vector<std::pair<uint64_t, size_t>> ranges;
  for (size_t i = 0; i < tensors_.size(); ++i) {
    GgufTensorInfo& t = tensors_[i];
    if (t.offset > data_size || t.nbytes > data_size - t.offset) {
      return absl::DataLossError(pd::StrCat(
          "tensor '", t.name, "' data [", t.offset, ", +", t.nbytes, ") lies outside the ",
          data_size, "-byte data section (file truncated?)"));
    }
    t.data = map_.data() + data_start + t.offset;
    ranges.emplace_back(t.offset, i);
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i) {
    const GgufTensorInfo& prev = tensors_[ranges[i - 1].second];
    const GgufTensorInfo& cur = tensors_[ranges[i].second];
    if (prev.offset + prev.nbytes > cur.offset) {
      return absl::InvalidArgumentError(
          pd::StrCat("tensors '", prev.name, "' and '", cur.name, "' overlap"));
    }
  }
  return absl::OkStatus();
}

const GgufValue* GgufFile::Find(std::string_view key) const {
  auto it = kv_.find(key);
  return it == kv_.end() ? nullptr : &it->second;
}

const GgufTensorInfo* GgufFile::FindTensor(std::string_view name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

namespace {
absl::Status Missing(std::string_view key) {
  return absl::NotFoundError(pd::StrCat("GGUF key '", key, "' is missing"));
}
}  // namespace

absl::StatusOr<std::string_view> GgufFile::GetString(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (!v) return Missing(key);
  if (v->type != GgufValueType::kString) return WrongType(key, *v, "string");
  return v->str;
}

absl::StatusOr<uint64_t> GgufFile::GetUint(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (!v) return Missing(key);
  if (!IsIntType(v->type)) return WrongType(key, *v, "an integer");
  if (IsSigned(v->type)) {
    if (v->i < 0) {
      return absl::InvalidArgumentError(
          pd::StrCat("GGUF key '", key, "' is ", v->i, ", expected a non-negative value"));
    }
    return static_cast<uint64_t>(v->i);
  }
  return v->u;
}

absl::StatusOr<int64_t> GgufFile::GetInt(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (!v) return Missing(key);
  if (!IsIntType(v->type)) return WrongType(key, *v, "an integer");
  if (!IsSigned(v->type)) {
    if (v->u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return absl::InvalidArgumentError(pd::StrCat("GGUF key '", key, "' is out of range"));
    }
    return static_cast<int64_t>(v->u);
  }
  return v->i;
}

absl::StatusOr<double> GgufFile::GetFloat(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (!v) return Missing(key);
  if (v->type == GgufValueType::kFloat32 || v->type == GgufValueType::kFloat64) return v->f;
  if (IsIntType(v->type)) return IsSigned(v->type) ? double(v->i) : double(v->u);
  return WrongType(key, *v, "a number");
}

absl::StatusOr<bool> GgufFile::GetBool(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (!v) return Missing(key);
  if (v->type != GgufValueType::kBool) return WrongType(key, *v, "bool");
  return v->i != 0;
}

absl::StatusOr<std::vector<std::string_view>> GgufFile::GetStringArray(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (!v) return Missing(key);
  if (v->type != GgufValueType::kArray || v->elem_type != GgufValueType::kString) {
    return WrongType(key, *v, "array of string");
  }
  return v->strings;
}

namespace {
template <typename T>
T LoadAt(const uint8_t* p, size_t i) {
  T x;
  std::memcpy(&x, p + i * sizeof(T), sizeof(T));
  return x;
}
}  // namespace

absl::StatusOr<std::vector<float>> GgufFile::GetFloatArray(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (!v) return Missing(key);
  if (v->type != GgufValueType::kArray || ScalarSizeImpl(v->elem_type) == 0 ||
      v->elem_type == GgufValueType::kBool) {
    return WrongType(key, *v, "array of numbers");
  }
  std::vector<float> out(v->count);
  for (size_t i = 0; i < v->count; ++i) {
    switch (v->elem_type) {
      case GgufValueType::kFloat32: out[i] = LoadAt<float>(v->raw, i); break;
      case GgufValueType::kFloat64: out[i] = float(LoadAt<double>(v->raw, i)); break;
      case GgufValueType::kUint8: out[i] = LoadAt<uint8_t>(v->raw, i); break;
      case GgufValueType::kInt8: out[i] = LoadAt<int8_t>(v->raw, i); break;
      case GgufValueType::kUint16: out[i] = LoadAt<uint16_t>(v->raw, i); break;
      case GgufValueType::kInt16: out[i] = LoadAt<int16_t>(v->raw, i); break;
      case GgufValueType::kUint32: out[i] = float(LoadAt<uint32_t>(v->raw, i)); break;
      case GgufValueType::kInt32: out[i] = float(LoadAt<int32_t>(v->raw, i)); break;
      case GgufValueType::kUint64: out[i] = float(LoadAt<uint64_t>(v->raw, i)); break;
      case GgufValueType::kInt64: out[i] = float(LoadAt<int64_t>(v->raw, i)); break;
      default: PD_CHECK(false);
    }
  }
  return out;
}

absl::StatusOr<std::vector<int64_t>> GgufFile::GetIntArray(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (!v) return Missing(key);
  if (v->type != GgufValueType::kArray || !IsIntType(v->elem_type)) {
    return WrongType(key, *v, "array of integers");
  }
  std::vector<int64_t> out(v->count);
  for (size_t i = 0; i < v->count; ++i) {
    switch (v->elem_type) {
      case GgufValueType::kUint8: out[i] = LoadAt<uint8_t>(v->raw, i); break;
      case GgufValueType::kInt8: out[i] = LoadAt<int8_t>(v->raw, i); break;
      case GgufValueType::kUint16: out[i] = LoadAt<uint16_t>(v->raw, i); break;
      case GgufValueType::kInt16: out[i] = LoadAt<int16_t>(v->raw, i); break;
      case GgufValueType::kUint32: out[i] = LoadAt<uint32_t>(v->raw, i); break;
      case GgufValueType::kInt32: out[i] = LoadAt<int32_t>(v->raw, i); break;
      case GgufValueType::kInt64: out[i] = LoadAt<int64_t>(v->raw, i); break;
      case GgufValueType::kUint64: {
        uint64_t x = LoadAt<uint64_t>(v->raw, i);
        if (x > uint64_t(std::numeric_limits<int64_t>::max())) {
          return absl::InvalidArgumentError(
              pd::StrCat("GGUF key '", key, "' element ", i, " is out of range"));
        }
        out[i] = int64_t(x);
        break;
      }
      default: PD_CHECK(false);
    }
  }
  return out;
}

absl::StatusOr<uint64_t> GgufFile::GetUintOr(std::string_view key, uint64_t def) const {
  return Has(key) ? GetUint(key) : absl::StatusOr<uint64_t>(def);
}
absl::StatusOr<double> GgufFile::GetFloatOr(std::string_view key, double def) const {
  return Has(key) ? GetFloat(key) : absl::StatusOr<double>(def);
}
absl::StatusOr<bool> GgufFile::GetBoolOr(std::string_view key, bool def) const {
  return Has(key) ? GetBool(key) : absl::StatusOr<bool>(def);
}

}  // namespace pd::engine
