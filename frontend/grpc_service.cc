#include "frontend/grpc_service.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/impl/codegen/proto_utils.h>
#include <grpcpp/impl/rpc_service_method.h>
#include <grpcpp/support/method_handler.h>

#include <chrono>
#include <utility>

#include "common/log.h"
#include "common/grpc_tls.h"
#include "common/status.h"
#include "common/strings.h"
#include "frontend/serving_metrics.h"
#include "pdserve/v1/chat.pb.h"
#include "pdserve/v1/chat_wire.pb.h"

namespace pd::frontend {
namespace {

constexpr char kGenerateMethod[] = "/pdserve.v1.Chat/Generate";
constexpr char kListModelsMethod[] = "/pdserve.v1.Chat/ListModels";
constexpr char kChatServiceName[] = "pdserve.v1.Chat";


std::string_view View(const grpc::string_ref& s) { return std::string_view(s.data(), s.size()); }

// wire request (strings as bytes) -> ApiRequest; the Frontend validates the values.
absl::StatusOr<ApiRequest> ToApiRequest(const pdserve::v1::wire::GenerateRequest& in,
                                        const grpc::ServerContext& context) {
  ApiRequest r;
  if (!IsValidUtf8(in.model())) return absl::InvalidArgumentError("model: is not valid UTF-8");
  r.model = in.model();
  switch (in.input_case()) {
    case pdserve::v1::wire::GenerateRequest::kMessages:
      for (const auto& m : in.messages().messages()) r.messages.push_back({m.role(), m.content()});
      break;
    case pdserve::v1::wire::GenerateRequest::kPrompt:
      r.prompt = in.prompt();
      break;
    case pdserve::v1::wire::GenerateRequest::INPUT_NOT_SET:
      break;
  }
  const auto& s = in.sampling();
  if (s.has_temperature()) r.temperature = s.temperature();
  if (s.has_top_p()) r.top_p = s.top_p();
  if (s.has_top_k()) r.top_k = s.top_k();
  if (s.has_min_p()) r.min_p = s.min_p();
  if (s.has_repetition_penalty()) r.repetition_penalty = s.repetition_penalty();
  if (s.has_seed()) r.seed = s.seed();
  if (in.has_max_tokens()) r.max_tokens = in.max_tokens();
  r.stop.assign(in.stop().begin(), in.stop().end());
  r.ignore_eos = in.ignore_eos();
  r.priority = in.priority();
  if (in.has_speculative()) r.speculative = in.speculative();
  r.request_id = in.request_id();
  const auto deadline = context.deadline();
  if (deadline != std::chrono::system_clock::time_point::max()) {
    r.deadline = absl::FromChrono(deadline);
  }
  return r;
}

}  // namespace

ChatService::ChatService(Frontend& frontend, const GrpcServerOptions& options,
                         ServingMetrics* metrics)
    : frontend_(frontend),
      api_keys_(options.api_keys),
      poll_interval_(options.poll_interval),
      metrics_(metrics) {
  AddMethod(new grpc::internal::RpcServiceMethod(
      kGenerateMethod, grpc::internal::RpcMethod::SERVER_STREAMING,
      new grpc::internal::ServerStreamingHandler<ChatService, pdserve::v1::wire::GenerateRequest,
                                                 pdserve::v1::GenerateResponse>(
          [](ChatService* service, grpc::ServerContext* ctx,
             const pdserve::v1::wire::GenerateRequest* req,
             grpc::ServerWriter<pdserve::v1::GenerateResponse>* writer) {
            return service->Generate(ctx, req, writer);
          },
          this)));
  AddMethod(new grpc::internal::RpcServiceMethod(
      kListModelsMethod, grpc::internal::RpcMethod::NORMAL_RPC,
      new grpc::internal::RpcMethodHandler<
          ChatService, pdserve::v1::ListModelsRequest, pdserve::v1::ListModelsResponse,
          grpc::protobuf::MessageLite, grpc::protobuf::MessageLite>(
          [](ChatService* service, grpc::ServerContext* ctx,
             const pdserve::v1::ListModelsRequest* req,
             pdserve::v1::ListModelsResponse* resp) { return service->ListModels(ctx, req, resp); },
          this)));
}

grpc::Status ChatService::Authenticate(const grpc::ServerContext& context) const {
  if (api_keys_.empty()) return grpc::Status::OK;
  std::string_view given;
  const auto& md = context.client_metadata();
  if (auto it = md.find("authorization"); it != md.end()) {
    std::string_view v = View(it->second);
    constexpr std::string_view kBearer = "Bearer ";
    if (v.size() > kBearer.size() && v.substr(0, kBearer.size()) == kBearer) {
      given = v.substr(kBearer.size());
    }
  }
  if (given.empty()) {
    if (auto it = md.find("x-api-key"); it != md.end()) given = View(it->second);
  }
  if (given.empty()) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                        "an API key is required: metadata 'authorization: Bearer KEY' or "
                        "'x-api-key: KEY'");
  }
  bool ok = false;
  for (const std::string& k : api_keys_) ok |= SecretEquals(given, k);
  if (!ok) return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "the API key is not valid");
  return grpc::Status::OK;
}

