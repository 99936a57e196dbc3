// pd-bench: load generator for pdserve's public APIs (gRPC and OpenAI-compatible HTTP).
// Usage and the definitions of the metrics: bench/pd_bench/README.md.
#include <algorithm>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "bench/pd_bench/client.h"
#include "bench/pd_bench/conversation.h"
#include "bench/pd_bench/report.h"
#include "bench/pd_bench/runner.h"
#include "bench/pd_bench/workload.h"
#include "common/status.h"
#include "common/strings.h"

namespace pd::bench {
namespace {

std::atomic<bool> g_stop{false};

void OnSigint(int) {
  g_stop.store(true);
  std::signal(SIGINT, SIG_DFL);  // a second Ctrl-C ends the process
}

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "pd-bench: error: %s\n", std::string(s.ToString()).c_str());
  return s.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
}

struct Flags {
  std::string api;
  std::string target;
  std::string model;
  std::string endpoint = "completions";
  std::optional<double> rate;
  std::optional<int> concurrency;
  std::optional<int> max_concurrency;
  std::optional<int64_t> num_requests;
  std::optional<double> duration;
  int warmup = 0;
  std::string prompt_tokens = "256";
  std::string output_tokens = "128";
  std::string dist;
  std::string mix;
  uint64_t seed = 0;
  std::optional<float> temperature;
  double timeout = 600;
  std::optional<double> slo_ttft_ms;
  std::optional<double> slo_tpot_ms;
  std::string json;
  bool save_requests = false;
  bool no_progress = false;
  int grpc_channels = 4;
  // Multi-turn mode.
  bool multi_turn = false;
  std::optional<int64_t> conversations;
  int turns = 4;
  double think_time_ms = 0;
  std::string think_time_dist = "fixed";
  int system_prompts = 1;
  int system_words = 256;
  std::string system_prompt_assignment = "round-robin";
  std::string user_words = "64";
};

absl::StatusOr<ConversationOptions> BuildConversations(const Flags& f) {
  ConversationOptions c;
  c.conversations = f.conversations.value_or(f.duration ? 0 : 10);
  c.turns = f.turns;
  c.think_time_ms = f.think_time_ms;
  c.think_time = f.think_time_dist == "exponential" ? ThinkTime::kExponential : ThinkTime::kFixed;
  c.system_prompts = f.system_prompts;
  c.system_words = f.system_words;
  c.assignment = f.system_prompt_assignment == "random" ? SystemPromptAssignment::kRandom
                                                        : SystemPromptAssignment::kRoundRobin;
  PD_ASSIGN_OR_RETURN(c.user_words, LengthDist::Parse(f.user_words));
  PD_ASSIGN_OR_RETURN(c.output, LengthDist::Parse(f.output_tokens));
  c.seed = f.seed;
  PD_RETURN_IF_ERROR(c.Validate());
  return c;
}

std::string DescribeConversations(const ConversationOptions& c) {
  std::string s =
      pd::StrCat(c.conversations > 0 ? pd::StrCat(c.conversations) : "unbounded",
                 " conversations of ", c.turns, " turns, think time ", c.think_time_ms, " ms",
                 c.think_time == ThinkTime::kExponential ? " (exponential)" : "", ", ");
  if (c.system_prompts == 0) {
    s += "no system prompt";
  } else {
    s +=
        pd::StrCat(c.system_prompts, " system prompt(s) of ", c.system_words, " words (",
                   c.assignment == SystemPromptAssignment::kRandom ? "random" : "round-robin", ")");
  }
  return s +
         pd::StrCat(", user words=", c.user_words.ToString(), ", max_tokens=", c.output.ToString());
}

absl::StatusOr<std::vector<WorkloadClass>> BuildWorkload(const Flags& f) {
  if (!f.mix.empty()) return ParseMix(f.mix);
  if (!f.dist.empty()) {
    PD_ASSIGN_OR_RETURN(std::vector<DistRow> rows, LoadDistFile(f.dist));
    return ClassesFromDist(rows);
  }
  WorkloadClass c;
  c.name = "all";
  PD_ASSIGN_OR_RETURN(c.prompt, LengthDist::Parse(f.prompt_tokens));
  PD_ASSIGN_OR_RETURN(c.output, LengthDist::Parse(f.output_tokens));
  return std::vector<WorkloadClass>{c};
}

