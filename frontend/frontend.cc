// The local Frontend: validation, chat template, tokenization, submission to the engine, and a
// Stream that turns the engine's token ids back into text.
//
// Data flow of one request: the engine thread calls QueueSink (OnTokens / OnFinish), which only
// appends to the request's StreamQueue under its mutex and returns: the engine never waits on a
// client. The handler thread that owns the LocalStream drains the queue in Next(), detokenizes,
// applies stop strings, records metrics, and cancels the request in the engine when a stop string
// matched or when the stream is dropped.
#include "frontend/frontend.h"

#include <atomic>
#include <cmath>
#include <deque>
#include <optional>
#include <random>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/cord.h"
#include "absl/strings/numbers.h"
#include "absl/synchronization/mutex.h"
#include "common/status.h"
#include "common/strings.h"
#include "common/utf8.h"
#include "engine/sched/stop.h"
#include "engine/tokenizer/tokenizer.h"
#include "frontend/serving_metrics.h"

namespace pd::frontend {

namespace {

using engine::FinishInfo;
using engine::FinishReason;

// What the engine thread hands to the stream. Guarded by its own mutex; the engine side only
// appends and never waits for the consumer.
struct StreamQueue {
  struct Tokens {
    std::vector<int32_t> ids;
    absl::Time arrival;
  };
  absl::Mutex mu;
  std::deque<Tokens> tokens ABSL_GUARDED_BY(mu);
  std::optional<FinishInfo> finish ABSL_GUARDED_BY(mu);
  // Set when the Stream was destroyed before the end: the sink then records the request's end
  // in the metrics itself (nobody else will see its FinishInfo).
  bool abandoned ABSL_GUARDED_BY(mu) = false;
  // Stream::SetNotify's callback: called after each append, outside `mu`.
  std::shared_ptr<const std::function<void()>> notify ABSL_GUARDED_BY(mu);
  ServingMetrics* metrics = nullptr;  // immutable after construction
  // Told when the request stops waiting for its first token. Immutable after construction.
  std::shared_ptr<Admission> admission;
  Admission::Ticket ticket;  // immutable after construction
  std::atomic<bool> left_queue{false};

  void LeaveQueue(absl::Time now, bool served) {
    if (admission != nullptr && !left_queue.exchange(true)) admission->Leave(now, served, ticket);
  }

  bool HasData() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    return !tokens.empty() || finish.has_value();
  }
};

class QueueSink final : public engine::GenerationSink {
 public:
  explicit QueueSink(std::shared_ptr<StreamQueue> q) : q_(std::move(q)) {}
  void OnTokens(const std::vector<int32_t>& tokens) override {
    const absl::Time now = absl::Now();
    q_->LeaveQueue(now, /*served=*/true);
    std::shared_ptr<const std::function<void()>> notify;
    {
      absl::MutexLock lock(&q_->mu);
      q_->tokens.push_back({tokens, now});
      notify = q_->notify;
    }
    if (notify != nullptr) (*notify)();
  }
  void OnFinish(const FinishInfo& info) override {
    q_->LeaveQueue(absl::Now(), /*served=*/false);
    bool abandoned;
    std::shared_ptr<const std::function<void()>> notify;
    {
      absl::MutexLock lock(&q_->mu);
      q_->finish = info;
      abandoned = q_->abandoned;
      notify = q_->notify;
    }
    if (notify != nullptr) (*notify)();
    if (abandoned && q_->metrics != nullptr) {
      // Lock-free counter and histogram updates: cheap enough for the engine thread.
      q_->metrics->RequestFinished(engine::FinishReasonName(info.reason), info.prompt_tokens,
                                   info.completion_tokens, info.cached_tokens, info.timing);
      if (info.reason == FinishReason::kCancelled) {
        q_->metrics->Error(absl::StatusCode::kCancelled);
      } else if (info.reason == FinishReason::kDeadline) {
        q_->metrics->Error(absl::StatusCode::kDeadlineExceeded);
      } else if (info.reason == FinishReason::kError) {
        q_->metrics->Error(info.status.code());
      }
    }
  }

