// Data files compiled into pdctl at build time, so that the binary works from any directory: the
// built-in quantization policies (engine/quant/policies/*.yaml) and the texts manifest
// (testdata/texts/manifest.json). CMake reads the files when it configures and reconfigures
// when they change; the strings are parsed at run time like any other policy or manifest.
#pragma once

#include <string_view>

namespace pd::engine::quantize {

// YAML text of built-in policy "S", "M" or "L" (exact case); empty for any other name.
std::string_view EmbeddedPolicy(std::string_view name);
// JSON text of testdata/texts/manifest.json.
std::string_view EmbeddedTextsManifest();

}  // namespace pd::engine::quantize
