#include "bench/pd_bench/report.h"

#include <algorithm>
#include <cstdio>
#include <functional>
#include <utility>

#include "common/strings.h"

namespace pd::bench {
namespace {

std::string Fixed(double v, int decimals) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.*f", decimals, v);
  return buf;
}

nlohmann::json OrNull(const std::optional<double>& v) {
  return v ? nlohmann::json(*v) : nlohmann::json(nullptr);
}

std::string Percent(double fraction) { return Fixed(100 * fraction, 1) + "%"; }

nlohmann::json DistToJson(const DistStats& d) {
  nlohmann::json j;
  j["n"] = d.n;
  if (d.n == 0) {
    for (const char* k : {"mean", "p50", "p90", "p99", "max"}) j[k] = nullptr;
  } else {
    j["mean"] = d.mean;
    j["p50"] = d.p50;
    j["p90"] = d.p90;
    j["p99"] = d.p99;
    j["max"] = d.max;
  }
  return j;
}

}  // namespace

Report BuildReport(const std::vector<WorkloadClass>& classes, const RunResult& result,
                   const Slo& slo) {
  std::vector<const RequestRecord*> all;
  std::vector<std::vector<const RequestRecord*>> by_class(classes.size());
  for (const RequestRecord& r : result.records) {
    all.push_back(&r);
    if (r.class_index >= 0 && r.class_index < static_cast<int>(classes.size())) {
      by_class[r.class_index].push_back(&r);
    }
  }
  Report report;
  report.overall = Summarize(all, result.duration_s, slo);
  for (const auto& records : by_class) {
    report.classes.push_back(Summarize(records, result.duration_s, slo));
  }
  if (std::any_of(all.begin(), all.end(), [](const RequestRecord* r) { return r->turn > 0; })) {
    report.turns = SummarizeTurns(all);
  }
  return report;
}

std::string FormatTurnTable(const TurnReport& t) {
  const std::string na = "n/a";
  const auto ms = [](const DistStats& d, double DistStats::*field) {
    return d.n > 0 ? Fixed(d.*field, 2) : std::string("-");
  };
  const double turn1_p50 =
      !t.turns.empty() && t.turns[0].ttft_ms.n > 0 ? t.turns[0].ttft_ms.p50 : 0;
  std::vector<std::vector<std::string>> rows = {{"turn", "requests", "failed", "TTFT p50",
                                                 "TTFT p90", "E2E p50", "prompt tok", "cached tok",
                                                 "hit rate", "TTFT p50 / turn 1"}};
  const auto add = [&](const std::string& label, const TurnSummary& s) {
    rows.push_back({label, pd::StrCat(s.requests), pd::StrCat(s.failed),
                    ms(s.ttft_ms, &DistStats::p50), ms(s.ttft_ms, &DistStats::p90),
                    ms(s.e2e_ms, &DistStats::p50),
                    s.prompt_tokens_mean ? Fixed(*s.prompt_tokens_mean, 1) : na,
                    s.cached_tokens_mean ? Fixed(*s.cached_tokens_mean, 1) : na,
                    s.cache_hit_rate ? Percent(*s.cache_hit_rate) : na,
                    s.ttft_ms.n > 0 && turn1_p50 > 0 ? Fixed(s.ttft_ms.p50 / turn1_p50, 2)
                                                     : std::string("-")});
  };
  for (const TurnSummary& s : t.turns) add(pd::StrCat(s.turn), s);
  add("turns >= 2", t.later);
  add("all", t.all);

  std::vector<size_t> width(rows[0].size(), 0);
  for (const auto& row : rows) {
    for (size_t i = 0; i < row.size(); ++i) width[i] = std::max(width[i], row[i].size());
  }
  std::string out =
      "per turn (ms; prompt / cached tok: the server's counts, mean per request; hit rate: "
      "cached / prompt tokens):\n";
  for (const auto& row : rows) {
    std::string line = row[0] + std::string(width[0] - row[0].size(), ' ');
    for (size_t i = 1; i < row.size(); ++i) {
      line += std::string(width[i] + 2 - row[i].size(), ' ') + row[i];
    }
    out += line + "\n";
  }
  out += pd::StrCat("cache hit rate (cached / prompt tokens): all turns ",
                    t.all.cache_hit_rate ? Percent(*t.all.cache_hit_rate) : na, ", turns >= 2 ",
                    t.later.cache_hit_rate ? Percent(*t.later.cache_hit_rate) : na, "\n");
  out += pd::StrCat("TTFT p50 of turns >= 2 / TTFT p50 of turn 1: ",
                    t.ttft_p50_ratio ? Fixed(*t.ttft_p50_ratio, 3) : std::string("-"), "\n");
  if (!t.cached_reported) {
    out +=
        "cached tokens n/a: the server reported none (HTTP: no "
        "usage.prompt_tokens_details.cached_tokens; gRPC: Usage.cached_tokens 0 throughout, "
        "which a server without the field also sends)\n";
  }
  return out;
}

