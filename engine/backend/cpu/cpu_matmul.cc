// The CPU backend's MatMul: planning (activation conversion, weight chunks, llama.cpp's per-row
// tile orders) and the parallel loops over weight chunks.
#include <algorithm>
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif
#include <cstdint>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "engine/backend/cpu/cpu_backend_internal.h"
#include "engine/backend/cpu/kernels.h"
#include "engine/quant/dtype.h"
#include "engine/quant/k_quants.h"
#include "engine/quant/q5_0x16.h"
#include "engine/quant/q8_0.h"

namespace pd::engine::cpu {
namespace {

// A MatMul work item covers this many weight bytes (rounded to whole 4-row tiles), so that it
// stays in L2 while every activation tile streams past it: weights are read from memory once per
// call whatever the batch size.
constexpr size_t kMatMulChunkBytes = 256 << 10;
// From this many activation rows on, Q8_0 and Q5_0 weights take the grouped 512-bit kernels (16
// rows per register). Their cost per weight block does not depend on how many of the 16 lanes
// are filled, so fewer rows leave most of the work wasted: with 4 rows the grouped Q8_0 head took
// 3.0x the time of the 4x4 tiles (gemv_bench rows/q8_0/4/1: 34 ms against 11 ms of CPU). The
// AVX2 Q5_0 grouped kernel (8 rows per register) takes the same bound: at 16 rows it levels with
// the tiles (rows/q5_0/16/1, Zen 3: 1.90 against 1.85 ms), at 512 it is 1.8-2.0x faster.
constexpr int64_t kGroupedMinRows = 12;
// On AMD Zen 4 (family 19h with AVX-512), which runs 512-bit operations as two 256-bit halves, the
// grouped Q8_0 / Q5_0 kernels lose to the quad kernels up to 16 rows: gemv_bench rows/q8_0/16
// (the Gemma 3 head) 49.9 -> 33.2 ms on one thread, 25.1 -> 16.9 on two; rows/q5_0/16 1.38 ->
// 1.01 and 0.81 -> 0.66 ms (bench/results/decode_16seq_zen4_2026-12-06.md). There the grouped
// kernels start at 17 rows. Every kernel gives the tiles' bits, so this changes speed only.
constexpr int64_t kGroupedMinRowsZen4 = 17;

// True on AMD family 19h CPUs (Zen 3 and Zen 4; only Zen 4 has AVX-512).
bool AmdFamily19h() {
#if defined(__x86_64__) || defined(__i386__)
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(0, &a, &b, &c, &d)) return false;
  const bool amd = b == 0x68747541 && d == 0x69746e65 && c == 0x444d4163;  // "AuthenticAMD"
  if (!amd || !__get_cpuid(1, &a, &b, &c, &d)) return false;
  const unsigned base = (a >> 8) & 0xf;
  const unsigned family = base == 0xf ? base + ((a >> 20) & 0xff) : base;
  return family == 0x19;
#else
  return false;
#endif
}

// The row count from which Q8_0 / Q5_0 weights take the grouped kernels (and MatMulGroup runs its
// matrices one at a time) on this CPU.
int64_t GroupedMinRows() {
  static const int64_t rows =
      AmdFamily19h() && cpu::Q8_0QuadVnni() != nullptr ? kGroupedMinRowsZen4 : kGroupedMinRows;
  return rows;
}
// The 16-row VNNI grouped kernels leave at most this many rows past the last full group of 16 to
// the tiles (in the same chunks, the weights still in L2) instead of a group of their own, which
// costs as much as a full one. Gemma 3 270M (its Q8_0 head), one thread, AVX-512 Xeon, step ms of
// `pdctl bench --verify V`, a group per 16 rows begun -> the tail in tiles: V = 17 133 -> 95, 18
// 135 -> 101, 20 138 -> 115, 22 -> 133; 24 143 -> 149. A tail row costs about 6.5 ms in tiles, a
// group some 50 ms: from 7 rows on, a group of its own is as cheap (V = 23: 141 ms).
constexpr int64_t kGroupedTailToTiles = 6;
constexpr int64_t kVnniGroupRows = 16;  // activation rows per group of those kernels
// From this many rows up to kGroupedMinRows, Q8_0 and Q5_0 weights take the quad kernels (four
// activation rows per 512-bit register, a group of four costing the same however many are
// filled); fewer rows keep the 256-bit tiles, which were faster at 2 rows (gemv_bench rows/*/2/1:
// Q8_0 head 10.8 against 11.7 ms, Q5_0 255 against 350 us) and, for Q5_0, level at 3.
constexpr int64_t kQuadMinRowsQ8_0 = 3;
constexpr int64_t kQuadMinRowsQ5_0 = 4;
// Without VNNI, Q8_0 weights take the AVX2 row kernel (one weight row at a time against every
// activation row) up to this many activation rows, and the AVX2 grouped kernel (8 rows per
// register) above. gemv_bench rows/q8_0/N/1, the Gemma 3 head, Zen 3, one thread, against what
// ran before (the tiles up to 4 rows, the grouped kernel from 5): 1 row 14.8 -> 12.0 ms, 2 rows
// 18.3 -> 14.5, 3 rows 20.4 -> 17.6, 4 rows 25.5 -> 19.9, 5 rows 36.8 -> 23.7, 8 rows 37.6 ->
// 33.9; at 16 rows (two passes over the weights) it levels with the grouped kernel (68 against
// 72 ms), which reads them once (alternating runs of both builds, best of two, at 1 and 2
// threads: bench/results/decode_rows_avx2_epyc_2026-12-05.md). The grouped kernel against the
// tiles: 16 rows 70.4 against 103.2 ms (prompt/q8_0/1: 24.0 -> 17.2 ms).
// Up to 16 rows: the grouped kernel's cost goes by groups of 8 begun (9 rows cost what 16 do), and
// the row kernel's second pass costs what its rows do. `pdctl bench --verify V`, step ms, Gemma 3
// 270M, one thread, PDSERVE_CPU_ISA=avx2 on an AVX-512 Xeon, grouped -> row kernel: V = 9 132 ->
// 92, 12 (as 16 before) -> 107, 16 134 -> 127.
constexpr int64_t kRowsMaxQ8_0 = 16;
// Without VNNI, Q5_0 weights take the AVX2 row kernel for this many activation rows (the tiles
// below, the grouped kernel from kGroupedMinRows): gemv_bench rows/q5_0/N/1 (2048 x 2048, Zen 3,
// one thread, two alternating runs each) against the tiles: 3 rows 558-571 -> 488-510 us, 4 rows
// 663-667 -> 611, 5 rows 951-970 -> 649-662, 8 rows 1308-1313 -> 963-1028; 1 and 2 rows level
// (296-312, 396-407 us), so they keep the tiles.
constexpr int64_t kRowsMinQ5_0 = 3;
constexpr int64_t kRowsMaxQ5_0 = 8;

// The type MatMul converts activations to for weights of type `w` (ggml's vec_dot_type). Only for
// HasMatMul types.
DType CompanionType(DType w) {
  switch (w) {
    case DType::kF32:
    case DType::kF16:
    case DType::kBF16:
    case DType::kQ8_0:
    case DType::kW8A8:  // per-token INT8 rows
      return w;
    case DType::kQ8_0x16:  // Q8_0 / Q5_0 rows repacked
    case DType::kQ5_0x16:
      return DType::kQ8_0;
    case DType::kQ4_Kx16:  // Q4_K / Q6_K rows repacked
    case DType::kQ6_Kx16:
      return DType::kQ8_K;
    case DType::kW4A16:  // activations stay F32
      return DType::kF32;
    case DType::kQ4_0:
    case DType::kQ5_0:
      return DType::kQ8_0;
    case DType::kQ2_K:
    case DType::kQ3_K:
    case DType::kQ4_K:
    case DType::kQ5_K:
    case DType::kQ6_K:
      return DType::kQ8_K;
    case DType::kQ8_K:
      break;
  }
  PD_CHECK_MSG(false, "no matmul for this weight type");
}

// The kernel that dots weights of type `w` with their companion activations.
cpu::GemmType GemmTypeOf(DType w) {
  switch (w) {
    case DType::kF32: return cpu::GemmType::kF32;
    case DType::kF16: return cpu::GemmType::kF16;
    case DType::kBF16: return cpu::GemmType::kBF16;
    case DType::kQ8_0: return cpu::GemmType::kQ8_0;
    case DType::kQ4_0: return cpu::GemmType::kQ4_0;
    case DType::kQ5_0: return cpu::GemmType::kQ5_0;
    case DType::kQ2_K: return cpu::GemmType::kQ2_K;
    case DType::kQ3_K: return cpu::GemmType::kQ3_K;
    case DType::kQ4_K: return cpu::GemmType::kQ4_K;
    case DType::kQ5_K: return cpu::GemmType::kQ5_K;
    case DType::kQ6_K: return cpu::GemmType::kQ6_K;
    case DType::kW8A8: return cpu::GemmType::kW8A8;
    case DType::kW4A16: return cpu::GemmType::kW4A16;
    case DType::kQ8_K:
    case DType::kQ8_0x16:  // the own-order kernels only (PlanMatMul)
    case DType::kQ5_0x16:
    case DType::kQ4_Kx16:
    case DType::kQ6_Kx16:
      break;
  }
  PD_CHECK_MSG(false, "no matmul for this weight type");
}

}  // namespace

