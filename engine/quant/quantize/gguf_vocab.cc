#include "engine/quant/quantize/gguf_vocab.h"

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/strings.h"

namespace pd::engine::quantize {

void SetVocabKeys(const GgufVocab& v, GgufWriter* w) {
  // In the order gguf-py's converter adds them (_set_vocab_gpt2 / _set_vocab_llama_hf, then
  // SpecialVocab.add_to_gguf). Token types are an int32 array, ids uint32, flags bool.
  w->SetString("tokenizer.ggml.model", v.model);
  if (!v.pre.empty()) w->SetString("tokenizer.ggml.pre", v.pre);
  w->SetStringArray("tokenizer.ggml.tokens", v.tokens);
  if (!v.scores.empty()) w->SetF32Array("tokenizer.ggml.scores", v.scores);
  w->SetI32Array("tokenizer.ggml.token_type", v.token_types);
  if (!v.merges.empty()) w->SetStringArray("tokenizer.ggml.merges", v.merges);
  const std::pair<std::string_view, const std::optional<int32_t>*> ids[] = {
      {"tokenizer.ggml.bos_token_id", &v.bos},
      {"tokenizer.ggml.eos_token_id", &v.eos},
      {"tokenizer.ggml.unknown_token_id", &v.unk},
      {"tokenizer.ggml.seperator_token_id", &v.sep},  // sic: llama.cpp's spelling
      {"tokenizer.ggml.padding_token_id", &v.pad},
      {"tokenizer.ggml.mask_token_id", &v.mask},
      {"tokenizer.ggml.eot_token_id", &v.eot},
      {"tokenizer.ggml.eom_token_id", &v.eom},
  };
  for (const auto& [key, id] : ids) {
    if (id->has_value()) w->SetU32(key, static_cast<uint32_t>(**id));
  }
  const std::pair<std::string_view, const std::optional<bool>*> flags[] = {
      {"tokenizer.ggml.add_bos_token", &v.add_bos},
      {"tokenizer.ggml.add_eos_token", &v.add_eos},
      {"tokenizer.ggml.add_sep_token", &v.add_sep},
      {"tokenizer.ggml.add_space_prefix", &v.add_space_prefix},
      {"tokenizer.ggml.remove_extra_whitespaces", &v.remove_extra_whitespaces},
  };
  for (const auto& [key, flag] : flags) {
    if (flag->has_value()) w->SetBool(key, **flag);
  }
  if (!v.precompiled_charsmap.empty()) {
    w->SetU8Array("tokenizer.ggml.precompiled_charsmap", v.precompiled_charsmap);
  }
  if (!v.named_chat_templates.empty()) {
    std::vector<std::string> names;
    for (const auto& [name, text] : v.named_chat_templates) {
      w->SetString(StrCat("tokenizer.chat_template.", name), text);
      names.push_back(name);
    }
    w->SetStringArray("tokenizer.chat_templates", names);
  }
  if (!v.chat_template.empty()) w->SetString("tokenizer.chat_template", v.chat_template);
}

}  // namespace pd::engine::quantize