 private:
  std::shared_ptr<StreamQueue> q_;
};

// A request in flight. Owned by one handler thread (not thread safe, except that the engine
// side only touches `queue_`).
class LocalStream final : public Stream {
 public:
  LocalStream(engine::GenerationEngine& engine, const engine::Tokenizer& tokenizer,
              ServingMetrics* metrics, std::string engine_id, std::string request_id,
              std::vector<std::string> stops, std::shared_ptr<StreamQueue> queue)
      : engine_(engine),
        metrics_(metrics),
        engine_id_(std::move(engine_id)),
        request_id_(std::move(request_id)),
        detok_(tokenizer),
        stops_(std::move(stops)),
        queue_(std::move(queue)) {}

  ~LocalStream() override {
    // Unread to the end: the client went away. Free the KV now. The sink may still be called; it
    // only fills a queue that the sink itself keeps alive, and records the end in the metrics.
    std::optional<FinishInfo> finish;
    {
      absl::MutexLock lock(&queue_->mu);
      queue_->notify.reset();
      if (done_) return;
      queue_->abandoned = true;
      finish = queue_->finish;
    }
    if (finish.has_value()) {
      Finish(*finish, nullptr);  // finished already, just not read: count it
    } else {
      engine_.Cancel(engine_id_, FinishReason::kCancelled);
    }
  }

  const std::string& request_id() const override { return request_id_; }

  void Cancel() override {
    if (!done_) engine_.Cancel(engine_id_, FinishReason::kCancelled);
  }

  void SetNotify(std::function<void()> notify) override {
    auto shared = std::make_shared<const std::function<void()>>(std::move(notify));
    bool ready;
    {
      absl::MutexLock lock(&queue_->mu);
      queue_->notify = shared;
      ready = queue_->HasData();
    }
    if (ready) (*shared)();
  }

  bool Next(ApiChunk* chunk, absl::Time deadline) override {
    if (done_) return false;
    ApiChunk out;
    while (true) {
      std::deque<StreamQueue::Tokens> events;
      std::optional<FinishInfo> finish;
      {
        absl::MutexLock lock(&queue_->mu);
        if (!queue_->mu.AwaitWithDeadline(absl::Condition(queue_.get(), &StreamQueue::HasData),
                                          deadline)) {
          break;
        }
        events.swap(queue_->tokens);
        finish = queue_->finish;  // the sink's OnFinish comes last: every token is in `events`
      }
      for (const StreamQueue::Tokens& ev : events) AddTokens(ev, &out);
      if (finish.has_value()) {
        Finish(*finish, &out);
        *chunk = std::move(out);
        return true;
      }
      // Tokens whose text is held back still make a chunk (clients may want the ids); after a
      // stop string only the engine's OnFinish is awaited.
      if (!out.text.empty() || !out.token_ids.empty()) break;
    }
    if (out.text.empty() && out.token_ids.empty()) return false;
    *chunk = std::move(out);
    return true;
  }

 private:
  void AddTokens(const StreamQueue::Tokens& ev, ApiChunk* out) {
    if (metrics_ != nullptr && last_arrival_.has_value() && !ev.ids.empty()) {
      const double gap = absl::ToDoubleSeconds(ev.arrival - *last_arrival_) / ev.ids.size();
      for (size_t i = 0; i < ev.ids.size(); ++i) metrics_->TokenInterval(gap);
    }
    last_arrival_ = ev.arrival;
    for (int32_t id : ev.ids) {
      if (stop_matched_) return;  // generated before the engine saw our Cancel
      out->token_ids.push_back(id);
      out->text += stops_.Push(detok_.Push(id));
      if (stops_.stopped()) {
        stop_matched_ = true;
        engine_.Cancel(engine_id_, FinishReason::kStop);
      }
    }
  }

