// AVX2 grouped GEMMs of Q5_0, Q8_0, Q4_K and Q6_K weights x many activation rows (prompts, batched
// decode): the GroupedKernels contract of kernels.h, eight activation rows per 256-bit register.
//
// The AVX2 tile (TileQ5_0, matmul_avx2.cc) keeps, per (weight row, activation row) pair and
// block, ggml's 8 int32 lanes (lane p: the products of weights 4p..4p+3) and one FMA per block
// into an 8-lane F32 accumulator, summed in HSum's order at the end. Here the pair's lane p sits
// in lane c of accumulator p: for one weight row, a group of 8 activation rows, block b and
// group p, the row's four codes (0..31) are broadcast, maddubs multiplies them (unsigned) with
// the 8 activation rows' four bytes (signed; pairs at most 2 * 31 * 128 in magnitude, so int16
// never saturates), madd with ones adds the pairs, and the -16 offset enters as the lane's start
// value (-16 times the sum of those four activation bytes, packed once per MatMul). So every int32
// is the tile's, and so is every F32 step (d_w * d_x, one FMA per block in block order, the lane
// sum ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7))): the results are bit-identical, for
// every row count (tests/engine/backend/cpu_kernels_test.cc compares them).
//
// Why: the 4 x 4 tile unpacks each weight block once per 4 activation rows and needs more than
// the 16 registers (its 16 accumulators, 16 activation vectors and their offsets spill). Here a
// chunk's rows are unpacked once per MatMul (pack_w), the loop holds 8 accumulators, and per 32
// products it issues 5 vector ops (maddubs, madd, add, cvt, fma) and half a broadcast, no shuffle
// (gemv_bench prompt/q5_0/1 on Zen 3: 27.8-30.0 -> 15.3 ms; the broadcast shared by two groups
// of activation rows, 23.2 -> 21.7 ms in alternating runs on a busy host).
//
// Q4_K in llama.cpp's repacked GEMM order (the AVX2 TileQ4KRepackGemm, k_quants_avx2.cc) takes
// the same form: per (weight row, prompt row) pair and super-block, four exact pair sums
// (sub-blocks 2p and 2p + 1, each sum of products times its 6-bit scale) and four min sums, each
// one FMA into a per-pair F32 accumulator. With prompt rows in lanes, the sums build up in int32
// lanes directly, with no lane reduction: per sub-block and group of four weights, one broadcast
// of the row's codes (0..15) serves two groups of 8 prompt rows (maddubs into int16, at most
// 8 * 2 * 15 * 128 = 30720 after the sub-block's 8 groups, so no saturation), then one madd by the
// sub-block scale per group. Per 32 products about 3 vector ops, against about 5.4 in the tile
// (prompt/q4_K/1: 20.0 -> 8.7 ms). Q6_K in llama.cpp's tiled order sums a whole super-block in
// int32 before its F32 steps and takes the same loop (prompt/q6_K/1: 14.9 -> 10.2 ms).
//
// Compiled with -mavx2 -mfma -mf16c and run only after SelectKernels() has checked the CPU.
#include "engine/backend/cpu/kernels.h"

#if defined(__x86_64__) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "engine/backend/cpu/kernels_avx2_internal.h"

namespace pd::engine::cpu {
namespace {

constexpr int kLanes = 8;

// An aligned vector of the packed prompt rows.
inline __m256i LoadA(const int32_t* p) {
  return _mm256_load_si256(reinterpret_cast<const __m256i*>(p));
}

// The final lane sum of the tiles (HSum's order) for the 8 accumulators of a group of activation
// rows (accumulator p: lane p of each pair); writes the first nc lanes to y[c * ys].
inline void StoreGroup(const __m256 (&a)[8], int nc, float* y, int64_t ys) {
  const __m256 sum =
      _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(a[0], a[4]), _mm256_add_ps(a[2], a[6])),
                    _mm256_add_ps(_mm256_add_ps(a[1], a[5]), _mm256_add_ps(a[3], a[7])));
  alignas(32) float lanes[kLanes];
  _mm256_store_ps(lanes, sum);
  for (int c = 0; c < nc; ++c) y[c * ys] = lanes[c];
}

