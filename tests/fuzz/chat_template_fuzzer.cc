// Fuzz target: the chat templates (engine/tokenizer/chat_template.h).
//
// Input: byte 0 picks the template kind (bits 0-1), add_generation_prompt (bit 2) and whether the
// rest is a conversation or model metadata (bit 3).
//   conversation: messages until the input ends, each a role byte (system, user, assistant, and
//                 names the API does not accept: developer, "", tool, User, or a free string) and
//                 the content up to the next NUL byte.
//   metadata:     a GGUF with a free tokenizer.chat_template and general.architecture, through
//                 DetectChatTemplate; and a free name through ParseChatTemplateName.
//
// What must hold (chat_template.h): a conversation renders exactly when its roles are valid
// (system, user or assistant; system only first; Gemma: user and assistant alternate from a user
// turn after an optional system message), and otherwise fails with INVALID_ARGUMENT, never a
// crash. A rendered prompt holds every message's content, in order (Gemma and Llama 2 carry the
// system message in the first user turn, so only there, when there is one), and with
// add_generation_prompt ends with the assistant turn's opening (Llama 2: right after the last
// user turn's [/INST]). The prompt then goes through the tokenizer as the front end sends it
// (parse_special): ids in range, and the text comes back when special tokens are rendered.
#include <string>
#include <string_view>
#include <vector>

#include "common/mapped_file.h"
#include "common/status.h"
#include "common/utf8.h"
#include "engine/model/gguf.h"
#include "engine/tokenizer/chat_template.h"
#include "engine/tokenizer/tokenizer.h"
#include "tests/fuzz/fuzz_input.h"
#include "tests/fuzz/fuzz_targets.h"
#include "tests/fuzz/fuzz_vocab.h"
#include "tests/testing/gguf_builder.h"

