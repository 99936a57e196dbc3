#include "engine/sched/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <unordered_set>

#include "common/status.h"
#include "common/strings.h"
#include "engine/backend/top_k.h"

namespace pd::engine {

absl::Status SamplingParams::Validate() const {
  if (!(temperature >= 0) || !std::isfinite(temperature)) {
    return absl::InvalidArgumentError(pd::StrCat("temperature must be >= 0, got ", temperature));
  }
  if (!(top_p > 0 && top_p <= 1)) {
    return absl::InvalidArgumentError(pd::StrCat("top_p must be in (0, 1], got ", top_p));
  }
  if (!(min_p >= 0 && min_p <= 1)) {
    return absl::InvalidArgumentError(pd::StrCat("min_p must be in [0, 1], got ", min_p));
  }
  if (!(repetition_penalty > 0) || !std::isfinite(repetition_penalty)) {
    return absl::InvalidArgumentError(
        pd::StrCat("repetition_penalty must be > 0, got ", repetition_penalty));
  }
  if (penalty_last_n < 0) {
    return absl::InvalidArgumentError(
        pd::StrCat("penalty_last_n must be >= 0, got ", penalty_last_n));
  }
  return absl::OkStatus();
}

SamplingParams SamplingParams::Greedy() {
  SamplingParams p;
  p.temperature = 0;
  p.top_k = 0;
  p.top_p = 1;
  p.min_p = 0;
  return p;
}

int32_t ArgMax(absl::Span<const float> logits) {
  if (logits.empty()) return 0;
  int32_t id = 0;
  float value;
  RowTopK(logits.data(), static_cast<int64_t>(logits.size()), 1, &id, &value);
  return id;
}

Sampler::Sampler(const SamplingParams& params) : params_(params), rng_(params.seed) {}

float TokenDist::Prob(int32_t id) const {
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] == id) return probs[i];
  }
  return 0.0f;
}

int32_t Sampler::Sample(absl::Span<const float> logits, absl::Span<const int32_t> history) {
  if (!Chain(logits, history)) return ArgMax(logits);  // greedy, no copies
  return DrawCandidates();
}

int32_t Sampler::DrawCandidates() {
  if (cand_.size() == 1) return cand_[0].id;
  std::uniform_real_distribution<double> uni(0.0, 1.0);
  double r = uni(rng_);
  for (size_t i = 0; i < cand_.size(); ++i) {
    r -= probs_[i];
    if (r <= 0) return cand_[i].id;
  }
  return cand_.back().id;
}

int Sampler::TopNeeded() const {
  if (params_.repetition_penalty != 1.0f && params_.penalty_last_n > 0) return 0;
  if (params_.temperature <= 0) return 1;
  return params_.top_k > 0 ? params_.top_k : 0;
}

int32_t Sampler::SampleTop(absl::Span<const int32_t> ids, absl::Span<const float> logits) {
  PD_CHECK(TopNeeded() > 0 && ids.size() == logits.size() && !ids.empty());
  if (params_.temperature <= 0) return ids[0];  // greedy: the best entry, ties to the lower id
  ChainTop(ids, logits);
  return DrawCandidates();
}

void Sampler::DistributionTop(absl::Span<const int32_t> ids, absl::Span<const float> logits,
                              TokenDist* out) {
  PD_CHECK(TopNeeded() > 0 && ids.size() == logits.size() && !ids.empty());
  out->ids.clear();
  out->probs.clear();
  if (params_.temperature <= 0) {
    out->ids.push_back(ids[0]);
    out->probs.push_back(1.0f);
    return;
  }
  ChainTop(ids, logits);
  out->ids.reserve(cand_.size());
  for (const Candidate& c : cand_) out->ids.push_back(c.id);
  if (cand_.size() == 1) {
    out->probs.push_back(1.0f);
  } else {
    out->probs.assign(probs_.begin(), probs_.begin() + cand_.size());
  }
}

void Sampler::ChainTop(absl::Span<const int32_t> ids, absl::Span<const float> logits) {
  // The best top_k of the row in rank order are the candidates Chain's heap keeps, in the order
  // its sort gives them (both order by logit, then id).
  const size_t k = std::min<size_t>(params_.top_k, ids.size());
  cand_.resize(k);
  for (size_t i = 0; i < k; ++i) cand_[i] = {ids[i], logits[i]};
  Filter();
}

void Sampler::Distribution(absl::Span<const float> logits, absl::Span<const int32_t> history,
                           TokenDist* out) {
  out->ids.clear();
  out->probs.clear();
  if (!Chain(logits, history)) {
    out->ids.push_back(ArgMax(logits));
    out->probs.push_back(1.0f);
    return;
  }
  out->ids.reserve(cand_.size());
  for (const Candidate& c : cand_) out->ids.push_back(c.id);
  if (cand_.size() == 1) {
    out->probs.push_back(1.0f);
  } else {
    out->probs.assign(probs_.begin(), probs_.begin() + cand_.size());
  }
}

