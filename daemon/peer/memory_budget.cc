#include "daemon/peer/memory_budget.h"

#include <algorithm>
#include <cassert>
#include <utility>

namespace longhaul::peer {

PeerMemoryBudget::PeerMemoryBudget(uint64_t bytes_per_peer) : bytes_per_peer_(bytes_per_peer) {}

bool PeerMemoryBudget::TryReserve(absl::string_view site, uint64_t bytes) {
  absl::MutexLock lock(&mu_);
  uint64_t& used = used_[site];
  if (bytes > bytes_per_peer_ - used) return false;
  used += bytes;
  return true;
}

bool PeerMemoryBudget::Reserve(absl::string_view site, uint64_t bytes, absl::Duration wait) {
  absl::MutexLock lock(&mu_);
  // Looked up on every check: another site's first reservation may rehash
  // the map while this one waits.
  auto fits = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return bytes <= bytes_per_peer_ - used_[site];
  };
  if (!fits()) {
    ++waiting_;
    const bool fit = mu_.AwaitWithTimeout(absl::Condition(&fits), wait);
    --waiting_;
    if (!fit) return false;
  }
  used_[site] += bytes;
  return true;
}

int PeerMemoryBudget::waiting() const {
  absl::MutexLock lock(&mu_);
  return waiting_;
}

void PeerMemoryBudget::Release(absl::string_view site, uint64_t bytes) {
  absl::MutexLock lock(&mu_);
  auto it = used_.find(site);
  assert(it != used_.end() && it->second >= bytes);
  if (it == used_.end()) return;
  it->second -= std::min(it->second, bytes);
}

uint64_t PeerMemoryBudget::used(absl::string_view site) const {
  absl::MutexLock lock(&mu_);
  auto it = used_.find(site);
  return it == used_.end() ? 0 : it->second;
}

MemoryReservation MemoryReservation::TryTake(PeerMemoryBudget* budget, absl::string_view site,
                                             uint64_t bytes) {
  MemoryReservation r;
  if (!budget->TryReserve(site, bytes)) return r;
  r.budget_ = budget;
  r.site_ = std::string(site);
  r.bytes_ = bytes;
  return r;
}

MemoryReservation::MemoryReservation(MemoryReservation&& other) noexcept
    : budget_(std::exchange(other.budget_, nullptr)),
      site_(std::move(other.site_)),
      bytes_(std::exchange(other.bytes_, 0)) {}

MemoryReservation& MemoryReservation::operator=(MemoryReservation&& other) noexcept {
  if (this != &other) {
    if (budget_ != nullptr) budget_->Release(site_, bytes_);
    budget_ = std::exchange(other.budget_, nullptr);
    site_ = std::move(other.site_);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

MemoryReservation::~MemoryReservation() {
  if (budget_ != nullptr) budget_->Release(site_, bytes_);
}

}  // namespace longhaul::peer
