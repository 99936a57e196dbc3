// AVX512-VNNI kernels for Q8_0 and Q5_0 weights x Q8_0 activations (Q8_0GroupedVnni(),
// Q5_0GroupedVnni()): a "grouped" GEMM on the 512-bit form of VPDPBUSD for four or more
// activation rows (batched decode, prompts) and a GEMV on the 256-bit form for one to three
// (decode). This file alone is compiled with -mavx512f -mavx512vl -mavx512vnni (plus
// AVX2/FMA/F16C); its kernels run only when CPUID reports those instructions. Like
// kernels_avx2.cc, it calls no inline function from shared headers.
//
// VPDPBUSD multiplies unsigned by signed bytes and adds each group of four products to an int32
// lane, starting from the lane's previous value.
// - Q8_0: weights are signed, so the kernels feed w + 128 (w XOR 0x80) as the unsigned operand
//   and start each lane at -128 * (sum of its activations), so that the lane holds sum w x
//   exactly (no overflow: |255 * 127 * 32| < 2^31).
// - Q5_0: codes u are unsigned (0..31, w = u - 16), so the lanes start at -16 * (sum of their
//   activations).
// Both kernels finish each block like the scalar kernel (float(dot) * (d_w * d_x), then an add,
// in block order), so every batch size gives the scalar table's bits: a sequence's logits do not
// depend on what else runs in its batch (tests/engine/backend/cpu_kernels_test.cc).
#include "engine/backend/cpu/kernels.h"

#if defined(__x86_64__) && defined(__AVX512VNNI__) && defined(__AVX512VL__) && defined(__F16C__)

#include <cpuid.h>
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <vector>

namespace pd::engine::cpu {
namespace {

inline float HalfToFloatVnni(uint16_t h) { return _cvtsh_ss(h); }

// The 32 codes (0..31) of a Q5_0 block in weight order.
inline __m256i UnpackQ5_0Vnni(const BlockQ5_0* wb) {
  const __m256i m4 = _mm256_set1_epi8(0x0F), sixteen = _mm256_set1_epi8(16);
  const __m256i spread = _mm256_setr_epi64x(0, 0x0101010101010101, 0x0202020202020202,
                                            0x0303030303030303);
  const __m256i bits = _mm256_set1_epi64x(0x8040201008040201);
  const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(wb->qs));
  uint32_t h;
  std::memcpy(&h, wb->qh, 4);
  const __m256i hb = _mm256_and_si256(
      _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(h)), spread), bits);
  const __m256i lo = _mm256_and_si256(
      _mm256_inserti128_si256(_mm256_castsi128_si256(q), _mm_srli_epi16(q, 4), 1), m4);
  return _mm256_or_si256(lo, _mm256_and_si256(_mm256_cmpeq_epi8(hb, bits), sixteen));
}

// ---- Q8_0 x Q8_0 for batches: 16 activation columns per 512-bit register ----------------------
//
// The tiles above give each (weight row, activation column) pair its own vector of 8 partial
// lanes, so every block costs 4 vector ops per pair and a final horizontal sum. For a batch of
// activation rows (batched decode, prompts) this kernel turns the layout around: one ZMM holds the
// same four-byte group of one block for 16 activation columns (one int32 lane per column), and
// each weight row's four bytes are broadcast against it. Eight VPDPBUSD then leave each column's
// exact int32 block dot in its own lane: no horizontal sums, and 512 multiply-adds per 8
// instructions. Weights are the unsigned operand (w XOR 0x80, copied once per chunk of rows into a
// thread-local buffer together with their f32 scales); lanes start at -128 * (sum of the
// column's 32 block values), as in the tiles.
//
// F32 part per block: y += float(dot) * (d_w * d_x), a multiply and an add (no FMA) in block
// order: the scalar kernel's DotQ8_0 exactly, so this kernel's results equal the scalar table's
// bit for bit (tests/engine/backend/cpu_kernels_test.cc).

constexpr int kLanes = 16;

// Per 16-column group and block: the 8 four-byte groups of 16 columns (8 x 16 int32), the sums
// of each column's 32 block values (16 int32: the lanes start at -bias * sum) and the columns'
// scales (16 f32).
struct XGroupBlock {
  int32_t q[8][kLanes];
  int32_t sum[kLanes];
  float d[kLanes];
};
static_assert(sizeof(XGroupBlock) == 640);

