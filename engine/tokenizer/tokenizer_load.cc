// Loading: a Tokenizer built from GGUF metadata (vocabulary, scores, token types, merges,
// special-token ids) and llama.cpp's post-load fix-ups of token attributes. Encoding and decoding
// are in tokenizer.cc, the encoders of each model in spm.cc, bpe.cc, ugm.cc and wpm.cc.
#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <initializer_list>
#include <utility>

#include "common/status.h"
#include "common/strings.h"
#include "engine/tokenizer/pretokenizer.h"
#include "engine/tokenizer/tokenizer.h"
#include "engine/tokenizer/ugm.h"
#include "engine/tokenizer/unicode.h"
#include "engine/tokenizer/wpm.h"

namespace pd::engine {
namespace {

using tokenizer_internal::PreTokenizerSpec;

constexpr std::string_view kSpaceEscape = "\xE2\x96\x81";  // U+2581, SentencePiece's space

// GGUF keys.
constexpr std::string_view kKeyModel = "tokenizer.ggml.model";
constexpr std::string_view kKeyPre = "tokenizer.ggml.pre";
constexpr std::string_view kKeyTokens = "tokenizer.ggml.tokens";
constexpr std::string_view kKeyScores = "tokenizer.ggml.scores";
constexpr std::string_view kKeyTypes = "tokenizer.ggml.token_type";
constexpr std::string_view kKeyMerges = "tokenizer.ggml.merges";
constexpr std::string_view kKeyAddBos = "tokenizer.ggml.add_bos_token";
constexpr std::string_view kKeyAddEos = "tokenizer.ggml.add_eos_token";
constexpr std::string_view kKeyAddSep = "tokenizer.ggml.add_sep_token";
constexpr std::string_view kKeyAddPrefix = "tokenizer.ggml.add_space_prefix";

// Token texts by which llama.cpp recognises special tokens that the GGUF does not name by id.
// When a vocabulary has several candidates, the first one in list order wins (so a chat model's
// turn-end token beats <|endoftext|>). llama.cpp takes whichever its hash map yields first, which
// can differ; every EOT candidate is an EOG token either way, so IsEog() is unaffected.
// clang-format off
const std::initializer_list<std::string_view> kEotTexts = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>",
    "<EOT>", "_<EOT>", "[EOT]", "<｜end▁of▁sentence｜>", "<end_of_utterance>"};
const std::initializer_list<std::string_view> kEomTexts = {"<|eom_id|>"};
const std::initializer_list<std::string_view> kFimPreTexts = {
    "<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>",
    "<PRE>",          "▁<PRE>",       "<|code_prefix|>", "<|prefix|>"};
const std::initializer_list<std::string_view> kFimSufTexts = {
    "<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>",
    "<SUF>",          "▁<SUF>",       "<|code_suffix|>", "<|suffix|>"};
const std::initializer_list<std::string_view> kFimMidTexts = {
    "<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>",
    "<MID>",          "▁<MID>",       "<|code_middle|>", "<|middle|>"};
const std::initializer_list<std::string_view> kFimPadTexts = {"<|fim_pad|>", "<fim-pad>",
                                                               "<fim_pad>", "<PAD>", "[PAD]"};
const std::initializer_list<std::string_view> kFimRepTexts = {
    "<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"};
const std::initializer_list<std::string_view> kFimSepTexts = {"<|file_sep|>"};
// Tokens that end generation wherever they appear in a vocabulary.
const std::initializer_list<std::string_view> kEogTexts = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
    "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
    "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
    "<｜end▁of▁sentence｜>", "[e~["};
// clang-format on

bool IsOneOf(std::string_view s, std::initializer_list<std::string_view> set) {
  for (std::string_view x : set) {
    if (s == x) return true;
  }
  return false;
}

uint32_t AttrsOfType(TokenType type) {
  switch (type) {
    case TokenType::kNormal:
      return TokenAttr::kNormal;
    case TokenType::kUnknown:
      return TokenAttr::kUnknown;
    case TokenType::kControl:
      return TokenAttr::kControl;
    case TokenType::kUserDefined:
      return TokenAttr::kUserDefined;
    case TokenType::kUnused:
      return TokenAttr::kUnused;
    case TokenType::kByte:
      return TokenAttr::kByte;
    case TokenType::kUndefined:
      return TokenAttr::kUndefined;
  }
  return TokenAttr::kUndefined;
}

