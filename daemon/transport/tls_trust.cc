#include "daemon/transport/tls_trust.h"

#include <openssl/bn.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509v3.h>

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"

namespace longhaul::transport {
namespace {

std::string CertificateSerial(X509* cert) {
  BIGNUM* bn = ASN1_INTEGER_to_BN(X509_get0_serialNumber(cert), nullptr);
  if (bn == nullptr) return "?";
  char* hex = BN_bn2hex(bn);
  std::string out = hex != nullptr ? hex : "?";
  OPENSSL_free(hex);
  BN_free(bn);
  return out;
}

// "site-a (serial 1A2B)" when the certificate names one of `sites`, else its
// subject and serial.
std::string DescribeCertificate(X509* cert, const std::vector<std::string>& sites) {
  std::string name = MatchSite(cert, sites);
  return absl::StrCat(name.empty() ? CertificateSubject(cert) : name, " (serial ",
                      CertificateSerial(cert), ")");
}

// True when the last error on the queue is only the end of a PEM file.
bool OnlyPemEndOfFile() {
  unsigned long err = ERR_peek_last_error();
  bool eof = ERR_GET_LIB(err) == ERR_LIB_PEM && ERR_GET_REASON(err) == PEM_R_NO_START_LINE;
  if (eof) ERR_clear_error();
  return eof;
}

}  // namespace

std::string OpenSslErrors() {
  std::string out;
  while (unsigned long err = ERR_get_error()) {
    char buf[256];
    ERR_error_string_n(err, buf, sizeof buf);
    if (!out.empty()) out += "; ";
    out += buf;
  }
  return out;
}

// The first site from `candidates` that the certificate names (SAN DNS, or
// CN when there is no SAN), or "" if none.
std::string MatchSite(X509* cert, const std::vector<std::string>& candidates) {
  for (const std::string& site : candidates) {
    if (X509_check_host(cert, site.data(), site.size(), X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS,
                        nullptr) == 1) {
      return site;
    }
  }
  return "";
}

std::string CertificateSubject(X509* cert) {
  char buf[256];
  X509_NAME_oneline(X509_get_subject_name(cert), buf, sizeof buf);
  return buf;
}

// An overdue CRL (past its next-update date) still lists what it revoked:
// applying it beats refusing every peer until someone re-signs it.
// TrustContext::Load warns about it.
int ToleratesOverdueCrl(int ok, X509_STORE_CTX* store) {
  if (!ok && X509_STORE_CTX_get_error(store) == X509_V_ERR_CRL_HAS_EXPIRED) return 1;
  return ok;
}

absl::StatusOr<std::shared_ptr<TrustContext>> TrustContext::Load(const TlsIdentity& identity,
                                                                 SSL_verify_cb verify) {
  std::shared_ptr<TrustContext> trust(new TrustContext());
  SSL_CTX* ctx = trust->ctx_.native_handle();
  trust->store_ = SSL_CTX_get_cert_store(ctx);
  // TLS 1.3 only, AES-256-GCM only: no downgrade, no plaintext, ever.
  if (SSL_CTX_set_min_proto_version(ctx, TLS1_3_VERSION) != 1 ||
      SSL_CTX_set_max_proto_version(ctx, TLS1_3_VERSION) != 1 ||
      SSL_CTX_set_ciphersuites(ctx, "TLS_AES_256_GCM_SHA384") != 1) {
    return absl::InternalError(absl::StrCat("TLS setup failed: ", OpenSslErrors()));
  }
  if (SSL_CTX_load_verify_locations(ctx, identity.ca_file.c_str(), nullptr) != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot load CA certificate ", identity.ca_file, ": ", OpenSslErrors()));
  }
  if (SSL_CTX_use_certificate_chain_file(ctx, identity.cert_file.c_str()) != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot load site certificate ", identity.cert_file, ": ", OpenSslErrors()));
  }
  if (SSL_CTX_use_PrivateKey_file(ctx, identity.key_file.c_str(), SSL_FILETYPE_PEM) != 1 ||
      SSL_CTX_check_private_key(ctx) != 1) {
    return absl::InvalidArgumentError(absl::StrCat("cannot load private key ", identity.key_file,
                                                   " for ", identity.cert_file, ": ",
                                                   OpenSslErrors()));
  }
  X509* own = SSL_CTX_get0_certificate(ctx);
  if (MatchSite(own, {identity.local_site}).empty()) {
    return absl::InvalidArgumentError(absl::StrCat("certificate ", identity.cert_file, " (",
                                                   CertificateSubject(own), ") does not name site ",
                                                   identity.local_site));
  }
  if (!identity.crl_file.empty()) {
    if (absl::Status s = trust->LoadCrl(identity); !s.ok()) return s;
  }
  SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, verify);
  SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_OFF);
  SSL_CTX_set_num_tickets(ctx, 0);
  return trust;
}