size_t Q8_0GroupedXBytes(int64_t n, int64_t k) {
  return static_cast<size_t>((n + kLanes - 1) / kLanes) * static_cast<size_t>(k / kQ8_0BlockSize) *
         sizeof(XGroupBlock);
}

void PackQ8_0GroupedX(const void* x, size_t xs, int64_t n, int64_t k, void* out) {
  const int64_t nb = k / kQ8_0BlockSize, groups = (n + kLanes - 1) / kLanes;
  auto* g = static_cast<XGroupBlock*>(out);
  std::memset(out, 0, Q8_0GroupedXBytes(n, k));
  for (int64_t c = 0; c < n; ++c) {
    const auto* xb = reinterpret_cast<const BlockQ8_0*>(static_cast<const char*>(x) + c * xs);
    const int64_t grp = c / kLanes;
    const int lane = static_cast<int>(c % kLanes);
    for (int64_t b = 0; b < nb; ++b) {
      XGroupBlock& o = g[grp * nb + b];
      int32_t sum = 0;
      for (int p = 0; p < 8; ++p) {
        std::memcpy(&o.q[p][lane], xb[b].qs + 4 * p, 4);
        for (int j = 0; j < 4; ++j) sum += xb[b].qs[4 * p + j];
      }
      o.sum[lane] = sum;
      o.d[lane] = HalfToFloatVnni(xb[b].d);
    }
  }
  (void)groups;
}

size_t Q8_0GroupedWBytes(int64_t rows, int64_t k) {
  const int64_t nb = k / kQ8_0BlockSize;
  return static_cast<size_t>(rows * nb) * (kQ8_0BlockSize + sizeof(float));
}

// Rows of w + 128 codes (k bytes each), then the rows' block scales as f32 (nb per row).
void PackQ8_0GroupedW(const void* w, size_t ws, int64_t rows, int64_t k, void* out) {
  const int64_t nb = k / kQ8_0BlockSize;
  uint8_t* codes = static_cast<uint8_t*>(out);
  float* scales = reinterpret_cast<float*>(codes + rows * k);
  const __m256i bias = _mm256_set1_epi8(static_cast<char>(0x80));
  for (int64_t r = 0; r < rows; ++r) {
    const auto* wb = reinterpret_cast<const BlockQ8_0*>(static_cast<const char*>(w) + r * ws);
    for (int64_t b = 0; b < nb; ++b) {
      const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb[b].qs));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(codes + r * k + b * kQ8_0BlockSize),
                          _mm256_xor_si256(q, bias));
      scales[r * nb + b] = HalfToFloatVnni(wb[b].d);
    }
  }
}

// Q5_0: rows of codes (0..31, k bytes each), then the rows' block scales as f32.
void PackQ5_0GroupedW(const void* w, size_t ws, int64_t rows, int64_t k, void* out) {
  const int64_t nb = k / kQ8_0BlockSize;
  uint8_t* codes = static_cast<uint8_t*>(out);
  float* scales = reinterpret_cast<float*>(codes + rows * k);
  for (int64_t r = 0; r < rows; ++r) {
    const auto* wb = reinterpret_cast<const BlockQ5_0*>(static_cast<const char*>(w) + r * ws);
    for (int64_t b = 0; b < nb; ++b) {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(codes + r * k + b * kQ8_0BlockSize),
                          UnpackQ5_0Vnni(wb + b));
      scales[r * nb + b] = HalfToFloatVnni(wb[b].d);
    }
  }
}

// R weight rows x one group of 16 columns (nc of them real). Weight codes are unsigned with a
// bias of 2^kShift (Q8_0: w + 128; Q5_0: its codes, w = u - 16). Each row's block dot runs as two
// independent chains (even and odd four-byte groups) and the R rows interleave, so that the
// VPDPBUSD latency (5 cycles) hides behind 2R chains instead of stalling one chain of 8.
template <int R, int kShift>
void GroupedRows(int64_t nb, const uint8_t* codes, const float* scales, int64_t k,
                 const XGroupBlock* xg, int nc, float* y, int64_t ys) {
  constexpr int kRn = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  __m512 acc[R];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const XGroupBlock& xb = xg[b];
    __m512i xq[8];
#pragma GCC unroll 8
    for (int p = 0; p < 8; ++p) xq[p] = _mm512_load_si512(xb.q[p]);
    const __m512i start = _mm512_sub_epi32(_mm512_setzero_si512(),
                                           _mm512_slli_epi32(_mm512_load_si512(xb.sum), kShift));
    const __m512 dx = _mm512_load_ps(xb.d);
    __m512i even[R], odd[R];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      even[r] = start;
      odd[r] = _mm512_setzero_si512();
    }
