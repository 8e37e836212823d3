// The tcp transport: TLS 1.3 (AES-256-GCM only) over kernel TCP, with both
// ends authenticated by certificates from one CA that must name a configured
// site. Channels use blocking I/O on their owner's thread; a watchdog bounds
// the handshake so a silent or plaintext client cannot hold a thread.
//
// Trust material (CA, own certificate and key, CRL) lives in one immutable
// TrustContext. ReloadTrust loads a new one for the handshakes that follow;
// each channel keeps the one it was made with, and every authenticated
// channel is registered with the peer certificate it proved, so a reload can
// re-verify each open channel's peer and abort those the new material refuses.

#include "absl/strings/string_view.h"
#include <linux/sockios.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/bn.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <sys/ioctl.h>
#include <sys/socket.h>

#include <atomic>
#include <optional>
#include <utility>
#include <boost/asio.hpp>
#include <boost/asio/ssl.hpp>
#include <chrono>
#include <condition_variable>
#include <list>
#include <mutex>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/container/inlined_vector.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "daemon/transport/tcp_info.h"
#include "daemon/transport/transport.h"
#include "common/fmt_absl.h"
#include "spdlog/spdlog.h"

namespace longhaul::transport {

// Holds a reference on the leaf and on each certificate of the chain.
class PeerCertificate {
 public:
  PeerCertificate(std::string site, X509* leaf, STACK_OF(X509)* chain)
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
  STACK_OF(X509)* chain() const { return chain_; }

 private:
  const std::string site_;
  X509* const leaf_;
  STACK_OF(X509)* const chain_;
};

namespace {

namespace asio = boost::asio;
namespace ssl = boost::asio::ssl;
using tcp = asio::ip::tcp;

constexpr auto kHandshakeTimeout = std::chrono::seconds(10);

absl::StatusOr<std::pair<std::string, std::string>> SplitHostPort(const std::string& address) {
  std::string host, port;
  if (!address.empty() && address[0] == '[') {
    size_t close = address.find(']');
    if (close == std::string::npos || close + 1 >= address.size() || address[close + 1] != ':') {
      return absl::InvalidArgumentError(absl::StrCat("address '", address, "' is not [host]:port"));
    }
    host = address.substr(1, close - 1);
    port = address.substr(close + 2);
  } else {
    size_t colon = address.rfind(':');
    if (colon == std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat("address '", address, "' has no :port"));
    }
    host = address.substr(0, colon);
    port = address.substr(colon + 1);
  }
  uint32_t port_number;
  if (host.empty() || !absl::SimpleAtoi(port, &port_number) || port_number > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("address '", address, "' is not host:port"));
  }
  return std::make_pair(host, port);
}

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

// An overdue CRL (past its next-update date) still lists what it revoked:
// applying it beats refusing every peer until someone re-signs it.
// TrustContext::Load warns about it.
int ToleratesOverdueCrl(int ok, X509_STORE_CTX* store) {
  if (!ok && X509_STORE_CTX_get_error(store) == X509_V_ERR_CRL_HAS_EXPIRED) return 1;
  return ok;
}

template <typename T, void (*Free)(T*)>
struct OpenSslDeleter {
  void operator()(T* p) const { Free(p); }
};
using BioPtr = std::unique_ptr<BIO, OpenSslDeleter<BIO, BIO_free_all>>;
using X509Ptr = std::unique_ptr<X509, OpenSslDeleter<X509, X509_free>>;
using X509CrlPtr = std::unique_ptr<X509_CRL, OpenSslDeleter<X509_CRL, X509_CRL_free>>;
using X509StoreCtxPtr =
    std::unique_ptr<X509_STORE_CTX, OpenSslDeleter<X509_STORE_CTX, X509_STORE_CTX_free>>;

