// Hugging Face tokenizer.json -> GGUF tokenizer metadata, after llama.cpp's converter:
// convert_hf_to_gguf.py (get_vocab_base, _set_vocab_gpt2, _set_vocab_llama_hf,
// does_token_look_special) and gguf-py's vocab.py (SpecialVocab, LlamaHfVocab). Where this
// departs from it, a comment says so and why.
#include "engine/tokenizer/hf_tokenizer.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <string_view>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "common/status.h"
#include "common/strings.h"
#include "engine/tokenizer/pretokenizer.h"
#include "engine/tokenizer/ugm.h"
#include "nlohmann/json.hpp"

namespace pd::engine {
namespace {

using json = nlohmann::json;

constexpr std::string_view kSpaceEscape = "\xE2\x96\x81";  // U+2581, SentencePiece's space

// llama.cpp's token types (gguf.TokenType).
constexpr int32_t kNormal = 1, kUnknown = 2, kControl = 3, kUserDefined = 4, kUnused = 5, kByte = 6;

// ---- the Hugging Face pre-tokenizer definitions llama.cpp's types were transcribed from -------
//
// Each is the list of Split regexes a tokenizer.json pre-tokenizer applies, in order, as its
// Sequence spells them (Digits and ByteLevel's own regex spelled as the Split they amount to; see
// Canonical()). The regexes are the original ones quoted in llama.cpp's src/llama-vocab.cpp (where
// llama.cpp runs a rewrite, the original is in its comment). Among the llama.cpp names of a
// definition, which share its patterns and differ in flags, the first whose ignore_merges agrees
// with the model's is taken, preferring one whose clean_spaces agrees with
// tokenizer_config.json's clean_up_tokenization_spaces when that is given. A new definition is
// a new row.

// ByteLevel's regex when use_regex is true (GPT-2's).
constexpr const char* kHfGpt2 =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
#define PD_HF_CONTRACTIONS R"((?i:'s|'t|'re|'ve|'m|'ll|'d))"
#define PD_HF_TIKTOKEN(digits)                              \
  PD_HF_CONTRACTIONS R"(|[^\r\n\p{L}\p{N}]?\p{L}+|)" digits \
                     R"(| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)"
constexpr const char* kHfLlama3 = PD_HF_TIKTOKEN(R"(\p{N}{1,3})");
constexpr const char* kHfQwen2 = PD_HF_TIKTOKEN(R"(\p{N})");
constexpr const char* kHfMiniCpm5 = PD_HF_TIKTOKEN(R"(\p{N}+)");
constexpr const char* kHfQwen35 =
    PD_HF_CONTRACTIONS R"(|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*)"
                       R"(|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr const char* kHfJais2 = PD_HF_CONTRACTIONS
    R"(|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*)"
    R"(|\s*[\r\n]+|\s{512}(?!\S)|\s{256}(?!\S)|\s{128}(?!\S)|\s{64}(?!\S)|\s{32}(?!\S))"
    R"(|\s{16}(?!\S)|\s{8}(?!\S)|\s{4}(?!\S)|\s{1,2}(?!\S)|\s{1})";
constexpr const char* kHfSeedCoder =
    PD_HF_CONTRACTIONS R"(|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+)"
                       R"(|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr const char* kHfBailing =
    R"('(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]++[\r\n]*)"
    R"(|\s*[\r\n]|\s+(?!\S)|\s+)";
constexpr const char* kHfExaoneMoe =
    PD_HF_CONTRACTIONS R"(|[^\r\n\p{L}\p{N}]?(?:\p{L}\p{M}*(?: \p{L}\p{M}*)*)+|\p{N})"
                       R"(| ?[^\s\p{L}\p{N}]+[\r\n/]?|\s*[\r\n]|\s+(?!\S)|\s+)";
// tiktoken's o200k (GPT-4o, Llama 4) and Mistral's Tekken (no contractions, single digits).
#define PD_HF_CASED(tail)                                                                \
  R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+)" tail \
  R"(|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*)" tail
constexpr const char* kHfO200k = PD_HF_CASED(
    PD_HF_CONTRACTIONS "?") R"(|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr const char* kHfTekken =
    PD_HF_CASED("") R"(|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// DeepSeek V3 and LLM / Coder, as llama.cpp quotes them.
constexpr const char* kHfCjkKana = "[\u4E00-\u9FA5\u3040-\u309F\u30A0-\u30FF]+";
constexpr const char* kHfDeepseek3 =
    R"([!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+)"
    R"(| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr const char* kHfDeepseekLatin =
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
constexpr const char* kHfDeepseekPunct =
    "\\s?[!-/:-~\uFF01-\uFF0F\uFF1A-\uFF5E\u2018-\u201F\u3000-\u3002]+";
constexpr const char* kHfCjkRun = "[\u4E00-\u9FA5\u0800-\u4E00\uAC00-\uD7FF]+";
#undef PD_HF_CASED
#undef PD_HF_TIKTOKEN
#undef PD_HF_CONTRACTIONS

struct PreDefinition {
  std::string_view family;               // for messages
  std::vector<std::string_view> splits;  // Split regexes, in order
  std::vector<std::string_view> names;   // llama.cpp tokenizer.ggml.pre names, preferred first
};

const std::vector<PreDefinition>& Definitions() {
  static const auto* defs = new std::vector<PreDefinition>{
      {"GPT-2 (ByteLevel with use_regex)", {kHfGpt2}, {"gpt-2", "trillion"}},
      {"StarCoder (Digits, then ByteLevel with use_regex)",
       {R"(\p{N})", kHfGpt2},
       {"starcoder", "smollm"}},
      {"Llama 3", {kHfLlama3}, {"llama-bpe", "smaug-bpe"}},
      {"Qwen 2", {kHfQwen2}, {"qwen2", "stablelm2"}},
      {"Qwen 3.5", {kHfQwen35}, {"qwen35"}},
      {"MiniCPM 5", {R"(\p{N}{1,3})", kHfMiniCpm5}, {"minicpm5"}},
      {"Jais 2", {kHfJais2}, {"jais-2"}},
      {"Seed-Coder", {kHfSeedCoder}, {"seed-coder"}},
      {"Bailing MoE", {kHfBailing}, {"bailingmoe"}},
      {"EXAONE MoE", {kHfExaoneMoe}, {"exaone-moe"}},
      {"o200k (GPT-4o, Llama 4)", {kHfO200k}, {"gpt-4o"}},
      {"Tekken", {kHfTekken}, {"tekken"}},
      {"Tiny Aya", {R"(\d{1,3}(?=(?:\d{3})*\b))", kHfO200k}, {"tiny_aya"}},
      {"DeepSeek V3", {R"(\p{N}{1,3})", kHfCjkKana, kHfDeepseek3}, {"deepseek-v3"}},
      {"DeepSeek LLM",
       {"[\r\n]", kHfDeepseekLatin, kHfDeepseekPunct, R"(\s+$)", kHfCjkRun, R"(\p{N}+)"},
       {"deepseek-llm"}},
      {"DeepSeek Coder",
       {"[\r\n]", R"(\s?\p{L}+)", R"(\s?\p{P}+)", kHfCjkRun, R"(\p{N})"},
       {"deepseek-coder"}},
  };
  return *defs;
}

// A regex with its line breaks and tabs spelled as escapes: tokenizer.json files write "\r\n" in
// a class either as the characters or as regex escapes, which match the same.
std::string Canonical(std::string_view regex) {
  std::string out;
  out.reserve(regex.size());
  for (char c : regex) {
    if (c == '\r') {
      out += "\\r";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else {
      out.push_back(c);
    }
  }
  return out;
}

// ---- JSON access with paths in the messages ---------------------------------------------------

std::string Quoted(std::string_view s) {
  return StrCat("\"", absl::Utf8SafeCHexEscape(ToAbsl(s)), "\"");
}

std::string_view TypeName(const json& j) {
  switch (j.type()) {
    case json::value_t::null:
      return "null";
    case json::value_t::object:
      return "an object";
    case json::value_t::array:
      return "an array";
    case json::value_t::string:
      return "a string";
    case json::value_t::boolean:
      return "a boolean";
    case json::value_t::number_integer:
    case json::value_t::number_unsigned:
      return "an integer";
    case json::value_t::number_float:
      return "a number";
    default:
      return "a value";
  }
}

// The bytes of `path`; nullopt with errno's value in *err when it cannot be read.
std::optional<std::string> ReadBytes(const std::string& path, int* err) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) {
    *err = errno;
    return std::nullopt;
  }
  std::string text;
  char buf[1 << 16];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) text.append(buf, n);
  const bool failed = std::ferror(f) != 0;
  *err = errno;
  std::fclose(f);
  if (failed) return std::nullopt;
  return text;
}

