#include "tools/pdctl/chat_cmd.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include "engine/sched/generate.h"
#include "engine/sched/stop.h"
#include "engine/tokenizer/chat_template.h"
#include "engine/tokenizer/tokenizer.h"
#include "tools/pdctl/cli_util.h"

namespace pd::tools {

CLI::App* AddChatCommand(CLI::App& app, ChatFlags* flags) {
  GenerateFlags& cg = flags->generate;
  CLI::App* chat = app.add_subcommand(
      "chat", "chat with a model: one user message per line on stdin, replies on stdout");
  cg.engine.Add(chat);
  cg.spec.Add(chat);
  chat->add_option("--system", flags->system, "system message");
  chat->add_option("--template", flags->template_name,
                   "chat template: gemma, chatml, llama3, llama2, phi3 (default: from the model)");
  chat->add_option("-n,--n-predict", cg.n_predict, "most tokens per reply")
      ->check(CLI::NonNegativeNumber);
  chat->add_option("--temperature,--temp", cg.temperature, "sampling temperature; 0 = greedy");
  chat->add_option("--top-k", cg.top_k, "keep the k most likely tokens (0 = off)");
  chat->add_option("--top-p", cg.top_p, "nucleus sampling mass (1 = off)");
  chat->add_option("--min-p", cg.min_p, "drop tokens below min_p x the top probability (0 = off)");
  chat->add_option("--repeat-penalty", cg.repeat_penalty, "repetition penalty (1 = off)");
  chat->add_option("--seed", cg.seed, "RNG seed (-1 = random)");
  chat->add_option("--stop", cg.stop, "stop string (repeatable)");
  return chat;
}

int RunChat(const ChatFlags& flags) {
  const GenerateFlags& g = flags.generate;
  const std::string& system = flags.system;
  const std::string& template_name = flags.template_name;
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
  std::unique_ptr<SpecGenerator> spec;
  if (g.spec.on()) {
    auto s = SpecGenerator::Create(*e, g.spec, g.engine.threads);
    if (!s.ok()) return Fail(s.status());
    spec = std::move(*s);
  }
  const bool interactive = isatty(fileno(stdin));
  std::vector<engine::ChatMessage> history;
  if (!system.empty()) history.push_back({"system", system});
  std::fprintf(stderr, "pdctl chat: %s (template %s). Type a message; /reset, /exit.\n",
               e->model_path.c_str(), std::string(engine::ChatTemplateName(*kind)).c_str());
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
    SpecCounts counts;
    auto r = spec ? spec->Generate(prompt, opt, on_token, &counts)
                  : engine::Generate(*e->model, *e->kv, 0, prompt, opt, on_token);
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
    if (spec && counts.draft_tokens > 0) {
      std::fprintf(stderr, "[speculation: %.2f tokens per target step, %d of %d drafts accepted]\n",
                   counts.steps > 0 ? n_dec / counts.steps : 0.0, counts.accepted_tokens,
                   counts.draft_tokens);
    }
  }
  return 0;
}

}  // namespace pd::tools