const cpu::GroupedKernels* CpuBackend::OwnOrderKernels(DType w) const {
  // Per type: its AMX kernels (q8_0x16, q5_0x16, q4_Kx16), its VNNI kernels, its AVX2 ones (none
  // for Q6_K: they lost to llama.cpp's order at 1, 4 and 16 rows, docs/numerics.md) and the
  // portable ones; `layout`: a laid-out type.
  using Get = const cpu::GroupedKernels* (*)();
  struct Entry {
    DType type;
    Get amx, vnni, avx2, portable;
    bool layout;
  };
  static constexpr Entry kEntries[] = {
      {DType::kQ8_0, nullptr, &cpu::Q8_0OwnOrderVnni, &cpu::Q8_0OwnOrderAvx2,
       &cpu::Q8_0OwnOrderScalar, false},
      {DType::kQ5_0, nullptr, &cpu::Q5_0OwnOrderVnni, &cpu::Q5_0OwnOrderAvx2,
       &cpu::Q5_0OwnOrderScalar, false},
      {DType::kQ4_K, nullptr, &cpu::Q4_KOwnOrderVnni, &cpu::Q4_KOwnOrderAvx2,
       &cpu::Q4_KOwnOrderScalar, false},
      {DType::kQ6_K, nullptr, &cpu::Q6_KOwnOrderVnni, nullptr, &cpu::Q6_KOwnOrderScalar, false},
      {DType::kQ8_0x16, &cpu::Q8_0x16OwnOrderAmx, &cpu::Q8_0x16OwnOrderVnni,
       &cpu::Q8_0x16OwnOrderAvx2, &cpu::Q8_0x16OwnOrderScalar, true},
      {DType::kQ5_0x16, &cpu::Q5_0x16OwnOrderAmx, &cpu::Q5_0x16OwnOrderVnni,
       &cpu::Q5_0x16OwnOrderAvx2, &cpu::Q5_0x16OwnOrderScalar, true},
      {DType::kQ4_Kx16, &cpu::Q4_Kx16OwnOrderAmx, &cpu::Q4_Kx16OwnOrderVnni,
       &cpu::Q4_Kx16OwnOrderAvx2, &cpu::Q4_Kx16OwnOrderScalar, true},
      {DType::kQ6_Kx16, nullptr, &cpu::Q6_Kx16OwnOrderVnni, nullptr, &cpu::Q6_Kx16OwnOrderScalar,
       true},
  };
  const bool simd = &k_ == cpu::Avx2Kernels();
  for (const Entry& e : kEntries) {
    if (e.type != w) continue;
    if (!simd) return e.portable();
    // The AMX kernels where they run (laid-out Q8_0 / Q5_0 / Q4_K), else the VNNI ones, else the
    // AVX2 ones. Without either, plain rows keep llama.cpp's order; a layout runs in its order on
    // any table (one made on another table, a test's, takes the portable kernel: the same bits).
    const cpu::GroupedKernels* g = e.amx != nullptr ? e.amx() : nullptr;
    if (g == nullptr) g = e.vnni();
    if (g == nullptr && e.avx2 != nullptr) g = e.avx2();
    return g != nullptr || !e.layout ? g : e.portable();
  }
  return nullptr;
}

