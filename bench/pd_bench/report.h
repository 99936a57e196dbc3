// pd-bench's results: per-class and overall summaries as a table (stdout) and as JSON (--json).
// Pure functions of their inputs.
#pragma once

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
};

Report BuildReport(const std::vector<WorkloadClass>& classes, const RunResult& result,
                   const Slo& slo);

// The table: one column for all requests and, with several classes, one per class. `header` lines
// (api, target, workload) are printed above it.
std::string FormatTable(const Report& report, const std::vector<WorkloadClass>& classes,
                        const Slo& slo, const std::vector<std::string>& header);

// {"config": config, "duration_s", "slo", "overall": {...}, "classes": {name: {...}}} and, with
// `records`, "requests": [...] (measured requests only). The summary fields are listed in
// bench/pd_bench/README.md; statistics over no data are null.
nlohmann::json ToJson(const Report& report, const std::vector<WorkloadClass>& classes,
                      const Slo& slo, const nlohmann::json& config,
                      const std::vector<RequestRecord>* records);

nlohmann::json SummaryToJson(const Summary& s);

}  // namespace pd::bench
