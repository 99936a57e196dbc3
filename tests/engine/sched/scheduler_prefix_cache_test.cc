// The scheduler's prefix cache on a tiny random model: with the cache on, every greedy stream is
// bit for bit the one the cache-off scheduler gives (f16, f32 and INT8 KV; F32 and Q8_0 weights;
// chunk and block sizes; shared prefixes running side by side with other requests), hits are
// reported, memory pressure evicts instead of failing, and 10,000 random requests with
// cancellations leave no block behind (the audit and the load gauges agree).
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "common/status_matchers.h"
#include "engine/sched/scheduler.h"
#include "tests/testing/tiny_engine.h"

namespace pd::engine {
namespace {

constexpr int kVocab = 96;  // TinyModelSpec's n_vocab

using Env = testing::TinyEngine;

std::unique_ptr<Env> MakeEnv(DType weights) {
  testing::TinyModelSpec spec;
  spec.type = weights;
  return testing::MakeTinyEngine(spec);
}

std::vector<int32_t> Random(int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> p(n);
  for (int32_t& t : p) t = static_cast<int32_t>(rng() % kVocab);
  return p;
}

std::vector<int32_t> Concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

class Sink : public GenerationSink {
 public:
  void OnTokens(const std::vector<int32_t>& t) override {
    absl::MutexLock l(&mu_);
    tokens_.insert(tokens_.end(), t.begin(), t.end());
  }
  void OnFinish(const FinishInfo& info) override {
    absl::MutexLock l(&mu_);
    EXPECT_FALSE(done_) << "OnFinish twice";
    info_ = info;
    done_ = true;
  }
  std::vector<int32_t> tokens() {
    absl::MutexLock l(&mu_);
    return tokens_;
  }
  FinishInfo info() {
    absl::MutexLock l(&mu_);
    return info_;
  }
  bool done() {
    absl::MutexLock l(&mu_);
    return done_;
  }

