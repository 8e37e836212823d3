#include "daemon/daemon.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/fmt_absl.h"
#include "daemon/peer/messaging.h"
#include "daemon/transfer/session_options.h"
#include "spdlog/spdlog.h"

namespace longhaul::daemon {
namespace {

// `status` with `what` (the step that failed) in front of its message.
absl::Status Failed(absl::string_view what, const absl::Status& status) {
  return absl::Status(status.code(), absl::StrCat(what, ": ", status.message()));
}

// A bearer token of the TCP control address: the file's first line,
// trimmed. Refused when short or readable by everyone.
absl::StatusOr<std::string> ReadControlToken(const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) {
    return absl::NotFoundError(absl::StrCat("control token file ", path, ": ", strerror(errno)));
  }
  if (st.st_mode & S_IROTH) {
    return absl::PermissionDeniedError(absl::StrCat(
        "control token file ", path, " is readable by everyone; chmod 600 (or 640) it"));
  }
  std::ifstream in(path);
  std::string token;
  std::getline(in, token);
  token = std::string(absl::StripAsciiWhitespace(token));
  if (token.size() < 16) {
    return absl::InvalidArgumentError(absl::StrCat("control token file ", path,
                                                   " must hold a token of at least 16 characters "
                                                   "(e.g. openssl rand -hex 32 > ",
                                                   path, ")"));
  }
  return token;
}

// Every configured token with its role; two roles may not share a token.
absl::StatusOr<std::vector<ControlService::RoleToken>> ReadControlTokens(
    const DaemonConfig& config) {
  std::vector<ControlService::RoleToken> tokens;
  for (const ControlToken& t : config.control_tokens) {
    auto token = ReadControlToken(t.file);
    if (!token.ok()) return token.status();
    for (const ControlService::RoleToken& other : tokens) {
      if (other.token == *token) {
        return absl::InvalidArgumentError(
            absl::StrCat("the ", ControlRoleName(t.role), " and ", ControlRoleName(other.role),
                         " control tokens are the same; each role needs its own"));
      }
    }
    tokens.push_back({t.role, *std::move(token)});
  }
  return tokens;
}

std::vector<std::string> PeerSites(const DaemonConfig& config) {
  std::vector<std::string> sites;
  for (const PeerConfig& p : config.peers) sites.push_back(p.site);
  return sites;
}

// The host part of a "host:port" the config already validated.
std::string HostOf(const std::string& address) { return address.substr(0, address.rfind(':')); }

}  // namespace

absl::StatusOr<std::unique_ptr<Daemon>> Daemon::Start(DaemonOptions options) {
  std::unique_ptr<Daemon> daemon(new Daemon(std::move(options)));
  if (absl::Status s = daemon->StartServing(); !s.ok()) return s;  // ~Daemon stops what started
  return daemon;
}

Daemon::Daemon(DaemonOptions options)
    : config_(std::move(options.config)),
      config_path_(std::move(options.config_path)),
      clock_(options.clock != nullptr ? *options.clock : RealClock::Get()),
      file_system_(options.file_system != nullptr ? *options.file_system
                                                  : storage::PosixFileSystem()),
      peer_sites_(PeerSites(config_)) {}

Daemon::~Daemon() { Shutdown(); }

absl::Status Daemon::StartServing() {
  std::error_code ec;
  std::filesystem::create_directories(config_.state_dir, ec);
  if (ec) {
    return Failed("cannot create state_dir",
                  absl::UnavailableError(absl::StrCat(config_.state_dir, ": ", ec.message())));
  }
  auto journal = storage::Journal::Open(config_.state_dir + "/journal");
  if (!journal.ok()) return Failed("cannot open the journal", journal.status());
  journal_ = *std::move(journal);

  if (absl::Status s = StartPeerTransports(); !s.ok()) return s;

  transport::TransportSet transports = {{"tcp", tcp_.get()}, {"udp", udp_.get()}};
  manager_ = std::make_unique<TransferManager>(config_, transports, *journal_, *gate_, clock_);
  relays_ = std::make_unique<Relays>(config_, transports, *gate_, *journal_, *receiver_);
  manager_->SetRateLimiter(limiter_.get());
  if (absl::Status s = manager_->Start(); !s.ok()) return Failed("cannot resume transfers", s);
  // After the manager exists: a publish asks it whether this site pulled the
  // version (pull_granted), to know which names its report may give.
  receiver_->FinishInterruptedPublishes();
  receiver_->StartExpirySweep();
  // Only now: a peer's open may ask the manager whether this site pulled it, and start a relay.
  if (absl::Status s = ListenForPeers(); !s.ok()) return s;

  if (absl::Status s = StartControlServers(); !s.ok()) return s;

  spdlog::info("site {} ready: peers on {}:{}, control on unix:{}, {} peers, {} exports",
               config_.site, HostOf(config_.listen), tcp_->listen_port(), config_.control_socket,
               config_.peers.size(), config_.exports.size());
  StartMetrics();
  ready_ = true;
  return absl::OkStatus();
}

