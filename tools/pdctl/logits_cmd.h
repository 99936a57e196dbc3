// `pdctl logits`: one forward pass over a prompt of token ids, its logits written to a file, for
// comparing with other engines (scripts/, tests/python). Without --top: the final position's
// n_vocab float32 logits. With --top N: for each position (every prompt position with --all,
// else the last), a record of float32 logsumexp of the full logits, N int32 token ids by
// decreasing logit, and their N float32 logits. With --dump-matmul-inputs DIR, also the
// intermediate tensors. Exit codes: 0 success; 2 bad input; 1 any other failure.
#pragma once

#include <string>

#include "CLI/CLI.hpp"
#include "tools/pdctl/engine_flags.h"

namespace pd::tools {

struct LogitsFlags {
  EngineFlags engine;
  std::string prompt_ids;  // space-separated token ids
  std::string out;         // output file
  bool all_positions = false;
  int top = 0;           // 0 = the final position's full logits
  std::string dump_dir;  // "" = no dump
};

CLI::App* AddLogitsCommand(CLI::App& app, LogitsFlags* flags);
int RunLogits(const LogitsFlags& flags);

}  // namespace pd::tools
