// pdserve's own Q8_0, Q5_0 and Q4_K orders (kernels.h, Q8_0x16OwnOrderAmx, Q5_0x16OwnOrderAmx,
// Q4_Kx16OwnOrderAmx) on matrices laid out as q8_0x16 / q5_0x16 / q4_Kx16, with Intel AMX
// (AMX-TILE + AMX-INT8) forming the block sums of several activation rows at once. Q4_K's
// specifics are in its section below; docs/numerics.md ("AMX") has the measurements.
//
// A laid-out block of a group of 16 weight rows is already an AMX B tile: code word j (codes
// 4j..4j+3) of row e at j * 64 + e * 4 is the layout TDPBSUD reads as 8 rows of K-quads for 16
// columns (engine/quant/q8_0x16.h). So per group and block: the A tile holds up to 16 activation
// rows' 32 codes (pack_x's rows, signed), the B tile the 16 weight rows' unsigned codes (Q8_0's
// w + 128 straight from the matrix; Q5_0's w + 16 unpacked by own_x16::LoadX16 into 512 bytes of
// scratch), one TDPBSUD gives the C tile of M x 16 exact int32 dot products, which TILESTORED
// writes out. Per activation row the epilogue then does what the VNNI kernel does per row
// (own_order_vnni.cc, RowBlock): the packed offset (-128 * sum(x), Q5_0: / 8) added, CVT,
// d_w * d_x, FMA into the row's 16 accumulators. The integers are exact and the F32 operations
// the portable kernel's, so the bits are the portable kernel's (own_order.cc). Two tile sets
// alternate between consecutive blocks, and the epilogue runs kLag blocks behind the tiles.
//
// Tiles: C in tmm0 / tmm1, A in tmm2 / tmm3 (M rows x 32 bytes), B in tmm4 / tmm5 (8 x 64 bytes);
// a call with more than 16 activation rows runs passes of 16 and a last pass of n % 16 rows in
// tmm6 (C) / tmm7 (A) with tmm4 (B), so that one configuration serves the whole call.
//
// Fewer activation rows than kAmxMinRows* (decode of one or a few sequences, bandwidth-bound)
// take the VNNI kernel: the same bits.
//
// The tile instructions are written as inline assembly (PD_TILE_* below). This file is compiled
// with the AVX-512 flags of own_order_vnni.cc; its kernels run only where AmxRuns() says so: CPUID
// reports AMX-TILE and AMX-INT8, the OS enables the tile state in XCR0 and grants this process the
// tile data (arch_prctl ARCH_REQ_XCOMP_PERM), the VNNI kernels run (PDSERVE_CPU_ISA,
// PDSERVE_CPU_NO_VNNI), and PDSERVE_CPU_NO_AMX is unset (or "0").
#include "engine/backend/cpu/kernels.h"
#include "engine/backend/cpu/own_order_x16_avx512.h"

#if defined(__x86_64__) && defined(__AVX512VNNI__) && defined(__AVX512VL__) && \
    defined(__AVX512BW__) && defined(__F16C__)

#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <utility>
#include <vector>

#include "engine/quant/k_quants.h"
#include "engine/quant/q4_kx16.h"
#include "engine/quant/q5_0x16.h"
#include "engine/quant/q8_0x16.h"

