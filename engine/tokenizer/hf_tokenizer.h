// Reading a Hugging Face tokenizer (tokenizer.json, tokenizer_config.json, config.json) into the
// GGUF tokenizer metadata that llama.cpp's converter (convert_hf_to_gguf.py, gguf-py's
// SpecialVocab) writes for it, so that a Hugging Face folder can be tokenized by pdserve's
// Tokenizer without converting it first.
//
// Three kinds of tokenizer.json are supported:
//  - byte-level BPE (model BPE, pre-tokenizer ByteLevel, possibly after Split/Digits steps in a
//    Sequence; decoder ByteLevel) -> tokenizer.ggml.model "gpt2". tokenizer.ggml.pre is chosen
//    from the tokenizer's own pre-tokenizer definition: its Split regexes (and ByteLevel's own
//    regex when use_regex is set), in order, looked up in a table of the Hugging Face definitions
//    llama.cpp's pre-tokenizer types were transcribed from (hf_tokenizer.cc, Definitions()); among
//    the llama.cpp names of one definition, the one whose ignore_merges agrees with the model's is
//    taken (clean_up_tokenization_spaces breaks ties).
//  - SentencePiece-style BPE (model BPE with byte_fallback; spaces made U+2581 by a Replace
//    normalizer, with or without Prepend, or by a Metaspace pre-tokenizer; decoder a Sequence with
//    ByteFallback) -> "llama". llama.cpp's converter (LlamaHfVocab) gives every token the score
//    -1000, with which its SentencePiece encoder (and pdserve's) merges left to right instead of
//    by merge rank; the scores written here are instead the negated rank of the first merge that
//    forms each token, so that merging by score is merging by rank. That is exact when the merges
//    are complete (every split of a token into two tokens is a merge, as in every tokenizer.json
//    converted from a SentencePiece model: Llama 2, Mistral, Gemma); a vocabulary with incomplete
//    merges (a BPE trained with `tokenizers` itself) is refused, naming a token and the missing
//    merge. add_space_prefix follows the Prepend normalizer / Metaspace prepend_scheme.
//  - Unigram (model Unigram; a Metaspace pre-tokenizer, possibly after WhitespaceSplit) -> "t5".
//    Scores are the model's log probabilities, model.unk_id the unknown token, <0xXX> pieces byte
//    tokens when byte_fallback. The normalizer may be a Precompiled charsmap (copied to
//    tokenizer.ggml.precompiled_charsmap after checking it), and transformers' SentencePiece
//    whitespace steps, Replace of " {2,}" (with Strip of the right end), which with WhitespaceSplit
//    become tokenizer.ggml.remove_extra_whitespaces; Metaspace's prepend_scheme gives
//    add_space_prefix. add_bos/add_eos are written as the post_processor says, false when it says
//    nothing (llama.cpp's t5 default would add EOS, Hugging Face adds nothing).
// Refused with UNIMPLEMENTED, naming exactly what: WordPiece and WordLevel models; Unigram models
// without unk_id or with other normalizers (NFKC, NFC, Lowercase...: a GGUF Unigram vocabulary
// normalizes only by a precompiled charsmap) or pre-tokenizers;
// normalizers other than NFC (byte-level; pdserve does not normalise, so non-NFC text can
// tokenize differently from Hugging Face, as in llama.cpp) and the SentencePiece ones above;
// pre-tokenizers not in the table (quoting their regexes); ByteLevel with add_prefix_space;
// BPE dropout, continuing_subword_prefix and end_of_word_suffix.
//
// Tokens: model.vocab and added_tokens by id; ids missing below the vocabulary size (config.json's
// vocab_size when larger, for byte-level BPE, as llama.cpp) become "[PADn]" unused tokens. Added
// tokens become control tokens when `special` (or when they look special, llama.cpp's
// does_token_look_special: <|...|>, <unused...>, <pad>...) and user-defined tokens otherwise
// (with U+2581 turned into spaces); added tokens past model.vocab are appended. Byte tokens
// <0xXX> of SentencePiece-style vocabularies are byte tokens. Special-token ids and add_bos/eos
// are derived as SpecialVocab derives them: tokenizer_config.json's *_token strings looked up
// among added_tokens, the post_processor (ByteLevel, RobertaProcessing, TemplateProcessing),
// add_*_token flags, then config.json's *_token_id for the types still unset.
//
// Thread safety: ReadHfTokenizer is a pure function of the files; call it from any thread.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace pd::engine {

// The GGUF tokenizer metadata that llama.cpp's converter writes for a Hugging Face tokenizer
// (written by quantize::SetVocabKeys, read back by Tokenizer::FromGguf).
struct GgufVocab {
  std::string model;                 // tokenizer.ggml.model: "gpt2", "llama" or "t5"
  std::string pre;                   // tokenizer.ggml.pre ("default" for "llama", as llama.cpp;
                                     // "" for "t5": not written)
  std::vector<std::string> tokens;   // by id
  std::vector<float> scores;         // empty when the model has none (byte-level BPE);
                                     // Unigram: the log probabilities
  std::vector<int32_t> token_types;  // llama.cpp: 1 normal 2 unknown 3 control 4 user-defined
                                     // 5 unused 6 byte
  std::vector<std::string> merges;   // "left right", byte-level BPE only
  // Special tokens, as SpecialVocab derives them (unset: the key is not written).
  std::optional<int32_t> bos, eos, unk, sep, pad, mask, eot, eom;
  std::optional<bool> add_bos, add_eos, add_sep, add_space_prefix;
  // Unigram ("t5"): tokenizer.ggml.remove_extra_whitespaces, and the SentencePiece charsmap
  // (tokenizer.ggml.precompiled_charsmap, a uint8 array; empty: not written).
  std::optional<bool> remove_extra_whitespaces;
  std::string precompiled_charsmap;
  std::string chat_template;  // tokenizer.chat_template ("" when none)
  // Named templates (tokenizer_config.json's list form): tokenizer.chat_template.NAME, listed in
  // tokenizer.chat_templates.
  std::vector<std::pair<std::string, std::string>> named_chat_templates;
};

// Reads DIR/tokenizer.json, and DIR/tokenizer_config.json, DIR/config.json,
// DIR/chat_template.jinja / chat_template.json when present.
// NOT_FOUND: DIR/tokenizer.json is missing. INVALID_ARGUMENT: a file is not valid JSON (with
// line and column), a value is missing or of the wrong type, ids are out of range, duplicated or
// leave holes, a merge names a token that is not in the vocabulary, a token text is repeated.
// UNIMPLEMENTED: a tokenizer kind pdserve does not run (see above), naming the model type,
// normalizer or pre-tokenizer. Messages name the file and the JSON path.
absl::StatusOr<GgufVocab> ReadHfTokenizer(const std::string& dir);

}  // namespace pd::engine
