// CheckSameVocabulary: a draft model must give every token id the target's token. Vocabularies
// are built as metadata-only GGUFs; each case changes one thing and checks that the message names
// it.
#include "engine/model/vocab_match.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "common/status_matchers.h"
#include "tests/testing/gguf_builder.h"

namespace pd::engine {
namespace {

using ::pd::engine::testing::GgufBuilder;
using ::pd::engine::testing::ParseBytes;
using ::pd::testing::StatusIs;

struct Vocab {
  std::vector<std::string> tokens = {"<unk>", "<s>", "</s>", "a", "b", "\xe2\x96\x81hello"};
  std::vector<int32_t> types = {2, 3, 3, 1, 1, 1};
  bool with_tokens = true, with_types = true;
  std::vector<std::pair<std::string, uint32_t>> ids = {{"tokenizer.ggml.bos_token_id", 1},
                                                       {"tokenizer.ggml.eos_token_id", 2},
                                                       {"tokenizer.ggml.unknown_token_id", 0}};
  uint64_t embd_rows = 6;  // token_embd.weight rows

  std::string Build() const {
    GgufBuilder b;
    b.Str("general.architecture", "llama").Str("tokenizer.ggml.model", "llama");
    if (with_tokens) b.StrArray("tokenizer.ggml.tokens", tokens);
    if (with_types) b.Array("tokenizer.ggml.token_type", GgufValueType::kInt32, types);
    for (const auto& [key, id] : ids) b.U32(key, id);
    b.Tensor("token_embd.weight", {4, embd_rows});
    return b.Build();
  }
};

absl::Status Check(const Vocab& target, const Vocab& draft) {
  const std::string t_bytes = target.Build(), d_bytes = draft.Build();
  auto t = ParseBytes(t_bytes);
  auto d = ParseBytes(d_bytes);
  PD_CHECK(t.ok() && d.ok());
  return CheckSameVocabulary(**t, **d);
}

TEST(VocabMatchTest, SameVocabularyIsOk) { PD_EXPECT_OK(Check(Vocab(), Vocab())); }

TEST(VocabMatchTest, MismatchesNameWhatDiffers) {
  struct Case {
    std::string name;
    std::function<void(Vocab&)> change;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"token string", [](Vocab& v) { v.tokens[4] = "c"; },
       "token 4 is \"b\" in the target and \"c\" in the draft"},
      {"escaped bytes", [](Vocab& v) { v.tokens[5] = "\n\t\x01"; },
       "token 5 is \"\xe2\x96\x81hello\" in the target and \"\\n\\t\\x01\" in the draft"},
      {"fewer tokens",
       [](Vocab& v) {
         v.tokens.pop_back();
         v.types.pop_back();
       },
       "the target has 6 tokens, the draft 5; token 5 (\"\xe2\x96\x81hello\") is only in the "
       "target"},
      {"more tokens",
       [](Vocab& v) {
         v.tokens.push_back("extra");
         v.types.push_back(1);
       },
       "the target has 6 tokens, the draft 7; token 6 (\"extra\") is only in the draft"},
      {"token type", [](Vocab& v) { v.types[2] = 1; },
       "token 2 (\"</s>\") has type 3 in the target and 1 in the draft"},
      {"special id", [](Vocab& v) { v.ids[1].second = 3; },
       "tokenizer.ggml.eos_token_id is 2 in the target and 3 in the draft"},
      {"special id only in the draft",
       [](Vocab& v) {
         v.ids.push_back({"tokenizer.ggml.eot_token_id", 2});
       },
       "tokenizer.ggml.eot_token_id is 2 in the draft and absent from the target"},
      {"special id only in the target", [](Vocab& v) { v.ids.pop_back(); },
       "tokenizer.ggml.unknown_token_id is 0 in the target and absent from the draft"},
      {"no token list", [](Vocab& v) { v.with_tokens = false; },
       "the target lists its tokens (tokenizer.ggml.tokens) and the draft does not"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    Vocab draft;
    c.change(draft);
    EXPECT_THAT(Check(Vocab(), draft), StatusIs(absl::StatusCode::kFailedPrecondition, c.message));
  }
}

TEST(VocabMatchTest, TypesAreComparedOnlyWhereBothListThem) {
  Vocab draft;
  draft.with_types = false;
  PD_EXPECT_OK(Check(Vocab(), draft));
}

TEST(VocabMatchTest, WithoutTokenListsTheEmbeddingRowsAreCompared) {
  Vocab a, b;
  a.with_tokens = b.with_tokens = false;
  a.with_types = b.with_types = false;
  PD_EXPECT_OK(Check(a, b));
  b.embd_rows = 7;
  EXPECT_THAT(Check(a, b), StatusIs(absl::StatusCode::kFailedPrecondition,
                                    "their embeddings have 6 (target) and 7 (draft) rows"));
}

}  // namespace
}  // namespace pd::engine
