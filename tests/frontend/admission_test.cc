// frontend/admission.h: the cap on waiting requests, the measured interval between first tokens
// and the SLO refusal it drives, with times passed in.
#include "frontend/admission.h"

#include <gtest/gtest.h>

#include "frontend/frontend.h"

namespace pd::frontend {
namespace {

const absl::Time kT0 = absl::FromUnixSeconds(1000);

TEST(AdmissionTest, CapsWaitingRequestsWithARetryHint) {
  Admission a({.max_waiting = 2});
  EXPECT_TRUE(a.Admit(kT0).ok());
  EXPECT_TRUE(a.Admit(kT0).ok());
  const absl::Status refused = a.Admit(kT0);
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_GE(RetryAfterSeconds(refused), 1);
  EXPECT_NE(refused.message().find("2 requests are waiting"), absl::string_view::npos)
      << refused.message();
  a.Leave(kT0 + absl::Milliseconds(10), /*served=*/true);
  EXPECT_EQ(a.waiting(), 1);
  EXPECT_TRUE(a.Admit(kT0).ok());
}

TEST(AdmissionTest, MeasuresTheIntervalBetweenFirstTokensWhileRequestsWait) {
  Admission a({.max_waiting = 0});
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(a.Admit(kT0).ok());
  // First tokens 100 ms apart; a request that ends without one is not a measure.
  a.Leave(kT0 + absl::Milliseconds(100), true);
  EXPECT_EQ(a.interval(), absl::Milliseconds(100));
  a.Leave(kT0 + absl::Milliseconds(150), false);
  EXPECT_EQ(a.interval(), absl::Milliseconds(100));
  a.Leave(kT0 + absl::Milliseconds(300), true);  // 200 ms after the last first token
  EXPECT_EQ(a.interval(), absl::Milliseconds(100) * 0.8 + absl::Milliseconds(200) * 0.2);
  a.Leave(kT0 + absl::Milliseconds(400), true);
  EXPECT_EQ(a.waiting(), 0);
  // An empty queue starts a new interval at the next admission, not at the last first token.
  ASSERT_TRUE(a.Admit(kT0 + absl::Seconds(10)).ok());
  const absl::Duration before = a.interval();
  a.Leave(kT0 + absl::Seconds(10) + before, true);
  EXPECT_EQ(a.interval(), before);
  // More leaves than admissions are ignored.
  a.Leave(kT0 + absl::Seconds(20), true);
  EXPECT_EQ(a.waiting(), 0);
  EXPECT_EQ(a.interval(), before);
}

TEST(AdmissionTest, RefusesWhenTheExpectedWaitExceedsTheSlo) {
  Admission a({.max_waiting = 0, .ttft_slo = absl::Milliseconds(500)});
  // Without a measure nothing is refused on the SLO.
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(a.Admit(kT0).ok());
  a.Leave(kT0 + absl::Milliseconds(100), true);  // interval 100 ms, 9 waiting
  // A tenth waiting request would wait (9 + 1) x 100 ms = 1 s > 500 ms.
  const absl::Status refused = a.Admit(kT0 + absl::Milliseconds(100));
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(RetryAfterSeconds(refused), 1);  // ceil(1 s - 0.5 s)
  for (int i = 0; i < 5; ++i) a.Leave(kT0 + absl::Milliseconds(200 + 100 * i), true);
  // 4 waiting: (4 + 1) x 100 ms = 500 ms, within the SLO.
  EXPECT_TRUE(a.Admit(kT0 + absl::Milliseconds(700)).ok());
}

TEST(AdmissionTest, RetryAfterIsOnlyOnOverloadedErrors) {
  EXPECT_EQ(RetryAfterSeconds(absl::ResourceExhaustedError("x")), 0);
  EXPECT_EQ(RetryAfterSeconds(absl::OkStatus()), 0);
  EXPECT_EQ(RetryAfterSeconds(OverloadedError("busy", 7)), 7);
  EXPECT_EQ(RetryAfterSeconds(OverloadedError("busy", 0)), 1);
}

}  // namespace
}  // namespace pd::frontend