  // Builds the last chunk into `out` (nullptr: only the metrics) and records the request's end.
  void Finish(const FinishInfo& info, ApiChunk* out_or_null) {
    done_ = true;
    ApiChunk scratch;
    ApiChunk* out = out_or_null != nullptr ? out_or_null : &scratch;
    if (!stop_matched_) {
      out->text += stops_.Push(detok_.Flush());
      if (stops_.stopped()) {
        stop_matched_ = true;
      } else {
        out->text += stops_.Flush();
      }
    }
    out->finished = true;
    out->prompt_tokens = info.prompt_tokens;
    out->completion_tokens = info.completion_tokens;
    out->cached_tokens = info.cached_tokens;
    out->draft_tokens = info.draft_tokens;
    out->accepted_tokens = info.accepted_tokens;
    out->timing = info.timing;
    if (stop_matched_) {
      out->finish_reason = "stop";
    } else {
      switch (info.reason) {
        case FinishReason::kStop:
          out->finish_reason = "stop";
          break;
        case FinishReason::kLength:
          out->finish_reason = "length";
          break;
        case FinishReason::kCancelled:
          out->status = absl::CancelledError("the request was cancelled");
          break;
        case FinishReason::kDeadline:
          out->status = absl::DeadlineExceededError(StrCat(
              "the request's deadline passed after ", info.completion_tokens, " generated tokens"));
          break;
        case FinishReason::kError:
          out->status = info.status.ok()
                            ? absl::InternalError("the engine failed the request without a status")
                            : info.status;
          break;
      }
    }
    if (metrics_ == nullptr) return;
    // Every accepted request ends in exactly one RequestFinished; failures also count as errors.
    metrics_->RequestFinished(
        out->status.ok() ? std::string_view(out->finish_reason)
                         : std::string_view(engine::FinishReasonName(info.reason)),
        info.prompt_tokens, info.completion_tokens, info.cached_tokens, info.timing);
    if (!out->status.ok()) metrics_->Error(out->status.code());
  }

  engine::GenerationEngine& engine_;
  ServingMetrics* const metrics_;
  const std::string engine_id_;
  const std::string request_id_;
  engine::StreamingDetokenizer detok_;
  engine::StopMatcher stops_;
  std::shared_ptr<StreamQueue> queue_;
  std::optional<absl::Time> last_arrival_;
  bool stop_matched_ = false;
  bool done_ = false;
};

absl::Status Invalid(std::string_view field, std::string_view what) {
  return absl::InvalidArgumentError(StrCat(field, ": ", what));
}

absl::Status CheckUtf8(std::string_view field, std::string_view text) {
  if (IsValidUtf8(text)) return absl::OkStatus();
  return Invalid(field, "is not valid UTF-8");
}

class LocalFrontend final : public Frontend {
 public:
  LocalFrontend(FrontendOptions options, engine::GenerationEngine& engine,
                const engine::Tokenizer& tokenizer, engine::ChatTemplateKind chat_template,
                ModelCard model, ServingMetrics* metrics)
      : options_(std::move(options)),
        engine_(engine),
        tokenizer_(tokenizer),
        chat_template_(chat_template),
        model_(std::move(model)),
        metrics_(metrics),
        admission_(std::make_shared<Admission>(options_.admission)),
        id_prefix_(StrCat("pd-", std::random_device{}() & 0xFFFFFF, "-")) {}

  absl::StatusOr<std::unique_ptr<Stream>> Start(const ApiRequest& request) override {
    absl::StatusOr<std::unique_ptr<Stream>> s = StartImpl(request);
    if (!s.ok() && metrics_ != nullptr) metrics_->Error(s.status().code());
    return s;
  }

  std::vector<ModelCard> Models() const override { return {model_}; }

