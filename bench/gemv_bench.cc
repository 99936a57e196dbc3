// Decode GEMV throughput of the CPU backend per weight format, next to the machine's DRAM read
// bandwidth measured in the same run (bench/run_gemv_bench.sh turns the output into a table).
//
// dram_read/<t>: t threads sum a 2 GiB buffer (far beyond any last-level cache) with 256-bit loads:
//   the read bandwidth a memory-bound kernel can hope for. Counter GBps = bytes read / s. Every
//   buffer here (this one and the weights) asks for 2 MiB pages, as the CPU backend holds a
//   model's weights (docs/config.md, PDSERVE_CPU_WEIGHTS); with 4 KiB pages both read slower.
// gemv/<format>/<case>/<t>: Backend::MatMul (CreateCpuBackend with t threads) of one F32
//   activation row against 8192 x 8192 weights, the real decode path (activation conversion,
//   tiling, thread pool). Counter GBps = weight bytes read / s; the activation's bytes are
//   negligible (32 KiB of F32 per call).
//   case l3:   one matrix, called repeatedly: it stays in the last-level cache when it fits
//              (formats of up to ~7 bits per weight on a 260 MiB L3), so this measures the kernel.
//   case dram: enough distinct matrices, called in turn, that together they hold >= 1 GiB: every
//              call reads its weights from DRAM.
// rows/<format>/<n>/<t>: the small-batch decode path. n F32 activation rows (n decode sequences,
//   or the n = K+1 rows a speculative step verifies), every row in the one-token (GEMV) order,
//   against the default model's shapes: Q8_0 as its 262,144 x 640 output head (178 MB), the
//   others 2048 x 2048 matrices, enough of them to hold >= 256 MiB, called in turn (from DRAM).
//   Counter GBps = weight bytes / s; rows_per_s = n * calls / s. Bandwidth-bound means the time
//   per call barely grows with n. Kernels on AVX-512 VNNI CPUs: Q8_0 / Q5_0 the 256-bit VNNI
//   tiles (1-2 rows), the quad kernels (3-4 to 11 rows), the grouped ones (12+); Q4_K (repacked
//   GEMV order) and Q6_K the ZMM tiles, four rows per weight unpacking (n = 5: a second pass
//   over the chunk for the fifth row). With PDSERVE_CPU_NO_VNNI=1 (or without VNNI): Q8_0 the
//   AVX2 row kernel up to 8 rows (rows_avx2.cc), the grouped one above; Q5_0 the 4x4 tiles for
//   1-2 and 9-11 rows, the row kernel for 3-8, the grouped one from 12; the k-quants the AVX2
//   tiles.
// head_own/q8_0/<n>/<t>: rows/q8_0/<n>/<t> with every row in pdserve's own order (kRowOrderOwn:
//   the output head over an F16 or INT8 cache, docs/numerics.md): 16 weight rows per register
//   on AVX-512 VNNI, 8 on AVX2 (PDSERVE_CPU_NO_VNNI=1 or without VNNI).
// head_x16/q8_0/<n>/<t>: head_own with the matrices repacked as q8_0x16 (what the model's head
//   takes in the own order, Weights::MapOwnHead): the same bits, no transposition per block.
// rows_own/q5_0/<n>/<t>: rows/q5_0/<n>/<t> with every row in the own order on the file's rows
//   (weights not laid out: copies off or past their budget), the transposing kernels.
// rows_x16/q5_0/<n>/<t>: rows/q5_0/<n>/<t> in the own order on the matrices laid out as q5_0x16
//   (what a model's Q5_0 layer matrices take over an F16 or INT8 cache, PDSERVE_LAYER_ORDER=own).
// rows_own/q4_K, rows_x16/q4_K, rows_own/q6_K, rows_x16/q6_K: the same for Q4_K and Q6_K (laid
//   out as q4_Kx16 / q6_Kx16 at load; on the file's rows each group of 16 is laid out in scratch
//   per call, the fallback).
// prompt_x16/<format>/<t>: prompt/<format>/<t> on the matrix laid out for the own order.
// prompt/<format>/<t>: one prompt's MatMul, 512 F32 activation rows in the default (prompt) order
//   against the default model's shapes, 2048 x 640 for the 32-block formats (Q5_0 and Q8_0 are
//   its FFN gate / up shape) and 640 x 2048 for the k-quants (FFN down), from cache: the compute
//   bound of prefill. Counter GMACps = multiply-adds (512 * rows * cols) / s.
// Weights hold random codes with finite, normal super-scales (every bit pattern of a code or a
// sub-block scale is valid; W8A8 codes avoid -128): kernel speed does not depend on the values.
// W8A8 (pdserve's INT8 weights x per-token INT8 activations) and W4A16 (INT4 groups of 128 x F32
// activations) have rows of their own: see engine/quant/w8a8.h and w4a16.h.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "common/host_alloc.h"
#include "common/status.h"
#include "common/strings.h"
#include "engine/backend/backend.h"
#include "engine/backend/cpu/thread_pool.h"
#include "engine/quant/dtype.h"
#include "engine/quant/fp16.h"