// The transports, and what serves the channels they accept (receiver,
// router, exchange hub); ListenForPeers lets peers connect.
absl::Status Daemon::StartPeerTransports() {
  transport::TlsIdentity identity{config_.tls.ca, config_.tls.cert, config_.tls.key,
                                  config_.site,   peer_sites_,      config_.tls.crl};
  transport::TcpTuning tuning;
  // Twice the bandwidth-delay product per connection: one connection (the
  // exchange link, or a transfer with one stream) must fill the pipe alone.
  // Bulk streams cap their unsent bytes (Channel::LimitUnsentBytes), so the
  // larger buffers do not queue a backlog ahead of an exchange.
  tuning.socket_buffer_bytes =
      std::clamp<uint64_t>(2 * config_.BandwidthDelayProduct(), 4u << 20, 256u << 20);
  tuning.congestion_control = config_.link.congestion_control;
  transport::ConnectionLimits connection_limits;
  connection_limits.handshake_timeout =
      TimeDelta::Microseconds(config_.peer_limits.handshake_timeout_us);
  connection_limits.max_pending_handshakes = config_.peer_limits.max_pending_handshakes;
  connection_limits.max_pending_handshakes_per_address =
      config_.peer_limits.max_pending_handshakes_per_address;
  connection_limits.max_connections_per_peer = config_.peer_limits.max_connections_per_peer;
  connection_limits.idle_timeout = TimeDelta::Microseconds(config_.peer_limits.idle_timeout_us);
  connection_limits.clock = &clock_;
  auto tcp = transport::MakeTcpTlsTransport(identity, tuning, connection_limits);
  if (!tcp.ok()) return Failed("cannot set up TLS", tcp.status());
  tcp_ = *std::move(tcp);
  {
    absl::MutexLock lock(&mu_);
    identity_ = std::move(identity);
  }
  // The udp transport: keys agreed over the tcp transport's TLS.
  transport::UdpOptions udp_options;
  // Per flow, like the tcp buffers above: twice the bandwidth-delay product, so one flow can fill
  // the pipe alone. The coupled controller hands the whole cwnd to the flows that still have data
  // at a transfer's tail; a window of BDP x 2 / streams held each of them to a fraction of the
  // link there (wan-lossy: 4 MiB per flow, < 750 Mbit/s for one flow at 45 ms).
  udp_options.window_bytes =
      std::clamp<uint64_t>(2 * config_.BandwidthDelayProduct(), 4u << 20, 64u << 20);
  udp_options.socket_buffer_bytes =
      std::clamp<uint64_t>(udp_options.window_bytes, 4u << 20, 32u << 20);
  udp_options.coupled = config_.udp.coupled;
  udp_options.clock = &clock_;
  auto udp = transport::MakeUdpTransport(*tcp_, udp_options);
  if (!udp.ok()) return Failed("cannot set up the udp transport", udp.status());
  udp_ = *std::move(udp);

  StartReceiverAndRouter();
  StartExchangeHub();
  return absl::OkStatus();
}

absl::Status Daemon::ListenForPeers() {
  if (absl::Status s = tcp_->Listen(config_.listen,
                                    [this](auto channel) { router_->Serve(std::move(channel)); });
      !s.ok()) {
    return Failed("cannot listen for peers", s);
  }
  // Same port number as the tcp listener (see udp_transport.h); port 0
  // there means the one the tcp listener bound.
  if (absl::Status s = udp_->Listen(config_.listen,
                                    [this](auto channel) { router_->Serve(std::move(channel)); });
      !s.ok()) {
    return Failed("cannot listen for udp peers", s);
  }
  return absl::OkStatus();
}