// ---- MatMul --------------------------------------------------------------------------------
// Bytes: weights m * row_bytes(w) once, activations n * k * 4 plus their converted copy, and per
// weight chunk a pass over the converted activations (from cache). Flops: 2 * n * m * k.
// Activations are converted to the weight's companion type (CompanionType: F16, BF16, Q8_0 for
// Q8_0 and Q4_0, Q8_K for the k-quants) once per call, in parallel over rows.
absl::Status CpuBackend::PlanMatMul(const Tensor& w, const Tensor& x, Tensor& y,
                                    absl::Span<const uint8_t> row_orders, int slot,
                                    Converted* converted, MatMulPlan* plan) {
  if (IsSupported(w.type) && !HasMatMul(w.type)) return NoMatMul(w, "MatMul");
  PD_RETURN_IF_ERROR(CheckTensor(w, "MatMul w"));
  PD_RETURN_IF_ERROR(CheckF32(x, "MatMul x"));
  PD_RETURN_IF_ERROR(CheckF32(y, "MatMul y"));
  if (x.cols != w.cols || y.rows != x.rows || y.cols != w.rows) {
    return absl::InvalidArgumentError(absl::StrCat("MatMul: w ", Describe(w), ", x ", Describe(x),
                                                   ", y ", Describe(y),
                                                   " (want y [x.rows, w.rows], x.cols == w.cols)"));
  }
  if (Overlap(y, x) || Overlap(y, w)) {
    return absl::InvalidArgumentError("MatMul: y must not overlap x or w");
  }
  const int64_t n = x.rows, m = w.rows, k = w.cols;
  int64_t n_own = 0;
  for (uint8_t o : row_orders) n_own += (o & kRowOrderOwn) != 0;
  if (n_own != 0 && n_own != n) {
    return absl::InvalidArgumentError(absl::StrCat(
        "MatMul: ", n_own, " of ", n, " rows ask for the own order; it is for all rows or none"));
  }
  // Only Q8_0, Q5_0, Q4_K and Q6_K rows have an own order on this backend, and only where it is
  // the faster one (with AVX512-VNNI; on AVX2 alone all but Q6_K's, own_order_avx2.cc; in the
  // portable table); other types and CPUs keep llama.cpp's. Weights laid out for it
  // (MapWeightsOwnLayout: q8_0x16, q5_0x16, q4_Kx16, q6_Kx16) take it on every row, flags or not.
  const bool laid_out = w.type == DType::kQ8_0x16 || w.type == DType::kQ5_0x16 ||
                        w.type == DType::kQ4_Kx16 || w.type == DType::kQ6_Kx16;
  const cpu::GroupedKernels* own_kernels = nullptr;
  if (n_own != 0 || laid_out) own_kernels = OwnOrderKernels(w.type);
  if (laid_out && w.type != DType::kQ8_0x16 && m % 16 != 0) {
    return absl::InvalidArgumentError(absl::StrCat("MatMul: a ", std::string(Traits(w.type).name),
                                                   " view of ", m,
                                                   " rows (want a multiple of 16)"));
  }
  const bool own = own_kernels != nullptr;
  if (w.type == DType::kW8A8 && k > kW8A8MaxCols) {
    return absl::InvalidArgumentError(absl::StrCat("MatMul: w8a8 rows of ", k,
                                                   " exceed the kernels' limit of ", kW8A8MaxCols));
  }
  *plan = MatMulPlan{&w, &y, n, m, k, static_cast<const char*>(x.data), x.row_bytes(),
                     row_orders, 0, 0};
  if (n == 0 || m == 0) return absl::OkStatus();
  if (k == 0) {
    std::memset(y.data, 0, y.bytes());
    return absl::OkStatus();
  }

  const DType xt = CompanionType(w.type);
  const char* xa = static_cast<const char*>(x.data);
  size_t xs = x.row_bytes();
  if (xt != DType::kF32 && converted != nullptr && converted->data != nullptr &&
      converted->type == xt) {
    xa = converted->data;
    xs = converted->stride;
  } else if (xt != DType::kF32) {
    // Convert every activation row once to the weight's companion type; every weight chunk below
    // then reuses the converted rows.
    xs = RowBytes(xt, k);
    PD_ASSIGN_OR_RETURN(char* conv, Scratch(xs * static_cast<size_t>(n), slot));
    const Kernels& kn = k_;
    pool_.ParallelFor(
        n,
        [&](int64_t r0, int64_t r1) {
          for (int64_t r = r0; r < r1; ++r) {
            const float* src = RowF32(x, r);
            char* dst = conv + r * xs;
            switch (xt) {
              case DType::kF16:
                kn.f32_to_f16(src, reinterpret_cast<uint16_t*>(dst), k);
                break;
              case DType::kBF16:
                kn.f32_to_bf16(src, reinterpret_cast<uint16_t*>(dst), k);
                break;
              case DType::kQ8_0:
                kn.quantize_q8_0(src, reinterpret_cast<BlockQ8_0*>(dst), k);
                break;
              case DType::kQ8_K:
                kn.quantize_q8_k(src, reinterpret_cast<BlockQ8_K*>(dst), k);
                break;
              case DType::kW8A8:
                kn.quantize_w8a8(src, dst, k);
                break;
              case DType::kF32:
              case DType::kW4A16:
              case DType::kQ8_0x16:
              case DType::kQ5_0x16:
              case DType::kQ4_Kx16:
              case DType::kQ4_0:
              case DType::kQ5_0:
              case DType::kQ2_K:
              case DType::kQ3_K:
              case DType::kQ4_K:
              case DType::kQ5_K:
              case DType::kQ6_K:
                PD_CHECK(false);  // never a companion type that needs converting
            }
          }
        },
        /*grain=*/std::max<int64_t>(1, 16384 / k));
    xa = conv;
    if (converted != nullptr) *converted = Converted{xt, xa, xs};
  }
  plan->xa = xa;
  plan->xs = xs;
  // Rows that no llama.cpp order binds take pdserve's own order (kRowOrderOwn, kernels.h).
  plan->quad = own_kernels;
  // A few Q8_0 rows against Q8_0 / Q5_0 weights: packed once for the quad kernels (shared by a
  // MatMulGroup's matrices through `converted`).
  if (!own && n < GroupedMinRows() && &k_ == cpu::Avx2Kernels()) {
    if (w.type == DType::kQ8_0 && n >= kQuadMinRowsQ8_0) plan->quad = cpu::Q8_0QuadVnni();
    if (w.type == DType::kQ5_0 && n >= kQuadMinRowsQ5_0) plan->quad = cpu::Q5_0QuadVnni();
  }
  // Without VNNI, Q8_0 weights take the AVX2 row kernel up to kRowsMaxQ8_0 rows and the AVX2
  // grouped kernel above, Q5_0 the row kernel from kRowsMinQ5_0 to kRowsMaxQ5_0 rows (all read
  // the weights in place), in this slot too: the same contract. The two row kernels share one
  // pack_x, so a MatMulGroup of both types (Gemma 3's Q5_0 q / k and Q8_0 v) packs once.
  if (w.type == DType::kQ8_0 && plan->quad == nullptr && &k_ == cpu::Avx2Kernels() &&
      cpu::Q8_0GroupedVnni() == nullptr) {
    plan->quad = n <= kRowsMaxQ8_0 ? cpu::Q8_0RowsAvx2() : cpu::Q8_0GroupedAvx2();
  }
  if (w.type == DType::kQ5_0 && plan->quad == nullptr && &k_ == cpu::Avx2Kernels() &&
      cpu::Q5_0GroupedVnni() == nullptr && n >= kRowsMinQ5_0 && n <= kRowsMaxQ5_0) {
    plan->quad = cpu::Q5_0RowsAvx2();
  }
  if (plan->quad != nullptr) {
    if (converted != nullptr && converted->quad_x != nullptr && converted->data == xa &&
        converted->quad->pack_x == plan->quad->pack_x) {
      plan->quad_x = converted->quad_x;
    } else {
      std::vector<char>& buf = quad_x_[slot];
      buf.resize(plan->quad->x_bytes(n, k) + 64);
      char* aligned = buf.data() + (64 - reinterpret_cast<uintptr_t>(buf.data()) % 64) % 64;
      plan->quad->pack_x(xa, xs, n, k, aligned);
      plan->quad_x = aligned;
      if (converted != nullptr && converted->data == xa) {
        converted->quad_x = aligned;
        converted->quad = plan->quad;
      }
    }
  }
  int64_t chunk_rows =
      static_cast<int64_t>(kMatMulChunkBytes / w.row_bytes()) / cpu::kGemmTileW * cpu::kGemmTileW;
  // At least 4 chunks per thread: a small model's K/V projections (256 rows) are one 256 KiB
  // chunk, which left all but one thread idle during decode. Chunk starts stay multiples of the
  // tile height, so the tiles (and the results) are the same for every thread count.
  const int64_t min_chunks = 4 * static_cast<int64_t>(pool_.num_threads());
  const int64_t balanced_rows =
      ((m + min_chunks - 1) / min_chunks + cpu::kGemmTileW - 1) / cpu::kGemmTileW *
      cpu::kGemmTileW;
  chunk_rows = std::max<int64_t>(cpu::kGemmTileW, std::min(chunk_rows, balanced_rows));
  // The own-order kernels take weight rows 16 at a time (a part group costs a whole one).
  if (own) chunk_rows = (chunk_rows + 15) / 16 * 16;
  plan->chunk_rows = chunk_rows;
  plan->n_chunks = (m + chunk_rows - 1) / chunk_rows;
  return absl::OkStatus();
}

