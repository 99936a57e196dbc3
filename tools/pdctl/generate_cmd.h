// `pdctl generate`: text from a prompt (text, a file, or token ids), streamed to stdout, with the
// speed and memory figures on stderr. Exit codes: 0 success; 2 no prompt or bad input; 1 any
// other failure.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "tools/pdctl/engine_flags.h"
#include "tools/pdctl/spec_generate.h"

namespace pd::tools {

struct GenerateFlags {
  EngineFlags engine;
  SpecFlags spec;
  std::string prompt, prompt_file, prompt_ids;
  int n_predict = 128;
  float temperature = 0.8f, top_p = 0.95f, min_p = 0.05f, repeat_penalty = 1.0f;
  int top_k = 40, repeat_last_n = 64;
  int64_t seed = -1;
  bool ignore_eos = false, print_ids = false, no_special = false;
  std::vector<std::string> stop;
};

CLI::App* AddGenerateCommand(CLI::App& app, GenerateFlags* flags);
int RunGenerate(const GenerateFlags& flags);

}  // namespace pd::tools