#pragma GCC unroll 8
    for (int p = 0; p < 8; p += 2) {
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        const uint8_t* wr = codes + r * k + b * kQ8_0BlockSize + 4 * p;
        int32_t w0, w1;
        std::memcpy(&w0, wr, 4);
        std::memcpy(&w1, wr + 4, 4);
        even[r] = _mm512_dpbusd_epi32(even[r], _mm512_set1_epi32(w0), xq[p]);
        odd[r] = _mm512_dpbusd_epi32(odd[r], _mm512_set1_epi32(w1), xq[p + 1]);
      }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      // Explicit rounding: the compiler must not fuse these into an FMA (the scalar kernel's
      // bits are a multiply, then an add). The int32 sum is exact.
      const __m512i dot = _mm512_add_epi32(even[r], odd[r]);
      const __m512 s = _mm512_mul_round_ps(_mm512_set1_ps(scales[r * nb + b]), dx, kRn);
      acc[r] = _mm512_add_round_ps(acc[r], _mm512_mul_round_ps(_mm512_cvtepi32_ps(dot), s, kRn),
                                   kRn);
    }
  }
  for (int r = 0; r < R; ++r) {
    alignas(64) float lanes[kLanes];
    _mm512_store_ps(lanes, acc[r]);
    for (int c = 0; c < nc; ++c) y[c * ys + r] = lanes[c];
  }
}

// ---- The same numerics for one to three activation rows (decode) -------------------------------
//
// With fewer than 4 activation rows the grouped layout would leave most lanes empty; this GEMV
// keeps the weights where they are and puts 8 weight rows in the lanes instead: per block, one
// 256-bit VPDPBUSD per (row, column) gives 8 partial sums, a tree of horizontal adds turns 8 rows'
// partials into one vector of 8 exact int32 block dots, and the F32 part is the scalar kernel's
// (multiply by d_w * d_x, then add, in block order). So a sequence's logits do not depend on
// how many others share its batch: 1, 2, 3 or 40 activation rows all give the scalar bits.

// Per column and block: the lanes' start (-bias * the sum of each lane's 4 activations) and d_x.
struct XGemvBlock {
  alignas(32) int32_t start[8];
  float d;
};

template <typename W>
__m256i GemvCodes(const W* wb) {
  if constexpr (std::is_same_v<W, BlockQ8_0>) {
    return _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb->qs)),
                            _mm256_set1_epi8(static_cast<char>(0x80)));
  } else {
    return UnpackQ5_0Vnni(wb);
  }
}

// Horizontal sums of 8 vectors of 8 int32: lane i of the result = sum of v[i]'s lanes.
inline __m256i HSum8x8(const __m256i v[8]) {
  const __m256i a = _mm256_hadd_epi32(v[0], v[1]), b = _mm256_hadd_epi32(v[2], v[3]);
  const __m256i c = _mm256_hadd_epi32(v[4], v[5]), d = _mm256_hadd_epi32(v[6], v[7]);
  const __m256i ab = _mm256_hadd_epi32(a, b), cd = _mm256_hadd_epi32(c, d);
  // ab = [r0 r1 r2 r3 (low halves) | r0 r1 r2 r3 (high halves)], cd likewise for r4..r7.
  return _mm256_add_epi32(_mm256_permute2x128_si256(ab, cd, 0x20),
                          _mm256_permute2x128_si256(ab, cd, 0x31));
}

// How many 8-row groups ahead the GEMV prefetches (into L2): measured on the default model's
// decode, 1 and 4 groups were 3-5% slower than 2.
constexpr int kGemvPrefetchGroups = 2;

