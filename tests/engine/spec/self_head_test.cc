// The self-head drafter (engine/spec/self_head.h): its forwards are the target's own, so with a
// head of every token its greedy proposals are the target's greedy continuation, the K/V it
// leaves in the target's cache are the ones the target writes, and its hidden states put
// through the output head alone (Batch::head_x) give the target's logits bit for bit.
#include "engine/spec/self_head.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>
#include <numeric>
#include <vector>

#include "common/status_matchers.h"
#include "engine/kv/kv_cache.h"
#include "tests/testing/tiny_engine.h"

namespace pd::engine::spec {
namespace {

using ::pd::testing::StatusIs;

constexpr int64_t kSeq = 7;

struct Env {
  std::unique_ptr<engine::testing::TinyEngine> target;
  std::unique_ptr<KvCache> kv;
};

Env Make(KvDType dtype) {
  engine::testing::TinyModelSpec spec;
  spec.type = DType::kQ8_0;
  spec.output_scale = 3;
  Env e;
  e.target = engine::testing::MakeTinyEngine(spec);
  auto kv = KvCache::Create(e.target->model->KvOptions(64, dtype, 4), *e.target->backend);
  PD_CHECK_OK(kv.status());
  e.kv = std::move(*kv);
  return e;
}

// Prefills `prompt` but its last token (as the scheduler leaves a decoding sequence).
void Prefill(Model& m, KvCache& kv, int64_t seq, const std::vector<int32_t>& prompt) {
  PD_CHECK_OK(kv.Reserve(seq, static_cast<int>(prompt.size()) - 1));
  Batch b;
  for (size_t i = 0; i + 1 < prompt.size(); ++i) {
    b.AddOrdered(prompt[i], static_cast<int32_t>(i), seq, false,
                 static_cast<int32_t>(prompt.size()));
  }
  std::vector<float> logits;
  PD_CHECK_OK(m.Forward(b, kv, &logits));
}

int32_t Argmax(const float* row, int n) {
  return static_cast<int32_t>(std::max_element(row, row + n) - row);
}

TEST(SelfHeadDrafter, ProposesTheTargetsGreedyContinuationAndItsHiddenStates) {
  for (const KvDType dtype : {KvDType::kF16, KvDType::kI8}) {
    Env e = Make(dtype);
    Model& target = *e.target->model;
    const int V = target.config().n_vocab;
    const int64_t n_embd = target.config().n_embd;
    std::vector<int32_t> all(V);
    std::iota(all.begin(), all.end(), 0);
    auto view = Model::WithHead(target, all);
    ASSERT_TRUE(view.ok()) << view.status();
    auto drafter = SelfHeadDrafter::Create(std::move(*view));
    ASSERT_TRUE(drafter.ok()) << drafter.status();
    EXPECT_GT((*drafter)->StepSeconds(1), 0);

    const std::vector<int32_t> prompt = {3, 14, 15, 92, 65, 35};
    constexpr int kDraft = 5;
    // The target alone: its greedy continuation, one token per forward, on a second sequence.
    std::vector<int32_t> want_tokens;
    std::vector<std::vector<float>> want_logits;
    Prefill(target, *e.kv, 1, prompt);
    int32_t tok = prompt.back();
    for (int i = 0; i < kDraft + 1; ++i) {
      const int32_t pos = static_cast<int32_t>(prompt.size()) - 1 + i;
      PD_ASSERT_OK(e.kv->Reserve(1, pos + 1));
      Batch b;
      b.AddOrdered(tok, pos, 1, true, static_cast<int32_t>(prompt.size()));
      std::vector<float> logits;
      PD_ASSERT_OK(target.Forward(b, *e.kv, &logits));
      want_logits.push_back(logits);
      tok = Argmax(logits.data(), V);
      want_tokens.push_back(tok);
    }

    // The drafter on the target's cache.
    Prefill(target, *e.kv, kSeq, prompt);
    PD_ASSERT_OK(e.kv->Reserve(kSeq, static_cast<int>(prompt.size()) + kDraft));
    const SamplingParams greedy = SamplingParams::Greedy();
    DraftRequest r;
    r.seq = kSeq;
    r.tokens = prompt;
    r.max_draft = kDraft;
    r.sampling = &greedy;
    r.target_kv = e.kv.get();
    r.prompt_len = static_cast<int32_t>(prompt.size());
    DraftRequest* reqs[] = {&r};
    PD_ASSERT_OK((*drafter)->Propose(reqs));
    EXPECT_EQ(r.draft, std::vector<int32_t>(want_tokens.begin(), want_tokens.begin() + kDraft));
    ASSERT_EQ(r.hidden.size(), static_cast<size_t>(kDraft * n_embd));

    // The verifying step: the last proposal as an ordinary row, the hidden states head-only.
    Batch v;
    v.head_x = r.hidden;
    v.AddOrdered(r.draft.back(), static_cast<int32_t>(prompt.size()) - 1 + kDraft, kSeq, true,
                 static_cast<int32_t>(prompt.size()));
    std::vector<float> logits;
    PD_ASSERT_OK(target.Forward(v, *e.kv, &logits));
    ASSERT_EQ(logits.size(), static_cast<size_t>((kDraft + 1) * V));
    // Output order: the ordinary row first, then the head-only rows.
    for (int t = 0; t < V; ++t) {
      ASSERT_EQ(logits[t], want_logits[kDraft][t]) << "ordinary row, token " << t;
    }
    for (int j = 0; j < kDraft; ++j) {
      for (int t = 0; t < V; ++t) {
        ASSERT_EQ(logits[(1 + j) * V + t], want_logits[j][t]) << "head row " << j << " token " << t;
      }
    }
  }
}

TEST(SelfHeadDrafter, RefusesAnUnrestrictedModelAndMixedCaches) {
  Env e = Make(KvDType::kF16);
  Env other = Make(KvDType::kF16);
  auto m = Model::Load(
      std::shared_ptr<const GgufFile>(
          GgufFile::Parse(MappedFile::Borrow(e.target->bytes.data(), e.target->bytes.size()))
              .value()),
      *e.target->backend);
  ASSERT_TRUE(m.ok());
  EXPECT_THAT(SelfHeadDrafter::Create(std::move(*m)).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "not restricted"));
  auto view = Model::WithHead(*e.target->model, {1, 2, 3});
  ASSERT_TRUE(view.ok());
  auto d = SelfHeadDrafter::Create(std::move(*view));
  ASSERT_TRUE(d.ok()) << d.status();
  const SamplingParams greedy = SamplingParams::Greedy();
  const std::vector<int32_t> prompt = {1, 2, 3};
  Prefill(*e.target->model, *e.kv, 1, prompt);
  Prefill(*e.target->model, *other.kv, 2, prompt);
  PD_ASSERT_OK(e.kv->Reserve(1, 4));
  PD_ASSERT_OK(other.kv->Reserve(2, 4));
  DraftRequest a, b;
  for (auto [r, kv, seq] : {std::tuple{&a, e.kv.get(), 1}, std::tuple{&b, other.kv.get(), 2}}) {
    r->seq = seq;
    r->tokens = prompt;
    r->max_draft = 1;
    r->sampling = &greedy;
    r->target_kv = kv;
    r->prompt_len = 3;
  }
  DraftRequest* reqs[] = {&a, &b};
  EXPECT_THAT((*d)->Propose(reqs), StatusIs(absl::StatusCode::kInvalidArgument, "different"));
}

}  // namespace
}  // namespace pd::engine::spec