 private:
  absl::Mutex mu_;
  std::vector<int32_t> tokens_ ABSL_GUARDED_BY(mu_);
  FinishInfo info_ ABSL_GUARDED_BY(mu_);
  bool done_ ABSL_GUARDED_BY(mu_) = false;
};

GenerationRequest Req(std::string id, std::vector<int32_t> prompt, int max_tokens = 8) {
  GenerationRequest r;
  r.id = std::move(id);
  r.prompt = std::move(prompt);
  r.max_tokens = max_tokens;
  r.sampling = SamplingParams::Greedy();
  return r;
}

// Steps until no request is live and no finished answer waits to be filed
// (prefix_cache.fill_generated).
void RunToIdle(Scheduler& s) {
  for (int i = 0; i < 5000; ++i) {
    const EngineLoad load = s.Load();
    if (load.running == 0 && load.waiting == 0 && load.prefix_fills_pending == 0) return;
    s.Step();
    ASSERT_TRUE(s.AuditKv().ok()) << s.AuditKv();
  }
  FAIL() << "scheduler did not become idle";
}

struct Outcome {
  std::vector<int32_t> tokens;
  FinishInfo info;
};

// A workload where prompts share prefixes in every way a chat server sees: a later request with
// the whole earlier prompt as its prefix (a next turn, which also contains generated tokens), two
// requests with one system prompt running side by side (one admitted while the other's prefix is
// still being computed), a shorter shared prefix, and unrelated prompts in the same batches.
std::map<std::string, Outcome> RunWorkload(Env& env, SchedulerOptions o) {
  o.run_thread = false;
  auto sched = Scheduler::Create(*env.model, o);
  PD_CHECK_OK(sched.status());
  Scheduler& s = **sched;
  std::map<std::string, std::shared_ptr<Sink>> sinks;
  auto submit = [&](GenerationRequest r) {
    auto sink = std::make_shared<Sink>();
    sinks[r.id] = sink;
    PD_CHECK_OK(s.Submit(std::move(r), sink));
  };
  const std::vector<int32_t> system = Random(41, 1);
  submit(Req("a", Concat(system, Random(7, 2))));
  submit(Req("c", Random(30, 3)));
  RunToIdle(s);
  // Turn 2 of "a": its prompt, its answer, a new message.
  submit(
      Req("a2", Concat(Concat(Concat(system, Random(7, 2)), sinks["a"]->tokens()), Random(5, 4))));
  submit(Req("b", Concat(system, Random(13, 5))));
  submit(Req("d", Concat(std::vector<int32_t>(system.begin(), system.begin() + 20), Random(9, 6))));
  s.Step();
  submit(Req("e", Concat(system, Random(3, 7))));  // while b's system prompt is in flight
  submit(Req("f", Random(25, 8)));
  RunToIdle(s);
  std::map<std::string, Outcome> out;
  for (auto& [id, sink] : sinks) {
    EXPECT_TRUE(sink->done()) << id;
    out[id] = Outcome{sink->tokens(), sink->info()};
  }
  const EngineLoad load = s.Load();
  EXPECT_EQ(load.kv_blocks_free, load.kv_blocks_total);
  return out;
}

class PrefixCacheIdentityTest
    : public ::testing::TestWithParam<std::tuple<KvDType, DType, int, int>> {};

TEST_P(PrefixCacheIdentityTest, GreedyStreamsMatchTheCacheOff) {
  const auto [kv_dtype, weights, chunk, block] = GetParam();
  auto env = MakeEnv(weights);
  SchedulerOptions o;
  o.kv_blocks = 256 / block * 4;
  o.block_size = block;
  o.kv_dtype = kv_dtype;
  o.max_running_seqs = 8;
  o.token_budget = 64;
  o.prefill_chunk = chunk;
  o.prefix_cache.enabled = false;
  const auto off = RunWorkload(*env, o);
  o.prefix_cache.enabled = true;
  o.prefix_cache.fill_generated = true;
  const auto on = RunWorkload(*env, o);
  ASSERT_EQ(on.size(), off.size());
  for (const auto& [id, r] : off) {
    const Outcome& c = on.at(id);
    EXPECT_EQ(c.tokens, r.tokens) << id;
    EXPECT_EQ(c.info.reason, r.info.reason) << id;
    EXPECT_EQ(r.info.cached_tokens, 0) << id;
  }
  // What the cache must have found (whole blocks of the prompt interior, docs/kv_cache.md):
  // "a" filed the blocks within its first 48 - 48 % 4 = 48 tokens, i.e. floor(48 / block) of
  // them, and the idle engine's fill of its 48 + 8 tokens those within 56 (fill_generated): a2
  // finds its answer too; its system prompt is 41 tokens.
  const int system_blocks = 41 / block * block;
  EXPECT_EQ(on.at("a").info.cached_tokens, 0);
  EXPECT_EQ(on.at("c").info.cached_tokens, 0);
  EXPECT_GE(on.at("a2").info.cached_tokens, 56 / block * block);
  EXPECT_GE(on.at("b").info.cached_tokens, system_blocks);
  EXPECT_GE(on.at("e").info.cached_tokens, system_blocks);
  EXPECT_EQ(on.at("d").info.cached_tokens, 20 / block * block);
}

INSTANTIATE_TEST_SUITE_P(KvTypesChunksBlocks, PrefixCacheIdentityTest,
                         ::testing::Combine(::testing::Values(KvDType::kF16, KvDType::kF32,
                                                              KvDType::kI8),
                                            ::testing::Values(DType::kF32, DType::kQ8_0),
                                            ::testing::Values(5, 16, 64), ::testing::Values(4, 16)),
                         [](const auto& info) {
                           return std::string(KvDTypeName(std::get<0>(info.param))) + "_" +
                                  (std::get<1>(info.param) == DType::kF32 ? "f32w" : "q8w") +
                                  "_chunk" + std::to_string(std::get<2>(info.param)) + "_block" +
                                  std::to_string(std::get<3>(info.param));
                         });

// A KV budget that holds two or three prompts: with the cache on, the same requests finish the
// same way (eviction before refusal), and evictions are counted.
TEST(PrefixCacheTest, PressureEvictsInsteadOfFailing) {
  auto env = MakeEnv(DType::kF32);
  SchedulerOptions o;
  o.kv_blocks = 24;  // 96 tokens of 4
  o.block_size = 4;
  o.max_running_seqs = 4;
  o.token_budget = 32;
  o.prefill_chunk = 16;
  o.run_thread = false;
  std::map<std::string, Outcome> result[2];
  int64_t evictions = 0;
  for (int on = 0; on < 2; ++on) {
    o.prefix_cache.enabled = on == 1;
    auto sched = Scheduler::Create(*env->model, o);
    PD_ASSERT_OK(sched);
    Scheduler& s = **sched;
    std::map<std::string, std::shared_ptr<Sink>> sinks;
    for (int round = 0; round < 3; ++round) {
      for (int i = 0; i < 6; ++i) {
        const std::string id = "r" + std::to_string(round) + "_" + std::to_string(i);
        auto sink = std::make_shared<Sink>();
        sinks[id] = sink;
        // Six prompts of 30-40 tokens, repeated each round: more than the cache can keep.
        PD_ASSERT_OK(s.Submit(Req(id, Random(30 + i * 2, 100 + i), 6), sink));
      }
      RunToIdle(s);
    }
    for (auto& [id, sink] : sinks) result[on][id] = Outcome{sink->tokens(), sink->info()};
    const EngineLoad load = s.Load();
    EXPECT_EQ(load.kv_blocks_free, load.kv_blocks_total);
    if (on == 1) {
      evictions = load.prefix_cache_evictions;
      EXPECT_GT(load.prefix_cache_hit_tokens, 0);
      EXPECT_EQ(load.prefix_cache_query_tokens, [] {
        int64_t n = 0;
        for (int i = 0; i < 6; ++i) n += 30 + i * 2;
        return 3 * n;
      }());
    }
  }
  EXPECT_GT(evictions, 0);
  for (const auto& [id, r] : result[0]) {
    EXPECT_EQ(result[1][id].tokens, r.tokens) << id;
    EXPECT_EQ(result[1][id].info.reason, r.info.reason) << id;
    EXPECT_TRUE(r.info.status.ok()) << id;
    EXPECT_TRUE(result[1][id].info.status.ok()) << id;
  }
}

// compress_idle_ms: blocks left idle are compressed by the engine's steps, the next request with
// that prefix expands them (reported as cached), and the bookkeeping holds. The hit is INT8-lossy,
// so its tokens are not compared with the cache-off run; they must still be a full answer.
TEST(PrefixCacheTest, IdleBlocksAreCompressedAndExpandedByTheNextHit) {
  auto env = MakeEnv(DType::kF32);
  SchedulerOptions o;
  o.kv_blocks = 32;
  o.block_size = 4;
  o.run_thread = false;
  o.prefix_cache.compress_idle_ms = 1;
  auto sched = Scheduler::Create(*env->model, o);
  PD_ASSERT_OK(sched);
  Scheduler& s = **sched;
  const std::vector<int32_t> system = Random(40, 31);
  auto first = std::make_shared<Sink>();
  PD_ASSERT_OK(s.Submit(Req("a", Concat(system, Random(5, 32)), 4), first));
  RunToIdle(s);
  absl::SleepFor(absl::Milliseconds(5));
  s.Step();  // nothing to run: the step compresses what has been idle for 1 ms
  EngineLoad load = s.Load();
  EXPECT_EQ(load.kv_blocks_compressed, 11);  // 45 tokens: rows below 44 in blocks of 4
  EXPECT_EQ(load.kv_blocks_free, load.kv_blocks_total);
  PD_EXPECT_OK(s.AuditKv());
  auto second = std::make_shared<Sink>();
  PD_ASSERT_OK(s.Submit(Req("b", Concat(system, Random(6, 33)), 4), second));
  RunToIdle(s);
  ASSERT_TRUE(second->done());
  EXPECT_TRUE(second->info().status.ok());
  EXPECT_EQ(second->tokens().size(), 4u);
  EXPECT_EQ(second->info().cached_tokens, 40);
  load = s.Load();
  EXPECT_LT(load.kv_blocks_compressed, 11);  // the shared 10 blocks were expanded
  EXPECT_EQ(load.kv_blocks_free, load.kv_blocks_total);
  PD_EXPECT_OK(s.AuditKv());
  o.prefix_cache.compress_idle_ms = -1;
  EXPECT_THAT(o.Validate(), ::pd::testing::StatusIs(absl::StatusCode::kInvalidArgument,
                                                    "prefix_cache.compress_idle_ms"));
}

// With its own thread, an idle engine wakes to compress (no request needs to arrive).
TEST(PrefixCacheTest, AnIdleEngineThreadCompressesOnItsOwn) {
  auto env = MakeEnv(DType::kF32);
  SchedulerOptions o;
  o.kv_blocks = 32;
  o.block_size = 4;
  o.prefix_cache.compress_idle_ms = 20;
  auto sched = Scheduler::Create(*env->model, o);
  PD_ASSERT_OK(sched);
  auto sink = std::make_shared<Sink>();
  PD_ASSERT_OK((*sched)->Submit(Req("a", Random(33, 41), 3), sink));
  const absl::Time end = absl::Now() + absl::Seconds(5);
  while ((*sched)->Load().kv_blocks_compressed < 8 && absl::Now() < end) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  EXPECT_TRUE(sink->done());
  EXPECT_EQ((*sched)->Load().kv_blocks_compressed, 8);  // 33 tokens: rows below 32
}

// prefix_cache.fill_generated: an idle engine files a finished answer's blocks with a fill
// (an internal prefill of prompt + answer); a client's Cancel of a request whose id looks like a
// fill's ends that request, never the fill; the next turn finds the answer; a fill in progress
// gives way to the next request at once and leaves no block behind.
TEST(PrefixCacheTest, FillsFileAnswersAndYieldToRequests) {
  auto env = MakeEnv(DType::kF32);
  SchedulerOptions o;
  o.kv_blocks = 64;
  o.block_size = 4;
  o.max_running_seqs = 4;
  o.token_budget = 8;  // a fill of 12 new tokens takes two steps
  o.prefill_chunk = 8;
  o.run_thread = false;
  o.prefix_cache.fill_generated = true;
  auto sched = Scheduler::Create(*env->model, o);
  PD_ASSERT_OK(sched);
  Scheduler& s = **sched;
  const std::vector<int32_t> prompt = Random(40, 51);
  auto a = std::make_shared<Sink>();
  PD_ASSERT_OK(s.Submit(Req("a", prompt, 12), a));
  for (int i = 0; i < 200 && !a->done(); ++i) s.Step();
  ASSERT_TRUE(a->done());
  EXPECT_EQ(s.Load().prefix_fills_pending, 1);  // 52 tokens would file 13 blocks, the prompt 10
  s.Step();                                     // idle: the fill starts (40 cached, 8 of 12)
  EngineLoad load = s.Load();
  EXPECT_EQ(load.prefix_fills_pending, 1);
  EXPECT_EQ(load.running + load.waiting, 0);  // a fill is not load
  auto c = std::make_shared<Sink>();
  PD_ASSERT_OK(s.Submit(Req("prefix-fill-0", Random(9, 52), 4), c));
  s.Cancel("prefix-fill-0");
  s.Step();  // the client's request ends; the fill (nothing live any more) completes
  ASSERT_TRUE(c->done());
  EXPECT_EQ(c->info().reason, FinishReason::kCancelled);
  EXPECT_EQ(s.Load().prefix_fills_pending, 0);
  EXPECT_EQ(s.Load().prefix_fill_tokens, 12);  // 52 tokens, the prompt's 40 cached
  auto b = std::make_shared<Sink>();
  PD_ASSERT_OK(s.Submit(Req("b", Concat(Concat(prompt, a->tokens()), Random(3, 53)), 2), b));
  RunToIdle(s);
  ASSERT_TRUE(b->done());
  EXPECT_EQ(b->info().cached_tokens, 52);  // the prompt's 10 blocks and the answer's 3
  // b's own fill (57 tokens) is done; a fill in progress yields to the next request.
  auto d = std::make_shared<Sink>();
  PD_ASSERT_OK(s.Submit(Req("d", Random(30, 54), 9), d));
  RunToIdle(s);
  ASSERT_TRUE(d->done());
  ASSERT_EQ(s.Load().prefix_fills_pending, 0);
  auto e = std::make_shared<Sink>();
  PD_ASSERT_OK(s.Submit(Req("e", Random(40, 55), 12), e));
  for (int i = 0; i < 200 && !e->done(); ++i) s.Step();
  s.Step();  // e's fill starts
  EXPECT_EQ(s.Load().prefix_fills_pending, 1);
  auto f = std::make_shared<Sink>();
  PD_ASSERT_OK(s.Submit(Req("f", Random(20, 56), 2), f));
  s.Step();
  EXPECT_EQ(s.Load().prefix_fills_pending, 0);  // dropped at f's arrival
  RunToIdle(s);
  ASSERT_TRUE(f->done());
  EXPECT_TRUE(f->info().status.ok());
  load = s.Load();
  EXPECT_EQ(load.kv_blocks_free, load.kv_blocks_total);
  PD_EXPECT_OK(s.AuditKv());
}

// 10,000 random requests over a few shared prefixes, a KV budget small enough for preemption and
// eviction, random cancellations (waiting, prefilling and decoding): after every step the audit
// holds; at the end every block is free or cached and unused, and the published load agrees.
TEST(PrefixCacheTest, TenThousandRandomRequestsLeaveNoBlockBehind) {
  auto env = MakeEnv(DType::kF32);
  SchedulerOptions o;
  o.kv_blocks = 40;
  o.block_size = 4;
  o.max_running_seqs = 6;
  o.max_waiting = 64;
  o.token_budget = 24;
  o.prefill_chunk = 8;
  o.run_thread = false;
  auto sched = Scheduler::Create(*env->model, o);
  PD_ASSERT_OK(sched);
  Scheduler& s = **sched;
  std::mt19937 rng(11);
  const std::vector<std::vector<int32_t>> prefixes = {Random(24, 21), Random(13, 22),
                                                      Random(33, 23), Random(9, 24)};
  std::vector<std::pair<std::string, std::shared_ptr<Sink>>> live;
  int submitted = 0, cancelled = 0, finished = 0;
  while (submitted < 10000 || !live.empty()) {
    const int arrivals = submitted < 10000 ? static_cast<int>(rng() % 3) : 0;
    for (int i = 0; i < arrivals; ++i) {
      std::vector<int32_t> prompt = prefixes[rng() % prefixes.size()];
      const std::vector<int32_t> tail = Random(1 + static_cast<int>(rng() % 10), rng());
      prompt.insert(prompt.end(), tail.begin(), tail.end());
      auto sink = std::make_shared<Sink>();
      const std::string id = "q" + std::to_string(submitted);
      if (s.Submit(Req(id, std::move(prompt), 1 + static_cast<int>(rng() % 6)), sink).ok()) {
        live.emplace_back(id, sink);
      }
      ++submitted;
    }
    if (!live.empty() && rng() % 4 == 0) {
      s.Cancel(live[rng() % live.size()].first);
      ++cancelled;
    }
    s.Step();
    const absl::Status audit = s.AuditKv();
    ASSERT_TRUE(audit.ok()) << audit << " after " << submitted << " requests";
    for (size_t i = 0; i < live.size();) {
      if (live[i].second->done()) {
        const FinishInfo info = live[i].second->info();
        EXPECT_TRUE(info.status.ok()) << live[i].first << ": " << info.status;
        ++finished;
        live[i] = std::move(live.back());
        live.pop_back();
      } else {
        ++i;
      }
    }
  }
  const EngineLoad load = s.Load();
  EXPECT_EQ(load.kv_blocks_free, load.kv_blocks_total);
  EXPECT_EQ(load.running, 0);
  EXPECT_EQ(load.waiting, 0);
  EXPECT_GT(load.prefix_cache_hit_tokens, 0);
  EXPECT_GT(load.prefix_cache_evictions, 0);
  EXPECT_GT(load.kv_blocks_cached, 0);
  ASSERT_NE(load.cached_block_hashes, nullptr);
  EXPECT_GT(cancelled, 1000);
  EXPECT_GT(finished, 9000);
  PD_EXPECT_OK(s.AuditKv());
}

}  // namespace
}  // namespace pd::engine
