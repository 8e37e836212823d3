#ifndef LONGHAUL_CLIENT_INCLUDE_LONGHAUL_EXCHANGE_H_
#define LONGHAUL_CLIENT_INCLUDE_LONGHAUL_EXCHANGE_H_

// Memory-to-memory exchange between sites through the local daemon: join a
// named group of sites, send and receive buffers by tag, all-reduce.
//
// Buffers reach the daemon through shared memory (sealed memfd segments the
// group owns, lends the daemon over its segment socket and reuses), never
// through gRPC. The segments are sealed against shrinking, so nothing done
// to them in this process can make the daemon fault; the daemons move them
// between sites on their encrypted peer links. Send, Recv and AllReduce
// stream through the segment: the daemon sends (and reduces) what the client
// has copied in so far, and a Recv copies out what has landed while the rest
// arrives, so the copies overlap the transfer (longhaul/shm_progress.h).
//
//   auto group = longhaul::ExchangeGroup::Join("unix:/run/longhaul/control.sock",
//                                              "run42", {"site-a", "site-b"}, absl::Seconds(30));
//   auto work = (*group)->AllReduce(grads.data(), grads.size(), longhaul::DType::kFloat32,
//                                   {.op = longhaul::ReduceOp::kAvg});
//   absl::Status s = work->Wait();
//   if (longhaul::IsPeerLost(s)) { /* retry: the group moved to the next generation */ }
//
// Collective calls (AllReduce, AllGather, Broadcast) must be issued in the
// same order at every site of the group: they are matched by their position
// in that order (one counter for all three).

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace longhaul {

enum class DType { kFloat32, kBFloat16, kFloat16 };
enum class ReduceOp { kSum, kAvg };

size_t ElementSize(DType dtype);

struct AllReduceOptions {
  ReduceOp op = ReduceOp::kSum;
  // Opt-in lossy compression on the wire: int8 codes with a float32 min and
  // step per block of 256 elements. Results stay identical at every site.
  bool quantize_int8 = false;
  // How long the daemon waits for the other sites before giving up.
  absl::Duration timeout = absl::Seconds(60);
  // Optional name every site must pass for the same call; a mismatch is an
  // error instead of a silent mix of different steps' data.
  std::string tag;
};

// Options of AllGather and Broadcast.
struct CollectiveOptions {
  // How long the daemon waits for the other sites before giving up.
  absl::Duration timeout = absl::Seconds(60);
  // Optional name every site must pass for the same call.
  std::string tag;
};

struct ExchangeStats {
  uint64_t bytes_sent = 0;      // payload bytes put on peer links by the local daemon
  uint64_t bytes_received = 0;  // payload bytes received from peers
  uint32_t peers = 0;
  double seconds = 0;           // wall time of the call, client side
  uint64_t generation = 0;      // group generation the call ran at
};

// A retryable error caused by a peer site dropping out of the group: the
// status is Unavailable and names the peer. The group has moved to the next
// generation without it; the next call runs with the remaining sites.
bool IsPeerLost(const absl::Status& status);
// The site named by a peer-lost status; empty for any other status.
std::string LostPeer(const absl::Status& status);

// The handle of an operation in flight. Thread-safe.
class ExchangeWork {
 public:
  virtual ~ExchangeWork() = default;
  // Waits for the result up to `timeout`. If it is not done by then,
  // returns DeadlineExceeded and the operation keeps running.
  virtual absl::Status Wait(absl::Duration timeout = absl::InfiniteDuration()) = 0;
  // True once the operation has finished (successfully or not).
  virtual bool Test() = 0;
  // Asks the daemon to stop the operation; Wait then returns Cancelled
  // (unless it finished first). The other sites' calls fail too.
  virtual void Cancel() = 0;
  // Meaningful once finished.
  virtual ExchangeStats Stats() = 0;
};

// Membership of this site in a named group of sites. Thread-safe; the
// buffers passed to an operation belong to the caller and must stay valid
// and untouched until its work has finished (Wait returned a final result or
// Test returned true).
class ExchangeGroup {
 public:
  // Joins `name` with `sites` (every member, this site included). Waits up
  // to `deadline` for every site to join; the group then has a generation
  // number agreed by all its members.
  static absl::StatusOr<std::unique_ptr<ExchangeGroup>> Join(const std::string& daemon_address,
                                                             const std::string& name,
                                                             std::vector<std::string> sites,
                                                             absl::Duration deadline);
  ~ExchangeGroup();  // leaves the group; waits for operations still in flight

  // In-place all-reduce of `count` elements at `data`. `data` is read while
  // the call runs and written only once it has succeeded: after a failure
  // it still holds its input, so a peer-lost all-reduce can be retried with
  // it as it is.
  std::unique_ptr<ExchangeWork> AllReduce(void* data, size_t count, DType dtype,
                                          const AllReduceOptions& options = {});
  // Blocking helpers.
  absl::Status AllReduceSync(void* data, size_t count, DType dtype,
                             const AllReduceOptions& options = {});

  // All-gather: every member passes `bytes` at `data` (the same length
  // everywhere); `out` (`out_capacity` bytes, at least members().size() x
  // `bytes`) receives every member's buffer, concatenated in sorted member
  // order, identical at every member. On success Stats().peers + 1 buffers
  // were gathered (the group may have shrunk since members() was read); on
  // failure `out` is untouched.
  std::unique_ptr<ExchangeWork> AllGather(const void* data, size_t bytes, void* out,
                                          size_t out_capacity,
                                          const CollectiveOptions& options = {});
  absl::Status AllGatherSync(const void* data, size_t bytes, void* out, size_t out_capacity,
                             const CollectiveOptions& options = {});
  // Broadcast: the `bytes` at `data` of the member `root` end up,
  // bit-identical, at `data` of every member (each passes the same length).
  // The root sends its buffer to every other member directly. On failure a
  // non-root's `data` is untouched.
  std::unique_ptr<ExchangeWork> Broadcast(void* data, size_t bytes, const std::string& root,
                                          const CollectiveOptions& options = {});
  absl::Status BroadcastSync(void* data, size_t bytes, const std::string& root,
                             const CollectiveOptions& options = {});

  // Sends `bytes` at `data` to `site` under `tag`; returns once they are on
  // the link to that site.
  absl::Status Send(const std::string& site, const std::string& tag, const void* data,
                    size_t bytes, absl::Duration timeout = absl::Seconds(60));
  // Receives the next message from `site` under `tag` into `data` (capacity
  // `bytes`); returns its length. The message is copied into `data` while it
  // arrives, so after a failed Recv `data` may hold part of a message.
  absl::StatusOr<size_t> Recv(const std::string& site, const std::string& tag, void* data,
                              size_t bytes, absl::Duration timeout = absl::Seconds(60));
  std::unique_ptr<ExchangeWork> SendAsync(const std::string& site, const std::string& tag,
                                          const void* data, size_t bytes,
                                          absl::Duration timeout = absl::Seconds(60));
  // Stats() of the returned work gives the received length in bytes_received.
  std::unique_ptr<ExchangeWork> RecvAsync(const std::string& site, const std::string& tag,
                                          void* data, size_t bytes,
                                          absl::Duration timeout = absl::Seconds(60));

  const std::string& name() const;
  const std::string& local_site() const;
  // As of the last call's answer (or the join).
  uint64_t generation() const;
  std::vector<std::string> members() const;

  struct Impl;

 private:
  explicit ExchangeGroup(std::shared_ptr<Impl> impl);
  std::shared_ptr<Impl> impl_;
};

}  // namespace longhaul

#endif  // LONGHAUL_CLIENT_INCLUDE_LONGHAUL_EXCHANGE_H_
