// AVX512-VNNI kernels for Q8_0, Q5_0 and Q4_0 weights x Q8_0 activations: tiles on the 256-bit
// (VL) form of VPDPBUSD (Q8_0TileVnni(), Q5_0TileVnni(), Q4_0TileVnni(): decode, one to four
// activation rows) and a grouped GEMM on the 512-bit form (Q8_0GroupedVnni(),
// Q5_0GroupedVnni(): batches and prompts).
// This file alone is compiled with -mavx512f -mavx512bw -mavx512vl -mavx512vnni (plus
// AVX2/FMA/F16C); its kernels run only when CPUID reports those instructions. Like
// kernels_avx2.cc, it calls no inline function from shared headers.
//
// VPDPBUSD multiplies unsigned by signed bytes and adds each group of four products to an int32
// lane, starting from the lane's previous value.
// - Q8_0: weights are signed, so the kernels feed w + 128 (w XOR 0x80) as the unsigned operand and
//   start each lane at -128 * (sum of the four activations): lane i = sum_{j<4} (w + 128) x -
//   128 sum_{j<4} x = sum_{j<4} w x, exactly the int32 lane the AVX2 tile's maddubs + madd
//   produce (no overflow: |255 * 127 * 4| < 2^31).
// - Q5_0: codes u are unsigned (0..31, w = u - 16), so the lanes start at -16 * (sum of the four
//   activations): lane i = sum (u - 16) x, the AVX2 tile's (maddubs(u, x) - maddubs(16, x), madd).
//   Q4_0 likewise with codes 0..15 and offset 8.
// The F32 parts (cvt, d_w * d_x, one FMA per lane and block in block order, the final lane sum)
// are the AVX2 tiles' own, so every kernel here gives the AVX2 tiles' bits, which follow ggml's
// x86 order (tests/engine/backend/cpu_kernels_test.cc).
#include "engine/backend/cpu/kernels.h"

#if defined(__x86_64__) && defined(__AVX512VNNI__) && defined(__AVX512VL__) && \
    defined(__AVX512BW__) && defined(__F16C__)

#include <cpuid.h>
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>

namespace pd::engine::cpu {
namespace {

inline float HalfToFloatVnni(uint16_t h) { return _cvtsh_ss(h); }

// Every f16 value as f32 (256 KiB), for kernels whose vector ports are their limit: a scale from
// here is a scalar load and a broadcast load, no vector instruction (where the F16C conversion
// and its broadcast take three). The conversion is exact either way, so the bits are the same.
// QuadRows uses it (gemv_bench rows/q8_0/5/1 20.2 -> 18.3 ms, rows/q5_0/5/1 531 -> 465 us on
// the AVX-512 Xeon), and GroupedRow; the one-row tile does not: its decode stream is bound by
// memory, and there the table's cache lines cost more than they save (a decode step 3 % slower).
// Not the scalar table's F16Table (kernels_scalar.cc): that one is built with F16ToF32, which keeps
// a signalling NaN's bits where F16C quiets it (1,022 of the 65,536 values), and these kernels must
// give the F16C kernels' bits for every scale.
const float* HalfTable() {
  static const float* const table = [] {
    auto* t = new float[65536];
    for (uint32_t h = 0; h < 65536; ++h) t[h] = _cvtsh_ss(static_cast<uint16_t>(h));
    return t;
  }();
  return table;
}

// The lane sums of four vectors of eight lanes (weight rows r = 0..3) stored to y[0 .. rows), in
// the AVX2 tiles' order (HSum: ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7))): each
// s_r = lo + hi (s_p = l_p + l_{p+4}), the four transposed so that lane r of p_j is s_r[j], then
// (p0 + p2) + (p1 + p3) for four rows at once, and one 16-byte store (masked to `rows`; the
// vectors past them are the caller's zeros) where four reductions and four scalar stores were.
// Every tile and the quad kernels end with it (gemv_bench on the AVX-512 Xeon, medians of three
// alternating runs: the Q8_0 head at one row 12.2 -> 11.7 ms, Q5_0 at one row 246 -> 232 us). The
// twin of kernels_avx2_internal.h's StoreHSum4: this file calls no inline function from shared
// headers.
inline void StoreHSum4Vnni(__m256 a0, __m256 a1, __m256 a2, __m256 a3, float* y, int rows) {
  const __m128 s0 = _mm_add_ps(_mm256_castps256_ps128(a0), _mm256_extractf128_ps(a0, 1));
  const __m128 s1 = _mm_add_ps(_mm256_castps256_ps128(a1), _mm256_extractf128_ps(a1, 1));
  const __m128 s2 = _mm_add_ps(_mm256_castps256_ps128(a2), _mm256_extractf128_ps(a2, 1));
  const __m128 s3 = _mm_add_ps(_mm256_castps256_ps128(a3), _mm256_extractf128_ps(a3, 1));
  const __m128 a01lo = _mm_unpacklo_ps(s0, s1), a01hi = _mm_unpackhi_ps(s0, s1);
  const __m128 a23lo = _mm_unpacklo_ps(s2, s3), a23hi = _mm_unpackhi_ps(s2, s3);
  const __m128 p0 = _mm_movelh_ps(a01lo, a23lo), p1 = _mm_movehl_ps(a23lo, a01lo);
  const __m128 p2 = _mm_movelh_ps(a01hi, a23hi), p3 = _mm_movehl_ps(a23hi, a01hi);
  const __m128 v = _mm_add_ps(_mm_add_ps(p0, p2), _mm_add_ps(p1, p3));
  if (rows == 4) {
    _mm_storeu_ps(y, v);
  } else {
    _mm_mask_storeu_ps(y, static_cast<__mmask8>((1u << rows) - 1), v);
  }
}

#define PD_VNNI_UNROLL _Pragma("GCC unroll 4")

// A tile's R x C results (R <= 4 weight rows) through StoreHSum4Vnni, rows past R as zeros.
template <int R, int C>
inline void StoreTileVnni(const __m256 (&acc)[R][C], float* y, int64_t ys) {
  static_assert(R >= 1 && R <= 4);
  PD_VNNI_UNROLL
  for (int c = 0; c < C; ++c) {
    __m256 a[4];
    PD_VNNI_UNROLL
    for (int r = 0; r < 4; ++r) a[r] = _mm256_setzero_ps();
    PD_VNNI_UNROLL
    for (int r = 0; r < R; ++r) a[r] = acc[r][c];
    StoreHSum4Vnni(a[0], a[1], a[2], a[3], y + c * ys, R);
  }
}

// The loops over R and C are fully unrolled so that the R x C accumulators (and the C activation
// vectors) live in registers: 16 + 12 of AVX512VL's 32 ymm registers for a 4 x 4 tile.
template <int R, int C>
void TileQ8Vnni(int64_t k, const char* w, size_t ws, const char* x, size_t xs, float* y,
                int64_t ys) {
  const int64_t nb = k / kQ8_0BlockSize;
  const __m256i bias = _mm256_set1_epi8(static_cast<char>(0x80));
  const __m256i zero = _mm256_setzero_si256();
  __m256 acc[R][C];
  PD_VNNI_UNROLL
  for (int r = 0; r < R; ++r)
    PD_VNNI_UNROLL
    for (int c = 0; c < C; ++c) acc[r][c] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    __m256i xq[C], start[C];
    __m256 dx[C];
    PD_VNNI_UNROLL
    for (int c = 0; c < C; ++c) {
      const BlockQ8_0* xb = reinterpret_cast<const BlockQ8_0*>(x + c * xs) + b;
      xq[c] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb->qs));
      start[c] = _mm256_sub_epi32(zero, _mm256_dpbusd_epi32(zero, bias, xq[c]));
      dx[c] = _mm256_set1_ps(HalfToFloatVnni(xb->d));
    }
    PD_VNNI_UNROLL
    for (int r = 0; r < R; ++r) {
      const BlockQ8_0* wb = reinterpret_cast<const BlockQ8_0*>(w + r * ws) + b;
      // 16 tiles ahead: the weights stream from memory once per token, and a shorter distance
      // (1, 4 or 8 tiles) left decode 3-5% slower on the default model.
      _mm_prefetch(reinterpret_cast<const char*>(wb) + 16 * R * ws, _MM_HINT_T1);
      const __m256i wu = _mm256_xor_si256(
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb->qs)), bias);
      const __m256 dw = _mm256_set1_ps(HalfToFloatVnni(wb->d));
      PD_VNNI_UNROLL
      for (int c = 0; c < C; ++c) {
        const __m256i dot = _mm256_dpbusd_epi32(start[c], wu, xq[c]);
        acc[r][c] =
            _mm256_fmadd_ps(_mm256_mul_ps(dw, dx[c]), _mm256_cvtepi32_ps(dot), acc[r][c]);
      }
    }
  }
  StoreTileVnni<R, C>(acc, y, ys);
}