std::string FormatTable(const Report& report, const std::vector<WorkloadClass>& classes,
                        const Slo& slo, const std::vector<std::string>& header) {
  std::vector<const Summary*> cols = {&report.overall};
  std::vector<std::string> names = {"all"};
  if (classes.size() > 1) {
    for (size_t i = 0; i < classes.size(); ++i) {
      cols.push_back(&report.classes[i]);
      names.push_back(classes[i].name);
    }
  }
  // Rows are collected first so that the label column fits the longest label.
  std::vector<std::pair<std::string, std::vector<std::string>>> rows;
  const auto row = [&](const std::string& label,
                       const std::function<std::string(const Summary&)>& cell) {
    std::vector<std::string> cells;
    for (const Summary* s : cols) cells.push_back(cell(*s));
    rows.emplace_back(label, std::move(cells));
  };
  const auto dist_rows = [&](const std::string& name, DistStats Summary::*field,
                             std::initializer_list<const char*> which) {
    for (const char* w : which) {
      row(pd::StrCat(name, " ", w, " (ms)"), [&](const Summary& s) -> std::string {
        const DistStats& d = s.*field;
        if (d.n == 0) return "-";
        const std::string k = w;
        const double v = k == "mean"  ? d.mean
                         : k == "p50" ? d.p50
                         : k == "p90" ? d.p90
                         : k == "p99" ? d.p99
                                      : d.max;
        return Fixed(v, 2);
      });
    }
  };
  row("", [&](const Summary& s) {
    for (size_t i = 0; i < cols.size(); ++i) {
      if (cols[i] == &s) return names[i];
    }
    return std::string();
  });
  row("requests completed", [](const Summary& s) { return pd::StrCat(s.completed); });
  row("requests failed", [](const Summary& s) { return pd::StrCat(s.failed); });
  row("duration (s)", [](const Summary& s) { return Fixed(s.duration_s, 2); });
  row("request throughput (req/s)",
      [](const Summary& s) { return Fixed(s.request_throughput, 3); });
  row("output throughput (tok/s)", [](const Summary& s) { return Fixed(s.output_throughput, 1); });
  row("total token throughput (tok/s)",
      [](const Summary& s) { return Fixed(s.total_token_throughput, 1); });
  row("prompt tokens: requested mean", [](const Summary& s) {
    return s.requests ? Fixed(s.requested_prompt_mean, 1) : std::string("-");
  });
  row("prompt tokens: server mean", [](const Summary& s) {
    return s.server_prompt_mean ? Fixed(*s.server_prompt_mean, 1) : std::string("-");
  });
  row("output tokens: requested mean", [](const Summary& s) {
    return s.requests ? Fixed(s.requested_output_mean, 1) : std::string("-");
  });
  row("output tokens: mean",
      [](const Summary& s) { return s.completed ? Fixed(s.output_mean, 1) : std::string("-"); });
  dist_rows("TTFT", &Summary::ttft_ms, {"mean", "p50", "p90", "p99"});
  dist_rows("TPOT", &Summary::tpot_ms, {"mean", "p50", "p90", "p99"});
  dist_rows("ITL", &Summary::itl_ms, {"mean", "p50", "p99", "max"});
  dist_rows("E2E", &Summary::e2e_ms, {"mean", "p50", "p99"});
  if (slo.any()) {
    std::string label = "goodput (req/s,";
    if (slo.ttft_ms) label += pd::StrCat(" TTFT<=", *slo.ttft_ms, "ms");
    if (slo.tpot_ms) label += pd::StrCat(" TPOT<=", *slo.tpot_ms, "ms");
    row(label + ")", [](const Summary& s) { return Fixed(s.goodput, 3); });
    row("requests meeting the SLOs (%)", [](const Summary& s) {
      return s.requests ? Fixed(100.0 * s.good / s.requests, 1) : std::string("-");
    });
  }
  if (report.overall.dispatch_lag_ms.n > 0 && report.overall.dispatch_lag_ms.max > 5) {
    row("client dispatch lag max (ms)",
        [](const Summary& s) { return Fixed(s.dispatch_lag_ms.max, 1); });
  }
  size_t label_width = 0, cell_width = 10;
  for (const auto& [label, cells] : rows) {
    label_width = std::max(label_width, label.size());
    for (const std::string& c : cells) cell_width = std::max(cell_width, c.size());
  }
  const std::string rule(std::max<size_t>(60, label_width + (cell_width + 2) * cols.size()), '=');
  std::string out = rule + "\n";
  for (const std::string& h : header) out += h + "\n";
  out += rule + "\n";
  for (const auto& [label, cells] : rows) {
    std::string line = label + std::string(label_width - label.size(), ' ');
    for (const std::string& c : cells) {
      line += std::string(cell_width + 2 - c.size(), ' ') + c;
    }
    out += line + "\n";
  }
  out += rule + "\n";
  for (size_t i = 0; i < cols.size(); ++i) {
    if (cols[i]->errors.empty()) continue;
    std::string line = pd::StrCat("errors (", names[i], "):");
    for (const auto& [key, n] : cols[i]->errors) line += pd::StrCat(" ", key, "=", n);
    out += line + "\n";
  }
  if (report.turns) out += FormatTurnTable(*report.turns) + rule + "\n";
  return out;
}

