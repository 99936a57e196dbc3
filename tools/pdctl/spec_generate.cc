#include "tools/pdctl/spec_generate.h"

#include <algorithm>

#include "common/status.h"
#include "common/strings.h"
#include "node/engine_builder.h"

namespace pd::tools {

void SpecFlags::Add(CLI::App* app) {
  app->add_option("--spec", spec,
                  "speculative decoding (lossless): off, ngram (prompt lookup), self (the "
                  "model's own draft: pdctl quantize --draft, found or built on first use), "
                  "self-head (the model's own layers with its head cut to 32768 frequent "
                  "tokens; no file) or the path of a draft GGUF with the model's vocabulary");
  app->add_option("--spec-k", spec_k, "the most draft tokens per step (1..16; K adapts below it)")
      ->check(CLI::Range(1, 16));
}

namespace {

// Collects the stream on the engine thread (Step() runs on this thread: no locking needed).
class CallbackSink final : public engine::GenerationSink {
 public:
  explicit CallbackSink(const engine::TokenCallback& cb) : cb_(cb) {}
  void OnTokens(const std::vector<int32_t>& tokens) override {
    for (int32_t t : tokens) {
      if (stopped) return;  // generated in the step that matched a stop string
      if (first_token == absl::InfinitePast()) first_token = absl::Now();
      out.push_back(t);
      if (cb_ && !cb_(t)) stopped = true;
    }
  }
  void OnFinish(const engine::FinishInfo& i) override {
    info = i;
    finished = true;
  }
  std::vector<int32_t> out;
  absl::Time first_token = absl::InfinitePast();
  bool stopped = false, finished = false;
  engine::FinishInfo info;

 private:
  const engine::TokenCallback& cb_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<SpecGenerator>> SpecGenerator::Create(Engine& engine,
                                                                     const SpecFlags& flags,
                                                                     int threads) {
  SpeculativeConfigOptions o;
  o.drafter = flags.spec;
  o.max_k = flags.spec_k;
  PD_ASSIGN_OR_RETURN(std::shared_ptr<engine::spec::Drafter> drafter,
                      node::BuildDrafter(o, *engine.model, engine.model_path, *engine.backend,
                                         threads));
  engine::SchedulerOptions so;
  so.kv_blocks = engine.kv->total_blocks();
  so.block_size = engine.kv->options().block_size;
  so.kv_dtype = engine.kv->options().dtype;
  so.max_running_seqs = 1;
  so.token_budget = 512;
  so.prefill_chunk = 512;
  so.prefix_cache.enabled = false;  // Generate's numerics: every prompt computed
  so.run_thread = false;
  so.speculative.drafter = drafter;
  so.speculative.max_k = flags.spec_k;
  auto gen = std::make_unique<SpecGenerator>();
  gen->drafter_name_ = drafter ? std::string(drafter->name()) : "off";
  PD_ASSIGN_OR_RETURN(gen->scheduler_, engine::Scheduler::Create(*engine.model, so));
  return gen;
}

absl::StatusOr<engine::GenerateResult> SpecGenerator::Generate(
    const std::vector<int32_t>& prompt, const engine::GenerateOptions& options,
    const engine::TokenCallback& on_token, SpecCounts* counts) {
  engine::GenerateResult result;
  result.prompt_tokens = static_cast<int>(prompt.size());
  if (options.max_tokens == 0) {
    result.finish_reason = "length";
    return result;
  }
  engine::GenerationRequest r;
  r.id = StrCat("generate-", calls_++);
  r.prompt = prompt;
  r.sampling = options.sampling;
  r.max_tokens = options.max_tokens;
  if (!options.ignore_eos) r.stop_token_ids = options.eog_tokens;
  auto sink = std::make_shared<CallbackSink>(on_token);
  const absl::Time t0 = absl::Now();
  PD_RETURN_IF_ERROR(scheduler_->Submit(r, sink));
  SpecCounts c;
  bool cancelled = false;
  while (!sink->finished) {
    const engine::StepStats st = scheduler_->Step();
    if (sink->first_token != absl::InfinitePast() && st.prefill_tokens == 0) ++c.steps;
    c.draft_tokens += st.draft_tokens;
    c.accepted_tokens += st.accepted_tokens;
    if (sink->stopped && !cancelled) {
      scheduler_->Cancel(r.id, engine::FinishReason::kStop);
      cancelled = true;
    }
  }
  const absl::Time t1 = absl::Now();
  if (sink->info.reason == engine::FinishReason::kError) return sink->info.status;
  result.tokens = sink->out;
  result.finish_reason =
      sink->info.reason == engine::FinishReason::kLength && !sink->stopped ? "length" : "stop";
  const absl::Time first = sink->first_token == absl::InfinitePast() ? t1 : sink->first_token;
  result.prefill_seconds = absl::ToDoubleSeconds(first - t0);
  result.decode_seconds = absl::ToDoubleSeconds(t1 - first);
  if (counts != nullptr) *counts = c;
  return result;
}

}  // namespace pd::tools
