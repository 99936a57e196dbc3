// The offload planner's arithmetic (engine/runtime/planner.h): KV bytes per layer, what each
// side holds for a given split, the fit to a budget, its refusals, and the decode-time
// prediction, on hand-made footprints whose every byte is known; and the footprint read from a
// real GGUF file.
#include "engine/runtime/planner.h"

#include <memory>
#include <string>
#include <utility>

#include <gtest/gtest.h>

#include "common/status_matchers.h"
#include "tests/testing/tiny_model.h"

namespace pd::engine {
namespace {

using ::pd::engine::testing::TinyModelSpec;
using ::pd::testing::StatusIs;

constexpr size_t kMiB = size_t{1} << 20;

// Llama 2 7B's shape.
ModelConfig Llama7B() {
  ModelConfig c;
  c.arch = "llama";
  c.n_vocab = 32000;
  c.n_embd = 4096;
  c.n_layer = 32;
  c.n_head = 32;
  c.n_head_kv = 32;
  c.head_dim = 128;
  c.n_ff = 11008;
  c.n_ctx_train = 4096;
  return c;
}

// Every layer `layer` bytes; embedding and head as given.
ModelFootprint Flat(const ModelConfig& c, size_t layer, size_t embd, size_t head, bool tied) {
  ModelFootprint f;
  f.n_layer = c.n_layer;
  f.layer_bytes.assign(c.n_layer, layer);
  f.embd_bytes = embd;
  f.head_bytes = head;
  f.tied = tied;
  f.max_matrix_elems = size_t(c.n_ff) * c.n_embd;
  return f;
}

TEST(PlannerTest, LayerKvBytesIsTwoTimesHeadsDimContextBytes) {
  const ModelConfig c = Llama7B();
  // 2 x 32 kv heads x 128 x 4096 tokens x 2 bytes.
  EXPECT_EQ(LayerKvBytes(c, 4096, KvDType::kF16, 16), size_t{2} * 32 * 128 * 4096 * 2);
  EXPECT_EQ(LayerKvBytes(c, 4096, KvDType::kF32, 16), size_t{2} * 32 * 128 * 4096 * 4);
  // INT8: one byte per value plus an F32 scale per token and head.
  EXPECT_EQ(LayerKvBytes(c, 4096, KvDType::kI8, 16), size_t{2} * (32 * 128 * 4096 + 32 * 4096 * 4));
  // Whole blocks: 17 tokens take two blocks of 16.
  EXPECT_EQ(LayerKvBytes(c, 17, KvDType::kF16, 16), LayerKvBytes(c, 32, KvDType::kF16, 16));
}

TEST(PlannerTest, FixedSplitPutsTheHeadWithTheLastLayer) {
  const ModelConfig c = Llama7B();
  const ModelFootprint f = Flat(c, 100 * kMiB, 70 * kMiB, 80 * kMiB, /*tied=*/false);
  PlanRequest req;
  req.ctx = 1024;
  req.gpu_bandwidth = 2e12;
  req.cpu_bandwidth = 50e9;
  const size_t kv = LayerKvBytes(c, 1024, KvDType::kF16, 16);

  auto none = PlanFixed(c, f, req, 0);
  PD_ASSERT_OK(none);
  EXPECT_EQ(none->gpu_total(), 0u);  // nothing on the GPU, no buffers there either
  EXPECT_EQ(none->cpu_weight_bytes, 32 * 100 * kMiB + 70 * kMiB + 80 * kMiB);
  EXPECT_EQ(none->cpu_kv_bytes, 32 * kv);
  // A decode step reads the layers and the head, not the whole embedding.
  EXPECT_DOUBLE_EQ(none->cpu_read_bytes, double(32 * 100 * kMiB + 80 * kMiB));
  EXPECT_DOUBLE_EQ(none->decode_seconds, double(32 * 100 * kMiB + 80 * kMiB) / 50e9);

  auto ten = PlanFixed(c, f, req, 10);
  PD_ASSERT_OK(ten);
  EXPECT_EQ(ten->gpu_weight_bytes, 10 * 100 * kMiB + 80 * kMiB);
  EXPECT_EQ(ten->cpu_weight_bytes, 22 * 100 * kMiB + 70 * kMiB);
  EXPECT_EQ(ten->gpu_kv_bytes, 10 * kv);
  EXPECT_EQ(ten->cpu_kv_bytes, 22 * kv);
  EXPECT_GT(ten->activation_bytes, 0u);
  EXPECT_GT(ten->workspace_bytes, 0u);
  // n w / B_gpu + (N - n) w / B_cpu, with the head on the GPU.
  EXPECT_DOUBLE_EQ(ten->decode_seconds,
                   double(10 * 100 * kMiB + 80 * kMiB) / 2e12 + double(22 * 100 * kMiB) / 50e9);

  auto all = PlanFixed(c, f, req, 32);
  PD_ASSERT_OK(all);
  EXPECT_EQ(all->cpu_weight_bytes, 0u);
  EXPECT_EQ(all->gpu_weight_bytes, 32 * 100 * kMiB + 70 * kMiB + 80 * kMiB);
  EXPECT_DOUBLE_EQ(all->decode_seconds, double(32 * 100 * kMiB + 80 * kMiB) / 2e12);
  // More layers on the faster side: faster.
  EXPECT_LT(all->decode_seconds, ten->decode_seconds);
  EXPECT_LT(ten->decode_seconds, none->decode_seconds);

  // Activations: the forward's nine layer slots for tokens_per_step rows and the head's three
  // for `batch` rows, F32 (Model::EnsureScratch).
  const size_t T = 512, E = 4096, F = 11008, q = 4096, kvd = 4096;
  EXPECT_EQ(ten->activation_bytes, 4 * (T * (3 * E + 2 * q + 2 * kvd + 2 * F) + (2 * E + 32000)));

  EXPECT_THAT(PlanFixed(c, f, req, 33), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(PlanFixed(c, f, req, -1), StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(PlannerTest, TiedHeadIsMappedOnEachSideThatNeedsIt) {
  const ModelConfig c = Llama7B();
  const ModelFootprint f = Flat(c, 100 * kMiB, 70 * kMiB, 1 * kMiB, /*tied=*/true);
  PlanRequest req;
  auto split = PlanFixed(c, f, req, 5);
  PD_ASSERT_OK(split);
  // The head (the embedding matrix plus the norm) on the GPU, the embedding for lookups on the CPU.
  EXPECT_EQ(split->gpu_weight_bytes, 5 * 100 * kMiB + 70 * kMiB + 1 * kMiB);
  EXPECT_EQ(split->cpu_weight_bytes, 27 * 100 * kMiB + 70 * kMiB);
  auto all = PlanFixed(c, f, req, 32);
  PD_ASSERT_OK(all);
  EXPECT_EQ(all->gpu_weight_bytes, 32 * 100 * kMiB + 70 * kMiB + 1 * kMiB);  // once
  auto none = PlanFixed(c, f, req, 0);
  PD_ASSERT_OK(none);
  EXPECT_EQ(none->cpu_weight_bytes, 32 * 100 * kMiB + 70 * kMiB + 1 * kMiB);  // once
  // Unknown bandwidths: no prediction.
  EXPECT_LT(split->decode_seconds, 0);
}

TEST(PlannerTest, OffloadTakesTheMostLayersTheBudgetHolds) {
  const ModelConfig c = Llama7B();
  const ModelFootprint f = Flat(c, 100 * kMiB, 70 * kMiB, 80 * kMiB, false);
  PlanRequest req;
  req.ctx = 2048;
  for (int want : {1, 7, 20, 31}) {
    // A budget exactly at `want` layers' total fits `want`, one byte less fits want - 1.
    auto exact = PlanFixed(c, f, req, want);
    PD_ASSERT_OK(exact);
    req.gpu_bytes = exact->gpu_total();
    auto fit = PlanOffload(c, f, req);
    PD_ASSERT_OK(fit);
    EXPECT_EQ(fit->gpu_layers, want);
    req.gpu_bytes = exact->gpu_total() - 1;
    if (want > 1) {
      auto less = PlanOffload(c, f, req);
      PD_ASSERT_OK(less);
      EXPECT_EQ(less->gpu_layers, want - 1);
    }
  }
  req.gpu_bytes = size_t{1} << 40;
  auto everything = PlanOffload(c, f, req);
  PD_ASSERT_OK(everything);
  EXPECT_EQ(everything->gpu_layers, 32);
}

TEST(PlannerTest, RefusesWhenTheKvOrNothingFits) {
  const ModelConfig c = Llama7B();
  const ModelFootprint f = Flat(c, 100 * kMiB, 70 * kMiB, 80 * kMiB, false);
  PlanRequest req;
  req.ctx = 32768;
  req.batch = 8;  // 2 x 32 x 128 x 32768 x 2 x 8 = 4 GiB of KV per layer
  req.gpu_bytes = 2048 * kMiB;
  EXPECT_THAT(PlanOffload(c, f, req),
              StatusIs(absl::StatusCode::kResourceExhausted, "KV cache of one layer"));
  req.ctx = 256;
  req.batch = 1;
  req.gpu_bytes = 150 * kMiB;  // a layer and the head need 180 MiB before buffers
  EXPECT_THAT(PlanOffload(c, f, req), StatusIs(absl::StatusCode::kResourceExhausted, "nothing fits"));
  req.ctx = 0;
  EXPECT_THAT(PlanOffload(c, f, req), StatusIs(absl::StatusCode::kInvalidArgument));
  req.ctx = 256;
  req.batch = 0;
  EXPECT_THAT(PlanOffload(c, f, req), StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(PlannerTest, FootprintOfAFileCountsEveryTensorOnce) {
  TinyModelSpec spec;
  spec.n_layer = 3;
  const std::string bytes = testing::TinyModel(spec);
  auto file = GgufFile::Parse(MappedFile::Borrow(bytes.data(), bytes.size()));
  PD_ASSERT_OK(file);
  auto c = ModelConfig::FromGguf(**file);
  PD_ASSERT_OK(c);
  size_t all = 0;
  for (const GgufTensorInfo& t : (*file)->tensors()) all += t.nbytes;
  const ModelFootprint f = FootprintOf(**file, *c);
  EXPECT_EQ(f.total(), all);
  ASSERT_EQ(f.layer_bytes.size(), 3u);
  EXPECT_EQ(f.layer_bytes[0], f.layer_bytes[2]);
  EXPECT_EQ(f.embd_bytes, size_t{96} * 64 * 4);  // F32 [96, 64]
  EXPECT_EQ(f.head_bytes, size_t{96} * 64 * 4 + 64 * 4);  // output + output_norm
  // Re-typed to Q8_0: every matrix at 34 bytes per 32 values, the norms unchanged.
  const ModelFootprint q = FootprintAs(**file, *c, DType::kQ8_0);
  EXPECT_EQ(q.embd_bytes, size_t{96} * 64 / 32 * 34);
  EXPECT_EQ(q.head_bytes, size_t{96} * 64 / 32 * 34 + 64 * 4);
  // Layer: q (64x64), k, v (32x64 each: 2 kv heads of 16), o (64x64), gate, up (96x64),
  // down (64x96): as Q8_0, plus two F32 norms of 64.
  const size_t elems = 64 * 64 * 2 + 32 * 64 * 2 + 96 * 64 * 3;
  EXPECT_EQ(q.layer_bytes[1], elems / 32 * 34 + 2 * 64 * 4);
  EXPECT_EQ(f.layer_bytes[1], elems * 4 + 2 * 64 * 4);
}

// A mixture of experts: a batch-1 step reads expert_used_count / expert_count of each layer's
// stacked experts (and everything else), on each side of the split.
TEST(PlannerTest, ExpertsAreReadInTheFractionATokenUses) {
  TinyModelSpec spec{.arch = "qwen3moe", .head_dim = 32, .qk_norm = true, .n_expert = 8,
                     .n_expert_used = 2, .expert_ff = 32};
  spec.n_layer = 2;
  const std::string bytes = testing::TinyModel(spec);
  auto file = GgufFile::Parse(MappedFile::Borrow(bytes.data(), bytes.size()));
  PD_ASSERT_OK(file);
  auto c = ModelConfig::FromGguf(**file);
  PD_ASSERT_OK(c);
  const ModelFootprint f = FootprintOf(**file, *c);
  const size_t experts = size_t{3} * 8 * 32 * 64 * 4;  // gate, up, down: 8 x 32 x 64 F32 each
  ASSERT_EQ(f.layer_expert_bytes.size(), 2u);
  EXPECT_EQ(f.layer_expert_bytes[0], experts);
  PlanRequest req;
  req.ctx = 64;
  req.cpu_bandwidth = 1e9;
  req.gpu_bandwidth = 1e10;
  auto none = PlanFixed(*c, f, req, 0);
  PD_ASSERT_OK(none);
  EXPECT_DOUBLE_EQ(none->cpu_read_bytes,
                   double(f.layer_bytes[0] + f.layer_bytes[1] + f.head_bytes) - 2 * 0.75 * experts);
  auto one = PlanFixed(*c, f, req, 1);
  PD_ASSERT_OK(one);
  EXPECT_DOUBLE_EQ(one->gpu_read_bytes, double(f.layer_bytes[1] + f.head_bytes) - 0.75 * experts);
  EXPECT_DOUBLE_EQ(one->cpu_read_bytes, double(f.layer_bytes[0]) - 0.75 * experts);
}

}  // namespace
}  // namespace pd::engine