// True when the last error on the queue is only the end of a PEM file.
bool OnlyPemEndOfFile() {
  unsigned long err = ERR_peek_last_error();
  bool eof = ERR_GET_LIB(err) == ERR_LIB_PEM && ERR_GET_REASON(err) == PEM_R_NO_START_LINE;
  if (eof) ERR_clear_error();
  return eof;
}

// The SSL ex_data slot that points from an SSL to its TcpTlsChannel, for the
// verify callback.
int ChannelSlot() {
  static const int slot = SSL_get_ex_new_index(0, nullptr, nullptr, nullptr, nullptr);
  return slot;
}

// One generation of trust material: an SSL_CTX with the CA, our certificate
// and key, and the CRL. Immutable once loaded; thread-safe.
class TrustContext {
 public:
  static absl::StatusOr<std::shared_ptr<TrustContext>> Load(const TlsIdentity& identity);

  ssl::context& ssl() { return ctx_; }
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
  TrustContext() : ctx_(ssl::context::tls) {}
  absl::Status LoadCrl(const TlsIdentity& identity);

  ssl::context ctx_;
  X509_STORE* store_ = nullptr;  // owned by ctx_
  std::string crl_file_;
  size_t revoked_ = 0;
};

int VerifyCallback(int ok, X509_STORE_CTX* store);

absl::StatusOr<std::shared_ptr<TrustContext>> TrustContext::Load(const TlsIdentity& identity) {
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
  SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, VerifyCallback);
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

