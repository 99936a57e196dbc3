// Status helpers that Debian's Abseil (20220623) lacks: early-return macros and invariant checks.
//
// Nothing in pdserve that can fail throws: it returns absl::Status / absl::StatusOr<T>.
// Invariants that can only be broken by a bug use PD_CHECK, which aborts with a message.
// Build messages with pd::StrCat from common/strings.h (Debian Abseil rejects std::string_view).
#pragma once

#include <cstdio>
#include <cstdlib>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define PD_CONCAT_INNER_(a, b) a##b
#define PD_CONCAT_(a, b) PD_CONCAT_INNER_(a, b)

// Returns the status from the enclosing function when `expr` is not OK.
#define PD_RETURN_IF_ERROR(expr)                  \
  do {                                            \
    ::absl::Status pd_status_ = (expr);           \
    if (!pd_status_.ok()) return pd_status_;      \
  } while (0)

// `PD_ASSIGN_OR_RETURN(auto x, F())`: declares/assigns x from a StatusOr, or returns its error.
#define PD_ASSIGN_OR_RETURN(lhs, rexpr) \
  PD_ASSIGN_OR_RETURN_IMPL_(PD_CONCAT_(pd_statusor_, __LINE__), lhs, rexpr)
#define PD_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, rexpr) \
  auto tmp = (rexpr);                              \
  if (!tmp.ok()) return std::move(tmp).status();   \
  lhs = std::move(tmp).value()

namespace pd::internal {
[[noreturn]] void CheckFailed(const char* file, int line, const char* expr, const char* msg);
}  // namespace pd::internal

// Aborts with file/line and the failed expression. For invariants, never for input validation.
#define PD_CHECK(cond)                                                                \
  do {                                                                                \
    if (!(cond)) ::pd::internal::CheckFailed(__FILE__, __LINE__, #cond, nullptr);     \
  } while (0)
#define PD_CHECK_MSG(cond, msg)                                                       \
  do {                                                                                \
    if (!(cond)) ::pd::internal::CheckFailed(__FILE__, __LINE__, #cond, (msg));       \
  } while (0)
#define PD_CHECK_OK(expr)                                                             \
  do {                                                                                \
    ::absl::Status pd_s_ = (expr);                                                    \
    if (!pd_s_.ok())                                                                  \
      ::pd::internal::CheckFailed(__FILE__, __LINE__, #expr,                          \
                                  std::string(pd_s_.ToString()).c_str());             \
  } while (0)
