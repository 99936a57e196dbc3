#include "frontend/serving_metrics.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "common/metrics.h"
#include "common/strings.h"

namespace pd::frontend {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

TEST(ServingMetricsTest, RegistersEveryDocumentedMetric) {
  MetricsRegistry registry;
  ServingMetrics metrics(registry);
  const std::string text = registry.Render();
  for (const char* histogram :
       {"pdserve_time_to_first_token_seconds", "pdserve_time_per_output_token_seconds",
        "pdserve_e2e_request_latency_seconds", "pdserve_queue_time_seconds",
        "pdserve_prefill_step_seconds", "pdserve_decode_step_seconds"}) {
    EXPECT_THAT(text, HasSubstr(pd::StrCat("# TYPE ", histogram, " histogram\n")));
    EXPECT_THAT(text, HasSubstr(pd::StrCat(histogram, "_bucket{le=\"0.001\"} 0\n")));
    EXPECT_THAT(text, HasSubstr(pd::StrCat(histogram, "_bucket{le=\"60\"} 0\n")));
    EXPECT_THAT(text, HasSubstr(pd::StrCat(histogram, "_count 0\n")));
  }
  for (const char* gauge : {"pdserve_running_sequences", "pdserve_waiting_sequences",
                            "pdserve_kv_blocks_used", "pdserve_kv_blocks_free"}) {
    EXPECT_THAT(text, HasSubstr(pd::StrCat("# TYPE ", gauge, " gauge\n", gauge, " 0\n")));
  }
  for (const char* counter : {"pdserve_prompt_tokens_total", "pdserve_generation_tokens_total",
                              "pdserve_requests_accepted_total"}) {
    EXPECT_THAT(text, HasSubstr(pd::StrCat("# TYPE ", counter, " counter\n", counter, " 0\n")));
  }
  EXPECT_THAT(text, HasSubstr("pdserve_requests_total{finish_reason=\"stop\"} 0\n"));
  EXPECT_THAT(text, HasSubstr("pdserve_requests_total{finish_reason=\"length\"} 0\n"));
  EXPECT_THAT(text, HasSubstr("# TYPE pdserve_errors_total counter\n"));
}

TEST(ServingMetricsTest, RequestLifecycle) {
  MetricsRegistry registry;
  ServingMetrics metrics(registry);
  metrics.RequestStarted();
  metrics.TokenInterval(0.04);
  metrics.TokenInterval(0.06);
  engine::RequestTiming t;
  t.arrival = absl::FromUnixSeconds(1000);
  t.first_scheduled = t.arrival + absl::Milliseconds(3);
  t.first_token = t.arrival + absl::Milliseconds(200);
  t.finished = t.arrival + absl::Seconds(3);
  metrics.RequestFinished("length", 17, 5, 16, t);
  const std::string text = registry.Render();
  EXPECT_THAT(text, HasSubstr("pdserve_requests_accepted_total 1\n"));
  EXPECT_THAT(text, HasSubstr("pdserve_requests_total{finish_reason=\"length\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("pdserve_prompt_tokens_total 17\n"));
  EXPECT_THAT(text, HasSubstr("pdserve_generation_tokens_total 5\n"));
  // TTFT 0.2 s: not in le=0.1, in le=0.25.
  EXPECT_THAT(text, HasSubstr("pdserve_time_to_first_token_seconds_bucket{le=\"0.1\"} 0\n"));
  EXPECT_THAT(text, HasSubstr("pdserve_time_to_first_token_seconds_bucket{le=\"0.25\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("pdserve_time_to_first_token_seconds_sum 0.2\n"));
  EXPECT_THAT(text, HasSubstr("pdserve_queue_time_seconds_bucket{le=\"0.0025\"} 0\n"));
  EXPECT_THAT(text, HasSubstr("pdserve_queue_time_seconds_bucket{le=\"0.005\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("pdserve_e2e_request_latency_seconds_bucket{le=\"2.5\"} 0\n"));
  EXPECT_THAT(text, HasSubstr("pdserve_e2e_request_latency_seconds_bucket{le=\"5\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("pdserve_time_per_output_token_seconds_bucket{le=\"0.05\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("pdserve_time_per_output_token_seconds_bucket{le=\"0.075\"} 2\n"));
  EXPECT_THAT(text, HasSubstr("pdserve_time_per_output_token_seconds_count 2\n"));
}

TEST(ServingMetricsTest, PhasesNeverReachedAreNotObserved) {
  MetricsRegistry registry;
  ServingMetrics metrics(registry);
  engine::RequestTiming t;
  t.arrival = absl::FromUnixSeconds(1000);
  t.first_scheduled = absl::InfinitePast();  // never scheduled
  t.first_token = absl::UnixEpoch();         // left at absl::Time's default: also never
  t.finished = t.arrival + absl::Milliseconds(1500);
  metrics.RequestFinished("cancelled", 9, 0, 0, t);
  const std::string text = registry.Render();
  EXPECT_THAT(text, HasSubstr("pdserve_requests_total{finish_reason=\"cancelled\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("pdserve_time_to_first_token_seconds_count 0\n"));
  EXPECT_THAT(text, HasSubstr("pdserve_queue_time_seconds_count 0\n"));
  EXPECT_THAT(text, HasSubstr("pdserve_e2e_request_latency_seconds_count 1\n"));
  EXPECT_THAT(text, HasSubstr("pdserve_generation_tokens_total 0\n"));
}

TEST(ServingMetricsTest, ErrorsStepsAndLoad) {
  MetricsRegistry registry;
  ServingMetrics metrics(registry);
  metrics.Error(absl::StatusCode::kInvalidArgument);
  metrics.Error(absl::StatusCode::kInvalidArgument);
  metrics.Error(absl::StatusCode::kResourceExhausted);
  metrics.Step({.prefill_tokens = 64, .decode_tokens = 0, .seconds = 0.12});
  metrics.Step({.prefill_tokens = 0, .decode_tokens = 3, .seconds = 0.015});
  metrics.Step({.prefill_tokens = 16, .decode_tokens = 2, .seconds = 0.04});  // mixed: both
  metrics.Step({.prefill_tokens = 0, .decode_tokens = 0, .seconds = 1});      // idle: neither
  engine::EngineLoad load;
  load.running = 3;
  load.waiting = 2;
  load.kv_blocks_total = 100;
  load.kv_blocks_free = 60;
  metrics.Load(load);
  const std::string text = registry.Render();
  EXPECT_THAT(text, HasSubstr("pdserve_errors_total{code=\"INVALID_ARGUMENT\"} 2\n"));
  EXPECT_THAT(text, HasSubstr("pdserve_errors_total{code=\"RESOURCE_EXHAUSTED\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("pdserve_prefill_step_seconds_count 2\n"));
  EXPECT_THAT(text, HasSubstr("pdserve_prefill_step_seconds_sum 0.16\n"));
  EXPECT_THAT(text, HasSubstr("pdserve_decode_step_seconds_count 2\n"));
  EXPECT_THAT(text, HasSubstr("pdserve_decode_step_seconds_bucket{le=\"0.02\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("pdserve_running_sequences 3\n"));
  EXPECT_THAT(text, HasSubstr("pdserve_waiting_sequences 2\n"));
  EXPECT_THAT(text, HasSubstr("pdserve_kv_blocks_used 40\n"));
  EXPECT_THAT(text, HasSubstr("pdserve_kv_blocks_free 60\n"));
  EXPECT_THAT(text, Not(HasSubstr("NaN")));
  // No captured steps (a CPU engine): the family, and no samples.
  EXPECT_THAT(text, HasSubstr("# TYPE pdserve_cuda_graph_steps_total counter\n"));
  EXPECT_THAT(text, Not(HasSubstr("pdserve_cuda_graph_steps_total{")));
}

// The engine reports its captured steps as totals since it started; the counter takes each
// report's increase, and a report that repeats (or, after a restart, goes back) adds nothing.
TEST(ServingMetricsTest, CapturedStepsCountTheIncreaseOfTheEnginesTotals) {
  MetricsRegistry registry;
  ServingMetrics metrics(registry);
  engine::EngineLoad load;
  load.graph_steps = 10;
  load.graph_abandoned = 1;
  metrics.Load(load);
  metrics.Load(load);
  load.graph_steps = 25;
  metrics.Load(load);
  const std::string text = registry.Render();
  EXPECT_THAT(text, HasSubstr("pdserve_cuda_graph_steps_total{result=\"launched\"} 25\n"));
  EXPECT_THAT(text, HasSubstr("pdserve_cuda_graph_steps_total{result=\"abandoned\"} 1\n"));
}

}  // namespace
}  // namespace pd::frontend
