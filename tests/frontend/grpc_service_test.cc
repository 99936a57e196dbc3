// The public gRPC API end to end in one process: a real gRPC client over loopback against
// GrpcServer -> Frontend -> Scheduler -> a tiny random Llama model with a small vocabulary.
#include "frontend/grpc_service.h"

#include <gmock/gmock.h>
#include <google/protobuf/descriptor.pb.h>
#include <grpcpp/impl/client_unary_call.h>
#include <grpcpp/impl/rpc_method.h>
#include <grpcpp/support/sync_stream.h>
#include <gtest/gtest.h>

#include <atomic>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "engine/tokenizer/tokenizer.h"
#include "pdserve/v1/chat.grpc.pb.h"
#include "pdserve/v1/chat_wire.pb.h"
#include "std_services.pb.h"
#include "tests/frontend/serving_testing.h"

namespace pd::frontend {
namespace {

using pdserve::v1::GenerateRequest;
using pdserve::v1::GenerateResponse;
using ::testing::HasSubstr;
using testing::MakeStack;
using testing::Stack;
using testing::StackOptions;

struct Result {
  grpc::Status status;
  std::string text;
  std::vector<int32_t> ids;
  int deltas = 0;
  std::string request_id;
  std::optional<pdserve::v1::Finish> finish;
  bool finish_was_last = true;
};

// Runs one Generate call to its end. `after_first` runs once the first message has arrived.
Result Generate(Stack& s, const GenerateRequest& req, grpc::ClientContext* ctx,
                const std::function<void()>& after_first = nullptr) {
  Result r;
  std::unique_ptr<grpc::ClientReader<GenerateResponse>> reader = s.stub->Generate(ctx, req);
  GenerateResponse msg;
  bool first = true;
  while (reader->Read(&msg)) {
    if (first && after_first) after_first();
    first = false;
    r.request_id = msg.request_id();
    if (r.finish.has_value()) r.finish_was_last = false;
    if (msg.has_delta()) {
      ++r.deltas;
      r.text += msg.delta().text();
      r.ids.insert(r.ids.end(), msg.delta().token_ids().begin(), msg.delta().token_ids().end());
    } else if (msg.has_finish()) {
      r.finish = msg.finish();
    }
  }
  r.status = reader->Finish();
  return r;
}

Result Generate(Stack& s, const GenerateRequest& req) {
  grpc::ClientContext ctx;
  return Generate(s, req, &ctx);
}

GenerateRequest Chat(const std::string& user, int max_tokens) {
  GenerateRequest req;
  auto* m = req.mutable_messages()->add_messages();
  m->set_role("user");
  m->set_content(user);
  req.set_max_tokens(max_tokens);
  req.mutable_sampling()->set_temperature(0);
  req.set_ignore_eos(true);
  req.mutable_stream_options()->set_include_token_ids(true);
  return req;
}

// What the tokens decode to, as a stream would produce it.
std::string Detokenize(const engine::Tokenizer& tok, const std::vector<int32_t>& ids) {
  engine::StreamingDetokenizer d(tok);
  std::string out;
  for (int32_t id : ids) out += d.Push(id);
  return out + d.Flush();
}

TEST(GrpcServiceTest, GenerateStreamsDeltasThenFinishWithUsage) {
  auto s = MakeStack();
  Result r = Generate(*s, Chat("hello world", 12));
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  ASSERT_TRUE(r.finish.has_value());
  EXPECT_TRUE(r.finish_was_last);
  EXPECT_GE(r.deltas, 1);
  EXPECT_EQ(r.finish->reason(), "length");
  EXPECT_EQ(r.finish->usage().completion_tokens(), 12);
  EXPECT_EQ(static_cast<int>(r.ids.size()), 12);
  EXPECT_GT(r.finish->usage().prompt_tokens(), 3);
  EXPECT_EQ(r.finish->usage().total_tokens(),
            r.finish->usage().prompt_tokens() + r.finish->usage().completion_tokens());
  EXPECT_GT(r.finish->time_to_first_token_s(), 0);
  EXPECT_GE(r.finish->total_time_s(), r.finish->time_to_first_token_s());
  EXPECT_EQ(r.text, Detokenize(*s->tokenizer, r.ids));
  EXPECT_FALSE(r.request_id.empty());
  EXPECT_TRUE(s->WaitIdle(absl::Seconds(2)));
}

TEST(GrpcServiceTest, PromptInputAndRequestIdEcho) {
  auto s = MakeStack();
  GenerateRequest req;
  req.set_prompt("the cat sat on the mat");
  req.set_max_tokens(5);
  req.set_request_id("my-id-1");
  req.set_ignore_eos(true);
  Result r = Generate(*s, req);
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.request_id, "my-id-1");
  ASSERT_TRUE(r.finish.has_value());
  EXPECT_EQ(r.finish->usage().completion_tokens(), 5);
  // BOS + the prompt's tokens.
  EXPECT_EQ(r.finish->usage().prompt_tokens(),
            static_cast<int>(s->tokenizer->Encode("the cat sat on the mat", true, true).size()));
  EXPECT_TRUE(r.ids.empty());  // include_token_ids not asked for
}

TEST(GrpcServiceTest, GreedyIsDeterministicAndStopStringEndsWithStop) {
  auto s = MakeStack();
  Result full = Generate(*s, Chat("the cat", 40));
  ASSERT_TRUE(full.status.ok()) << full.status.error_message();
  ASSERT_EQ(Generate(*s, Chat("the cat", 40)).text, full.text);
  // A stop string from the middle of the greedy output: the same request now ends right before
  // its first occurrence.
  const std::string& t = full.text;
  ASSERT_GE(t.size(), 8u) << t;
  size_t at = t.size() / 2;
  while (at < t.size() && (static_cast<unsigned char>(t[at]) & 0xC0) == 0x80) ++at;
  size_t end = at + 1;
  while (end < t.size() && (static_cast<unsigned char>(t[end]) & 0xC0) == 0x80) ++end;
  const std::string stop = t.substr(at, end - at);
  GenerateRequest req = Chat("the cat", 40);
  req.add_stop(stop);
  Result r = Generate(*s, req);
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  ASSERT_TRUE(r.finish.has_value());
  EXPECT_EQ(r.finish->reason(), "stop");
  EXPECT_EQ(r.text, t.substr(0, t.find(stop)));
  EXPECT_TRUE(s->WaitIdle(absl::Seconds(2)));
}

TEST(GrpcServiceTest, EndOfGenerationTokenStopsUnlessIgnoreEos) {
  // Some seed of a short, sampled generation hits </s> or <|im_end|> within the context: the
  // stream then ends with "stop" before max_tokens, and never with the EOG token's text.
  auto s = MakeStack();
  bool saw_stop = false;
  for (int seed = 0; seed < 40 && !saw_stop; ++seed) {
    GenerateRequest req = Chat("hello", 200);
    req.set_ignore_eos(false);
    req.mutable_sampling()->set_temperature(1.5f);
    req.mutable_sampling()->set_top_k(0);
    req.mutable_sampling()->set_top_p(1);
    req.mutable_sampling()->set_min_p(0);
    req.mutable_sampling()->set_seed(seed);
    Result r = Generate(*s, req);
    ASSERT_TRUE(r.status.ok()) << r.status.error_message();
    ASSERT_TRUE(r.finish.has_value());
    for (int32_t id : r.ids) EXPECT_FALSE(s->tokenizer->IsEog(id)) << id;
    if (r.finish->reason() == "stop") {
      saw_stop = true;
      EXPECT_LT(r.finish->usage().completion_tokens(), 200);
    }
  }
  EXPECT_TRUE(saw_stop);
}

TEST(GrpcServiceTest, ListModels) {
  auto s = MakeStack();
  grpc::ClientContext ctx;
  pdserve::v1::ListModelsResponse resp;
  ASSERT_TRUE(s->stub->ListModels(&ctx, {}, &resp).ok());
  ASSERT_EQ(resp.models_size(), 1);
  EXPECT_EQ(resp.models(0).id(), "tiny");
  EXPECT_EQ(resp.models(0).architecture(), "llama");
  EXPECT_EQ(resp.models(0).context_length(), s->scheduler->max_context());
}

TEST(GrpcServiceTest, UnknownModelIsNotFound) {
  auto s = MakeStack();
  GenerateRequest req = Chat("hi", 4);
  req.set_model("gpt-17");
  Result r = Generate(*s, req);
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(r.status.error_message(), HasSubstr("gpt-17"));
  req.set_model("tiny");
  EXPECT_TRUE(Generate(*s, req).status.ok());
}

pdtest::HealthCheckResponse::ServingStatus Health(Stack& s, const std::string& service,
                                                  grpc::Status* status) {
  grpc::ClientContext ctx;
  pdtest::HealthCheckRequest req;
  req.set_service(service);
  pdtest::HealthCheckResponse resp;
  const grpc::internal::RpcMethod method("/grpc.health.v1.Health/Check",
                                         grpc::internal::RpcMethod::NORMAL_RPC);
  *status = grpc::internal::BlockingUnaryCall(s.channel.get(), method, &ctx, req, &resp);
  return resp.status();
}

TEST(GrpcServiceTest, HealthCheckServing) {
  auto s = MakeStack();
  grpc::Status st;
  EXPECT_EQ(Health(*s, "", &st), pdtest::HealthCheckResponse::SERVING);
  EXPECT_TRUE(st.ok()) << st.error_message();
  EXPECT_EQ(Health(*s, "pdserve.v1.Chat", &st), pdtest::HealthCheckResponse::SERVING);
  EXPECT_TRUE(st.ok()) << st.error_message();
  Health(*s, "no.such.Service", &st);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::NOT_FOUND);
}