grpc::Status ChatService::Generate(grpc::ServerContext* context,
                                   const pdserve::v1::wire::GenerateRequest* request,
                                   grpc::ServerWriter<pdserve::v1::GenerateResponse>* writer) {
  auto fail = [this](const absl::Status& s) {
    if (metrics_ != nullptr) metrics_->Error(s.code());
    return ToGrpc(s);
  };
  if (grpc::Status auth = Authenticate(*context); !auth.ok()) {
    if (metrics_ != nullptr) metrics_->Error(absl::StatusCode::kUnauthenticated);
    return auth;
  }
  if (!accepting_.load()) return fail(absl::UnavailableError("the server is shutting down"));
  absl::StatusOr<ApiRequest> api = ToApiRequest(*request, *context);
  if (!api.ok()) return fail(api.status());
  // Errors of Start are counted by the Frontend.
  absl::StatusOr<std::unique_ptr<Stream>> stream = frontend_.Start(*api);
  if (!stream.ok()) {
    if (const int retry = RetryAfterSeconds(stream.status()); retry > 0) {
      context->AddTrailingMetadata("retry-after", std::to_string(retry));
    }
    return ToGrpc(stream.status());
  }
  const bool include_ids = request->stream_options().include_token_ids();

  // From here on, returning early destroys the stream, which cancels the request in the engine.
  pdserve::v1::GenerateResponse response;
  response.set_request_id((*stream)->request_id());
  while (true) {
    if (context->IsCancelled()) {
      return grpc::Status(grpc::StatusCode::CANCELLED, "the call was cancelled");
    }
    ApiChunk chunk;
    if (!(*stream)->Next(&chunk, absl::Now() + poll_interval_)) continue;
    if (!chunk.text.empty() || (include_ids && !chunk.token_ids.empty())) {
      response.clear_finish();
      pdserve::v1::Delta* delta = response.mutable_delta();
      delta->set_text(chunk.text);
      delta->clear_token_ids();
      if (include_ids)
        delta->mutable_token_ids()->Add(chunk.token_ids.begin(), chunk.token_ids.end());
      if (!writer->Write(response)) {
        return grpc::Status(grpc::StatusCode::CANCELLED, "the client went away");
      }
    }
    if (!chunk.finished) continue;
    if (!chunk.status.ok()) return ToGrpc(chunk.status);
    response.clear_delta();
    pdserve::v1::Finish* finish = response.mutable_finish();
    finish->set_reason(chunk.finish_reason);
    finish->mutable_usage()->set_prompt_tokens(chunk.prompt_tokens);
    finish->mutable_usage()->set_completion_tokens(chunk.completion_tokens);
    finish->mutable_usage()->set_total_tokens(chunk.prompt_tokens + chunk.completion_tokens);
    finish->mutable_usage()->set_cached_tokens(chunk.cached_tokens);
    finish->mutable_usage()->set_draft_tokens(chunk.draft_tokens);
    finish->mutable_usage()->set_accepted_draft_tokens(chunk.accepted_tokens);
    const engine::RequestTiming& t = chunk.timing;
    if (t.first_token > t.arrival && t.arrival != absl::InfinitePast()) {
      finish->set_time_to_first_token_s(
          static_cast<float>(absl::ToDoubleSeconds(t.first_token - t.arrival)));
    }
    if (t.finished > t.arrival && t.arrival != absl::InfinitePast()) {
      finish->set_total_time_s(static_cast<float>(absl::ToDoubleSeconds(t.finished - t.arrival)));
    }
    writer->WriteLast(response, grpc::WriteOptions());
    return grpc::Status::OK;
  }
}

