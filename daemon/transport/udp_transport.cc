#include "daemon/transport/udp_transport.h"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/udp.h>
#include <openssl/rand.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <map>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/errno_status.h"
#include "common/fmt_absl.h"
#include "common/host_port.h"
#include "congestion/aggregate_controller.h"
#include "congestion/bbr3.h"
#include "congestion/random.h"
#include "daemon/transport/udp_connection.h"
#include "daemon/wire/messaging.h"
#include "longhaul/v1/peer.pb.h"
#include "spdlog/spdlog.h"

#ifndef UDP_GRO
#define UDP_GRO 104
#endif

namespace longhaul::transport {
namespace {

using udp::UdpConnection;
using udp::UdpConnectionParams;

// The largest UdpHandshake either side reads: a few numbers and, from a
// listener that refuses, a sentence.
constexpr uint32_t kMaxHandshakeMessage = 16u << 10;

absl::StatusOr<sockaddr_storage> Resolve(const std::string& host, uint16_t port, socklen_t* len) {
  addrinfo hints = {};
  hints.ai_socktype = SOCK_DGRAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* result = nullptr;
  const std::string service = std::to_string(port);
  if (int rc = getaddrinfo(host.c_str(), service.c_str(), &hints, &result); rc != 0) {
    return absl::UnavailableError(absl::StrCat("cannot resolve ", host, ": ", gai_strerror(rc)));
  }
  sockaddr_storage out = {};
  std::memcpy(&out, result->ai_addr, result->ai_addrlen);
  *len = result->ai_addrlen;
  freeaddrinfo(result);
  return out;
}

uint64_t RandomId() {
  uint64_t id = 0;
  while (id == 0) RAND_bytes(reinterpret_cast<unsigned char*>(&id), sizeof id);
  return id;
}

// A UDP socket for one flow: large buffers, GRO, no fragmentation.
absl::StatusOr<int> MakeSocket(int family, const UdpOptions& options) {
  int fd = ::socket(family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return ErrnoError("cannot create a UDP socket");
  int buffer = static_cast<int>(std::min<uint64_t>(options.socket_buffer_bytes, 1u << 30));
  if (setsockopt(fd, SOL_SOCKET, SO_SNDBUFFORCE, &buffer, sizeof buffer) != 0) {
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buffer, sizeof buffer);
  }
  if (setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &buffer, sizeof buffer) != 0) {
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buffer, sizeof buffer);
  }
  int one = 1;
  setsockopt(fd, SOL_UDP, UDP_GRO, &one, sizeof one);
  int pmtu = IP_PMTUDISC_DO;
  if (family == AF_INET) {
    setsockopt(fd, IPPROTO_IP, IP_MTU_DISCOVER, &pmtu, sizeof pmtu);
  } else {
    setsockopt(fd, IPPROTO_IPV6, IPV6_MTU_DISCOVER, &pmtu, sizeof pmtu);
  }
  return fd;
}

// The largest datagram the connected socket's route carries without fragments.
size_t PathDatagram(int fd, int family, size_t cap) {
  int mtu = 0;
  socklen_t len = sizeof mtu;
  const int level = family == AF_INET ? IPPROTO_IP : IPPROTO_IPV6;
  const int opt = family == AF_INET ? IP_MTU : IPV6_MTU;
  if (getsockopt(fd, level, opt, &mtu, &len) != 0 || mtu <= 0) return std::min<size_t>(cap, 1200);
  const size_t overhead = family == AF_INET ? 28 : 48;
  return std::clamp<size_t>(static_cast<size_t>(mtu) - overhead, 1200, cap);
}

uint16_t LocalPort(int fd) {
  sockaddr_storage addr = {};
  socklen_t len = sizeof addr;
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  return addr.ss_family == AF_INET ? ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port)
                                   : ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port);
}

void SetPort(sockaddr_storage* addr, uint16_t port) {
  if (addr->ss_family == AF_INET) {
    reinterpret_cast<sockaddr_in*>(addr)->sin_port = htons(port);
  } else {
    reinterpret_cast<sockaddr_in6*>(addr)->sin6_port = htons(port);
  }
}