namespace pd::engine::cpu {
namespace {

using own_x16::LoadX16;
using own_x16::X16;
using own_x16::X16BlockBytes;

constexpr int kLanes = 16;    // weight rows per group (C tile columns)
constexpr int kBlock = 32;    // weights per block (A tile bytes per row, B tile rows x 4)
constexpr int kMaxRows = 16;  // activation rows per pass (A and C tile rows)
// Fewer activation rows than these take the VNNI kernel: where the tile work per block (about
// 20 cycles whatever the rows) costs more than the VNNI kernel's products. gemv_bench on the AMX
// Xeon, one thread, us (ms for the head), VNNI / AMX: head_x16/q8_0 2 rows 15.2 / 12.8 ms, 4 rows
// 13.4 / 13.1, 16 rows 21.9 / 19.4; rows_x16/q5_0 2 rows 233 / 243, 3 rows 247 / 242, 16 rows
// 443 / 360; rows_x16/q4_K 4 rows 219 / 248, 8 rows 289 / 287, 16 rows 509 / 417.
// Q8_0 over the head stream (kernels.h, HeadStream) from 3 rows: at 2 the VNNI kernel
// prefetching near into L1 is faster (head_x16/q8_0/2/t, ms, AMX / VNNI: one
// thread 13.0-13.2 / 11.5-11.6, two 6.46 / 5.96-6.18; 3 rows 12.6-13.8 / 16.8-17.0).
constexpr int kAmxMinRowsQ8_0 = 2;
constexpr int kAmxMinRowsQ8_0Head = 3;
constexpr int kAmxMinRowsQ5_0 = 3;
constexpr int kAmxMinRowsQ4_K = 8;
// How far ahead of the group stream the software prefetch into L2 runs (as the VNNI kernel's).
constexpr size_t kPrefetchBytes = 16384;

// The tile instructions as assembly (GCC's <amxtileintrin.h> macros declare no memory operands,
// so the compiler could move the epilogue's loads above the store that fills them). Each load
// and store names the bytes it reads or writes as a memory operand, and nothing else: a "memory"
// clobber instead made GCC keep the accumulators on the stack, and vector stores before a tile
// load stall it (it waits for them to reach the cache).
// A tile load whose bytes nothing in the kernel writes (activations, q8_0x16 codes).
#define PD_TILE_LOAD_RO(t, base, stride) \
  asm volatile("tileloadd (%0,%1,1), %%tmm" #t ::"r"(base), "r"(static_cast<int64_t>(stride)))
// A tile load of a 512-byte B tile that the kernel wrote (q5_0x16, unpacked).
#define PD_TILE_LOAD_B(t, base)                                                                    \
  asm volatile("tileloadd (%1,%2,1), %%tmm" #t ::"m"(*reinterpret_cast<const char(*)[512]>(base)), \
               "r"(base), "r"(int64_t{64}))
// A C tile stored as rows of 64 bytes at `base` (up to 1 KiB).
#define PD_TILE_STORE(t, base)                                                \
  asm volatile("tilestored %%tmm" #t ", (%1,%2,1)"                            \
               : "=m"(*reinterpret_cast<int32_t(*)[kMaxRows * kLanes]>(base)) \
               : "r"(base), "r"(int64_t{64}))
#define PD_TILE_ZERO(t) asm volatile("tilezero %%tmm" #t ::)
// C += A (signed bytes) . B (unsigned bytes), K-quads.
#define PD_TILE_DPBSUD(c, a, b) asm volatile("tdpbsud %%tmm" #b ", %%tmm" #a ", %%tmm" #c ::)

// The tile configuration (palette 1): per tile its rows and bytes per row.
struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};
static_assert(sizeof(TileConfig) == 64);

// `m` rows in the main tiles (0-3), `tail` rows in the last pass's (6, 7; none: 0).
void ConfigureTiles(int m, int tail) {
  TileConfig c;
  for (int t : {0, 1}) c.rows[t] = static_cast<uint8_t>(m), c.colsb[t] = 64;
  for (int t : {2, 3}) c.rows[t] = static_cast<uint8_t>(m), c.colsb[t] = kBlock;
  for (int t : {4, 5}) c.rows[t] = kBlock / 4, c.colsb[t] = 64;
  if (tail > 0) {
    c.rows[6] = static_cast<uint8_t>(tail), c.colsb[6] = 64;
    c.rows[7] = static_cast<uint8_t>(tail), c.colsb[7] = kBlock;
  }
  asm volatile("ldtilecfg %0" ::"m"(c));
}

// How many blocks the epilogue runs behind the tile unit, and Q5_0's unpacking ahead of it: a
// vector load of bytes that TILESTORED has just written, or a TILELOADD of bytes that vector
// stores have just written, waits for the store to reach the cache instead of forwarding
// (measured on the AMX Xeon: a B tile loaded right after its unpacking costs ~35 cycles more than
// one unpacked two blocks earlier).
constexpr int kLag = 2;
constexpr int kRing = 2 * kLag;  // buffers in flight: written kLag ahead, read kLag behind

struct alignas(64) Scratch {
  int32_t c[kRing][kMaxRows * kLanes];  // the C tiles as stored, block b's at b % kRing
  uint8_t b[kRing][kBlock * kLanes];    // Q5_0's B tiles, unpacked, block b's at b % kRing
};

// Q5_0: block b's B tile (the 16 rows' unsigned codes) unpacked into `out`.
template <X16 kW>
__attribute__((always_inline)) inline void UnpackB(const char* group, int64_t nb, int64_t b,
                                                   uint8_t* out) {
  __m512i w[8];
  (void)LoadX16<kW>(group, nb, b, w);
#pragma GCC unroll 8
  for (int j = 0; j < 8; ++j) _mm512_store_si512(out + 64 * j, w[j]);
}

template <X16 kW>
__attribute__((always_inline)) inline __m512 Scales(const char* group, int64_t nb, int64_t b) {
  const size_t at = kW == X16::kQ8_0 ? Q8_0x16ScalesAt(nb, b) : Q5_0x16ScalesAt(nb, b);
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(group + at)));
}