// Four f16 scales at a stride of `stride` bytes, as 4 floats.
inline __m128 QuadScaleVnni(const char* p, size_t stride) {
  uint16_t h[4];
  for (int i = 0; i < 4; ++i) std::memcpy(&h[i], p + i * stride, 2);
  const uint64_t bits = h[0] | uint64_t{h[1]} << 16 | uint64_t{h[2]} << 32 | uint64_t{h[3]} << 48;
  return _mm_cvtph_ps(_mm_cvtsi64_si128(static_cast<int64_t>(bits)));
}

// The 32 codes (0..31) of a Q5_0 block in weight order: the nibbles, and 16 added to byte j
// where bit j of qh is set (qh as an AVX512BW byte mask: one instruction for the fifth bits,
// where spreading them to bytes with shuffles and compares took six).
inline __m256i UnpackQ5_0Vnni(const BlockQ5_0* wb) {
  const __m256i m4 = _mm256_set1_epi8(0x0F), sixteen = _mm256_set1_epi8(16);
  const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(wb->qs));
  uint32_t h;
  std::memcpy(&h, wb->qh, 4);
  const __m256i lo = _mm256_and_si256(
      _mm256_inserti128_si256(_mm256_castsi128_si256(q), _mm_srli_epi16(q, 4), 1), m4);
  return _mm256_mask_add_epi8(lo, static_cast<__mmask32>(h), lo, sixteen);
}

// The 32 codes (0..15) of a Q4_0 block in weight order: low nibbles, then high nibbles.
inline __m256i UnpackQ4_0Vnni(const BlockQ4_0* wb) {
  const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(wb->qs));
  return _mm256_and_si256(
      _mm256_inserti128_si256(_mm256_castsi128_si256(q), _mm_srli_epi16(q, 4), 1),
      _mm256_set1_epi8(0x0F));
}

// The two "unsigned code minus offset" formats: w = u - kOffset.
struct Q5_0Codes {
  using Block = BlockQ5_0;
  static constexpr char kOffset = 16;
  static __m256i Unpack(const Block* b) { return UnpackQ5_0Vnni(b); }
};
struct Q4_0Codes {
  using Block = BlockQ4_0;
  static constexpr char kOffset = 8;
  static __m256i Unpack(const Block* b) { return UnpackQ4_0Vnni(b); }
};

