// Cost of prefix-cache compression (prefix_cache.compress_idle_ms, docs/kv_cache.md): time to
// compress an idle cached block to INT8 and to expand it back on a hit, per block of a Gemma 3
// 270M-shaped cache (18 layers, 1 KV head, head_dim 256, 16 tokens: 288 KiB of f16 per block),
// against a plain copy of the same bytes measured in the same run (what any move of the block
// costs; the physical limit of a memory-bound pass).
//
//   build/bin/kv_compress_bench [--blocks N] [--layers L] [--heads H] [--head-dim D] [--reps R]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/status.h"
#include "engine/backend/backend.h"
#include "engine/backend/cpu/kernels.h"
#include "engine/kv/kv_cache.h"
#include "engine/quant/fp16.h"

namespace pd::engine {
namespace {

double Seconds(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

int Main(int argc, char** argv) {
  int blocks = 256, layers = 18, heads = 1, head_dim = 256, reps = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string f = argv[i];
    const int v = std::atoi(argv[i + 1]);
    if (f == "--blocks")
      blocks = v;
    else if (f == "--layers")
      layers = v;
    else if (f == "--heads")
      heads = v;
    else if (f == "--head-dim")
      head_dim = v;
    else if (f == "--reps")
      reps = v;
    else {
      std::fprintf(stderr, "kv_compress_bench: unknown flag %s\n", f.c_str());
      return 2;
    }
  }
  auto backend = CreateCpuBackend({1});
  KvCacheOptions o;
  o.n_layer = layers;
  o.n_kv_heads = heads;
  o.head_dim = head_dim;
  o.block_size = 16;
  o.n_blocks = 2 * blocks + 2;
  o.dtype = KvDType::kF16;
  o.prefix_cache.enabled = true;
  o.prefix_cache.compress_idle_ms = 1;
  auto kv = KvCache::Create(o, *backend);
  if (!kv.ok()) {
    std::fprintf(stderr, "kv_compress_bench: %s\n", kv.status().ToString().c_str());
    return 1;
  }
  KvCache& c = **kv;
  const size_t span = c.BlockBytes().span();
  const size_t block_bytes = span * 2 * layers;  // K and V of every layer
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<uint16_t> row(span / 2);
  std::vector<int32_t> tokens(static_cast<size_t>(blocks) * 16 + 1);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>(i);
  double compress_s = 1e30, expand_s = 1e30, copy_s = 1e30;
  std::vector<char> copy_dst(block_bytes * blocks);
  for (int rep = 0; rep < reps; ++rep) {
    PD_CHECK_OK(c.Reserve(1, static_cast<int>(tokens.size()) - 1));
    for (int l = 0; l < layers; ++l) {
      for (int b = 0; b < blocks; ++b) {
        for (KvPart part : {KvPart::kK, KvPart::kV}) {
          for (uint16_t& h : row) h = F32ToF16(normal(rng));
          PD_CHECK_OK(c.Import(1, l, b, part, row.data(), span));
        }
      }
    }
    c.Publish(1, tokens, static_cast<int>(tokens.size()) - 1);
    // The copy reference: every block's bytes, layer by layer, as the compressor reads them.
    auto t0 = std::chrono::steady_clock::now();
    size_t off = 0;
    for (int b = 0; b < blocks; ++b) {
      for (int l = 0; l < layers; ++l) {
        for (KvTensor* t : {&c.k(l), &c.v(l)}) {
          const int32_t id = c.BlockTable(1)[b];
          std::memcpy(copy_dst.data() + off, static_cast<char*>(t->data) + id * span, span);
          off += span;
        }
      }
    }
    auto t1 = std::chrono::steady_clock::now();
    copy_s = std::min(copy_s, Seconds(t0, t1));
    c.Free(1);
    const absl::Time later = absl::Now() + absl::Seconds(1);
    t0 = std::chrono::steady_clock::now();
    const int done = c.CompressIdle(later, blocks);
    t1 = std::chrono::steady_clock::now();
    PD_CHECK(done == blocks);
    compress_s = std::min(compress_s, Seconds(t0, t1));
    t0 = std::chrono::steady_clock::now();
    const int hit = c.MatchPrefix(2, tokens, static_cast<int>(tokens.size()) - 1);
    t1 = std::chrono::steady_clock::now();
    PD_CHECK(hit == blocks * 16);
    expand_s = std::min(expand_s, Seconds(t0, t1));
    c.Free(2);
    // Back to a clean cache for the next repetition.
    PD_CHECK_OK(c.Reserve(3, (2 * blocks + 2) * 16));
    c.Free(3);
  }
  const bool avx512 = cpu::Avx512KvRowF16ToI8(head_dim) != nullptr;
  const double mib = static_cast<double>(block_bytes) / (1 << 20);
  std::printf(
      "KV block: %d layers x K,V x 16 tokens x %d heads x %d dims, f16 = %.3f MiB; "
      "INT8 half: %.3f MiB + scales; best of %d over %d blocks; kernels: %s\n\n",
      layers, heads, head_dim, mib, mib / 2, reps, blocks,
      avx512 ? "AVX-512 fused f16<->int8 rows" : "AVX2 (or scalar) f16<->int8 rows");
  std::printf("| operation | us per block | GB/s of f16 block bytes | vs memcpy of the block |\n");
  std::printf("| --- | ---: | ---: | ---: |\n");
  auto line = [&](const char* name, double s) {
    const double per = s / blocks;
    std::printf("| %s | %.1f | %.2f | %.2fx |\n", name, per * 1e6, block_bytes / per / 1e9,
                per / (copy_s / blocks));
  };
  line("memcpy (reference)", copy_s);
  line("compress (f16 -> INT8 page slot)", compress_s);
  line("expand on a hit (INT8 -> f16 block)", expand_s);
  return 0;
}

}  // namespace
}  // namespace pd::engine

int main(int argc, char** argv) { return pd::engine::Main(argc, argv); }