absl::Status CpuBackend::MatMulImpl(const Tensor& w, const Tensor& x, Tensor& y,
                                    absl::Span<const uint8_t> row_orders) {
  MatMulPlan p;
  PD_RETURN_IF_ERROR(PlanMatMul(w, x, y, row_orders, /*slot=*/0, /*converted=*/nullptr, &p));
  if (p.n_chunks == 0) return absl::OkStatus();
  const int64_t n = p.n, m = p.m, k = p.k, chunk_rows = p.chunk_rows, n_chunks = p.n_chunks;
  const char* wa = static_cast<const char*>(w.data);
  const size_t ws = w.row_bytes();
  float* ya = static_cast<float*>(y.data);
  // Q8_0 and Q5_0 for a batch: activations laid out 16 rows per register once; Q8_0 weights read
  // in place, Q5_0 chunks unpacked once per call, or read in place for a single group of 16 rows
  // (AVX512-VNNI). Without VNNI, Q5_0 takes the AVX2 grouped kernel (8 rows per register; prompt
  // GEMM 1.8-2.0x the 4x4 tiles, gemv_bench prompt/q5_0/1 on Zen 3), and Q8_0 its AVX2 grouped
  // kernel through the plan's in-place slot (PlanMatMul). All are bit-identical to the tiles
  // below, so results do not depend on the batch size.
  // Without the 512-bit k-quant tiles, Q4_K matrices llama.cpp repacks and Q6_K ones take AVX2
  // grouped kernels for the leading rows in the order each reproduces (a prompt's rows: Q4_K's
  // repacked GEMM order, all but the last n % 4; Q6_K's tiled order, all of them from 8 rows),
  // bit-identical to the tiles of that order; the rows after (GEMV or vec_dot order) take the
  // tiles, in the same chunks.
  const cpu::GroupedKernels* grouped = nullptr;
  int64_t n_grouped = n;
  // The leading rows whose order has (want) or lacks (!want) `flag`; by_default without orders.
  auto leading = [&](uint8_t flag, bool want, int64_t by_default) {
    if (row_orders.empty()) return by_default;
    int64_t i = 0;
    while (i < n && ((row_orders[i] & flag) != 0) == want) ++i;
    return i;
  };
  if (p.quad == nullptr && n >= GroupedMinRows() && &k_ == cpu::Avx2Kernels()) {
    if (w.type == DType::kQ8_0) grouped = cpu::Q8_0GroupedVnni();
    if (w.type == DType::kQ5_0) grouped = cpu::Q5_0GroupedVnni();
    if (grouped != nullptr && n > kVnniGroupRows && n % kVnniGroupRows <= kGroupedTailToTiles) {
      n_grouped = n - n % kVnniGroupRows;
    }
    if (w.type == DType::kQ5_0 && grouped != nullptr && n_grouped <= kVnniGroupRows) {
      grouped = cpu::Q5_0GroupedInPlaceVnni();
    }
    if (w.type == DType::kQ5_0 && grouped == nullptr) grouped = cpu::Q5_0GroupedAvx2();
    const cpu::ZmmKQuantTiles zmm = cpu::ZmmKQuantTilesIfSupported();
    if (w.type == DType::kQ4_K && m % 8 == 0 && zmm.q4_k_repack_gemm == nullptr) {
      n_grouped = leading(kRowOrderGemv, false, n - n % 4);
      if (n_grouped >= kGroupedMinRows) grouped = cpu::Q4KRepackGroupedAvx2();
    }
    if (w.type == DType::kQ6_K && zmm.q6_k_wide == nullptr) {
      n_grouped = leading(kRowOrderWide, true, n);
      if (n_grouped >= kGroupedMinRows) grouped = cpu::Q6KWideGroupedAvx2();
    }
  }
  if (grouped != nullptr) {
    thread_local std::vector<char> xg_storage;
    xg_storage.resize(grouped->x_bytes(n_grouped, k) + 64);
    char* xg = xg_storage.data() + (64 - reinterpret_cast<uintptr_t>(xg_storage.data()) % 64) % 64;
    grouped->pack_x(p.xa, p.xs, n_grouped, k, xg);
    p.x_begin = n_grouped;  // the tiles take the rows after
    pool_.ParallelFor(n_chunks, [&](int64_t c0, int64_t c1) {
      thread_local std::vector<char> wp;
      for (int64_t c = c0; c < c1; ++c) {
        const int64_t r_begin = c * chunk_rows, rows = std::min(m, (c + 1) * chunk_rows) - r_begin;
        const char* wc = wa + r_begin * ws;
        if (grouped->pack_w == nullptr) {
          grouped->gemm(k, wc, ws, rows, xg, n_grouped, ya + r_begin, m);
        } else {
          wp.resize(grouped->w_bytes(rows, k));
          grouped->pack_w(wc, ws, rows, k, wp.data());
          grouped->gemm(k, wp.data(), 0, rows, xg, n_grouped, ya + r_begin, m);
        }
        if (n_grouped < n) RunMatMulChunks(p, c, c + 1);
      }
    });
    return absl::OkStatus();
  }
  pool_.ParallelFor(n_chunks, [&](int64_t c0, int64_t c1) { RunMatMulChunks(p, c0, c1); });
  return absl::OkStatus();
}

