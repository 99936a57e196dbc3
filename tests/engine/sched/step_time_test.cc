// StepTimeModel: the online fit of step times that sizes prompt chunks by a time budget.
#include "engine/sched/step_time.h"

#include <gtest/gtest.h>

#include <random>

namespace pd::engine {
namespace {

// A machine whose steps cost exactly this (seconds): 2 ms fixed, 0.4 ms per decode token,
// 10 us per 1k positions a decode token attends, 0.8 ms per prompt token, 20 us per 1k
// positions a prompt token attends.
struct Costs {
  double fixed = 2e-3, per_decode = 0.4e-3, per_decode_ctx = 10e-6 / 1024,
         per_prefill = 0.8e-3, per_prefill_ctx = 20e-6 / 1024;
  double operator()(const StepShape& s) const {
    return fixed + per_decode * s.decode_tokens + per_decode_ctx * s.decode_context +
           per_prefill * s.prefill_tokens + per_prefill_ctx * s.prefill_context;
  }
};

StepShape Decode(int n, int context) {
  StepShape s;
  s.decode_tokens = n;
  s.decode_context = static_cast<double>(n) * context;
  return s;
}

// Random serving-like steps: 0..16 decoding streams, sometimes a chunk of a prompt.
StepShape RandomStep(std::mt19937& rng) {
  StepShape s = Decode(static_cast<int>(rng() % 17), 64 + static_cast<int>(rng() % 2000));
  if (rng() % 3 == 0 || s.decode_tokens == 0) {
    s.AddChunk(static_cast<int>(rng() % 3000), 1 + static_cast<int>(rng() % 256));
  }
  return s;
}

TEST(StepShapeTest, ChunkContextIsTheSumOfAttendedPositions) {
  StepShape s;
  s.AddChunk(10, 3);  // tokens at positions 10, 11, 12 attend 11, 12, 13 positions
  EXPECT_EQ(s.prefill_tokens, 3);
  EXPECT_DOUBLE_EQ(s.prefill_context, 11 + 12 + 13);
}

TEST(StepTimeModelTest, ReadyOnlyWhenPromptCostsCanBeTold) {
  StepTimeModel m;
  for (int i = 0; i < 100; ++i) m.Observe(Decode(4, 100), 3e-3);
  EXPECT_FALSE(m.ready()) << "no step with prompt tokens: nothing prices them";
  EXPECT_EQ(m.MaxPrefill(Decode(4, 100), 0, 300, 1e-3), 300) << "not ready: no limit";
  // Every step carries decode tokens and the same prompt chunk: the cost of a prompt token
  // cannot be told from the fixed cost of a step.
  const Costs cost;
  StepTimeModel same;
  for (int i = 0; i < 100; ++i) {
    StepShape s = Decode(8, 100);
    s.AddChunk(0, 16);
    same.Observe(s, cost(s));
  }
  EXPECT_FALSE(same.ready()) << "one chunk size only";
  // The same steady load with chunks of varying size (no decode-only step at all) can.
  StepTimeModel varied;
  for (int i = 0; i < 100; ++i) {
    StepShape s = Decode(8, 100);
    s.AddChunk(0, 8 + (i % 5) * 8);
    varied.Observe(s, cost(s));
  }
  ASSERT_TRUE(varied.ready());
  StepShape s = Decode(8, 100);
  s.AddChunk(0, 100);
  EXPECT_NEAR(varied.Predict(s), cost(s), 0.01 * cost(s));
}

TEST(StepTimeModelTest, LongDecodeRunsDoNotForgetPromptCosts) {
  const Costs cost;
  std::mt19937 rng(9);
  StepTimeModel m(/*window=*/16);
  for (int i = 0; i < 40; ++i) {
    const StepShape s = RandomStep(rng);
    m.Observe(s, cost(s));
  }
  ASSERT_TRUE(m.ready());
  for (int i = 0; i < 1000; ++i) m.Observe(Decode(16, 300), cost(Decode(16, 300)));
  ASSERT_TRUE(m.ready());
  StepShape s = Decode(16, 300);
  s.AddChunk(0, 100);
  EXPECT_NEAR(m.Predict(s), cost(s), 0.01 * cost(s));
}

TEST(StepTimeModelTest, NegativeSlopesLeaveTheFitInsteadOfBiasingIt) {
  // A machine where more decode tokens never cost more (say, a wide GPU): noise makes the fitted
  // decode slope slightly negative. Clamping it to zero after the fit would shift every
  // prediction; refitting without the column keeps them right.
  std::mt19937 rng(1);
  std::uniform_real_distribution<double> noise(0.97, 1.03);
  StepTimeModel m;
  auto cost = [](const StepShape& s) { return 5e-3 + 1e-3 * s.prefill_tokens; };
  for (int i = 0; i < 128; ++i) {
    StepShape s = Decode(static_cast<int>(rng() % 17), 100);
    if (i % 2 == 0) s.AddChunk(0, 1 + static_cast<int>(rng() % 64));
    m.Observe(s, cost(s) * noise(rng));
  }
  ASSERT_TRUE(m.ready());
  for (const int d : {1, 8, 16}) {
    StepShape s = Decode(d, 100);
    EXPECT_NEAR(m.Predict(s), cost(s), 0.03 * cost(s)) << d << " decode tokens";
    s.AddChunk(0, 32);
    EXPECT_NEAR(m.Predict(s), cost(s), 0.03 * cost(s)) << d << " decode tokens + 32";
  }
}

TEST(StepTimeModelTest, IgnoresEmptyAndNonPositiveSteps) {
  StepTimeModel m;
  m.Observe(StepShape{}, 1.0);
  m.Observe(Decode(2, 10), 0);
  m.Observe(Decode(2, 10), -1);
  EXPECT_EQ(m.TypicalDecodeStep(), 0);
  m.Observe(Decode(2, 10), 0.25);
  EXPECT_EQ(m.TypicalDecodeStep(), 0.25);
}

TEST(StepTimeModelTest, RecoversLinearCosts) {
  const Costs cost;
  std::mt19937 rng(7);
  StepTimeModel m;
  for (int i = 0; i < 200; ++i) {
    const StepShape s = RandomStep(rng);
    m.Observe(s, cost(s));
  }
  ASSERT_TRUE(m.ready());
  for (int i = 0; i < 50; ++i) {
    const StepShape s = RandomStep(rng);
    // The ridge term (1e-4 of the data per column) biases the fit by well under 1%.
    EXPECT_NEAR(m.Predict(s), cost(s), 0.01 * cost(s));
  }
}

TEST(StepTimeModelTest, NoisyStepsStillPredictWithinTheNoise) {
  const Costs cost;
  std::mt19937 rng(11);
  std::uniform_real_distribution<double> noise(0.9, 1.1);
  StepTimeModel m;
  for (int i = 0; i < 128; ++i) {
    const StepShape s = RandomStep(rng);
    m.Observe(s, cost(s) * noise(rng));
  }
  ASSERT_TRUE(m.ready());
  for (int i = 0; i < 50; ++i) {
    const StepShape s = RandomStep(rng);
    EXPECT_NEAR(m.Predict(s), cost(s), 0.1 * cost(s));
  }
}

TEST(StepTimeModelTest, FollowsAMachineThatSlowsDown) {
  Costs cost;
  std::mt19937 rng(3);
  StepTimeModel m(/*window=*/64);
  for (int i = 0; i < 64; ++i) {
    const StepShape s = RandomStep(rng);
    m.Observe(s, cost(s));
  }
  cost.fixed *= 2, cost.per_decode *= 2, cost.per_prefill *= 2;  // another process took a core
  for (int i = 0; i < 300; ++i) {  // enough for 64 new steps of each kind
    const StepShape s = RandomStep(rng);
    m.Observe(s, cost(s));
  }
  const StepShape s = RandomStep(rng);
  EXPECT_NEAR(m.Predict(s), cost(s), 0.01 * cost(s)) << "the windows hold only the new costs";
}

TEST(StepTimeModelTest, MaxPrefillIsTheLargestChunkWithinTheBudget) {
  const Costs cost;
  std::mt19937 rng(5);
  StepTimeModel m;
  for (int i = 0; i < 200; ++i) {
    const StepShape s = RandomStep(rng);
    m.Observe(s, cost(s));
  }
  ASSERT_TRUE(m.ready());
  const StepShape base = Decode(16, 500);
  for (const int start : {0, 1000, 8000}) {
    for (const double budget : {0.0, 0.5 * cost(base), 1.5 * cost(base), 3 * cost(base)}) {
      const int p = m.MaxPrefill(base, start, 512, budget);
      ASSERT_GE(p, 0);
      ASSERT_LE(p, 512);
      StepShape with = base;
      with.AddChunk(start, p);
      if (p > 0) {
        EXPECT_LE(m.Predict(with), budget);
      }
      if (p < 512) {
        StepShape more = base;
        more.AddChunk(start, p + 1);
        EXPECT_GT(m.Predict(more), budget) << "one more token would still fit";
      }
    }
  }
  // 1.5x a 16-stream decode step (2 + 6.4 ms + context) leaves ~4.3 ms: ~5 prompt tokens.
  const int p = m.MaxPrefill(base, 0, 512, 1.5 * cost(base));
  EXPECT_NEAR(p, (0.5 * cost(base)) / cost.per_prefill, 1.0);
  // A longer context makes each prompt token dearer: fewer fit.
  EXPECT_LT(m.MaxPrefill(base, 60000, 512, 3 * cost(base)),
            m.MaxPrefill(base, 0, 512, 3 * cost(base)));
}

TEST(StepTimeModelTest, TypicalDecodeStepIsTheMedianOfRecentDecodeSteps) {
  StepTimeModel m(/*window=*/128, /*median_window=*/5);
  for (const double t : {1.0, 9.0, 2.0, 8.0, 3.0}) m.Observe(Decode(1, 1), t);
  EXPECT_EQ(m.TypicalDecodeStep(), 3.0);
  StepShape prompt_only;
  prompt_only.AddChunk(0, 100);
  m.Observe(prompt_only, 100.0);  // a step without decode tokens stalls no stream: not counted
  EXPECT_EQ(m.TypicalDecodeStep(), 3.0);
  for (int i = 0; i < 3; ++i) m.Observe(Decode(1, 1), 5.0);  // the window drops the oldest
  EXPECT_EQ(m.TypicalDecodeStep(), 5.0);
}

}  // namespace
}  // namespace pd::engine
