// longhauld: a site's transfer daemon. See README.md and deploy/CONFIG.md.

#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "common/clock.h"
#include "common/fmt_absl.h"
#include "daemon/config.h"
#include "daemon/control_service.h"
#include "daemon/exchange/exchange_hub.h"
#include "daemon/exchange/exchange_service.h"
#include "daemon/local_control_server.h"
#include "daemon/metrics/daemon_metrics.h"
#include "daemon/metrics/http_server.h"
#include "daemon/peer/memory_budget.h"
#include "daemon/peer/messaging.h"
#include "daemon/peer/priority_gate.h"
#include "daemon/peer/rate_limiter.h"
#include "daemon/peer/receiver.h"
#include "daemon/peer/router.h"
#include "daemon/session_options.h"
#include "daemon/transfer_manager.h"
#include "daemon/transport/transport.h"
#include "daemon/transport/udp_transport.h"
#include "spdlog/spdlog.h"
#include "storage/journal.h"

namespace longhaul::daemon {
namespace {

int Fail(absl::string_view what, const absl::Status& status) {
  spdlog::critical("{}: {}", what, status.message());
  return 1;
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

// SIGHUP: the tls section of the config file, read again, replaces
// `identity`'s files in both transports. A config or file that does not load
// changes nothing.
void ReloadTrust(const std::string& config_path, transport::TlsIdentity& identity,
                 transport::Transport& tcp, transport::Transport& udp) {
  auto config = LoadConfig(config_path);
  if (!config.ok()) {
    spdlog::error("SIGHUP: cannot reload TLS trust, kept the previous: {}",
                  config.status().message());
    return;
  }
  transport::TlsIdentity next = identity;
  next.ca_file = config->tls.ca;
  next.cert_file = config->tls.cert;
  next.key_file = config->tls.key;
  next.crl_file = config->tls.crl;
  if (absl::Status s = tcp.ReloadTrust(next); !s.ok()) {
    spdlog::error("SIGHUP: cannot reload TLS trust, kept the previous: {}", s.message());
    return;
  }
  identity = next;
  (void)udp.ReloadTrust(next);
}

// Each peer connection, pending or served, holds a descriptor: take the
// whole hard limit rather than a soft default of 1024.
void RaiseOpenFileLimit() {
  struct rlimit limit;
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0) {
    spdlog::warn("cannot read the open-file limit: {}", strerror(errno));
    return;
  }
  if (limit.rlim_cur < limit.rlim_max) {
    rlim_t soft = limit.rlim_cur;
    limit.rlim_cur = limit.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &limit) != 0) {
      spdlog::warn("cannot raise the open-file limit from {} to {}: {}", soft, limit.rlim_max,
                   strerror(errno));
      limit.rlim_cur = soft;
    }
  }
  spdlog::info("open-file limit {}", limit.rlim_cur);
}