namespace pd::engine {
namespace {

constexpr int64_t kRows = 8192, kCols = 8192;
constexpr size_t kDramReadBytes = size_t{2} << 30;  // bandwidth buffer
constexpr size_t kDramSetBytes = size_t{1} << 30;   // least weight bytes of the DRAM case

struct Free {
  void operator()(void* p) const { std::free(p); }
};
using HostBytes = std::unique_ptr<char, Free>;

// 2 MiB pages where the kernel gives them (pd::AllocHost), as the model loader holds weights.
HostBytes AllocBytes(size_t bytes) {
  void* p = pd::AllocHost(bytes, 64);
  PD_CHECK_MSG(p != nullptr, "out of memory");
  return HostBytes(static_cast<char*>(p));
}

// xorshift64*: fast enough to fill a GiB in well under a second.
struct Rng {
  uint64_t s;
  uint64_t Next() {
    s ^= s >> 12;
    s ^= s << 25;
    s ^= s >> 27;
    return s * 0x2545F4914F6CDD1Dull;
  }
};

// ---- DRAM read bandwidth ---------------------------------------------------------------------

#if defined(__x86_64__)
__attribute__((target("avx2"))) uint64_t SumAvx2(const char* p, size_t n) {
  __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
  for (size_t i = 0; i + 128 <= n; i += 128) {
    a0 = _mm256_add_epi64(a0, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i)));
    a1 = _mm256_add_epi64(a1, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 32)));
    a2 = _mm256_add_epi64(a2, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 64)));
    a3 = _mm256_add_epi64(a3, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 96)));
  }
  const __m256i s = _mm256_add_epi64(_mm256_add_epi64(a0, a1), _mm256_add_epi64(a2, a3));
  alignas(32) uint64_t lanes[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), s);
  return lanes[0] + lanes[1] + lanes[2] + lanes[3];
}
#endif

uint64_t SumBytes(const char* p, size_t n) {
#if defined(__x86_64__)
  if (__builtin_cpu_supports("avx2")) return SumAvx2(p, n);
#endif
  uint64_t s = 0;
  for (size_t i = 0; i + 8 <= n; i += 8) {
    uint64_t v;
    std::memcpy(&v, p + i, 8);
    s += v;
  }
  return s;
}

// The bandwidth buffer, allocated by the first dram_read run and freed by the first gemv run.
HostBytes g_read_buffer;

const char* ReadBuffer() {
  if (g_read_buffer == nullptr) {
    g_read_buffer = AllocBytes(kDramReadBytes);
    Rng rng{42};
    for (size_t i = 0; i < kDramReadBytes; i += 8) {
      const uint64_t v = rng.Next();
      std::memcpy(g_read_buffer.get() + i, &v, 8);
    }
  }
  return g_read_buffer.get();
}

void BM_DramRead(benchmark::State& state) {
  const int threads = static_cast<int>(state.range(0));
  const char* buf = ReadBuffer();
  cpu::ThreadPool pool(threads);
  const int64_t chunks = 256;  // 8 MiB each, claimed dynamically
  const size_t chunk = kDramReadBytes / chunks;
  for (auto _ : state) {
    std::vector<uint64_t> sums(chunks);
    pool.ParallelFor(chunks, [&](int64_t c0, int64_t c1) {
      for (int64_t c = c0; c < c1; ++c) sums[c] = SumBytes(buf + c * chunk, chunk);
    });
    benchmark::DoNotOptimize(sums.data());
  }
  state.counters["GBps"] = benchmark::Counter(
      static_cast<double>(kDramReadBytes) * state.iterations() / 1e9, benchmark::Counter::kIsRate);
}

// ---- GEMV ----------------------------------------------------------------------------------

// Byte offsets of the f16 super-scales in a block of each quantized type.
std::vector<int> ScaleOffsets(DType t) {
  switch (t) {
    case DType::kQ8_0:
    case DType::kQ4_0:
    case DType::kQ5_0: return {0};
    case DType::kQ2_K: return {80, 82};
    case DType::kQ3_K: return {108};
    case DType::kQ4_K:
    case DType::kQ5_K: return {0, 2};
    case DType::kQ6_K: return {208};
    case DType::kW4A16: return {0};
    default: return {};
  }
}