// The bytes of an optional file, nullopt when it cannot be read.
std::optional<std::string> ReadOptional(const std::string& path) {
  int err = 0;
  return ReadBytes(path, &err);
}

// Collects the message of a parse error (nlohmann's SAX interface; no exceptions).
struct ParseErrorSax : json::json_sax_t {
  std::string error;
  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t&) override { return true; }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool start_object(std::size_t) override { return true; }
  bool key(string_t&) override { return true; }
  bool end_object() override { return true; }
  bool start_array(std::size_t) override { return true; }
  bool end_array() override { return true; }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) override {
    error = e.what();
    return false;
  }
};

// A parsed JSON file; every error names the file and the JSON path.
class JsonFile {
 public:
  // nullopt when the file does not exist and !required; NOT_FOUND when it does not and required.
  static absl::StatusOr<std::optional<JsonFile>> Load(const std::string& path, bool required) {
    int err = 0;
    std::optional<std::string> text = ReadBytes(path, &err);
    if (!text.has_value()) {
      if (err == ENOENT && !required) return std::optional<JsonFile>();
      const std::string msg = StrCat("cannot read ", path, ": ", std::strerror(err));
      return err == ENOENT ? absl::NotFoundError(msg) : absl::InvalidArgumentError(msg);
    }
    JsonFile file;
    file.path_ = path;
    file.root_ = json::parse(*text, nullptr, /*allow_exceptions=*/false);
    if (file.root_.is_discarded()) {
      ParseErrorSax sax;
      json::sax_parse(*text, &sax);
      return absl::InvalidArgumentError(StrCat(path, ": not valid JSON: ", sax.error));
    }
    if (!file.root_.is_object()) {
      return absl::InvalidArgumentError(
          StrCat(path, ": expected a JSON object at the top, got ", TypeName(file.root_)));
    }
    return std::optional<JsonFile>(std::move(file));
  }

  const std::string& path() const { return path_; }
  const json& root() const { return root_; }

  absl::Status Invalid(std::string_view at, std::string_view what) const {
    return absl::InvalidArgumentError(
        StrCat(path_, ": ", at.empty() ? "" : StrCat(at, ": "), what));
  }
  absl::Status Unsupported(std::string_view at, std::string_view what) const {
    return absl::UnimplementedError(StrCat(path_, ": ", at.empty() ? "" : StrCat(at, ": "), what));
  }
  absl::Status WrongType(std::string_view at, std::string_view expected, const json& got) const {
    return Invalid(at, StrCat("expected ", expected, ", got ", TypeName(got)));
  }

  // Member `key` of `obj`, nullptr when absent or null.
  static const json* Find(const json& obj, std::string_view key) {
    if (!obj.is_object()) return nullptr;
    const auto it = obj.find(std::string(key));
    return it == obj.end() || it->is_null() ? nullptr : &*it;
  }
  // Member `key` of the object at `at`, which must be there.
  absl::StatusOr<const json*> Require(const json& obj, std::string_view at,
                                      std::string_view key) const {
    const json* v = Find(obj, key);
    if (v == nullptr) return Invalid(at, StrCat("\"", key, "\" is missing"));
    return v;
  }
  absl::StatusOr<std::optional<std::string>> OptString(const json& obj, std::string_view at,
                                                       std::string_view key) const {
    const json* v = Find(obj, key);
    if (v == nullptr) return std::optional<std::string>();
    if (!v->is_string()) return WrongType(Join(at, key), "a string", *v);
    return std::optional<std::string>(v->get<std::string>());
  }
  absl::StatusOr<std::optional<bool>> OptBool(const json& obj, std::string_view at,
                                              std::string_view key) const {
    const json* v = Find(obj, key);
    if (v == nullptr) return std::optional<bool>();
    if (!v->is_boolean()) return WrongType(Join(at, key), "a boolean", *v);
    return std::optional<bool>(v->get<bool>());
  }
  // A token id: an integer in [0, INT32_MAX).
  absl::StatusOr<int32_t> Id(const json& v, std::string_view at) const {
    if (!v.is_number_integer()) return WrongType(at, "a token id (an integer)", v);
    if (v.is_number_unsigned() ? v.get<uint64_t>() >= INT32_MAX
                               : v.get<int64_t>() < 0 || v.get<int64_t>() >= INT32_MAX) {
      return Invalid(at, StrCat("token id ", v.dump(), " is out of range"));
    }
    return static_cast<int32_t>(v.get<int64_t>());
  }

  static std::string Join(std::string_view at, std::string_view key) {
    return at.empty() ? std::string(key) : StrCat(at, ".", key);
  }

 private:
  std::string path_;
  json root_;
};

// A string, or an object's "content" string (tokenizer_config.json's AddedToken form).
std::optional<std::string> ContentOf(const json* v) {
  if (v == nullptr) return std::nullopt;
  if (v->is_string()) return v->get<std::string>();
  if (const json* c = JsonFile::Find(*v, "content"); c != nullptr && c->is_string()) {
    return c->get<std::string>();
  }
  return std::nullopt;
}

// ---- tokenizer.json ---------------------------------------------------------------------------

struct AddedToken {
  int32_t id;
  std::string content;
  bool special;
};

struct HfModel {
  bool unigram = false;
  std::optional<int32_t> unk_id;  // Unigram
  std::vector<double> scores;     // Unigram, by id
  bool byte_fallback = false;
  bool ignore_merges = false;
  absl::flat_hash_map<std::string, int32_t> vocab;
  std::vector<std::pair<std::string, std::string>> merges;  // by rank
  bool merges_are_pairs = false;                            // the [a, b] form
};

// model.vocab of a Unigram model: [[piece, log probability], ...], the id being the index.
absl::StatusOr<HfModel> ReadUnigram(const JsonFile& f, const json& model) {
  HfModel m;
  m.unigram = true;
  PD_ASSIGN_OR_RETURN(std::optional<bool> byte_fallback,
                      f.OptBool(model, "model", "byte_fallback"));
  m.byte_fallback = byte_fallback.value_or(false);
  PD_ASSIGN_OR_RETURN(const json* vocab, f.Require(model, "model", "vocab"));
  if (!vocab->is_array()) {
    return f.WrongType("model.vocab", "an array of [piece, score] pairs", *vocab);
  }
  if (vocab->size() >= static_cast<size_t>(INT32_MAX)) {
    return f.Invalid("model.vocab", "too many pieces");
  }
  m.vocab.reserve(vocab->size());
  m.scores.reserve(vocab->size());
  for (size_t i = 0; i < vocab->size(); ++i) {
    const json& e = (*vocab)[i];
    const std::string at = StrCat("model.vocab[", i, "]");
    if (!e.is_array() || e.size() != 2 || !e[0].is_string() || !e[1].is_number()) {
      return f.WrongType(at, "a [piece, score] pair", e);
    }
    const std::string text = e[0].get<std::string>();
    const auto [it, inserted] = m.vocab.emplace(text, static_cast<int32_t>(i));
    if (!inserted) {
      return f.Invalid(at, StrCat(Quoted(text), " is also piece ", it->second));
    }
    m.scores.push_back(e[1].get<double>());
  }
  const json* unk = JsonFile::Find(model, "unk_id");
  if (unk == nullptr) {
    return f.Unsupported("model.unk_id",
                         "a Unigram model without an unknown token is not supported (llama.cpp's "
                         "Unigram encoder needs one)");
  }
  PD_ASSIGN_OR_RETURN(int32_t unk_id, f.Id(*unk, "model.unk_id"));
  if (static_cast<size_t>(unk_id) >= vocab->size()) {
    return f.Invalid("model.unk_id", StrCat("id ", unk_id, " is out of range: model.vocab has ",
                                            vocab->size(), " pieces"));
  }
  m.unk_id = unk_id;
  return m;
}

