// Percentiles on known data, per-request metrics, summaries and goodput.
#include "bench/pd_bench/stats.h"

#include "gtest/gtest.h"

namespace pd::bench {
namespace {

TEST(PercentileTest, LinearInterpolationLikeNumpy) {
  const std::vector<double> one_to_ten = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  EXPECT_DOUBLE_EQ(Percentile(one_to_ten, 0), 1);
  EXPECT_DOUBLE_EQ(Percentile(one_to_ten, 50), 5.5);
  EXPECT_DOUBLE_EQ(Percentile(one_to_ten, 90), 9.1);
  EXPECT_DOUBLE_EQ(Percentile(one_to_ten, 99), 9.91);
  EXPECT_DOUBLE_EQ(Percentile(one_to_ten, 100), 10);
  // numpy.percentile([15, 20, 35, 40, 50], [40, 50, 99]) == [29, 35, 49.6]
  const std::vector<double> v = {15, 20, 35, 40, 50};
  EXPECT_DOUBLE_EQ(Percentile(v, 40), 29);
  EXPECT_DOUBLE_EQ(Percentile(v, 50), 35);
  EXPECT_NEAR(Percentile(v, 99), 49.6, 1e-12);
  EXPECT_DOUBLE_EQ(Percentile({7}, 99), 7);
}

TEST(PercentileTest, DescribeSortsAndSummarises) {
  std::vector<double> values;
  for (int i = 100; i >= 1; --i) values.push_back(i);  // 100..1, unsorted on purpose
  const DistStats d = Describe(values);
  EXPECT_EQ(d.n, 100u);
  EXPECT_DOUBLE_EQ(d.mean, 50.5);
  EXPECT_DOUBLE_EQ(d.p50, 50.5);
  EXPECT_DOUBLE_EQ(d.p90, 90.1);
  EXPECT_DOUBLE_EQ(d.p99, 99.01);
  EXPECT_DOUBLE_EQ(d.max, 100);
  EXPECT_EQ(Describe({}).n, 0u);
}

RequestRecord Ok(double ttft, double e2e, int tokens) {
  RequestRecord r;
  r.ok = true;
  r.ttft_s = ttft;
  r.e2e_s = e2e;
  r.completion_tokens = tokens;
  r.requested_prompt_tokens = 100;
  r.requested_output_tokens = tokens;
  return r;
}

TEST(RequestRecordTest, TpotExcludesTheFirstToken) {
  // 11 tokens: the first at 0.2 s, the other 10 over the next 0.5 s.
  EXPECT_DOUBLE_EQ(*Ok(0.2, 0.7, 11).Tpot(), 0.05);
  EXPECT_FALSE(Ok(0.2, 0.2, 1).Tpot().has_value());
  RequestRecord streamed = Ok(0.1, 0.4, 0);
  streamed.completion_tokens.reset();
  streamed.stream_tokens = 4;  // no usage: count from the stream
  EXPECT_EQ(streamed.OutputTokens(), 4);
  EXPECT_DOUBLE_EQ(*streamed.Tpot(), 0.1);
  RequestRecord no_content = Ok(-1, 0.3, 0);
  EXPECT_DOUBLE_EQ(no_content.Ttft(), 0.3);
}

TEST(GoodputTest, BothObjectivesMustHold) {
  Slo slo;
  slo.ttft_ms = 100;
  slo.tpot_ms = 20;
  EXPECT_TRUE(MeetsSlo(Ok(0.09, 0.09 + 10 * 0.019, 11), slo));
  EXPECT_FALSE(MeetsSlo(Ok(0.11, 0.11 + 10 * 0.01, 11), slo));   // TTFT too slow
  EXPECT_FALSE(MeetsSlo(Ok(0.05, 0.05 + 10 * 0.021, 11), slo));  // TPOT too slow
  EXPECT_TRUE(MeetsSlo(Ok(0.05, 0.05, 1), slo));                 // no TPOT with one token
  RequestRecord failed = Ok(0.01, 0.02, 3);
  failed.ok = false;
  EXPECT_FALSE(MeetsSlo(failed, slo));
  EXPECT_TRUE(MeetsSlo(Ok(5, 50, 100), Slo()));  // no objective: every success counts
}

TEST(SummaryTest, CountsThroughputsAndGoodput) {
  std::vector<RequestRecord> records = {
      Ok(0.05, 0.05 + 9 * 0.010, 10),   // good
      Ok(0.08, 0.08 + 9 * 0.030, 10),   // TPOT 30 ms: bad
      Ok(0.20, 0.20 + 9 * 0.010, 10),   // TTFT 200 ms: bad
      Ok(0.01, 0.01 + 19 * 0.005, 20),  // good
  };
  records[0].prompt_tokens = 101;
  records[1].prompt_tokens = 103;
  records[0].itl_s = {0.01, 0.02};
  RequestRecord failed;
  failed.ok = false;
  failed.error = "UNAVAILABLE";
  failed.requested_prompt_tokens = 100;
  failed.requested_output_tokens = 10;
  records.push_back(failed);
  failed.error = "http_503";
  records.push_back(failed);
  records.push_back(failed);
  RequestRecord warm = Ok(9, 9, 10);
  warm.warmup = true;
  records.push_back(warm);

  std::vector<const RequestRecord*> ptrs;
  for (const RequestRecord& r : records) ptrs.push_back(&r);
  Slo slo;
  slo.ttft_ms = 100;
  slo.tpot_ms = 20;
  const Summary s = Summarize(ptrs, 2.0, slo);
  EXPECT_EQ(s.requests, 7);
  EXPECT_EQ(s.completed, 4);
  EXPECT_EQ(s.failed, 3);
  EXPECT_EQ(s.errors.at("UNAVAILABLE"), 1);
  EXPECT_EQ(s.errors.at("http_503"), 2);
  EXPECT_EQ(s.output_tokens, 50);
  EXPECT_EQ(s.prompt_tokens, 101 + 103 + 100 + 100);  // server's counts where reported
  EXPECT_DOUBLE_EQ(s.request_throughput, 2.0);
  EXPECT_DOUBLE_EQ(s.output_throughput, 25.0);
  EXPECT_DOUBLE_EQ(s.total_token_throughput, (404 + 50) / 2.0);
  EXPECT_DOUBLE_EQ(*s.server_prompt_mean, 102);
  EXPECT_DOUBLE_EQ(s.requested_prompt_mean, 100);
  EXPECT_DOUBLE_EQ(s.output_mean, 12.5);
  EXPECT_EQ(s.good, 2);
  EXPECT_DOUBLE_EQ(s.goodput, 1.0);
  EXPECT_EQ(s.ttft_ms.n, 4u);
  EXPECT_DOUBLE_EQ(s.ttft_ms.mean, (50 + 80 + 200 + 10) / 4.0);
  EXPECT_NEAR(s.tpot_ms.p50, 10, 1e-9);
  EXPECT_NEAR(s.tpot_ms.max, 30, 1e-9);
  EXPECT_EQ(s.itl_ms.n, 2u);
  EXPECT_DOUBLE_EQ(s.itl_ms.max, 20);
  EXPECT_LE(s.ttft_ms.p50, s.ttft_ms.p99);
}

}  // namespace
}  // namespace pd::bench
