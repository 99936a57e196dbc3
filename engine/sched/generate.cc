#include "engine/sched/generate.h"

#include <algorithm>
#include <chrono>

#include "common/status.h"
#include "common/strings.h"

namespace pd::engine {
namespace {

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

absl::StatusOr<GenerateResult> Generate(Model& model, KvCache& kv, int64_t seq,
                                        const std::vector<int32_t>& prompt,
                                        const GenerateOptions& options,
                                        const TokenCallback& on_token) {
  if (prompt.empty()) return absl::InvalidArgumentError("the prompt is empty");
  if (options.max_tokens < 0) return absl::InvalidArgumentError("max_tokens must be >= 0");
  if (options.prefill_chunk <= 0) return absl::InvalidArgumentError("prefill_chunk must be > 0");
  PD_RETURN_IF_ERROR(options.sampling.Validate());
  const int64_t capacity = int64_t{kv.total_blocks()} * kv.options().block_size;
  if (static_cast<int64_t>(prompt.size()) + options.max_tokens > capacity) {
    return absl::InvalidArgumentError(pd::StrCat(
        "prompt (", prompt.size(), " tokens) + max_tokens (", options.max_tokens,
        ") exceeds the KV cache capacity of ", capacity, " tokens"));
  }
  struct FreeOnExit {
    KvCache& kv;
    int64_t seq;
    ~FreeOnExit() { kv.Free(seq); }
  } free_on_exit{kv, seq};

  GenerateResult result;
  result.prompt_tokens = static_cast<int>(prompt.size());
  const int n_vocab = model.config().n_vocab;
  Sampler sampler(options.sampling);
  std::vector<int32_t> history = prompt;
  std::vector<float> logits;
  // Only the row's best entries leave the backend when they decide the token (Scheduler does the
  // same; Sampler::TopNeeded).
  const int top_k = sampler.TopNeeded() <= std::min(n_vocab, kMaxTopK) ? sampler.TopNeeded() : 0;
  TopLogits top;
  const auto forward = [&](const Batch& batch) {
    return top_k > 0 ? model.ForwardTop(batch, kv, top_k, &top) : model.Forward(batch, kv, &logits);
  };

  const double t0 = Now();
  for (size_t start = 0; start < prompt.size(); start += options.prefill_chunk) {
    const size_t end = std::min(prompt.size(), start + options.prefill_chunk);
    PD_RETURN_IF_ERROR(kv.Reserve(seq, static_cast<int>(end)));
    Batch batch;
    for (size_t i = start; i < end; ++i) {
      batch.AddOrdered(prompt[i], static_cast<int32_t>(i), seq, i + 1 == prompt.size(),
                       static_cast<int32_t>(prompt.size()));
    }
    PD_RETURN_IF_ERROR(forward(batch));
  }
  const double t1 = Now();
  result.prefill_seconds = t1 - t0;

  result.finish_reason = "length";
  for (int step = 0; step < options.max_tokens; ++step) {
    const int32_t token =
        top_k > 0 ? sampler.SampleTop(top.Ids(0), top.Values(0))
                  : sampler.Sample(absl::MakeConstSpan(logits.data(), n_vocab), history);
    if (!options.ignore_eos && options.eog_tokens.contains(token)) {
      result.finish_reason = "stop";
      break;
    }
    result.tokens.push_back(token);
    history.push_back(token);
    if (on_token && !on_token(token)) {
      result.finish_reason = "stop";
      break;
    }
    if (step + 1 == options.max_tokens) break;  // no logits needed after the last token
    const int32_t pos = static_cast<int32_t>(history.size()) - 1;
    PD_RETURN_IF_ERROR(kv.Reserve(seq, pos + 1));
    Batch batch;
    batch.AddOrdered(token, pos, seq, true, static_cast<int32_t>(prompt.size()));
    PD_RETURN_IF_ERROR(forward(batch));
  }
  result.decode_seconds = Now() - t1;
  return result;
}

}  // namespace pd::engine
