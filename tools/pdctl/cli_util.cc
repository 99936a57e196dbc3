#include "tools/pdctl/cli_util.h"

#include <sys/resource.h>
#include <unistd.h>

#include <csignal>
#include <cstring>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "common/strings.h"

namespace pd::tools {

namespace {

char g_tmp_path[4096];  // read by the signal handler: a fixed buffer, no allocation

void RemoveTmpAndDie(int sig) {
  if (g_tmp_path[0] != '\0') ::unlink(g_tmp_path);
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

}  // namespace

TmpFileGuard::TmpFileGuard(const std::string& tmp_path) {
  if (tmp_path.size() < sizeof(g_tmp_path)) {
    std::memcpy(g_tmp_path, tmp_path.c_str(), tmp_path.size() + 1);
  }
  ::signal(SIGINT, RemoveTmpAndDie);
  ::signal(SIGTERM, RemoveTmpAndDie);
}

TmpFileGuard::~TmpFileGuard() {
  ::signal(SIGINT, SIG_DFL);
  ::signal(SIGTERM, SIG_DFL);
  g_tmp_path[0] = '\0';
}

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
