// frontend/admission.h: the cap on waiting requests, the measured interval between first tokens,
// the calibration of predictions by their errors, and the SLO refusal they drive, with times
// passed in.
#include "frontend/admission.h"

#include <gtest/gtest.h>

#include <vector>

#include "frontend/frontend.h"

namespace pd::frontend {
namespace {

const absl::Time kT0 = absl::FromUnixSeconds(1000);
using Ticket = Admission::Ticket;

Ticket MustAdmit(Admission& a, absl::Time now) {
  absl::StatusOr<Ticket> t = a.Admit(now);
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? *t : Ticket{};
}

TEST(AdmissionTest, CapsWaitingRequestsWithARetryHint) {
  Admission a({.max_waiting = 2});
  const Ticket t1 = MustAdmit(a, kT0);
  MustAdmit(a, kT0);
  const absl::Status refused = a.Admit(kT0).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_GE(RetryAfterSeconds(refused), 1);
  EXPECT_NE(refused.message().find("2 requests are waiting"), absl::string_view::npos)
      << refused.message();
  a.Leave(kT0 + absl::Milliseconds(10), /*served=*/true, t1);
  EXPECT_EQ(a.waiting(), 1);
  MustAdmit(a, kT0);
}

TEST(AdmissionTest, MeasuresTheIntervalBetweenFirstTokensWhileRequestsWait) {
  Admission a({.max_waiting = 0});
  std::vector<Ticket> t;
  for (int i = 0; i < 4; ++i) t.push_back(MustAdmit(a, kT0));
  EXPECT_EQ(t[0].predicted, absl::ZeroDuration());  // nothing measured yet
  // First tokens 100 ms apart; a request that ends without one is not a measure.
  a.Leave(kT0 + absl::Milliseconds(100), true, t[0]);
  EXPECT_EQ(a.interval(), absl::Milliseconds(100));
  a.Leave(kT0 + absl::Milliseconds(150), false, t[1]);
  EXPECT_EQ(a.interval(), absl::Milliseconds(100));
  a.Leave(kT0 + absl::Milliseconds(300), true, t[2]);  // 200 ms after the last first token
  EXPECT_EQ(a.interval(), absl::Milliseconds(100) * 0.8 + absl::Milliseconds(200) * 0.2);
  a.Leave(kT0 + absl::Milliseconds(400), true, t[3]);
  EXPECT_EQ(a.waiting(), 0);
  // An empty queue starts a new interval at the next admission, not at the last first token.
  const Ticket next = MustAdmit(a, kT0 + absl::Seconds(10));
  const absl::Duration before = a.interval();
  EXPECT_EQ(next.predicted, before);  // first in line: one interval
  a.Leave(kT0 + absl::Seconds(10) + before, true, next);
  EXPECT_EQ(a.interval(), before);
  // More leaves than admissions are ignored.
  a.Leave(kT0 + absl::Seconds(20), true, next);
  EXPECT_EQ(a.waiting(), 0);
  EXPECT_EQ(a.interval(), before);
}

TEST(AdmissionTest, RefusesWhenThePredictedWaitExceedsTheSlo) {
  Admission a({.max_waiting = 0, .ttft_slo = absl::Milliseconds(625), .slo_headroom = 0.8});
  // Without a measure nothing is refused on the SLO.
  std::vector<Ticket> t;
  for (int i = 0; i < 10; ++i) t.push_back(MustAdmit(a, kT0));
  a.Leave(kT0 + absl::Milliseconds(100), true, t[0]);  // interval 100 ms, 9 waiting
  // A tenth waiting request would wait (9 + 1) x 100 ms = 1 s > 0.8 x 625 ms = 500 ms.
  const absl::Status refused = a.Admit(kT0 + absl::Milliseconds(100)).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(RetryAfterSeconds(refused), 1);  // ceil(1 s - 0.5 s)
  for (int i = 1; i <= 5; ++i) a.Leave(kT0 + absl::Milliseconds(100 + 100 * i), true, t[i]);
  // 4 waiting: (4 + 1) x 100 ms = 500 ms, within 0.8 x the SLO.
  MustAdmit(a, kT0 + absl::Milliseconds(700));
}

// Before any first token (a server just started, or stalled), the time the queue has waited bounds
// the interval from below: nothing is measured yet, and still not everything is admitted.
TEST(AdmissionTest, AWaitingQueueBoundsTheIntervalBeforeAnyMeasure) {
  Admission a({.max_waiting = 0, .ttft_slo = absl::Seconds(1), .slo_headroom = 1.0});
  for (int i = 0; i < 3; ++i) MustAdmit(a, kT0);
  EXPECT_EQ(a.interval(), absl::ZeroDuration());
  // 100 ms in: at least 100 ms per first token, 4 x 100 ms = 0.4 s for a fourth: admitted.
  const Ticket fourth = MustAdmit(a, kT0 + absl::Milliseconds(100));
  EXPECT_EQ(fourth.predicted, absl::Milliseconds(400));
  // 300 ms in, nothing served yet: a fifth would wait at least 5 x 300 ms = 1.5 s.
  EXPECT_EQ(a.Admit(kT0 + absl::Milliseconds(300)).status().code(),
            absl::StatusCode::kResourceExhausted);
}

// One request at a time (an empty queue, so no SLO check applies), each leaving after
// slowdowns[i % n] x its prediction: the ratios the calibration sees are exactly the slowdowns.
void Play(Admission& a, const std::vector<double>& slowdowns, int rounds) {
  absl::Time now = kT0;
  Ticket seed = MustAdmit(a, now);
  a.Leave(now + absl::Milliseconds(10), true, seed);  // interval 10 ms
  now += absl::Seconds(1);
  for (int i = 0; i < rounds; ++i) {
    const Ticket t = MustAdmit(a, now);
    now = t.admitted + t.predicted * slowdowns[i % slowdowns.size()];
    a.Leave(now, true, t);
    now += absl::Seconds(1);
  }
}

TEST(AdmissionTest, CalibrationIsThe99thPercentileOfPredictionErrors) {
  Admission few({.max_waiting = 0});
  Play(few, {3.0}, Admission::kMinCalibration - 1);
  EXPECT_EQ(few.calibration(), 1.0);  // too few to trust
  Admission accurate({.max_waiting = 0});
  Play(accurate, {1.0}, 100);
  EXPECT_DOUBLE_EQ(accurate.calibration(), 1.0);
  Admission tail({.max_waiting = 0});
  std::vector<double> s(50, 0.5);
  s[7] = 2.5;  // 2 of 100 predictions fell 2.5x short
  Play(tail, s, 100);
  EXPECT_DOUBLE_EQ(tail.calibration(), 2.5);
  // The window forgets: 300 accurate predictions later the tail is gone.
  Play(tail, {1.0}, Admission::kCalibrationWindow + 44);
  EXPECT_DOUBLE_EQ(tail.calibration(), 1.0);
}

// The calibration decides: with predictions that fell 2x short, a request whose raw prediction
// fits the SLO but whose calibrated one does not is refused; with accurate ones it is admitted.
TEST(AdmissionTest, CalibratedPredictionsDecide) {
  for (const double slowdown : {1.0, 2.0}) {
    const std::vector<double> pattern = {slowdown, 1.0 / slowdown};
    Admission dry({.max_waiting = 0});
    Play(dry, pattern, 64);
    const absl::Duration raw = dry.interval() * 2;  // a second waiting request's prediction
    ASSERT_DOUBLE_EQ(dry.calibration(), slowdown);
    // An SLO between the raw prediction and 2x it.
    Admission a({.max_waiting = 0, .ttft_slo = raw * 1.5, .slo_headroom = 1.0});
    Play(a, pattern, 64);
    ASSERT_EQ(a.interval(), dry.interval());
    MustAdmit(a, kT0 + absl::Hours(1));
    EXPECT_EQ(a.Admit(kT0 + absl::Hours(1)).ok(), slowdown == 1.0) << slowdown;
  }
}

TEST(AdmissionTest, RetryAfterIsOnlyOnOverloadedErrors) {
  EXPECT_EQ(RetryAfterSeconds(absl::ResourceExhaustedError("x")), 0);
  EXPECT_EQ(RetryAfterSeconds(absl::OkStatus()), 0);
  EXPECT_EQ(RetryAfterSeconds(OverloadedError("busy", 7)), 7);
  EXPECT_EQ(RetryAfterSeconds(OverloadedError("busy", 0)), 1);
}

}  // namespace
}  // namespace pd::frontend