absl::StatusOr<HfModel> ReadModel(const JsonFile& f) {
  PD_ASSIGN_OR_RETURN(const json* model, f.Require(f.root(), "", "model"));
  if (!model->is_object()) return f.WrongType("model", "an object", *model);
  PD_ASSIGN_OR_RETURN(std::optional<std::string> type, f.OptString(*model, "model", "type"));
  if (!type.has_value()) {
    // Old files leave BPE's type out; a vocabulary with merges is BPE.
    if (JsonFile::Find(*model, "merges") == nullptr) {
      return f.Invalid("model", "\"type\" is missing");
    }
    type = "BPE";
  }
  if (*type == "Unigram") return ReadUnigram(f, *model);
  if (*type != "BPE") {
    return f.Unsupported("model.type",
                         StrCat(Quoted(*type),
                                " tokenizers are not supported "
                                "(supported: BPE, byte-level or SentencePiece-style; Unigram)"));
  }
  HfModel m;
  PD_ASSIGN_OR_RETURN(std::optional<bool> byte_fallback,
                      f.OptBool(*model, "model", "byte_fallback"));
  PD_ASSIGN_OR_RETURN(std::optional<bool> ignore_merges,
                      f.OptBool(*model, "model", "ignore_merges"));
  m.byte_fallback = byte_fallback.value_or(false);
  m.ignore_merges = ignore_merges.value_or(false);
  if (const json* d = JsonFile::Find(*model, "dropout")) {
    if (!d->is_number()) return f.WrongType("model.dropout", "a number", *d);
    if (d->get<double>() != 0) {
      return f.Unsupported("model.dropout", StrCat("BPE dropout ", d->dump(),
                                                   " is not supported (encoding would "
                                                   "be random)"));
    }
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    PD_ASSIGN_OR_RETURN(std::optional<std::string> v, f.OptString(*model, "model", key));
    if (v.has_value() && !v->empty()) {
      return f.Unsupported(StrCat("model.", key), StrCat(Quoted(*v), " is not supported"));
    }
  }

  PD_ASSIGN_OR_RETURN(const json* vocab, f.Require(*model, "model", "vocab"));
  if (!vocab->is_object()) return f.WrongType("model.vocab", "an object (token -> id)", *vocab);
  m.vocab.reserve(vocab->size());
  absl::flat_hash_map<int32_t, const std::string*> by_id;
  by_id.reserve(vocab->size());
  for (const auto& [text, id_json] : vocab->items()) {
    const std::string at = StrCat("model.vocab[", Quoted(text), "]");
    PD_ASSIGN_OR_RETURN(int32_t id, f.Id(id_json, at));
    const auto [it, inserted] = m.vocab.emplace(text, id);
    const auto [prev, fresh] = by_id.emplace(id, &it->first);
    if (!fresh) {
      return f.Invalid(at, StrCat("id ", id, " is also the id of ", Quoted(*prev->second)));
    }
  }

  PD_ASSIGN_OR_RETURN(const json* merges, f.Require(*model, "model", "merges"));
  if (!merges->is_array()) return f.WrongType("model.merges", "an array", *merges);
  m.merges.reserve(merges->size());
  for (size_t r = 0; r < merges->size(); ++r) {
    const json& e = (*merges)[r];
    const std::string at = StrCat("model.merges[", r, "]");
    std::string left, right;
    if (e.is_string()) {
      // "left right": exactly one space, as tokenizers parses it.
      const std::string s = e.get<std::string>();
      const size_t sp = s.find(' ');
      if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos) {
        return f.Invalid(at, StrCat("expected \"left right\" (one space), got ", Quoted(s)));
      }
      left = s.substr(0, sp);
      right = s.substr(sp + 1);
    } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
      left = e[0].get<std::string>();
      right = e[1].get<std::string>();
      m.merges_are_pairs = true;
    } else {
      return f.WrongType(at, "\"left right\" or [left, right]", e);
    }
    for (const std::string* part : {&left, &right}) {
      if (!m.vocab.contains(*part)) {
        return f.Invalid(at, StrCat(Quoted(*part), " is not in model.vocab"));
      }
    }
    if (!m.vocab.contains(left + right)) {
      return f.Invalid(at,
                       StrCat("the merged token ", Quoted(left + right), " is not in model.vocab"));
    }
    m.merges.emplace_back(std::move(left), std::move(right));
  }
  return m;
}

absl::StatusOr<std::vector<AddedToken>> ReadAddedTokens(const JsonFile& f) {
  std::vector<AddedToken> added;
  const json* list = JsonFile::Find(f.root(), "added_tokens");
  if (list == nullptr) return added;
  if (!list->is_array()) return f.WrongType("added_tokens", "an array", *list);
  for (size_t i = 0; i < list->size(); ++i) {
    const json& e = (*list)[i];
    const std::string at = StrCat("added_tokens[", i, "]");
    if (!e.is_object()) return f.WrongType(at, "an object", e);
    PD_ASSIGN_OR_RETURN(const json* id_json, f.Require(e, at, "id"));
    PD_ASSIGN_OR_RETURN(int32_t id, f.Id(*id_json, StrCat(at, ".id")));
    PD_ASSIGN_OR_RETURN(std::optional<std::string> content, f.OptString(e, at, "content"));
    if (!content.has_value()) return f.Invalid(at, "\"content\" is missing");
    PD_ASSIGN_OR_RETURN(std::optional<bool> special, f.OptBool(e, at, "special"));
    added.push_back({id, std::move(*content), special.value_or(false)});
  }
  return added;
}

// llama.cpp's does_token_look_special: added tokens some models forget to mark special.
bool LooksSpecial(std::string_view t) {
  if (t == "<pad>" || t == "<mask>" || t == "<2mass>" || t == "[@BOS@]") return true;
  if (t.starts_with("<|") && t.ends_with("|>")) return true;
  if (t.starts_with("<\xEF\xBD\x9C") && t.ends_with("\xEF\xBD\x9C>")) return true;  // <｜...｜>
  return t.starts_with("<unused") && t.ends_with(">");
}

bool IsByteToken(std::string_view t) {
  auto hex = [](char c) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
  };
  return t.size() == 6 && t.starts_with("<0x") && hex(t[3]) && hex(t[4]) && t[5] == '>';
}

// The steps of a pre-tokenizer or normalizer: a Sequence flattened, anything else as itself.
absl::Status Flatten(const JsonFile& f, const json& j, const std::string& at,
                     std::string_view list_key,
                     std::vector<std::pair<const json*, std::string>>* out) {
  if (!j.is_object()) return f.WrongType(at, "an object", j);
  PD_ASSIGN_OR_RETURN(std::optional<std::string> type, f.OptString(j, at, "type"));
  if (!type.has_value()) return f.Invalid(at, "\"type\" is missing");
  if (*type != "Sequence") {
    out->emplace_back(&j, at);
    return absl::OkStatus();
  }
  PD_ASSIGN_OR_RETURN(const json* list, f.Require(j, at, list_key));
  if (!list->is_array()) return f.WrongType(JsonFile::Join(at, list_key), "an array", *list);
  for (size_t i = 0; i < list->size(); ++i) {
    PD_RETURN_IF_ERROR(
        Flatten(f, (*list)[i], StrCat(JsonFile::Join(at, list_key), "[", i, "]"), list_key, out));
  }
  return absl::OkStatus();
}

std::string TypeOf(const json& j) {
  const json* t = JsonFile::Find(j, "type");
  return t != nullptr && t->is_string() ? t->get<std::string>() : std::string();
}