nlohmann::json SummaryToJson(const Summary& s) {
  nlohmann::json j;
  j["requests"] = s.requests;
  j["completed"] = s.completed;
  j["failed"] = s.failed;
  j["errors"] = nlohmann::json::object();
  for (const auto& [key, n] : s.errors) j["errors"][key] = n;
  j["duration_s"] = s.duration_s;
  j["request_throughput"] = s.request_throughput;
  j["output_throughput"] = s.output_throughput;
  j["total_token_throughput"] = s.total_token_throughput;
  j["output_tokens"] = s.output_tokens;
  j["prompt_tokens"] = s.prompt_tokens;
  j["prompt_tokens_requested_mean"] = s.requested_prompt_mean;
  j["prompt_tokens_server_mean"] =
      s.server_prompt_mean ? nlohmann::json(*s.server_prompt_mean) : nlohmann::json(nullptr);
  j["output_tokens_requested_mean"] = s.requested_output_mean;
  j["output_tokens_mean"] = s.output_mean;
  j["ttft_ms"] = DistToJson(s.ttft_ms);
  j["tpot_ms"] = DistToJson(s.tpot_ms);
  j["itl_ms"] = DistToJson(s.itl_ms);
  j["e2e_ms"] = DistToJson(s.e2e_ms);
  j["dispatch_lag_ms"] = DistToJson(s.dispatch_lag_ms);
  j["good_requests"] = s.good;
  j["goodput"] = s.goodput;
  return j;
}