void ReplaceAll(std::string* s, std::string_view from, std::string_view to) {
  std::string out;
  out.reserve(s->size());
  size_t pos = 0;
  while (true) {
    const size_t hit = s->find(from.data(), pos, from.size());
    if (hit == std::string::npos) break;
    out.append(*s, pos, hit - pos);
    out.append(to);
    pos = hit + from.size();
  }
  out.append(*s, pos, std::string::npos);
  s->swap(out);
}

// The byte a `<0xXX>` token stands for (hex digits at offset 3, parsed like strtol).
uint8_t ByteOfByteToken(const std::string& text) {
  const std::string hex = text.size() > 3 ? text.substr(3, 2) : std::string();
  return static_cast<uint8_t>(std::strtol(hex.c_str(), nullptr, 16));
}

// Maps a byte-level BPE token back to bytes. A code point outside the byte alphabet is rendered
// as "[UNK_BYTE_0x<its utf-8 in hex><token text>]", llama.cpp's marker.
std::string DecodeByteLevel(const std::string& text) {
  std::string out;
  for (uint32_t cpt : tokenizer_internal::DecodeUtf8Lenient(text)) {
    const int b = tokenizer_internal::UnicodeToByte(cpt);
    if (b >= 0) {
      out.push_back(static_cast<char>(b));
      continue;
    }
    std::string utf8;
    tokenizer_internal::AppendUtf8(cpt <= 0x10FFFF ? cpt : tokenizer_internal::kReplacementChar,
                                   &utf8);
    out += "[UNK_BYTE_0x";
    static constexpr char kHex[] = "0123456789abcdef";
    for (unsigned char c : utf8) {
      out.push_back(kHex[c >> 4]);
      out.push_back(kHex[c & 15]);
    }
    out += text;
    out += "]";
  }
  return out;
}