int32_t Sampler::Draw(const TokenDist& dist) {
  PD_CHECK(!dist.ids.empty());
  if (dist.ids.size() == 1) return dist.ids[0];
  double r = Uniform();
  for (size_t i = 0; i < dist.ids.size(); ++i) {
    r -= dist.probs[i];
    if (r <= 0) return dist.ids[i];
  }
  // Rounding left mass over: the last id with a non-zero probability.
  for (size_t i = dist.ids.size(); i-- > 0;) {
    if (dist.probs[i] > 0) return dist.ids[i];
  }
  return dist.ids.back();
}

double Sampler::Uniform() {
  std::uniform_real_distribution<double> uni(0.0, 1.0);
  return uni(rng_);
}

bool Sampler::Chain(absl::Span<const float> logits, absl::Span<const int32_t> history) {
  PD_CHECK(!logits.empty());
  const int32_t n_vocab = static_cast<int32_t>(logits.size());
  const bool penalize =
      params_.repetition_penalty != 1.0f && params_.penalty_last_n > 0 && !history.empty();
  if (params_.temperature <= 0 && !penalize) return false;
  auto by_logit = [](const Candidate& a, const Candidate& b) {
    return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
  };
  // Repetition penalty (CTRL-style): positive logits divided, negative multiplied. The penalized
  // ids (at most penalty_last_n) are kept aside with their new logits.
  std::vector<Candidate>& penalized = penalized_;
  penalized.clear();
  if (penalize) {
    const size_t n = std::min<size_t>(history.size(), params_.penalty_last_n);
    std::unordered_set<int32_t> seen(history.end() - n, history.end());
    for (int32_t id : seen) {
      if (id < 0 || id >= n_vocab) continue;
      const float l = logits[id];
      penalized.push_back({id, l > 0 ? l / params_.repetition_penalty
                                      : l * params_.repetition_penalty});
    }
    std::sort(penalized.begin(), penalized.end(),
              [](const Candidate& a, const Candidate& b) { return a.id < b.id; });
  }
  if (params_.temperature <= 0) {  // greedy with a penalty
    Candidate best{-1, -std::numeric_limits<float>::infinity()};
    size_t next_pen = 0;
    for (int32_t i = 0; i < n_vocab; ++i) {
      Candidate c{i, logits[i]};
      if (next_pen < penalized.size() && penalized[next_pen].id == i) c = penalized[next_pen++];
      if (best.id < 0 || by_logit(c, best)) best = c;
    }
    cand_.assign(1, best);
    probs_.assign(1, 1.0f);
    return true;
  }

  // Top-k: the k best by (logit desc, id asc) in one pass with a heap whose top is the worst kept
  // candidate (most logits fail one comparison against it), then sorted: the same candidates in
  // the same order as sorting everything. Without top-k, every id is a candidate.
  const size_t k = params_.top_k > 0 ? std::min<size_t>(params_.top_k, n_vocab) : n_vocab;
  cand_.clear();
  cand_.reserve(k);
  size_t next_pen = 0;
  for (int32_t i = 0; i < n_vocab; ++i) {
    Candidate c{i, logits[i]};
    if (next_pen < penalized.size() && penalized[next_pen].id == i) c = penalized[next_pen++];
    if (k == static_cast<size_t>(n_vocab)) {
      cand_.push_back(c);  // everything: sorted once below
    } else if (cand_.size() < k) {
      cand_.push_back(c);
      std::push_heap(cand_.begin(), cand_.end(), by_logit);
    } else if (by_logit(c, cand_.front())) {
      std::pop_heap(cand_.begin(), cand_.end(), by_logit);
      cand_.back() = c;
      std::push_heap(cand_.begin(), cand_.end(), by_logit);
    }
  }
  std::sort(cand_.begin(), cand_.end(), by_logit);
  Filter();
  return true;
}

void Sampler::Filter() {
  // Ids that can never be drawn (-inf logits: a draft head's missing rows) leave the list.
  while (cand_.size() > 1 && cand_.back().logit == -std::numeric_limits<float>::infinity()) {
    cand_.pop_back();
  }

  // Probabilities at temperature 1 for the p-filters (softmax over the kept candidates).
  auto softmax = [&](float temp) {
    probs_.resize(cand_.size());
    const float mx = cand_[0].logit;
    double sum = 0;
    for (size_t i = 0; i < cand_.size(); ++i) {
      probs_[i] = std::exp((cand_[i].logit - mx) / temp);
      sum += probs_[i];
    }
    for (float& p : probs_) p = static_cast<float>(p / sum);
  };
  softmax(1.0f);
  if (params_.top_p < 1.0f) {
    double cum = 0;
    size_t i = 0;
    for (; i < cand_.size(); ++i) {
      cum += probs_[i];
      if (cum >= params_.top_p) {
        ++i;
        break;
      }
    }
    cand_.resize(std::max<size_t>(i, 1));
    probs_.resize(cand_.size());
  }
  if (params_.min_p > 0) {
    const float threshold = probs_[0] * params_.min_p;
    size_t i = 1;
    while (i < cand_.size() && probs_[i] >= threshold) ++i;
    cand_.resize(i);
  }
  softmax(params_.temperature);
}

}  // namespace pd::engine
