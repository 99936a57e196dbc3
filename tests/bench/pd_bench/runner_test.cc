// The runner against an in-process fake server: request counts, concurrency limits, warm-up,
// per-class arrival processes, deterministic workloads.
#include "bench/pd_bench/runner.h"

#include <algorithm>
#include <map>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"

namespace pd::bench {
namespace {

// Streams max_tokens "tokens" with a fixed pause between them; fails every `fail_every`-th call.
class FakeClient : public ApiClient {
 public:
  explicit FakeClient(double token_s, int fail_every = 0)
      : token_s_(token_s), fail_every_(fail_every) {}

  absl::StatusOr<std::string> Probe() override { return std::string("fake"); }
  void SetModel(const std::string&) override {}

  void Run(const BenchRequest& request, Clock::time_point origin, RequestRecord* record) override {
    const int now = inflight_.fetch_add(1) + 1;
    int prev = max_inflight_.load();
    while (now > prev && !max_inflight_.compare_exchange_weak(prev, now)) {
    }
    const int call = calls_.fetch_add(1) + 1;
    {
      absl::MutexLock lock(&mu_);
      prompts_[request.id] = request.prompt;
    }
    StreamTimer timer(origin, record);
    timer.Sent();
    if (fail_every_ > 0 && call % fail_every_ == 0) {
      timer.Ended();
      record->error = "UNAVAILABLE";
      inflight_.fetch_sub(1);
      return;
    }
    for (int i = 0; i < request.max_tokens; ++i) {
      std::this_thread::sleep_for(std::chrono::duration<double>(token_s_));
      timer.Content(1);
    }
    timer.Ended();
    record->completion_tokens = request.max_tokens;
    record->prompt_tokens =
        1 + static_cast<int>(std::count(request.prompt.begin(), request.prompt.end(), ' ')) + 1;
    record->ok = true;
    inflight_.fetch_sub(1);
  }

  int max_inflight() const { return max_inflight_.load(); }
  int calls() const { return calls_.load(); }

