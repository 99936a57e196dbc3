// Scheduler tests on a tiny random Llama-style model. Results are compared with single-sequence
// engine::Generate runs; step-by-step behaviour (batch composition, admission, preemption) is
// checked with run_thread = false, where the test drives the loop with Step().
#include "engine/sched/scheduler.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/status_matchers.h"
#include "engine/sched/generate.h"
#include "tests/testing/recording_backend.h"
#include "tests/testing/tiny_engine.h"

namespace pd::engine {
namespace {

using ::pd::testing::StatusIs;
using ::testing::ElementsAre;

constexpr int kVocab = 96;  // TinyModelSpec's n_vocab

using Env = testing::TinyEngine;

std::unique_ptr<Env> MakeEnv() { return testing::MakeTinyEngine(); }

std::vector<int32_t> Prompt(int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> p(n);
  for (int32_t& t : p) t = static_cast<int32_t>(rng() % kVocab);
  return p;
}

GenerationRequest Req(std::string id, std::vector<int32_t> prompt, int max_tokens,
                      int priority = 0) {
  GenerationRequest r;
  r.id = std::move(id);
  r.prompt = std::move(prompt);
  r.max_tokens = max_tokens;
  r.sampling = SamplingParams::Greedy();
  r.priority = priority;
  return r;
}

// The request run alone with engine::Generate (what batching must not change).
std::vector<int32_t> Reference(Env& env, const GenerationRequest& r,
                               KvDType kv_type = KvDType::kF16) {
  auto kv = KvCache::Create(env.model->KvOptions(64, kv_type, 16), *env.backend);
  PD_CHECK_OK(kv.status());
  GenerateOptions o;
  o.max_tokens = r.max_tokens;
  o.sampling = r.sampling;
  o.eog_tokens = r.stop_token_ids;
  auto result = Generate(*env.model, **kv, 0, r.prompt, o, nullptr);
  PD_CHECK_OK(result.status());
  return result->tokens;
}

// Records one request's stream; checks the sink contract (OnFinish exactly once, last).
class RecordingSink : public GenerationSink {
 public:
  // Runs on the engine thread after each OnTokens, with the number of tokens so far.
  std::function<void(int)> on_tokens;
  // Runs on the engine thread in OnFinish.
  std::function<void(const FinishInfo&)> on_finish;

  void OnTokens(const std::vector<int32_t>& tokens) override {
    int n;
    {
      absl::MutexLock l(&mu_);
      EXPECT_FALSE(finished_) << "OnTokens after OnFinish";
      EXPECT_EQ(tokens.size(), 1u);
      tokens_.insert(tokens_.end(), tokens.begin(), tokens.end());
      n = static_cast<int>(tokens_.size());
    }
    if (on_tokens) on_tokens(n);
  }
  void OnFinish(const FinishInfo& info) override {
    {
      absl::MutexLock l(&mu_);
      EXPECT_FALSE(finished_) << "OnFinish twice";
      EXPECT_EQ(info.completion_tokens, static_cast<int>(tokens_.size()));
      finished_ = true;
      info_ = info;
    }
    if (on_finish) on_finish(info);
  }
  bool WaitFinished(absl::Duration timeout = absl::Seconds(60)) {
    absl::MutexLock l(&mu_);
    return mu_.AwaitWithTimeout(absl::Condition(&finished_), timeout);
  }
  bool finished() {
    absl::MutexLock l(&mu_);
    return finished_;
  }
  std::vector<int32_t> tokens() {
    absl::MutexLock l(&mu_);
    return tokens_;
  }
  int n_tokens() {
    absl::MutexLock l(&mu_);
    return static_cast<int>(tokens_.size());
  }
  FinishInfo info() {
    absl::MutexLock l(&mu_);
    return info_;
  }

