// PrefillRate (router/prefill_rate.h): a prefill node's prompt tokens per second of busy time,
// and the wait it predicts, driven with explicit times.
#include "router/prefill_rate.h"

#include <gtest/gtest.h>

namespace pd::router {
namespace {

const absl::Time t0 = absl::FromUnixSeconds(1'000'000);
absl::Time At(double s) { return t0 + absl::Seconds(s); }

// One prefill of `tokens` from `start` to `end`, alone on the node.
void Alone(PrefillRate& r, int64_t tokens, double start, double end) {
  r.Active(1, At(start));
  r.Active(0, At(end));
  r.Finished(tokens, At(end));
}

TEST(PrefillRateTest, UnknownUntilThereIsEvidence) {
  PrefillRate r;
  EXPECT_FALSE(r.TokensPerSecond());
  EXPECT_FALSE(r.Wait(1000, 1000));
  Alone(r, 100, 0, 1);  // too few tokens
  EXPECT_FALSE(r.TokensPerSecond());
  PrefillRate q;
  Alone(q, 5000, 0, 0.2);  // too short a time
  EXPECT_FALSE(q.TokensPerSecond());
  Alone(q, 5000, 5, 5.4);  // 10,000 tokens in 0.6 s of busy time
  ASSERT_TRUE(q.TokensPerSecond());
  EXPECT_NEAR(*q.TokensPerSecond(), 10000 / 0.6, 1e-6);
}

TEST(PrefillRateTest, IdleTimeDoesNotCount) {
  PrefillRate r;
  Alone(r, 1000, 0, 1);
  Alone(r, 3000, 100, 103);  // 99 s idle between them
  ASSERT_TRUE(r.TokensPerSecond());
  EXPECT_NEAR(*r.TokensPerSecond(), 1000.0, 1e-9);
}

TEST(PrefillRateTest, OverlappingPrefillsShareTheBusyTime) {
  // Two prompts of 1,000 tokens on the node at once for 2 s: the node computes 1,000 tokens/s,
  // though each prompt took 2 s (a per-request rate would say 500).
  PrefillRate r;
  r.Active(1, At(0));
  r.Active(2, At(0.1));
  r.Active(1, At(1.9));
  r.Finished(1000, At(1.9));
  r.Active(0, At(2));
  r.Finished(1000, At(2));
  ASSERT_TRUE(r.TokensPerSecond());
  EXPECT_NEAR(*r.TokensPerSecond(), 1000.0, 1e-9);
}

TEST(PrefillRateTest, FollowsANodeThatSlowsDown) {
  PrefillRate r;
  double t = 0;
  for (int i = 0; i < 100; ++i, t += 2) Alone(r, 1000, t, t + 1);  // 1,000 tokens/s
  EXPECT_NEAR(*r.TokensPerSecond(), 1000.0, 1e-6);
  // Then 250 tokens/s for two windows of busy time: older work has been halved away.
  const int n = static_cast<int>(2 * absl::ToDoubleSeconds(PrefillRate::kWindow) / 4);
  for (int i = 0; i < n; ++i, t += 5) Alone(r, 1000, t, t + 4);
  const double rate = *r.TokensPerSecond();
  EXPECT_LT(rate, 1.3 * 250);
  EXPECT_GT(rate, 250.0);
}

TEST(PrefillRateTest, WaitIsTheBacklogAndThePromptAtTheRate) {
  PrefillRate r;
  Alone(r, 2000, 0, 2);  // 1,000 tokens/s
  ASSERT_TRUE(r.Wait(3000, 500));
  EXPECT_EQ(*r.Wait(3000, 500), absl::Milliseconds(3500));
  EXPECT_EQ(*r.Wait(-5, 500), absl::Milliseconds(500));  // a negative backlog counts as none
}

}  // namespace
}  // namespace pd::router