// Q5_0 / Q4_0 x Q8_0, four blocks per step like the AVX2 tiles (one f16 -> f32 conversion for
// their scales); each block is unpacked here and the weights two tiles ahead are prefetched into
// L2. Lanes start at -kOffset * (sum of the four activations), so lane L = sum (u - kOffset) x
// over weights 4L..4L+3 of the block: the AVX2 tiles' int32 lanes (ggml's layout), exactly.
template <class F, int R, int C>
void TileCodesVnni(int64_t k, const char* w, size_t ws, const char* x, size_t xs, float* y,
                   int64_t ys) {
  using Block = typename F::Block;
  const int64_t nb = k / kQ8_0BlockSize;
  const __m256i offset = _mm256_set1_epi8(F::kOffset);
  const __m256i zero = _mm256_setzero_si256();
  auto code_vec = [&](int r, int64_t block) {
    return F::Unpack(reinterpret_cast<const Block*>(w + r * ws) + block);
  };
  __m256 acc[R][C];
  PD_VNNI_UNROLL
  for (int r = 0; r < R; ++r)
    PD_VNNI_UNROLL
    for (int c = 0; c < C; ++c) acc[r][c] = _mm256_setzero_ps();
  int64_t b = 0;
  for (; b + 4 <= nb; b += 4) {
    __m256i yv[C][4], start[C][4];
    __m128 dx[C];
    PD_VNNI_UNROLL
    for (int c = 0; c < C; ++c) {
      const BlockQ8_0* xb = reinterpret_cast<const BlockQ8_0*>(x + c * xs) + b;
      PD_VNNI_UNROLL
      for (int j = 0; j < 4; ++j) {
        yv[c][j] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb[j].qs));
        start[c][j] = _mm256_sub_epi32(zero, _mm256_dpbusd_epi32(zero, offset, yv[c][j]));
      }
      dx[c] = QuadScaleVnni(reinterpret_cast<const char*>(&xb->d), sizeof(BlockQ8_0));
    }
    PD_VNNI_UNROLL
    for (int r = 0; r < R; ++r) {
      const Block* wb = reinterpret_cast<const Block*>(w + r * ws) + b;
      const char* ahead = reinterpret_cast<const char*>(wb) + 2 * R * ws;
      _mm_prefetch(ahead, _MM_HINT_T1);
      _mm_prefetch(ahead + 64, _MM_HINT_T1);
      const __m128 dw = QuadScaleVnni(reinterpret_cast<const char*>(&wb->d), sizeof(Block));
      __m256i u[4];
      PD_VNNI_UNROLL
      for (int j = 0; j < 4; ++j) u[j] = code_vec(r, b + j);
      PD_VNNI_UNROLL
      for (int c = 0; c < C; ++c) {
        const __m256 d4 = _mm256_castps128_ps256(_mm_mul_ps(dw, dx[c]));
        PD_VNNI_UNROLL
        for (int j = 0; j < 4; ++j) {
          const __m256i dot = _mm256_dpbusd_epi32(start[c][j], u[j], yv[c][j]);
          const __m256 d = _mm256_permutevar8x32_ps(d4, _mm256_set1_epi32(j));
          acc[r][c] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(dot), acc[r][c]);
        }
      }
    }
  }
  for (; b < nb; ++b) {  // leftover blocks
    for (int r = 0; r < R; ++r) {
      const Block* wb = reinterpret_cast<const Block*>(w + r * ws) + b;
      const __m256i u = code_vec(r, b);
      const float dw = HalfToFloatVnni(wb->d);
      PD_VNNI_UNROLL
      for (int c = 0; c < C; ++c) {
        const BlockQ8_0* xb = reinterpret_cast<const BlockQ8_0*>(x + c * xs) + b;
        const __m256i yq = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb->qs));
        const __m256i st = _mm256_sub_epi32(zero, _mm256_dpbusd_epi32(zero, offset, yq));
        acc[r][c] = _mm256_fmadd_ps(_mm256_set1_ps(dw * HalfToFloatVnni(xb->d)),
                                    _mm256_cvtepi32_ps(_mm256_dpbusd_epi32(st, u, yq)),
                                    acc[r][c]);
      }
    }
  }
  StoreTileVnni<R, C>(acc, y, ys);
}

using TileImplVnni = void (*)(int64_t, const char*, size_t, const char*, size_t, float*, int64_t);

// Every R x C instantiation of a tile template, and the GemmTileFn that dispatches on nr, nc.
template <template <int, int> class T>
struct VnniTable {
  static constexpr TileImplVnni kFns[4][4] = {
      {T<1, 1>::Fn, T<1, 2>::Fn, T<1, 3>::Fn, T<1, 4>::Fn},
      {T<2, 1>::Fn, T<2, 2>::Fn, T<2, 3>::Fn, T<2, 4>::Fn},
      {T<3, 1>::Fn, T<3, 2>::Fn, T<3, 3>::Fn, T<3, 4>::Fn},
      {T<4, 1>::Fn, T<4, 2>::Fn, T<4, 3>::Fn, T<4, 4>::Fn},
  };
  static void Gemm(int64_t k, const void* w, size_t w_stride, int nr, const void* x,
                   size_t x_stride, int nc, float* y, int64_t y_stride) {
    kFns[nr - 1][nc - 1](k, static_cast<const char*>(w), w_stride, static_cast<const char*>(x),
                         x_stride, y, y_stride);
  }
};
static_assert(kGemmTileW == 4 && kGemmTileX == 4, "VnniTable lists 4x4 instantiations");

template <int R, int C>
struct Q8Vnni {
  static constexpr TileImplVnni Fn = &TileQ8Vnni<R, C>;
};
template <int R, int C>
struct Q5_0Vnni {
  static constexpr TileImplVnni Fn = &TileCodesVnni<Q5_0Codes, R, C>;
};
template <int R, int C>
struct Q4_0Vnni {
  static constexpr TileImplVnni Fn = &TileCodesVnni<Q4_0Codes, R, C>;
};

