#ifndef LONGHAUL_TESTS_WANEM_EMULATOR_H_
#define LONGHAUL_TESTS_WANEM_EMULATOR_H_

#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "tests/wanem/netns.h"

namespace longhaul::wanem {

// A running emulated network: its namespaces, TUN devices and data-path
// threads. Implemented by the two-site link and the N-site star
// (star_emulator.h); wanem_main.cc drives either through this interface.
//
// Not thread-safe: owned and called by main's thread only (the data-path
// threads it starts touch only what they own and atomics).
class Emulator {
 public:
  virtual ~Emulator() = default;

  // Creates the namespaces and devices and starts the threads. On failure,
  // Stop() removes whatever was made.
  virtual absl::Status Start() = 0;
  // Idempotent. Stops the threads, closes the TUN devices and deletes the
  // namespaces with every process still inside them.
  virtual void Stop() = 0;
  // Cuts (or restores) the links `which` names; "" means all of them.
  virtual absl::Status SetCut(bool cut, absl::string_view which) = 0;
  // Starts (loss > 0) or ends (0) a loss burst on the links `which` names,
  // as SetCut does: LinkShaper::set_burst_loss.
  virtual absl::Status SetBurstLoss(double loss, absl::string_view which) = 0;

  // One JSON object: pid, namespaces, addresses, MTU.
  virtual std::string InfoJson() const = 0;
  // One JSON object: the info fields and every link direction's counters.
  virtual std::string StatsJson() const = 0;
  // Shell-sourceable KEY=value lines (README.md).
  virtual std::string ReadyFileText() const = 0;
  // Human-readable per-direction counts, printed on exit.
  virtual std::string Summary() const = 0;
};

// The teardown both emulators' Stop() does: wakes the data-path threads
// through the eventfd `stop_fd` and joins them, closes the TUN devices and
// `stop_fd` (each set to -1 once closed), and deletes the sites' namespaces
// with every process inside them (failures are printed, not returned).
void StopThreadsAndDeleteSites(int& stop_fd, absl::Span<std::thread> threads,
                               absl::Span<int> tun_fds, absl::Span<const SiteSpec> sites);

}  // namespace longhaul::wanem

#endif  // LONGHAUL_TESTS_WANEM_EMULATOR_H_
