#include "engine/sched/scheduler.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <limits>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "common/log.h"
#include "common/status.h"
#include "common/strings.h"
#include "engine/kv/block_hash.h"

namespace pd::engine {

// A request inside the engine. Owned by waiting_ or running_; touched by the engine thread only.
struct Scheduler::Sequence {
  Sequence(Incoming in, int64_t kv_seq)
      : id(std::move(in.request.id)),
        kv_id(kv_seq),
        sink(std::move(in.sink)),
        tokens(std::move(in.request.prompt)),
        n_prompt(static_cast<int>(tokens.size())),
        order_prompt_len(n_prompt - std::clamp(in.request.resumed_tokens, 0, n_prompt - 1)),
        max_tokens(in.request.max_tokens),
        stop(std::move(in.request.stop_token_ids)),
        priority(in.request.priority),
        deadline(in.request.deadline),
        arrival_order(in.arrival_order),
        export_layer(std::move(in.export_layer)),
        hold_kv(in.hold_kv),
        publish_import(in.publish_import),
        speculative(in.request.speculative),
        sampling(in.request.sampling),
        sampler(in.request.sampling) {
    timing.arrival = in.arrival;
    timing.first_scheduled = absl::InfinitePast();
    timing.first_token = absl::InfinitePast();
    timing.finished = absl::InfinitePast();
  }

  int remaining() const { return static_cast<int>(tokens.size()) - n_computed; }
  // Its next work is one decode token (as opposed to a prompt or recompute chunk).
  bool decoding() const { return n_generated > 0 && remaining() == 1; }

  const std::string id;
  const int64_t kv_id;  // sequence id in the KvCache
  const std::shared_ptr<GenerationSink> sink;
  std::vector<int32_t> tokens;  // prompt + generated: the sampler's history, the recompute input
  const int n_prompt;
  // The prompt length that fixes each row's summation orders (Batch::AddOrdered): n_prompt less
  // the tokens a retried request had already generated elsewhere.
  const int order_prompt_len;
  const int max_tokens;
  const absl::flat_hash_set<int32_t> stop;
  const int priority;
  const absl::Time deadline;
  const int64_t arrival_order;
  const ExportLayer export_layer;  // SubmitExport's hook, or empty
  const bool hold_kv;              // keep the blocks after Finish once exported
  bool exported = false;           // export_layer ran for its prompt
  const bool publish_import;       // SubmitImport(publish): file the imported prompt blocks
  int cached_tokens = 0;           // prompt tokens taken from the prefix cache (until 1st token)
  bool cache_counted = false;      // its prompt was looked up in the prefix cache once
  const bool speculative;          // the request allows speculative decoding
  const SamplingParams sampling;
  Sampler sampler;  // keeps its RNG state across preemptions
  RequestTiming timing;
  // Speculative decoding: this step's draft (its rows follow the fed token in the batch), the
  // sequence's acceptance estimate, and its totals for FinishInfo.
  spec::DraftRequest draft;
  int spec_rows = 0;  // draft tokens in the batch being built (part of `planned`, unless shared)
  // This step verifies a draft made on the target's own cache (SharesTargetKv): its drafted
  // rows are head-only rows, their hidden states in draft.hidden.
  bool shared_draft() const { return spec_rows > 0 && !draft.hidden.empty(); }
  spec::AcceptanceEstimate acceptance;
  double catch_up_debt = 0;  // draft catch-up seconds the gate has not seen yet
  int draft_tokens = 0;
  int accepted_tokens = 0;
  bool fill = false;  // an internal prefill that files a finished request's answer (QueueFill)

