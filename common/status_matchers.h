// GoogleTest matchers for absl::Status / StatusOr: EXPECT_THAT(s, StatusIs(kInvalidArgument)).
#pragma once

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace pd::testing {

inline const absl::Status& GetStatus(const absl::Status& s) { return s; }
template <typename T>
const absl::Status& GetStatus(const absl::StatusOr<T>& s) {
  return s.status();
}

MATCHER_P(StatusIs, code, "") {
  const absl::Status& s = ::pd::testing::GetStatus(arg);
  *result_listener << "status is " << s.ToString();
  return s.code() == code;
}

MATCHER_P2(StatusIs, code, substr, "") {
  const absl::Status& s = ::pd::testing::GetStatus(arg);
  *result_listener << "status is " << s.ToString();
  return s.code() == code && s.message().find(substr) != absl::string_view::npos;
}

MATCHER(IsOk, "") {
  const absl::Status& s = ::pd::testing::GetStatus(arg);
  *result_listener << "status is " << s.ToString();
  return s.ok();
}

}  // namespace pd::testing

#define PD_ASSERT_OK(expr) ASSERT_THAT((expr), ::pd::testing::IsOk())
#define PD_EXPECT_OK(expr) EXPECT_THAT((expr), ::pd::testing::IsOk())
