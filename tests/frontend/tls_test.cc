// TLS on the public APIs and mutual TLS credentials (common/grpc_tls.h), with certificates from
// the throwaway CA (common/tls_certs.h): HTTPS through the HTTP server, TLS and mTLS handshakes
// through real gRPC servers over loopback, and the refusals (no TLS, an unknown CA, no client
// certificate) at the handshake.
#include <grpcpp/grpcpp.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509_vfy.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <memory>
#include <string>

#include "common/grpc_tls.h"
#include "common/status.h"
#include "common/metrics.h"
#include "common/strings.h"
#include "common/tls_certs.h"
#include "frontend/http_server.h"
#include "frontend/grpc_service.h"
#include "pdserve/v1/chat.grpc.pb.h"

namespace pd {
namespace {

using ::testing::HasSubstr;

// A temporary directory with a CA and certificates for "server" and "client", and a second,
// unrelated CA ("other") with its own "stranger" certificate.
class TlsDir {
 public:
  TlsDir() {
    char tmpl[] = "/tmp/pd_tls_XXXXXX";
    dir_ = mkdtemp(tmpl);
    auto ca = WriteLocalCluster(dir_, {"server", "client"});
    PD_CHECK_OK(ca.status());
    auto other = WriteLocalCluster(dir_ + "/other", {"stranger"});
    PD_CHECK_OK(other.status());
  }
  ~TlsDir() { std::system(StrCat("rm -rf '", dir_, "'").c_str()); }
  std::string Path(const std::string& name) const { return StrCat(dir_, "/", name); }
  TlsFiles Files(const std::string& who, bool with_ca = true,
                 const std::string& ca = "ca.pem") const {
    return {Path(who + ".pem"), Path(who + ".key"), with_ca ? Path(ca) : ""};
  }

