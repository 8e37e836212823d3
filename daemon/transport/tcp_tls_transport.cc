// The tcp transport: TLS 1.3 (AES-256-GCM only) over kernel TCP, with both
// ends authenticated by certificates from one CA that must name a configured
// site. Channels use blocking I/O on their owner's thread once they are
// authenticated. Accepted connections are handshaken asynchronously on one
// io thread, under caps on pending handshakes (in total and per source IP)
// and a deadline that covers TLS plus the peer's HELLO: a connection gets a
// thread only after it has authenticated and sent its first bytes, so
// scanners and silent or slow clients cost a socket, not a thread. The same
// thread closes accepted channels past their HELLO deadline or idle too long.
// Dialed handshakes are bounded by a watchdog.
//
// Trust material (CA, own certificate and key, CRL) lives in one immutable
// TrustContext. ReloadTrust loads a new one for the handshakes that follow;
// each channel keeps the one it was made with, and every authenticated
// channel is registered with the peer certificate it proved, so a reload can
// re-verify each open channel's peer and abort those the new material refuses.

#include <fcntl.h>
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
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <system_error>
#include <thread>
#include <utility>

#include <boost/asio.hpp>
#include <boost/asio/ssl.hpp>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/container/inlined_vector.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "common/fmt_absl.h"
#include "daemon/transport/tcp_info.h"
#include "daemon/transport/transport.h"
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

// How often the io thread looks for accepted channels past their HELLO
// deadline or idle timeout.
constexpr auto kSweepInterval = std::chrono::milliseconds(200);
// Pause before accepting again after an accept error that is not ours to fix.
constexpr auto kAcceptRetry = std::chrono::milliseconds(50);

std::chrono::steady_clock::duration ToChrono(TimeDelta d) {
  return std::chrono::nanoseconds(d.ToNanoseconds());
}

// At most kLinesPerSecond log lines a second for a flood of refusals; the
// lines it drops are counted into the next one. Thread-safe.
class LogLimiter {
 public:
  static constexpr int kLinesPerSecond = 20;

  // True if a line may be logged now; then `*dropped` is the number of lines
  // dropped since the last one.
  bool Allow(uint64_t* dropped) {
    std::lock_guard lock(mu_);
    auto now = std::chrono::steady_clock::now();
    if (now - window_start_ >= std::chrono::seconds(1)) {
      window_start_ = now;
      lines_ = 0;
    }
    if (lines_ >= kLinesPerSecond) {
      ++dropped_;
      return false;
    }
    ++lines_;
    *dropped = std::exchange(dropped_, 0);
    return true;
  }

 private:
  std::mutex mu_;
  std::chrono::steady_clock::time_point window_start_;
  int lines_ = 0;
  uint64_t dropped_ = 0;
};

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

// Operations (reads and writes) on the channels of one peer site, counted
// by the channels and read by the idle sweep. Thread-safe.
struct SiteActivity {
  std::atomic<uint64_t> operations{0};
};

// The trust material new channels take, the authenticated channels a reload
// must re-check, and what the connection caps count. Shared by the
// transport and its channels, so that a channel may outlive the transport.
// Thread-safe.
struct ChannelRegistry {
  struct Site {
    std::shared_ptr<SiteActivity> activity = std::make_shared<SiteActivity>();
    uint32_t accepted = 0;                         // authenticated accepted channels open
    uint64_t seen = 0;                             // activity->operations at the last sweep
    std::chrono::steady_clock::time_point active;  // when they last changed
  };

  absl::Mutex mu;
  std::shared_ptr<TrustContext> trust ABSL_GUARDED_BY(mu);
  absl::flat_hash_set<TcpTlsChannel*> live ABSL_GUARDED_BY(mu);
  // Accepted connections before their HELLO, in total and by source IP.
  uint32_t pending ABSL_GUARDED_BY(mu) = 0;
  absl::flat_hash_map<std::string, uint32_t> pending_per_address ABSL_GUARDED_BY(mu);
  absl::flat_hash_map<std::string, Site> sites ABSL_GUARDED_BY(mu);

