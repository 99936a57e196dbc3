#include "tools/pdctl/generate_cmd.h"

#include <algorithm>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/strings.h"
#include "engine/sched/generate.h"
#include "engine/sched/stop.h"
#include "engine/tokenizer/tokenizer.h"
#include "tools/pdctl/cli_util.h"

namespace pd::tools {

CLI::App* AddGenerateCommand(CLI::App& app, GenerateFlags* g) {
  CLI::App* gen = app.add_subcommand("generate",
                                     "generate text from a prompt, streamed to stdout; "
                                     "speed and memory figures go to stderr");
  g->engine.Add(gen);
  g->spec.Add(gen);
  auto* p_opt = gen->add_option("-p,--prompt", g->prompt, "prompt text");
  auto* f_opt = gen->add_option("-f,--file", g->prompt_file, "read the prompt from a file");
  auto* i_opt =
      gen->add_option("--prompt-ids", g->prompt_ids, "prompt as space-separated token ids");
  p_opt->excludes(f_opt)->excludes(i_opt);
  f_opt->excludes(i_opt);
  gen->add_option("-n,--n-predict", g->n_predict, "tokens to generate")
      ->check(CLI::NonNegativeNumber);
  gen->add_option("--temperature,--temp", g->temperature, "sampling temperature; 0 = greedy");
  gen->add_option("--top-k", g->top_k, "keep the k most likely tokens (0 = off)");
  gen->add_option("--top-p", g->top_p, "nucleus sampling mass (1 = off)");
  gen->add_option("--min-p", g->min_p, "drop tokens below min_p x the top probability (0 = off)");
  gen->add_option("--repeat-penalty", g->repeat_penalty, "repetition penalty (1 = off)");
  gen->add_option("--repeat-last-n", g->repeat_last_n, "tokens the repetition penalty looks back");
  gen->add_option("--seed", g->seed, "RNG seed (-1 = random, printed on stderr)");
  gen->add_option("--stop", g->stop, "stop string (repeatable); not printed");
  gen->add_flag("--ignore-eos", g->ignore_eos, "keep generating past end-of-generation tokens");
  gen->add_flag("--print-ids", g->print_ids, "print generated token ids instead of text");
  gen->add_flag("--no-special", g->no_special, "add no BOS/EOS and parse no special-token text");
  return gen;
}

int RunGenerate(const GenerateFlags& g) {
  if (g.prompt.empty() && g.prompt_file.empty() && g.prompt_ids.empty()) {
    std::fprintf(stderr, "pdctl generate: give a prompt with -p, -f or --prompt-ids\n");
    return 2;
  }
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
  std::unique_ptr<SpecGenerator> spec;
  SpecCounts counts;
  if (g.spec.on()) {
    auto s = SpecGenerator::Create(*e, g.spec, g.engine.threads);
    if (!s.ok()) return Fail(s.status());
    spec = std::move(*s);
  }
  auto r = spec ? spec->Generate(prompt, opt, on_token, &counts)
                : engine::Generate(*e->model, *e->kv, /*seq=*/0, prompt, opt, on_token);
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
               e->model_path.c_str(), cfg.arch.c_str(), cfg.n_layer,
               e->model->weights().total_bytes / 1048576.0,
               g.engine.threads > 0 ? g.engine.threads
                                    : static_cast<int>(std::thread::hardware_concurrency()),
               static_cast<unsigned long long>(opt.sampling.seed), r->prompt_tokens,
               r->prefill_seconds, r->prompt_tokens / std::max(r->prefill_seconds, 1e-9),
               r->tokens.size(), r->decode_seconds, n_dec / std::max(r->decode_seconds, 1e-9),
               r->finish_reason.c_str(), PeakRssMiB());
  if (spec) {
    std::fprintf(stderr,
                 "speculation: %s, K <= %d | %d target steps for %zu tokens (%.2f per step) | "
                 "drafted %d, accepted %d (%.0f %%)\n",
                 spec->drafter_name().c_str(), g.spec.spec_k, counts.steps, r->tokens.size(),
                 counts.steps > 0 ? n_dec / counts.steps : 0.0, counts.draft_tokens,
                 counts.accepted_tokens,
                 counts.draft_tokens > 0 ? 100.0 * counts.accepted_tokens / counts.draft_tokens
                                         : 0.0);
  }
  return 0;
}

}  // namespace pd::tools
