// The engine loop of a node: continuous batching over one Model and one paged KvCache.
//
// Each step builds ONE Batch: the next token of every decoding sequence (one each, logits wanted)
// plus prompt chunks of admitted or waiting sequences filling the rest of the token budget, runs
// Model::Forward once (weights are read once per step for the whole batch), samples each sequence
// with its own seeded Sampler, streams the tokens to the sinks and frees the KV of every sequence
// that finished. docs/scheduler.md describes the policy: admission, chunked prefill, preemption by
// recompute, limits, options.
//
// Ownership: a Scheduler borrows (or owns) the Model, whose Backend must outlive both, and owns
// its KvCache and its engine thread; Shutdown() (or the destructor) stops and joins the thread.
// While the Scheduler lives, the Model belongs to its engine thread: run nothing else on it.
//
// Thread safety: Submit, Cancel, Load, max_context and Shutdown may be called from any thread,
// including from a sink (which runs on the engine thread; Shutdown excepted there). Everything
// the engine loop touches (the cache, the model, the sequences) belongs to the engine thread.
// Sinks are called on the engine thread, never under a lock; the OnFinish calls of requests
// still live at Shutdown are made on the thread calling Shutdown, after the engine thread ended.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "engine/kv/kv_cache.h"
#include "engine/kv/kv_write_fence.h"
#include "engine/runtime/model.h"
#include "engine/sched/engine_api.h"
#include "engine/sched/sampler.h"
#include "engine/sched/step_time.h"
#include "engine/spec/acceptance.h"
#include "engine/spec/drafter.h"
#include "engine/spec/policy.h"

namespace pd::engine {

// One sequence's share of a step's batch.
struct StepSequence {
  std::string id;
  int tokens = 0;        // tokens of this sequence in the batch
  bool prefill = false;  // a prompt (or recompute) chunk; false: one decode token
  bool operator==(const StepSequence&) const = default;
};

// What one engine step did, for metrics and tests.
struct StepStats {
  int prefill_tokens = 0;  // prompt / recompute tokens computed in the step
  int decode_tokens = 0;   // decode tokens computed in the step (one per decoding sequence)
  double seconds = 0;      // wall time of the step: intake, scheduling, forward, sampling
  int preemptions = 0;     // sequences whose KV was dropped in this step
  // The step-time budget cut this step's prompt tokens (SchedulerOptions::step_time_stretch).
  bool prefill_time_limited = false;
  // The prompt tokens arriving per decoding step (a moving average over about 32 of them) that
  // this step's pacing used; 0 when the step had nothing decoding or pacing is off.
  double prompt_arrival_rate = 0;
  std::vector<StepSequence> batch;  // batch composition: decode tokens first, then chunks
  EngineLoad load;                  // the load after the step
  // Speculative decoding in this step (docs/speculative.md). decode_tokens and the batch count
  // the draft rows too.
  int spec_sequences = 0;   // sequences that verified a draft
  int draft_tokens = 0;     // draft tokens in the batch (proposed and verified)
  int accepted_tokens = 0;  // of those, accepted
  // By position in the draft (index 0 = first token): drafts that reached the position (every
  // position before it was accepted) and, of those, the ones accepted there.
  std::vector<int> drafted_at, accepted_at;
  double draft_seconds = 0;  // in the drafter's Propose
  // The step copied back each logits row's best entries only (SchedulerOptions::top_logits): 0
  // when it copied whole rows, else the k.
  int top_logits_k = 0;
};

// Called on the engine thread after every step that ran a forward, before that step's tokens and
// finishes reach the sinks; must not block.
using StepObserver = std::function<void(const StepStats&)>;

// Speculative decoding (docs/speculative.md): a drafter proposes tokens, the target verifies them
// in the step, and each sequence drafts as far as its recent acceptance and the step's cost make
// worth it.
struct SpeculativeOptions {
  std::shared_ptr<spec::Drafter> drafter;  // null: no speculation
  int max_k = 8;                           // draft tokens per sequence and step, 0..16
  // A draft qualifies only when its own return (extra tokens per extra second) beats the step's
  // tokens per second by this factor (spec::ChooseK).
  double min_gain = 1.25;
  // > 0: every speculating sequence asks for exactly this many draft tokens each step, whatever
  // the cost model says (tests, benchmarks of a fixed K). 0: adaptive.
  int fixed_k = 0;
  // Target step seconds by row count. Empty (the normal case): measured by Scheduler::Create
  // with a few forwards of up to 64 rows.
  std::optional<spec::SpecCost> cost;
  // For a drafter whose drafted rows go through the output head only (SharesTargetKv): seconds
  // of one ordinary row plus `rows - 1` head-only rows. Empty: measured by Create for such a
  // drafter (`cost` when that is given: tests).
  std::optional<spec::SpecCost> head_cost;
  // The acceptance rule; empty: spec::AcceptOrResample. Tests put a wrong rule here to show that
  // the distribution test detects one.
  std::function<spec::Verdict(const TokenDist& p, int32_t x, const TokenDist* q, Sampler& rng)>
      rule;
  absl::Status Validate() const;
};

struct SchedulerOptions {
  // KV memory: `kv_blocks` blocks if > 0, else as many blocks as fit in `kv_bytes`.
  int64_t kv_bytes = int64_t{256} << 20;  // 256 MiB
  int kv_blocks = 0;
  int block_size = 16;               // tokens per KV block
  KvDType kv_dtype = KvDType::kF16;  // f16, f32 or int8; passed through to KvCacheOptions
  // Reuse of the K/V of prompt prefixes already computed (docs/kv_cache.md, "Prefix cache"): a
  // new sequence starts from the longest cached chain of full blocks equal to its prompt's, and
  // the full prompt blocks of every sequence stay cached after it ends until memory is needed.
  PrefixCacheOptions prefix_cache;

