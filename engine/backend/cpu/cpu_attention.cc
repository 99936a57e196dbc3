// The CPU backend's Attention over a paged KV cache (F32, F16 or INT8), in ggml's order.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "engine/backend/cpu/cpu_backend_internal.h"
#include "engine/backend/cpu/kernels.h"

namespace pd::engine::cpu {

// ---- Attention -----------------------------------------------------------------------------
// One work item is (tile of a sequence's rows, kv head): its rows and their n_heads / n_kv_heads
// query heads share every K/V row read. Two passes over the visible positions: scores (scale,
// softcap) into a scratch row per head, then the softmax probabilities and a weighted sum of V
// rows, all in ggml's order (see the comment before the work loop). Per token and head: 4 *
// head_dim * L flops over L visible positions; K/V bytes 2 * L * head_dim * elem per kv head
// (INT8: elem 1, plus 4 bytes of scale per row). INT8 is dequantized on the fly: the key's scale
// multiplies its unscaled int8 dot, the value's scale folds into the softmax weight.
absl::Status CpuBackend::Attention(const Tensor& q, const KvTensor& k_cache,
                                   const KvTensor& v_cache, const KvBatch& kv,
                                   const AttentionParams& p, Tensor& out) {
  PD_RETURN_IF_ERROR(CheckF32(q, "Attention q"));
  PD_RETURN_IF_ERROR(CheckF32(out, "Attention out"));
  PD_RETURN_IF_ERROR(CheckCache(k_cache, kv, "Attention k_cache"));
  PD_RETURN_IF_ERROR(CheckCache(v_cache, kv, "Attention v_cache"));
  if (p.n_heads <= 0 || p.n_kv_heads <= 0 || p.n_heads % p.n_kv_heads != 0 || p.head_dim <= 0 ||
      p.window < 0 || !(p.softcap >= 0.f) || !std::isfinite(p.softcap) || !std::isfinite(p.scale)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Attention: n_heads ", p.n_heads, ", n_kv_heads ", p.n_kv_heads, ", head_dim ", p.head_dim,
        ", window ", p.window, ", softcap ", p.softcap, ", scale ", p.scale));
  }
  const int64_t q_cols = static_cast<int64_t>(p.n_heads) * p.head_dim;
  if (q.cols != q_cols || k_cache.n_kv_heads != p.n_kv_heads || k_cache.head_dim != p.head_dim ||
      v_cache.n_kv_heads != p.n_kv_heads || v_cache.head_dim != p.head_dim) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Attention: q ", Describe(q), ", k_cache ", Describe(k_cache), ", v_cache ",
        Describe(v_cache), " for ", p.n_heads, "/", p.n_kv_heads, " heads of ", p.head_dim));
  }
  PD_RETURN_IF_ERROR(CheckSameShape(q, out, "Attention q/out"));
  if (!(out.data == q.data) && Overlap(q, out)) {
    return absl::InvalidArgumentError("Attention: out partially overlaps q");
  }
  const int64_t n_tokens = q.rows;
  PD_RETURN_IF_ERROR(CheckKvBatch(kv, n_tokens));
  const int64_t cache_rows = std::min(k_cache.slots(), v_cache.slots());
  auto first_visible = [&](int64_t t) -> int64_t {
    return p.window > 0 ? std::max<int64_t>(0, kv.pos[t] - p.window + 1) : 0;
  };
  for (int64_t t = 0; t < n_tokens; ++t) {
    const int64_t lo = first_visible(t);
    PD_RETURN_IF_ERROR(CheckSlots(kv, kv.seq[t], lo, kv.pos[t], cache_rows));
  }

  const int group = p.n_heads / p.n_kv_heads;
  const int64_t hd = p.head_dim;
  // q . k for an INT8 key (F32 and F16 keys are dotted as F32 rows in ggml's order below): the
  // unscaled int8 dot times the key's scale. INT8 keys are stored rotated (kv_rotation.h): `qh`
  // must be the query rotated by RotateKvRowOut.
  auto dot_i8 = [&](int64_t slot, int64_t kvh, const float* qh) -> float {
    float d;
    std::memcpy(&d, k_cache.scale(slot, static_cast<int>(kvh)), sizeof(float));
    return d * k_.dot_i8_f32(
                   reinterpret_cast<const int8_t*>(k_cache.values(slot, static_cast<int>(kvh))),
                   qh, hd);
  };
  // o += a * v for an INT8 value row: its scale folds into the weight (F32 and F16 rows are
  // summed by ak.vsum below). The sum stays in the rotated basis until RotateKvRowOut.
  auto axpy_i8 = [&](float a, int64_t slot, int64_t kvh, float* o) {
    float d;
    std::memcpy(&d, v_cache.scale(slot, static_cast<int>(kvh)), sizeof(float));
    k_.axpy_i8(a * d, reinterpret_cast<const int8_t*>(v_cache.values(slot, static_cast<int>(kvh))),
               o, hd);
  };
  // The addresses of head kvh's rows at positions lo..hi of sequence `sq` in cache `c`, walking
  // the block table a block at a time (a slot's block and offset cost two divisions, which per
  // position showed in profiles).
  auto row_addresses = [&]<typename T>(const KvTensor& c, int32_t sq, int64_t kvh, int64_t lo,
                                       int64_t hi, std::vector<const T*>& out) {
    out.resize(static_cast<size_t>(hi - lo + 1));
    const int64_t bs = kv.block_size;
    const size_t row_elems = static_cast<size_t>(c.row_elems());
    for (int64_t pos = lo; pos <= hi;) {
      const int64_t off = pos % bs, n = std::min(bs - off, hi - pos + 1);
      const T* r = reinterpret_cast<const T*>(
          c.values(int64_t{kv.block_tables[sq][pos / bs]} * bs + off, static_cast<int>(kvh)));
      for (int64_t i = 0; i < n; ++i) out[pos - lo + i] = r + i * row_elems;
      pos += n;
    }
  };
  // F16 rows shared by several query heads (GQA) are widened to F32 once and then dotted /
  // accumulated in F32 by every head of the group: exact (f16 -> f32 is), for a quarter of the
  // conversions with Gemma 3 270M's 4 heads per KV head.
  const bool widen_k = k_cache.type == KvDType::kF16 && group > 1;
  const bool widen_v = v_cache.type == KvDType::kF16 && group > 1;
  std::vector<int32_t> seq_rows;
  for (int64_t t = 0; t < n_tokens; ++t) {
    if (kv.seq[t] >= static_cast<int32_t>(seq_rows.size())) seq_rows.resize(kv.seq[t] + 1, 0);
    ++seq_rows[kv.seq[t]];
  }
  auto attn_wide = [&](int64_t t) {
    return kv.row_orders.empty() ? seq_rows[kv.seq[t]] > 1
                                 : (kv.row_orders[t] & kRowOrderAttnWide) != 0;
  };
  // Prompt rows (kRowOrderAttnWide) over an F16 cache take the GEMM order (AttnKernels::qk_gemm,
  // pv_gemm; docs/numerics.md): llama.cpp's bits are not kept with F16 K/V anyway (it rounds the
  // query and the probabilities to F16), and a GEMM's micro-tiles run attention over a long
  // prompt at several times the speed of ggml's order. Each row's bits still depend on its own
  // positions only, so chunking and batching change none. F32 caches keep ggml's order.
  static const bool ggml_order_only = CpuAttnGgmlOrderFromEnv().value_or(false);
  const bool gemm_cache =
      !ggml_order_only && k_cache.type == KvDType::kF16 && v_cache.type == KvDType::kF16;
  auto gemm_row = [&](int64_t t) { return gemm_cache && attn_wide(t); };
  // The other rows over an F16 V cache (generated tokens, speculative steps), and every row over
  // an INT8 one, sum V in one chain per column over their positions in order (n_acc = 1:
  // pv_gemm's chain, read from the cache's rows), not in ggml's L or 4L accumulators and their
  // tree: no llama.cpp bits to keep there either, and a decode row's attention costs about a
  // quarter less (docs/numerics.md).
  const bool chain_rows = !ggml_order_only && v_cache.type != KvDType::kF32;
  // A prompt's rows of one sequence read the same keys and values again and again (row t all
  // the positions before it): sequences with many rows in the batch get their visible K and V
  // widened to F32 once, [kv head][position][head_dim], and the rows read those (the same F32
  // kernels on the same values: bit-identical).
  // A sequence with GEMM-order rows gets its K in the blocked transposed layout of qk_gemm
  // (kAttnKeyBlock keys per block, position lo first) and its V as F32 rows, whatever its rows.
  struct WideSeq {
    int64_t lo = 0, hi = -1;  // positions widened (hi < lo: none)
    int64_t rows = 0;         // batch rows of the sequence
    bool gemm = false;        // K transposed for qk_gemm (else K as F32 rows)
    size_t offset = 0;        // into widened_kv_ (K; V follows after n_kv_heads * k_span())
    int64_t span() const { return hi - lo + 1; }
    int64_t k_span() const {  // positions per kv head of the K part (whole key blocks)
      return gemm ? (span() + kAttnKeyBlock - 1) / kAttnKeyBlock * kAttnKeyBlock : span();
    }
  };
  std::vector<WideSeq> wide;
  bool any_gemm = false;
  for (int64_t t = 0; t < n_tokens && !any_gemm; ++t) any_gemm = gemm_row(t);
  if ((widen_k && widen_v && n_tokens >= 16) || any_gemm) {
    int32_t n_seq = 0;
    for (int64_t t = 0; t < n_tokens; ++t) n_seq = std::max(n_seq, kv.seq[t] + 1);
    wide.resize(static_cast<size_t>(n_seq));
    for (int64_t t = 0; t < n_tokens; ++t) {
      WideSeq& w = wide[kv.seq[t]];
      const int64_t lo = first_visible(t);
      w.lo = w.rows == 0 ? lo : std::min(w.lo, lo);
      w.hi = w.rows == 0 ? kv.pos[t] : std::max<int64_t>(w.hi, kv.pos[t]);
      ++w.rows;
      w.gemm = w.gemm || gemm_row(t);
    }
    size_t total = 0;
    std::vector<std::pair<int32_t, int64_t>> jobs;  // (sequence, kv head) to widen
    for (int32_t sq = 0; sq < n_seq; ++sq) {
      WideSeq& w = wide[sq];
      if (!w.gemm && (w.rows < 8 || !(widen_k && widen_v && n_tokens >= 16))) {
        w.hi = w.lo - 1;  // few rows: widening per row costs no more
        continue;
      }
      w.offset = total;
      total += static_cast<size_t>(p.n_kv_heads * (w.k_span() + w.span()) * hd);
      for (int64_t h = 0; h < p.n_kv_heads; ++h) jobs.emplace_back(sq, h);
    }
    if (widened_kv_.size() < total) widened_kv_.resize(total);
    pool_.ParallelFor(static_cast<int64_t>(jobs.size()), [&](int64_t j0, int64_t j1) {
      for (int64_t j = j0; j < j1; ++j) {
        const auto [sq, h] = jobs[j];
        const WideSeq& w = wide[sq];
        float* kd = widened_kv_.data() + w.offset + h * w.k_span() * hd;
        float* vd = widened_kv_.data() + w.offset + (p.n_kv_heads * w.k_span() + h * w.span()) * hd;
        thread_local std::vector<float> key;
        key.resize(static_cast<size_t>(hd));
        for (int64_t pos = w.lo; pos <= w.hi; ++pos) {
          const int64_t slot = SlotOf(kv, sq, pos);
          const auto* kr =
              reinterpret_cast<const uint16_t*>(k_cache.values(slot, static_cast<int>(h)));
          if (w.gemm) {
            k_.f16_to_f32(kr, key.data(), hd);
            for (int64_t d = 0; d < hd; ++d) kd[AttnKeyBlockIndex(pos - w.lo, d, hd)] = key[d];
          } else {
            k_.f16_to_f32(kr, kd + (pos - w.lo) * hd, hd);
          }
          k_.f16_to_f32(
              reinterpret_cast<const uint16_t*>(v_cache.values(slot, static_cast<int>(h))),
              vd + (pos - w.lo) * hd, hd);
        }
        for (int64_t j = w.span(); j < w.k_span(); ++j) {  // the last block's unused keys
          for (int64_t d = 0; d < hd; ++d) kd[AttnKeyBlockIndex(j, d, hd)] = 0.f;
        }
      }
    });
  }
  // ggml's order (AttnKernels, kernels.h): positions are grouped by L = ak.lanes from position 0,
  // as llama.cpp's KV cells are; masked positions count as exact zeros. A row flagged
  // kRowOrderAttnWide (by default: a sequence with two or more rows in this batch) sums V like
  // tinyBLAS (L accumulators), the others like ggml_vec_dot_f32 (4L); over an F16 or INT8 V
  // cache, the rows that are not in the GEMM order sum V in one chain (chain_rows above).
  const cpu::AttnKernels& ak = k_.attn();
  const int64_t lanes = ak.lanes;
  // A prompt's rows of one sequence go in tiles of up to kTileRows rows close in position (sorted
  // by position, ranges within kTileSlack of the tile's first row): a tile's rows read each block
  // of keys while it is in L1 (ak.dots per row, kKeyBlock keys at a time) and each V segment once
  // for all of them (ak.vsums_rows), where a row alone streams the whole visible K and V from L2
  // or L3. Every (row, head, position) keeps its own range and order: the same bits as row by row.
  // INT8 caches and rows alone in their sequence (decode) go one row per tile.
  // GEMM-order tiles take rows until they hold about 32 query heads (the micro-tiles' reuse of
  // each key and value read), between 8 and kMaxTileRows rows.
  constexpr int kTileRows = 8, kMaxTileRows = 32;
  constexpr int64_t kI8Block = 32;  // INT8 rows widened at a time (32 x head_dim floats)
  const int gemm_tile_rows = std::clamp((32 + group - 1) / group, kTileRows, kMaxTileRows);
  constexpr int64_t kTileSlack = 64, kKeyBlock = 32;
  std::vector<int32_t> order(static_cast<size_t>(n_tokens));
  for (int64_t t = 0; t < n_tokens; ++t) order[t] = static_cast<int32_t>(t);
  const bool tiled = k_cache.type != KvDType::kI8 && v_cache.type != KvDType::kI8;
  if (tiled) {
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
      return kv.seq[a] != kv.seq[b] ? kv.seq[a] < kv.seq[b] : kv.pos[a] < kv.pos[b];
    });
  }
  struct Tile {
    int32_t first = 0, n = 0;  // rows order[first .. first + n)
    int64_t span = 0;          // scores per (row, head): positions a0 .. a1 of the tile
    bool gemm = false;         // rows in the GEMM order
  };
  std::vector<Tile> tiles;
  int64_t max_scratch = 0;
  for (int32_t i = 0; i < n_tokens;) {
    const int64_t t0 = order[i];
    Tile tile{i, 1, 0, gemm_row(t0)};
    const int max_rows = tile.gemm ? gemm_tile_rows : kTileRows;
    while (tiled && tile.n < max_rows && i + tile.n < n_tokens) {
      const int64_t t = order[i + tile.n];
      if (kv.seq[t] != kv.seq[t0] || attn_wide(t) != attn_wide(t0) ||
          std::abs(kv.pos[t] - kv.pos[t0]) > kTileSlack ||
          std::abs(first_visible(t) - first_visible(t0)) > kTileSlack) {
        break;
      }
      ++tile.n;
    }
    int64_t a0 = std::numeric_limits<int64_t>::max(), a1 = 0;
    for (int32_t r = 0; r < tile.n; ++r) {
      const int64_t t = order[i + r], lo = first_visible(t);
      a0 = std::min(a0, lo - lo % lanes);
      a1 = std::max<int64_t>(a1, (kv.pos[t] + lanes) / lanes * lanes);
    }
    tile.span = a1 - a0;
    max_scratch = std::max(max_scratch, tile.n * group * tile.span);
    tiles.push_back(tile);
    i += tile.n;
  }
  // Work items are (tile, kv head, slice of the group's query heads). With fewer tiles x kv heads
  // than threads (decode of one sequence: Gemma 3 270M has one KV head) the group's heads are
  // split so every thread has work; each slice widens the F16 rows it reads itself, and every
  // head's arithmetic is the same whichever slice computes it.
  const int64_t base_items = static_cast<int64_t>(tiles.size()) * p.n_kv_heads;
  const int64_t n_slices =
      base_items >= pool_.num_threads()
          ? 1
          : std::min<int64_t>(group, (pool_.num_threads() + base_items - 1) / base_items);
  pool_.ParallelFor(base_items * n_slices, [&](int64_t w0, int64_t w1) {
    // Per-thread scratch, kept across calls: the accumulator rows alone are 256 KiB for Gemma
    // (4 heads x 64 x 256 floats), and a fresh allocation per call (mmap'd, zeroed by the kernel)
    // cost 4% of a decode step.
    thread_local std::vector<float> scores, acc, rotated_q;
    thread_local std::vector<const float*> rows;         // F32 K or V rows (cache or widened)
    thread_local std::vector<const uint16_t*> rows_f16;  // F16 ones in the cache
    if (scores.size() < static_cast<size_t>(max_scratch)) {
      scores.resize(static_cast<size_t>(max_scratch));
    }
    if (v_cache.type == KvDType::kI8 && !chain_rows) {
      acc.resize(static_cast<size_t>(group * 4 * lanes * hd));
    }
    // INT8 rows widened for the chain (chain_rows): kI8Block rows of values, their scales, and the
    // slice's weights times the scales.
    thread_local std::vector<float> widened_i8, scales_i8, weights;
    if (chain_rows && (k_cache.type == KvDType::kI8 || v_cache.type == KvDType::kI8)) {
      widened_i8.resize(static_cast<size_t>(kI8Block * hd));
      scales_i8.resize(static_cast<size_t>(kI8Block));
      weights.resize(static_cast<size_t>(group * kI8Block));
    }
    thread_local std::vector<const float*> pw;
    thread_local std::vector<float*> ow;
    // Positions kb .. kb + n - 1 (n <= kI8Block) of sequence sq's INT8 rows of head kvh in `cache`
    // into widened_i8 (rows[] point at them); returns their scales.
    auto widen_i8 = [&](const KvTensor& cache, int32_t sq, int64_t kb, int64_t n, int64_t kvh) {
      if (rows.size() < static_cast<size_t>(n)) rows.resize(static_cast<size_t>(n));
      for (int64_t j = 0; j < n; ++j) {
        const int64_t slot = SlotOf(kv, sq, kb + j);
        std::memcpy(&scales_i8[j], cache.scale(slot, static_cast<int>(kvh)), sizeof(float));
        float* w = widened_i8.data() + j * hd;
        k_.widen_i8(reinterpret_cast<const int8_t*>(cache.values(slot, static_cast<int>(kvh))), w,
                    hd);
        rows[j] = w;
      }
      return scales_i8.data();
    };
    if (k_cache.type == KvDType::kI8) rotated_q.resize(static_cast<size_t>(group * hd));
    for (int64_t item = w0; item < w1; ++item) {
      const int64_t slice = item % n_slices;
      const Tile& tile = tiles[item / n_slices / p.n_kv_heads];
      const int64_t kvh = item / n_slices % p.n_kv_heads;
      const int g0 = static_cast<int>(slice * group / n_slices);
      const int g1 = static_cast<int>((slice + 1) * group / n_slices);
      const int nr = tile.n;
      const int32_t* trow = order.data() + tile.first;
      const int32_t seq = kv.seq[trow[0]];
      // Row r of the tile: positions [lo[r], hi[r]], its scores at sc(r, g)[pos - a0], the
      // tile's union of positions [lo_min, hi_max].
      int64_t lo[kMaxTileRows], hi[kMaxTileRows];
      int64_t a0 = std::numeric_limits<int64_t>::max(), lo_min = a0, hi_max = 0;
      for (int r = 0; r < nr; ++r) {
        lo[r] = first_visible(trow[r]);
        hi[r] = kv.pos[trow[r]];
        a0 = std::min(a0, lo[r] - lo[r] % lanes);
        lo_min = std::min(lo_min, lo[r]);
        hi_max = std::max(hi_max, hi[r]);
      }
      const int64_t span = tile.span;
      auto sc = [&](int r, int g) { return scores.data() + (r * group + g) * span; };
      const int64_t n_acc = chain_rows ? 1 : attn_wide(trow[0]) ? lanes : 4 * lanes;
      // Row r's query (the group's first head).
      auto q_row = [&](int r) { return RowF32(q, trow[r]) + kvh * group * hd; };
      // This tile's sequence widened above: its K and V rows in F32, indexed by position - w.lo.
      const float* wk = nullptr;
      const float* wv = nullptr;
      if (!wide.empty() && wide[seq].hi >= wide[seq].lo && !wide[seq].gemm) {
        const WideSeq& w = wide[seq];
        wk = widened_kv_.data() + w.offset + (kvh * w.span() + (lo_min - w.lo)) * hd;
        wv = wk + p.n_kv_heads * w.span() * hd;
      }
      // The tile's rows [lo_min, hi_max] of `cache` (K or V): the widened copy `w` or the
      // cache's F32 rows into `rows`, or its F16 rows into `rows_f16`; true for F16.
      auto gather = [&](const KvTensor& cache, const float* w) {
        if (w != nullptr) {
          rows.resize(static_cast<size_t>(hi_max - lo_min + 1));
          for (int64_t j = 0; j <= hi_max - lo_min; ++j) rows[j] = w + j * hd;
          return false;
        }
        if (cache.type != KvDType::kF16) {
          row_addresses(cache, seq, kvh, lo_min, hi_max, rows);
          return false;
        }
        row_addresses(cache, seq, kvh, lo_min, hi_max, rows_f16);
        return true;
      };
      // Pass 1: scores (ak.dots: bit for bit ak.dot per pair; a GEMM tile: ak.qk_gemm over the
      // tile's union of positions), -inf outside [lo, hi].
      auto mask_outside = [&] {
        for (int r = 0; r < nr; ++r) {
          for (int g = g0; g < g1; ++g) {
            float* sg = sc(r, g);
            std::fill(sg, sg + (lo[r] - a0), -std::numeric_limits<float>::infinity());
            std::fill(sg + (hi[r] + 1 - a0), sg + span, -std::numeric_limits<float>::infinity());
          }
        }
      };
      const WideSeq* gw = tile.gemm ? &wide[seq] : nullptr;
      const float* qs[kMaxTileRows * 4];  // GEMM tiles: (row, head) query and output rows
      float* os[kMaxTileRows * 4];
      const int n_pairs = nr * (g1 - g0);
      std::vector<const float*> qs_heap;
      std::vector<float*> os_heap;
      const float** qp = qs;
      float** op = os;
      if (tile.gemm && n_pairs > kMaxTileRows * 4) {
        qs_heap.resize(static_cast<size_t>(n_pairs));
        os_heap.resize(static_cast<size_t>(n_pairs));
        qp = qs_heap.data();
        op = os_heap.data();
      }
      if (!tile.gemm) mask_outside();
      if (tile.gemm) {
        for (int r = 0; r < nr; ++r) {
          for (int g = g0; g < g1; ++g) {
            qp[r * (g1 - g0) + g - g0] = q_row(r) + g * hd;
            op[r * (g1 - g0) + g - g0] = sc(r, g) + (lo_min - a0);
          }
        }
        const float* kt = widened_kv_.data() + gw->offset + kvh * gw->k_span() * hd;
        ak.qk_gemm(qp, n_pairs, kt, hd, lo_min - gw->lo, hi_max - lo_min + 1, op);
        mask_outside();
      } else if (k_cache.type == KvDType::kI8) {
        // INT8 keys are stored rotated: so is the query they are dotted with (tiles of one row).
        const float* qh = q_row(0);
        std::memcpy(rotated_q.data() + g0 * hd, qh + g0 * hd,
                    static_cast<size_t>((g1 - g0) * hd) * sizeof(float));
        for (int g = g0; g < g1; ++g) k_.rotate_kv_row(rotated_q.data() + g * hd, p.head_dim, 1.f);
        if (chain_rows) {
          // kI8Block keys at a time widened to F32 (exact) for all the slice's heads (ak.dots),
          // each score then times its key's scale.
          for (int64_t kb = lo[0]; kb <= hi[0]; kb += kI8Block) {
            const int64_t n = std::min(kI8Block, hi[0] - kb + 1);
            const float* d = widen_i8(k_cache, seq, kb, n, kvh);
            ak.dots(rotated_q.data() + g0 * hd, hd, g1 - g0, rows.data(), static_cast<int>(n), hd,
                    sc(0, g0) + (kb - a0), span);
            for (int g = g0; g < g1; ++g) {
              float* s = sc(0, g) + (kb - a0);
              for (int64_t j = 0; j < n; ++j) s[j] *= d[j];
            }
          }
        } else {
          for (int64_t pos = lo[0]; pos <= hi[0]; ++pos) {
            for (int g = g0; g < g1; ++g) {
              sc(0, g)[pos - a0] = dot_i8(SlotOf(kv, seq, pos), kvh, rotated_q.data() + g * hd);
            }
          }
        }
      } else {
        // F32 and F16 keys, all the slice's heads per key read (F16 keys widened as loaded); a
        // tile's rows take the keys kKeyBlock at a time, each block for every row while in L1.
        const bool f16 = gather(k_cache, wk);
        const int64_t n_k = hi_max - lo_min + 1;
        const int64_t block = nr == 1 ? n_k : kKeyBlock;
        for (int64_t kb = lo_min; kb <= hi_max; kb += block) {
          for (int r = 0; r < nr; ++r) {
            const int64_t j0 = std::max(kb, lo[r]), j1 = std::min(kb + block - 1, hi[r]);
            if (j0 > j1) continue;
            const float* qg = q_row(r) + g0 * hd;
            float* s0 = sc(r, g0) + (j0 - a0);
            const int nk = static_cast<int>(j1 - j0 + 1);
            if (f16) {
              ak.dots_f16(qg, hd, g1 - g0, rows_f16.data() + (j0 - lo_min), nk, hd, s0, span);
            } else {
              ak.dots(qg, hd, g1 - g0, rows.data() + (j0 - lo_min), nk, hd, s0, span);
            }
          }
        }
      }
      for (int r = 0; r < nr; ++r) {
        for (int g = g0; g < g1; ++g) {
          float* sg = sc(r, g) + (lo[r] - a0);
          if (p.softcap > 0.f) {
            for (int64_t j = 0; j <= hi[r] - lo[r]; ++j) {
              sg[j] = p.softcap * std::tanh(sg[j] * p.scale / p.softcap);
            }
          } else {
            for (int64_t j = 0; j <= hi[r] - lo[r]; ++j) sg[j] *= p.scale;
          }
        }
      }
      // Softmax: exponentials and their F64 sum over whole groups of L positions (the row's own
      // groups, from lo - lo % L), then the probabilities scaled by the F32 reciprocal. The
      // tile's queries are fully read by now, so out may alias q.
      for (int r = 0; r < nr; ++r) {
        const int64_t ar0 = lo[r] - lo[r] % lanes, ar1 = (hi[r] + lanes) / lanes * lanes;
        for (int g = g0; g < g1; ++g) {
          float* sg = sc(r, g);
          const float m = k_.max(sg + (lo[r] - a0), hi[r] - lo[r] + 1);
          const float inv =
              static_cast<float>(1.0 / ak.exp_sum(sg + (ar0 - a0), m, sg + (ar0 - a0), ar1 - ar0));
          for (int64_t j = lo[r] - a0; j <= hi[r] - a0; ++j) sg[j] *= inv;
        }
      }
      // Pass 2: position pos adds p * v into accumulator pos % n_acc; then the accumulators are
      // summed in ggml's tree. F32 and F16 rows go through ak.vsums (one row) or ak.vsums_rows
      // (a tile), which keep the accumulators in registers and read each V row once for all the
      // slice's heads (and the tile's rows; F16 rows widened as they are loaded, or a prompt's
      // once per sequence above); INT8 rows, whose scale folds into the weight, through n_acc
      // rows.
      if (tile.gemm) {
        // Each row's sums run over its own positions only, in order: the tile's union of
        // positions is cut where any row's range starts or ends, and each piece goes to the rows
        // that cover it (qp: their probabilities, op: their output rows, zeroed first).
        const float* vbase =
            widened_kv_.data() + gw->offset + (p.n_kv_heads * gw->k_span() + kvh * gw->span()) * hd;
        for (int r = 0; r < nr; ++r) {
          float* o = RowF32(out, trow[r]) + kvh * group * hd + g0 * hd;
          std::fill(o, o + (g1 - g0) * hd, 0.f);
        }
        int64_t cuts[2 * kMaxTileRows];
        int n_cuts = 0;
        for (int r = 0; r < nr; ++r) {
          cuts[n_cuts++] = lo[r];
          cuts[n_cuts++] = hi[r] + 1;
        }
        std::sort(cuts, cuts + n_cuts);
        n_cuts = static_cast<int>(std::unique(cuts, cuts + n_cuts) - cuts);
        for (int c = 0; c + 1 < n_cuts; ++c) {
          const int64_t j0 = cuts[c], j1 = cuts[c + 1];  // positions [j0, j1)
          int n_active = 0;
          for (int r = 0; r < nr; ++r) {
            if (lo[r] > j0 || hi[r] < j1 - 1) continue;
            float* o = RowF32(out, trow[r]) + kvh * group * hd;
            for (int g = g0; g < g1; ++g) {
              qp[n_active] = sc(r, g) + (j0 - a0);
              op[n_active++] = o + g * hd;
            }
          }
          if (n_active == 0) continue;
          ak.pv_gemm(qp, n_active, vbase + (j0 - gw->lo) * hd, hd, j1 - j0, hd, op);
        }
        continue;
      }
      if (v_cache.type != KvDType::kI8) {
        const float* pr[kTileRows];
        float* orow[kTileRows];
        for (int r = 0; r < nr; ++r) {
          pr[r] = sc(r, g0) + (lo[r] - a0);
          orow[r] = RowF32(out, trow[r]) + kvh * group * hd + g0 * hd;
        }
        const bool f16 = gather(v_cache, wv);
        if (nr == 1 && f16) {
          ak.vsums_f16(pr[0], span, g1 - g0, rows_f16.data(), lo[0], hi[0], static_cast<int>(n_acc),
                       hd, orow[0], hd);
        } else if (nr == 1) {
          ak.vsums(pr[0], span, g1 - g0, rows.data(), lo[0], hi[0], static_cast<int>(n_acc), hd,
                   orow[0], hd);
        } else if (f16) {
          ak.vsums_rows_f16(pr, span, g1 - g0, nr, rows_f16.data(), lo_min, lo, hi,
                            static_cast<int>(n_acc), hd, orow, hd);
        } else {
          ak.vsums_rows(pr, span, g1 - g0, nr, rows.data(), lo_min, lo, hi, static_cast<int>(n_acc),
                        hd, orow, hd);
        }
        continue;
      }
      float* oh = RowF32(out, trow[0]) + kvh * group * hd;
      if (n_acc == 1) {
        // The chain, kI8Block values at a time widened to F32 (exact) for all the slice's heads
        // (ak.pv_gemm continues each output's chain), each weight times its value's scale: per
        // position fma(p * scale, q, o), axpy_i8's arithmetic.
        pw.resize(static_cast<size_t>(g1 - g0));
        ow.resize(static_cast<size_t>(g1 - g0));
        for (int g = g0; g < g1; ++g) {
          ow[g - g0] = oh + g * hd;
          std::fill(oh + g * hd, oh + (g + 1) * hd, 0.f);
        }
        for (int64_t kb = lo[0]; kb <= hi[0]; kb += kI8Block) {
          const int64_t n = std::min(kI8Block, hi[0] - kb + 1);
          const float* d = widen_i8(v_cache, seq, kb, n, kvh);
          for (int g = g0; g < g1; ++g) {
            float* w = weights.data() + (g - g0) * kI8Block;
            const float* pg = sc(0, g) + (kb - a0);
            for (int64_t j = 0; j < n; ++j) w[j] = pg[j] * d[j];
            pw[g - g0] = w;
          }
          ak.pv_gemm(pw.data(), g1 - g0, widened_i8.data(), hd, n, hd, ow.data());
        }
        for (int g = g0; g < g1; ++g) k_.rotate_kv_row(oh + g * hd, p.head_dim, 1.f);
        continue;
      }
      std::fill(acc.begin() + g0 * n_acc * hd, acc.begin() + g1 * n_acc * hd, 0.f);
      for (int64_t pos = lo[0]; pos <= hi[0]; ++pos) {
        const int64_t r = pos % n_acc;
        for (int g = g0; g < g1; ++g) {
          const float pj = sc(0, g)[pos - a0];
          float* ar = acc.data() + (g * n_acc + r) * hd;
          axpy_i8(pj, SlotOf(kv, seq, pos), kvh, ar);
        }
      }
      for (int g = g0; g < g1; ++g) {
        ak.reduce(acc.data() + g * n_acc * hd, static_cast<int>(n_acc), hd, hd, oh + g * hd);
        k_.rotate_kv_row(oh + g * hd, p.head_dim, 1.f);  // the weighted sum of rotated values, back
      }
    }
  });
  return absl::OkStatus();
}

}  // namespace pd::engine::cpu