 private:
  absl::Status ValidateSampling(const ApiRequest& r, engine::SamplingParams* p) const {
    *p = options_.default_sampling;
    if (r.temperature) {
      if (!(*r.temperature >= 0) || !std::isfinite(*r.temperature)) {
        return Invalid("temperature", StrCat("must be >= 0, got ", *r.temperature));
      }
      p->temperature = *r.temperature;
    }
    if (r.top_p) {
      if (!(*r.top_p > 0 && *r.top_p <= 1)) {
        return Invalid("top_p", StrCat("must be in (0, 1], got ", *r.top_p));
      }
      p->top_p = *r.top_p;
    }
    if (r.top_k) {
      if (*r.top_k < 0) return Invalid("top_k", StrCat("must be >= 0, got ", *r.top_k));
      p->top_k = *r.top_k;
    }
    if (r.min_p) {
      if (!(*r.min_p >= 0 && *r.min_p <= 1)) {
        return Invalid("min_p", StrCat("must be in [0, 1], got ", *r.min_p));
      }
      p->min_p = *r.min_p;
    }
    if (r.repetition_penalty) {
      if (!(*r.repetition_penalty > 0) || !std::isfinite(*r.repetition_penalty)) {
        return Invalid("repetition_penalty", StrCat("must be > 0, got ", *r.repetition_penalty));
      }
      p->repetition_penalty = *r.repetition_penalty;
    }
    p->seed = r.seed ? *r.seed : (uint64_t{std::random_device{}()} << 32) ^ std::random_device{}();
    return p->Validate();
  }

  absl::StatusOr<std::unique_ptr<Stream>> StartImpl(const ApiRequest& r) {
    if (!r.model.empty() && r.model != model_.id) {
      return absl::NotFoundError(
          StrCat("model '", r.model, "' is not served here (served: '", model_.id, "')"));
    }
    // Before any work on the request: refused here, an overload costs microseconds.
    PD_ASSIGN_OR_RETURN(Admission::Ticket ticket, admission_->Admit(absl::Now()));
    auto queue = std::make_shared<StreamQueue>();
    queue->metrics = metrics_;
    queue->admission = admission_;
    queue->ticket = ticket;
    absl::StatusOr<std::unique_ptr<Stream>> s = Prepare(r, queue);
    if (!s.ok()) queue->LeaveQueue(absl::Now(), /*served=*/false);
    return s;
  }