// ---- Q8_0 / Q5_0 x Q8_0 for batches: 16 activation rows per 512-bit register ------------------
//
// The tiles above give each (weight row, activation row) pair its own 256-bit vector: per block,
// one VPDPBUSD leaves 8 int32 lanes (lane p = the dot of the block's four-byte group p), which are
// scaled by d_w * d_x and FMA-accumulated per lane, and summed across lanes at the end. For a
// batch of activation rows (batched decode, prompts) this kernel computes exactly those lanes with
// the layout turned around: one ZMM holds four-byte group p of one block for 16 activation rows
// (one int32 lane per row), and each weight row's group p is broadcast against it. The int32
// results are the tiles' lane p for 16 pairs at once; per group p the kernel keeps a ZMM
// accumulator (lanes = activation rows) with the tiles' FMA per block, and at the end adds the 8
// accumulators in the tiles' lane-sum order. So the results are the tiles' bits (and so the AVX2
// tiles', and ggml's x86 order) for every batch size: a sequence's logits do not depend on its
// batch, and the 512-bit form does 16 pairs per instruction instead of one.
// Weights are the unsigned operand: Q8_0 w XOR 0x80 (lanes start at -128 * the group's
// activation sum), Q5_0 its codes (start -16 * sum). Q8_0 weights are read in place (the XOR is
// one scalar instruction per four-byte group); each chunk of Q5_0 rows is unpacked once per
// MatMul into a thread-local buffer with its scales as f32.

constexpr int kLanes = 16;

// Per 16-row group of activations and block: group p's four bytes for 16 rows (8 x 16 int32),
// the lanes' start values for group p (-2^kShift * the sum of its four values; 8 x 16 int32) and
// the rows' scales (16 f32).
struct XGroupBlock {
  int32_t q[8][kLanes];
  int32_t start[8][kLanes];
  float d[kLanes];
};
static_assert(sizeof(XGroupBlock) == 1088);

size_t GroupedXBytes(int64_t n, int64_t k) {
  return static_cast<size_t>((n + kLanes - 1) / kLanes) * static_cast<size_t>(k / kQ8_0BlockSize) *
         sizeof(XGroupBlock);
}

template <int kShift>
void PackGroupedX(const void* x, size_t xs, int64_t n, int64_t k, void* out) {
  const int64_t nb = k / kQ8_0BlockSize;
  auto* g = static_cast<XGroupBlock*>(out);
  std::memset(out, 0, GroupedXBytes(n, k));
  for (int64_t c = 0; c < n; ++c) {
    const auto* xb = reinterpret_cast<const BlockQ8_0*>(static_cast<const char*>(x) + c * xs);
    const int64_t grp = c / kLanes;
    const int lane = static_cast<int>(c % kLanes);
    for (int64_t b = 0; b < nb; ++b) {
      XGroupBlock& o = g[grp * nb + b];
      for (int p = 0; p < 8; ++p) {
        std::memcpy(&o.q[p][lane], xb[b].qs + 4 * p, 4);
        int32_t sum = 0;
        for (int j = 0; j < 4; ++j) sum += xb[b].qs[4 * p + j];
        o.start[p][lane] = -sum * (1 << kShift);
      }
      o.d[lane] = HalfToFloatVnni(xb[b].d);
    }
  }
}

// Q5_0's packed chunk: rows of codes (0..31, k bytes each), then the rows' block scales as f32.
size_t Q5_0PackedBytes(int64_t rows, int64_t k) {
  const int64_t nb = k / kQ8_0BlockSize;
  return static_cast<size_t>(rows * nb) * (kQ8_0BlockSize + sizeof(float));
}

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

// How GroupedRow reads its weight row: Q8_0 or Q5_0 blocks in place, or the codes and f32
// scales of PackQ5_0GroupedW.
enum class GroupedW { kQ8_0, kQ5_0, kPacked };

// Blocks [b0, b1) of one weight row x one group of 16 activation rows (nc of them real), 8
// accumulators of 16 lanes: from zero (b0 = 0) or `carry`, and at the end (b1 = nb) summed into
// y[c * ys], else left in `carry`. Blocks in place: the row two rows ahead is prefetched.
//
// Each four-byte group of weights reaches the vector unit as a broadcast load (VPBROADCASTD from
// memory, a load-port operation) rather than from a general register (VPBROADCASTD r32, port 5,
// which the VPDPBUSD / CVT / FMA stream also needs). A block in place is first made unsigned
// codes as one 256-bit vector (Q8_0: XOR 0x80; Q5_0: unpacked) into `wx`; the empty asm
// statement says `wx` may have changed, so that the compiler loads from it instead of turning the
// eight broadcasts back into shuffles of that vector. One weight row per call: with two, the
// compiler keeps the activation vectors in registers by spilling accumulators, or (with the loads
// folded) gains nothing. gemv_bench on the AVX-512 Xeon, alternating runs, against two rows per
// call with register broadcasts: rows/q8_0/16/1 (the 262,144-row head from DRAM) 38.5-41.4 ->
// 36.0-37.0 ms, prompt/q8_0/1 10.2-10.9 -> 9.3-9.8 ms, prompt/q5_0/1 8.7 -> 8.2 ms.
template <GroupedW kW>
void GroupedRow(int64_t b0, int64_t b1, int64_t nb, const uint8_t* codes, const float* scales,
                int64_t stride, const XGroupBlock* xg, __m512 (&carry)[8], int nc, float* y,
                int64_t ys) {
  __m512 acc[8];
#pragma GCC unroll 8
  for (int p = 0; p < 8; ++p) acc[p] = b0 == 0 ? _mm512_setzero_ps() : carry[p];
  alignas(32) uint8_t wx[kQ8_0BlockSize];
  const float* const half = HalfTable();
  for (int64_t b = b0; b < b1; ++b) {
    const XGroupBlock& xb = xg[b];
    const uint8_t* wr = wx;
    float dw;
    if constexpr (kW == GroupedW::kQ8_0) {
      const auto* wb = reinterpret_cast<const BlockQ8_0*>(codes) + b;
      _mm_prefetch(reinterpret_cast<const char*>(wb) + 2 * stride, _MM_HINT_T1);
      _mm256_store_si256(
          reinterpret_cast<__m256i*>(wx),
          _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb->qs)),
                           _mm256_set1_epi8(static_cast<char>(0x80))));
      asm("" : "+m"(wx));
      dw = half[wb->d];
    } else if constexpr (kW == GroupedW::kQ5_0) {
      const auto* wb = reinterpret_cast<const BlockQ5_0*>(codes) + b;
      _mm_prefetch(reinterpret_cast<const char*>(wb) + 2 * stride, _MM_HINT_T1);
      _mm256_store_si256(reinterpret_cast<__m256i*>(wx), UnpackQ5_0Vnni(wb));
      asm("" : "+m"(wx));
      dw = half[wb->d];
    } else {
      wr = codes + b * kQ8_0BlockSize;
      dw = scales[b];
    }
    // The tiles' d_w * d_x (the same product in every lane of a pair).
    const __m512 s = _mm512_mul_ps(_mm512_set1_ps(dw), _mm512_load_ps(xb.d));
