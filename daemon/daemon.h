// Daemon: one site's longhauld, every server and worker it runs, as an
// object a process (main.cc) or a test starts and stops.
#ifndef LONGHAUL_DAEMON_DAEMON_H_
#define LONGHAUL_DAEMON_DAEMON_H_

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "daemon/config.h"
#include "daemon/control_service.h"
#include "daemon/exchange/exchange_hub.h"
#include "daemon/exchange/exchange_service.h"
#include "daemon/local_control_server.h"
#include "daemon/metrics/daemon_metrics.h"
#include "daemon/metrics/http_server.h"
#include "daemon/peer/memory_budget.h"
#include "daemon/peer/priority_gate.h"
#include "daemon/peer/rate_limiter.h"
#include "daemon/peer/receiver.h"
#include "daemon/peer/router.h"
#include "daemon/transfer/relay.h"
#include "daemon/transfer/transfer_manager.h"
#include "daemon/transport/transport.h"
#include "daemon/transport/udp_transport.h"
#include "storage/file_system.h"
#include "storage/journal.h"

namespace longhaul::daemon {

struct DaemonOptions {
  // Already loaded and validated (LoadConfig).
  DaemonConfig config;
  // The file `config` came from: ReloadTrust reads its tls section again.
  // Empty: ReloadTrust refuses.
  std::string config_path;
  // Every time the daemon reads: transfer runs and records, rate caps,
  // expiry, both transports' deadlines and the udp plane's congestion
  // control. nullptr: RealClock::Get(). Must outlive the Daemon.
  const Clock* clock = nullptr;
  // Holds staging and destinations of incoming transfers; nullptr:
  // storage::PosixFileSystem(). Must outlive the Daemon.
  storage::FileSystem* file_system = nullptr;
};

// A running site: the journal under config.state_dir, the tcp+tls and udp
// peer transports on config.listen (one port number for both; port 0 picks
// a free one), the receiver of incoming transfers, the exchange hub, the
// transfer manager (which resumes the journal's unfinished transfers), the
// control API on config.control_socket (and config.control_listen when
// set), and /metrics on config.metrics.listen when set.
//
// Start brings them up in that order and fails, with everything it started
// stopped again, on the first that cannot start; the message says which
// ("cannot open the journal: ..."). A metrics address that cannot be bound
// is logged and the daemon runs without metrics. Shutdown drains in the
// reverse direction: metrics, exchanges, the control servers (calls still
// running after 2 s are cancelled), transfers (kept resumable in the
// journal), the receiver, the transports.
//
// Several Daemons may run in one process (tests), each with its own
// config.state_dir and control socket. Process-wide settings (the log
// pattern, the open-file limit, signal handling) are the caller's.
//
// Thread-safe: ReloadTrust and Shutdown may be called from any thread; the
// accessors are constant from Start on.
class Daemon {
 public:
  static absl::StatusOr<std::unique_ptr<Daemon>> Start(DaemonOptions options);
  // Calls Shutdown.
  ~Daemon();
  Daemon(const Daemon&) = delete;
  Daemon& operator=(const Daemon&) = delete;

  // Stops the daemon (see the class comment); returns once every server and
  // worker has stopped. Idempotent.
  void Shutdown();

  // What SIGHUP does: reads the tls section of the config file again and
  // puts its files in force on both transports (connections the new trust
  // refuses are closed). A file that does not load, or a certificate that
  // does not, changes nothing and is returned (and logged).
  absl::Status ReloadTrust();

  // The port peers connect to, tcp and udp alike.
  uint16_t peer_port() const;
  // The Unix socket of the control API ("unix:" + it is a client address).
  const std::string& control_socket() const { return config_.control_socket; }
  // The bound /metrics port; 0 when the daemon runs without metrics.
  uint16_t metrics_port() const;
  const DaemonConfig& config() const { return config_; }

 private:
  explicit Daemon(DaemonOptions options);
  // The steps of Start, in order; each member it sets is stopped by
  // Shutdown, whatever step failed.
  absl::Status StartServing();
  absl::Status StartPeerTransports();
  // Listens on the tcp and udp transports: peers may connect from now on.
  absl::Status ListenForPeers();
  void StartReceiverAndRouter();
  void StartExchangeHub();
  absl::Status StartControlServers();
  absl::Status StartTcpControl();
  void StartMetrics();

  const DaemonConfig config_;
  const std::string config_path_;
  const Clock& clock_;
  storage::FileSystem& file_system_;
  // Configured peer sites, whom transfers and caps may name.
  const std::vector<std::string> peer_sites_;

  absl::Mutex mu_;  // serializes ReloadTrust and Shutdown
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
  bool ready_ = false;  // set once by Start, when everything serves
  // The files in force on the transports; ReloadTrust replaces them.
  transport::TlsIdentity identity_ ABSL_GUARDED_BY(mu_);

  // In start-up order, so that they are destroyed in the reverse.
  std::unique_ptr<storage::Journal> journal_;
  std::unique_ptr<transport::Transport> tcp_;
  std::unique_ptr<transport::UdpTransport> udp_;
  std::unique_ptr<peer::PeerMemoryBudget> memory_budget_;
  std::unique_ptr<peer::Receiver> receiver_;
  std::unique_ptr<peer::PeerRouter> router_;
  std::unique_ptr<peer::RateLimiter> limiter_;
  std::unique_ptr<peer::PriorityGate> gate_;
  std::unique_ptr<exchange::ExchangeHub> exchange_hub_;
  std::unique_ptr<Relays> relays_;  // fan-out: relays of incoming transfers
  std::unique_ptr<TransferManager> manager_;
  std::unique_ptr<exchange::ExchangeService> exchange_service_;
  std::unique_ptr<LocalControlServer> local_server_;
  std::unique_ptr<ControlService> tcp_service_;
  std::unique_ptr<grpc::Server> tcp_server_;
  std::unique_ptr<metrics::DaemonCollector> daemon_metrics_;
  std::unique_ptr<metrics::MetricsServer> metrics_server_;
};

}  // namespace longhaul::daemon

#endif  // LONGHAUL_DAEMON_DAEMON_H_
