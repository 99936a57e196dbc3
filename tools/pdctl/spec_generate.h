// `pdctl generate/chat --spec`: one sequence generated through a Scheduler with a drafter
// (docs/speculative.md), so that the command runs exactly the serving path's speculative
// decoding: the same drafters, acceptance rule, adaptive K and KV rollback.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/status/statusor.h"
#include "engine/sched/generate.h"
#include "engine/sched/scheduler.h"
#include "tools/pdctl/engine_flags.h"

namespace pd::tools {

struct SpecFlags {
  std::string spec = "off";  // off | ngram | self | draft GGUF path
  int spec_k = 8;            // the most draft tokens per step
  void Add(CLI::App* app);
  bool on() const { return spec != "off"; }
};

// What speculation did for one generation.
struct SpecCounts {
  int steps = 0;          // target steps after the prompt's
  int draft_tokens = 0;   // verified
  int accepted_tokens = 0;
};

class SpecGenerator {
 public:
  // Builds the drafter `flags` names for `engine`'s model (a self-draft may be built first:
  // minutes, with progress) and a one-sequence Scheduler with a KV cache the size of
  // engine.kv's, whose start-up measures the step cost. `engine` must outlive the generator.
  static absl::StatusOr<std::unique_ptr<SpecGenerator>> Create(Engine& engine,
                                                               const SpecFlags& flags,
                                                               int threads);
  // engine::Generate's contract (the callback may stop it), through the Scheduler.
  absl::StatusOr<engine::GenerateResult> Generate(const std::vector<int32_t>& prompt,
                                                  const engine::GenerateOptions& options,
                                                  const engine::TokenCallback& on_token,
                                                  SpecCounts* counts);
  std::string drafter_name() const { return drafter_name_; }

 private:
  std::unique_ptr<engine::Scheduler> scheduler_;
  std::string drafter_name_;
  int calls_ = 0;
};

}  // namespace pd::tools