// Byte-level BPE: the Split regexes of the pre-tokenizer (canonical form), or UNIMPLEMENTED
// naming the step pdserve cannot run.
absl::StatusOr<std::vector<std::string>> ByteLevelSplits(const JsonFile& f) {
  const json* pre = JsonFile::Find(f.root(), "pre_tokenizer");
  if (pre == nullptr) {
    return f.Unsupported("pre_tokenizer",
                         "a BPE model without byte_fallback needs a ByteLevel pre-tokenizer; "
                         "there is none");
  }
  std::vector<std::pair<const json*, std::string>> steps;
  PD_RETURN_IF_ERROR(Flatten(f, *pre, "pre_tokenizer", "pretokenizers", &steps));
  std::vector<std::string> splits;
  bool byte_level = false;
  for (const auto& [step, at] : steps) {
    const std::string type = TypeOf(*step);
    if (byte_level) {
      return f.Unsupported(at, StrCat("a ", type, " step after ByteLevel is not supported"));
    }
    if (type == "ByteLevel") {
      PD_ASSIGN_OR_RETURN(std::optional<bool> prefix, f.OptBool(*step, at, "add_prefix_space"));
      PD_ASSIGN_OR_RETURN(std::optional<bool> use_regex, f.OptBool(*step, at, "use_regex"));
      if (prefix.value_or(true)) {
        return f.Unsupported(at,
                             "ByteLevel with add_prefix_space (a space put before the text) "
                             "is not supported");
      }
      if (use_regex.value_or(true)) splits.push_back(Canonical(kHfGpt2));
      byte_level = true;
    } else if (type == "Split") {
      PD_ASSIGN_OR_RETURN(std::optional<std::string> behavior, f.OptString(*step, at, "behavior"));
      PD_ASSIGN_OR_RETURN(std::optional<bool> invert, f.OptBool(*step, at, "invert"));
      PD_ASSIGN_OR_RETURN(const json* pattern, f.Require(*step, at, "pattern"));
      const json* regex = JsonFile::Find(*pattern, "Regex");
      if (regex == nullptr || !regex->is_string()) {
        return f.Unsupported(StrCat(at, ".pattern"),
                             StrCat("only Regex patterns are supported, got ", pattern->dump()));
      }
      if (behavior.value_or("") != "Isolated" || invert.value_or(false)) {
        return f.Unsupported(at, StrCat("Split behavior ", Quoted(behavior.value_or("")),
                                        invert.value_or(false) ? " inverted" : "",
                                        " is not supported (only Isolated)"));
      }
      splits.push_back(Canonical(regex->get<std::string>()));
    } else if (type == "Digits") {
      PD_ASSIGN_OR_RETURN(std::optional<bool> each, f.OptBool(*step, at, "individual_digits"));
      splits.push_back(each.value_or(false) ? R"(\p{N})" : R"(\p{N}+)");
    } else {
      return f.Unsupported(at, StrCat("pre-tokenizer ", Quoted(type), " is not supported"));
    }
  }
  if (!byte_level) {
    return f.Unsupported("pre_tokenizer",
                         "a BPE model without byte_fallback needs a ByteLevel pre-tokenizer; "
                         "there is none");
  }
  return splits;
}

// The llama.cpp pre-tokenizer name for byte-level BPE (see Definitions()).
absl::StatusOr<std::string> ChoosePre(const JsonFile& f, const std::vector<std::string>& splits,
                                      bool ignore_merges, std::optional<bool> clean_spaces) {
  for (const PreDefinition& def : Definitions()) {
    if (def.splits.size() != splits.size()) continue;
    bool same = true;
    for (size_t i = 0; i < splits.size() && same; ++i) same = Canonical(def.splits[i]) == splits[i];
    if (!same) continue;
    std::string chosen;
    for (std::string_view name : def.names) {
      absl::StatusOr<tokenizer_internal::PreTokenizerSpec> spec =
          tokenizer_internal::PreTokenizerSpecFor(name);
      PD_CHECK_OK(spec.status());  // the table names only types pdserve runs
      if (spec->ignore_merges != ignore_merges) continue;
      if (chosen.empty()) chosen = std::string(name);
      if (clean_spaces.has_value() && spec->clean_spaces == *clean_spaces) {
        chosen = std::string(name);
        break;
      }
    }
    if (chosen.empty()) {
      return f.Unsupported("model.ignore_merges",
                           StrCat("the pre-tokenizer is ", def.family,
                                  "'s, but with ignore_merges ", ignore_merges ? "true" : "false",
                                  ", which no llama.cpp pre-tokenizer type of it has"));
    }
    return chosen;
  }
  std::string quoted;
  for (size_t i = 0; i < splits.size(); ++i) {
    quoted += StrCat(i ? ", then " : "", Quoted(splits[i]));
  }
  return f.Unsupported(
      "pre_tokenizer",
      StrCat("unknown pre-tokenizer: splits by ", quoted.empty() ? "nothing" : quoted,
             "; no llama.cpp pre-tokenizer type is known to match it"));
}

// SentencePiece-style BPE: whether a space is put before the text (Prepend / Metaspace), and
// whether the text is split before each U+2581 (Metaspace split). UNIMPLEMENTED for anything
// else.
struct SpmSetup {
  bool add_space_prefix = false;
  bool split_at_spaces = false;
};

// A Metaspace pre-tokenizer step: spaces become U+2581 (another replacement is UNIMPLEMENTED),
// `scheme` is its prepend_scheme (always / first / never; older files' add_prefix_space gives
// always or never), `split` whether it splits before each U+2581.
struct Metaspace {
  std::string scheme;
  bool split = true;
};

absl::StatusOr<Metaspace> ReadMetaspace(const JsonFile& f, const json& step,
                                        const std::string& at) {
  PD_ASSIGN_OR_RETURN(std::optional<std::string> rep, f.OptString(step, at, "replacement"));
  if (rep.value_or(std::string(kSpaceEscape)) != kSpaceEscape) {
    return f.Unsupported(
        at, StrCat("Metaspace replacement ", Quoted(*rep), " is not supported (only U+2581)"));
  }
  PD_ASSIGN_OR_RETURN(std::optional<std::string> scheme, f.OptString(step, at, "prepend_scheme"));
  PD_ASSIGN_OR_RETURN(std::optional<bool> add_prefix, f.OptBool(step, at, "add_prefix_space"));
  if (scheme.has_value() && *scheme != "always" && *scheme != "first" && *scheme != "never") {
    return f.Invalid(JsonFile::Join(at, "prepend_scheme"),
                     StrCat("expected always, first or never, got ", Quoted(*scheme)));
  }
  PD_ASSIGN_OR_RETURN(std::optional<bool> split, f.OptBool(step, at, "split"));
  return Metaspace{scheme.value_or(add_prefix.value_or(true) ? "always" : "never"),
                   split.value_or(true)};
}

absl::StatusOr<SpmSetup> ReadSpmSetup(const JsonFile& f) {
  SpmSetup s;
  bool replace = false, prepend = false;
  if (const json* norm = JsonFile::Find(f.root(), "normalizer")) {
    std::vector<std::pair<const json*, std::string>> steps;
    PD_RETURN_IF_ERROR(Flatten(f, *norm, "normalizer", "normalizers", &steps));
    for (const auto& [step, at] : steps) {
      const std::string type = TypeOf(*step);
      if (type == "Prepend") {
        PD_ASSIGN_OR_RETURN(std::optional<std::string> p, f.OptString(*step, at, "prepend"));
        if (p.value_or("") != kSpaceEscape) {
          return f.Unsupported(
              at, StrCat("Prepend of ", Quoted(p.value_or("")), " is not supported (only U+2581)"));
        }
        prepend = true;
      } else if (type == "Replace") {
        PD_ASSIGN_OR_RETURN(const json* pattern, f.Require(*step, at, "pattern"));
        const json* str = JsonFile::Find(*pattern, "String");
        PD_ASSIGN_OR_RETURN(std::optional<std::string> content, f.OptString(*step, at, "content"));
        if (str == nullptr || !str->is_string() || str->get<std::string>() != " " ||
            content.value_or("") != kSpaceEscape) {
          return f.Unsupported(
              at, StrCat("Replace ", pattern->dump(), " -> ", Quoted(content.value_or("")),
                         " is not supported (only \" \" -> U+2581)"));
        }
        replace = true;
      } else {
        return f.Unsupported(at, StrCat("normalizer ", Quoted(type), " is not supported"));
      }
    }
  }
  bool metaspace = false;
  if (const json* pre = JsonFile::Find(f.root(), "pre_tokenizer")) {
    std::vector<std::pair<const json*, std::string>> steps;
    PD_RETURN_IF_ERROR(Flatten(f, *pre, "pre_tokenizer", "pretokenizers", &steps));
    for (const auto& [step, at] : steps) {
      const std::string type = TypeOf(*step);
      if (type != "Metaspace" || metaspace) {
        return f.Unsupported(at, StrCat("pre-tokenizer ", Quoted(type),
                                        " is not supported for a "
                                        "SentencePiece-style BPE (only one Metaspace)"));
      }
      PD_ASSIGN_OR_RETURN(const Metaspace m, ReadMetaspace(f, *step, at));
      s.add_space_prefix = m.scheme != "never";
      s.split_at_spaces = m.split;
      metaspace = true;
    }
  }
  if (metaspace && (replace || prepend)) {
    return f.Unsupported("normalizer",
                         "a U+2581 normalizer together with a Metaspace "
                         "pre-tokenizer is not supported");
  }
  if (!metaspace) {
    if (!replace) {
      return f.Unsupported("normalizer",
                           "a BPE model with byte_fallback needs spaces made U+2581 (a Replace "
                           "normalizer or a Metaspace pre-tokenizer); there is neither");
    }
    s.add_space_prefix = prepend;
  }
  return s;
}

