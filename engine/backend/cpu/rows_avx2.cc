// AVX2 Q8_0 and Q5_0 weights x a few activation rows (a decode step of a few sequences, the
// K + 1 rows a speculative step verifies, one decode row through Gemma 3's Q8_0 output head): the
// GroupedKernels contract of kernels.h, weights read in place, one weight row at a time.
//
// The 4 x 4 tiles (TileQ8, TileQ5_0, matmul_avx2.cc) walk four weight rows side by side; the Q8_0
// one runs out of the 16 ymm registers from four activation rows on and splits into passes, and
// the grouped kernels (grouped_avx2.cc) put eight activation rows in the lanes of a register, so
// they cost the same for one row as for eight. Here each weight row is read once, front to back,
// against every activation row (up to eight accumulators in registers): per block and activation
// row the tile's own vector ops (Q8_0: sign, maddubs, madd, cvt, fma; Q5_0: maddubs, sub of the
// row's packed offset, madd, cvt, fma), and per block and weight row one load and |w| (Q8_0) or
// the unpacking (Q5_0). The products of the scales, d_w * d_x, are formed eight at a time before
// the row's blocks (one multiply per block and eight activation rows instead of one per pair) and
// broadcast from memory, which costs a load, not an ALU slot. One sequential stream with a
// software prefetch a few rows ahead (kPrefetchBytes) keeps the memory side busy: rows of 640
// weights (Gemma 3's head, 680 bytes) are too short for the hardware prefetchers alone.
//
// Every output keeps the tile's operations and their order (per block: the int32 lanes, cvt, one
// FMA by the F32 product d_w * d_x into an 8-lane accumulator; at the end HSum), so the results
// equal the tiles' and ggml's bit for bit for every activation row count
// (tests/engine/backend/cpu_kernels_test.cc, RowsAvx2Test).
//
// What bounds it: on Zen 3, maddubs, madd, cvt and the FMA share two pipes (a chain of the four
// runs at about 2 cycles per pair and block, measured), so with ggml's bits four activation rows
// through the head cost at least 262,144 x 20 x 4 x 2 cycles, 13 ms at 3.2 GHz; this kernel takes
// 18 ms with the head in cache and 20 ms from DRAM (gemv_bench rows/q8_0/4/1), against 26 ms for
// the tiles. Figures per row count: cpu_matmul.cc (kRowsMaxQ8_0, kRowsMinQ5_0).
//
// Compiled with -mavx2 -mfma -mf16c and run only after SelectKernels() has checked the CPU.
#include "engine/backend/cpu/kernels.h"

#if defined(__x86_64__) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)

#include <algorithm>
#include <cstring>

#include "engine/backend/cpu/kernels_avx2_internal.h"

