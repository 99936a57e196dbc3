#include "engine/tokenizer/pretokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>

#include "common/log.h"
#include "common/status.h"
#include "common/strings.h"

namespace pd::engine::tokenizer_internal {
namespace {

// ---- patterns ---------------------------------------------------------------------------------
//
// Written in the regex dialect llama.cpp's tables use, with its meaning (Rewrite turns them into
// PCRE2): llama.cpp's rewrites of the Hugging Face patterns (case-insensitive contractions spelled
// out, possessive quantifiers made greedy, \p{Lu} and \p{Ll} classes expressed with lookaheads)
// are what it runs, so they are what we run. Built from shared pieces where the rows share them.

// English contractions, case-insensitive, spelled with ASCII classes (llama.cpp's tolower never
// maps a non-ASCII letter onto one of these letters).
#define PD_CONTRACTIONS R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD]))"
// GPT-2's split without its lookahead tail, and with it.
#define PD_GPT2_CORE R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+)"
constexpr const char* kGpt2 = PD_GPT2_CORE R"(|\s+(?!\S))";
// Line breaks and whitespace as tiktoken-style patterns end.
#define PD_TIKTOKEN_SPACE R"(|\s*[\r\n]+|\s+(?!\S)|\s+)"
// A tiktoken-style pattern: contractions, a letter run with one optional non-letter prefix, a
// digit group `digits`, a punctuation run with trailing line breaks, whitespace.
#define PD_TIKTOKEN(digits)                                                            \
  PD_CONTRACTIONS R"(|[^\r\n\p{L}\p{N}]?\p{L}+|)" digits R"(| ?[^\s\p{L}\p{N}]+[\r\n]*)" \
      PD_TIKTOKEN_SPACE
constexpr const char* kLlama3 = PD_TIKTOKEN(R"(\p{N}{1,3})");
constexpr const char* kQwen2 = PD_TIKTOKEN(R"(\p{N})");
constexpr const char* kMiniCpm5 = PD_TIKTOKEN(R"(\p{N}+)");
// Jais 2: Llama 3 with whitespace runs cut into power-of-two lengths.
constexpr const char* kJais2 =
    PD_CONTRACTIONS R"(|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+)"
    R"(|\s{512}(?!\S)|\s{256}(?!\S)|\s{128}(?!\S)|\s{64}(?!\S)|\s{32}(?!\S)|\s{16}(?!\S))"
    R"(|\s{8}(?!\S)|\s{4}(?!\S)|\s{1,2}(?!\S)|\s{1})";
// Qwen 3.5: letters keep their combining marks.
constexpr const char* kQwen35 =
    PD_CONTRACTIONS R"(|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*)"
    PD_TIKTOKEN_SPACE;
// Seed-Coder: punctuation runs stop at line breaks.
constexpr const char* kSeedCoder =
    PD_CONTRACTIONS R"(|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+)" PD_TIKTOKEN_SPACE;
// Qwen 2 without contractions (Turkish suffixes after an apostrophe stay with their word).
constexpr const char* kUfakzeka =
    R"([^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*)" PD_TIKTOKEN_SPACE;
// Bailing MoE: Qwen 2 with single line breaks.
constexpr const char* kBailing =
    R"('(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N})"
    R"(| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+)";
// EXAONE MoE: a letter run may hold single spaces between letters.
constexpr const char* kExaoneMoe =
    PD_CONTRACTIONS R"(|[^\r\n\p{L}\p{N}]?(?:\p{L}\p{M}*(?: \p{L}\p{M}*)*)+|\p{N})"
    R"(| ?[^\s\p{L}\p{N}]+[\r\n/]?|\s*[\r\n]|\s+(?!\S)|\s+)";
// Upper-then-lower letter runs (tiktoken's o200k: GPT-4o, Llama 4), in llama.cpp's lookahead
// form: "a letter that is not a-z" for the upper-case class, "not A-Z" for the lower-case one.
// `letter` is the class a letter comes from; `tail` follows each run (contractions or nothing).
#define PD_CASED_RUNS(letter, tail)                                                        \
  R"([^\r\n\p{L}\p{N}]?((?=[)" letter R"(])([^a-z]))*((?=[)" letter R"(])([^A-Z]))+)" tail \
  R"(|[^\r\n\p{L}\p{N}]?((?=[)" letter R"(])([^a-z]))+((?=[)" letter R"(])([^A-Z]))*)" tail
#define PD_O200K(letter)                                                                  \
  PD_CASED_RUNS(letter, PD_CONTRACTIONS "?") R"(|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*)" \
      PD_TIKTOKEN_SPACE
constexpr const char* kGpt4o = PD_O200K(R"(\p{L})");
constexpr const char* kGraniteMulti = PD_O200K(R"(\p{L}\p{M})");
// Mistral's Tekken: o200k's runs without contractions, single digits.
constexpr const char* kTekken =
    PD_CASED_RUNS(R"(\p{L})", "") R"(|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*)" PD_TIKTOKEN_SPACE;
// Tiny Aya: digit groups of three from the right, then the cased runs in their class form.
#define PD_AYA_CASED(tail)                                                                      \
  R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+)" tail        \
      R"(|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*)" tail
constexpr const char* kTinyAya = PD_AYA_CASED(PD_CONTRACTIONS "?")
    R"(|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*)" PD_TIKTOKEN_SPACE;
// Youtu: CJK and Hangul runs first, then Tiny Aya's cased runs with single digits.
constexpr const char* kYoutuCjk =
    "[\uAC00-\uD7A3\u3131-\u318E]+|[\uFF01\u2026\u201C\u201D\u2018\u2019\u2014\uFF1A\uFF1B"
    "\uFF0C\u3001-\u303F\uFE30-\uFE4F]+|[\u3105-\u312F]+|[\u4E00-\u9FA5\u3040-\u309F\u30A0-\u30FF]+";
constexpr const char* kYoutu = PD_AYA_CASED(PD_CONTRACTIONS "?")
    R"(|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*)" PD_TIKTOKEN_SPACE;
// DeepSeek V3 family: digit triples, kana and CJK runs, then a pattern where an ASCII
// punctuation mark may lead a Latin word.
constexpr const char* kCjkKana = "[\u4E00-\u9FA5\u3040-\u309F\u30A0-\u30FF]+";
#define PD_DEEPSEEK3_HEAD \
  R"([!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+)"
constexpr const char* kDeepseek3 =
    PD_DEEPSEEK3_HEAD R"(| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr const char* kSpark25 =
    PD_DEEPSEEK3_HEAD R"(| ?[\p{P}\p{S}]+|[\r\n]|\s+(?!\S)|\s+)";
// Kimi K2: Han runs, then letter runs without Han (its cased classes only ever meant "letters"
// here), contractions, digit triples, punctuation and whitespace as in o200k. llama.cpp runs this
// as custom code; the pattern gives the same pieces. Han is llama.cpp's list of CJK ideograph
// blocks, not the Unicode script (which adds radicals, U+3005 and U+3007).
#define PD_HAN                                                                     \
  R"([\x{4E00}-\x{9FFF}\x{3400}-\x{4DBF}\x{20000}-\x{2A6DF}\x{2A700}-\x{2B73F})" \
  R"(\x{2B740}-\x{2B81F}\x{2B820}-\x{2CEAF}\x{2CEB0}-\x{2EBEF}\x{F900}-\x{FAFF})"    \
  R"(\x{2F800}-\x{2FA1F}])"
constexpr const char* kKimiK2 =
    PD_HAN R"(+|[^\r\n\p{L}\p{N}]?(?:(?!)" PD_HAN R"()\p{L})+)"
    R"((?:'[sS]|'[tT]|'[mM]|'[dD]|'[rR][eE]|'[vV][eE]|'[lL][lL])?|\p{N}{1,3})"
    R"(| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
#undef PD_HAN
// AFMoE: CJK, kana, half-width kana, Kangxi radicals, Thai, Lao, Khmer, Myanmar, Hangul runs.
constexpr const char* kAfmoeScripts =
    "[\u4E00-\u9FFF\u3400-\u4DBF\u8C48-\uFAFF\u3040-\u309F\u30A0-\u30FF\uFF65-\uFF9F"
    "\u2F00-\u2FDF\u0E40-\u0E7F\u0E80-\u0EFF\u1780-\u17FF\u1000-\u109F\uAA60-\uAA7F"
    "\uA9E0-\uA9FF\uAC00-\uD7AF\u1100-\u11FF]+";
// DeepSeek LLM: its Latin-script letter ranges, ASCII and full-width punctuation, trailing
// whitespace, CJK runs, digit runs.
constexpr const char* kDeepseekLatin =
    "\\s?[A-Za-z\u00B5\u00C0-\u00D6\u00D8-\u00F6\u00F8-\u01BA\u01BC-\u01BF\u01C4-\u0293"
    "\u0295-\u02AF\u0370-\u0373\u0376\u0377\u037B-\u037D\u037F\u0386\u0388-\u038A\u038C"
    "\u038E-\u03A1\u03A3-\u03F5\u03F7-\u0481\u048A-\u052F\u0531-\u0556\u10A0-\u10C5"
    "\u13A0-\u13F5\u13F8-\u13FD\u1C90-\u1CBA\u1CBD-\u1CBF\u1D00-\u1D2B\u1D6B-\u1D77"
    "\u1D79-\u1D9A\u1E00-\u1F15\u1F18-\u1F1D\u1F20-\u1F45\u1F48-\u1F4D\u1F50-\u1F57\u1F59"
    "\u1F5B\u1F5D\u1F5F-\u1F7D\u1F80-\u1FB4\u1FB6-\u1FBC\u1FBE\u1FC2-\u1FC4\u1FC6-\u1FCC"
    "\u1FD0-\u1FD3\u1FD6-\u1FDB\u1FE0-\u1FEC\u1FF2-\u1FF4\u1FF6-\u1FFC\u2102\u2107"
    "\u210A-\u2113\u2115\u2119-\u211D\u2124\u2126\u2128\u212A-\u212D\u212F-\u2134\u2139"
    "\u213C-\u213F\u2145-\u2149\u214E\u2183\u2184\u2C00-\u2C7B\u2C7E-\u2CE4\u2CEB-\u2CEE"
    "\u2CF2\u2CF3\uA640-\uA66D\uA680-\uA69B\uA722-\uA76F\uA771-\uA787\uA78B-\uA78E"
    "\uAB70-\uABBF\uFB00-\uFB06\uFB13-\uFB17\uFF21-\uFF3A\uFF41-\uFF5A\U00010400-\U0001044F"
    "\U000104B0-\U000104D3\U000104D8-\U000104FB\U00010C80-\U00010CB2\U00010CC0-\U00010CF2"
    "\U000118A0-\U000118DF\U0001E900-\U0001E943]+";
constexpr const char* kDeepseekPunct =
    "\\s?[!-/:-~\uFF01-\uFF0F\uFF1A-\uFF5E\u2018-\u201F\u3000-\u3002]+";
// CJK unified ideographs U+4E00-U+9FA5, U+0800-U+4E00 and Hangul syllables/Jamo U+AC00-U+D7FF
// as one run (DeepSeek's pre-tokenizers).
constexpr const char* kCjkRun = R"([\x{4E00}-\x{9FA5}\x{0800}-\x{4E00}\x{AC00}-\x{D7FF}]+)";
// BLOOM / Poro: runs of anything but whitespace and a few sentence marks.
constexpr const char* kBloom =
    " ?[^(\\s|.,!?\u2026\u3002\uFF0C\u3001\u0964\u06D4\u060C)]+";

// The whole lines, then the line breaks (Laguna's first split; Gemma 4's only one).
constexpr const char* kLines = R"([^\n]+|[\n]+)";

#undef PD_DEEPSEEK3_HEAD
#undef PD_AYA_CASED
#undef PD_O200K
#undef PD_CASED_RUNS
#undef PD_TIKTOKEN
#undef PD_TIKTOKEN_SPACE
#undef PD_GPT2_CORE
#undef PD_CONTRACTIONS

// Flags of a row (llama.cpp's per-type loader settings).
enum RowFlags : unsigned {
  kKeepSpaces = 1,     // clean_spaces off when decoding
  kIgnoreMerges = 2,   // a whole piece that is a token is emitted as is
  kAddBos = 4,         // default of tokenizer.ggml.add_bos_token
  kNoBos = 8,          // the type has no BOS token (ChatGLM)
  kRawUtf8 = 16,       // BPE over raw UTF-8, not GPT-2's byte alphabet (PreTokenizerSpec)
  kEscapeSpaces = 32,  // spaces become U+2581 (PreTokenizerSpec::escape_spaces)
  kNewlineRuns = 64,   // PreTokenizerSpec::whole_newline_runs
  kForceBos = 128,     // PreTokenizerSpec::force_add_bos
  kAddSep = 256,       // default of tokenizer.ggml.add_sep_token (PreTokenizerSpec::add_sep)
};

// One row per pre-tokenizer type: the `tokenizer.ggml.pre` names that select it, its patterns
// (applied in order) and its flags. A new type is a new row.
struct Row {
  std::vector<std::string_view> names;
  std::vector<const char*> patterns;
  unsigned flags = 0;
};

const std::vector<Row>& Rows() {
  static const auto* rows = new std::vector<Row>{
      {{"default"},
       {R"([\p{P}\$\+<=>\^~\|]+)", kGpt2, R"(\p{N}+)", "[0-9][0-9][0-9]"}},
      {{"llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2",
        "jina-v5-nano"},
       {kLlama3},
       kIgnoreMerges | kAddBos},
      {{"dbrx", "smaug-bpe"}, {kLlama3}},
      {{"chatglm-bpe"}, {kLlama3}, kNoBos},
      {{"glm4", "glm5"}, {kLlama3}, kNoBos | kIgnoreMerges},
      {{"jais-2"}, {kJais2}},
      {{"minicpm5"}, {R"(\p{N}{1,3})", kMiniCpm5}, kIgnoreMerges},
      {{"qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "hunyuan", "solar-open"},
       {kQwen2},
       kKeepSpaces},
      {{"stablelm2", "megrez"}, {kQwen2}},
      {{"grok-2"}, {kQwen2}, kKeepSpaces},
      {{"laguna"}, {kLines, kQwen2}, kKeepSpaces},
      {{"qwen35"}, {kQwen35}, kKeepSpaces},
      {{"seed-coder"}, {kSeedCoder}, kKeepSpaces},
      {{"ufakzeka"}, {kUfakzeka}, kKeepSpaces},
      {{"bailingmoe", "bailingmoe2", "llada-moe"}, {kBailing}, kKeepSpaces},
      {{"exaone-moe"}, {kExaoneMoe}},
      {{"gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2"}, {kGpt4o}, kKeepSpaces},
      {{"granite-embed-multi-97m"}, {kGraniteMulti}, kKeepSpaces | kIgnoreMerges},
      {{"tekken"}, {kTekken}, kKeepSpaces | kIgnoreMerges | kAddBos},
      {{"tiny_aya", "cohere2moe"}, {kDigitGroups, kTinyAya}, kKeepSpaces},
      {{"afmoe"}, {kDigitGroups, kAfmoeScripts, kDeepseek3}, kKeepSpaces},
      {{"kimi-k2"}, {kKimiK2}, kKeepSpaces},
      {{"youtu"}, {kYoutuCjk, kYoutu}, kKeepSpaces | kIgnoreMerges},
      {{"deepseek-v3", "hunyuan-dense", "hy_v4", "joyai-llm"},
       {R"(\p{N}{1,3})", kCjkKana, kDeepseek3},
       kKeepSpaces},
      {{"spark2_5"}, {R"(\p{N}{1,3})", kCjkKana, kSpark25, R"(\p{N})"}, kKeepSpaces},
      {{"deepseek-llm"},
       {"[\r\n]", kDeepseekLatin, kDeepseekPunct, R"(\s+$)", kCjkRun, R"(\p{N}+)"},
       kKeepSpaces},
      {{"deepseek-coder"},
       {"[\r\n]", R"(\s?\p{L}+)", R"(\s?\p{P}+)", kCjkRun, R"(\p{N})"},
       kKeepSpaces},
      {{"falcon"}, {R"([\p{P}\$\+<=>\^~\|`]+)", kGpt2, "[0-9][0-9][0-9]"}},
      {{"starcoder", "refact", "codeshell", "exaone", "minerva-7b", "mellum2"},
       {R"(\p{N})", kGpt2}},
      {{"command-r", "smollm"}, {R"(\p{N})", kGpt2}, kKeepSpaces},
      {{"gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v2-es", "jina-v2-de", "a.x-4.0",
        "mellum", "modern-bert", "exaone4", "mpt", "olmo", "jais"},
       {kGpt2}},
      {{"trillion", "granite-docling"}, {kGpt2}, kKeepSpaces},
      // Encoders (Jina v1/v2 code, RoBERTa) whose texts of a pair are joined by a separator.
      {{"jina-v1-en", "jina-v2-code", "roberta-bpe"}, {kGpt2}, kAddSep},
      {{"bloom", "gpt3-finnish"}, {kBloom}},
      {{"poro-chat"}, {kBloom}, kKeepSpaces},
      {{"viking"}, {kBloom, R"(\p{N})"}, kKeepSpaces},
      {{"chameleon"},
       {"<sentinel:[0-9]+>", "(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z", "([\\t\\n]|    |  )",
        R"(\p{N})", R"([\p{P}!-/:-@\[-`{-~])", kGpt2},
       kKeepSpaces | kAddBos},
      {{"superbpe"}, {R"(\p{N}+)", R"((?=(\d{3})+(?!\d)))"}, kKeepSpaces},
      // SentencePiece-style BPE: the whole text (spaces as U+2581) merges line by line.
      {{"gemma4", "granite-embed-multi-311m"}, {kLines},
       kRawUtf8 | kEscapeSpaces | kNewlineRuns | kForceBos},
      {{"sarvam-moe"}, {kLines}, kRawUtf8 | kEscapeSpaces | kKeepSpaces},
      {{"whitespace"}, {R"(\S+)"}, kRawUtf8},
  };
  return *rows;
}

// A pattern of the tables, in PCRE2 syntax with llama.cpp's meaning. llama.cpp runs patterns with
// \p{..} classes through std::regex on a copy of the text where every non-ASCII code point is
// replaced by one byte for its class, and the others through std::wregex with non-ASCII
// whitespace mapped to one whitespace character. Either way:
//   \s, \S   Unicode White_Space, and its complement (PCRE2's own \s also matches U+180E);
//   \p{Lu} \p{Ll} \p{Lt} \p{Lm} \p{Lo}   any letter: llama.cpp's classes know "letter" only;
//   \d       ASCII digits (std::regex's \d);
//   \b       a boundary between ASCII word characters [A-Za-z0-9_] and anything else.
// And since llama.cpp replaces every non-ASCII whitespace character of the text by U+000B before
// it matches, a class that names non-ASCII characters (DeepSeek's U+0800-U+4E00, which holds
// U+2003 and U+3000) never matches non-ASCII whitespace: such a class is guarded by a negative
// lookahead. Other escapes are copied.
//
// The end of the character class that opens at pattern[open] (the index of its ']').
size_t ClassEnd(std::string_view pattern, size_t open) {
  size_t i = open + 1;
  if (i < pattern.size() && pattern[i] == '^') ++i;
  if (i < pattern.size() && pattern[i] == ']') ++i;  // a leading ']' is a literal
  for (; i < pattern.size(); ++i) {
    if (pattern[i] == '\\') {
      ++i;
    } else if (pattern[i] == ']') {
      return i;
    }
  }
  return std::string_view::npos;
}

// True when a class (its text, brackets included) names a character above U+007F and neither
// whitespace nor a property class.
bool NamesNonAsciiOnly(std::string_view cls) {
  bool non_ascii = false;
  for (size_t i = 0; i < cls.size(); ++i) {
    if (static_cast<unsigned char>(cls[i]) >= 0x80) non_ascii = true;
    if (cls[i] != '\\' || i + 1 >= cls.size()) continue;
    const char e = cls[++i];
    if (e == 's' || e == 'p' || e == 'P') return false;
    if (e == 'x' && i + 1 < cls.size() && cls[i + 1] == '{') {
      non_ascii |= std::strtoul(std::string(cls.substr(i + 2, 8)).c_str(), nullptr, 16) >= 0x80;
    }
  }
  return non_ascii;
}

std::string Rewrite(std::string_view pattern, bool guard_classes = true) {
  constexpr std::string_view kAsciiWord = "[A-Za-z0-9_]";
  std::string out;
  out.reserve(pattern.size() + 32);
  bool in_class = false;
  for (size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (guard_classes && c == '[' && !in_class && i + 1 < pattern.size() &&
        pattern[i + 1] != '^') {
      const size_t end = ClassEnd(pattern, i);
      if (end != std::string_view::npos && NamesNonAsciiOnly(pattern.substr(i, end - i + 1))) {
        out += StrCat(R"((?:(?!\p{White_Space}))", Rewrite(pattern.substr(i, end - i + 1), false),
                      ")");
        i = end;
        continue;
      }
    }
    if (c == '\\' && i + 1 < pattern.size()) {
      const char e = pattern[i + 1];
      const std::string_view rest = pattern.substr(i);
      if (e == 's') {
        out += R"(\p{White_Space})";
      } else if (e == 'S') {
        out += R"(\P{White_Space})";
      } else if (e == 'd') {
        out += in_class ? "0-9" : "[0-9]";
      } else if (e == 'b' && !in_class) {
        out += StrCat("(?:(?<=", kAsciiWord, ")(?!", kAsciiWord, ")|(?<!", kAsciiWord, ")(?=",
                      kAsciiWord, "))");
      } else if (rest.size() >= 6 && rest.substr(0, 4) == "\\p{L" && rest[5] == '}' &&
                 std::string_view("ultmo").find(rest[4]) != std::string_view::npos) {
        out += R"(\p{L})";
        i += 4;  // past "p{Lx" (the loop's ++i takes the '}'), with the 1 below
      } else {
        out += pattern.substr(i, 2);
      }
      ++i;
      continue;
    }
    if (c == '[' && !in_class) {
      in_class = true;
      out += c;
      // A ']' or '^]' right after '[' is a literal; copy it so it does not close the class.
      if (i + 1 < pattern.size() && pattern[i + 1] == '^') out += pattern[++i];
      if (i + 1 < pattern.size() && pattern[i + 1] == ']') out += pattern[++i];
      continue;
    }
    if (c == ']' && in_class) in_class = false;
    out += c;
  }
  return out;
}

// Per-thread PCRE2 scratch: match data (we only read the whole-match offsets) and a JIT stack that
// may grow to 8 MiB, far more than any of our patterns needs.
struct ThreadScratch {
  pcre2_match_data* match_data = nullptr;
  pcre2_match_context* match_context = nullptr;
  pcre2_jit_stack* jit_stack = nullptr;

  ThreadScratch() {
    match_data = pcre2_match_data_create(1, nullptr);
    match_context = pcre2_match_context_create(nullptr);
    jit_stack = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, nullptr);
    PD_CHECK(match_data != nullptr && match_context != nullptr);
    if (jit_stack != nullptr) pcre2_jit_stack_assign(match_context, nullptr, jit_stack);
  }
  ~ThreadScratch() {
    pcre2_match_data_free(match_data);
    pcre2_match_context_free(match_context);
    if (jit_stack != nullptr) pcre2_jit_stack_free(jit_stack);
  }
};

ThreadScratch& Scratch() {
  thread_local ThreadScratch scratch;
  return scratch;
}

size_t NextCharEnd(std::string_view text, size_t pos) {
  size_t i = pos + 1;
  while (i < text.size() && (static_cast<uint8_t>(text[i]) & 0xC0) == 0x80) ++i;
  return i;
}

}  // namespace

