// The argument checks of a KvBatch (backend.h) that every backend's StoreKv and Attention make
// before touching a cache: one definition, so the CPU and CUDA backends refuse the same batches
// with the same words.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "engine/backend/backend.h"

namespace pd::engine {

// The per-token spans of a batch of n_tokens: as many positions and sequence ids (and row
// orders, when given) as tokens, a positive block size, every sequence id naming a block table,
// no negative position. INVALID_ARGUMENT naming the first fault.
absl::Status CheckKvBatch(const KvBatch& kv, int64_t n_tokens);
// Positions [first, last] of sequence `seq` (an index CheckKvBatch accepted) map to slots below
// `cache_slots` through its block table. INVALID_ARGUMENT naming the block otherwise.
absl::Status CheckSlots(const KvBatch& kv, int32_t seq, int64_t first, int64_t last,
                        int64_t cache_slots);

}  // namespace pd::engine