  int max_running_seqs = 32;  // sequences holding KV at once
  int max_waiting = 256;      // accepted requests not running (queued or preempted)
  // Sum over live requests of prompt + max_tokens; 0 = no limit. Must be >= the context.
  int64_t max_total_tokens = 0;
  // Tokens per step (decode tokens + prefill chunks). >= max_running_seqs, so that the decode
  // tokens of a full running set always fit.
  int token_budget = 512;
  // On: prompts are cut into chunks of at most `prefill_chunk` tokens that fill the budget left
  // by decode tokens. Off: a prompt runs whole in one step (alone if it exceeds the budget).
  bool chunked_prefill = true;
  int prefill_chunk = 512;
  // Step-time budget (docs/scheduler.md): while sequences decode, a step takes the recent
  // arrival rate of prompt tokens plus the pending ones / `prefill_pace_steps` (0: no pacing),
  // capped so that its predicted time stays <= step_time_stretch x the same step's without
  // prompt tokens, or x the loaded step (this one, or every live sequence's when more are live
  // than decode, with the arrival rate's prompt tokens) capped at the median recent step (a fit
  // of step times learned online), unless that falls below the arrival rate,
  // and at least `min_prefill_chunk` tokens so that prompts always progress.
  // step_time_stretch 0 = all of this off: chunks of `prefill_chunk` whatever they cost. Off
  // here, so that a Scheduler's steps depend on its inputs only (tests, tools); the daemons'
  // config turns it on (scheduler.step_time_stretch, default 1.4).
  double step_time_stretch = 0;
  int prefill_pace_steps = 32;
  // The arrival rate is a moving average over about this many decoding steps (the weight of a
  // step's arrivals is 1 / this). Long enough that a burst of prompts (16 streams' prompts
  // arriving together) raises it by a fraction, and the burst drains through the time budget
  // instead of a run of long steps; the rate still follows a steady load.
  int prompt_rate_steps = 128;
  int min_prefill_chunk = 16;
  // The seconds the step-time fit learns for a step of this shape; empty (the normal case): the
  // step's measured wall time. Tests set it to model a machine with known costs.
  std::function<double(const StepShape&)> step_time_source;
  // On: higher GenerationRequest::priority is admitted first and preempted last; off: FCFS.
  bool enable_priority = true;
  // Prompt + max_tokens accepted; 0 = the model's trained context. Capped by the KV capacity.
  int max_context = 0;
  // Run the engine loop on an own thread (the normal case). false: no thread; the owner drives
  // the loop by calling Scheduler::Step() (deterministic tests, or a daemon with its own loop).
  bool run_thread = true;
  StepObserver step_observer;  // may be empty
  SpeculativeOptions speculative;
  // On (the default): when every sampler in a step depends only on its row's best logits
  // (greedy, or top-k without a repetition penalty), the step copies back just those
  // (Model::ForwardTop), on the device for a GPU. Off: whole logits rows every step. The tokens
  // are the same either way; off is for tests and comparisons.
  bool top_logits = true;