absl::StatusOr<PreTokenizerSpec> PreTokenizerSpecFor(std::string_view pre) {
  const std::string_view name = pre.empty() ? "default" : pre;
  for (const Row& row : Rows()) {
    if (std::find(row.names.begin(), row.names.end(), name) == row.names.end()) continue;
    PreTokenizerSpec s;
    s.patterns.assign(row.patterns.begin(), row.patterns.end());
    s.clean_spaces = !(row.flags & kKeepSpaces);
    s.ignore_merges = row.flags & kIgnoreMerges;
    s.add_bos = row.flags & kAddBos;
    s.bos_disabled = row.flags & kNoBos;
    s.byte_encode = !(row.flags & kRawUtf8);
    s.escape_spaces = row.flags & kEscapeSpaces;
    s.whole_newline_runs = row.flags & kNewlineRuns;
    s.force_add_bos = row.flags & kForceBos;
    s.add_sep = row.flags & kAddSep;
    return s;
  }
  return absl::InvalidArgumentError(
      StrCat("unknown tokenizer.ggml.pre '", name, "' (", SupportedPreTokenizers().size(),
             " names of ", Rows().size(),
             " pre-tokenizer types are supported, every one llama.cpp's vocabulary loader knows; "
             "docs/models.md lists them)"));
}