std::vector<pdtest::ServerReflectionResponse> Reflect(
    Stack& s, const std::vector<pdtest::ServerReflectionRequest>& reqs) {
  grpc::ClientContext ctx;
  const grpc::internal::RpcMethod method(
      "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
      grpc::internal::RpcMethod::BIDI_STREAMING);
  std::unique_ptr<
      grpc::ClientReaderWriter<pdtest::ServerReflectionRequest, pdtest::ServerReflectionResponse>>
      stream(grpc::internal::ClientReaderWriterFactory<
             pdtest::ServerReflectionRequest,
             pdtest::ServerReflectionResponse>::Create(s.channel.get(), method, &ctx));
  std::vector<pdtest::ServerReflectionResponse> out;
  for (const auto& r : reqs) {
    EXPECT_TRUE(stream->Write(r));
    pdtest::ServerReflectionResponse resp;
    EXPECT_TRUE(stream->Read(&resp));
    out.push_back(resp);
  }
  stream->WritesDone();
  EXPECT_TRUE(stream->Finish().ok());
  return out;
}

TEST(GrpcServiceTest, ReflectionListsServicesAndServesChatProto) {
  auto s = MakeStack();
  pdtest::ServerReflectionRequest list, file;
  list.set_list_services("");
  file.set_file_containing_symbol("pdserve.v1.Chat");
  auto resp = Reflect(*s, {list, file});
  ASSERT_EQ(resp.size(), 2u);
  std::vector<std::string> names;
  for (const auto& svc : resp[0].list_services_response().service()) names.push_back(svc.name());
  EXPECT_THAT(names, ::testing::IsSupersetOf({"pdserve.v1.Chat", "grpc.health.v1.Health",
                                              "grpc.reflection.v1alpha.ServerReflection"}));
  ASSERT_TRUE(resp[1].has_file_descriptor_response());
  ASSERT_GE(resp[1].file_descriptor_response().file_descriptor_proto_size(), 1);
  google::protobuf::FileDescriptorProto fd;
  ASSERT_TRUE(fd.ParseFromString(resp[1].file_descriptor_response().file_descriptor_proto(0)));
  EXPECT_EQ(fd.name(), "pdserve/v1/chat.proto");
  ASSERT_GE(fd.service_size(), 1);
  EXPECT_EQ(fd.service(0).name(), "Chat");
  // The served descriptor says the request is pdserve.v1.GenerateRequest, not the wire mirror.
  EXPECT_EQ(fd.service(0).method(0).input_type(), ".pdserve.v1.GenerateRequest");
}

