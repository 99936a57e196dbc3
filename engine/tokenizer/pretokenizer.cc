#include "engine/tokenizer/pretokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <atomic>

#include "common/log.h"
#include "common/status.h"
#include "common/strings.h"

namespace pd::engine::tokenizer_internal {
namespace {

// ---- patterns (PCRE2 syntax; \s is rewritten to White_Space at compile time) ----

// GPT-2's split: contractions, letter runs, digit runs and other-symbol runs (each with one
// optional leading space), then whitespace not followed by a non-space.
constexpr const char* kGpt2 =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S))";

// Llama 3 / tiktoken-style split. The case-insensitive contractions are spelled out with ASCII
// classes, which is what llama.cpp implements (its tolower never maps a non-ASCII letter onto
// s, t, r, e, v, m, l or d).
constexpr const char* kLlama3 =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|)"
    R"(\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// Qwen2: as Llama 3, but every digit is its own piece.
constexpr const char* kQwen2 =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|)"
    R"(\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// CJK unified ideographs U+4E00-U+9FA5, U+0800-U+4E00 and Hangul syllables/Jamo U+AC00-U+D7FF
// as one run (DeepSeek's pre-tokenizer).
constexpr const char* kCjkRun = R"([\x{4E00}-\x{9FA5}\x{0800}-\x{4E00}\x{AC00}-\x{D7FF}]+)";

PreTokenizerSpec Gpt2Spec() { return {{kGpt2}}; }

PreTokenizerSpec Llama3Spec(bool llama3_flags) {
  PreTokenizerSpec s{{kLlama3}};
  s.ignore_merges = llama3_flags;
  s.add_bos = llama3_flags;
  return s;
}

PreTokenizerSpec Qwen2Spec(bool clean_spaces) {
  PreTokenizerSpec s{{kQwen2}};
  s.clean_spaces = clean_spaces;
  return s;
}

PreTokenizerSpec StarcoderSpec(bool clean_spaces) {
  PreTokenizerSpec s{{R"(\p{N})", kGpt2}};
  s.clean_spaces = clean_spaces;
  return s;
}

bool In(std::string_view pre, std::initializer_list<std::string_view> names) {
  for (std::string_view n : names) {
    if (pre == n) return true;
  }
  return false;
}

// `\s` -> `\p{White_Space}`, `\S` -> `\P{White_Space}` (inside classes too); other escapes copied.
std::string RewriteWhitespace(std::string_view pattern) {
  std::string out;
  out.reserve(pattern.size() + 32);
  for (size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] == '\\' && i + 1 < pattern.size()) {
      const char c = pattern[i + 1];
      if (c == 's') {
        out += R"(\p{White_Space})";
      } else if (c == 'S') {
        out += R"(\P{White_Space})";
      } else {
        out += pattern.substr(i, 2);
      }
      ++i;
    } else {
      out += pattern[i];
    }
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
  if (pre.empty() || pre == "default") {
    return PreTokenizerSpec{{R"([\p{P}\$\+<=>\^~\|]+)", kGpt2, R"(\p{N}+)", "[0-9][0-9][0-9]"}};
  }
  if (In(pre, {"llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0",
               "lfm2", "jina-v5-nano"})) {
    return Llama3Spec(/*llama3_flags=*/true);
  }
  if (In(pre, {"dbrx", "smaug-bpe"})) return Llama3Spec(/*llama3_flags=*/false);
  if (In(pre, {"glm4", "chatglm-bpe"})) {
    PreTokenizerSpec s = Llama3Spec(/*llama3_flags=*/false);
    s.bos_disabled = true;
    return s;
  }
  if (In(pre, {"qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "hunyuan", "solar-open"})) {
    return Qwen2Spec(/*clean_spaces=*/false);
  }
  if (In(pre, {"stablelm2", "megrez"})) return Qwen2Spec(/*clean_spaces=*/true);
  if (pre == "deepseek-coder") {
    PreTokenizerSpec s{{"[\r\n]", R"(\s?\p{L}+)", R"(\s?\p{P}+)", kCjkRun, R"(\p{N})"}};
    s.clean_spaces = false;
    return s;
  }
  if (pre == "falcon") {
    return PreTokenizerSpec{{R"([\p{P}\$\+<=>\^~\|`]+)", kGpt2, "[0-9][0-9][0-9]"}};
  }
  if (In(pre, {"starcoder", "refact", "codeshell", "exaone", "minerva-7b", "mellum2"})) {
    return StarcoderSpec(/*clean_spaces=*/true);
  }
  if (In(pre, {"command-r", "smollm"})) return StarcoderSpec(/*clean_spaces=*/false);
  if (In(pre, {"gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v2-es", "jina-v2-de",
               "a.x-4.0", "mellum", "modern-bert", "exaone4", "mpt", "olmo", "jais"})) {
    return Gpt2Spec();
  }
  if (In(pre, {"trillion", "granite-docling"})) {
    PreTokenizerSpec s = Gpt2Spec();
    s.clean_spaces = false;
    return s;
  }
  return absl::InvalidArgumentError(
      StrCat("unsupported tokenizer.ggml.pre '", pre,
             "' (supported: default, gpt-2, llama3/llama-bpe, qwen2, starcoder, deepseek-coder, "
             "falcon and their aliases)"));
}

struct PreTokenizer::Pattern {
  pcre2_code* code = nullptr;
  ~Pattern() { pcre2_code_free(code); }
};

absl::StatusOr<std::unique_ptr<PreTokenizer>> PreTokenizer::Create(
    const std::vector<std::string>& patterns) {
  uint32_t have_jit = 0;
  pcre2_config(PCRE2_CONFIG_JIT, &have_jit);
  std::unique_ptr<PreTokenizer> pt(new PreTokenizer());
  for (const std::string& raw : patterns) {
    const std::string pattern = RewriteWhitespace(raw);
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
        if (m_end == m_begin) {
          // Empty match (none of the shipped patterns can produce one): a split point only.
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
