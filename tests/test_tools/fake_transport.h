// A transport::Transport over in-memory channel pairs (fake_channel.h), for
// tests that run a sender and a receiver in one process.
//
// Listen(address, handler) registers a handler for "host:port" (port 0 is
// given a port of its own). Dial(site, address) makes a channel pair: the
// dialer's end names `site` as its peer (the fake authenticates every dial),
// the other end names this transport's local site and goes to the handler
// registered for `address`, on a thread of its own, as the tcp transport
// does. A dial to an address nobody listens on is Unavailable ("connection
// refused"); RefuseDials and set_dial_hook make dials fail on purpose.
//
// Thread-safe. Shutdown (and the destructor) aborts every channel it made
// and waits for the handlers to return, so handlers must return once their
// channel fails; neither may be called from a handler.
#ifndef LONGHAUL_TESTS_TEST_TOOLS_FAKE_TRANSPORT_H_
#define LONGHAUL_TESTS_TEST_TOOLS_FAKE_TRANSPORT_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "daemon/transport/transport.h"
#include "tests/test_tools/fake_channel.h"

namespace longhaul::transport::testing {

class FakeTransport final : public Transport {
 public:
  // Called before each dial, outside any lock (it may block to hold the
  // dial back); a non-OK status is the dial's answer.
  using DialHook = std::function<absl::Status(const std::string& site, const std::string& address)>;

  // `local_site`: the peer_site the handlers' ends report.
  explicit FakeTransport(std::string local_site);
  ~FakeTransport() override;

  // Transport
  absl::StatusOr<std::unique_ptr<Channel>> Dial(const std::string& site,
                                                const std::string& address) override;
  absl::Status Listen(const std::string& address, ChannelHandler on_channel) override;
  // The port of the last Listen.
  uint16_t listen_port() const override;
  void Shutdown() override;

  // Every dial fails with `status` (and counts) until called again with OK.
  void RefuseDials(absl::Status status);
  void set_dial_hook(DialHook hook);

  // Dials asked for so far, refused ones included.
  int dials() const;
  // Waits until `n` dials were asked for; false if `timeout` passed first.
  bool WaitForDials(int n, absl::Duration timeout) const;

 private:
  const std::string local_site_;
  mutable absl::Mutex mu_;
  std::map<std::string, ChannelHandler> handlers_ ABSL_GUARDED_BY(mu_);
  uint16_t last_port_ ABSL_GUARDED_BY(mu_) = 0;
  uint16_t next_port_ ABSL_GUARDED_BY(mu_) = 40000;
  absl::Status refusal_ ABSL_GUARDED_BY(mu_);
  DialHook hook_ ABSL_GUARDED_BY(mu_);
  int dials_ ABSL_GUARDED_BY(mu_) = 0;
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::weak_ptr<FakeConnection>> connections_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread> handler_threads_ ABSL_GUARDED_BY(mu_);
};

}  // namespace longhaul::transport::testing

#endif  // LONGHAUL_TESTS_TEST_TOOLS_FAKE_TRANSPORT_H_