 private:
  absl::Mutex mu_;
  std::vector<int32_t> tokens_ ABSL_GUARDED_BY(mu_);
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  FinishInfo info_ ABSL_GUARDED_BY(mu_);
};

// Six requests of different prompt and output lengths, ids prefix0..prefix5, prompts drawn from
// prompt_seed + i: greedy, except one seeded sampling request (its own sampler must give what it
// gives alone) and one with a repetition penalty (its history must be prompt + output, as in
// Generate).
std::vector<GenerationRequest> MixedRequests(const std::string& prefix, uint32_t prompt_seed,
                                             uint64_t sampling_seed) {
  std::vector<GenerationRequest> reqs;
  const int lens[] = {3, 40, 17, 1, 25, 9};
  const int max_tokens[] = {20, 12, 30, 8, 16, 24};
  for (int i = 0; i < 6; ++i) {
    reqs.push_back(
        Req(prefix + std::to_string(i), Prompt(lens[i], prompt_seed + i), max_tokens[i]));
  }
  reqs[4].sampling = SamplingParams{};
  reqs[4].sampling.seed = sampling_seed;
  reqs[4].sampling.temperature = 1.0f;
  reqs[2].sampling.repetition_penalty = 1.5f;
  reqs[2].sampling.penalty_last_n = 16;
  return reqs;
}

SchedulerOptions Small(bool threaded = true) {
  SchedulerOptions o;
  o.kv_blocks = 64;
  o.max_running_seqs = 8;
  o.token_budget = 64;
  o.prefill_chunk = 16;
  o.run_thread = threaded;
  return o;
}

std::unique_ptr<Scheduler> MakeScheduler(Env& env, const SchedulerOptions& o) {
  auto s = Scheduler::Create(*env.model, o);
  PD_CHECK_OK(s.status());
  return std::move(*s);
}

// Steps until nothing is live (manual mode).
void RunToIdle(Scheduler& s, int max_steps = 2000) {
  for (int i = 0; i < max_steps; ++i) {
    const EngineLoad load = s.Load();
    if (load.running == 0 && load.waiting == 0) return;
    s.Step();
  }
  FAIL() << "scheduler did not become idle in " << max_steps << " steps";
}

void ExpectAllBlocksFree(const Scheduler& s) {
  const EngineLoad load = s.Load();
  EXPECT_EQ(load.kv_blocks_free, load.kv_blocks_total);
  EXPECT_EQ(load.kv_blocks_total, s.kv_blocks_total());
  EXPECT_EQ(load.running, 0);
  EXPECT_EQ(load.waiting, 0);
  EXPECT_EQ(load.pending_prefill_tokens, 0);
}

TEST(SchedulerOptionsTest, ValidateNamesTheField) {
  EXPECT_TRUE(SchedulerOptions{}.Validate().ok());
  auto with = [](auto edit) {
    SchedulerOptions o;
    edit(o);
    return o.Validate();
  };
  EXPECT_THAT(with([](auto& o) { o.kv_blocks = -1; }),
              StatusIs(absl::StatusCode::kInvalidArgument, "kv_blocks"));
  EXPECT_THAT(with([](auto& o) { o.kv_bytes = 0; }),
              StatusIs(absl::StatusCode::kInvalidArgument, "kv_bytes"));
  EXPECT_THAT(with([](auto& o) { o.block_size = 0; }),
              StatusIs(absl::StatusCode::kInvalidArgument, "block_size"));
  EXPECT_THAT(with([](auto& o) { o.max_running_seqs = 0; }),
              StatusIs(absl::StatusCode::kInvalidArgument, "max_running_seqs"));
  EXPECT_THAT(with([](auto& o) { o.max_waiting = 0; }),
              StatusIs(absl::StatusCode::kInvalidArgument, "max_waiting"));
  EXPECT_THAT(with([](auto& o) { o.max_total_tokens = -5; }),
              StatusIs(absl::StatusCode::kInvalidArgument, "max_total_tokens"));
  EXPECT_THAT(with([](auto& o) { o.token_budget = 16; }),  // < max_running_seqs (32)
              StatusIs(absl::StatusCode::kInvalidArgument, "token_budget"));
  EXPECT_THAT(with([](auto& o) { o.prefill_chunk = 0; }),
              StatusIs(absl::StatusCode::kInvalidArgument, "prefill_chunk"));
  EXPECT_THAT(with([](auto& o) { o.max_context = -1; }),
              StatusIs(absl::StatusCode::kInvalidArgument, "max_context"));
}

TEST(SchedulerCreateTest, SizesKvFromBytesAndContextFromModelAndCache) {
  auto env = MakeEnv();
  SchedulerOptions o = Small();
  o.kv_blocks = 0;
  const size_t per_block = KvCache::BytesFor(env->model->KvOptions(1, KvDType::kF16, 16));
  o.kv_bytes = static_cast<int64_t>(per_block) * 7 + per_block / 2;
  auto s = MakeScheduler(*env, o);
  EXPECT_EQ(s->kv_blocks_total(), 7);
  EXPECT_EQ(s->Load().kv_blocks_free, 7);
  EXPECT_EQ(s->Load().kv_block_size, 16);
  EXPECT_EQ(s->max_context(), 7 * 16);  // the cache is smaller than the trained context (256)

  // The KV type is passed through: INT8 blocks (values + scales) are smaller, so more fit.
  o.kv_dtype = KvDType::kI8;
  const size_t per_i8_block = KvCache::BytesFor(env->model->KvOptions(1, KvDType::kI8, 16));
  ASSERT_LT(per_i8_block, per_block);
  EXPECT_EQ(MakeScheduler(*env, o)->kv_blocks_total(), o.kv_bytes / per_i8_block);
  o.kv_dtype = KvDType::kF16;

  o.kv_blocks = 64;
  EXPECT_EQ(MakeScheduler(*env, o)->max_context(), 256);  // the model's trained context
  o.max_context = 100;
  EXPECT_EQ(MakeScheduler(*env, o)->max_context(), 100);

  o.kv_blocks = 0;
  o.kv_bytes = static_cast<int64_t>(per_block) - 1;
  EXPECT_THAT(Scheduler::Create(*env->model, o),
              StatusIs(absl::StatusCode::kInvalidArgument, "below one KV block"));
  o.kv_blocks = 64;
  o.max_total_tokens = 99;  // < max_context 100: a full-length request could never run
  EXPECT_THAT(Scheduler::Create(*env->model, o),
              StatusIs(absl::StatusCode::kInvalidArgument, "max_total_tokens"));
}

TEST(SchedulerCreateTest, OwnsTheModelWhenGivenOne) {
  auto env = MakeEnv();
  auto file = GgufFile::Parse(MappedFile::Borrow(env->bytes.data(), env->bytes.size()));
  PD_ASSERT_OK(file);
  auto model = Model::Load(std::shared_ptr<const GgufFile>(std::move(*file)), *env->backend);
  PD_ASSERT_OK(model);
  const GenerationRequest r = Req("own", Prompt(6, 5), 5);
  const auto expected = Reference(*env, r);
  auto sched = Scheduler::Create(std::move(*model), Small());
  PD_ASSERT_OK(sched);
  auto sink = std::make_shared<RecordingSink>();
  PD_ASSERT_OK((*sched)->Submit(r, sink));
  ASSERT_TRUE(sink->WaitFinished());
  EXPECT_EQ(sink->tokens(), expected);
  EXPECT_THAT(Scheduler::Create(std::unique_ptr<Model>(), Small()),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

// The KV type is passed through: with INT8 KV (values quantized per token and head), batching
// still changes nothing, so the streams equal Generate on an INT8 cache.
TEST(SchedulerTest, Int8KvStreamsMatchGenerateOnInt8Cache) {
  auto env = MakeEnv();
  std::vector<GenerationRequest> reqs = {Req("i0", Prompt(9, 90), 14), Req("i1", Prompt(33, 91), 9),
                                         Req("i2", Prompt(2, 92), 20)};
  std::vector<std::vector<int32_t>> expected;
  for (const auto& r : reqs) expected.push_back(Reference(*env, r, KvDType::kI8));
  SchedulerOptions o = Small();
  o.kv_dtype = KvDType::kI8;
  auto sched = MakeScheduler(*env, o);
  std::vector<std::shared_ptr<RecordingSink>> sinks;
  for (const auto& r : reqs) {
    sinks.push_back(std::make_shared<RecordingSink>());
    PD_ASSERT_OK(sched->Submit(r, sinks.back()));
  }
  for (size_t i = 0; i < reqs.size(); ++i) {
    ASSERT_TRUE(sinks[i]->WaitFinished());
    EXPECT_EQ(sinks[i]->tokens(), expected[i]) << reqs[i].id;
  }
  ExpectAllBlocksFree(*sched);
}

// The scheduler on a backend that captures its steps (the CUDA backend's graphs, emulated on
// the CPU by RecordingBackend: ops run only at the end of a step, host spans copied when called):
// six concurrent requests get the tokens each gets alone on the CPU backend, through greedy, seeded
// and penalized sampling (top logits on the device, and whole rows); the decode steps of up to 8
// rows are captured, and the engine load counts them.
TEST(SchedulerTest, CapturedStepsGiveTheTokensOfPlainOnes) {
  auto env = MakeEnv();
  std::vector<GenerationRequest> reqs = MixedRequests("c", 300, 99);
  std::vector<std::vector<int32_t>> expected;
  for (const auto& r : reqs) expected.push_back(Reference(*env, r));

  testing::RecordingBackend rec("cpu:recording");
  auto file = GgufFile::Parse(MappedFile::Borrow(env->bytes.data(), env->bytes.size()));
  PD_ASSERT_OK(file.status());
  auto model = Model::Load(std::shared_ptr<const GgufFile>(std::move(*file)), rec);
  PD_ASSERT_OK(model.status());
  auto sched = Scheduler::Create(**model, Small());
  PD_ASSERT_OK(sched.status());
  std::vector<std::shared_ptr<RecordingSink>> sinks;
  for (const auto& r : reqs) {
    sinks.push_back(std::make_shared<RecordingSink>());
    PD_ASSERT_OK((*sched)->Submit(r, sinks.back()));
  }
  for (size_t i = 0; i < reqs.size(); ++i) {
    ASSERT_TRUE(sinks[i]->WaitFinished());
    EXPECT_EQ(sinks[i]->tokens(), expected[i]) << reqs[i].id;
  }
  const EngineLoad load = (*sched)->Load();
  EXPECT_GT(load.graph_steps, 0);
  EXPECT_EQ(load.graph_abandoned, 0);
  ExpectAllBlocksFree(**sched);
}

TEST(SchedulerTest, ConcurrentSequencesMatchGenerateAlone) {
  auto env = MakeEnv();
  std::vector<GenerationRequest> reqs = MixedRequests("r", 100, 1234);
  std::vector<std::vector<int32_t>> expected;
  for (const auto& r : reqs) expected.push_back(Reference(*env, r));

  std::vector<StepStats> steps;
  absl::Mutex steps_mu;
  SchedulerOptions o = Small();
  o.step_observer = [&](const StepStats& s) {
    absl::MutexLock l(&steps_mu);
    steps.push_back(s);
  };
  auto sched = MakeScheduler(*env, o);
  std::vector<std::shared_ptr<RecordingSink>> sinks;
  for (const auto& r : reqs) {
    sinks.push_back(std::make_shared<RecordingSink>());
    PD_ASSERT_OK(sched->Submit(r, sinks.back()));
  }
  for (size_t i = 0; i < reqs.size(); ++i) {
    ASSERT_TRUE(sinks[i]->WaitFinished()) << reqs[i].id;
    EXPECT_EQ(sinks[i]->tokens(), expected[i]) << reqs[i].id;
    const FinishInfo info = sinks[i]->info();
    EXPECT_EQ(info.reason, FinishReason::kLength);
    PD_EXPECT_OK(info.status);
    EXPECT_EQ(info.prompt_tokens, static_cast<int>(reqs[i].prompt.size()));
    EXPECT_EQ(info.completion_tokens, reqs[i].max_tokens);
    EXPECT_GE(info.timing.first_scheduled, info.timing.arrival);
    EXPECT_GE(info.timing.first_token, info.timing.first_scheduled);
    EXPECT_GE(info.timing.finished, info.timing.first_token);
    EXPECT_EQ(info.timing.preemptions, 0);
  }
  ExpectAllBlocksFree(*sched);

  // Every token was computed exactly once: prompt + (max_tokens - 1) per request.
  absl::MutexLock l(&steps_mu);
  int64_t computed = 0, expected_computed = 0;
  bool batched = false;
  for (const StepStats& s : steps) {
    computed += s.prefill_tokens + s.decode_tokens;
    EXPECT_LE(s.prefill_tokens + s.decode_tokens, o.token_budget);
    batched |= s.batch.size() > 1;
  }
  for (const GenerationRequest& r : reqs) {
    expected_computed += static_cast<int64_t>(r.prompt.size()) + r.max_tokens - 1;
  }
  EXPECT_EQ(computed, expected_computed);
  EXPECT_TRUE(batched) << "no step held more than one sequence";
  ASSERT_FALSE(steps.empty());
  EXPECT_EQ(steps.back().load.running, 0);
  EXPECT_EQ(steps.back().load.kv_blocks_free, steps.back().load.kv_blocks_total);
}

// Copying back only each row's best logits (the default) gives the tokens that whole rows give,
// for greedy, seeded top-k / top-p / min-p sampling, and beside a sequence with a repetition
// penalty (whose steps then copy whole rows for everyone).
TEST(SchedulerTest, TopLogitsGiveTheTokensOfWholeRows) {
  auto env = MakeEnv();
  std::vector<GenerationRequest> reqs;
  for (int i = 0; i < 5; ++i) {
    reqs.push_back(Req("r" + std::to_string(i), Prompt(5 + 7 * i, 300 + i), 24));
  }
  reqs[1].sampling = SamplingParams{};  // top_k 40, top_p 0.95, min_p 0.05, temperature 0.8
  reqs[1].sampling.seed = 99;
  reqs[2].sampling = SamplingParams{};
  reqs[2].sampling.seed = 5;
  reqs[2].sampling.temperature = 1.5f;
  reqs[2].sampling.top_k = 7;
  reqs[2].sampling.min_p = 0;
  reqs[3].sampling = SamplingParams{};
  reqs[3].sampling.seed = 6;
  reqs[3].sampling.top_k = kVocab;  // every id, still from the copied-back entries
  reqs[3].sampling.top_p = 1.0f;
  reqs[3].sampling.min_p = 0;
  reqs[4].sampling.repetition_penalty = 1.3f;  // greedy with a penalty: whole rows
  reqs[4].sampling.penalty_last_n = 8;
  reqs[4].max_tokens = 6;                      // ends early: later steps go back to top-k
  std::vector<std::vector<int32_t>> got[2];
  int top_steps[2] = {0, 0}, whole_steps[2] = {0, 0};
  for (const bool top : {false, true}) {
    SchedulerOptions o = Small(/*threaded=*/false);
    o.top_logits = top;
    o.step_observer = [&](const StepStats& st) {
      ++(st.top_logits_k > 0 ? top_steps : whole_steps)[top];
      // The largest need of the step's sampling sequences.
      const int k = st.top_logits_k;
      EXPECT_TRUE(k == 0 || k == 1 || k == 7 || k == 40 || k == kVocab) << k;
    };
    auto sched = MakeScheduler(*env, o);
    std::vector<std::shared_ptr<RecordingSink>> sinks;
    for (const auto& r : reqs) {
      sinks.push_back(std::make_shared<RecordingSink>());
      PD_ASSERT_OK(sched->Submit(r, sinks.back()));
    }
    RunToIdle(*sched);
    for (auto& sink : sinks) {
      ASSERT_TRUE(sink->finished());
      got[top].push_back(sink->tokens());
    }
    ExpectAllBlocksFree(*sched);
  }
  for (size_t i = 0; i < reqs.size(); ++i) EXPECT_EQ(got[1][i], got[0][i]) << reqs[i].id;
  EXPECT_EQ(top_steps[0], 0);
  EXPECT_GT(whole_steps[1], 0);  // while the penalized request ran
  EXPECT_GT(top_steps[1], whole_steps[1]);
  // The seeded requests really sampled: their streams differ from greedy decoding.
  GenerationRequest greedy = reqs[2];
  greedy.sampling = SamplingParams::Greedy();
  EXPECT_NE(got[1][2], Reference(*env, greedy));
}

// Expected state after each Step(), TensorRT-LLM style.
struct StepRow {
  std::vector<StepSequence> batch;
  int prefill_tokens;
  int decode_tokens;
  std::vector<int> tokens_so_far;  // per request, in submission order
};

void RunTable(Scheduler& sched, const std::vector<std::shared_ptr<RecordingSink>>& sinks,
              const std::vector<StepRow>& table,
              const std::function<void(int step)>& before_step = nullptr) {
  for (size_t i = 0; i < table.size(); ++i) {
    SCOPED_TRACE(::testing::Message() << "step " << i + 1);
    if (before_step) before_step(static_cast<int>(i + 1));
    const StepStats s = sched.Step();
    EXPECT_EQ(s.batch, table[i].batch);
    EXPECT_EQ(s.prefill_tokens, table[i].prefill_tokens);
    EXPECT_EQ(s.decode_tokens, table[i].decode_tokens);
    std::vector<int> got;
    for (size_t k = 0; k < table[i].tokens_so_far.size(); ++k) got.push_back(sinks[k]->n_tokens());
    EXPECT_EQ(got, table[i].tokens_so_far);
  }
}

TEST(SchedulerTest, ChunkedPrefillNeverStallsRunningStreams) {
  auto env = MakeEnv();
  const GenerationRequest a = Req("A", Prompt(3, 1), 6);
  const GenerationRequest b = Req("B", Prompt(20, 2), 3);
  const auto ref_a = Reference(*env, a), ref_b = Reference(*env, b);
  SchedulerOptions o = Small(/*threaded=*/false);
  o.max_running_seqs = 4;
  o.token_budget = 8;
  o.prefill_chunk = 8;
  auto sched = MakeScheduler(*env, o);
  std::vector<std::shared_ptr<RecordingSink>> sinks = {std::make_shared<RecordingSink>(),
                                                       std::make_shared<RecordingSink>()};
  PD_ASSERT_OK(sched->Submit(a, sinks[0]));
  // B arrives after A's first step; its 20-token prompt is cut to the 7 tokens A's decode leaves.
  const std::vector<StepRow> table = {
      {{{"A", 3, true}}, 3, 0, {1, 0}},
      {{{"A", 1, false}, {"B", 7, true}}, 7, 1, {2, 0}},
      {{{"A", 1, false}, {"B", 7, true}}, 7, 1, {3, 0}},
      {{{"A", 1, false}, {"B", 6, true}}, 6, 1, {4, 1}},
      {{{"A", 1, false}, {"B", 1, false}}, 0, 2, {5, 2}},
      {{{"A", 1, false}, {"B", 1, false}}, 0, 2, {6, 3}},
      {{}, 0, 0, {6, 3}},
  };
  RunTable(*sched, sinks, table, [&](int step) {
    if (step == 2) {
      PD_EXPECT_OK(sched->Submit(b, sinks[1]));
    }
  });
  EXPECT_EQ(sinks[0]->tokens(), ref_a);
  EXPECT_EQ(sinks[1]->tokens(), ref_b);
  EXPECT_TRUE(sinks[0]->finished() && sinks[1]->finished());
  ExpectAllBlocksFree(*sched);
}

// The step-time budget (SchedulerOptions::step_time_stretch) on a modelled machine whose steps
// cost 1 ms + 1 ms per decode token + 0.5 ms per prompt token: a prompt that arrives while
// streams decode is cut so that no step takes more than the stretch times the median recent
// step, the prompt still progresses by at least min_prefill_chunk tokens per step, a step with
// nothing decoding takes whole chunks, and every output is the one the request gets alone.
struct TimedRun {
  std::vector<StepStats> steps;
  std::vector<std::vector<int32_t>> outputs;
};

// The modelled machine: 1 ms a step + 1 ms per decode token + 0.5 ms per prompt token.
double ModelledStep(const StepShape& s) {
  return 1e-3 + 1e-3 * s.decode_tokens + 0.5e-3 * s.prefill_tokens;
}

// Manual-mode options on the modelled machine, chunks of 64, the step-time budget at `stretch`.
SchedulerOptions TimedOptions(double stretch, int min_prefill_chunk = 2) {
  SchedulerOptions o = Small(/*threaded=*/false);
  o.kv_blocks = 128;
  o.token_budget = 128;
  o.prefill_chunk = 64;
  o.step_time_stretch = stretch;
  o.min_prefill_chunk = min_prefill_chunk;
  o.step_time_source = ModelledStep;
  return o;
}

TimedRun RunTimed(Env& env, const std::vector<GenerationRequest>& reqs, double stretch,
                  std::vector<double>* step_costs) {
  auto cost = ModelledStep;
  const SchedulerOptions o = TimedOptions(stretch);
  auto sched = MakeScheduler(env, o);
  std::vector<std::shared_ptr<RecordingSink>> sinks;
  TimedRun run;
  // Requests 0..n-2 arrive one per step (so that the fit sees prompt steps next to decode
  // steps); the last one, the long prompt, after 24 steps, when the others all decode.
  for (int step = 0; step < 400; ++step) {
    const size_t next = sinks.size();
    if (next + 1 < reqs.size() || (next + 1 == reqs.size() && step == 24)) {
      sinks.push_back(std::make_shared<RecordingSink>());
      PD_CHECK_OK(sched->Submit(reqs[next], sinks.back()));
    }
    const EngineLoad load = sched->Load();
    if (sinks.size() == reqs.size() && load.running == 0 && load.waiting == 0) break;
    StepStats st = sched->Step();
    StepShape shape;
    shape.decode_tokens = st.decode_tokens;
    shape.prefill_tokens = st.prefill_tokens;
    if (step_costs != nullptr && !st.batch.empty()) step_costs->push_back(cost(shape));
    run.steps.push_back(std::move(st));
  }
  for (auto& s : sinks) {
    EXPECT_TRUE(s->finished());
    run.outputs.push_back(s->tokens());
  }
  ExpectAllBlocksFree(*sched);
  return run;
}

TEST(SchedulerTest, StepTimeBudgetCutsChunksThatWouldStallStreams) {
  auto env = MakeEnv();
  std::vector<GenerationRequest> reqs;
  for (int i = 0; i < 5; ++i) reqs.push_back(Req("d" + std::to_string(i), Prompt(6, 10 + i), 60));
  reqs.push_back(Req("long", Prompt(120, 99), 4));
  std::vector<double> costs;
  const TimedRun timed = RunTimed(*env, reqs, /*stretch=*/1.5, &costs);
  const TimedRun untimed = RunTimed(*env, reqs, /*stretch=*/0, nullptr);
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ(timed.outputs[i], Reference(*env, reqs[i])) << reqs[i].id;
    EXPECT_EQ(untimed.outputs[i], timed.outputs[i]) << reqs[i].id;
  }
  // Off: the long prompt runs in chunks of 64 beside the decodes (a 38 ms step next to 6 ms ones).
  int untimed_max = 0;
  for (const StepStats& s : untimed.steps) untimed_max = std::max(untimed_max, s.prefill_tokens);
  EXPECT_EQ(untimed_max, 64);
  // On: each step that carries prompt tokens next to decode tokens costs at most 1.5x what the
  // same step costs without them, or carries only the min_prefill_chunk floor (as every such
  // step does before the fit is ready). (The arrival-rate floor stays below the cap here: a few
  // prompt tokens a step.)
  int limited = 0;
  size_t k = 0;  // index into costs (steps with a batch)
  bool fit_ready = false;
  for (const StepStats& s : timed.steps) {
    if (s.batch.empty()) continue;
    const double c = costs[k++];
    if (s.prefill_time_limited) {
      ++limited;
      EXPECT_GT(s.decode_tokens, 0);
      EXPECT_LE(s.prompt_arrival_rate * 1.1, 6);
      if (!fit_ready) {  // the first step beside a decode: the floor only
        EXPECT_EQ(s.prefill_tokens, 2);
        fit_ready = true;
        continue;
      }
      const double decode_only = 1e-3 + 1e-3 * s.decode_tokens;
      EXPECT_TRUE(c <= 1.5 * decode_only * (1 + 1e-9) || s.prefill_tokens <= 2)
          << "step cost " << c << " > 1.5 x " << decode_only << " with " << s.prefill_tokens
          << " prompt tokens";
      EXPECT_GE(s.prefill_tokens, 2) << "below min_prefill_chunk";
    }
  }
  // 5 decoding streams: 6 ms steps, budget 9 ms, 6 prompt tokens a step for the 120-token prompt.
  EXPECT_GE(limited, 10) << "the long prompt was not cut by time";
}

TEST(SchedulerTest, PromptWorkIsPacedOverSteps) {
  auto env = MakeEnv();
  std::vector<GenerationRequest> reqs;
  for (int i = 0; i < 5; ++i) reqs.push_back(Req("d" + std::to_string(i), Prompt(6, 30 + i), 60));
  reqs.push_back(Req("long", Prompt(120, 98), 4));
  // A stretch this large never binds: what is left is pacing while streams decode: the recent
  // arrival rate of prompt tokens (x 1.1, rounded up) plus ceil(pending / 32), at least
  // min_prefill_chunk = 2.
  const TimedRun run = RunTimed(*env, reqs, /*stretch=*/1000, nullptr);
  std::vector<int> long_chunks, want;
  int left = 120;
  for (const StepStats& s : run.steps) {
    for (const StepSequence& q : s.batch) {
      if (q.id != "long" || !q.prefill) continue;
      long_chunks.push_back(q.tokens);
      const int keep_up = static_cast<int>(std::ceil(1.1 * s.prompt_arrival_rate));
      const int take = std::min(left, std::max(2, keep_up + (left + 31) / 32));
      want.push_back(take);
      left -= take;
    }
  }
  EXPECT_EQ(long_chunks, want);
  EXPECT_EQ(left, 0);
  // The long prompt arrived at once: the arrival rate the steps used jumped by 120 / 128
  // (prompt_rate_steps) and decays by 1/128 a step.
  EXPECT_GT(long_chunks.size(), 8u);
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ(run.outputs[i], Reference(*env, reqs[i])) << reqs[i].id;
  }
}

// A burst: eight prompts arrive at once. While only a few of them decode, a step may take prompt
// work up to what the plain step of all eight costs (x the stretch): the streams that decode
// first see steps no longer than they will once all eight decode, and the burst's last prompts
// wait less than under a budget of their few decoding peers' step. Outputs are each request's
// alone.
TEST(SchedulerTest, BurstFillsStepsUpToTheFullBatch) {
  auto env = MakeEnv();
  SchedulerOptions o = TimedOptions(/*stretch=*/1.5);
  auto sched = MakeScheduler(*env, o);
  std::vector<GenerationRequest> reqs;
  std::vector<std::shared_ptr<RecordingSink>> sinks;
  // Fit training: two short requests, one a step, then idle.
  for (int i = 0; i < 3; ++i) {
    reqs.push_back(Req("w" + std::to_string(i), Prompt(6 + 3 * i, 70 + i), 12));
    sinks.push_back(std::make_shared<RecordingSink>());
    PD_ASSERT_OK(sched->Submit(reqs.back(), sinks.back()));
    sched->Step();
  }
  RunToIdle(*sched);
  for (int i = 0; i < 8; ++i) {
    reqs.push_back(Req("b" + std::to_string(i), Prompt(40, 80 + i), 24));
    sinks.push_back(std::make_shared<RecordingSink>());
    PD_ASSERT_OK(sched->Submit(reqs.back(), sinks.back()));
  }
  const double full = 1.5 * ModelledStep(StepShape{8, 0, 0, 0});  // 13.5 ms
  int filled = 0;  // mixed steps longer than their own decode rows' budget
  for (int step = 0; step < 400; ++step) {
    const EngineLoad load = sched->Load();
    if (load.running == 0 && load.waiting == 0) break;
    const StepStats st = sched->Step();
    if (st.decode_tokens == 0 || st.prefill_tokens == 0) continue;
    StepShape shape;
    shape.decode_tokens = st.decode_tokens;
    shape.prefill_tokens = st.prefill_tokens;
    const double cost = ModelledStep(shape);
    const int floor = std::max(2, static_cast<int>(std::ceil(1.1 * st.prompt_arrival_rate)));
    EXPECT_TRUE(cost <= full * (1 + 1e-9) || st.prefill_tokens <= floor)
        << "step " << step << ": " << st.decode_tokens << " decode + " << st.prefill_tokens
        << " prompt tokens cost " << cost << " s, over " << full;
    if (cost > 1.5 * ModelledStep(StepShape{st.decode_tokens, 0, 0, 0}) * (1 + 1e-9) &&
        st.prefill_tokens > floor) {
      ++filled;
    }
  }
  EXPECT_GE(filled, 3) << "few decoding streams did not take the full batch's budget";
  for (size_t i = 0; i < reqs.size(); ++i) {
    ASSERT_TRUE(sinks[i]->finished()) << reqs[i].id;
    EXPECT_EQ(sinks[i]->tokens(), Reference(*env, reqs[i])) << reqs[i].id;
  }
  ExpectAllBlocksFree(*sched);
}

// Prompts that arrive faster than the time cap lets steps take them: the arrival-rate floor
// keeps the backlog bounded (a cap alone would let it, and every TTFT, grow for as long as the
// arrivals go on), and the outputs stay those of each request alone.
TEST(SchedulerTest, PacingKeepsUpWithPromptArrivals) {
  auto env = MakeEnv();
  // 4 decoding streams: 5 ms steps, cap 5.5 ms: 1 prompt token a step.
  SchedulerOptions o = TimedOptions(/*stretch=*/1.1, /*min_prefill_chunk=*/1);
  o.kv_blocks = 256;
  auto sched = MakeScheduler(*env, o);
  std::vector<std::shared_ptr<RecordingSink>> sinks;
  std::vector<GenerationRequest> reqs;
  // 4 streams that decode throughout, then a 24-token prompt every 4 steps (6 tokens a step).
  for (int i = 0; i < 4; ++i) {
    reqs.push_back(Req("s" + std::to_string(i), Prompt(4, 40 + i), 200));
    sinks.push_back(std::make_shared<RecordingSink>());
    PD_ASSERT_OK(sched->Submit(reqs.back(), sinks.back()));
  }
  int max_waiting_tokens = 0;
  for (int step = 0; step < 160; ++step) {
    if (step >= 8 && step % 4 == 0) {
      reqs.push_back(Req("p" + std::to_string(step), Prompt(24, step), 2));
      sinks.push_back(std::make_shared<RecordingSink>());
      PD_ASSERT_OK(sched->Submit(reqs.back(), sinks.back()));
    }
    sched->Step();
    if (step >= 80) {
      max_waiting_tokens = std::max<int>(max_waiting_tokens, sched->Load().pending_prefill_tokens);
    }
  }
  // Without the floor the backlog grows by ~5 tokens a step (over 400 after 80 steps). With it,
  // 190 at the peak: the budget past the steps' own decode rows is held to stretch x the median
  // step, so the full batch's allowance (4 streams + the waiting prompts) no longer drains it to
  // ~90 as it did before that cap.
  EXPECT_LT(max_waiting_tokens, 250);
  RunToIdle(*sched);
  for (size_t i = 0; i < reqs.size(); ++i) {
    ASSERT_TRUE(sinks[i]->finished()) << reqs[i].id;
    EXPECT_EQ(sinks[i]->tokens(), Reference(*env, reqs[i])) << reqs[i].id;
  }
  ExpectAllBlocksFree(*sched);
}

// A wave of prompts beside a steady load (whose typical step carries prompt tokens) fills steps
// up to stretch x the median recent step and no further: the full batch's allowance alone (all
// the live sequences' decode step, x stretch) let such steps reach 1.53 x the median, the ITL
// tail of a closed loop's waves. The wave still starts within 30 steps (23 here).
TEST(SchedulerTest, WaveStepsStayWithinStretchOfTheMedianStep) {
  auto env = MakeEnv();
  SchedulerOptions o = TimedOptions(/*stretch=*/1.5, /*min_prefill_chunk=*/1);
  o.kv_blocks = 256;
  auto sched = MakeScheduler(*env, o);
  std::vector<std::shared_ptr<RecordingSink>> sinks;
  std::vector<GenerationRequest> reqs;
  std::vector<size_t> wave;  // the wave's requests
  auto submit = [&](GenerationRequest r) {
    reqs.push_back(std::move(r));
    sinks.push_back(std::make_shared<RecordingSink>());
    PD_ASSERT_OK(sched->Submit(reqs.back(), sinks.back()));
  };
  // 4 streams that decode throughout; a 24-token prompt every 4 steps (6 tokens a step); at
  // step 160 a wave of 6 prompts of 48 tokens.
  for (int i = 0; i < 4; ++i) submit(Req("s" + std::to_string(i), Prompt(4, 40 + i), 248));
  std::vector<double> costs;  // modelled seconds of every step that decoded
  int wave_steps = -1;        // steps until every prompt of the wave had its first token
  for (int step = 0; step < 240 && wave_steps < 0; ++step) {
    if (step >= 8 && step % 4 == 0) submit(Req("p" + std::to_string(step), Prompt(24, step), 2));
    if (step == 160) {
      for (int i = 0; i < 6; ++i) {
        wave.push_back(reqs.size());
        submit(Req("w" + std::to_string(i), Prompt(48, 90 + i), 2));
      }
    }
    const StepStats st = sched->Step();
    if (st.decode_tokens == 0) continue;
    StepShape shape;
    shape.decode_tokens = st.decode_tokens;
    shape.prefill_tokens = st.prefill_tokens;
    const double cost = ModelledStep(shape);
    if (step >= 160) {
      // Within stretch x the median of the 64 steps before it, unless the arrival-rate floor
      // set its prompt tokens.
      std::vector<double> recent(costs.end() - 64, costs.end());
      std::nth_element(recent.begin(), recent.begin() + 32, recent.end());
      const int floor = std::max(1, static_cast<int>(std::ceil(1.1 * st.prompt_arrival_rate)));
      EXPECT_TRUE(cost <= 1.5 * recent[32] * (1 + 1e-9) || st.prefill_tokens <= floor)
          << "step " << step << ": " << st.decode_tokens << " decode + " << st.prefill_tokens
          << " prompt tokens cost " << cost << " s, median " << recent[32];
      bool started = true;
      for (size_t i : wave) started &= !sinks[i]->tokens().empty();
      if (started) wave_steps = step - 160 + 1;
    }
    costs.push_back(cost);
  }
  // The wave is 288 tokens beside 4-6 decode rows (5-7 ms a step); the typical step carries the
  // steady load's ~7 prompt tokens (8.5 ms), and 1.5 x that leaves ~15 a step.
  EXPECT_GE(wave_steps, 1) << "the wave's prompts did not all start within 80 steps";
  EXPECT_LE(wave_steps, 30);
  RunToIdle(*sched);
  for (size_t i = 0; i < reqs.size(); ++i) {
    ASSERT_TRUE(sinks[i]->finished()) << reqs[i].id;
    EXPECT_EQ(sinks[i]->tokens(), Reference(*env, reqs[i])) << reqs[i].id;
  }
  ExpectAllBlocksFree(*sched);
}

TEST(SchedulerTest, StepTimeBudgetLeavesPromptOnlyStepsWhole) {
  auto env = MakeEnv();
  // Train the fit on decode steps and prompt steps, then let everything finish: a prompt that
  // arrives when nothing decodes runs in whole chunks.
  std::vector<GenerationRequest> reqs;
  for (int i = 0; i < 5; ++i) reqs.push_back(Req("d" + std::to_string(i), Prompt(6, 20 + i), 20));
  reqs.push_back(Req("late", Prompt(100, 7), 2));
  const SchedulerOptions o = TimedOptions(/*stretch=*/1.5);
  auto sched = MakeScheduler(*env, o);
  std::vector<std::shared_ptr<RecordingSink>> sinks;
  for (size_t i = 0; i + 1 < reqs.size(); ++i) {
    sinks.push_back(std::make_shared<RecordingSink>());
    PD_ASSERT_OK(sched->Submit(reqs[i], sinks.back()));
    sched->Step();
  }
  RunToIdle(*sched);
  sinks.push_back(std::make_shared<RecordingSink>());
  PD_ASSERT_OK(sched->Submit(reqs.back(), sinks.back()));
  const StepStats first = sched->Step();
  EXPECT_EQ(first.prefill_tokens, 64);
  EXPECT_FALSE(first.prefill_time_limited);
  RunToIdle(*sched);
  EXPECT_EQ(sinks.back()->tokens(), Reference(*env, reqs.back()));
}

TEST(SchedulerTest, PrefillChunkSplitsPromptsAcrossSequences) {
  auto env = MakeEnv();
  SchedulerOptions o = Small(/*threaded=*/false);
  o.max_running_seqs = 4;
  o.token_budget = 8;
  o.prefill_chunk = 4;
  auto sched = MakeScheduler(*env, o);
  std::vector<std::shared_ptr<RecordingSink>> sinks = {std::make_shared<RecordingSink>(),
                                                       std::make_shared<RecordingSink>(),
                                                       std::make_shared<RecordingSink>()};
  PD_ASSERT_OK(sched->Submit(Req("C", Prompt(6, 3), 2), sinks[0]));
  PD_ASSERT_OK(sched->Submit(Req("D", Prompt(6, 4), 2), sinks[1]));
  PD_ASSERT_OK(sched->Submit(Req("E", Prompt(2, 5), 1), sinks[2]));
  const std::vector<StepRow> table = {
      // Budget 8 = two chunks of 4: E waits (FCFS) although it is short.
      {{{"C", 4, true}, {"D", 4, true}}, 8, 0, {0, 0, 0}},
      {{{"C", 2, true}, {"D", 2, true}, {"E", 2, true}}, 6, 0, {1, 1, 1}},
      {{{"C", 1, false}, {"D", 1, false}}, 0, 2, {2, 2, 1}},
      {{}, 0, 0, {2, 2, 1}},
  };
  RunTable(*sched, sinks, table);
  for (auto& s : sinks) EXPECT_EQ(s->info().reason, FinishReason::kLength);
  ExpectAllBlocksFree(*sched);
}

TEST(SchedulerTest, WithoutChunkingAPromptRunsWholeBesideDecodes) {
  auto env = MakeEnv();
  const GenerationRequest a = Req("A", Prompt(3, 1), 4);
  const GenerationRequest b = Req("B", Prompt(20, 2), 2);
  const GenerationRequest c = Req("C", Prompt(5, 6), 1);
  SchedulerOptions o = Small(/*threaded=*/false);
  o.max_running_seqs = 4;
  o.token_budget = 8;
  o.chunked_prefill = false;
  auto sched = MakeScheduler(*env, o);
  std::vector<std::shared_ptr<RecordingSink>> sinks = {std::make_shared<RecordingSink>(),
                                                       std::make_shared<RecordingSink>(),
                                                       std::make_shared<RecordingSink>()};
  PD_ASSERT_OK(sched->Submit(a, sinks[0]));
  const std::vector<StepRow> table = {
      {{{"A", 3, true}}, 3, 0, {1, 0, 0}},
      // B's 20 tokens exceed the budget and run whole; C does not fit beside it and waits.
      {{{"A", 1, false}, {"B", 20, true}}, 20, 1, {2, 1, 0}},
      {{{"A", 1, false}, {"B", 1, false}, {"C", 5, true}}, 5, 2, {3, 2, 1}},
      {{{"A", 1, false}}, 0, 1, {4, 2, 1}},
      {{}, 0, 0, {4, 2, 1}},
  };
  RunTable(*sched, sinks, table, [&](int step) {
    if (step == 2) {
      PD_EXPECT_OK(sched->Submit(b, sinks[1]));
      PD_EXPECT_OK(sched->Submit(c, sinks[2]));
    }
  });
  EXPECT_EQ(sinks[1]->tokens(), Reference(*env, b));
  ExpectAllBlocksFree(*sched);
}

TEST(SchedulerTest, PreemptionByRecomputeKeepsTokensAndReturnsBlocks) {
  auto env = MakeEnv();
  std::vector<GenerationRequest> reqs = {Req("P0", Prompt(10, 7), 30), Req("P1", Prompt(11, 8), 30),
                                         Req("P2", Prompt(12, 9), 30)};
  reqs[2].sampling = SamplingParams{};  // a seeded sampler must continue across the recompute
  reqs[2].sampling.seed = 99;
  reqs[1].sampling.repetition_penalty = 1.5f;  // the recompute keeps the history too
  std::vector<std::vector<int32_t>> expected;
  for (const auto& r : reqs) expected.push_back(Reference(*env, r));

  SchedulerOptions o = Small(/*threaded=*/false);
  o.kv_blocks = 5;  // 80 tokens; the three need 3 blocks each
  int preemptions = 0;
  int min_free = 5;
  o.step_observer = [&](const StepStats& s) {
    preemptions += s.preemptions;
    min_free = std::min(min_free, s.load.kv_blocks_free);
  };
  auto sched = MakeScheduler(*env, o);
  EXPECT_EQ(sched->max_context(), 80);
  std::vector<std::shared_ptr<RecordingSink>> sinks;
  for (const auto& r : reqs) {
    sinks.push_back(std::make_shared<RecordingSink>());
    PD_ASSERT_OK(sched->Submit(r, sinks.back()));
  }
  RunToIdle(*sched);
  int recorded = 0;
  for (size_t i = 0; i < reqs.size(); ++i) {
    ASSERT_TRUE(sinks[i]->finished());
    EXPECT_EQ(sinks[i]->tokens(), expected[i]) << reqs[i].id;  // none lost, none re-emitted
    EXPECT_EQ(sinks[i]->info().reason, FinishReason::kLength);
    recorded += sinks[i]->info().timing.preemptions;
  }
  EXPECT_GT(preemptions, 0);
  EXPECT_EQ(recorded, preemptions);
  EXPECT_EQ(min_free, 0);
  // The earliest admitted sequence is never the victim.
  EXPECT_EQ(sinks[0]->info().timing.preemptions, 0);
  ExpectAllBlocksFree(*sched);
}

TEST(SchedulerTest, HigherPriorityIsAdmittedFirst) {
  auto env = MakeEnv();
  for (bool priority : {true, false}) {
    SCOPED_TRACE(priority ? "priority" : "fcfs");
    SchedulerOptions o = Small(/*threaded=*/false);
    o.max_running_seqs = 1;
    o.enable_priority = priority;
    auto sched = MakeScheduler(*env, o);
    std::vector<std::string> order;
    std::vector<std::shared_ptr<RecordingSink>> sinks;
    const std::vector<std::pair<std::string, int>> reqs = {
        {"low", 0}, {"mid", 1}, {"high", 5}, {"low2", 0}};
    for (const auto& [id, prio] : reqs) {
      sinks.push_back(std::make_shared<RecordingSink>());
      sinks.back()->on_finish = [&order, id = id](const FinishInfo&) { order.push_back(id); };
      PD_ASSERT_OK(sched->Submit(Req(id, Prompt(4, prio + 20), 2, prio), sinks.back()));
    }
    RunToIdle(*sched);
    if (priority) {
      EXPECT_THAT(order, ElementsAre("high", "mid", "low", "low2"));
    } else {
      EXPECT_THAT(order, ElementsAre("low", "mid", "high", "low2"));
    }
    ExpectAllBlocksFree(*sched);
  }
}

TEST(SchedulerTest, LowerPriorityIsPreemptedFirst) {
  auto env = MakeEnv();
  const GenerationRequest low = Req("low", Prompt(10, 30), 38, 0);
  const GenerationRequest high = Req("high", Prompt(10, 31), 38, 9);
  const auto ref_low = Reference(*env, low), ref_high = Reference(*env, high);
  SchedulerOptions o = Small(/*threaded=*/false);
  o.kv_blocks = 4;  // 64 tokens; each needs 48 (3 blocks)
  auto sched = MakeScheduler(*env, o);
  auto s_low = std::make_shared<RecordingSink>(), s_high = std::make_shared<RecordingSink>();
  PD_ASSERT_OK(sched->Submit(low, s_low));
  sched->Step();                              // low is admitted first...
  PD_ASSERT_OK(sched->Submit(high, s_high));  // ...yet high, admitted later, keeps its KV
  RunToIdle(*sched);
  EXPECT_EQ(s_high->info().timing.preemptions, 0);
  EXPECT_GE(s_low->info().timing.preemptions, 1);
  EXPECT_EQ(s_low->tokens(), ref_low);
  EXPECT_EQ(s_high->tokens(), ref_high);
  ExpectAllBlocksFree(*sched);
}

TEST(SchedulerTest, CancelMidStreamFreesAtOnce) {
  auto env = MakeEnv();
  const GenerationRequest other = Req("other", Prompt(8, 41), 40);
  const auto ref_other = Reference(*env, other);
  auto sched = MakeScheduler(*env, Small());
  absl::Notification third_token, cancelled;
  auto victim = std::make_shared<RecordingSink>();
  victim->on_tokens = [&](int n) {
    if (n == 3) {
      third_token.Notify();
      cancelled.WaitForNotification();  // hold the engine until the other thread cancelled
    }
  };
  int free_at_finish = -1;
  victim->on_finish = [&](const FinishInfo&) { free_at_finish = sched->Load().kv_blocks_free; };
  // A stream that cancels itself from its sink (the engine thread), as a stop-string match does.
  auto self = std::make_shared<RecordingSink>();
  self->on_tokens = [&](int n) {
    if (n == 2) sched->Cancel("self", FinishReason::kStop);
  };
  auto other_sink = std::make_shared<RecordingSink>();
  PD_ASSERT_OK(sched->Submit(Req("victim", Prompt(100, 40), 150), victim));
  PD_ASSERT_OK(sched->Submit(Req("self", Prompt(5, 42), 200), self));
  PD_ASSERT_OK(sched->Submit(other, other_sink));
  ASSERT_TRUE(third_token.WaitForNotificationWithTimeout(absl::Seconds(60)));
  sched->Cancel("victim");
  sched->Cancel("no-such-request");  // no-op
  cancelled.Notify();
  ASSERT_TRUE(victim->WaitFinished());
  EXPECT_EQ(victim->info().reason, FinishReason::kCancelled);
  EXPECT_EQ(victim->info().completion_tokens, 3);
  ASSERT_TRUE(self->WaitFinished());
  EXPECT_EQ(self->info().reason, FinishReason::kStop);
  EXPECT_EQ(self->info().completion_tokens, 2);
  ASSERT_TRUE(other_sink->WaitFinished());
  EXPECT_EQ(other_sink->tokens(), ref_other);
  // The victim's 7 blocks were back before its OnFinish; only "other" (at most 3 blocks) and
  // "self" (1) could still hold some then.
  EXPECT_GE(free_at_finish, sched->kv_blocks_total() - 4);
  ExpectAllBlocksFree(*sched);
}

TEST(SchedulerTest, CancelWhileWaiting) {
  auto env = MakeEnv();
  SchedulerOptions o = Small(/*threaded=*/false);
  o.max_running_seqs = 1;
  auto sched = MakeScheduler(*env, o);
  auto a = std::make_shared<RecordingSink>(), b = std::make_shared<RecordingSink>();
  PD_ASSERT_OK(sched->Submit(Req("a", Prompt(4, 1), 10), a));
  PD_ASSERT_OK(sched->Submit(Req("b", Prompt(4, 2), 10), b));
  sched->Step();
  EXPECT_EQ(sched->Load().running, 1);
  EXPECT_EQ(sched->Load().waiting, 1);
  sched->Cancel("b");
  const StepStats s = sched->Step();
  ASSERT_TRUE(b->finished());
  EXPECT_EQ(b->info().reason, FinishReason::kCancelled);
  EXPECT_EQ(b->info().completion_tokens, 0);
  EXPECT_EQ(s.load.waiting, 0);
  // The id is free again once finished.
  auto b2 = std::make_shared<RecordingSink>();
  PD_EXPECT_OK(sched->Submit(Req("b", Prompt(4, 2), 1), b2));
  RunToIdle(*sched);
  EXPECT_EQ(a->info().reason, FinishReason::kLength);
  EXPECT_EQ(b2->info().reason, FinishReason::kLength);
  ExpectAllBlocksFree(*sched);
}

TEST(SchedulerTest, DeadlinesEndRequestsAndFreeKv) {
  auto env = MakeEnv();
  auto sched = MakeScheduler(*env, Small());
  GenerationRequest past = Req("past", Prompt(6, 50), 50);
  past.deadline = absl::Now() - absl::Seconds(1);
  GenerationRequest soon = Req("soon", Prompt(6, 51), 200);
  soon.deadline = absl::Now() + absl::Seconds(1);
  auto s_past = std::make_shared<RecordingSink>(), s_soon = std::make_shared<RecordingSink>();
  s_soon->on_tokens = [&](int n) {
    if (n == 1) absl::SleepFor(soon.deadline - absl::Now() + absl::Milliseconds(20));
  };
  PD_ASSERT_OK(sched->Submit(past, s_past));
  PD_ASSERT_OK(sched->Submit(soon, s_soon));
  ASSERT_TRUE(s_past->WaitFinished());
  ASSERT_TRUE(s_soon->WaitFinished());
  EXPECT_EQ(s_past->info().reason, FinishReason::kDeadline);
  EXPECT_EQ(s_past->info().completion_tokens, 0);
  EXPECT_EQ(s_soon->info().reason, FinishReason::kDeadline);
  EXPECT_EQ(s_soon->info().completion_tokens, 1);  // checked at the start of every step
  EXPECT_GE(s_soon->info().timing.finished, soon.deadline);
  ExpectAllBlocksFree(*sched);
}

TEST(SchedulerTest, QueueFullIsResourceExhausted) {
  auto env = MakeEnv();
  SchedulerOptions o = Small(/*threaded=*/false);
  o.max_waiting = 2;
  o.max_running_seqs = 1;
  auto sched = MakeScheduler(*env, o);
  std::vector<std::shared_ptr<RecordingSink>> sinks;
  for (int i = 0; i < 3; ++i) sinks.push_back(std::make_shared<RecordingSink>());
  PD_ASSERT_OK(sched->Submit(Req("q0", Prompt(4, 1), 3), sinks[0]));
  PD_ASSERT_OK(sched->Submit(Req("q1", Prompt(4, 2), 3), sinks[1]));
  EXPECT_THAT(sched->Submit(Req("q2", Prompt(4, 3), 3), sinks[2]),
              StatusIs(absl::StatusCode::kResourceExhausted, "waiting queue is full"));
  EXPECT_EQ(sched->Load().waiting, 2);
  sched->Step();  // q0 runs, q1 waits (one running slot): room for one more
  EXPECT_EQ(sched->Load().waiting, 1);
  PD_EXPECT_OK(sched->Submit(Req("q2", Prompt(4, 3), 3), sinks[2]));
  EXPECT_THAT(sched->Submit(Req("q3", Prompt(4, 4), 3), std::make_shared<RecordingSink>()),
              StatusIs(absl::StatusCode::kResourceExhausted));
  RunToIdle(*sched);
  for (auto& s : sinks) EXPECT_EQ(s->info().reason, FinishReason::kLength);
  ExpectAllBlocksFree(*sched);
}

TEST(SchedulerTest, TotalTokenLimitIsResourceExhausted) {
  auto env = MakeEnv();
  SchedulerOptions o = Small(/*threaded=*/false);
  o.max_context = 64;
  o.max_total_tokens = 100;
  auto sched = MakeScheduler(*env, o);
  auto a = std::make_shared<RecordingSink>(), b = std::make_shared<RecordingSink>();
  PD_ASSERT_OK(sched->Submit(Req("a", Prompt(40, 1), 20), a));  // 60 of 100
  EXPECT_THAT(sched->Submit(Req("b", Prompt(30, 2), 20), b),    // 60 + 50 > 100
              StatusIs(absl::StatusCode::kResourceExhausted, "total-token limit"));
  PD_EXPECT_OK(sched->Submit(Req("c", Prompt(20, 3), 20), std::make_shared<RecordingSink>()));
  RunToIdle(*sched);
  EXPECT_TRUE(a->finished());
  EXPECT_FALSE(b->finished());  // a refused request's sink is never called
  PD_EXPECT_OK(sched->Submit(Req("b", Prompt(30, 2), 20), b));  // the tokens were released
  RunToIdle(*sched);
  EXPECT_EQ(b->info().reason, FinishReason::kLength);
  ExpectAllBlocksFree(*sched);
}

TEST(SchedulerTest, BadRequestsAreInvalidWhileOthersRunUnharmed) {
  auto env = MakeEnv();
  const GenerationRequest good = Req("good", Prompt(12, 60), 30);
  const auto ref = Reference(*env, good);
  auto sched = MakeScheduler(*env, Small());
  absl::Notification started, submitted;
  auto good_sink = std::make_shared<RecordingSink>();
  good_sink->on_tokens = [&](int n) {
    if (n == 1) {
      started.Notify();
      submitted.WaitForNotification();  // keep "good" live while the bad ones arrive
    }
  };
  PD_ASSERT_OK(sched->Submit(good, good_sink));
  ASSERT_TRUE(started.WaitForNotificationWithTimeout(absl::Seconds(60)));

  auto bad_sink = std::make_shared<RecordingSink>();
  auto expect_invalid = [&](GenerationRequest r, const char* field,
                            std::shared_ptr<GenerationSink> sink) {
    EXPECT_THAT(sched->Submit(std::move(r), std::move(sink)),
                StatusIs(absl::StatusCode::kInvalidArgument, field));
  };
  auto r = [&] { return Req("bad", Prompt(4, 61), 4); };
  {
    auto x = r();
    x.id = "";
    expect_invalid(x, "id", bad_sink);
  }
  {
    auto x = r();
    x.prompt.clear();
    expect_invalid(x, "prompt", bad_sink);
  }
  {
    auto x = r();
    x.prompt[1] = kVocab;
    expect_invalid(x, "prompt[1]", bad_sink);
    x.prompt[1] = -3;
    expect_invalid(x, "prompt[1]", bad_sink);
  }
  {
    auto x = r();
    x.max_tokens = 0;
    expect_invalid(x, "max_tokens", bad_sink);
  }
  {
    auto x = r();
    x.max_tokens = sched->max_context();  // + 4 prompt tokens
    expect_invalid(x, "exceeds the context", bad_sink);
  }
  {
    auto x = r();
    x.sampling.temperature = -1;
    expect_invalid(x, "sampling.temperature", bad_sink);
    x = r();
    x.sampling.top_p = 0;
    expect_invalid(x, "sampling.top_p", bad_sink);
  }
  expect_invalid(r(), "sink", nullptr);
  {
    auto x = r();
    x.id = "good";
    expect_invalid(x, "already in use", bad_sink);
  }
  submitted.Notify();
  ASSERT_TRUE(good_sink->WaitFinished());
  EXPECT_EQ(good_sink->tokens(), ref);
  EXPECT_EQ(good_sink->info().reason, FinishReason::kLength);
  EXPECT_EQ(bad_sink->n_tokens(), 0);
  EXPECT_FALSE(bad_sink->finished());
  ExpectAllBlocksFree(*sched);
}

TEST(SchedulerTest, StopTokenEndsWithoutEmittingIt) {
  auto env = MakeEnv();
  GenerationRequest r = Req("s", Prompt(7, 70), 20);
  const auto full = Reference(*env, r);
  ASSERT_GE(full.size(), 6u);
  r.stop_token_ids = {full[5]};
  const auto expected = Reference(*env, r);  // stops at the first occurrence of full[5]
  ASSERT_LE(expected.size(), 5u);
  auto sched = MakeScheduler(*env, Small());
  auto sink = std::make_shared<RecordingSink>();
  PD_ASSERT_OK(sched->Submit(r, sink));
  ASSERT_TRUE(sink->WaitFinished());
  EXPECT_EQ(sink->info().reason, FinishReason::kStop);
  EXPECT_EQ(sink->tokens(), expected);
  ExpectAllBlocksFree(*sched);
}

TEST(SchedulerTest, ShutdownFinishesLiveRequests) {
  auto env = MakeEnv();
  SchedulerOptions o = Small();
  o.max_running_seqs = 2;
  auto sched = MakeScheduler(*env, o);
  absl::Notification first;
  std::vector<std::shared_ptr<RecordingSink>> sinks;
  for (int i = 0; i < 3; ++i) sinks.push_back(std::make_shared<RecordingSink>());
  sinks[0]->on_tokens = [&](int n) {
    if (n == 1) {
      first.Notify();
      absl::SleepFor(absl::Milliseconds(50));  // Shutdown arrives while this step runs
    }
  };
  for (int i = 0; i < 3; ++i) {
    PD_ASSERT_OK(sched->Submit(Req("s" + std::to_string(i), Prompt(5, 80 + i), 200), sinks[i]));
  }
  ASSERT_TRUE(first.WaitForNotificationWithTimeout(absl::Seconds(60)));
  sched->Shutdown();
  for (auto& s : sinks) {
    ASSERT_TRUE(s->finished());  // before Shutdown returned
    EXPECT_EQ(s->info().reason, FinishReason::kError);
    EXPECT_THAT(s->info().status, StatusIs(absl::StatusCode::kUnavailable));
  }
  EXPECT_GE(sinks[0]->n_tokens(), 1);
  EXPECT_EQ(sinks[2]->n_tokens(), 0);  // was waiting for a running slot
  EXPECT_THAT(sched->Submit(Req("late", Prompt(3, 1), 3), std::make_shared<RecordingSink>()),
              StatusIs(absl::StatusCode::kUnavailable));
  ExpectAllBlocksFree(*sched);
  sched->Shutdown();  // idempotent; the destructor calls it again
}

TEST(SchedulerTest, ShutdownWithoutThreadFinishesRunningAndWaiting) {
  auto env = MakeEnv();
  SchedulerOptions o = Small(/*threaded=*/false);
  o.max_running_seqs = 1;
  auto sched = MakeScheduler(*env, o);
  auto a = std::make_shared<RecordingSink>(), b = std::make_shared<RecordingSink>(),
       c = std::make_shared<RecordingSink>();
  PD_ASSERT_OK(sched->Submit(Req("a", Prompt(5, 1), 9), a));
  PD_ASSERT_OK(sched->Submit(Req("b", Prompt(5, 2), 9), b));
  sched->Step();
  PD_ASSERT_OK(sched->Submit(Req("c", Prompt(5, 3), 9), c));  // never pulled by a step
  EXPECT_LT(sched->Load().kv_blocks_free, sched->kv_blocks_total());
  sched->Shutdown();
  for (auto* s : {a.get(), b.get(), c.get()}) {
    ASSERT_TRUE(s->finished());
    EXPECT_THAT(s->info().status, StatusIs(absl::StatusCode::kUnavailable));
  }
  EXPECT_EQ(a->n_tokens(), 1);
  ExpectAllBlocksFree(*sched);
  EXPECT_TRUE(sched->Step().batch.empty());
}

TEST(SchedulerTest, LoadCountsWaitingAndPendingPrefill) {
  auto env = MakeEnv();
  SchedulerOptions o = Small(/*threaded=*/false);
  o.max_running_seqs = 1;
  o.token_budget = 8;
  o.prefill_chunk = 8;
  auto sched = MakeScheduler(*env, o);
  PD_ASSERT_OK(sched->Submit(Req("a", Prompt(20, 1), 2), std::make_shared<RecordingSink>()));
  PD_ASSERT_OK(sched->Submit(Req("b", Prompt(5, 2), 2), std::make_shared<RecordingSink>()));
  EngineLoad load = sched->Load();
  EXPECT_EQ(load.waiting, 2);
  EXPECT_EQ(load.running, 0);
  EXPECT_EQ(load.pending_prefill_tokens, 25);
  const StepStats s = sched->Step();  // a's first chunk of 8
  EXPECT_EQ(s.load.running, 1);
  EXPECT_EQ(s.load.waiting, 1);
  EXPECT_EQ(s.load.pending_prefill_tokens, 17);
  EXPECT_EQ(s.load.kv_blocks_free, s.load.kv_blocks_total - 1);
  load = sched->Load();
  EXPECT_EQ(load.pending_prefill_tokens, 17);
  EXPECT_EQ(load.kv_blocks_free, s.load.kv_blocks_free);
  RunToIdle(*sched);
  ExpectAllBlocksFree(*sched);
}

TEST(SchedulerTest, ManyThreadsSubmitAndCancelConcurrently) {
  auto env = MakeEnv();
  SchedulerOptions o = Small();
  o.kv_blocks = 12;  // tight: preemptions happen too
  auto sched = MakeScheduler(*env, o);
  constexpr int kThreads = 4, kPerThread = 6;
  std::vector<std::shared_ptr<RecordingSink>> sinks(kThreads * kPerThread);
  for (auto& s : sinks) s = std::make_shared<RecordingSink>();
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i) {
        const int k = t * kPerThread + i;
        const std::string id = "t" + std::to_string(k);
        PD_EXPECT_OK(sched->Submit(Req(id, Prompt(5 + k % 20, k), 10 + k % 30), sinks[k]));
        if (k % 3 == 0) sched->Cancel(id);
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int k = 0; k < kThreads * kPerThread; ++k) {
    ASSERT_TRUE(sinks[k]->WaitFinished()) << k;
    const FinishReason r = sinks[k]->info().reason;
    EXPECT_TRUE(r == FinishReason::kLength || (k % 3 == 0 && r == FinishReason::kCancelled))
        << k << " " << FinishReasonName(r);
  }
  ExpectAllBlocksFree(*sched);
}

// AuditKvNow from other threads while the engine thread runs (what Node.Audit calls): every audit
// taken between two steps of a busy, preempting, cancelling scheduler passes, and so does the one
// taken once it is idle, with every block free. After Shutdown it audits directly.
TEST(SchedulerTest, AuditKvNowRunsBetweenStepsWhileBusy) {
  auto env = MakeEnv();
  SchedulerOptions o = Small();
  o.kv_blocks = 12;  // tight: preemptions happen too
  auto sched = MakeScheduler(*env, o);
  constexpr int kRequests = 24;
  std::vector<std::shared_ptr<RecordingSink>> sinks(kRequests);
  std::atomic<bool> submitting{true};
  std::atomic<int> audits{0};
  std::thread auditor([&] {
    while (submitting.load() || audits.load() < 5) {
      PD_EXPECT_OK(sched->AuditKvNow());
      audits.fetch_add(1);
    }
  });
  for (int k = 0; k < kRequests; ++k) {
    sinks[k] = std::make_shared<RecordingSink>();
    const std::string id = "a" + std::to_string(k);
    PD_EXPECT_OK(sched->Submit(Req(id, Prompt(5 + k % 20, k), 10 + k % 30), sinks[k]));
    if (k % 3 == 0) sched->Cancel(id);
  }
  for (auto& sink : sinks) ASSERT_TRUE(sink->WaitFinished());
  submitting.store(false);
  auditor.join();
  EXPECT_GE(audits.load(), 5);
  PD_EXPECT_OK(sched->AuditKvNow());
  ExpectAllBlocksFree(*sched);
  sched->Shutdown();
  PD_EXPECT_OK(sched->AuditKvNow());  // no engine thread: AuditKv itself
}

TEST(FinishReasonTest, Names) {
  EXPECT_STREQ(FinishReasonName(FinishReason::kStop), "stop");
  EXPECT_STREQ(FinishReasonName(FinishReason::kLength), "length");
  EXPECT_STREQ(FinishReasonName(FinishReason::kCancelled), "cancelled");
  EXPECT_STREQ(FinishReasonName(FinishReason::kDeadline), "deadline");
  EXPECT_STREQ(FinishReasonName(FinishReason::kError), "error");
}

}  // namespace
}  // namespace pd::engine
