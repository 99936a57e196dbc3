#include "bench/pd_bench/runner.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <list>
#include <memory>
#include <string>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "bench/pd_bench/arrivals.h"
#include "bench/pd_bench/conversation.h"
#include "bench/pd_bench/prompt.h"
#include "common/status.h"
#include "common/strings.h"

namespace pd::bench {
namespace {

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// State shared by every request thread of a run.
class Shared {
 public:
  Shared(const std::vector<WorkloadClass>& classes, ApiClient& client, Clock::time_point origin)
      : classes_(classes), client_(client), origin_(origin) {}

  const std::vector<WorkloadClass>& classes() const { return classes_; }

  // Sends one request and keeps its record. `scheduled` is its Poisson arrival time, if any.
  void Execute(int class_index, const LengthPair& lengths, std::string prompt, bool warmup,
               std::optional<Clock::time_point> scheduled) {
    RequestRecord r;
    r.class_index = class_index;
    r.warmup = warmup;
    r.requested_prompt_tokens = lengths.prompt_tokens;
    r.requested_output_tokens = lengths.output_tokens;
    BenchRequest request;
    request.prompt = std::move(prompt);
    request.max_tokens = lengths.output_tokens;
    Execute(std::move(r), std::move(request), scheduled);
  }

  // Sends `request` (its id assigned here) and keeps `r`, filled in by the client, without its
  // text; returns it with the text. `scheduled`: when the request was due, if not at its send.
  RequestRecord Execute(RequestRecord r, BenchRequest request,
                        std::optional<Clock::time_point> scheduled) {
    r.id = request.id = next_id_.fetch_add(1);
    inflight_.fetch_add(1);
    client_.Run(request, origin_, &r);
    r.scheduled_s = scheduled ? Seconds(*scheduled - origin_) : r.send_s;
    (r.ok ? completed_ : failed_).fetch_add(1);
    inflight_.fetch_sub(1);
    std::string text = std::move(r.text);
    r.text.clear();
    {
      absl::MutexLock lock(&mu_);
      records_.push_back(r);
    }
    r.text = std::move(text);
    return r;
  }

  int64_t inflight() const { return inflight_.load(); }
  int64_t completed() const { return completed_.load(); }
  int64_t failed() const { return failed_.load(); }
  void ResetCounters() {
    completed_ = 0;
    failed_ = 0;
  }
  std::vector<RequestRecord> TakeRecords() {
    absl::MutexLock lock(&mu_);
    return std::move(records_);
  }

 private:
  const std::vector<WorkloadClass>& classes_;
  ApiClient& client_;
  const Clock::time_point origin_;
  std::atomic<int64_t> next_id_{0}, inflight_{0}, completed_{0}, failed_{0};
  absl::Mutex mu_;
  std::vector<RequestRecord> records_ ABSL_GUARDED_BY(mu_);
};

// The requests of one arrival process: the k-th request's class, lengths and prompt depend only on
// (seed, process, k), whatever the timing. Thread safe.
class Source {
 public:
  // `fixed_class` >= 0: every request is of that class; else classes are picked by weight among
  // the shared ones (`all` = among every class, for the warm-up).
  Source(const std::vector<WorkloadClass>& classes, int fixed_class, bool all, uint64_t seed,
         uint64_t process)
      : classes_(classes),
        fixed_class_(fixed_class),
        picker_(Pickable(classes, all)),
        seed_(seed),
        process_(process) {}

  struct Planned {
    int class_index;
    LengthPair lengths;
    std::string prompt;
  };
  Planned Next() {
    std::mt19937_64 rng(MixSeed(seed_, process_, seq_.fetch_add(1)));
    Planned p;
    p.class_index = fixed_class_ >= 0 ? fixed_class_ : picker_.Pick(rng);
    p.lengths = classes_[p.class_index].Draw(rng);
    p.prompt = BuildPrompt(p.lengths.prompt_tokens, rng());
    return p;
  }

 private:
  static std::vector<WorkloadClass> Pickable(const std::vector<WorkloadClass>& classes, bool all) {
    std::vector<WorkloadClass> copy = classes;
    if (all) {
      for (WorkloadClass& c : copy) {
        c.rate.reset();
        c.concurrency.reset();
      }
    }
    return copy;
  }