// Unigram: the GGUF flags and charsmap its normalizer and pre-tokenizer map onto, or
// UNIMPLEMENTED naming the step that maps onto none.
struct UgmSetup {
  bool add_space_prefix = false;
  bool split_at_spaces = false;
  bool remove_extra_whitespaces = false;
  std::string charsmap;
};

absl::StatusOr<UgmSetup> ReadUgmSetup(const JsonFile& f) {
  UgmSetup s;
  bool squeeze = false, strip = false;
  if (const json* norm = JsonFile::Find(f.root(), "normalizer")) {
    std::vector<std::pair<const json*, std::string>> steps;
    PD_RETURN_IF_ERROR(Flatten(f, *norm, "normalizer", "normalizers", &steps));
    for (size_t i = 0; i < steps.size(); ++i) {
      const auto& [step, at] = steps[i];
      const std::string type = TypeOf(*step);
      if (type == "Precompiled" && i == 0) {
        PD_ASSIGN_OR_RETURN(std::optional<std::string> b64,
                            f.OptString(*step, at, "precompiled_charsmap"));
        std::string blob;
        if (!absl::Base64Unescape(ToAbsl(b64.value_or("")), &blob)) {
          return f.Invalid(JsonFile::Join(at, "precompiled_charsmap"), "not valid base64");
        }
        if (!blob.empty()) {
          absl::StatusOr<std::unique_ptr<tokenizer_internal::PrecompiledCharsmap>> map =
              tokenizer_internal::PrecompiledCharsmap::Parse(
                  absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(blob.data()), blob.size()));
          if (!map.ok()) {
            return f.Invalid(JsonFile::Join(at, "precompiled_charsmap"),
                             std::string(map.status().message()));
          }
        }
        s.charsmap = std::move(blob);
      } else if (type == "Replace") {
        // transformers' SentencePiece converter: runs of spaces become one.
        PD_ASSIGN_OR_RETURN(const json* pattern, f.Require(*step, at, "pattern"));
        const json* regex = JsonFile::Find(*pattern, "Regex");
        PD_ASSIGN_OR_RETURN(std::optional<std::string> content, f.OptString(*step, at, "content"));
        if (regex == nullptr || !regex->is_string() || regex->get<std::string>() != " {2,}" ||
            (content.value_or("") != " " && content.value_or("") != kSpaceEscape)) {
          return f.Unsupported(
              at, StrCat("Replace ", pattern->dump(), " -> ", Quoted(content.value_or("")),
                         " is not supported for a Unigram model (only Regex \" {2,}\" -> \" \" "
                         "or U+2581)"));
        }
        squeeze = true;
      } else if (type == "Strip") {
        PD_ASSIGN_OR_RETURN(std::optional<bool> left, f.OptBool(*step, at, "strip_left"));
        PD_ASSIGN_OR_RETURN(std::optional<bool> right, f.OptBool(*step, at, "strip_right"));
        if (left.value_or(false) || !right.value_or(false)) {
          return f.Unsupported(at, "Strip is supported for a Unigram model only of the right end");
        }
        strip = true;
      } else {
        return f.Unsupported(
            at, StrCat("normalizer ", Quoted(type),
                       " is not supported for a Unigram model (supported: a first Precompiled, "
                       "Replace of \" {2,}\", Strip of the right end): a GGUF Unigram vocabulary "
                       "normalizes only by a precompiled charsmap"));
      }
    }
  }
  if (strip && !squeeze) {
    return f.Unsupported("normalizer",
                         "Strip without Replace of \" {2,}\" is not supported for a Unigram model");
  }
  bool metaspace = false, whitespace_split = false;
  std::string scheme_used;
  if (const json* pre = JsonFile::Find(f.root(), "pre_tokenizer")) {
    std::vector<std::pair<const json*, std::string>> steps;
    PD_RETURN_IF_ERROR(Flatten(f, *pre, "pre_tokenizer", "pretokenizers", &steps));
    for (const auto& [step, at] : steps) {
      const std::string type = TypeOf(*step);
      if (type == "WhitespaceSplit" && !metaspace && !whitespace_split) {
        whitespace_split = true;
        continue;
      }
      if (type != "Metaspace" || metaspace) {
        return f.Unsupported(at, StrCat("pre-tokenizer ", Quoted(type),
                                        " is not supported for a Unigram model (only one "
                                        "Metaspace, possibly after WhitespaceSplit)"));
      }
      PD_ASSIGN_OR_RETURN(const Metaspace m, ReadMetaspace(f, *step, at));
      scheme_used = m.scheme;
      s.add_space_prefix = m.scheme != "never";
      s.split_at_spaces = m.split;
      metaspace = true;
    }
  }
  if (!metaspace) {
    return f.Unsupported("pre_tokenizer",
                         "a Unigram model needs a Metaspace pre-tokenizer (spaces as U+2581); "
                         "there is none");
  }
  if (whitespace_split) {
    // Words split at whitespace, each given a U+2581: llama.cpp's remove_extra_whitespaces,
    // which puts a U+2581 before every word.
    if (scheme_used != "always") {
      return f.Unsupported("pre_tokenizer",
                           StrCat("WhitespaceSplit with Metaspace prepend_scheme ",
                                  Quoted(scheme_used), " is not supported (only always)"));
    }
    s.remove_extra_whitespaces = true;
  }
  if (squeeze) s.remove_extra_whitespaces = true;
  return s;
}

// The decoder must turn the model's pieces back into text the way llama.cpp's decoder for the
// chosen model does.
absl::Status CheckDecoder(const JsonFile& f, bool byte_level, bool unigram) {
  const json* dec = JsonFile::Find(f.root(), "decoder");
  std::vector<std::pair<const json*, std::string>> steps;
  if (dec != nullptr) PD_RETURN_IF_ERROR(Flatten(f, *dec, "decoder", "decoders", &steps));
  bool ok = false;
  for (const auto& [step, at] : steps) {
    const std::string type = TypeOf(*step);
    if (unigram) {
      ok |= type == "Metaspace" || type == "Replace";
    } else {
      ok |= byte_level ? type == "ByteLevel" : type == "ByteFallback";
    }
  }
  if (ok) return absl::OkStatus();
  if (unigram) {
    return f.Unsupported("decoder",
                         "a Unigram model needs a Metaspace decoder (or a Replace of U+2581)");
  }
  return f.Unsupported("decoder", byte_level ? "a byte-level BPE needs a ByteLevel decoder"
                                             : "a SentencePiece-style BPE needs a ByteFallback "
                                               "decoder");
}

// ---- SpecialVocab (gguf-py/gguf/vocab.py) -----------------------------------------------------
//
// Special-token ids and add_* flags derived from tokenizer.json's post_processor and added_tokens,
// tokenizer_config.json and config.json, the way SpecialVocab derives them (its crude reading of
// TemplateProcessing included). One departure: tokenizer_config.json's *_token values in the
// AddedToken form ({"content": ...}) are taken by their content also where SpecialVocab compares
// the raw value (TemplateProcessing), so that they are not mistaken for different tokens.
class SpecialVocab {
 public:
  SpecialVocab(const std::vector<AddedToken>& added, int32_t n_vocab)
      : added_(added), n_vocab_(n_vocab) {}

