// The model's side of captured steps (Backend::BeginCapture / EndCapture, the CUDA backend's
// graphs), on a recording backend that runs the CPU backend's kernels only at the end of a step
// (tests/testing/recording_backend.h): captured steps give the bits of the same steps run op by
// op; an abandoned recording runs again; an error while recording is returned and leaves the
// backend ready for the next step; and a step that cannot be captured (a hook, an observer,
// hidden rows, experts, a split over backends, no logits) is never offered. The CUDA backend's
// own side runs in cuda_backend_test and cuda_model_test on a GPU (bench/gpu/).
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/status_matchers.h"
#include "engine/runtime/model.h"
#include "engine/runtime/placement.h"
#include "tests/testing/counting_backend.h"
#include "tests/testing/recording_backend.h"
#include "tests/testing/tiny_model.h"

namespace pd::engine {
namespace {

using ::pd::engine::testing::CountingBackend;
using ::pd::engine::testing::RecordingBackend;
using ::pd::engine::testing::TinyModelSpec;
using ::pd::testing::StatusIs;

struct Loaded {
  std::unique_ptr<Model> model;
  std::unique_ptr<KvCache> kv;
};

Loaded Load(const std::string& bytes, absl::Span<Backend* const> backends,
            const LayerPlacement& placement, KvDType kv_type = KvDType::kF16) {
  Loaded l;
  auto file = GgufFile::Parse(MappedFile::Borrow(bytes.data(), bytes.size()));
  EXPECT_TRUE(file.ok()) << file.status();
  if (!file.ok()) return l;
  auto model = Model::Load(std::shared_ptr<const GgufFile>(std::move(*file)), backends, placement);
  EXPECT_TRUE(model.ok()) << model.status();
  if (!model.ok()) return l;
  l.model = *std::move(model);
  auto kv = KvCache::Create(l.model->KvOptions(64, kv_type, 4), l.model->LayerBackends());
  EXPECT_TRUE(kv.ok()) << kv.status();
  if (kv.ok()) l.kv = *std::move(kv);
  return l;
}

// The two-layer tiny model of `bytes` with every layer on `b`.
Loaded LoadOn(const std::string& bytes, Backend& b, KvDType kv_type = KvDType::kF16) {
  Backend* backends[] = {&b};
  return Load(bytes, backends, LayerPlacement::Single(2), kv_type);
}

// Everything the steps below put out, in order.
struct Outputs {
  std::vector<float> logits;
  std::vector<int32_t> top_ids;
  std::vector<float> top_values;
  int forwards = 0;        // Forward / ForwardTop calls
  int small_forwards = 0;  // of them, batches of at most 8 rows (what the recorder takes)
};

// Three sequences: a prompt of 11 rows (too many to capture), prompts of 5 and 3 rows, then
// decode steps of all three (Forward and ForwardTop in turn), of one, and of two.
Outputs RunSteps(Model& m, KvCache& kv) {
  Outputs out;
  auto forward = [&](const Batch& b) {
    std::vector<float> l;
    PD_EXPECT_OK(m.Forward(b, kv, &l));
    out.logits.insert(out.logits.end(), l.begin(), l.end());
    ++out.forwards;
    out.small_forwards += b.size() <= 8;
  };
  auto top = [&](const Batch& b) {
    TopLogits t;
    PD_EXPECT_OK(m.ForwardTop(b, kv, 3, &t));
    out.top_ids.insert(out.top_ids.end(), t.ids.begin(), t.ids.end());
    out.top_values.insert(out.top_values.end(), t.values.begin(), t.values.end());
    ++out.forwards;
    out.small_forwards += b.size() <= 8;
  };
  for (int64_t s = 0; s < 3; ++s) PD_EXPECT_OK(kv.Reserve(s, 40));
  const std::vector<std::vector<int32_t>> prompts = {
      {1, 5, 9, 33, 2, 70, 11, 4, 8, 90, 3}, {6, 7, 12, 40, 41}, {15, 16, 17}};
  for (int64_t s = 0; s < 3; ++s) {
    Batch b;
    const auto& p = prompts[s];
    for (size_t i = 0; i < p.size(); ++i) b.Add(p[i], static_cast<int32_t>(i), s, true);
    forward(b);
  }
  std::vector<int32_t> len = {11, 5, 3};
  for (int step = 0; step < 6; ++step) {
    Batch b;
    for (int64_t s = 0; s < 3; ++s) b.Add(20 + step + static_cast<int32_t>(s), len[s]++, s, true);
    if (step % 2 == 0) {
      forward(b);
    } else {
      top(b);
    }
  }
  Batch one;
  one.Add(50, len[1]++, 1, true);
  forward(one);
  Batch two;
  two.Add(51, len[0]++, 0, true);
  two.Add(52, len[2]++, 2, true);
  top(two);
  for (int64_t s = 0; s < 3; ++s) kv.Free(s);
  return out;
}

void ExpectSameBits(const Outputs& a, const Outputs& b) {
  ASSERT_EQ(a.logits.size(), b.logits.size());
  EXPECT_EQ(std::memcmp(a.logits.data(), b.logits.data(), a.logits.size() * sizeof(float)), 0);
  EXPECT_EQ(a.top_ids, b.top_ids);
  ASSERT_EQ(a.top_values.size(), b.top_values.size());
  EXPECT_EQ(
      std::memcmp(a.top_values.data(), b.top_values.data(), a.top_values.size() * sizeof(float)),
      0);
}

// The same steps op by op on a backend that passes for a device (host_memory() false), as the
// recording one does, so that both take the same paths apart from the capture.
Outputs Reference(const std::string& bytes, KvDType kv_type) {
  CountingBackend ref("cpu:reference", /*host_memory=*/false);
  Loaded l = LoadOn(bytes, ref, kv_type);
  if (l.kv == nullptr) return {};
  return RunSteps(*l.model, *l.kv);
}

struct Case {
  const char* name;
  TinyModelSpec spec;
  KvDType kv;
};
void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

class ModelCaptureTest : public ::testing::TestWithParam<Case> {};

TEST_P(ModelCaptureTest, CapturedStepsGiveTheBitsOfStepsRunOpByOp) {
  const std::string bytes = testing::TinyModel(GetParam().spec);
  const Outputs want = Reference(bytes, GetParam().kv);
  ASSERT_FALSE(want.logits.empty());
  RecordingBackend rec("cpu:recording");
  Loaded l = LoadOn(bytes, rec, GetParam().kv);
  ASSERT_NE(l.kv, nullptr);
  const Outputs got = RunSteps(*l.model, *l.kv);
  ExpectSameBits(got, want);
  // Every batch of up to 8 rows went as one recording; the 11-row prompt was declined.
  EXPECT_EQ(rec.capture_stats().launched, want.small_forwards);
  EXPECT_EQ(rec.capture_stats().abandoned, 0);
  EXPECT_EQ(rec.begin_calls, want.forwards);
  EXPECT_GT(rec.replayed_ops, 0);
  EXPECT_EQ(l.kv->free_blocks(), l.kv->total_blocks());
}

// Specs set field by field (designated initializers would leave `metadata` to a warning).
TinyModelSpec Spec(std::string arch, DType type, bool tied = false) {
  TinyModelSpec s;
  s.arch = std::move(arch);
  s.type = type;
  s.tied = tied;
  return s;
}
TinyModelSpec WithBias(TinyModelSpec s) {
  s.qkv_bias = true;
  return s;
}
TinyModelSpec WithQkNorm(TinyModelSpec s) {
  s.head_dim = 32;
  s.qk_norm = true;
  return s;
}
TinyModelSpec FusedWithWindow(TinyModelSpec s) {
  s.fused = true;
  s.sliding_window = 4;
  return s;
}

INSTANTIATE_TEST_SUITE_P(
    Models, ModelCaptureTest,
    ::testing::Values(
        Case{"llama_f32_f32kv", Spec("llama", DType::kF32), KvDType::kF32},
        Case{"llama_q8_0_tied_f16kv", Spec("llama", DType::kQ8_0, true), KvDType::kF16},
        Case{"qwen2_bias_int8kv", WithBias(Spec("qwen2", DType::kF32)), KvDType::kI8},
        Case{"qwen3_qk_norm", WithQkNorm(Spec("qwen3", DType::kF32)), KvDType::kF16},
        Case{"phi3_fused_window", FusedWithWindow(Spec("phi3", DType::kF32)), KvDType::kF16}),
    [](const ::testing::TestParamInfo<Case>& i) { return std::string(i.param.name); });

TEST(ModelCaptureTest, AbandonedRecordingsRunAgainWithTheSameBits) {
  const std::string bytes = testing::TinyModel(Spec("llama", DType::kQ8_0));
  const Outputs want = Reference(bytes, KvDType::kF16);
  ASSERT_FALSE(want.logits.empty());
  // Every recording abandoned at its seventh op: no step launched, every one run again.
  {
    RecordingBackend rec("cpu:recording");
    rec.abort_at = 7;
    Loaded l = LoadOn(bytes, rec);
    ASSERT_NE(l.kv, nullptr);
    ExpectSameBits(RunSteps(*l.model, *l.kv), want);
    EXPECT_EQ(rec.capture_stats().launched, 0);
    EXPECT_EQ(rec.capture_stats().abandoned, want.small_forwards);
    EXPECT_EQ(rec.replayed_ops, 0);
  }
  // The first two abandoned at their first op, the rest launched.
  {
    RecordingBackend rec("cpu:recording");
    rec.abort_at = 1;
    rec.abort_steps = 2;
    Loaded l = LoadOn(bytes, rec);
    ASSERT_NE(l.kv, nullptr);
    ExpectSameBits(RunSteps(*l.model, *l.kv), want);
    EXPECT_EQ(rec.capture_stats().abandoned, 2);
    EXPECT_EQ(rec.capture_stats().launched, want.small_forwards - 2);
  }
}

TEST(ModelCaptureTest, AnErrorWhileRecordingIsReturnedAndTheNextStepIsCaptured) {
  const std::string bytes = testing::TinyModel(TinyModelSpec{});
  RecordingBackend rec("cpu:recording");
  Loaded l = LoadOn(bytes, rec);
  ASSERT_NE(l.kv, nullptr);
  PD_ASSERT_OK(l.kv->Reserve(0, 8));
  Batch bad;
  bad.Add(5, 0, 0, true);
  bad.Add(96, 1, 0, true);  // the vocabulary has 96 tokens
  std::vector<float> logits = {1.f};
  EXPECT_THAT(l.model->Forward(bad, *l.kv, &logits),
              StatusIs(absl::StatusCode::kInvalidArgument, "outside the vocabulary"));
  EXPECT_TRUE(logits.empty());
  EXPECT_EQ(rec.capture_stats().launched, 0);
  EXPECT_EQ(rec.capture_stats().abandoned, 0);  // refused, not abandoned
  Batch good;
  good.Add(5, 0, 0, true);
  PD_ASSERT_OK(l.model->Forward(good, *l.kv, &logits));
  EXPECT_EQ(rec.capture_stats().launched, 1);
  EXPECT_EQ(logits.size(), 96u);
  l.kv->Free(0);
}

// Steps whose ops wait for the host in the middle, or that span backends, are never offered for
// capture: they run op by op, as before.
TEST(ModelCaptureTest, StepsThatCannotBeCapturedAreNotOffered) {
  const std::string bytes = testing::TinyModel(TinyModelSpec{});
  RecordingBackend rec("cpu:recording");
  Loaded l = LoadOn(bytes, rec);
  ASSERT_NE(l.kv, nullptr);
  PD_ASSERT_OK(l.kv->Reserve(0, 16));
  Batch b;
  b.Add(5, 0, 0, true);
  b.Add(6, 1, 0, true);
  std::vector<float> logits, hidden;
  // A hook after each layer's KV store (the prefill daemon's layer streaming).
  int hooked = 0;
  PD_ASSERT_OK(l.model->Forward(b, *l.kv, &logits, [&](int) { ++hooked; }));
  EXPECT_EQ(hooked, 2);
  // Hidden rows (the self-head drafter), and no logits at all.
  PD_ASSERT_OK(l.model->ForwardHidden(b, *l.kv, &logits, &hidden));
  PD_ASSERT_OK(l.model->Forward(b, *l.kv, nullptr));
  Batch no_rows;
  no_rows.Add(5, 0, 0, false);
  PD_ASSERT_OK(l.model->Forward(no_rows, *l.kv, &logits));
  // An observer (a quantizer's calibration).
  struct Count : MatMulObserver {
    int seen = 0;
    void Observe(std::string_view, const float*, int64_t, int64_t) override { ++seen; }
  } observer;
  l.model->set_observer(&observer);
  PD_ASSERT_OK(l.model->Forward(b, *l.kv, &logits));
  EXPECT_GT(observer.seen, 0);
  l.model->set_observer(nullptr);
  EXPECT_EQ(rec.begin_calls, 0);
  // And a plain step is offered.
  PD_ASSERT_OK(l.model->Forward(b, *l.kv, &logits));
  EXPECT_EQ(rec.begin_calls, 1);
  EXPECT_EQ(rec.capture_stats().launched, 1);
  l.kv->Free(0);

  // Experts route on the host between ops.
  TinyModelSpec moe_spec;
  moe_spec.n_expert = 4;
  moe_spec.n_expert_used = 2;
  const std::string moe = testing::TinyModel(moe_spec);
  RecordingBackend rec_moe("cpu:recording");
  Loaded m = LoadOn(moe, rec_moe);
  ASSERT_NE(m.kv, nullptr);
  PD_ASSERT_OK(m.kv->Reserve(0, 4));
  PD_ASSERT_OK(m.model->Forward(b, *m.kv, &logits));
  EXPECT_EQ(rec_moe.begin_calls, 0);
  m.kv->Free(0);

  // A split over two backends hands the activations over through the host.
  RecordingBackend a("cpu:a"), c("cpu:c");
  Backend* two[] = {&a, &c};
  Loaded s = Load(bytes, two, LayerPlacement::Offload(2, 1));
  ASSERT_NE(s.kv, nullptr);
  PD_ASSERT_OK(s.kv->Reserve(0, 4));
  PD_ASSERT_OK(s.model->Forward(b, *s.kv, &logits));
  EXPECT_EQ(a.begin_calls + c.begin_calls, 0);
  s.kv->Free(0);
}

}  // namespace
}  // namespace pd::engine
