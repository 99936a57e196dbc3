// The ModelCard of a GGUF file (what ListModels and /v1/models show), shared by pd-serve and
// pd-router, which both describe the model their engines run.
#pragma once

#include <string>

#include "engine/model/gguf.h"
#include "frontend/frontend.h"

namespace pd::frontend {

// llama.cpp's general.file_type name ("Q4_K_M", ...); "" when the file sets none.
std::string QuantizationName(const engine::GgufFile& file);
// The file name without its directory and ".gguf".
std::string FileStem(const std::string& path);
// id (or FileStem(path) when empty), architecture, parameters, quantization; context_length is
// left for the caller (it is the engine's).
ModelCard ModelCardFromGguf(const engine::GgufFile& file, const std::string& path,
                            const std::string& id);

}  // namespace pd::frontend