  absl::Status Load(const JsonFile& tokenizer, const std::optional<JsonFile>& config_file,
                    const std::optional<JsonFile>& model_config, const std::string& dir,
                    GgufVocab* out) {
    const json empty = json::object();
    const json& tc = config_file.has_value() ? config_file->root() : empty;
    // Python's truthiness of the tokenizer_config dict: absent or empty counts as absent.
    const bool have_tc = config_file.has_value() && !config_file->root().empty();
    for (const char* key : {"bos", "eos", "cls", "sep"}) {
      tokens_[key] = ContentOf(JsonFile::Find(tc, StrCat(key, "_token")));
    }
    if (!Truthy("bos") && Truthy("cls") && have_tc) tokens_["bos"] = tokens_["cls"];
    if (!Truthy("eos") && Truthy("sep") && have_tc) tokens_["eos"] = tokens_["sep"];
    if (const json* pp = JsonFile::Find(tokenizer.root(), "post_processor")) {
      PostProcessor(*pp, have_tc);
    }
    if (have_tc) PD_RETURN_IF_ERROR(FromConfig(*config_file, dir, out));
    if (model_config.has_value()) {
      const json& mc = model_config->root();
      const json* text_config = JsonFile::Find(mc, "text_config");
      for (const std::string& type : types_) {
        const json* id = JsonFile::Find(mc, StrCat(type, "_token_id"));
        if (id == nullptr && text_config != nullptr) {
          id = JsonFile::Find(*text_config, StrCat(type, "_token_id"));
        }
        if (id == nullptr || !id->is_number_integer()) continue;  // lists are ignored too
        if (!id->is_number_unsigned()) {
          return model_config->Invalid(StrCat(type, "_token_id"),
                                       StrCat("invalid token id ", id->dump()));
        }
        // SpecialVocab skips ids past the vocabulary when it knows its size; pdserve always does
        // (a tokenizer folder beside a bigger model's config.json).
        if (id->get<uint64_t>() < static_cast<uint64_t>(n_vocab_)) {
          SetId(type, static_cast<int32_t>(id->get<uint64_t>()));
        }
      }
    }
    // Only the types gguf-py's writer has keys for.
    const std::pair<std::string_view, std::optional<int32_t>*> ids[] = {
        {"bos", &out->bos}, {"eos", &out->eos},   {"unk", &out->unk}, {"sep", &out->sep},
        {"pad", &out->pad}, {"mask", &out->mask}, {"eot", &out->eot}, {"eom", &out->eom}};
    for (const auto& [type, slot] : ids) {
      const auto it = ids_.find(std::string(type));
      if (it != ids_.end()) *slot = it->second;
    }
    const std::pair<std::string_view, std::optional<bool>*> adds[] = {
        {"bos", &out->add_bos}, {"eos", &out->add_eos}, {"sep", &out->add_sep}};
    for (const auto& [type, slot] : adds) {
      const auto it = add_.find(std::string(type));
      if (it != add_.end()) *slot = it->second;
    }
    return absl::OkStatus();
  }

 private:
  bool Truthy(const std::string& type) const {
    const auto it = tokens_.find(type);
    return it != tokens_.end() && it->second.has_value() && !it->second->empty();
  }
  bool Is(const std::string& type, const std::optional<std::string>& s) const {
    const auto it = tokens_.find(type);
    return s.has_value() && it != tokens_.end() && it->second == s;
  }
  bool HasType(std::string_view type) const {
    return std::find(types_.begin(), types_.end(), type) != types_.end();
  }
  void SetId(const std::string& type, int32_t id) {
    if (id < n_vocab_) ids_.emplace(type, id);  // the first one set wins
  }
  // entry.SpecialToken.id of a template entry.
  static std::optional<std::string> SpecialTokenOf(const json& entry) {
    const json* st = JsonFile::Find(entry, "SpecialToken");
    const json* id = st == nullptr ? nullptr : JsonFile::Find(*st, "id");
    if (id == nullptr || !id->is_string() || id->get<std::string>().empty()) return std::nullopt;
    return id->get<std::string>();
  }
  static std::optional<std::string> SequenceOf(const json& entry) {
    const json* seq = JsonFile::Find(entry, "Sequence");
    const json* id = seq == nullptr ? nullptr : JsonFile::Find(*seq, "id");
    if (id == nullptr || !id->is_string()) return std::nullopt;
    return id->get<std::string>();
  }

  void PostProcessor(const json& pp, bool have_tc) {
    std::vector<const json*> processors;
    if (const json* list = JsonFile::Find(pp, "processors"); list != nullptr && list->is_array()) {
      for (const json& p : *list) processors.push_back(&p);
    } else {
      processors.push_back(&pp);
    }
    for (const json* p : processors) {
      const std::string type = TypeOf(*p);
      if (type == "ByteLevel") {
        add_.emplace("bos", false);
        add_.emplace("eos", false);
      } else if (type == "RobertaProcessing") {
        add_["bos"] = add_["eos"] = add_["sep"] = true;
        auto first_of = [&](std::string_view key, const std::string& fallback) {
          const json* v = JsonFile::Find(*p, key);
          if (v != nullptr && v->is_array() && !v->empty() && (*v)[0].is_string()) {
            return std::optional<std::string>((*v)[0].get<std::string>());
          }
          return tokens_[fallback];
        };
        if (!Truthy("cls") && have_tc) tokens_["cls"] = first_of("cls", "bos");
        if (!Truthy("sep") && have_tc) tokens_["sep"] = first_of("sep", "eos");
      } else if (type == "TemplateProcessing") {
        Template(*p, have_tc);
      }
    }
  }

  void Template(const json& p, bool have_tc) {
    static const json kEmpty = json::array();
    const json* single_json = JsonFile::Find(p, "single");
    const json* pair_json = JsonFile::Find(p, "pair");
    const json& single = single_json != nullptr && single_json->is_array() ? *single_json : kEmpty;
    const json& pair = pair_json != nullptr && pair_json->is_array() ? *pair_json : kEmpty;
    std::optional<std::string> first, last;
    if (single.size() > 1) {
      first = SpecialTokenOf(single.front());
      if (first.has_value()) {
        if (!have_tc) {
          tokens_["bos"] = first;
        } else if (!Is("bos", first) && !Is("cls", first)) {
          if (!Truthy("bos")) tokens_["bos"] = first;
          if (!Truthy("cls")) tokens_["cls"] = first;
        }
        add_["bos"] = Is("bos", first) || Is("cls", first);
      }
      last = SpecialTokenOf(single.back());
      if (last.has_value()) {
        if (!have_tc) {
          tokens_["eos"] = last;
        } else if (!Is("eos", last)) {
          // The old EOS becomes EOT (or EOM) and the template's last token EOS.
          if (!HasType("eot")) {
            types_.push_back("eot");
            tokens_["eot"] = tokens_["eos"];
          } else if (!HasType("eom")) {
            types_.push_back("eom");
            tokens_["eom"] = tokens_["eos"];
          }
          tokens_["eos"] = last;
        }
        add_["eos"] = Is("eos", last);
      }
    }
    if (pair.empty()) return;
    size_t begin = 0, end = pair.size();
    if (first.has_value() && SpecialTokenOf(pair.front()) == first) begin = 1;
    if (last.has_value() && SpecialTokenOf(pair.back()) == last) --end;
    if (begin >= end) return;
    if (SequenceOf(pair[begin]) != "A" || SequenceOf(pair[end - 1]) != "B") return;
    ++begin, --end;  // A [sep] [eos] B: what lies between
    if (begin >= end) return;
    bool add_sep = false;
    const std::optional<std::string> mid = SpecialTokenOf(pair[begin]);
    if (mid.has_value() && (Is("sep", mid) || Is("eos", mid)) && !last.has_value()) add_sep = true;
    if (end - begin == 2) {
      const std::optional<std::string> mid2 = SpecialTokenOf(pair[begin + 1]);
      if (mid2.has_value() && (Is("sep", mid2) || Is("eos", mid2))) add_sep = true;
    }
    add_["sep"] = add_sep;
    if (add_sep && !Truthy("sep") && have_tc) tokens_["sep"] = tokens_["eos"];
  }