// One block's tile work in tiles C, A, B: C = A . B, stored to `c`; B loaded from bytes the
// kernel wrote (kWritten) or from the matrix.
#define PD_TILE_BLOCK(C, A, B)  \
  PD_TILE_ZERO(C);              \
  PD_TILE_LOAD_RO(A, a, xrb);   \
  if constexpr (kWritten) {     \
    PD_TILE_LOAD_B(B, bt);      \
  } else {                      \
    PD_TILE_LOAD_RO(B, bt, 64); \
  }                             \
  PD_TILE_DPBSUD(C, A, B);      \
  PD_TILE_STORE(C, c)

// One block in the tile set kSet (0, 1: the alternating main sets; 2: the last pass's). `a`: the
// first activation row's block codes; `bt`: the B tile, in the matrix (kWritten false) or
// unpacked into scratch.
template <int kSet, bool kWritten>
__attribute__((always_inline)) inline void Issue(const char* a, size_t xrb, const char* bt,
                                                 int32_t* c) {
  if constexpr (kSet == 0) {
    PD_TILE_BLOCK(0, 2, 4);
  } else if constexpr (kSet == 1) {
    PD_TILE_BLOCK(1, 3, 5);
  } else {
    PD_TILE_BLOCK(6, 7, 4);
  }
}

// Per block and pass, the M activation rows' packed offsets (shifted for the weights' codes) and
// d_x side by side (RowTable), so the epilogue broadcasts them from one base.
struct RowTerms {
  int32_t off[kMaxRows];
  float d[kMaxRows];
};

// Per activation row i < M of block b: acc[i] = fma(d_w * d_x, isum, acc[i]), isum = C's row
// plus the row's offset: RowBlock's operations.
template <int M>
__attribute__((always_inline)) inline void Epilogue(__m512 (&acc)[M], const int32_t* c, __m512 dw,
                                                    const RowTerms& t) {
#pragma GCC unroll 16
  for (int i = 0; i < M; ++i) {
    const __m512i isum =
        _mm512_add_epi32(_mm512_load_si512(c + i * kLanes), _mm512_set1_epi32(t.off[i]));
    acc[i] = _mm512_fmadd_ps(_mm512_mul_ps(dw, _mm512_set1_ps(t.d[i])), _mm512_cvtepi32_ps(isum),
                             acc[i]);
  }
}