  int n_generated = 0;
  int n_computed = 0;      // tokens whose K/V are in the cache
  bool running = false;    // holds KV (in running_)
  bool importing = false;  // holds KV (in importing_), its prompt's K/V arriving from outside
  // importing, host-memory cache: the gate through which another thread writes its blocks; closed
  // (CloseImportFence) before the blocks are freed or the sequence runs
  std::shared_ptr<KvWriteFence> import_fence;
  int64_t admission = -1;  // order of its latest admission
  int64_t preempted_step = -1;
  int planned = 0;  // tokens in the batch being built
  bool planned_prefill = false;
  bool seen_pending = false;  // its prompt (or recompute) counted in the prompt arrival rate
};

struct Scheduler::Event {
  std::shared_ptr<GenerationSink> sink;
  std::vector<int32_t> tokens;  // OnTokens unless finish
  bool finish = false;
  FinishInfo info;
};

absl::Status SchedulerOptions::Validate() const {
  auto bad = [](const char* field, auto value, const char* want) {
    return absl::InvalidArgumentError(
        pd::StrCat("SchedulerOptions.", field, " must be ", want, ", got ", value));
  };
  if (kv_blocks < 0) return bad("kv_blocks", kv_blocks, ">= 0");
  if (kv_blocks == 0 && kv_bytes <= 0) return bad("kv_bytes", kv_bytes, "> 0 when kv_blocks is 0");
  if (block_size < 1) return bad("block_size", block_size, ">= 1");
  if (max_running_seqs < 1) return bad("max_running_seqs", max_running_seqs, ">= 1");
  if (max_waiting < 1) return bad("max_waiting", max_waiting, ">= 1");
  if (max_total_tokens < 0) return bad("max_total_tokens", max_total_tokens, ">= 0");
  if (token_budget < max_running_seqs) {
    return bad("token_budget", token_budget, ">= max_running_seqs");
  }
  if (prefill_chunk < 1) return bad("prefill_chunk", prefill_chunk, ">= 1");
  if (!(step_time_stretch == 0 || step_time_stretch >= 1)) {
    return bad("step_time_stretch", step_time_stretch, "0 (off) or >= 1");
  }
  if (min_prefill_chunk < 1) return bad("min_prefill_chunk", min_prefill_chunk, ">= 1");
  if (prefill_pace_steps < 0) return bad("prefill_pace_steps", prefill_pace_steps, ">= 0");
  if (prompt_rate_steps < 1) return bad("prompt_rate_steps", prompt_rate_steps, ">= 1");
  if (prefix_cache.min_free_blocks < 0) {
    return bad("prefix_cache.min_free_blocks", prefix_cache.min_free_blocks, ">= 0");
  }
  if (prefix_cache.summary_blocks < 0) {
    return bad("prefix_cache.summary_blocks", prefix_cache.summary_blocks, ">= 0");
  }
  if (prefix_cache.compress_idle_ms < 0) {
    return bad("prefix_cache.compress_idle_ms", prefix_cache.compress_idle_ms, ">= 0");
  }
  if (max_context < 0) return bad("max_context", max_context, ">= 0");
  return speculative.Validate();
}

absl::Status SpeculativeOptions::Validate() const {
  auto bad = [](const char* field, auto value, const char* want) {
    return absl::InvalidArgumentError(
        pd::StrCat("SchedulerOptions.speculative.", field, " must be ", want, ", got ", value));
  };
  if (max_k < 0 || max_k > 16) return bad("max_k", max_k, "in [0, 16]");
  if (fixed_k < 0 || fixed_k > max_k) return bad("fixed_k", fixed_k, "in [0, max_k]");
  if (!(min_gain > 0)) return bad("min_gain", min_gain, "> 0");
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Scheduler>> Scheduler::Create(Model& model,
                                                             const SchedulerOptions& options) {
  return CreateImpl(model, nullptr, options);
}

absl::StatusOr<std::unique_ptr<Scheduler>> Scheduler::Create(std::unique_ptr<Model> model,
                                                             const SchedulerOptions& options) {
  if (model == nullptr) return absl::InvalidArgumentError("Scheduler::Create: model is null");
  Model& ref = *model;
  return CreateImpl(ref, std::move(model), options);
}

absl::StatusOr<std::unique_ptr<Scheduler>> Scheduler::CreateImpl(Model& model,
                                                                 std::unique_ptr<Model> owned,
                                                                 const SchedulerOptions& options) {
  PD_RETURN_IF_ERROR(options.Validate());
  KvCacheOptions kvo = model.KvOptions(1, options.kv_dtype, options.block_size);
  kvo.prefix_cache = options.prefix_cache;
  int64_t n_blocks = options.kv_blocks;
  if (n_blocks == 0) {
    const size_t per_block = KvCache::BytesFor(kvo);
    n_blocks = std::min<int64_t>(options.kv_bytes / static_cast<int64_t>(per_block), INT_MAX);
    if (n_blocks < 1) {
      return absl::InvalidArgumentError(pd::StrCat("SchedulerOptions.kv_bytes (", options.kv_bytes,
                                                   ") is below one KV block (", per_block,
                                                   " bytes)"));
    }
  }
  kvo.n_blocks = static_cast<int>(n_blocks);
  PD_ASSIGN_OR_RETURN(std::unique_ptr<KvCache> kv, KvCache::Create(kvo, model.LayerBackends()));
  const int64_t capacity = int64_t{kvo.n_blocks} * kvo.block_size;
  int64_t context = options.max_context > 0 ? options.max_context : model.config().n_ctx_train;
  if (context <= 0) context = capacity;
  context = std::min({context, capacity, int64_t{INT_MAX}});
  if (options.max_total_tokens > 0 && options.max_total_tokens < context) {
    return absl::InvalidArgumentError(pd::StrCat(
        "SchedulerOptions.max_total_tokens (", options.max_total_tokens, ") is below the context (",
        context, " tokens): a full-length request could never run"));
  }
  std::unique_ptr<Scheduler> s(
      new Scheduler(model, std::move(owned), options, std::move(kv), static_cast<int>(context)));
  if (options.speculative.drafter != nullptr && options.speculative.max_k > 0) {
    if (options.speculative.cost.has_value()) {
      s->spec_cost_ = options.speculative.cost;
    } else {
      PD_ASSIGN_OR_RETURN(s->spec_cost_, s->MeasureStepCost());
    }
    if (options.speculative.drafter->SharesTargetKv()) {
      if (options.speculative.head_cost.has_value()) {
        s->spec_head_cost_ = options.speculative.head_cost;
      } else if (options.speculative.cost.has_value()) {
        s->spec_head_cost_ = options.speculative.cost;
      } else {
        const int cap = std::min(64, options.speculative.max_k + 1);
        PD_ASSIGN_OR_RETURN(s->spec_head_cost_,
                            spec::SpecCost::MeasureHead(s->model_, *s->kv_, cap, &s->logits_));
        std::string table;
        for (size_t i = 0; i < s->spec_head_cost_->rows().size(); ++i) {
          table += pd::StrCat(i ? ", " : "", s->spec_head_cost_->rows()[i], ": ",
                              s->spec_head_cost_->seconds()[i] * 1e3, " ms");
        }
        PD_LOG(kInfo, "speculative decoding: one row and the output head over more {", table, "}");
      }
    }
  }
  if (options.run_thread) s->thread_ = std::thread([p = s.get()] { p->Loop(); });
  return s;
}

Scheduler::Scheduler(Model& model, std::unique_ptr<Model> owned, const SchedulerOptions& options,
                     std::unique_ptr<KvCache> kv, int max_context)
    : model_(model),
      owned_model_(std::move(owned)),
      options_(options),
      max_context_(max_context),
      n_vocab_(model.config().n_vocab),
      kv_blocks_total_(kv->total_blocks()),
      block_size_(kv->options().block_size),
      kv_options_(kv->options()),
      kv_(std::move(kv)) {
  absl::MutexLock l(&mu_);
  engine_load_.kv_blocks_total = kv_blocks_total_;
  engine_load_.kv_blocks_free = kv_->free_blocks();
  engine_load_.kv_block_size = block_size_;
}

Scheduler::~Scheduler() { Shutdown(); }

absl::Status Scheduler::ValidateRequest(const GenerationRequest& r,
                                        const GenerationSink* sink) const {
  if (sink == nullptr) return absl::InvalidArgumentError("sink must not be null");
  if (r.id.empty()) return absl::InvalidArgumentError("id must not be empty");
  if (r.prompt.empty()) return absl::InvalidArgumentError("prompt must not be empty");
  for (size_t i = 0; i < r.prompt.size(); ++i) {
    if (r.prompt[i] < 0 || r.prompt[i] >= n_vocab_) {
      return absl::InvalidArgumentError(pd::StrCat("prompt[", i, "] = ", r.prompt[i],
                                                   " is outside the vocabulary of ", n_vocab_,
                                                   " tokens"));
    }
  }
  if (r.max_tokens < 1) {
    return absl::InvalidArgumentError(pd::StrCat("max_tokens must be >= 1, got ", r.max_tokens));
  }
  if (static_cast<int64_t>(r.prompt.size()) + r.max_tokens > max_context_) {
    return absl::InvalidArgumentError(
        pd::StrCat("prompt (", r.prompt.size(), " tokens) + max_tokens (", r.max_tokens,
                   ") exceeds the context of ", max_context_, " tokens"));
  }
  absl::Status s = r.sampling.Validate();
  if (!s.ok()) return absl::InvalidArgumentError(pd::StrCat("sampling.", s.message()));
  return absl::OkStatus();
}

absl::Status Scheduler::Submit(GenerationRequest request, std::shared_ptr<GenerationSink> sink) {
  return Accept(std::move(request), std::move(sink), nullptr);
}

absl::Status Scheduler::SubmitImport(GenerationRequest request,
                                     std::shared_ptr<GenerationSink> sink,
                                     ImportReserved on_reserved, bool publish) {
  if (!on_reserved) return absl::InvalidArgumentError("on_reserved: must not be empty");
  return Accept(std::move(request), std::move(sink), std::move(on_reserved), nullptr, false,
                publish);
}

void Scheduler::PostImport(const std::string& id, ImportTask task) {
  absl::MutexLock l(&mu_);
  import_tasks_.emplace_back(id, std::move(task));
  wake_.Signal();
}

void Scheduler::CompleteImport(const std::string& id, absl::StatusOr<int32_t> first_token) {
  absl::MutexLock l(&mu_);
  import_done_.emplace_back(id, std::move(first_token));
  wake_.Signal();
}

absl::Status Scheduler::SubmitExport(GenerationRequest request,
                                     std::shared_ptr<GenerationSink> sink, ExportLayer on_layer,
                                     bool hold_kv) {
  if (!on_layer) return absl::InvalidArgumentError("on_layer: must not be empty");
  if (hold_kv && request.max_tokens != 1) {
    return absl::InvalidArgumentError(pd::StrCat(
        "hold_kv: the request must end with its prompt (max_tokens 1), not ", request.max_tokens));
  }
  return Accept(std::move(request), std::move(sink), nullptr, std::move(on_layer), hold_kv);
}

void Scheduler::ReleaseExportedKv(int64_t kv_seq) {
  absl::MutexLock l(&mu_);
  releases_.push_back(kv_seq);
  wake_.Signal();
}

int Scheduler::held_exports() const {
  absl::MutexLock l(&mu_);
  return held_published_;
}

void Scheduler::ApplyReleases() {
  std::vector<int64_t> releases;
  {
    absl::MutexLock l(&mu_);
    releases.swap(releases_);
  }
  for (int64_t id : releases) {
    if (held_.erase(id) > 0) kv_->Free(id);
  }
}

absl::Status Scheduler::Accept(GenerationRequest request, std::shared_ptr<GenerationSink> sink,
                               ImportReserved on_reserved, ExportLayer export_layer, bool hold_kv,
                               bool publish_import) {
  PD_RETURN_IF_ERROR(ValidateRequest(request, sink.get()));
  const int64_t total = static_cast<int64_t>(request.prompt.size()) + request.max_tokens;
  absl::MutexLock l(&mu_);
  if (!accepting_) return absl::UnavailableError("the engine is shutting down");
  if (live_.contains(request.id)) {
    return absl::InvalidArgumentError(
        pd::StrCat("id \"", request.id, "\" is already in use by a live request"));
  }
  const int64_t waiting = engine_load_.waiting + static_cast<int64_t>(incoming_.size());
  if (waiting >= options_.max_waiting) {
    return absl::ResourceExhaustedError(
        pd::StrCat("the waiting queue is full (", waiting, " requests)"));
  }
  if (options_.max_total_tokens > 0 && live_tokens_ + total > options_.max_total_tokens) {
    return absl::ResourceExhaustedError(pd::StrCat(
        "total-token limit: live requests hold ", live_tokens_, " of ", options_.max_total_tokens,
        " tokens (prompt + max_tokens), this one needs ", total));
  }
  live_.emplace(request.id, total);
  live_tokens_ += total;
  incoming_prompt_tokens_ += static_cast<int64_t>(request.prompt.size());
  incoming_.push_back(Incoming{std::move(request), std::move(sink), absl::Now(), next_arrival_++,
                               std::move(on_reserved), std::move(export_layer), hold_kv,
                               publish_import});
  wake_.Signal();
  return absl::OkStatus();
}

void Scheduler::Cancel(const std::string& id, FinishReason reason) {
  absl::MutexLock l(&mu_);
  if (!live_.contains(id)) return;
  cancels_.emplace_back(id, reason);
  wake_.Signal();
}

EngineLoad Scheduler::Load() const {
  absl::MutexLock l(&mu_);
  EngineLoad load = engine_load_;
  load.waiting += static_cast<int>(incoming_.size());
  load.pending_prefill_tokens += incoming_prompt_tokens_;
  return load;
}

void Scheduler::Shutdown() {
  absl::MutexLock serial(&shutdown_mu_);
  {
    absl::MutexLock l(&mu_);
    if (shut_down_) return;
    accepting_ = false;
    stop_ = true;
    wake_.Signal();
  }
  if (thread_.joinable()) {
    PD_CHECK_MSG(thread_.get_id() != std::this_thread::get_id(),
                 "Scheduler::Shutdown called from a sink (the engine thread)");
    thread_.join();
  }
  FinishAllUnavailable();
  absl::MutexLock l(&mu_);
  shut_down_ = true;
}

StepStats Scheduler::Step() {
  PD_CHECK_MSG(!options_.run_thread, "Scheduler::Step needs SchedulerOptions.run_thread = false");
  {
    absl::MutexLock l(&mu_);
    if (stop_) return StepStats{};
  }
  return RunStep();
}

void Scheduler::Loop() {
  while (true) {
    bool compress = false;
    {
      absl::MutexLock l(&mu_);
      while (!stop_ && incoming_.empty() && cancels_.empty() && import_tasks_.empty() &&
             import_done_.empty() && releases_.empty() && audits_.empty() && !engine_busy_) {
        // Idle with cached blocks to compress: wake for them (kv_ is this thread's).
        const PrefixCacheStats cache = kv_->prefix_stats();
        // Uncompressed cached blocks (the LRU's blocks, not its compressed entries) wait.
        if (options_.prefix_cache.compress_idle_ms > 0 &&
            cache.evictable_blocks > cache.compressed_blocks) {
          if (!wake_.WaitWithTimeout(
                  &mu_, absl::Milliseconds(std::max(options_.prefix_cache.compress_idle_ms, 10)))) {
            continue;
          }
          compress = kv_->HasIdleBlocks(absl::Now());
          if (compress) break;
        } else {
          wake_.Wait(&mu_);
        }
      }
      if (stop_) {
        for (const auto& a : audits_) {
          a->result = absl::UnavailableError("the scheduler is shutting down");
          a->done = true;
        }
        audits_.clear();
        return;
      }
    }
    RunAudits();
    if (compress) {
      kv_->CompressIdle(absl::Now(), kCompressPerStep);
      Publish(nullptr);
      continue;
    }
    const StepStats stats = RunStep();
    if (stats.batch.empty()) {
      // Live sequences that could not run (should not happen: the first in order can always
      // take blocks from the others). Wait a little rather than spin.
      absl::MutexLock l(&mu_);
      if (!stop_ && incoming_.empty() && cancels_.empty() && import_tasks_.empty() &&
          import_done_.empty() && releases_.empty() && audits_.empty()) {
        wake_.WaitWithTimeout(&mu_, absl::Milliseconds(1));
      }
    }
  }
}

void Scheduler::PullLocked(std::deque<Incoming>* arrived,
                           std::vector<std::pair<std::string, FinishReason>>* cancels) {
  // They stay counted as waiting / pending while the engine thread turns them into Sequences.
  engine_load_.waiting += static_cast<int>(incoming_.size());
  engine_load_.pending_prefill_tokens += incoming_prompt_tokens_;
  incoming_prompt_tokens_ = 0;
  arrived->swap(incoming_);
  cancels->swap(cancels_);
}

void Scheduler::Pull(std::vector<std::pair<std::string, FinishReason>>* cancels) {
  std::deque<Incoming> arrived;
  {
    absl::MutexLock l(&mu_);
    PullLocked(&arrived, cancels);
  }
  for (Incoming& in : arrived) {
    ImportReserved on_reserved = std::move(in.on_reserved);
    auto seq = std::make_unique<Sequence>(std::move(in), next_seq_id_++);
    if (on_reserved) {
      // A lossless import starts after the blocks this node already holds (never the whole
      // prompt: the sender's last block always travels).
      const int hit = seq->publish_import && options_.prefix_cache.enabled
                          ? kv_->MatchPrefix(seq->kv_id, seq->tokens,
                                             std::min(CacheableTokens(*seq), seq->n_prompt - 1))
                          : 0;
      if (kv_->Reserve(seq->kv_id, seq->n_prompt).ok()) {
        seq->importing = true;
        NoteCacheLookup(*seq, hit);
        ImportTarget target;
        target.kv_seq = seq->kv_id;
        target.first_block = hit / block_size_;
        if (kv_->host_memory()) {
          for (int l = 0; l < kv_options_.n_layer; ++l) {
            target.layers.push_back(*kv_->ExportSpans(seq->kv_id, l));  // reserved just now
          }
          target.fence = seq->import_fence = std::make_shared<KvWriteFence>();
        }
        importing_.push_back(std::move(seq));
        on_reserved(std::move(target));
        continue;
      }
      kv_->Free(seq->kv_id);
      on_reserved(absl::ResourceExhaustedError(
          pd::StrCat("no free KV blocks for ", seq->n_prompt, " imported tokens now")));
    }
    InsertWaiting(std::move(seq));
  }
}

bool Scheduler::Before(const Sequence& a, const Sequence& b) const {
  if (options_.enable_priority && a.priority != b.priority) return a.priority > b.priority;
  return a.arrival_order < b.arrival_order;
}

void Scheduler::InsertWaiting(std::unique_ptr<Sequence> seq) {
  auto it = std::upper_bound(waiting_.begin(), waiting_.end(), seq,
                             [this](const std::unique_ptr<Sequence>& a,
                                    const std::unique_ptr<Sequence>& b) { return Before(*a, *b); });
  waiting_.insert(it, std::move(seq));
}

namespace {

// Removes `seq` from `list` and returns its owner (nullptr if absent).
template <typename T>
std::unique_ptr<T> Take(std::vector<std::unique_ptr<T>>& list, const T* seq) {
  for (auto it = list.begin(); it != list.end(); ++it) {
    if (it->get() == seq) {
      std::unique_ptr<T> owned = std::move(*it);
      list.erase(it);
      return owned;
    }
  }
  return nullptr;
}

}  // namespace

void Scheduler::CloseImportFence(Sequence& seq) {
  if (seq.import_fence == nullptr) return;
  seq.import_fence->Close();  // waits for a layer being written into its blocks
  seq.import_fence.reset();
}

void Scheduler::Finish(std::unique_ptr<Sequence> seq, FinishReason reason, absl::Status status) {
  CloseImportFence(*seq);
  if (options_.speculative.drafter != nullptr) options_.speculative.drafter->Release(seq->kv_id);
  if (seq->fill) {  // no caller, no live_ entry: what it computed is filed already
    live_fill_ = nullptr;
    fill_tokens_ += std::max(0, seq->n_computed - seq->cached_tokens);
    kv_->Free(seq->kv_id);
    return;
  }
  if ((reason == FinishReason::kStop || reason == FinishReason::kLength) && status.ok()) {
    QueueFill(*seq);
  }
  gate_debt_ += seq->catch_up_debt;  // the catch-up the gate has not seen yet
  if (seq->hold_kv && seq->exported) {
    held_.insert(seq->kv_id);  // a transport may still be reading them: ReleaseExportedKv
  } else {
    kv_->Free(seq->kv_id);
  }
  seq->timing.finished = absl::Now();
  Event e;
  e.sink = seq->sink;
  e.finish = true;
  e.info.reason = reason;
  e.info.status = std::move(status);
  e.info.prompt_tokens = seq->n_prompt;
  e.info.completion_tokens = seq->n_generated;
  e.info.cached_tokens = seq->cached_tokens;
  e.info.draft_tokens = seq->draft_tokens;
  e.info.accepted_tokens = seq->accepted_tokens;
  e.info.timing = seq->timing;
  events_.push_back(std::move(e));
  finished_ids_.push_back(seq->id);
}

// The running sequence to preempt first: lowest priority (when enabled), then the most recently
// admitted.
Scheduler::Sequence* Scheduler::PickVictim() {
  Sequence* victim = nullptr;
  for (const auto& s : running_) {
    if (victim == nullptr) {
      victim = s.get();
      continue;
    }
    const bool lower = options_.enable_priority && s->priority != victim->priority
                           ? s->priority < victim->priority
                           : s->admission > victim->admission;
    if (lower) victim = s.get();
  }
  return victim;
}

void Scheduler::Preempt(Sequence* victim, StepPlan& plan) {
  std::unique_ptr<Sequence> owned = Take(running_, victim);
  PD_CHECK(owned != nullptr);
  kv_->Free(victim->kv_id);
  plan.budget += victim->planned;  // it leaves the batch being built, if it was in it
  victim->spec_rows = 0;
  victim->draft.draft.clear();
  victim->draft.hidden.clear();
  victim->n_computed = 0;
  victim->running = false;
  victim->admission = -1;
  victim->planned = 0;
  victim->seen_pending = false;  // its recompute is new prompt work
  victim->preempted_step = step_no_;
  ++victim->timing.preemptions;
  ++plan.preemptions;
  InsertWaiting(std::move(owned));
}

std::unique_ptr<Scheduler::Sequence> Scheduler::Remove(Sequence* seq) {
  std::unique_ptr<Sequence> owned = seq->importing ? Take(importing_, seq)
                                    : seq->running ? Take(running_, seq)
                                                   : Take(waiting_, seq);
  PD_CHECK(owned != nullptr);
  return owned;
}

void Scheduler::Intake() {
  ApplyReleases();
  std::vector<std::pair<std::string, FinishReason>> cancels;
  Pull(&cancels);
  for (const auto& [id, reason] : cancels) {
    Sequence* found = nullptr;
    for (const auto* list : {&running_, &waiting_, &importing_}) {
      for (const auto& s : *list) {
        if (s->id == id) found = s.get();
      }
    }
    // Absent: it finished in an earlier step after the Cancel was queued.
    if (found != nullptr) Finish(Remove(found), reason, absl::OkStatus());
  }
  const absl::Time now = absl::Now();
  std::vector<Sequence*> expired;
  for (const auto* list : {&running_, &waiting_, &importing_}) {
    for (const auto& s : *list) {
      if (now >= s->deadline) expired.push_back(s.get());
    }
  }
  for (Sequence* s : expired) Finish(Remove(s), FinishReason::kDeadline, absl::OkStatus());
  RunImports();
}

void Scheduler::AbortImport(Sequence* seq, const absl::Status& why) {
  std::unique_ptr<Sequence> owned = Take(importing_, seq);
  PD_CHECK(owned != nullptr);
  PD_LOG(kWarning, "request ", seq->id, ": KV import failed, prefilling locally: ", why.ToString());
  CloseImportFence(*seq);
  kv_->Free(seq->kv_id);
  seq->importing = false;
  seq->n_computed = 0;
  InsertWaiting(std::move(owned));
}

void Scheduler::RunImports() {
  std::vector<std::pair<std::string, ImportTask>> tasks;
  std::vector<std::pair<std::string, absl::StatusOr<int32_t>>> done;
  {
    absl::MutexLock l(&mu_);
    tasks.swap(import_tasks_);
    done.swap(import_done_);
  }
  auto find = [this](const std::string& id) -> Sequence* {
    for (const auto& s : importing_) {
      if (s->id == id) return s.get();
    }
    return nullptr;
  };
  for (auto& [id, task] : tasks) {
    Sequence* s = find(id);
    if (s == nullptr) continue;
    if (absl::Status st = task(*kv_, s->kv_id); !st.ok()) AbortImport(s, st);
  }
  const absl::Time now = absl::Now();
  for (auto& [id, first] : done) {
    Sequence* s = find(id);
    if (s == nullptr) continue;
    if (!first.ok()) {
      AbortImport(s, first.status());
      continue;
    }
    std::unique_ptr<Sequence> owned = Take(importing_, s);
    CloseImportFence(*s);  // its K/V are in: nothing may write them from now on
    s->importing = false;
    s->n_computed = s->n_prompt;
    s->timing.first_scheduled = now;
    s->timing.kv_imported = true;
    if (s->publish_import) kv_->Publish(s->kv_id, s->tokens, CacheableTokens(*s));
    const int32_t token = *first;
    if (token < 0 || token >= n_vocab_) {
      Finish(std::move(owned), FinishReason::kError,
             absl::InvalidArgumentError(pd::StrCat("first_token: ", token, " is outside the ",
                                                   n_vocab_, "-token vocabulary")));
      continue;
    }
    if (s->stop.contains(token)) {
      Finish(std::move(owned), FinishReason::kStop, absl::OkStatus());
      continue;
    }
    s->tokens.push_back(token);
    ++s->n_generated;
    s->timing.first_token = now;
    events_.push_back(Event{s->sink, {token}, false, {}});
    if (s->n_generated >= s->max_tokens) {
      Finish(std::move(owned), FinishReason::kLength, absl::OkStatus());
      continue;
    }
    // Joins the running batch; its next work is one decode token (the cache may briefly hold
    // more than max_running_seqs sequences: the blocks are already its own).
    s->running = true;
    s->admission = next_admission_++;
    running_.push_back(std::move(owned));
  }
}

int Scheduler::CacheableTokens(const Sequence& seq) {
  return CacheablePrefix(seq.order_prompt_len);
}

void Scheduler::MatchCachedPrefix(Sequence& seq) {
  if (!options_.prefix_cache.enabled || seq.n_computed != 0) return;
  // The last token is always computed: its row gives the logits of the next token.
  const int usable = std::min(CacheableTokens(seq), static_cast<int>(seq.tokens.size()) - 1);
  const int hit = kv_->MatchPrefix(seq.kv_id, seq.tokens, usable);
  seq.n_computed = hit;
  NoteCacheLookup(seq, hit);
}

namespace {

// The sink of fill sequences: they have no caller.
class DiscardSink final : public GenerationSink {
 public:
  void OnTokens(const std::vector<int32_t>&) override {}
  void OnFinish(const FinishInfo&) override {}
};

// Finished requests whose answers wait to be filed, at most: the newest are the likeliest to
// be continued, and an engine idle long enough to fill more has nothing queued anyway.
constexpr size_t kMaxQueuedFills = 16;

}  // namespace

void Scheduler::QueueFill(const Sequence& seq) {
  const PrefixCacheOptions& pc = options_.prefix_cache;
  if (!pc.enabled || !pc.fill_generated || seq.n_generated == 0 || seq.hold_kv ||
      seq.export_layer) {
    return;
  }
  const int n = static_cast<int>(seq.tokens.size());
  // Worth a prefill only if it files a block the prompt did not (generated rows are never
  // filed: their summation orders are a decode step's, docs/kv_cache.md), and it fits.
  if (CacheablePrefix(n) / block_size_ <= CacheableTokens(seq) / block_size_) return;
  if (n + 1 > max_context_ || int64_t{n} + 1 > int64_t{kv_blocks_total_} * block_size_) return;
  fills_.push_back(seq.tokens);
  if (fills_.size() > kMaxQueuedFills) fills_.pop_front();
}

void Scheduler::ManageFills() {
  if (live_fill_ == nullptr && fills_.empty()) return;
  const size_t live = running_.size() + waiting_.size() + importing_.size();
  if (live > (live_fill_ != nullptr ? 1u : 0u)) {
    // Requests first: a fill gives way at once (the blocks it completed are filed already).
    if (live_fill_ != nullptr) {
      Finish(Remove(live_fill_), FinishReason::kCancelled, absl::OkStatus());
    }
    return;
  }
  if (live_fill_ != nullptr) return;
  static const std::shared_ptr<GenerationSink> discard = std::make_shared<DiscardSink>();
  GenerationRequest r;  // no id: every request's is non-empty, so no Cancel can name a fill
  r.prompt = std::move(fills_.back());
  fills_.pop_back();
  r.max_tokens = 1;
  r.sampling = SamplingParams::Greedy();
  r.speculative = false;
  r.priority = std::numeric_limits<int>::min();
  auto seq = std::make_unique<Sequence>(
      Incoming{std::move(r), discard, absl::Now(), std::numeric_limits<int64_t>::max(), {}, {},
               false, false},
      next_seq_id_++);
  seq->fill = true;
  live_fill_ = seq.get();
  InsertWaiting(std::move(seq));
}

void Scheduler::NoteCacheLookup(Sequence& seq, int hit) {
  if (seq.fill) {  // internal work: neither a request's figure nor the node's counts
    seq.cached_tokens = hit;  // what it does not compute (fill_tokens_)
    return;
  }
  if (seq.n_generated == 0) seq.cached_tokens = hit;  // what its first token was computed on
  if (seq.cache_counted) return;                     // a re-admission after preemption
  seq.cache_counted = true;
  cache_query_tokens_ += seq.n_prompt;
  cache_hit_tokens_ += hit;
}

void Scheduler::PlanDecode(StepPlan& plan) {
  std::vector<Sequence*> order;
  for (const auto& s : running_) order.push_back(s.get());
  std::sort(order.begin(), order.end(),
            [this](const Sequence* a, const Sequence* b) { return Before(*a, *b); });
  for (Sequence* s : order) {
    if (!s->running || !s->decoding()) continue;
    // Best first: when the cache is full the victim (possibly `s` itself) gives up its KV.
    while (!kv_->Reserve(s->kv_id, s->n_computed + 1).ok()) {
      Sequence* victim = PickVictim();
      Preempt(victim, plan);
      if (victim == s) break;
    }
    if (!s->running) continue;
    s->planned = 1;
    s->planned_prefill = false;
    plan.budget -= 1;
    plan.shape.decode_tokens += 1;
    plan.shape.decode_context += s->n_computed + 1;
    plan.decode.push_back(s);
  }
  plan.plain = plan.shape;
}

void Scheduler::PlanDrafts(StepPlan& plan, StepStats& stats) {
  const SpeculativeOptions& so = options_.speculative;
  if (so.drafter == nullptr || !spec_cost_.has_value() || plan.decode.empty()) return;
  // The step as planned so far: its decode rows, and the prompt tokens PlanPrefill will likely
  // add.
  int64_t pending = 0;
  for (const auto& s : running_) {
    if (!s->decoding()) pending += s->remaining();
  }
  for (const auto& s : waiting_) pending += s->remaining();
  const int n_decode = static_cast<int>(plan.decode.size());
  const bool shared = so.drafter->SharesTargetKv();
  // Where speculating steps have measured slower than plain ones at this batch size, the step
  // stays plain, and a probe drafts to measure; a step that will likely carry prompt rows (not
  // measured) speculates only where speculation has measured faster. A fixed K is an order, not
  // a prediction: it bypasses the gate.
  using Decision = spec::SpecGate::Decision;
  Decision decision = Decision::kSpeculate;
  if (so.fixed_k == 0) {
    decision = spec_gate_.Decide(n_decode);
    if (pending > 0 && !spec_gate_.Proven(n_decode)) decision = Decision::kPlain;
    if (decision == Decision::kPlain) return;
  }
  // The prompt rows make the step costlier and an extra row relatively cheaper, but emit no
  // token: a draft's return is weighed against the decode rows' own rate.
  const int prompt = ExpectedPromptTokens(plan, pending);
  spec::StepEstimate step;
  step.rows = n_decode + prompt;
  step.seconds = spec_cost_->Seconds(step.rows);
  step.tokens = n_decode;
  if (prompt > 0) step.base_rate = n_decode / spec_cost_->Seconds(n_decode);
  // Most promising sequences first: they get the cheap rows.
  std::vector<Sequence*> order;
  for (Sequence* s : plan.decode) {
    if (s->running && s->speculative) order.push_back(s);
  }
  // A sequence with little evidence of its own is taken to accept like the drafter's recent
  // drafts over all sequences.
  const double prior = drafter_acceptance_.rate();
  std::stable_sort(order.begin(), order.end(), [prior](const Sequence* a, const Sequence* b) {
    return a->acceptance.rate(prior) > b->acceptance.rate(prior);
  });
  int budget = plan.budget;
  double catch_up_total = 0;  // predicted catch-up work of the drafting sequences
  std::vector<Sequence*> drafting;
  std::vector<spec::DraftRequest*> requests;
  for (Sequence* s : order) {
    // Drafting past max_tokens is wasted: the last token of a request is never a draft's.
    const int limit = std::min({so.max_k, s->max_tokens - s->n_generated - 1, budget});
    int k = 0;
    if (limit > 0 && so.fixed_k > 0) {
      k = std::min(so.fixed_k, limit);
    } else if (limit > 0) {
      // The draft's cost per token: measured on this engine's own draft steps once there are
      // any (the start-up timing is one moment of a noisy host); before, the start-up step time
      // shared by every sequence that may draft in this step (one draft step serves them all).
      const double draft_row_s =
          (draft_token_seconds_ > 0 ? draft_token_seconds_
                                    : so.drafter->StepSeconds(static_cast<int>(order.size())) /
                                          static_cast<double>(order.size())) +
          verify_row_seconds_;
      // A draft model's catch-up is paid once and serves every later draft of the sequence:
      // this step bears its share over the tokens still to come (at most 32 of them, as the
      // sequence may stop drafting). Charged whole, it would keep a stale draft stale forever.
      const int ahead = std::clamp(s->max_tokens - s->n_generated, 1, 32);
      const double catch_up = so.drafter->CatchUpSeconds(s->kv_id, s->tokens);
      k = spec::ChooseK(step, *spec_cost_, s->acceptance.rate(prior), limit, draft_row_s,
                        so.min_gain, catch_up / ahead,
                        spec_head_cost_.has_value() ? &*spec_head_cost_ : nullptr);
      // A probe drafts a little where ChooseK would not, for one sequence of the step (the
      // most promising): that measures the acceptance and what drafts do to the step at this
      // batch size, and costs one short draft. (Probing every sequence of a batch made each
      // probe step cost several plain ones: free text, 4 streams, 1 thread, AVX2 EPYC, 0.91x
      // with such probes against 1.01x with none.) Not where the draft must first catch up on
      // more than that little on tokens it sat out (a draft model): that would cost more than
      // the probe learns, again at every probe; its prompt, at the first decode step, any draft
      // must read.
      const bool cheap = catch_up <= spec::SpecGate::kProbeDraft * so.drafter->StepSeconds(1);
      // (A sequence already drafting in this step serves the probe.)
      if (decision == Decision::kProbe && k == 0 && drafting.empty() &&
          (cheap || s->n_generated <= 1)) {
        k = std::min(spec::SpecGate::kProbeDraft, limit);
      }
      // A draft model's catch-up serves this sequence's later drafts too: the gate sees this
      // step's share now and the rest when the sequence ends (each short request's catch-up is
      // a recurring cost, which the gate must see, but not all at once in the step that paid).
      if (k > 0) {
        catch_up_total += catch_up;
        const double later = catch_up * (1 - 1.0 / ahead);
        catch_up_deferred_ += later;
        s->catch_up_debt += later;
      }
    }
    // A drafter on the target's own cache writes positions n_computed .. n_computed + k - 1
    // while it drafts, and the step feeds position n_computed + k: room for all of them first.
    if (k > 0 && shared && !kv_->Reserve(s->kv_id, s->n_computed + 1 + k).ok()) k = 0;
    if (k <= 0) {
      s->acceptance.Idle();
      continue;
    }
    budget -= k;
    s->draft.seq = s->kv_id;
    s->draft.tokens = s->tokens;
    s->draft.max_draft = k;
    s->draft.sampling = &s->sampling;
    s->draft.draft.clear();
    s->draft.q.clear();
    s->draft.hidden.clear();
    s->draft.target_kv = shared ? kv_.get() : nullptr;
    s->draft.prompt_len = s->order_prompt_len;
    drafting.push_back(s);
    requests.push_back(&s->draft);
  }
  if (requests.empty()) {
    if (decision == Decision::kProbe) spec_gate_.ProbeUnused(n_decode);
    return;
  }
  const absl::Time t0 = absl::Now();
  const absl::Status st = so.drafter->Propose(requests);
  stats.draft_seconds = absl::ToDoubleSeconds(absl::Now() - t0);
  if (st.ok()) {
    size_t proposed = 0;
    for (const spec::DraftRequest* r : requests) proposed += r->draft.size();
    // Only steps with little catching up teach the cost of drafting: the catch-up's own
    // prediction can be far off (a prompt's once took twice its estimate, which left a draft
    // token looking 6x dearer than it is). The average starts from the start-up timing.
    const double start_up = so.drafter->StepSeconds(static_cast<int>(requests.size())) /
                            static_cast<double>(requests.size());
    if (proposed > 0 && catch_up_total <= start_up) {
      const double per_token =
          std::max(0.0, stats.draft_seconds - catch_up_total) / static_cast<double>(proposed);
      draft_token_seconds_ =
          0.8 * (draft_token_seconds_ > 0 ? draft_token_seconds_ : start_up) + 0.2 * per_token;
    }
  }
  if (!st.ok()) {
    PD_LOG(kWarning, "drafter ", so.drafter->name(), " failed, this step runs without drafts: ",
           st.ToString());
  }
  const size_t n_embd = static_cast<size_t>(model_.config().n_embd);
  for (Sequence* s : drafting) {
    std::vector<int32_t>& d = s->draft.draft;
    const bool q_ok = s->draft.q.empty() || s->draft.q.size() >= d.size();
    const bool hidden_ok = !shared || s->draft.hidden.size() >= d.size() * n_embd;
    if (!st.ok() || !q_ok || !hidden_ok) d.clear();
    if (static_cast<int>(d.size()) > s->draft.max_draft) d.resize(s->draft.max_draft);
    for (size_t i = 0; i < d.size(); ++i) {
      if (d[i] < 0 || d[i] >= n_vocab_) {  // a drafter's bug must not reach the model
        d.resize(i);
        break;
      }
    }
    int k = std::min(static_cast<int>(d.size()), plan.budget);
    // Speculation never preempts anybody: no room, no draft.
    if (k > 0 && !shared && !kv_->Reserve(s->kv_id, s->n_computed + 1 + k).ok()) k = 0;
    d.resize(k);
    s->draft.tokens = {};
    s->draft.target_kv = nullptr;
    if (k == 0) {
      s->draft.q.clear();
      s->draft.hidden.clear();
      // Blocks reserved for a draft that did not come go back (what the drafter wrote there
      // lies past the computed tokens; the step rewrites position n_computed).
      if (shared) kv_->Truncate(s->kv_id, s->n_computed + 1);
      continue;
    }
    s->spec_rows = k;
    if (shared) {
      // Its K draft positions are computed; the step feeds the last proposal at n_computed + k
      // and runs the output head over the K hidden states.
      s->draft.hidden.resize(static_cast<size_t>(k) * n_embd);
      plan.shape.decode_context += k;
      continue;
    }
    s->planned += k;
    plan.budget -= k;
    plan.shape.decode_tokens += k;
    for (int i = 1; i <= k; ++i) plan.shape.decode_context += s->n_computed + 1 + i;
  }
}

absl::StatusOr<spec::SpecCost> Scheduler::MeasureStepCost() {
  // Rows a step can hold with every running sequence drafting max_k tokens (at most 64: beyond,
  // SpecCost extrapolates the last, compute-bound, segment).
  const int cap = std::min({64, options_.token_budget,
                            options_.max_running_seqs * (options_.speculative.max_k + 1)});
  const absl::Time t0 = absl::Now();
  PD_ASSIGN_OR_RETURN(spec::SpecCost cost,
                      spec::SpecCost::MeasureForward(model_, *kv_, cap, &logits_));
  std::string table;
  for (size_t i = 0; i < cost.rows().size(); ++i) {
    table += pd::StrCat(i ? ", " : "", cost.rows()[i], ": ", cost.seconds()[i] * 1e3, " ms");
  }
  PD_LOG(kInfo, "speculative decoding: target step cost by rows {", table, "} (measured in ",
         absl::ToDoubleSeconds(absl::Now() - t0), " s)");
  return cost;
}

Scheduler::PromptPace Scheduler::Pace(const StepPlan& plan, int64_t pending) const {
  // Step-time budget: only while tokens decode in this step (a prompt-only step stalls nobody).
  // Such a step takes the recent arrival rate of prompt tokens (x 1.1) plus the pending ones
  // spread over prefill_pace_steps steps, so that steps carry about equal prompt work instead of
  // a few long ones among short ones; within the time budget once the fit is ready (stretch x
  // the predicted time of this step or of the full batch, each with the arrival rate's prompt
  // tokens, capped at the median recent step: below) unless that is below the arrival rate
  // (a cap below it would let the backlog, and every waiting prompt's TTFT, grow without bound);
  // and at least min_prefill_chunk.
  PromptPace pace;
  pace.timed = options_.chunked_prefill && options_.step_time_stretch > 0 && !plan.decode.empty();
  if (!pace.timed) return pace;
  if (options_.prefill_pace_steps > 0) {
    pace.keep_up =
        static_cast<int>(std::min<double>(INT_MAX / 2, std::ceil(1.1 * prompt_arrival_rate_)));
    pace.paced = static_cast<int>(std::min<int64_t>(
        INT_MAX,
        pace.keep_up + (pending + options_.prefill_pace_steps - 1) / options_.prefill_pace_steps));
  }
  if (step_time_.ready()) {
    // Stretch x this step's own decode rows (and drafts) always. Past that, the loaded step:
    // this step, or, when more sequences are live than decode now (a burst of prompts being
    // prefilled), the step of all of them (up to max_running_seqs), the time every stream's
    // steps take once they decode; a step of a few streams may fill up to that with prompt
    // work, which shortens the burst's TTFT.
    StepShape full = plan.plain;
    const int live = static_cast<int>(
        std::min<size_t>(running_.size() + waiting_.size(), options_.max_running_seqs));
    if (full.decode_tokens > 0 && live > full.decode_tokens) {
      full.decode_context *= static_cast<double>(live) / full.decode_tokens;
      full.decode_tokens = live;
    }
    // Both with the prompt tokens that keep up with the arrivals (a loaded server's typical step
    // carries them, and the streams see that step most, not a decode-only one; chunks placed at
    // position 0, the least attention they cost), and never past the median of the recent
    // steps: when prompts come in waves (a closed loop of equal requests), a wave's prefill
    // steps are the ITL tail, and this keeps them within stretch x the typical ITL.
    StepShape own = plan.shape;
    if (pace.keep_up > 0) {
      own.AddChunk(0, pace.keep_up);
      full.AddChunk(0, pace.keep_up);
    }
    double loaded_s = std::max(step_time_.Predict(own), step_time_.Predict(full));
    const double typical = step_time_.TypicalDecodeStep();
    if (typical > 0) loaded_s = std::min(loaded_s, typical);
    pace.budget_s = options_.step_time_stretch * std::max(step_time_.Predict(plan.shape), loaded_s);
  }
  return pace;
}

int Scheduler::ExpectedPromptTokens(const StepPlan& plan, int64_t pending) const {
  int n = static_cast<int>(
      std::min<int64_t>({pending, std::max(0, plan.budget), int64_t{options_.prefill_chunk}}));
  const PromptPace pace = Pace(plan, pending);
  if (!pace.timed || n <= 0) return n;
  return PromptAllowance(pace, plan.shape, /*start=*/0, n, /*taken=*/0);
}

int Scheduler::PromptAllowance(const PromptPace& pace, const StepShape& shape, int start, int want,
                               int taken) const {
  int allowed = std::min(want, std::max(0, pace.paced - taken));
  if (step_time_.ready()) {
    allowed = std::max(step_time_.MaxPrefill(shape, start, allowed, pace.budget_s),
                       std::min(allowed, pace.keep_up - taken));
  }
  return std::max(allowed, std::min(want, options_.min_prefill_chunk - taken));
}

void Scheduler::PlanPrefill(StepPlan& plan) {
  std::vector<Sequence*> candidates;
  for (const auto& s : running_) {
    if (s->planned == 0 && s->remaining() > 0) candidates.push_back(s.get());
  }
  for (const auto& s : waiting_) {
    if (s->preempted_step != step_no_) candidates.push_back(s.get());
  }
  std::sort(candidates.begin(), candidates.end(),
            [this](const Sequence* a, const Sequence* b) { return Before(*a, *b); });
  bool any_prefill = false;
  bool admit_blocked = false;  // a waiting sequence did not fit: later ones may not overtake it
  const absl::Time now = absl::Now();
  int64_t pending = 0;
  for (const Sequence* s : candidates) pending += s->remaining();
  if (options_.chunked_prefill && options_.step_time_stretch > 0 && !plan.decode.empty() &&
      options_.prefill_pace_steps > 0) {
    int64_t arrived = 0;
    for (Sequence* s : candidates) {
      if (!s->seen_pending) arrived += s->remaining();
      s->seen_pending = true;
    }
    // Prompt tokens arriving per decoding step, over about the last prompt_rate_steps such steps.
    const double w = 1.0 / options_.prompt_rate_steps;
    prompt_arrival_rate_ = (1 - w) * prompt_arrival_rate_ + w * static_cast<double>(arrived);
    plan.prompt_arrival_rate = prompt_arrival_rate_;
  }
  const PromptPace pace = Pace(plan, pending);
  int timed_tokens = 0;  // prompt tokens the time budget allowed so far
  for (Sequence* s : candidates) {
    const bool admitted = s->running;
    if (!admitted && (admit_blocked || s->preempted_step == step_no_)) continue;  // or preempted
    if (admitted && s->planned > 0) continue;
    if (!admitted && static_cast<int>(running_.size()) >= options_.max_running_seqs) continue;
    if (!admitted) MatchCachedPrefix(*s);
    int want = s->remaining();
    if (options_.chunked_prefill) {
      want = std::min({want, options_.prefill_chunk, plan.budget});
    } else if (want > plan.budget && any_prefill) {
      want = 0;  // the whole prompt in a later step, alone if need be
    }
    // Before any preemption for room: a chunk the time budget drops needs no blocks.
    bool out_of_time = false;
    if (pace.timed && want > 0) {
      const int allowed = PromptAllowance(pace, plan.shape, s->n_computed, want, timed_tokens);
      out_of_time = allowed < want;
      want = allowed;
      timed_tokens += want;
      plan.prefill_time_limited |= out_of_time;
    }
    auto room = [&] {  // tokens it can compute with its blocks and the free ones
      return kv_->Capacity(s->kv_id) + kv_->free_blocks() * block_size_ - s->n_computed;
    };
    if (admitted && want > 0) {
      // A running sequence that cannot grow at all takes blocks from one ordered after it, so
      // that half-prefilled sequences never wait on each other forever.
      while (room() <= 0) {
        Sequence* victim = PickVictim();
        if (victim == s) break;
        Preempt(victim, plan);
      }
    }
    if (want > 0) {
      want = options_.chunked_prefill ? std::min(want, room()) : (room() >= want ? want : 0);
    }
    if (want <= 0 && out_of_time) {
      if (!admitted) {
        kv_->Free(s->kv_id);  // the cached blocks it took, back to the cache
        s->n_computed = 0;
      }
      break;  // the step is full in time; later sequences wait as well
    }
    if (want <= 0) {
      if (!admitted) {
        admit_blocked = true;
        kv_->Free(s->kv_id);  // the cached blocks it took, back to the cache
        s->n_computed = 0;
      }
      continue;
    }
    PD_CHECK_OK(kv_->Reserve(s->kv_id, s->n_computed + want));
    if (!admitted) {
      running_.push_back(Take(waiting_, s));
      s->running = true;
      s->admission = next_admission_++;
      if (s->timing.first_scheduled == absl::InfinitePast()) s->timing.first_scheduled = now;
    }
    s->planned = want;
    s->planned_prefill = true;
    plan.budget -= want;
    plan.shape.AddChunk(s->n_computed, want);
    any_prefill = true;
    plan.prefill.push_back(s);
    if (out_of_time) break;
  }
}

void Scheduler::Execute(const StepPlan& plan, StepStats& stats) {
  Batch batch;
  std::vector<Sequence*> in_batch;
  // Sequences with logits in this batch, and the index of their first logits row: one row for a
  // plain sequence, 1 + drafted rows for one verifying a draft. A draft of a drafter on the
  // target's own cache has its drafted rows as head-only rows (Batch::head_x, from head_first;
  // their logits follow every logits row's) and one ordinary row, its last proposal's.
  struct Output {
    Sequence* s;
    size_t row;
    int64_t head_first = -1;
  };
  std::vector<Output> outputs;
  const size_t n_embd = static_cast<size_t>(model_.config().n_embd);
  for (const std::vector<Sequence*>* list : {&plan.decode, &plan.prefill}) {
    for (Sequence* s : *list) {
      if (!s->running || s->planned == 0) continue;  // preempted after it was planned
      in_batch.push_back(s);
      const int n_tokens = static_cast<int>(s->tokens.size());
      if (s->shared_draft()) {
        const int k = s->spec_rows;
        outputs.push_back(Output{s, batch.logits_rows.size(),
                                 static_cast<int64_t>(batch.head_x.size() / n_embd)});
        batch.head_x.insert(batch.head_x.end(), s->draft.hidden.begin(), s->draft.hidden.end());
        batch.AddOrdered(s->draft.draft[k - 1], s->n_computed + k, s->kv_id, true,
                         s->order_prompt_len);
        // Its drafted rows count as decode rows, as a draft verified through the layers does.
        stats.batch.push_back(StepSequence{s->id, s->planned + k, s->planned_prefill});
        stats.decode_tokens += s->planned + k;
        continue;
      }
      for (int i = 0; i < s->planned; ++i) {
        const int pos = s->n_computed + i;
        // Positions past the sequence's tokens are its draft's (verified rows all want logits).
        const int32_t token = pos < n_tokens ? s->tokens[pos] : s->draft.draft[pos - n_tokens];
        const bool want_logits = pos + 1 >= n_tokens;
        if (want_logits && pos + 1 == n_tokens) {
          outputs.push_back(Output{s, batch.logits_rows.size()});
        }
        batch.AddOrdered(token, pos, s->kv_id, want_logits, s->order_prompt_len);
      }
      stats.batch.push_back(StepSequence{s->id, s->planned, s->planned_prefill});
      (s->planned_prefill ? stats.prefill_tokens : stats.decode_tokens) += s->planned;
    }
  }
  if (batch.size() == 0) return;

  // Sequences whose prompt's last chunk is in this batch and whose K/V leave the node.
  std::vector<Sequence*> exporting;
  for (Sequence* s : in_batch) {
    if (s->export_layer && s->planned_prefill && s->n_generated == 0 &&
        s->n_computed + s->planned == s->n_prompt) {
      exporting.push_back(s);
    }
  }
  Model::LayerHook hook;
  if (!exporting.empty()) {
    hook = [this, &exporting](int layer) {
      for (Sequence* s : exporting) {
        s->exported = true;  // its owner has now seen kv_id: hold_kv blocks wait for its release
        s->export_layer(*kv_, s->kv_id, layer);
      }
    };
  }
  // When every sampler's result depends on its row's best few logits alone (greedy, or top-k
  // without a repetition penalty: the defaults), only those leave the backend: a GPU copies back
  // k pairs per row instead of the vocabulary's logits, and nothing scans 262k floats per row on
  // the host. The tokens are the same either way (Sampler::SampleTop).
  int top_k = options_.top_logits ? 0 : -1;
  const int max_top = static_cast<int>(std::min<int64_t>(n_vocab_, kMaxTopK));
  for (const Output& out : outputs) {
    const Sequence* s = out.s;
    if (top_k < 0) break;
    const int need = s->sampler.TopNeeded();
    if (need <= 0 || need > max_top) {
      top_k = 0;
      break;
    }
    top_k = std::max(top_k, need);
  }
  use_top_ = top_k > 0;
  stats.top_logits_k = std::max(top_k, 0);
  const absl::Status st = use_top_ ? model_.ForwardTop(batch, *kv_, top_k, &top_, hook)
                                   : model_.Forward(batch, *kv_, &logits_, hook);
  if (!st.ok()) {
    // A bug or a resource problem (requests were validated): fail this batch, keep serving.
    PD_LOG(kError, "forward of ", batch.size(), " tokens failed, failing its ", in_batch.size(),
           " sequences: ", st.ToString());
    for (Sequence* s : in_batch) Finish(Take(running_, s), FinishReason::kError, st);
    return;
  }
  for (Sequence* s : in_batch) {
    // Draft rows count as computed only once accepted (Verify). A shared draft's first position
    // (the fed token's) was computed by the drafter, and its step row is its last proposal's.
    s->n_computed += s->shared_draft() ? 1 : s->planned - s->spec_rows;
    s->planned = 0;
    if (options_.prefix_cache.enabled) {
      kv_->Publish(s->kv_id, s->tokens, std::min(s->n_computed, CacheableTokens(*s)));
    }
  }
  const size_t n_logits = batch.logits_rows.size();
  std::vector<size_t> rows;
  for (const Output& out : outputs) {
    Sequence* s = out.s;
    const size_t row = out.row;
    if (s->spec_rows > 0) {
      rows.clear();
      for (int j = 0; j < s->spec_rows; ++j) {
        rows.push_back(out.head_first >= 0 ? n_logits + out.head_first + j : row + j);
      }
      rows.push_back(out.head_first >= 0 ? row : row + s->spec_rows);
      Verify(s, rows, stats);
      continue;
    }
    const int32_t token =
        use_top_ ? s->sampler.SampleTop(top_.Ids(row), top_.Values(row))
                 : s->sampler.Sample(absl::MakeConstSpan(
                                         logits_.data() + row * static_cast<size_t>(n_vocab_),
                                         n_vocab_),
                                     s->tokens);
    std::vector<int32_t> emitted;
    if (Emit(s, token, &emitted)) FlushTokens(s, &emitted);
  }
}

bool Scheduler::Emit(Sequence* s, int32_t token, std::vector<int32_t>* emitted) {
  if (s->stop.contains(token)) {
    FlushTokens(s, emitted);
    Finish(Take(running_, s), FinishReason::kStop, absl::OkStatus());
    return false;
  }
  s->tokens.push_back(token);
  ++s->n_generated;
  emitted->push_back(token);
  if (s->n_generated >= s->max_tokens) {
    FlushTokens(s, emitted);
    Finish(Take(running_, s), FinishReason::kLength, absl::OkStatus());
    return false;
  }
  return true;
}

void Scheduler::FlushTokens(Sequence* s, std::vector<int32_t>* emitted) {
  if (emitted->empty()) return;
  if (s->timing.first_token == absl::InfinitePast()) s->timing.first_token = absl::Now();
  events_.push_back(Event{s->sink, std::move(*emitted), false, {}});
  emitted->clear();
}

void Scheduler::Verify(Sequence* s, absl::Span<const size_t> rows, StepStats& stats) {
  const absl::Time t0 = absl::Now();
  const int drafted = s->spec_rows;
  PD_CHECK(rows.size() == static_cast<size_t>(drafted) + 1);
  const std::vector<int32_t> draft = std::move(s->draft.draft);
  const std::vector<TokenDist> q = std::move(s->draft.q);
  s->draft.draft.clear();
  s->draft.q.clear();
  s->draft.hidden.clear();
  s->spec_rows = 0;
  ++stats.spec_sequences;
  if (static_cast<int>(stats.drafted_at.size()) < drafted) {
    stats.drafted_at.resize(drafted);
    stats.accepted_at.resize(drafted);
  }
  std::vector<int32_t> emitted;
  int tried = 0, accepted = 0;
  s->draft_tokens += drafted;  // before Emit, which may end (and destroy) the sequence
  stats.draft_tokens += drafted;
  bool live = true;  // still running (Emit did not finish it)
  bool go_on = true;
  for (int j = 0; j <= drafted && go_on; ++j) {
    const size_t r = rows[j];
    if (use_top_) {
      s->sampler.DistributionTop(top_.Ids(r), top_.Values(r), &target_dist_);
    } else {
      const float* row = logits_.data() + r * static_cast<size_t>(n_vocab_);
      s->sampler.Distribution(absl::MakeConstSpan(row, n_vocab_), s->tokens, &target_dist_);
    }
    spec::Verdict v;
    if (j < drafted) {
      const TokenDist* qj = q.empty() ? nullptr : &q[j];
      v = options_.speculative.rule
              ? options_.speculative.rule(target_dist_, draft[j], qj, s->sampler)
              : spec::AcceptOrResample(target_dist_, draft[j], qj, s->sampler);
      ++tried;
      ++stats.drafted_at[j];
      if (v.accepted) {
        ++accepted;
        ++stats.accepted_at[j];
        ++s->n_computed;  // row j + 1 computed this very token: its K/V stand
      }
    } else {
      v.token = s->sampler.Draw(target_dist_);  // all accepted: the bonus token
    }
    if (v.accepted) ++s->accepted_tokens;  // before Emit, as above
    live = Emit(s, v.token, &emitted);
    go_on = live && v.accepted;
  }
  stats.accepted_tokens += accepted;
  drafter_acceptance_.Observe(tried, accepted);
  // The work beyond the one token a plain step samples, per draft token.
  const double per_row = absl::ToDoubleSeconds(absl::Now() - t0) / (tried + 1);
  verify_row_seconds_ = verify_row_seconds_ == 0 ? per_row : 0.9 * verify_row_seconds_ + 0.1 * per_row;
  if (!live) return;  // finished: its blocks are gone
  FlushTokens(s, &emitted);
  s->acceptance.Observe(tried, accepted);
  // Rejected rows' K/V stay in the blocks until overwritten; blocks holding only those go back.
  kv_->Truncate(s->kv_id, s->n_computed);
}

StepStats Scheduler::RunStep() {
  const absl::Time t0 = absl::Now();
  ++step_no_;
  Intake();  // cancellations and deadlines free their KV before anything is scheduled
  ManageFills();
  if (!events_.empty()) {
    // Requests ended at the intake (cancelled, past their deadline): their callers and the load
    // hear it now, not after this step's forward pass.
    Publish(nullptr);
    Deliver();
  }
  StepPlan plan;
  plan.budget = options_.token_budget;
  StepStats stats;
  PlanDecode(plan);
  PlanDrafts(plan, stats);
  PlanPrefill(plan);
  stats.preemptions = plan.preemptions;
  Execute(plan, stats);
  // Idle cached blocks to INT8 (prefix_cache.compress_idle_ms), a bounded number per step.
  kv_->CompressIdle(absl::Now(), kCompressPerStep);
  stats.seconds = absl::ToDoubleSeconds(absl::Now() - t0);
  stats.prefill_time_limited = plan.prefill_time_limited;
  stats.prompt_arrival_rate = plan.prompt_arrival_rate;
  // The gate learns from the decode part of a step: a step with prompt rows too counts, less
  // their predicted time, once the step-time fit is ready and they are under half the step
  // (under sustained load nearly every step carries prompt rows: a gate that skipped those
  // would stay unproven at most batch sizes, and steps would flip between drafting and not as
  // the batch moves between sizes).
  double decode_seconds = stats.prefill_tokens == 0 ? stats.seconds : 0;
  if (stats.prefill_tokens > 0 && step_time_.ready()) {
    StepShape decode_only = plan.shape;
    decode_only.prefill_tokens = 0;
    decode_only.prefill_context = 0;
    const double prompt_s = step_time_.Predict(plan.shape) - step_time_.Predict(decode_only);
    if (prompt_s >= 0 && prompt_s < 0.5 * stats.seconds) decode_seconds = stats.seconds - prompt_s;
  }
  // The step's decoding sequences (however their drafts were verified: through the layers, or
  // as head-only rows).
  int seqs = 0;
  for (const StepSequence& b : stats.batch) seqs += b.prefill ? 0 : 1;
  if (options_.speculative.drafter != nullptr && decode_seconds > 0 && seqs > 0) {
    const double seconds = std::max(decode_seconds - catch_up_deferred_, 0.1 * decode_seconds);
    spec_gate_.Observe(seqs, stats.draft_tokens > 0, seqs + stats.accepted_tokens, seconds);
    spec_gate_.Charge(seqs, gate_debt_);
    PD_LOG(kDebug, "step ", step_no_, ": ", seqs, " sequences, ", stats.draft_tokens, " drafted, ",
           stats.accepted_tokens, " accepted in ", stats.seconds * 1e3, " ms (drafting ",
           stats.draft_seconds * 1e3, " ms, catch-up deferred ", catch_up_deferred_ * 1e3,
           " ms, charged ", gate_debt_ * 1e3, " ms); measured tok/s with drafts ",
           spec_gate_.Rate(seqs, true), ", without ", spec_gate_.Rate(seqs, false));
    gate_debt_ = 0;
  }
  catch_up_deferred_ = 0;
  if (stats.prefill_tokens > 0 && stats.decode_tokens > 0) {
    PD_LOG(kDebug, "step ", step_no_, ": ", stats.decode_tokens, " decode + ", stats.prefill_tokens,
           " prompt tokens in ", stats.seconds * 1e3, " ms (fit ",
           step_time_.ready() ? "ready" : "not ready", ", predicted ",
           step_time_.Predict(plan.shape) * 1e3, " ms, median step ",
           step_time_.TypicalDecodeStep() * 1e3, " ms, prompt arrival rate ",
           plan.prompt_arrival_rate, " tokens/step", plan.prefill_time_limited ? ", cut" : "", ")");
  }
  if (!stats.batch.empty()) {
    step_time_.Observe(plan.shape, options_.step_time_source
                                       ? options_.step_time_source(plan.shape)
                                       : stats.seconds);
  }
  Publish(&stats);
  if (!stats.batch.empty() && options_.step_observer) options_.step_observer(stats);
  Deliver();
  return stats;
}

void Scheduler::Publish(StepStats* stats) {
  EngineLoad load;
  // The fill sequence (ManageFills) is idle work that yields to any request: not load.
  const bool fill_running = live_fill_ != nullptr && live_fill_->running;
  const bool fill_waiting = live_fill_ != nullptr && !live_fill_->running;
  load.running = static_cast<int>(running_.size()) - (fill_running ? 1 : 0);
  load.waiting = static_cast<int>(waiting_.size()) - (fill_waiting ? 1 : 0);
  load.kv_blocks_total = kv_blocks_total_;
  load.kv_blocks_free = kv_->free_blocks();
  load.kv_block_size = block_size_;
  const PrefixCacheStats cache = kv_->prefix_stats();
  load.kv_blocks_cached = cache.cached_blocks;
  load.kv_blocks_compressed = cache.compressed_blocks;
  load.prefix_cache_evictions = cache.evictions;
  load.prefix_cache_query_tokens = cache_query_tokens_;
  load.prefix_cache_hit_tokens = cache_hit_tokens_;
  load.prefix_fills_pending = static_cast<int>(fills_.size()) + (live_fill_ != nullptr ? 1 : 0);
  load.prefix_fill_tokens = fill_tokens_;
  const Backend::CaptureStats graphs = model_.backend().capture_stats();
  load.graph_steps = graphs.launched;
  load.graph_abandoned = graphs.abandoned;
  if (options_.prefix_cache.enabled) {
    const absl::Time now = absl::Now();
    // At most every 100 ms while busy, and always when going idle (no later step would refresh
    // what the last one filed or released).
    const bool idle = running_.empty() && waiting_.empty() && importing_.empty();
    if (summary_ == nullptr || idle || now - summary_time_ >= absl::Milliseconds(100)) {
      summary_ = std::make_shared<const std::vector<uint64_t>>(kv_->PrefixSummary());
      summary_time_ = now;
    }
    load.cached_block_hashes = summary_;
  }
  for (const auto& s : waiting_) load.pending_prefill_tokens += s->fill ? 0 : s->remaining();
  for (const auto& s : running_) {
    if (!s->decoding() && !s->fill) load.pending_prefill_tokens += s->remaining();
  }
  absl::MutexLock l(&mu_);
  for (const std::string& id : finished_ids_) {
    auto it = live_.find(id);
    PD_CHECK(it != live_.end());
    live_tokens_ -= it->second;
    live_.erase(it);
  }
  finished_ids_.clear();
  engine_load_ = load;
  held_published_ = static_cast<int>(held_.size());
  // Importing sequences keep the loop stepping (1 ms idle waits) so that their deadlines run.
  engine_busy_ = !running_.empty() || !waiting_.empty() || !importing_.empty() || !fills_.empty();
  if (stats != nullptr) {
    stats->load = load;
    stats->load.waiting += static_cast<int>(incoming_.size());
    stats->load.pending_prefill_tokens += incoming_prompt_tokens_;
  }
}

absl::Status Scheduler::AuditKv() const {
  PD_CHECK_MSG(!options_.run_thread || !thread_.joinable(),
               "Scheduler::AuditKv needs run_thread = false or a shut down scheduler");
  return AuditKvOnEngineThread();
}

absl::Status Scheduler::AuditKvOnEngineThread() const {
  PD_RETURN_IF_ERROR(kv_->blocks().Audit());
  absl::flat_hash_set<int64_t> owners(held_.begin(), held_.end());
  for (const auto* list : {&running_, &importing_}) {
    for (const auto& s : *list) {
      owners.insert(s->kv_id);
      if (kv_->Capacity(s->kv_id) < s->n_computed) {
        return absl::InternalError(pd::StrCat("request ", s->id, " computed ", s->n_computed,
                                              " tokens but holds room for ",
                                              kv_->Capacity(s->kv_id)));
      }
    }
  }
  for (int64_t seq : kv_->blocks().Sequences()) {
    if (!owners.contains(seq)) {
      return absl::InternalError(pd::StrCat("KV sequence ", seq,
                                            " holds blocks but no live "
                                            "running or importing request or held export owns it"));
    }
  }
  return absl::OkStatus();
}

absl::Status Scheduler::AuditKvNow(absl::Duration timeout) {
  auto call = std::make_shared<AuditCall>();
  {
    absl::MutexLock l(&mu_);
    if (options_.run_thread && !shut_down_ && !stop_) {
      audits_.push_back(call);
      wake_.Signal();
      auto done = [&call]() { return call->done; };
      if (!mu_.AwaitWithTimeout(absl::Condition(&done), timeout)) {
        return absl::DeadlineExceededError(
            pd::StrCat("the engine thread reached no step boundary within ",
                       absl::FormatDuration(timeout)));
      }
      return call->result;
    }
    if (options_.run_thread && !shut_down_) {
      return absl::UnavailableError("the scheduler is shutting down");
    }
  }
  return AuditKv();
}

void Scheduler::RunAudits() {
  std::vector<std::shared_ptr<AuditCall>> calls;
  {
    absl::MutexLock l(&mu_);
    if (audits_.empty()) return;
    calls.swap(audits_);
  }
  // The engine thread between two steps: what AuditKv reads is this thread's.
  const absl::Status result = AuditKvOnEngineThread();
  absl::MutexLock l(&mu_);
  for (const auto& c : calls) {
    c->result = result;
    c->done = true;
  }
}

void Scheduler::Deliver() {
  std::vector<Event> events;
  events.swap(events_);
  for (Event& e : events) {
    if (e.finish) {
      e.sink->OnFinish(e.info);
    } else {
      e.sink->OnTokens(e.tokens);
    }
  }
}

void Scheduler::FinishAllUnavailable() {
  std::vector<std::pair<std::string, FinishReason>> cancels;  // moot: everything ends
  Pull(&cancels);
  const absl::Status unavailable = absl::UnavailableError("the engine is shutting down");
  while (!running_.empty()) {
    std::unique_ptr<Sequence> s = std::move(running_.back());
    running_.pop_back();
    Finish(std::move(s), FinishReason::kError, unavailable);
  }
  while (!waiting_.empty()) {
    std::unique_ptr<Sequence> s = std::move(waiting_.back());
    waiting_.pop_back();
    Finish(std::move(s), FinishReason::kError, unavailable);
  }
  while (!importing_.empty()) {
    std::unique_ptr<Sequence> s = std::move(importing_.back());
    importing_.pop_back();
    Finish(std::move(s), FinishReason::kError, unavailable);
  }
  // Nothing reads held exports any more once the engine is gone (their transports are shut
  // down before the scheduler).
  ApplyReleases();
  for (int64_t id : held_) kv_->Free(id);
  held_.clear();
  fills_.clear();
  Publish(nullptr);
  Deliver();
}

}  // namespace pd::engine