absl::Status Invalid(std::string_view key, const absl::Status& cause) {
  return absl::InvalidArgumentError(StrCat(key, ": ", std::string(cause.message())));
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Loading

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromGguf(const GgufFile& gguf) {
  std::unique_ptr<Tokenizer> tok(new Tokenizer());
  PD_RETURN_IF_ERROR(tok->Load(gguf));
  return tok;
}

Tokenizer::~Tokenizer() = default;

absl::Status Tokenizer::Load(const GgufFile& gguf) {
  // ---- kind ----
  if (!gguf.Has(kKeyModel)) {
    return absl::InvalidArgumentError("no tokenizer in this GGUF: tokenizer.ggml.model is missing");
  }
  absl::StatusOr<std::string_view> model = gguf.GetString(kKeyModel);
  if (!model.ok()) return Invalid(kKeyModel, model.status());
  if (gguf.Has(kKeyPre)) {
    absl::StatusOr<std::string_view> pre = gguf.GetString(kKeyPre);
    if (!pre.ok()) return Invalid(kKeyPre, pre.status());
    pre_ = std::string(*pre);
  }
  PreTokenizerSpec spec;
  if (*model == "llama") {
    model_ = TokenizerModel::kSpm;
    bos_ = 1;
    eos_ = 2;
    unk_ = 0;
    add_space_prefix_ = true;
    add_bos_ = true;
    clean_spaces_ = false;
  } else if (*model == "gpt2" || *model == "gemma4") {
    model_ = TokenizerModel::kBpe;
    // Gemma 4's model name implies its pre-tokenizer, and no default special tokens.
    const bool gemma4 = *model == "gemma4";
    if (gemma4) pre_ = "gemma4";
    PD_ASSIGN_OR_RETURN(spec, tokenizer_internal::PreTokenizerSpecFor(pre_));
    bos_ = spec.bos_disabled || gemma4 ? kNoToken : 11;
    eos_ = gemma4 ? kNoToken : 11;
    add_space_prefix_ = false;
    add_bos_ = spec.add_bos;
    clean_spaces_ = spec.clean_spaces;
    ignore_merges_ = spec.ignore_merges;
    byte_encode_ = spec.byte_encode;
    escape_spaces_ = spec.escape_spaces;
    whole_newline_runs_ = spec.whole_newline_runs;
    force_add_bos_ = spec.force_add_bos;
    add_sep_ = spec.add_sep;
  } else if (*model == "t5") {
    // llama.cpp's defaults for its UGM vocabularies (T5's ids); no space prefix unless the key
    // says so.
    model_ = TokenizerModel::kUgm;
    bos_ = kNoToken;
    eos_ = 1;
    unk_ = 2;
    pad_ = 0;
    add_space_prefix_ = false;
    add_bos_ = false;
    add_eos_ = true;
    clean_spaces_ = false;
  } else if (*model == "bert") {
    // llama.cpp's WPM defaults, BERT's ids: [CLS] 101 as BOS, [UNK] 100, [SEP] 102, [PAD] 0; no
    // EOS.
    model_ = TokenizerModel::kWpm;
    bos_ = 101;
    eos_ = kNoToken;
    unk_ = 100;
    sep_ = 102;
    pad_ = 0;
    add_space_prefix_ = false;
    add_bos_ = true;
    add_eos_ = false;
    add_sep_ = true;
    clean_spaces_ = true;
  } else {
    return absl::InvalidArgumentError(StrCat("unsupported tokenizer.ggml.model '", *model,
                                             "' (supported: llama, gpt2, gemma4, t5, bert)"));
  }
  if (gguf.Has(kKeyAddPrefix)) {
    absl::StatusOr<bool> v = gguf.GetBool(kKeyAddPrefix);
    if (!v.ok()) return Invalid(kKeyAddPrefix, v.status());
    add_space_prefix_ = *v;
  }

  // ---- vocabulary ----
  if (!gguf.Has(kKeyTokens)) {
    return absl::InvalidArgumentError("tokenizer.ggml.tokens is missing");
  }
  absl::StatusOr<std::vector<std::string_view>> texts = gguf.GetStringArray(kKeyTokens);
  if (!texts.ok()) return Invalid(kKeyTokens, texts.status());
  const size_t n = texts->size();
  if (n == 0) return absl::InvalidArgumentError("tokenizer.ggml.tokens is empty");
  if (n > static_cast<size_t>(INT32_MAX / 2)) {
    return absl::InvalidArgumentError(StrCat("tokenizer.ggml.tokens: too many tokens (", n, ")"));
  }
  std::vector<float> scores;
  if (gguf.Has(kKeyScores)) {
    absl::StatusOr<std::vector<float>> v = gguf.GetFloatArray(kKeyScores);
    if (!v.ok()) return Invalid(kKeyScores, v.status());
    if (v->size() != n) {
      return absl::InvalidArgumentError(
          StrCat("tokenizer.ggml.scores has ", v->size(), " entries but there are ", n, " tokens"));
    }
    scores = std::move(*v);
  }
  std::vector<int64_t> types;
  if (gguf.Has(kKeyTypes)) {
    absl::StatusOr<std::vector<int64_t>> v = gguf.GetIntArray(kKeyTypes);
    if (!v.ok()) return Invalid(kKeyTypes, v.status());
    if (v->size() != n) {
      return absl::InvalidArgumentError(StrCat("tokenizer.ggml.token_type has ", v->size(),
                                               " entries but there are ", n, " tokens"));
    }
    types = std::move(*v);
  }
  tokens_.resize(n);
  text_to_id_.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    Token& t = tokens_[i];
    t.text = std::string((*texts)[i]);
    if (t.text.empty()) t.text = StrCat("[EMPTY_", i, "]");  // llama.cpp's placeholder
    if (!scores.empty()) t.score = scores[i];
    if (!types.empty()) {
      const int64_t ty = types[i];
      t.type = ty >= 0 && ty <= 6 ? static_cast<TokenType>(ty) : TokenType::kUndefined;
    }
    t.attrs = AttrsOfType(t.type);
    const auto [it, inserted] = text_to_id_.emplace(t.text, static_cast<int32_t>(i));
    if (!inserted) {
      return absl::InvalidArgumentError(StrCat("duplicate token in vocabulary: ids ", it->second,
                                               " and ", i, " are both '", t.text, "'"));
    }
  }

  // ---- merges (BPE) ----
  if (model_ == TokenizerModel::kBpe) {
    if (!gguf.Has(kKeyMerges)) {
      return absl::InvalidArgumentError("tokenizer.ggml.merges is missing (needed for BPE)");
    }
    absl::StatusOr<std::vector<std::string_view>> merges = gguf.GetStringArray(kKeyMerges);
    if (!merges.ok()) return Invalid(kKeyMerges, merges.status());
    merge_rank_.reserve(merges->size());
    for (size_t r = 0; r < merges->size(); ++r) {
      const std::string_view m = (*merges)[r];
      // "left right", split at the first space after the first byte; the first entry of a
      // duplicate pair wins.
      const size_t sp = m.size() > 1 ? m.find(' ', 1) : std::string_view::npos;
      if (sp == std::string_view::npos) continue;  // malformed: can never match
      merge_rank_.emplace(std::string(m), static_cast<int32_t>(r));
    }
    PD_ASSIGN_OR_RETURN(pre_tokenizer_, tokenizer_internal::PreTokenizer::Create(spec.patterns));
  }

  PD_RETURN_IF_ERROR(LoadSpecialIds(gguf));
  DetectSpecialTokens(gguf);

  // ---- caches ----
  for (int32_t id = 0; id < n_vocab(); ++id) tokens_[id].piece = ComputePiece(id);
  for (int32_t id = 0; id < n_vocab(); ++id) {
    constexpr uint32_t kSpecial =
        TokenAttr::kControl | TokenAttr::kUserDefined | TokenAttr::kUnknown;
    if (tokens_[id].attrs & kSpecial) special_tokens_.push_back(id);
  }
  std::stable_sort(special_tokens_.begin(), special_tokens_.end(), [&](int32_t a, int32_t b) {
    return tokens_[a].text.size() > tokens_[b].text.size();
  });
  byte_token_.fill(kNoToken);
  if (model_ == TokenizerModel::kSpm) {
    spm_split_at_spaces_ = true;
    for (const Token& t : tokens_) {
      std::string_view rest = t.text;
      while (rest.substr(0, kSpaceEscape.size()) == kSpaceEscape)
        rest.remove_prefix(kSpaceEscape.size());
      if (rest.find(kSpaceEscape) != std::string_view::npos) {
        spm_split_at_spaces_ = false;
        break;
      }
    }
    static constexpr char kHex[] = "0123456789ABCDEF";
    for (int b = 0; b < 256; ++b) {
      const std::string name = {'<', '0', 'x', kHex[b >> 4], kHex[b & 15], '>'};
      int32_t id = Find(name);
      if (id == kNoToken) id = Find(std::string(1, static_cast<char>(b)));
      byte_token_[b] = id;
    }
  }
  if (model_ == TokenizerModel::kUgm) PD_RETURN_IF_ERROR(LoadUgm(gguf));
  if (model_ == TokenizerModel::kWpm) PD_RETURN_IF_ERROR(LoadWpm(gguf));
  return absl::OkStatus();
}

