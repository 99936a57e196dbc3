// The SSE line parser and OpenAI stream chunks.
#include "frontend/openai_stream.h"

#include <vector>

#include "gtest/gtest.h"

namespace pd::frontend {
namespace {

std::vector<SseEvent> FeedAll(const std::vector<std::string>& pieces, bool finish = true) {
  SseParser parser;
  std::vector<SseEvent> events;
  const auto on_event = [&](const SseEvent& e) { events.push_back(e); };
  for (const std::string& p : pieces) parser.Feed(p, on_event);
  if (finish) parser.Finish(on_event);
  return events;
}

TEST(SseParserTest, EventsSplitAnywhere) {
  const std::string body =
      "data: {\"a\":1}\n\n: keep-alive\n\ndata:{\"b\":2}\r\n\r\nevent: error\ndata: x\n\n"
      "data: [DONE]\n\n";
  // Every split point of the body gives the same events.
  for (size_t cut = 0; cut <= body.size(); ++cut) {
    const std::vector<SseEvent> events = FeedAll({body.substr(0, cut), body.substr(cut)});
    ASSERT_EQ(events.size(), 4u) << cut;
    EXPECT_EQ(events[0].data, "{\"a\":1}");
    EXPECT_EQ(events[1].data, "{\"b\":2}");  // no space after the colon
    EXPECT_EQ(events[2].event, "error");
    EXPECT_EQ(events[2].data, "x");
    EXPECT_EQ(events[3].data, "[DONE]");
  }
  // Byte by byte.
  std::vector<std::string> bytes;
  for (const char c : body) bytes.emplace_back(1, c);
  EXPECT_EQ(FeedAll(bytes).size(), 4u);
}

TEST(SseParserTest, LineEndingsMultilineDataAndUnknownFields) {
  const std::vector<SseEvent> events =
      FeedAll({"id: 7\rretry: 10\rdata: one\rdata: two\r\rdata\n\ndata:  lead\n\n"});
  ASSERT_EQ(events.size(), 3u);
  EXPECT_EQ(events[0].data, "one\ntwo");
  EXPECT_EQ(events[1].data, "");       // "data" without a colon: empty value
  EXPECT_EQ(events[2].data, " lead");  // only one space is dropped
}

TEST(SseParserTest, BlankLinesWithoutDataDispatchNothing) {
  EXPECT_TRUE(FeedAll({"\n\n: comment\n\nevent: x\n\n"}).empty());
}

TEST(SseParserTest, FinishTakesAnUnterminatedLastEvent) {
  EXPECT_TRUE(FeedAll({"data: [DONE]"}, /*finish=*/false).empty());
  const std::vector<SseEvent> events = FeedAll({"data: [DONE]"});
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].data, "[DONE]");
  EXPECT_EQ(FeedAll({"data: a\n"}).size(), 1u);
}

TEST(OpenAiChunkTest, ChatDeltaCompletionTextUsageDone) {
  absl::StatusOr<OpenAiChunk> chat =
      ParseOpenAiData(R"({"id":"x","object":"chat.completion.chunk","choices":[{"index":0,)"
                      R"("delta":{"content":"Hel"},"finish_reason":null}]})");
  ASSERT_TRUE(chat.ok()) << chat.status();
  EXPECT_EQ(chat->text, "Hel");
  EXPECT_EQ(chat->finish_reason, "");
  EXPECT_FALSE(chat->done);
  EXPECT_FALSE(chat->prompt_tokens.has_value());

  absl::StatusOr<OpenAiChunk> role =
      ParseOpenAiData(R"({"choices":[{"index":0,"delta":{"role":"assistant"}}]})");
  ASSERT_TRUE(role.ok());
  EXPECT_EQ(role->text, "");

  absl::StatusOr<OpenAiChunk> text = ParseOpenAiData(
      R"({"object":"text_completion","choices":[{"index":0,"text":" world","finish_reason":"length"}]})");
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(text->text, " world");
  EXPECT_EQ(text->finish_reason, "length");

  absl::StatusOr<OpenAiChunk> usage = ParseOpenAiData(
      R"({"choices":[],"usage":{"prompt_tokens":65,"completion_tokens":128,"total_tokens":193}})");
  ASSERT_TRUE(usage.ok());
  EXPECT_EQ(usage->prompt_tokens, 65);
  EXPECT_EQ(usage->completion_tokens, 128);
  EXPECT_EQ(usage->text, "");

  absl::StatusOr<OpenAiChunk> done = ParseOpenAiData("[DONE]");
  ASSERT_TRUE(done.ok());
  EXPECT_TRUE(done->done);
}

TEST(OpenAiChunkTest, ErrorsAndGarbage) {
  absl::StatusOr<OpenAiChunk> err = ParseOpenAiData(
      R"({"error":{"message":"queue full","type":"server_error","code":"RESOURCE_EXHAUSTED"}})");
  ASSERT_TRUE(err.ok());
  EXPECT_TRUE(err->error);
  EXPECT_EQ(err->error_code, "RESOURCE_EXHAUSTED");
  EXPECT_EQ(err->error_message, "queue full");
  absl::StatusOr<OpenAiChunk> typed =
      ParseOpenAiData(R"({"error":{"type":"overloaded","code":429}})");
  EXPECT_EQ(typed->error_code, "429");
  absl::StatusOr<OpenAiChunk> bare = ParseOpenAiData(R"({"error":"boom"})");
  EXPECT_EQ(bare->error_code, "error");
  EXPECT_EQ(bare->error_message, "boom");
  EXPECT_EQ(ParseOpenAiData("not json").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseOpenAiData("[1,2]").status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pd::frontend