// Bytes of n activation rows packed in groups of 8, one Block per group and block of kWeights.
template <typename Block, int64_t kWeights = kQ8_0BlockSize>
size_t GroupBytes(int64_t n, int64_t k) {
  return static_cast<size_t>((n + kLanes - 1) / kLanes) * static_cast<size_t>(k / kWeights) *
         sizeof(Block);
}

// Weight rows in panels of kPanelRows, each panel against every pair of activation groups (and a
// last group alone): panel(G, r0, r1, g, nc_last) computes weight rows [r0, r1) against groups
// g .. g + G - 1 (G an std::integral_constant), the last of them nc_last rows, the others full. A
// group's blocks (k = 640: 20 x 544 bytes for Q5_0) stay in L1 while a panel's rows pass, and the
// panel (64 rows) in L2 while the groups pass.
constexpr int64_t kPanelRows = 64;

template <typename F>
void PanelLoop(int64_t rows, int64_t n, F&& panel) {
  const int64_t groups = (n + kLanes - 1) / kLanes;
  const int nc_tail = static_cast<int>(n - (groups - 1) * kLanes);
  for (int64_t r0 = 0; r0 < rows; r0 += kPanelRows) {
    const int64_t r1 = std::min(rows, r0 + kPanelRows);
    int64_t g = 0;
    for (; g + 2 <= groups; g += 2) {
      panel(std::integral_constant<int, 2>(), r0, r1, g, g + 2 == groups ? nc_tail : kLanes);
    }
    if (g < groups) panel(std::integral_constant<int, 1>(), r0, r1, g, nc_tail);
  }
}

// One block of a group of 8 activation rows: q[p][c] = bytes 4p..4p+3 of row c's block,
// start[p][c] = -16 * their sum, d[c] = row c's scale. Rows past n are zero (their lanes are
// computed and dropped).
struct XGroupBlock {
  int32_t q[8][kLanes];
  int32_t start[8][kLanes];
  float d[kLanes];
};
static_assert(sizeof(XGroupBlock) % 32 == 0, "blocks stay 32-byte aligned");

size_t XBytes(int64_t n, int64_t k) { return GroupBytes<XGroupBlock>(n, k); }

void PackX(const void* x, size_t xs, int64_t n, int64_t k, void* out) {
  const int64_t nb = k / kQ8_0BlockSize;
  auto* g = static_cast<XGroupBlock*>(out);
  std::memset(out, 0, XBytes(n, k));
  const __m256i ones8 = _mm256_set1_epi8(1);
  const __m256i ones16 = _mm256_set1_epi16(1);
  for (int64_t c = 0; c < n; ++c) {
    const auto* xb = reinterpret_cast<const BlockQ8_0*>(static_cast<const char*>(x) + c * xs);
    const int64_t grp = c / kLanes;
    const int lane = static_cast<int>(c % kLanes);
    for (int64_t b = 0; b < nb; ++b) {
      XGroupBlock& o = g[grp * nb + b];
      const __m256i q = Load32(xb[b].qs);
      // The four-byte sums (|sum| <= 512), times -16.
      const __m256i start = _mm256_slli_epi32(
          _mm256_sub_epi32(_mm256_setzero_si256(),
                           _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, q), ones16)),
          4);
      alignas(32) int32_t qv[8], sv[8];
      _mm256_store_si256(reinterpret_cast<__m256i*>(qv), q);
      _mm256_store_si256(reinterpret_cast<__m256i*>(sv), start);
      for (int p = 0; p < 8; ++p) {
        o.q[p][lane] = qv[p];
        o.start[p][lane] = sv[p];
      }
      o.d[lane] = HalfToFloat(xb[b].d);
    }
  }
}

// The packed chunk: rows of codes (0..31, k bytes each), then the rows' block scales as F32.
size_t WBytes(int64_t rows, int64_t k) {
  const int64_t nb = k / kQ8_0BlockSize;
  return static_cast<size_t>(rows * nb) * (kQ8_0BlockSize + sizeof(float));
}

void PackW(const void* w, size_t ws, int64_t rows, int64_t k, void* out) {
  const int64_t nb = k / kQ8_0BlockSize;
  uint8_t* codes = static_cast<uint8_t*>(out);
  float* scales = reinterpret_cast<float*>(codes + rows * k);
  for (int64_t r = 0; r < rows; ++r) {
    const auto* wb = reinterpret_cast<const BlockQ5_0*>(static_cast<const char*>(w) + r * ws);
    for (int64_t b = 0; b < nb; ++b) {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(codes + r * k + b * kQ8_0BlockSize),
                          UnpackQ5_0(wb + b));
      scales[r * nb + b] = HalfToFloat(wb[b].d);
    }
  }
}

