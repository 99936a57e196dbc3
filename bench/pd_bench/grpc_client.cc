// ApiClient over the public gRPC API: pdserve.v1.Chat/Generate, a server-streaming call read with
// the synchronous API (one blocking reader per request thread).
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <vector>

#include "absl/status/status.h"
#include "bench/pd_bench/client.h"
#include "common/status.h"
#include "common/strings.h"
#include "pdserve/v1/chat.grpc.pb.h"

namespace pd::bench {
namespace {

namespace v1 = ::pdserve::v1;

std::chrono::system_clock::time_point DeadlineIn(double seconds) {
  return std::chrono::system_clock::now() +
         std::chrono::duration_cast<std::chrono::system_clock::duration>(
             std::chrono::duration<double>(seconds));
}

std::string CodeName(grpc::StatusCode code) {
  // gRPC and absl number their codes identically.
  return std::string(absl::StatusCodeToString(static_cast<absl::StatusCode>(code)));
}

// Usage.cached_tokens. Declared `int32` (proto3, no presence), a 0 is also what a server sends that
// does not know the field; the record says so. Should the field become `optional int32`, its
// presence is read exactly.
template <typename Usage>
void SetCachedTokens(const Usage& usage, RequestRecord* record) {
  if constexpr (requires { usage.has_cached_tokens(); }) {
    if (usage.has_cached_tokens()) record->cached_tokens = usage.cached_tokens();
  } else {
    record->cached_tokens = usage.cached_tokens();
    record->cached_tokens_implicit = true;
  }
}

class GrpcClient final : public ApiClient {
 public:
  explicit GrpcClient(const ClientOptions& options) : options_(options) {
    const int n = std::max(1, options.grpc_channels);
    for (int i = 0; i < n; ++i) {
      grpc::ChannelArguments args;
      // A private subchannel pool per channel: each channel opens its own connection, so the
      // streams are spread over `n` HTTP/2 connections instead of sharing one.
      args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
      channels_.push_back(
          grpc::CreateCustomChannel(options.target, grpc::InsecureChannelCredentials(), args));
      stubs_.push_back(v1::Chat::NewStub(channels_.back()));
    }
  }

  absl::StatusOr<std::string> Probe() override {
    grpc::ClientContext ctx;
    ctx.set_deadline(DeadlineIn(10));
    v1::ListModelsResponse resp;
    const grpc::Status s = stubs_[0]->ListModels(&ctx, v1::ListModelsRequest(), &resp);
    if (!s.ok()) {
      return absl::UnavailableError(pd::StrCat("gRPC ListModels on ", options_.target, ": ",
                                               CodeName(s.error_code()), ": ", s.error_message()));
    }
    if (resp.models_size() == 0) {
      return absl::NotFoundError(pd::StrCat(options_.target, " lists no model"));
    }
    // Connect every channel now, so that no request's TTFT includes a connection set-up.
    for (const std::shared_ptr<grpc::Channel>& channel : channels_) {
      if (!channel->WaitForConnected(DeadlineIn(10))) {
        return absl::UnavailableError(pd::StrCat("gRPC: cannot connect to ", options_.target));
      }
    }
    return resp.models(0).id();
  }

  void SetModel(const std::string& model) override { options_.model = model; }

  void Run(const BenchRequest& request, Clock::time_point origin, RequestRecord* record) override {
    v1::GenerateRequest req;
    req.set_model(options_.model);
    if (!request.messages.empty()) {
      for (const ChatMessage& message : request.messages) {
        v1::ChatMessage* m = req.mutable_messages()->add_messages();
        m->set_role(message.role);
        m->set_content(message.content);
      }
    } else if (options_.chat) {
      v1::ChatMessage* m = req.mutable_messages()->add_messages();
      m->set_role("user");
      m->set_content(request.prompt);
    } else {
      req.set_prompt(request.prompt);
    }
    req.set_max_tokens(request.max_tokens);
    req.set_ignore_eos(true);
    // Token ids make every token visible, also while the text of a partial character is held back.
    req.mutable_stream_options()->set_include_token_ids(true);
    if (options_.temperature) req.mutable_sampling()->set_temperature(*options_.temperature);
    req.set_request_id(pd::StrCat("pd-bench-", request.id));

    v1::Chat::Stub& stub = *stubs_[next_.fetch_add(1, std::memory_order_relaxed) % stubs_.size()];
    grpc::ClientContext ctx;
    ctx.set_deadline(DeadlineIn(options_.timeout_s));
    StreamTimer timer(origin, record);
    timer.Sent();
    std::unique_ptr<grpc::ClientReader<v1::GenerateResponse>> reader = stub.Generate(&ctx, req);
    v1::GenerateResponse resp;
    bool finished = false;
    while (reader->Read(&resp)) {
      if (resp.has_delta()) {
        const v1::Delta& d = resp.delta();
        if (request.keep_text) record->text += d.text();
        if (d.token_ids_size() > 0) {
          timer.Content(d.token_ids_size());
        } else if (!d.text().empty()) {
          timer.Content(1);
        }
      } else if (resp.has_finish()) {
        timer.Ended();
        finished = true;
        const v1::Finish& f = resp.finish();
        record->finish_reason = f.reason();
        if (f.has_usage()) {
          record->prompt_tokens = f.usage().prompt_tokens();
          record->completion_tokens = f.usage().completion_tokens();
          SetCachedTokens(f.usage(), record);
        }
      }
    }
    const grpc::Status status = reader->Finish();
    timer.Ended();
    if (!status.ok()) {
      record->ok = false;
      record->error = CodeName(status.error_code());
      record->error_message = status.error_message();
    } else if (!finished) {
      record->ok = false;
      record->error = "incomplete_stream";
      record->error_message = "the stream ended without a finish message";
    } else {
      record->ok = true;
    }
  }

 private:
  ClientOptions options_;  // model set once by SetModel before the requests start
  std::vector<std::shared_ptr<grpc::Channel>> channels_;
  std::vector<std::unique_ptr<v1::Chat::Stub>> stubs_;  // one per channel
  std::atomic<size_t> next_{0};
};

}  // namespace

absl::StatusOr<std::unique_ptr<ApiClient>> MakeGrpcClient(const ClientOptions& options) {
  std::string host;
  int port = 0;
  PD_RETURN_IF_ERROR(SplitHostPort(options.target, &host, &port));
  return std::make_unique<GrpcClient>(options);
}

}  // namespace pd::bench
