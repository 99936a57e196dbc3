#include "tools/pdctl/cli_util.h"

#include <sys/resource.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "common/strings.h"

namespace pd::tools {

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "pdctl: error: %s\n", std::string(s.ToString()).c_str());
  return s.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
}

absl::StatusOr<std::vector<int32_t>> ParseIds(const std::string& text) {
  std::vector<int32_t> ids;
  std::istringstream in(text);
  std::string tok;
  while (in >> tok) {
    char* end = nullptr;
    const long v = std::strtol(tok.c_str(), &end, 10);
    if (end == tok.c_str() || *end != '\0' || v < 0 || v > INT32_MAX) {
      return absl::InvalidArgumentError(pd::StrCat("'", tok, "' is not a token id"));
    }
    ids.push_back(static_cast<int32_t>(v));
  }
  return ids;
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(pd::StrCat("cannot read '", path, "'"));
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

double PeakRssMiB() {
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_maxrss / 1024.0;
}

}  // namespace pd::tools