template <typename W, int C>
void Gemv8Rows(int64_t nb, const char* w, size_t ws, const XGemvBlock* xg, const char* x,
               size_t xs, float* y, int64_t ys) {
  const __m256i row_offsets = _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
                                                 _mm256_set1_epi32(static_cast<int>(ws)));
  __m256 acc[C];
  for (int c = 0; c < C; ++c) acc[c] = _mm256_setzero_ps();
  // The 8 rows are 8 * ws contiguous bytes, consumed over nb steps: fetch the bytes of the rows
  // kGemvPrefetchGroups groups ahead into L2 at the same pace (the hardware prefetcher alone
  // kept decode ~25% slower).
  const char* next = w + kGemvPrefetchGroups * 8 * ws;
  const int64_t lines = static_cast<int64_t>(8 * ws + 63) / 64;
  const int64_t per_step = (lines + nb - 1) / nb;
  for (int64_t b = 0; b < nb; ++b) {
    for (int64_t j = b * per_step; j < std::min(lines, (b + 1) * per_step); ++j) {
      _mm_prefetch(next + j * 64, _MM_HINT_T1);
    }
    __m256i xq[C], st[C];
    for (int c = 0; c < C; ++c) {
      const BlockQ8_0* xb = reinterpret_cast<const BlockQ8_0*>(x + c * xs) + b;
      xq[c] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb->qs));
      st[c] = _mm256_load_si256(reinterpret_cast<const __m256i*>(xg[c * nb + b].start));
    }
    __m256i v[C][8];
#pragma GCC unroll 8
    for (int i = 0; i < 8; ++i) {
      const __m256i u = GemvCodes(reinterpret_cast<const W*>(w + i * ws) + b);
      for (int c = 0; c < C; ++c) v[c][i] = _mm256_dpbusd_epi32(st[c], u, xq[c]);
    }
    // The 8 rows' f16 scales of block b (d is the first field of both block types).
    const __m256i d32 = _mm256_i32gather_epi32(
        reinterpret_cast<const int*>(w + b * sizeof(W)), row_offsets, 1);
    const __m256 dw = _mm256_cvtph_ps(_mm256_cvtepi32_epi16(d32));
    for (int c = 0; c < C; ++c) {
      const __m256i dot = HSum8x8(v[c]);
      const __m256 s = _mm256_mul_ps(dw, _mm256_set1_ps(xg[c * nb + b].d));
      __m256 t = _mm256_mul_ps(_mm256_cvtepi32_ps(dot), s);
      __asm__("" : "+x"(t));  // keeps the compiler from fusing the multiply into the add (FMA)
      acc[c] = _mm256_add_ps(acc[c], t);
    }
  }
  for (int c = 0; c < C; ++c) _mm256_storeu_ps(y + c * ys, acc[c]);
}

// y[c * ys + r] for all `rows` weight rows of `w` and n (1..3) activation rows `x`; rows beyond
// the last multiple of 8 go through the scalar kernel (the same bits).
template <typename W, int kShift, int kType>
void GemvScalarExact(int64_t k, const void* w, size_t ws, int64_t rows, const void* x, size_t xs,
                     int64_t n, float* y, int64_t ys) {
  const int64_t nb = k / kQ8_0BlockSize;
  thread_local std::vector<XGemvBlock> xg;
  xg.resize(static_cast<size_t>(n * nb));
  const __m256i bias = _mm256_set1_epi8(static_cast<char>(1 << kShift));
  for (int64_t c = 0; c < n; ++c) {
    for (int64_t b = 0; b < nb; ++b) {
      const BlockQ8_0* xb = reinterpret_cast<const BlockQ8_0*>(static_cast<const char*>(x) +
                                                               c * xs) + b;
      const __m256i xq = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb->qs));
      _mm256_store_si256(reinterpret_cast<__m256i*>(xg[c * nb + b].start),
                         _mm256_sub_epi32(_mm256_setzero_si256(),
                                          _mm256_dpbusd_epi32(_mm256_setzero_si256(), bias, xq)));
      xg[c * nb + b].d = HalfToFloatVnni(xb->d);
    }
  }
  const char* wa = static_cast<const char*>(w);
  const char* xa = static_cast<const char*>(x);
  const int64_t full = rows / 8 * 8;
  for (int64_t r = 0; r < full; r += 8) {
    const char* wr = wa + r * ws;
    switch (n) {
      case 1: Gemv8Rows<W, 1>(nb, wr, ws, xg.data(), xa, xs, y + r, ys); break;
      case 2: Gemv8Rows<W, 2>(nb, wr, ws, xg.data(), xa, xs, y + r, ys); break;
      default: Gemv8Rows<W, 3>(nb, wr, ws, xg.data(), xa, xs, y + r, ys); break;
    }
  }
  const Kernels& scalar = ScalarKernels();
  for (int64_t r = full; r < rows; r += kGemmTileW) {
    for (int64_t c = 0; c < n; c += kGemmTileX) {
      scalar.gemm[kType](k, wa + r * ws, ws, static_cast<int>(std::min<int64_t>(kGemmTileW, rows - r)),
                         xa + c * xs, xs, static_cast<int>(std::min<int64_t>(kGemmTileX, n - c)),
                         y + c * ys + r, ys);
    }
  }
}