  // INVALID_ARGUMENT naming the field.
  absl::Status Validate() const;
};

class Scheduler final : public GenerationEngine {
 public:
  // Creates the KV cache on the model's backend and (with run_thread) starts the engine thread.
  // INVALID_ARGUMENT for bad options (or a KV budget below one block), RESOURCE_EXHAUSTED when
  // the backend cannot hold the cache. `model` (and its backend) must outlive the Scheduler.
  static absl::StatusOr<std::unique_ptr<Scheduler>> Create(Model& model,
                                                           const SchedulerOptions& options);
  // Same, owning the model (its backend must still outlive the Scheduler).
  static absl::StatusOr<std::unique_ptr<Scheduler>> Create(std::unique_ptr<Model> model,
                                                           const SchedulerOptions& options);
  ~Scheduler() override;  // Shutdown()

  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // GenerationEngine. Submit errors: see engine_api.h.
  absl::Status Submit(GenerationRequest request, std::shared_ptr<GenerationSink> sink) override;
  void Cancel(const std::string& id, FinishReason reason = FinishReason::kCancelled) override;
  EngineLoad Load() const override;
  int max_context() const override { return max_context_; }

  // ---- Imported KV: the decode side of KV transfer (docs/scheduler.md, "Imported KV") ----
  // The blocks reserved for an importing sequence, as on_reserved sees them. On a host-memory
  // cache (KvCache::host_memory) the KvWriteTarget part holds them for another thread to write
  // through `fence` until the engine closes it (it does before it frees or reuses them: Cancel,
  // the deadline, a failed import, shutdown) and once the import completed. Empty for a device
  // cache: import with PostImport then.
  struct ImportTarget : KvWriteTarget {
    int64_t kv_seq = -1;  // its KvCache id
    // Leading blocks the sequence took from the prefix cache (SubmitImport with publish): they
    // hold the prompt's K/V already and are shared, so only blocks from this one on are written.
    int first_block = 0;
  };
  // Called on the engine thread with the importing sequence's blocks, or RESOURCE_EXHAUSTED
  // when the prompt's blocks are not free now (the request then prefills locally, as if given to
  // Submit). Must not block.
  using ImportReserved = std::function<void(absl::StatusOr<ImportTarget> reserved)>;
  // Runs on the engine thread with the cache and the importing sequence's KvCache id (e.g.
  // kvtransfer::ImportLayer); a non-OK status aborts the import (local prefill).
  using ImportTask = std::function<absl::Status(KvCache& kv, int64_t kv_seq)>;
  // Accepts `request` like Submit (same checks and errors), but the K/V of its prompt are written
  // into the cache from outside instead of being computed: at the next step's intake the engine
  // reserves blocks for the whole prompt and calls `on_reserved` (not null). While importing, the
  // sequence holds its blocks, takes no part in steps and is never preempted; Cancel and the
  // deadline end it as usual.
  // publish: the imported K/V are bit for bit what this node would compute (a lossless wire):
  // the prompt's longest cached prefix is then taken from the prefix cache at the reservation
  // (ImportTarget::first_block; only the rest is imported), and the prompt's full blocks go into
  // the cache when the import completes.
  absl::Status SubmitImport(GenerationRequest request, std::shared_ptr<GenerationSink> sink,
                            ImportReserved on_reserved, bool publish = false);
  // Queues `task` for the importing request `id` (run at the next intake, in order). Ignored when
  // `id` is not importing (any more).
  void PostImport(const std::string& id, ImportTask task);
  // Ends request `id`'s import. With the first token (sampled by whoever computed the prompt) the
  // sequence joins the running batch with its prompt computed: the token is emitted (or ends it:
  // a stop token, max_tokens 1) and decoding continues from it. With an error its blocks are
  // freed and it prefills locally. Ignored when `id` is not importing.
  void CompleteImport(const std::string& id, absl::StatusOr<int32_t> first_token);

