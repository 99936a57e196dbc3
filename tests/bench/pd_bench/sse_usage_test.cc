// The usage pd-bench reads from an OpenAI stream (frontend/openai_stream.h): cached prompt tokens
// from usage.prompt_tokens_details.cached_tokens in the final usage chunk, unset when absent.
#include <string>
#include <vector>

#include "frontend/openai_stream.h"
#include "gtest/gtest.h"

namespace pd::bench {
namespace {

using frontend::OpenAiChunk;
using frontend::ParseOpenAiData;
using frontend::SseEvent;
using frontend::SseParser;

// Feeds `body` in small pieces and returns every parsed chunk.
std::vector<OpenAiChunk> Parse(const std::string& body) {
  std::vector<OpenAiChunk> chunks;
  SseParser parser;
  const auto on_event = [&](const SseEvent& ev) {
    absl::StatusOr<OpenAiChunk> c = ParseOpenAiData(ev.data);
    EXPECT_TRUE(c.ok()) << c.status();
    if (c.ok()) chunks.push_back(*c);
  };
  for (size_t i = 0; i < body.size(); i += 7) parser.Feed(body.substr(i, 7), on_event);
  parser.Finish(on_event);
  return chunks;
}

constexpr char kContent[] =
    "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,"
    "\"delta\":{\"content\":\"Hi\"},\"finish_reason\":null}],\"usage\":null}\n\n";

TEST(SseUsageTest, CachedTokensFromTheFinalUsageChunk) {
  const std::string body = std::string(kContent) +
                           "data: {\"id\":\"c\",\"choices\":[],\"usage\":{\"prompt_tokens\":812,"
                           "\"completion_tokens\":16,\"total_tokens\":828,"
                           "\"prompt_tokens_details\":{\"cached_tokens\":768}}}\n\n"
                           "data: [DONE]\n\n";
  const std::vector<OpenAiChunk> chunks = Parse(body);
  ASSERT_EQ(chunks.size(), 3u);
  EXPECT_EQ(chunks[0].text, "Hi");
  EXPECT_FALSE(chunks[0].cached_tokens.has_value()) << "usage: null";
  EXPECT_EQ(chunks[1].prompt_tokens, 812);
  EXPECT_EQ(chunks[1].completion_tokens, 16);
  ASSERT_TRUE(chunks[1].cached_tokens.has_value());
  EXPECT_EQ(*chunks[1].cached_tokens, 768);
  EXPECT_TRUE(chunks[2].done);
}

TEST(SseUsageTest, ZeroCachedTokensIsReported) {
  const std::vector<OpenAiChunk> chunks = Parse(
      "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":1,"
      "\"prompt_tokens_details\":{\"cached_tokens\":0}}}\n\n");
  ASSERT_EQ(chunks.size(), 1u);
  ASSERT_TRUE(chunks[0].cached_tokens.has_value());
  EXPECT_EQ(*chunks[0].cached_tokens, 0);
}

TEST(SseUsageTest, AbsentCachedTokensStayUnset) {
  for (const char* usage : {
           R"({"prompt_tokens":5,"completion_tokens":1})",
           R"({"prompt_tokens":5,"completion_tokens":1,"prompt_tokens_details":null})",
           R"({"prompt_tokens":5,"completion_tokens":1,"prompt_tokens_details":{}})",
           R"({"prompt_tokens":5,"prompt_tokens_details":{"cached_tokens":null}})",
           R"({"prompt_tokens":5,"prompt_tokens_details":{"cached_tokens":"12"}})",
       }) {
    const std::vector<OpenAiChunk> chunks =
        Parse(std::string("data: {\"choices\":[],\"usage\":") + usage + "}\n\n");
    ASSERT_EQ(chunks.size(), 1u) << usage;
    EXPECT_EQ(chunks[0].prompt_tokens, 5) << usage;
    EXPECT_FALSE(chunks[0].cached_tokens.has_value()) << usage;
  }
}

}  // namespace
}  // namespace pd::bench
