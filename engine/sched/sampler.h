// Token sampling from next-token logits.
//
// The chain, in order: repetition penalty over the last `penalty_last_n` tokens, top-k, top-p,
// min-p, temperature, then a draw from the remaining distribution with the sampler's seeded RNG.
// temperature <= 0 is greedy (argmax after the penalty; ties go to the lowest id). The same seed
// and the same logits give the same tokens. Not thread safe: one sampler per sequence.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace pd::engine {

struct SamplingParams {
  float temperature = 0.8f;
  int top_k = 40;            // <= 0: disabled
  float top_p = 0.95f;       // >= 1: disabled
  float min_p = 0.05f;       // <= 0: disabled
  float repetition_penalty = 1.0f;  // 1: disabled; > 1 discourages repeats
  int penalty_last_n = 64;
  uint64_t seed = 0;

  // INVALID_ARGUMENT naming the field for out-of-range values.
  absl::Status Validate() const;
  static SamplingParams Greedy();
};

// Index of the largest value, the lowest index among equal ones (greedy decoding's choice); 0
// when `logits` holds only NaNs (or is empty). RowTopK with k = 1 (engine/backend/top_k.h), the
// ranking Backend::TopK gives: one pass over 64-value blocks, 33 us over Gemma's 262k logits in
// L2 on the AVX-512 Xeon.
int32_t ArgMax(absl::Span<const float> logits);

// A next-token distribution after the sampling chain: the ids it can draw, most probable first
// (ties: lower id first), with their probabilities (summing to 1). Greedy: one id with 1.
struct TokenDist {
  std::vector<int32_t> ids;
  std::vector<float> probs;
  // Probability of `id` (0 when it is not among ids). Linear in ids.size().
  float Prob(int32_t id) const;
};

class Sampler {
 public:
  explicit Sampler(const SamplingParams& params);

  // Picks the next token. `history` holds the sequence's tokens so far (prompt and output), for
  // the repetition penalty. `logits` has n_vocab entries and is not modified. The same as
  // Draw(Distribution(logits, history)), without building the distribution when greedy.
  int32_t Sample(absl::Span<const float> logits, absl::Span<const int32_t> history);

  // The distribution Sample draws from, after the whole chain (penalty, top-k, top-p, min-p,
  // temperature): what speculative decoding compares between draft and target.
  void Distribution(absl::Span<const float> logits, absl::Span<const int32_t> history,
                    TokenDist* out);
  // How many of a row's best logits decide Sample and Distribution (so that a forward pass can
  // copy back only those: Model::ForwardTop): 1 for greedy decoding, top_k with top-k on; 0 when
  // the whole row is needed (no top-k, or a repetition penalty, which can lift any id).
  int TopNeeded() const;
  // Sample and Distribution from a row's best entries: `ids` and `logits` hold at least
  // TopNeeded() (> 0) of them, or the whole of a shorter row, in top_k.h's rank order
  // (Backend::TopK). Same results, same RNG draws, as from the whole row.
  int32_t SampleTop(absl::Span<const int32_t> ids, absl::Span<const float> logits);
  void DistributionTop(absl::Span<const int32_t> ids, absl::Span<const float> logits,
                       TokenDist* out);

  // Draws from `dist` with the sampler's RNG (one uniform, none when it holds a single id).
  int32_t Draw(const TokenDist& dist);
  // A uniform draw in [0, 1) from the sampler's RNG (speculative acceptance tests).
  double Uniform();

  const SamplingParams& params() const { return params_; }

 private:
  struct Candidate {
    int32_t id;
    float logit;
  };
  SamplingParams params_;
  std::mt19937_64 rng_;
  std::vector<Candidate> cand_;      // scratch
  std::vector<Candidate> penalized_;  // scratch: ids under the repetition penalty
  std::vector<float> probs_;     // scratch
  TokenDist dist_;                // scratch for Sample
  // Fills cand_ / probs_ with the chain's result (non-greedy, or greedy with a penalty: then a
  // single candidate). Returns false for plain greedy (no penalty): the caller takes ArgMax.
  bool Chain(absl::Span<const float> logits, absl::Span<const int32_t> history);
  // Chain from a row's best entries (SampleTop's precondition): cand_ = the first top_k of
  // them, then the filters.
  void ChainTop(absl::Span<const int32_t> ids, absl::Span<const float> logits);
  // The chain past top-k over cand_ (sorted best first): drops -inf, top-p, min-p, temperature.
  void Filter();
  // Sample's draw from cand_ / probs_.
  int32_t DrawCandidates();
};

}  // namespace pd::engine