#pragma GCC unroll 8
    for (int p = 0; p < 8; ++p) {
      int32_t w4;
      std::memcpy(&w4, wr + 4 * p, 4);
      const __m512i dot = _mm512_dpbusd_epi32(_mm512_load_si512(xb.start[p]), _mm512_set1_epi32(w4),
                                              _mm512_load_si512(xb.q[p]));
      acc[p] = _mm512_fmadd_ps(s, _mm512_cvtepi32_ps(dot), acc[p]);
    }
  }
  if (b1 < nb) {
#pragma GCC unroll 8
    for (int p = 0; p < 8; ++p) carry[p] = acc[p];
    return;
  }
  // The tiles' lane-sum order: ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)).
  const __m512 sum =
      _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(acc[0], acc[4]), _mm512_add_ps(acc[2], acc[6])),
                    _mm512_add_ps(_mm512_add_ps(acc[1], acc[5]), _mm512_add_ps(acc[3], acc[7])));
  alignas(64) float lanes[kLanes];
  _mm512_store_ps(lanes, sum);
  for (int c = 0; c < nc; ++c) y[c * ys] = lanes[c];
}

// y[c * ys + r] for `rows` weight rows and n activation rows (packed with PackGroupedX). `w`: the
// weight blocks themselves, rows `w_stride` bytes apart, or (kPacked) the packed codes and scales
// of PackQ5_0GroupedW.
//
// A weight row reads all of its group's activation blocks (1,088 bytes each). Up to
// kGroupedSpanBlocks of them (26 KiB) stay in L1 from one row to the next; longer rows run in
// spans of that many blocks over kGroupedRowTile rows at a time, each row's accumulators carried
// from span to span (the additions stay in block order: the same bits; a row of one span is one
// call, rows in order, as without tiles). Without the spans, a
// 2,048-wide row read 70 KiB of activations from L2 per weight row (gemv_bench rows/q5_0/16/1
// 1.27 -> 1.40 ms against two rows per call).
constexpr int64_t kGroupedSpanBlocks = 24;
constexpr int64_t kGroupedRowTile = 8;

template <GroupedW kW>
void GemmGrouped(int64_t k, const void* w, size_t w_stride, int64_t rows, const void* packed_x,
                 int64_t n, float* y, int64_t ys) {
  const int64_t nb = k / kQ8_0BlockSize;
  const uint8_t* codes = static_cast<const uint8_t*>(w);
  const bool packed = kW == GroupedW::kPacked;
  const int64_t stride = packed ? k : static_cast<int64_t>(w_stride);
  const float* scales = packed ? reinterpret_cast<const float*>(codes + rows * k) : nullptr;
  const auto* xg = static_cast<const XGroupBlock*>(packed_x);
  __m512 carry[kGroupedRowTile][8];
  for (int64_t g = 0; g * kLanes < n; ++g) {
    const int nc = static_cast<int>(std::min<int64_t>(kLanes, n - g * kLanes));
    float* yg = y + g * kLanes * ys;
    for (int64_t r0 = 0; r0 < rows; r0 += kGroupedRowTile) {
      const int64_t r1 = std::min(rows, r0 + kGroupedRowTile);
      for (int64_t b0 = 0; b0 < nb; b0 += kGroupedSpanBlocks) {
        const int64_t b1 = std::min(nb, b0 + kGroupedSpanBlocks);
        for (int64_t r = r0; r < r1; ++r) {
          GroupedRow<kW>(b0, b1, nb, codes + r * stride, packed ? scales + r * nb : nullptr, stride,
                         xg + g * nb, carry[r - r0], nc, yg + r, ys);
        }
      }
    }
  }
}

// ---- Q8_0 / Q5_0 x Q8_0 for small batches: four activation rows per 512-bit register ----------
//
// The tiles keep, per (weight row, activation row) pair, 8 int32 lanes per block (lane p = the
// dot of four-byte group p) in a 256-bit register; the grouped kernel above turns that around
// with one activation row per lane, which wastes 12 of 16 lanes at 4 rows. Here a ZMM holds
// groups 0-3 (the block's first 16 bytes) of four activation rows, one 128-bit lane per row, and a
// second ZMM groups 4-7; each weight row's 16-byte halves are broadcast to the four 128-bit lanes.
// One VPDPBUSD + CVT + FMA per half then computes the tiles' lanes p (and p + 4) for four pairs at
// once, with the tiles' per-lane start values, scale products d_w * d_x and FMA per block in block
// order; at the end lo + hi gives each row's (l0 + l4, l1 + l5, l2 + l6, l3 + l7), reduced in the
// tiles' order ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)). So the results are the tiles'
// bits (the AVX2 tiles', ggml's x86 order) for every batch: 7 ZMM operations per weight row and
// block for four activation rows where the 4x4 tile issues 16 YMM ones.

// Per block and group of four activation rows (PackQuadX): the rows' first and second 16 bytes
// (lane c = row c), the Q8_0 start values -128 * (sum of each four-byte group) and the rows'
// scales, each repeated over the row's four int32 lanes.
struct XQuadBlock {
  int8_t lo[64];
  int8_t hi[64];
  int32_t start_lo[16];
  int32_t start_hi[16];
  float d[16];
};
static_assert(sizeof(XQuadBlock) == 320);

