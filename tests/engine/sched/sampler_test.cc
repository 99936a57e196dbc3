#include "engine/sched/sampler.h"

#include <cmath>
#include <map>
#include <vector>

#include <gtest/gtest.h>

#include "common/status_matchers.h"

namespace pd::engine {
namespace {

using ::pd::testing::StatusIs;

std::vector<float> Logits(std::initializer_list<float> v) { return std::vector<float>(v); }

TEST(SamplerTest, GreedyPicksArgmaxAndLowestIdOnTies) {
  Sampler s(SamplingParams::Greedy());
  auto l = Logits({0.1f, 2.0f, -1.0f, 2.0f});
  EXPECT_EQ(s.Sample(l, {}), 1);
  auto l2 = Logits({-5.f, -4.f, -3.f});
  EXPECT_EQ(s.Sample(l2, {}), 2);
}

TEST(SamplerTest, ArgMaxMatchesAScanAtEveryLengthAndPosition) {
  // Lengths around the 16-lane blocks; the maximum (twice, for ties) anywhere.
  for (int n = 1; n <= 70; ++n) {
    for (int at = 0; at < n; ++at) {
      std::vector<float> x(n);
      for (int i = 0; i < n; ++i) x[i] = std::sin(0.7f * i) - 2.f;
      x[at] = 5.f;
      if (at + 17 < n) x[at + 17] = 5.f;  // a tie in another lane: the lower index wins
      ASSERT_EQ(ArgMax(x), at) << n << " " << at;
    }
  }
  EXPECT_EQ(ArgMax(Logits({-INFINITY, -INFINITY})), 0);
  EXPECT_EQ(ArgMax(Logits({NAN, 1.f, NAN})), 1);
}

TEST(SamplerTest, RepetitionPenaltyChangesGreedyChoice) {
  SamplingParams p = SamplingParams::Greedy();
  p.repetition_penalty = 2.0f;
  Sampler s(p);
  auto l = Logits({3.0f, 2.0f, -1.0f});
  const std::vector<int32_t> history = {0};
  EXPECT_EQ(s.Sample(l, history), 1);  // 3/2 = 1.5 < 2
  // Outside the look-back window the penalty does not apply.
  p.penalty_last_n = 1;
  Sampler s2(p);
  const std::vector<int32_t> old = {0, 2};
  EXPECT_EQ(s2.Sample(l, old), 0);
}

TEST(SamplerTest, SameSeedSameTokens) {
  SamplingParams p;
  p.temperature = 1.0f;
  p.top_k = 0;
  p.top_p = 1.0f;
  p.min_p = 0;
  p.seed = 1234;
  std::vector<float> l(100);
  for (int i = 0; i < 100; ++i) l[i] = std::sin(i * 0.37f) * 2;
  Sampler a(p), b(p);
  std::vector<int32_t> ta, tb;
  for (int i = 0; i < 50; ++i) {
    ta.push_back(a.Sample(l, {}));
    tb.push_back(b.Sample(l, {}));
  }
  EXPECT_EQ(ta, tb);
  p.seed = 99;
  Sampler c(p);
  std::vector<int32_t> tc;
  for (int i = 0; i < 50; ++i) tc.push_back(c.Sample(l, {}));
  EXPECT_NE(ta, tc);
}

TEST(SamplerTest, TopKOneIsGreedy) {
  SamplingParams p;
  p.temperature = 5.0f;
  p.top_k = 1;
  p.seed = 7;
  Sampler s(p);
  auto l = Logits({0.f, 0.5f, 0.4f});
  for (int i = 0; i < 20; ++i) EXPECT_EQ(s.Sample(l, {}), 1);
}

TEST(SamplerTest, TopPKeepsOnlyTheNucleus) {
  // Probabilities ~ {0.66, 0.24, 0.09, 0.01}: top_p 0.8 keeps ids 0 and 1 only.
  SamplingParams p;
  p.temperature = 1.0f;
  p.top_k = 0;
  p.top_p = 0.8f;
  p.min_p = 0;
  p.seed = 3;
  Sampler s(p);
  auto l = Logits({std::log(0.66f), std::log(0.24f), std::log(0.09f), std::log(0.01f)});
  std::map<int, int> counts;
  for (int i = 0; i < 2000; ++i) counts[s.Sample(l, {})]++;
  EXPECT_EQ(counts.count(2), 0u);
  EXPECT_EQ(counts.count(3), 0u);
  EXPECT_GT(counts[0], counts[1]);
  EXPECT_GT(counts[1], 200);
}

TEST(SamplerTest, MinPDropsUnlikelyTokens) {
  SamplingParams p;
  p.temperature = 1.0f;
  p.top_k = 0;
  p.top_p = 1.0f;
  p.min_p = 0.2f;  // keeps tokens with prob >= 0.2 * 0.5
  p.seed = 11;
  Sampler s(p);
  auto l = Logits({std::log(0.5f), std::log(0.3f), std::log(0.15f), std::log(0.05f)});
  std::map<int, int> counts;
  for (int i = 0; i < 3000; ++i) counts[s.Sample(l, {})]++;
  EXPECT_EQ(counts.count(3), 0u);
  EXPECT_GT(counts[2], 100);
}

TEST(SamplerTest, TemperatureMatchesDistribution) {
  SamplingParams p;
  p.temperature = 0.5f;
  p.top_k = 0;
  p.top_p = 1.0f;
  p.min_p = 0;
  p.seed = 5;
  Sampler s(p);
  auto l = Logits({0.0f, std::log(2.0f)});
  // At T=0.5, p1/p0 = 2^2 = 4 -> p1 = 0.8.
  int ones = 0;
  const int n = 20000;
  for (int i = 0; i < n; ++i) ones += s.Sample(l, {}) == 1;
  EXPECT_NEAR(ones / double(n), 0.8, 0.02);
}

TEST(SamplerTest, ValidateRejectsBadParams) {
  SamplingParams p;
  p.temperature = -1;
  EXPECT_THAT(p.Validate(), StatusIs(absl::StatusCode::kInvalidArgument, "temperature"));
  p = SamplingParams();
  p.top_p = 0;
  EXPECT_THAT(p.Validate(), StatusIs(absl::StatusCode::kInvalidArgument, "top_p"));
  p = SamplingParams();
  p.min_p = 1.5f;
  EXPECT_THAT(p.Validate(), StatusIs(absl::StatusCode::kInvalidArgument, "min_p"));
  p = SamplingParams();
  p.repetition_penalty = 0;
  EXPECT_THAT(p.Validate(), StatusIs(absl::StatusCode::kInvalidArgument, "repetition_penalty"));
  PD_EXPECT_OK(SamplingParams().Validate());
}

}  // namespace
}  // namespace pd::engine
