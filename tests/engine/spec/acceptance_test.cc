#include "engine/spec/acceptance.h"

#include <random>

#include <gtest/gtest.h>

#include "tests/testing/chi_square.h"

namespace pd::engine::spec {
namespace {

using engine::testing::ChiSquareTest;

TokenDist Dist(std::vector<int32_t> ids, std::vector<float> probs) {
  return TokenDist{std::move(ids), std::move(probs)};
}

TEST(ChiSquareHelper, KnownValues) {
  // Q(1, x) = exp(-x); chi-square with 2 dof at 5.991 has p = 0.05; with 10 dof at 23.209, 0.01.
  EXPECT_NEAR(engine::testing::UpperRegularizedGamma(1, 2), std::exp(-2.0), 1e-12);
  EXPECT_NEAR(engine::testing::UpperRegularizedGamma(1, 2.9955), 0.05, 1e-4);
  EXPECT_NEAR(engine::testing::UpperRegularizedGamma(5, 11.6046), 0.01, 1e-4);
  EXPECT_NEAR(engine::testing::UpperRegularizedGamma(5, 2), 0.947347, 1e-5);
}

TEST(AcceptOrResample, GreedyAcceptsTheArgmaxAndDrawsNothing) {
  const TokenDist p = Dist({7}, {1.0f});
  Sampler rng(SamplingParams{.seed = 3});
  Sampler twin(SamplingParams{.seed = 3});
  Verdict v = AcceptOrResample(p, 7, nullptr, rng);
  EXPECT_TRUE(v.accepted);
  EXPECT_EQ(v.token, 7);
  v = AcceptOrResample(p, 5, nullptr, rng);
  EXPECT_FALSE(v.accepted);
  EXPECT_EQ(v.token, 7);
  EXPECT_EQ(rng.Uniform(), twin.Uniform());  // the RNG stream was not touched
}

TEST(AcceptOrResample, ATokenOutsideTheDraftsSupportIsNeverProposedButResampledFine) {
  // q puts no mass on 3; a rejected x then resamples within p - q, which may be 3.
  const TokenDist p = Dist({1, 3}, {0.5f, 0.5f});
  const TokenDist q = Dist({1, 2}, {0.5f, 0.5f});
  Sampler rng(SamplingParams{.seed = 1});
  const Verdict v = AcceptOrResample(p, 2, &q, rng);  // p(2) = 0: always rejected
  EXPECT_FALSE(v.accepted);
  EXPECT_EQ(v.token, 3);  // the residual is all on 3
}

// Draws x ~ q, applies `rule`, and counts the emitted tokens: their distribution must be p.
template <typename Rule>
std::vector<double> Emitted(const TokenDist& p, const TokenDist* q, int32_t fixed_x, int n_vocab,
                            int samples, Rule rule) {
  std::vector<double> counts(n_vocab, 0);
  Sampler rng(SamplingParams{.seed = 11});
  Sampler draft(SamplingParams{.seed = 12});
  for (int i = 0; i < samples; ++i) {
    const int32_t x = q != nullptr ? draft.Draw(*q) : fixed_x;
    counts[rule(p, x, q, rng).token] += 1;
  }
  return counts;
}

std::vector<double> Probs(const TokenDist& p, int n_vocab) {
  std::vector<double> out(n_vocab, 0);
  for (size_t i = 0; i < p.ids.size(); ++i) out[p.ids[i]] = p.probs[i];
  return out;
}

// The classic mistake: on rejection, draw from p instead of the residual.
Verdict WrongRule(const TokenDist& p, int32_t x, const TokenDist* q, Sampler& rng) {
  const double px = p.Prob(x), qx = q == nullptr ? 1.0 : q->Prob(x);
  if (px > 0 && (px >= qx || rng.Uniform() * qx < px)) return {x, true};
  return {rng.Draw(p), false};
}

TEST(AcceptOrResample, EmittedTokensHaveTheTargetDistribution) {
  const int kVocab = 6, kSamples = 200000;
  const TokenDist p = Dist({0, 1, 2, 3, 4}, {0.4f, 0.25f, 0.15f, 0.12f, 0.08f});
  const TokenDist q = Dist({4, 5, 0, 1}, {0.4f, 0.3f, 0.2f, 0.1f});  // badly wrong, partly disjoint
  const auto real = [](const TokenDist& p, int32_t x, const TokenDist* q, Sampler& r) {
    return AcceptOrResample(p, x, q, r);
  };
  const auto probs = Probs(p, kVocab);
  const auto ok_q = ChiSquareTest(Emitted(p, &q, 0, kVocab, kSamples, real), probs);
  EXPECT_GT(ok_q.p_value, 0.01) << "chi2 " << ok_q.statistic << " dof " << ok_q.dof;
  // A deterministic proposal (n-gram): q is a point mass on x.
  for (int32_t x : {0, 3, 5}) {
    const auto ok_x = ChiSquareTest(Emitted(p, nullptr, x, kVocab, kSamples, real), probs);
    EXPECT_GT(ok_x.p_value, 0.01) << "x " << x << " chi2 " << ok_x.statistic;
  }
  // The same test must catch a wrong rule.
  const auto bad_q = ChiSquareTest(Emitted(p, &q, 0, kVocab, kSamples, WrongRule), probs);
  EXPECT_LT(bad_q.p_value, 1e-6) << "chi2 " << bad_q.statistic;
  const auto bad_x = ChiSquareTest(Emitted(p, nullptr, 0, kVocab, kSamples, WrongRule), probs);
  EXPECT_LT(bad_x.p_value, 1e-6) << "chi2 " << bad_x.statistic;
}

}  // namespace
}  // namespace pd::engine::spec