std::vector<std::string_view> SupportedPreTokenizers() {
  std::vector<std::string_view> names;
  for (const Row& row : Rows()) names.insert(names.end(), row.names.begin(), row.names.end());
  return names;
}

struct PreTokenizer::Pattern {
  pcre2_code* code = nullptr;
  // kDigitGroups: `code` finds digit runs (\p{N}+), and Split cuts at the run's end and every
  // third digit before it instead of isolating matches.
  bool digit_groups = false;
  ~Pattern() { pcre2_code_free(code); }
};

absl::StatusOr<std::unique_ptr<PreTokenizer>> PreTokenizer::Create(
    const std::vector<std::string>& patterns) {
  uint32_t have_jit = 0;
  pcre2_config(PCRE2_CONFIG_JIT, &have_jit);
  std::unique_ptr<PreTokenizer> pt(new PreTokenizer());
  for (const std::string& raw : patterns) {
    const bool digit_groups = raw == kDigitGroups;
    const std::string pattern = digit_groups ? std::string(R"(\p{N}+)") : Rewrite(raw);
    int error = 0;
    PCRE2_SIZE error_offset = 0;
    auto p = std::make_unique<Pattern>();
    p->code =
        pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                      PCRE2_UTF | PCRE2_UCP | PCRE2_DOLLAR_ENDONLY, &error, &error_offset, nullptr);
    if (p->code == nullptr) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(error, msg, sizeof(msg));
      return absl::InvalidArgumentError(StrCat("pre-tokenizer pattern '", raw,
                                               "' does not compile at offset ", error_offset, ": ",
                                               reinterpret_cast<const char*>(msg)));
    }
    // Without JIT the interpreter is used; same results, slower.
    if (have_jit) pcre2_jit_compile(p->code, PCRE2_JIT_COMPLETE);
    p->digit_groups = digit_groups;
    pt->patterns_.push_back(std::move(p));
  }
  return pt;
}