nlohmann::json TurnReportToJson(const TurnReport& t) {
  const auto turn = [](const TurnSummary& s) {
    nlohmann::json j;
    if (s.turn > 0) j["turn"] = s.turn;
    j["requests"] = s.requests;
    j["completed"] = s.completed;
    j["failed"] = s.failed;
    j["ttft_ms"] = DistToJson(s.ttft_ms);
    j["e2e_ms"] = DistToJson(s.e2e_ms);
    j["prompt_tokens_mean"] = OrNull(s.prompt_tokens_mean);
    j["cached_tokens_mean"] = OrNull(s.cached_tokens_mean);
    // The sums behind the hit rate: none when no request reported both counts.
    j["prompt_tokens_sum"] =
        s.hit_rate_requests > 0 ? nlohmann::json(s.prompt_tokens_sum) : nullptr;
    j["cached_tokens_sum"] =
        s.hit_rate_requests > 0 ? nlohmann::json(s.cached_tokens_sum) : nullptr;
    j["cache_hit_rate"] = OrNull(s.cache_hit_rate);
    return j;
  };
  nlohmann::json j;
  j["cached_tokens_reported"] = t.cached_reported;
  j["cache_hit_rate"] = OrNull(t.all.cache_hit_rate);
  j["cache_hit_rate_turns_2plus"] = OrNull(t.later.cache_hit_rate);
  j["ttft_p50_ratio_turns_2plus_to_turn_1"] = OrNull(t.ttft_p50_ratio);
  j["per_turn"] = nlohmann::json::array();
  for (const TurnSummary& s : t.turns) j["per_turn"].push_back(turn(s));
  j["turns_2plus"] = turn(t.later);
  j["all"] = turn(t.all);
  return j;
}

nlohmann::json ToJson(const Report& report, const std::vector<WorkloadClass>& classes,
                      const Slo& slo, const nlohmann::json& config,
                      const std::vector<RequestRecord>* records) {
  nlohmann::json j;
  j["config"] = config;
  j["duration_s"] = report.overall.duration_s;
  j["slo"] = {{"ttft_ms", slo.ttft_ms ? nlohmann::json(*slo.ttft_ms) : nlohmann::json(nullptr)},
              {"tpot_ms", slo.tpot_ms ? nlohmann::json(*slo.tpot_ms) : nlohmann::json(nullptr)}};
  j["overall"] = SummaryToJson(report.overall);
  j["classes"] = nlohmann::json::object();
  for (size_t i = 0; i < classes.size(); ++i) {
    nlohmann::json c = SummaryToJson(report.classes[i]);
    nlohmann::json w;
    if (classes[i].rows.empty()) {
      w["prompt"] = classes[i].prompt.ToString();
      w["output"] = classes[i].output.ToString();
    } else {
      w["rows"] = classes[i].rows.size();
    }
    w["weight"] = classes[i].weight;
    if (classes[i].rate) w["rate"] = *classes[i].rate;
    if (classes[i].concurrency) w["concurrency"] = *classes[i].concurrency;
    c["workload"] = w;
    j["classes"][classes[i].name] = c;
  }
  if (report.turns) j["turns"] = TurnReportToJson(*report.turns);
  if (records != nullptr) {
    std::vector<const RequestRecord*> all;
    for (const RequestRecord& r : *records) all.push_back(&r);
    const bool cached_reported = ServerReportsCachedTokens(all);
    nlohmann::json list = nlohmann::json::array();
    for (const RequestRecord& r : *records) {
      if (r.warmup) continue;
      nlohmann::json q;
      q["id"] = r.id;
      q["class"] = classes[r.class_index].name;
      if (r.turn > 0) {
        q["conversation"] = r.conversation;
        q["turn"] = r.turn;
      }
      q["ok"] = r.ok;
      if (!r.ok) {
        q["error"] = r.error;
        q["error_message"] = r.error_message;
      }
      q["requested_prompt_tokens"] = r.requested_prompt_tokens;
      q["requested_output_tokens"] = r.requested_output_tokens;
      q["prompt_tokens"] = r.prompt_tokens ? nlohmann::json(*r.prompt_tokens) : nullptr;
      const std::optional<int> cached = EffectiveCachedTokens(r, cached_reported);
      q["cached_tokens"] = cached ? nlohmann::json(*cached) : nullptr;
      q["output_tokens"] = r.OutputTokens();
      q["finish_reason"] = r.finish_reason;
      q["scheduled_s"] = r.scheduled_s;
      q["send_s"] = r.send_s;
      q["ttft_s"] = r.ok ? nlohmann::json(r.Ttft()) : nullptr;
      q["e2e_s"] = r.e2e_s;
      const std::optional<double> tpot = r.Tpot();
      q["tpot_s"] = tpot ? nlohmann::json(*tpot) : nullptr;
      q["itl_s"] = r.itl_s;
      list.push_back(std::move(q));
    }
    j["requests"] = std::move(list);
  }
  return j;
}

}  // namespace pd::bench
