#include "engine/spec/acceptance.h"

#include <algorithm>

#include "absl/container/flat_hash_map.h"

namespace pd::engine::spec {

Verdict AcceptOrResample(const TokenDist& p, int32_t x, const TokenDist* q, Sampler& rng) {
  const double px = p.Prob(x);
  const double qx = q == nullptr ? 1.0 : q->Prob(x);
  if (px > 0 && (px >= qx || rng.Uniform() * qx < px)) return {x, true};
  // Rejected: the residual max(0, p - q), over p's support (elsewhere p is 0).
  TokenDist residual;
  residual.ids.reserve(p.ids.size());
  residual.probs.reserve(p.ids.size());
  double sum = 0;
  if (q == nullptr) {
    for (size_t i = 0; i < p.ids.size(); ++i) {
      const double r = p.ids[i] == x ? std::max(0.0, p.probs[i] - 1.0) : p.probs[i];
      if (r <= 0) continue;
      residual.ids.push_back(p.ids[i]);
      residual.probs.push_back(static_cast<float>(r));
      sum += r;
    }
  } else {
    absl::flat_hash_map<int32_t, float> qmap;
    qmap.reserve(q->ids.size());
    for (size_t i = 0; i < q->ids.size(); ++i) qmap[q->ids[i]] = q->probs[i];
    for (size_t i = 0; i < p.ids.size(); ++i) {
      auto it = qmap.find(p.ids[i]);
      const double r = p.probs[i] - (it == qmap.end() ? 0.0 : it->second);
      if (r <= 0) continue;
      residual.ids.push_back(p.ids[i]);
      residual.probs.push_back(static_cast<float>(r));
      sum += r;
    }
  }
  // p <= q everywhere (to rounding) means p == q: then x could not have been rejected except by
  // rounding, and p itself is the right distribution.
  if (residual.ids.empty() || sum <= 0) return {rng.Draw(p), false};
  for (float& r : residual.probs) r = static_cast<float>(r / sum);
  return {rng.Draw(residual), false};
}

}  // namespace pd::engine::spec