  absl::Status FromConfig(const JsonFile& cf, const std::string& dir, GgufVocab* out) {
    const json& tc = cf.root();
    // The chat template: tokenizer_config.json's, else chat_template.jinja (with
    // additional_chat_templates/*.jinja as named ones), else chat_template.json's.
    json alt;
    const json* tmpl = nullptr;
    if (const auto it = tc.find("chat_template"); it != tc.end()) {
      tmpl = &*it;
    } else if (std::optional<std::string> jinja = ReadOptional(dir + "/chat_template.jinja")) {
      alt = *jinja;
      std::error_code ec;
      for (const auto& e :
           std::filesystem::directory_iterator(dir + "/additional_chat_templates", ec)) {
        if (e.path().extension() != ".jinja") continue;
        if (alt.is_string()) alt = json::array({{{"name", "default"}, {"template", *jinja}}});
        alt.push_back({{"name", e.path().stem().string()},
                       {"template", ReadOptional(e.path().string()).value_or("")}});
      }
      tmpl = &alt;
    } else {
      PD_ASSIGN_OR_RETURN(std::optional<JsonFile> tj,
                          JsonFile::Load(dir + "/chat_template.json", false));
      if (tj.has_value()) {
        if (const json* t = JsonFile::Find(tj->root(), "chat_template")) alt = *t;
        tmpl = &alt;
      }
    }
    if (tmpl != nullptr && tmpl->is_string()) {
      out->chat_template = tmpl->get<std::string>();
    } else if (tmpl != nullptr && tmpl->is_array()) {
      // [{"name": ..., "template": ...}]: "default" is the template, the others are named (gguf-py
      // writes names with every character but [A-Za-z0-9] made '_').
      for (size_t i = 0; i < tmpl->size(); ++i) {
        const json& e = (*tmpl)[i];
        if (!e.is_object()) {
          return cf.WrongType(StrCat("chat_template[", i, "]"), "an object", e);
        }
        std::string name = ContentOf(JsonFile::Find(e, "name")).value_or("");
        const json* body = JsonFile::Find(e, "template");
        for (char& c : name) {
          if (!absl::ascii_isalnum(static_cast<unsigned char>(c))) c = '_';
        }
        if (name.empty() || body == nullptr || !body->is_string()) continue;
        if (name == "default") {
          out->chat_template = body->get<std::string>();
        } else {
          out->named_chat_templates.emplace_back(name, body->get<std::string>());
        }
      }
      std::sort(out->named_chat_templates.begin(), out->named_chat_templates.end());
    }
    // Other types of chat_template are ignored, as SpecialVocab ignores them.

    for (const std::string& type : types_) {
      const json* add = JsonFile::Find(tc, StrCat("add_", type, "_token"));
      if (add != nullptr && add->is_boolean())
        add_.emplace(type, add->get<bool>());  // keeps
                                               // the
                                               // post_processor's
      std::optional<std::string> content;
      if (const auto t = tokens_.find(type); t != tokens_.end()) {
        content = t->second;
      } else {
        content = ContentOf(JsonFile::Find(tc, StrCat(type, "_token")));
      }
      if (!content.has_value()) continue;
      for (const AddedToken& a : added_) {  // the first match
        if (a.content == *content) {
          SetId(type, a.id);
          break;
        }
      }
    }
    return absl::OkStatus();
  }

  const std::vector<AddedToken>& added_;
  const int32_t n_vocab_;
  std::vector<std::string> types_ = {"bos", "eos", "unk", "sep", "pad", "cls", "mask"};
  // tokenizer_config.json's *_token contents, as SpecialVocab rewrites them.
  std::map<std::string, std::optional<std::string>> tokens_;
  std::map<std::string, bool> add_;
  std::map<std::string, int32_t> ids_;
};

// ---- SentencePiece-style scores -----------------------------------------------------------------

// model.vocab by id.
std::vector<std::pair<int32_t, std::string_view>> ById(const HfModel& m) {
  std::vector<std::pair<int32_t, std::string_view>> v;
  v.reserve(m.vocab.size());
  for (const auto& [text, id] : m.vocab) v.emplace_back(id, text);
  std::sort(v.begin(), v.end());
  return v;
}

// Start of each UTF-8 character of `s` after the first.
std::vector<size_t> CharBoundaries(std::string_view s) {
  std::vector<size_t> cuts;
  for (size_t i = 1; i < s.size(); ++i) {
    if ((static_cast<unsigned char>(s[i]) & 0xC0) != 0x80) cuts.push_back(i);
  }
  return cuts;
}

// Scores under which merging by score (pdserve's and llama.cpp's SentencePiece encoder) is
// merging by rank (Hugging Face's BPE): a token formed by merges scores minus the rank of the
// first one; every other token scores below all of them. UNIMPLEMENTED when the merges are not
// complete (a split of a token into two tokens that is not a merge: SentencePiece would merge it,
// Hugging Face would not). Added tokens are left out of that check: Hugging Face takes their text
// out before the model sees it, and so does pdserve when it parses special-token text.
absl::StatusOr<std::vector<float>> SpmScores(const JsonFile& f, const HfModel& m,
                                             const std::vector<AddedToken>& added,
                                             const std::vector<std::string>& tokens) {
  absl::flat_hash_set<std::string> merges;
  merges.reserve(m.merges.size());
  for (const auto& [l, r] : m.merges) merges.insert(StrCat(l, " ", r));
  absl::flat_hash_set<std::string_view> added_texts;
  for (const AddedToken& a : added) added_texts.insert(a.content);
  for (const auto& [id, text] : ById(m)) {  // by id: the first offender is named
    if (IsByteToken(text) || added_texts.contains(text)) continue;
    for (size_t cut : CharBoundaries(text)) {
      const std::string_view l = std::string_view(text).substr(0, cut);
      const std::string_view r = std::string_view(text).substr(cut);
      if (!m.vocab.contains(ToAbsl(l)) || !m.vocab.contains(ToAbsl(r))) continue;
      if (merges.contains(StrCat(l, " ", r))) continue;
      return f.Unsupported(
          "model.merges",
          StrCat("token ", Quoted(text), " (id ", id, ") is ", Quoted(l), " + ", Quoted(r),
                 ", both tokens, but that is not a merge: these are not the merges of a "
                 "SentencePiece model (a BPE trained with byte_fallback by the tokenizers library "
                 "is not supported yet), so pdserve's SentencePiece encoder would merge "
                 "differently from Hugging Face's BPE"));
    }
  }
  const float lowest = -static_cast<float>(m.merges.size()) - 1;
  std::vector<float> scores(tokens.size(), lowest);
  for (size_t r = m.merges.size(); r-- > 0;) {  // the first merge of a token wins
    const auto& [left, right] = m.merges[r];
    const int32_t id = m.vocab.find(left + right)->second;
    scores[id] = -static_cast<float>(r);
  }
  return scores;
}

}  // namespace