// One group of 16 weight rows against the M activation rows from x0 (`terms`: their RowTerms per
// block): y[i * ys + lane row]. Block b's tiles run while the epilogue finishes block b - kLag
// (and Q5_0 unpacks block b + kLag); the accumulators still take the blocks in order. kTail: the
// last pass's tile set.
template <int M, X16 kW, bool kTail>
void GroupAmx(int64_t nb, const char* group, const char* ahead, const char* x0, size_t xrb,
              const RowTerms* terms, float* y, int64_t ys, Scratch& s) {
  constexpr size_t kBytes = X16BlockBytes<kW>();
  constexpr int kLines = static_cast<int>((kBytes + 63) / 64);
  constexpr bool kWritten = kW == X16::kQ5_0;
  constexpr int kSet = kTail ? 2 : 0;
  // (Every loop over acc unrolled, so that it lives in registers.)
  __m512 acc[M];
#pragma GCC unroll 16
  for (int i = 0; i < M; ++i) acc[i] = _mm512_setzero_ps();
  if constexpr (kWritten) {
    for (int64_t b = 0; b < std::min<int64_t>(kLag, nb); ++b) UnpackB<kW>(group, nb, b, s.b[b]);
  }
  for (int64_t b = 0; b < nb; ++b) {
    if (ahead != nullptr) {
#pragma GCC unroll 10
      for (int o = 0; o < kLines; ++o) _mm_prefetch(ahead + b * kBytes + 64 * o, _MM_HINT_T1);
    }
    const char* bt;
    if constexpr (kWritten) {
      if (b + kLag < nb) UnpackB<kW>(group, nb, b + kLag, s.b[(b + kLag) % kRing]);
      bt = reinterpret_cast<const char*>(s.b[b % kRing]);
    } else {
      bt = group + Q8_0x16CodesAt(b);
    }
    int32_t* c = s.c[b % kRing];
    if (kTail || b % 2 == 0) {
      Issue<kSet, kWritten>(x0 + b * kBlock, xrb, bt, c);
    } else {
      Issue<1, kWritten>(x0 + b * kBlock, xrb, bt, c);
    }
    if (b >= kLag) {
      const int64_t e = b - kLag;
      Epilogue<M>(acc, s.c[e % kRing], Scales<kW>(group, nb, e), terms[e]);
    }
  }
  for (int64_t e = std::max<int64_t>(0, nb - kLag); e < nb; ++e) {
    Epilogue<M>(acc, s.c[e % kRing], Scales<kW>(group, nb, e), terms[e]);
  }
#pragma GCC unroll 16
  for (int i = 0; i < M; ++i) _mm512_storeu_ps(y + i * ys, acc[i]);
}

// A group function: nb blocks (or super-blocks) of one group of 16 weight rows against one pass
// of activation rows, its terms per block from `terms`.
template <typename Terms>
using GroupFn = void (*)(int64_t, const char*, const char*, const char*, size_t, const Terms*,
                         float*, int64_t, Scratch&);

// How a call's n activation rows split into passes: `full` passes of `rows` (min(n, 16)), then
// one of `tail` rows unless tail is 0.
struct Passes {
  int rows;
  int64_t full;
  int tail;
  int64_t count() const { return full + (tail > 0 ? 1 : 0); }
};
Passes PassesOf(int64_t n) {
  const int rows = static_cast<int>(std::min<int64_t>(n, kMaxRows));
  const int64_t full = n / rows;
  return {rows, full, static_cast<int>(n - full * rows)};
}

