#include "kvtransfer/kv_codec.h"

#include <algorithm>
#include <cstring>
#include <optional>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "common/strings.h"
#include "engine/backend/cpu/kernels.h"
#include "engine/backend/kv_rotation.h"

namespace pd::kvtransfer {
namespace {

const engine::cpu::Kernels& K() {
  static const engine::cpu::Kernels& k = engine::cpu::SelectKernels(/*force_scalar=*/false);
  return k;
}

}  // namespace

void ConvertBlock(KvDType from, const void* src, KvDType to, void* dst, int block_size,
                  int n_kv_heads, int head_dim) {
  const size_t rows = static_cast<size_t>(block_size) * static_cast<size_t>(n_kv_heads);
  const size_t hd = static_cast<size_t>(head_dim);
  if (from == to) {
    std::memcpy(dst, src,
                rows * hd * engine::KvValueBytes(from) + rows * engine::KvScaleBytes(from));
    return;
  }
  const engine::cpu::Kernels& k = K();
  const uint8_t* s = static_cast<const uint8_t*>(src);
  uint8_t* d = static_cast<uint8_t*>(dst);
  thread_local std::vector<float> tmp;
  tmp.resize(hd);
  if (from == KvDType::kF16 && to == KvDType::kI8) {  // the INT8 wire: one kernel per row
    for (size_t r = 0; r < rows; ++r) {
      const float scale =
          k.quantize_kv_i8_f16(reinterpret_cast<const uint16_t*>(s) + r * hd, tmp.data(),
                               reinterpret_cast<int8_t*>(d) + r * hd, head_dim);
      std::memcpy(d + rows * hd + r * 4, &scale, 4);
    }
    return;
  }
  if (from == KvDType::kI8 && to == KvDType::kF16) {  // importing it into an F16 cache
    for (size_t r = 0; r < rows; ++r) {
      float scale;
      std::memcpy(&scale, s + rows * hd + r * 4, 4);
      k.dequantize_kv_i8_f16(reinterpret_cast<const int8_t*>(s) + r * hd, scale, tmp.data(),
                             reinterpret_cast<uint16_t*>(d) + r * hd, head_dim);
    }
    return;
  }
  for (size_t r = 0; r < rows; ++r) {
    // Decode one token-head to F32 (exact for F16 and INT8 * scale up to F32 rounding).
    const float* x = tmp.data();
    switch (from) {
      case KvDType::kF32:
        x = reinterpret_cast<const float*>(s + r * hd * 4);
        break;
      case KvDType::kF16:
        k.f16_to_f32(reinterpret_cast<const uint16_t*>(s) + r * hd, tmp.data(),
                     static_cast<int64_t>(hd));
        break;
      case KvDType::kI8: {
        float scale;
        std::memcpy(&scale, s + rows * hd + r * 4, 4);
        const int8_t* q = reinterpret_cast<const int8_t*>(s) + r * hd;
        for (size_t i = 0; i < hd; ++i) tmp[i] = scale * static_cast<float>(q[i]);
        k.rotate_kv_row(tmp.data(), head_dim, 1.f);  // INT8 rows are stored rotated: undo it
        break;
      }
    }
    // Encode it in the target type.
    switch (to) {
      case KvDType::kF32:
        std::memcpy(d + r * hd * 4, x, hd * 4);
        break;
      case KvDType::kF16:
        k.f32_to_f16(x, reinterpret_cast<uint16_t*>(d) + r * hd, static_cast<int64_t>(hd));
        break;
      case KvDType::kI8: {
        if (x != tmp.data()) std::memcpy(tmp.data(), x, hd * sizeof(float));
        const float scale = engine::cpu::QuantizeKvRowI8(
            k, tmp.data(), reinterpret_cast<int8_t*>(d) + r * hd, head_dim);
        std::memcpy(d + rows * hd + r * 4, &scale, 4);
        break;
      }
    }
  }
}

namespace {

// The checks PackLayer, LayerRuns and LandLayer share: `spans` hold at least the layer's
// total_blocks blocks in ExportSpans order, those from first_block on each a non-null span of
// `source`'s size. `what` names the caller in the message.
absl::Status CheckSpans(const TransferGeometry& g, KvDType source, int layer,
                        absl::Span<const engine::KvSpan> spans, std::string_view what = "Push") {
  const size_t total = 2 * static_cast<size_t>(g.total_blocks());
  if (spans.size() < total) {
    return absl::InvalidArgumentError(pd::StrCat(
        what, ": layer ", layer, " has ", spans.size(), " spans, the transfer needs ", total, " (",
        g.total_blocks(), " blocks of ", g.block_size, " for ", g.n_tokens, " tokens, K and V)"));
  }
  const size_t src_bytes = g.SpanBytes(source);
  for (size_t i = 2 * static_cast<size_t>(g.first_block); i < total; ++i) {
    const engine::KvSpan& sp = spans[i];
    const engine::KvPart part = i % 2 == 0 ? engine::KvPart::kK : engine::KvPart::kV;
    if (sp.layer != layer || sp.block_index != static_cast<int>(i / 2) || sp.part != part) {
      return absl::InvalidArgumentError(pd::StrCat(
          what, ": span ", i, " is (layer ", sp.layer, ", block ", sp.block_index, ", ",
          sp.part == engine::KvPart::kK ? "K" : "V", "), expected (layer ", layer, ", block ",
          i / 2, ", ", part == engine::KvPart::kK ? "K" : "V", ") as KvCache::ExportSpans gives"));
    }
    if (sp.data == nullptr || sp.bytes != src_bytes) {
      return absl::InvalidArgumentError(pd::StrCat(
          what, ": span ", i, " has ", sp.bytes, " bytes", sp.data == nullptr ? " (null data)" : "",
          ", expected ", src_bytes, " (", engine::KvDTypeName(source), " block of ", g.block_size,
          " x ", g.n_kv_heads, " x ", g.head_dim, ")"));
    }
  }
  return absl::OkStatus();
}

// ExportSpans index of the span at wire position `w` (K blocks first, then V blocks; the wire
// starts at g.first_block).
inline size_t SpanOfWire(const TransferGeometry& g, size_t w) {
  const size_t nb = static_cast<size_t>(g.n_blocks()), first = static_cast<size_t>(g.first_block);
  return w < nb ? 2 * (first + w) : 2 * (first + w - nb) + 1;
}

}  // namespace

absl::Status PackLayer(const TransferGeometry& g, KvDType source, int layer,
                       absl::Span<const engine::KvSpan> spans, absl::Span<uint8_t> out,
                       uint64_t* checksum) {
  if (out.size() != g.LayerBytes()) {
    return absl::InvalidArgumentError(pd::StrCat("PackLayer: output holds ", out.size(),
                                                 " bytes, the layer needs ", g.LayerBytes()));
  }
  PD_RETURN_IF_ERROR(CheckSpans(g, source, layer, spans));
  const size_t nb = static_cast<size_t>(g.n_blocks());
  const size_t wire_bytes = g.SpanBytes(g.wire_dtype);
  std::optional<Checksum64Stream> hash;
  if (checksum != nullptr) hash.emplace();
  for (size_t w = 0; w < 2 * nb; ++w) {
    uint8_t* dst = out.data() + w * wire_bytes;
    ConvertBlock(source, spans[SpanOfWire(g, w)].data, g.wire_dtype, dst, g.block_size,
                 g.n_kv_heads, g.head_dim);
    if (hash) hash->Update(dst, wire_bytes);  // while the block is still in L1
  }
  if (hash) *checksum = hash->Digest();
  return absl::OkStatus();
}

absl::Status LayerRuns(const TransferGeometry& g, KvDType source, int layer,
                       absl::Span<const engine::KvSpan> spans, std::vector<ByteRun>* runs,
                       uint64_t* checksum) {
  if (source != g.wire_dtype) {
    return absl::InvalidArgumentError(pd::StrCat(
        "LayerRuns: the cache holds ", engine::KvDTypeName(source), " but the wire carries ",
        engine::KvDTypeName(g.wire_dtype), " (only a same-dtype layer can be sent in place)"));
  }
  PD_RETURN_IF_ERROR(CheckSpans(g, source, layer, spans));
  const size_t nb = static_cast<size_t>(g.n_blocks());
  const size_t bytes = g.SpanBytes(source);
  runs->clear();
  for (size_t w = 0; w < 2 * nb; ++w) {
    const uint8_t* p = static_cast<const uint8_t*>(spans[SpanOfWire(g, w)].data);
    if (!runs->empty() && runs->back().data + runs->back().bytes == p) {
      runs->back().bytes += bytes;
    } else {
      runs->push_back(ByteRun{p, bytes});
    }
  }
  if (checksum != nullptr) {
    Checksum64Stream hash;
    for (const ByteRun& r : *runs) hash.Update(r.data, r.bytes);
    *checksum = hash.Digest();
  }
  return absl::OkStatus();
}

absl::Status CheckLandingSpans(const TransferGeometry& g, int layer,
                               absl::Span<const engine::KvSpan> spans) {
  return CheckSpans(g, g.receiver_dtype, layer, spans, "receive target");
}

absl::StatusOr<uint64_t> LandLayer(const TransferGeometry& g, int layer,
                                   absl::Span<const uint8_t> payload,
                                   absl::Span<const engine::KvSpan> spans) {
  if (payload.size() != g.LayerBytes()) {
    return absl::InvalidArgumentError(pd::StrCat("LandLayer: payload of ", payload.size(),
                                                 " bytes, the layer has ", g.LayerBytes()));
  }
  PD_RETURN_IF_ERROR(CheckLandingSpans(g, layer, spans));
  const size_t nb = static_cast<size_t>(g.n_blocks());
  const size_t wire_bytes = g.SpanBytes(g.wire_dtype);
  Checksum64Stream hash;
  for (size_t w = 0; w < 2 * nb; ++w) {
    const uint8_t* src = payload.data() + w * wire_bytes;
    hash.Update(src, wire_bytes);  // then the copy reads the block from L1
    ConvertBlock(g.wire_dtype, src, g.receiver_dtype, spans[SpanOfWire(g, w)].data, g.block_size,
                 g.n_kv_heads, g.head_dim);
  }
  return hash.Digest();
}

absl::Status ImportLayer(const LayerPayload& payload, engine::KvCache& cache, int64_t seq) {
  return ImportLayer(payload.geometry, payload.layer, payload.data(), cache, seq);
}

absl::Status ImportLayer(const TransferGeometry& g, int layer, absl::Span<const uint8_t> payload,
                         engine::KvCache& cache, int64_t seq) {
  const engine::KvCacheOptions& o = cache.options();
  PD_RETURN_IF_ERROR(g.CheckCache(o));
  if (o.dtype != g.receiver_dtype) {
    return absl::FailedPreconditionError(
        pd::StrCat("KV cache dtype is ", engine::KvDTypeName(o.dtype),
                   " but the transfer was set up for ", engine::KvDTypeName(g.receiver_dtype)));
  }
  if (payload.size() != g.LayerBytes()) {
    return absl::InvalidArgumentError(pd::StrCat("ImportLayer: payload of ", payload.size(),
                                                 " bytes, the layer has ", g.LayerBytes()));
  }
  if (cache.Capacity(seq) < g.n_tokens) {
    return absl::FailedPreconditionError(
        pd::StrCat("sequence ", seq, " holds ", cache.Capacity(seq),
                   " positions, the transfer needs ", g.n_tokens, " (Reserve first)"));
  }
  const size_t wire_bytes = g.SpanBytes(g.wire_dtype), cache_bytes = cache.BlockBytes().span();
  std::vector<uint8_t> tmp(g.wire_dtype == o.dtype ? 0 : cache_bytes);
  const int nb = g.n_blocks();
  for (int w = 0; w < 2 * nb; ++w) {  // wire order: K of every block, then V
    const engine::KvPart part = w < nb ? engine::KvPart::kK : engine::KvPart::kV;
    const int block = g.first_block + (w < nb ? w : w - nb);
    const uint8_t* src = payload.data() + static_cast<size_t>(w) * wire_bytes;
    if (g.wire_dtype == o.dtype) {
      PD_RETURN_IF_ERROR(cache.Import(seq, layer, block, part, src, wire_bytes));
    } else {
      ConvertBlock(g.wire_dtype, src, o.dtype, tmp.data(), g.block_size, g.n_kv_heads, g.head_dim);
      PD_RETURN_IF_ERROR(cache.Import(seq, layer, block, part, tmp.data(), cache_bytes));
    }
  }
  return absl::OkStatus();
}

}  // namespace pd::kvtransfer
