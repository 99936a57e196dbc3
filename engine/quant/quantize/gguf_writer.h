// GGUF v3 writer: metadata (copied from a GgufFile or set), tensor infos, and tensor data at
// aligned offsets, written to PATH.tmp and renamed onto PATH only by Commit(), so that a failed or
// abandoned write never leaves a partial file at PATH (the destructor removes PATH.tmp).
//
// Usage: SetKv/CopyKv..., AddTensor... (the layout is then fixed), Open(), WriteTensor() (or
// WriteTensorPart() pieces) for each tensor in any order, Commit().
//
// Thread safety: not thread safe; one writer per output file.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/mapped_file.h"
#include "engine/model/gguf.h"
#include "engine/quant/dtype.h"

namespace pd::engine::quantize {

class GgufWriter {
 public:
  explicit GgufWriter(uint64_t alignment = 32);
  ~GgufWriter();
  GgufWriter(const GgufWriter&) = delete;
  GgufWriter& operator=(const GgufWriter&) = delete;

  // ---- metadata (in insertion order; setting a key again replaces its value in place) ----
  // Exact copy of a value read by GgufFile (type and payload). UNIMPLEMENTED for arrays of
  // arrays, whose elements the reader does not keep.
  absl::Status CopyKv(std::string_view key, const GgufValue& v);
  void SetU32(std::string_view key, uint32_t v);
  void SetF32(std::string_view key, float v);
  void SetBool(std::string_view key, bool v);
  void SetString(std::string_view key, std::string_view v);
  void SetU8Array(std::string_view key, std::string_view bytes);
  void SetI32Array(std::string_view key, const std::vector<int32_t>& v);
  void SetF32Array(std::string_view key, const std::vector<float>& v);
  void SetStringArray(std::string_view key, const std::vector<std::string>& v);
  bool HasKv(std::string_view key) const;

  // ---- tensors ----
  // `shape` in ggml order (shape[0] = row length). Returns the tensor's index.
  size_t AddTensor(std::string_view name, DType type, const std::vector<int64_t>& shape);
  size_t tensor_count() const { return tensors_.size(); }
  size_t TensorBytes(size_t i) const { return tensors_[i].bytes; }

  // ---- layout (valid once every key and tensor is added) ----
  uint64_t DataStart() const;  // offset of the data section in the file
  uint64_t FileSize() const;   // header + data, each tensor padded to the alignment

  // Creates PATH.tmp and writes the header. PERMISSION_DENIED / NOT_FOUND (missing folder) /
  // INTERNAL with the path and errno text when it cannot.
  absl::Status Open(const std::string& path);
  // Like Open, into an anonymous in-memory file (memfd) instead of PATH.tmp; finish with
  // CommitToMemory. `name` labels it in errors and /proc.
  absl::Status OpenMemory(const std::string& name);
  // Writes tensor i's data (exactly TensorBytes(i) bytes) at its offset.
  absl::Status WriteTensor(size_t i, const void* data, size_t n);
  // Writes `n` bytes of tensor i's data starting `offset` bytes into it (offset + n at most
  // TensorBytes(i)): large tensors in pieces, so that no whole tensor need be held in memory.
  absl::Status WriteTensorPart(size_t i, uint64_t offset, const void* data, size_t n);
  // Pads, flushes, closes and renames PATH.tmp onto PATH. After a failure PATH.tmp is removed.
  absl::Status Commit();
  // Pads and maps the in-memory file of OpenMemory read-only (it lives as long as the map).
  absl::StatusOr<MappedFile> CommitToMemory();
  // Removes PATH.tmp if it exists (also done by the destructor unless committed).
  void Abandon();

  const std::string& tmp_path() const { return tmp_path_; }

 private:
  struct Kv {
    std::string key;
    uint32_t type;
    std::string payload;  // value bytes as in the file
  };
  struct TensorInfo {
    std::string name;
    DType type;
    std::vector<int64_t> shape;
    size_t bytes;
    uint64_t offset;  // relative to the data section
  };
  void Put(std::string_view key, uint32_t type, std::string payload);
  std::string Header() const;
  absl::Status WriteAt(uint64_t offset, const void* data, size_t n);

  uint64_t alignment_;
  std::vector<Kv> kvs_;
  std::vector<TensorInfo> tensors_;
  uint64_t data_bytes_ = 0;
  // DataStart(), fixed by Open(): not recomputed per write (a big vocabulary's header is MiBs).
  uint64_t data_start_ = 0;
  std::string path_, tmp_path_;
  int fd_ = -1;
  bool committed_ = false;
  bool in_memory_ = false;  // OpenMemory: fd_ is a memfd, no paths
};

}  // namespace pd::engine::quantize