  Site& SiteLocked(const std::string& name) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    auto [it, inserted] = sites.try_emplace(name);
    if (inserted) it->second.active = std::chrono::steady_clock::now();
    return it->second;
  }
};

// The TCP socket under a channel's TLS stream. Boost.Asio's TLS stream reads
// and writes its lower layer one record (at most 16 KiB of payload) at a
// time: a system call per record, and on loopback a wake-up of the other
// side per record. Here a blocking read takes what the socket holds, up to
// kReadBytes, and serves the records from that; and the records of one
// Channel::Write (between BeginBatch and EndBatch) leave kWriteBytes at a
// time, the rest when the batch ends. The buffers are made at first use, so
// a connection that only handshakes holds none. Writes outside a batch (the handshake,
// TLS's own messages during a read) go straight out. Asynchronous operations
// (the handshake and the first read of an accepted channel, on the io
// thread) go straight to the socket; they all come before the first
// blocking read, so nothing read ahead is ever skipped. Not thread-safe,
// like the TLS stream above it.
class BatchingSocket {
 public:
  using executor_type = tcp::socket::executor_type;
  using lowest_layer_type = tcp::socket::lowest_layer_type;
  static constexpr size_t kReadBytes = 64u << 10;
  static constexpr size_t kWriteBytes = 256u << 10;

  explicit BatchingSocket(tcp::socket socket) : socket_(std::move(socket)) {}

  executor_type get_executor() { return socket_.get_executor(); }
  lowest_layer_type& lowest_layer() { return socket_.lowest_layer(); }
  const lowest_layer_type& lowest_layer() const { return socket_.lowest_layer(); }

  template <typename MutableBuffers>
  size_t read_some(const MutableBuffers& buffers, boost::system::error_code& ec) {
    if (read_at_ == read_end_) {
      if (!read_buffer_) read_buffer_ = std::make_unique_for_overwrite<uint8_t[]>(kReadBytes);
      read_at_ = read_end_ = 0;
      read_end_ = socket_.read_some(asio::buffer(read_buffer_.get(), kReadBytes), ec);
      if (ec) return 0;
    }
    const size_t n = asio::buffer_copy(
        buffers, asio::buffer(read_buffer_.get() + read_at_, read_end_ - read_at_));
    read_at_ += n;
    ec = {};
    return n;
  }

  template <typename ConstBuffers>
  size_t write_some(const ConstBuffers& buffers, boost::system::error_code& ec) {
    if (!batching_) return socket_.write_some(buffers, ec);
    if (write_len_ == kWriteBytes && !Flush(ec)) return 0;
    if (!write_buffer_) write_buffer_ = std::make_unique_for_overwrite<uint8_t[]>(kWriteBytes);
    const size_t n = asio::buffer_copy(
        asio::buffer(write_buffer_.get() + write_len_, kWriteBytes - write_len_), buffers);
    write_len_ += n;
    ec = {};
    return n;
  }

  template <typename MutableBuffers, typename Handler>
  auto async_read_some(const MutableBuffers& buffers, Handler&& handler) {
    return socket_.async_read_some(buffers, std::forward<Handler>(handler));
  }
  template <typename ConstBuffers, typename Handler>
  auto async_write_some(const ConstBuffers& buffers, Handler&& handler) {
    return socket_.async_write_some(buffers, std::forward<Handler>(handler));
  }

  void BeginBatch() { batching_ = true; }
  // Sends what the batch holds; false (with `ec`) when the socket failed.
  bool EndBatch(boost::system::error_code& ec) {
    batching_ = false;
    return Flush(ec);
  }

 private:
  bool Flush(boost::system::error_code& ec) {
    const size_t len = std::exchange(write_len_, 0);
    if (len > 0) asio::write(socket_, asio::buffer(write_buffer_.get(), len), ec);
    return !ec;
  }

