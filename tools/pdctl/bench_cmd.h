// `pdctl bench`: llama-bench's two figures on one model: pp (one forward of a `pp`-token prompt
// from an empty cache, logits of the last position only) and tg (`tg` single-token forwards from
// an empty cache, full logits each step, greedy argmax over them). Token ids are synthetic (BOS,
// then BenchToken(i)); bench/cpu_vs_llamacpp/run.py feeds llama.cpp the same ids. Also times the
// model load and the first forward after it (cold or warm page cache: the caller decides), and
// reports peak RSS split into file-backed (the binary, and the weights under
// PDSERVE_CPU_WEIGHTS=mmap) and anonymous memory (the CPU backend's weight copies, KV,
// scratch). With --batch B > 1, also B sequences decoding one token per step together (each
// first holding a --batch-pp-token prompt, prefilled untimed, as llama-batched-bench's -npp
// does). Prints one JSON object on stdout. Exit codes: 0 success; 2 bad input (pp/tg larger
// than the context); 1 any other failure.
#pragma once

#include "CLI/CLI.hpp"
#include "tools/pdctl/engine_flags.h"

namespace pd::tools {

struct BenchFlags {
  EngineFlags engine;
  int pp = 512;   // prompt tokens
  int tg = 128;   // generated tokens
  int reps = 3;   // repetitions
  int batch = 1;  // > 1: also time batched decoding of this many sequences
  int batch_pp = 0;  // prompt tokens each batched sequence holds before its timed steps
  int verify = 1;  // > 1: also time steps of this many rows of one sequence (speculative verify)
};

CLI::App* AddBenchCommand(CLI::App& app, BenchFlags* flags);
int RunBench(const BenchFlags& flags);

}  // namespace pd::tools
