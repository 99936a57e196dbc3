// Single-sequence generation on a Model: chunked prefill of the prompt, then one decode step per
// token. Used by `pdctl generate`; the serving scheduler batches many sequences instead.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "engine/kv/kv_cache.h"
#include "engine/runtime/model.h"
#include "engine/sched/sampler.h"

namespace pd::engine {

struct GenerateOptions {
  int max_tokens = 128;
  SamplingParams sampling;
  absl::flat_hash_set<int32_t> eog_tokens;  // end-of-generation ids (ignored with ignore_eos)
  bool ignore_eos = false;
  int prefill_chunk = 512;  // prompt tokens per forward
};

struct GenerateResult {
  std::vector<int32_t> tokens;  // generated ids (the EOG token, if hit, is not included)
  std::string finish_reason;    // "stop" (EOG or callback), "length"
  int prompt_tokens = 0;
  double prefill_seconds = 0;   // prompt processing, including the first token's logits
  double decode_seconds = 0;    // all later steps
};

// Called for each generated token; return false to stop (e.g. a stop string matched).
using TokenCallback = std::function<bool(int32_t token)>;

// Runs one sequence (id `seq`) to completion in `kv`, freeing its blocks at the end whatever
// the outcome. INVALID_ARGUMENT for an empty prompt or one longer than the cache;
// RESOURCE_EXHAUSTED when the cache runs out of blocks.
absl::StatusOr<GenerateResult> Generate(Model& model, KvCache& kv, int64_t seq,
                                        const std::vector<int32_t>& prompt,
                                        const GenerateOptions& options,
                                        const TokenCallback& on_token);

}  // namespace pd::engine