size_t QuadXBytes(int64_t n, int64_t k) {
  return static_cast<size_t>((n + 3) / 4) * static_cast<size_t>(k / kQ8_0BlockSize) *
         sizeof(XQuadBlock);
}

// Blocks are laid out [block][group]; rows past n repeat the last row (their results are never
// stored).
void PackQuadX(const void* x, size_t xs, int64_t n, int64_t k, void* out) {
  const int64_t nb = k / kQ8_0BlockSize, groups = (n + 3) / 4;
  auto* o = static_cast<XQuadBlock*>(out);
  for (int64_t b = 0; b < nb; ++b) {
    for (int64_t g = 0; g < groups; ++g) {
      XQuadBlock& q = o[b * groups + g];
      for (int c = 0; c < 4; ++c) {
        const int64_t row = std::min<int64_t>(g * 4 + c, n - 1);
        const auto* xb =
            reinterpret_cast<const BlockQ8_0*>(static_cast<const char*>(x) + row * xs) + b;
        std::memcpy(q.lo + 16 * c, xb->qs, 16);
        std::memcpy(q.hi + 16 * c, xb->qs + 16, 16);
        for (int p = 0; p < 4; ++p) {
          int32_t lo = 0, hi = 0;
          for (int j = 0; j < 4; ++j) {
            lo += xb->qs[4 * p + j];
            hi += xb->qs[16 + 4 * p + j];
          }
          q.start_lo[4 * c + p] = -128 * lo;
          q.start_hi[4 * c + p] = -128 * hi;
          q.d[4 * c + p] = HalfToFloatVnni(xb->d);
        }
      }
    }
  }
}

// QuadRows' results for its R <= 4 weight rows, reduced and stored four weight rows at a time:
// per group of activation rows, the rows' sums t_r = lo + hi (zeros past R) are transposed within
// each 128-bit lane (lane c: the 4 x 4 block t_r[p] of activation row c), so that one addition
// tree gives (t0 + t2) + (t1 + t3) for the four weight rows at once, each lane's tiles' order,
// and one 16-byte store (masked to R) writes them to y[c * ys + r .. r + R); the tail's 256-bit
// sums through StoreHSum4Vnni. A call covers one row's blocks (20 for the default model's
// 640-wide rows), so the per-row reduction this replaced (a spill, four reloads and four scalar
// stores per row and group) was a large share of it: gemv_bench rows/q8_0/5/1 on the AVX-512
// Xeon 17.5 -> 16.1 ms, rows/q8_0/4/1 15.9 -> 15.1 (medians of three alternating runs).
template <int R, int G, bool kTail>
inline void QuadStore(const __m512 (&acc)[R][G][2], const __m256 (&tacc)[R], int n_valid, float* y,
                      int64_t ys) {
  static_assert(R >= 1 && R <= 4);
  const __mmask8 mask = static_cast<__mmask8>((1u << R) - 1);
#pragma GCC unroll 4
  for (int g = 0; g < G; ++g) {
    __m512 t[4];
#pragma GCC unroll 4
    for (int r = 0; r < 4; ++r) t[r] = _mm512_setzero_ps();
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) t[r] = _mm512_add_ps(acc[r][g][0], acc[r][g][1]);
    // Per 128-bit lane: a01lo = (t0[0], t1[0], t0[1], t1[1]), a01hi = (t0[2], t1[2], t0[3], t1[3]).
    const __m512 a01lo = _mm512_unpacklo_ps(t[0], t[1]), a01hi = _mm512_unpackhi_ps(t[0], t[1]);
    const __m512 a23lo = _mm512_unpacklo_ps(t[2], t[3]), a23hi = _mm512_unpackhi_ps(t[2], t[3]);
    // pj: lane 4c + r = t_r[4c + j].
    const __m512 p0 = _mm512_shuffle_ps(a01lo, a23lo, 0x44);
    const __m512 p1 = _mm512_shuffle_ps(a01lo, a23lo, 0xEE);
    const __m512 p2 = _mm512_shuffle_ps(a01hi, a23hi, 0x44);
    const __m512 p3 = _mm512_shuffle_ps(a01hi, a23hi, 0xEE);
    const __m512 v = _mm512_add_ps(_mm512_add_ps(p0, p2), _mm512_add_ps(p1, p3));
    float* yg = y + g * 4 * ys;
    if (g * 4 + 0 < n_valid) _mm_mask_storeu_ps(yg, mask, _mm512_castps512_ps128(v));
    if (g * 4 + 1 < n_valid) _mm_mask_storeu_ps(yg + ys, mask, _mm512_extractf32x4_ps(v, 1));
    if (g * 4 + 2 < n_valid) _mm_mask_storeu_ps(yg + 2 * ys, mask, _mm512_extractf32x4_ps(v, 2));
    if (g * 4 + 3 < n_valid) _mm_mask_storeu_ps(yg + 3 * ys, mask, _mm512_extractf32x4_ps(v, 3));
  }
  if constexpr (kTail) {
    __m256 a[4];
#pragma GCC unroll 4
    for (int r = 0; r < 4; ++r) a[r] = _mm256_setzero_ps();
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) a[r] = tacc[r];
    StoreHSum4Vnni(a[0], a[1], a[2], a[3], y + 4 * G * ys, R);
  }
}

