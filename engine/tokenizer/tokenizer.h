// Tokenizers read from a GGUF file's `tokenizer.ggml.*` metadata, id-compatible with llama.cpp.
//
// Four vocabulary kinds are supported:
//  - `tokenizer.ggml.model = llama`: SentencePiece-style BPE. Spaces become U+2581, a space is
//    prefixed to each run of text that starts the input or follows a special token (when
//    `tokenizer.ggml.add_space_prefix`, default true), pairs of symbols are merged greedily by the
//    score of the merged token, and what is left unknown falls back to byte tokens `<0xXX>`.
//  - `tokenizer.ggml.model = gpt2`: byte-level BPE. Text is split by the regex pre-tokenizer named
//    by `tokenizer.ggml.pre` (PCRE2), each piece is mapped byte by byte onto GPT-2's printable
//    alphabet, and merged by rank from `tokenizer.ggml.merges`.
//  - `tokenizer.ggml.model = t5`: Unigram (SentencePiece's, llama.cpp's "UGM"). Each run of text
//    is normalized (`tokenizer.ggml.precompiled_charsmap`, spaces as U+2581, the space prefix and
//    `tokenizer.ggml.remove_extra_whitespaces`) and segmented by a Viterbi search for the most
//    probable sequence of tokens (scores are log probabilities); unknown characters become the
//    unknown token, or byte tokens when the vocabulary has them (ugm.cc says exactly how).
//  - `tokenizer.ggml.model = bert`: WordPiece (llama.cpp's "WPM"). Each run of text is split into
//    words at white space, punctuation and CJK ideographs, lowercased and stripped of accents
//    (`tokenizer.ggml.normalizer.lowercase` / `.strip_accents`, default true), and each word,
//    marked with a leading U+2581, is cut into the longest tokens from its start; a word that
//    cannot be cut is the unknown token (wpm.cc says exactly how).
//
// Input bytes need not be valid UTF-8; they are handled the way llama.cpp handles them so that the
// ids match its ids (Unigram: an invalid byte is normalized to U+FFFD; byte fallback is the one
// place where pdserve departs from llama.cpp on purpose, to give the ids the model was trained on):
//  - SPM works on raw bytes: an invalid byte ends up as its byte token. Initial symbols are cut by
//    the lead byte without validation, so an invalid lead byte takes the next 1-3 bytes (even an
//    escaped space) into its byte tokens, exactly as llama.cpp does.
//  - BPE decodes leniently first: a lead byte with enough continuation bytes decodes without range
//    checks (overlong forms are re-encoded in shortest form, surrogates keep their 3-byte form),
//    any other byte becomes U+FFFD (one per byte). A 4-byte form above U+10FFFF (e.g. F4 90 80 80)
//    becomes one U+FFFD; llama.cpp aborts the process on that input.
//  - WordPiece decodes leniently too; an invalid byte becomes U+FFFD, which it drops, and a
//    4-byte form above U+10FFFF is dropped (llama.cpp aborts there as well).
// Decoding (TokenToPiece/Decode) returns a token's bytes, which may be a fragment of a UTF-8
// sequence; StreamingDetokenizer turns a stream of ids into valid UTF-8 only.
//
// Ownership: a Tokenizer owns copies of everything it needs; the GgufFile may be closed after
// FromGguf(). Thread safety: immutable after creation; every const method may be called
// concurrently. StreamingDetokenizer is not thread safe (one per stream).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/model/gguf.h"

