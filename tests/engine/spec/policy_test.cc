#include "engine/spec/policy.h"

#include <cmath>
#include <map>

#include <gtest/gtest.h>

namespace pd::engine::spec {
namespace {

TEST(ExpectedTokens, MatchesTheGeometricSeries) {
  for (double a : {0.0, 0.3, 0.6, 0.9}) {
    for (int k = 0; k <= 8; ++k) {
      double sum = 0;
      for (int i = 0; i <= k; ++i) sum += std::pow(a, i);  // 1 + a + ... + a^k
      EXPECT_NEAR(ExpectedTokens(a, k), sum, 1e-12) << "a " << a << " k " << k;
    }
  }
  EXPECT_EQ(ExpectedTokens(1.0, 4), 5);
}

TEST(SpecCost, InterpolatesAndExtrapolates) {
  SpecCost c = SpecCost::FromPoints({1, 2, 4}, {1.0, 1.5, 3.5});
  EXPECT_DOUBLE_EQ(c.Seconds(1), 1.0);
  EXPECT_DOUBLE_EQ(c.Seconds(0.5), 1.0);
  EXPECT_DOUBLE_EQ(c.Seconds(1.5), 1.25);
  EXPECT_DOUBLE_EQ(c.Seconds(3), 2.5);
  EXPECT_DOUBLE_EQ(c.Seconds(6), 5.5);  // the last segment's slope (1 s per row)
}

TEST(SpecCost, MeasureTimesPowersOfTwoAndKeepsTheTableMonotone) {
  std::vector<int> asked;
  auto seconds = [&](int rows) -> absl::StatusOr<double> {
    asked.push_back(rows);
    return rows == 4 ? 0.5 : 1.0 * rows;  // a noisy dip at 4 rows
  };
  absl::StatusOr<SpecCost> c = SpecCost::Measure(6, seconds);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(asked, (std::vector<int>{1, 2, 4, 6}));
  EXPECT_EQ(c->seconds(), (std::vector<double>{1, 2, 2, 6}));
  auto bad = [](int) -> absl::StatusOr<double> { return 0.0; };
  EXPECT_FALSE(SpecCost::Measure(4, bad).ok());
  EXPECT_FALSE(SpecCost::Measure(0, seconds).ok());
  EXPECT_FALSE(SpecCost::Measure(4, seconds, 0).ok());
}

TEST(SpecCost, MeasureGoesRoundRobinAndKeepsTheFastest) {
  // A busy stretch of the host (every timing 3x) over the first five calls: timed one row count
  // at a time, it would fall on the small steps only and flatten the table; round-robin, each
  // row count's other rounds are quiet, and the fastest timing is its own cost.
  std::vector<int> asked;
  auto seconds = [&](int rows) -> absl::StatusOr<double> {
    asked.push_back(rows);
    const double busy = asked.size() <= 5 ? 3.0 : 1.0;
    return busy * (1e-3 + 1e-4 * rows);
  };
  absl::StatusOr<SpecCost> c = SpecCost::Measure(8, seconds, 3);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(asked, (std::vector<int>{1, 2, 4, 8, 1, 2, 4, 8, 1, 2, 4, 8}));
  const std::vector<int> rows = {1, 2, 4, 8};
  for (size_t i = 0; i < rows.size(); ++i) {
    EXPECT_DOUBLE_EQ(c->seconds()[i], 1e-3 + 1e-4 * rows[i]) << rows[i] << " rows";
  }
}

TEST(AcceptanceEstimate, MovesTowardTheObservedRateAndFadesWhenIdle) {
  AcceptanceEstimate e;
  EXPECT_DOUBLE_EQ(e.rate(), 0.5);  // the prior
  for (int i = 0; i < 50; ++i) e.Observe(4, 4);
  EXPECT_GT(e.rate(), 0.9);
  AcceptanceEstimate bad;
  for (int i = 0; i < 50; ++i) bad.Observe(4, 0);
  EXPECT_LT(bad.rate(), 0.1);
  for (int i = 0; i < 200; ++i) bad.Idle();
  EXPECT_GT(bad.rate(), 0.4);  // back near the prior: it will probe again
  // With little evidence, a given prior (the drafter's acceptance over all sequences) leads.
  AcceptanceEstimate fresh;
  EXPECT_DOUBLE_EQ(fresh.rate(0.9), 0.9);
  fresh.Observe(1, 0);
  EXPECT_LT(fresh.rate(0.9), 0.9);
  EXPECT_GT(fresh.rate(0.9), fresh.rate());
}

TEST(ChooseK, DraftsDeeperWhenAcceptanceIsHigherAndRowsAreCheap) {
  // Memory-bound: 64 rows cost 10 % more than one.
  const SpecCost flat = SpecCost::FromPoints({1, 64}, {1e-2, 1.1e-2});
  int last = 0;
  for (double a : {0.3, 0.6, 0.8, 0.95}) {
    StepEstimate step{1, flat.Seconds(1), 1};
    const int k = ChooseK(step, flat, a, 8, 0, 1.05);
    EXPECT_GE(k, last) << "a " << a;
    last = k;
  }
  EXPECT_EQ(last, 8);
  StepEstimate step{1, flat.Seconds(1), 1};
  EXPECT_EQ(ChooseK(step, flat, 0.95, 3, 0, 1.05), 3);  // the limit holds
  EXPECT_DOUBLE_EQ(step.rows, 4);
  EXPECT_NEAR(step.tokens, ExpectedTokens(0.95, 3), 1e-12);
}

TEST(ChooseK, TurnsOffWhenTheStepIsComputeBound) {
  // Every row costs the same: a row of a draft at a = 0.6 pays back 0.6 tokens for a full row.
  const SpecCost linear = SpecCost::FromPoints({1, 64}, {1e-2, 64e-2});
  StepEstimate one{1, linear.Seconds(1), 1};
  EXPECT_EQ(ChooseK(one, linear, 0.6, 8, 0, 1.05), 0);
  EXPECT_DOUBLE_EQ(one.rows, 1);  // unchanged
  // A large batch on a table that turns compute-bound after 8 rows: no draft for one more
  // sequence there, though the same sequence alone would draft.
  const SpecCost knee = SpecCost::FromPoints({1, 8, 64}, {1e-2, 1.1e-2, 8.8e-2});
  StepEstimate alone{1, knee.Seconds(1), 1};
  EXPECT_GT(ChooseK(alone, knee, 0.7, 8, 0, 1.05), 0);
  StepEstimate batch{32, knee.Seconds(32), 32};
  EXPECT_EQ(ChooseK(batch, knee, 0.7, 8, 0, 1.05), 0);
}

TEST(ChooseK, PromptRowsDoNotMakeDraftsLookCheap) {
  // Compute-bound after 8 rows. 9 decoding sequences at a = 1 and 40 prompt rows in the step:
  // the step's rate counts 9 tokens over 49 rows' time, which any draft row (one token per row)
  // beats; the decode rows' own rate, 9 tokens over 9 rows' time, it does not beat by min_gain.
  const SpecCost knee = SpecCost::FromPoints({1, 8, 64}, {1e-2, 1.1e-2, 8.8e-2});
  StepEstimate step_rate{49, knee.Seconds(49), 9};
  EXPECT_GT(ChooseK(step_rate, knee, 0.99, 8, 0, 1.25), 0);
  StepEstimate decode_rate{49, knee.Seconds(49), 9};
  decode_rate.base_rate = 9 / knee.Seconds(9);
  EXPECT_EQ(ChooseK(decode_rate, knee, 0.99, 8, 0, 1.25), 0);
  // One decoding sequence beside the same prompt rows: a draft row costs a fraction of the lone
  // sequence's plain step and still drafts.
  StepEstimate alone{41, knee.Seconds(41), 1};
  alone.base_rate = 1 / knee.Seconds(1);
  EXPECT_GT(ChooseK(alone, knee, 0.9, 8, 0, 1.25), 0);
}

TEST(ChooseK, HeadOnlyRowsArePricedByTheirOwnTable) {
  // A batch of 32 on a compute-bound table: layer rows cost their full share, so no draft; the
  // same draft as head-only rows (a self-head drafter) costs what the head table says, whatever
  // the step's other rows, and adds no layer rows to the step.
  const SpecCost linear = SpecCost::FromPoints({1, 64}, {1e-2, 64e-2});
  const SpecCost head = SpecCost::FromPoints({1, 9}, {1e-2, 1.4e-2});
  StepEstimate layers{32, linear.Seconds(32), 32};
  EXPECT_EQ(ChooseK(layers, linear, 0.9, 8, 0, 1.05), 0);
  StepEstimate heads{32, linear.Seconds(32), 32};
  const int k = ChooseK(heads, linear, 0.9, 8, 0, 1.05, 0, &head);
  EXPECT_GT(k, 0);
  EXPECT_DOUBLE_EQ(heads.rows, 32);
  EXPECT_NEAR(heads.seconds, linear.Seconds(32) + head.Seconds(1 + k) - head.Seconds(1), 1e-12);
}

TEST(ChooseK, DraftWorkCountsAgainstTheGain) {
  const SpecCost flat = SpecCost::FromPoints({1, 64}, {1e-2, 1.1e-2});
  StepEstimate free_draft{1, flat.Seconds(1), 1};
  StepEstimate costly{1, flat.Seconds(1), 1};
  const int k_free = ChooseK(free_draft, flat, 0.7, 8, 0, 1.05);
  const int k_costly = ChooseK(costly, flat, 0.7, 8, 0.5e-2, 1.05);  // half a step per token
  EXPECT_GT(k_free, k_costly);
  StepEstimate too_costly{1, flat.Seconds(1), 1};
  EXPECT_EQ(ChooseK(too_costly, flat, 0.7, 8, 1e-2, 1.05), 0);  // a draft token = a step
  // A draft model that must first catch up on many tokens: that fixed cost can outweigh it.
  StepEstimate fresh{1, flat.Seconds(1), 1}, stale{1, flat.Seconds(1), 1};
  EXPECT_GT(ChooseK(fresh, flat, 0.7, 8, 0, 1.05, 0), 0);
  EXPECT_EQ(ChooseK(stale, flat, 0.7, 8, 0, 1.05, 5e-2), 0);
  EXPECT_DOUBLE_EQ(stale.rows, 1);
}


// Drives a gate as a scheduler would: each step asks Allow, and when allowed it "speculates" at
// `on_rate` tokens/s, otherwise runs plain at `off_rate`. Returns the share of allowed steps
// over the last `measure` of `steps`.
double AllowedShare(SpecGate& gate, int sequences, double on_rate, double off_rate, int steps,
                    int measure) {
  int allowed = 0;
  for (int i = 0; i < steps; ++i) {
    const bool on = gate.Decide(sequences) != SpecGate::Decision::kPlain;
    if (i >= steps - measure) allowed += on;
    const double tokens = on ? 2.0 * sequences : sequences;
    gate.Observe(sequences, on, tokens, tokens / (on ? on_rate : off_rate));
  }
  return static_cast<double>(allowed) / measure;
}

TEST(SpecGate, KeepsTheFasterSideAndStillExploresTheOther) {
  SpecGate gate;
  // Over the last 640 of 1000 steps the exploration interval has grown to kExploreMax: 2 or 3
  // tries of the losing side.
  const double few = 2.0 / 640, many = 3.0 / 640;
  // Speculating steps are 1.8x faster at one sequence: allowed but for the rare exploration.
  const double win = AllowedShare(gate, 1, 180, 100, 1000, 640);
  EXPECT_GE(win, 1 - many);
  EXPECT_LE(win, 1 - few);
  EXPECT_GT(gate.Rate(1, true), gate.Rate(1, false));
  // 15% slower at 16 sequences (another bucket, its own verdict): refused but for exploration.
  const double lose = AllowedShare(gate, 16, 85, 100, 1000, 640);
  EXPECT_GE(lose, few);
  EXPECT_LE(lose, many);
  // Close (within 10%): exploration stays frequent (every kExploreClose steps).
  const double close = AllowedShare(gate, 4, 96, 100, 1000, 640);
  EXPECT_NEAR(close, 1.0 / SpecGate::kExploreClose, 1.0 / 640);
  // Where drafts win they run as ChooseK sees fit; where they lose, the rare try is a probe.
  std::map<SpecGate::Decision, int> at1, at16;
  for (int i = 0; i < 2 * SpecGate::kExploreMax; ++i) {
    ++at1[gate.Decide(1)];
    ++at16[gate.Decide(16)];
  }
  EXPECT_EQ(at1[SpecGate::Decision::kSpeculate] + at1[SpecGate::Decision::kPlain],
            2 * SpecGate::kExploreMax);
  EXPECT_EQ(at1[SpecGate::Decision::kPlain], 2);
  EXPECT_EQ(at16[SpecGate::Decision::kPlain] + at16[SpecGate::Decision::kProbe],
            2 * SpecGate::kExploreMax);
  EXPECT_EQ(at16[SpecGate::Decision::kProbe], 2);
  EXPECT_TRUE(gate.Proven(1));
  EXPECT_FALSE(gate.Proven(16));
}

TEST(SpecGate, FollowsAChangeInTheWorkload) {
  SpecGate gate;
  AllowedShare(gate, 2, 200, 100, 500, 1);
  // Drafts stop paying (say the text stopped repeating): the speculating steps show it, the gate
  // closes within a few steps.
  EXPECT_LT(AllowedShare(gate, 2, 70, 100, 100, 80), 0.05);
  // And reopens when they pay again: the probes find out (a few, at most kExploreMax apart).
  EXPECT_GT(AllowedShare(gate, 2, 200, 100, 6 * SpecGate::kExploreMax, 640), 0.95);
}

TEST(SpecGate, AnUnusedProbeIsRetriedNextStep) {
  SpecGate gate;
  AllowedShare(gate, 1, 70, 100, 300, 1);  // drafts lose: probes only, far apart
  int plain = 0;
  while (gate.Decide(1) == SpecGate::Decision::kPlain) ++plain;
  EXPECT_GT(plain, 16);
  // The probe found nothing to draft: the next steps probe until one does.
  gate.ProbeUnused(1);
  EXPECT_EQ(gate.Decide(1), SpecGate::Decision::kProbe);
  gate.ProbeUnused(1);
  EXPECT_EQ(gate.Decide(1), SpecGate::Decision::kProbe);
  gate.Observe(1, true, 2, 2.0 / 70);
  EXPECT_EQ(gate.Decide(1), SpecGate::Decision::kPlain);
}

TEST(SpecGate, WarmsUpBothSidesFirstAndIgnoresBadObservations) {
  SpecGate gate;
  EXPECT_EQ(gate.Rate(3, true), 0);
  EXPECT_FALSE(gate.Proven(3));
  int on = 0;
  for (int i = 0; i < 2 * SpecGate::kWarmup; ++i) {
    const SpecGate::Decision d = gate.Decide(3);
    EXPECT_NE(d, SpecGate::Decision::kSpeculate);  // no verdict yet: probes and plain steps
    const bool allowed = d == SpecGate::Decision::kProbe;
    on += allowed;
    gate.Observe(3, allowed, 3, allowed ? 0.01 : 0.1);  // drafts look 10x better
  }
  EXPECT_EQ(on, SpecGate::kWarmup);  // alternated, whatever the first results said
  EXPECT_TRUE(gate.Proven(3));
  gate.Observe(3, true, 3, 0);        // no time: ignored
  gate.Observe(0, true, 3, 1);        // no sequence: ignored
  gate.Observe(3, true, -1, 1);       // negative tokens: ignored
  EXPECT_NEAR(gate.Rate(3, true), 300, 1e-6);
  EXPECT_NEAR(gate.Rate(4, false), 30, 1e-6);  // 3 and 4 share a bucket
  EXPECT_EQ(gate.Rate(5, false), 0);
  // Deferred costs land on the speculating side only.
  const double before = gate.Rate(3, true);
  gate.Charge(3, 0.01);
  EXPECT_LT(gate.Rate(3, true), before);
  EXPECT_NEAR(gate.Rate(4, false), 30, 1e-6);
  gate.Charge(3, -1);  // ignored
  EXPECT_GT(gate.Rate(3, true), 0);
}

}  // namespace
}  // namespace pd::engine::spec