// The Q5_0 rows of a packed chunk for RowGroups: a row's codes (0..31) and F32 scales; the -16
// offset enters as the lanes' start values.
struct Q5_0Fmt {
  using XBlock = XGroupBlock;
  struct Row {
    const uint8_t* codes;
    const float* scales;
  };
  struct Weights {
    __m256i q;  // four codes, broadcast
  };
  // Row r of the chunk at w (PackW's layout: rows * k codes, then rows * nb scales).
  static Row RowOf(const void* w, size_t /*ws*/, int64_t rows, int64_t k, int64_t r) {
    const uint8_t* codes = static_cast<const uint8_t*>(w);
    const int64_t nb = k / kQ8_0BlockSize;
    return {codes + r * k, reinterpret_cast<const float*>(codes + rows * k) + r * nb};
  }
  static float Scale(const Row& w, int64_t b) { return w.scales[b]; }
  static const void* Codes(const Row& w, int64_t b) { return w.codes + b * kQ8_0BlockSize; }
  static Weights Broadcast(int32_t w4) { return {_mm256_set1_epi32(w4)}; }
  // The eight rows' lane sums of products 4p..4p+3, as the tile has them.
  static __m256i Dot(const Weights& w, const XBlock* x, int p, __m256i ones) {
    return _mm256_add_epi32(_mm256_madd_epi16(_mm256_maddubs_epi16(w.q, LoadA(x->q[p])), ones),
                            LoadA(x->start[p]));
  }
};

// ---- Q8_0 x Q8_0, weights read in place ------------------------------------------------------
//
// The AVX2 Q8_0 tile (TileQ8 / Q8Pass, matmul_avx2.cc) computes, per (weight row, activation row)
// pair and block, maddubs(|w|, sign(x, w)) (|w| and the signs by _mm256_sign_epi8, as ggml's
// vec_dot_q8_0_q8_0), madd with ones into 8 int32 lanes (lane p: products 4p..4p+3), cvt, and
// one FMA by d_w * d_x into lane p of the pair's F32 accumulator; HSum at the end. Here lane p of
// the pair sits in lane c of accumulator p, as for Q5_0: the weight row's four bytes at 4p are
// broadcast (their |w| shared by two groups of activation rows), sign() takes the eight rows'
// four bytes each, and the same maddubs / madd / cvt / FMA follow, so every int16, int32 and F32
// step is the tile's and the results are bit-identical. Per 32 products 5 vector ops (sign,
// maddubs, madd, cvt, fmadd) and about half an op of broadcast and |w|, against 7 in the tile
// (which also multiplies d_w by d_x and broadcasts it per pair and block).

// One block of a group of 8 activation rows: q[p][c] = bytes 4p..4p+3 of row c's block, d[c] =
// row c's scale; rows past n are zero.
struct XGroupBlock8 {
  int32_t q[8][kLanes];
  float d[kLanes];
};
static_assert(sizeof(XGroupBlock8) % 32 == 0, "blocks stay 32-byte aligned");

size_t XBytes8(int64_t n, int64_t k) { return GroupBytes<XGroupBlock8>(n, k); }

void PackX8(const void* x, size_t xs, int64_t n, int64_t k, void* out) {
  const int64_t nb = k / kQ8_0BlockSize;
  auto* g = static_cast<XGroupBlock8*>(out);
  std::memset(out, 0, XBytes8(n, k));
  for (int64_t c = 0; c < n; ++c) {
    const auto* xb = reinterpret_cast<const BlockQ8_0*>(static_cast<const char*>(x) + c * xs);
    const int lane = static_cast<int>(c % kLanes);
    XGroupBlock8* o = g + (c / kLanes) * nb;
    for (int64_t b = 0; b < nb; ++b) {
      for (int p = 0; p < 8; ++p) std::memcpy(&o[b].q[p][lane], xb[b].qs + 4 * p, 4);
      o[b].d[lane] = HalfToFloat(xb[b].d);
    }
  }
}

