// Time of the CPU backend's Attention on Gemma 3 270M's shapes (4 query heads sharing 1 KV head,
// head_dim 256, scale 1/16, no window, no softcap) over a paged KV cache of 16-token blocks in
// shuffled order: one decode row, or a prompt chunk of 128 or 512 rows ending at the context
// length, per KV type and thread count. Each line also prints a hash of the output bytes, so
// that two builds (bench/attention/compare.py) can show they compute the same bits.
//
//   build/bin/attention_bench [--ctx 512,2048,4096,16384] [--rows 1,128,512] [--kv f16,f32]
//                             [--threads 1,2] [--attn best|avx2] [--min-s 0.3]
//
// --attn avx2 runs the AVX2 attention kernels even where the CPU has AVX-512 (the table a CPU
// without AVX-512 gets); best is what CreateCpuBackend picks.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "engine/backend/backend.h"
#include "engine/backend/cpu/cpu_backend_internal.h"
#include "engine/backend/cpu/kernels.h"
#include "engine/quant/fp16.h"

namespace pd::engine {
namespace {

std::vector<int> ParseList(const char* s) {
  std::vector<int> out;
  for (const char* p = s; *p != '\0';) {
    out.push_back(std::atoi(p));
    const char* comma = std::strchr(p, ',');
    if (comma == nullptr) break;
    p = comma + 1;
  }
  return out;
}

uint64_t Fnv1a(const void* data, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; ++i) h = (h ^ static_cast<const uint8_t*>(data)[i]) * 1099511628211ull;
  return h;
}

const cpu::AttnKernels& Avx2Attn() { return cpu::Avx2AttnKernels(); }

int Main(int argc, char** argv) {
  std::vector<int> ctxs = {512, 2048, 4096, 16384}, rows_list = {1, 128, 512}, threads = {1, 2};
  std::vector<std::string> kvs = {"f16", "f32"};
  std::string attn = "best";
  double min_s = 0.3;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string f = argv[i];
    if (f == "--ctx") {
      ctxs = ParseList(argv[i + 1]);
    } else if (f == "--rows") {
      rows_list = ParseList(argv[i + 1]);
    } else if (f == "--threads") {
      threads = ParseList(argv[i + 1]);
    } else if (f == "--kv") {
      kvs.clear();
      for (std::string s = argv[i + 1]; !s.empty();) {
        const size_t c = s.find(',');
        kvs.push_back(s.substr(0, c));
        s = c == std::string::npos ? "" : s.substr(c + 1);
      }
    } else if (f == "--attn") {
      attn = argv[i + 1];
    } else if (f == "--min-s") {
      min_s = std::atof(argv[i + 1]);
    } else {
      std::fprintf(stderr, "attention_bench: unknown flag %s\n", f.c_str());
      return 2;
    }
  }
  static cpu::Kernels avx2_attn_table;
  if (attn == "avx2") {
    if (cpu::Avx2Kernels() == nullptr || &cpu::SelectKernels(false) != cpu::Avx2Kernels()) {
      std::fprintf(stderr, "attention_bench: no AVX2 on this build/CPU\n");
      return 2;
    }
    avx2_attn_table = *cpu::Avx2Kernels();
    avx2_attn_table.attn = &Avx2Attn;
  }
  const cpu::AttnKernels& ak =
      attn == "avx2" ? cpu::Avx2AttnKernels() : cpu::SelectKernels(false).attn();
  std::printf("# attention kernels: %d lanes (%s)\n", ak.lanes,
              ak.lanes == 16                  ? "AVX-512"
              : cpu::Avx2Kernels() != nullptr ? "AVX2"
                                              : "scalar");
  std::printf("%-5s %6s %5s %3s %12s %12s %18s\n", "kv", "ctx", "rows", "thr", "ms/call",
              "us/row/layer", "output-hash");

  const AttentionParams p{4, 1, 256, 1.f / 16.f, 0, 0.f};
  const int bs = 16;
  for (const std::string& kvname : kvs) {
    const KvDType dt = kvname == "f32" ? KvDType::kF32 : KvDType::kF16;
    for (int ctx : ctxs) {
      const int n_blocks = (ctx + bs - 1) / bs;
      std::vector<int32_t> table(n_blocks);
      std::iota(table.begin(), table.end(), 0);
      std::mt19937 rng(7);
      std::shuffle(table.begin(), table.end(), rng);
      KvTensor kc{dt, p.n_kv_heads, p.head_dim, bs, n_blocks, nullptr};
      std::vector<uint8_t> kbytes(kc.bytes() + 64), vbytes(kc.bytes() + 64);
      kc.data = kbytes.data();
      KvTensor vc = kc;
      vc.data = vbytes.data();
      std::normal_distribution<float> normal(0.f, 1.f);
      for (KvTensor* c : {&kc, &vc}) {
        for (int64_t s = 0; s < c->slots(); ++s) {
          char* row = c->values(s, 0);
          for (int d = 0; d < p.head_dim; ++d) {
            const float x = normal(rng) * (c == &kc ? 2.f : 1.f);
            if (dt == KvDType::kF32) {
              std::memcpy(row + 4 * d, &x, 4);
            } else {
              const uint16_t h = F32ToF16(x);
              std::memcpy(row + 2 * d, &h, 2);
            }
          }
        }
      }
      for (int rows : rows_list) {
        if (rows > ctx) continue;
        std::vector<int32_t> pos(rows), seq(rows, 0);
        for (int r = 0; r < rows; ++r) pos[r] = ctx - rows + r;
        KvBatch kv{pos, seq, {table}, bs, {}};
        std::vector<float> qv(static_cast<size_t>(rows) * p.n_heads * p.head_dim);
        for (float& x : qv) x = normal(rng);
        std::vector<float> ov(qv.size());
        Tensor q{DType::kF32, int64_t{p.n_heads} * p.head_dim, rows, qv.data()};
        Tensor o{DType::kF32, int64_t{p.n_heads} * p.head_dim, rows, ov.data()};
        for (int thr : threads) {
          std::unique_ptr<Backend> be =
              attn == "avx2" ? std::make_unique<cpu::CpuBackend>(avx2_attn_table, thr)
                             : CreateCpuBackend({.threads = thr});
          if (absl::Status st = be->Attention(q, kc, vc, kv, p, o); !st.ok()) {  // warm-up
            std::fprintf(stderr, "Attention: %s\n", std::string(st.message()).c_str());
            return 1;
          }
          double best = 1e30, total = 0;
          int reps = 0;
          while (reps < 3 || total < min_s) {
            const auto t0 = std::chrono::steady_clock::now();
            (void)be->Attention(q, kc, vc, kv, p, o);
            const double s =
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
            best = std::min(best, s);
            total += s;
            ++reps;
          }
          std::printf("%-5s %6d %5d %3d %12.3f %12.2f   %016llx\n", kvname.c_str(), ctx, rows, thr,
                      best * 1e3, best * 1e6 / rows,
                      static_cast<unsigned long long>(Fnv1a(ov.data(), ov.size() * sizeof(float))));
          std::fflush(stdout);
        }
      }
    }
  }
  return 0;
}

}  // namespace
}  // namespace pd::engine

int main(int argc, char** argv) { return pd::engine::Main(argc, argv); }