absl::Status Tokenizer::LoadSpecialIds(const GgufFile& gguf) {
  const int32_t n = n_vocab();
  // Defaults that do not fit this vocabulary are dropped, as in llama.cpp.
  for (int32_t* id : {&bos_, &eos_, &unk_, &pad_, &sep_}) {
    if (*id >= n) *id = kNoToken;
  }
  const std::pair<std::string_view, int32_t*> keys[] = {
      {"tokenizer.ggml.bos_token_id", &bos_},
      {"tokenizer.ggml.eos_token_id", &eos_},
      {"tokenizer.ggml.eot_token_id", &eot_},
      {"tokenizer.ggml.eom_token_id", &eom_},
      {"tokenizer.ggml.unknown_token_id", &unk_},
      {"tokenizer.ggml.padding_token_id", &pad_},
      {"tokenizer.ggml.seperator_token_id", &sep_},  // sic: llama.cpp's spelling
      {"tokenizer.ggml.fim_pre_token_id", &fim_pre_},
      {"tokenizer.ggml.fim_suf_token_id", &fim_suf_},
      {"tokenizer.ggml.fim_mid_token_id", &fim_mid_},
      {"tokenizer.ggml.fim_pad_token_id", &fim_pad_},
      {"tokenizer.ggml.fim_rep_token_id", &fim_rep_},
      {"tokenizer.ggml.fim_sep_token_id", &fim_sep_},
      {"tokenizer.ggml.prefix_token_id", &fim_pre_},  // older names
      {"tokenizer.ggml.suffix_token_id", &fim_suf_},
      {"tokenizer.ggml.middle_token_id", &fim_mid_},
  };
  for (const auto& [key, id] : keys) {
    if (!gguf.Has(key)) continue;
    absl::StatusOr<uint64_t> v = gguf.GetUint(key);
    if (!v.ok()) return Invalid(key, v.status());
    // llama.cpp only warns and keeps the default here; an id that names no token is a broken
    // file, so we refuse it.
    if (*v >= static_cast<uint64_t>(n)) {
      return absl::InvalidArgumentError(
          StrCat(key, " = ", *v, " is out of range: the vocabulary has ", n, " tokens"));
    }
    *id = static_cast<int32_t>(*v);
  }
  for (const auto& [key, flag] : {std::pair<std::string_view, bool*>{kKeyAddBos, &add_bos_},
                                  {kKeyAddEos, &add_eos_},
                                  {kKeyAddSep, &add_sep_}}) {
    if (!gguf.Has(key)) continue;
    absl::StatusOr<bool> v = gguf.GetBool(key);
    if (!v.ok()) return Invalid(key, v.status());
    *flag = *v;
  }
  if (force_add_bos_ && bos_ != kNoToken) add_bos_ = true;
  // WordPiece adds [CLS] and [SEP] whatever add_bos/add_eos say (LoadWpm names what such a
  // vocabulary lacks), as llama.cpp does.
  const bool wpm = model_ == TokenizerModel::kWpm;
  if (add_bos_ && bos_ == kNoToken && !wpm) {
    return absl::InvalidArgumentError(
        "tokenizer.ggml.add_bos_token is true but there is no BOS token");
  }
  if (add_eos_ && eos_ == kNoToken && !wpm) {
    return absl::InvalidArgumentError(
        "tokenizer.ggml.add_eos_token is true but there is no EOS token");
  }
  return absl::OkStatus();
}