void CpuBackend::RunMatMulChunks(const MatMulPlan& p, int64_t c0, int64_t c1) const {
  const Tensor& w = *p.w;
  const int64_t n = p.n, m = p.m, k = p.k, chunk_rows = p.chunk_rows;
  const absl::Span<const uint8_t> row_orders = p.row_orders;
  const char* xa = p.xa;
  const size_t xs = p.xs;
  const char* wa = static_cast<const char*>(w.data);
  const size_t ws = w.row_bytes();
  float* ya = static_cast<float*>(p.y->data);
  const int64_t r_begin = c0 * chunk_rows, r_end = std::min(m, c1 * chunk_rows);
  if (p.quad != nullptr) {
    p.quad->gemm(k, wa + r_begin * ws, ws, r_end - r_begin, p.quad_x, n, ya + r_begin, m);
    return;
  }
  const cpu::GemmTileFn tile = k_.gemm[static_cast<int>(GemmTypeOf(w.type))];
  // llama.cpp's per-row orders (Backend::MatMulRowOrder): Q4_K matrices it repacks (rows a
  // multiple of 8) take its repacked GEMM / GEMV orders, other k-quants its tiled order for
  // sequences of 8+ rows; consecutive rows of one order share tiles. Q2_K is repacked too where
  // llama.cpp would be (q2_k_repacked_).
  const bool repacked_q4 = w.type == DType::kQ4_K && m % 8 == 0;
  const bool repacked_q2 = w.type == DType::kQ2_K && m % 8 == 0 && q2_k_repacked_;
  const bool repacked = repacked_q4 || repacked_q2;
  const cpu::GemmTileFn wide_tile = k_.gemm_wide[static_cast<int>(GemmTypeOf(w.type))];
  auto order_of = [&](int64_t i) -> uint8_t {
    if (!row_orders.empty()) return row_orders[i];
    return (i >= n - n % 4 ? kRowOrderGemv : 0) | (n >= 8 ? kRowOrderWide : 0);
  };
  auto tile_of = [&](int64_t i) -> cpu::GemmTileFn {
    const uint8_t o = order_of(i);
    if (repacked_q4) return (o & kRowOrderGemv) ? k_.q4_k_repack_gemv : k_.q4_k_repack_gemm;
    if (repacked_q2) return (o & kRowOrderGemv) ? k_.q2_k_repack_gemv : k_.q2_k_repack_gemm;
    if (wide_tile != nullptr && (o & kRowOrderWide)) return wide_tile;
    return tile;
  };
  const bool per_row = repacked || wide_tile != nullptr;
  // Activation tiles outer, weight tiles inner: this chunk of weights stays in cache.
  for (int64_t i = p.x_begin; i < n;) {
    int nc = static_cast<int>(std::min<int64_t>(cpu::kGemmTileX, n - i));
    cpu::GemmTileFn fn = tile;
    if (per_row) {
      fn = tile_of(i);
      int same = 1;
      while (same < nc && tile_of(i + same) == fn) ++same;
      nc = same;
    }
    // Five rows of one tile (a K = 4 speculative step, five sequences) in one pass where the
    // table has such a tile: 4 + 1 columns unpack every weight block twice.
    if (nc == cpu::kGemmTileX && n - i == cpu::kGemmTileX + 1 &&
        (!per_row || tile_of(i + cpu::kGemmTileX) == fn)) {
      cpu::GemmTileFn five = nullptr;
      if (fn == k_.q4_k_repack_gemv) five = k_.q4_k_repack_gemv5;
      if (fn == k_.gemm[static_cast<int>(cpu::GemmType::kQ6_K)]) five = k_.q6_k5;
      if (five != nullptr) {
        fn = five;
        nc = cpu::kGemmTileX + 1;
      }
    }
    for (int64_t r = r_begin; r < r_end; r += cpu::kGemmTileW) {
      const int nr = static_cast<int>(std::min<int64_t>(cpu::kGemmTileW, r_end - r));
      fn(k, wa + r * ws, ws, nr, xa + i * xs, xs, nc, ya + i * m + r, m);
    }
    i += nc;
  }
}

