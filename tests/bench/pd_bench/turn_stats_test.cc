// Multi-turn statistics: per-turn aggregation, the cache hit rate, the TTFT ratio, and counts the
// server did not report shown as n/a (never as a measured 0), in the table and the JSON.
#include <algorithm>

#include "bench/pd_bench/report.h"
#include "bench/pd_bench/stats.h"
#include "gtest/gtest.h"

namespace pd::bench {
namespace {

RequestRecord Turn(int turn, double ttft_s, std::optional<int> prompt, std::optional<int> cached) {
  RequestRecord r;
  r.ok = true;
  r.turn = turn;
  r.conversation = 0;
  r.ttft_s = ttft_s;
  r.e2e_s = ttft_s + 0.1;
  r.completion_tokens = 4;
  r.prompt_tokens = prompt;
  r.cached_tokens = cached;
  return r;
}

std::vector<const RequestRecord*> Ptrs(const std::vector<RequestRecord>& v) {
  std::vector<const RequestRecord*> p;
  for (const RequestRecord& r : v) p.push_back(&r);
  return p;
}

TEST(TurnStatsTest, PerTurnAggregatesAndHitRates) {
  std::vector<RequestRecord> records = {
      Turn(1, 0.100, 300, 0),   Turn(1, 0.200, 310, 0),   Turn(1, 0.300, 320, 256),
      Turn(2, 0.050, 400, 300), Turn(2, 0.070, 420, 320), Turn(3, 0.060, 500, 400),
  };
  RequestRecord failed = Turn(3, 0.9, 999, 999);
  failed.ok = false;
  failed.error = "UNAVAILABLE";
  records.push_back(failed);
  RequestRecord warm = Turn(1, 5.0, 1000, 1000);
  warm.warmup = true;
  records.push_back(warm);
  RequestRecord single = Turn(0, 5.0, 1000, 1000);  // not part of a conversation
  records.push_back(single);

  const TurnReport t = SummarizeTurns(Ptrs(records));
  EXPECT_TRUE(t.cached_reported);
  ASSERT_EQ(t.turns.size(), 3u);
  EXPECT_EQ(t.turns[0].turn, 1);
  EXPECT_EQ(t.turns[0].requests, 3);
  EXPECT_EQ(t.turns[0].completed, 3);
  EXPECT_DOUBLE_EQ(t.turns[0].ttft_ms.p50, 200);
  EXPECT_DOUBLE_EQ(t.turns[0].ttft_ms.p90, 280);
  EXPECT_DOUBLE_EQ(*t.turns[0].prompt_tokens_mean, 310);
  EXPECT_DOUBLE_EQ(*t.turns[0].cached_tokens_mean, 256.0 / 3);
  EXPECT_DOUBLE_EQ(*t.turns[0].cache_hit_rate, 256.0 / 930);
  EXPECT_DOUBLE_EQ(*t.turns[1].cache_hit_rate, 620.0 / 820);
  EXPECT_DOUBLE_EQ(t.turns[1].ttft_ms.p50, 60);
  // The failed turn 3 counts as a request, not in any statistic.
  EXPECT_EQ(t.turns[2].requests, 2);
  EXPECT_EQ(t.turns[2].failed, 1);
  EXPECT_EQ(t.turns[2].ttft_ms.n, 1u);
  EXPECT_DOUBLE_EQ(*t.turns[2].cache_hit_rate, 0.8);

  EXPECT_EQ(t.all.requests, 7);
  EXPECT_EQ(t.all.hit_rate_requests, 6);
  EXPECT_EQ(t.all.prompt_tokens_sum, 300 + 310 + 320 + 400 + 420 + 500);
  EXPECT_EQ(t.all.cached_tokens_sum, 256 + 300 + 320 + 400);
  EXPECT_DOUBLE_EQ(*t.all.cache_hit_rate, 1276.0 / 2250);
  EXPECT_EQ(t.later.requests, 4);
  EXPECT_DOUBLE_EQ(*t.later.cache_hit_rate, 1020.0 / 1320);
  // Turns >= 2 pooled: 50, 60, 70 ms -> p50 60 ms, over turn 1's 200 ms.
  EXPECT_DOUBLE_EQ(t.later.ttft_ms.p50, 60);
  EXPECT_DOUBLE_EQ(*t.ttft_p50_ratio, 0.3);
}

TEST(TurnStatsTest, HitRateOnlyOverRequestsReportingBothCounts) {
  // An HTTP server that reports cached tokens on some responses only.
  const std::vector<RequestRecord> records = {
      Turn(1, 0.1, 100, 50),
      Turn(1, 0.1, 900, std::nullopt),
      Turn(2, 0.1, std::nullopt, 70),
  };
  const TurnReport t = SummarizeTurns(Ptrs(records));
  EXPECT_DOUBLE_EQ(*t.turns[0].cache_hit_rate, 0.5);
  EXPECT_DOUBLE_EQ(*t.turns[0].prompt_tokens_mean, 500);
  EXPECT_DOUBLE_EQ(*t.turns[0].cached_tokens_mean, 50);
  EXPECT_FALSE(t.turns[1].cache_hit_rate.has_value());
  EXPECT_FALSE(t.turns[1].prompt_tokens_mean.has_value());
  EXPECT_DOUBLE_EQ(*t.turns[1].cached_tokens_mean, 70);
  EXPECT_EQ(t.turns[1].hit_rate_requests, 0);
  EXPECT_FALSE(t.later.cache_hit_rate.has_value());
  EXPECT_DOUBLE_EQ(*t.all.cache_hit_rate, 0.5);
}

TEST(TurnStatsTest, UnreportedCachedTokensAreNotZero) {
  // HTTP without usage.prompt_tokens_details: no count at all.
  std::vector<RequestRecord> http = {Turn(1, 0.2, 300, std::nullopt),
                                     Turn(2, 0.1, 400, std::nullopt)};
  TurnReport t = SummarizeTurns(Ptrs(http));
  EXPECT_FALSE(t.cached_reported);
  EXPECT_FALSE(t.turns[0].cached_tokens_mean.has_value());
  EXPECT_FALSE(t.all.cache_hit_rate.has_value());
  EXPECT_FALSE(t.later.cache_hit_rate.has_value());
  EXPECT_DOUBLE_EQ(*t.ttft_p50_ratio, 0.5);

  // gRPC: Usage.cached_tokens has no presence. Zeros throughout: not reported.
  std::vector<RequestRecord> grpc = {Turn(1, 0.2, 300, 0), Turn(2, 0.1, 400, 0)};
  for (RequestRecord& r : grpc) r.cached_tokens_implicit = true;
  t = SummarizeTurns(Ptrs(grpc));
  EXPECT_FALSE(t.cached_reported);
  EXPECT_FALSE(t.turns[0].cached_tokens_mean.has_value());
  EXPECT_FALSE(t.all.cache_hit_rate.has_value());
  EXPECT_FALSE(EffectiveCachedTokens(grpc[0], false).has_value());

  // ... but once some response has a positive count, the server evidently reports it: its zeros
  // are measured.
  grpc[1].cached_tokens = 256;
  t = SummarizeTurns(Ptrs(grpc));
  EXPECT_TRUE(t.cached_reported);
  EXPECT_DOUBLE_EQ(*t.turns[0].cached_tokens_mean, 0);
  EXPECT_DOUBLE_EQ(*t.turns[0].cache_hit_rate, 0);
  EXPECT_DOUBLE_EQ(*t.later.cache_hit_rate, 256.0 / 400);
  EXPECT_EQ(*EffectiveCachedTokens(grpc[0], true), 0);

  // An explicit (HTTP) 0 is a measured 0.
  std::vector<RequestRecord> explicit_zero = {Turn(1, 0.2, 300, 0)};
  t = SummarizeTurns(Ptrs(explicit_zero));
  EXPECT_TRUE(t.cached_reported);
  EXPECT_DOUBLE_EQ(*t.all.cache_hit_rate, 0);
}

TEST(TurnStatsTest, NoRatioWithoutBothSides) {
  const std::vector<RequestRecord> only_first = {Turn(1, 0.2, 300, 0)};
  EXPECT_FALSE(SummarizeTurns(Ptrs(only_first)).ttft_p50_ratio.has_value());
  EXPECT_TRUE(SummarizeTurns({}).turns.empty());
}

RunResult Result(std::vector<RequestRecord> records) {
  RunResult r;
  r.records = std::move(records);
  r.duration_s = 1;
  return r;
}

std::vector<WorkloadClass> OneClass() {
  WorkloadClass c;
  c.name = "chat";
  return {c};
}

TEST(TurnReportTest, TableAndJsonShowNaWhenNotReported) {
  const RunResult result =
      Result({Turn(1, 0.2, 300, std::nullopt), Turn(2, 0.1, 400, std::nullopt)});
  const Report report = BuildReport(OneClass(), result, Slo());
  ASSERT_TRUE(report.turns.has_value());
  const std::string table = FormatTable(report, OneClass(), Slo(), {"header"});
  EXPECT_NE(table.find("per turn ("), std::string::npos) << table;
  EXPECT_NE(table.find("cache hit rate (cached / prompt tokens): all turns n/a, turns >= 2 n/a"),
            std::string::npos)
      << table;
  EXPECT_NE(table.find("cached tokens n/a"), std::string::npos) << table;
  EXPECT_NE(table.find("TTFT p50 of turns >= 2 / TTFT p50 of turn 1: 0.500"), std::string::npos)
      << table;
  EXPECT_EQ(table.find("0.0%"), std::string::npos) << table;

  const nlohmann::json j =
      ToJson(report, OneClass(), Slo(), nlohmann::json::object(), &result.records);
  EXPECT_FALSE(j["turns"]["cached_tokens_reported"].get<bool>());
  EXPECT_TRUE(j["turns"]["cache_hit_rate"].is_null());
  EXPECT_TRUE(j["turns"]["cache_hit_rate_turns_2plus"].is_null());
  EXPECT_DOUBLE_EQ(j["turns"]["ttft_p50_ratio_turns_2plus_to_turn_1"].get<double>(), 0.5);
  ASSERT_EQ(j["turns"]["per_turn"].size(), 2u);
  EXPECT_EQ(j["turns"]["per_turn"][1]["turn"], 2);
  EXPECT_TRUE(j["turns"]["per_turn"][0]["cached_tokens_mean"].is_null());
  EXPECT_TRUE(j["turns"]["all"]["cached_tokens_sum"].is_null());
  EXPECT_TRUE(j["turns"]["all"]["prompt_tokens_sum"].is_null());
  EXPECT_DOUBLE_EQ(j["turns"]["per_turn"][1]["prompt_tokens_mean"].get<double>(), 400);
  EXPECT_TRUE(j["requests"][0]["cached_tokens"].is_null());
  EXPECT_EQ(j["requests"][1]["turn"], 2);
}

TEST(TurnReportTest, TableAndJsonWithReportedCounts) {
  const RunResult result = Result({Turn(1, 0.2, 300, 0), Turn(2, 0.1, 400, 300)});
  const Report report = BuildReport(OneClass(), result, Slo());
  const std::string table = FormatTable(report, OneClass(), Slo(), {});
  EXPECT_NE(table.find("all turns 42.9%, turns >= 2 75.0%"), std::string::npos) << table;
  EXPECT_EQ(table.find("cached tokens n/a"), std::string::npos) << table;
  const nlohmann::json j =
      ToJson(report, OneClass(), Slo(), nlohmann::json::object(), &result.records);
  EXPECT_DOUBLE_EQ(j["turns"]["cache_hit_rate"].get<double>(), 300.0 / 700);
  EXPECT_DOUBLE_EQ(j["turns"]["turns_2plus"]["cached_tokens_mean"].get<double>(), 300);
  EXPECT_EQ(j["turns"]["all"]["prompt_tokens_sum"], 700);
  EXPECT_EQ(j["turns"]["all"]["cached_tokens_sum"], 300);
  EXPECT_EQ(j["requests"][0]["cached_tokens"], 0);

  // Single-turn runs have no turn table.
  const Report plain = BuildReport(OneClass(), Result({Turn(0, 0.2, 300, 0)}), Slo());
  EXPECT_FALSE(plain.turns.has_value());
  EXPECT_EQ(FormatTable(plain, OneClass(), Slo(), {}).find("per turn"), std::string::npos);
}

}  // namespace
}  // namespace pd::bench