void Daemon::StartReceiverAndRouter() {
  // What each peer site may make this daemon hold (peer_limits.memory_per_peer): the receiver's
  // buffers here, and the exchange hub's unclaimed messages, from one budget.
  memory_budget_ = std::make_unique<peer::PeerMemoryBudget>(config_.peer_limits.memory_per_peer);
  peer::ReceiverOptions receiver_options = ReceiverOptionsFor(config_);
  receiver_options.pull_granted = [this](const peer::DestinationAuthority::Change& change) {
    return manager_->PullGranted(change);
  };
  receiver_options.relay = [this](const std::string& transfer_id, const v1::RelayTarget& target) {
    relays_->Set(transfer_id, target);
  };
  receiver_ = std::make_unique<peer::Receiver>(std::move(receiver_options), *journal_, file_system_,
                                               memory_budget_.get(), clock_);

  router_ = std::make_unique<peer::PeerRouter>();
  router_->Register(v1::Hello::CONTROL,
                    [this](std::unique_ptr<transport::Channel> channel, const v1::Hello& hello) {
                      receiver_->Serve(std::move(channel), hello);
                    });
  router_->Register(v1::Hello::DATA,
                    [this](std::unique_ptr<transport::Channel> channel, const v1::Hello& hello) {
                      // Checking and storing chunks yields the CPU to exchanges (this thread
                      // serves this one data channel and ends with it).
                      peer::PriorityGate::LowerThreadPriority(v1::CHECKPOINT);
                      receiver_->Serve(std::move(channel), hello);
                    });
  // Pull and third-party copy: this site as the source (daemon/transfer/remote_copy.h).
  router_->Register(v1::Hello::REMOTE,
                    [this](std::unique_ptr<transport::Channel> channel, const v1::Hello&) {
                      manager_->ServeRemote(*channel);
                    });
  // A probe's handshake was the point.
  router_->Register(v1::Hello::PROBE, [](auto, const v1::Hello&) {});
  router_->Register(v1::Hello::UDP_HANDSHAKE, [this](auto channel, const v1::Hello&) {
    udp_->AcceptHandshake(std::move(channel));
  });
}

void Daemon::StartExchangeHub() {
  // Operators' caps: from the config, changed at run time by `longhaul limit`;
  // they apply to transfers and to exchanges alike.
  limiter_ = std::make_unique<peer::RateLimiter>(clock_);
  for (const auto& [site, bps] : config_.limits.peers) {
    limiter_->SetPeerLimit(site, Bandwidth::BitsPerSecond(static_cast<int64_t>(bps)));
  }
  for (const auto& [name, bps] : config_.limits.classes) {
    if (auto cls = peer::ParsePriorityClass(name); cls.ok()) {
      limiter_->SetClassLimit(*cls, Bandwidth::BitsPerSecond(static_cast<int64_t>(bps)));
    }
  }
  gate_ = std::make_unique<peer::PriorityGate>();
  exchange::HubOptions hub_options;
  hub_options.max_unclaimed_messages_per_peer = config_.peer_limits.max_unclaimed_messages_per_peer;
  hub_options.memory_budget = memory_budget_.get();
  hub_options.sharded_all_reduce = config_.exchange.sharded_all_reduce;
  hub_options.uplink = Bandwidth::BitsPerSecond(static_cast<int64_t>(config_.link.bandwidth_bps));
  exchange_hub_ = std::make_unique<exchange::ExchangeHub>(
      config_.site, peer_sites_,
      [this](const std::string& site) -> absl::StatusOr<std::unique_ptr<transport::Channel>> {
        const PeerConfig* peer = config_.FindPeer(site);
        if (peer == nullptr) {
          return absl::NotFoundError(absl::StrCat(site, " is not a configured peer"));
        }
        v1::Hello hello;
        hello.set_role(v1::Hello::EXCHANGE);
        return peer::DialSession(*tcp_, site, peer->address, hello);
      },
      gate_.get(), hub_options, limiter_.get(), clock_);
  router_->Register(v1::Hello::EXCHANGE,
                    [this](std::unique_ptr<transport::Channel> channel, const v1::Hello&) {
                      exchange_hub_->ServeInbound(std::move(channel));
                    });
}

absl::Status Daemon::StartControlServers() {
  // Local control: each caller known by uid (see LocalControlServer), the
  // socket for the daemon's user and group only.
  const std::string& socket_path = config_.control_socket;
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(socket_path).parent_path(), ec);
  exchange_service_ = std::make_unique<exchange::ExchangeService>(*exchange_hub_);
  if (absl::Status s = exchange_service_->ServeSegments({socket_path + ".shm", 0660}); !s.ok()) {
    return Failed("cannot serve the exchange segment socket", s);
  }
  auto local_server = LocalControlServer::Start(
      {socket_path, 0660},
      [this](const Caller& caller) {
        auto service = std::make_unique<ControlService>(*manager_, caller);
        service->SetRateLimiter(limiter_.get(), peer_sites_);
        std::vector<std::unique_ptr<grpc::Service>> services;
        services.push_back(std::move(service));
        return services;
      },
      {exchange_service_.get()});
  if (!local_server.ok()) return Failed("cannot serve the control API", local_server.status());
  local_server_ = *std::move(local_server);
  return StartTcpControl();
}

