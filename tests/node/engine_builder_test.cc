// node/engine_builder.h: the one engine construction of pdctl, pd-serve and the node daemons.
#include "node/engine_builder.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "common/status_matchers.h"
#include "tests/testing/process.h"
#include "tests/testing/tiny_model.h"

namespace pd::node {
namespace {

using ::pd::testing::StatusIs;
using ::testing::HasSubstr;

std::string TinyModelFile(const ::pd::testing::TempDir& dir) {
  engine::testing::TinyModelSpec spec;
  return dir.Write("tiny.gguf", engine::testing::TinyModel(spec));
}

TEST(EngineBuilderTest, BuildsTheModelWithTheDefaultContextRule) {
  ::pd::testing::TempDir dir;
  EngineOptions o;
  o.model_path = TinyModelFile(dir);
  o.threads = 1;
  absl::StatusOr<Engine> e = BuildEngine(o);
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->model_path, o.model_path);
  EXPECT_EQ(e->backend->name(), "cpu");
  // The tiny model trains on 256 tokens: the default context is min(256, 4096).
  EXPECT_EQ(e->context, 256);
  EXPECT_EQ(engine::DefaultContext(131072), 4096);
  o.context = 64;
  e = BuildEngine(o);
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->context, 64);
}

TEST(EngineBuilderTest, CudaWithoutAGpuIsAClearErrorAtStart) {
  if (engine::CreateCudaBackend(0).ok()) GTEST_SKIP() << "a GPU is present";
  ::pd::testing::TempDir dir;
  EngineOptions o;
  o.model_path = TinyModelFile(dir);
  o.backend = "cuda";
  for (const char* layers : {"all", "auto", "1"}) {
    o.gpu_layers = layers;
    absl::StatusOr<Engine> e = BuildEngine(o);
    EXPECT_THAT(e, StatusIs(absl::StatusCode::kUnavailable)) << layers;
    EXPECT_THAT(std::string(e.status().message()),
                ::testing::AnyOf(HasSubstr("no CUDA device"), HasSubstr("built without CUDA")));
  }
  o.gpu_layers = "3";  // the tiny model has two layers
  EXPECT_THAT(BuildEngine(o), StatusIs(absl::StatusCode::kInvalidArgument, "a count in [0, 2]"));
}

TEST(EngineBuilderTest, BadOptionsAreClearErrors) {
  EngineOptions o;
  o.model_path = "/nonexistent/model.gguf";
  EXPECT_THAT(BuildEngine(o), StatusIs(absl::StatusCode::kNotFound));
  o.backend = "tpu";
  EXPECT_THAT(BuildEngine(o), StatusIs(absl::StatusCode::kInvalidArgument, "backend"));
  ::pd::testing::TempDir dir;
  o.model_path = TinyModelFile(dir);
  o.backend = "cpu";
  o.gpu_layers = "1";
  EXPECT_THAT(BuildEngine(o), StatusIs(absl::StatusCode::kInvalidArgument, "needs backend cuda"));
}

TEST(EngineBuilderTest, ServingEngineTakesTheConfigsSections) {
  ::pd::testing::TempDir dir;
  ServeOptions o;
  o.model.path = TinyModelFile(dir);
  o.threads = 1;
  o.model.context = 128;
  o.kv.memory_mib = 4;
  absl::StatusOr<ServingEngine> e = BuildServingEngine(o, nullptr);
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->scheduler->max_context(), 128);
  e->scheduler->Shutdown();
  o.kv.dtype = "f8";
  EXPECT_THAT(BuildServingEngine(o, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, "kv.dtype"));
}

}  // namespace
}  // namespace pd::node
