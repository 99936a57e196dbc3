// pdctl: the pdserve command line. Subcommands: generate, chat, tokenize, logits, models, bench,
// quantize, texts.
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "CLI/CLI.hpp"
#include "common/log.h"
#include "common/status.h"
#include "common/strings.h"
#include "engine/backend/backend.h"
#include "engine/kv/kv_cache.h"
#include "engine/model/gguf.h"
#include "engine/model/model_finder.h"
#include "engine/runtime/model.h"
#include "engine/sched/generate.h"
#include "engine/sched/stop.h"
#include "engine/tokenizer/chat_template.h"
#include "engine/tokenizer/tokenizer.h"
#include "node/engine_builder.h"
#include "tools/pdctl/quantize_cmd.h"
#include "tools/pdctl/up_cmd.h"

namespace pd::tools {
namespace {

using engine::Backend;
using engine::DType;

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "pdctl: error: %s\n", std::string(s.ToString()).c_str());
  return s.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
}

absl::StatusOr<std::vector<int32_t>> ParseIds(const std::string& text) {
  std::vector<int32_t> ids;
  std::istringstream in(text);
  std::string tok;
  while (in >> tok) {
    char* end = nullptr;
    const long v = std::strtol(tok.c_str(), &end, 10);
    if (end == tok.c_str() || *end != '\0' || v < 0 || v > INT32_MAX) {
      return absl::InvalidArgumentError(pd::StrCat("'", tok, "' is not a token id"));
    }
    ids.push_back(static_cast<int32_t>(v));
  }
  return ids;
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(pd::StrCat("cannot read '", path, "'"));
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

double PeakRssMiB() {
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_maxrss / 1024.0;
}

// Options shared by the commands that run the model.
struct EngineFlags {
  std::string model;
  int threads = 0;
  std::string kv_type = "f16";
  int ctx = 0;
  std::string backend = "cpu";
  std::string cpu_kernels = "auto";

  void Add(CLI::App* app) {
    app->add_option("-m,--model", model,
                    "GGUF model file (default: the default model, see `pdctl models`)");
    app->add_option("-t,--threads", threads, "CPU threads (0 = all cores)");
    app->add_option("--kv-type", kv_type,
                    "KV cache element type: f16, f32, or int8 (per token and head scales)")
        ->check(CLI::IsMember({"f16", "f32", "int8"}));
    app->add_option("-c,--ctx", ctx, "context size in tokens (0 = min(training context, 4096))");
    app->add_option("--backend", backend, "compute backend: cpu or cuda")
        ->check(CLI::IsMember({"cpu", "cuda"}));
    app->add_option("--cpu-kernels", cpu_kernels,
                    "CPU kernels: auto (AVX2+FMA when the CPU has them) or scalar (portable)")
        ->check(CLI::IsMember({"auto", "scalar"}));
  }
};

// A loaded model with its backend and a KV cache for one sequence.
struct Engine {
  std::unique_ptr<Backend> backend;
  std::shared_ptr<engine::GgufFile> file;
  std::unique_ptr<engine::Model> model;
  std::unique_ptr<engine::KvCache> kv;
};

absl::StatusOr<Engine> LoadEngine(EngineFlags& f) {
  // The node runtime's engine construction (node/engine_builder.h): the same default model,
  // backend check and context rule as pd-serve and the cluster's nodes.
  node::EngineOptions eo;
  eo.model_path = f.model;
  eo.backend = f.backend;
  eo.threads = f.threads;
  eo.force_scalar = f.cpu_kernels == "scalar";
  eo.context = f.ctx;
  PD_ASSIGN_OR_RETURN(node::Engine built, node::BuildEngine(eo));
  f.model = built.model_path;
  Engine e;
  e.backend = std::move(built.backend);
  e.file = std::move(built.file);
  e.model = std::move(built.model);
  const int ctx = built.context;
  const int block = 16;
  const int n_blocks = (ctx + block - 1) / block;
  const std::optional<engine::KvDType> kv_type = engine::ParseKvDType(f.kv_type);
  if (!kv_type) return absl::InvalidArgumentError(pd::StrCat("unknown --kv-type ", f.kv_type));
  PD_ASSIGN_OR_RETURN(e.kv, engine::KvCache::Create(e.model->KvOptions(n_blocks, *kv_type),
                                                    *e.backend));
  return e;
}

// ---- generate ----------------------------------------------------------------------------------
struct GenerateFlags {
  EngineFlags engine;
  std::string prompt, prompt_file, prompt_ids;
  int n_predict = 128;
  float temperature = 0.8f, top_p = 0.95f, min_p = 0.05f, repeat_penalty = 1.0f;
  int top_k = 40, repeat_last_n = 64;
  int64_t seed = -1;
  bool ignore_eos = false, print_ids = false, no_special = false;
  std::vector<std::string> stop;
};

int RunGenerate(GenerateFlags& g) {
  auto e = LoadEngine(g.engine);
  if (!e.ok()) return Fail(e.status());
  const engine::ModelConfig& cfg = e->model->config();

  std::unique_ptr<engine::Tokenizer> tok;
  if (g.prompt_ids.empty() || !g.print_ids) {
    auto t = engine::Tokenizer::FromGguf(*e->file);
    if (!t.ok()) return Fail(t.status());
    tok = std::move(*t);
  }
  std::vector<int32_t> prompt;
  if (!g.prompt_ids.empty()) {
    auto ids = ParseIds(g.prompt_ids);
    if (!ids.ok()) return Fail(ids.status());
    prompt = *ids;
  } else {
    std::string text = g.prompt;
    if (!g.prompt_file.empty()) {
      auto t = ReadFile(g.prompt_file);
      if (!t.ok()) return Fail(t.status());
      text = *t;
    }
    prompt = tok->Encode(text, /*add_special=*/!g.no_special, /*parse_special=*/!g.no_special);
  }

  engine::GenerateOptions opt;
  opt.max_tokens = g.n_predict;
  opt.ignore_eos = g.ignore_eos;
  opt.sampling.temperature = g.temperature;
  opt.sampling.top_k = g.top_k;
  opt.sampling.top_p = g.top_p;
  opt.sampling.min_p = g.min_p;
  opt.sampling.repetition_penalty = g.repeat_penalty;
  opt.sampling.penalty_last_n = g.repeat_last_n;
  opt.sampling.seed = g.seed >= 0 ? static_cast<uint64_t>(g.seed) : std::random_device{}();
  if (tok) {
    for (int32_t id = 0; id < tok->n_vocab(); ++id) {
      if (tok->IsEog(id)) opt.eog_tokens.insert(id);
    }
  }

  engine::StopMatcher stops(g.stop);
  std::unique_ptr<engine::StreamingDetokenizer> detok;
  if (tok && !g.print_ids) detok = std::make_unique<engine::StreamingDetokenizer>(*tok);
  auto on_token = [&](int32_t id) {
    if (!detok) return true;
    std::string out = stops.Push(detok->Push(id));
    std::fwrite(out.data(), 1, out.size(), stdout);
    std::fflush(stdout);
    return !stops.stopped();
  };
  auto r = engine::Generate(*e->model, *e->kv, /*seq=*/0, prompt, opt, on_token);
  if (!r.ok()) return Fail(r.status());
  if (detok) {
    std::string rest = stops.Push(detok->Flush());
    rest += stops.Flush();
    std::fwrite(rest.data(), 1, rest.size(), stdout);
    std::fputc('\n', stdout);
  } else {
    std::string line;
    for (size_t i = 0; i < r->tokens.size(); ++i) line += pd::StrCat(i ? " " : "", r->tokens[i]);
    std::printf("%s\n", line.c_str());
  }
  std::fflush(stdout);

  const double n_dec = r->tokens.size() > 1 ? double(r->tokens.size() - 1) : 0;
  std::fprintf(stderr,
               "\nmodel: %s (%s, %d layers, %.1f MiB of weights) | threads: %d | seed: %llu\n"
               "prompt:  %d tokens in %.3f s = %.2f tokens/s\n"
               "decode:  %zu tokens in %.3f s = %.2f tokens/s\n"
               "finish:  %s | peak memory (RSS): %.1f MiB\n",
               g.engine.model.c_str(), cfg.arch.c_str(), cfg.n_layer,
               e->model->weights().total_bytes / 1048576.0,
               g.engine.threads > 0 ? g.engine.threads
                                    : static_cast<int>(std::thread::hardware_concurrency()),
               static_cast<unsigned long long>(opt.sampling.seed), r->prompt_tokens,
               r->prefill_seconds, r->prompt_tokens / std::max(r->prefill_seconds, 1e-9),
               r->tokens.size(), r->decode_seconds, n_dec / std::max(r->decode_seconds, 1e-9),
               r->finish_reason.c_str(), PeakRssMiB());
  return 0;
}

// ---- logits ------------------------------------------------------------------------------------
// Without --top: the final position's n_vocab float32 logits. With --top N: for each position
// (every prompt position with --all, else the last), a record of float32 logsumexp of the full
// logits, N int32 token ids by decreasing logit, and their N float32 logits.
// Writes the input of every weight matmul to DIR/<weight name>.f32 ([rows, cols] float32,
// row-major), and each layer's Q, K (after RoPE) and V to DIR/blk.L.{Q,K,V}cur.f32: for comparing a forward pass with another engine's intermediate tensors
// (scripts/compare_intermediates.py does it against llama.cpp).
class MatMulInputDumper final : public engine::MatMulObserver {
 public:
  explicit MatMulInputDumper(std::string dir) : dir_(std::move(dir)) {}
  void Observe(std::string_view weight, const float* x, int64_t rows, int64_t cols) override {
    Write(weight, x, rows, cols);
  }
  bool WantsIntermediates() const override { return true; }
  void ObserveIntermediate(std::string_view name, const float* x, int64_t rows,
                           int64_t cols) override {
    Write(name, x, rows, cols);
  }
  const absl::Status& status() const { return status_; }

 private:
  void Write(std::string_view name, const float* x, int64_t rows, int64_t cols) {
    const std::string path = pd::StrCat(dir_, "/", name, ".f32");
    std::ofstream out(path, std::ios::binary);
    out.write(reinterpret_cast<const char*>(x), static_cast<std::streamsize>(rows * cols * sizeof(float)));
    if (!out && status_.ok()) status_ = absl::InternalError(pd::StrCat("cannot write '", path, "'"));
  }

  std::string dir_;
  absl::Status status_;
};

int RunLogits(EngineFlags& f, const std::string& prompt_ids, const std::string& out_path,
              bool all_positions, int top, const std::string& dump_dir) {
  auto ids = ParseIds(prompt_ids);
  if (!ids.ok()) return Fail(ids.status());
  if (ids->empty()) return Fail(absl::InvalidArgumentError("--prompt-ids is empty"));
  auto e = LoadEngine(f);
  if (!e.ok()) return Fail(e.status());
  if (auto s = e->kv->Reserve(0, static_cast<int>(ids->size())); !s.ok()) return Fail(s);
  engine::Batch batch;
  for (size_t i = 0; i < ids->size(); ++i) {
    batch.AddOrdered((*ids)[i], static_cast<int32_t>(i), 0, all_positions || i + 1 == ids->size(),
                     static_cast<int32_t>(ids->size()), all_positions);
  }
  std::optional<MatMulInputDumper> dumper;
  if (!dump_dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(dump_dir, ec);
    if (ec) {
      return Fail(absl::InvalidArgumentError(
          pd::StrCat("cannot create --dump-matmul-inputs directory '", dump_dir, "': ", ec.message())));
    }
    dumper.emplace(dump_dir);
    e->model->set_observer(&*dumper);
  }
  std::vector<float> logits;
  if (auto s = e->model->Forward(batch, *e->kv, &logits); !s.ok()) return Fail(s);
  e->model->set_observer(nullptr);
  if (dumper && !dumper->status().ok()) return Fail(dumper->status());
  std::ofstream out(out_path, std::ios::binary);
  if (top <= 0) {
    out.write(reinterpret_cast<const char*>(logits.data()), logits.size() * sizeof(float));
  } else {
    const int64_t n_vocab = e->model->config().n_vocab;
    const int k = static_cast<int>(std::min<int64_t>(top, n_vocab));
    std::vector<int32_t> order(n_vocab);
    for (size_t r = 0; r < logits.size() / n_vocab; ++r) {
      const float* row = logits.data() + r * n_vocab;
      const float mx = *std::max_element(row, row + n_vocab);
      double sum = 0;
      for (int64_t i = 0; i < n_vocab; ++i) sum += std::exp(double(row[i]) - mx);
      const float lse = static_cast<float>(mx + std::log(sum));
      for (int64_t i = 0; i < n_vocab; ++i) order[i] = static_cast<int32_t>(i);
      std::partial_sort(order.begin(), order.begin() + k, order.end(),
                        [&](int32_t a, int32_t b) { return row[a] > row[b] || (row[a] == row[b] && a < b); });
      std::vector<float> vals(k);
      for (int i = 0; i < k; ++i) vals[i] = row[order[i]];
      out.write(reinterpret_cast<const char*>(&lse), sizeof(float));
      out.write(reinterpret_cast<const char*>(order.data()), k * sizeof(int32_t));
      out.write(reinterpret_cast<const char*>(vals.data()), k * sizeof(float));
    }
  }
  if (!out) return Fail(absl::InternalError(pd::StrCat("cannot write '", out_path, "'")));
  return 0;
}

// ---- tokenize ----------------------------------------------------------------------------------
int RunTokenize(const std::string& model, bool no_special, const std::string& file,
                const std::string& text) {
  auto gguf = engine::GgufFile::Open(model);
  if (!gguf.ok()) return Fail(gguf.status());
  auto tok = engine::Tokenizer::FromGguf(**gguf);
  if (!tok.ok()) return Fail(tok.status());
  std::string input = text;
  if (!file.empty()) {
    auto t = ReadFile(file);
    if (!t.ok()) return Fail(t.status());
    input = *t;
  }
  std::vector<int32_t> ids = (*tok)->Encode(input, !no_special, !no_special);
  std::string line;
  for (size_t i = 0; i < ids.size(); ++i) line += pd::StrCat(i ? " " : "", ids[i]);
  std::printf("%s\n", line.c_str());
  return 0;
}

// ---- models -----------------------------------------------------------------------------------
int RunModels() {
  std::printf("search path:");
  for (const std::string& d : engine::ModelSearchPath()) std::printf(" %s", d.c_str());
  std::printf("\n");
  auto def = engine::FindDefaultModel();
  std::printf("default model: %s\n\n",
              def.ok() ? def->c_str() : std::string(def.status().message()).c_str());
  const auto models = engine::ListModels();
  if (models.empty()) {
    std::printf("no .gguf files found\n");
    return 0;
  }
  std::printf("%-10s %-10s %-30s %s\n", "size(MiB)", "runs", "name / architecture", "path");
  for (const auto& m : models) {
    std::printf("%-10.1f %-10s %-30s %s\n", m.bytes / 1048576.0, m.loadable ? "yes" : "no",
                pd::StrCat(m.name, " / ", m.architecture).substr(0, 60).c_str(), m.path.c_str());
  }
  return 0;
}

// ---- chat ---------------------------------------------------------------------------------------
// Reads user turns line by line from stdin, answers each with the whole conversation as context.
// Commands: /reset forgets the history, /exit (or end of input) quits.
int RunChat(GenerateFlags& g, const std::string& system, const std::string& template_name) {
  auto e = LoadEngine(g.engine);
  if (!e.ok()) return Fail(e.status());
  auto tok = engine::Tokenizer::FromGguf(*e->file);
  if (!tok.ok()) return Fail(tok.status());
  absl::StatusOr<engine::ChatTemplateKind> kind =
      template_name.empty() ? engine::DetectChatTemplate(*e->file)
                            : engine::ParseChatTemplateName(template_name);
  if (!kind.ok()) return Fail(kind.status());

  engine::GenerateOptions opt;
  opt.max_tokens = g.n_predict;
  opt.sampling.temperature = g.temperature;
  opt.sampling.top_k = g.top_k;
  opt.sampling.top_p = g.top_p;
  opt.sampling.min_p = g.min_p;
  opt.sampling.repetition_penalty = g.repeat_penalty;
  opt.sampling.penalty_last_n = g.repeat_last_n;
  opt.sampling.seed = g.seed >= 0 ? static_cast<uint64_t>(g.seed) : std::random_device{}();
  for (int32_t id = 0; id < (*tok)->n_vocab(); ++id) {
    if ((*tok)->IsEog(id)) opt.eog_tokens.insert(id);
  }
  const bool interactive = isatty(fileno(stdin));
  std::vector<engine::ChatMessage> history;
  if (!system.empty()) history.push_back({"system", system});
  std::fprintf(stderr, "pdctl chat: %s (template %s). Type a message; /reset, /exit.\n",
               g.engine.model.c_str(), std::string(engine::ChatTemplateName(*kind)).c_str());
  std::string line;
  while (true) {
    if (interactive) std::fprintf(stderr, "> ");
    if (!std::getline(std::cin, line) || line == "/exit") break;
    if (line.empty()) continue;
    if (line == "/reset") {
      history.resize(system.empty() ? 0 : 1);
      continue;
    }
    history.push_back({"user", line});
    auto prompt_text = engine::ApplyChatTemplate(*kind, history, true);
    if (!prompt_text.ok()) return Fail(prompt_text.status());
    std::vector<int32_t> prompt = (*tok)->Encode(*prompt_text, true, true);
    engine::StopMatcher stops(g.stop);
    engine::StreamingDetokenizer detok(**tok);
    std::string reply;
    auto on_token = [&](int32_t id) {
      std::string out = stops.Push(detok.Push(id));
      reply += out;
      std::fwrite(out.data(), 1, out.size(), stdout);
      std::fflush(stdout);
      return !stops.stopped();
    };
    auto r = engine::Generate(*e->model, *e->kv, 0, prompt, opt, on_token);
    if (!r.ok()) {
      // The conversation outgrew the context (or another request-level error): say so, keep going.
      std::fprintf(stderr, "\npdctl chat: %s\n", std::string(r.status().ToString()).c_str());
      history.pop_back();
      continue;
    }
    std::string rest = stops.Push(detok.Flush()) + stops.Flush();
    reply += rest;
    std::fwrite(rest.data(), 1, rest.size(), stdout);
    std::printf("\n");
    std::fflush(stdout);
    history.push_back({"assistant", reply});
    const double n_dec = r->tokens.size() > 1 ? double(r->tokens.size() - 1) : 0;
    std::fprintf(stderr, "[%d prompt tokens at %.1f tok/s, %zu generated at %.1f tok/s, %s]\n",
                 r->prompt_tokens, r->prompt_tokens / std::max(r->prefill_seconds, 1e-9),
                 r->tokens.size(), n_dec / std::max(r->decode_seconds, 1e-9),
                 r->finish_reason.c_str());
  }
  return 0;
}

// ---- bench -------------------------------------------------------------------------------------
// llama-bench's two figures on one model: pp (one forward of a `pp`-token prompt from an empty
// cache, logits of the last position only) and tg (`tg` single-token forwards from an empty
// cache, full logits each step, greedy argmax over them). Token ids are synthetic (BOS, then
// BenchToken(i)); bench/cpu_vs_llamacpp/run.py feeds llama.cpp the same ids. Also times the
// model load and the first forward after it (cold or warm page cache: the caller decides), and
// reports peak RSS split into file-backed (the mmapped weights) and anonymous memory. Prints
// one JSON object on stdout.
int32_t BenchToken(int i) {
  return i == 0 ? 2 : 1000 + static_cast<int32_t>((i * 7919LL) % 100000);
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

int RunBench(EngineFlags& f, int pp, int tg, int reps, int batch_seqs) {
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
  const int tg_blocks = (tg + kv.options().block_size - 1) / kv.options().block_size;
  if (batch_seqs > 1 && int64_t{batch_seqs} * tg_blocks > kv.total_blocks()) {
    return Fail(absl::InvalidArgumentError(pd::StrCat(
        "--batch ", batch_seqs, " sequences of ", tg, " tokens need ", batch_seqs * tg_blocks,
        " KV blocks, the cache has ", kv.total_blocks(), " (raise --ctx or lower --tg)")));
  }
  std::vector<float> logits;
  auto prompt = [&](int n) -> absl::Status {
    kv.Free(0);
    PD_RETURN_IF_ERROR(kv.Reserve(0, n));
    engine::Batch batch;
    for (int i = 0; i < n; ++i) batch.Add(BenchToken(i), i, 0, i + 1 == n);
    return model.Forward(batch, kv, &logits);
  };
  auto decode = [&](int n) -> absl::Status {
    kv.Free(0);
    int32_t token = BenchToken(0);
    for (int i = 0; i < n; ++i) {
      PD_RETURN_IF_ERROR(kv.Reserve(0, i + 1));
      engine::Batch batch;
      batch.Add(token, i, 0, true);
      PD_RETURN_IF_ERROR(model.Forward(batch, kv, &logits));
      token = engine::ArgMax(absl::MakeConstSpan(logits.data(), n_vocab));
    }
    return absl::OkStatus();
  };
  // Batched decode: `batch_seqs` sequences (ids 1..B) each take one token per step, as a
  // continuous-batching engine's decode steps do; full logits for every row.
  auto decode_batch = [&](int n) -> absl::Status {
    std::vector<int32_t> tokens(batch_seqs, BenchToken(0));
    for (int s = 1; s <= batch_seqs; ++s) kv.Free(s);
    for (int i = 0; i < n; ++i) {
      engine::Batch batch;
      for (int s = 0; s < batch_seqs; ++s) {
        PD_RETURN_IF_ERROR(kv.Reserve(s + 1, i + 1));
        batch.Add(tokens[s] + (i == 0 ? s : 0), i, s + 1, true);
      }
      PD_RETURN_IF_ERROR(model.Forward(batch, kv, &logits));
      for (int s = 0; s < batch_seqs; ++s) {
        tokens[s] = engine::ArgMax(
            absl::MakeConstSpan(logits.data() + static_cast<size_t>(s) * n_vocab, n_vocab));
      }
    }
    for (int s = 1; s <= batch_seqs; ++s) kv.Free(s);
    return absl::OkStatus();
  };
  // First token after the load: an 8-token prompt (touches every weight page).
  const double t1 = NowSeconds();
  if (auto s = prompt(8); !s.ok()) return Fail(s);
  const double first_s = NowSeconds() - t1;
  // Warm-up: caches, thread pool, scratch sized for the largest batch.
  if (auto s = prompt(pp); !s.ok()) return Fail(s);
  if (auto s = decode(std::min(tg, 16)); !s.ok()) return Fail(s);
  // Rates per wall second, and per second of this process's CPU time (all threads): on a
  // machine shared with other work the latter moves less for single-threaded runs.
  std::vector<double> pp_rates, tg_rates, pp_cpu, tg_cpu, tgb_rates, tgb_cpu;
  if (batch_seqs > 1) {
    if (auto s = decode_batch(std::min(tg, 4)); !s.ok()) return Fail(s);
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
    if (batch_seqs > 1) {
      t = NowSeconds(), c = CpuSeconds();
      if (auto s = decode_batch(tg); !s.ok()) return Fail(s);
      tgb_rates.push_back(static_cast<double>(tg) * batch_seqs / (NowSeconds() - t));
      tgb_cpu.push_back(static_cast<double>(tg) * batch_seqs / (CpuSeconds() - c));
    }
  }
  auto list = [](const std::vector<double>& v) {
    std::string s = "[";
    for (size_t i = 0; i < v.size(); ++i) s += pd::StrCat(i ? ", " : "", v[i]);
    return s + "]";
  };
  const int threads =
      f.threads > 0 ? f.threads : static_cast<int>(std::thread::hardware_concurrency());
  std::printf(
      "{\"system\": \"pdserve\", \"model\": \"%s\", \"threads\": %d, \"kv_type\": \"%s\", "
      "\"pp\": %d, \"tg\": %d, \"load_s\": %.4f, \"first_token_s\": %.4f, \"pp_tok_s\": %s, "
      "\"tg_tok_s\": %s, \"pp_tok_per_cpu_s\": %s, \"tg_tok_per_cpu_s\": %s, \"peak_rss_mib\": "
      "%.1f, \"rss_file_mib\": %.1f, \"rss_anon_mib\": %.1f, "
      "\"weights_bytes\": %zu, \"batch\": %d, \"tg_batch_tok_s\": %s, \"tg_batch_tok_per_cpu_s\": %s}\n",
      f.model.c_str(), threads, f.kv_type.c_str(), pp, tg, load_s, first_s, list(pp_rates).c_str(),
      list(tg_rates).c_str(), list(pp_cpu).c_str(), list(tg_cpu).c_str(), PeakRssMiB(),
      ProcStatusMiB("RssFile"), ProcStatusMiB("RssAnon"),
      static_cast<size_t>(model.weights().total_bytes), batch_seqs, list(tgb_rates).c_str(),
      list(tgb_cpu).c_str());
  return 0;
}

}  // namespace
}  // namespace pd::tools

