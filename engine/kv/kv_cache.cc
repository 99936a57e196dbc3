#include "engine/kv/kv_cache.h"

#include "common/status.h"
#include "common/strings.h"

namespace pd::engine {
namespace {

KvTensor LayerTensor(const KvCacheOptions& o) {
  KvTensor t;
  t.type = o.dtype;
  t.n_kv_heads = o.n_kv_heads;
  t.head_dim = o.head_dim;
  t.block_size = o.block_size;
  t.n_blocks = o.n_blocks;
  return t;
}

const char* PartName(KvPart part) { return part == KvPart::kK ? "K" : "V"; }

}  // namespace

KvBlockBytes KvCache::BlockBytesFor(const KvCacheOptions& o) {
  const KvTensor t = LayerTensor(o);
  KvBlockBytes b;
  b.values = t.block_value_bytes();
  b.scales = t.block_scale_bytes();
  return b;
}

size_t KvCache::BytesFor(const KvCacheOptions& o) {
  return size_t(o.n_layer) * size_t(o.n_blocks) * BlockBytesFor(o).per_layer();
}

absl::StatusOr<std::unique_ptr<KvCache>> KvCache::Create(const KvCacheOptions& o,
                                                         Backend& backend) {
  if (o.n_layer <= 0 || o.n_kv_heads <= 0 || o.head_dim <= 0 || o.block_size <= 0 ||
      o.n_blocks <= 0) {
    return absl::InvalidArgumentError(pd::StrCat(
        "KV cache options must be positive: layers ", o.n_layer, ", kv heads ", o.n_kv_heads,
        ", head dim ", o.head_dim, ", block size ", o.block_size, ", blocks ", o.n_blocks));
  }
  if (o.dtype != KvDType::kF16 && o.dtype != KvDType::kF32 && o.dtype != KvDType::kI8) {
    return absl::InvalidArgumentError(pd::StrCat("KV cache type ", static_cast<int>(o.dtype),
                                                 " is not supported (f16, f32, int8)"));
  }
  std::unique_ptr<KvCache> c(new KvCache(backend));
  c->options_ = o;
  for (int l = 0; l < o.n_layer; ++l) {
    for (int kv = 0; kv < 2; ++kv) {
      KvTensor t = LayerTensor(o);
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
  const size_t need =
      (static_cast<size_t>(n_tokens) + options_.block_size - 1) / options_.block_size;
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

absl::StatusOr<std::vector<KvSpan>> KvCache::ExportSpans(int64_t seq, int layer) const {
  auto it = tables_.find(seq);
  if (it == tables_.end()) {
    return absl::NotFoundError(pd::StrCat("KV export: unknown sequence ", seq));
  }
  if (layer < 0 || layer >= options_.n_layer) {
    return absl::InvalidArgumentError(
        pd::StrCat("KV export: layer ", layer, " outside [0, ", options_.n_layer, ")"));
  }
  const size_t span = BlockBytes().span();
  std::vector<KvSpan> spans;
  spans.reserve(2 * it->second.size());
  for (size_t i = 0; i < it->second.size(); ++i) {
    const size_t offset = static_cast<size_t>(it->second[i]) * span;
    for (KvPart part : {KvPart::kK, KvPart::kV}) {
      const KvTensor& t = part == KvPart::kK ? k_[layer] : v_[layer];
      spans.push_back(
          KvSpan{layer, static_cast<int>(i), part, static_cast<char*>(t.data) + offset, span});
    }
  }
  return spans;
}

absl::StatusOr<char*> KvCache::BlockAddress(int64_t seq, int layer, int block_index, KvPart part,
                                            const void* host, size_t bytes) const {
  auto it = tables_.find(seq);
  if (it == tables_.end()) {
    return absl::NotFoundError(
        pd::StrCat("KV block copy: unknown sequence ", seq, " (reserve its blocks first)"));
  }
  if (layer < 0 || layer >= options_.n_layer) {
    return absl::InvalidArgumentError(
        pd::StrCat("KV block copy: layer ", layer, " outside [0, ", options_.n_layer, ")"));
  }
  const std::vector<int32_t>& table = it->second;
  if (block_index < 0 || static_cast<size_t>(block_index) >= table.size()) {
    return absl::OutOfRangeError(pd::StrCat("KV block copy: block index ", block_index,
                                            " of sequence ", seq, ", which owns ", table.size(),
                                            " blocks"));
  }
  const KvBlockBytes bb = BlockBytes();
  if (bytes != bb.span()) {
    return absl::InvalidArgumentError(pd::StrCat(
        "KV block copy: size mismatch: ", bytes, " bytes for a ", PartName(part), " block of ",
        bb.span(), " (", KvDTypeName(options_.dtype), ", ", options_.block_size, " slots x ",
        options_.n_kv_heads, " heads x ", options_.head_dim, ": ", bb.values, " bytes of values + ",
        bb.scales, " of scales)"));
  }
  if (host == nullptr) return absl::InvalidArgumentError("KV block copy: null host buffer");
  const KvTensor& t = part == KvPart::kK ? k_[layer] : v_[layer];
  return static_cast<char*>(t.data) + static_cast<size_t>(table[block_index]) * bb.span();
}

absl::Status KvCache::Export(int64_t seq, int layer, int block_index, KvPart part, void* host_dst,
                             size_t bytes) {
  PD_ASSIGN_OR_RETURN(char* src, BlockAddress(seq, layer, block_index, part, host_dst, bytes));
  PD_RETURN_IF_ERROR(backend_.Download(host_dst, src, bytes));
  return backend_.Synchronize();
}

absl::Status KvCache::Import(int64_t seq, int layer, int block_index, KvPart part,
                             const void* host_src, size_t bytes) {
  PD_ASSIGN_OR_RETURN(char* dst, BlockAddress(seq, layer, block_index, part, host_src, bytes));
  return backend_.Upload(dst, host_src, bytes);
}

}  // namespace pd::engine
