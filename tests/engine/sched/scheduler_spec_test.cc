// Speculative decoding inside the Scheduler (docs/speculative.md): lossless for greedy decoding
// (the same tokens as without it, for each drafter and KV type) and for sampling (the emitted
// tokens' joint distribution is the target's, by a chi-square test that a wrong acceptance rule
// fails), no KV leaked, stop tokens and max_tokens cut exactly, adaptive K.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/mapped_file.h"
#include "common/status.h"
#include "engine/sched/scheduler.h"
#include "engine/spec/draft_model.h"
#include "engine/spec/ngram.h"
#include "engine/spec/self_head.h"
#include "tests/testing/chi_square.h"
#include "tests/testing/tiny_engine.h"

namespace pd::engine {
namespace {

constexpr int kVocab = 96;  // TinyModelSpec's n_vocab

// Collects one request's output; checks the sink contract.
class Sink : public GenerationSink {
 public:
  void OnTokens(const std::vector<int32_t>& t) override {
    EXPECT_FALSE(finished) << "OnTokens after OnFinish";
    EXPECT_FALSE(t.empty());
    tokens.insert(tokens.end(), t.begin(), t.end());
    ++calls;
  }
  void OnFinish(const FinishInfo& i) override {
    EXPECT_FALSE(finished) << "OnFinish twice";
    EXPECT_EQ(i.completion_tokens, static_cast<int>(tokens.size()));
    finished = true;
    info = i;
  }
  std::vector<int32_t> tokens;
  int calls = 0;
  bool finished = false;
  FinishInfo info;
};

// Prompts with repeats (so that n-gram lookup finds something) and without.
std::vector<int32_t> Prompt(int i) {
  std::mt19937 rng(1000 + i);
  std::vector<int32_t> p;
  const int motif = 3 + i % 5;
  std::vector<int32_t> m(motif);
  for (int32_t& t : m) t = static_cast<int32_t>(rng() % kVocab);
  const int reps = i % 3;  // 0: no repeat
  for (int r = 0; r <= reps; ++r) p.insert(p.end(), m.begin(), m.end());
  const int tail = 1 + i % 4;
  for (int k = 0; k < tail; ++k) p.push_back(static_cast<int32_t>(rng() % kVocab));
  return p;
}

// Output head scaled up: next-token distributions as peaked as a trained model's often are, so
// that drafts are often accepted (and a wrong rule has something to get wrong).
constexpr float kOutputScale = 3;
testing::TinyModelSpec TargetSpec() {
  testing::TinyModelSpec spec;
  spec.output_scale = kOutputScale;
  return spec;
}
std::unique_ptr<testing::TinyEngine> Target() { return testing::MakeTinyEngine(TargetSpec()); }

// A draft with the target's vocabulary: the target's weights in Q8_0 (close: most proposals
// accepted), perturbed (medium), or another random model (far: most rejected).
enum class Near { kClose, kMedium, kFar };
std::unique_ptr<Model> DraftModel(testing::TinyEngine& keep, Near near) {
  testing::TinyModelSpec spec = TargetSpec();
  if (near == Near::kClose) spec.type = DType::kQ8_0;
  if (near == Near::kMedium) spec.perturb = 0.4f;  // most proposals accepted, not all
  if (near == Near::kFar) spec.seed = 77;
  keep.bytes = testing::TinyModel(spec);
  keep.backend = CreateCpuBackend();
  auto file = GgufFile::Parse(MappedFile::Borrow(keep.bytes.data(), keep.bytes.size()));
  PD_CHECK_OK(file.status());
  auto m = Model::Load(std::shared_ptr<const GgufFile>(std::move(*file)), *keep.backend);
  PD_CHECK_OK(m.status());
  return std::move(*m);
}

// Memory-bound costs (an extra row is nearly free): adaptive K drafts.
spec::SpecCost FlatCost() { return spec::SpecCost::FromPoints({1, 64}, {1e-3, 1.1e-3}); }
// A draft model step at a tenth of the target's.
spec::SpecCost DraftCost() { return spec::SpecCost::FromPoints({1, 16}, {1e-4, 1.1e-4}); }

SchedulerOptions Options(std::shared_ptr<spec::Drafter> drafter, KvDType kv = KvDType::kF16) {
  SchedulerOptions o;
  o.kv_blocks = 256;
  o.max_running_seqs = 16;
  o.token_budget = 128;
  o.prefill_chunk = 32;
  o.kv_dtype = kv;
  o.run_thread = false;
  o.speculative.drafter = std::move(drafter);
  o.speculative.cost = FlatCost();
  return o;
}

struct RunResult {
  std::vector<std::vector<int32_t>> tokens;
  std::vector<FinishInfo> info;
  int64_t drafted = 0, accepted = 0, multi_token_calls = 0;
  int64_t steps = 0, drafting_steps = 0, max_drafted_in_step = 0;
};

RunResult RunAll(Model& model, const SchedulerOptions& o, const std::vector<GenerationRequest>& reqs) {
  auto s = Scheduler::Create(model, o);
  PD_CHECK_OK(s.status());
  std::vector<std::shared_ptr<Sink>> sinks;
  size_t submitted = 0;
  RunResult out;
  for (int step = 0; step < 1000000; ++step) {
    // Requests go in as the waiting queue has room (a sampling test submits thousands).
    while (submitted < reqs.size() && (*s)->Load().waiting < o.max_waiting / 2) {
      sinks.push_back(std::make_shared<Sink>());
      PD_CHECK_OK((*s)->Submit(reqs[submitted++], sinks.back()));
    }
    const EngineLoad load = (*s)->Load();
    if (load.running == 0 && load.waiting == 0) break;
    const StepStats st = (*s)->Step();
    out.drafted += st.draft_tokens;
    out.accepted += st.accepted_tokens;
    ++out.steps;
    out.drafting_steps += st.draft_tokens > 0;
    out.max_drafted_in_step = std::max<int64_t>(out.max_drafted_in_step, st.draft_tokens);
    EXPECT_LE(st.accepted_tokens, st.draft_tokens);
    const absl::Status audit = (*s)->AuditKv();
    EXPECT_TRUE(audit.ok()) << audit;
    if (!audit.ok()) break;
  }
  const EngineLoad load = (*s)->Load();
  EXPECT_EQ(load.kv_blocks_free, load.kv_blocks_total) << "KV blocks leaked";
  for (const auto& sink : sinks) {
    EXPECT_TRUE(sink->finished);
    out.tokens.push_back(sink->tokens);
    out.info.push_back(sink->info);
    out.multi_token_calls += sink->calls < static_cast<int>(sink->tokens.size()) ? 1 : 0;
  }
  return out;
}

std::vector<GenerationRequest> GreedyRequests(int n, int max_tokens) {
  std::vector<GenerationRequest> reqs;
  for (int i = 0; i < n; ++i) {
    GenerationRequest r;
    r.id = "r" + std::to_string(i);
    r.prompt = Prompt(i);
    r.max_tokens = max_tokens + i % 7;
    r.sampling = SamplingParams::Greedy();
    if (i % 4 == 1) r.sampling.repetition_penalty = 1.3f;  // the chain, penalty included
    if (i % 5 == 2) r.stop_token_ids = {static_cast<int32_t>(i % kVocab)};
    reqs.push_back(std::move(r));
  }
  return reqs;
}

void ExpectSameAsPlain(Model& target, std::shared_ptr<spec::Drafter> drafter, KvDType kv,
                       Near near) {
  const auto reqs = GreedyRequests(100, 24);
  SchedulerOptions plain = Options(nullptr, kv);
  const RunResult want = RunAll(target, plain, reqs);
  const RunResult got = RunAll(target, Options(drafter, kv), reqs);
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ(got.tokens[i], want.tokens[i]) << "request " << i;
    EXPECT_EQ(got.info[i].reason, want.info[i].reason) << "request " << i;
    EXPECT_EQ(want.info[i].draft_tokens, 0);
  }
  // Both paths of the rule ran: drafts accepted and drafts rejected (a far draft: rejected).
  EXPECT_GT(got.drafted, got.accepted);
  if (near != Near::kFar) {
    EXPECT_GT(got.accepted, 0);
    EXPECT_GT(got.multi_token_calls, 0);  // accepted runs reach the sink as one call
  }
  if (near == Near::kClose) {
    EXPECT_GT(got.accepted * 2, got.drafted);
  }
  int64_t per_request_drafted = 0;
  for (const FinishInfo& f : got.info) per_request_drafted += f.draft_tokens;
  EXPECT_EQ(per_request_drafted, got.drafted);
}

class GreedyLossless : public ::testing::TestWithParam<KvDType> {};

TEST_P(GreedyLossless, NgramDrafterGivesTheSameTokens) {
  auto env = Target();
  ExpectSameAsPlain(*env->model, std::make_shared<spec::NgramDrafter>(), GetParam(), Near::kMedium);
}

TEST_P(GreedyLossless, CloseDraftModelGivesTheSameTokens) {
  auto env = Target();
  testing::TinyEngine keep;
  auto drafter = spec::DraftModelDrafter::Create(DraftModel(keep, Near::kClose), kVocab,
                                                 {.kv_bytes = int64_t{8} << 20, .cost = DraftCost()});
  ASSERT_TRUE(drafter.ok()) << drafter.status();
  ExpectSameAsPlain(*env->model, std::move(*drafter), GetParam(), Near::kClose);
}

TEST_P(GreedyLossless, FarDraftModelGivesTheSameTokens) {
  auto env = Target();
  testing::TinyEngine keep;
  auto drafter = spec::DraftModelDrafter::Create(DraftModel(keep, Near::kFar), kVocab,
                                                 {.kv_bytes = int64_t{8} << 20, .cost = DraftCost()});
  ASSERT_TRUE(drafter.ok()) << drafter.status();
  ExpectSameAsPlain(*env->model, std::move(*drafter), GetParam(), Near::kFar);
}

// The target as its own draft: its layers, its head cut to every `step`-th token (the draft's
// argmax is the target's whenever that is among them).
std::unique_ptr<Model> SelfHeadDraft(const Model& target, int step = 3) {
  std::vector<int32_t> ids;
  for (int t = 0; t < kVocab; t += step) ids.push_back(t);
  auto m = Model::WithHead(target, ids);
  PD_CHECK_OK(m.status());
  return std::move(*m);
}

TEST_P(GreedyLossless, SelfHeadDrafterGivesTheSameTokens) {
  auto env = Target();
  auto drafter = spec::SelfHeadDrafter::Create(SelfHeadDraft(*env->model), DraftCost());
  ASSERT_TRUE(drafter.ok()) << drafter.status();
  ExpectSameAsPlain(*env->model, std::move(*drafter), GetParam(), Near::kMedium);
}

// The cut head as an ordinary draft model over a cache of its own (what a draft GGUF gets).
TEST_P(GreedyLossless, SelfHeadViewAsADraftModelGivesTheSameTokens) {
  auto env = Target();
  auto drafter = spec::DraftModelDrafter::Create(
      SelfHeadDraft(*env->model), kVocab, {.kv_bytes = int64_t{8} << 20, .cost = DraftCost()});
  ASSERT_TRUE(drafter.ok()) << drafter.status();
  ExpectSameAsPlain(*env->model, std::move(*drafter), GetParam(), Near::kMedium);
}

INSTANTIATE_TEST_SUITE_P(KvTypes, GreedyLossless, ::testing::Values(KvDType::kF16, KvDType::kI8),
                         [](const auto& info) {
                           return std::string(info.param == KvDType::kF16 ? "F16" : "Int8");
                         });

TEST(SpeculativeScheduler, DraftModelCacheThatIsTooSmallOnlyCostsDrafts) {
  // Room for about two sequences' draft KV: the drafter evicts and re-computes, never fails a
  // request, and the output is unchanged.
  auto env = Target();
  testing::TinyEngine keep;
  const KvCacheOptions kvo = DraftModel(keep, Near::kClose)->KvOptions(1, KvDType::kF16, 16);
  auto drafter = spec::DraftModelDrafter::Create(
      DraftModel(keep, Near::kClose), kVocab,
      {.kv_bytes = static_cast<int64_t>(KvCache::BytesFor(kvo)) * 5, .cost = DraftCost()});
  ASSERT_TRUE(drafter.ok()) << drafter.status();
  const auto reqs = GreedyRequests(24, 20);
  const RunResult want = RunAll(*env->model, Options(nullptr), reqs);
  const RunResult got = RunAll(*env->model, Options(std::move(*drafter)), reqs);
  EXPECT_EQ(got.tokens, want.tokens);
  EXPECT_GT(got.accepted, 0);
}

TEST(SpeculativeScheduler, ARequestMayTurnItOff) {
  auto env = Target();
  auto reqs = GreedyRequests(8, 16);
  for (auto& r : reqs) r.speculative = false;
  const RunResult got = RunAll(*env->model, Options(std::make_shared<spec::NgramDrafter>()), reqs);
  EXPECT_EQ(got.drafted, 0);
}

TEST(SpeculativeScheduler, OnlyProbesWhenEveryRowCostsAFullShare) {
  // Compute-bound costs: an extra row costs as much as the step's own, so ChooseK never drafts;
  // what drafts remain are the gate's probes (SpecGate): its warm-up, then its explorations,
  // each one sequence's draft of at most kProbeDraft tokens.
  auto env = Target();
  SchedulerOptions o = Options(std::make_shared<spec::NgramDrafter>());
  o.speculative.cost = spec::SpecCost::FromPoints({1, 64}, {1e-3, 64e-3});
  const RunResult got = RunAll(*env->model, o, GreedyRequests(16, 16));
  // Per bucket of sequence counts (16 running down to 1 as they finish: 5 buckets).
  EXPECT_LE(got.drafting_steps, 5 * spec::SpecGate::kWarmup + got.steps / spec::SpecGate::kExploreMin)
      << got.steps << " steps";
  EXPECT_LE(got.max_drafted_in_step, spec::SpecGate::kProbeDraft);
}

TEST(SpeculativeScheduler, MeasuresTheStepCostAtCreate) {
  auto env = Target();
  SchedulerOptions o = Options(std::make_shared<spec::NgramDrafter>());
  o.speculative.cost.reset();
  auto s = Scheduler::Create(*env->model, o);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ((*s)->Load().kv_blocks_free, o.kv_blocks);  // the scratch sequence is gone
  EXPECT_TRUE((*s)->AuditKv().ok());
}

// A drafter whose proposals are good (a close draft model's) but slow (a sleep in every
// Propose), and that claims to cost nothing: the cost model believes it, the measured gate
// does not.
class SlowDrafter : public spec::Drafter {
 public:
  explicit SlowDrafter(std::shared_ptr<spec::Drafter> inner) : inner_(std::move(inner)) {}
  std::string_view name() const override { return "slow"; }
  absl::Status Propose(absl::Span<spec::DraftRequest* const> requests) override {
    absl::SleepFor(absl::Milliseconds(10));
    return inner_->Propose(requests);
  }
  void Release(int64_t seq) override { inner_->Release(seq); }
  bool SharesTargetKv() const override { return inner_->SharesTargetKv(); }

