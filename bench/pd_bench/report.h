// pd-bench's results: per-class and overall summaries as a table (stdout) and as JSON (--json).
// Pure functions of their inputs.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "bench/pd_bench/runner.h"
#include "bench/pd_bench/stats.h"
#include "bench/pd_bench/workload.h"
#include "nlohmann/json.hpp"

namespace pd::bench {

struct Report {
  Summary overall;
  std::vector<Summary> classes;  // parallel to the workload's classes
  std::optional<TurnReport> turns;  // multi-turn mode: set when a record has a turn
};

Report BuildReport(const std::vector<WorkloadClass>& classes, const RunResult& result,
                   const Slo& slo);

// The table: one column for all requests and, with several classes, one per class. `header` lines
// (api, target, workload) are printed above it; the per-turn table (FormatTurnTable) below it.
std::string FormatTable(const Report& report, const std::vector<WorkloadClass>& classes,
                        const Slo& slo, const std::vector<std::string>& header);

// Multi-turn mode: one row per turn, then turns >= 2 and all turns pooled: requests, TTFT p50/p90,
// E2E p50, the server's prompt and cached token means, the cache hit rate, and the TTFT p50 over
// turn 1's; then the overall hit rates and TTFT ratio. Counts the server did not report are "n/a".
std::string FormatTurnTable(const TurnReport& turns);

// {"config": config, "duration_s", "slo", "overall": {...}, "classes": {name: {...}}}, in
// multi-turn mode "turns": {...}, and with `records`, "requests": [...] (measured requests only).
// The fields are listed in bench/pd_bench/README.md; statistics over no data, and counts the
// server did not report, are null.
nlohmann::json ToJson(const Report& report, const std::vector<WorkloadClass>& classes,
                      const Slo& slo, const nlohmann::json& config,
                      const std::vector<RequestRecord>* records);

nlohmann::json SummaryToJson(const Summary& s);
nlohmann::json TurnReportToJson(const TurnReport& t);

}  // namespace pd::bench
