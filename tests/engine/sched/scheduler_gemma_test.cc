// The scheduler on the real default model (Gemma 3 270M, Q4_K_M): concurrent greedy streams,
// chunked and batched with each other, give what each gives alone with engine::Generate.
// Labelled slow; skipped when the model file is not installed (scripts/setup.sh fetches it).
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/status.h"
#include "common/status_matchers.h"
#include "engine/model/model_finder.h"
#include "engine/sched/generate.h"
#include "engine/sched/scheduler.h"

namespace pd::engine {
namespace {

class Sink : public GenerationSink {
 public:
  void OnTokens(const std::vector<int32_t>& t) override {
    absl::MutexLock l(&mu_);
    tokens_.insert(tokens_.end(), t.begin(), t.end());
  }
  void OnFinish(const FinishInfo& info) override {
    absl::MutexLock l(&mu_);
    info_ = info;
    done_ = true;
  }
  std::vector<int32_t> Wait(FinishInfo* info) {
    absl::MutexLock l(&mu_);
    mu_.Await(absl::Condition(&done_));
    *info = info_;
    return tokens_;
  }

 private:
  absl::Mutex mu_;
  std::vector<int32_t> tokens_ ABSL_GUARDED_BY(mu_);
  FinishInfo info_ ABSL_GUARDED_BY(mu_);
  bool done_ ABSL_GUARDED_BY(mu_) = false;
};

TEST(SchedulerGemmaTest, ConcurrentGreedyStreamsMatchGenerateAlone) {
  auto path = FindDefaultModel();
  PD_ASSERT_OK(path);  // scripts/setup.sh assembles the default model into models/
  auto file = GgufFile::Open(*path);
  PD_ASSERT_OK(file);
  auto backend = CreateCpuBackend();
  auto model = Model::Load(std::shared_ptr<const GgufFile>(std::move(*file)), *backend);
  PD_ASSERT_OK(model);

  // Gemma token ids: <bos> (2) then ordinary vocabulary pieces; lengths straddle the chunk.
  std::vector<GenerationRequest> reqs(3);
  const int lens[] = {5, 37, 70};
  for (int i = 0; i < 3; ++i) {
    reqs[i].id = "g" + std::to_string(i);
    reqs[i].prompt.push_back(2);
    for (int k = 1; k < lens[i]; ++k) reqs[i].prompt.push_back(1000 + 37 * k + 101 * i);
    reqs[i].max_tokens = 12;
    reqs[i].sampling = SamplingParams::Greedy();
  }
  std::vector<std::vector<int32_t>> expected;
  for (const auto& r : reqs) {
    auto kv = KvCache::Create((*model)->KvOptions(16, KvDType::kF16, 16), *backend);
    PD_ASSERT_OK(kv);
    GenerateOptions o;
    o.max_tokens = r.max_tokens;
    o.sampling = r.sampling;
    auto g = Generate(**model, **kv, 0, r.prompt, o, nullptr);
    PD_ASSERT_OK(g);
    expected.push_back(g->tokens);
  }

  SchedulerOptions o;
  o.kv_blocks = 32;
  o.token_budget = 32;
  o.prefill_chunk = 24;
  auto sched = Scheduler::Create(**model, o);
  PD_ASSERT_OK(sched);
  std::vector<std::shared_ptr<Sink>> sinks;
  for (const auto& r : reqs) {
    sinks.push_back(std::make_shared<Sink>());
    PD_ASSERT_OK((*sched)->Submit(r, sinks.back()));
  }
  for (int i = 0; i < 3; ++i) {
    FinishInfo info;
    EXPECT_EQ(sinks[i]->Wait(&info), expected[i]) << reqs[i].id;
    EXPECT_EQ(info.reason, FinishReason::kLength);
  }
  const EngineLoad load = (*sched)->Load();
  EXPECT_EQ(load.kv_blocks_free, load.kv_blocks_total);
}

// A chat on the real model, whose Q4_K / Q6_K matmuls take different summation orders for
// different row counts (docs/numerics.md): turn 2 sends turn 1's prompt, its answer and a new
// message; requests with the same system prompt run side by side. With the prefix cache on, every
// greedy stream is the cache-off one, for f16, f32 and INT8 KV and two chunk sizes, the K/V bytes
// of every full prompt block are identical (the stronger check: a greedy token survives a
// last-bit difference that the bytes show), and the cached prefix is reported.
TEST(SchedulerGemmaTest, PrefixCacheKeepsGreedyStreamsBitForBit) {
  auto path = FindDefaultModel();
  PD_ASSERT_OK(path);
  auto file = GgufFile::Open(*path);
  PD_ASSERT_OK(file);
  auto backend = CreateCpuBackend();
  auto model = Model::Load(std::shared_ptr<const GgufFile>(std::move(*file)), *backend);
  PD_ASSERT_OK(model);
  std::vector<int32_t> system = {2};
  for (int k = 1; k < 53; ++k) system.push_back(3000 + 53 * k);
  auto with = [](std::vector<int32_t> a, std::initializer_list<int32_t> b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
  };
  auto run = [&](KvDType dtype, int chunk, bool cache) {
    SchedulerOptions o;
    o.kv_blocks = 64;
    o.kv_dtype = dtype;
    o.token_budget = 64;
    o.prefill_chunk = chunk;
    o.prefix_cache.enabled = cache;
    o.prefix_cache.fill_generated = cache;  // turn 1's answer is filed by a fill, then reused
    auto sched = Scheduler::Create(**model, o);
    PD_CHECK_OK(sched.status());
    auto request = [](std::string id, std::vector<int32_t> prompt) {
      GenerationRequest r;
      r.id = std::move(id);
      r.prompt = std::move(prompt);
      r.max_tokens = 8;
      r.sampling = SamplingParams::Greedy();
      return r;
    };
    std::vector<std::pair<std::vector<int32_t>, FinishInfo>> out;
    // Later prompts' K/V, every layer, full blocks only (the partial block's free slots hold
    // whatever the block held before).
    auto kv_t2 = std::make_shared<std::string>(), kv_other = std::make_shared<std::string>();
    auto capture = [](std::shared_ptr<std::string> kv_bytes) {
      return [kv_bytes](const KvCache& kv, int64_t seq, int layer) {
        auto spans = kv.ExportSpans(seq, layer);
        PD_CHECK_OK(spans.status());
        for (const KvSpan& span : *spans) {
          if (span.block_index + 1 < static_cast<int>(spans->size() / 2)) {
            kv_bytes->append(static_cast<const char*>(span.data), span.bytes);
          }
        }
      };
    };
    auto wait = [&](std::shared_ptr<Sink> sink) {
      FinishInfo info;
      std::vector<int32_t> t = sink->Wait(&info);
      out.emplace_back(t, info);
      return t;
    };
    const std::vector<int32_t> turn1 = with(system, {4000, 4100, 4200, 4300, 4400, 4500, 4600});
    auto s1 = std::make_shared<Sink>();
    PD_CHECK_OK((*sched)->Submit(request("t1", turn1), s1));
    std::vector<int32_t> turn2 = turn1;
    const std::vector<int32_t> answer = wait(s1);
    // The idle engine files turn 1's prompt + answer (68 tokens) before turn 2 arrives.
    for (int i = 0; i < 10000 && (*sched)->Load().prefix_fills_pending > 0; ++i) {
      absl::SleepFor(absl::Milliseconds(1));
    }
    turn2.insert(turn2.end(), answer.begin(), answer.end());
    turn2.insert(turn2.end(), {5000, 5100, 5200, 5300, 5400});
    auto s2 = std::make_shared<Sink>(), s3 = std::make_shared<Sink>();
    PD_CHECK_OK((*sched)->SubmitExport(request("t2", turn2), s2, capture(kv_t2)));
    PD_CHECK_OK((*sched)->SubmitExport(request("other", with(system, {6000, 6100, 6200})), s3,
                                       capture(kv_other)));
    wait(s2);
    wait(s3);
    const std::string kv_bytes = *kv_t2 + *kv_other;
    out.emplace_back(std::vector<int32_t>(kv_bytes.begin(), kv_bytes.end()), FinishInfo{});
    return out;
  };
  for (KvDType dtype : {KvDType::kF16, KvDType::kF32, KvDType::kI8}) {
    for (int chunk : {24, 512}) {
      if (dtype != KvDType::kF16 && chunk != 24) continue;
      const auto off = run(dtype, chunk, false);
      const auto on = run(dtype, chunk, true);
      const std::string where = std::string(KvDTypeName(dtype)) + " chunk " + std::to_string(chunk);
      ASSERT_EQ(on.size(), 4u);
      EXPECT_GT(on[3].first.size(), 0u);
      EXPECT_TRUE(on[3].first == off[3].first) << where << ": K/V bytes differ";
      for (size_t i = 0; i < 3; ++i) {
        EXPECT_EQ(on[i].first, off[i].first) << where << ", request " << i;
        EXPECT_EQ(off[i].second.cached_tokens, 0);
      }
      // Turn 1's 60-token prompt filed its first 3 blocks of 16, the fill of its 68 tokens a
      // fourth (rows below 68 - 68 % 4 = 68): turn 2 (73 tokens) starts after 64, the other
      // prompt (the system prompt and 3 tokens) after 48.
      EXPECT_EQ(on[1].second.cached_tokens, 64) << where;
      EXPECT_EQ(on[2].second.cached_tokens, 48) << where;
    }
  }
}

}  // namespace
}  // namespace pd::engine
