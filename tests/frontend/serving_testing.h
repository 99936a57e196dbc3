// Test helpers for the serving core: a tiny random Llama model that carries a small SPM vocabulary
// (so prompts tokenize and outputs detokenize), and an in-process serving stack on loopback:
// Model -> Scheduler -> Frontend -> GrpcServer on port 0, with a channel to it.
#pragma once

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/mapped_file.h"
#include "common/metrics.h"
#include "common/status.h"
#include "engine/backend/backend.h"
#include "engine/model/gguf.h"
#include "engine/runtime/model.h"
#include "engine/sched/scheduler.h"
#include "engine/tokenizer/tokenizer.h"
#include "frontend/frontend.h"
#include "frontend/grpc_service.h"
#include "frontend/serving_metrics.h"
#include "pdserve/v1/chat.grpc.pb.h"
#include "tests/testing/tiny_model.h"

namespace pd::frontend::testing {

// SPM vocabulary: <unk> <s> </s> <|im_start|> <|im_end|>, 256 byte tokens, then "▁" + a few
// words and the letters (with and without "▁"). </s> and <|im_end|> end generation.
inline std::vector<std::string> ServingVocab() {
  std::vector<std::string> v = {"<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"};
  for (int b = 0; b < 256; ++b) {
    char buf[8];
    std::snprintf(buf, sizeof buf, "<0x%02X>", b);
    v.push_back(buf);
  }
  const std::string sp = "\xE2\x96\x81";  // U+2581
  v.push_back(sp);
  for (const char* w : {"hello", "world", "the", "cat", "sat", "on", "mat", "user", "system"}) {
    v.push_back(sp + w);
  }
  for (char c = 'a'; c <= 'z'; ++c) {
    v.push_back(std::string(1, c));
    v.push_back(sp + std::string(1, c));
  }
  v.push_back("\n");
  return v;
}

inline void AddServingVocab(engine::testing::GgufBuilder& b) {
  const std::vector<std::string> tokens = ServingVocab();
  std::vector<float> scores(tokens.size());
  std::vector<int32_t> types(tokens.size(), 1);
  types[0] = 2;
  for (int i = 1; i <= 4; ++i) types[i] = 3;
  for (int i = 5; i < 5 + 256; ++i) types[i] = 6;
  for (size_t i = 0; i < tokens.size(); ++i) scores[i] = -static_cast<float>(i);
  b.Str("tokenizer.ggml.model", "llama");
  b.StrArray("tokenizer.ggml.tokens", tokens);
  b.Array<float>("tokenizer.ggml.scores", engine::GgufValueType::kFloat32, scores);
  b.Array<int32_t>("tokenizer.ggml.token_type", engine::GgufValueType::kInt32, types);
  b.U32("tokenizer.ggml.unknown_token_id", 0);
  b.U32("tokenizer.ggml.bos_token_id", 1);
  b.U32("tokenizer.ggml.eos_token_id", 2);
}

// A tiny llama (context 256) whose vocabulary is ServingVocab().
inline std::string ServingModelGguf(uint32_t seed = 7) {
  engine::testing::TinyModelSpec spec;
  spec.n_vocab = static_cast<int>(ServingVocab().size());
  spec.seed = seed;
  spec.metadata = AddServingVocab;
  return engine::testing::TinyModel(spec);
}

struct StackOptions {
  engine::SchedulerOptions scheduler;
  FrontendOptions frontend;
  GrpcServerOptions grpc;
  // Sleep after every engine step (in the step observer): makes streams last long enough to be
  // cancelled, timed out or queued behind, without depending on the machine's speed.
  std::chrono::milliseconds step_delay{0};
};

// Model, tokenizer, Scheduler, Frontend and GrpcServer in this process. Members are declared in
// dependency order so that destruction runs server -> frontend -> scheduler -> model.
struct Stack {
  std::string bytes;
  std::unique_ptr<engine::Backend> backend;
  std::unique_ptr<engine::Model> model;
  std::unique_ptr<engine::Tokenizer> tokenizer;
  MetricsRegistry registry;
  std::unique_ptr<ServingMetrics> metrics;
  std::unique_ptr<engine::Scheduler> scheduler;
  std::unique_ptr<Frontend> frontend;
  std::unique_ptr<GrpcServer> server;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<pdserve::v1::Chat::Stub> stub;

  ~Stack() {
    if (server) server->Shutdown(absl::ZeroDuration());
    server.reset();
    frontend.reset();
    if (scheduler) scheduler->Shutdown();
  }

  // Waits until the engine holds no sequence and every KV block is free again.
  bool WaitIdle(absl::Duration timeout) const {
    const absl::Time end = absl::Now() + timeout;
    while (absl::Now() < end) {
      engine::EngineLoad l = scheduler->Load();
      if (l.running == 0 && l.waiting == 0 && l.kv_blocks_free == l.kv_blocks_total) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    return false;
  }
};

inline std::unique_ptr<Stack> MakeStack(StackOptions o = {}) {
  auto s = std::make_unique<Stack>();
  s->bytes = ServingModelGguf();
  s->backend = engine::CreateCpuBackend({.threads = 1});
  auto file = engine::GgufFile::Parse(MappedFile::Borrow(s->bytes.data(), s->bytes.size()));
  PD_CHECK_OK(file.status());
  std::shared_ptr<const engine::GgufFile> shared(std::move(*file));
  auto tok = engine::Tokenizer::FromGguf(*shared);
  PD_CHECK_OK(tok.status());
  s->tokenizer = std::move(*tok);
  auto model = engine::Model::Load(shared, *s->backend);
  PD_CHECK_OK(model.status());
  s->model = std::move(*model);
  s->metrics = std::make_unique<ServingMetrics>(s->registry);
  if (o.scheduler.kv_blocks == 0) o.scheduler.kv_blocks = 64;
  if (o.step_delay.count() > 0) {
    const auto delay = o.step_delay;
    o.scheduler.step_observer = [delay](const engine::StepStats&) {
      std::this_thread::sleep_for(delay);
    };
  }
  auto sched = engine::Scheduler::Create(*s->model, o.scheduler);
  PD_CHECK_OK(sched.status());
  s->scheduler = std::move(*sched);
  ModelCard card{"tiny", "llama", s->scheduler->max_context(), 0, "F32"};
  s->frontend = MakeLocalFrontend(o.frontend, *s->scheduler, *s->tokenizer,
                                  engine::ChatTemplateKind::kChatMl, card, s->metrics.get());
  o.grpc.port = 0;
  auto server = GrpcServer::Start(*s->frontend, o.grpc, s->metrics.get());
  PD_CHECK_OK(server.status());
  s->server = std::move(*server);
  s->channel = grpc::CreateChannel(s->server->address(), grpc::InsecureChannelCredentials());
  s->stub = pdserve::v1::Chat::NewStub(s->channel);
  return s;
}

}  // namespace pd::frontend::testing