// `bytes` of random weights of type t: normal finite floats for F32/F16/BF16; random codes and
// sub-block scales with f16 super-scales in [2^-10, 2^-6) of either sign for the quantized types.
void FillWeights(DType t, char* p, size_t bytes, uint64_t seed) {
  Rng rng{seed * 0x9E3779B97F4A7C15ull + 1};
  if (t == DType::kF32) {
    for (size_t i = 0; i + 4 <= bytes; i += 4) {
      const float f = static_cast<float>(static_cast<int32_t>(rng.Next() >> 32)) * 0x1p-31f;
      std::memcpy(p + i, &f, 4);
    }
    return;
  }
  for (size_t i = 0; i + 8 <= bytes; i += 8) {
    const uint64_t v = rng.Next();
    std::memcpy(p + i, &v, 8);
  }
  if (t == DType::kF16 || t == DType::kBF16) {
    // Keep sign and mantissa, force the exponent to a normal range around 1.
    const uint16_t exp_mask = t == DType::kF16 ? 0x7c00 : 0x7f80;
    const uint16_t exp_one = t == DType::kF16 ? 0x3800 : 0x3f00;  // 0.5
    for (size_t i = 0; i + 2 <= bytes; i += 2) {
      uint16_t h;
      std::memcpy(&h, p + i, 2);
      h = static_cast<uint16_t>((h & ~exp_mask) | exp_one);
      std::memcpy(p + i, &h, 2);
    }
    return;
  }
  if (t == DType::kW8A8) {
    // Rows of a 16-byte header (f32 scale, zero padding) and int8 codes; -128 is no valid code.
    const size_t rb = RowBytes(t, kCols);
    for (size_t r = 0; r + rb <= bytes; r += rb) {
      const float d = std::exp2(-10.f + static_cast<float>(rng.Next() >> 60) / 4.f);
      std::memset(p + r, 0, 16);
      std::memcpy(p + r, &d, 4);
      for (size_t j = 16; j < rb; ++j) {
        if (static_cast<uint8_t>(p[r + j]) == 0x80) p[r + j] = static_cast<char>(0x81);
      }
    }
    return;
  }
  const size_t bb = Traits(t).block_bytes;
  const std::vector<int> offsets = ScaleOffsets(t);
  for (size_t b = 0; b + bb <= bytes; b += bb) {
    for (int off : offsets) {
      const uint64_t r = rng.Next();
      const float d = ((r & 1) ? -1.f : 1.f) * std::exp2(-10.f + static_cast<float>(r >> 60) / 4.f);
      const uint16_t h = F32ToF16(d);
      std::memcpy(p + b + off, &h, 2);
    }
  }
}

// The weights of one benchmark: `count` distinct matrices of kRows x kCols, back to back.
struct WeightSet {
  DType type = DType::kF32;
  bool dram = false;
  int count = 0;
  size_t matrix_bytes = 0;
  HostBytes bytes;
};

// One set is kept at a time (benchmarks run in registration order: every thread count of a
// (format, case) pair in a row), so memory holds at most one 1 GiB set besides the read buffer.
WeightSet& Weights(DType t, bool dram) {
  static WeightSet set;
  if (set.bytes != nullptr && set.type == t && set.dram == dram) return set;
  g_read_buffer.reset();  // the bandwidth runs are over
  set.bytes.reset();
  set.type = t;
  set.dram = dram;
  set.matrix_bytes = RowBytes(t, kCols) * kRows;
  set.count = dram ? static_cast<int>((kDramSetBytes + set.matrix_bytes - 1) / set.matrix_bytes)
                   : 1;
  set.bytes = AllocBytes(set.matrix_bytes * set.count);
  for (int i = 0; i < set.count; ++i) {
    FillWeights(t, set.bytes.get() + i * set.matrix_bytes, set.matrix_bytes, i + 1);
  }
  return set;
}

