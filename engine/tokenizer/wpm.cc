// WordPiece tokenization (tokenizer.ggml.model = bert), id-compatible with llama.cpp's WPM
// tokenizer (BERT and its descendants: BGE, MiniLM, nomic-embed...).
//
// Each run of text between special tokens is handled on its own:
//  1. Words (SplitWpmWords). The run is decoded leniently (unicode.h: a byte that starts no UTF-8
//     sequence is U+FFFD). With strip_accents each code point is first replaced by the first code
//     point of its canonical decomposition, as llama.cpp's tables do: "é" becomes "e", a Hangul
//     syllable its leading consonant. Then white space ends the current word; U+0000, U+FFFD,
//     control characters (Cc, Cf, Co, Cs) and, with strip_accents, marks (M) are dropped;
//     punctuation (P), the ASCII symbols $ + < = > ^ ` | ~ and CJK ideographs (llama.cpp's list of
//     blocks, IsCjkIdeograph) are words of one character; anything else joins the current word,
//     mapped to its simple lowercase when `lowercase`. Character data: unicode.h (Unicode 15.1,
//     as llama.cpp's). A code point above U+10FFFF (a 4-byte form F4 90.. to F7 ..) is dropped;
//     llama.cpp aborts the process on it.
//  2. Pieces. Each word is prefixed with U+2581, the word-start marker: llama.cpp's converter
//     writes BERT's word-initial pieces with it and its "##" continuation pieces bare. The word
//     is then cut greedily from its start: at each position, the longest token whose text the
//     rest begins with (any token: llama.cpp looks the text up among all of them). When some
//     position begins no token, the whole word becomes the unknown token.
// Encode() adds [CLS] (BOS) before and [SEP] after the text with add_special, whatever
// tokenizer.ggml.add_bos_token / add_eos_token / add_sep_token say, as llama.cpp does.
//
// Costs: step 1 is linear in the text (binary searches in the Unicode tables for non-ASCII code
// points); step 2 walks, at each cut, the trie path of the longest token that could start there.
#include "engine/tokenizer/wpm.h"

#include <initializer_list>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"
#include "common/strings.h"
#include "engine/tokenizer/tokenizer.h"
#include "engine/tokenizer/unicode.h"

