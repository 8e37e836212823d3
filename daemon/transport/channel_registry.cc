#include "daemon/transport/channel_registry.h"

#include <utility>

#include "common/check.h"

namespace longhaul::transport {

ChannelRegistry::Registration::Registration(Registration&& other) noexcept
    : registry_(std::exchange(other.registry_, nullptr)),
      channel_(std::exchange(other.channel_, nullptr)) {}

ChannelRegistry::Registration& ChannelRegistry::Registration::operator=(
    Registration&& other) noexcept {
  if (this != &other) {
    Reset();
    registry_ = std::exchange(other.registry_, nullptr);
    channel_ = std::exchange(other.channel_, nullptr);
  }
  return *this;
}

void ChannelRegistry::Registration::Reset() {
  if (registry_ == nullptr) return;
  std::exchange(registry_, nullptr)->Remove(std::exchange(channel_, nullptr));
}

ChannelRegistry::~ChannelRegistry() {
  absl::MutexLock lock(&mu_);
  LONGHAUL_CHECK(channels_.empty()) << channels_.size() << " channels still registered";
}

ChannelRegistry::Registration ChannelRegistry::Add(Channel& channel) {
  absl::MutexLock lock(&mu_);
  if (closed_) return Registration();
  LONGHAUL_CHECK(channels_.insert(&channel).second) << "channel registered twice";
  return Registration(this, &channel);
}

void ChannelRegistry::Remove(Channel* channel) {
  absl::MutexLock lock(&mu_);
  channels_.erase(channel);
}

void ChannelRegistry::AbortAll() {
  absl::MutexLock lock(&mu_);
  for (Channel* channel : channels_) channel->Abort();
}

void ChannelRegistry::Close() {
  absl::MutexLock lock(&mu_);
  closed_ = true;
  for (Channel* channel : channels_) channel->Abort();
}

void ChannelRegistry::ForEach(absl::FunctionRef<void(Channel&)> fn) {
  absl::MutexLock lock(&mu_);
  for (Channel* channel : channels_) fn(*channel);
}

bool ChannelRegistry::empty() const {
  absl::MutexLock lock(&mu_);
  return channels_.empty();
}

void ChannelRegistry::WaitUntilEmpty() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](absl::flat_hash_set<Channel*>* channels) { return channels->empty(); }, &channels_));
}

}  // namespace longhaul::transport
