// `pdctl convert HF_DIR OUT.gguf [--type T]`: a Hugging Face checkpoint (config.json, safetensors,
// tokenizer.json) as a GGUF that llama.cpp and pdserve load (engine/convert/hf_convert.h). Float
// types copy or round the weights; a quantized type runs the quantizer on the converted model.
// Exit codes: 0 written; 2 bad input or an unsupported checkpoint; 1 any other failure.
#pragma once

#include <string>

#include "CLI/CLI.hpp"

namespace pd::tools {

struct ConvertFlags {
  std::string input, output;
  std::string type = "auto";  // auto (as stored), f32, f16, bf16, or a quantized type
  std::string policy = "M";   // quantized types: the mixed-precision policy
};

CLI::App* AddConvertCommand(CLI::App& app, ConvertFlags* flags);
int RunConvert(const ConvertFlags& flags);

}  // namespace pd::tools