  tcp::socket socket_;
  std::unique_ptr<uint8_t[]> read_buffer_;
  size_t read_at_ = 0;
  size_t read_end_ = 0;
  std::unique_ptr<uint8_t[]> write_buffer_;
  size_t write_len_ = 0;
  bool batching_ = false;
};
using TlsStream = ssl::stream<BatchingSocket>;

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
      ReleasePendingLocked();
      if (!counted_site_.empty()) --registry_->SiteLocked(counted_site_).accepted;
    }
    boost::system::error_code ec;
    stream_.lowest_layer().close(ec);
  }

  TlsStream& stream() { return stream_; }
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

  // An accepted channel takes the pending-handshake slot its transport
  // counted for `ip` (in registry_->pending and pending_per_address) and
  // gives it back at EndHandshake or destruction. Before anyone else can
  // see the channel.
  void TakePendingSlot(std::string ip, std::chrono::steady_clock::time_point deadline) {
    pending_ = true;
    source_ip_ = std::move(ip);
    deadline_ = deadline;
  }
  // The three below under registry_->mu.
  bool pending() const { return pending_; }
  std::chrono::steady_clock::time_point deadline() const { return deadline_; }
  // True the first time only: a channel is closed (and counted) once,
  // whether by the sweep or by its handshake timer.
  bool MarkClosing() { return !std::exchange(closing_, true); }

  // An accepted channel counts against its site's connection cap until it
  // is destroyed. Under registry_->mu.
  void CountForSite(const std::string& site) { counted_site_ = site; }
  void set_activity(std::shared_ptr<SiteActivity> activity) { activity_ = std::move(activity); }

  // Bytes already read from the TLS stream (while the io thread waited for
  // the peer's first bytes): ReadExactly returns them first.
  asio::mutable_buffer prefix_space() { return asio::buffer(prefix_); }
  void set_prefix(size_t bytes) {
    prefix_at_ = 0;
    prefix_end_ = bytes;
  }

  void KeepWhenIdle() override {
    absl::MutexLock lock(&registry_->mu);
    keep_when_idle_ = true;
  }
  bool keep_when_idle() const { return keep_when_idle_; }  // under registry_->mu

  void EndHandshake() override {
    absl::MutexLock lock(&registry_->mu);
    if (!pending_) return;
    ReleasePendingLocked();
    if (!counted_site_.empty()) {
      registry_->SiteLocked(counted_site_).active = std::chrono::steady_clock::now();
    }
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
    Touch();
    boost::system::error_code ec;
    stream_.next_layer().BeginBatch();
    asio::write(stream_, buffers, ec);
    boost::system::error_code flushed;
    stream_.next_layer().EndBatch(flushed);
    if (!ec) ec = flushed;
    Touch();
    return ToStatus(ec, "write");
  }

  absl::Status ReadExactly(absl::Span<uint8_t> out) override {
    Touch();
    size_t buffered = std::min(out.size(), prefix_end_ - prefix_at_);
    if (buffered > 0) {
      std::memcpy(out.data(), prefix_.data() + prefix_at_, buffered);
      prefix_at_ += buffered;
      out = out.subspan(buffered);
      if (out.empty()) return absl::OkStatus();
    }
    boost::system::error_code ec;
    asio::read(stream_, asio::buffer(out.data(), out.size()), ec);
    Touch();
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
    int fd = const_cast<TlsStream&>(stream_).lowest_layer().native_handle();
    int unsent = 0;
    if (::ioctl(fd, SIOCOUTQNSD, &unsent) != 0 || unsent < 0) return 0;
    return static_cast<uint64_t>(unsent);
  }

  LinkStats Stats() const override {
    LinkStats stats;
    stats.congestion_control = congestion_control_;
    int fd = const_cast<TlsStream&>(stream_).lowest_layer().native_handle();
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
  void Touch() {
    if (activity_ != nullptr) activity_->operations.fetch_add(1, std::memory_order_relaxed);
  }

  void ReleasePendingLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(registry_->mu) {
    if (!pending_) return;
    pending_ = false;
    --registry_->pending;
    auto it = registry_->pending_per_address.find(source_ip_);
    if (it != registry_->pending_per_address.end() && --it->second == 0) {
      registry_->pending_per_address.erase(it);
    }
  }

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
  TlsStream stream_;
  std::string peer_site_;
  std::string peer_address_;
  std::string congestion_control_;
  std::shared_ptr<const PeerCertificate> peer_certificate_;
  X509Ptr rejected_;
  std::atomic<bool> aborted_{false};
  // Set before the channel is handed over; read-only after.
  std::shared_ptr<SiteActivity> activity_;
  std::array<uint8_t, 64> prefix_{};
  size_t prefix_at_ = 0;
  size_t prefix_end_ = 0;
  // Guarded by registry_->mu (a lock of another object, so not annotated).
  bool pending_ = false;
  bool closing_ = false;
  bool keep_when_idle_ = false;
  std::string source_ip_;
  std::chrono::steady_clock::time_point deadline_;
  std::string counted_site_;
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
  TcpTlsTransport(TlsIdentity identity, TcpTuning tuning, ConnectionLimits limits)
      : identity_(std::move(identity)),
        tuning_(tuning),
        limits_(limits),
        registry_(std::make_shared<ChannelRegistry>()),
        reserve_fd_(::open("/dev/null", O_RDONLY | O_CLOEXEC)) {}

  ~TcpTlsTransport() override {
    Shutdown();
    if (reserve_fd_ >= 0) ::close(reserve_fd_);
  }

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

  ConnectionCounters connection_counters() const override {
    ConnectionCounters out;
    out.refused_too_many_pending = counters_.too_many_pending.load();
    out.refused_too_many_from_address = counters_.too_many_from_address.load();
    out.refused_too_many_for_peer = counters_.too_many_for_peer.load();
    out.refused_no_thread = counters_.no_thread.load();
    out.refused_no_fd = counters_.no_fd.load();
    out.handshakes_failed = counters_.failed.load();
    out.handshakes_timed_out = counters_.timed_out.load();
    out.idle_closed = counters_.idle_closed.load();
    absl::MutexLock lock(&registry_->mu);
    out.pending_handshakes = registry_->pending;
    return out;
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
    if (absl::Status s = Adopt(*channel, site, /*accepted=*/false); !s.ok()) {
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
    AcceptNext();
    Sweep();
    io_thread_ = std::thread([this] { io_.run(); });
    return absl::OkStatus();
  }

  uint16_t listen_port() const override { return port_; }

  void Shutdown() override {
    if (stopping_.exchange(true)) return;
    io_.stop();
    if (io_thread_.joinable()) io_thread_.join();
    // The io thread is gone: nothing else touches the acceptor now. Pending
    // handshakes end with io_ (their handlers own them).
    if (acceptor_) {
      ::shutdown(acceptor_->native_handle(), SHUT_RDWR);
      boost::system::error_code ignored;
      acceptor_->close(ignored);
    }
    // Wait for connection threads: they end once their handler returns.
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(+[](int* n) { return *n == 0; }, &live_handlers_));
  }

 private:
  // An accepted connection in its handshake, owned by the io thread's
  // pending handlers.
  struct PendingConnection {
    PendingConnection(std::unique_ptr<TcpTlsChannel> c, asio::io_context& io)
        : channel(std::move(c)), timer(io) {}
    std::unique_ptr<TcpTlsChannel> channel;
    asio::steady_timer timer;  // the handshake deadline
    bool timed_out = false;
    bool done = false;  // handed over or refused; the timer must not touch it
  };

  // Everything below runs on the io thread.

  void AcceptNext() {
    acceptor_->async_accept([this](const boost::system::error_code& ec, tcp::socket socket) {
      OnAccept(ec, std::move(socket));
    });
  }

  void AcceptLater() {
    retry_timer_.expires_after(kAcceptRetry);
    retry_timer_.async_wait([this](const boost::system::error_code& ec) {
      if (!ec && !stopping_.load()) AcceptNext();
    });
  }

  void OnAccept(const boost::system::error_code& ec, tcp::socket socket) {
    if (stopping_.load() || ec == asio::error::operation_aborted) return;
    if (ec) {
      if (ec.value() == EMFILE || ec.value() == ENFILE || ec.value() == ENOBUFS ||
          ec.value() == ENOMEM) {
        RefuseForLackOfDescriptors(ec);
      } else {
        LogRefusal(absl::StrCat("port ", port_), absl::StrCat("accept failed: ", ec.message()));
        AcceptLater();
      }
      return;
    }
    boost::system::error_code ignored;
    tcp::endpoint remote = socket.remote_endpoint(ignored);
    if (ignored) {  // reset before we got to it
      AcceptNext();
      return;
    }
    std::string ip = remote.address().to_string();
    std::string address = absl::StrCat(ip, ":", remote.port());
    std::string refused;
    {
      absl::MutexLock lock(&registry_->mu);
      uint32_t& from_address = registry_->pending_per_address[ip];
      if (registry_->pending >= limits_.max_pending_handshakes) {
        counters_.too_many_pending.fetch_add(1);
        refused = absl::StrCat(registry_->pending,
                               " handshakes pending (peer_limits.max_pending_handshakes)");
      } else if (from_address >= limits_.max_pending_handshakes_per_address) {
        counters_.too_many_from_address.fetch_add(1);
        refused = absl::StrCat(from_address, " handshakes pending from ", ip,
                               " (peer_limits.max_pending_handshakes_per_address)");
      } else {
        ++registry_->pending;
        ++from_address;
      }
      if (from_address == 0) registry_->pending_per_address.erase(ip);
    }
    if (!refused.empty()) {
      socket.close(ignored);
      LogRefusal(address, refused);
      AcceptNext();
      return;
    }
    auto channel = std::make_unique<TcpTlsChannel>(std::move(socket), CurrentTrust(), registry_,
                                                   /*dialed=*/false);
    channel->TakePendingSlot(
        ip, std::chrono::steady_clock::now() + ToChrono(limits_.handshake_timeout));
    channel->set_congestion_control(TuneSocket(channel->stream().lowest_layer()));
    channel->set_identity("(unauthenticated)", address);
    auto pending = std::make_shared<PendingConnection>(std::move(channel), io_);
    pending->timer.expires_after(ToChrono(limits_.handshake_timeout));
    pending->timer.async_wait([pending](const boost::system::error_code& ec) {
      if (ec || pending->done) return;
      pending->timed_out = true;
      boost::system::error_code ignored;
      pending->channel->stream().lowest_layer().cancel(ignored);
      pending->channel->Abort();
    });
    pending->channel->stream().async_handshake(
        ssl::stream_base::server,
        [this, pending](const boost::system::error_code& ec) { OnHandshake(pending, ec); });
    AcceptNext();
  }

  void OnHandshake(const std::shared_ptr<PendingConnection>& pending,
                   const boost::system::error_code& ec) {
    TcpTlsChannel& channel = *pending->channel;
    absl::Status admitted =
        ec ? HandshakeError(channel, ec, ssl::stream_base::server) : Authenticate(channel);
    if (!admitted.ok()) {
      Refuse(*pending, admitted);
      return;
    }
    // The peer's first bytes (its HELLO) come before it gets a thread.
    channel.stream().async_read_some(
        channel.prefix_space(), [this, pending](const boost::system::error_code& ec, size_t bytes) {
          OnFirstBytes(pending, ec, bytes);
        });
  }

  void OnFirstBytes(const std::shared_ptr<PendingConnection>& pending,
                    const boost::system::error_code& ec, size_t bytes) {
    if (ec || bytes == 0) {
      if (pending->timed_out) {
        Refuse(*pending, absl::DeadlineExceededError("no HELLO"));
        return;
      }
      // Closed before a word, so nothing was lost: usually a sender's spare
      // data channel (see PeerRouter::Serve).
      spdlog::debug("connection from {} ({}) ended before its hello: {}",
                    pending->channel->peer_site(), pending->channel->peer_address(),
                    ec ? ec.message() : "no data");
      pending->done = true;
      pending->timer.cancel();
      return;
    }
    pending->done = true;
    pending->timer.cancel();
    pending->channel->set_prefix(bytes);
    HandOver(std::move(pending->channel));
  }

  // Gives an authenticated channel the thread that serves it.
  void HandOver(std::unique_ptr<TcpTlsChannel> channel) {
    const std::string address = channel->peer_address();
    {
      absl::MutexLock lock(&mu_);
      ++live_handlers_;
    }
    try {
      std::thread([this, channel = std::move(channel)]() mutable {
        on_channel_(std::move(channel));
        absl::MutexLock lock(&mu_);
        --live_handlers_;
      }).detach();
    } catch (const std::system_error& e) {
      {
        absl::MutexLock lock(&mu_);
        --live_handlers_;
      }
      counters_.no_thread.fetch_add(1);
      LogRefusal(address, absl::StrCat("cannot start a thread for it: ", e.what(),
                                       " (raise the task limit, e.g. systemd TasksMax)"));
    }
  }

  // Ends a pending connection that did not make it, counted by why.
  void Refuse(PendingConnection& pending, const absl::Status& why) {
    pending.done = true;
    pending.timer.cancel();
    std::string message(why.message());
    if (pending.timed_out) {
      bool first;  // the sweep may have closed it at the same deadline
      {
        absl::MutexLock lock(&registry_->mu);
        first = pending.channel->MarkClosing();
      }
      if (!first) return;
      counters_.timed_out.fetch_add(1);
      message = absl::StrCat("no TLS handshake and HELLO within ",
                             limits_.handshake_timeout.ToMilliseconds() / 1000.0,
                             "s (peer_limits.handshake_timeout)");
    } else if (!absl::IsResourceExhausted(why)) {
      counters_.failed.fetch_add(1);
      LogRefusal(handshake_log_, pending.channel->peer_address(), message);
      return;
    }
    LogRefusal(pending.channel->peer_address(), message);
  }

  // Out of file descriptors, the pending connection cannot be accepted, and
  // would stay at the head of the queue: give up the spare descriptor,
  // accept it, close it, and take the spare again.
  void RefuseForLackOfDescriptors(const boost::system::error_code& ec) {
    counters_.no_fd.fetch_add(1);
    bool refused_one = false;
    if (reserve_fd_ >= 0) {
      ::close(reserve_fd_);
      int fd = ::accept4(acceptor_->native_handle(), nullptr, nullptr, SOCK_CLOEXEC);
      if (fd >= 0) {
        ::close(fd);
        refused_one = true;
      }
      reserve_fd_ = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    }
    LogRefusal(absl::StrCat("port ", port_),
               absl::StrCat("cannot accept: ", ec.message(),
                            " (raise the open-file limit, e.g. systemd LimitNOFILE)"));
    if (refused_one) {
      AcceptNext();
    } else {
      AcceptLater();
    }
  }

  // `log` separates floods of one kind (caps, deadlines) from refused
  // certificates, so that one cannot hide the other.
  void LogRefusal(const std::string& address, const std::string& why) {
    LogRefusal(refusal_log_, address, why);
  }
  void LogRefusal(LogLimiter& log, const std::string& address, const std::string& why) {
    uint64_t dropped = 0;
    if (!log.Allow(&dropped)) return;
    spdlog::warn("refused connection from {}: {}{}", address, why,
                 dropped > 0 ? absl::StrCat(" (", dropped, " more refusals not logged)") : "");
  }

  // Closes accepted channels past their HELLO deadline, and those whose
  // site has been idle for limits_.idle_timeout; then runs again.
  uint64_t AddActivitySource(ActivitySource source) override {
    absl::MutexLock lock(&sources_mu_);
    const uint64_t id = next_source_id_++;
    activity_sources_.emplace(id, std::move(source));
    return id;
  }
  void RemoveActivitySource(uint64_t id) override {
    absl::MutexLock lock(&sources_mu_);
    activity_sources_.erase(id);
  }

  void Sweep() {
    const auto now = std::chrono::steady_clock::now();
    // Before registry_->mu: a source takes its own transport's lock.
    std::vector<std::string> active_elsewhere;
    {
      absl::MutexLock lock(&sources_mu_);
      for (const auto& [id, source] : activity_sources_) {
        std::vector<std::string> sites = source();
        active_elsewhere.insert(active_elsewhere.end(), sites.begin(), sites.end());
      }
    }
    {
      absl::MutexLock lock(&registry_->mu);
      for (const std::string& site : active_elsewhere) registry_->SiteLocked(site).active = now;
      for (auto& [name, site] : registry_->sites) {
        uint64_t operations = site.activity->operations.load(std::memory_order_relaxed);
        if (operations != site.seen) {
          site.seen = operations;
          site.active = now;
        }
      }
      const bool idle_applies = limits_.idle_timeout > TimeDelta::Zero();
      for (TcpTlsChannel* channel : registry_->live) {
        if (channel->dialed()) continue;
        if (channel->pending()) {
          if (now < channel->deadline() || !channel->MarkClosing()) continue;
          counters_.timed_out.fetch_add(1);
          LogRefusal(channel->peer_address(),
                     absl::StrCat(channel->peer_site(), " sent no complete HELLO within ",
                                  limits_.handshake_timeout.ToMilliseconds() / 1000.0,
                                  "s (peer_limits.handshake_timeout)"));
          channel->Abort();
          continue;
        }
        if (!idle_applies || channel->keep_when_idle()) continue;
        auto site = registry_->sites.find(channel->peer_site());
        if (site == registry_->sites.end() ||
            now - site->second.active < ToChrono(limits_.idle_timeout) || !channel->MarkClosing()) {
          continue;
        }
        counters_.idle_closed.fetch_add(1);
        spdlog::info(
            "closing idle connection from {} ({}): nothing from or to {} for {}s "
            "(peer_limits.idle_timeout)",
            channel->peer_site(), channel->peer_address(), channel->peer_site(),
            limits_.idle_timeout.ToMilliseconds() / 1000);
        channel->Abort();
      }
    }
    sweep_timer_.expires_after(kSweepInterval);
    sweep_timer_.async_wait([this](const boost::system::error_code& ec) {
      if (!ec && !stopping_.load()) Sweep();
    });
  }

  // The site an accepted channel's verified certificate names, registered.
  absl::Status Authenticate(TcpTlsChannel& channel) {
    X509* cert = SSL_get0_peer_certificate(channel.stream().native_handle());
    std::string site = MatchSite(cert, identity_.peer_sites);
    if (site.empty()) {
      return absl::PermissionDeniedError(absl::StrCat(
          "certificate ", CertificateSubject(cert), " chains to our CA but names no configured peer site (",
          absl::StrJoin(identity_.peer_sites, ", "), ")"));
    }
    channel.set_identity(site, channel.peer_address());
    return Adopt(channel, site, /*accepted=*/true);
  }

  std::shared_ptr<TrustContext> CurrentTrust() const {
    absl::MutexLock lock(&registry_->mu);
    return registry_->trust;
  }

  // Registers an authenticated channel for re-checks at each reload. A
  // reload that came during its handshake has not seen it: check it here
  // against what that reload loaded. An `accepted` channel counts against
  // its site's limits_.max_connections_per_peer (ResourceExhausted past it).
  absl::Status Adopt(TcpTlsChannel& channel, const std::string& site, bool accepted) {
    SSL* ssl = channel.stream().native_handle();
    auto cert = std::make_shared<const PeerCertificate>(site, SSL_get0_peer_certificate(ssl),
                                                        SSL_get_peer_cert_chain(ssl));
    absl::MutexLock lock(&registry_->mu);
    if (registry_->trust != channel.trust()) {
      if (absl::Status s = registry_->trust->Check(*cert); !s.ok()) return s;
    }
    ChannelRegistry::Site& entry = registry_->SiteLocked(site);
    if (accepted) {
      if (entry.accepted >= limits_.max_connections_per_peer) {
        counters_.too_many_for_peer.fetch_add(1);
        return absl::ResourceExhaustedError(
            absl::StrCat(site, " already has ", entry.accepted,
                         " connections open (peer_limits.max_connections_per_peer)"));
      }
      ++entry.accepted;
      channel.CountForSite(site);
    }
    channel.set_activity(entry.activity);
    channel.set_peer_certificate(std::move(cert));
    registry_->live.insert(&channel);
    return absl::OkStatus();
  }

  // Runs the TLS handshake with a deadline and explains certificate failures.
  absl::Status Handshake(TcpTlsChannel& channel, ssl::stream_base::handshake_type type) {
    auto handle =
        watchdog_.Arm(ToChrono(limits_.handshake_timeout), [&channel] { channel.Abort(); });
    boost::system::error_code ec;
    channel.stream().handshake(type, ec);
    watchdog_.Disarm(handle);
    if (!ec) return absl::OkStatus();
    return HandshakeError(channel, ec, type);
  }

  // Why a TLS handshake failed, for the log and the error.
  absl::Status HandshakeError(TcpTlsChannel& channel, const boost::system::error_code& ec,
                              ssl::stream_base::handshake_type type) {
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
  std::string TuneSocket(TlsStream::lowest_layer_type& socket) {
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

  struct Counters {
    std::atomic<uint64_t> too_many_pending{0};
    std::atomic<uint64_t> too_many_from_address{0};
    std::atomic<uint64_t> too_many_for_peer{0};
    std::atomic<uint64_t> no_thread{0};
    std::atomic<uint64_t> no_fd{0};
    std::atomic<uint64_t> failed{0};
    std::atomic<uint64_t> timed_out{0};
    std::atomic<uint64_t> idle_closed{0};
  };

  const TlsIdentity identity_;  // the files of the first load; site and peers never change
  const TcpTuning tuning_;
  const ConnectionLimits limits_;
  const std::shared_ptr<ChannelRegistry> registry_;
  Counters counters_;
  LogLimiter refusal_log_;
  LogLimiter handshake_log_;
  int reserve_fd_;  // given up to refuse a connection when out of descriptors
  ChannelHandler on_channel_;
  // Run by io_thread_ once listening: accepts, handshakes and sweeps. Dial
  // and channels use blocking calls on sockets of it.
  asio::io_context io_;
  asio::steady_timer sweep_timer_{io_};
  asio::steady_timer retry_timer_{io_};
  Watchdog watchdog_;
  std::optional<tcp::acceptor> acceptor_;
  uint16_t port_ = 0;
  std::thread io_thread_;
  std::atomic<bool> stopping_{false};
  std::atomic<bool> cc_fallback_logged_{false};
  absl::Mutex sources_mu_;
  uint64_t next_source_id_ ABSL_GUARDED_BY(sources_mu_) = 1;
  absl::flat_hash_map<uint64_t, ActivitySource> activity_sources_ ABSL_GUARDED_BY(sources_mu_);
  absl::Mutex mu_;
  int live_handlers_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Transport>> MakeTcpTlsTransport(const TlsIdentity& identity,
                                                               const TcpTuning& tuning,
                                                               const ConnectionLimits& limits) {
  auto transport = std::make_unique<TcpTlsTransport>(identity, tuning, limits);
  absl::Status status = transport->Init();
  if (!status.ok()) return status;
  return std::unique_ptr<Transport>(std::move(transport));
}

}  // namespace longhaul::transport
