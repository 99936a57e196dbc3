#include "frontend/public_api.h"

#include <algorithm>
#include <cstdint>
#include <thread>
#include <utility>

#include "common/net.h"
#include "common/status.h"
#include "common/strings.h"
#include "frontend/model_card.h"

namespace pd::frontend {

absl::StatusOr<FrontendModel> LoadFrontendModel(const engine::GgufFile& file,
                                                const std::string& path,
                                                const ModelConfigOptions& model) {
  FrontendModel m;
  PD_ASSIGN_OR_RETURN(m.tokenizer, engine::Tokenizer::FromGguf(file));
  PD_ASSIGN_OR_RETURN(m.chat_template, model.chat_template.empty()
                                           ? engine::DetectChatTemplate(file)
                                           : engine::ParseChatTemplateName(model.chat_template));
  m.card = ModelCardFromGguf(file, path, model.id);
  return m;
}

FrontendOptions FrontendOptionsFrom(const ServeOptions& o) {
  FrontendOptions fo;
  fo.default_max_tokens = o.limits.default_max_tokens;
  fo.max_tokens_limit = o.limits.max_tokens;
  fo.max_stop = o.limits.max_stop;
  fo.admission.max_waiting = o.admission.max_waiting;
  fo.admission.ttft_slo = absl::Milliseconds(o.admission.ttft_slo_ms);
  fo.admission.slo_headroom = o.admission.slo_headroom;
  return fo;
}

absl::StatusOr<std::unique_ptr<PublicServers>> PublicServers::Start(
    const ServeOptions& o, Frontend& frontend, MetricsRegistry& registry, ServingMetrics* metrics,
    std::function<void()> refresh_metrics) {
  std::unique_ptr<PublicServers> s(new PublicServers());
  if (o.grpc.enabled) {
    GrpcServerOptions go;
    go.host = o.grpc.host;
    go.port = o.grpc.port;
    go.api_keys = o.api_keys;
    go.tls_cert_file = o.tls.cert_file;
    go.tls_key_file = o.tls.key_file;
    go.max_message_bytes = static_cast<int>(std::min<int64_t>(o.limits.max_body_bytes, INT32_MAX));
    PD_ASSIGN_OR_RETURN(s->grpc_, GrpcServer::Start(frontend, go, metrics));
  }
  if (o.http.enabled) {
    HttpServerOptions ho;
    ho.max_body_bytes = static_cast<size_t>(o.limits.max_body_bytes);
    const HttpLimitsOptions& l = o.http_limits;
    ho.max_connections = l.max_connections;
    ho.max_connections_per_address = l.max_connections_per_address;
    ho.header_timeout = absl::Milliseconds(l.header_timeout_ms);
    ho.body_timeout = absl::Milliseconds(l.body_timeout_ms);
    ho.idle_timeout = absl::Milliseconds(l.idle_timeout_ms);
    ho.write_timeout = absl::Milliseconds(l.write_timeout_ms);
    ho.threads = l.threads;
    ho.io_threads = l.io_threads;
    ho.tls_cert_file = o.tls.cert_file;
    ho.tls_key_file = o.tls.key_file;
    ho.api_keys = o.api_keys;
    ho.refresh_metrics = std::move(refresh_metrics);
    s->http_ = std::make_unique<HttpServer>(ho, frontend, registry, metrics);
    PD_ASSIGN_OR_RETURN(s->http_port_, s->http_->Start(o.http.host, o.http.port));
    s->http_host_ = o.http.host;
    s->http_tls_ = !o.tls.cert_file.empty();
  }
  return s;
}

PublicServers::~PublicServers() { Shutdown(absl::ZeroDuration()); }

std::string PublicServers::Endpoints() const {
  return StrCat("grpc=", grpc_ ? grpc_->address() : "off",
                " http=",
                http_ ? StrCat(http_tls_ ? "https://" : "http://", JoinHostPort(http_host_, http_port_))
                      : "off");
}

void PublicServers::Shutdown(absl::Duration grace) {
  if (shut_down_) return;
  shut_down_ = true;
  std::thread grpc_stop([this, grace] {
    if (grpc_) grpc_->Shutdown(grace);
  });
  if (http_) http_->Stop();
  grpc_stop.join();
}

}  // namespace pd::frontend