namespace pd::engine {

namespace tokenizer_internal {
class PreTokenizer;
struct UgmModel;
struct WpmModel;
}  // namespace tokenizer_internal

// `tokenizer.ggml.token_type` values.
enum class TokenType : int32_t {
  kUndefined = 0,
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,
  kUserDefined = 4,
  kUnused = 5,
  kByte = 6,
};

// Effective token attributes (a bit set, same bit values as llama.cpp's llama_token_attr). They
// start from the GGUF token type and are then adjusted the way llama.cpp adjusts them: EOG-looking
// tokens become control tokens, control tokens named "...unused..." also become unused, Phi-3's
// special tokens strip whitespace on their right, and so on.
struct TokenAttr {
  static constexpr uint32_t kUndefined = 0;
  static constexpr uint32_t kUnknown = 1u << 0;
  static constexpr uint32_t kUnused = 1u << 1;
  static constexpr uint32_t kNormal = 1u << 2;
  static constexpr uint32_t kControl = 1u << 3;
  static constexpr uint32_t kUserDefined = 1u << 4;
  static constexpr uint32_t kByte = 1u << 5;
  static constexpr uint32_t kNormalized = 1u << 6;
  static constexpr uint32_t kLstrip = 1u << 7;  // eat whitespace left of the token when parsing
  static constexpr uint32_t kRstrip = 1u << 8;  // eat whitespace right of the token when parsing
  static constexpr uint32_t kSingleWord = 1u << 9;
};

enum class TokenizerModel { kSpm, kBpe, kUgm, kWpm };

inline constexpr int32_t kNoToken = -1;

struct DecodeOptions {
  // Render control and unknown tokens as their text (otherwise they decode to nothing).
  bool render_special = false;
  // Drop a leading BOS and a trailing EOS when the model adds them (add_bos / add_eos).
  bool remove_special = false;
  // llama.cpp's clean_up_tokenization_spaces passes (" ," -> ",", " 's" -> "'s", ...). Off by
  // default because it breaks round trips; clean_spaces_default() says what llama.cpp uses.
  bool clean_spaces = false;
};

class Tokenizer {
 public:
  // Builds the tokenizer from `gguf` metadata (a vocabulary-only GGUF is fine).
  // INVALID_ARGUMENT: missing or unsupported tokenizer.ggml.model / .pre, missing tokens or merges,
  // arrays whose length differs from the token count, a value of the wrong type, duplicate tokens,
  // a special token id out of range, add_bos/add_eos without the token to add, a t5 vocabulary
  // without an unknown token, a bert vocabulary without an unknown, [CLS] or [SEP] token.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromGguf(const GgufFile& gguf);
  ~Tokenizer();
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  // Token ids of `text` (any bytes). `add_special`: add BOS/EOS as the model asks
  // (tokenizer.ggml.add_bos_token / add_eos_token, or llama.cpp's per-model defaults: SPM adds BOS;
  // BPE adds BOS for the llama3 pre-tokenizers only; Unigram adds EOS, not BOS); WordPiece always
  // adds [CLS] (BOS) and [SEP], whatever the keys say, as llama.cpp does. add_sep never changes
  // Encode() (see add_sep()). `parse_special`:
  // text equal to a control or unknown token becomes that token. User-defined tokens are always
  // recognised, as in llama.cpp and Hugging Face tokenizers. Longer special tokens win over shorter
  // ones. Precondition: text.size() < 4 GiB (PD_CHECKed; requests are bounded far below that).
  std::vector<int32_t> Encode(std::string_view text, bool add_special, bool parse_special) const;

  // Bytes of one token: byte tokens give their byte, BPE tokens are mapped back from the byte-level
  // alphabet, U+2581 becomes a space in SPM, Unigram and WordPiece tokens. Control and unknown
  // tokens give "" unless `render_special`; unused/undefined tokens always give "". An id out of
  // range gives "".
  std::string TokenToPiece(int32_t id, bool render_special = false) const;

  // Concatenated pieces. Like llama.cpp's llama_detokenize: when the vocabulary adds a space
  // prefix (SPM), one leading space is removed from the FIRST token's piece — so
  // Decode(Encode("Hello", false, false)) == "Hello". If the first token is BOS (kept, or removed
  // by remove_special) nothing is stripped, so [BOS, "▁Hello"] decodes to " Hello", again as
  // llama.cpp does. Ids out of range are skipped.
  std::string Decode(absl::Span<const int32_t> ids, const DecodeOptions& options = {}) const;

