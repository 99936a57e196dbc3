// Length distributions, --mix and --dist parsing, class picking.
#include "bench/pd_bench/workload.h"

#include <cmath>
#include <map>

#include "common/status_matchers.h"
#include "gtest/gtest.h"

namespace pd::bench {
namespace {

TEST(LengthDistTest, ParsesTheThreeForms) {
  absl::StatusOr<LengthDist> fixed = LengthDist::Parse("64");
  ASSERT_TRUE(fixed.ok());
  EXPECT_EQ(fixed->ToString(), "64");
  EXPECT_DOUBLE_EQ(fixed->Mean(), 64);
  absl::StatusOr<LengthDist> uni = LengthDist::Parse(" uniform:32:96 ");
  ASSERT_TRUE(uni.ok());
  EXPECT_EQ(uni->ToString(), "uniform:32:96");
  EXPECT_DOUBLE_EQ(uni->Mean(), 64);
  absl::StatusOr<LengthDist> normal = LengthDist::Parse("normal:200:50.5");
  ASSERT_TRUE(normal.ok());
  EXPECT_EQ(normal->ToString(), "normal:200:50.5");
  EXPECT_DOUBLE_EQ(normal->Mean(), 200);
}

TEST(LengthDistTest, RejectsMalformedSpecs) {
  for (const char* spec : {"", "0", "-5", "abc", "12x", "uniform:5", "uniform:9:3", "uniform:0:4",
                           "normal:0:1", "normal:10:-1", "poisson:3:4", "uniform:1:2:3"}) {
    EXPECT_EQ(LengthDist::Parse(spec).status().code(), absl::StatusCode::kInvalidArgument) << spec;
  }
}

TEST(LengthDistTest, SamplesStayInRangeAndMatchTheMean) {
  std::mt19937_64 rng(7);
  const LengthDist uni = *LengthDist::Parse("uniform:10:20");
  std::map<int, int> seen;
  double sum = 0;
  for (int i = 0; i < 20000; ++i) {
    const int v = uni.Sample(rng);
    ASSERT_GE(v, 10);
    ASSERT_LE(v, 20);
    ++seen[v];
    sum += v;
  }
  EXPECT_EQ(seen.size(), 11u);  // both bounds are reachable
  EXPECT_NEAR(sum / 20000, 15, 0.1);

  const LengthDist normal = *LengthDist::Parse("normal:100:10");
  sum = 0;
  double sq = 0;
  for (int i = 0; i < 20000; ++i) {
    const int v = normal.Sample(rng);
    sum += v;
    sq += static_cast<double>(v) * v;
  }
  const double mean = sum / 20000;
  EXPECT_NEAR(mean, 100, 0.5);
  EXPECT_NEAR(std::sqrt(sq / 20000 - mean * mean), 10, 0.5);

  // A wide normal is clamped at 1, never below.
  const LengthDist wide = *LengthDist::Parse("normal:2:50");
  for (int i = 0; i < 1000; ++i) ASSERT_GE(wide.Sample(rng), 1);
}

TEST(DistFileTest, CsvWithHeaderCommentsAndClasses) {
  absl::StatusOr<std::vector<DistRow>> rows = ParseDistCsv(
      "prompt_len,output_len,class\n"
      "# a comment\n"
      "64,128,short\r\n"
      "\n"
      " 2048 , 16 , long \n"
      "100,5\n");
  ASSERT_TRUE(rows.ok()) << rows.status();
  ASSERT_EQ(rows->size(), 3u);
  EXPECT_EQ((*rows)[0].lengths.prompt_tokens, 64);
  EXPECT_EQ((*rows)[0].lengths.output_tokens, 128);
  EXPECT_EQ((*rows)[0].cls, "short");
  EXPECT_EQ((*rows)[1].lengths.prompt_tokens, 2048);
  EXPECT_EQ((*rows)[1].cls, "long");
  EXPECT_EQ((*rows)[2].cls, "");
}

TEST(DistFileTest, CsvErrorsNameTheLine) {
  absl::StatusOr<std::vector<DistRow>> bad = ParseDistCsv("1,2\n3,x\n");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(bad.status().message()).find("line 2"), std::string::npos) << bad.status();
  EXPECT_FALSE(ParseDistCsv("1,2,3,4\n").ok());
  EXPECT_FALSE(ParseDistCsv("1,0\n").ok());
  EXPECT_FALSE(ParseDistCsv("# only a comment\n").ok());
  // Only the first content line may be a header.
  EXPECT_FALSE(ParseDistCsv("1,2\nprompt,output\n").ok());
}

TEST(DistFileTest, JsonPairsAndObjects) {
  absl::StatusOr<std::vector<DistRow>> rows = ParseDistJson(
      R"([[10, 20], {"prompt_len": 2048, "output_len": 16, "class": "long"},
          {"prompt_len": 5, "output_len": 6}])");
  ASSERT_TRUE(rows.ok()) << rows.status();
  ASSERT_EQ(rows->size(), 3u);
  EXPECT_EQ((*rows)[0].lengths.prompt_tokens, 10);
  EXPECT_EQ((*rows)[0].lengths.output_tokens, 20);
  EXPECT_EQ((*rows)[1].cls, "long");
  EXPECT_EQ((*rows)[2].lengths.output_tokens, 6);
  EXPECT_EQ((*rows)[2].cls, "");
}

