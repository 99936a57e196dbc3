#include "kvtransfer/kv_codec.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "common/status.h"
#include "common/strings.h"
#include "engine/backend/cpu/kernels.h"

namespace pd::kvtransfer {
namespace {

constexpr uint64_t kP1 = 11400714785074694791ULL;
constexpr uint64_t kP2 = 14029467366897019727ULL;
constexpr uint64_t kP3 = 1609587929392839161ULL;
constexpr uint64_t kP4 = 9650029242287828579ULL;
constexpr uint64_t kP5 = 2870177450012600261ULL;

inline uint64_t Rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }
inline uint64_t Read64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}
inline uint32_t Read32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
inline uint64_t Round(uint64_t acc, uint64_t input) {
  acc += input * kP2;
  acc = Rotl(acc, 31);
  return acc * kP1;
}
inline uint64_t MergeRound(uint64_t acc, uint64_t val) {
  acc ^= Round(0, val);
  return acc * kP1 + kP4;
}

const engine::cpu::Kernels& K() {
  static const engine::cpu::Kernels& k = engine::cpu::SelectKernels(/*force_scalar=*/false);
  return k;
}

}  // namespace

// XXH64 (Yann Collet's xxHash, 64-bit, seed 0), little-endian. Four independent lanes of 8 bytes:
// one multiply-rotate-multiply per 8 bytes per lane, about 1 byte per cycle per lane.
namespace {

inline void Stripe(uint64_t v[4], const uint8_t* p) {
  v[0] = Round(v[0], Read64(p));
  v[1] = Round(v[1], Read64(p + 8));
  v[2] = Round(v[2], Read64(p + 16));
  v[3] = Round(v[3], Read64(p + 24));
}

// The tail (< 32 bytes) and the avalanche, given the converged accumulator.
uint64_t Finish(uint64_t h, const uint8_t* p, const uint8_t* end) {
  while (p + 8 <= end) {
    h ^= Round(0, Read64(p));
    h = Rotl(h, 27) * kP1 + kP4;
    p += 8;
  }
  if (p + 4 <= end) {
    h ^= static_cast<uint64_t>(Read32(p)) * kP1;
    h = Rotl(h, 23) * kP2 + kP3;
    p += 4;
  }
  while (p < end) {
    h ^= static_cast<uint64_t>(*p) * kP5;
    h = Rotl(h, 11) * kP1;
    ++p;
  }
  h ^= h >> 33;
  h *= kP2;
  h ^= h >> 29;
  h *= kP3;
  h ^= h >> 32;
  return h;
}

uint64_t Converge(const uint64_t v[4]) {
  uint64_t h = Rotl(v[0], 1) + Rotl(v[1], 7) + Rotl(v[2], 12) + Rotl(v[3], 18);
  for (int i = 0; i < 4; ++i) h = MergeRound(h, v[i]);
  return h;
}

}  // namespace

uint64_t Checksum64(const void* data, size_t n) {
  const uint8_t* p = static_cast<const uint8_t*>(data);
  const uint8_t* const end = p + n;
  uint64_t h;
  if (n >= 32) {
    uint64_t v[4] = {kP1 + kP2, kP2, 0, 0 - kP1};
    do {
      Stripe(v, p);
      p += 32;
    } while (p + 32 <= end);
    h = Converge(v);
  } else {
    h = kP5;
  }
  return Finish(h + static_cast<uint64_t>(n), p, end);
}

void Checksum64Stream::Update(const void* data, size_t n) {
  const uint8_t* p = static_cast<const uint8_t*>(data);
  const uint8_t* const end = p + n;
  total_ += n;
  if (buf_len_ > 0) {
    const size_t take = std::min(n, 32 - buf_len_);
    std::memcpy(buf_ + buf_len_, p, take);
    buf_len_ += take;
    p += take;
    if (buf_len_ < 32) return;
    Stripe(v_, buf_);
    buf_len_ = 0;
  }
  while (p + 32 <= end) {
    Stripe(v_, p);
    p += 32;
  }
  std::memcpy(buf_, p, static_cast<size_t>(end - p));
  buf_len_ = static_cast<size_t>(end - p);
}

