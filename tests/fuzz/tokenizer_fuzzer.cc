// Fuzz target: the tokenizers (engine/tokenizer/tokenizer.h) on arbitrary bytes.
//
// Input: byte 0 picks the mode, byte 1 the flags (bit 0 add_special, 1 parse_special,
// 2 render_special, 3 clean_spaces, 4 remove_special), the rest is the payload.
//   mode 0-3  Encode the payload with one of the fuzz vocabularies (fuzz_vocab.h), then decode it
//   mode 4-7  decode the payload read as token ids (in range or not) with vocabulary mode - 4
//   mode 8    build a vocabulary from the payload (Tokenizer::FromGguf: SPM, BPE, Unigram with
//             a charsmap from the input, or WordPiece), then encode the rest
//
// What must hold, each from a promise of tokenizer.h:
//  - Encode gives ids in [0, n_vocab); with add_special it starts with BOS when the model adds
//    one; without parse_special it holds no control or unknown token but that BOS.
//  - StreamingDetokenizer emits valid UTF-8 only, and what it emits is Decode()'s text with
//    invalid sequences replaced (both strip the first token's leading space the same way).
//  - Round trips. SPM: "an invalid byte ends up as its byte token" and U+2581 is read as a space,
//    so text without U+2581 that is valid UTF-8 (or holds no space an invalid lead byte could
//    swallow) decodes back to itself. BPE: valid UTF-8 decodes back to itself; any other input is
//    normalised (overlong forms, U+FFFD) and the normalised text round-trips. With parse_special,
//    where no space prefix follows a special token (BPE, SPM without add_space_prefix), rendering
//    special tokens gives the text back too.
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/mapped_file.h"
#include "common/status.h"
#include "common/utf8.h"
#include "engine/model/gguf.h"
#include "engine/tokenizer/tokenizer.h"
#include "engine/tokenizer/unicode.h"
#include "tests/fuzz/fuzz_input.h"
#include "tests/fuzz/fuzz_targets.h"
#include "tests/fuzz/fuzz_vocab.h"
#include "tests/testing/gguf_builder.h"

