#ifndef LONGHAUL_DAEMON_PEER_PRIORITY_GATE_H_
#define LONGHAUL_DAEMON_PEER_PRIORITY_GATE_H_

#include <atomic>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "longhaul/v1/control.pb.h"

namespace longhaul::peer {

// Priority between traffic classes on the link to one peer site: exchange
// over checkpoint over background. Work of a class marks itself active with
// Enter(); a sender asks WaitForTurn() at every chunk boundary and waits
// while a higher class is active on the same link, so a higher class takes
// the link within one chunk time.
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

  Scope Enter(const std::string& site, v1::PriorityClass cls);

  // Blocks while a class above `cls` is active on `site`, or until `stop`
  // becomes true (checked at least every 50 ms). Returns true if it waited.
  bool WaitForTurn(const std::string& site, v1::PriorityClass cls, const std::atomic<bool>& stop);

  // 0 = exchange, 1 = checkpoint (and unspecified), 2 = background.
  static int Rank(v1::PriorityClass cls);

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
