#ifndef LONGHAUL_DAEMON_PEER_PRIORITY_GATE_H_
#define LONGHAUL_DAEMON_PEER_PRIORITY_GATE_H_

#include <atomic>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "daemon/transport/transport.h"
#include "longhaul/v1/control.pb.h"

namespace longhaul::peer {

// Priority between traffic classes on the link to one peer site: exchange
// over checkpoint over background. Work of a class marks itself active with
// Enter(); a bulk sender asks WaitForTurn() at every chunk boundary and, inside
// a chunk, between slices of kYieldBytes, and waits while a higher class is
// active on the same link. With the bulk channels' unsent-bytes cap
// (Channel::LimitUnsentBytes(kBulkUnsentBytes)) a higher class so takes the
// link within a slice time per stream, well inside one chunk time.
//
// The link is not the only thing the classes share: on a small host the bulk
// class's hashing and encryption compete for the CPU with the threads that
// carry an exchange, and every wake-up on the exchange path waits for a core.
// LowerThreadPriority() makes a bulk thread yield the CPU too.
//
// Thread-safe.
class PriorityGate {
 public:
  // Marks `cls` active on the link to `site` until the returned Scope dies.
  class Scope {
   public:
    Scope(PriorityGate* gate, std::string site, int rank) : gate_(gate), site_(std::move(site)), rank_(rank) {}
    Scope(Scope&& other) noexcept : gate_(other.gate_), site_(std::move(other.site_)), rank_(other.rank_) {
      other.gate_ = nullptr;
    }
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;
    ~Scope() {
      if (gate_) gate_->Leave(site_, rank_);
    }

   private:
    PriorityGate* gate_;
    std::string site_;
    int rank_;
  };

  // Bytes a bulk sender writes between two looks at the gate inside a chunk.
  // The rest of a slice under way when an exchange starts still goes out
  // ahead of it, from every stream: 8 streams x 64 KiB is 4 ms at 1 Gbit/s
  // (17 ms with 256 KiB). A look costs one uncontended mutex, and the
  // transport writes TLS records of 16 KiB either way.
  static constexpr uint64_t kYieldBytes = 64ull << 10;
  // What a bulk stream lets its transport hold unsent
  // (Channel::LimitUnsentBytes): once it pauses, at most this much more of
  // it goes out ahead of an exchange. Enough to bridge a writer's wake-up
  // (1.7 ms of a 10 Gbit/s link shared by 8 streams).
  static constexpr uint64_t kBulkUnsentBytes = 256ull << 10;

  Scope Enter(const std::string& site, v1::PriorityClass cls);

  // True if a class above `cls` is active on `site` (a cheap look, for
  // deciding whether to call WaitForTurn).
  bool HigherActive(const std::string& site, v1::PriorityClass cls);
  // How many works of `cls` are active on `site` (for tests and metrics).
  int ActiveCount(const std::string& site, v1::PriorityClass cls);

  // Blocks while a class above `cls` is active on `site`, or until `stop`
  // becomes true (checked at least every 50 ms). Returns true if it waited.
  bool WaitForTurn(const std::string& site, v1::PriorityClass cls, const std::atomic<bool>& stop);

  // Writes `parts` to `channel` in order, in slices of at most kYieldBytes.
  // Before every slice but the first it waits while a class above `cls` is
  // active on `site`. The bytes on the wire are the same as one Write; only
  // their timing differs. Cancelled if `stop` is set while waiting.
  absl::Status WriteYielding(transport::Channel& channel,
                             absl::Span<const absl::Span<const uint8_t>> parts,
                             const std::string& site, v1::PriorityClass cls,
                             const std::atomic<bool>& stop);

  // 0 = exchange, 1 = checkpoint (and unspecified), 2 = background.
  static int Rank(v1::PriorityClass cls);

  // The nice value a thread carrying `cls` bulk data runs at: 0 for exchange,
  // kCheckpointNice for checkpoint (and unspecified), kBackgroundNice for
  // background.
  static constexpr int kCheckpointNice = 10;
  static constexpr int kBackgroundNice = 15;
  static int NiceFor(v1::PriorityClass cls);
  // Lowers the calling thread's CPU priority to NiceFor(cls) (never raises
  // it). For threads that carry one class's bulk data and end with it (a
  // sender's stream, a receiver's data channel). Best effort: a refusal is
  // ignored.
  static void LowerThreadPriority(v1::PriorityClass cls);

 private:
  static constexpr int kClasses = 3;
  struct Counts {
    int active[kClasses] = {0, 0, 0};
  };
  void Leave(const std::string& site, int rank);

  absl::Mutex mu_;
  absl::flat_hash_map<std::string, Counts> links_ ABSL_GUARDED_BY(mu_);
};

}  // namespace longhaul::peer

#endif  // LONGHAUL_DAEMON_PEER_PRIORITY_GATE_H_
