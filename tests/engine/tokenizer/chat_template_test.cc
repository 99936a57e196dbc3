#include "engine/tokenizer/chat_template.h"

#include <gtest/gtest.h>

#include "common/status_matchers.h"
#include "tests/testing/gguf_builder.h"

namespace pd::engine {
namespace {

using ::pd::testing::StatusIs;

TEST(ChatTemplateTest, GemmaFoldsSystemIntoFirstUserTurn) {
  auto s = ApplyChatTemplate(ChatTemplateKind::kGemma,
                             {{"system", "Be brief."}, {"user", "Hi"}, {"assistant", "Hello!"},
                              {"user", "Why is the sky blue?"}},
                             true);
  PD_ASSERT_OK(s);
  EXPECT_EQ(*s,
            "<start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n"
            "<start_of_turn>model\nHello!<end_of_turn>\n"
            "<start_of_turn>user\nWhy is the sky blue?<end_of_turn>\n"
            "<start_of_turn>model\n");
}

TEST(ChatTemplateTest, GemmaRefusesNonAlternatingTurns) {
  EXPECT_THAT(ApplyChatTemplate(ChatTemplateKind::kGemma, {{"user", "a"}, {"user", "b"}}, true),
              StatusIs(absl::StatusCode::kInvalidArgument, "alternate"));
  EXPECT_THAT(ApplyChatTemplate(ChatTemplateKind::kGemma, {{"assistant", "a"}}, true),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(ChatTemplateTest, ChatMlAndLlama3) {
  auto c = ApplyChatTemplate(ChatTemplateKind::kChatMl, {{"system", "S"}, {"user", "U"}}, true);
  PD_ASSERT_OK(c);
  EXPECT_EQ(*c, "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n"
                "<|im_start|>assistant\n");
  auto l = ApplyChatTemplate(ChatTemplateKind::kLlama3, {{"user", "U"}}, false);
  PD_ASSERT_OK(l);
  EXPECT_EQ(*l, "<|start_header_id|>user<|end_header_id|>\n\nU<|eot_id|>");
}

// Phi-3's format as llama.cpp's built-in "phi3" template writes it (llama-chat.cpp): every role,
// system included, a turn of its own.
TEST(ChatTemplateTest, Phi3) {
  auto p = ApplyChatTemplate(ChatTemplateKind::kPhi3,
                             {{"system", "S"}, {"user", "U"}, {"assistant", "A"}, {"user", "V"}},
                             true);
  PD_ASSERT_OK(p);
  EXPECT_EQ(*p, "<|system|>\nS<|end|>\n<|user|>\nU<|end|>\n<|assistant|>\nA<|end|>\n"
                "<|user|>\nV<|end|>\n<|assistant|>\n");
  auto k = ParseChatTemplateName("phi3");
  PD_ASSERT_OK(k);
  EXPECT_EQ(*k, ChatTemplateKind::kPhi3);
  EXPECT_EQ(ChatTemplateName(ChatTemplateKind::kPhi3), "phi3");
}

// The kind comes from the file's template text when it has one, else from the architecture.
TEST(ChatTemplateTest, DetectedFromTheTemplateThenTheArchitecture) {
  struct Case {
    std::string arch, tmpl;
    ChatTemplateKind want;
  };
  const std::vector<Case> cases = {
      {"llama", "{% for m in messages %}<|user|>{{ m.content }}<|end|><|assistant|>",
       ChatTemplateKind::kPhi3},
      {"phi3", "", ChatTemplateKind::kPhi3},
      {"qwen3moe", "", ChatTemplateKind::kChatMl},
      {"llama", "<|start_header_id|>", ChatTemplateKind::kLlama3},
      {"phi3", "<|im_start|>", ChatTemplateKind::kChatMl},
      {"gemma2", "", ChatTemplateKind::kGemma},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.arch + " / " + c.tmpl);
    testing::GgufBuilder b;
    b.Str("general.architecture", c.arch);
    if (!c.tmpl.empty()) b.Str("tokenizer.chat_template", c.tmpl);
    const std::string bytes = b.Build();
    auto f = testing::ParseBytes(bytes);
    PD_ASSERT_OK(f);
    auto k = DetectChatTemplate(**f);
    PD_ASSERT_OK(k);
    EXPECT_EQ(ChatTemplateName(*k), ChatTemplateName(c.want));
  }
  testing::GgufBuilder b;
  b.Str("general.architecture", "falcon");
  const std::string bytes = b.Build();
  auto f = testing::ParseBytes(bytes);
  PD_ASSERT_OK(f);
  EXPECT_THAT(DetectChatTemplate(**f), StatusIs(absl::StatusCode::kUnimplemented, "phi3"));
}

TEST(ChatTemplateTest, BadInput) {
  EXPECT_THAT(ApplyChatTemplate(ChatTemplateKind::kChatMl, {}, true),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(ApplyChatTemplate(ChatTemplateKind::kChatMl, {{"robot", "x"}}, true),
              StatusIs(absl::StatusCode::kInvalidArgument, "robot"));
  EXPECT_THAT(ApplyChatTemplate(ChatTemplateKind::kChatMl, {{"user", "x"}, {"system", "y"}}, true),
              StatusIs(absl::StatusCode::kInvalidArgument, "first"));
  EXPECT_THAT(ParseChatTemplateName("jinja"), StatusIs(absl::StatusCode::kInvalidArgument));
  PD_EXPECT_OK(ParseChatTemplateName("gemma"));
}

}  // namespace
}  // namespace pd::engine
