// The order Backend::TopK ranks logits in, and its host implementation (the CPU backend's, and
// the reference the CUDA kernel is tested against).
//
// Entries rank by value, largest first; equal values by lower column first. -0 equals +0, and
// NaN ranks below every number (-inf included), so a NaN is kept only when a row has fewer than k
// numbers. This is Sampler's order (engine/sched/sampler.h) for every row without NaNs, which
// makes sampling from a row's top k give the tokens sampling from the whole row gives.
#pragma once

#include <cstdint>
#include <cstring>

namespace pd::engine {

// An unsigned key whose order is the rank order of values (larger key = ranks first): the float's
// bits with the sign folded so unsigned comparison sorts numbers, -0 mapped to +0's key and every
// NaN to 0, below -inf's key.
inline uint32_t TopKKey(float v) {
  if (v != v) return 0;  // NaN
  if (v == 0.0f) v = 0.0f;  // -0 -> +0
  uint32_t u;
  std::memcpy(&u, &v, sizeof(u));
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// The k best entries of row[0, cols) in rank order: ids[0, k) their columns, values[0, k) the
// values. 1 <= k <= cols. One pass over the row: for k = 1 in 64-value blocks (then a search of
// the one block that holds the best), otherwise with a heap of k entries.
void RowTopK(const float* row, int64_t cols, int k, int32_t* ids, float* values);

// Merges candidate lists (each already in rank order, ids distinct across lists) into the best k
// of their union: how the CPU backend joins the top k of a row's chunks.
void MergeTopK(const int32_t* ids, const float* values, int64_t n, int k, int32_t* out_ids,
               float* out_values);

}  // namespace pd::engine
