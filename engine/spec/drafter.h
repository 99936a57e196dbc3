// Drafters for speculative decoding (docs/speculative.md): something that cheaply proposes the
// next few tokens of a sequence, which the target model then verifies in one step.
//
// A Drafter serves every speculating sequence of one Scheduler: Propose is called once per engine
// step with all of that step's requests, so that a draft model batches its forwards. It runs on
// the engine thread only and is not thread safe. A drafter never fails a request: when it cannot
// propose (no match, no room in its own cache) it returns fewer tokens, or none.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "engine/sched/sampler.h"

namespace pd::engine {
class KvCache;
}

namespace pd::engine::spec {

// One sequence's request for a draft.
struct DraftRequest {
  int64_t seq = 0;                    // the sequence's id (stable for its life; its KV id)
  absl::Span<const int32_t> tokens;   // prompt + generated tokens; the last one is fed next step
  int max_draft = 0;                  // propose at most this many tokens (>= 1)
  const SamplingParams* sampling = nullptr;  // the request's sampling chain (for a model's q)

  // Filled by Propose: up to max_draft tokens following `tokens`.
  std::vector<int32_t> draft;
  // The draft's distribution at each proposed position (q in the acceptance rule), after the
  // request's own sampling chain. Empty: the proposals are deterministic (q(draft[i]) = 1).
  std::vector<TokenDist> q;

  // For a drafter that runs the target's own layers (SharesTargetKv): the target's cache, in
  // which the caller has reserved positions up to tokens.size() - 2 + max_draft, and the
  // sequence's prompt length (its rows' summation orders, Batch::AddOrdered).
  KvCache* target_kv = nullptr;
  int32_t prompt_len = 0;
  // Filled by such a drafter: draft.size() rows of n_embd floats, row i the target's final hidden
  // state at position tokens.size() - 1 + i (the one whose logits verify draft[i]); the K/V of
  // those positions are in target_kv.
  std::vector<float> hidden;
};

// The sampling chain a drafter draws its proposals with: the request's, from an RNG stream of its
// own (not the target's, whose draws the acceptance rule makes).
inline SamplingParams DraftSampling(const SamplingParams& request) {
  SamplingParams p = request;
  p.seed = p.seed * 0x9E3779B97F4A7C15ull + 0x5DEECE66Dull;
  return p;
}

class Drafter {
 public:
  virtual ~Drafter() = default;
  // "ngram", "model", ...: the drafter's kind, for logs and metrics.
  virtual std::string_view name() const = 0;
  // Proposes for every request. Errors are the drafter's own faults (a forward that failed): the
  // scheduler then runs the step without drafts and logs it.
  virtual absl::Status Propose(absl::Span<DraftRequest* const> requests) = 0;
  // Sequence `seq` ended: drop whatever the drafter keeps for it.
  virtual void Release(int64_t seq) {}
  // Runs the target's own layers on the target's cache and returns hidden states
  // (DraftRequest::target_kv, hidden): the verifying step then runs only the output head for
  // the drafted positions.
  virtual bool SharesTargetKv() const { return false; }
  // Seconds of one draft step proposing one token for each of `rows` sequences; 0 for a drafter
  // that costs nothing next to a target step (n-gram lookup). Measured by the drafter.
  virtual double StepSeconds(int rows) const { return 0; }
  // Seconds of work the drafter must do for sequence `seq` (tokens as in DraftRequest) before it
  // can propose: a draft model catching up on the tokens decoded since its last draft. 0 for a
  // drafter that keeps no state.
  virtual double CatchUpSeconds(int64_t seq, absl::Span<const int32_t> tokens) const {
    return 0;
  }
};

}  // namespace pd::engine::spec
