// Layer placement (engine/runtime/placement.h): the ranges' checks, and a model split over two
// CPU backend instances giving bit-identical logits to the same model on one, at every split
// point, with each layer's weights, KV cache and ops on its own backend. (Two CPU backends run
// the same kernels, so any difference would come from the hand-off or a misplaced tensor; the
// GPU/CPU split is checked on the GPU machine by bench/gpu/.)
#include "engine/runtime/placement.h"

#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "common/status_matchers.h"
#include "engine/runtime/model.h"
#include "engine/sched/generate.h"
#include "tests/testing/counting_backend.h"
#include "tests/testing/tiny_model.h"

namespace pd::engine {
namespace {

using ::pd::engine::testing::CountingBackend;
using ::pd::engine::testing::TinyModelSpec;
using ::pd::testing::StatusIs;

TEST(LayerPlacementTest, SingleAndOffloadCoverTheLayers) {
  PD_EXPECT_OK(LayerPlacement::Single(5).Validate(5, 1));
  const LayerPlacement p = LayerPlacement::Offload(10, 4);
  ASSERT_EQ(p.ranges.size(), 2u);
  PD_EXPECT_OK(p.Validate(10, 2));
  EXPECT_EQ(p.BackendOf(0), 1);  // the first layers stay on the host backend
  EXPECT_EQ(p.BackendOf(5), 1);
  EXPECT_EQ(p.BackendOf(6), 0);  // the last four go to the device with the head
  EXPECT_EQ(p.BackendOf(9), 0);
  EXPECT_EQ(p.BackendOf(10), -1);
  EXPECT_EQ(p.LayersOn(0), 4);
  EXPECT_EQ(p.LayersOn(1), 6);
  EXPECT_EQ(p.Describe({"cuda:0", "cpu"}), "layers 0-5 on cpu, layers 6-9 on cuda:0");
  // Clamped, and no empty range.
  EXPECT_EQ(LayerPlacement::Offload(10, 0).ranges.size(), 1u);
  EXPECT_EQ(LayerPlacement::Offload(10, 0).BackendOf(9), 1);
  EXPECT_EQ(LayerPlacement::Offload(10, 99).ranges.size(), 1u);
  EXPECT_EQ(LayerPlacement::Offload(10, 99).BackendOf(0), 0);
  EXPECT_EQ(LayerPlacement::Offload(10, -3).LayersOn(0), 0);
  EXPECT_EQ(LayerPlacement::Offload(3, 1).Describe({"gpu", "cpu"}),
            "layers 0-1 on cpu, layer 2 on gpu");
}

TEST(LayerPlacementTest, ValidateNamesTheFault) {
  LayerPlacement gap;
  gap.ranges = {{0, 2, 0}, {3, 5, 1}};
  EXPECT_THAT(gap.Validate(5, 2), StatusIs(absl::StatusCode::kInvalidArgument,
                                           "does not start at layer 2"));
  LayerPlacement overlap;
  overlap.ranges = {{0, 3, 0}, {2, 5, 1}};
  EXPECT_THAT(overlap.Validate(5, 2), StatusIs(absl::StatusCode::kInvalidArgument));
  LayerPlacement empty;
  empty.ranges = {{0, 0, 0}, {0, 5, 1}};
  EXPECT_THAT(empty.Validate(5, 2), StatusIs(absl::StatusCode::kInvalidArgument,
                                             "empty range"));
  LayerPlacement short_;
  short_.ranges = {{0, 4, 0}};
  EXPECT_THAT(short_.Validate(5, 1), StatusIs(absl::StatusCode::kInvalidArgument,
                                              "the model has 5"));
  LayerPlacement bad_backend;
  bad_backend.ranges = {{0, 5, 2}};
  EXPECT_THAT(bad_backend.Validate(5, 2), StatusIs(absl::StatusCode::kInvalidArgument,
                                                   "backend 2 of 2"));
  EXPECT_THAT(LayerPlacement{}.Validate(5, 1), StatusIs(absl::StatusCode::kInvalidArgument));
  Backend* none[] = {nullptr};
  EXPECT_THAT(LayerBackends(LayerPlacement::Single(2), 2, none),
              StatusIs(absl::StatusCode::kInvalidArgument, "null"));
}

struct PlacedRun {
  std::vector<float> logits;          // every prompt position, then each decode step's
  std::vector<int32_t> greedy;        // Generate's tokens
  size_t kv_bytes[2] = {0, 0};        // per backend
  size_t weight_bytes[2] = {0, 0};
  int ops[2] = {0, 0};
};

// Runs the model of `spec` with `placement` over two counting CPU backends: a prompt in one
// batch (all logits), four decode steps, then a greedy generation.
PlacedRun RunPlaced(const std::string& bytes, const LayerPlacement& placement, KvDType kv_type) {
  PlacedRun r;
  CountingBackend a("cpu:a"), b("cpu:b");
  Backend* backends[] = {&a, &b};
  auto file = GgufFile::Parse(MappedFile::Borrow(bytes.data(), bytes.size()));
  EXPECT_TRUE(file.ok()) << file.status();
  auto model = Model::Load(std::shared_ptr<const GgufFile>(std::move(*file)), backends, placement);
  EXPECT_TRUE(model.ok()) << model.status();
  if (!model.ok()) return r;
  Model& m = **model;
  const size_t weights_a = a.mapped, weights_b = b.mapped;
  auto kv = KvCache::Create(m.KvOptions(32, kv_type, 4), m.LayerBackends());
  EXPECT_TRUE(kv.ok()) << kv.status();
  r.kv_bytes[0] = a.allocated;
  r.kv_bytes[1] = b.allocated;
  r.weight_bytes[0] = weights_a;
  r.weight_bytes[1] = weights_b;
  const int ops_a = a.ops, ops_b = b.ops;

  const std::vector<int32_t> prompt = {1, 5, 9, 33, 2, 70, 11, 4, 8, 90, 3};
  PD_EXPECT_OK((*kv)->Reserve(0, 16));
  Batch batch;
  for (size_t i = 0; i < prompt.size(); ++i) batch.Add(prompt[i], int32_t(i), 0, true);
  PD_EXPECT_OK(m.Forward(batch, **kv, &r.logits));
  for (int step = 0; step < 4; ++step) {
    Batch one;
    one.Add(7 + step, int32_t(prompt.size()) + step, 0, true);
    std::vector<float> l;
    PD_EXPECT_OK(m.Forward(one, **kv, &l));
    r.logits.insert(r.logits.end(), l.begin(), l.end());
  }
  (*kv)->Free(0);
  r.ops[0] = a.ops - ops_a;
  r.ops[1] = b.ops - ops_b;
  GenerateOptions o;
  o.max_tokens = 10;
  o.sampling = SamplingParams::Greedy();
  o.prefill_chunk = 3;
  auto g = Generate(m, **kv, 1, prompt, o, nullptr);
  EXPECT_TRUE(g.ok()) << g.status();
  if (g.ok()) r.greedy = g->tokens;
  EXPECT_EQ((*kv)->free_blocks(), (*kv)->total_blocks());
  return r;
}

struct Case {
  const char* name;
  TinyModelSpec spec;
  KvDType kv;
};
void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

class PlacementModelTest : public ::testing::TestWithParam<Case> {};

TEST_P(PlacementModelTest, SplitOverTwoBackendsIsBitIdenticalToOne) {
  TinyModelSpec spec = GetParam().spec;
  spec.n_layer = 4;
  const std::string bytes = testing::TinyModel(spec);
  const KvDType kv = GetParam().kv;
  const PlacedRun one = RunPlaced(bytes, LayerPlacement::Single(4), kv);
  ASSERT_FALSE(one.logits.empty());
  EXPECT_EQ(one.kv_bytes[1], 0u);
  EXPECT_EQ(one.ops[1], 0);
  for (int device_layers = 0; device_layers <= 4; ++device_layers) {
    SCOPED_TRACE(::testing::Message() << device_layers << " layers on backend 0");
    const PlacedRun split = RunPlaced(bytes, LayerPlacement::Offload(4, device_layers), kv);
    ASSERT_EQ(split.logits.size(), one.logits.size());
    EXPECT_EQ(std::memcmp(split.logits.data(), one.logits.data(),
                          one.logits.size() * sizeof(float)),
              0);
    EXPECT_EQ(split.greedy, one.greedy);
    // Each layer's KV lives on its backend: a quarter of the cache per layer (scratch buffers
    // come later, at the first forward).
    const size_t total_kv = one.kv_bytes[0];
    EXPECT_EQ(split.kv_bytes[0], total_kv / 4 * device_layers);
    EXPECT_EQ(split.kv_bytes[1], total_kv / 4 * (4 - device_layers));
    // Both backends run ops exactly when they hold layers.
    EXPECT_EQ(split.ops[0] > 0, device_layers > 0);
    EXPECT_EQ(split.ops[1] > 0, device_layers < 4);
    EXPECT_EQ(split.ops[0] + split.ops[1], one.ops[0]);
    // Weights: every byte mapped once, plus a tied head mapped a second time on the head's
    // backend when it is not the embedding's.
    const size_t head_copy =
        spec.tied && device_layers > 0 && device_layers < 4
            ? RowBytes(spec.type, spec.n_embd) * static_cast<size_t>(spec.n_vocab)
            : 0;
    EXPECT_EQ(split.weight_bytes[0] + split.weight_bytes[1], one.weight_bytes[0] + head_copy);
  }
  // Three ranges, back and forth: two hand-offs per forward.
  LayerPlacement zigzag;
  zigzag.ranges = {{0, 1, 0}, {1, 3, 1}, {3, 4, 0}};
  const PlacedRun z = RunPlaced(bytes, zigzag, kv);
  ASSERT_EQ(z.logits.size(), one.logits.size());
  EXPECT_EQ(std::memcmp(z.logits.data(), one.logits.data(), one.logits.size() * sizeof(float)), 0);
  EXPECT_EQ(z.greedy, one.greedy);
}

INSTANTIATE_TEST_SUITE_P(
    Models, PlacementModelTest,
    ::testing::Values(Case{"llama_f32", TinyModelSpec{}, KvDType::kF32},
                      Case{"llama_q8_0_tied_f16kv",
                           TinyModelSpec{.tied = true, .type = DType::kQ8_0}, KvDType::kF16},
                      Case{"qwen2_bias_int8kv",
                           TinyModelSpec{.arch = "qwen2", .qkv_bias = true, .type = DType::kF16},
                           KvDType::kI8},
                      Case{"llama_mqa_bf16", TinyModelSpec{.n_head_kv = 1, .type = DType::kBF16},
                           KvDType::kF16}),
    [](const ::testing::TestParamInfo<Case>& i) { return std::string(i.param.name); });

TEST(PlacementModelTest, RefusesAPlacementThatDoesNotFit) {
  TinyModelSpec spec;
  spec.n_layer = 3;
  const std::string bytes = testing::TinyModel(spec);
  auto file = GgufFile::Parse(MappedFile::Borrow(bytes.data(), bytes.size()));
  ASSERT_TRUE(file.ok());
  std::shared_ptr<const GgufFile> shared(std::move(*file));
  std::unique_ptr<Backend> cpu = CreateCpuBackend({.threads = 1});
  Backend* one[] = {cpu.get()};
  EXPECT_THAT(Model::Load(shared, one, LayerPlacement::Single(2)),
              StatusIs(absl::StatusCode::kInvalidArgument, "the model has 3"));
  EXPECT_THAT(Model::Load(shared, one, LayerPlacement::Offload(3, 1)),
              StatusIs(absl::StatusCode::kInvalidArgument, "backend 1 of 1"));
  // A KV cache needs one backend per layer.
  auto model = Model::Load(shared, one, LayerPlacement::Single(3));
  PD_ASSERT_OK(model);
  Backend* two[] = {cpu.get(), cpu.get()};
  EXPECT_THAT(KvCache::Create((*model)->KvOptions(4, KvDType::kF16, 4), two),
              StatusIs(absl::StatusCode::kInvalidArgument, "for 3 layers"));
}

}  // namespace
}  // namespace pd::engine
