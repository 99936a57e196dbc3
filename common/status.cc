#include "common/status.h"

namespace pd::internal {

void CheckFailed(const char* file, int line, const char* expr, const char* msg) {
  std::fprintf(stderr, "PD_CHECK failed at %s:%d: %s%s%s\n", file, line, expr, msg ? ": " : "",
               msg ? msg : "");
  std::fflush(stderr);
  std::abort();
}

}  // namespace pd::internal