 private:
  std::shared_ptr<spec::Drafter> inner_;
};

// For a draft model, and for the self-head drafter, whose drafted rows are not rows of the
// step's batch (the gate must still see its steps as speculating ones).
class SlowDrafts : public ::testing::TestWithParam<bool> {};

TEST_P(SlowDrafts, MeasuredSlowDraftsTurnThemselvesOff) {
  auto env = Target();
  testing::TinyEngine keep;
  std::shared_ptr<spec::Drafter> inner;
  if (GetParam()) {
    auto d = spec::SelfHeadDrafter::Create(SelfHeadDraft(*env->model), DraftCost());
    ASSERT_TRUE(d.ok()) << d.status();
    inner = std::move(*d);
  } else {
    auto d = spec::DraftModelDrafter::Create(DraftModel(keep, Near::kClose), kVocab,
                                             {.cost = DraftCost()});
    ASSERT_TRUE(d.ok()) << d.status();
    inner = std::move(*d);
  }
  SchedulerOptions o = Options(std::make_shared<SlowDrafter>(std::move(inner)));
  auto s = Scheduler::Create(*env->model, o);
  ASSERT_TRUE(s.ok()) << s.status();
  auto reqs = GreedyRequests(1, 240);  // the tiny model holds 256 tokens
  auto sink = std::make_shared<Sink>();
  const absl::Status submitted = (*s)->Submit(reqs[0], sink);
  ASSERT_TRUE(submitted.ok()) << submitted;
  int steps = 0, drafting_steps = 0, accepted = 0;
  while (!sink->finished && steps < 10000) {
    const StepStats st = (*s)->Step();
    ++steps;
    drafting_steps += st.draft_tokens > 0;
    accepted += st.accepted_tokens;
  }
  ASSERT_TRUE(sink->finished);
  EXPECT_GT(accepted, 0);  // the drafts were good: only their time turned them off
  // The warm-up, then tries at intervals doubling from SpecGate::kExploreMin (16 + 32 + 64 + 128
  // steps: at most 5 in 250). Slack for a slow machine's noisy first steps.
  EXPECT_LE(drafting_steps, spec::SpecGate::kWarmup + 5 + 3) << steps << " steps";
  EXPECT_TRUE((*s)->AuditKv().ok());
}

INSTANTIATE_TEST_SUITE_P(Drafters, SlowDrafts, ::testing::Bool(), [](const auto& info) {
  return std::string(info.param ? "SelfHead" : "DraftModel");
});

TEST(SpeculativeScheduler, ValidatesItsOptions) {
  SchedulerOptions o;
  o.speculative.max_k = 17;
  EXPECT_FALSE(o.Validate().ok());
  o.speculative.max_k = 4;
  o.speculative.fixed_k = 5;
  EXPECT_FALSE(o.Validate().ok());
  o.speculative.fixed_k = 4;
  EXPECT_TRUE(o.Validate().ok());
}

// ---- sampling: the emitted tokens' distribution is the target's ----------------------------

// The exact joint distribution of the first `n` generated tokens of `prompt` under `params`
// (no stop tokens): every prefix's next-token distribution by the sampler's chain.
std::map<std::vector<int32_t>, double> ExactJoint(Model& model, const std::vector<int32_t>& prompt,
                                                  const SamplingParams& params, int n) {
  std::map<std::vector<int32_t>, double> joint = {{{}, 1.0}};
  auto kv = KvCache::Create(model.KvOptions(16, KvDType::kF32, 16), model.backend());
  PD_CHECK_OK(kv.status());
  Sampler chain(params);
  std::vector<float> logits;
  for (int step = 0; step < n; ++step) {
    std::map<std::vector<int32_t>, double> next;
    for (const auto& [prefix, prob] : joint) {
      std::vector<int32_t> seq = prompt;
      seq.insert(seq.end(), prefix.begin(), prefix.end());
      PD_CHECK_OK((*kv)->Reserve(0, static_cast<int>(seq.size())));
      Batch b;
      for (size_t i = 0; i < seq.size(); ++i) {
        b.AddOrdered(seq[i], static_cast<int32_t>(i), 0, i + 1 == seq.size(),
                     static_cast<int32_t>(prompt.size()));
      }
      PD_CHECK_OK(model.Forward(b, **kv, &logits));
      (*kv)->Free(0);
      TokenDist d;
      chain.Distribution(logits, seq, &d);
      for (size_t i = 0; i < d.ids.size(); ++i) {
        std::vector<int32_t> longer = prefix;
        longer.push_back(d.ids[i]);
        next[longer] += prob * d.probs[i];
      }
    }
    joint = std::move(next);
  }
  return joint;
}

struct SamplingCase {
  const char* name;
  SamplingParams params;
};

std::vector<SamplingCase> SamplingCases() {
  auto with = [](float temp, int top_k, float top_p, float min_p, float penalty) {
    SamplingParams p;
    p.temperature = temp;
    p.top_k = top_k;
    p.top_p = top_p;
    p.min_p = min_p;
    p.repetition_penalty = penalty;
    return p;
  };
  return {{"temp1_topk6", with(1.0f, 6, 1.0f, 0.0f, 1.0f)},
          {"temp07_topp09", with(0.7f, 0, 0.9f, 0.0f, 1.0f)},
          {"temp12_minp001_penalty", with(1.2f, 0, 1.0f, 0.01f, 1.1f)}};
}

// Draws `n` requests of 3 tokens each after `prompt` and tests their joint distribution
// against the exact one. Returns the p-value.
double SampledJointPValue(Model& target, std::shared_ptr<spec::Drafter> drafter,
                          const SamplingParams& params, bool wrong_rule, int n,
                          int64_t* drafted, int64_t* accepted) {
  // Every vocabulary token once (so that 1-gram lookup proposes after any first token: the
  // token that followed it here), then the target's own greedy continuation.
  std::vector<int32_t> prompt(kVocab);
  for (int i = 0; i < kVocab; ++i) prompt[i] = (i * 37 + 11) % kVocab;  // 37 is prime to 96
  {
    GenerationRequest g;
    g.id = "greedy";
    g.prompt = prompt;
    g.max_tokens = 8;
    g.sampling = SamplingParams::Greedy();
    const RunResult r = RunAll(target, Options(nullptr), {g});
    prompt.insert(prompt.end(), r.tokens[0].begin(), r.tokens[0].end());
  }
  SchedulerOptions o = Options(std::move(drafter));
  o.speculative.fixed_k = 2;
  o.prefix_cache.enabled = true;  // the shared prompt is computed once
  o.max_running_seqs = 64;
  o.token_budget = 512;
  o.prefill_chunk = 512;
  if (wrong_rule) {
    // Rejection draws from p instead of the residual: the classic bug.
    o.speculative.rule = [](const TokenDist& p, int32_t x, const TokenDist* q, Sampler& rng) {
      const double px = p.Prob(x), qx = q == nullptr ? 1.0 : q->Prob(x);
      if (px > 0 && (px >= qx || rng.Uniform() * qx < px)) return spec::Verdict{x, true};
      return spec::Verdict{rng.Draw(p), false};
    };
  }
  std::vector<GenerationRequest> reqs;
  for (int i = 0; i < n; ++i) {
    GenerationRequest r;
    r.id = "s" + std::to_string(i);
    r.prompt = prompt;
    r.max_tokens = 3;
    r.sampling = params;
    r.sampling.seed = 7919u * i + 1;
    reqs.push_back(std::move(r));
  }
  const RunResult got = RunAll(target, o, reqs);
  *drafted = got.drafted;
  *accepted = got.accepted;
  const auto exact = ExactJoint(target, prompt, params, 3);
  int likely = 0;  // outcomes of probability >= 1e-3: the law is not (nearly) deterministic
  for (const auto& [seq, p] : exact) likely += p >= 1e-3 ? 1 : 0;
  EXPECT_GE(likely, 10) << "a degenerate test case";
  std::map<std::vector<int32_t>, double> counts;
  for (const auto& t : got.tokens) counts[t] += 1;
  std::vector<double> observed, probs;
  for (const auto& [seq, p] : exact) {
    observed.push_back(counts.contains(seq) ? counts[seq] : 0);
    probs.push_back(p);
    counts.erase(seq);
  }
  for (const auto& [seq, c] : counts) {  // outcomes the target cannot produce
    observed.push_back(c);
    probs.push_back(0);
  }
  const auto chi = testing::ChiSquareTest(observed, probs);
  return chi.p_value;
}

class SamplingLossless : public ::testing::TestWithParam<int> {};

TEST_P(SamplingLossless, JointDistributionOfThreeTokensIsTheTargets) {
  const SamplingCase c = SamplingCases()[GetParam()];
  auto env = Target();
  constexpr int kSamples = 20000;
  for (const char* kind : {"n-gram", "draft model", "self-head"}) {
    SCOPED_TRACE(std::string(c.name) + " " + kind);
    testing::TinyEngine keep;
    auto make = [&]() -> std::shared_ptr<spec::Drafter> {
      if (kind == std::string_view("n-gram")) {
        return std::make_shared<spec::NgramDrafter>(spec::NgramOptions{.min_n = 1, .max_n = 3});
      }
      if (kind == std::string_view("self-head")) {
        auto d = spec::SelfHeadDrafter::Create(SelfHeadDraft(*env->model, 2), DraftCost());
        PD_CHECK_OK(d.status());
        return std::move(*d);
      }
      auto d = spec::DraftModelDrafter::Create(DraftModel(keep, Near::kMedium), kVocab,
                                               {.kv_bytes = int64_t{8} << 20, .cost = DraftCost()});
      PD_CHECK_OK(d.status());
      return std::move(*d);
    };
    int64_t drafted = 0, accepted = 0;
    const double p_ok =
        SampledJointPValue(*env->model, make(), c.params, false, kSamples, &drafted, &accepted);
    EXPECT_GT(p_ok, 0.01);
    // The drafts were really verified, and both branches of the rule taken.
    EXPECT_GT(drafted, kSamples / 2);
    EXPECT_GT(accepted, kSamples / 50);
    EXPECT_LT(accepted, drafted);
    const double p_wrong =
        SampledJointPValue(*env->model, make(), c.params, true, kSamples, &drafted, &accepted);
    std::fprintf(stderr, "%s %s: p %.4f, wrong rule p %.3g, drafted %lld accepted %lld\n", c.name,
                 kind, p_ok, p_wrong, (long long)drafted, (long long)accepted);
    EXPECT_LT(p_wrong, 0.01) << "the test cannot tell a wrong acceptance rule";
  }
}

INSTANTIATE_TEST_SUITE_P(Settings, SamplingLossless, ::testing::Range(0, 3),
                         [](const auto& info) {
                           return std::string(SamplingCases()[info.param].name);
                         });

}  // namespace
}  // namespace pd::engine
