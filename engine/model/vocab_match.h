// Whether a draft model speaks the target's vocabulary: speculative decoding feeds the draft's
// token ids to the target and back, so both must give every id the same token.
//
// Thread safety: a pure function of two immutable files.
#pragma once

#include "absl/status/status.h"
#include "engine/model/gguf.h"

namespace pd::engine {

// OK when `draft` has the vocabulary of `target`: the same number of tokens, the same token
// strings (tokenizer.ggml.tokens) id for id, the same token types where both files list them
// (tokenizer.ggml.token_type), and the same special ids: every tokenizer.ggml.*_token_id key
// either file has (bos, eos, eot, eom, pad, unk, sep, cls, mask, fim_*, ...) must be in both,
// with equal values. Files without a token list are compared by their token_embd row counts.
//
// FAILED_PRECONDITION on a mismatch; the message names the first differing token (its index and
// both strings), the differing token type, or the special-id key and both values.
absl::Status CheckSameVocabulary(const GgufFile& target, const GgufFile& draft);

}  // namespace pd::engine
