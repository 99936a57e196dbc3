// Every file of every fuzz corpus (tests/fuzz/corpus/<target>/) through its harness
// (fuzz_targets.h), in the ordinary build: each seed, each input a nightly run merged in, and each
// reproducer of a crash a fuzzer once found stays a regression test. A harness reports a broken
// invariant by aborting (PD_CHECK), which fails the test; the file it was reading is the last
// "[ corpus ]" line before the abort. Run from the repository root (ctest does).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <ostream>
#include <string>
#include <vector>

#include "tests/fuzz/fuzz_targets.h"

namespace pd::fuzz {

// gtest names a failing parameter by this.
void PrintTo(const FuzzTarget& target, std::ostream* os) { *os << target.name; }

namespace {

namespace fs = std::filesystem;

class CorpusTest : public ::testing::TestWithParam<FuzzTarget> {};

TEST_P(CorpusTest, EveryFileRunsCleanThroughItsHarness) {
  const fs::path dir = fs::path("tests/fuzz/corpus") / GetParam().name;
  ASSERT_TRUE(fs::is_directory(dir)) << dir << " is missing (run from the repository root)";
  std::vector<fs::path> files;
  for (const fs::directory_entry& e : fs::directory_iterator(dir)) {
    if (e.is_regular_file()) files.push_back(e.path());
  }
  std::sort(files.begin(), files.end());
  // A handful of seeds at least: an empty folder would make this test pass without running.
  ASSERT_GE(files.size(), 4u) << dir << " holds too few inputs";
  for (const fs::path& f : files) {
    std::fprintf(stderr, "[ corpus   ] %s\n", f.c_str());
    std::ifstream in(f, std::ios::binary);
    ASSERT_TRUE(in.good()) << "cannot read " << f;
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    EXPECT_EQ(GetParam().fn(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()), 0) << f;
  }
}

INSTANTIATE_TEST_SUITE_P(Fuzz, CorpusTest, ::testing::ValuesIn(kFuzzTargets),
                         [](const ::testing::TestParamInfo<FuzzTarget>& info) {
                           return std::string(info.param.name);
                         });

}  // namespace
}  // namespace pd::fuzz