int main(int argc, char** argv) {
  using namespace pd::tools;
  CLI::App app{"pdctl: pdserve's command line (generate text, tokenize, dump logits, quantize)"};
  app.require_subcommand(1);
  app.option_defaults()->always_capture_default();

  GenerateFlags g;
  CLI::App* gen = app.add_subcommand("generate",
                                     "generate text from a prompt, streamed to stdout; "
                                     "speed and memory figures go to stderr");
  g.engine.Add(gen);
  auto* p_opt = gen->add_option("-p,--prompt", g.prompt, "prompt text");
  auto* f_opt = gen->add_option("-f,--file", g.prompt_file, "read the prompt from a file");
  auto* i_opt =
      gen->add_option("--prompt-ids", g.prompt_ids, "prompt as space-separated token ids");
  p_opt->excludes(f_opt)->excludes(i_opt);
  f_opt->excludes(i_opt);
  gen->add_option("-n,--n-predict", g.n_predict, "tokens to generate")
      ->check(CLI::NonNegativeNumber);
  gen->add_option("--temperature,--temp", g.temperature, "sampling temperature; 0 = greedy");
  gen->add_option("--top-k", g.top_k, "keep the k most likely tokens (0 = off)");
  gen->add_option("--top-p", g.top_p, "nucleus sampling mass (1 = off)");
  gen->add_option("--min-p", g.min_p, "drop tokens below min_p x the top probability (0 = off)");
  gen->add_option("--repeat-penalty", g.repeat_penalty, "repetition penalty (1 = off)");
  gen->add_option("--repeat-last-n", g.repeat_last_n, "tokens the repetition penalty looks back");
  gen->add_option("--seed", g.seed, "RNG seed (-1 = random, printed on stderr)");
  gen->add_option("--stop", g.stop, "stop string (repeatable); not printed");
  gen->add_flag("--ignore-eos", g.ignore_eos, "keep generating past end-of-generation tokens");
  gen->add_flag("--print-ids", g.print_ids, "print generated token ids instead of text");
  gen->add_flag("--no-special", g.no_special, "add no BOS/EOS and parse no special-token text");

  EngineFlags lf;
  std::string logit_ids, logit_out;
  CLI::App* lg = app.add_subcommand(
      "logits", "write the final position's logits (n_vocab float32, little-endian) to a file");
  lf.Add(lg);
  lg->add_option("--prompt-ids", logit_ids, "prompt as space-separated token ids")->required();
  lg->add_option("-o,--out", logit_out, "output file")->required();
  bool logit_all = false;
  int logit_top = 0;
  lg->add_flag("--all", logit_all, "every prompt position, not only the last (needs --top)");
  lg->add_option("--top", logit_top,
                 "write per position: float32 logsumexp, then the N best ids (int32) and their "
                 "logits (float32); 0 = the final position's full logits");
  std::string logit_dump;
  lg->add_option("--dump-matmul-inputs", logit_dump,
                 "also write the input of every weight matmul to DIR/<weight>.f32 (float32 "
                 "[tokens, cols]), for comparing intermediates with another engine");

  std::string tk_model, tk_file, tk_text;
  bool tk_no_special = false;
  CLI::App* tk = app.add_subcommand("tokenize", "print the token ids of a text on one line");
  tk->add_option("-m,--model", tk_model, "GGUF model or vocabulary file")->required();
  tk->add_flag("--no-special", tk_no_special, "add no BOS/EOS and parse no special-token text");
  auto* tf = tk->add_option("--file", tk_file, "read the text from a file");
  auto* tt = tk->add_option("--text", tk_text, "the text");
  tf->excludes(tt);

  CLI::App* models = app.add_subcommand("models", "list the model files pdctl can find, and where");

  GenerateFlags cg;
  std::string chat_system, chat_template;
  CLI::App* chat = app.add_subcommand(
      "chat", "chat with a model: one user message per line on stdin, replies on stdout");
  cg.engine.Add(chat);
  chat->add_option("--system", chat_system, "system message");
  chat->add_option("--template", chat_template,
                   "chat template: gemma, chatml, llama3, llama2 (default: from the model)");
  chat->add_option("-n,--n-predict", cg.n_predict, "most tokens per reply")
      ->check(CLI::NonNegativeNumber);
  chat->add_option("--temperature,--temp", cg.temperature, "sampling temperature; 0 = greedy");
  chat->add_option("--top-k", cg.top_k, "keep the k most likely tokens (0 = off)");
  chat->add_option("--top-p", cg.top_p, "nucleus sampling mass (1 = off)");
  chat->add_option("--min-p", cg.min_p, "drop tokens below min_p x the top probability (0 = off)");
  chat->add_option("--repeat-penalty", cg.repeat_penalty, "repetition penalty (1 = off)");
  chat->add_option("--seed", cg.seed, "RNG seed (-1 = random)");
  chat->add_option("--stop", cg.stop, "stop string (repeatable)");

  EngineFlags bf;
  int bench_pp = 512, bench_tg = 128, bench_reps = 3, bench_batch = 1;
  CLI::App* bench = app.add_subcommand(
      "bench", "time prompt processing (pp) and decoding (tg) like llama-bench; prints JSON");
  bf.Add(bench);
  bench->add_option("--pp", bench_pp, "prompt tokens")->check(CLI::PositiveNumber);
  bench->add_option("--tg", bench_tg, "generated tokens")->check(CLI::PositiveNumber);
  bench->add_option("-r,--reps", bench_reps, "repetitions")->check(CLI::PositiveNumber);
  bench->add_option("--batch", bench_batch,
                    "also time batched decoding: this many sequences take one token per step "
                    "(tg_batch_tok_s: all sequences' tokens per second)")
      ->check(CLI::PositiveNumber);

  QuantizeFlags qf;
  CLI::App* qz = AddQuantizeCommand(app, &qf);
  TextsFlags txf;
  CLI::App* tx = AddTextsCommand(app, &txf);

  UpFlags uf;
  CLI::App* up = AddUpCommand(app, &uf);

  CLI11_PARSE(app, argc, argv);
  if (up->parsed()) return RunUp(uf);
  if (qz->parsed()) return RunQuantize(qf);
  if (tx->parsed()) return RunTexts(txf);
  if (models->parsed()) return RunModels();
  if (bench->parsed()) return RunBench(bf, bench_pp, bench_tg, bench_reps, bench_batch);
  if (chat->parsed()) return RunChat(cg, chat_system, chat_template);
  if (gen->parsed()) {
    if (g.prompt.empty() && g.prompt_file.empty() && g.prompt_ids.empty()) {
      std::fprintf(stderr, "pdctl generate: give a prompt with -p, -f or --prompt-ids\n");
      return 2;
    }
    return RunGenerate(g);
  }
  if (lg->parsed()) return RunLogits(lf, logit_ids, logit_out, logit_all, logit_top, logit_dump);
  if (tk->parsed()) {
    if (tk_file.empty() && tt->count() == 0) {
      std::fprintf(stderr, "pdctl tokenize: give --text or --file\n");
      return 2;
    }
    return RunTokenize(tk_model, tk_no_special, tk_file, tk_text);
  }
  return 0;
}
