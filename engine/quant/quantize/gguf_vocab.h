// The GGUF tokenizer keys of a GgufVocab (engine/tokenizer/hf_tokenizer.h), named and typed as
// llama.cpp's gguf-py writer names and types them (gguf/constants.py Keys.Tokenizer): what
// convert_hf_to_gguf.py's vocabulary step writes, and what Tokenizer::FromGguf reads.
//
// Thread safety: not thread safe on the writer (GgufWriter is single-threaded).
#pragma once

#include "engine/quant/quantize/gguf_writer.h"
#include "engine/tokenizer/hf_tokenizer.h"

namespace pd::engine::quantize {

// Sets tokenizer.ggml.model, .pre, .tokens, .scores (when any), .token_type, .merges (when any),
// the special-token ids and add_* flags that `v` has, tokenizer.ggml.add_space_prefix and the chat
// template(s). Precondition: `w` is not yet opened (metadata is fixed by Open()).
void SetVocabKeys(const GgufVocab& v, GgufWriter* w);

}  // namespace pd::engine::quantize