  // ---- Exported KV: the prefill side of KV transfer (docs/scheduler.md, "Exported KV") ----
  // Runs on the engine thread inside Model::Forward, once per layer of the step that computes the
  // last chunk of the request's prompt, right after that layer's K/V were stored: the cache holds
  // the whole prompt's K/V of `layer` for sequence `kv_seq` (KvCache::ExportSpans). Must not block
  // for long and must not change the cache.
  using ExportLayer = std::function<void(const KvCache& kv, int64_t kv_seq, int layer)>;
  // Accepts `request` like Submit; `on_layer` (not empty) sees each layer of its prompt's K/V as
  // soon as it is computed (a prompt recomputed after a preemption is exported again).
  // hold_kv: when the request ends after its K/V were exported, its blocks stay allocated
  // (unchanged) until ReleaseExportedKv(kv_seq), so that a transport can read them in place after
  // the request finished (KV transfer's zero-copy send). Needs max_tokens 1 (the request ends in
  // the step that completes its prompt); INVALID_ARGUMENT otherwise.
  absl::Status SubmitExport(GenerationRequest request, std::shared_ptr<GenerationSink> sink,
                            ExportLayer on_layer, bool hold_kv = false);
  // Frees the blocks SubmitExport(hold_kv) kept for sequence `kv_seq` (the id its on_layer saw),
  // at the next intake. Any thread; ignored for a sequence that holds nothing (yet). Every held
  // sequence must be released (Shutdown frees what is left).
  void ReleaseExportedKv(int64_t kv_seq);
  // Sequences whose exported blocks are held (engine thread's count, published each step).
  int held_exports() const;

  // Stops accepting (Submit answers UNAVAILABLE), lets the step in progress end, joins the engine
  // thread and finishes every live request with kError / UNAVAILABLE, freeing its KV.
  // Idempotent. Not from a sink (it would join its own thread).
  void Shutdown();

  // Runs one step on the calling thread: pulls new requests and cancellations, runs deadlines,
  // schedules, forwards, samples, streams. Only with options.run_thread == false.
  StepStats Step();

  // Checks the KV bookkeeping: the block manager's invariants (BlockManager::Audit), and that
  // every sequence holding blocks is a live request or a held export, and every live running or
  // importing one holds enough blocks for its computed tokens. INTERNAL naming what is broken.
  // Only with options.run_thread == false (between Step() calls) or after Shutdown.
  absl::Status AuditKv() const;
  // AuditKv from any thread while the engine thread runs: the audit runs on the engine thread
  // between two steps and this call waits for its result (a node's Node.Audit). UNAVAILABLE when
  // the scheduler shuts down meanwhile; DEADLINE_EXCEEDED when no step boundary came within
  // `timeout`. Without an engine thread (run_thread = false, or after Shutdown) it is AuditKv().
  absl::Status AuditKvNow(absl::Duration timeout = absl::Seconds(10));

