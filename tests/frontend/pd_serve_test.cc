// The real pd-serve binary on loopback: started with a tiny model on port 0, driven over gRPC,
// stopped with SIGTERM.
#include <fcntl.h>
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "pdserve/v1/chat.grpc.pb.h"
#include "tests/frontend/serving_testing.h"
#include "tests/testing/process.h"

namespace pd::frontend {
namespace {

using ::testing::HasSubstr;

using ::pd::testing::Process;
using ::pd::testing::TempDir;

TEST(PdServeTest, ServesGrpcOnAFreePortAndStopsOnSigterm) {
  TempDir dir;
  const std::string model = dir.Write("tiny.gguf", testing::ServingModelGguf());
  const std::string config = dir.Write("serve.yaml", R"(
model: {id: tiny, chat_template: chatml}
kv: {memory_mib: 8}
scheduler: {max_running_seqs: 4, token_budget: 64}
shutdown_grace_s: 0.2
)");
  Process p({PD_SERVE_BINARY, "--config", config, "--model", model, "--grpc-port", "0",
             "--http-port", "0", "--threads", "1"});
  const std::string ready = p.WaitForLine(std::regex("^pd-serve ready: "), absl::Seconds(30));
  ASSERT_FALSE(ready.empty()) << p.Stderr();
  std::smatch m;
  ASSERT_TRUE(std::regex_search(
      ready, m, std::regex(R"(grpc=(127\.0\.0\.1:\d+) http=http://127\.0\.0\.1:\d+ model=tiny$)")))
      << ready;
  auto channel = grpc::CreateChannel(m[1].str(), grpc::InsecureChannelCredentials());
  auto stub = pdserve::v1::Chat::NewStub(channel);

  {
    grpc::ClientContext ctx;
    pdserve::v1::ListModelsResponse resp;
    ASSERT_TRUE(stub->ListModels(&ctx, {}, &resp).ok());
    ASSERT_EQ(resp.models_size(), 1);
    EXPECT_EQ(resp.models(0).id(), "tiny");
    EXPECT_EQ(resp.models(0).context_length(), 256);
    EXPECT_GT(resp.models(0).parameters(), 10000);
  }
  pdserve::v1::GenerateRequest req;
  auto* msg = req.mutable_messages()->add_messages();
  msg->set_role("user");
  msg->set_content("hello world");
  req.set_max_tokens(16);
  req.set_ignore_eos(true);
  {
    grpc::ClientContext ctx;
    auto reader = stub->Generate(&ctx, req);
    pdserve::v1::GenerateResponse r;
    int deltas = 0;
    std::optional<pdserve::v1::Finish> finish;
    while (reader->Read(&r)) {
      if (r.has_delta()) ++deltas;
      if (r.has_finish()) finish = r.finish();
    }
    ASSERT_TRUE(reader->Finish().ok());
    ASSERT_TRUE(finish.has_value());
    EXPECT_EQ(finish->reason(), "length");
    EXPECT_EQ(finish->usage().completion_tokens(), 16);
    EXPECT_GE(deltas, 1);
  }
  {
    grpc::ClientContext ctx;
    req.set_max_tokens(-1);
    auto reader = stub->Generate(&ctx, req);
    pdserve::v1::GenerateResponse r;
    EXPECT_FALSE(reader->Read(&r));
    grpc::Status s = reader->Finish();
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(s.error_message(), HasSubstr("max_tokens"));
  }
  p.Signal(SIGTERM);
  EXPECT_EQ(p.Wait(absl::Seconds(10)), 0) << p.Stderr();
}

TEST(PdServeTest, BadConfigExitsNamingTheKey) {
  TempDir dir;
  const std::string config = dir.Write("bad.yaml", "scheduler:\n  token_budjet: 5\n");
  Process p({PD_SERVE_BINARY, "--config", config});
  EXPECT_EQ(p.Wait(absl::Seconds(10)), 2);
  EXPECT_THAT(p.Stderr(), HasSubstr("scheduler.token_budjet: unknown key"));
}

TEST(PdServeTest, MissingModelFileFails) {
  Process p({PD_SERVE_BINARY, "--model", "/nonexistent/model.gguf", "--grpc-port", "0",
             "--http-port", "0"});
  EXPECT_EQ(p.Wait(absl::Seconds(10)), 1);
  EXPECT_THAT(p.Stderr(), HasSubstr("/nonexistent/model.gguf"));
}

}  // namespace
}  // namespace pd::frontend
