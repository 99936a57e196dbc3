// Chat templates: turning a list of messages into the prompt text a model was trained on.
//
// Templates are implemented natively (no Jinja engine): Gemma, ChatML (Qwen2 and many others),
// Llama 3, Llama 2 and Phi-3. The kind is detected from the GGUF's `tokenizer.chat_template` when the
// file has one, otherwise from the architecture. The rendered text holds special-token text
// (e.g. "<start_of_turn>"), so encode it with parse_special = true; the BOS token is left to the
// tokenizer's add_special rule. Thread safe (pure functions).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model/gguf.h"

namespace pd::engine {

struct ChatMessage {
  std::string role;  // "system", "user" or "assistant"
  std::string content;
};

enum class ChatTemplateKind { kGemma, kChatMl, kLlama3, kLlama2, kPhi3 };

std::string_view ChatTemplateName(ChatTemplateKind kind);
// Parses "gemma", "chatml", "llama3", "llama2", "phi3". INVALID_ARGUMENT otherwise.
absl::StatusOr<ChatTemplateKind> ParseChatTemplateName(std::string_view name);
// The template for a model file. UNIMPLEMENTED when the file's template is none of the known kinds
// and the architecture gives no default.
absl::StatusOr<ChatTemplateKind> DetectChatTemplate(const GgufFile& file);

// Renders `messages`; with add_generation_prompt, ends with the opening of the assistant's turn.
// INVALID_ARGUMENT for an unknown role, an empty conversation, or (Gemma) roles that do not
// alternate user/assistant after an optional leading system message.
absl::StatusOr<std::string> ApplyChatTemplate(ChatTemplateKind kind,
                                              const std::vector<ChatMessage>& messages,
                                              bool add_generation_prompt);

}  // namespace pd::engine