  // Validates, templates, tokenizes and submits `r`, whose output goes to `queue`.
  absl::StatusOr<std::unique_ptr<Stream>> Prepare(const ApiRequest& r,
                                                  std::shared_ptr<StreamQueue> queue) {
    // Input: exactly one of messages / prompt.
    if (r.prompt.has_value() && !r.messages.empty()) {
      return Invalid("messages", "messages and prompt are both set; give one of them");
    }
    if (!r.prompt.has_value() && r.messages.empty()) {
      return Invalid("messages", "at least one message is required (or give prompt instead)");
    }
    for (size_t i = 0; i < r.messages.size(); ++i) {
      const engine::ChatMessage& m = r.messages[i];
      if (m.role != "system" && m.role != "user" && m.role != "assistant") {
        return Invalid(StrCat("messages[", i, "].role"),
                       StrCat("unknown role '", IsValidUtf8(m.role) ? m.role : "?",
                              "' (system, user or assistant)"));
      }
      PD_RETURN_IF_ERROR(CheckUtf8(StrCat("messages[", i, "].content"), m.content));
    }
    if (r.prompt.has_value()) PD_RETURN_IF_ERROR(CheckUtf8("prompt", *r.prompt));
    // Stop strings.
    if (static_cast<int>(r.stop.size()) > options_.max_stop) {
      return Invalid("stop",
                     StrCat("at most ", options_.max_stop, " stop strings, got ", r.stop.size()));
    }
    for (size_t i = 0; i < r.stop.size(); ++i) {
      const std::string field = StrCat("stop[", i, "]");
      if (r.stop[i].empty()) return Invalid(field, "must not be empty");
      if (static_cast<int>(r.stop[i].size()) > options_.max_stop_bytes) {
        return Invalid(field, StrCat("longer than ", options_.max_stop_bytes, " bytes"));
      }
      PD_RETURN_IF_ERROR(CheckUtf8(field, r.stop[i]));
    }
    if (r.max_tokens.has_value() &&
        (*r.max_tokens < 1 || *r.max_tokens > options_.max_tokens_limit)) {
      return Invalid("max_tokens", StrCat("must be in [1, ", options_.max_tokens_limit, "], got ",
                                          *r.max_tokens));
    }
    engine::GenerationRequest g;
    PD_RETURN_IF_ERROR(ValidateSampling(r, &g.sampling));

    // Prompt text -> token ids.
    std::string text;
    if (r.prompt.has_value()) {
      text = *r.prompt;
    } else {
      absl::StatusOr<std::string> t = ApplyChatTemplate(chat_template_, r.messages, true);
      if (!t.ok()) {
        return absl::InvalidArgumentError(StrCat("messages: ", t.status().message()));
      }
      text = *std::move(t);
    }
    g.prompt = tokenizer_.Encode(text, /*add_special=*/true, /*parse_special=*/true);
    const int n_prompt = static_cast<int>(g.prompt.size());
    const int context = engine_.max_context();
    if (n_prompt == 0) {
      return Invalid(r.prompt.has_value() ? "prompt" : "messages", "is empty after tokenization");
    }
    if (n_prompt >= context) {
      return Invalid(r.prompt.has_value() ? "prompt" : "messages",
                     StrCat("prompt is ", n_prompt, " tokens, context is ", context,
                            " (no room for any output)"));
    }
    if (r.max_tokens.has_value()) {
      if (n_prompt + *r.max_tokens > context) {
        return Invalid("max_tokens", StrCat("prompt is ", n_prompt, " tokens, context is ", context,
                                            ": max_tokens may be at most ", context - n_prompt,
                                            ", got ", *r.max_tokens));
      }
      g.max_tokens = *r.max_tokens;
    } else {
      g.max_tokens = std::min(options_.default_max_tokens, context - n_prompt);
    }
    if (!r.ignore_eos) {
      g.stop_token_ids.insert(tokenizer_.eog_ids().begin(), tokenizer_.eog_ids().end());
    }
    g.priority = r.priority;
    g.speculative = r.speculative;
    g.deadline = r.deadline;
    const uint64_t n = next_id_.fetch_add(1, std::memory_order_relaxed);
    g.id = StrCat(id_prefix_, n);
    std::string request_id = r.request_id.empty() ? g.id : r.request_id;
    if (!IsValidUtf8(request_id)) return Invalid("request_id", "is not valid UTF-8");

    std::string engine_id = g.id;
    PD_RETURN_IF_ERROR(engine_.Submit(std::move(g), std::make_shared<QueueSink>(queue)));
    if (metrics_ != nullptr) metrics_->RequestStarted();
    return std::unique_ptr<Stream>(
        std::make_unique<LocalStream>(engine_, tokenizer_, metrics_, std::move(engine_id),
                                      std::move(request_id), r.stop, std::move(queue)));
  }

  const FrontendOptions options_;
  engine::GenerationEngine& engine_;
  const engine::Tokenizer& tokenizer_;
  const engine::ChatTemplateKind chat_template_;
  const ModelCard model_;
  ServingMetrics* const metrics_;
  const std::shared_ptr<Admission> admission_;  // shared with the sinks, which may outlive us
  const std::string id_prefix_;
  std::atomic<uint64_t> next_id_{0};
};

}  // namespace

std::unique_ptr<Frontend> MakeLocalFrontend(FrontendOptions options,
                                            engine::GenerationEngine& engine,
                                            const engine::Tokenizer& tokenizer,
                                            engine::ChatTemplateKind chat_template, ModelCard model,
                                            ServingMetrics* metrics) {
  return std::make_unique<LocalFrontend>(std::move(options), engine, tokenizer, chat_template,
                                         std::move(model), metrics);
}

namespace {
constexpr char kRetryAfterUrl[] = "type.pdserve.dev/retry_after_s";
}  // namespace

absl::Status OverloadedError(std::string_view message, int retry_after_s) {
  absl::Status s = absl::ResourceExhaustedError(absl::string_view(message.data(), message.size()));
  s.SetPayload(kRetryAfterUrl, absl::Cord(std::to_string(std::max(retry_after_s, 1))));
  return s;
}

int RetryAfterSeconds(const absl::Status& status) {
  const absl::optional<absl::Cord> p = status.GetPayload(kRetryAfterUrl);
  if (!p.has_value()) return 0;
  int s = 0;
  return absl::SimpleAtoi(std::string(*p), &s) && s > 0 ? s : 0;
}

}  // namespace pd::frontend