  const SchedulerOptions& options() const { return options_; }
  int kv_blocks_total() const { return kv_blocks_total_; }
  // The KV cache's shape and dtype (fixed at Create; any thread): what a KV transfer checks.
  const KvCacheOptions& kv_options() const { return kv_options_; }

 private:
  struct Sequence;
  struct Incoming {
    GenerationRequest request;
    std::shared_ptr<GenerationSink> sink;
    absl::Time arrival;
    int64_t arrival_order = 0;
    ImportReserved on_reserved;   // set: SubmitImport
    ExportLayer export_layer;     // set: SubmitExport
    bool hold_kv = false;         // SubmitExport(hold_kv)
    bool publish_import = false;  // SubmitImport(publish)
  };
  struct Event;  // sink call queued during a step, delivered at its end

  Scheduler(Model& model, std::unique_ptr<Model> owned, const SchedulerOptions& options,
            std::unique_ptr<KvCache> kv, int max_context);
  static absl::StatusOr<std::unique_ptr<Scheduler>> CreateImpl(Model& model,
                                                               std::unique_ptr<Model> owned,
                                                               const SchedulerOptions& options);
  absl::Status ValidateRequest(const GenerationRequest& request, const GenerationSink* sink) const;
  absl::Status Accept(GenerationRequest request, std::shared_ptr<GenerationSink> sink,
                      ImportReserved on_reserved, ExportLayer export_layer = nullptr,
                      bool hold_kv = false, bool publish_import = false);
  // Leading tokens of `seq` whose K/V rows have the numerics of any prompt's interior rows
  // (docs/numerics.md): the only rows the prefix cache files or reuses.
  static int CacheableTokens(const Sequence& seq);
  // Takes a waiting sequence's cached prefix at its admission (prefix_cache.enabled).
  void MatchCachedPrefix(Sequence& seq);
  // Records a lookup that found `hit` tokens: the request's cached_tokens and, for its first
  // lookup only, the query / hit token counts.
  void NoteCacheLookup(Sequence& seq, int hit);
  // prefix_cache.fill_generated: QueueFill remembers a finished request's tokens when a prefill
  // of them would file blocks its prompt did not; ManageFills (each step, after the intake)
  // drops the fill sequence as soon as a request is live and otherwise starts the newest
  // queued fill as an internal one-token request (no id, no sink, no counts, lowest priority).
  void QueueFill(const Sequence& seq);
  void ManageFills();
  void RunImports();  // posted import tasks and completions (engine thread)
  static void CloseImportFence(Sequence& seq);  // before an importing sequence's blocks change
  void ApplyReleases();                         // ReleaseExportedKv calls (engine thread)
  void AbortImport(Sequence* seq, const absl::Status& why);

  // The batch being built in a step.
  struct StepPlan {
    std::vector<Sequence*> decode;   // one token each
    std::vector<Sequence*> prefill;  // a chunk each
    int budget = 0;                  // tokens left
    int preemptions = 0;
    StepShape shape;  // what the step computes, for the step-time fit
    StepShape plain;  // its decode rows alone (PlanDecode's shape: no drafts, no prompt)
    bool prefill_time_limited = false;
    double prompt_arrival_rate = 0;  // the pacing rate this step used (StepStats)
  };

