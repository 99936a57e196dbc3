#include "engine/tokenizer/chat_template.h"

#include <gtest/gtest.h>

#include "common/status_matchers.h"

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