namespace pd::fuzz {
namespace {

using engine::DecodeOptions;
using engine::StreamingDetokenizer;
using engine::Tokenizer;
using engine::TokenizerModel;
using engine::tokenizer_internal::SanitizeUtf8;

constexpr std::string_view kSpmSpace = "\xE2\x96\x81";

struct Flags {
  bool add_special, parse_special, render_special, clean_spaces, remove_special;
};

Flags ReadFlags(FuzzInput& in) {
  const uint8_t b = in.Byte();
  return Flags{(b & 1) != 0, (b & 2) != 0, (b & 4) != 0, (b & 8) != 0, (b & 16) != 0};
}

// Streams `ids` and checks every piece is valid UTF-8 and that the whole is Decode()'s text with
// invalid sequences replaced. Returns the streamed text.
std::string CheckStreaming(const Tokenizer& tok, const std::vector<int32_t>& ids,
                           bool render_special) {
  StreamingDetokenizer::Options opts;
  opts.render_special = render_special;
  opts.strip_leading_space = true;  // as Decode() does
  StreamingDetokenizer stream(tok, opts);
  std::string streamed;
  for (int32_t id : ids) {
    const std::string piece = stream.Push(id);
    PD_CHECK_MSG(IsValidUtf8(piece), "StreamingDetokenizer::Push emitted invalid UTF-8");
    streamed += piece;
  }
  const std::string tail = stream.Flush();
  PD_CHECK_MSG(IsValidUtf8(tail), "StreamingDetokenizer::Flush emitted invalid UTF-8");
  PD_CHECK(stream.pending_bytes() == 0);
  streamed += tail;
  DecodeOptions d;
  d.render_special = render_special;
  PD_CHECK_MSG(streamed == SanitizeUtf8(tok.Decode(ids, d)),
               "streamed text differs from the sanitized Decode()");
  return streamed;
}

// Decode with every option; only the absence of crashes is promised for the cleaned text.
void DecodeAllWays(const Tokenizer& tok, const std::vector<int32_t>& ids, const Flags& f) {
  DecodeOptions d;
  d.render_special = f.render_special;
  d.remove_special = f.remove_special;
  d.clean_spaces = f.clean_spaces;
  volatile size_t sink = tok.Decode(ids, d).size();
  for (int32_t id : ids) sink = sink + tok.TokenToPiece(id, f.render_special).size();
  (void)sink;
  CheckStreaming(tok, ids, f.render_special);
}

void CheckIds(const Tokenizer& tok, const std::vector<int32_t>& ids) {
  for (int32_t id : ids) PD_CHECK_MSG(tok.IsValid(id), "Encode produced an id out of range");
}

// A token that only parse_special (or add_special) may produce.
bool IsSpecial(const Tokenizer& tok, int32_t id) {
  return (tok.token_attrs(id) & (engine::TokenAttr::kControl | engine::TokenAttr::kUnknown)) != 0;
}

void FuzzText(FuzzVocab v, const Flags& f, std::string_view text) {
  const Tokenizer& tok = GetTokenizer(v);
  const std::vector<int32_t> ids = tok.Encode(text, f.add_special, f.parse_special);
  CheckIds(tok, ids);
  if (f.add_special && tok.add_bos()) {
    PD_CHECK_MSG(!ids.empty() && ids.front() == tok.bos(), "add_special: BOS missing");
  }
  if (f.add_special && tok.add_eos()) {
    PD_CHECK_MSG(!ids.empty() && ids.back() == tok.eos(), "add_special: EOS missing");
  }
  if (!f.parse_special) {
    const size_t skip = f.add_special && tok.add_bos() ? 1 : 0;
    for (size_t i = skip; i < ids.size(); ++i) {
      PD_CHECK_MSG(!IsSpecial(tok, ids[i]), "a special token without parse_special");
    }
  }
  DecodeAllWays(tok, ids, f);

  // Round trips (see the file comment), always without add_special: a kept BOS changes the
  // leading-space rule by design.
  const bool valid = IsValidUtf8(text);
  const std::vector<int32_t> plain = tok.Encode(text, false, false);
  if (tok.model() == TokenizerModel::kSpm) {
    const bool spm_exact = text.find(kSpmSpace) == std::string_view::npos &&
                           (valid || text.find(' ') == std::string_view::npos);
    if (spm_exact) {
      PD_CHECK_MSG(tok.Decode(plain) == text, "SPM: Decode(Encode(text)) != text");
    }
    if (spm_exact && !tok.add_space_prefix()) {
      DecodeOptions d;
      d.render_special = true;
      PD_CHECK_MSG(tok.Decode(tok.Encode(text, false, true), d) == text,
                   "SPM without space prefix: parse_special + render_special lose text");
    }
    return;
  }
  const std::string once = tok.Decode(plain);
  if (valid) {
    PD_CHECK_MSG(once == text, "BPE: Decode(Encode(text)) != text for valid UTF-8");
    DecodeOptions d;
    d.render_special = true;
    PD_CHECK_MSG(tok.Decode(tok.Encode(text, false, true), d) == text,
                 "BPE: parse_special + render_special lose text");
  } else {
    PD_CHECK_MSG(tok.Decode(tok.Encode(once, false, false)) == once,
                 "BPE: the normalised text does not round-trip");
  }
}

void FuzzIds(FuzzVocab v, const Flags& f, FuzzInput& in) {
  const Tokenizer& tok = GetTokenizer(v);
  std::vector<int32_t> ids;
  while (!in.empty()) {
    // Mostly ids of the vocabulary, some just outside it and a few anywhere.
    const uint16_t raw = in.Int<uint16_t>();
    if ((raw & 0xF000) == 0xF000) {
      ids.push_back(static_cast<int32_t>(in.Int<uint32_t>()));
    } else {
      ids.push_back(static_cast<int32_t>(raw % (tok.n_vocab() + 8)) - 4);
    }
  }
  DecodeAllWays(tok, ids, f);
}

// A vocabulary from the input: up to 64 tokens of up to 255 bytes with a type each, optional
// merges between them, special ids that may be out of range, then text to encode.
void FuzzVocabulary(const Flags& f, FuzzInput& in) {
  static const char* const kPre[] = {"",       "default",        "llama3",
                                     "qwen2",  "gpt-2",          "starcoder",
                                     "falcon", "deepseek-coder", "no-such-pre"};
  const uint8_t shape = in.Byte();
  // Bit 0: byte-level BPE; bit 7: Unigram; both: WordPiece.
  const bool bert = (shape & 1) && (shape & 128);
  const bool bpe = (shape & 1) && !bert;
  const bool t5 = !(shape & 1) && (shape & 128);
  std::vector<std::string> tokens;
  std::vector<int32_t> types;
  std::vector<float> scores;
  const size_t n = in.Pick(64);
  for (size_t i = 0; i < n && !in.empty(); ++i) {
    types.push_back(static_cast<int32_t>(in.Pick(8)));  // 7 is no TokenType
    scores.push_back(static_cast<float>(static_cast<int8_t>(in.Byte())));
    tokens.emplace_back(in.Short());
  }
  engine::testing::GgufBuilder b;
  b.Str("tokenizer.ggml.model", bpe ? "gpt2" : t5 ? "t5" : bert ? "bert" : "llama");
  if (t5) {
    // A precompiled charsmap from the input (mostly malformed: it must be refused cleanly) and
    // the whitespace flag.
    const std::string map = in.Bool() ? std::string(in.Bytes(in.Int<uint16_t>())) : std::string();
    if (!map.empty()) {
      b.Array<uint8_t>("tokenizer.ggml.precompiled_charsmap", engine::GgufValueType::kUint8,
                       std::vector<uint8_t>(map.begin(), map.end()));
    }
    b.Bool("tokenizer.ggml.remove_extra_whitespaces", in.Bool());
  }
  if (bert) {
    // The ids WordPiece needs (missing or out of range: refused cleanly) and its normalizer.
    if (in.Bool()) b.U32("tokenizer.ggml.unknown_token_id", in.Byte());
    if (in.Bool()) b.U32("tokenizer.ggml.seperator_token_id", in.Byte());
    b.Bool("tokenizer.ggml.normalizer.lowercase", in.Bool());
    b.Bool("tokenizer.ggml.normalizer.strip_accents", in.Bool());
  }
  if (bpe) b.Str("tokenizer.ggml.pre", kPre[in.Pick(std::size(kPre))]);
  b.StrArray("tokenizer.ggml.tokens", tokens);
  if (shape & 2) {
    b.Array<int32_t>("tokenizer.ggml.token_type", engine::GgufValueType::kInt32, types);
  }
  if (shape & 4) b.Array<float>("tokenizer.ggml.scores", engine::GgufValueType::kFloat32, scores);
  if (bpe && !tokens.empty()) {
    std::vector<std::string> merges;
    const size_t m = in.Pick(64);
    for (size_t i = 0; i < m; ++i) {
      merges.push_back(tokens[in.Pick(tokens.size())] + " " + tokens[in.Pick(tokens.size())]);
    }
    b.StrArray("tokenizer.ggml.merges", merges);
  }
  if (shape & 8) b.U32("tokenizer.ggml.bos_token_id", in.Byte());
  if (shape & 16) b.U32("tokenizer.ggml.eos_token_id", in.Byte());
  if (shape & 32) b.Bool("tokenizer.ggml.add_bos_token", in.Bool());
  if (shape & 64) b.Bool("tokenizer.ggml.add_space_prefix", in.Bool());
  const std::string bytes = b.Build();
  auto file = engine::GgufFile::Parse(MappedFile::Borrow(bytes.data(), bytes.size()));
  PD_CHECK_OK(file.status());  // the builder wrote a well-formed file
  absl::StatusOr<std::unique_ptr<Tokenizer>> tok = Tokenizer::FromGguf(**file);
  if (!tok.ok()) {
    PD_CHECK(tok.status().code() == absl::StatusCode::kInvalidArgument);
    PD_CHECK(!tok.status().message().empty());
    return;
  }
  const Tokenizer& t = **tok;
  PD_CHECK(t.n_vocab() == static_cast<int32_t>(tokens.size()));
  for (int32_t id : t.eog_ids()) PD_CHECK(t.IsValid(id) && t.IsEog(id));
  for (int32_t id : {t.bos(), t.eos(), t.eot(), t.eom(), t.unk(), t.pad(), t.sep()}) {
    PD_CHECK(id == engine::kNoToken || t.IsValid(id));
  }
  const std::vector<int32_t> ids = t.Encode(in.Rest(), f.add_special, f.parse_special);
  CheckIds(t, ids);
  if (bert && f.add_special) {
    PD_CHECK_MSG(ids.size() >= 2 && ids.front() == t.bos() && ids.back() == t.sep(),
                 "WordPiece: add_special must give [CLS] ... [SEP]");
  }
  DecodeAllWays(t, ids, f);
}

}  // namespace

int FuzzTokenizer(const uint8_t* data, size_t size) {
  FuzzInput in(data, size);
  const size_t mode = in.Pick(9);
  const Flags flags = ReadFlags(in);
  if (mode < 4) {
    FuzzText(static_cast<FuzzVocab>(mode), flags, in.Rest());
  } else if (mode < 8) {
    FuzzIds(static_cast<FuzzVocab>(mode - 4), flags, in);
  } else {
    FuzzVocabulary(flags, in);
  }
  return 0;
}

}  // namespace pd::fuzz
