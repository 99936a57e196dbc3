#include "engine/kv/kv_cache.h"

#include <algorithm>
#include <cstring>

#include "common/status.h"
#include "common/strings.h"
#include "engine/backend/cpu/kernels.h"

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
  const std::vector<Backend*> all(static_cast<size_t>(std::max(o.n_layer, 0)), &backend);
  return Create(o, absl::MakeConstSpan(all));
}

absl::StatusOr<std::unique_ptr<KvCache>> KvCache::Create(
    const KvCacheOptions& o, absl::Span<Backend* const> layer_backends) {
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
  if (o.prefix_cache.compress_idle_ms < 0) {
    return absl::InvalidArgumentError(pd::StrCat("prefix cache compress_idle_ms must be >= 0, got ",
                                                 o.prefix_cache.compress_idle_ms));
  }
  if (layer_backends.size() != static_cast<size_t>(o.n_layer) ||
      std::find(layer_backends.begin(), layer_backends.end(), nullptr) != layer_backends.end()) {
    return absl::InvalidArgumentError(pd::StrCat("KV cache: ", layer_backends.size(),
                                                 " layer backends given (none may be null) for ",
                                                 o.n_layer, " layers"));
  }
  bool host = true;
  for (Backend* b : layer_backends) host = host && b->host_memory();
  if (o.prefix_cache.compress_idle_ms > 0 && (o.dtype != KvDType::kF16 || !host)) {
    return absl::InvalidArgumentError(
        pd::StrCat("prefix cache compression (compress_idle_ms ", o.prefix_cache.compress_idle_ms,
                   ") needs an f16 KV cache in host memory (the CPU backend); this cache is ",
                   KvDTypeName(o.dtype), " on ", layer_backends.front()->name()));
  }
  if (o.prefix_cache.min_free_blocks < 0 || o.prefix_cache.summary_blocks < 0) {
    return absl::InvalidArgumentError(pd::StrCat(
        "prefix cache options must be >= 0: min_free_blocks ", o.prefix_cache.min_free_blocks,
        ", summary_blocks ", o.prefix_cache.summary_blocks));
  }
  std::unique_ptr<KvCache> c(new KvCache());
  c->options_ = o;
  c->backends_.assign(layer_backends.begin(), layer_backends.end());
  c->host_memory_ = host;
  for (int l = 0; l < o.n_layer; ++l) {
    Backend& backend = *layer_backends[l];
    for (int kv = 0; kv < 2; ++kv) {
      KvTensor t = LayerTensor(o);
      PD_ASSIGN_OR_RETURN(std::unique_ptr<Buffer> buf, backend.Allocate(t.bytes()));
      t.data = buf->data();
      PD_RETURN_IF_ERROR(backend.Zero(t.data, t.bytes()));
      c->buffers_.push_back(std::move(buf));
      (kv == 0 ? c->k_ : c->v_).push_back(t);
    }
  }
  c->blocks_ = std::make_unique<BlockManager>(o.n_blocks, o.block_size, o.prefix_cache);
  return c;
}

absl::Status KvCache::Reserve(int64_t seq, int n_tokens) { return blocks_->Reserve(seq, n_tokens); }

void KvCache::Free(int64_t seq) { blocks_->Free(seq); }

int KvCache::MatchPrefix(int64_t seq, absl::Span<const int32_t> tokens, int max_tokens) {
  if (options_.prefix_cache.compress_idle_ms <= 0) {
    return blocks_->MatchPrefix(seq, tokens, max_tokens);
  }
  return blocks_->MatchPrefix(seq, tokens, max_tokens, [this](int32_t b, int32_t page, int slot) {
    ExpandBlock(b, page, slot);
  });
}

int KvCache::CompressIdle(absl::Time now, int max_blocks) {
  if (options_.prefix_cache.compress_idle_ms <= 0) return 0;
  return blocks_->CompressIdle(
      now, absl::Milliseconds(options_.prefix_cache.compress_idle_ms), max_blocks,
      [this](int32_t b, int32_t page, int slot) { CompressBlock(b, page, slot); });
}

bool KvCache::HasIdleBlocks(absl::Time now) const {
  return options_.prefix_cache.compress_idle_ms > 0 &&
         blocks_->HasIdleBlocks(now, absl::Milliseconds(options_.prefix_cache.compress_idle_ms));
}

