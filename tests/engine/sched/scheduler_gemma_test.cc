// The scheduler on the real default model (Gemma 3 270M, Q4_K_M): concurrent greedy streams,
// chunked and batched with each other, give what each gives alone with engine::Generate.
// Labelled slow; skipped when the model file is not installed (scripts/setup.sh fetches it).
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
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

}  // namespace
}  // namespace pd::engine