// The Q8_0 rows for RowGroups, read in place.
struct Q8_0Fmt {
  using XBlock = XGroupBlock8;
  using Row = const BlockQ8_0*;
  struct Weights {
    __m256i q;    // four weights, broadcast
    __m256i abs;  // their |w| (the tile's sign(w, w))
  };
  static Row RowOf(const void* w, size_t ws, int64_t /*rows*/, int64_t /*k*/, int64_t r) {
    return reinterpret_cast<const BlockQ8_0*>(static_cast<const char*>(w) + r * ws);
  }
  static float Scale(Row w, int64_t b) { return HalfToFloat(w[b].d); }
  static const void* Codes(Row w, int64_t b) { return w[b].qs; }
  static Weights Broadcast(int32_t w4) {
    const __m256i q = _mm256_set1_epi32(w4);
    return {q, _mm256_sign_epi8(q, q)};
  }
  static __m256i Dot(const Weights& w, const XBlock* x, int p, __m256i ones) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(w.abs, _mm256_sign_epi8(LoadA(x->q[p]), w.q)),
                             ones);
  }
};

// ---- Q5_0 and Q8_0: one weight row against groups of activation rows --------------------------

// One weight row of format F (nb blocks) x G groups of 8 activation rows (group g's blocks at
// xg + g * nb); writes group g's first nc[g] lanes to y[(8g + c) * ys]. Per block, the row's
// scale times each group's activation scales, then per four weights one broadcast (shared by the
// G groups) and per group F::Dot, cvt and one FMA into accumulator p. With G = 2 the eight lanes
// p run as two passes of four (8 accumulators either way), so each broadcast serves both groups:
// for Q5_0, per 32 products 5.5 ops instead of 6.
template <typename F, int G>
void RowGroups(int64_t nb, const typename F::Row& w, const typename F::XBlock* xg, const int* nc,
               float* y, int64_t ys) {
  constexpr int P = 8 / G;  // lanes p per pass
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 part[G][8];
  PD_UNROLL for (int pass = 0; pass < G; ++pass) {
    __m256 acc[G][P];
    PD_UNROLL for (int g = 0; g < G; ++g) {
      PD_UNROLL for (int j = 0; j < P; ++j) acc[g][j] = _mm256_setzero_ps();
    }
    for (int64_t b = 0; b < nb; ++b) {
      const typename F::XBlock* xb[G];
      __m256 s[G];
      const __m256 dw = _mm256_set1_ps(F::Scale(w, b));
      PD_UNROLL for (int g = 0; g < G; ++g) {
        xb[g] = xg + g * nb + b;
        s[g] = _mm256_mul_ps(dw, _mm256_load_ps(xb[g]->d));
      }
      const char* codes = static_cast<const char*>(F::Codes(w, b));
      PD_UNROLL for (int j = 0; j < P; ++j) {
        const int p = pass * P + j;
        int32_t w4;
        std::memcpy(&w4, codes + 4 * p, 4);
        const typename F::Weights wq = F::Broadcast(w4);
        PD_UNROLL for (int g = 0; g < G; ++g) {
          acc[g][j] =
              _mm256_fmadd_ps(s[g], _mm256_cvtepi32_ps(F::Dot(wq, xb[g], p, ones)), acc[g][j]);
        }
      }
    }
    PD_UNROLL for (int g = 0; g < G; ++g) {
      PD_UNROLL for (int j = 0; j < P; ++j) part[g][pass * P + j] = acc[g][j];
    }
  }
  PD_UNROLL for (int g = 0; g < G; ++g) StoreGroup(part[g], nc[g], y + g * kLanes * ys, ys);
}

// The GroupedKernels gemm of Q5_0 (w: the packed chunk) and Q8_0 (w: the rows in place).
template <typename F>
void GemmGrouped(int64_t k, const void* w, size_t ws, int64_t rows, const void* packed_x, int64_t n,
                 float* y, int64_t ys) {
  const int64_t nb = k / kQ8_0BlockSize;
  const auto* xg = static_cast<const typename F::XBlock*>(packed_x);
  PanelLoop(rows, n, [&](auto G, int64_t r0, int64_t r1, int64_t g, int nc_last) {
    const int nc[2] = {G == 1 ? nc_last : kLanes, nc_last};  // rows of groups g, g + 1
    for (int64_t r = r0; r < r1; ++r) {
      RowGroups<F, decltype(G)::value>(nb, F::RowOf(w, ws, rows, k, r), xg + g * nb, nc,
                                       y + g * kLanes * ys + r, ys);
    }
  });
}