// y[i * ys + r] over the groups of 16 rows (groups outer, so each group's bytes come from memory
// once) in the passes `ps`, each group function from `main` (the pass's rows - 1) or `tail`;
// `terms`: `per_pass` entries per pass. The first pass over a group fetches the stream
// kPrefetchBytes ahead into L2, a block's share per block, up to the matrix's end.
template <typename Terms, size_t N>
void RunGroups(const std::array<GroupFn<Terms>, N>& main, const std::array<GroupFn<Terms>, N>& tail,
               const Passes& ps, int64_t nb, const char* wa, size_t group_bytes, int64_t groups,
               const char* xa, size_t xrb, const Terms* terms, int64_t per_pass, float* y,
               int64_t ys) {
  Scratch s;
  ConfigureTiles(ps.rows, ps.tail);
  const GroupFn<Terms> main_fn = main[ps.rows - 1];
  for (int64_t g = 0; g < groups; ++g) {
    const char* group = wa + g * group_bytes;
    const size_t next = static_cast<size_t>(g) * group_bytes + kPrefetchBytes;
    const char* ahead = next < groups * group_bytes ? wa + next : nullptr;
    for (int64_t p = 0; p < ps.full; ++p) {
      main_fn(nb, group, p == 0 ? ahead : nullptr, xa + p * ps.rows * xrb, xrb,
              terms + p * per_pass, y + p * ps.rows * ys + g * kLanes, ys, s);
    }
    if (ps.tail > 0) {
      const int64_t i0 = ps.full * ps.rows;
      tail[ps.tail - 1](nb, group, ps.full == 0 ? ahead : nullptr, xa + i0 * xrb, xrb,
                        terms + ps.full * per_pass, y + i0 * ys + g * kLanes, ys, s);
    }
  }
  asm volatile("tilerelease" ::);
}

template <X16 kW, bool kTail, int... N>
constexpr std::array<GroupFn<RowTerms>, sizeof...(N)> MakeGroups(std::integer_sequence<int, N...>) {
  return {&GroupAmx<N + 1, kW, kTail>...};
}

// y[i * ys + r] over the groups of 16 rows in passes of up to 16 activation rows (groups outer,
// so each group's bytes come from memory once: RunGroups); q8_0x16's last rows % 16 plain rows,
// and calls of fewer than kAmxMinRows* rows, go to the VNNI kernel.
template <X16 kW>
void GemmX16Amx(int64_t k, const void* w, size_t ws, int64_t rows, const void* xp, int64_t n,
                float* y, int64_t ys) {
  static constexpr auto kMain = MakeGroups<kW, false>(std::make_integer_sequence<int, kMaxRows>{});
  static constexpr auto kTailFns =
      MakeGroups<kW, true>(std::make_integer_sequence<int, kMaxRows>{});
  const GroupedKernels* vnni = kW == X16::kQ8_0 ? Q8_0x16OwnOrderVnni() : Q5_0x16OwnOrderVnni();
  const int64_t nb = k / kBlock;
  const size_t group_bytes = static_cast<size_t>(nb) * X16BlockBytes<kW>();
  const int64_t groups = rows / kLanes;
  const int min_rows = kW == X16::kQ5_0                  ? kAmxMinRowsQ5_0
                       : HeadStream(groups, group_bytes) ? kAmxMinRowsQ8_0Head
                                                         : kAmxMinRowsQ8_0;
  if (n < min_rows) {
    vnni->gemm(k, w, ws, rows, xp, n, y, ys);
    return;
  }
  const size_t xrb = Q8_0OwnXRowBytes(nb);
  const char* wa = static_cast<const char*>(w);
  const char* xa = static_cast<const char*>(xp);
  if (groups > 0) {
    const Passes ps = PassesOf(n);
    // Each pass's RowTerms per block: pass p, block b at terms[p * nb + b].
    thread_local std::vector<RowTerms> terms;
    terms.resize(static_cast<size_t>(ps.count() * nb));
    constexpr int kShift = kW == X16::kQ8_0 ? 0 : 3;
    for (int64_t i = 0; i < n; ++i) {
      const char* xr = xa + i * xrb;
      RowTerms* row_terms = terms.data() + (i / ps.rows) * nb;
      const int lane = static_cast<int>(i % ps.rows);
      for (int64_t b = 0; b < nb; ++b) {
        int32_t off;
        std::memcpy(&off, xr + nb * (kBlock + 4) + b * 4, 4);
        row_terms[b].off[lane] = off >> kShift;
        std::memcpy(&row_terms[b].d[lane], xr + nb * kBlock + b * 4, 4);
      }
    }
    RunGroups(kMain, kTailFns, ps, nb, wa, group_bytes, groups, xa, xrb, terms.data(), nb, y, ys);
  }
  if constexpr (kW == X16::kQ8_0) {
    if (const int64_t rest = rows - groups * kLanes; rest > 0) {
      vnni->gemm(k, wa + groups * group_bytes, static_cast<size_t>(nb) * 34, rest, xp, n,
                 y + groups * kLanes, ys);
    }
  }
}

