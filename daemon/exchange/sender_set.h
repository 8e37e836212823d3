#ifndef LONGHAUL_DAEMON_EXCHANGE_SENDER_SET_H_
#define LONGHAUL_DAEMON_EXCHANGE_SENDER_SET_H_

// The senders of one all-reduce step: one thread per destination site, so
// the sends to different peers run at once (each on its own link).
//
// Not thread-safe; owned by the operation's thread. The send function runs
// on the sender threads and must stay valid, with whatever it reads, until
// Finish or the destructor has joined them.

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "common/units.h"

namespace longhaul::exchange {

class SenderSet {
 public:
  using SendFn = std::function<absl::Status(const std::string& site)>;
  // Starts `send(site)` for every one of `sites`. `clock` (not owned)
  // outlives the set.
  SenderSet(const std::vector<std::string>& sites, const Clock& clock, SendFn send);
  // Joins the senders (they must end on their own: see Finish).
  ~SenderSet();
  SenderSet(const SenderSet&) = delete;
  SenderSet& operator=(const SenderSet&) = delete;

  // Waits for every sender until `deadline`; calls `cut(site)` for each one
  // still running then (which must make its write fail), and joins all.
  void Finish(Timestamp deadline, const std::function<void(const std::string&)>& cut);

  // Each site's outcome, in `sites` order; valid after Finish.
  const std::vector<absl::Status>& statuses() const { return statuses_; }

 private:
  const std::vector<std::string> sites_;
  const Clock& clock_;
  std::vector<absl::Status> statuses_;
  std::unique_ptr<std::atomic<bool>[]> done_;
  std::vector<std::thread> threads_;
  absl::Mutex mu_;
  size_t finished_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace longhaul::exchange

#endif  // LONGHAUL_DAEMON_EXCHANGE_SENDER_SET_H_
