// Test helper: a TinyModel (tiny_model.h) loaded on a CPU backend, for tests that run the engine
// (the scheduler, KV import). The GGUF bytes live as long as the model that maps them. Callers
// link pd_runtime.
#pragma once

#include <memory>
#include <string>

#include "common/mapped_file.h"
#include "common/status.h"
#include "engine/runtime/model.h"
#include "tests/testing/tiny_model.h"

namespace pd::engine::testing {

struct TinyEngine {
  std::string bytes;  // the GGUF file the model maps
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Model> model;
};

// PD_CHECK-fails on a bad spec: a test setup error, not a condition under test.
inline std::unique_ptr<TinyEngine> MakeTinyEngine(const TinyModelSpec& spec = {}) {
  auto env = std::make_unique<TinyEngine>();
  env->bytes = TinyModel(spec);
  env->backend = CreateCpuBackend();
  auto file = GgufFile::Parse(MappedFile::Borrow(env->bytes.data(), env->bytes.size()));
  PD_CHECK_OK(file.status());
  auto model = Model::Load(std::shared_ptr<const GgufFile>(std::move(*file)), *env->backend);
  PD_CHECK_OK(model.status());
  env->model = std::move(*model);
  return env;
}

}  // namespace pd::engine::testing
