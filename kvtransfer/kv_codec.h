// The wire format of one layer and its conversions: packing a sequence's exported KV spans into a
// layer payload (copy, or INT8 compression), the payload checksum, and importing a payload into a
// KvCache (copy, or INT8 expansion / compression to the cache's dtype).
//
// A layer payload is the layer's K blocks in order, then its V blocks (block 0 K, block 1 K, ...,
// block 0 V, block 1 V, ...; a sequence's blocks are often consecutive in the cache, so K and V
// are then two contiguous runs that the sender can hand to the network in place), each one block
// span in the wire dtype, in the format of
// engine/backend/kv_layout.h (INT8: values [block_size][n_kv_heads][head_dim] int8, then F32 scales
// [block_size][n_kv_heads]). INT8 uses the engine's INT8 KV scheme (each token-head rotated by a
// Hadamard matrix, engine/backend/kv_rotation.h, then scale = max|x| / 127 and
// q = round_half_even(x / scale)), through the same code and CPU kernels, so compressing on the
// wire gives the bytes an INT8 cache would have stored for the same values.
//
// All functions are pure (thread-safe) except ImportLayer, which writes the caller's KvCache and so
// runs on its owner's thread, and LandLayer, which writes the blocks it is given (any thread, for
// blocks set aside for it).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/kv/kv_cache.h"
#include "kvtransfer/checksum.h"
#include "kvtransfer/kv_transport.h"

namespace pd::kvtransfer {

// Converts one block span of `block_size * n_kv_heads` token-heads of `head_dim` values from
// dtype `from` (at `src`) to dtype `to` (at `dst`, which holds the `to` span size). Same dtype:
// a copy. To INT8: x' = H x / b (RotateKvRowIn), scale = max|x'| / 127,
// q = round_half_even(x' / scale) (the engine's scheme). From INT8: x = H (scale * q)
// (RotateKvRowOut), rounded to f16 (nearest even) for F16. f16 <-> f32 is exact one way and
// rounds to nearest even the other. src and dst must not overlap.
void ConvertBlock(KvDType from, const void* src, KvDType to, void* dst, int block_size,
                  int n_kv_heads, int head_dim);

// The two conversions the wire uses, named for tests and callers.
inline void CompressBlockF16ToI8(const void* src, void* dst, int block_size, int n_kv_heads,
                                 int head_dim) {
  ConvertBlock(KvDType::kF16, src, KvDType::kI8, dst, block_size, n_kv_heads, head_dim);
}
inline void ExpandBlockI8ToF16(const void* src, void* dst, int block_size, int n_kv_heads,
                               int head_dim) {
  ConvertBlock(KvDType::kI8, src, KvDType::kF16, dst, block_size, n_kv_heads, head_dim);
}

// Packs the first g.n_blocks() blocks of `spans` (one layer's KvCache::ExportSpans, host memory,
// from a cache of dtype `source`) into `out` (g.LayerBytes() bytes) in g.wire_dtype.
// INVALID_ARGUMENT when spans are too few, out of order, of another layer than `layer`, of the
// wrong size for `source`, null, or `out` is not LayerBytes() long.
// With `checksum`, also stores Checksum64 of `out` (computed block by block as it is written,
// so the payload is not read a second time).
absl::Status PackLayer(const TransferGeometry& g, KvDType source, int layer,
                       absl::Span<const engine::KvSpan> spans, absl::Span<uint8_t> out,
                       uint64_t* checksum = nullptr);

// A contiguous piece of host memory.
struct ByteRun {
  const uint8_t* data = nullptr;
  size_t bytes = 0;
};

// The in-place alternative to PackLayer when the cache's dtype is the wire dtype: the layer's
// payload as it already lies in the cache, as the fewest runs of host memory whose concatenation
// is the payload (adjacent blocks merged), with the payload's Checksum64. Same span checks as
// PackLayer; INVALID_ARGUMENT when `source` is not g.wire_dtype.
absl::Status LayerRuns(const TransferGeometry& g, KvDType source, int layer,
                       absl::Span<const engine::KvSpan> spans, std::vector<ByteRun>* runs,
                       uint64_t* checksum);

// Lands a received layer payload (wire format, g.LayerBytes() bytes) in the receiver's blocks:
// `spans` are the layer's KvCache::ExportSpans of the reserved sequence (host memory, a cache of
// g.receiver_dtype), written block by block, converted from g.wire_dtype where it differs. Returns
// Checksum64 of the payload, taken block by block in the same pass (each block is hashed and then
// copied while it is in L1), for the caller to compare with the sender's. Any thread may call it
// for blocks its caller may write (engine/kv/kv_write_fence.h). INVALID_ARGUMENT for a payload of
// the wrong size or spans as PackLayer rejects them (checked against g.receiver_dtype).
absl::StatusOr<uint64_t> LandLayer(const TransferGeometry& g, int layer,
                                   absl::Span<const uint8_t> payload,
                                   absl::Span<const engine::KvSpan> spans);
// LandLayer's span checks alone (the receiver validates a whole target when it opens a transfer).
absl::Status CheckLandingSpans(const TransferGeometry& g, int layer,
                               absl::Span<const engine::KvSpan> spans);

// Writes a verified layer payload into `seq`'s reserved blocks of `cache`, converting wire dtype
// to the cache's dtype. Runs on the cache owner's thread. FAILED_PRECONDITION when the cache's
// shape or dtype differs from the payload's geometry (receiver_dtype) or `seq` holds fewer than
// n_tokens positions; INVALID_ARGUMENT for a payload of the wrong size; KvCache::Import's errors.
absl::Status ImportLayer(const LayerPayload& payload, engine::KvCache& cache, int64_t seq);
// The same from raw parts.
absl::Status ImportLayer(const TransferGeometry& g, int layer, absl::Span<const uint8_t> payload,
                         engine::KvCache& cache, int64_t seq);

}  // namespace pd::kvtransfer