int Run(const std::string& config_path, const std::string& log_level_override) {
  auto config = LoadConfig(config_path);
  if (!config.ok()) return Fail("bad configuration", config.status());
  spdlog::set_level(spdlog::level::from_str(log_level_override.empty() ? config->log_level
                                                                       : log_level_override));
  spdlog::set_pattern(absl::StrCat("%Y-%m-%dT%H:%M:%S.%e %^%l%$ [", config->site, "] %v"));
  RaiseOpenFileLimit();

  std::error_code ec;
  std::filesystem::create_directories(config->state_dir, ec);
  if (ec) {
    return Fail("cannot create state_dir",
                absl::UnavailableError(absl::StrCat(config->state_dir, ": ", ec.message())));
  }
  auto journal = storage::Journal::Open(config->state_dir + "/journal");
  if (!journal.ok()) return Fail("cannot open the journal", journal.status());

  transport::TlsIdentity identity{
      config->tls.ca, config->tls.cert, config->tls.key, config->site, {}, config->tls.crl};
  for (const PeerConfig& p : config->peers) identity.peer_sites.push_back(p.site);
  transport::TcpTuning tuning;
  // Twice the bandwidth-delay product per connection: one connection (the
  // exchange link, or a transfer with one stream) must fill the pipe alone.
  // Bulk streams cap their unsent bytes (Channel::LimitUnsentBytes), so the
  // larger buffers do not queue a backlog ahead of an exchange.
  tuning.socket_buffer_bytes =
      std::clamp<uint64_t>(2 * config->BandwidthDelayProduct(), 4u << 20, 256u << 20);
  tuning.congestion_control = config->link.congestion_control;
  transport::ConnectionLimits connection_limits;
  connection_limits.handshake_timeout =
      TimeDelta::Microseconds(config->peer_limits.handshake_timeout_us);
  connection_limits.max_pending_handshakes = config->peer_limits.max_pending_handshakes;
  connection_limits.max_pending_handshakes_per_address =
      config->peer_limits.max_pending_handshakes_per_address;
  connection_limits.max_connections_per_peer = config->peer_limits.max_connections_per_peer;
  connection_limits.idle_timeout = TimeDelta::Microseconds(config->peer_limits.idle_timeout_us);
  auto transport = transport::MakeTcpTlsTransport(identity, tuning, connection_limits);
  if (!transport.ok()) return Fail("cannot set up TLS", transport.status());
  // The udp transport (issue 5): keys agreed over the tcp transport's TLS.
  transport::UdpOptions udp_options;
  // Per flow, like the tcp buffers above: twice the bandwidth-delay product, so one flow can fill
  // the pipe alone. The coupled controller hands the whole cwnd to the flows that still have data
  // at a transfer's tail; a window of BDP x 2 / streams held each of them to a fraction of the
  // link there (wan-lossy: 4 MiB per flow, < 750 Mbit/s for one flow at 45 ms).
  udp_options.window_bytes =
      std::clamp<uint64_t>(2 * config->BandwidthDelayProduct(), 4u << 20, 64u << 20);
  udp_options.socket_buffer_bytes = std::clamp<uint64_t>(udp_options.window_bytes, 4u << 20, 32u << 20);
  udp_options.coupled = config->udp.coupled;
  auto udp = transport::MakeUdpTransport(**transport, udp_options);
  if (!udp.ok()) return Fail("cannot set up the udp transport", udp.status());

  // What each peer site may make this daemon hold (peer_limits.memory_per_peer): the receiver's
  // buffers here, and the exchange hub's unclaimed messages, from one budget.
  peer::PeerMemoryBudget memory_budget(config->peer_limits.memory_per_peer);
  longhaul::peer::Receiver receiver(ReceiverOptionsFor(*config), **journal,
                                    storage::PosixFileSystem(), &memory_budget);
  receiver.FinishInterruptedPublishes();
  receiver.StartExpirySweep();
  longhaul::peer::PeerRouter router;
  auto serve_transfer = [&receiver](std::unique_ptr<transport::Channel> channel,
                                    const v1::Hello& hello) {
    receiver.Serve(std::move(channel), hello);
  };
  router.Register(v1::Hello::CONTROL, serve_transfer);
  router.Register(v1::Hello::DATA, [&receiver](std::unique_ptr<transport::Channel> channel,
                                               const v1::Hello& hello) {
    // Checking and storing chunks yields the CPU to exchanges (this thread
    // serves this one data channel and ends with it).
    longhaul::peer::PriorityGate::LowerThreadPriority(v1::CHECKPOINT);
    receiver.Serve(std::move(channel), hello);
  });
  router.Register(v1::Hello::PROBE, [](auto, const v1::Hello&) {});  // the handshake was the point
  router.Register(v1::Hello::UDP_HANDSHAKE, [&udp](auto channel, const v1::Hello&) {
    (*udp)->AcceptHandshake(std::move(channel));
  });
  // Operators' caps: from the config, changed at run time by `longhaul limit`;
  // they apply to transfers and to exchanges alike.
  longhaul::peer::RateLimiter limiter(RealClock::Get());
  for (const auto& [site, bps] : config->limits.peers) {
    limiter.SetPeerLimit(site, Bandwidth::BitsPerSecond(static_cast<int64_t>(bps)));
  }
  for (const auto& [name, bps] : config->limits.classes) {
    if (auto cls = longhaul::peer::ParsePriorityClass(name); cls.ok()) {
      limiter.SetClassLimit(*cls, Bandwidth::BitsPerSecond(static_cast<int64_t>(bps)));
    }
  }
  longhaul::peer::PriorityGate gate;
  std::vector<std::string> exchange_peers;
  for (const PeerConfig& p : config->peers) exchange_peers.push_back(p.site);
  exchange::HubOptions hub_options;
  hub_options.max_unclaimed_messages_per_peer =
      config->peer_limits.max_unclaimed_messages_per_peer;
  hub_options.memory_budget = &memory_budget;
  exchange::ExchangeHub exchange_hub(
      config->site, exchange_peers,
      [&config, &transport](const std::string& site)
          -> absl::StatusOr<std::unique_ptr<transport::Channel>> {
        const PeerConfig* peer = config->FindPeer(site);
        if (peer == nullptr) return absl::NotFoundError(absl::StrCat(site, " is not a configured peer"));
        v1::Hello hello;
        hello.set_role(v1::Hello::EXCHANGE);
        auto channel = longhaul::peer::DialSession(**transport, site, peer->address, hello);
        // Paced at most at the link's rate, the kernel's congestion control
        // cannot overshoot into the bottleneck queue while it probes (BBR's
        // startup paces at 2.89x its estimate) and lose the message's packets
        // to it.
        if (channel.ok()) {
          (*channel)->LimitPacingRate(
              Bandwidth::BitsPerSecond(static_cast<int64_t>(config->link.bandwidth_bps)));
        }
        return channel;
      },
      &gate, hub_options, &limiter);
  router.Register(v1::Hello::EXCHANGE, [&exchange_hub](std::unique_ptr<transport::Channel> channel,
                                                       const v1::Hello&) {
    exchange_hub.ServeInbound(std::move(channel));
  });
  if (absl::Status s = (*transport)->Listen(config->listen, [&router](auto channel) {
        router.Serve(std::move(channel));
      });
      !s.ok()) {
    return Fail("cannot listen for peers", s);
  }
  // Same port number as the tcp listener (see udp_transport.h).
  if (absl::Status s = (*udp)->Listen(config->listen, [&router](auto channel) {
        router.Serve(std::move(channel));
      });
      !s.ok()) {
    return Fail("cannot listen for udp peers", s);
  }

  transport::TransportSet transports = {{"tcp", transport->get()}, {"udp", udp->get()}};
  TransferManager manager(*config, transports, **journal, gate);
  manager.SetRateLimiter(&limiter);
  if (absl::Status s = manager.Start(); !s.ok()) return Fail("cannot resume transfers", s);

  // Local control: each caller known by uid (see LocalControlServer), the
  // socket for the daemon's user and group only.
  std::string socket_path = config->control_socket;
  std::filesystem::create_directories(std::filesystem::path(socket_path).parent_path(), ec);
  exchange::ExchangeService exchange_service(exchange_hub);
  if (absl::Status s = exchange_service.ServeSegments({socket_path + ".shm", 0660}); !s.ok()) {
    return Fail("cannot serve the exchange segment socket", s);
  }
  auto local_server =
      LocalControlServer::Start({socket_path, 0660},
                                [&manager, &limiter, &identity](const Caller& caller) {
                                  auto service = std::make_unique<ControlService>(manager, caller);
                                  service->SetRateLimiter(&limiter, identity.peer_sites);
                                  std::vector<std::unique_ptr<grpc::Service>> services;
                                  services.push_back(std::move(service));
                                  return services;
                                },
                                {&exchange_service});
  if (!local_server.ok()) return Fail("cannot serve the control API", local_server.status());

  // The optional TCP control address: the control API only (exchanges need
  // shared memory with a local client), every call with a role's token.
  std::unique_ptr<ControlService> tcp_service;
  std::unique_ptr<grpc::Server> tcp_server;
  if (!config->control_listen.empty()) {
    auto tokens = ReadControlTokens(*config);
    if (!tokens.ok()) return Fail("cannot serve the TCP control address", tokens.status());
    std::vector<std::string> roles;
    for (const ControlService::RoleToken& t : *tokens) roles.emplace_back(ControlRoleName(t.role));
    tcp_service = std::make_unique<ControlService>(manager, *std::move(tokens));
    tcp_service->SetRateLimiter(&limiter, identity.peer_sites);
    int port = 0;
    grpc::ServerBuilder tcp_builder;
    tcp_builder.AddListeningPort(config->control_listen, grpc::InsecureServerCredentials(), &port);
    tcp_builder.RegisterService(tcp_service.get());
    tcp_server = tcp_builder.BuildAndStart();
    if (!tcp_server || port == 0) {
      return Fail("cannot serve the TCP control address",
                  absl::UnavailableError(absl::StrCat("cannot listen on ", config->control_listen)));
    }
    spdlog::info("control also on tcp {}:{} (bearer token required; roles: {})",
                 config->control_listen.substr(0, config->control_listen.rfind(':')), port,
                 absl::StrJoin(roles, ", "));
  }

  const std::string listen_host = config->listen.substr(0, config->listen.rfind(':'));
  spdlog::info("site {} ready: peers on {}:{}, control on unix:{}, {} peers, {} exports",
               config->site, listen_host, (*transport)->listen_port(), socket_path,
               config->peers.size(), config->exports.size());

  const metrics::DaemonCollector daemon_metrics(
      {config->site, &manager, &receiver, journal->get(), &limiter, transport->get()});
  std::unique_ptr<metrics::MetricsServer> metrics_server;
  if (!config->metrics.listen.empty()) {
    metrics::MetricsServer::Options metrics_options;
    metrics_options.max_connections = config->metrics.max_connections;
    metrics_options.request_timeout = TimeDelta::Microseconds(config->metrics.request_timeout_us);
    auto started = metrics::MetricsServer::Start(
        config->metrics.listen, daemon_metrics, [] { return absl::OkStatus(); }, metrics_options);
    if (started.ok()) {
      metrics_server = std::move(*started);
      spdlog::info("metrics on http://{}:{}/metrics",
                   config->metrics.listen.substr(0, config->metrics.listen.rfind(':')),
                   metrics_server->port());
    } else {
      // Not fatal: moving data matters more than being watched.
      spdlog::error("{}; running without metrics (set metrics.listen)", started.status().message());
    }
  }

  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGHUP);
  int received = 0;
  while (sigwait(&signals, &received) == 0 && received == SIGHUP) {
    ReloadTrust(config_path, identity, **transport, **udp);
  }
  spdlog::info("received {}; draining", strsignal(received));

  if (metrics_server) metrics_server->Stop();
  exchange_hub.Shutdown();  // ends exchange calls so the server can drain
  // On gRPC's monotonic clock, so a wall-clock step cannot cut the drain short.
  const gpr_timespec drained_by =
      gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC), gpr_time_from_seconds(2, GPR_TIMESPAN));
  if (tcp_server) tcp_server->Shutdown(drained_by);
  (*local_server)->Shutdown(drained_by);
  manager.Shutdown();
  receiver.Shutdown();
  (*udp)->Shutdown();
  (*transport)->Shutdown();
  spdlog::info("stopped cleanly");
  return 0;
}

}  // namespace
}  // namespace longhaul::daemon

int main(int argc, char** argv) {
  CLI::App app{"longhauld: moves training data between sites over long-haul links"};
  std::string config_path;
  std::string log_level;
  app.add_option("--config", config_path, "YAML configuration file")->required();
  app.add_option("--log-level", log_level, "trace|debug|info|warn|error (overrides the config)");
  CLI11_PARSE(app, argc, argv);

  // Signals are taken by sigwait in main; every thread started later inherits
  // the mask. A peer that hangs up must be an error value, not SIGPIPE.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  signal(SIGPIPE, SIG_IGN);
  return longhaul::daemon::Run(config_path, log_level);
}
