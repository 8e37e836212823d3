#include "tests/test_tools/fake_transport.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/host_port.h"

namespace longhaul::transport::testing {

FakeTransport::FakeTransport(std::string local_site) : local_site_(std::move(local_site)) {}

FakeTransport::~FakeTransport() { Shutdown(); }

absl::StatusOr<std::unique_ptr<Channel>> FakeTransport::Dial(const std::string& site,
                                                             const std::string& address) {
  DialHook hook;
  {
    absl::MutexLock lock(&mu_);
    ++dials_;
    if (shut_down_) return absl::UnavailableError("transport is shut down");
    if (!refusal_.ok()) return refusal_;
    hook = hook_;
  }
  if (hook) {
    if (absl::Status s = hook(site, address); !s.ok()) return s;
  }
  absl::MutexLock lock(&mu_);
  if (shut_down_) return absl::UnavailableError("transport is shut down");
  auto handler = handlers_.find(address);
  if (handler == handlers_.end()) {
    return absl::UnavailableError(
        absl::StrCat("connect to ", site, " at ", address, " failed: connection refused"));
  }
  ChannelPair pair = MakeChannelPair(site, address, local_site_, "fake:" + local_site_);
  connections_.push_back(pair.a->connection());
  handler_threads_.emplace_back(
      [on_channel = handler->second, accepted = std::move(pair.b)]() mutable {
        on_channel(std::move(accepted));
      });
  return std::unique_ptr<Channel>(std::move(pair.a));
}

absl::Status FakeTransport::Listen(const std::string& address, ChannelHandler on_channel) {
  absl::StatusOr<HostPort> parsed = ParseHostPort(address);
  if (!parsed.ok()) return parsed.status();
  absl::MutexLock lock(&mu_);
  if (shut_down_) return absl::FailedPreconditionError("transport is shut down");
  uint16_t port = parsed->port != 0 ? parsed->port : next_port_++;
  const std::string bound = absl::StrCat(parsed->host, ":", port);
  if (!handlers_.emplace(bound, std::move(on_channel)).second) {
    return absl::AlreadyExistsError(absl::StrCat(bound, " is in use"));
  }
  last_port_ = port;
  return absl::OkStatus();
}

uint16_t FakeTransport::listen_port() const {
  absl::MutexLock lock(&mu_);
  return last_port_;
}

void FakeTransport::Shutdown() {
  std::vector<std::thread> threads;
  {
    absl::MutexLock lock(&mu_);
    shut_down_ = true;
    handlers_.clear();
    for (const std::weak_ptr<FakeConnection>& weak : connections_) {
      if (std::shared_ptr<FakeConnection> connection = weak.lock()) {
        FakeChannel::AbortConnection(*connection);
      }
    }
    connections_.clear();
    threads.swap(handler_threads_);
  }
  for (std::thread& t : threads) t.join();
}

void FakeTransport::RefuseDials(absl::Status status) {
  absl::MutexLock lock(&mu_);
  refusal_ = std::move(status);
}

void FakeTransport::set_dial_hook(DialHook hook) {
  absl::MutexLock lock(&mu_);
  hook_ = std::move(hook);
}

int FakeTransport::dials() const {
  absl::MutexLock lock(&mu_);
  return dials_;
}

bool FakeTransport::WaitForDials(int n, absl::Duration timeout) const {
  absl::MutexLock lock(&mu_);
  auto reached = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return dials_ >= n; };
  return mu_.AwaitWithTimeout(absl::Condition(&reached), timeout);
}

}  // namespace longhaul::transport::testing
