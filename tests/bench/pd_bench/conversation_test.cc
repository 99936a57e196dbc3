// The multi-turn workload's texts: deterministic from the seed, system prompts that differ from
// their first words and are shared across conversations, user messages distinct per conversation
// and turn, and requests that grow turn by turn with the answers the server returned.
#include "bench/pd_bench/conversation.h"

#include <map>
#include <set>

#include "bench/pd_bench/prompt.h"
#include "gtest/gtest.h"

namespace pd::bench {
namespace {

std::vector<std::string> Words(const std::string& text) {
  std::vector<std::string> words;
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find(' ', start);
    if (end == std::string::npos) end = text.size();
    words.push_back(text.substr(start, end - start));
    start = end + 1;
  }
  return words;
}

ConversationOptions Options() {
  ConversationOptions o;
  o.conversations = 8;
  o.turns = 3;
  o.system_prompts = 4;
  o.system_words = 20;
  o.user_words = LengthDist::Fixed(6);
  o.output = LengthDist::Fixed(5);
  o.seed = 7;
  return o;
}

TEST(ConversationTest, TextsAreDeterministicFromTheSeed) {
  const ConversationOptions a = Options();
  ConversationOptions b = Options();
  EXPECT_EQ(SystemPrompt(a, 2), SystemPrompt(b, 2));
  EXPECT_EQ(UserMessage(a, 5, 2), UserMessage(b, 5, 2));
  b.seed = 8;
  EXPECT_NE(SystemPrompt(a, 2), SystemPrompt(b, 2));
  EXPECT_NE(UserMessage(a, 5, 2), UserMessage(b, 5, 2));
  // Changing another knob leaves the system prompts as they were.
  ConversationOptions c = Options();
  c.turns = 9;
  c.user_words = LengthDist::Fixed(50);
  EXPECT_EQ(SystemPrompt(a, 3), SystemPrompt(c, 3));
}

TEST(ConversationTest, LengthsInWordsFromTheList) {
  ConversationOptions o = Options();
  o.user_words = *LengthDist::Parse("uniform:3:9");
  const std::set<std::string_view> list(PromptWords().begin(), PromptWords().end());
  for (int i = 0; i < o.system_prompts; ++i) {
    const std::vector<std::string> words = Words(SystemPrompt(o, i));
    EXPECT_EQ(words.size(), 20u);
    for (const std::string& w : words) EXPECT_TRUE(list.count(w)) << w;
  }
  std::set<size_t> lengths;
  for (int c = 0; c < 20; ++c) {
    const size_t n = Words(UserMessage(o, c, 1)).size();
    EXPECT_GE(n, 3u);
    EXPECT_LE(n, 9u);
    lengths.insert(n);
  }
  EXPECT_GT(lengths.size(), 1u) << "user message lengths are drawn, not fixed";
  for (const int n : {1, 2, 3}) {
    o.system_words = n;
    EXPECT_EQ(Words(SystemPrompt(o, 1)).size(), static_cast<size_t>(n));
  }
}

TEST(ConversationTest, SystemPromptsDifferFromTheirFirstWords) {
  ConversationOptions o = Options();
  o.system_prompts =
      static_cast<int>(PromptWords().size());  // 147: the first word tells them apart
  std::set<std::string> first;
  for (int i = 0; i < o.system_prompts; ++i) first.insert(Words(SystemPrompt(o, i))[0]);
  EXPECT_EQ(first.size(), static_cast<size_t>(o.system_prompts));

  o.system_prompts = 1000;  // beyond: the first two words do
  std::set<std::pair<std::string, std::string>> first_two;
  for (int i = 0; i < o.system_prompts; ++i) {
    const std::vector<std::string> w = Words(SystemPrompt(o, i));
    first_two.insert({w[0], w[1]});
  }
  EXPECT_EQ(first_two.size(), 1000u);
}

TEST(ConversationTest, SystemPromptsAreSharedRoundRobinOrRandomly) {
  ConversationOptions o = Options();
  for (int64_t c = 0; c < 12; ++c) EXPECT_EQ(SystemPromptOf(o, c), c % 4);
  // Conversations with the same system prompt start with the same system message.
  EXPECT_EQ(Conversation(o, 1).history()[0].content, Conversation(o, 5).history()[0].content);
  EXPECT_NE(Conversation(o, 1).history()[0].content, Conversation(o, 2).history()[0].content);
  EXPECT_EQ(Conversation(o, 1).history()[0].role, "system");

  o.assignment = SystemPromptAssignment::kRandom;
  std::map<int, int> uses;
  for (int64_t c = 0; c < 400; ++c) {
    const int s = SystemPromptOf(o, c);
    ASSERT_GE(s, 0);
    ASSERT_LT(s, 4);
    EXPECT_EQ(s, SystemPromptOf(o, c)) << "seeded per conversation";
    ++uses[s];
  }
  ASSERT_EQ(uses.size(), 4u);
  for (const auto& [s, n] : uses) EXPECT_GT(n, 50) << "prompt " << s;  // expected 100 each
  ConversationOptions reseeded = o;
  reseeded.seed = 99;
  int differ = 0;
  for (int64_t c = 0; c < 40; ++c) differ += SystemPromptOf(o, c) != SystemPromptOf(reseeded, c);
  EXPECT_GT(differ, 10);  // 30 expected

  o.system_prompts = 0;
  EXPECT_EQ(SystemPromptOf(o, 3), -1);
  EXPECT_TRUE(Conversation(o, 3).history().empty());
}

TEST(ConversationTest, UserMessagesDifferPerConversationAndTurn) {
  const ConversationOptions o = Options();
  std::set<std::string> seen;
  for (int64_t c = 0; c < 50; ++c) {
    for (int t = 1; t <= 5; ++t) EXPECT_TRUE(seen.insert(UserMessage(o, c, t)).second) << c << t;
  }
}

TEST(ConversationTest, EachTurnSendsTheWholeConversationSoFar) {
  const ConversationOptions o = Options();
  Conversation conv(o, 6);
  EXPECT_EQ(conv.next_turn(), 1);
  const std::vector<ChatMessage> first = conv.NextMessages();
  ASSERT_EQ(first.size(), 2u);
  EXPECT_EQ(first[0].role, "system");
  EXPECT_EQ(first[0].content, SystemPrompt(o, 6 % 4));
  EXPECT_EQ(first[1].role, "user");
  EXPECT_EQ(first[1].content, UserMessage(o, 6, 1));
  EXPECT_EQ(conv.NextPromptTokens(), 20 + 6);

  conv.AddAnswer("first answer", 5);
  const std::vector<ChatMessage> second = conv.NextMessages();
  ASSERT_EQ(second.size(), 4u);
  // The previous request is a prefix of this one, then the answer and the next user message.
  for (size_t i = 0; i < first.size(); ++i) {
    EXPECT_EQ(second[i].role, first[i].role);
    EXPECT_EQ(second[i].content, first[i].content);
  }
  EXPECT_EQ(second[2].role, "assistant");
  EXPECT_EQ(second[2].content, "first answer");
  EXPECT_EQ(second[3].role, "user");
  EXPECT_EQ(second[3].content, UserMessage(o, 6, 2));
  EXPECT_EQ(conv.NextPromptTokens(), 20 + 6 + 5 + 6);

  conv.AddAnswer("second answer", 4);
  EXPECT_EQ(conv.next_turn(), 3);
  const std::vector<ChatMessage> third = conv.NextMessages();
  ASSERT_EQ(third.size(), 6u);
  EXPECT_EQ(third[4].content, "second answer");
  EXPECT_EQ(third[5].content, UserMessage(o, 6, 3));
  EXPECT_EQ(conv.NextPromptTokens(), 20 + 6 + 5 + 6 + 4 + 6);
  EXPECT_FALSE(conv.finished());
  conv.AddAnswer("third answer", 5);
  EXPECT_TRUE(conv.finished());
  EXPECT_EQ(conv.history().size(), 7u);

  // The same conversation rebuilt gives the same requests for the same answers.
  Conversation again(o, 6);
  EXPECT_EQ(again.NextMessages()[1].content, first[1].content);
}

TEST(ConversationTest, ThinkTimeFixedOrExponentialAndSeeded) {
  ConversationOptions o = Options();
  o.think_time_ms = 250;
  EXPECT_DOUBLE_EQ(ThinkTimeS(o, 3, 1), 0.25);
  EXPECT_DOUBLE_EQ(ThinkTimeS(o, 4, 2), 0.25);
  o.think_time = ThinkTime::kExponential;
  EXPECT_DOUBLE_EQ(ThinkTimeS(o, 3, 1), ThinkTimeS(o, 3, 1));
  EXPECT_NE(ThinkTimeS(o, 3, 1), ThinkTimeS(o, 3, 2));
  double sum = 0;
  const int n = 4000;
  for (int c = 0; c < n; ++c) {
    const double t = ThinkTimeS(o, c, 1);
    EXPECT_GE(t, 0);
    sum += t;
  }
  EXPECT_NEAR(sum / n, 0.25, 0.025);  // the mean of 4000 draws: sd 0.25 / sqrt(4000) = 0.004
  o.think_time_ms = 0;
  EXPECT_DOUBLE_EQ(ThinkTimeS(o, 3, 1), 0);
}

TEST(ConversationTest, MaxTokensPerTurnFromTheOutputSpec) {
  ConversationOptions o = Options();
  EXPECT_EQ(TurnMaxTokens(o, 1, 1), 5);
  o.output = *LengthDist::Parse("uniform:10:20");
  for (int t = 1; t <= 10; ++t) {
    const int n = TurnMaxTokens(o, 2, t);
    EXPECT_GE(n, 10);
    EXPECT_LE(n, 20);
    EXPECT_EQ(n, TurnMaxTokens(o, 2, t));
  }
}

TEST(ConversationTest, ValidationNamesTheFlag) {
  EXPECT_TRUE(Options().Validate().ok());
  const auto invalid = [](auto change) {
    ConversationOptions o = Options();
    change(o);
    return o.Validate().code() == absl::StatusCode::kInvalidArgument;
  };
  EXPECT_TRUE(invalid([](ConversationOptions& o) { o.turns = 0; }));
  EXPECT_TRUE(invalid([](ConversationOptions& o) { o.conversations = -1; }));
  EXPECT_TRUE(invalid([](ConversationOptions& o) { o.think_time_ms = -1; }));
  EXPECT_TRUE(invalid([](ConversationOptions& o) { o.system_prompts = -1; }));
  EXPECT_TRUE(invalid([](ConversationOptions& o) { o.system_words = 0; }));
  EXPECT_TRUE(invalid([](ConversationOptions& o) {
    o.system_prompts = 200;
    o.system_words = 1;
  }));
  EXPECT_TRUE(invalid([](ConversationOptions& o) { o.system_prompts = 147 * 147 + 1; }));
  EXPECT_FALSE(invalid([](ConversationOptions& o) {
    o.system_prompts = 0;
    o.system_words = 0;
  }));
}

}  // namespace
}  // namespace pd::bench
