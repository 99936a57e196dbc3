// Minimal leveled logging to stderr. Thread safe (one fprintf per message).
#pragma once

#include <string_view>

#include "common/strings.h"

namespace pd {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3 };

// Messages below this level are dropped. Default kInfo; PD_LOG_LEVEL=debug|info|warning|error.
LogLevel MinLogLevel();
void SetMinLogLevel(LogLevel level);
void LogMessage(LogLevel level, const char* file, int line, std::string_view msg);

}  // namespace pd

// PD_LOG(kInfo, "loaded ", n, " tensors");
#define PD_LOG(level, ...)                                                                 \
  do {                                                                                     \
    if (::pd::LogLevel::level >= ::pd::MinLogLevel())                                      \
      ::pd::LogMessage(::pd::LogLevel::level, __FILE__, __LINE__, ::pd::StrCat(__VA_ARGS__)); \
  } while (0)