  const std::vector<WorkloadClass>& classes_;
  const int fixed_class_;
  const ClassPicker picker_;
  const uint64_t seed_, process_;
  std::atomic<uint64_t> seq_{0};
};

// The requests a phase may still send.
class Budget {
 public:
  Budget(int64_t limit, std::optional<Clock::time_point> deadline, const std::atomic<bool>* stop)
      : limit_(limit), deadline_(deadline), stop_(stop) {}

  // Takes one request from the budget; false once it is spent, past the deadline, or stopped.
  bool Claim() {
    if (Stopped() || Expired(Clock::now())) return false;
    return limit_ <= 0 || claimed_.fetch_add(1) < limit_;
  }
  bool Expired(Clock::time_point t) const { return deadline_ && t >= *deadline_; }
  bool Stopped() const { return stop_ != nullptr && stop_->load(); }

 private:
  const int64_t limit_;
  const std::optional<Clock::time_point> deadline_;
  const std::atomic<bool>* stop_;
  std::atomic<int64_t> claimed_{0};
};

// What an arrival process starts: one request, or a whole conversation. A JobSource plans the next
// job (builds its texts) before its arrival time; the job then runs on a request thread, given the
// time it was due (none in a closed loop). A JobSource may be called from several threads at once.
using Job = std::function<void(std::optional<Clock::time_point> scheduled)>;
using JobSource = std::function<Job()>;

JobSource RequestJobs(Shared& shared, Source& source, bool warmup) {
  return [&shared, &source, warmup]() -> Job {
    return [&shared, warmup, p = std::make_shared<Source::Planned>(source.Next())](
               std::optional<Clock::time_point> scheduled) {
      shared.Execute(p->class_index, p->lengths, std::move(p->prompt), warmup, scheduled);
    };
  };
}

void RunClosedLoop(Budget& budget, int concurrency, const JobSource& next) {
  std::vector<std::thread> threads;
  threads.reserve(concurrency);
  for (int i = 0; i < concurrency; ++i) {
    threads.emplace_back([&] {
      while (budget.Claim()) next()(std::nullopt);
    });
  }
  for (std::thread& t : threads) t.join();
}

void RunPoisson(Budget& budget, double rate, std::optional<int> max_inflight, uint64_t seed,
                Clock::time_point start, const JobSource& next_job) {
  struct Worker {
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> done;
  };
  std::list<Worker> workers;
  const auto reap = [&] {
    for (auto it = workers.begin(); it != workers.end();) {
      if (it->done->load()) {
        it->thread.join();
        it = workers.erase(it);
      } else {
        ++it;
      }
    }
  };
  PoissonArrivals arrivals(rate, seed);
  Clock::time_point next = start;
  // Requests of this process started and not yet ended (counted before their thread starts, so
  // that --max-concurrency is never overshot).
  std::atomic<int> outstanding{0};
  while (true) {
    next += std::chrono::duration_cast<Clock::duration>(
        std::chrono::duration<double>(arrivals.NextGap()));
    if (budget.Expired(next) || !budget.Claim()) break;
    // The job (its request, or its conversation's first one) is built before its arrival time, so
    // that its send is not delayed by that.
    Job job = next_job();
    // Sleep in slices so that a stop request is seen promptly.
    while (Clock::now() < next && !budget.Stopped()) {
      std::this_thread::sleep_until(std::min(next, Clock::now() + std::chrono::milliseconds(100)));
    }
    while (max_inflight && outstanding.load() >= *max_inflight && !budget.Stopped()) {
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    if (budget.Stopped() || budget.Expired(Clock::now())) break;
    auto done = std::make_shared<std::atomic<bool>>(false);
    const Clock::time_point scheduled = next;
    outstanding.fetch_add(1);
    workers.push_back(Worker{std::thread([&outstanding, job = std::move(job), done, scheduled] {
                               job(scheduled);
                               outstanding.fetch_sub(1);
                               done->store(true);
                             }),
                             done});
    reap();
  }
  for (Worker& w : workers) w.thread.join();
}

// Prints "[pd-bench] PHASE: done/total done, k in flight, e errors, t s" on stderr: in place
// (carriage return) on a terminal, a line every 10 s otherwise. Owns its thread.
class Progress {
 public:
  Progress(bool enabled, std::string phase, int64_t total, const Shared& shared)
      : enabled_(enabled),
        tty_(isatty(STDERR_FILENO) == 1),
        phase_(std::move(phase)),
        total_(total),
        shared_(shared),
        start_(Clock::now()) {
    if (enabled_) thread_ = std::thread([this] { Loop(); });
  }
  ~Progress() {
    if (!enabled_) return;
    {
      absl::MutexLock lock(&mu_);
      stopping_ = true;
    }
    thread_.join();
    Print(/*final=*/true);
  }

 private:
  void Loop() {
    const absl::Duration period = tty_ ? absl::Milliseconds(250) : absl::Seconds(10);
    absl::MutexLock lock(&mu_);
    while (!mu_.AwaitWithTimeout(absl::Condition(&stopping_), period)) Print(/*final=*/false);
  }
  void Print(bool final) {
    const int64_t done = shared_.completed() + shared_.failed();
    const std::string count = total_ > 0 ? pd::StrCat(done, "/", total_) : pd::StrCat(done);
    char elapsed[32];
    std::snprintf(elapsed, sizeof(elapsed), "%.1f", Seconds(Clock::now() - start_));
    const std::string line =
        pd::StrCat("[pd-bench] ", phase_, ": ", count, " done, ", shared_.inflight(),
                   " in flight, ", shared_.failed(), " errors, ", elapsed, " s");
    if (tty_) {
      std::fprintf(stderr, "\r%-78s%s", line.c_str(), final ? "\n" : "");
    } else {
      std::fprintf(stderr, "%s\n", line.c_str());
    }
    std::fflush(stderr);
  }

  const bool enabled_, tty_;
  const std::string phase_;
  const int64_t total_;
  const Shared& shared_;
  const Clock::time_point start_;
  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

int WarmupConcurrency(const RunOptions& options, const std::vector<WorkloadClass>& classes) {
  int c = 0;
  if (options.concurrency) {
    c = *options.concurrency;
  } else {
    for (const WorkloadClass& k : classes) c += k.concurrency.value_or(0);
  }
  if (c == 0) c = 4;
  return std::max(1, std::min(c, options.warmup));
}

// Sleeps until `t`, in slices so that a stop is seen promptly. False when stopped or past the
// budget's deadline by then.
bool WaitUntil(const Budget& budget, Clock::time_point t) {
  while (Clock::now() < t && !budget.Stopped()) {
    std::this_thread::sleep_until(std::min(t, Clock::now() + std::chrono::milliseconds(100)));
  }
  return !budget.Stopped() && !budget.Expired(Clock::now());
}

// Sends the turns of `conversation` one after another, each after the previous answer and its
// think time (the turn is due then: its `scheduled` time). The first turn is due at `scheduled`.
// Ends early when a turn fails (there is no answer to build the next one on), or when the run is
// stopped or past its deadline.
void RunConversation(Shared& shared, const Budget& budget, const ConversationOptions& options,
                     Conversation& conversation, bool warmup,
                     std::optional<Clock::time_point> scheduled) {
  while (!conversation.finished()) {
    const int turn = conversation.next_turn();
    RequestRecord r;
    r.warmup = warmup;
    r.conversation = conversation.index();
    r.turn = turn;
    r.requested_prompt_tokens = conversation.NextPromptTokens();
    r.requested_output_tokens = TurnMaxTokens(options, conversation.index(), turn);
    BenchRequest request;
    request.messages = conversation.NextMessages();
    request.max_tokens = r.requested_output_tokens;
    request.keep_text = true;
    RequestRecord done = shared.Execute(std::move(r), std::move(request), scheduled);
    if (!done.ok) return;
    conversation.AddAnswer(std::move(done.text), done.OutputTokens());
    if (conversation.finished()) return;
    scheduled = Clock::now() +
                std::chrono::duration_cast<Clock::duration>(
                    std::chrono::duration<double>(ThinkTimeS(options, conversation.index(), turn)));
    if (!WaitUntil(budget, *scheduled)) return;
  }
}

// Conversations 0, 1, ... of `options`, in the order they are asked for.
JobSource ConversationJobs(Shared& shared, const Budget& budget, const ConversationOptions& options,
                           bool warmup, std::atomic<int64_t>& next_index) {
  return [&shared, &budget, &options, warmup, &next_index]() -> Job {
    auto conversation = std::make_shared<Conversation>(options, next_index.fetch_add(1));
    return [&shared, &budget, &options, warmup,
            conversation](std::optional<Clock::time_point> scheduled) {
      RunConversation(shared, budget, options, *conversation, warmup, scheduled);
    };
  };
}

// When a run of --duration stops sending (none without it).
std::optional<Clock::time_point> Deadline(const RunOptions& options, Clock::time_point start) {
  if (options.duration_s <= 0) return std::nullopt;
  return start + std::chrono::duration_cast<Clock::duration>(
                     std::chrono::duration<double>(options.duration_s));
}

}  // namespace

absl::Status ValidateRun(const RunOptions& options, const std::vector<WorkloadClass>& classes) {
  if (classes.empty()) return absl::InvalidArgumentError("the workload has no class");
  if (options.rate && options.concurrency) {
    return absl::InvalidArgumentError("give --rate or --concurrency, not both");
  }
  if (options.rate && !(*options.rate > 0)) return absl::InvalidArgumentError("--rate must be > 0");
  if (options.concurrency && *options.concurrency < 1) {
    return absl::InvalidArgumentError("--concurrency must be >= 1");
  }
  if (options.max_inflight && *options.max_inflight < 1) {
    return absl::InvalidArgumentError("--max-concurrency must be >= 1");
  }
  if (options.num_requests < 0 || options.duration_s < 0 || options.warmup < 0) {
    return absl::InvalidArgumentError("--num-requests, --duration and --warmup must be >= 0");
  }
  if (options.num_requests == 0 && options.duration_s == 0) {
    return absl::InvalidArgumentError("give --num-requests or --duration (or both)");
  }
  const bool any_shared = std::any_of(classes.begin(), classes.end(),
                                      [](const WorkloadClass& c) { return c.shared(); });
  if (!any_shared && (options.rate || options.concurrency)) {
    return absl::InvalidArgumentError(
        "every --mix class has its own rate/concurrency: --rate/--concurrency would drive none");
  }
  return absl::OkStatus();
}

RunResult RunBenchmark(const RunOptions& options, const std::vector<WorkloadClass>& classes,
                       ApiClient& client) {
  PD_CHECK_OK(ValidateRun(options, classes));
  const Clock::time_point origin = Clock::now();
  Shared shared(classes, client, origin);

  if (options.warmup > 0) {
    Source source(classes, -1, /*all=*/true, options.seed, /*process=*/1000);
    Budget budget(options.warmup, std::nullopt, options.stop);
    Progress progress(options.progress, "warm-up", options.warmup, shared);
    RunClosedLoop(budget, WarmupConcurrency(options, classes),
                  RequestJobs(shared, source, /*warmup=*/true));
  }
  shared.ResetCounters();

  const Clock::time_point start = Clock::now();
  const std::optional<Clock::time_point> deadline = Deadline(options, start);
  Budget budget(options.num_requests, deadline, options.stop);
  std::vector<std::unique_ptr<Source>> sources;
  std::vector<std::thread> drivers;
  {
    Progress progress(options.progress, "measured", options.num_requests, shared);
    const auto launch = [&](int fixed_class, std::optional<double> rate,
                            std::optional<int> concurrency, uint64_t process) {
      sources.push_back(
          std::make_unique<Source>(classes, fixed_class, /*all=*/false, options.seed, process));
      Source* source = sources.back().get();
      if (rate) {
        const uint64_t arrival_seed = MixSeed(options.seed, process, 0xa11);
        drivers.emplace_back(
            [&shared, &budget, &options, source, start, rate = *rate, arrival_seed] {
              RunPoisson(budget, rate, options.max_inflight, arrival_seed, start,
                         RequestJobs(shared, *source, /*warmup=*/false));
            });
      } else {
        drivers.emplace_back([&shared, &budget, source, c = concurrency.value_or(1)] {
          RunClosedLoop(budget, c, RequestJobs(shared, *source, /*warmup=*/false));
        });
      }
    };
    if (std::any_of(classes.begin(), classes.end(),
                    [](const WorkloadClass& c) { return c.shared(); })) {
      launch(-1, options.rate, options.concurrency, /*process=*/0);
    }
    for (size_t i = 0; i < classes.size(); ++i) {
      if (!classes[i].shared()) {
        launch(static_cast<int>(i), classes[i].rate, classes[i].concurrency, 1 + i);
      }
    }
    for (std::thread& t : drivers) t.join();
  }
  RunResult result;
  result.duration_s = std::max(Seconds(Clock::now() - start), 1e-9);
  result.records = shared.TakeRecords();
  return result;
}

absl::Status ValidateConversationRun(const RunOptions& options,
                                     const ConversationOptions& conversations) {
  PD_RETURN_IF_ERROR(conversations.Validate());
  if (options.rate && options.concurrency) {
    return absl::InvalidArgumentError("give --rate or --concurrency, not both");
  }
  if (options.rate && !(*options.rate > 0)) return absl::InvalidArgumentError("--rate must be > 0");
  if (options.concurrency && *options.concurrency < 1) {
    return absl::InvalidArgumentError("--concurrency must be >= 1");
  }
  if (options.max_inflight && *options.max_inflight < 1) {
    return absl::InvalidArgumentError("--max-concurrency must be >= 1");
  }
  if (options.duration_s < 0 || options.warmup < 0) {
    return absl::InvalidArgumentError("--duration and --warmup must be >= 0");
  }
  if (conversations.conversations == 0 && options.duration_s == 0) {
    return absl::InvalidArgumentError("give --conversations or --duration (or both)");
  }
  return absl::OkStatus();
}

RunResult RunConversations(const RunOptions& options, const ConversationOptions& conversations,
                           ApiClient& client) {
  PD_CHECK_OK(ValidateConversationRun(options, conversations));
  const Clock::time_point origin = Clock::now();
  const std::vector<WorkloadClass> no_classes;
  Shared shared(no_classes, client, origin);

  if (options.warmup > 0) {
    // One-turn conversations from another seed: their system prompts are not the measured ones,
    // so that those start cold.
    ConversationOptions warm = conversations;
    warm.seed = MixSeed(conversations.seed, 0x3a3, 0);
    warm.turns = 1;
    Budget budget(options.warmup, std::nullopt, options.stop);
    Progress progress(options.progress, "warm-up", options.warmup, shared);
    std::atomic<int64_t> next_index{0};
    const int concurrency = options.concurrency.value_or(options.max_inflight.value_or(4));
    RunClosedLoop(budget, std::max(1, std::min(concurrency, options.warmup)),
                  ConversationJobs(shared, budget, warm, /*warmup=*/true, next_index));
  }
  shared.ResetCounters();

  const Clock::time_point start = Clock::now();
  const std::optional<Clock::time_point> deadline = Deadline(options, start);
  // The budget counts conversations; their turns are sent while it is neither stopped nor past
  // its deadline.
  Budget budget(conversations.conversations, deadline, options.stop);
  std::atomic<int64_t> next_index{0};
  {
    Progress progress(options.progress, "measured",
                      conversations.conversations * conversations.turns, shared);
    const JobSource jobs =
        ConversationJobs(shared, budget, conversations, /*warmup=*/false, next_index);
    if (options.rate) {
      RunPoisson(budget, *options.rate, options.max_inflight, MixSeed(options.seed, 0, 0xa11),
                 start, jobs);
    } else {
      RunClosedLoop(budget, options.concurrency.value_or(1), jobs);
    }
  }
  RunResult result;
  result.duration_s = std::max(Seconds(Clock::now() - start), 1e-9);
  result.records = shared.TakeRecords();
  return result;
}

}  // namespace pd::bench
