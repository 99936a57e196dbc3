// A model's fingerprint: what two nodes must agree on before one uses the other's KV cache (a
// decode node decoding from a prefill node's KV, a prefill node taking a decode node's prefix), and
// what the router checks each node against (docs/security.md, "Mixed models").
//
// XXH3-64 over the GGUF header exactly as on disk (magic, version, every metadata key and value:
// architecture, hyperparameters, RoPE, tokenizer; every tensor's name, type, shape and offset) and
// over the first 4 KiB of each tensor's data, so that different weights under an identical header
// (a fine-tune, another quantization run) differ too. Cost: the header (a few MiB with a large
// vocabulary) plus one page per tensor: about a millisecond, whatever the model's size. Equal
// files give equal fingerprints on every machine; a change anywhere in the header or at the start
// of any tensor changes it. Not a cryptographic commitment: it guards against mistakes (a node
// started with another model), not against a node that lies.
#pragma once

#include <cstdint>
#include <string>

#include "engine/model/gguf.h"

namespace pd::engine {

uint64_t ModelFingerprint(const GgufFile& file);

// 16 lowercase hex digits.
std::string FingerprintHex(uint64_t fingerprint);

}  // namespace pd::engine