// Runs callbacks at deadlines on one thread; used to abort handshakes that
// take too long. Thread-safe.
class Watchdog {
 public:
  Watchdog() : thread_([this] { Run(); }) {}
  ~Watchdog() {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

  using Handle = std::list<std::pair<std::chrono::steady_clock::time_point, std::function<void()>>>::iterator;

  Handle Arm(std::chrono::steady_clock::duration after, std::function<void()> fn) {
    std::lock_guard lock(mu_);
    auto it = entries_.emplace(entries_.end(), std::chrono::steady_clock::now() + after, std::move(fn));
    cv_.notify_all();
    return it;
  }
  void Disarm(Handle h) {
    std::lock_guard lock(mu_);
    entries_.erase(h);
  }

 private:
  void Run() {
    std::unique_lock lock(mu_);
    while (!stop_) {
      auto now = std::chrono::steady_clock::now();
      auto next = now + std::chrono::seconds(1);
      for (auto it = entries_.begin(); it != entries_.end();) {
        if (it->first <= now) {
          it->second();
          it = entries_.erase(it);
        } else {
          next = std::min(next, it->first);
          ++it;
        }
      }
      cv_.wait_until(lock, next);
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::list<std::pair<std::chrono::steady_clock::time_point, std::function<void()>>> entries_;
  std::thread thread_;
};

class TcpTlsChannel;

// The trust material new channels take, and the authenticated channels a
// reload must re-check. Shared by the transport and its channels, so that a
// channel may outlive the transport. Thread-safe.
struct ChannelRegistry {
  absl::Mutex mu;
  std::shared_ptr<TrustContext> trust ABSL_GUARDED_BY(mu);
  absl::flat_hash_set<TcpTlsChannel*> live ABSL_GUARDED_BY(mu);
};

class TcpTlsChannel final : public Channel {
 public:
  // `socket` is connected; the TLS session uses `trust` for its handshake.
  TcpTlsChannel(tcp::socket socket, std::shared_ptr<TrustContext> trust,
                std::shared_ptr<ChannelRegistry> registry, bool dialed)
      : trust_(std::move(trust)),
        registry_(std::move(registry)),
        dialed_(dialed),
        stream_(std::move(socket), trust_->ssl()) {
    SSL_set_ex_data(stream_.native_handle(), ChannelSlot(), this);
  }
  ~TcpTlsChannel() override {
    {
      absl::MutexLock lock(&registry_->mu);
      registry_->live.erase(this);
    }
    boost::system::error_code ec;
    stream_.lowest_layer().close(ec);
  }

  ssl::stream<tcp::socket>& stream() { return stream_; }
  const std::shared_ptr<TrustContext>& trust() const { return trust_; }
  bool dialed() const { return dialed_; }
  void set_identity(std::string site, std::string address) {
    peer_site_ = std::move(site);
    peer_address_ = std::move(address);
  }
  void set_congestion_control(std::string cc) { congestion_control_ = std::move(cc); }
  void set_peer_certificate(std::shared_ptr<const PeerCertificate> cert) {
    peer_certificate_ = std::move(cert);
  }
  std::shared_ptr<const PeerCertificate> peer_certificate() const override {
    return peer_certificate_;
  }

  // Called by the verify callback, during the handshake, with the first
  // certificate that failed verification.
  void NoteRejected(X509* cert) {
    if (rejected_ == nullptr && cert != nullptr && X509_up_ref(cert) == 1) rejected_.reset(cert);
  }
  X509* rejected() const { return rejected_.get(); }

  absl::Status Write(absl::Span<const absl::Span<const uint8_t>> parts) override {
    absl::InlinedVector<asio::const_buffer, 4> buffers;
    for (absl::Span<const uint8_t> part : parts) buffers.emplace_back(part.data(), part.size());
    boost::system::error_code ec;
    asio::write(stream_, buffers, ec);
    return ToStatus(ec, "write");
  }

  absl::Status ReadExactly(absl::Span<uint8_t> out) override {
    boost::system::error_code ec;
    asio::read(stream_, asio::buffer(out.data(), out.size()), ec);
    return ToStatus(ec, "read");
  }

  void Abort() override {
    aborted_.store(true);
    ::shutdown(stream_.lowest_layer().native_handle(), SHUT_RDWR);
  }

  absl::StatusOr<std::vector<uint8_t>> ExportKeyingMaterial(absl::string_view label,
                                                            size_t length) override {
    std::vector<uint8_t> out(length);
    if (SSL_export_keying_material(stream_.native_handle(), out.data(), out.size(), label.data(),
                                   label.size(), nullptr, 0, 0) != 1) {
      return absl::InternalError(absl::StrCat("TLS key export failed: ", OpenSslErrors()));
    }
    return out;
  }

  const std::string& peer_site() const override { return peer_site_; }
  const std::string& peer_address() const override { return peer_address_; }

  void LimitUnsentBytes(uint64_t bytes) override {
    int lowat = static_cast<int>(std::min<uint64_t>(bytes, 1u << 30));
    setsockopt(stream_.lowest_layer().native_handle(), IPPROTO_TCP, TCP_NOTSENT_LOWAT, &lowat,
               sizeof lowat);
  }

  void LimitPacingRate(Bandwidth rate) override {
    uint64_t bytes_per_second = static_cast<uint64_t>(std::max<int64_t>(rate.ToBytesPerSecond(), 1));
    setsockopt(stream_.lowest_layer().native_handle(), SOL_SOCKET, SO_MAX_PACING_RATE,
               &bytes_per_second, sizeof bytes_per_second);
  }

  uint64_t UnsentBytes() const override {
    int fd = const_cast<ssl::stream<tcp::socket>&>(stream_).lowest_layer().native_handle();
    int unsent = 0;
    if (::ioctl(fd, SIOCOUTQNSD, &unsent) != 0 || unsent < 0) return 0;
    return static_cast<uint64_t>(unsent);
  }

  LinkStats Stats() const override {
    LinkStats stats;
    stats.congestion_control = congestion_control_;
    int fd = const_cast<ssl::stream<tcp::socket>&>(stream_).lowest_layer().native_handle();
    KernelTcpInfo info;
    if (ReadKernelTcpInfo(fd, &info)) {
      stats.rtt_ms = info.rtt_ms;
      stats.delivery_rate_mbit = info.delivery_rate_mbit;
      stats.retransmits = info.total_retrans;
    }
    int sndbuf = 0;
    socklen_t len = sizeof sndbuf;
    if (getsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sndbuf, &len) == 0) stats.socket_buffer_bytes = sndbuf;
    uint64_t max_pacing = 0;
    len = sizeof max_pacing;
    if (getsockopt(fd, SOL_SOCKET, SO_MAX_PACING_RATE, &max_pacing, &len) == 0 &&
        len == sizeof max_pacing && max_pacing != ~uint64_t{0}) {
      stats.max_pacing_rate_bytes_per_second = max_pacing;
    }
    return stats;
  }

 private:
  absl::Status ToStatus(const boost::system::error_code& ec, absl::string_view op) const {
    if (!ec) return absl::OkStatus();
    if (aborted_.load()) return absl::CancelledError(absl::StrCat(op, " aborted"));
    if (ec == asio::error::eof || ec == ssl::error::stream_truncated) {
      return absl::UnavailableError(
          absl::StrCat(peer_site_, " at ", peer_address_, " closed the connection"));
    }
    // TLS 1.3 ends the client's handshake before the server has judged the
    // client's certificate, so the server's verdict arrives on a read.
    if (ec.category() == asio::error::get_ssl_category() &&
        ERR_GET_REASON(ec.value()) == SSL_R_SSLV3_ALERT_CERTIFICATE_REVOKED) {
      return absl::PermissionDeniedError(absl::StrCat(
          peer_site_, " at ", peer_address_,
          " refused our certificate: its tls.crl lists it as revoked (this site needs a new "
          "certificate: deploy/pki.sh DIR SITE)"));
    }
    return absl::UnavailableError(
        absl::StrCat(op, " to ", peer_site_, " at ", peer_address_, " failed: ", ec.message()));
  }

  // Declared before stream_, which holds an SSL made from it.
  const std::shared_ptr<TrustContext> trust_;
  const std::shared_ptr<ChannelRegistry> registry_;
  const bool dialed_;
  ssl::stream<tcp::socket> stream_;
  std::string peer_site_;
  std::string peer_address_;
  std::string congestion_control_;
  std::shared_ptr<const PeerCertificate> peer_certificate_;
  X509Ptr rejected_;
  std::atomic<bool> aborted_{false};
};

int VerifyCallback(int ok, X509_STORE_CTX* store) {
  if (ToleratesOverdueCrl(ok, store)) return 1;
  auto* ssl =
      static_cast<SSL*>(X509_STORE_CTX_get_ex_data(store, SSL_get_ex_data_X509_STORE_CTX_idx()));
  auto* channel =
      ssl != nullptr ? static_cast<TcpTlsChannel*>(SSL_get_ex_data(ssl, ChannelSlot())) : nullptr;
  if (channel != nullptr) channel->NoteRejected(X509_STORE_CTX_get_current_cert(store));
  return 0;
}

class TcpTlsTransport final : public Transport {
 public:
  TcpTlsTransport(TlsIdentity identity, TcpTuning tuning)
      : identity_(std::move(identity)),
        tuning_(tuning),
        registry_(std::make_shared<ChannelRegistry>()) {}

  ~TcpTlsTransport() override { Shutdown(); }

  absl::Status Init() {
    auto trust = TrustContext::Load(identity_);
    if (!trust.ok()) return trust.status();
    absl::MutexLock lock(&registry_->mu);
    registry_->trust = *std::move(trust);
    return absl::OkStatus();
  }

  absl::Status ReloadTrust(const TlsIdentity& identity) override {
    if (identity.local_site != identity_.local_site ||
        identity.peer_sites != identity_.peer_sites) {
      return absl::InvalidArgumentError(
          "the site name and the peer list cannot change without a restart");
    }
    auto trust = TrustContext::Load(identity);
    if (!trust.ok()) return trust.status();
    size_t open = 0, closed = 0;
    {
      absl::MutexLock lock(&registry_->mu);
      registry_->trust = *trust;
      for (TcpTlsChannel* channel : registry_->live) {
        ++open;
        absl::Status check = (*trust)->Check(*channel->peer_certificate());
        if (check.ok()) continue;
        ++closed;
        spdlog::warn("closing channel {} {} at {}: {}", channel->dialed() ? "to" : "from",
                     channel->peer_site(), channel->peer_address(), check.message());
        channel->Abort();
      }
    }
    spdlog::info(
        "reloaded TLS trust: ca {}, certificate {}, {}; {} open channels re-checked, {} "
        "closed",
        identity.ca_file, identity.cert_file,
        identity.crl_file.empty()
            ? std::string("no crl")
            : absl::StrCat("crl ", identity.crl_file, " (", (*trust)->revoked(), " revoked)"),
        open, closed);
    return absl::OkStatus();
  }

  absl::Status CheckPeer(const PeerCertificate& peer) const override {
    return CurrentTrust()->Check(peer);
  }

  absl::StatusOr<std::unique_ptr<Channel>> Dial(const std::string& site,
                                                const std::string& address) override {
    auto host_port = SplitHostPort(address);
    if (!host_port.ok()) return host_port.status();
    boost::system::error_code ec;
    tcp::resolver resolver(io_);
    auto endpoints = resolver.resolve(host_port->first, host_port->second, ec);
    if (ec) {
      return absl::UnavailableError(absl::StrCat("cannot resolve ", site, " address ", address, ": ",
                                                 ec.message()));
    }
    tcp::socket socket(io_);
    asio::connect(socket, endpoints, ec);
    if (ec) {
      return absl::UnavailableError(
          absl::StrCat("cannot connect to ", site, " at ", address, ": ", ec.message()));
    }
    auto channel = std::make_unique<TcpTlsChannel>(std::move(socket), CurrentTrust(), registry_,
                                                   /*dialed=*/true);
    channel->set_congestion_control(TuneSocket(channel->stream().lowest_layer()));
    channel->set_identity(site, address);
    SSL_set_tlsext_host_name(channel->stream().native_handle(), site.c_str());
    absl::Status handshake = Handshake(*channel, ssl::stream_base::client);
    if (!handshake.ok()) {
      return absl::Status(handshake.code(), absl::StrCat("TLS handshake with ", site, " at ",
                                                         address, " failed: ", handshake.message()));
    }
    X509* cert = SSL_get0_peer_certificate(channel->stream().native_handle());
    if (MatchSite(cert, {site}).empty()) {
      std::string named = MatchSite(cert, identity_.peer_sites);
      return absl::PermissionDeniedError(
          absl::StrCat("peer at ", address, " presented a certificate for ",
                       named.empty() ? CertificateSubject(cert) : named, ", expected ", site));
    }
    if (absl::Status s = Adopt(*channel, site); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat("TLS handshake with ", site, " at ", address,
                                                 " failed: ", s.message()));
    }
    return std::unique_ptr<Channel>(std::move(channel));
  }

  absl::Status Listen(const std::string& address, ChannelHandler on_channel) override {
    auto host_port = SplitHostPort(address);
    if (!host_port.ok()) return host_port.status();
    boost::system::error_code ec;
    tcp::resolver resolver(io_);
    auto endpoints = resolver.resolve(host_port->first, host_port->second, ec);
    if (ec || endpoints.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("cannot resolve listen address ", address, ": ", ec.message()));
    }
    acceptor_.emplace(io_);
    tcp::endpoint endpoint = endpoints.begin()->endpoint();
    acceptor_->open(endpoint.protocol(), ec);
    if (!ec) acceptor_->set_option(tcp::acceptor::reuse_address(true), ec);
    if (!ec) acceptor_->bind(endpoint, ec);
    if (!ec) acceptor_->listen(asio::socket_base::max_listen_connections, ec);
    if (ec) {
      return absl::UnavailableError(absl::StrCat("cannot listen on ", address, ": ", ec.message()));
    }
    port_ = acceptor_->local_endpoint().port();
    on_channel_ = std::move(on_channel);
    accept_thread_ = std::thread([this] { AcceptLoop(); });
    return absl::OkStatus();
  }