absl::Status TrustContext::LoadCrl(const TlsIdentity& identity) {
  crl_file_ = identity.crl_file;
  const std::string what = absl::StrCat("tls.crl ", crl_file_);
  std::vector<X509Ptr> cas;
  if (BioPtr in(BIO_new_file(identity.ca_file.c_str(), "r")); in != nullptr) {
    while (X509* ca = PEM_read_bio_X509(in.get(), nullptr, nullptr, nullptr)) cas.emplace_back(ca);
  }
  ERR_clear_error();
  BioPtr in(BIO_new_file(crl_file_.c_str(), "r"));
  if (in == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("cannot read ", what, ": ", OpenSslErrors()));
  }
  size_t crls = 0;
  while (X509CrlPtr crl{PEM_read_bio_X509_CRL(in.get(), nullptr, nullptr, nullptr)}) {
    ++crls;
    bool signed_by_ca = false;
    for (const X509Ptr& ca : cas) {
      signed_by_ca =
          X509_NAME_cmp(X509_CRL_get_issuer(crl.get()), X509_get_subject_name(ca.get())) == 0 &&
          X509_CRL_verify(crl.get(), X509_get0_pubkey(ca.get())) == 1;
      if (signed_by_ca) break;
    }
    ERR_clear_error();
    if (!signed_by_ca) {
      char name[256];
      X509_NAME_oneline(X509_CRL_get_issuer(crl.get()), name, sizeof name);
      return absl::InvalidArgumentError(absl::StrCat(
          what, ": its CRL #", crls, " (issuer ", name, ") is not signed by the CA in tls.ca ",
          identity.ca_file, "; make the CRL with deploy/pki.sh from that CA"));
    }
    if (const ASN1_TIME* next = X509_CRL_get0_nextUpdate(crl.get());
        next != nullptr && X509_cmp_current_time(next) < 0) {
      spdlog::warn(
          "{} is past its next-update date; still applying it (renew it with "
          "deploy/pki.sh crl DIR)",
          what);
    }
    if (STACK_OF(X509_REVOKED)* revoked = X509_CRL_get_REVOKED(crl.get())) {
      revoked_ += sk_X509_REVOKED_num(revoked);
    }
    if (X509_STORE_add_crl(store_, crl.get()) != 1) {
      return absl::InternalError(absl::StrCat(what, ": ", OpenSslErrors()));
    }
  }
  if (!OnlyPemEndOfFile()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " is not a valid PEM CRL: ", OpenSslErrors()));
  }
  if (crls == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " holds no PEM CRL (deploy/pki.sh crl DIR makes one)"));
  }
  X509_STORE_set_flags(store_, X509_V_FLAG_CRL_CHECK);
  return absl::OkStatus();
}

absl::Status TrustContext::Check(const PeerCertificate& peer) const {
  X509StoreCtxPtr ctx(X509_STORE_CTX_new());
  if (ctx == nullptr || X509_STORE_CTX_init(ctx.get(), store_, peer.leaf(), peer.chain()) != 1) {
    return absl::InternalError(absl::StrCat("certificate check failed: ", OpenSslErrors()));
  }
  X509_STORE_CTX_set_verify_cb(ctx.get(), ToleratesOverdueCrl);
  if (X509_verify_cert(ctx.get()) == 1) return absl::OkStatus();
  ERR_clear_error();
  return absl::PermissionDeniedError(
      DescribeFailure(peer.leaf(), X509_STORE_CTX_get_error(ctx.get()), "", {peer.site()}));
}

std::string TrustContext::DescribeFailure(X509* cert, long verify_error, const std::string& address,
                                          const std::vector<std::string>& sites) const {
  std::string who = cert != nullptr ? DescribeCertificate(cert, sites) : address;
  if (verify_error == X509_V_ERR_CERT_REVOKED) {
    return absl::StrCat("certificate of ", who, " is revoked by tls.crl ", crl_file_);
  }
  return absl::StrCat("certificate of ", who,
                      " rejected: ", X509_verify_cert_error_string(verify_error));
}

}  // namespace longhaul::transport