  void Loop();
  static constexpr int kCompressPerStep = 64;  // blocks compressed per step at most
  // Engine-thread work (no lock held unless named *Locked).
  StepStats RunStep();
  void PullLocked(std::deque<Incoming>* arrived,
                  std::vector<std::pair<std::string, FinishReason>>* cancels)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // New requests into waiting_ (built outside the lock), pending cancellations out.
  void Pull(std::vector<std::pair<std::string, FinishReason>>* cancels);
  void Intake();                     // new requests, cancellations, deadlines
  void PlanDecode(StepPlan& plan);   // a token for every decoding sequence
  void PlanPrefill(StepPlan& plan);  // chunks and admissions in the budget left
  // Draft tokens for the decoding sequences that speculate (after PlanDecode, before
  // PlanPrefill): chooses each one's K, runs the drafter, reserves the rows' KV.
  void PlanDrafts(StepPlan& plan, StepStats& stats);
  // PlanPrefill's limits for a step planned so far as `plan`, with `pending` prompt (or
  // recompute) tokens waiting (docs/scheduler.md, "Step-time budget"). Without `timed` (no
  // decode rows, or the budget off) none apply.
  struct PromptPace {
    bool timed = false;
    double budget_s = 0;  // the step's time budget; 0 until the step-time fit is ready
    int paced = INT_MAX;  // prompt tokens by pacing (the arrival rate and the backlog)
    int keep_up = 0;      // ... of which the time budget may not cut below this many
  };
  PromptPace Pace(const StepPlan& plan, int64_t pending) const;
  // The prompt tokens in [0, want] a chunk starting at position `start` may take under `pace`
  // in a step of `shape`, when the step's earlier chunks took `taken` (a timed pace only).
  int PromptAllowance(const PromptPace& pace, const StepShape& shape, int start, int want,
                      int taken) const;
  // The prompt tokens PlanPrefill will likely add to `plan`, for PlanDrafts' cost of a step: the
  // allowance of one chunk starting at position 0 (the chunks' positions are not known yet).
  int ExpectedPromptTokens(const StepPlan& plan, int64_t pending) const;
  // Verifies the draft of `s` against its logits rows (1 + drafted of them, in position order)
  // and emits the accepted tokens and the correction (or bonus) token.
  void Verify(Sequence* s, absl::Span<const size_t> rows, StepStats& stats);
  // Emits tokens generated for `s` this step and ends it on a stop token or max_tokens. Returns
  // false when the sequence finished.
  bool Emit(Sequence* s, int32_t token, std::vector<int32_t>* emitted);
  // Queues the tokens Emit collected as one OnTokens call.
  void FlushTokens(Sequence* s, std::vector<int32_t>* emitted);
  // Times target steps of 1..64 decode rows (SpeculativeOptions::cost when not given).
  absl::StatusOr<spec::SpecCost> MeasureStepCost();
  void Execute(const StepPlan& plan, StepStats& stats);     // forward, sample, finish
  bool Before(const Sequence& a, const Sequence& b) const;  // scheduling order
  void InsertWaiting(std::unique_ptr<Sequence> seq);
  std::unique_ptr<Sequence> Remove(Sequence* seq);  // from running_ or waiting_
  void Finish(std::unique_ptr<Sequence> seq, FinishReason reason, absl::Status status);
  Sequence* PickVictim();  // lowest priority (if enabled), then latest admission
  void Preempt(Sequence* victim, StepPlan& plan);
  // Publishes the load (and releases finished ids) under the lock; fills stats->load if given.
  void Publish(StepStats* stats);
  void Deliver();
  void FinishAllUnavailable();

  Model& model_;
  std::unique_ptr<Model> owned_model_;
  const SchedulerOptions options_;
  const int max_context_;
  const int n_vocab_;
  const int kv_blocks_total_;
  const int block_size_;
  const KvCacheOptions kv_options_;

