#include "engine/tokenizer/chat_template.h"

#include "common/status.h"
#include "common/strings.h"

namespace pd::engine {
namespace {

absl::Status CheckRoles(const std::vector<ChatMessage>& messages) {
  if (messages.empty()) return absl::InvalidArgumentError("the conversation has no messages");
  for (size_t i = 0; i < messages.size(); ++i) {
    const std::string& r = messages[i].role;
    if (r != "system" && r != "user" && r != "assistant") {
      return absl::InvalidArgumentError(pd::StrCat("message ", i, " has role '", r,
                                                   "' (expected system, user or assistant)"));
    }
    if (r == "system" && i != 0) {
      return absl::InvalidArgumentError("a system message may only come first");
    }
  }
  return absl::OkStatus();
}

// Gemma: no system role; a system message is prepended to the first user turn. Turns must
// alternate user / model, starting with user.
absl::StatusOr<std::string> Gemma(const std::vector<ChatMessage>& m, bool gen) {
  std::string out, system;
  size_t i = 0;
  if (m[0].role == "system") {
    system = m[0].content + "\n\n";
    i = 1;
  }
  bool expect_user = true;
  for (; i < m.size(); ++i) {
    const bool is_user = m[i].role == "user";
    if (is_user != expect_user) {
      return absl::InvalidArgumentError(
          "Gemma's template needs user and assistant turns to alternate, starting with user");
    }
    out += pd::StrCat("<start_of_turn>", is_user ? "user" : "model", "\n", system, m[i].content,
                      "<end_of_turn>\n");
    system.clear();
    expect_user = !expect_user;
  }
  if (gen) out += "<start_of_turn>model\n";
  return out;
}

std::string ChatMl(const std::vector<ChatMessage>& m, bool gen) {
  std::string out;
  for (const ChatMessage& msg : m) {
    out += pd::StrCat("<|im_start|>", msg.role, "\n", msg.content, "<|im_end|>\n");
  }
  if (gen) out += "<|im_start|>assistant\n";
  return out;
}

std::string Llama3(const std::vector<ChatMessage>& m, bool gen) {
  std::string out;
  for (const ChatMessage& msg : m) {
    out += pd::StrCat("<|start_header_id|>", msg.role, "<|end_header_id|>\n\n", msg.content,
                      "<|eot_id|>");
  }
  if (gen) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
  return out;
}

// Llama 2: [INST] blocks, the system prompt inside the first one.
std::string Llama2(const std::vector<ChatMessage>& m, bool gen) {
  std::string out, system;
  size_t i = 0;
  if (m[0].role == "system") {
    system = pd::StrCat("<<SYS>>\n", m[0].content, "\n<</SYS>>\n\n");
    i = 1;
  }
  for (; i < m.size(); ++i) {
    if (m[i].role == "user") {
      out += pd::StrCat("[INST] ", system, m[i].content, " [/INST]");
      system.clear();
    } else {
      out += pd::StrCat(" ", m[i].content, " </s>");
    }
  }
  (void)gen;  // the assistant's turn starts right after [/INST]
  return out;
}

// Phi-3 (and Phi-3.5, Phi-4-mini): <|role|>, newline, the content and <|end|> per turn; the system
// role is a turn of its own.
std::string Phi3(const std::vector<ChatMessage>& m, bool gen) {
  std::string out;
  for (const ChatMessage& msg : m) {
    out += pd::StrCat("<|", msg.role, "|>\n", msg.content, "<|end|>\n");
  }
  if (gen) out += "<|assistant|>\n";
  return out;
}

}  // namespace

std::string_view ChatTemplateName(ChatTemplateKind kind) {
  switch (kind) {
    case ChatTemplateKind::kGemma: return "gemma";
    case ChatTemplateKind::kChatMl: return "chatml";
    case ChatTemplateKind::kLlama3: return "llama3";
    case ChatTemplateKind::kLlama2: return "llama2";
    case ChatTemplateKind::kPhi3: return "phi3";
  }
  return "unknown";
}

absl::StatusOr<ChatTemplateKind> ParseChatTemplateName(std::string_view name) {
  for (ChatTemplateKind k : {ChatTemplateKind::kGemma, ChatTemplateKind::kChatMl,
                             ChatTemplateKind::kLlama3, ChatTemplateKind::kLlama2,
                             ChatTemplateKind::kPhi3}) {
    if (name == ChatTemplateName(k)) return k;
  }
  return absl::InvalidArgumentError(
      pd::StrCat("unknown chat template '", name, "' (known: gemma, chatml, llama3, llama2, phi3)"));
}

absl::StatusOr<ChatTemplateKind> DetectChatTemplate(const GgufFile& file) {
  if (auto t = file.GetString("tokenizer.chat_template"); t.ok()) {
    const std::string_view s = *t;
    if (s.find("<start_of_turn>") != std::string_view::npos) return ChatTemplateKind::kGemma;
    if (s.find("<|im_start|>") != std::string_view::npos) return ChatTemplateKind::kChatMl;
    if (s.find("<|start_header_id|>") != std::string_view::npos) return ChatTemplateKind::kLlama3;
    if (s.find("[INST]") != std::string_view::npos) return ChatTemplateKind::kLlama2;
    if (s.find("<|assistant|>") != std::string_view::npos &&
        s.find("<|end|>") != std::string_view::npos) {
      return ChatTemplateKind::kPhi3;
    }
  }
  auto arch = file.GetString("general.architecture");
  if (arch.ok()) {
    if (*arch == "gemma3" || *arch == "gemma2" || *arch == "gemma") return ChatTemplateKind::kGemma;
    if (*arch == "qwen2" || *arch == "qwen3" || *arch == "qwen3moe") {
      return ChatTemplateKind::kChatMl;
    }
    if (*arch == "phi3") return ChatTemplateKind::kPhi3;
    if (*arch == "llama") return ChatTemplateKind::kLlama2;
  }
  return absl::UnimplementedError(
      "the model has no chat template this engine knows; pass one explicitly (gemma, chatml, "
      "llama3, llama2, phi3)");
}

absl::StatusOr<std::string> ApplyChatTemplate(ChatTemplateKind kind,
                                              const std::vector<ChatMessage>& messages,
                                              bool add_generation_prompt) {
  PD_RETURN_IF_ERROR(CheckRoles(messages));
  switch (kind) {
    case ChatTemplateKind::kGemma: return Gemma(messages, add_generation_prompt);
    case ChatTemplateKind::kChatMl: return ChatMl(messages, add_generation_prompt);
    case ChatTemplateKind::kLlama3: return Llama3(messages, add_generation_prompt);
    case ChatTemplateKind::kLlama2: return Llama2(messages, add_generation_prompt);
    case ChatTemplateKind::kPhi3: return Phi3(messages, add_generation_prompt);
  }
  return absl::InternalError("unknown chat template kind");
}

}  // namespace pd::engine
