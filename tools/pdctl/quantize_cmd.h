// `pdctl quantize` (engine/quant/quantize) and `pdctl texts` (the built-in calibration and
// evaluation texts): flags, validation, exit codes. Kept apart from main.cc so that the other
// subcommands stay as they are.
#pragma once

#include <string>
#include <vector>

#include "CLI/CLI.hpp"

namespace pd::tools {

struct QuantizeFlags {
  // type, method, policy: empty = the default (required; rtn; M), or for --draft (q3_K;
  // importance; S).
  std::string input, output, type, method, policy, calib;
  std::vector<std::string> overrides;
  int64_t calib_tokens = 0;  // 0: 16384, or 4096 for --draft
  int chunk_tokens = 512;
  bool eval_hessian = false;
  int64_t hessian_mib = 4096;
  int threads = 0;
  double damp = 0.01;
  int gptq_block = 128;
  bool no_act_order = false;
  bool no_smooth = false;     // w8a8: skip SmoothQuant
  float smooth_alpha = 0.5f;  // w8a8: migration strength
  // --draft: write a self-draft model for speculative decoding (draft_model.h).
  bool draft = false;
  int draft_vocab = 32768;
  int64_t draft_eval_tokens = 2048;
};

// Declares the subcommand on `app`; RunQuantize runs it once parsed. Exit codes: 0 success;
// 2 bad arguments (type, method, policy, override), unreadable input or calibration text, a
// model the engine cannot run when calibration needs it, an output that cannot be written;
// 1 any other failure. No file is left at OUTPUT on failure.
CLI::App* AddQuantizeCommand(CLI::App& app, QuantizeFlags* flags);
int RunQuantize(const QuantizeFlags& flags);

struct TextsFlags {
  std::string kind;  // calibration | evaluation
  std::string out;   // file; empty = stdout
};
CLI::App* AddTextsCommand(CLI::App& app, TextsFlags* flags);
int RunTexts(const TextsFlags& flags);

}  // namespace pd::tools
