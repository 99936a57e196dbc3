// Element and block types of tensors, numbered as GGUF/ggml numbers them so that a GGUF tensor's
// type field converts directly. Only the types listed here are supported by the engine; any other
// value is rejected by the GGUF reader with INVALID_ARGUMENT.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace pd::engine {

enum class DType : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ5_0 = 6,
  kQ8_0 = 8,
  kQ2_K = 10,
  kQ3_K = 11,
  kQ4_K = 12,
  kQ5_K = 13,
  kQ6_K = 14,
  kQ8_K = 15,  // activations for dot products with k-quant weights; never in model files
  kBF16 = 30,
  // pdserve's own types (not ggml's; layouts in w8a8.h and w4a16.h, docs/quantization.md). Their
  // numbers carry the tag 0x5044 ("PD") in the high 16 bits: ggml numbers its types densely from
  // 0 (under 64 so far, one or two added a year), so they can never reach these values, and any
  // ggml-based reader rejects them cleanly as "type >= GGML_TYPE_COUNT" instead of misreading
  // the bytes. Both fit in an int32 (ggml reads the field as a signed enum).
  kW8A8 = 0x50440001,   // "w8a8": INT8 per-output-channel weights, dynamic per-token INT8 acts
  kW4A16 = 0x50440002,  // "w4a16": INT4 groups of 128 with an f16 scale, float activations
  // Runtime layouts, never in a file (DTypeFromGgml refuses them): Q8_0 / Q5_0 rows 16 at a time,
  // codes interleaved by 4-byte words, for the CPU backend's own order (q8_0x16.h, q5_0x16.h),
  // Q4_K rows 16 at a time with their scales unpacked (q4_kx16.h), and Q6_K rows (q6_kx16.h).
  kQ8_0x16 = 0x50440100,  // "q8_0x16"
  kQ5_0x16 = 0x50440101,  // "q5_0x16"
  kQ4_Kx16 = 0x50440102,  // "q4_Kx16"
  kQ6_Kx16 = 0x50440103,  // "q6_Kx16"
};

struct DTypeTraits {
  std::string_view name;  // as ggml spells it: "f32", "q8_0", "q4_K", ...
  int block_size;         // elements per block (1 for plain floats)
  size_t block_bytes;     // bytes per block
  // Bytes every row starts with before its blocks (a per-row header: W8A8's row scale); 0 for
  // every ggml type. A row of n elements takes row_header_bytes + n / block_size * block_bytes.
  size_t row_header_bytes = 0;
};
// Layouts of the quantized types: q8_0.h (Q8_0), k_quants.h (Q4_0, Q2_K .. Q6_K, Q8_K), q5_0.h,
// w8a8.h and w4a16.h (pdserve's own).

// Traits of a supported type. PD_CHECKs that `t` is supported.
const DTypeTraits& Traits(DType t);
// The supported DType for a raw ggml type number, or nullopt.
std::optional<DType> DTypeFromGgml(uint32_t ggml_type);
// Name of a raw ggml type number, for error messages ("q4_K", or "type 123").
std::string RawGgmlTypeName(uint32_t ggml_type);

// Bytes of one row of `n` elements (per-row header included); `n` must be a multiple of the
// block size.
inline size_t RowBytes(DType t, int64_t n) {
  const DTypeTraits& tr = Traits(t);
  return tr.row_header_bytes + static_cast<size_t>(n / tr.block_size) * tr.block_bytes;
}

}  // namespace pd::engine