// A Bbr3 that owns the Random it borrows, so each uncoupled flow has its own.
class OwnedBbr3 final : public congestion::Controller {
 public:
  OwnedBbr3(const congestion::Bbr3Params& params, uint64_t seed, Timestamp now)
      : random_(seed), bbr_(params, random_, now) {}
  void OnPacketSent(Timestamp now, uint64_t pn, ByteCount bytes, ByteCount in_flight,
                    bool retransmittable) override {
    bbr_.OnPacketSent(now, pn, bytes, in_flight, retransmittable);
  }
  void OnCongestionEvent(Timestamp now, ByteCount prior_in_flight,
                         absl::Span<const congestion::AckedPacket> acked,
                         absl::Span<const congestion::LostPacket> lost) override {
    bbr_.OnCongestionEvent(now, prior_in_flight, acked, lost);
  }
  void OnAppLimited() override { bbr_.OnAppLimited(); }
  ByteCount cwnd() const override { return bbr_.cwnd(); }
  Bandwidth pacing_rate() const override { return bbr_.pacing_rate(); }
  ByteCount send_quantum() const override { return bbr_.send_quantum(); }
  congestion::ControllerState DebugState() const override { return bbr_.DebugState(); }

 private:
  congestion::SplitMix64Random random_;
  congestion::Bbr3 bbr_;
};

class UdpTransportImpl final : public UdpTransport {
 public:
  UdpTransportImpl(Transport& tls, const UdpOptions& options)
      : tls_(tls),
        options_(options),
        clock_(options.clock != nullptr ? *options.clock : RealClock::Get()) {
    uint64_t seed;
    RAND_bytes(reinterpret_cast<unsigned char*>(&seed), sizeof seed);
    random_ = std::make_unique<congestion::SplitMix64Random>(seed);
    activity_source_ = tls_.AddActivitySource([this] {
      std::vector<std::string> sites;
      absl::MutexLock lock(&mu_);
      for (const auto& [connection, flow] : live_) sites.push_back(flow.site);
      return sites;
    });
  }
  ~UdpTransportImpl() override {
    tls_.RemoveActivitySource(activity_source_);
    Shutdown();
    if (reserve_fd_ >= 0) ::close(reserve_fd_);
  }

  absl::StatusOr<std::unique_ptr<Channel>> Dial(const std::string& site,
                                                const std::string& address) override {
    if (stopping_.load()) return absl::CancelledError("udp transport is shutting down");
    auto host_port = ParseHostPort(address);
    if (!host_port.ok()) return host_port.status();
    auto tls = tls_.Dial(site, address);
    if (!tls.ok()) return tls.status();
    std::shared_ptr<const PeerCertificate> certificate = (*tls)->peer_certificate();
    v1::Hello hello;
    hello.set_role(v1::Hello::UDP_HANDSHAKE);
    hello.set_protocol_version(wire::kProtocolVersion);
    if (absl::Status s = wire::SendProto(**tls, wire::FrameType::kHello, 0, hello); !s.ok()) {
      return s;
    }

    socklen_t peer_len = 0;
    auto peer_addr = Resolve(host_port->host, host_port->port, &peer_len);
    if (!peer_addr.ok()) return peer_addr.status();
    auto fd = MakeSocket(peer_addr->ss_family, options_);
    if (!fd.ok()) return fd.status();
    UniqueFd owned(*fd);
    sockaddr_storage any = {};
    any.ss_family = peer_addr->ss_family;
    if (::bind(*fd, reinterpret_cast<sockaddr*>(&any),
               any.ss_family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6)) != 0) {
      return ErrnoError("cannot bind a UDP socket");
    }