// ---- Q4_K x Q8_K, llama.cpp's repacked GEMM order --------------------------------------------

// One super-block of a group of 8 prompt rows (Q8_K), for the Q4_K and Q6_K kernels:
// q[v][t][c] = bytes 32v + 4t .. + 3 of row c; bsp[i][c] = (bsum 2i, bsum 2i + 1) of row c as two
// int16 (Q6_K's offsets); bs[p][c] = (the sums of sub-blocks 2p and 2p + 1, 32 bytes each,
// |.| <= 4096) as two int16 (Q4_K's mins); d[c] = row c's scale.
struct XGroupBlockK {
  int32_t q[8][8][kLanes];
  int32_t bsp[8][kLanes];
  int32_t bs[4][kLanes];
  float d[kLanes];
};
static_assert(sizeof(XGroupBlockK) % 32 == 0, "blocks stay 32-byte aligned");

size_t XBytesK(int64_t n, int64_t k) { return GroupBytes<XGroupBlockK, kQK>(n, k); }

// Two int16 as one int32 lane, `lo` in the low half (madd's first of the pair).
inline int32_t Int16Pair(int lo, int hi) {
  return static_cast<int32_t>((static_cast<uint32_t>(hi) << 16) |
                              (static_cast<uint32_t>(lo) & 0xFFFF));
}

void PackXK(const void* x, size_t xs, int64_t n, int64_t k, void* out) {
  const int64_t nb = k / kQK;
  auto* g = static_cast<XGroupBlockK*>(out);
  std::memset(out, 0, XBytesK(n, k));
  for (int64_t c = 0; c < n; ++c) {
    const auto* xb = reinterpret_cast<const BlockQ8_K*>(static_cast<const char*>(x) + c * xs);
    const int64_t grp = c / kLanes;
    const int lane = static_cast<int>(c % kLanes);
    for (int64_t b = 0; b < nb; ++b) {
      XGroupBlockK& o = g[grp * nb + b];
      for (int v = 0; v < 8; ++v) {
        alignas(32) int32_t qv[8];
        _mm256_store_si256(reinterpret_cast<__m256i*>(qv), Load32(xb[b].qs + 32 * v));
        for (int t = 0; t < 8; ++t) o.q[v][t][lane] = qv[t];
      }
      const int16_t* bsums = xb[b].bsums;
      for (int i = 0; i < 8; ++i) o.bsp[i][lane] = Int16Pair(bsums[2 * i], bsums[2 * i + 1]);
      for (int p = 0; p < 4; ++p) {
        o.bs[p][lane] =
            Int16Pair(bsums[4 * p] + bsums[4 * p + 1], bsums[4 * p + 2] + bsums[4 * p + 3]);
      }
      o.d[lane] = xb[b].d;
    }
  }
}

// One unpacked super-block of a weight row: codes in sub-block order (q[32v + l] = weight 32v + l,
// 0..15), the 6-bit scales as int16, the mins as int16 (pairs 2p, 2p + 1 adjacent), d and dmin.
struct WBlockK {
  uint8_t q[kQK];
  int16_t sc[8];
  int16_t mn[8];
  float d, dmin;
};

size_t WBytesK(int64_t rows, int64_t k) {
  return static_cast<size_t>(rows * (k / kQK)) * sizeof(WBlockK);
}

void PackWK(const void* w, size_t ws, int64_t rows, int64_t k, void* out) {
  const int64_t nb = k / kQK;
  auto* o = static_cast<WBlockK*>(out);
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  for (int64_t r = 0; r < rows; ++r) {
    const auto* wb = reinterpret_cast<const BlockQ4_K*>(static_cast<const char*>(w) + r * ws);
    for (int64_t b = 0; b < nb; ++b, ++o) {
      for (int p = 0; p < 4; ++p) {  // sub-blocks 2p, 2p + 1: the low, high nibbles of qs[32p..]
        const __m256i q = Load32(wb[b].qs + 32 * p);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(o->q + 64 * p), _mm256_and_si256(q, m4));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(o->q + 64 * p + 32),
                            _mm256_and_si256(_mm256_srli_epi16(q, 4), m4));
      }
      const uint8_t* s = wb[b].scales;  // layout: k_quants.h, BlockQ4_K
      for (int j = 0; j < 8; ++j) {
        o->sc[j] = static_cast<int16_t>(j < 4 ? s[j] & 63 : (s[j + 4] & 15) | (s[j - 4] >> 6) << 4);
        o->mn[j] = static_cast<int16_t>(j < 4 ? s[j + 4] & 63 : (s[j + 4] >> 4) | (s[j] >> 6) << 4);
      }
      o->d = HalfToFloat(wb[b].d);
      o->dmin = HalfToFloat(wb[b].dmin);
    }
  }
}

