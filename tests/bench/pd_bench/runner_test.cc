// The runner against an in-process fake server: request counts, concurrency limits, warm-up,
// per-class arrival processes, deterministic workloads.
#include "bench/pd_bench/runner.h"

#include <algorithm>
#include <map>
#include <set>
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

// A chat server: answers "answer-<id>" in max_tokens chunks, keeps every request's messages, and
// fails the requests whose id is in `fail_ids`.
class ChatFakeClient : public ApiClient {
 public:
  explicit ChatFakeClient(double token_s, std::set<int64_t> fail_ids = {})
      : token_s_(token_s), fail_ids_(std::move(fail_ids)) {}

  absl::StatusOr<std::string> Probe() override { return std::string("fake"); }
  void SetModel(const std::string&) override {}

  void Run(const BenchRequest& request, Clock::time_point origin, RequestRecord* record) override {
    const int now = inflight_.fetch_add(1) + 1;
    int prev = max_inflight_.load();
    while (now > prev && !max_inflight_.compare_exchange_weak(prev, now)) {
    }
    {
      absl::MutexLock lock(&mu_);
      messages_[request.id] = request.messages;
    }
    StreamTimer timer(origin, record);
    timer.Sent();
    if (fail_ids_.count(request.id)) {
      timer.Ended();
      record->error = "UNAVAILABLE";
      inflight_.fetch_sub(1);
      return;
    }
    const std::string answer = "answer-" + std::to_string(request.id);
    for (int i = 0; i < request.max_tokens; ++i) {
      std::this_thread::sleep_for(std::chrono::duration<double>(token_s_));
      timer.Content(1);
      if (request.keep_text && i == 0) record->text += answer;
    }
    timer.Ended();
    record->completion_tokens = request.max_tokens;
    record->prompt_tokens = 10 * static_cast<int>(request.messages.size());
    record->cached_tokens = 10 * static_cast<int>(request.messages.size() - 1);
    record->ok = true;
    inflight_.fetch_sub(1);
  }

  int max_inflight() const { return max_inflight_.load(); }
  std::map<int64_t, std::vector<ChatMessage>> messages() const {
    absl::MutexLock lock(&mu_);
    return messages_;
  }

 private:
  const double token_s_;
  const std::set<int64_t> fail_ids_;
  std::atomic<int> inflight_{0}, max_inflight_{0};
  mutable absl::Mutex mu_;
  std::map<int64_t, std::vector<ChatMessage>> messages_ ABSL_GUARDED_BY(mu_);
};

ConversationOptions Chats(int64_t n, int turns) {
  ConversationOptions c;
  c.conversations = n;
  c.turns = turns;
  c.system_prompts = 2;
  c.system_words = 8;
  c.user_words = LengthDist::Fixed(3);
  c.output = LengthDist::Fixed(2);
  c.seed = 3;
  return c;
}

// The measured records of each conversation, by turn.
std::map<int64_t, std::map<int, const RequestRecord*>> ByConversation(const RunResult& r) {
  std::map<int64_t, std::map<int, const RequestRecord*>> by;
  for (const RequestRecord& rec : r.records) {
    if (!rec.warmup) by[rec.conversation][rec.turn] = &rec;
  }
  return by;
}