namespace pd::fuzz {
namespace {

using engine::ChatMessage;
using engine::ChatTemplateKind;

constexpr size_t kMaxMessages = 64;

bool EndsWith(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

// The header's rule for a conversation the template accepts.
bool Acceptable(ChatTemplateKind kind, const std::vector<ChatMessage>& m) {
  if (m.empty()) return false;
  for (size_t i = 0; i < m.size(); ++i) {
    const std::string& r = m[i].role;
    if (r != "system" && r != "user" && r != "assistant") return false;
    if (r == "system" && i != 0) return false;
  }
  if (kind == ChatTemplateKind::kGemma) {
    bool expect_user = true;
    for (size_t i = m[0].role == "system" ? 1 : 0; i < m.size(); ++i) {
      if ((m[i].role == "user") != expect_user) return false;
      expect_user = !expect_user;
    }
  }
  return true;
}

std::string_view Opening(ChatTemplateKind kind) {
  switch (kind) {
    case ChatTemplateKind::kGemma:
      return "<start_of_turn>model\n";
    case ChatTemplateKind::kChatMl:
      return "<|im_start|>assistant\n";
    case ChatTemplateKind::kLlama3:
      return "<|start_header_id|>assistant<|end_header_id|>\n\n";
    case ChatTemplateKind::kLlama2:
      return " [/INST]";
    case ChatTemplateKind::kPhi3:
      return "<|assistant|>\n";
  }
  return "";
}

void FuzzConversation(ChatTemplateKind kind, bool gen, FuzzInput& in) {
  static const char* const kRoles[] = {"system", "user", "assistant", "developer",
                                       "",       "tool", "User"};
  std::vector<ChatMessage> messages;
  while (!in.empty() && messages.size() < kMaxMessages) {
    ChatMessage m;
    const size_t r = in.Pick(std::size(kRoles) + 1);
    m.role = r < std::size(kRoles) ? std::string(kRoles[r]) : std::string(in.Short());
    m.content = std::string(in.Until('\0'));
    messages.push_back(std::move(m));
  }
  const absl::StatusOr<std::string> out = engine::ApplyChatTemplate(kind, messages, gen);
  const bool acceptable = Acceptable(kind, messages);
  if (!out.ok()) {
    PD_CHECK_MSG(!acceptable, "a valid conversation was refused");
    PD_CHECK(out.status().code() == absl::StatusCode::kInvalidArgument);
    PD_CHECK(!out.status().message().empty());
    return;
  }
  PD_CHECK_MSG(acceptable, "an invalid conversation was rendered");
  // Gemma and Llama 2 have no system turn: the system message goes into the first user turn (and
  // is dropped when none follows, as in the models' own templates). Every other message is
  // rendered where it stands.
  const bool merges_system = kind == ChatTemplateKind::kGemma || kind == ChatTemplateKind::kLlama2;
  bool has_user = false;
  size_t pos = 0;
  for (const ChatMessage& m : messages) {
    has_user |= m.role == "user";
    if (merges_system && m.role == "system") continue;
    const size_t at = out->find(m.content, pos);
    PD_CHECK_MSG(at != std::string::npos, "a message's content is missing or out of order");
    pos = at + m.content.size();
  }
  if (merges_system && has_user && messages[0].role == "system") {
    PD_CHECK_MSG(out->find(messages[0].content) != std::string::npos,
                 "the system message is missing from the first user turn");
  }
  if (gen && (kind != ChatTemplateKind::kLlama2 || messages.back().role == "user")) {
    PD_CHECK_MSG(EndsWith(*out, Opening(kind)), "no assistant turn opening at the end");
  }

  // As the front end encodes it (parse_special), without BOS so that the text compares.
  const engine::Tokenizer& tok = GetTokenizer(FuzzVocab::kBpeLlama3);
  const std::vector<int32_t> ids = tok.Encode(*out, /*add_special=*/false, /*parse_special=*/true);
  for (int32_t id : ids) PD_CHECK(tok.IsValid(id));
  if (IsValidUtf8(*out)) {
    engine::DecodeOptions d;
    d.render_special = true;
    PD_CHECK_MSG(tok.Decode(ids, d) == *out, "the rendered prompt does not survive tokenization");
  }
}

void FuzzMetadata(FuzzInput& in) {
  static const char* const kArchs[] = {"llama", "qwen2", "gemma", "gemma2", "gemma3", "phi3"};
  const uint8_t shape = in.Byte();
  engine::testing::GgufBuilder b;
  if (shape & 1) b.Str("tokenizer.chat_template", in.Short());
  if (shape & 2) b.U32("tokenizer.chat_template", in.Byte());  // the wrong type
  if (shape & 4) {
    b.Str("general.architecture",
          shape & 8 ? std::string(in.Short()) : std::string(kArchs[in.Pick(std::size(kArchs))]));
  }
  const std::string bytes = b.Build();
  auto file = engine::GgufFile::Parse(MappedFile::Borrow(bytes.data(), bytes.size()));
  if (file.ok()) {  // a duplicate key is refused by the reader
    absl::StatusOr<ChatTemplateKind> kind = engine::DetectChatTemplate(**file);
    if (kind.ok()) {
      auto again = engine::ParseChatTemplateName(engine::ChatTemplateName(*kind));
      PD_CHECK(again.ok() && *again == *kind);
    } else {
      PD_CHECK(kind.status().code() == absl::StatusCode::kUnimplemented);
    }
  }
  const std::string_view name = in.Rest();
  absl::StatusOr<ChatTemplateKind> parsed = engine::ParseChatTemplateName(name);
  const bool known =
      name == "gemma" || name == "chatml" || name == "llama3" || name == "llama2" || name == "phi3";
  PD_CHECK(parsed.ok() == known);
  if (parsed.ok()) PD_CHECK(engine::ChatTemplateName(*parsed) == name);
}

}  // namespace

int FuzzChatTemplate(const uint8_t* data, size_t size) {
  FuzzInput in(data, size);
  const uint8_t head = in.Byte();
  // Bits 0-1: Gemma, ChatML, Llama 3, Llama 2; bit 4 set: Phi-3.
  const auto kind = static_cast<ChatTemplateKind>((head & 16) != 0 ? 4 : head & 3);
  if (head & 8) {
    FuzzMetadata(in);
  } else {
    FuzzConversation(kind, (head & 4) != 0, in);
  }
  return 0;
}

}  // namespace pd::fuzz