// One block's K and V of every layer, F16 [block_size][n_kv_heads][head_dim], become INT8 rows in
// the engine's INT8 KV scheme (rotated, one F32 scale per row: kv_layout.h) written into half of
// the page's span; the scales go to page_scales_. Two such halves fill one F16 span exactly.
// The kernel table's fused rows (AVX-512 where the CPU has it, else AVX2 or scalar twins that
// give the same bytes). Per block: reads 2 x span x layers bytes, writes half as many.
void KvCache::CompressBlock(int32_t block, int32_t page, int slot) {
  const cpu::Kernels& k = cpu::SelectKernels(/*force_scalar=*/false);
  const int hd = options_.head_dim;
  const size_t rows = static_cast<size_t>(options_.block_size) * options_.n_kv_heads;
  const size_t span = BlockBytes().span();
  std::vector<float>& scales = page_scales_[int64_t{page} * BlockManager::kPageSlots + slot];
  scales.resize(static_cast<size_t>(options_.n_layer) * 2 * rows);
  std::vector<float> tmp(hd);
  std::vector<uint16_t> row(hd);
  for (int l = 0; l < options_.n_layer; ++l) {
    for (int part = 0; part < 2; ++part) {
      char* base = static_cast<char*>((part == 0 ? k_ : v_)[l].data);
      const uint16_t* src = reinterpret_cast<const uint16_t*>(base + block * span);
      int8_t* dst = reinterpret_cast<int8_t*>(base + page * span + slot * (span / 2));
      float* sc = scales.data() + (static_cast<size_t>(l) * 2 + part) * rows;
      // In place (page == block, slot 0): INT8 row r lands on bytes [r hd, (r + 1) hd), before
      // F16 row r + 1 starts (2 (r + 1) hd), so no row is overwritten before it is read; row r
      // itself is copied out first.
      for (size_t r = 0; r < rows; ++r) {
        std::memcpy(row.data(), src + r * hd, hd * sizeof(uint16_t));
        sc[r] = k.quantize_kv_i8_f16(row.data(), tmp.data(), dst + r * hd, hd);
      }
    }
  }
}

void KvCache::ExpandBlock(int32_t block, int32_t page, int slot) {
  const cpu::Kernels& k = cpu::SelectKernels(/*force_scalar=*/false);
  const int hd = options_.head_dim;
  const size_t rows = static_cast<size_t>(options_.block_size) * options_.n_kv_heads;
  const size_t span = BlockBytes().span();
  auto it = page_scales_.find(int64_t{page} * BlockManager::kPageSlots + slot);
  PD_CHECK(it != page_scales_.end());
  const std::vector<float>& scales = it->second;
  std::vector<float> tmp(hd);
  for (int l = 0; l < options_.n_layer; ++l) {
    for (int part = 0; part < 2; ++part) {
      char* base = static_cast<char*>((part == 0 ? k_ : v_)[l].data);
      const int8_t* src = reinterpret_cast<const int8_t*>(base + page * span + slot * (span / 2));
      uint16_t* dst = reinterpret_cast<uint16_t*>(base + block * span);
      const float* sc = scales.data() + (static_cast<size_t>(l) * 2 + part) * rows;
      for (size_t r = 0; r < rows; ++r) {
        k.dequantize_kv_i8_f16(src + r * hd, sc[r], tmp.data(), dst + r * hd, hd);
      }
    }
  }
  page_scales_.erase(it);
}

const std::vector<int32_t>& KvCache::BlockTable(int64_t seq) const { return blocks_->Table(seq); }

int KvCache::Capacity(int64_t seq) const {
  return static_cast<int>(BlockTable(seq).size()) * options_.block_size;
}

absl::StatusOr<std::vector<KvSpan>> KvCache::ExportSpans(int64_t seq, int layer) const {
  const std::vector<int32_t>& table = BlockTable(seq);
  if (table.empty()) {
    return absl::NotFoundError(pd::StrCat("KV export: unknown sequence ", seq));
  }
  if (layer < 0 || layer >= options_.n_layer) {
    return absl::InvalidArgumentError(
        pd::StrCat("KV export: layer ", layer, " outside [0, ", options_.n_layer, ")"));
  }
  const size_t span = BlockBytes().span();
  std::vector<KvSpan> spans;
  spans.reserve(2 * table.size());
  for (size_t i = 0; i < table.size(); ++i) {
    const size_t offset = static_cast<size_t>(table[i]) * span;
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
  const std::vector<int32_t>& table = BlockTable(seq);
  if (table.empty()) {
    return absl::NotFoundError(
        pd::StrCat("KV block copy: unknown sequence ", seq, " (reserve its blocks first)"));
  }
  if (layer < 0 || layer >= options_.n_layer) {
    return absl::InvalidArgumentError(
        pd::StrCat("KV block copy: layer ", layer, " outside [0, ", options_.n_layer, ")"));
  }
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
                             size_t bytes) const {
  PD_ASSIGN_OR_RETURN(char* src, BlockAddress(seq, layer, block_index, part, host_dst, bytes));
  PD_RETURN_IF_ERROR(backends_[layer]->Download(host_dst, src, bytes));
  return backends_[layer]->Synchronize();
}

absl::Status KvCache::Import(int64_t seq, int layer, int block_index, KvPart part,
                             const void* host_src, size_t bytes) {
  PD_ASSIGN_OR_RETURN(char* dst, BlockAddress(seq, layer, block_index, part, host_src, bytes));
  if (blocks_->ReadOnly(BlockTable(seq)[block_index])) {
    return absl::FailedPreconditionError(
        pd::StrCat("KV import: block ", block_index, " of sequence ", seq,
                   " is shared or in the prefix cache; it cannot be overwritten"));
  }
  return backends_[layer]->Upload(dst, host_src, bytes);
}

}  // namespace pd::engine