  uint16_t listen_port() const override { return port_; }

  void Shutdown() override {
    if (stopping_.exchange(true)) return;
    if (acceptor_) ::shutdown(acceptor_->native_handle(), SHUT_RDWR);
    if (accept_thread_.joinable()) accept_thread_.join();
    // Wait for connection threads: they end once their handler returns.
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(+[](int* n) { return *n == 0; }, &live_handlers_));
  }

 private:
  void AcceptLoop() {
    while (!stopping_.load()) {
      boost::system::error_code ec;
      tcp::endpoint remote;
      tcp::socket socket(io_);
      acceptor_->accept(socket, remote, ec);
      if (ec) {
        if (stopping_.load()) return;
        spdlog::warn("accept on port {} failed: {}", port_, ec.message());
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        continue;
      }
      auto channel = std::make_unique<TcpTlsChannel>(std::move(socket), CurrentTrust(), registry_,
                                                     /*dialed=*/false);
      {
        absl::MutexLock lock(&mu_);
        ++live_handlers_;
      }
      std::thread([this, channel = std::move(channel), remote]() mutable {
        std::string address = absl::StrCat(remote.address().to_string(), ":", remote.port());
        absl::Status admitted = Admit(*channel, address);
        if (admitted.ok()) {
          on_channel_(std::move(channel));
        } else {
          spdlog::warn("refused connection from {}: {}", address, admitted.message());
        }
        absl::MutexLock lock(&mu_);
        --live_handlers_;
      }).detach();
    }
  }

  absl::Status Admit(TcpTlsChannel& channel, const std::string& address) {
    channel.set_congestion_control(TuneSocket(channel.stream().lowest_layer()));
    channel.set_identity("(unauthenticated)", address);
    absl::Status handshake = Handshake(channel, ssl::stream_base::server);
    if (!handshake.ok()) return handshake;
    X509* cert = SSL_get0_peer_certificate(channel.stream().native_handle());
    std::string site = MatchSite(cert, identity_.peer_sites);
    if (site.empty()) {
      return absl::PermissionDeniedError(absl::StrCat(
          "certificate ", CertificateSubject(cert), " chains to our CA but names no configured peer site (",
          absl::StrJoin(identity_.peer_sites, ", "), ")"));
    }
    channel.set_identity(site, address);
    return Adopt(channel, site);
  }

  std::shared_ptr<TrustContext> CurrentTrust() const {
    absl::MutexLock lock(&registry_->mu);
    return registry_->trust;
  }

  // Registers an authenticated channel for re-checks at each reload. A
  // reload that came during its handshake has not seen it: check it here
  // against what that reload loaded.
  absl::Status Adopt(TcpTlsChannel& channel, const std::string& site) {
    SSL* ssl = channel.stream().native_handle();
    auto cert = std::make_shared<const PeerCertificate>(site, SSL_get0_peer_certificate(ssl),
                                                        SSL_get_peer_cert_chain(ssl));
    absl::MutexLock lock(&registry_->mu);
    if (registry_->trust != channel.trust()) {
      if (absl::Status s = registry_->trust->Check(*cert); !s.ok()) return s;
    }
    channel.set_peer_certificate(std::move(cert));
    registry_->live.insert(&channel);
    return absl::OkStatus();
  }

  // Runs the TLS handshake with a deadline and explains certificate failures.
  absl::Status Handshake(TcpTlsChannel& channel, ssl::stream_base::handshake_type type) {
    auto handle = watchdog_.Arm(kHandshakeTimeout, [&channel] { channel.Abort(); });
    boost::system::error_code ec;
    channel.stream().handshake(type, ec);
    watchdog_.Disarm(handle);
    if (!ec) return absl::OkStatus();
    long verify = SSL_get_verify_result(channel.stream().native_handle());
    if (verify != X509_V_OK) {
      bool hint = type == ssl::stream_base::server && verify != X509_V_ERR_CERT_REVOKED;
      return absl::PermissionDeniedError(absl::StrCat(
          channel.trust()->DescribeFailure(channel.rejected(), verify, channel.peer_address(),
                                           identity_.peer_sites),
          hint ? " (does its certificate come from our CA?)" : ""));
    }
    if (ec == asio::error::eof || ec == ssl::error::stream_truncated ||
        ec == asio::error::connection_reset || ec == asio::error::broken_pipe ||
        ec == asio::error::operation_aborted || ec == asio::error::timed_out) {
      return absl::UnavailableError(absl::StrCat("TLS handshake interrupted: ", ec.message()));
    }
    std::string reason = ec.message();
    if (ec.category() == asio::error::get_ssl_category()) {
      reason = ERR_reason_error_string(ec.value()) ? ERR_reason_error_string(ec.value()) : reason;
    }
    if (reason.find("wrong version number") != std::string::npos ||
        reason.find("http request") != std::string::npos) {
      reason += " (not a TLS 1.3 client: plaintext and older TLS are refused)";
    }
    if (reason.find("alert") != std::string::npos) {
      reason += " (the peer rejected our certificate or TLS settings; check its log)";
    }
    return absl::PermissionDeniedError(absl::StrCat("TLS handshake failed: ", reason));
  }

  // Socket options for long fat pipes; returns the congestion control in use.
  std::string TuneSocket(ssl::stream<tcp::socket>::lowest_layer_type& socket) {
    int fd = socket.native_handle();
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    // Detect a dead peer or a cut link even while we only wait to read.
    setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
    int idle = 10, interval = 5, count = 3;
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof interval);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &count, sizeof count);
    unsigned user_timeout_ms = 30000;
    setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user_timeout_ms, sizeof user_timeout_ms);

    int buffer = static_cast<int>(std::min<uint64_t>(tuning_.socket_buffer_bytes, 1u << 30));
    // The FORCE variants pass net.core.[rw]mem_max when we have CAP_NET_ADMIN.
    if (setsockopt(fd, SOL_SOCKET, SO_SNDBUFFORCE, &buffer, sizeof buffer) != 0) {
      setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buffer, sizeof buffer);
    }
    if (setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &buffer, sizeof buffer) != 0) {
      setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buffer, sizeof buffer);
    }

    const std::string& wanted = tuning_.congestion_control;
    if (!wanted.empty() &&
        setsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, wanted.data(), wanted.size()) != 0) {
      int err = errno;
      if (!cc_fallback_logged_.exchange(true)) {
        spdlog::warn("kernel congestion control '{}' unavailable ({}); using the kernel default",
                     wanted, std::strerror(err));
      }
    }
    char name[16] = {};
    socklen_t len = sizeof name;
    if (getsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, name, &len) != 0) return "unknown";
    return std::string(name, strnlen(name, sizeof name));
  }

  const TlsIdentity identity_;  // the files of the first load; site and peers never change
  const TcpTuning tuning_;
  const std::shared_ptr<ChannelRegistry> registry_;
  asio::io_context io_;  // never run: channels use blocking calls
  Watchdog watchdog_;
  std::optional<tcp::acceptor> acceptor_;
  uint16_t port_ = 0;
  ChannelHandler on_channel_;
  std::thread accept_thread_;
  std::atomic<bool> stopping_{false};
  std::atomic<bool> cc_fallback_logged_{false};
  absl::Mutex mu_;
  int live_handlers_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Transport>> MakeTcpTlsTransport(const TlsIdentity& identity,
                                                               const TcpTuning& tuning) {
  auto transport = std::make_unique<TcpTlsTransport>(identity, tuning);
  absl::Status status = transport->Init();
  if (!status.ok()) return status;
  return std::unique_ptr<Transport>(std::move(transport));
}

}  // namespace longhaul::transport
