#include "tools/pdctl/models_cmd.h"

#include <cstdio>
#include <string>

#include "common/strings.h"
#include "engine/model/model_finder.h"

namespace pd::tools {

CLI::App* AddModelsCommand(CLI::App& app) {
  return app.add_subcommand("models", "list the model files pdctl can find, and where");
}

int RunModels() {
  std::printf("search path:");
  for (const std::string& d : engine::ModelSearchPath()) std::printf(" %s", d.c_str());
  std::printf("\n");
  auto def = engine::FindDefaultModel();
  std::printf("default model: %s\n\n",
              def.ok() ? def->c_str() : std::string(def.status().message()).c_str());
  const auto models = engine::ListModels();
  if (models.empty()) {
    std::printf("no .gguf files found\n");
    return 0;
  }
  std::printf("%-10s %-10s %-30s %s\n", "size(MiB)", "runs", "name / architecture", "path");
  for (const auto& m : models) {
    std::printf("%-10.1f %-10s %-30s %s\n", m.bytes / 1048576.0, m.loadable ? "yes" : "no",
                pd::StrCat(m.name, " / ", m.architecture).substr(0, 60).c_str(), m.path.c_str());
  }
  return 0;
}

}  // namespace pd::tools
