#include "engine/kv/kv_cache.h"

#include "common/status.h"
#include "common/strings.h"

namespace pd::engine {

size_t KvCache::BytesFor(const KvCacheOptions& o) {
  const size_t row = RowBytes(o.dtype, int64_t{o.n_kv_heads} * o.head_dim);
  return 2 * size_t(o.n_layer) * size_t(o.n_blocks) * size_t(o.block_size) * row;
}

absl::StatusOr<std::unique_ptr<KvCache>> KvCache::Create(const KvCacheOptions& o,
                                                         Backend& backend) {
  if (o.n_layer <= 0 || o.n_kv_heads <= 0 || o.head_dim <= 0 || o.block_size <= 0 ||
      o.n_blocks <= 0) {
    return absl::InvalidArgumentError(pd::StrCat(
        "KV cache options must be positive: layers ", o.n_layer, ", kv heads ", o.n_kv_heads,
        ", head dim ", o.head_dim, ", block size ", o.block_size, ", blocks ", o.n_blocks));
  }
  if (o.dtype != DType::kF16 && o.dtype != DType::kF32) {
    return absl::InvalidArgumentError(
        pd::StrCat("KV cache type ", Traits(o.dtype).name, " is not supported (f16, f32)"));
  }
  std::unique_ptr<KvCache> c(new KvCache());
  c->options_ = o;
  const int64_t cols = int64_t{o.n_kv_heads} * o.head_dim;
  const int64_t rows = int64_t{o.n_blocks} * o.block_size;
  for (int l = 0; l < o.n_layer; ++l) {
    for (int kv = 0; kv < 2; ++kv) {
      Tensor t{o.dtype, cols, rows, nullptr};
      PD_ASSIGN_OR_RETURN(std::unique_ptr<Buffer> buf, backend.Allocate(t.bytes()));
      t.data = buf->data();
      PD_RETURN_IF_ERROR(backend.Zero(t.data, t.bytes()));
      c->buffers_.push_back(std::move(buf));
      (kv == 0 ? c->k_ : c->v_).push_back(t);
    }
  }
  c->free_.reserve(o.n_blocks);
  for (int b = o.n_blocks - 1; b >= 0; --b) c->free_.push_back(b);
  return c;
}

absl::Status KvCache::Reserve(int64_t seq, int n_tokens) {
  std::vector<int32_t>& table = tables_[seq];
  const size_t need = (static_cast<size_t>(n_tokens) + options_.block_size - 1) / options_.block_size;
  if (need <= table.size()) return absl::OkStatus();
  const size_t more = need - table.size();
  if (more > free_.size()) {
    if (table.empty()) tables_.erase(seq);
    return absl::ResourceExhaustedError(pd::StrCat("KV cache full: sequence needs ", more,
                                                   " more blocks, ", free_.size(), " free"));
  }
  for (size_t i = 0; i < more; ++i) {
    table.push_back(free_.back());
    free_.pop_back();
  }
  return absl::OkStatus();
}

void KvCache::Free(int64_t seq) {
  auto it = tables_.find(seq);
  if (it == tables_.end()) return;
  for (int32_t b : it->second) free_.push_back(b);
  tables_.erase(it);
}

const std::vector<int32_t>& KvCache::BlockTable(int64_t seq) const {
  static const std::vector<int32_t> kEmpty;
  auto it = tables_.find(seq);
  return it == tables_.end() ? kEmpty : it->second;
}

int KvCache::Capacity(int64_t seq) const {
  return static_cast<int>(BlockTable(seq).size()) * options_.block_size;
}

}  // namespace pd::engine