TEST(RunnerConversationTest, TurnsSendTheHistoryWithTheAnswersReturned) {
  ChatFakeClient client(0.001);
  RunOptions opts;
  opts.concurrency = 2;
  opts.warmup = 2;
  opts.progress = false;
  const ConversationOptions chats = Chats(5, 3);
  ASSERT_TRUE(ValidateConversationRun(opts, chats).ok());
  const RunResult r = RunConversations(opts, chats, client);
  ASSERT_EQ(r.records.size(), 2u + 5 * 3);
  EXPECT_LE(client.max_inflight(), 2);
  const auto messages = client.messages();
  int warm = 0;
  for (const RequestRecord& rec : r.records) {
    EXPECT_TRUE(rec.ok);
    EXPECT_TRUE(rec.text.empty()) << "kept records drop the text";
    EXPECT_EQ(rec.class_index, 0);
    if (rec.warmup) {
      ++warm;
      EXPECT_EQ(rec.turn, 1);
      // Warm-up conversations have system prompts of their own.
      const std::string& system = messages.at(rec.id)[0].content;
      EXPECT_NE(system, SystemPrompt(chats, 0));
      EXPECT_NE(system, SystemPrompt(chats, 1));
    }
  }
  EXPECT_EQ(warm, 2);
  const auto by = ByConversation(r);
  ASSERT_EQ(by.size(), 5u);
  for (const auto& [conv, turns] : by) {
    ASSERT_EQ(turns.size(), 3u) << conv;
    for (const auto& [turn, rec] : turns) {
      const std::vector<ChatMessage>& m = messages.at(rec->id);
      ASSERT_EQ(m.size(), static_cast<size_t>(2 * turn)) << conv << " " << turn;
      EXPECT_EQ(m[0].content, SystemPrompt(chats, static_cast<int>(conv % 2)));
      EXPECT_EQ(m.back().content, UserMessage(chats, conv, turn));
      EXPECT_EQ(rec->requested_prompt_tokens, 8 + 3 * turn + 2 * (turn - 1));
      if (turn > 1) {
        // The previous turn's messages and its answer as the server returned it.
        const RequestRecord* prev = turns.at(turn - 1);
        const std::vector<ChatMessage>& pm = messages.at(prev->id);
        for (size_t i = 0; i < pm.size(); ++i) EXPECT_EQ(m[i].content, pm[i].content);
        EXPECT_EQ(m[m.size() - 2].role, "assistant");
        EXPECT_EQ(m[m.size() - 2].content, "answer-" + std::to_string(prev->id));
        // Sent after the previous answer.
        EXPECT_GE(rec->send_s + 1e-9, prev->send_s + prev->e2e_s);
      }
    }
  }
  const TurnReport t = SummarizeTurns([&] {
    std::vector<const RequestRecord*> p;
    for (const RequestRecord& rec : r.records) p.push_back(&rec);
    return p;
  }());
  ASSERT_EQ(t.turns.size(), 3u);
  EXPECT_EQ(t.turns[2].requests, 5);
  // The fake reports prompt 10 x messages, cached 10 x (messages - 1): turn 2 has 4 messages.
  EXPECT_DOUBLE_EQ(*t.turns[1].cache_hit_rate, 0.75);
}

TEST(RunnerConversationTest, ThinkTimeSeparatesTurns) {
  ChatFakeClient client(0.0005);
  RunOptions opts;
  opts.concurrency = 3;
  opts.progress = false;
  ConversationOptions chats = Chats(3, 3);
  chats.think_time_ms = 40;
  const RunResult r = RunConversations(opts, chats, client);
  for (const auto& [conv, turns] : ByConversation(r)) {
    ASSERT_EQ(turns.size(), 3u);
    for (int turn = 2; turn <= 3; ++turn) {
      const RequestRecord* prev = turns.at(turn - 1);
      const RequestRecord* rec = turns.at(turn);
      EXPECT_GE(rec->send_s - (prev->send_s + prev->e2e_s), 0.040 - 1e-4) << conv << " " << turn;
      // Due after the think time: no dispatch lag to speak of.
      EXPECT_LT(rec->send_s - rec->scheduled_s, 0.25);
    }
  }
  EXPECT_GE(r.duration_s, 0.08);
}

TEST(RunnerConversationTest, AFailedTurnEndsItsConversation) {
  // Closed loop of one conversation: requests 0, 1 are conversation 0; 2 (its turn 3) fails.
  ChatFakeClient client(0.0001, /*fail_ids=*/{2});
  RunOptions opts;
  opts.concurrency = 1;
  opts.progress = false;
  const RunResult r = RunConversations(opts, Chats(2, 4), client);
  const auto by = ByConversation(r);
  ASSERT_EQ(by.at(0).size(), 3u);
  EXPECT_FALSE(by.at(0).at(3)->ok);
  EXPECT_EQ(by.at(1).size(), 4u);
  EXPECT_EQ(r.records.size(), 7u);
}

TEST(RunnerConversationTest, PoissonConversationsWithAtMostNActive) {
  ChatFakeClient client(0.002);
  RunOptions opts;
  opts.rate = 1000;
  opts.max_inflight = 2;
  opts.progress = false;
  const RunResult r = RunConversations(opts, Chats(6, 2), client);
  EXPECT_EQ(r.records.size(), 12u);
  EXPECT_LE(client.max_inflight(), 2);
  EXPECT_EQ(ByConversation(r).size(), 6u);
}

TEST(RunnerConversationTest, ValidationNamesTheProblem) {
  RunOptions opts;
  opts.concurrency = 1;
  EXPECT_TRUE(ValidateConversationRun(opts, Chats(1, 1)).ok());
  EXPECT_EQ(ValidateConversationRun(opts, Chats(0, 1)).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ValidateConversationRun(opts, Chats(1, 0)).code(), absl::StatusCode::kInvalidArgument);
  opts.rate = 1;
  EXPECT_EQ(ValidateConversationRun(opts, Chats(1, 1)).code(), absl::StatusCode::kInvalidArgument);
  opts.concurrency.reset();
  opts.duration_s = 1;
  EXPECT_TRUE(ValidateConversationRun(opts, Chats(0, 1)).ok());
}

}  // namespace
}  // namespace pd::bench
