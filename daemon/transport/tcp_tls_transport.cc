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
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <system_error>
#include <thread>
#include <utility>

// After <utility>: Debian's Boost.Asio uses std::exchange without including it.
#include <boost/asio.hpp>
#include <boost/asio/ssl.hpp>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "common/fmt_absl.h"
#include "common/host_port.h"
#include "daemon/transport/tcp_info.h"
#include "daemon/transport/tcp_tls_channel.h"
#include "daemon/transport/tls_trust.h"
#include "daemon/transport/transport.h"
#include "spdlog/spdlog.h"

namespace longhaul::transport {
namespace {

// How often the io thread looks for accepted channels past their HELLO
// deadline or idle timeout. An asio timer, so real time: the sweep judges
// deadlines and idleness on the injected clock, and a test that moves that
// clock sees the result within one interval.
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

  explicit LogLimiter(const Clock& clock) : clock_(clock), window_start_(clock.Now()) {}

  // True if a line may be logged now; then `*dropped` is the number of lines
  // dropped since the last one.
  bool Allow(uint64_t* dropped) {
    std::lock_guard lock(mu_);
    const Timestamp now = clock_.Now();
    if (now - window_start_ >= TimeDelta::Seconds(1)) {
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
  const Clock& clock_;
  std::mutex mu_;
  Timestamp window_start_;
  int lines_ = 0;
  uint64_t dropped_ = 0;
};

// Runs callbacks at deadlines on one thread; used to abort handshakes that
// take too long. Deadlines are on `clock`; the thread sleeps on the real
// clock (a condition variable can wait for nothing else) for the time
// left, at most kMaxSleep while a deadline is armed, so a test clock moved
// forward is noticed within that. Thread-safe.
//
// Contract: a callback runs at most once, under the lock, and removes its
// own entry; Disarm of an entry that has run (or never existed) does
// nothing. When Disarm returns, the callback is not running and never will,
// so it may capture what its arming caller owns.
class Watchdog {
 public:
  static constexpr TimeDelta kMaxSleep = TimeDelta::Milliseconds(100);

  explicit Watchdog(const Clock& clock) : clock_(clock), thread_([this] { Run(); }) {}
  ~Watchdog() {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

  using Handle = uint64_t;

  Handle Arm(TimeDelta after, std::function<void()> fn) {
    std::lock_guard lock(mu_);
    const Handle handle = next_handle_++;
    entries_.emplace(handle, Entry{clock_.Now() + after, std::move(fn)});
    cv_.notify_all();
    return handle;
  }
  void Disarm(Handle handle) {
    std::lock_guard lock(mu_);
    entries_.erase(handle);
  }

 private:
  struct Entry {
    Timestamp deadline;
    std::function<void()> fn;
  };

  void Run() {
    std::unique_lock lock(mu_);
    while (!stop_) {
      const Timestamp now = clock_.Now();
      Timestamp next = now + kMaxSleep;
      if (entries_.empty()) {
        cv_.wait(lock);  // Arm and the destructor notify
        continue;
      }
      for (auto it = entries_.begin(); it != entries_.end();) {
        if (it->second.deadline <= now) {
          it->second.fn();
          it = entries_.erase(it);
        } else {
          next = std::min(next, it->second.deadline);
          ++it;
        }
      }
      cv_.wait_for(lock, ToChrono(next - now));
    }
  }

  const Clock& clock_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  Handle next_handle_ = 0;
  std::map<Handle, Entry> entries_;
  std::thread thread_;
};

class TcpTlsTransport final : public Transport {
 public:
  TcpTlsTransport(TlsIdentity identity, TcpTuning tuning, ConnectionLimits limits)
      : identity_(std::move(identity)),
        tuning_(tuning),
        limits_(limits),
        clock_(limits.clock != nullptr ? *limits.clock : RealClock::Get()),
        registry_(std::make_shared<TcpTlsRegistry>(clock_)),
        refusal_log_(clock_),
        handshake_log_(clock_),
        reserve_fd_(::open("/dev/null", O_RDONLY | O_CLOEXEC)),
        watchdog_(clock_) {}

  ~TcpTlsTransport() override {
    Shutdown();
    if (reserve_fd_ >= 0) ::close(reserve_fd_);
  }

  absl::Status Init() {
    auto trust = TrustContext::Load(identity_, VerifyCallback);
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
    auto trust = TrustContext::Load(identity, VerifyCallback);
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
    auto host_port = ParseHostPort(address);
    if (!host_port.ok()) return host_port.status();
    boost::system::error_code ec;
    tcp::resolver resolver(io_);
    auto endpoints = resolver.resolve(host_port->host, std::to_string(host_port->port), ec);
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
    auto host_port = ParseHostPort(address);
    if (!host_port.ok()) return host_port.status();
    boost::system::error_code ec;
    tcp::resolver resolver(io_);
    auto endpoints = resolver.resolve(host_port->host, std::to_string(host_port->port), ec);
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
    std::string address = remote.address().is_v6() ? absl::StrCat("[", ip, "]:", remote.port())
                                                   : absl::StrCat(ip, ":", remote.port());
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
    channel->TakePendingSlot(ip, clock_.Now() + limits_.handshake_timeout);
    channel->set_congestion_control(TuneSocket(channel->stream().lowest_layer()));
    channel->set_identity("(unauthenticated)", address);
    auto pending = std::make_shared<PendingConnection>(std::move(channel), io_);
    // Real time (an asio timer), so that a stalled TLS handshake is cancelled even though
    // the sweep cannot interrupt it; the sweep enforces the same deadline on the injected clock.
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
    const Timestamp now = clock_.Now();
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
        if (site == registry_->sites.end() || now - site->second.active < limits_.idle_timeout ||
            !channel->MarkClosing()) {
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
    TcpTlsRegistry::Site& entry = registry_->SiteLocked(site);
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
    auto handle = watchdog_.Arm(limits_.handshake_timeout, [&channel] { channel.Abort(); });
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
  const Clock& clock_;
  const std::shared_ptr<TcpTlsRegistry> registry_;
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