void BM_Gemv(benchmark::State& state, DType t, bool dram, int threads) {
  WeightSet& set = Weights(t, dram);
  std::unique_ptr<Backend> be = CreateCpuBackend({.threads = threads});
  std::vector<float> xv(kCols), yv(kRows);
  Rng rng{7};
  for (float& f : xv) f = static_cast<float>(static_cast<int32_t>(rng.Next() >> 32)) * 0x1p-31f;
  Tensor x{DType::kF32, kCols, 1, xv.data()};
  Tensor y{DType::kF32, kRows, 1, yv.data()};
  std::vector<Tensor> w(set.count);
  for (int i = 0; i < set.count; ++i) {
    w[i] = Tensor{t, kCols, kRows, set.bytes.get() + i * set.matrix_bytes};
  }
  // Warm up: the L3 case's matrix into the cache, the thread pool awake.
  for (int i = 0; i < set.count; ++i) PD_CHECK_OK(be->MatMul(w[i], x, y));
  int next = 0;
  for (auto _ : state) {
    PD_CHECK_OK(be->MatMul(w[next], x, y));
    benchmark::DoNotOptimize(yv.data());
    if (++next == set.count) next = 0;
  }
  state.counters["GBps"] = benchmark::Counter(
      static_cast<double>(set.matrix_bytes) * state.iterations() / 1e9,
      benchmark::Counter::kIsRate);
  state.counters["bytes_per_weight"] =
      static_cast<double>(set.matrix_bytes) / static_cast<double>(kRows * kCols);
  state.counters["set_MiB"] = static_cast<double>(set.matrix_bytes * set.count) / (1 << 20);
}

// `w` laid out for the own order by the backend that runs it (q8_0x16, q5_0x16, q4_Kx16,
// q6_Kx16: what a model's matrices take at load), its bytes in *storage.
Tensor LaidOut(Backend& be, const Tensor& w, std::unique_ptr<Buffer>* storage) {
  absl::StatusOr<Tensor> laid = be.MapWeightsOwnLayout(w, storage);
  PD_CHECK_OK(laid.status());
  PD_CHECK_MSG(laid->data != nullptr, "no own-order layout for this type on this CPU");
  return *laid;
}

void BM_Rows(benchmark::State& state, DType t, int n, int threads, uint8_t order, bool x16) {
  const int64_t rows = t == DType::kQ8_0 ? 262144 : 2048;
  const int64_t cols = t == DType::kQ8_0 ? 640 : 2048;
  const size_t matrix_bytes = RowBytes(t, cols) * rows;
  const int count = static_cast<int>(((size_t{256} << 20) + matrix_bytes - 1) / matrix_bytes);
  static DType set_type = DType::kF32;
  static HostBytes set;
  if (set == nullptr || set_type != t) {
    g_read_buffer.reset();
    set.reset();
    set = AllocBytes(matrix_bytes * count);
    for (int i = 0; i < count; ++i) FillWeights(t, set.get() + i * matrix_bytes, matrix_bytes, i + 1);
    set_type = t;
  }
  std::unique_ptr<Backend> be = CreateCpuBackend({.threads = threads});
  std::vector<float> xv(cols * n), yv(rows * n);
  Rng rng{7};
  for (float& f : xv) f = static_cast<float>(static_cast<int32_t>(rng.Next() >> 32)) * 0x1p-31f;
  Tensor x{DType::kF32, cols, n, xv.data()};
  Tensor y{DType::kF32, rows, n, yv.data()};
  const std::vector<uint8_t> orders(n, order);
  std::vector<Tensor> w(count);
  for (int i = 0; i < count; ++i) w[i] = Tensor{t, cols, rows, set.get() + i * matrix_bytes};
  // The same matrices laid out for the own order (head_x16, rows_x16).
  std::vector<std::unique_ptr<Buffer>> laid(x16 ? count : 0);
  for (size_t i = 0; i < laid.size(); ++i) w[i] = LaidOut(*be, w[i], &laid[i]);
  for (int i = 0; i < count; ++i) PD_CHECK_OK(be->MatMulRowOrder(w[i], x, y, orders));
  int next = 0;
  for (auto _ : state) {
    PD_CHECK_OK(be->MatMulRowOrder(w[next], x, y, orders));
    benchmark::DoNotOptimize(yv.data());
    if (++next == count) next = 0;
  }
  state.counters["GBps"] = benchmark::Counter(
      static_cast<double>(matrix_bytes) * state.iterations() / 1e9, benchmark::Counter::kIsRate);
  state.counters["rows_per_s"] = benchmark::Counter(
      static_cast<double>(n) * state.iterations(), benchmark::Counter::kIsRate);
}

