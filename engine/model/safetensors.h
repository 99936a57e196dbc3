// Safetensors reader over memory maps: one file (SafetensorsFile) or a Hugging Face model folder
// of one file or several shards (SafetensorsCheckpoint).
//
// A safetensors file is an 8-byte little-endian header length N, N bytes of a UTF-8 JSON object
// (tensor name -> {"dtype", "shape", "data_offsets"}, plus an optional "__metadata__" object of
// strings), then the data buffer the offsets point into. Every length, count, offset and size is
// validated before use, as strictly as the reference implementation (Hugging Face's `safetensors`
// crate): the tensors must tile the data buffer exactly, with no gap, no overlap and no trailing
// byte. Stricter than it in one way: a key that appears twice in one JSON object (two tensors of
// one name) is refused, where the reference keeps one of them silently. A malformed file yields
// INVALID_ARGUMENT (DATA_LOSS when it is truncated) naming the file, the tensor and the numbers,
// never a crash. Tensor data is not copied: SafetensorsTensor::data points into the map, and is NOT
// necessarily aligned to its element size (the format does not promise it: read it with memcpy).
//
// Shapes are row-major as in PyTorch (shape.back() varies fastest), the reverse of ggml's order.
//
// Thread safety: both classes are immutable after Open(); safe to share across threads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
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

// The largest header (JSON) accepted, as in the reference implementation: far above any real
// checkpoint's, low enough that a hostile length cannot make the JSON parser build gigabytes.
inline constexpr uint64_t kSafetensorsMaxHeaderBytes = 100'000'000;

// Bits of one element of the safetensors dtype `dtype` as written in a header ("F32" -> 32,
// "F4" -> 4, "F6_E2M3" -> 6); 0 for a name that is not a safetensors dtype. Known (those of the
// reference implementation): BOOL, U8, I8, F8_E4M3, F8_E5M2, F8_E8M0, F8_E4M3FNUZ, F8_E5M2FNUZ,
// F4, F6_E2M3, F6_E3M2, I16, U16, F16, BF16, I32, U32, F32, I64, U64, F64, C64.
size_t SafetensorsDTypeBits(std::string_view dtype);
// The engine's DType for a safetensors dtype it computes with (F32, F16, BF16); nullopt otherwise.
std::optional<DType> DTypeFromSafetensors(std::string_view dtype);

struct SafetensorsTensor {
  std::string name;
  std::string dtype;              // as written: "F32", "BF16", "F8_E4M3", ...
  std::optional<DType> type;      // DTypeFromSafetensors(dtype): set for F32, F16, BF16 only
  std::vector<int64_t> shape;     // row-major as in the file: shape.back() is the fastest-varying
  uint64_t offset = 0;            // data_offsets[0], relative to the file's data buffer
  const uint8_t* data = nullptr;  // into the map; NOT necessarily aligned
  size_t nbytes = 0;              // data_offsets[1] - data_offsets[0]
  std::string file;               // the file's name (a shard's file name within its folder)

  // Product of shape (1 for a scalar, 0 when a dimension is 0). Cannot overflow: Parse checks.
  int64_t numel() const;
};

// One safetensors file.
class SafetensorsFile {
 public:
  // Maps and parses `path`; tensors' `file` is its last path component. NOT_FOUND if missing;
  // INVALID_ARGUMENT / DATA_LOSS on malformed input, the message starting with the path.
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> Open(const std::string& path);
  // Parses bytes the caller keeps alive (tests, the fuzzer) under the file name `name`, which
  // starts every error message and becomes the tensors' `file`.
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> Parse(MappedFile map, std::string name);

  const std::string& name() const { return name_; }
  size_t file_size() const { return map_.size(); }
  uint64_t header_size() const { return header_size_; }     // N: the JSON's length in bytes
  uint64_t data_start() const { return 8 + header_size_; }  // file offset of the data buffer
  // The header's JSON text, as in the file (padding included).
  std::string_view header() const {
    return {reinterpret_cast<const char*>(map_.data()) + 8, static_cast<size_t>(header_size_)};
  }

  // Every tensor, sorted by data offset (names break ties between empty tensors).
  const std::vector<SafetensorsTensor>& tensors() const { return tensors_; }
  // The tensor called `name`, or nullptr.
  const SafetensorsTensor* Find(std::string_view name) const;
  // "__metadata__" (empty when absent).
  const std::map<std::string, std::string, std::less<>>& metadata() const { return metadata_; }

 private:
  SafetensorsFile() = default;
  absl::Status ParseAll();

  MappedFile map_;
  std::string name_;
  uint64_t header_size_ = 0;
  std::vector<SafetensorsTensor> tensors_;
  std::map<std::string, size_t, std::less<>> index_;  // name -> position in tensors_
  std::map<std::string, std::string, std::less<>> metadata_;
};

// The parsed model.safetensors.index.json: which shard holds each tensor.
struct SafetensorsIndex {
  std::map<std::string, std::string, std::less<>> weight_map;  // tensor name -> shard file name
  std::vector<std::string> shards;  // the distinct shard file names, sorted
};

// Parses an index file's text. INVALID_ARGUMENT unless it is valid UTF-8 JSON, an object whose
// "weight_map" is a non-empty object of strings, each a plain file name (1 to 255 bytes, no '/',
// '\' or NUL, not "." or ".."). Other keys ("metadata" with its "total_size") are ignored.
absl::StatusOr<SafetensorsIndex> ParseSafetensorsIndex(std::string_view json);

// A Hugging Face model folder's weights: every tensor of every shard, by name. Each shard is
// mapped once and stays mapped while the checkpoint lives.
//
// Which files, in the order transformers looks for them:
//   1. DIR/model.safetensors: the whole model in one file;
//   2. DIR/model.safetensors.index.json: its "weight_map" names the shard of every tensor. Every
//      shard must open, every tensor must be in the shard the map names, and every tensor of a
//      shard must be in the map (a tensor the index does not list, or lists under another shard,
//      is INVALID_ARGUMENT: the index is stale or the shards are mixed up). Other .safetensors
//      files in DIR (e.g. a consolidated.safetensors beside the shards) are ignored;
//   3. neither: every *.safetensors file in DIR, as one model; a tensor name in two of them is
//      INVALID_ARGUMENT.
// NOT_FOUND when DIR has no safetensors file. `path` may also name one .safetensors file, or an
// index (a *.json file) whose shards are beside it.
class SafetensorsCheckpoint {
 public:
  static absl::StatusOr<std::unique_ptr<SafetensorsCheckpoint>> Open(const std::string& path);

  // The folder the files are in.
  const std::string& dir() const { return dir_; }
  // The files opened, sorted by name.
  const std::vector<std::unique_ptr<SafetensorsFile>>& files() const { return files_; }
  // Every tensor of every file, sorted by name; pointers into files().
  const std::vector<const SafetensorsTensor*>& tensors() const { return tensors_; }
  // The tensor called `name`, or nullptr.
  const SafetensorsTensor* Find(std::string_view name) const;
  // Sum of every tensor's nbytes.
  uint64_t total_nbytes() const { return total_nbytes_; }

 private:
  SafetensorsCheckpoint() = default;
  absl::Status OpenIndex(const std::string& index_path);
  absl::Status OpenFiles(const std::vector<std::string>& names);
  absl::Status Collect();

  std::string dir_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::vector<const SafetensorsTensor*> tensors_;
  std::map<std::string_view, const SafetensorsTensor*, std::less<>> by_name_;
  uint64_t total_nbytes_ = 0;
};

}  // namespace pd::engine