// The Q4_K kernel for the panel loop below: per weight row and group of prompt rows, the pair
// sums' accumulator and the mins'.
struct Q4K {
  using WBlock = WBlockK;
  using XBlock = XGroupBlockK;
  struct Acc {
    __m256 acc, macc;
  };
  static void Zero(Acc& a) { a.acc = a.macc = _mm256_setzero_ps(); }
  static __m256 Result(const Acc& a) { return _mm256_sub_ps(a.acc, a.macc); }

  // Super-block wb of one weight row into its accumulators, against G groups of prompt rows.
  template <int G>
  PD_ALWAYS_INLINE static void Block(const WBlockK& wb, const XGroupBlockK* const* xb, Acc* a) {
    __m256 acc[G], macc[G], d[G], dmin[G];
    PD_UNROLL for (int g = 0; g < G; ++g) {
      acc[g] = a[g].acc;
      macc[g] = a[g].macc;
      const __m256 dx = _mm256_load_ps(xb[g]->d);
      d[g] = _mm256_mul_ps(_mm256_set1_ps(wb.d), dx);  // d_w * d_x, as the tile's
      dmin[g] = _mm256_mul_ps(_mm256_set1_ps(wb.dmin), dx);
    }
    PD_UNROLL for (int p = 0; p < 4; ++p) {
      __m256i sum[G];
      PD_UNROLL for (int g = 0; g < G; ++g) sum[g] = _mm256_setzero_si256();
      PD_UNROLL for (int h = 0; h < 2; ++h) {
        const int v = 2 * p + h;
        __m256i t16[G];
        PD_UNROLL for (int g = 0; g < G; ++g) t16[g] = _mm256_setzero_si256();
        PD_UNROLL for (int t = 0; t < 8; ++t) {
          int32_t w4;
          std::memcpy(&w4, wb.q + 32 * v + 4 * t, 4);
          const __m256i wq = _mm256_set1_epi32(w4);
          PD_UNROLL for (int g = 0; g < G; ++g) {
            t16[g] = _mm256_add_epi16(t16[g], _mm256_maddubs_epi16(wq, LoadA(xb[g]->q[v][t])));
          }
        }
        const __m256i sc = _mm256_set1_epi16(wb.sc[v]);
        PD_UNROLL for (int g = 0; g < G; ++g) {
          sum[g] = _mm256_add_epi32(sum[g], _mm256_madd_epi16(t16[g], sc));
        }
      }
      int32_t m2;
      std::memcpy(&m2, wb.mn + 2 * p, 4);
      const __m256i mins = _mm256_set1_epi32(m2);
      PD_UNROLL for (int g = 0; g < G; ++g) {
        acc[g] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum[g]), d[g], acc[g]);
        const __m256i ms = _mm256_madd_epi16(mins, LoadA(xb[g]->bs[p]));
        macc[g] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(ms), dmin[g], macc[g]);
      }
    }
    PD_UNROLL for (int g = 0; g < G; ++g) {
      a[g].acc = acc[g];
      a[g].macc = macc[g];
    }
  }
};

// ---- Q6_K x Q8_K, llama.cpp's tiled order (8+ prompt rows)
// ---------------------------------------
//
// The tile (TileQ6_K<R, C, true>, k_quants_avx2.cc) sums each super-block exactly in int32,
// sum_i sc_i (P_i - 32 bsum_i) over its 16 sub-blocks (P_i: codes 0..63 dotted with the
// activations), then res = float(total) * d_w and acc = fma(res, d_x, acc). Here the total
// builds up in the prompt row's lane: per sub-block, four broadcasts of four codes, maddubs into
// int16 two groups at a time (at most 2 * 2 * 63 * 128 = 32256), madd by the sub-block scale.

