// `pdctl models`: the model search path, the default model, and every .gguf file found on the
// path with its size, architecture and whether pdserve can run it. Exit code: 0.
#pragma once

#include "CLI/CLI.hpp"

namespace pd::tools {

CLI::App* AddModelsCommand(CLI::App& app);
int RunModels();

}  // namespace pd::tools