// ---- Q4_K (q4_Kx16) -------------------------------------------------------------------------
//
// Per group of 16 weight rows and sub-block j of 32 (super-block s, j < 8): the B tile is the
// sub-block's 8 nibble words (q4_kx16.h: low nibbles of pair p's words for sub-block 2p, high
// for 2p + 1) as bytes 0..15, unpacked into scratch a pair at a time kLag sub-blocks ahead; the A
// tile the activation rows' 32 codes; one TDPBSUD gives isum_j exactly. The epilogue adds
// isum_j * sc_j into each row's sumi (VPMULLD by the 16 rows' scales), and at a super-block's end
// does what the VNNI kernel does (own_order_vnni.cc, TileQ4Kx16): summ from the mins and the
// row's sub-block sums (4 VPDPWSSD), then fma(d * d_x, sumi, y) and fma(-(dmin * d_x), summ, y).
// The sixteen rows' sums fill the registers, so the F32 accumulators live in y itself (zeroed
// first: the portable kernel's +0 start, the same operations).

// Per super-block and pass, the M activation rows' d_x and sub-block-sum words (pack_x's).
struct KTerms {
  float d[kMaxRows];
  int32_t words[4][kMaxRows];
};

__attribute__((always_inline)) inline void UnpackQ4KPair(const char* sb, int p, uint8_t* lo,
                                                         uint8_t* hi) {
  const __m512i m4 = _mm512_set1_epi8(0x0F);
  const char* nib = sb + kQ4_Kx16NibblesAt + p * 8 * 64;
#pragma GCC unroll 8
  for (int t = 0; t < 8; ++t) {
    const __m512i q = _mm512_loadu_si512(nib + 64 * t);
    _mm512_store_si512(lo + 64 * t, _mm512_and_si512(q, m4));
    _mm512_store_si512(hi + 64 * t, _mm512_and_si512(_mm512_srli_epi16(q, 4), m4));
  }
}

// Sub-block u = 8 s + j of the group: sumi[i] += C's row i * sc_j.
template <int M>
__attribute__((always_inline)) inline void Q4KSubBlock(__m512i (&sumi)[M], const int32_t* c,
                                                       const char* sb, int j) {
  const __m512i sc = _mm512_cvtepu8_epi32(
      _mm_loadu_si128(reinterpret_cast<const __m128i*>(sb + kQ4_Kx16ScalesAt + 16 * j)));
#pragma GCC unroll 16
  for (int i = 0; i < M; ++i) {
    sumi[i] = _mm512_add_epi32(sumi[i], _mm512_mullo_epi32(_mm512_load_si512(c + i * kLanes), sc));
  }
}

// The end of super-block sb for the M rows: y[i] = fma(d * d_x, sumi, y[i]), then
// fma(-(dmin * d_x), summ, y[i]) (TileQ4Kx16's operations), sumi reset.
template <int M>
__attribute__((always_inline)) inline void Q4KSuperEnd(__m512i (&sumi)[M], const char* sb,
                                                       const KTerms& t, float* y, int64_t ys) {
  __m512i mins[4];
#pragma GCC unroll 4
  for (int p = 0; p < 4; ++p) {
    mins[p] = _mm512_cvtepu8_epi16(
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(sb + kQ4_Kx16MinsAt + 32 * p)));
  }
  const __m512 dw =
      _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(sb + kQ4_Kx16DAt)));
  const __m512 dm =
      _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(sb + kQ4_Kx16DminAt)));