// One unpacked super-block of a Q6_K row: codes 0..63 in weight order, the 16 int8 scales as
// int16 (pairs 2i, 2i + 1 adjacent), d.
struct WBlock6 {
  uint8_t q[kQK];
  int16_t sc[16];
  float d;
};

size_t WBytes6(int64_t rows, int64_t k) {
  return static_cast<size_t>(rows * (k / kQK)) * sizeof(WBlock6);
}

void PackW6(const void* w, size_t ws, int64_t rows, int64_t k, void* out) {
  const int64_t nb = k / kQK;
  auto* o = static_cast<WBlock6*>(out);
  const __m256i m4 = _mm256_set1_epi8(0x0F), m30 = _mm256_set1_epi8(0x30);
  for (int64_t r = 0; r < rows; ++r) {
    const auto* wb = reinterpret_cast<const BlockQ6_K*>(static_cast<const char*>(w) + r * ws);
    for (int64_t b = 0; b < nb; ++b, ++o) {
      for (int h = 0; h < 2; ++h) {  // weights 128h + 32kk + l (layout: k_quants.h, BlockQ6_K)
        const __m256i la = Load32(wb[b].ql + 64 * h), lb = Load32(wb[b].ql + 64 * h + 32);
        const __m256i hq = Load32(wb[b].qh + 32 * h);
        for (int kk = 0; kk < 4; ++kk) {
          const __m256i l = (kk & 1) ? lb : la;
          const __m256i lo4 = _mm256_and_si256(kk < 2 ? l : _mm256_srli_epi16(l, 4), m4);
          // Bits 2kk .. 2kk + 1 of qh to bits 4..5.
          const __m256i hb =
              _mm256_and_si256(kk < 2 ? _mm256_sll_epi16(hq, _mm_cvtsi32_si128(4 - 2 * kk))
                                      : _mm256_srl_epi16(hq, _mm_cvtsi32_si128(2 * kk - 4)),
                               m30);
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(o->q + 128 * h + 32 * kk),
                              _mm256_or_si256(lo4, hb));
        }
      }
      for (int i = 0; i < 16; ++i) o->sc[i] = wb[b].scales[i];
      o->d = HalfToFloat(wb[b].d);
    }
  }
}

struct Q6K {
  using WBlock = WBlock6;
  using XBlock = XGroupBlockK;
  struct Acc {
    __m256 acc;
  };
  static void Zero(Acc& a) { a.acc = _mm256_setzero_ps(); }
  static __m256 Result(const Acc& a) { return a.acc; }

  template <int G>
  PD_ALWAYS_INLINE static void Block(const WBlock6& wb, const XGroupBlockK* const* xb, Acc* a) {
    __m256i total[G];
    PD_UNROLL for (int g = 0; g < G; ++g) total[g] = _mm256_setzero_si256();
    PD_UNROLL for (int i = 0; i < 16; ++i) {  // sub-block i: weights 16i .. 16i + 15
      const __m256i sc = _mm256_set1_epi16(wb.sc[i]);
      PD_UNROLL for (int half = 0; half < 2; ++half) {
        __m256i t16[G];
        PD_UNROLL for (int j = 0; j < 2; ++j) {
          const int grp = 4 * i + 2 * half + j;  // weights 4 grp .. 4 grp + 3
          int32_t w4;
          std::memcpy(&w4, wb.q + 4 * grp, 4);
          const __m256i wq = _mm256_set1_epi32(w4);
          PD_UNROLL for (int g = 0; g < G; ++g) {
            const __m256i p = _mm256_maddubs_epi16(wq, LoadA(xb[g]->q[grp / 8][grp % 8]));
            t16[g] = j == 0 ? p : _mm256_add_epi16(t16[g], p);
          }
        }
        PD_UNROLL for (int g = 0; g < G; ++g) {
          total[g] = _mm256_add_epi32(total[g], _mm256_madd_epi16(t16[g], sc));
        }
      }
    }
    // The codes' offset: 32 sum_i sc_i bsum_i.
    PD_UNROLL for (int g = 0; g < G; ++g) {
      __m256i offs = _mm256_setzero_si256();
      PD_UNROLL for (int i = 0; i < 8; ++i) {
        int32_t s2;
        std::memcpy(&s2, wb.sc + 2 * i, 4);
        offs =
            _mm256_add_epi32(offs, _mm256_madd_epi16(_mm256_set1_epi32(s2), LoadA(xb[g]->bsp[i])));
      }
      const __m256 res =
          _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(total[g], _mm256_slli_epi32(offs, 5))),
                        _mm256_set1_ps(wb.d));
      a[g].acc = _mm256_fmadd_ps(res, _mm256_load_ps(xb[g]->d), a[g].acc);
    }
  }
};