TEST(GrpcServiceTest, ClientCancelFreesKvAtOnce) {
  StackOptions o;
  o.step_delay = std::chrono::milliseconds(5);
  auto s = MakeStack(o);
  const engine::EngineLoad idle = s->scheduler->Load();
  grpc::ClientContext ctx;
  std::atomic<bool> was_busy{false};
  Result r = Generate(*s, Chat("hello", 200), &ctx, [&] {
    const engine::EngineLoad l = s->scheduler->Load();
    was_busy = l.running == 1 && l.kv_blocks_free < idle.kv_blocks_free;
    ctx.TryCancel();
  });
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_TRUE(was_busy);
  // 200 tokens at >= 5 ms a step would take a second; the KV must be back long before that.
  const absl::Time t0 = absl::Now();
  EXPECT_TRUE(s->WaitIdle(absl::Milliseconds(300)));
  EXPECT_LT(absl::Now() - t0, absl::Milliseconds(300));
  EXPECT_EQ(s->scheduler->Load().kv_blocks_free, idle.kv_blocks_free);
}

TEST(GrpcServiceTest, DeadlineExceededFreesKv) {
  StackOptions o;
  o.step_delay = std::chrono::milliseconds(5);
  auto s = MakeStack(o);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(150));
  const absl::Time t0 = absl::Now();
  Result r = Generate(*s, Chat("hello", 200), &ctx);
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_GT(r.deltas, 0);
  EXPECT_LT(absl::Now() - t0, absl::Milliseconds(800));
  EXPECT_TRUE(s->WaitIdle(absl::Milliseconds(300)));
}