  // Engine-thread state (the thread, or Step()'s caller, or Shutdown() after the join).
  std::unique_ptr<KvCache> kv_;
  std::vector<std::unique_ptr<Sequence>> waiting_;    // in scheduling order
  std::vector<std::unique_ptr<Sequence>> running_;    // in admission order
  std::vector<std::unique_ptr<Sequence>> importing_;  // holding blocks, K/V arriving from outside
  std::vector<Event> events_;
  std::vector<std::string> finished_ids_;  // this step's, released under the lock at Publish
  std::vector<int64_t> finished_tokens_;
  std::vector<float> logits_;
  // The last step's logits rows as their best entries (Model::ForwardTop), when use_top_: then
  // logits_ is stale.
  TopLogits top_;
  bool use_top_ = false;
  int64_t next_seq_id_ = 0;
  int64_t cache_query_tokens_ = 0;  // prompt tokens looked up in the prefix cache
  int64_t cache_hit_tokens_ = 0;    // of those, tokens found
  std::deque<std::vector<int32_t>> fills_;  // finished requests' tokens to file (QueueFill)
  Sequence* live_fill_ = nullptr;  // the fill sequence in running_ or waiting_ (at most one)
  int64_t fill_tokens_ = 0;  // tokens fills computed (their cached prefixes not counted)
  std::shared_ptr<const std::vector<uint64_t>> summary_;  // EngineLoad::cached_block_hashes
  absl::Time summary_time_ = absl::InfinitePast();
  int64_t next_admission_ = 0;
  int64_t step_no_ = 0;
  StepTimeModel step_time_;                  // step cost fit for the step-time budget
  double prompt_arrival_rate_ = 0;           // prompt tokens arriving per decoding step (EWMA)
  std::optional<spec::SpecCost> spec_cost_;  // target step seconds by rows (speculation on)
  std::optional<spec::SpecCost> spec_head_cost_;  // SpeculativeOptions::head_cost, when it applies
  TokenDist target_dist_;                    // scratch: p in verification
  // Seconds the verification of one draft token takes on the engine thread (its row's target
  // distribution, the rule), a running average: part of a draft token's cost in ChooseK.
  double verify_row_seconds_ = 0;
  spec::SpecGate spec_gate_;  // measured speculating vs plain step rates, by batch size
  spec::AcceptanceEstimate drafter_acceptance_;  // over all sequences: their prior
  // Draft catch-up left out of this step's measure (charged when its sequence ends), and the
  // catch-up of ended sequences not yet charged to the gate.
  double catch_up_deferred_ = 0;
  double gate_debt_ = 0;
  double draft_token_seconds_ = 0;  // the drafter's measured seconds per proposed token (EWMA)

  mutable absl::Mutex mu_;
  absl::CondVar wake_;
  bool accepting_ ABSL_GUARDED_BY(mu_) = true;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  // AuditKvNow calls waiting for the engine thread; it answers them between two steps.
  struct AuditCall {
    absl::Status result;
    bool done = false;
  };
  std::vector<std::shared_ptr<AuditCall>> audits_ ABSL_GUARDED_BY(mu_);
  void RunAudits();                            // engine thread
  absl::Status AuditKvOnEngineThread() const;  // AuditKv's checks; the engine thread's state
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
  std::deque<Incoming> incoming_ ABSL_GUARDED_BY(mu_);
  int64_t incoming_prompt_tokens_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::pair<std::string, FinishReason>> cancels_ ABSL_GUARDED_BY(mu_);
  std::vector<std::pair<std::string, ImportTask>> import_tasks_ ABSL_GUARDED_BY(mu_);
  std::vector<std::pair<std::string, absl::StatusOr<int32_t>>> import_done_ ABSL_GUARDED_BY(mu_);
  std::vector<int64_t> releases_ ABSL_GUARDED_BY(mu_);  // ReleaseExportedKv, not yet applied
  int held_published_ ABSL_GUARDED_BY(mu_) = 0;
  // Engine thread: kv ids of finished exports whose blocks are held (SubmitExport hold_kv).
  absl::flat_hash_set<int64_t> held_;
  // Live request id -> its prompt + max_tokens (for the total-token limit).
  absl::flat_hash_map<std::string, int64_t> live_ ABSL_GUARDED_BY(mu_);
  int64_t live_tokens_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t next_arrival_ ABSL_GUARDED_BY(mu_) = 0;
  // The engine's part of the load, published at the end of each step.
  EngineLoad engine_load_ ABSL_GUARDED_BY(mu_);
  bool engine_busy_ ABSL_GUARDED_BY(mu_) = false;  // sequences running or waiting

  absl::Mutex shutdown_mu_;  // serializes Shutdown callers
  std::thread thread_;
};

}  // namespace pd::engine