  // ---- vocabulary ----
  TokenizerModel model() const { return model_; }
  const std::string& pre() const { return pre_; }  // tokenizer.ggml.pre as given ("" if absent)
  int32_t n_vocab() const { return static_cast<int32_t>(tokens_.size()); }
  bool IsValid(int32_t id) const { return id >= 0 && id < n_vocab(); }
  // Preconditions for the per-token accessors: IsValid(id) (PD_CHECKed).
  const std::string& token_text(int32_t id) const;  // as stored in the vocabulary
  float token_score(int32_t id) const;
  TokenType token_type(int32_t id) const;  // as declared in the GGUF (kNormal when absent)
  uint32_t token_attrs(int32_t id) const;  // effective TokenAttr bits
  bool IsControl(int32_t id) const;        // control attribute set
  // End of generation: EOS, EOT, EOM, FIM pad/repo/file-separator tokens and tokens such as
  // <|im_end|>, <|eot_id|>, <end_of_turn>, <|endoftext|>, <|end|> found in the vocabulary.
  bool IsEog(int32_t id) const;
  const std::vector<int32_t>& eog_ids() const { return eog_ids_; }  // sorted

  // ---- special tokens (kNoToken when the model has none) ----
  int32_t bos() const { return bos_; }
  int32_t eos() const { return eos_; }
  int32_t eot() const { return eot_; }
  int32_t eom() const { return eom_; }
  int32_t unk() const { return unk_; }
  int32_t pad() const { return pad_; }
  // The separator (tokenizer.ggml.seperator_token_id, llama.cpp's spelling; WordPiece: [SEP], 102
  // by default).
  int32_t sep() const { return sep_; }
  bool add_bos() const { return add_bos_; }
  bool add_eos() const { return add_eos_; }
  // Whether a separator goes between the two texts of a pair, as llama.cpp's reranking and
  // embedding tools put it (tokenizer.ggml.add_sep_token; defaults: true for WordPiece and the
  // jina-v1-en, jina-v2-code and roberta-bpe pre-tokenizers). Encode() takes one text and never
  // adds it; a caller joining two texts does. May be true with sep() == kNoToken, as in
  // llama.cpp: then there is nothing to add.
  bool add_sep() const { return add_sep_; }
  bool add_space_prefix() const { return add_space_prefix_; }
  bool clean_spaces_default() const { return clean_spaces_; }

 private:
  struct Token {
    std::string text;   // vocabulary text
    std::string piece;  // decoded bytes (special tokens: their text)
    float score = 0;
    TokenType type = TokenType::kNormal;
    uint32_t attrs = TokenAttr::kNormal;
    bool eog = false;
  };
  // A run of input text or an already recognised special token.
  struct Fragment {
    int32_t token;  // kNoToken for text
    size_t begin, end;
  };

  // Merge state reused across runs/words of one Encode() call (spm.cc, bpe.cc).
  struct SpmScratch;
  struct BpeScratch;

  Tokenizer() = default;
  absl::Status Load(const GgufFile& gguf);
  absl::Status LoadSpecialIds(const GgufFile& gguf);
  void DetectSpecialTokens(const GgufFile& gguf);
  std::string ComputePiece(int32_t id) const;
  int32_t Find(std::string_view text) const;
  std::vector<Fragment> Partition(std::string_view text, bool parse_special) const;
  void EncodeSpm(std::string_view escaped, std::vector<int32_t>* out) const;
  void EncodeSpmRun(std::string_view run, SpmScratch* scratch, std::vector<int32_t>* out) const;
  void EncodeBpe(std::string_view text, std::vector<int32_t>* out) const;
  void MergeBpeWord(std::string_view word, BpeScratch* scratch, std::vector<int32_t>* out) const;
  // Unigram (ugm.cc): the matcher, charsmap and flags, after the token attributes are final.
  absl::Status LoadUgm(const GgufFile& gguf);
  void EncodeUgm(std::string_view text, std::vector<int32_t>* out) const;
  // WordPiece (wpm.cc): the trie and normalizer flags; needs the unknown, BOS and SEP tokens.
  absl::Status LoadWpm(const GgufFile& gguf);
  void EncodeWpm(std::string_view text, std::vector<int32_t>* out) const;

