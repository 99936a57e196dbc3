#include "engine/model/vocab_match.h"

#include <algorithm>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "common/strings.h"

namespace pd::engine {
namespace {

constexpr std::string_view kTokensKey = "tokenizer.ggml.tokens";
constexpr std::string_view kTypesKey = "tokenizer.ggml.token_type";

absl::Status Mismatch(std::string_view what) {
  return absl::FailedPreconditionError(
      pd::StrCat("the draft model's vocabulary differs from the target's: ", what));
}

// A token string for a message: quoted, with control bytes escaped, cut at 40 bytes.
std::string Quote(std::string_view s) {
  std::string out = "\"";
  for (size_t i = 0; i < s.size() && i < 40; ++i) {
    const unsigned char ch = static_cast<unsigned char>(s[i]);
    if (ch == '\n') {
      out += "\\n";
    } else if (ch == '\t') {
      out += "\\t";
    } else if (ch == '"' || ch == '\\') {
      out += '\\';
      out += static_cast<char>(ch);
    } else if (ch < 0x20 || ch == 0x7f) {
      static const char kHex[] = "0123456789abcdef";
      out += "\\x";
      out += kHex[ch >> 4];
      out += kHex[ch & 15];
    } else {
      out += static_cast<char>(ch);
    }
  }
  if (s.size() > 40) out += "...";
  return out + "\"";
}

int64_t EmbeddingRows(const GgufFile& f) {
  const GgufTensorInfo* t = f.FindTensor("token_embd.weight");
  return t == nullptr || t->shape.size() != 2 ? -1 : t->shape[1];
}

bool IsSpecialIdKey(std::string_view key) {
  constexpr std::string_view kPrefix = "tokenizer.ggml.", kSuffix = "_token_id";
  return key.size() > kPrefix.size() + kSuffix.size() && key.substr(0, kPrefix.size()) == kPrefix &&
         key.substr(key.size() - kSuffix.size()) == kSuffix;
}

}  // namespace

absl::Status CheckSameVocabulary(const GgufFile& target, const GgufFile& draft) {
  const bool t_has = target.Has(kTokensKey), d_has = draft.Has(kTokensKey);
  if (t_has != d_has) {
    return Mismatch(pd::StrCat("the ", t_has ? "target" : "draft", " lists its tokens (",
                               kTokensKey, ") and the ", t_has ? "draft" : "target", " does not"));
  }
  if (!t_has) {
    const int64_t t_rows = EmbeddingRows(target), d_rows = EmbeddingRows(draft);
    if (t_rows != d_rows) {
      return Mismatch(pd::StrCat("neither lists its tokens, and their embeddings have ", t_rows,
                                 " (target) and ", d_rows, " (draft) rows"));
    }
  } else {
    PD_ASSIGN_OR_RETURN(const std::vector<std::string_view> t_tokens,
                        target.GetStringArray(kTokensKey));
    PD_ASSIGN_OR_RETURN(const std::vector<std::string_view> d_tokens,
                        draft.GetStringArray(kTokensKey));
    const size_t n = std::min(t_tokens.size(), d_tokens.size());
    for (size_t i = 0; i < n; ++i) {
      if (t_tokens[i] != d_tokens[i]) {
        return Mismatch(pd::StrCat("token ", i, " is ", Quote(t_tokens[i]), " in the target and ",
                                   Quote(d_tokens[i]), " in the draft"));
      }
    }
    if (t_tokens.size() != d_tokens.size()) {
      const bool t_longer = t_tokens.size() > d_tokens.size();
      return Mismatch(pd::StrCat("the target has ", t_tokens.size(), " tokens, the draft ",
                                 d_tokens.size(), "; token ", n, " (",
                                 Quote(t_longer ? t_tokens[n] : d_tokens[n]), ") is only in the ",
                                 t_longer ? "target" : "draft"));
    }
    if (target.Has(kTypesKey) && draft.Has(kTypesKey)) {
      PD_ASSIGN_OR_RETURN(const std::vector<int64_t> t_types, target.GetIntArray(kTypesKey));
      PD_ASSIGN_OR_RETURN(const std::vector<int64_t> d_types, draft.GetIntArray(kTypesKey));
      const size_t m = std::min({t_types.size(), d_types.size(), t_tokens.size()});
      for (size_t i = 0; i < m; ++i) {
        if (t_types[i] != d_types[i]) {
          return Mismatch(pd::StrCat("token ", i, " (", Quote(t_tokens[i]), ") has type ",
                                     t_types[i], " in the target and ", d_types[i],
                                     " in the draft"));
        }
      }
      if (t_types.size() != d_types.size()) {
        return Mismatch(pd::StrCat(kTypesKey, " has ", t_types.size(),
                                   " entries in the target and ", d_types.size(), " in the draft"));
      }
    }
  }
  // Special ids: every *_token_id key of either file.
  std::set<std::string_view> keys;
  for (const GgufFile* f : {&target, &draft}) {
    for (const auto& [key, value] : f->metadata()) {
      if (IsSpecialIdKey(key)) keys.insert(key);
    }
  }
  for (std::string_view key : keys) {
    const bool in_t = target.Has(key), in_d = draft.Has(key);
    if (in_t != in_d) {
      auto v = (in_t ? target : draft).GetInt(key);
      return Mismatch(pd::StrCat(key, " is ", v.ok() ? pd::StrCat(*v) : "set", " in the ",
                                 in_t ? "target" : "draft", " and absent from the ",
                                 in_t ? "draft" : "target"));
    }
    PD_ASSIGN_OR_RETURN(const int64_t t_id, target.GetInt(key));
    PD_ASSIGN_OR_RETURN(const int64_t d_id, draft.GetInt(key));
    if (t_id != d_id) {
      return Mismatch(pd::StrCat(key, " is ", t_id, " in the target and ", d_id, " in the draft"));
    }
  }
  return absl::OkStatus();
}

}  // namespace pd::engine