// Mirrors llama.cpp's post-load fix-ups of token attributes and its EOG set.
void Tokenizer::DetectSpecialTokens(const GgufFile& gguf) {
  const int32_t n = n_vocab();
  auto detect = [&](int32_t* slot, std::initializer_list<std::string_view> texts) {
    if (*slot != kNoToken) return;
    for (std::string_view text : texts) {
      const int32_t id = Find(text);
      if (id != kNoToken) {
        *slot = id;
        tokens_[id].attrs |= TokenAttr::kControl;
        return;
      }
    }
  };
  detect(&eot_, kEotTexts);
  detect(&eom_, kEomTexts);
  detect(&fim_pre_, kFimPreTexts);
  detect(&fim_suf_, kFimSufTexts);
  detect(&fim_mid_, kFimMidTexts);
  detect(&fim_pad_, kFimPadTexts);
  detect(&fim_rep_, kFimRepTexts);
  detect(&fim_sep_, kFimSepTexts);

  // Control tokens named "...unused..." are unused.
  for (Token& t : tokens_) {
    if ((t.attrs & TokenAttr::kControl) && t.text.find("unused") != std::string::npos) {
      t.attrs |= TokenAttr::kUnused;
    }
  }

  // End-of-generation set.
  std::vector<bool> eog(n, false);
  for (int32_t id : {fim_pad_, fim_rep_, fim_sep_}) {
    if (id != kNoToken) eog[id] = true;
  }
  for (int32_t id = 0; id < n; ++id) {
    Token& t = tokens_[id];
    if (IsOneOf(t.text, kEogTexts)) {
      eog[id] = true;
      t.attrs |= TokenAttr::kControl;
    }
    // gpt-oss's channel markers are always rendered.
    if (IsOneOf(t.text, {"<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"})) {
      t.attrs = TokenAttr::kUserDefined;
    }
  }
  for (int32_t id : {eos_, eot_, eom_}) {
    if (id != kNoToken) eog[id] = true;
  }
  // o200k_harmony / solar-open: "<|end|>" ends a message, not the generation.
  {
    bool has_return = false, has_call = false, has_flush = false;
    int32_t end_id = kNoToken;
    for (int32_t id = 0; id < n; ++id) {
      if (!eog[id]) continue;
      const std::string& text = tokens_[id].text;
      if (text == "<|return|>") has_return = true;
      if (text == "<|call|>" || text == "<|calls|>") has_call = true;
      if (text == "<|flush|>") has_flush = true;
      if (text == "<|end|>") end_id = id;
    }
    if (end_id != kNoToken && has_call && (has_return || has_flush)) {
      eog[end_id] = false;
      tokens_[end_id].attrs = TokenAttr::kUserDefined;
    }
  }
  // Gemma 4 / PaddleOCR: "</s>" is an ordinary token when "<|tool_response>" is an EOG token.
  {
    int32_t s_id = kNoToken;
    bool has_tool_response = false;
    for (int32_t id = 0; id < n; ++id) {
      if (!eog[id]) continue;
      if (tokens_[id].text == "<|tool_response>") has_tool_response = true;
      if (tokens_[id].text == "</s>") s_id = id;
    }
    if (has_tool_response && s_id != kNoToken) {
      eog[s_id] = false;
      tokens_[s_id].attrs = TokenAttr::kNormal;
    }
  }
  for (int32_t id = 0; id < n; ++id) {
    tokens_[id].eog = eog[id];
    if (eog[id]) eog_ids_.push_back(id);
  }

  // Whitespace-eating tokens, chosen by model name as llama.cpp does.
  auto get = [&](std::string_view key) {
    absl::StatusOr<std::string_view> v = gguf.GetString(key);
    return v.ok() ? std::string(*v) : std::string();
  };
  std::string name = get("general.name");
  std::transform(name.begin(), name.end(), name.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  const std::string arch = get("general.architecture");
  auto contains = [](const std::string& s, std::initializer_list<std::string_view> subs) {
    for (std::string_view sub : subs) {
      if (s.find(sub) != std::string::npos) return true;
    }
    return false;
  };
  auto set_attr = [&](std::string_view text, uint32_t attr, bool on) {
    const int32_t id = Find(text);
    if (id == kNoToken) return;
    tokens_[id].attrs = on ? (tokens_[id].attrs | attr) : (tokens_[id].attrs & ~attr);
  };
  if (contains(pre_, {"jina-v2-de", "jina-v2-es", "jina-v2-code"}) ||
      contains(arch, {"nomic-bert-moe", "jina-bert-v3"})) {
    set_attr("<mask>", TokenAttr::kLstrip, true);
  } else if (contains(name, {"phi-3", "phi3"})) {
    for (Token& t : tokens_) {
      if (t.attrs & (TokenAttr::kControl | TokenAttr::kUserDefined | TokenAttr::kUnknown)) {
        t.attrs |= TokenAttr::kRstrip;
      }
    }
    set_attr("</s>", TokenAttr::kRstrip, true);
    for (std::string_view t : {"<unk>", "<s>", "<|endoftext|>"}) {
      set_attr(t, TokenAttr::kRstrip, false);
    }
  } else if (contains(name, {"modern-bert"})) {
    set_attr("[MASK]", TokenAttr::kLstrip, true);
  }
}

std::string Tokenizer::ComputePiece(int32_t id) const {
  const Token& t = tokens_[id];
  if (t.attrs & (TokenAttr::kUnknown | TokenAttr::kControl | TokenAttr::kUserDefined)) {
    return t.text;
  }
  if (t.attrs & TokenAttr::kNormal) {
    if (model_ == TokenizerModel::kBpe && !escape_spaces_) return DecodeByteLevel(t.text);
    std::string s = t.text;
    ReplaceAll(&s, kSpaceEscape, " ");
    return s;
  }
  if (t.attrs & TokenAttr::kByte) return std::string(1, static_cast<char>(ByteOfByteToken(t.text)));
  return std::string();  // unused / undefined
}

int32_t Tokenizer::Find(std::string_view text) const {
  const auto it = text_to_id_.find(ToAbsl(text));
  return it == text_to_id_.end() ? kNoToken : it->second;
}

}  // namespace pd::engine