  TokenizerModel model_ = TokenizerModel::kSpm;
  std::string pre_;
  std::vector<Token> tokens_;
  absl::flat_hash_map<std::string, int32_t> text_to_id_;
  // BPE: "left right" -> merge rank (lower merges first).
  absl::flat_hash_map<std::string, int32_t> merge_rank_;
  std::unique_ptr<tokenizer_internal::PreTokenizer> pre_tokenizer_;
  std::unique_ptr<tokenizer_internal::UgmModel> ugm_;  // Unigram only
  std::unique_ptr<tokenizer_internal::WpmModel> wpm_;  // WordPiece only
  // Control, user-defined and unknown tokens, longest text first (ties: lower id first).
  std::vector<int32_t> special_tokens_;
  // SPM and Unigram byte fallback: token of each byte value (kNoToken if the vocabulary lacks
  // it; Unigram takes byte tokens <0xXX> only).
  std::array<int32_t, 256> byte_token_{};
  std::vector<int32_t> eog_ids_;

  int32_t bos_ = kNoToken, eos_ = kNoToken, eot_ = kNoToken, eom_ = kNoToken;
  int32_t unk_ = kNoToken, pad_ = kNoToken, sep_ = kNoToken;
  int32_t fim_pre_ = kNoToken, fim_suf_ = kNoToken, fim_mid_ = kNoToken;
  int32_t fim_pad_ = kNoToken, fim_rep_ = kNoToken, fim_sep_ = kNoToken;
  bool add_bos_ = false;
  bool add_eos_ = false;
  bool add_sep_ = false;
  bool add_space_prefix_ = false;
  bool clean_spaces_ = false;
  bool ignore_merges_ = false;
  // BPE over the text's UTF-8 rather than GPT-2's byte alphabet, spaces escaped as U+2581,
  // newline-only pieces whole (PreTokenizerSpec).
  bool byte_encode_ = true;
  bool escape_spaces_ = false;
  bool whole_newline_runs_ = false;
  bool force_add_bos_ = false;  // PreTokenizerSpec::force_add_bos
  // SPM: no token has U+2581 after anything but a leading run of U+2581 (see EncodeSpm).
  bool spm_split_at_spaces_ = false;
};

// Turns ids arriving one at a time into text that is always valid UTF-8: Push() returns only
// complete characters and holds back a trailing incomplete sequence until the next token completes
// it; bytes that can never form a character become U+FFFD right away. Flush() returns what is held
// back (an incomplete tail becomes one U+FFFD) and resets the state. Ids out of range are skipped,
// as Decode() skips them. With Decode()'s options (the same render_special, strip_leading_space
// on), what Push() and Flush() return over a stream is Decode()'s text of the same ids with every
// invalid sequence replaced (tokenizer_internal::SanitizeUtf8).
//
// Borrows `tokenizer`, which must outlive it. Not thread safe.
class StreamingDetokenizer {
 public:
  struct Options {
    bool render_special = false;  // as DecodeOptions::render_special
    // Strip one leading space from the first token's piece when the vocabulary adds a space
    // prefix, like Decode(). Off by default: generated text continues a prompt.
    bool strip_leading_space = false;
  };
  explicit StreamingDetokenizer(const Tokenizer& tokenizer)
      : StreamingDetokenizer(tokenizer, Options()) {}
  StreamingDetokenizer(const Tokenizer& tokenizer, Options options)
      : tokenizer_(tokenizer), options_(options) {}

  std::string Push(int32_t id);
  std::string Flush();
  // Bytes held back, waiting for the rest of a UTF-8 sequence.
  size_t pending_bytes() const { return pending_.size(); }

 private:
  const Tokenizer& tokenizer_;
  const Options options_;
  std::string pending_;
  bool first_ = true;
};

}  // namespace pd::engine