#pragma GCC unroll 16
  for (int i = 0; i < M; ++i) {
    __m512i summ = _mm512_setzero_si512();
#pragma GCC unroll 4
    for (int p = 0; p < 4; ++p) {
      summ = _mm512_dpwssd_epi32(summ, mins[p], _mm512_set1_epi32(t.words[p][i]));
    }
    const __m512 vdx = _mm512_set1_ps(t.d[i]);
    __m512 acc = _mm512_loadu_ps(y + i * ys);
    acc = _mm512_fmadd_ps(_mm512_mul_ps(dw, vdx), _mm512_cvtepi32_ps(sumi[i]), acc);
    acc = _mm512_fnmadd_ps(_mm512_mul_ps(dm, vdx), _mm512_cvtepi32_ps(summ), acc);
    _mm512_storeu_ps(y + i * ys, acc);
    sumi[i] = _mm512_setzero_si512();
  }
}

// One group of 16 q4_Kx16 rows against the M activation rows from x0 (`terms`: their KTerms per
// super-block); sub-blocks u = 8 s + j in one sequence, the epilogue kLag behind the tiles.
template <int M, bool kTail>
void GroupQ4KAmx(int64_t nbk, const char* group, const char* ahead, const char* x0, size_t xrb,
                 const KTerms* terms, float* y, int64_t ys, Scratch& s) {
  constexpr int kLines = static_cast<int>(kQ4_Kx16SuperBytes / 64);
  constexpr int kSet = kTail ? 2 : 0;
  const int64_t nu = nbk * 8;
#pragma GCC unroll 16
  for (int i = 0; i < M; ++i) _mm512_storeu_ps(y + i * ys, _mm512_setzero_ps());
  __m512i sumi[M];
#pragma GCC unroll 16
  for (int i = 0; i < M; ++i) sumi[i] = _mm512_setzero_si512();
  UnpackQ4KPair(group, 0, s.b[0], s.b[1]);
  auto finish = [&](int64_t e) __attribute__((always_inline)) {
    const char* sb = group + (e / 8) * kQ4_Kx16SuperBytes;
    Q4KSubBlock<M>(sumi, s.c[e % kRing], sb, static_cast<int>(e % 8));
    if (e % 8 == 7) Q4KSuperEnd<M>(sumi, sb, terms[e / 8], y, ys);
  };
  for (int64_t u = 0; u < nu; ++u) {
    if (u % 8 == 0 && ahead != nullptr) {
      // The super-block's share of the stream ahead, at its first sub-block.
#pragma GCC unroll 37
      for (int o = 0; o < kLines; ++o) {
        _mm_prefetch(ahead + (u / 8) * kQ4_Kx16SuperBytes + 64 * o, _MM_HINT_T1);
      }
    }
    if (u % 2 == 0 && u + kLag < nu) {
      const int64_t v = u + kLag;  // even: a pair's first sub-block
      UnpackQ4KPair(group + (v / 8) * kQ4_Kx16SuperBytes, static_cast<int>((v % 8) / 2),
                    s.b[v % kRing], s.b[(v + 1) % kRing]);
    }
    const char* a = x0 + (u / 8) * kQK + (u % 8) * kBlock;
    const char* bt = reinterpret_cast<const char*>(s.b[u % kRing]);
    int32_t* c = s.c[u % kRing];
    if (kTail || u % 2 == 0) {
      Issue<kSet, true>(a, xrb, bt, c);
    } else {
      Issue<1, true>(a, xrb, bt, c);
    }
    if (u >= kLag) finish(u - kLag);
  }
  for (int64_t e = std::max<int64_t>(0, nu - kLag); e < nu; ++e) finish(e);
}

template <bool kTail, int... N>
constexpr std::array<GroupFn<KTerms>, sizeof...(N)> MakeGroupsQ4K(
    std::integer_sequence<int, N...>) {
  return {&GroupQ4KAmx<N + 1, kTail>...};
}