// A panel of weight rows [r0, r1) against groups g0 .. g0 + G - 1 (the last one nc_last rows).
// The super-block loop is outside the row loop: a super-block's prompt data stays in L1 while the
// panel's rows pass, and the rows' accumulators wait in memory between super-blocks.
template <typename K, int G>
void Panel(int64_t nb, const typename K::WBlock* wk, int64_t r0, int64_t r1,
           const typename K::XBlock* xg, int64_t g0, int nc_last, float* y, int64_t ys) {
  typename K::Acc a[kPanelRows][G];
  for (int64_t r = r0; r < r1; ++r) {
    for (int g = 0; g < G; ++g) K::Zero(a[r - r0][g]);
  }
  for (int64_t b = 0; b < nb; ++b) {
    const typename K::XBlock* xb[G];
    PD_UNROLL for (int g = 0; g < G; ++g) xb[g] = xg + (g0 + g) * nb + b;
    for (int64_t r = r0; r < r1; ++r) K::template Block<G>(wk[r * nb + b], xb, a[r - r0]);
  }
  for (int64_t r = r0; r < r1; ++r) {
    for (int g = 0; g < G; ++g) {
      alignas(32) float lanes[kLanes];
      _mm256_store_ps(lanes, K::Result(a[r - r0][g]));
      const int nc = g == G - 1 ? nc_last : kLanes;
      float* yg = y + (g0 + g) * kLanes * ys + r;
      for (int c = 0; c < nc; ++c) yg[c * ys] = lanes[c];
    }
  }
}

// The GroupedKernels gemm of a k-quant: panels of rows, two groups of prompt rows at a time.
template <typename K>
void GemmOf(int64_t k, const void* w, size_t /*w_stride*/, int64_t rows, const void* packed_x,
            int64_t n, float* y, int64_t ys) {
  const int64_t nb = k / kQK;
  const auto* wk = static_cast<const typename K::WBlock*>(w);
  const auto* xg = static_cast<const typename K::XBlock*>(packed_x);
  PanelLoop(rows, n, [&](auto G, int64_t r0, int64_t r1, int64_t g, int nc_last) {
    Panel<K, decltype(G)::value>(nb, wk, r0, r1, xg, g, nc_last, y, ys);
  });
}

}  // namespace

const GroupedKernels* Q5_0GroupedAvx2() {
  static constexpr GroupedKernels kKernels = {&XBytes, &PackX, &WBytes, &PackW,
                                              &GemmGrouped<Q5_0Fmt>};
  return &kKernels;
}

const GroupedKernels* Q8_0GroupedAvx2() {
  static constexpr GroupedKernels kKernels = {&XBytes8, &PackX8, nullptr, nullptr,
                                              &GemmGrouped<Q8_0Fmt>};
  return &kKernels;
}

const GroupedKernels* Q4KRepackGroupedAvx2() {
  static constexpr GroupedKernels kKernels = {&XBytesK, &PackXK, &WBytesK, &PackWK, &GemmOf<Q4K>};
  return &kKernels;
}

const GroupedKernels* Q6KWideGroupedAvx2() {
  static constexpr GroupedKernels kKernels = {&XBytesK, &PackXK, &WBytes6, &PackW6, &GemmOf<Q6K>};
  return &kKernels;
}

}  // namespace pd::engine::cpu

#else

namespace pd::engine::cpu {
const GroupedKernels* Q5_0GroupedAvx2() { return nullptr; }
const GroupedKernels* Q8_0GroupedAvx2() { return nullptr; }
const GroupedKernels* Q4KRepackGroupedAvx2() { return nullptr; }
const GroupedKernels* Q6KWideGroupedAvx2() { return nullptr; }
}  // namespace pd::engine::cpu

#endif
