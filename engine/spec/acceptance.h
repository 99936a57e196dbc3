// The acceptance rule of speculative decoding (docs/speculative.md, "The rule"): one position of
// a draft, verified against the target's distribution. Drawn this way, every emitted token has
// exactly the target's distribution, whatever the draft proposed.
#pragma once

#include <cstdint>

#include "engine/sched/sampler.h"

namespace pd::engine::spec {

struct Verdict {
  int32_t token = 0;      // the token emitted at this position
  bool accepted = false;  // token is the draft's proposal (and the next position may be tried)
};

// Target distribution `p` (after the request's sampling chain), draft proposal `x` drawn from
// `q` (nullptr: a deterministic proposal, q(x) = 1). Accepts x with probability
// min(1, p(x) / q(x)) (no random draw when p(x) >= q(x), so greedy decoding draws nothing);
// otherwise draws the token from norm(max(0, p - q)) with `rng`.
Verdict AcceptOrResample(const TokenDist& p, int32_t x, const TokenDist* q, Sampler& rng);

}  // namespace pd::engine::spec
