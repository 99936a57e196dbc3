// Synthetic prompts: N words are N tokens in the SPM and byte-level BPE vocabularies.
#include "bench/pd_bench/prompt.h"

#include <set>

#include "common/status.h"
#include "engine/model/gguf.h"
#include "engine/tokenizer/tokenizer.h"
#include "gtest/gtest.h"

namespace pd::bench {
namespace {

TEST(PromptTest, DeterministicWordsFromTheList) {
  const std::string a = BuildPrompt(50, 42);
  EXPECT_EQ(a, BuildPrompt(50, 42));
  EXPECT_NE(a, BuildPrompt(50, 43));
  const std::set<std::string_view> words(PromptWords().begin(), PromptWords().end());
  EXPECT_EQ(words.size(), PromptWords().size()) << "duplicate words in the list";
  int n = 0;
  size_t start = 0;
  while (start <= a.size()) {
    size_t end = a.find(' ', start);
    if (end == std::string::npos) end = a.size();
    EXPECT_TRUE(words.count(std::string_view(a).substr(start, end - start)));
    ++n;
    start = end + 1;
  }
  EXPECT_EQ(n, 50);
  EXPECT_EQ(BuildPrompt(1, 0).find(' '), std::string::npos);
}

// Run from the repository root (ctest does): the vocabularies are under testdata/tokenizer.
class PromptTokensTest : public ::testing::TestWithParam<std::string> {};

TEST_P(PromptTokensTest, EveryWordIsOneToken) {
  const std::string path = "testdata/tokenizer/ggml-vocab-" + GetParam() + ".gguf";
  absl::StatusOr<std::unique_ptr<engine::GgufFile>> gguf = engine::GgufFile::Open(path);
  ASSERT_TRUE(gguf.ok()) << path << ": " << gguf.status();
  absl::StatusOr<std::unique_ptr<engine::Tokenizer>> tok = engine::Tokenizer::FromGguf(**gguf);
  ASSERT_TRUE(tok.ok()) << tok.status();
  for (const int n : {1, 7, 100, 2048}) {
    for (const uint64_t seed : {0, 1, 2}) {
      const std::string text = BuildPrompt(n, seed);
      EXPECT_EQ((*tok)->Encode(text, /*add_special=*/false, /*parse_special=*/false).size(),
                static_cast<size_t>(n))
          << GetParam() << " n=" << n << " seed=" << seed;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Vocabs, PromptTokensTest,
                         ::testing::Values("llama-spm", "gpt-2", "phi-3", "deepseek-coder"));

}  // namespace
}  // namespace pd::bench
