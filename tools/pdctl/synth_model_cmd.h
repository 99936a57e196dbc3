// `pdctl synth-model`: writes a random-weight Llama-architecture GGUF of a named or given shape
// (engine/quant/quantize/synth_model.h), so that machines without Python or a network can make
// their test and benchmark models. Exit codes: 0 success (also `--shape list`); 2 bad arguments
// (unknown shape or type, an inconsistent shape, a missing output folder, too little disk
// space); 1 any other failure. No file is left at OUTPUT on failure or interruption.
#pragma once

#include <cstdint>
#include <string>

#include "CLI/CLI.hpp"

namespace pd::tools {

struct SynthModelFlags {
  std::string output;
  std::string shape;  // a built-in shape, "list", or empty (every size flag given)
  // Sizes: 0 = not given (the shape's value; required without --shape, except kv_heads =
  // heads, head_dim = embd / heads and ctx = 4096).
  int layers = 0, embd = 0, heads = 0, kv_heads = 0, ff = 0, vocab = 0, head_dim = 0, ctx = 0;
  double rope_base = 0, rms_eps = 0;  // 0: the shape's (10000 and 1e-5 without one)
  std::string type, output_type;
  bool tied = false;
  uint64_t seed = 1;
  int threads = 0;
};

CLI::App* AddSynthModelCommand(CLI::App& app, SynthModelFlags* flags);
int RunSynthModel(const SynthModelFlags& flags);

}  // namespace pd::tools
