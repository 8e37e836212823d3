#include "daemon/exchange/sender_set.h"

#include "daemon/exchange/deadline.h"

namespace longhaul::exchange {

SenderSet::SenderSet(const std::vector<std::string>& sites, const Clock& clock, SendFn send)
    : sites_(sites), clock_(clock) {
  statuses_.resize(sites.size());
  done_ = std::make_unique<std::atomic<bool>[]>(sites.size());
  for (size_t i = 0; i < sites.size(); ++i) {
    done_[i] = false;
    threads_.emplace_back([this, i, send] {
      statuses_[i] = send(sites_[i]);
      absl::MutexLock lock(&mu_);
      done_[i] = true;
      ++finished_;
    });
  }
}

SenderSet::~SenderSet() {
  for (auto& t : threads_) {
    if (t.joinable()) t.join();
  }
}

void SenderSet::Finish(Timestamp deadline, const std::function<void(const std::string&)>& cut) {
  {
    absl::MutexLock lock(&mu_);
    auto all = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return finished_ == threads_.size(); };
    AwaitUntil(mu_, absl::Condition(&all), clock_, deadline);
  }
  for (size_t i = 0; i < threads_.size(); ++i) {
    if (!done_[i]) cut(sites_[i]);
  }
  for (auto& t : threads_) t.join();
}

}  // namespace longhaul::exchange
