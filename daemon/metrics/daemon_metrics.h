// longhauld's series: what a site sends and receives, its transfers by
// state, journal latency, per-peer link figures and the operators' caps.
#ifndef LONGHAUL_DAEMON_METRICS_DAEMON_METRICS_H_
#define LONGHAUL_DAEMON_METRICS_DAEMON_METRICS_H_

#include <string>

#include "daemon/metrics/registry.h"

namespace longhaul {
namespace storage {
class Journal;
}
namespace peer {
class Receiver;
class RateLimiter;
}  // namespace peer
namespace daemon {
class TransferManager;
}

namespace metrics {

// Where the series come from. Every pointer may be null (that group of
// series is then absent); each must outlive the registry's last Render().
struct DaemonSources {
  std::string site;
  daemon::TransferManager* manager = nullptr;
  const peer::Receiver* receiver = nullptr;
  const storage::Journal* journal = nullptr;
  const peer::RateLimiter* limiter = nullptr;
};

// Adds longhauld's families to `registry` with a collector that refreshes
// them from `sources` at every scrape (snapshots only: nothing on the data
// path). Call once per registry.
void RegisterDaemonMetrics(Registry& registry, DaemonSources sources);

}  // namespace metrics
}  // namespace longhaul

#endif  // LONGHAUL_DAEMON_METRICS_DAEMON_METRICS_H_
