#include "common/tls_certs.h"

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstdint>
#include <fstream>
#include <memory>

#include "common/status.h"
#include "common/strings.h"

namespace pd {

namespace {

template <typename T, void (*Free)(T*)>
struct Deleter {
  void operator()(T* p) const { Free(p); }
};
using Key = std::unique_ptr<EVP_PKEY, Deleter<EVP_PKEY, EVP_PKEY_free>>;
using Cert = std::unique_ptr<X509, Deleter<X509, X509_free>>;
using Bio = std::unique_ptr<BIO, Deleter<BIO, BIO_free_all>>;

absl::Status OpenSslError(std::string_view what) {
  const unsigned long e = ERR_get_error();
  char buf[256] = "unknown error";
  if (e != 0) ERR_error_string_n(e, buf, sizeof(buf));
  return absl::InternalError(StrCat("TLS: ", what, ": ", buf));
}

std::string BioText(BIO* bio) {
  char* data = nullptr;
  const long n = BIO_get_mem_data(bio, &data);
  return std::string(data, n > 0 ? n : 0);
}

absl::StatusOr<PemPair> ToPem(X509* cert, EVP_PKEY* key) {
  Bio c(BIO_new(BIO_s_mem())), k(BIO_new(BIO_s_mem()));
  if (!c || !k || PEM_write_bio_X509(c.get(), cert) != 1 ||
      PEM_write_bio_PrivateKey(k.get(), key, nullptr, nullptr, 0, nullptr, nullptr) != 1) {
    return OpenSslError("writing PEM");
  }
  return PemPair{BioText(c.get()), BioText(k.get())};
}

absl::Status AddExtension(X509* cert, X509* issuer, int nid, const std::string& value) {
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, issuer, cert, nullptr, nullptr, 0);
  X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value.c_str());
  if (ext == nullptr) return absl::InvalidArgumentError(StrCat("TLS: bad extension '", value, "'"));
  const int ok = X509_add_ext(cert, ext, -1);
  X509_EXTENSION_free(ext);
  if (ok != 1) return OpenSslError("adding an extension");
  return absl::OkStatus();
}

// A certificate for `key` named `common_name`, valid from an hour ago for `validity`, issued by
// `issuer` (null: by itself). Extensions and signature are the caller's.
absl::StatusOr<Cert> NewCert(EVP_PKEY* key, std::string_view common_name, X509* issuer,
                             absl::Duration validity) {
  Cert cert(X509_new());
  if (!cert) return OpenSslError("X509_new");
  X509_set_version(cert.get(), 2);  // v3
  uint64_t serial = 0;
  if (RAND_bytes(reinterpret_cast<unsigned char*>(&serial), sizeof(serial)) != 1) {
    return OpenSslError("random serial");
  }
  ASN1_INTEGER_set_uint64(X509_get_serialNumber(cert.get()), serial >> 1);
  X509_gmtime_adj(X509_getm_notBefore(cert.get()), -3600);
  X509_gmtime_adj(X509_getm_notAfter(cert.get()), absl::ToInt64Seconds(validity));
  if (X509_set_pubkey(cert.get(), key) != 1) return OpenSslError("set public key");
  X509_NAME* name = X509_get_subject_name(cert.get());
  const std::string cn(common_name);
  X509_NAME_add_entry_by_txt(name, "O", MBSTRING_ASC,
                             reinterpret_cast<const unsigned char*>("pdserve"), -1, -1, 0);
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC,
                             reinterpret_cast<const unsigned char*>(cn.c_str()), -1, -1, 0);
  X509_set_issuer_name(cert.get(), issuer != nullptr ? X509_get_subject_name(issuer) : name);
  return cert;
}