// The optional TCP control address: the control API only (exchanges need
// shared memory with a local client), every call with a role's token.
absl::Status Daemon::StartTcpControl() {
  if (config_.control_listen.empty()) return absl::OkStatus();
  constexpr absl::string_view kFailed = "cannot serve the TCP control address";
  auto tokens = ReadControlTokens(config_);
  if (!tokens.ok()) return Failed(kFailed, tokens.status());
  std::vector<std::string> roles;
  for (const ControlService::RoleToken& t : *tokens) roles.emplace_back(ControlRoleName(t.role));
  tcp_service_ = std::make_unique<ControlService>(*manager_, *std::move(tokens));
  tcp_service_->SetRateLimiter(limiter_.get(), peer_sites_);
  int port = 0;
  grpc::ServerBuilder tcp_builder;
  tcp_builder.AddListeningPort(config_.control_listen, grpc::InsecureServerCredentials(), &port);
  tcp_builder.RegisterService(tcp_service_.get());
  tcp_server_ = tcp_builder.BuildAndStart();
  if (!tcp_server_ || port == 0) {
    return Failed(
        kFailed, absl::UnavailableError(absl::StrCat("cannot listen on ", config_.control_listen)));
  }
  spdlog::info("control also on tcp {}:{} (bearer token required; roles: {})",
               HostOf(config_.control_listen), port, absl::StrJoin(roles, ", "));
  return absl::OkStatus();
}

void Daemon::StartMetrics() {
  daemon_metrics_ = std::make_unique<metrics::DaemonCollector>(metrics::DaemonSources{
      config_.site, manager_.get(), receiver_.get(), journal_.get(), limiter_.get(), tcp_.get()});
  if (config_.metrics.listen.empty()) return;
  metrics::MetricsServer::Options metrics_options;
  metrics_options.max_connections = config_.metrics.max_connections;
  metrics_options.request_timeout = TimeDelta::Microseconds(config_.metrics.request_timeout_us);
  auto started = metrics::MetricsServer::Start(
      config_.metrics.listen, *daemon_metrics_, [] { return absl::OkStatus(); }, metrics_options);
  if (!started.ok()) {
    // Not fatal: moving data matters more than being watched.
    spdlog::error("{}; running without metrics (set metrics.listen)", started.status().message());
    return;
  }
  metrics_server_ = *std::move(started);
  spdlog::info("metrics on http://{}:{}/metrics", HostOf(config_.metrics.listen),
               metrics_server_->port());
}

void Daemon::Shutdown() {
  absl::MutexLock lock(&mu_);
  if (shut_down_) return;
  shut_down_ = true;
  if (metrics_server_) metrics_server_->Stop();
  if (exchange_hub_) exchange_hub_->Shutdown();  // ends exchange calls so the server can drain
  // On gRPC's monotonic clock, so a wall-clock step cannot cut the drain short.
  const gpr_timespec drained_by =
      gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC), gpr_time_from_seconds(2, GPR_TIMESPAN));
  if (tcp_server_) tcp_server_->Shutdown(drained_by);
  if (local_server_) local_server_->Shutdown(drained_by);
  if (manager_) manager_->Shutdown();
  if (relays_) relays_->Shutdown();
  if (receiver_) receiver_->Shutdown();
  if (udp_) udp_->Shutdown();
  if (tcp_) tcp_->Shutdown();
  if (ready_) spdlog::info("stopped cleanly");
}

absl::Status Daemon::ReloadTrust() {
  absl::MutexLock lock(&mu_);
  if (shut_down_) return absl::FailedPreconditionError("the daemon is shut down");
  if (config_path_.empty()) {
    return absl::FailedPreconditionError("no configuration file to reload TLS trust from");
  }
  auto config = LoadConfig(config_path_);
  if (!config.ok()) {
    spdlog::error("SIGHUP: cannot reload TLS trust, kept the previous: {}",
                  config.status().message());
    return config.status();
  }
  transport::TlsIdentity next = identity_;
  next.ca_file = config->tls.ca;
  next.cert_file = config->tls.cert;
  next.key_file = config->tls.key;
  next.crl_file = config->tls.crl;
  if (absl::Status s = tcp_->ReloadTrust(next); !s.ok()) {
    spdlog::error("SIGHUP: cannot reload TLS trust, kept the previous: {}", s.message());
    return s;
  }
  identity_ = std::move(next);
  (void)udp_->ReloadTrust(identity_);
  return absl::OkStatus();
}

uint16_t Daemon::peer_port() const { return tcp_->listen_port(); }

uint16_t Daemon::metrics_port() const { return metrics_server_ ? metrics_server_->port() : 0; }

}  // namespace longhaul::daemon