absl::StatusOr<GgufVocab> ReadHfTokenizer(const std::string& dir) {
  PD_ASSIGN_OR_RETURN(std::optional<JsonFile> tok_file,
                      JsonFile::Load(dir + "/tokenizer.json", /*required=*/true));
  const JsonFile& f = *tok_file;
  PD_ASSIGN_OR_RETURN(std::optional<JsonFile> config_file,
                      JsonFile::Load(dir + "/tokenizer_config.json", false));
  PD_ASSIGN_OR_RETURN(std::optional<JsonFile> model_config,
                      JsonFile::Load(dir + "/config.json", false));

  PD_ASSIGN_OR_RETURN(HfModel m, ReadModel(f));
  PD_ASSIGN_OR_RETURN(std::vector<AddedToken> added, ReadAddedTokens(f));
  const bool byte_level = !m.byte_fallback && !m.unigram;

  GgufVocab v;
  SpmSetup spm;
  UgmSetup ugm;
  if (m.unigram) {
    v.model = "t5";
    PD_ASSIGN_OR_RETURN(ugm, ReadUgmSetup(f));
    v.add_space_prefix = ugm.add_space_prefix;
    v.remove_extra_whitespaces = ugm.remove_extra_whitespaces;
    v.precompiled_charsmap = ugm.charsmap;
  } else if (byte_level) {
    v.model = "gpt2";
    if (const json* norm = JsonFile::Find(f.root(), "normalizer")) {
      std::vector<std::pair<const json*, std::string>> steps;
      PD_RETURN_IF_ERROR(Flatten(f, *norm, "normalizer", "normalizers", &steps));
      for (const auto& [step, at] : steps) {
        // NFC is accepted as llama.cpp accepts it (Qwen 2): neither normalises, so text that is
        // not in NFC can tokenize differently from Hugging Face.
        if (TypeOf(*step) != "NFC") {
          return f.Unsupported(at, StrCat("normalizer ", Quoted(TypeOf(*step)),
                                          " is not supported for a byte-level BPE (only NFC)"));
        }
      }
    }
    PD_ASSIGN_OR_RETURN(std::vector<std::string> splits, ByteLevelSplits(f));
    std::optional<bool> clean_spaces;
    if (config_file.has_value()) {
      PD_ASSIGN_OR_RETURN(clean_spaces, config_file->OptBool(config_file->root(), "",
                                                             "clean_up_tokenization_spaces"));
    }
    PD_ASSIGN_OR_RETURN(v.pre, ChoosePre(f, splits, m.ignore_merges, clean_spaces));
  } else {
    v.model = "llama";
    v.pre = "default";  // what llama.cpp writes for it
    if (m.ignore_merges) {
      return f.Unsupported("model.ignore_merges",
                           "ignore_merges with byte_fallback is not supported");
    }
    PD_ASSIGN_OR_RETURN(spm, ReadSpmSetup(f));
    v.add_space_prefix = spm.add_space_prefix;
  }
  PD_RETURN_IF_ERROR(CheckDecoder(f, byte_level, m.unigram));

  // ---- tokens: model.vocab, then added_tokens over it ----
  // The vocabulary size: every distinct token (ids must then be dense), or config.json's
  // vocab_size when larger (byte-level BPE, as get_vocab_base: the rest become [PADn]).
  absl::flat_hash_map<std::string, int32_t> text_to_id(m.vocab.begin(), m.vocab.end());
  for (const AddedToken& a : added) text_to_id[a.content] = a.id;  // added ones win
  int64_t n = static_cast<int64_t>(text_to_id.size());
  if (byte_level && model_config.has_value()) {
    const json& mc = model_config->root();
    const json* size = JsonFile::Find(mc, "vocab_size");
    if (size == nullptr) {
      if (const json* tc = JsonFile::Find(mc, "text_config"))
        size = JsonFile::Find(*tc, "vocab_size");
    }
    if (size != nullptr) {
      if (!size->is_number_integer() || size->get<int64_t>() <= 0 ||
          size->get<int64_t>() >= INT32_MAX) {
        return model_config->WrongType("vocab_size", "a positive integer", *size);
      }
      if (size->get<int64_t>() < n) {
        return model_config->Invalid("vocab_size", StrCat("is ", size->dump(), " but ",
                                                          tok_file->path(), " has ", n, " tokens"));
      }
      n = size->get<int64_t>();
    }
  }
  std::vector<std::optional<std::string>> slots(n);
  std::vector<int32_t> types(n, kNormal);
  const std::string range =
      StrCat("ids must be below ", n, ", the number of tokens (model.vocab and added_tokens",
             byte_level && model_config.has_value() ? ", or config.json's vocab_size)" : ")");
  for (const auto& [id, text] : ById(m)) {
    if (id >= n) {
      return f.Invalid(StrCat("model.vocab[", Quoted(text), "]"),
                       StrCat("id ", id, " is out of range: ", range));
    }
    // An added token with this text under another id took it: this id is a hole.
    if (text_to_id.find(ToAbsl(text))->second != id) continue;
    slots[id] = std::string(text);
    if (!byte_level && (!m.unigram || m.byte_fallback) && IsByteToken(text)) types[id] = kByte;
  }
  std::set<int32_t> added_ids;
  for (size_t i = 0; i < added.size(); ++i) {
    const AddedToken& a = added[i];
    const std::string at = StrCat("added_tokens[", i, "]");
    if (a.id >= n) {
      return f.Invalid(StrCat(at, ".id"), StrCat("id ", a.id, " is out of range: ", range));
    }
    if (!added_ids.insert(a.id).second) {
      return f.Invalid(StrCat(at, ".id"), StrCat("id ", a.id, " is added twice"));
    }
    if (slots[a.id].has_value() && *slots[a.id] != a.content) {
      return f.Invalid(at, StrCat("id ", a.id, " is ", Quoted(a.content), " here but ",
                                  Quoted(*slots[a.id]), " in model.vocab"));
    }
    if (text_to_id[a.content] != a.id) {
      return f.Invalid(at, StrCat(Quoted(a.content), " is added twice"));
    }
    std::string text = a.content;
    if (a.special || LooksSpecial(text)) {
      types[a.id] = kControl;
    } else {
      // llama.cpp matches user-defined tokens in the raw text, where spaces are spaces.
      types[a.id] = kUserDefined;
      size_t pos = 0;
      while ((pos = text.find(kSpaceEscape, pos)) != std::string::npos) text.replace(pos, 3, " ");
    }
    slots[a.id] = std::move(text);
  }
  v.tokens.resize(n);
  for (int64_t id = 0; id < n; ++id) {
    if (slots[id].has_value()) {
      v.tokens[id] = std::move(*slots[id]);
    } else {
      v.tokens[id] = StrCat("[PAD", id, "]");
      types[id] = kUnused;
    }
  }
  v.token_types = std::move(types);
  {
    absl::flat_hash_map<std::string_view, int64_t> seen;
    for (int64_t id = 0; id < n; ++id) {
      const auto [it, fresh] = seen.emplace(v.tokens[id], id);
      if (!fresh) {
        return f.Invalid(
            "", StrCat("tokens ", it->second, " and ", id, " are both ", Quoted(v.tokens[id]),
                       " (once user-defined U+2581 are spaces)"));
      }
    }
  }

  // SentencePiece types its unknown piece so, whether or not it is also an added token.
  if (m.unigram) v.token_types[*m.unk_id] = kUnknown;

  // ---- merges / scores ----
  if (m.unigram) {
    v.scores.assign(n, 0.0f);
    for (size_t id = 0; id < m.scores.size(); ++id) v.scores[id] = static_cast<float>(m.scores[id]);
    if (ugm.split_at_spaces) {
      // Hugging Face searches each piece between U+2581 on its own; llama.cpp searches the whole
      // text, which is the same only while no token holds U+2581 after its start.
      for (const auto& [id, text] : ById(m)) {
        if (text.find(kSpaceEscape, 1) != std::string::npos) {
          return f.Unsupported("pre_tokenizer.split",
                               StrCat("Metaspace split with token ", Quoted(text), " (id ", id,
                                      "), which holds U+2581 after its start, is not supported"));
        }
      }
    }
  } else if (byte_level) {
    v.merges.reserve(m.merges.size());
    for (const auto& [l, r] : m.merges) {
      if (!m.merges_are_pairs) {
        v.merges.push_back(StrCat(l, " ", r));
        continue;
      }
      // The [a, b] form may hold spaces; SpecialVocab writes each as U+0120 so that the "a b"
      // string splits back.
      auto escape = [](const std::string& part) {
        std::string out;
        for (char c : part) {
          if (c == ' ') {
            out += "\xC4\xA0";
          } else {
            out.push_back(c);
          }
        }
        return out;
      };
      v.merges.push_back(StrCat(escape(l), " ", escape(r)));
    }
  } else {
    PD_ASSIGN_OR_RETURN(v.scores, SpmScores(f, m, added, v.tokens));
    if (spm.split_at_spaces) {
      // Hugging Face splits before each U+2581; the SentencePiece encoder merges across such a
      // point only into a token with U+2581 inside it.
      for (const auto& [id, text] : ById(m)) {
        if (text.find(kSpaceEscape, 1) != std::string::npos) {
          return f.Unsupported("pre_tokenizer.split",
                               StrCat("Metaspace split with token ", Quoted(text), " (id ", id,
                                      "), which holds U+2581 after its start, is not supported"));
        }
      }
    }
  }

  SpecialVocab special(added, static_cast<int32_t>(n));
  PD_RETURN_IF_ERROR(special.Load(f, config_file, model_config, dir, &v));
  if (m.unigram) {
    if (!v.unk.has_value()) v.unk = *m.unk_id;
    // Hugging Face adds only what the post_processor / tokenizer_config say; llama.cpp's t5
    // default is to add EOS.
    if (!v.add_bos.has_value()) v.add_bos = false;
    if (!v.add_eos.has_value()) v.add_eos = false;
  }
  return v;
}

}  // namespace pd::engine