 private:
  std::string dir_;
};

// OpenSSL's own chain verification of `cert_pem` against `ca_pem`.
bool Verifies(const std::string& cert_pem, const std::string& ca_pem) {
  BIO* cb = BIO_new_mem_buf(cert_pem.data(), static_cast<int>(cert_pem.size()));
  BIO* ab = BIO_new_mem_buf(ca_pem.data(), static_cast<int>(ca_pem.size()));
  X509* cert = PEM_read_bio_X509(cb, nullptr, nullptr, nullptr);
  X509* ca = PEM_read_bio_X509(ab, nullptr, nullptr, nullptr);
  X509_STORE* store = X509_STORE_new();
  X509_STORE_add_cert(store, ca);
  X509_STORE_CTX* ctx = X509_STORE_CTX_new();
  X509_STORE_CTX_init(ctx, store, cert, nullptr);
  const bool ok = X509_verify_cert(ctx) == 1;
  X509_STORE_CTX_free(ctx);
  X509_STORE_free(store);
  X509_free(cert);
  X509_free(ca);
  BIO_free(cb);
  BIO_free(ab);
  return ok;
}

TEST(TlsCertsTest, IssuedCertificatesChainToTheirCaOnly) {
  auto ca = MakeCa("test CA", absl::Hours(1));
  ASSERT_TRUE(ca.ok()) << ca.status();
  auto other = MakeCa("other CA", absl::Hours(1));
  ASSERT_TRUE(other.ok());
  auto leaf = IssueCert(*ca, "node-a", {"node-a", "localhost"}, {"127.0.0.1"}, absl::Hours(1));
  ASSERT_TRUE(leaf.ok()) << leaf.status();
  EXPECT_THAT(leaf->cert, HasSubstr("BEGIN CERTIFICATE"));
  EXPECT_THAT(leaf->key, HasSubstr("BEGIN PRIVATE KEY"));
  EXPECT_TRUE(Verifies(leaf->cert, ca->cert));
  EXPECT_FALSE(Verifies(leaf->cert, other->cert));
  EXPECT_EQ(IssueCert(PemPair{"junk", "junk"}, "x", {}, {}, absl::Hours(1)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(IssueCert(*ca, "x", {}, {"not-an-ip"}, absl::Hours(1)).ok());
}

TEST(TlsCertsTest, ReadPemNamesWhatIsWrong) {
  TlsDir d;
  EXPECT_TRUE(ReadPem(d.Path("ca.pem"), "CA").ok());
  auto missing = ReadPem(d.Path("nope.pem"), "TLS CA");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(missing.status().message()), HasSubstr("nope.pem"));
  {
    std::ofstream(d.Path("junk.pem")) << "not a certificate";
  }
  EXPECT_THAT(std::string(ReadPem(d.Path("junk.pem"), "x").status().message()),
              HasSubstr("no PEM block"));
  EXPECT_FALSE(GrpcServerCredentials({d.Path("server.pem"), "", ""}).ok());
  EXPECT_FALSE(GrpcChannelCredentials({d.Path("client.pem"), d.Path("client.key"), ""}).ok());
}

// ---- HTTPS -------------------------------------------------------------------------------------

class OneModelFrontend : public frontend::Frontend {
 public:
  absl::StatusOr<std::unique_ptr<frontend::Stream>> Start(const frontend::ApiRequest&) override {
    return absl::UnavailableError("not used here");
  }
  std::vector<frontend::ModelCard> Models() const override {
    return {frontend::ModelCard{"tiny", "llama", 64, 1, "F32"}};
  }
};

TEST(HttpsTest, ServesTlsOnlyWithTheConfiguredCertificate) {
  TlsDir d;
  OneModelFrontend fe;
  MetricsRegistry registry;
  frontend::HttpServerOptions o;
  o.tls_cert_file = d.Path("server.pem");
  o.tls_key_file = d.Path("server.key");
  frontend::HttpServer server(o, fe, registry);
  auto port = server.Start("127.0.0.1", 0);
  ASSERT_TRUE(port.ok()) << port.status();

  httplib::SSLClient client("127.0.0.1", *port);
  client.set_ca_cert_path(d.Path("ca.pem").c_str());
  client.enable_server_certificate_verification(true);
  auto r = client.Get("/v1/models");
  ASSERT_TRUE(r) << httplib::to_string(r.error());
  EXPECT_EQ(r->status, 200);
  EXPECT_THAT(r->body, HasSubstr("\"tiny\""));
  // A client that trusts another CA refuses the server; a plaintext client gets nothing.
  httplib::SSLClient wrong("127.0.0.1", *port);
  wrong.set_ca_cert_path(d.Path("other/ca.pem").c_str());
  wrong.enable_server_certificate_verification(true);
  EXPECT_FALSE(wrong.Get("/v1/models"));
  httplib::Client plain("127.0.0.1", *port);
  plain.set_read_timeout(2, 0);
  auto p = plain.Get("/v1/models");
  EXPECT_TRUE(!p || p->status != 200);
  // The server keeps serving after both.
  r = client.Get("/health");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
}

TEST(HttpsTest, BadTlsFilesAreRefusedAtStart) {
  TlsDir d;
  OneModelFrontend fe;
  MetricsRegistry r1, r2;
  frontend::HttpServerOptions o;
  o.tls_cert_file = d.Path("server.pem");
  frontend::HttpServer half(o, fe, r1);
  EXPECT_EQ(half.Start("127.0.0.1", 0).status().code(), absl::StatusCode::kInvalidArgument);
  o.tls_key_file = d.Path("missing.key");
  frontend::HttpServer missing(o, fe, r2);
  auto s = missing.Start("127.0.0.1", 0);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.status().message()), HasSubstr("missing.key"));
}

// ---- gRPC TLS and mutual TLS ------------------------------------------------------------------

// The public gRPC API with `files` as its TLS (ca_file: mutual TLS).
struct TlsGrpcServer {
  explicit TlsGrpcServer(const TlsFiles& files) {
    frontend::GrpcServerOptions o;
    o.tls_cert_file = files.cert_file;
    o.tls_key_file = files.key_file;
    o.tls_ca_file = files.ca_file;
    auto s = frontend::GrpcServer::Start(fe, o, nullptr);
    PD_CHECK_OK(s.status());
    server = std::move(*s);
  }
  OneModelFrontend fe;
  std::unique_ptr<frontend::GrpcServer> server;
};

// ListModels through a channel made with `files` (the server's name checked as "localhost").
grpc::Status ListModels(int port, const TlsFiles& files) {
  auto creds = GrpcChannelCredentials(files);
  if (!creds.ok()) return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "bad credentials");
  auto stub = pdserve::v1::Chat::NewStub(
      grpc::CreateChannel(StrCat("localhost:", port), *creds));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  pdserve::v1::ListModelsRequest req;
  pdserve::v1::ListModelsResponse resp;
  grpc::Status st = stub->ListModels(&ctx, req, &resp);
  if (st.ok() && (resp.models_size() != 1 || resp.models(0).id() != "tiny")) {
    return grpc::Status(grpc::StatusCode::INTERNAL, "wrong answer");
  }
  return st;
}

TEST(GrpcTlsTest, ServerTlsChecksTheServerAgainstTheCa) {
  TlsDir d;
  TlsGrpcServer s(d.Files("server", /*with_ca=*/false));
  const int port = s.server->port();
  EXPECT_TRUE(ListModels(port, {"", "", d.Path("ca.pem")}).ok());
  EXPECT_FALSE(ListModels(port, {"", "", d.Path("other/ca.pem")}).ok());  // unknown CA
  EXPECT_FALSE(ListModels(port, {}).ok());                                // plaintext
}

TEST(GrpcTlsTest, MutualTlsRefusesClientsWithoutAValidCertificateAtTheHandshake) {
  TlsDir d;
  TlsGrpcServer s(d.Files("server"));
  const int port = s.server->port();
  EXPECT_TRUE(ListModels(port, d.Files("client")).ok());
  // No client certificate, one from another CA, or plaintext: refused before any RPC runs.
  const grpc::Status none = ListModels(port, {"", "", d.Path("ca.pem")});
  EXPECT_EQ(none.error_code(), grpc::StatusCode::UNAVAILABLE) << none.error_message();
  const grpc::Status stranger = ListModels(
      port, {d.Path("other/stranger.pem"), d.Path("other/stranger.key"), d.Path("ca.pem")});
  EXPECT_EQ(stranger.error_code(), grpc::StatusCode::UNAVAILABLE) << stranger.error_message();
  EXPECT_FALSE(ListModels(port, {}).ok());
}

}  // namespace
}  // namespace pd
