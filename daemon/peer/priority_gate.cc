#include "daemon/peer/priority_gate.h"

namespace longhaul::peer {

int PriorityGate::Rank(v1::PriorityClass cls) {
  switch (cls) {
    case v1::EXCHANGE:
      return 0;
    case v1::BACKGROUND:
      return 2;
    default:
      return 1;
  }
}

PriorityGate::Scope PriorityGate::Enter(const std::string& site, v1::PriorityClass cls) {
  int rank = Rank(cls);
  absl::MutexLock lock(&mu_);
  ++links_[site].active[rank];
  return Scope(this, site, rank);
}

void PriorityGate::Leave(const std::string& site, int rank) {
  absl::MutexLock lock(&mu_);
  --links_[site].active[rank];
}

bool PriorityGate::WaitForTurn(const std::string& site, v1::PriorityClass cls,
                               const std::atomic<bool>& stop) {
  const int rank = Rank(cls);
  absl::MutexLock lock(&mu_);
  auto higher_active = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const Counts& c = links_[site];
    for (int r = 0; r < rank; ++r) {
      if (c.active[r] > 0) return true;
    }
    return false;
  };
  // `stop` is not guarded by mu_, hence the timeout.
  auto may_go = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !higher_active() || stop.load(); };
  bool waited = false;
  while (!may_go()) {
    waited = true;
    mu_.AwaitWithTimeout(absl::Condition(&may_go), absl::Milliseconds(50));
  }
  return waited;
}

}  // namespace longhaul::peer