absl::Status WriteFile(const std::string& path, const std::string& text, mode_t mode) {
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << text;
    if (!out) return absl::UnavailableError(StrCat("cannot write ", path));
  }
  if (chmod(path.c_str(), mode) != 0) return absl::UnavailableError(StrCat("cannot chmod ", path));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<PemPair> MakeCa(std::string_view common_name, absl::Duration validity) {
  Key key(EVP_EC_gen("P-256"));
  if (!key) return OpenSslError("EC key generation");
  PD_ASSIGN_OR_RETURN(Cert cert, NewCert(key.get(), common_name, nullptr, validity));
  PD_RETURN_IF_ERROR(AddExtension(cert.get(), cert.get(), NID_basic_constraints, "critical,CA:TRUE"));
  PD_RETURN_IF_ERROR(
      AddExtension(cert.get(), cert.get(), NID_key_usage, "critical,keyCertSign,cRLSign"));
  PD_RETURN_IF_ERROR(AddExtension(cert.get(), cert.get(), NID_subject_key_identifier, "hash"));
  if (X509_sign(cert.get(), key.get(), EVP_sha256()) == 0) return OpenSslError("signing the CA");
  return ToPem(cert.get(), key.get());
}

absl::StatusOr<PemPair> IssueCert(const PemPair& ca, std::string_view common_name,
                                  const std::vector<std::string>& dns_names,
                                  const std::vector<std::string>& ip_addresses,
                                  absl::Duration validity) {
  Bio cb(BIO_new_mem_buf(ca.cert.data(), static_cast<int>(ca.cert.size())));
  Bio kb(BIO_new_mem_buf(ca.key.data(), static_cast<int>(ca.key.size())));
  Cert ca_cert(PEM_read_bio_X509(cb.get(), nullptr, nullptr, nullptr));
  Key ca_key(PEM_read_bio_PrivateKey(kb.get(), nullptr, nullptr, nullptr));
  if (!ca_cert || !ca_key) return absl::InvalidArgumentError("TLS: the CA's PEM does not parse");
  Key key(EVP_EC_gen("P-256"));
  if (!key) return OpenSslError("EC key generation");
  PD_ASSIGN_OR_RETURN(Cert cert, NewCert(key.get(), common_name, ca_cert.get(), validity));
  X509* c = cert.get();
  PD_RETURN_IF_ERROR(AddExtension(c, ca_cert.get(), NID_basic_constraints, "critical,CA:FALSE"));
  PD_RETURN_IF_ERROR(AddExtension(c, ca_cert.get(), NID_key_usage, "critical,digitalSignature"));
  PD_RETURN_IF_ERROR(AddExtension(c, ca_cert.get(), NID_ext_key_usage, "serverAuth,clientAuth"));
  PD_RETURN_IF_ERROR(AddExtension(c, ca_cert.get(), NID_authority_key_identifier, "keyid"));
  std::string alt;
  for (const std::string& d : dns_names) alt += StrCat(alt.empty() ? "" : ",", "DNS:", d);
  for (const std::string& ip : ip_addresses) alt += StrCat(alt.empty() ? "" : ",", "IP:", ip);
  if (!alt.empty()) PD_RETURN_IF_ERROR(AddExtension(c, ca_cert.get(), NID_subject_alt_name, alt));
  if (X509_sign(c, ca_key.get(), EVP_sha256()) == 0) return OpenSslError("signing a certificate");
  return ToPem(c, key.get());
}

absl::StatusOr<std::string> WriteLocalCluster(const std::string& dir,
                                              const std::vector<std::string>& names) {
  if (mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return absl::UnavailableError(StrCat("cannot create ", dir));
  }
  const absl::Duration validity = absl::Hours(24 * 30);
  PD_ASSIGN_OR_RETURN(PemPair ca, MakeCa("pdserve local cluster CA", validity));
  const std::string ca_path = StrCat(dir, "/ca.pem");
  PD_RETURN_IF_ERROR(WriteFile(ca_path, ca.cert, 0644));
  for (const std::string& name : names) {
    PD_ASSIGN_OR_RETURN(PemPair p, IssueCert(ca, name, {name, "localhost"}, {"127.0.0.1"}, validity));
    PD_RETURN_IF_ERROR(WriteFile(StrCat(dir, "/", name, ".pem"), p.cert, 0644));
    PD_RETURN_IF_ERROR(WriteFile(StrCat(dir, "/", name, ".key"), p.key, 0600));
  }
  return ca_path;
}

}  // namespace pd