PreTokenizer::~PreTokenizer() = default;

void PreTokenizer::Split(std::string_view text,
                         std::vector<std::pair<size_t, size_t>>* pieces) const {
  if (text.empty()) return;
  ThreadScratch& scratch = Scratch();
  std::vector<std::pair<size_t, size_t>> cur = {{0, text.size()}};
  std::vector<std::pair<size_t, size_t>> next;
  for (const auto& pattern : patterns_) {
    next.clear();
    next.reserve(cur.size() * 2);
    for (const auto& [begin, end] : cur) {
      const std::string_view seg = text.substr(begin, end - begin);
      const auto* subject = reinterpret_cast<PCRE2_SPTR>(seg.data());
      size_t gap_start = 0;  // start of the not-yet-emitted text in seg
      size_t search = 0;
      while (search <= seg.size()) {
        const int rc = pcre2_match(pattern->code, subject, seg.size(), search, PCRE2_NO_UTF_CHECK,
                                   scratch.match_data, scratch.match_context);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
          // Resource limits only (the subject is valid UTF-8): keep the rest as one piece.
          static std::atomic<bool> logged{false};
          if (!logged.exchange(true)) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(rc, msg, sizeof(msg));
            PD_LOG(kError, "pre-tokenizer match failed (", reinterpret_cast<const char*>(msg),
                   "); leaving a ", seg.size() - search, "-byte span unsplit");
          }
          break;
        }
        const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(scratch.match_data);
        const size_t m_begin = ov[0], m_end = ov[1];
        if (pattern->digit_groups) {
          // Cuts at the run's end and every third digit back from it (never at its start: the
          // text before a run stays with its first group, as in llama.cpp).
          std::vector<size_t> starts;  // code point starts in the run
          for (size_t i = m_begin; i < m_end; i = NextCharEnd(seg, i)) starts.push_back(i);
          const size_t n = starts.size();
          for (size_t first = n % 3 == 0 ? 3 : n % 3; first <= n; first += 3) {
            const size_t cut = first == n ? m_end : starts[first];
            next.emplace_back(begin + gap_start, begin + cut);
            gap_start = cut;
          }
          search = m_end;
          continue;
        }
        if (m_end == m_begin) {
          // Empty match (superbpe's digit-group lookahead): a split point only, as in llama.cpp,
          // whose empty pieces vanish.
          if (m_begin > gap_start) next.emplace_back(begin + gap_start, begin + m_begin);
          gap_start = m_begin;
          if (m_begin >= seg.size()) break;
          search = NextCharEnd(seg, m_begin);
          continue;
        }
        if (m_begin > gap_start) next.emplace_back(begin + gap_start, begin + m_begin);
        next.emplace_back(begin + m_begin, begin + m_end);
        gap_start = search = m_end;
      }
      if (gap_start < seg.size()) next.emplace_back(begin + gap_start, end);
    }
    cur.swap(next);
  }
  pieces->insert(pieces->end(), cur.begin(), cur.end());
}

}  // namespace pd::engine::tokenizer_internal
