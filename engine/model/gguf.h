// GGUF (v2, v3) reader over a memory map. Every count, length and offset is validated before use;
// a malformed file yields INVALID_ARGUMENT (or DATA_LOSS when truncated) with the byte offset and
// what was expected, never a crash. Tensor data is not copied: TensorInfo::data points into the map.
//
// Thread safety: immutable after Open(); safe to share across threads.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/mapped_file.h"
#include "engine/quant/dtype.h"

namespace pd::engine {

enum class GgufValueType : uint32_t {
  kUint8 = 0, kInt8 = 1, kUint16 = 2, kInt16 = 3, kUint32 = 4, kInt32 = 5, kFloat32 = 6,
  kBool = 7, kString = 8, kArray = 9, kUint64 = 10, kInt64 = 11, kFloat64 = 12,
};
std::string_view GgufValueTypeName(GgufValueType t);
// Bytes of one scalar of type `t`; 0 for string and array.
size_t GgufScalarSize(GgufValueType t);

// One metadata value. Scalars are widened on parse; arrays keep their element type.
struct GgufValue {
  GgufValueType type = GgufValueType::kUint8;
  // Scalar payload (numbers widened; bool as 0/1).
  int64_t i = 0;      // signed ints and bool
  uint64_t u = 0;     // unsigned ints
  double f = 0;       // floats
  std::string_view str;  // kString: bytes in the map (not NUL-terminated, may hold any byte)
  // kArray payload.
  GgufValueType elem_type = GgufValueType::kUint8;
  uint64_t count = 0;
  const uint8_t* raw = nullptr;           // numeric arrays: count little-endian elements
  std::vector<std::string_view> strings;  // string arrays
};

struct GgufTensorInfo {
  std::string name;
  DType type = DType::kF32;
  std::vector<int64_t> shape;  // ggml order: shape[0] is the fastest-varying (row length)
  uint64_t offset = 0;         // relative to the data section
  size_t nbytes = 0;
  const uint8_t* data = nullptr;  // into the map, aligned to the file's alignment

  int64_t numel() const;
  // Rows when viewed as 2-D: product of shape[1..].
  int64_t rows() const;
};

class GgufFile {
 public:
  // Maps and parses `path`. NOT_FOUND if missing; INVALID_ARGUMENT/DATA_LOSS on malformed input.
  static absl::StatusOr<std::unique_ptr<GgufFile>> Open(const std::string& path);
  // Parses bytes the caller keeps alive (tests, fuzzer).
  static absl::StatusOr<std::unique_ptr<GgufFile>> Parse(MappedFile map);

  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  size_t file_size() const { return map_.size(); }
  // The whole file as mapped.
  std::string_view bytes() const {
    return {reinterpret_cast<const char*>(map_.data()), map_.size()};
  }

  // Drops this process's pages of [p, p + n) of the mapping (MappedFile::DropPages): for tensor
  // bytes a backend has copied into its own memory. Reads still see the same bytes.
  void DropPages(const void* p, size_t n) const { map_.DropPages(p, n); }

  // ---- metadata ----
  const std::map<std::string, GgufValue, std::less<>>& metadata() const { return kv_; }
  const GgufValue* Find(std::string_view key) const;
  bool Has(std::string_view key) const { return Find(key) != nullptr; }
  // Typed getters: NOT_FOUND when absent, INVALID_ARGUMENT when of an incompatible type or out of
  // range. Integer getters accept any integer type whose value fits.
  absl::StatusOr<std::string_view> GetString(std::string_view key) const;
  absl::StatusOr<uint64_t> GetUint(std::string_view key) const;
  absl::StatusOr<int64_t> GetInt(std::string_view key) const;
  absl::StatusOr<double> GetFloat(std::string_view key) const;  // any int or float type
  absl::StatusOr<bool> GetBool(std::string_view key) const;
  absl::StatusOr<std::vector<std::string_view>> GetStringArray(std::string_view key) const;
  absl::StatusOr<std::vector<float>> GetFloatArray(std::string_view key) const;   // f32/f64/ints
  absl::StatusOr<std::vector<int64_t>> GetIntArray(std::string_view key) const;  // any ints
  // Convenience: value or default when the key is absent (errors if present but wrong type).
  absl::StatusOr<uint64_t> GetUintOr(std::string_view key, uint64_t def) const;
  absl::StatusOr<double> GetFloatOr(std::string_view key, double def) const;
  absl::StatusOr<bool> GetBoolOr(std::string_view key, bool def) const;

  // ---- tensors ----
  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
  const GgufTensorInfo* FindTensor(std::string_view name) const;

 private:
  GgufFile() = default;
  absl::Status ParseAll();

  MappedFile map_;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  std::map<std::string, GgufValue, std::less<>> kv_;
  std::vector<GgufTensorInfo> tensors_;
  std::map<std::string, size_t, std::less<>> tensor_index_;
};

}  // namespace pd::engine
