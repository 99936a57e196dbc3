#include "engine/backend/kv_batch_check.h"

#include "common/strings.h"

namespace pd::engine {

absl::Status CheckKvBatch(const KvBatch& kv, int64_t n_tokens) {
  if (static_cast<int64_t>(kv.pos.size()) != n_tokens ||
      static_cast<int64_t>(kv.seq.size()) != n_tokens) {
    return absl::InvalidArgumentError(pd::StrCat("KvBatch: ", kv.pos.size(), " positions and ",
                                                 kv.seq.size(), " sequence ids for ", n_tokens,
                                                 " tokens"));
  }
  if (kv.block_size <= 0) {
    return absl::InvalidArgumentError(pd::StrCat("KvBatch: block_size ", kv.block_size));
  }
  if (!kv.row_orders.empty() && static_cast<int64_t>(kv.row_orders.size()) != n_tokens) {
    return absl::InvalidArgumentError(pd::StrCat("KvBatch: ", kv.row_orders.size(),
                                                 " row orders for ", n_tokens, " tokens"));
  }
  for (int64_t t = 0; t < n_tokens; ++t) {
    if (kv.seq[t] < 0 || static_cast<size_t>(kv.seq[t]) >= kv.block_tables.size()) {
      return absl::InvalidArgumentError(pd::StrCat("KvBatch: token ", t, " has sequence ",
                                                   kv.seq[t], " but there are ",
                                                   kv.block_tables.size(), " block tables"));
    }
    if (kv.pos[t] < 0) {
      return absl::InvalidArgumentError(
          pd::StrCat("KvBatch: token ", t, " has position ", kv.pos[t]));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckSlots(const KvBatch& kv, int32_t seq, int64_t first, int64_t last,
                        int64_t cache_slots) {
  const absl::Span<const int32_t> table = kv.block_tables[seq];
  const int64_t bs = kv.block_size;
  for (int64_t blk = first / bs; blk <= last / bs; ++blk) {
    if (blk >= static_cast<int64_t>(table.size())) {
      return absl::InvalidArgumentError(pd::StrCat("KvBatch: position ", last, " of sequence ",
                                                   seq, " needs block ", blk,
                                                   " but its table has ", table.size()));
    }
    const int64_t last_off = blk == last / bs ? last % bs : bs - 1;
    if (table[blk] < 0 || int64_t{table[blk]} * bs + last_off >= cache_slots) {
      return absl::InvalidArgumentError(pd::StrCat("KvBatch: block id ", table[blk],
                                                   " of sequence ", seq,
                                                   " is outside a cache of ", cache_slots,
                                                   " slots"));
    }
  }
  return absl::OkStatus();
}

}  // namespace pd::engine