void BM_Prompt(benchmark::State& state, DType t, int threads, bool x16) {
  constexpr int64_t n = 512;
  const bool kquant = Traits(t).block_size == 256;
  const int64_t rows = kquant ? 640 : 2048, cols = kquant ? 2048 : 640;
  const size_t matrix_bytes = RowBytes(t, cols) * rows;
  HostBytes w = AllocBytes(matrix_bytes);
  FillWeights(t, w.get(), matrix_bytes, 1);
  std::unique_ptr<Backend> be = CreateCpuBackend({.threads = threads});
  std::unique_ptr<Buffer> laid;
  std::vector<float> xv(cols * n), yv(rows * n);
  Rng rng{7};
  for (float& f : xv) f = static_cast<float>(static_cast<int32_t>(rng.Next() >> 32)) * 0x1p-31f;
  Tensor x{DType::kF32, cols, n, xv.data()};
  Tensor y{DType::kF32, rows, n, yv.data()};
  const Tensor plain{t, cols, rows, w.get()};
  const Tensor wt = x16 ? LaidOut(*be, plain, &laid) : plain;
  PD_CHECK_OK(be->MatMul(wt, x, y));
  for (auto _ : state) {
    PD_CHECK_OK(be->MatMul(wt, x, y));
    benchmark::DoNotOptimize(yv.data());
  }
  state.counters["GMACps"] = benchmark::Counter(
      static_cast<double>(n * rows * cols) * state.iterations() / 1e9, benchmark::Counter::kIsRate);
}

void RegisterAll() {
  for (int threads : {1, 2}) {
    benchmark::RegisterBenchmark("dram_read", BM_DramRead)  // named dram_read/<threads>
        ->Arg(threads)
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond);
  }
  const DType types[] = {DType::kF32,  DType::kF16,  DType::kBF16, DType::kQ8_0, DType::kQ4_0,
                         DType::kQ2_K, DType::kQ3_K, DType::kQ4_K, DType::kQ5_K, DType::kQ6_K,
                         DType::kW8A8, DType::kW4A16};
  for (DType t : types) {
    for (bool dram : {false, true}) {
      for (int threads : {1, 2}) {
        const std::string name = pd::StrCat("gemv/", Traits(t).name, "/", dram ? "dram" : "l3",
                                            "/", threads);
        benchmark::RegisterBenchmark(name.c_str(), BM_Gemv, t, dram, threads)
            ->UseRealTime()
            ->Unit(benchmark::kMicrosecond);
      }
    }
  }
  for (DType t : {DType::kQ8_0, DType::kQ5_0, DType::kQ4_K, DType::kQ6_K}) {
    for (int threads : {1, 2}) {
      const std::string name = pd::StrCat("prompt/", Traits(t).name, "/", threads);
      benchmark::RegisterBenchmark(name.c_str(), BM_Prompt, t, threads, false)
          ->UseRealTime()
          ->Unit(benchmark::kMillisecond);
      const std::string laid = pd::StrCat("prompt_x16/", Traits(t).name, "/", threads);
      benchmark::RegisterBenchmark(laid.c_str(), BM_Prompt, t, threads, true)
          ->UseRealTime()
          ->Unit(benchmark::kMillisecond);
    }
  }
  for (DType t : {DType::kQ8_0, DType::kQ5_0, DType::kQ4_K, DType::kQ6_K}) {
    for (int n : {1, 2, 3, 4, 5, 8, 16}) {
      for (int threads : {1, 2}) {
        const std::string name = pd::StrCat("rows/", Traits(t).name, "/", n, "/", threads);
        benchmark::RegisterBenchmark(name.c_str(), BM_Rows, t, n, threads, kRowOrderGemv, false)
            ->UseRealTime()
            ->Unit(benchmark::kMicrosecond);
      }
    }
  }
  // The own order: on the file's rows (the flag) and on the matrices laid out for it.
  struct OwnCase {
    const char* name;
    DType type;
    bool x16;
  };
  for (const OwnCase& c :
       {OwnCase{"head_own/q8_0", DType::kQ8_0, false}, OwnCase{"head_x16/q8_0", DType::kQ8_0, true},
        OwnCase{"rows_own/q5_0", DType::kQ5_0, false}, OwnCase{"rows_x16/q5_0", DType::kQ5_0, true},
        OwnCase{"rows_own/q4_K", DType::kQ4_K, false}, OwnCase{"rows_x16/q4_K", DType::kQ4_K, true},
        OwnCase{"rows_own/q6_K", DType::kQ6_K, false},
        OwnCase{"rows_x16/q6_K", DType::kQ6_K, true}}) {
    for (int n : {1, 2, 3, 4, 5, 8, 16}) {
      for (int threads : {1, 2}) {
        const std::string name = pd::StrCat(c.name, "/", n, "/", threads);
        benchmark::RegisterBenchmark(name.c_str(), BM_Rows, c.type, n, threads,
                                     static_cast<uint8_t>(kRowOrderGemv | kRowOrderOwn), c.x16)
            ->UseRealTime()
            ->Unit(benchmark::kMicrosecond);
      }
    }
  }
}

}  // namespace
}  // namespace pd::engine

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  pd::engine::RegisterAll();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