 private:
  const double token_s_;
  const int fail_every_;
  std::atomic<int> inflight_{0}, max_inflight_{0}, calls_{0};
  absl::Mutex mu_;
  std::map<int64_t, std::string> prompts_ ABSL_GUARDED_BY(mu_);
};

std::vector<WorkloadClass> Fixed(int prompt, int output) {
  WorkloadClass c;
  c.name = "all";
  c.prompt = LengthDist::Fixed(prompt);
  c.output = LengthDist::Fixed(output);
  return {c};
}

TEST(RunnerTest, ClosedLoopKeepsConcurrencyAndCountsWarmupApart) {
  FakeClient client(0.002);
  RunOptions opts;
  opts.concurrency = 4;
  opts.num_requests = 20;
  opts.warmup = 3;
  opts.progress = false;
  const std::vector<WorkloadClass> classes = Fixed(8, 5);
  const RunResult r = RunBenchmark(opts, classes, client);
  EXPECT_EQ(client.calls(), 23);
  EXPECT_LE(client.max_inflight(), 4);
  EXPECT_EQ(client.max_inflight(), 4);
  ASSERT_EQ(r.records.size(), 23u);
  int warm = 0;
  for (const RequestRecord& rec : r.records) {
    warm += rec.warmup;
    EXPECT_TRUE(rec.ok);
    EXPECT_EQ(rec.OutputTokens(), 5);
    EXPECT_EQ(rec.itl_s.size(), 4u);
    EXPECT_GT(rec.ttft_s, 0);
    EXPECT_GE(rec.e2e_s, rec.ttft_s);
    EXPECT_DOUBLE_EQ(rec.scheduled_s, rec.send_s);
  }
  EXPECT_EQ(warm, 3);
  std::vector<const RequestRecord*> ptrs;
  for (const RequestRecord& rec : r.records) ptrs.push_back(&rec);
  const Summary s = Summarize(ptrs, r.duration_s, Slo());
  EXPECT_EQ(s.completed, 20);
  // Sleeps of 2 ms per token: never less, and not much more unless the machine is swamped.
  EXPECT_GE(s.tpot_ms.p50, 2.0);
  EXPECT_LT(s.tpot_ms.p50, 50.0);
  EXPECT_GT(r.duration_s, 0.02);
}

TEST(RunnerTest, PoissonRateSendsTheRequestedCountAtAboutTheRate) {
  FakeClient client(0.0005);
  RunOptions opts;
  opts.rate = 200;
  opts.num_requests = 100;
  opts.seed = 5;
  opts.progress = false;
  const RunResult r = RunBenchmark(opts, Fixed(4, 2), client);
  ASSERT_EQ(r.records.size(), 100u);
  // 100 arrivals at 200/s take about 0.5 s (the sum of 100 exponential gaps: sd 10%).
  EXPECT_GT(r.duration_s, 0.25);
  EXPECT_LT(r.duration_s, 3.0);
  for (const RequestRecord& rec : r.records) {
    EXPECT_GE(rec.send_s + 1e-9, rec.scheduled_s);
    EXPECT_TRUE(rec.ok);
  }
}

TEST(RunnerTest, MaxInflightCapsAFastPoissonProcess) {
  FakeClient client(0.002);
  RunOptions opts;
  opts.rate = 2000;
  opts.max_inflight = 2;
  opts.num_requests = 20;
  opts.progress = false;
  const RunResult r = RunBenchmark(opts, Fixed(4, 3), client);
  EXPECT_EQ(r.records.size(), 20u);
  EXPECT_LE(client.max_inflight(), 2);
  // Held arrivals show as dispatch lag.
  double max_lag = 0;
  for (const RequestRecord& rec : r.records)
    max_lag = std::max(max_lag, rec.send_s - rec.scheduled_s);
  EXPECT_GT(max_lag, 0.005);
}

TEST(RunnerTest, PerClassProcessesAndDurationLimit) {
  FakeClient client(0.001);
  RunOptions opts;
  opts.duration_s = 0.3;
  opts.progress = false;
  const std::vector<WorkloadClass> classes =
      *ParseMix("decode:prompt=4,output=20,concurrency=3;long:prompt=64,output=2,rate=20");
  const RunResult r = RunBenchmark(opts, classes, client);
  std::map<int, int> per_class;
  for (const RequestRecord& rec : r.records) {
    ++per_class[rec.class_index];
    EXPECT_EQ(rec.requested_output_tokens, rec.class_index == 0 ? 20 : 2);
    // Every request was sent before the deadline.
    EXPECT_LT(rec.send_s, 0.3 + 0.25);
  }
  EXPECT_GE(per_class[0], 3);
  EXPECT_GE(per_class[1], 1);
  EXPECT_LE(client.max_inflight(), 3 + per_class[1]);
}

TEST(RunnerTest, ErrorsAreRecordedByStatus) {
  FakeClient client(0.0001, /*fail_every=*/3);
  RunOptions opts;
  opts.concurrency = 2;
  opts.num_requests = 9;
  opts.progress = false;
  const RunResult r = RunBenchmark(opts, Fixed(2, 2), client);
  std::vector<const RequestRecord*> ptrs;
  for (const RequestRecord& rec : r.records) ptrs.push_back(&rec);
  const Summary s = Summarize(ptrs, r.duration_s, Slo());
  EXPECT_EQ(s.failed, 3);
  EXPECT_EQ(s.errors.at("UNAVAILABLE"), 3);
  EXPECT_EQ(s.completed, 6);
}

TEST(RunnerTest, ValidationNamesTheProblem) {
  const std::vector<WorkloadClass> one = Fixed(1, 1);
  RunOptions both;
  both.rate = 1;
  both.concurrency = 2;
  both.num_requests = 1;
  EXPECT_EQ(ValidateRun(both, one).code(), absl::StatusCode::kInvalidArgument);
  RunOptions unbounded;
  EXPECT_EQ(ValidateRun(unbounded, one).code(), absl::StatusCode::kInvalidArgument);
  RunOptions driving_nothing;
  driving_nothing.rate = 1;
  driving_nothing.num_requests = 1;
  EXPECT_EQ(ValidateRun(driving_nothing, *ParseMix("a:concurrency=1")).code(),
            absl::StatusCode::kInvalidArgument);
  RunOptions fine;
  fine.duration_s = 1;
  EXPECT_TRUE(ValidateRun(fine, one).ok());
}

}  // namespace
}  // namespace pd::bench