    v1::UdpHandshake mine;
    mine.set_connection_id(RandomId());
    mine.set_udp_port(LocalPort(*fd));
    mine.set_receive_window(options_.window_bytes);
    mine.set_max_datagram(static_cast<uint32_t>(options_.max_datagram));
    if (absl::Status s = wire::SendProto(**tls, wire::FrameType::kControl, 0, mine); !s.ok()) {
      return s;
    }
    v1::UdpHandshake theirs;
    if (absl::Status s =
            wire::ReadProto(**tls, wire::FrameType::kControl, 0, kMaxHandshakeMessage, &theirs);
        !s.ok()) {
      return absl::Status(s.code(), absl::StrCat("udp handshake with ", site, " at ", address,
                                                 " failed: ", s.message()));
    }
    if (!theirs.error().empty()) {
      return absl::UnavailableError(
          absl::StrCat(site, " at ", address, " refused a udp flow: ", theirs.error()));
    }
    if (theirs.udp_port() == 0 || theirs.udp_port() > 65535 || theirs.connection_id() == 0 ||
        theirs.max_datagram() < 1200 || theirs.receive_window() < 65536) {
      return absl::InvalidArgumentError(
          absl::StrCat(site, " at ", address, " sent an invalid udp handshake"));
    }
    auto keys = ExportKeys(**tls);
    if (!keys.ok()) return keys.status();
    SetPort(&*peer_addr, static_cast<uint16_t>(theirs.udp_port()));
    if (::connect(*fd, reinterpret_cast<sockaddr*>(&*peer_addr), peer_len) != 0) {
      return ErrnoError(absl::StrCat("cannot connect a UDP socket to ", site, " at ", address));
    }
    UdpConnectionParams params;
    params.local_connection_id = mine.connection_id();
    params.peer_connection_id = theirs.connection_id();
    params.send_keys = keys->dialer_to_listener;
    params.receive_keys = keys->listener_to_dialer;
    params.max_datagram = std::min<size_t>(
        PathDatagram(*fd, peer_addr->ss_family, options_.max_datagram), theirs.max_datagram());
    params.peer_window_bytes = theirs.receive_window();
    params.peer_site = site;
    params.peer_address = absl::StrCat(host_port->host, ":", theirs.udp_port(), "/udp");
    AddController(site, params.max_datagram, &params, /*dialed=*/true);
    params.fd = owned.release();
    return std::unique_ptr<Channel>(
        Register(std::move(params), std::move(certificate), /*dialed=*/true));
  }

  void AcceptHandshake(std::unique_ptr<Channel> tls) override {
    const std::string site = tls->peer_site();
    v1::UdpHandshake theirs;
    if (absl::Status s =
            wire::ReadProto(*tls, wire::FrameType::kControl, 0, kMaxHandshakeMessage, &theirs);
        !s.ok()) {
      spdlog::warn("udp handshake from {} ({}) failed: {}", site, tls->peer_address(), s.message());
      return;
    }
    auto refuse = [&](const std::string& why) {
      spdlog::warn("refused a udp flow from {} ({}): {}", site, tls->peer_address(), why);
      v1::UdpHandshake answer;
      answer.set_error(why);
      (void)wire::SendProto(*tls, wire::FrameType::kControl, 0, answer);
    };
    if (theirs.udp_port() == 0 || theirs.udp_port() > 65535 || theirs.connection_id() == 0 ||
        theirs.max_datagram() < 1200 || theirs.receive_window() < 65536) {
      refuse("invalid udp handshake");
      return;
    }
    ChannelHandler handler;
    {
      absl::MutexLock lock(&mu_);
      handler = on_channel_;
    }
    if (!handler || stopping_.load()) {
      refuse("this daemon does not serve the udp transport");
      return;
    }
    auto client_host = ParseHostPort(tls->peer_address());
    socklen_t peer_len = 0;
    absl::StatusOr<sockaddr_storage> peer_addr =
        client_host.ok()
            ? Resolve(client_host->host, static_cast<uint16_t>(theirs.udp_port()), &peer_len)
            : absl::StatusOr<sockaddr_storage>(client_host.status());
    if (!peer_addr.ok()) {
      refuse(std::string(peer_addr.status().message()));
      return;
    }
    auto fd = MakeSocket(peer_addr->ss_family, options_);
    if (!fd.ok()) {
      refuse(std::string(fd.status().message()));
      return;
    }
    UniqueFd owned(*fd);
    int one = 1;
    setsockopt(*fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof one);
    socklen_t local_len = 0;
    auto local = Resolve(listen_host_, port_, &local_len);
    if (!local.ok() || local->ss_family != peer_addr->ss_family) {
      refuse("address family mismatch between the udp listener and the peer");
      return;
    }
    if (::bind(*fd, reinterpret_cast<sockaddr*>(&*local), local_len) != 0 ||
        ::connect(*fd, reinterpret_cast<sockaddr*>(&*peer_addr), peer_len) != 0) {
      refuse(absl::StrCat("cannot open udp port ", port_, ": ", std::strerror(errno)));
      return;
    }
    v1::UdpHandshake mine;
    mine.set_connection_id(RandomId());
    mine.set_udp_port(port_);
    mine.set_receive_window(options_.window_bytes);
    mine.set_max_datagram(static_cast<uint32_t>(options_.max_datagram));
    auto keys = ExportKeys(*tls);
    if (!keys.ok()) {
      refuse(std::string(keys.status().message()));
      return;
    }
    if (absl::Status s = wire::SendProto(*tls, wire::FrameType::kControl, 0, mine); !s.ok()) {
      spdlog::warn("udp handshake from {} failed: {}", site, s.message());
      return;
    }
    UdpConnectionParams params;
    params.local_connection_id = mine.connection_id();
    params.peer_connection_id = theirs.connection_id();
    params.send_keys = keys->listener_to_dialer;
    params.receive_keys = keys->dialer_to_listener;
    params.max_datagram = std::min<size_t>(
        PathDatagram(*fd, peer_addr->ss_family, options_.max_datagram), theirs.max_datagram());
    params.peer_window_bytes = theirs.receive_window();
    params.peer_site = site;
    params.peer_address = absl::StrCat(client_host->host, ":", theirs.udp_port(), "/udp");
    AddController(site, params.max_datagram, &params, /*dialed=*/false);
    params.fd = owned.release();
    std::shared_ptr<const PeerCertificate> certificate = tls->peer_certificate();
    tls.reset();  // the keys are exported; the TLS channel has done its job
    handler(Register(std::move(params), std::move(certificate), /*dialed=*/false));
  }

  absl::Status Listen(const std::string& address, ChannelHandler on_channel) override {
    auto host_port = ParseHostPort(address);
    if (!host_port.ok()) return host_port.status();
    uint16_t port = host_port->port != 0 ? host_port->port : tls_.listen_port();
    if (port == 0) {
      return absl::FailedPreconditionError(
          "udp transport: Listen on port 0 needs the tcp transport to listen first");
    }
    socklen_t len = 0;
    auto local = Resolve(host_port->host, port, &len);
    if (!local.ok()) return local.status();
    // Hold the port: flows bind it with SO_REUSEPORT and connect, and the
    // kernel prefers a connected socket's exact match over this one.
    int fd = ::socket(local->ss_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return ErrnoError("cannot create a UDP socket");
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof one);
    int small = 4096;
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
    if (::bind(fd, reinterpret_cast<sockaddr*>(&*local), len) != 0) {
      absl::Status s =
          ErrnoError(absl::StrCat("cannot listen on udp ", address, " (port ", port, ")"));
      ::close(fd);
      return s;
    }
    absl::MutexLock lock(&mu_);
    reserve_fd_ = fd;
    listen_host_ = host_port->host;
    port_ = port;
    on_channel_ = std::move(on_channel);
    return absl::OkStatus();
  }

  uint16_t listen_port() const override { return port_; }

  void Shutdown() override {
    stopping_.store(true);
    absl::MutexLock lock(&mu_);
    for (auto& [c, flow] : live_) c->Abort();
  }

  absl::Status ReloadTrust(const TlsIdentity&) override {
    size_t open = 0, closed = 0;
    absl::MutexLock lock(&mu_);
    for (auto& [connection, flow] : live_) {
      ++open;
      if (!Trusted(*connection, flow)) ++closed;
    }
    if (open > 0) spdlog::info("re-checked {} udp flows, closed {}", open, closed);
    return absl::OkStatus();
  }

 private:
  struct UniqueFd {
    explicit UniqueFd(int fd) : fd(fd) {}
    ~UniqueFd() {
      if (fd >= 0) ::close(fd);
    }
    int release() { return std::exchange(fd, -1); }
    int fd;
  };

  // One coupled model per peer site, shared by every flow dialed to it.
  struct Aggregate {
    std::shared_ptr<absl::Mutex> mu = std::make_shared<absl::Mutex>();
    std::unique_ptr<congestion::SplitMix64Random> random;
    std::unique_ptr<congestion::AggregateController> controller;
  };

  // Whether no flow drives the aggregate's model any more. The next flow then starts a fresh one
  // (Startup): the old model's rate and what it learned of its competitors (Bbr3's tolerance of
  // loss in a loss-blind competitor's queue) describe traffic that may be long gone.
  static bool AggregateIsUnused(const Aggregate& agg) {
    absl::MutexLock cc(agg.mu.get());
    return agg.controller->num_flows() == 0;
  }

  absl::StatusOr<udp::ConnectionKeys> ExportKeys(Channel& tls) {
    auto exported = tls.ExportKeyingMaterial(udp::kExportLabel, udp::kExportLength);
    if (!exported.ok()) return exported.status();
    auto keys = udp::SplitExportedKeys(*exported);
    OPENSSL_cleanse(exported->data(), exported->size());
    return keys;
  }

  void AddController(const std::string& site, size_t mss, UdpConnectionParams* params,
                     bool dialed) {
    congestion::Bbr3Params bbr;
    bbr.mss = mss;
    absl::MutexLock lock(&mu_);
    const Timestamp now = clock_.Now();
    if (dialed && options_.coupled) {
      Aggregate& agg = aggregates_[site];
      if (agg.controller != nullptr && AggregateIsUnused(agg)) agg.controller.reset();
      if (agg.controller == nullptr) {
        agg.random = std::make_unique<congestion::SplitMix64Random>(random_->NextUint64());
        agg.controller = std::make_unique<congestion::AggregateController>(bbr, *agg.random, now);
      }
      params->controller_mu = agg.mu;
      absl::MutexLock cc(agg.mu.get());
      params->controller = agg.controller->AddFlow();
      params->congestion_control_name = "bbr3-coupled";
    } else {
      params->controller_mu = std::make_shared<absl::Mutex>();
      params->controller = std::make_unique<OwnedBbr3>(bbr, random_->NextUint64(), now);
      params->congestion_control_name = "bbr3";
    }
  }

  // What a flow's keying TLS handshake proved, for re-checks at reloads.
  struct Flow {
    std::shared_ptr<const PeerCertificate> certificate;  // nullptr: nothing to re-check
    std::string site;
    std::string address;
    bool dialed = false;
  };

  // Asks the tls transport whether it still accepts the flow's peer; if not,
  // logs and aborts the flow.
  bool Trusted(UdpConnection& connection, const Flow& flow) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (flow.certificate == nullptr) return true;
    absl::Status check = tls_.CheckPeer(*flow.certificate);
    if (check.ok()) return true;
    spdlog::warn("closing udp flow {} {} at {}: {}", flow.dialed ? "to" : "from", flow.site,
                 flow.address, check.message());
    connection.Abort();
    return false;
  }

  // A flow is checked once more as it registers: a reload between its TLS
  // handshake and here would otherwise never see it.
  std::unique_ptr<UdpConnection> Register(UdpConnectionParams params,
                                          std::shared_ptr<const PeerCertificate> certificate,
                                          bool dialed) {
    Flow flow{std::move(certificate), params.peer_site, params.peer_address, dialed};
    params.window_bytes = options_.window_bytes;
    params.gso = options_.gso;
    params.key_update_interval = options_.key_update_interval;
    params.idle_timeout = options_.idle_timeout;
    params.io_thread_nice = options_.io_thread_nice;
    params.drop_every_nth_received = options_.drop_every_nth_received_datagram;
    params.clock = &clock_;
    auto holder = std::make_shared<UdpConnection*>(nullptr);
    params.on_destroy = [this, holder] {
      absl::MutexLock lock(&mu_);
      live_.erase(*holder);
    };
    auto connection = std::make_unique<UdpConnection>(std::move(params));
    *holder = connection.get();
    absl::MutexLock lock(&mu_);
    if (stopping_.load()) {
      connection->Abort();
    } else {
      Trusted(*connection, flow);
    }
    live_.emplace(connection.get(), std::move(flow));
    return connection;
  }

  Transport& tls_;
  const UdpOptions options_;
  const Clock& clock_;
  std::atomic<bool> stopping_{false};
  absl::Mutex mu_;
  ChannelHandler on_channel_ ABSL_GUARDED_BY(mu_);
  std::string listen_host_;
  uint16_t port_ = 0;
  int reserve_fd_ = -1;
  // Seeds the per-flow and per-aggregate generators; guarded by mu_.
  std::unique_ptr<congestion::SplitMix64Random> random_;
  std::map<std::string, Aggregate> aggregates_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<UdpConnection*, Flow> live_ ABSL_GUARDED_BY(mu_);
  uint64_t activity_source_ = 0;  // our live flows, for the tls transport's idle sweep
};

}  // namespace

absl::StatusOr<std::unique_ptr<UdpTransport>> MakeUdpTransport(Transport& tls_transport,
                                                               const UdpOptions& options) {
  if (options.window_bytes < (1u << 20) || options.max_datagram < 1200 ||
      options.max_datagram > 65000) {
    return absl::InvalidArgumentError(
        "udp transport: window must be >= 1 MiB and max_datagram within [1200, 65000]");
  }
  return std::unique_ptr<UdpTransport>(std::make_unique<UdpTransportImpl>(tls_transport, options));
}

}  // namespace longhaul::transport