// R weight rows x G groups of four activation rows. kQ8: Q8_0 weight blocks (w XOR 0x80 against
// start -128 * sum); otherwise Q5_0 blocks (codes 0..31 against -16 * sum = start >> 3, exact).
//
// kTail: one more activation row, alone in the group after the G groups (n = 5 or 9; 5 is the
// K + 1 rows of a speculative step with K = 4), in the 256-bit tile's form (TileQ8Vnni /
// TileCodesVnni): the block as one YMM of eight int32 lanes with the tiles' start values, scale
// product d_w * d_x, FMA per block and final lane sum, so the tile's bits. It costs 6
// instructions per weight block where a second group of four would cost 9 for one useful row.
template <int R, int G, bool kQ8, bool kTail>
void QuadRows(int64_t nb, const char* w, size_t ws, const XQuadBlock* xq, int64_t groups,
              int n_valid, float* y, int64_t ys) {
  __m512 acc[R][G][2];
  __m256 tacc[R];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    tacc[r] = _mm256_setzero_ps();
#pragma GCC unroll 4
    for (int g = 0; g < G; ++g) acc[r][g][0] = acc[r][g][1] = _mm512_setzero_ps();
  }
  const __m512i bias = _mm512_set1_epi8(static_cast<char>(0x80));
  const float* const half = HalfTable();
  for (int64_t b = 0; b < nb; ++b) {
    const XQuadBlock* xb = xq + b * groups;
    // The tail row (lane 0 of group G): its 32 bytes, start values and scale, as the tile has them.
    __m256i tx = _mm256_setzero_si256(), tstart = _mm256_setzero_si256();
    __m256 tdx = _mm256_setzero_ps();
    if constexpr (kTail) {
      const XQuadBlock& t = xb[G];
      tx = _mm256_inserti128_si256(
          _mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(t.lo))),
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(t.hi)), 1);
      tstart = _mm256_inserti128_si256(
          _mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(t.start_lo))),
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(t.start_hi)), 1);
      if constexpr (!kQ8) tstart = _mm256_srai_epi32(tstart, 3);
      tdx = _mm256_set1_ps(t.d[0]);
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      __m512i wlo, whi;
      // The block's 32 unsigned operands in order, for the tail row.
      __m256i wt = _mm256_setzero_si256();
      float dw;
      if constexpr (kQ8) {
        const BlockQ8_0* wb = reinterpret_cast<const BlockQ8_0*>(w + r * ws) + b;
        // 64 rows ahead, as far as the 4x4 tiles' 16 tiles.
        _mm_prefetch(reinterpret_cast<const char*>(wb) + 64 * ws, _MM_HINT_T1);
        wlo = _mm512_xor_si512(
            _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(wb->qs))),
            bias);
        whi = _mm512_xor_si512(
            _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(wb->qs + 16))),
            bias);
        wt = _mm256_blend_epi32(_mm512_castsi512_si256(wlo), _mm512_castsi512_si256(whi), 0xF0);
        dw = half[wb->d];
      } else {
        const BlockQ5_0* wb = reinterpret_cast<const BlockQ5_0*>(w + r * ws) + b;
        _mm_prefetch(reinterpret_cast<const char*>(wb) + 64 * ws, _MM_HINT_T1);
        // The codes straight into their four 128-bit lanes: the 16 bytes of nibbles broadcast
        // from memory, low nibbles (weights 0-15) and high ones (16-31), and 16 added where the
        // fifth bit is set, qh's half repeated in each lane's 16 mask bits by one multiply. This
        // replaces the 256-bit unpack and three lane shuffles (port 5) that turned it into the
        // two broadcasts: gemv_bench rows/q5_0/4/1 449 -> 430 us, 402 with the scale table.
        const __m512i q =
            _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(wb->qs)));
        uint32_t h;
        std::memcpy(&h, wb->qh, 4);
        // One IMUL each (port 1): left to itself the compiler spreads the multiply into shifts
        // and adds on the ports the vector work needs.
        uint64_t each_lane = 0x0001000100010001;
        __asm__("" : "+r"(each_lane));
        const __mmask64 hlo = _cvtu64_mask64(uint64_t{h & 0xFFFF} * each_lane);
        const __mmask64 hhi = _cvtu64_mask64(uint64_t{h >> 16} * each_lane);
        const __m512i m4 = _mm512_set1_epi8(0x0F), sixteen = _mm512_set1_epi8(16);
        wlo = _mm512_and_si512(q, m4);
        whi = _mm512_and_si512(_mm512_srli_epi16(q, 4), m4);
        wlo = _mm512_mask_add_epi8(wlo, hlo, wlo, sixteen);
        whi = _mm512_mask_add_epi8(whi, hhi, whi, sixteen);
        if constexpr (kTail) {
          wt = _mm256_inserti128_si256(_mm512_castsi512_si256(wlo), _mm512_castsi512_si128(whi), 1);
        }
        dw = half[wb->d];
      }
      const __m512 dwv = _mm512_set1_ps(dw);
#pragma GCC unroll 4
      for (int g = 0; g < G; ++g) {
        __m512i slo = _mm512_loadu_si512(xb[g].start_lo);
        __m512i shi = _mm512_loadu_si512(xb[g].start_hi);
        if constexpr (!kQ8) {
          slo = _mm512_srai_epi32(slo, 3);
          shi = _mm512_srai_epi32(shi, 3);
        }
        const __m512 s = _mm512_mul_ps(dwv, _mm512_loadu_ps(xb[g].d));
        const __m512i dlo = _mm512_dpbusd_epi32(slo, wlo, _mm512_loadu_si512(xb[g].lo));
        const __m512i dhi = _mm512_dpbusd_epi32(shi, whi, _mm512_loadu_si512(xb[g].hi));
        acc[r][g][0] = _mm512_fmadd_ps(s, _mm512_cvtepi32_ps(dlo), acc[r][g][0]);
        acc[r][g][1] = _mm512_fmadd_ps(s, _mm512_cvtepi32_ps(dhi), acc[r][g][1]);
      }
      if constexpr (kTail) {
        const __m256i dot = _mm256_dpbusd_epi32(tstart, wt, tx);
        const __m256 st = _mm256_mul_ps(_mm512_castps512_ps256(dwv), tdx);
        tacc[r] = _mm256_fmadd_ps(st, _mm256_cvtepi32_ps(dot), tacc[r]);
      }
    }
  }
  QuadStore<R, G, kTail>(acc, tacc, n_valid, y, ys);
}

