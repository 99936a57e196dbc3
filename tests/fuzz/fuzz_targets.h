// The libFuzzer harnesses of tests/fuzz as plain functions. Each fuzzer binary's
// LLVMFuzzerTestOneInput (fuzz_main.cc) calls one of them; in the ordinary build,
// fuzz_corpus_test runs every file of tests/fuzz/corpus/<name>/ through the same function, so an
// input that once crashed a fuzzer stays a regression test.
//
// A harness returns 0 for every input. A broken invariant is a PD_CHECK failure (abort), which
// libFuzzer reports as a crash and which fails the corpus test. Harnesses keep process-wide state
// built once (vocabularies, a tiny engine); they are not thread safe.
#pragma once

#include <cstddef>
#include <cstdint>

namespace pd::fuzz {

// GGUF reader, ModelConfig::FromGguf, Weights::Load (gguf_fuzzer.cc).
int FuzzGguf(const uint8_t* data, size_t size);
// The safetensors reader and the model.safetensors.index.json parser, on every input
// (safetensors_fuzzer.cc).
int FuzzSafetensors(const uint8_t* data, size_t size);
// Tokenizer::Encode / Decode / StreamingDetokenizer on SPM and BPE vocabularies, and
// Tokenizer::FromGguf on vocabularies made from the input (tokenizer_fuzzer.cc).
int FuzzTokenizer(const uint8_t* data, size_t size);
// ApplyChatTemplate for every ChatTemplateKind, DetectChatTemplate (chat_template_fuzzer.cc).
int FuzzChatTemplate(const uint8_t* data, size_t size);
// openai::ParseRequest (chat and completion bodies) and the Frontend behind it
// (openai_request_fuzzer.cc).
int FuzzOpenAiRequest(const uint8_t* data, size_t size);
// The node API's protobuf messages through the decode and prefill services
// (node_protocol_fuzzer.cc).
int FuzzNodeProtocol(const uint8_t* data, size_t size);
// TransferDescriptor::Parse and the KV transport's receiver on arbitrary messages
// (kv_frame_fuzzer.cc).
int FuzzKvFrame(const uint8_t* data, size_t size);

struct FuzzTarget {
  const char* name;  // corpus folder tests/fuzz/corpus/<name>, fuzzer binary <name>_fuzzer
  int (*fn)(const uint8_t* data, size_t size);
};

inline constexpr FuzzTarget kFuzzTargets[] = {
    {"gguf", FuzzGguf},
    {"safetensors", FuzzSafetensors},
    {"tokenizer", FuzzTokenizer},
    {"chat_template", FuzzChatTemplate},
    {"openai_request", FuzzOpenAiRequest},
    {"node_protocol", FuzzNodeProtocol},
    {"kv_frame", FuzzKvFrame},
};

}  // namespace pd::fuzz