// y[c * ys + r] for `rows` packed weight rows and n activation columns (packed with
// PackQ8_0GroupedX).
template <int kShift>
void GemmGrouped(int64_t k, const void* packed_w, int64_t rows, const void* packed_x, int64_t n,
                 float* y, int64_t ys) {
  const int64_t nb = k / kQ8_0BlockSize;
  const uint8_t* codes = static_cast<const uint8_t*>(packed_w);
  const float* scales = reinterpret_cast<const float*>(codes + rows * k);
  const auto* xg = static_cast<const XGroupBlock*>(packed_x);
  for (int64_t g = 0; g * kLanes < n; ++g) {
    const int nc = static_cast<int>(std::min<int64_t>(kLanes, n - g * kLanes));
    float* yg = y + g * kLanes * ys;
    int64_t r = 0;
    for (; r + 4 <= rows; r += 4) {
      GroupedRows<4, kShift>(nb, codes + r * k, scales + r * nb, k, xg + g * nb, nc, yg + r, ys);
    }
    for (; r < rows; ++r) {
      GroupedRows<1, kShift>(nb, codes + r * k, scales + r * nb, k, xg + g * nb, nc, yg + r, ys);
    }
  }
}

// AVX512F + AVX512VL + AVX512_VNNI, and the OS saves the opmask and ZMM state.
bool CpuHasAvx512Vnni() {
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & bit_OSXSAVE)) return false;
  unsigned xcr0_lo, xcr0_hi;
  __asm__("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
  if ((xcr0_lo & 0xe6) != 0xe6) return false;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
  const bool avx512f = b & (1u << 16), avx512vl = b & (1u << 31), vnni = c & (1u << 11);
  return avx512f && avx512vl && vnni;
}

bool UseVnni() {
  static const bool use = [] {
    const char* off = std::getenv("PDSERVE_CPU_NO_VNNI");
    if (off != nullptr && off[0] != '\0' && off[0] != '0') return false;
    return CpuHasAvx512Vnni();
  }();
  return use;
}

}  // namespace


const Q8_0GroupedKernels* Q8_0GroupedVnni() {
  static constexpr Q8_0GroupedKernels kKernels = {&Q8_0GroupedXBytes, &PackQ8_0GroupedX,
                                                  &Q8_0GroupedWBytes, &PackQ8_0GroupedW,
                                                  &GemmGrouped<7>,
                                                  &GemvScalarExact<BlockQ8_0, 7, 3>};
  return UseVnni() ? &kKernels : nullptr;
}

const Q8_0GroupedKernels* Q5_0GroupedVnni() {
  static constexpr Q8_0GroupedKernels kKernels = {&Q8_0GroupedXBytes, &PackQ8_0GroupedX,
                                                  &Q8_0GroupedWBytes, &PackQ5_0GroupedW,
                                                  &GemmGrouped<4>,
                                                  &GemvScalarExact<BlockQ5_0, 4, 10>};
  return UseVnni() ? &kKernels : nullptr;
}

}  // namespace pd::engine::cpu

#else

namespace pd::engine::cpu {
const Q8_0GroupedKernels* Q8_0GroupedVnni() { return nullptr; }
const Q8_0GroupedKernels* Q5_0GroupedVnni() { return nullptr; }
}  // namespace pd::engine::cpu

#endif