// y[c * ys + r] for `rows` weight rows (raw Q8_0 or Q5_0 blocks, `w_stride` bytes apart) and n
// activation rows packed by PackQuadX: groups of four rows two at a time, four weight rows per
// step (R x G accumulators: 16 of the 32 ZMM registers); a last group holding a single row
// (n = 5, 9) rides along with the pass before it as QuadRows' tail.
template <bool kQ8>
void GemmQuad(int64_t k, const void* w, size_t w_stride, int64_t rows, const void* packed_x,
              int64_t n, float* y, int64_t ys) {
  const int64_t nb = k / kQ8_0BlockSize, groups = (n + 3) / 4;
  const bool tail = n > 4 && n % 4 == 1;
  const int64_t full_groups = tail ? groups - 1 : groups;
  const char* wc = static_cast<const char*>(w);
  const auto* xq = static_cast<const XQuadBlock*>(packed_x);
  using Fn = void (*)(int64_t, const char*, size_t, const XQuadBlock*, int64_t, int, float*,
                      int64_t);
  static constexpr Fn kFns[2][4][2] = {
      {{&QuadRows<1, 1, kQ8, false>, &QuadRows<1, 2, kQ8, false>},
       {&QuadRows<2, 1, kQ8, false>, &QuadRows<2, 2, kQ8, false>},
       {&QuadRows<3, 1, kQ8, false>, &QuadRows<3, 2, kQ8, false>},
       {&QuadRows<4, 1, kQ8, false>, &QuadRows<4, 2, kQ8, false>}},
      {{&QuadRows<1, 1, kQ8, true>, &QuadRows<1, 2, kQ8, true>},
       {&QuadRows<2, 1, kQ8, true>, &QuadRows<2, 2, kQ8, true>},
       {&QuadRows<3, 1, kQ8, true>, &QuadRows<3, 2, kQ8, true>},
       {&QuadRows<4, 1, kQ8, true>, &QuadRows<4, 2, kQ8, true>}},
  };
  for (int64_t g = 0; g < full_groups; g += 2) {
    const int gs = static_cast<int>(std::min<int64_t>(2, full_groups - g));
    const int with_tail = tail && g + gs == full_groups ? 1 : 0;
    const int n_valid = static_cast<int>(std::min<int64_t>(4 * gs, n - g * 4));
    for (int64_t r = 0; r < rows; r += 4) {
      const int rs = static_cast<int>(std::min<int64_t>(4, rows - r));
      kFns[with_tail][rs - 1][gs - 1](nb, wc + r * w_stride, w_stride, xq + g, groups, n_valid,
                                      y + g * 4 * ys + r, ys);
    }
  }
}

PD_NO_AVX512 bool ReadUseVnni() {
  const char* off = std::getenv("PDSERVE_CPU_NO_VNNI");
  if (off != nullptr && off[0] != '\0' && off[0] != '0') return false;
  return CpuHasAvx512(bit_AVX512F | bit_AVX512BW | bit_AVX512VL, bit_AVX512VNNI);  // + OS state
}

PD_NO_AVX512 bool UseVnni() {
  static const bool use = ReadUseVnni();
  return use;
}

}  // namespace

PD_NO_AVX512 const GroupedKernels* Q8_0QuadVnni() {
  static constexpr GroupedKernels kKernels = {&QuadXBytes, &PackQuadX, nullptr, nullptr,
                                              &GemmQuad<true>};
  return UseVnni() ? &kKernels : nullptr;
}

PD_NO_AVX512 const GroupedKernels* Q5_0QuadVnni() {
  static constexpr GroupedKernels kKernels = {&QuadXBytes, &PackQuadX, nullptr, nullptr,
                                              &GemmQuad<false>};
  return UseVnni() ? &kKernels : nullptr;
}

PD_NO_AVX512 GemmTileFn Q8_0TileVnni() { return UseVnni() ? &VnniTable<Q8Vnni>::Gemm : nullptr; }
PD_NO_AVX512 GemmTileFn Q5_0TileVnni() { return UseVnni() ? &VnniTable<Q5_0Vnni>::Gemm : nullptr; }
PD_NO_AVX512 GemmTileFn Q4_0TileVnni() { return UseVnni() ? &VnniTable<Q4_0Vnni>::Gemm : nullptr; }

PD_NO_AVX512 const GroupedKernels* Q8_0GroupedVnni() {
  static constexpr GroupedKernels kKernels = {&GroupedXBytes, &PackGroupedX<7>, nullptr, nullptr,
                                              &GemmGrouped<GroupedW::kQ8_0>};
  return UseVnni() ? &kKernels : nullptr;
}

PD_NO_AVX512 const GroupedKernels* Q5_0GroupedVnni() {
  static constexpr GroupedKernels kKernels = {&GroupedXBytes, &PackGroupedX<4>, &Q5_0PackedBytes,
                                              &PackQ5_0GroupedW, &GemmGrouped<GroupedW::kPacked>};
  return UseVnni() ? &kKernels : nullptr;
}

PD_NO_AVX512 const GroupedKernels* Q5_0GroupedInPlaceVnni() {
  static constexpr GroupedKernels kKernels = {&GroupedXBytes, &PackGroupedX<4>, nullptr, nullptr,
                                              &GemmGrouped<GroupedW::kQ5_0>};
  return UseVnni() ? &kKernels : nullptr;
}

}  // namespace pd::engine::cpu

#else

namespace pd::engine::cpu {
GemmTileFn Q8_0TileVnni() { return nullptr; }
GemmTileFn Q5_0TileVnni() { return nullptr; }
GemmTileFn Q4_0TileVnni() { return nullptr; }
const GroupedKernels* Q8_0GroupedVnni() { return nullptr; }
const GroupedKernels* Q5_0GroupedVnni() { return nullptr; }
const GroupedKernels* Q5_0GroupedInPlaceVnni() { return nullptr; }
const GroupedKernels* Q8_0QuadVnni() { return nullptr; }
const GroupedKernels* Q5_0QuadVnni() { return nullptr; }
}  // namespace pd::engine::cpu

#endif