namespace pd::engine::cpu {
namespace {

// Activation rows per pass over a weight row (accumulators in registers).
constexpr int kMaxCols = 8;
// Blocks whose scale products are formed at a time (a 4 KiB table on the stack).
constexpr int64_t kScaleBlocks = 128;
// How far ahead of the block being read the prefetch runs: about eight of Gemma 3's head rows.
constexpr int64_t kPrefetchBytes = 5440;

// The packed activation rows, one layout for both weight types: for each block b and row c, 64
// bytes (one cache line): the 32 codes, then Q5_0's offset maddubs(16, codes) as 16 int16; after
// them, for each group of kMaxCols rows and each block, the rows' scales as F32 (zero past n).
struct XCell {
  int8_t q[kQ8_0BlockSize];
  int16_t offset[16];
};
static_assert(sizeof(XCell) == 64, "one cache line per block and row");

int64_t Groups(int64_t n) { return (n + kMaxCols - 1) / kMaxCols; }
size_t CellBytes(int64_t n, int64_t nb) { return static_cast<size_t>(nb * n) * sizeof(XCell); }
size_t XBytes(int64_t n, int64_t k) {
  const int64_t nb = k / kQ8_0BlockSize;
  return CellBytes(n, nb) + static_cast<size_t>(nb * Groups(n) * kMaxCols) * sizeof(float);
}

void PackX(const void* x, size_t xs, int64_t n, int64_t k, void* out) {
  const int64_t nb = k / kQ8_0BlockSize;
  auto* cells = static_cast<XCell*>(out);
  auto* scales = reinterpret_cast<float*>(static_cast<char*>(out) + CellBytes(n, nb));
  std::memset(scales, 0, static_cast<size_t>(nb * Groups(n) * kMaxCols) * sizeof(float));
  const __m256i sixteen = _mm256_set1_epi8(16);
  for (int64_t c = 0; c < n; ++c) {
    const auto* xb = reinterpret_cast<const BlockQ8_0*>(static_cast<const char*>(x) + c * xs);
    for (int64_t b = 0; b < nb; ++b) {
      XCell& cell = cells[b * n + c];
      const __m256i q = Load32(xb[b].qs);
      _mm256_store_si256(reinterpret_cast<__m256i*>(cell.q), q);
      _mm256_store_si256(reinterpret_cast<__m256i*>(cell.offset), _mm256_maddubs_epi16(sixteen, q));
      scales[(c / kMaxCols * nb + b) * kMaxCols + c % kMaxCols] = HalfToFloat(xb[b].d);
    }
  }
}

// Q8_0: |w| (unsigned) times x with w's sign via maddubs, madd with ones (the tile's int32 lanes).
struct Q8_0Fmt {
  using Block = BlockQ8_0;
  struct Prepared {
    __m256i wq, wabs;
  };
  static Prepared Prepare(const Block& wb) {
    const __m256i wq = Load32(wb.qs);
    return {wq, _mm256_sign_epi8(wq, wq)};
  }
  static __m256i Dot(const Prepared& w, const XCell& x, __m256i ones) {
    const __m256i xq = _mm256_load_si256(reinterpret_cast<const __m256i*>(x.q));
    return _mm256_madd_epi16(_mm256_maddubs_epi16(w.wabs, _mm256_sign_epi8(xq, w.wq)), ones);
  }
};

// Q5_0: the codes (0..31) unpacked once per block (UnpackQ5_0), maddubs with x less x's offset
// (16 times its pairs: the -16 of every code), madd with ones: the tile's int32 lanes.
struct Q5_0Fmt {
  using Block = BlockQ5_0;
  struct Prepared {
    __m256i u;
  };
  static Prepared Prepare(const Block& wb) { return {UnpackQ5_0(&wb)}; }
  static __m256i Dot(const Prepared& w, const XCell& x, __m256i ones) {
    const __m256i xq = _mm256_load_si256(reinterpret_cast<const __m256i*>(x.q));
    const __m256i off = _mm256_load_si256(reinterpret_cast<const __m256i*>(x.offset));
    return _mm256_madd_epi16(_mm256_sub_epi16(_mm256_maddubs_epi16(w.u, xq), off), ones);
  }
};

// One weight row (blocks [b0, b1)) against C activation rows starting at column c0: acc[c] +=
// the row's blocks . column c's blocks. dd[b - b0][c]: d_w * d_x of block b and column c0 + c.
template <typename F, int C>
PD_ALWAYS_INLINE inline void RowPass(const typename F::Block* wr, const XCell* cells, int64_t n,
                                     int64_t c0, int64_t b0, int64_t b1,
                                     const float (*dd)[kMaxCols], __m256 (&acc)[C]) {
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t b = b0; b < b1; ++b) {
    // Blocks are at most 34 bytes, so one prefetch per block touches every 64-byte line.
    _mm_prefetch(reinterpret_cast<const char*>(wr + b) + kPrefetchBytes, _MM_HINT_T0);
    const typename F::Prepared w = F::Prepare(wr[b]);
    const XCell* xb = cells + b * n + c0;
    PD_UNROLL for (int c = 0; c < C; ++c) {
      const __m256 p = _mm256_cvtepi32_ps(F::Dot(w, xb[c], ones));
      acc[c] = _mm256_fmadd_ps(_mm256_broadcast_ss(&dd[b - b0][c]), p, acc[c]);
    }
  }
}

// Weight rows [0, rows) against columns [c0, c0 + C).
template <typename F, int C>
void Columns(int64_t nb, const char* w, size_t ws, int64_t rows, const XCell* cells,
             const float* scales, int64_t n, int64_t c0, float* y, int64_t ys) {
  alignas(32) float dd[kScaleBlocks][kMaxCols];
  const float* sc = scales + c0 / kMaxCols * nb * kMaxCols;
  for (int64_t r = 0; r < rows; ++r) {
    const auto* wr = reinterpret_cast<const typename F::Block*>(w + r * ws);
    __m256 acc[C];
    PD_UNROLL for (int c = 0; c < C; ++c) acc[c] = _mm256_setzero_ps();
    for (int64_t b0 = 0; b0 < nb; b0 += kScaleBlocks) {
      const int64_t b1 = std::min(nb, b0 + kScaleBlocks);
      for (int64_t b = b0; b < b1; ++b) {
        _mm256_store_ps(dd[b - b0], _mm256_mul_ps(_mm256_set1_ps(HalfToFloat(wr[b].d)),
                                                  _mm256_loadu_ps(sc + b * kMaxCols)));
      }
      RowPass<F, C>(wr, cells, n, c0, b0, b1, dd, acc);
    }
    PD_UNROLL for (int c = 0; c < C; ++c) y[(c0 + c) * ys + r] = HSum(acc[c]);
  }
}

template <typename F>
void Gemm(int64_t k, const void* w, size_t ws, int64_t rows, const void* packed_x, int64_t n,
          float* y, int64_t ys) {
  const int64_t nb = k / kQ8_0BlockSize;
  const auto* cells = static_cast<const XCell*>(packed_x);
  const auto* scales =
      reinterpret_cast<const float*>(static_cast<const char*>(packed_x) + CellBytes(n, nb));
  const char* wc = static_cast<const char*>(w);
  using Fn = void (*)(int64_t, const char*, size_t, int64_t, const XCell*, const float*, int64_t,
                      int64_t, float*, int64_t);
  static constexpr Fn kFns[kMaxCols] = {&Columns<F, 1>, &Columns<F, 2>, &Columns<F, 3>,
                                        &Columns<F, 4>, &Columns<F, 5>, &Columns<F, 6>,
                                        &Columns<F, 7>, &Columns<F, 8>};
  for (int64_t c0 = 0; c0 < n; c0 += kMaxCols) {
    const int64_t cols = std::min<int64_t>(kMaxCols, n - c0);
    kFns[cols - 1](nb, wc, ws, rows, cells, scales, n, c0, y, ys);
  }
}

}  // namespace

const GroupedKernels* Q8_0RowsAvx2() {
  static constexpr GroupedKernels kKernels = {&XBytes, &PackX, nullptr, nullptr, &Gemm<Q8_0Fmt>};
  return &kKernels;
}

const GroupedKernels* Q5_0RowsAvx2() {
  static constexpr GroupedKernels kKernels = {&XBytes, &PackX, nullptr, nullptr, &Gemm<Q5_0Fmt>};
  return &kKernels;
}

}  // namespace pd::engine::cpu

#else

namespace pd::engine::cpu {
const GroupedKernels* Q8_0RowsAvx2() { return nullptr; }
const GroupedKernels* Q5_0RowsAvx2() { return nullptr; }
}  // namespace pd::engine::cpu

#endif