std::string DescribeClass(const WorkloadClass& c) {
  std::string s = pd::StrCat(c.name, "(");
  if (c.rows.empty()) {
    s += pd::StrCat("prompt=", c.prompt.ToString(), " output=", c.output.ToString());
  } else {
    s += pd::StrCat(c.rows.size(), " rows, mean prompt=", static_cast<int>(c.MeanPrompt() + 0.5),
                    " output=", static_cast<int>(c.MeanOutput() + 0.5));
  }
  if (c.rate) s += pd::StrCat(" rate=", *c.rate);
  if (c.concurrency) s += pd::StrCat(" concurrency=", *c.concurrency);
  if (c.shared()) s += pd::StrCat(" weight=", c.weight);
  return s + ")";
}

int Main(int argc, char** argv) {
  Flags f;
  CLI::App app{"pd-bench: load generator for pdserve's gRPC and OpenAI-compatible HTTP APIs"};
  app.add_option("--api", f.api, "grpc (pdserve.v1.Chat/Generate) or http (OpenAI-compatible)")
      ->required()
      ->check(CLI::IsMember({"grpc", "http"}));
  app.add_option("--target", f.target, "HOST:PORT of the server")->required();
  app.add_option("--model", f.model, "model to request (default: the first the server lists)");
  app.add_option("--endpoint", f.endpoint,
                 "completions: raw prompt (/v1/completions, GenerateRequest.prompt); chat: one "
                 "user message (/v1/chat/completions, GenerateRequest.messages)")
      ->check(CLI::IsMember({"completions", "chat"}))
      ->capture_default_str();
  CLI::Option* rate = app.add_option("--rate", f.rate, "Poisson arrivals, requests/s");
  app.add_option("--concurrency", f.concurrency,
                 "closed loop: this many streams in flight (default 1 without --rate)")
      ->excludes(rate);
  app.add_option("--max-concurrency", f.max_concurrency,
                 "with --rate: an arrival waits while this many requests are in flight")
      ->needs(rate);
  app.add_option("--num-requests,-n", f.num_requests,
                 "measured requests (default 100 when --duration is not given)");
  app.add_option("--duration", f.duration, "seconds after which no new request is sent");
  app.add_option("--warmup", f.warmup, "warm-up requests before the measurement (excluded)")
      ->capture_default_str();
  CLI::Option* prompt = app.add_option("--prompt-tokens", f.prompt_tokens,
                                       "prompt length: N, uniform:A:B or normal:MU:SIGMA")
                            ->capture_default_str();
  CLI::Option* output = app.add_option("--output-tokens", f.output_tokens,
                                       "output length (max_tokens with ignore_eos): N, "
                                       "uniform:A:B or normal:MU:SIGMA")
                            ->capture_default_str();
  CLI::Option* dist = app.add_option("--dist", f.dist,
                                     "file of (prompt_len, output_len[, class]) rows, CSV or JSON")
                          ->excludes(prompt)
                          ->excludes(output);
  app.add_option("--mix", f.mix,
                 "workload classes: \"NAME:prompt=SPEC,output=SPEC,weight=W|rate=R|"
                 "concurrency=C;...\" (statistics per class)")
      ->excludes(prompt)
      ->excludes(output)
      ->excludes(dist);
  app.add_option("--seed", f.seed, "seed of lengths, prompts and arrivals")->capture_default_str();
  app.add_option("--temperature", f.temperature, "sampling temperature (default: server's)");
  app.add_option("--timeout", f.timeout, "per-request timeout, seconds")->capture_default_str();
  app.add_option("--slo-ttft-ms", f.slo_ttft_ms, "goodput: TTFT objective, ms");
  app.add_option("--slo-tpot-ms", f.slo_tpot_ms, "goodput: TPOT objective, ms");
  app.add_option("--json", f.json, "write the results as JSON to this file");
  app.add_flag("--save-requests", f.save_requests, "also write every request's record to --json");
  app.add_flag("--no-progress", f.no_progress, "no progress line on stderr");
  app.add_option("--grpc-channels", f.grpc_channels, "gRPC connections the streams are spread over")
      ->capture_default_str();
  CLI::Option* multi_turn =
      app.add_flag("--multi-turn", f.multi_turn,
                   "multi-turn chat: conversations whose turns send the whole history; "
                   "--rate/--concurrency start conversations")
          ->excludes(prompt)
          ->excludes(dist)
          ->excludes(app.get_option("--mix"))
          ->excludes(app.get_option("--num-requests"));
  app.add_option("--conversations", f.conversations,
                 "multi-turn: measured conversations (default 10 when --duration is not given)")
      ->needs(multi_turn);
  app.add_option("--turns", f.turns, "multi-turn: user turns per conversation")
      ->needs(multi_turn)
      ->capture_default_str();
  app.add_option("--think-time-ms", f.think_time_ms,
                 "multi-turn: pause between an answer and the next turn, ms (mean with "
                 "--think-time-dist exponential)")
      ->needs(multi_turn)
      ->capture_default_str();
  app.add_option("--think-time-dist", f.think_time_dist, "multi-turn: fixed or exponential")
      ->needs(multi_turn)
      ->check(CLI::IsMember({"fixed", "exponential"}))
      ->capture_default_str();
  app.add_option("--system-prompts", f.system_prompts,
                 "multi-turn: distinct system prompts the conversations share (0: none)")
      ->needs(multi_turn)
      ->capture_default_str();
  app.add_option("--system-words", f.system_words, "multi-turn: words (tokens) per system prompt")
      ->needs(multi_turn)
      ->capture_default_str();
  app.add_option("--system-prompt-assignment", f.system_prompt_assignment,
                 "multi-turn: round-robin (conversation c gets prompt c mod S) or random (seeded)")
      ->needs(multi_turn)
      ->check(CLI::IsMember({"round-robin", "random"}))
      ->capture_default_str();
  app.add_option("--user-words", f.user_words,
                 "multi-turn: words (tokens) per user message: N, uniform:A:B or normal:MU:SIGMA")
      ->needs(multi_turn)
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  if (f.multi_turn) {
    if (app.count("--endpoint") > 0 && f.endpoint != "chat") {
      return Fail(absl::InvalidArgumentError("--multi-turn sends chat requests: --endpoint chat"));
    }
    f.endpoint = "chat";
  }
  absl::StatusOr<ConversationOptions> conversations;
  if (f.multi_turn) {
    conversations = BuildConversations(f);
    if (!conversations.ok()) return Fail(conversations.status());
  }
  absl::StatusOr<std::vector<WorkloadClass>> classes = BuildWorkload(f);
  if (!classes.ok()) return Fail(classes.status());
  if (f.multi_turn) {
    // One class for the common table; its "prompt" is the user message length.
    (*classes)[0].name = "chat";
    (*classes)[0].prompt = conversations->user_words;
  }

  RunOptions run;
  run.rate = f.rate;
  run.concurrency = f.concurrency;
  run.max_inflight = f.max_concurrency;
  run.duration_s = f.duration.value_or(0);
  run.num_requests = f.num_requests.value_or(f.duration ? 0 : 100);
  run.warmup = f.warmup;
  run.seed = f.seed;
  run.progress = !f.no_progress;
  run.stop = &g_stop;
  if (absl::Status s =
          f.multi_turn ? ValidateConversationRun(run, *conversations) : ValidateRun(run, *classes);
      !s.ok()) {
    return Fail(s);
  }

  ClientOptions copts;
  copts.target = f.target;
  copts.model = f.model;
  copts.chat = f.endpoint == "chat";
  copts.timeout_s = f.timeout;
  copts.temperature = f.temperature;
  copts.grpc_channels = f.grpc_channels;
  absl::StatusOr<std::unique_ptr<ApiClient>> client =
      f.api == "grpc" ? MakeGrpcClient(copts) : MakeHttpClient(copts);
  if (!client.ok()) return Fail(client.status());
  absl::StatusOr<std::string> served = (*client)->Probe();
  if (!served.ok()) return Fail(served.status());
  const std::string model = f.model.empty() ? *served : f.model;
  (*client)->SetModel(model);

  Slo slo;
  slo.ttft_ms = f.slo_ttft_ms;
  slo.tpot_ms = f.slo_tpot_ms;

  std::signal(SIGINT, OnSigint);
  const RunResult result = f.multi_turn ? RunConversations(run, *conversations, **client)
                                        : RunBenchmark(run, *classes, **client);
  std::signal(SIGINT, SIG_DFL);
  const Report report = BuildReport(*classes, result, slo);

  const bool any_shared = std::any_of(classes->begin(), classes->end(),
                                      [](const WorkloadClass& c) { return c.shared(); });
  const std::string unit = f.multi_turn ? "conversations" : "requests";
  std::string arrivals;
  if (!any_shared) {
    arrivals = "one process per class";
  } else if (run.rate) {
    arrivals = pd::StrCat("Poisson ", *run.rate, f.multi_turn ? " conversations/s" : " req/s");
    if (run.max_inflight) {
      arrivals += pd::StrCat(" (at most ", *run.max_inflight, " ", unit, " in flight)");
    }
  } else {
    arrivals = pd::StrCat("closed loop, concurrency ", run.concurrency.value_or(1),
                          f.multi_turn ? " conversations" : "");
  }
  const int64_t limit = f.multi_turn ? conversations->conversations : run.num_requests;
  std::string workload;
  if (f.multi_turn) {
    workload = " " + DescribeConversations(*conversations);
  } else {
    for (const WorkloadClass& c : *classes) workload += " " + DescribeClass(c);
  }
  std::vector<std::string> header = {
      pd::StrCat("pd-bench  api=", f.api, "  target=", f.target, "  model=", model,
                 "  endpoint=", f.endpoint),
      pd::StrCat("arrivals: ", arrivals, "; stop after ",
                 limit > 0 ? pd::StrCat(limit, " ", unit) : "",
                 limit > 0 && run.duration_s > 0 ? " or " : "",
                 run.duration_s > 0 ? pd::StrCat(run.duration_s, " s") : "", "; warm-up ",
                 run.warmup, f.multi_turn ? " one-turn conversations" : "", "; seed ", run.seed),
      pd::StrCat("workload:", workload)};
  if (g_stop.load()) header.push_back("interrupted: statistics cover the requests sent so far");
  std::fputs(FormatTable(report, *classes, slo, header).c_str(), stdout);
  std::fflush(stdout);

  if (!f.json.empty()) {
    nlohmann::json config = {
        {"api", f.api},
        {"target", f.target},
        {"model", model},
        {"endpoint", f.endpoint},
        {"rate", run.rate ? nlohmann::json(*run.rate) : nlohmann::json(nullptr)},
        {"concurrency", run.rate || !any_shared ? nlohmann::json(nullptr)
                                                : nlohmann::json(run.concurrency.value_or(1))},
        {"max_concurrency",
         run.max_inflight ? nlohmann::json(*run.max_inflight) : nlohmann::json(nullptr)},
        {"num_requests", run.num_requests},
        {"duration_s", run.duration_s},
        {"warmup", run.warmup},
        {"seed", run.seed},
        {"mix", f.mix},
        {"dist", f.dist},
        {"prompt_tokens", f.mix.empty() && f.dist.empty() ? f.prompt_tokens : ""},
        {"output_tokens", f.mix.empty() && f.dist.empty() ? f.output_tokens : ""},
        {"interrupted", g_stop.load()},
        {"multi_turn", nullptr},
    };
    if (f.multi_turn) {
      const ConversationOptions& c = *conversations;
      config["num_requests"] = nullptr;
      config["prompt_tokens"] = "";
      config["multi_turn"] = {
          {"conversations", c.conversations},
          {"turns", c.turns},
          {"think_time_ms", c.think_time_ms},
          {"think_time_dist", f.think_time_dist},
          {"system_prompts", c.system_prompts},
          {"system_words", c.system_words},
          {"system_prompt_assignment", f.system_prompt_assignment},
          {"user_words", c.user_words.ToString()},
          {"output_tokens", c.output.ToString()},
      };
    }
    const nlohmann::json j =
        ToJson(report, *classes, slo, config, f.save_requests ? &result.records : nullptr);
    std::ofstream out(f.json);
    out << j.dump(1) << "\n";
    if (!out) return Fail(absl::UnavailableError(pd::StrCat("cannot write '", f.json, "'")));
  }
  return report.overall.completed > 0 ? 0 : 1;
}

}  // namespace
}  // namespace pd::bench

int main(int argc, char** argv) { return pd::bench::Main(argc, argv); }