TEST(GrpcServiceTest, ApiKeys) {
  StackOptions o;
  o.grpc.api_keys = {"sekret-1", "sekret-2"};
  auto s = MakeStack(o);
  auto call = [&](const char* header, const std::string& value) {
    grpc::ClientContext ctx;
    if (header != nullptr) ctx.AddMetadata(header, value);
    return Generate(*s, Chat("hi", 2), &ctx).status;
  };
  grpc::Status none = call(nullptr, "");
  EXPECT_EQ(none.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_THAT(none.error_message(), HasSubstr("API key is required"));
  EXPECT_EQ(call("authorization", "Bearer wrong").error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(call("authorization", "sekret-1").error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(call("x-api-key", "sekret-").error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_TRUE(call("authorization", "Bearer sekret-1").ok());
  EXPECT_TRUE(call("authorization", "Bearer sekret-2").ok());
  EXPECT_TRUE(call("x-api-key", "sekret-2").ok());
  {
    grpc::ClientContext ctx;
    pdserve::v1::ListModelsResponse resp;
    EXPECT_EQ(s->stub->ListModels(&ctx, {}, &resp).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  }
  grpc::Status st;  // health stays open for probes
  EXPECT_EQ(Health(*s, "", &st), pdtest::HealthCheckResponse::SERVING);
}

struct BadCase {
  std::string name;
  std::function<void(GenerateRequest*)> mutate;
  std::string field;  // the message names it
  grpc::StatusCode code = grpc::StatusCode::INVALID_ARGUMENT;
};

TEST(GrpcServiceTest, BadInputsAreRefusedNamingTheFieldWhileOtherStreamsRun) {
  StackOptions o;
  o.step_delay = std::chrono::milliseconds(2);
  o.frontend.max_tokens_limit = 1000;
  auto s = MakeStack(o);
  const std::string bad_utf8 = "ok \xC3\x28 no";
  std::vector<BadCase> cases = {
      {"no input", [](GenerateRequest* r) { r->clear_input(); }, "messages"},
      {"empty messages", [](GenerateRequest* r) { r->mutable_messages()->clear_messages(); },
       "messages"},
      {"unknown role",
       [](GenerateRequest* r) { r->mutable_messages()->mutable_messages(0)->set_role("robot"); },
       "messages[0].role"},
      {"content utf8",
       [&](GenerateRequest* r) {
         auto* m = r->mutable_messages()->add_messages();
         m->set_role("assistant");
         m->set_content(bad_utf8);
       },
       "messages[1].content: is not valid UTF-8"},
      {"prompt utf8", [&](GenerateRequest* r) { r->set_prompt(bad_utf8); },
       "prompt: is not valid UTF-8"},
      {"stop utf8",
       [&](GenerateRequest* r) {
         r->add_stop("x");
         r->add_stop(bad_utf8);
       },
       "stop[1]: is not valid UTF-8"},
      {"model utf8", [&](GenerateRequest* r) { r->set_model(bad_utf8); }, "model"},
      {"max_tokens 0", [](GenerateRequest* r) { r->set_max_tokens(0); }, "max_tokens"},
      {"max_tokens negative", [](GenerateRequest* r) { r->set_max_tokens(-3); }, "max_tokens"},
      {"max_tokens over limit", [](GenerateRequest* r) { r->set_max_tokens(1001); }, "max_tokens"},
      {"temperature", [](GenerateRequest* r) { r->mutable_sampling()->set_temperature(-0.5f); },
       "temperature"},
      {"top_p 0", [](GenerateRequest* r) { r->mutable_sampling()->set_top_p(0); }, "top_p"},
      {"top_p > 1", [](GenerateRequest* r) { r->mutable_sampling()->set_top_p(1.5f); }, "top_p"},
      {"top_k", [](GenerateRequest* r) { r->mutable_sampling()->set_top_k(-1); }, "top_k"},
      {"min_p < 0", [](GenerateRequest* r) { r->mutable_sampling()->set_min_p(-0.1f); }, "min_p"},
      {"min_p > 1", [](GenerateRequest* r) { r->mutable_sampling()->set_min_p(1.1f); }, "min_p"},
      {"repetition_penalty",
       [](GenerateRequest* r) { r->mutable_sampling()->set_repetition_penalty(0); },
       "repetition_penalty"},
      {"too many stops",
       [](GenerateRequest* r) {
         for (int i = 0; i < 9; ++i) r->add_stop("s" + std::to_string(i));
       },
       "stop: at most 8"},
      {"empty stop",
       [](GenerateRequest* r) {
         r->add_stop("a");
         r->add_stop("");
       },
       "stop[1]: must not be empty"},
      {"prompt + max_tokens over context", [](GenerateRequest* r) { r->set_max_tokens(250); },
       "context is 256"},
      {"prompt over context",
       [](GenerateRequest* r) {
         std::string long_text;
         for (int i = 0; i < 300; ++i) long_text += "hello ";
         r->set_prompt(long_text);
       },
       "context is 256"},
      {"unknown model", [](GenerateRequest* r) { r->set_model("other"); }, "model 'other'",
       grpc::StatusCode::NOT_FOUND},
  };

  // Two healthy streams run across all the refusals.
  std::vector<Result> healthy(2);
  std::vector<std::thread> threads;
  for (int i = 0; i < 2; ++i) {
    threads.emplace_back([&, i] { healthy[i] = Generate(*s, Chat("the mat", 60)); });
  }
  for (const BadCase& c : cases) {
    SCOPED_TRACE(c.name);
    GenerateRequest req = Chat("hello", 4);
    c.mutate(&req);
    Result r = Generate(*s, req);
    EXPECT_EQ(r.status.error_code(), c.code) << r.status.error_message();
    EXPECT_THAT(r.status.error_message(), HasSubstr(c.field));
    EXPECT_EQ(r.deltas, 0);
  }
  for (auto& t : threads) t.join();
  for (const Result& r : healthy) {
    ASSERT_TRUE(r.status.ok()) << r.status.error_message();
    ASSERT_TRUE(r.finish.has_value());
    EXPECT_EQ(r.finish->reason(), "length");
    EXPECT_EQ(r.finish->usage().completion_tokens(), 60);
  }
  EXPECT_EQ(healthy[0].text, healthy[1].text);  // greedy, same prompt: batching changes nothing
  EXPECT_TRUE(s->WaitIdle(absl::Seconds(2)));
}

TEST(GrpcServiceTest, FullQueueIsResourceExhausted) {
  StackOptions o;
  o.step_delay = std::chrono::milliseconds(5);
  o.scheduler.max_running_seqs = 1;
  o.scheduler.token_budget = 64;
  o.scheduler.max_waiting = 1;
  auto s = MakeStack(o);
  // A runs, B waits behind it, C finds the queue full.
  grpc::ClientContext ctx_a, ctx_b;
  Result a, b;
  std::atomic<bool> a_started{false};
  std::thread ta([&] { a = Generate(*s, Chat("hello", 200), &ctx_a, [&] { a_started = true; }); });
  while (!a_started) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  std::thread tb([&] { b = Generate(*s, Chat("hello", 200), &ctx_b); });
  const absl::Time end = absl::Now() + absl::Seconds(2);
  while (s->scheduler->Load().waiting < 1 && absl::Now() < end) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_EQ(s->scheduler->Load().waiting, 1);
  Result c = Generate(*s, Chat("hello", 4));
  EXPECT_EQ(c.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
      << c.status.error_message();
  ctx_a.TryCancel();
  ctx_b.TryCancel();
  ta.join();
  tb.join();
  EXPECT_EQ(a.status.error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_EQ(b.status.error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_TRUE(s->WaitIdle(absl::Seconds(1)));
  // Room again.
  EXPECT_TRUE(Generate(*s, Chat("hello", 4)).status.ok());
}

TEST(GrpcServiceTest, ShutdownCancelsRunningStreamsAfterGrace) {
  StackOptions o;
  o.step_delay = std::chrono::milliseconds(5);
  auto s = MakeStack(o);
  grpc::ClientContext ctx;
  std::atomic<bool> started{false};
  Result r;
  std::thread t([&] { r = Generate(*s, Chat("hello", 200), &ctx, [&] { started = true; }); });
  while (!started) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  const absl::Time t0 = absl::Now();
  s->server->Shutdown(absl::Milliseconds(50));
  EXPECT_LT(absl::Now() - t0, absl::Milliseconds(500));
  t.join();
  EXPECT_FALSE(r.status.ok());
  EXPECT_TRUE(s->WaitIdle(absl::Milliseconds(300)));
}

TEST(GrpcServiceTest, OversizedRequestIsResourceExhausted) {
  StackOptions o;
  o.grpc.max_message_bytes = 4096;
  auto s = MakeStack(o);
  GenerateRequest req = Chat(std::string(8192, 'a'), 4);
  EXPECT_EQ(Generate(*s, req).status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_TRUE(Generate(*s, Chat("hello", 4)).status.ok());
}

TEST(GrpcServiceTest, RequestsAreCountedInTheServingMetrics) {
  StackOptions o;
  o.step_delay = std::chrono::milliseconds(2);
  auto s = MakeStack(o);
  ASSERT_TRUE(Generate(*s, Chat("hello", 6)).status.ok());
  GenerateRequest bad = Chat("hello", 6);
  bad.mutable_sampling()->set_top_k(-2);
  ASSERT_EQ(Generate(*s, bad).status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  {
    grpc::ClientContext ctx;
    Result r = Generate(*s, Chat("hello", 200), &ctx, [&] { ctx.TryCancel(); });
    ASSERT_EQ(r.status.error_code(), grpc::StatusCode::CANCELLED);
  }
  ASSERT_TRUE(s->WaitIdle(absl::Seconds(1)));
  // The cancelled stream's end is recorded when the engine reports it, right after the KV is
  // freed; give the engine thread a moment.
  std::string text;
  for (int i = 0; i < 100; ++i) {
    text = s->registry.Render();
    if (text.find("pdserve_requests_total{finish_reason=\"cancelled\"} 1") != std::string::npos) {
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_THAT(text, HasSubstr("pdserve_requests_accepted_total 2"));
  EXPECT_THAT(text, HasSubstr("pdserve_requests_total{finish_reason=\"length\"} 1"));
  EXPECT_THAT(text, HasSubstr("pdserve_requests_total{finish_reason=\"cancelled\"} 1"));
  EXPECT_THAT(text, HasSubstr("pdserve_errors_total{code=\"INVALID_ARGUMENT\"} 1"));
  EXPECT_THAT(text, HasSubstr("pdserve_errors_total{code=\"CANCELLED\"} 1"));
  // Five intervals between the six tokens of the first request, plus the cancelled one's.
  EXPECT_THAT(text, ::testing::ContainsRegex("pdserve_time_per_output_token_seconds_count [5-9]"));
}

// chat_wire.proto must mirror chat.proto's request field by field (string <-> bytes).
void ExpectMirror(const google::protobuf::Descriptor* pub,
                  const google::protobuf::Descriptor* wire) {
  SCOPED_TRACE(pub->full_name());
  ASSERT_EQ(pub->field_count(), wire->field_count());
  for (int i = 0; i < pub->field_count(); ++i) {
    const google::protobuf::FieldDescriptor* a = pub->field(i);
    const google::protobuf::FieldDescriptor* b = wire->FindFieldByNumber(a->number());
    ASSERT_NE(b, nullptr) << a->name();
    EXPECT_EQ(a->name(), b->name());
    EXPECT_EQ(a->label(), b->label()) << a->name();
    EXPECT_EQ(a->has_presence(), b->has_presence()) << a->name();
    EXPECT_EQ(a->real_containing_oneof() == nullptr, b->real_containing_oneof() == nullptr)
        << a->name();
    if (a->type() == google::protobuf::FieldDescriptor::TYPE_STRING) {
      EXPECT_EQ(b->type(), google::protobuf::FieldDescriptor::TYPE_BYTES) << a->name();
    } else {
      EXPECT_EQ(a->type(), b->type()) << a->name();
    }
    if (a->type() == google::protobuf::FieldDescriptor::TYPE_MESSAGE) {
      ExpectMirror(a->message_type(), b->message_type());
    }
  }
}

TEST(GrpcServiceTest, WireMirrorMatchesChatProto) {
  ExpectMirror(pdserve::v1::GenerateRequest::descriptor(),
               pdserve::v1::wire::GenerateRequest::descriptor());
}

TEST(GrpcServiceTest, StatusCodesMapOneToOne) {
  for (int c = 0; c <= 16; ++c) {
    const absl::Status s(static_cast<absl::StatusCode>(c), c == 0 ? "" : "msg");
    const grpc::Status g = ToGrpc(s);
    EXPECT_EQ(static_cast<int>(g.error_code()), c);
    if (c != 0) {
      EXPECT_EQ(g.error_message(), "msg");
    }
  }
}

// Admission's refusal over gRPC: RESOURCE_EXHAUSTED with the retry hint as trailing metadata.
class OverloadedFrontend : public Frontend {
 public:
  absl::StatusOr<std::unique_ptr<Stream>> Start(const ApiRequest&) override {
    return OverloadedError("server overloaded: 3 requests wait", 4);
  }
  std::vector<ModelCard> Models() const override { return {ModelCard{"tiny", "llama", 64, 1, ""}}; }
};

TEST(GrpcServiceTest, OverloadIsResourceExhaustedWithRetryAfterMetadata) {
  OverloadedFrontend fe;
  auto server = GrpcServer::Start(fe, GrpcServerOptions{}, nullptr);
  ASSERT_TRUE(server.ok()) << server.status();
  auto stub = pdserve::v1::Chat::NewStub(
      grpc::CreateChannel((*server)->address(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  auto reader = stub->Generate(&ctx, Chat("hi", 2));
  GenerateResponse msg;
  EXPECT_FALSE(reader->Read(&msg));
  const grpc::Status st = reader->Finish();
  EXPECT_EQ(st.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(st.error_message(), HasSubstr("overloaded"));
  const auto& trailers = ctx.GetServerTrailingMetadata();
  auto it = trailers.find("retry-after");
  ASSERT_NE(it, trailers.end());
  EXPECT_EQ(std::string(it->second.data(), it->second.size()), "4");
}

}  // namespace
}  // namespace pd::frontend