namespace pd::engine {
namespace tokenizer_internal {
namespace {

constexpr std::string_view kWordStart = "\xE2\x96\x81";  // U+2581

// The ASCII characters of Unicode's symbol categories (Sc, Sk, Sm): llama.cpp splits these off
// as words; symbols above ASCII stay inside words.
bool IsAsciiSymbol(uint32_t cpt) {
  switch (cpt) {
    case '$':
    case '+':
    case '<':
    case '=':
    case '>':
    case '^':
    case '`':
    case '|':
    case '~':
      return true;
    default:
      return false;
  }
}

// The CJK ideograph blocks of BERT's BasicTokenizer, as llama.cpp lists them: Extension E is
// taken from U+2B920 (where Hugging Face's Rust tokenizer starts it), so U+2B820-U+2B91F are not
// split off.
bool IsCjkIdeograph(uint32_t cpt) {
  return (cpt >= 0x4E00 && cpt <= 0x9FFF) || (cpt >= 0x3400 && cpt <= 0x4DBF) ||
         (cpt >= 0x20000 && cpt <= 0x2A6DF) || (cpt >= 0x2A700 && cpt <= 0x2B73F) ||
         (cpt >= 0x2B740 && cpt <= 0x2B81F) || (cpt >= 0x2B920 && cpt <= 0x2CEAF) ||
         (cpt >= 0xF900 && cpt <= 0xFAFF) || (cpt >= 0x2F800 && cpt <= 0x2FA1F);
}

}  // namespace

void SplitWpmWords(std::string_view text, const WpmModel& model, std::string* norm,
                   std::vector<std::pair<size_t, size_t>>* words) {
  size_t begin = norm->size();  // of the current word
  auto end_word = [&] {
    if (norm->size() > begin) words->emplace_back(begin, norm->size());
    begin = norm->size();
  };
  for (uint32_t cpt : DecodeUtf8Lenient(text)) {
    if (cpt > 0x10FFFF) continue;
    if (model.strip_accents) cpt = NfdFirst(cpt);
    if (IsWhiteSpace(cpt)) {
      end_word();
      continue;
    }
    const CharClass cls = ClassOf(cpt);
    if (cpt == 0 || cpt == kReplacementChar || cls == CharClass::kControl) continue;
    if (model.strip_accents && cls == CharClass::kMark) continue;
    const uint32_t out = model.lowercase ? SimpleLowercase(cpt) : cpt;
    if (cls == CharClass::kPunctuation || IsAsciiSymbol(cpt) || IsCjkIdeograph(cpt)) {
      end_word();
      AppendUtf8(out, norm);
      end_word();
    } else {
      AppendUtf8(out, norm);
    }
  }
  end_word();
}

}  // namespace tokenizer_internal

absl::Status Tokenizer::LoadWpm(const GgufFile& gguf) {
  struct Needed {
    int32_t id;
    std::string_view what, key;
  };
  for (const Needed& n : {Needed{unk_, "an unknown token", "unknown_token_id, default 100"},
                          Needed{bos_, "a [CLS] (BOS) token", "bos_token_id, default 101"},
                          Needed{sep_, "a [SEP] token", "seperator_token_id, default 102"}}) {
    if (n.id == kNoToken) {
      return absl::InvalidArgumentError(StrCat("tokenizer.ggml.model bert needs ", n.what,
                                               " (tokenizer.ggml.", n.key,
                                               "), and the vocabulary has none"));
    }
  }
  auto wpm = std::make_unique<tokenizer_internal::WpmModel>();
  constexpr std::string_view kLowercase = "tokenizer.ggml.normalizer.lowercase";
  constexpr std::string_view kStripAccents = "tokenizer.ggml.normalizer.strip_accents";
  absl::StatusOr<bool> lowercase = gguf.GetBoolOr(kLowercase, true);
  if (!lowercase.ok()) {
    return absl::InvalidArgumentError(
        StrCat(kLowercase, ": ", std::string(lowercase.status().message())));
  }
  absl::StatusOr<bool> strip_accents = gguf.GetBoolOr(kStripAccents, *lowercase);
  if (!strip_accents.ok()) {
    return absl::InvalidArgumentError(
        StrCat(kStripAccents, ": ", std::string(strip_accents.status().message())));
  }
  wpm->lowercase = *lowercase;
  wpm->strip_accents = *strip_accents;
  for (int32_t id = 0; id < n_vocab(); ++id) wpm->matcher.Insert(tokens_[id].text, id);
  wpm_ = std::move(wpm);
  return absl::OkStatus();
}

void Tokenizer::EncodeWpm(std::string_view text, std::vector<int32_t>* out) const {
  const tokenizer_internal::WpmModel& wpm = *wpm_;
  const tokenizer_internal::TokenTrie& trie = wpm.matcher;
  std::string norm;
  std::vector<std::pair<size_t, size_t>> words;
  tokenizer_internal::SplitWpmWords(text, wpm, &norm, &words);
  std::string word;
  for (const auto& [begin, end] : words) {
    word.assign(tokenizer_internal::kWordStart);
    word.append(norm, begin, end - begin);
    const size_t mark = out->size();
    for (size_t i = 0; i < word.size();) {
      // The longest token at i.
      int32_t best = -1;
      size_t best_end = i;
      int32_t node = 0;
      for (size_t j = i; j < word.size(); ++j) {
        node = trie.Child(node, static_cast<uint8_t>(word[j]));
        if (node < 0) break;
        if (trie.Value(node) >= 0) {
          best = trie.Value(node);
          best_end = j + 1;
        }
      }
      if (best < 0) {
        out->resize(mark);  // the word is unknown as a whole
        break;
      }
      out->push_back(best);
      i = best_end;
    }
    if (out->size() == mark) out->push_back(unk_);
  }
}

}  // namespace pd::engine