TEST(DistFileTest, JsonErrors) {
  for (const char* text : {"", "{}", "[", "[[1]]", "[[1, 2.5]]", "[[0, 3]]", "[\"x\"]",
                           R"([{"prompt_len": 3}])", R"([{"prompt_len": 3, "output_len": 4,
                           "class": 7}])",
                           "[]"}) {
    EXPECT_EQ(ParseDistJson(text).status().code(), absl::StatusCode::kInvalidArgument) << text;
  }
}

TEST(DistFileTest, ClassesFromRowsAreWeightedByRowCount) {
  std::vector<DistRow> rows = {
      {{64, 128}, "short"}, {{2048, 16}, "long"}, {{32, 64}, "short"}, {{48, 100}, "short"}};
  absl::StatusOr<std::vector<WorkloadClass>> classes = ClassesFromDist(rows);
  ASSERT_TRUE(classes.ok());
  ASSERT_EQ(classes->size(), 2u);
  EXPECT_EQ((*classes)[0].name, "short");
  EXPECT_DOUBLE_EQ((*classes)[0].weight, 3);
  EXPECT_EQ((*classes)[0].rows.size(), 3u);
  EXPECT_DOUBLE_EQ((*classes)[0].MeanPrompt(), (64 + 32 + 48) / 3.0);
  EXPECT_EQ((*classes)[1].name, "long");
  EXPECT_DOUBLE_EQ((*classes)[1].weight, 1);
  std::mt19937_64 rng(1);
  for (int i = 0; i < 100; ++i) {
    const LengthPair p = (*classes)[0].Draw(rng);
    EXPECT_TRUE(p.prompt_tokens == 64 || p.prompt_tokens == 32 || p.prompt_tokens == 48);
  }
  std::vector<DistRow> unnamed = {{{1, 2}, ""}};
  EXPECT_EQ((*ClassesFromDist(unnamed))[0].name, "dist");
  EXPECT_FALSE(ClassesFromDist({}).ok());
}

TEST(MixTest, ParsesClassesWithTheirKeys) {
  absl::StatusOr<std::vector<WorkloadClass>> mix = ParseMix(
      "short:prompt=64,output=uniform:100:150,weight=0.9; long:prompt=2048,output=16,weight=0.1;"
      "decode:prompt=32,output=512,concurrency=8;burst:prompt=normal:1000:100,rate=0.5");
  ASSERT_TRUE(mix.ok()) << mix.status();
  ASSERT_EQ(mix->size(), 4u);
  const WorkloadClass& s = (*mix)[0];
  EXPECT_EQ(s.name, "short");
  EXPECT_EQ(s.prompt.ToString(), "64");
  EXPECT_EQ(s.output.ToString(), "uniform:100:150");
  EXPECT_DOUBLE_EQ(s.weight, 0.9);
  EXPECT_TRUE(s.shared());
  EXPECT_EQ((*mix)[1].prompt.ToString(), "2048");
  EXPECT_EQ((*mix)[2].concurrency, 8);
  EXPECT_FALSE((*mix)[2].shared());
  EXPECT_EQ((*mix)[3].rate, 0.5);
  EXPECT_EQ((*mix)[3].output.ToString(), "128");  // default
}

TEST(MixTest, RejectsBadSpecs) {
  for (const char* spec :
       {"", ";", ":prompt=3", "a:prompt", "a:prompt=0", "a:weight=0", "a:weight=-1", "a:rate=0",
        "a:concurrency=0", "a:rate=1,concurrency=2", "a:colour=red", "a:prompt=1;a:prompt=2"}) {
    EXPECT_EQ(ParseMix(spec).status().code(), absl::StatusCode::kInvalidArgument) << spec;
  }
}

TEST(ClassPickerTest, PicksSharedClassesByWeight) {
  std::vector<WorkloadClass> classes = *ParseMix("a:weight=3;own:concurrency=2;b:weight=1");
  const ClassPicker picker(classes);
  std::mt19937_64 rng(3);
  int counts[3] = {0, 0, 0};
  for (int i = 0; i < 40000; ++i) ++counts[picker.Pick(rng)];
  EXPECT_EQ(counts[1], 0);  // has its own arrival process
  EXPECT_NEAR(counts[0] / 40000.0, 0.75, 0.01);
  EXPECT_NEAR(counts[2] / 40000.0, 0.25, 0.01);
}

}  // namespace
}  // namespace pd::bench
