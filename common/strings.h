// String helpers. Debian's Abseil is built with its own absl::string_view (not std::string_view),
// so absl::StrCat rejects std::string_view arguments; pd::StrCat accepts both.
#pragma once

#include <string>
#include <string_view>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace pd {
namespace internal {
template <typename T>
decltype(auto) StrArg(const T& v) {
  if constexpr (std::is_same_v<T, std::string_view>) {
    return absl::string_view(v.data(), v.size());
  } else {
    return (v);
  }
}
}  // namespace internal

// absl::StrCat that also takes std::string_view.
template <typename... Args>
std::string StrCat(const Args&... args) {
  return absl::StrCat(internal::StrArg(args)...);
}

// std::string_view -> absl::string_view (for absl APIs such as Status messages).
inline absl::string_view ToAbsl(std::string_view s) { return absl::string_view(s.data(), s.size()); }

// Whether `given` equals `secret`, in a time that depends on neither where they differ nor (beyond
// `given`'s own length) on `secret`: API keys are compared with it.
inline bool SecretEquals(std::string_view given, std::string_view secret) {
  unsigned char diff = given.size() == secret.size() ? 0 : 1;
  for (size_t i = 0; i < given.size(); ++i) {
    diff |= static_cast<unsigned char>(given[i] ^ (i < secret.size() ? secret[i] : 0));
  }
  return diff == 0;
}

}  // namespace pd
