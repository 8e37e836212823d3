// longhauld's series: what a site sends and receives, its transfers by
// state, journal latency, per-peer link figures, the operators' caps and the
// tcp transport's refused and closed connections.
#ifndef LONGHAUL_DAEMON_METRICS_DAEMON_METRICS_H_
#define LONGHAUL_DAEMON_METRICS_DAEMON_METRICS_H_

#include <string>
#include <utility>
#include <vector>

#include "prometheus/collectable.h"
#include "prometheus/metric_family.h"

namespace longhaul {
namespace storage {
class Journal;
}
namespace peer {
class Receiver;
class RateLimiter;
}  // namespace peer
namespace transport {
class Transport;
}
namespace daemon {
class TransferManager;
}

namespace metrics {

// Where the series come from. Every pointer may be null (that group of
// families then has no samples); each must outlive the collector.
struct DaemonSources {
  std::string site;
  daemon::TransferManager* manager = nullptr;
  const peer::Receiver* receiver = nullptr;
  const storage::Journal* journal = nullptr;
  const peer::RateLimiter* limiter = nullptr;
  const transport::Transport* tcp = nullptr;  // its ConnectionCounters
};

// Reads `sources` at every Collect() and returns longhauld's families, always
// the same ones in the same order. Reads only the sources' snapshot accessors:
// nothing on the data path.
//
// Thread-safe: Collect() keeps no state, and the sources are thread-safe.
class DaemonCollector : public prometheus::Collectable {
 public:
  explicit DaemonCollector(DaemonSources sources) : sources_(std::move(sources)) {}

  std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  const DaemonSources sources_;
};

}  // namespace metrics
}  // namespace longhaul

#endif  // LONGHAUL_DAEMON_METRICS_DAEMON_METRICS_H_