// y[i * ys + r] over the groups of 16 q4_Kx16 rows, as GemmX16Amx.
void GemmQ4Kx16Amx(int64_t k, const void* w, size_t ws, int64_t rows, const void* xp, int64_t n,
                   float* y, int64_t ys) {
  static constexpr auto kMain = MakeGroupsQ4K<false>(std::make_integer_sequence<int, kMaxRows>{});
  static constexpr auto kTailFns = MakeGroupsQ4K<true>(std::make_integer_sequence<int, kMaxRows>{});
  if (n < kAmxMinRowsQ4_K) {
    Q4_Kx16OwnOrderVnni()->gemm(k, w, ws, rows, xp, n, y, ys);
    return;
  }
  const int64_t nbk = k / kQK;
  const size_t xrb = Q4_KOwnXRowBytes(nbk);
  const char* wa = static_cast<const char*>(w);
  const char* xa = static_cast<const char*>(xp);
  const size_t group_bytes = static_cast<size_t>(nbk) * kQ4_Kx16SuperBytes;
  const int64_t groups = rows / kLanes;
  if (groups == 0) return;
  const Passes ps = PassesOf(n);
  // Each pass's KTerms per super-block: pass p, super-block s at terms[p * nbk + s].
  thread_local std::vector<KTerms> terms;
  terms.resize(static_cast<size_t>(ps.count() * nbk));
  for (int64_t i = 0; i < n; ++i) {
    const char* xr = xa + i * xrb;
    KTerms* row_terms = terms.data() + (i / ps.rows) * nbk;
    const int lane = static_cast<int>(i % ps.rows);
    for (int64_t sb = 0; sb < nbk; ++sb) {
      std::memcpy(&row_terms[sb].d[lane], xr + nbk * kQK + sb * 4, 4);
      for (int p = 0; p < 4; ++p) {
        std::memcpy(&row_terms[sb].words[p][lane], xr + nbk * (kQK + 4) + sb * 16 + p * 4, 4);
      }
    }
  }
  RunGroups(kMain, kTailFns, ps, nbk, wa, group_bytes, groups, xa, xrb, terms.data(), nbk, y, ys);
}

#undef PD_TILE_BLOCK
#undef PD_TILE_ZERO
#undef PD_TILE_LOAD_RO
#undef PD_TILE_LOAD_B
#undef PD_TILE_STORE
#undef PD_TILE_DPBSUD

PD_NO_AVX512 bool ReadUseAmx() {
  const char* off = std::getenv("PDSERVE_CPU_NO_AMX");
  if (off != nullptr && off[0] != '\0' && off[0] != '0') return false;
  if (Q8_0x16OwnOrderVnni() == nullptr) return false;  // the CPU, PDSERVE_CPU_ISA, NO_VNNI
  unsigned a, b, c, d;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
  if ((d & (1u << 24)) == 0 || (d & (1u << 25)) == 0) return false;  // AMX-TILE, AMX-INT8
  unsigned xcr0_lo, xcr0_hi;
  __asm__("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
  if ((xcr0_lo & (3u << 17)) != (3u << 17)) return false;  // XTILECFG, XTILEDATA
  // Linux grants the tile data per process on request (ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA);
  // without it the first tile instruction faults.
  constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
}

}  // namespace

PD_NO_AVX512 bool AmxRuns() {
  static const bool use = ReadUseAmx();
  return use;
}

PD_NO_AVX512 const GroupedKernels* Q8_0x16OwnOrderAmx() {
  return AmxRuns() ? &kOwnOrderKernels<&GemmX16Amx<X16::kQ8_0>> : nullptr;
}

PD_NO_AVX512 const GroupedKernels* Q5_0x16OwnOrderAmx() {
  return AmxRuns() ? &kOwnOrderKernels<&GemmX16Amx<X16::kQ5_0>> : nullptr;
}

PD_NO_AVX512 const GroupedKernels* Q4_Kx16OwnOrderAmx() {
  return AmxRuns() ? &kOwnOrderQ4KKernels<&GemmQ4Kx16Amx> : nullptr;
}

}  // namespace pd::engine::cpu

#else

namespace pd::engine::cpu {
bool AmxRuns() { return false; }
const GroupedKernels* Q8_0x16OwnOrderAmx() { return nullptr; }
const GroupedKernels* Q5_0x16OwnOrderAmx() { return nullptr; }
const GroupedKernels* Q4_Kx16OwnOrderAmx() { return nullptr; }
}  // namespace pd::engine::cpu

#endif
