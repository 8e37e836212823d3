#ifndef LONGHAUL_DAEMON_TRANSPORT_TLS_TRUST_H_
#define LONGHAUL_DAEMON_TRANSPORT_TLS_TRUST_H_

// The tcp transport's trust material and the certificate helpers around it:
// a TrustContext is one immutable generation of CA, own certificate and key,
// and CRL; a PeerCertificate is what a peer proved in its handshake, kept so
// that a reload can check it again.

#include <openssl/ssl.h>
#include <openssl/x509.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

// After <utility>: Debian's Boost.Asio uses std::exchange without including it.
#include <boost/asio/ssl/context.hpp>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "daemon/transport/transport.h"

namespace longhaul::transport {

// Holds a reference on the leaf and on each certificate of the chain.
class PeerCertificate {
 public:
  PeerCertificate(std::string site, X509* leaf, STACK_OF(X509) * chain)
      : site_(std::move(site)), leaf_(leaf), chain_(chain ? X509_chain_up_ref(chain) : nullptr) {
    X509_up_ref(leaf_);
  }
  ~PeerCertificate() {
    X509_free(leaf_);
    sk_X509_pop_free(chain_, X509_free);
  }
  PeerCertificate(const PeerCertificate&) = delete;
  PeerCertificate& operator=(const PeerCertificate&) = delete;

  const std::string& site() const { return site_; }
  X509* leaf() const { return leaf_; }
  // The untrusted certificates the peer sent beside the leaf (may hold it too).
  STACK_OF(X509) * chain() const { return chain_; }

 private:
  const std::string site_;
  X509* const leaf_;
  STACK_OF(X509) * const chain_;
};

// The errors on OpenSSL's queue, "; "-separated; empties the queue.
std::string OpenSslErrors();

// The first site from `candidates` that the certificate names (SAN DNS, or
// CN when there is no SAN), or "" if none.
std::string MatchSite(X509* cert, const std::vector<std::string>& candidates);

// The certificate's subject, one line.
std::string CertificateSubject(X509* cert);

// An overdue CRL (past its next-update date) still lists what it revoked:
// applying it beats refusing every peer until someone re-signs it.
// TrustContext::Load warns about it.
int ToleratesOverdueCrl(int ok, X509_STORE_CTX* store);

template <typename T, void (*Free)(T*)>
struct OpenSslDeleter {
  void operator()(T* p) const { Free(p); }
};
using BioPtr = std::unique_ptr<BIO, OpenSslDeleter<BIO, BIO_free_all>>;
using X509Ptr = std::unique_ptr<X509, OpenSslDeleter<X509, X509_free>>;
using X509CrlPtr = std::unique_ptr<X509_CRL, OpenSslDeleter<X509_CRL, X509_CRL_free>>;
using X509StoreCtxPtr =
    std::unique_ptr<X509_STORE_CTX, OpenSslDeleter<X509_STORE_CTX, X509_STORE_CTX_free>>;

// One generation of trust material: an SSL_CTX with the CA, our certificate
// and key, and the CRL. Immutable once loaded; thread-safe.
class TrustContext {
 public:
  // Loads `identity`'s CA, certificate and key (which must name
  // identity.local_site) and CRL, for TLS 1.3 with AES-256-GCM only; the
  // handshakes it makes verify the peer with `verify` (OpenSSL's
  // verify_callback). InvalidArgument naming the file that cannot be used,
  // Internal when OpenSSL refuses the TLS settings.
  static absl::StatusOr<std::shared_ptr<TrustContext>> Load(const TlsIdentity& identity,
                                                            SSL_verify_cb verify);

  boost::asio::ssl::context& ssl() { return ctx_; }
  const std::string& crl_file() const { return crl_file_; }
  size_t revoked() const { return revoked_; }

  // OK if `peer` verifies against this material now; PermissionDenied
  // naming the site and the reason otherwise.
  absl::Status Check(const PeerCertificate& peer) const;

  // Why verification failed, for the log and the error: names `cert` (the
  // one that failed; `address` when unknown) by the site among `sites` it
  // names and its serial.
  std::string DescribeFailure(X509* cert, long verify_error, const std::string& address,
                              const std::vector<std::string>& sites) const;

 private:
  TrustContext() : ctx_(boost::asio::ssl::context::tls) {}
  absl::Status LoadCrl(const TlsIdentity& identity);

  boost::asio::ssl::context ctx_;
  X509_STORE* store_ = nullptr;  // owned by ctx_
  std::string crl_file_;
  size_t revoked_ = 0;
};

}  // namespace longhaul::transport

#endif  // LONGHAUL_DAEMON_TRANSPORT_TLS_TRUST_H_
