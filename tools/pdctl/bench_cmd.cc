#include "tools/pdctl/bench_cmd.h"

#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "common/status.h"
#include "common/strings.h"
#include "engine/kv/kv_cache.h"
#include "engine/runtime/model.h"
#include "engine/sched/generate.h"
#include "tools/pdctl/cli_util.h"

namespace pd::tools {
namespace {

// Token i of the synthetic prompt: BOS, then ids spread over the vocabulary (of n_vocab ids;
// the modulo changes nothing for vocabularies of 101,000 ids or more, such as Gemma's).
int32_t BenchToken(int i, int n_vocab) {
  return i == 0 ? 2 : static_cast<int32_t>((1000 + (i * 7919LL) % 100000) % n_vocab);
}

double NowSeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double CpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// kB value of a "Name:   123 kB" line of /proc/self/status, in MiB; -1 when missing.
double ProcStatusMiB(const char* name) {
  std::ifstream in("/proc/self/status");
  std::string line;
  const std::string key = pd::StrCat(name, ":");
  while (std::getline(in, line)) {
    if (line.rfind(key, 0) == 0) return std::strtod(line.c_str() + key.size(), nullptr) / 1024.0;
  }
  return -1;
}

}  // namespace

CLI::App* AddBenchCommand(CLI::App& app, BenchFlags* flags) {
  CLI::App* bench = app.add_subcommand(
      "bench", "time prompt processing (pp) and decoding (tg) like llama-bench; prints JSON");
  flags->engine.Add(bench);
  bench->add_option("--pp", flags->pp, "prompt tokens")->check(CLI::PositiveNumber);
  bench->add_option("--tg", flags->tg, "generated tokens")->check(CLI::PositiveNumber);
  bench->add_option("-r,--reps", flags->reps, "repetitions")->check(CLI::PositiveNumber);
  bench
      ->add_option("--batch", flags->batch,
                   "also time batched decoding: this many sequences take one token per step "
                   "(tg_batch_tok_s: all sequences' tokens per second)")
      ->check(CLI::PositiveNumber);
  bench
      ->add_option("--batch-pp", flags->batch_pp,
                   "with --batch (1 too): each sequence first takes a prompt of this many tokens "
                   "(prefilled, not timed), so the timed steps attend over it, as "
                   "llama-batched-bench's -npp (default 0: the sequences start empty)")
      ->check(CLI::NonNegativeNumber);
  bench
      ->add_option("--verify", flags->verify,
                   "also time speculative-verification steps: one sequence takes this many "
                   "generated tokens per step (K drafted + 1), logits for each (tg_step_ms: a "
                   "one-token step, tg_verify_step_ms: such a step; _cpu_ms: process CPU time)")
      ->check(CLI::PositiveNumber);
  return bench;
}

int RunBench(const BenchFlags& flags) {
  const EngineFlags& f = flags.engine;
  const int pp = flags.pp, tg = flags.tg, reps = flags.reps, batch_seqs = flags.batch;
  const int verify_rows = flags.verify, batch_pp = flags.batch_pp;
  // Batched runs: more than one sequence, or one sequence decoding after a prompt.
  const bool batched = batch_seqs > 1 || batch_pp > 0;
  const double t0 = NowSeconds();
  auto e = LoadEngine(f);
  if (!e.ok()) return Fail(e.status());
  const double load_s = NowSeconds() - t0;
  engine::Model& model = *e->model;
  engine::KvCache& kv = *e->kv;
  const int n_vocab = model.config().n_vocab;
  if (std::max(pp, tg) > kv.total_blocks() * kv.options().block_size) {
    return Fail(absl::InvalidArgumentError("pp/tg larger than the context (raise --ctx)"));
  }
  const int seq_blocks = (batch_pp + tg + kv.options().block_size - 1) / kv.options().block_size;
  if (batched && int64_t{batch_seqs} * seq_blocks > kv.total_blocks()) {
    return Fail(absl::InvalidArgumentError(pd::StrCat(
        "--batch ", batch_seqs, " sequences of ", batch_pp + tg,
        " tokens (--batch-pp + --tg) need ", batch_seqs * seq_blocks, " KV blocks, the cache has ",
        kv.total_blocks(), " (raise --ctx or lower --tg)")));
  }
  std::vector<float> logits;
  // Decode steps take each row's best token as the daemons do for greedy sampling (the
  // scheduler's top-logits path, Model::ForwardTop with k = 1: the backend reduces the rows, the
  // host gets one id per row), not a host-side scan of every row's logits.
  engine::TopLogits top;
  auto prompt = [&](int n) -> absl::Status {
    kv.Free(0);
    PD_RETURN_IF_ERROR(kv.Reserve(0, n));
    engine::Batch batch;
    for (int i = 0; i < n; ++i) batch.Add(BenchToken(i, n_vocab), i, 0, i + 1 == n);
    return model.Forward(batch, kv, &logits);
  };
  auto decode = [&](int n) -> absl::Status {
    kv.Free(0);
    int32_t token = BenchToken(0, n_vocab);
    for (int i = 0; i < n; ++i) {
      PD_RETURN_IF_ERROR(kv.Reserve(0, i + 1));
      engine::Batch batch;
      batch.Add(token, i, 0, true);
      PD_RETURN_IF_ERROR(model.ForwardTop(batch, kv, 1, &top));
      token = top.Ids(0)[0];
    }
    return absl::OkStatus();
  };
  // Batched decode: `batch_seqs` sequences (ids 1..B) each take one token per step, as a
  // continuous-batching engine's decode steps do; logits for every row. With batch_pp, each
  // sequence first gets its own batch_pp-token prompt (prefill_batch, not timed by the caller).
  auto prefill_batch = [&]() -> absl::Status {
    kv.Free(0);  // the single-sequence runs are done with it
    for (int s = 1; s <= batch_seqs; ++s) {
      kv.Free(s);
      if (batch_pp == 0) continue;
      PD_RETURN_IF_ERROR(kv.Reserve(s, batch_pp));
      engine::Batch batch;
      for (int i = 0; i < batch_pp; ++i) {
        batch.Add(BenchToken(i == 0 ? 0 : i + s, n_vocab), i, s, i + 1 == batch_pp);
      }
      PD_RETURN_IF_ERROR(model.Forward(batch, kv, &logits));
    }
    return absl::OkStatus();
  };
  auto decode_batch = [&](int n) -> absl::Status {
    std::vector<int32_t> tokens(batch_seqs, BenchToken(0, n_vocab));
    for (int i = 0; i < n; ++i) {
      engine::Batch batch;
      for (int s = 0; s < batch_seqs; ++s) {
        PD_RETURN_IF_ERROR(kv.Reserve(s + 1, batch_pp + i + 1));
        batch.Add(tokens[s] + (i == 0 ? s : 0), batch_pp + i, s + 1, true);
      }
      PD_RETURN_IF_ERROR(model.ForwardTop(batch, kv, 1, &top));
      for (int s = 0; s < batch_seqs; ++s) tokens[s] = top.Ids(s)[0];
    }
    for (int s = 1; s <= batch_seqs; ++s) kv.Free(s);
    return absl::OkStatus();
  };
  // Verification steps: one sequence takes `verify_rows` tokens per step at the positions that
  // follow (all accepted), in a generated token's orders, until it holds about tg tokens.
  auto decode_verify = [&](int n) -> absl::Status {
    kv.Free(0);
    int32_t token = BenchToken(0, n_vocab);
    for (int pos = 0; pos + verify_rows <= std::max(n, verify_rows); pos += verify_rows) {
      PD_RETURN_IF_ERROR(kv.Reserve(0, pos + verify_rows));
      engine::Batch batch;
      for (int j = 0; j < verify_rows; ++j) {
        batch.AddOrdered(token + j, pos + j, 0, true, /*prompt_len=*/0);
      }
      PD_RETURN_IF_ERROR(model.ForwardTop(batch, kv, 1, &top));
      token = top.Ids(verify_rows - 1)[0];
    }
    return absl::OkStatus();
  };
  auto verify_steps = [&](int n) { return std::max(n, verify_rows) / verify_rows; };
  // First token after the load: an 8-token prompt (touches every weight page).
  const double t1 = NowSeconds();
  if (auto s = prompt(8); !s.ok()) return Fail(s);
  const double first_s = NowSeconds() - t1;
  // Warm-up: caches, thread pool, scratch sized for the largest batch.
  if (auto s = prompt(pp); !s.ok()) return Fail(s);
  if (auto s = decode(std::min(tg, 16)); !s.ok()) return Fail(s);
  // Rates per wall second, and per second of this process's CPU time (all threads): on a
  // machine shared with other work the latter moves less for single-threaded runs.
  std::vector<double> pp_rates, tg_rates, pp_cpu, tg_cpu, tgb_rates, tgb_cpu, tgv_ms, tgv_cpu_ms;
  if (batched) {
    if (auto s = prefill_batch(); !s.ok()) return Fail(s);
    if (auto s = decode_batch(std::min(tg, 4)); !s.ok()) return Fail(s);
  }
  if (verify_rows > 1) {
    if (auto s = decode_verify(std::min(tg, 4 * verify_rows)); !s.ok()) return Fail(s);
  }
  for (int r = 0; r < reps; ++r) {
    double t = NowSeconds(), c = CpuSeconds();
    if (auto s = prompt(pp); !s.ok()) return Fail(s);
    pp_rates.push_back(pp / (NowSeconds() - t));
    pp_cpu.push_back(pp / (CpuSeconds() - c));
    t = NowSeconds(), c = CpuSeconds();
    if (auto s = decode(tg); !s.ok()) return Fail(s);
    tg_rates.push_back(tg / (NowSeconds() - t));
    tg_cpu.push_back(tg / (CpuSeconds() - c));
    if (batched) {
      if (auto s = prefill_batch(); !s.ok()) return Fail(s);
      t = NowSeconds(), c = CpuSeconds();
      if (auto s = decode_batch(tg); !s.ok()) return Fail(s);
      tgb_rates.push_back(static_cast<double>(tg) * batch_seqs / (NowSeconds() - t));
      tgb_cpu.push_back(static_cast<double>(tg) * batch_seqs / (CpuSeconds() - c));
    }
    if (verify_rows > 1) {
      t = NowSeconds(), c = CpuSeconds();
      if (auto s = decode_verify(tg); !s.ok()) return Fail(s);
      tgv_ms.push_back(1e3 * (NowSeconds() - t) / verify_steps(tg));
      tgv_cpu_ms.push_back(1e3 * (CpuSeconds() - c) / verify_steps(tg));
    }
  }
  std::vector<double> tg_ms, tg_cpu_ms;
  for (double r : tg_rates) tg_ms.push_back(1e3 / r);
  for (double r : tg_cpu) tg_cpu_ms.push_back(1e3 / r);
  auto list = [](const std::vector<double>& v) {
    std::string s = "[";
    for (size_t i = 0; i < v.size(); ++i) s += pd::StrCat(i ? ", " : "", v[i]);
    return s + "]";
  };
  const int threads =
      f.threads > 0 ? f.threads : static_cast<int>(std::thread::hardware_concurrency());
  // Steps the head's backend launched as CUDA graphs (PDSERVE_CUDA_GRAPHS=1), and recordings
  // it abandoned; zeros on the CPU.
  const engine::Backend::CaptureStats graphs = model.backend().capture_stats();
  std::printf(
      "{\"system\": \"pdserve\", \"model\": \"%s\", \"kernels\": \"%s\", \"threads\": %d, "
      "\"kv_type\": \"%s\", "
      "\"pp\": %d, \"tg\": %d, \"load_s\": %.4f, \"first_token_s\": %.4f, \"pp_tok_s\": %s, "
      "\"tg_tok_s\": %s, \"pp_tok_per_cpu_s\": %s, \"tg_tok_per_cpu_s\": %s, \"peak_rss_mib\": "
      "%.1f, \"rss_file_mib\": %.1f, \"rss_anon_mib\": %.1f, "
      "\"weights_bytes\": %zu, \"batch\": %d, \"batch_pp\": %d, \"tg_batch_tok_s\": %s, "
      "\"tg_batch_tok_per_cpu_s\": "
      "%s, \"verify\": %d, \"tg_step_ms\": %s, \"tg_step_cpu_ms\": %s, \"tg_verify_step_ms\": %s, "
      "\"tg_verify_step_cpu_ms\": %s, \"graph_steps\": %lld, \"graph_abandoned\": %lld}\n",
      e->model_path.c_str(), e->kernels.c_str(), threads, f.kv_type.c_str(), pp, tg, load_s,
      first_s, list(pp_rates).c_str(), list(tg_rates).c_str(), list(pp_cpu).c_str(),
      list(tg_cpu).c_str(), PeakRssMiB(), ProcStatusMiB("RssFile"), ProcStatusMiB("RssAnon"),
      static_cast<size_t>(model.weights().total_bytes), batch_seqs, batch_pp,
      list(tgb_rates).c_str(), list(tgb_cpu).c_str(), verify_rows, list(tg_ms).c_str(),
      list(tg_cpu_ms).c_str(), list(tgv_ms).c_str(), list(tgv_cpu_ms).c_str(),
      static_cast<long long>(graphs.launched), static_cast<long long>(graphs.abandoned));
  return 0;
}

}  // namespace pd::tools
