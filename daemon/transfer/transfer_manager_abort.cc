// TransferManager: cancels whose destination did not confirm that it dropped
// the staging (unreachable, restarting or failing when the cancel came) are
// asked again until it does; after a restart, those of every transfer
// cancelled within the last incoming expiry (see Start).
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "common/fmt_absl.h"
#include "daemon/transfer/transfer_manager.h"
#include "spdlog/spdlog.h"

namespace longhaul::daemon {

std::string TransferManager::DestinationOf(const v1::OutgoingTransfer& record,
                                           const std::string& transfer_id) {
  if (record.legs_size() == 0) return transfer_id == record.id() ? record.spec().dest_site() : "";
  for (const v1::FanoutLeg& leg : record.legs()) {
    if (leg.transfer_id() == transfer_id) return leg.destination().site();
  }
  return "";
}

std::vector<std::string> TransferManager::AbortedAt(const v1::OutgoingTransfer& record) {
  if (record.legs_size() == 0) return {record.id()};
  std::vector<std::string> ids;
  for (const v1::FanoutLeg& leg : record.legs()) {
    if (leg.state() != v1::COMPLETED) ids.push_back(leg.transfer_id());
  }
  return ids;
}

void TransferManager::AbortRetryLoop() {
  while (true) {
    RetryPendingAborts();
    absl::MutexLock lock(&mu_);
    if (mu_.AwaitWithTimeout(absl::Condition(&shutting_down_), kAbortRetry)) return;
  }
}

void TransferManager::RetryPendingAborts() {
  struct Pending {
    std::string id;           // the transfer here
    std::string site;         // a destination of it
    std::string transfer_id;  // the transfer there
  };
  std::vector<Pending> pending;
  {
    absl::MutexLock lock(&mu_);
    // An incoming expiry after the cancel the destination has expired the
    // staging itself: no need to ask any more.
    const int64_t recent_ms =
        absl::ToUnixMillis(clock_.WallNow()) - config_.peer_limits.incoming_expiry_us / 1000;
    for (auto it = aborts_pending_.begin(); it != aborts_pending_.end();) {
      const Transfer& t = *transfers_.at(it->first);
      if (t.record.finished_unix_ms() < recent_ms) {
        aborts_pending_.erase(it++);
        continue;
      }
      for (const std::string& transfer_id : it->second) {
        pending.push_back({it->first, DestinationOf(t.record, transfer_id), transfer_id});
      }
      ++it;
    }
  }
  for (const Pending& p : pending) {
    // No such destination any more: nobody to ask.
    if (!p.site.empty()) {
      absl::StatusOr<bool> published = AbortRemote(p.site, p.transfer_id);
      if (!published.ok()) {
        spdlog::debug("transfer {}: {} has not confirmed the abort yet: {}", p.id, p.site,
                      published.status().message());
        continue;
      }
      if (*published) {
        spdlog::warn("transfer {}: {} had published it before the abort reached it", p.id, p.site);
      } else {
        spdlog::info("transfer {}: {} confirmed the abort; its staging there is removed", p.id,
                     p.site);
      }
    }
    absl::MutexLock lock(&mu_);
    if (shutting_down_) return;
    auto it = aborts_pending_.find(p.id);
    if (it == aborts_pending_.end()) continue;
    std::vector<std::string>& there = it->second;
    there.erase(std::remove(there.begin(), there.end(), p.transfer_id), there.end());
    if (there.empty()) aborts_pending_.erase(it);
  }
}

}  // namespace longhaul::daemon
