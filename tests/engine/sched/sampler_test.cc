#include "engine/sched/sampler.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <random>
#include <set>
#include <vector>

#include <gtest/gtest.h>

#include "common/status_matchers.h"
#include "engine/backend/top_k.h"

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

namespace pd::engine {
namespace {

// The sampler's definition, written the plain way: every id a candidate (penalty applied), all
// sorted by (logit desc, id asc), the first top_k kept, softmax at temperature 1, top-p, min-p,
// softmax at the temperature, one uniform draw. The Sampler (one-pass top-k heap, penalized ids
// kept aside) must draw exactly the same ids from the same seed.
int32_t ReferenceSample(const SamplingParams& p, const std::vector<float>& logits,
                        const std::vector<int32_t>& history, std::mt19937_64& rng) {
  struct C {
    int32_t id;
    float logit;
  };
  std::vector<C> c;
  for (int32_t i = 0; i < static_cast<int32_t>(logits.size()); ++i) c.push_back({i, logits[i]});
  if (p.repetition_penalty != 1.0f && p.penalty_last_n > 0 && !history.empty()) {
    const size_t n = std::min<size_t>(history.size(), p.penalty_last_n);
    std::set<int32_t> seen(history.end() - n, history.end());
    for (int32_t id : seen) {
      float& l = c[id].logit;
      l = l > 0 ? l / p.repetition_penalty : l * p.repetition_penalty;
    }
  }
  std::sort(c.begin(), c.end(), [](const C& a, const C& b) {
    return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
  });
  if (p.temperature <= 0) return c[0].id;
  if (p.top_k > 0 && static_cast<size_t>(p.top_k) < c.size()) c.resize(p.top_k);
  std::vector<float> pr;
  auto softmax = [&](float t) {
    pr.resize(c.size());
    double sum = 0;
    for (size_t i = 0; i < c.size(); ++i) sum += pr[i] = std::exp((c[i].logit - c[0].logit) / t);
    for (float& x : pr) x = static_cast<float>(x / sum);
  };
  softmax(1.0f);
  if (p.top_p < 1.0f) {
    double cum = 0;
    size_t i = 0;
    for (; i < c.size(); ++i) {
      cum += pr[i];
      if (cum >= p.top_p) {
        ++i;
        break;
      }
    }
    c.resize(std::max<size_t>(i, 1));
    pr.resize(c.size());
  }
  if (p.min_p > 0) {
    const float threshold = pr[0] * p.min_p;
    size_t i = 1;
    while (i < c.size() && pr[i] >= threshold) ++i;
    c.resize(i);
  }
  softmax(p.temperature);
  std::uniform_real_distribution<double> uni(0.0, 1.0);
  double r = uni(rng);
  for (size_t i = 0; i < c.size(); ++i) {
    r -= pr[i];
    if (r <= 0) return c[i].id;
  }
  return c.back().id;
}

TEST(SamplerTest, DrawsWhatTheDefinitionDrawsForEveryFilterMix) {
  std::mt19937 gen(3);
  std::normal_distribution<float> logit(0, 3);
  for (int vocab : {7, 1000, 12000}) {
    std::vector<float> logits(vocab);
    for (float& l : logits) l = std::round(logit(gen) * 4) / 4;  // many ties
    std::vector<int32_t> history;
    for (int i = 0; i < 80; ++i) history.push_back(static_cast<int32_t>(gen() % vocab));
    for (int top_k : {0, 1, 5, 40, 100000}) {
      for (float penalty : {1.0f, 1.3f}) {
        for (float temperature : {0.0f, 0.7f, 1.5f}) {
          SamplingParams p;
          p.top_k = top_k;
          p.repetition_penalty = penalty;
          p.temperature = temperature;
          p.top_p = top_k == 5 ? 1.0f : 0.9f;
          p.min_p = top_k == 40 ? 0.0f : 0.05f;
          p.seed = 17;
          Sampler s(p);
          std::mt19937_64 rng(p.seed);
          for (int draw = 0; draw < 8; ++draw) {
            ASSERT_EQ(s.Sample(logits, history), ReferenceSample(p, logits, history, rng))
                << "vocab " << vocab << " top_k " << top_k << " penalty " << penalty
                << " temperature " << temperature << " draw " << draw;
          }
        }
      }
    }
  }
}

// ---- sampling from a row's best entries (Model::ForwardTop) ----------------------------------

// The row's best n entries as Backend::TopK gives them.
void TopOf(const std::vector<float>& row, int n, std::vector<int32_t>* ids,
           std::vector<float>* values) {
  ids->resize(n);
  values->resize(n);
  RowTopK(row.data(), static_cast<int64_t>(row.size()), n, ids->data(), values->data());
}

TEST(SamplerTopTest, TopNeededFollowsTheChain) {
  SamplingParams p;
  p.top_k = 40;
  EXPECT_EQ(Sampler(p).TopNeeded(), 40);
  p.top_k = 0;
  EXPECT_EQ(Sampler(p).TopNeeded(), 0);  // every id is a candidate
  EXPECT_EQ(Sampler(SamplingParams::Greedy()).TopNeeded(), 1);
  p = SamplingParams::Greedy();
  p.repetition_penalty = 1.3f;
  EXPECT_EQ(Sampler(p).TopNeeded(), 0);  // a penalty can lift any id
  p.penalty_last_n = 0;
  EXPECT_EQ(Sampler(p).TopNeeded(), 1);  // ... unless it looks at no tokens
}

TEST(SamplerTopTest, SameTokensAndDistributionsAsFromTheWholeRow) {
  // Rows with ties (logits rounded to a coarse grid), -0 and +0, -inf entries; every mix of the
  // filters; the same seed on both sides: every draw and every distribution must agree, given
  // the row's best TopNeeded() entries, or more.
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-6.f, 6.f);
  int checked = 0;
  for (const int n_vocab : {1, 3, 50, 1000, 5000}) {
    for (const float temperature : {0.f, 0.3f, 1.f, 1.7f}) {
      for (const int top_k : {1, 2, 40, 256}) {
        for (const float top_p : {1.f, 0.9f, 0.5f}) {
          for (const float min_p : {0.f, 0.05f, 0.3f}) {
            SamplingParams p;
            p.temperature = temperature;
            p.top_k = top_k;
            p.top_p = top_p;
            p.min_p = min_p;
            p.seed = static_cast<uint64_t>(checked);
            Sampler whole(p), top(p);
            const int need = top.TopNeeded();
            ASSERT_GT(need, 0);
            for (int step = 0; step < 4; ++step) {
              std::vector<float> row(n_vocab);
              for (float& x : row) x = std::round(u(rng) * 4.f) / 4.f;  // many ties
              if (n_vocab > 2) {
                row[1] = -0.f;
                row[2] = 0.f;
              }
              if (n_vocab > 10) row[5] = -INFINITY;
              std::vector<int32_t> ids;
              std::vector<float> values;
              const int n = std::min(n_vocab, step % 2 == 0 ? need : need + 5);
              TopOf(row, n, &ids, &values);
              const std::vector<int32_t> history = {0};
              TokenDist dw, dt;
              whole.Distribution(row, history, &dw);
              top.DistributionTop(ids, values, &dt);
              ASSERT_EQ(dw.ids, dt.ids) << n_vocab << " " << temperature << " " << top_k;
              ASSERT_EQ(dw.probs, dt.probs);
              ASSERT_EQ(whole.Sample(row, history), top.SampleTop(ids, values))
                  << n_vocab << " t=" << temperature << " k=" << top_k << " p=" << top_p
                  << " min_p=" << min_p;
              ++checked;
            }
          }
        }
      }
    }
  }
  EXPECT_EQ(checked, 5 * 4 * 4 * 3 * 3 * 4);
}

TEST(SamplerTopTest, RowTopKRanksLikeAFullSort) {
  // Against sorting every (value, id) pair by the documented order: NaN last, -0 == +0.
  std::mt19937 rng(3);
  std::uniform_int_distribution<int> pick(-8, 8);
  // k = 1 takes 64-column blocks, then the columns after the last full one: widths around the
  // block, and rows whose best sits in the tail, twice in different blocks, nowhere (all NaN, all
  // -infinity, NaN and -infinity), or among zeros of both signs.
  int special = 0;
  for (const int cols : {1, 2, 17, 63, 64, 65, 129, 300, 4096, 4096, 4096, 4096, 4096, 4096}) {
    std::vector<float> row(cols);
    for (int i = 0; i < cols; ++i) {
      const int v = pick(rng);
      row[i] = v == 8 ? NAN : v == -8 ? -INFINITY : v == 0 ? (i % 2 ? -0.f : 0.f) : v * 0.5f;
    }
    if (cols == 4096) {
      switch (special++) {
        case 0:  // the best only in the tail (4096 = 64 blocks: make it 4096 - 3 in a 4093 row)
          row.resize(4093);
          row[4091] = 9.f;
          break;
        case 1:  // the best twice, in blocks 5 and 40
          row[5 * 64 + 7] = 9.f;
          row[40 * 64 + 1] = 9.f;
          break;
        case 2:
          std::fill(row.begin(), row.end(), NAN);
          break;
        case 3:
          std::fill(row.begin(), row.end(), -INFINITY);
          break;
        case 4:
          for (int i = 0; i < cols; ++i) row[i] = i % 3 ? NAN : -INFINITY;
          break;
        default:
          for (int i = 0; i < cols; ++i) row[i] = i % 5 == 4 ? -0.f : i % 5 == 2 ? 0.f : -1.f;
          break;
      }
    }
    const int n_cols = static_cast<int>(row.size());
    std::vector<int32_t> order(n_cols);
    for (int i = 0; i < n_cols; ++i) order[i] = i;
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
      const bool na = std::isnan(row[a]), nb = std::isnan(row[b]);
      if (na || nb) return !na && nb;
      return row[a] > row[b];
    });
    for (const int k : {1, 2, 5, 256}) {
      if (k > n_cols) continue;
      std::vector<int32_t> ids;
      std::vector<float> values;
      TopOf(row, k, &ids, &values);
      for (int j = 0; j < k; ++j) {
        ASSERT_EQ(ids[j], order[j])
            << "cols " << n_cols << " k " << k << " rank " << j << " special " << special;
        ASSERT_EQ(std::memcmp(&values[j], &row[order[j]], sizeof(float)), 0);
      }
    }
  }
}

}  // namespace
}  // namespace pd::engine
