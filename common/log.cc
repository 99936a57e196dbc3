#include "common/log.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>

namespace pd {
namespace {

LogLevel LevelFromEnv() {
  const char* v = std::getenv("PD_LOG_LEVEL");
  if (v == nullptr) return LogLevel::kInfo;
  if (std::strcmp(v, "debug") == 0) return LogLevel::kDebug;
  if (std::strcmp(v, "warning") == 0) return LogLevel::kWarning;
  if (std::strcmp(v, "error") == 0) return LogLevel::kError;
  return LogLevel::kInfo;
}

std::atomic<int>& Level() {
  static std::atomic<int> level{static_cast<int>(LevelFromEnv())};
  return level;
}

}  // namespace

LogLevel MinLogLevel() { return static_cast<LogLevel>(Level().load(std::memory_order_relaxed)); }
void SetMinLogLevel(LogLevel level) { Level().store(static_cast<int>(level)); }

void LogMessage(LogLevel level, const char* file, int line, std::string_view msg) {
  static const char kTags[] = {'D', 'I', 'W', 'E'};
  const char* base = std::strrchr(file, '/');
  base = base ? base + 1 : file;
  std::fprintf(stderr, "%c %s:%d] %.*s\n", kTags[static_cast<int>(level)], base, line,
               static_cast<int>(msg.size()), msg.data());
}

}  // namespace pd
