#ifndef LONGHAUL_DAEMON_PEER_MEMORY_BUDGET_H_
#define LONGHAUL_DAEMON_PEER_MEMORY_BUDGET_H_

// Memory a peer makes this daemon hold, by peer site: its receive buffers
// (chunks in flight on its streams) and its exchange messages no local call
// has claimed yet. Each site may hold up to one budget
// (peer_limits.memory_per_peer); past it the caller slows or refuses that
// peer, never the daemon.

#include <cstdint>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace longhaul::peer {

// Thread-safe.
class PeerMemoryBudget {
 public:
  explicit PeerMemoryBudget(uint64_t bytes_per_peer);

  // Reserves `bytes` for `site`. False, and nothing reserved, when that would
  // take the site past its budget.
  bool TryReserve(absl::string_view site, uint64_t bytes);
  // TryReserve that waits up to `wait` (a real-time mutex wait) for
  // Releases to make room.
  bool Reserve(absl::string_view site, uint64_t bytes, absl::Duration wait);
  // Returns what TryReserve reserved. Releasing more than is held is a bug.
  void Release(absl::string_view site, uint64_t bytes);

  uint64_t used(absl::string_view site) const;
  // Reserve() calls waiting now (for tests).
  int waiting() const;
  uint64_t bytes_per_peer() const { return bytes_per_peer_; }

 private:
  const uint64_t bytes_per_peer_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, uint64_t> used_ ABSL_GUARDED_BY(mu_);
  int waiting_ ABSL_GUARDED_BY(mu_) = 0;
};

// A reservation released when it goes out of scope (or is moved from).
class MemoryReservation {
 public:
  MemoryReservation() = default;
  // Empty (bytes() == 0) when the budget refuses.
  static MemoryReservation TryTake(PeerMemoryBudget* budget, absl::string_view site,
                                   uint64_t bytes);
  MemoryReservation(MemoryReservation&& other) noexcept;
  MemoryReservation& operator=(MemoryReservation&& other) noexcept;
  MemoryReservation(const MemoryReservation&) = delete;
  MemoryReservation& operator=(const MemoryReservation&) = delete;
  ~MemoryReservation();

  uint64_t bytes() const { return bytes_; }

 private:
  PeerMemoryBudget* budget_ = nullptr;
  std::string site_;
  uint64_t bytes_ = 0;
};

}  // namespace longhaul::peer

#endif  // LONGHAUL_DAEMON_PEER_MEMORY_BUDGET_H_