uint64_t Checksum64Stream::Digest() const {
  const uint64_t h = total_ >= 32 ? Converge(v_) : kP5;
  return Finish(h + total_, buf_, buf_ + buf_len_);
}

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
        const float scale =
            k.quantize_kv_i8(x, reinterpret_cast<int8_t*>(d) + r * hd, static_cast<int64_t>(hd));
        std::memcpy(d + rows * hd + r * 4, &scale, 4);
        break;
      }
    }
  }
}

absl::Status PackLayer(const TransferGeometry& g, KvDType source, int layer,
                       absl::Span<const engine::KvSpan> spans, absl::Span<uint8_t> out,
                       uint64_t* checksum) {
  Checksum64Stream hash;
  if (out.size() != g.LayerBytes()) {
    return absl::InvalidArgumentError(pd::StrCat("PackLayer: output holds ", out.size(),
                                                 " bytes, the layer needs ", g.LayerBytes()));
  }
  const size_t n = 2 * static_cast<size_t>(g.n_blocks());
  if (spans.size() < n) {
    return absl::InvalidArgumentError(pd::StrCat(
        "Push: layer ", layer, " has ", spans.size(), " spans, the transfer needs ", n, " (",
        g.n_blocks(), " blocks of ", g.block_size, " for ", g.n_tokens, " tokens, K and V)"));
  }
  const size_t src_bytes = g.SpanBytes(source), wire_bytes = g.SpanBytes(g.wire_dtype);
  for (size_t i = 0; i < n; ++i) {
    const engine::KvSpan& sp = spans[i];
    const engine::KvPart part = i % 2 == 0 ? engine::KvPart::kK : engine::KvPart::kV;
    if (sp.layer != layer || sp.block_index != static_cast<int>(i / 2) || sp.part != part) {
      return absl::InvalidArgumentError(pd::StrCat(
          "Push: span ", i, " is (layer ", sp.layer, ", block ", sp.block_index, ", ",
          sp.part == engine::KvPart::kK ? "K" : "V", "), expected (layer ", layer, ", block ",
          i / 2, ", ", part == engine::KvPart::kK ? "K" : "V", ") as KvCache::ExportSpans gives"));
    }
    if (sp.data == nullptr || sp.bytes != src_bytes) {
      return absl::InvalidArgumentError(pd::StrCat(
          "Push: span ", i, " has ", sp.bytes, " bytes", sp.data == nullptr ? " (null data)" : "",
          ", expected ", src_bytes, " (", engine::KvDTypeName(source), " block of ", g.block_size,
          " x ", g.n_kv_heads, " x ", g.head_dim, ")"));
    }
    ConvertBlock(source, sp.data, g.wire_dtype, out.data() + i * wire_bytes, g.block_size,
                 g.n_kv_heads, g.head_dim);
    if (checksum != nullptr) hash.Update(out.data() + i * wire_bytes, wire_bytes);
  }
  if (checksum != nullptr) *checksum = hash.Digest();
  return absl::OkStatus();
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
  for (int i = 0; i < 2 * g.n_blocks(); ++i) {
    const engine::KvPart part = i % 2 == 0 ? engine::KvPart::kK : engine::KvPart::kV;
    const uint8_t* src = payload.data() + static_cast<size_t>(i) * wire_bytes;
    if (g.wire_dtype == o.dtype) {
      PD_RETURN_IF_ERROR(cache.Import(seq, layer, i / 2, part, src, wire_bytes));
    } else {
      ConvertBlock(g.wire_dtype, src, o.dtype, tmp.data(), g.block_size, g.n_kv_heads, g.head_dim);
      PD_RETURN_IF_ERROR(cache.Import(seq, layer, i / 2, part, tmp.data(), cache_bytes));
    }
  }
  return absl::OkStatus();
}

}  // namespace pd::kvtransfer
