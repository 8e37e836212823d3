#include "daemon/peer/priority_gate.h"

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "absl/container/inlined_vector.h"

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

int PriorityGate::NiceFor(v1::PriorityClass cls) {
  switch (Rank(cls)) {
    case 0:
      return 0;
    case 2:
      return kBackgroundNice;
    default:
      return kCheckpointNice;
  }
}

void PriorityGate::LowerThreadPriority(v1::PriorityClass cls) {
  // On Linux the nice value is per thread: PRIO_PROCESS with a thread id.
  const id_t tid = static_cast<id_t>(::syscall(SYS_gettid));
  errno = 0;
  const int current = ::getpriority(PRIO_PROCESS, tid);
  if (current == -1 && errno != 0) return;
  const int wanted = NiceFor(cls);
  if (wanted > current) ::setpriority(PRIO_PROCESS, tid, wanted);
}

absl::Status PriorityGate::WriteYielding(transport::Channel& channel,
                                         absl::Span<const absl::Span<const uint8_t>> parts,
                                         const std::string& site, v1::PriorityClass cls,
                                         const std::atomic<bool>& stop) {
  absl::InlinedVector<absl::Span<const uint8_t>, 4> slice;
  uint64_t slice_bytes = 0;
  bool first = true;
  auto flush = [&]() -> absl::Status {
    if (!first && HigherActive(site, cls)) {
      WaitForTurn(site, cls, stop);
      if (stop.load()) return absl::CancelledError("stopped");
    }
    first = false;
    absl::Status s = channel.Write(slice);
    slice.clear();
    slice_bytes = 0;
    return s;
  };
  for (absl::Span<const uint8_t> part : parts) {
    while (!part.empty()) {
      const uint64_t n = std::min<uint64_t>(part.size(), kYieldBytes - slice_bytes);
      slice.push_back(part.subspan(0, n));
      slice_bytes += n;
      part.remove_prefix(n);
      if (slice_bytes == kYieldBytes) {
        if (absl::Status s = flush(); !s.ok()) return s;
      }
    }
  }
  if (!slice.empty()) return flush();
  return absl::OkStatus();
}

bool PriorityGate::HigherActive(const std::string& site, v1::PriorityClass cls) {
  const int rank = Rank(cls);
  absl::MutexLock lock(&mu_);
  auto it = links_.find(site);
  if (it == links_.end()) return false;
  for (int r = 0; r < rank; ++r) {
    if (it->second.active[r] > 0) return true;
  }
  return false;
}

int PriorityGate::ActiveCount(const std::string& site, v1::PriorityClass cls) {
  absl::MutexLock lock(&mu_);
  auto it = links_.find(site);
  return it == links_.end() ? 0 : it->second.active[Rank(cls)];
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