absl::Status CpuBackend::MatMulGroup(absl::Span<const Tensor* const> ws, const Tensor& x,
                                     absl::Span<Tensor* const> ys,
                                     absl::Span<const uint8_t> row_orders) {
  if (ws.size() != ys.size()) {
    return absl::InvalidArgumentError(absl::StrCat("MatMulGroup: ", ws.size(), " weights, ",
                                                   ys.size(), " outputs"));
  }
  if (static_cast<int64_t>(row_orders.size()) != x.rows) {
    return absl::InvalidArgumentError(absl::StrCat("MatMulGroup: ", row_orders.size(),
                                                   " row orders for x ", Describe(x)));
  }
  // Batches (the grouped VNNI GEMM) and groups with more companion types than scratch slots run
  // one MatMul at a time.
  bool one_loop = ws.size() > 1 && x.rows < GroupedMinRows();
  DType types[kScratchSlots];
  int n_types = 0;
  for (size_t i = 0; one_loop && i < ws.size(); ++i) {
    const DType xt = CompanionType(ws[i]->type);
    if (xt == DType::kF32 || std::find(types, types + n_types, xt) != types + n_types) continue;
    if (n_types == kScratchSlots) {
      one_loop = false;
    } else {
      types[n_types++] = xt;
    }
  }
  if (!one_loop) {
    for (size_t i = 0; i < ws.size(); ++i) {
      PD_RETURN_IF_ERROR(MatMulImpl(*ws[i], x, *ys[i], row_orders));
    }
    return absl::OkStatus();
  }
  // Each matrix's chunks are the ones MatMul would use (so the same tiles and bits); the
  // activations are converted once per companion type; one parallel loop runs all chunks.
  Converted converted[kScratchSlots];
  std::vector<MatMulPlan> plans(ws.size());
  std::vector<int64_t> first(ws.size() + 1, 0);
  for (size_t i = 0; i < ws.size(); ++i) {
    const DType xt = CompanionType(ws[i]->type);
    const int slot =
        xt == DType::kF32 ? 0 : static_cast<int>(std::find(types, types + n_types, xt) - types);
    PD_RETURN_IF_ERROR(
        PlanMatMul(*ws[i], x, *ys[i], row_orders, slot, &converted[slot], &plans[i]));
    first[i + 1] = first[i] + plans[i].n_chunks;
  }
  pool_.ParallelFor(first.back(), [&](int64_t c0, int64_t c1) {
    size_t j =
        static_cast<size_t>(std::upper_bound(first.begin(), first.end(), c0) - first.begin()) - 1;
    for (int64_t c = c0; c < c1;) {
      while (c >= first[j + 1]) ++j;
      const int64_t end = std::min(c1, first[j + 1]);
      RunMatMulChunks(plans[j], c - first[j], end - first[j]);
      c = end;
    }
  });
  return absl::OkStatus();
}

}  // namespace pd::engine::cpu
