// Finds stop strings in streamed text without ever emitting text that a stop string could still
// claim: text that might be the start of a stop string is held back until it is decided.
// Not thread safe: one per sequence.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace pd::engine {

class StopMatcher {
 public:
  explicit StopMatcher(std::vector<std::string> stops);

  // Adds `delta`; returns the text now safe to emit. After a stop string is found, returns the
  // text before it, sets stopped(), and ignores later input.
  std::string Push(std::string_view delta);
  // Returns the held-back text (at the end of generation, when no stop string matched).
  std::string Flush();
  bool stopped() const { return stopped_; }
  const std::string& matched() const { return matched_; }

 private:
  std::vector<std::string> stops_;
  std::string pending_;
  std::string matched_;
  bool stopped_ = false;
};

}  // namespace pd::engine