grpc::Status ChatService::ListModels(grpc::ServerContext* context,
                                     const pdserve::v1::ListModelsRequest* /*request*/,
                                     pdserve::v1::ListModelsResponse* response) {
  if (grpc::Status auth = Authenticate(*context); !auth.ok()) {
    if (metrics_ != nullptr) metrics_->Error(absl::StatusCode::kUnauthenticated);
    return auth;
  }
  for (const ModelCard& m : frontend_.Models()) {
    pdserve::v1::ModelInfo* info = response->add_models();
    info->set_id(m.id);
    info->set_architecture(m.architecture);
    info->set_context_length(m.context_length);
    info->set_parameters(m.parameters);
    info->set_quantization(m.quantization);
  }
  return grpc::Status::OK;
}

absl::StatusOr<std::unique_ptr<GrpcServer>> GrpcServer::Start(Frontend& frontend,
                                                              const GrpcServerOptions& options,
                                                              ServingMetrics* metrics) {
  std::unique_ptr<GrpcServer> s(new GrpcServer());
  s->host_ = options.host;
  s->service_ = std::make_unique<ChatService>(frontend, options, metrics);
  // Both are process-wide switches that take effect for servers built afterwards.
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  // The reflection service serves descriptors from the generated pool; make sure chat.proto is
  // in it even though the service class is hand-written.
  (void)pdserve::v1::GenerateRequest::descriptor();

  grpc::ServerBuilder builder;
  const bool v6 = options.host.find(':') != std::string::npos;
  const std::string addr = StrCat(v6 ? "[" : "", options.host, v6 ? "]" : "", ":", options.port);
  PD_ASSIGN_OR_RETURN(std::shared_ptr<grpc::ServerCredentials> credentials,
                      GrpcServerCredentials(
                          {options.tls_cert_file, options.tls_key_file, options.tls_ca_file}));
  builder.AddListeningPort(addr, credentials, &s->port_);
  builder.SetMaxReceiveMessageSize(options.max_message_bytes);
  builder.RegisterService(s->service_.get());
  s->server_ = builder.BuildAndStart();
  if (s->server_ == nullptr || s->port_ == 0) {
    return absl::UnavailableError(StrCat("cannot listen for gRPC on ", addr));
  }
  grpc::HealthCheckServiceInterface* health = s->server_->GetHealthCheckService();
  if (health != nullptr) {
    health->SetServingStatus(true);
    health->SetServingStatus(kChatServiceName, true);
  }
  return s;
}

std::string GrpcServer::address() const {
  const bool v6 = host_.find(':') != std::string::npos;
  return StrCat(v6 ? "[" : "", host_, v6 ? "]" : "", ":", port_);
}

void GrpcServer::Shutdown(absl::Duration grace) {
  if (shut_down_.exchange(true)) return;
  if (grpc::HealthCheckServiceInterface* health = server_->GetHealthCheckService()) {
    health->SetServingStatus(false);
  }
  service_->StopAccepting();
  // Refuses new calls at once; after the deadline cancels the calls still running, whose
  // handlers then see IsCancelled() within one poll interval and drop their streams.
  server_->Shutdown(absl::ToChronoTime(absl::Now() + grace));
  server_->Wait();
}

GrpcServer::~GrpcServer() {
  if (server_ != nullptr) Shutdown(absl::ZeroDuration());
}

}  // namespace pd::frontend
