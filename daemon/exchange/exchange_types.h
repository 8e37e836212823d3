#ifndef LONGHAUL_DAEMON_EXCHANGE_EXCHANGE_TYPES_H_
#define LONGHAUL_DAEMON_EXCHANGE_EXCHANGE_TYPES_H_

// The values the exchange pieces pass between them and return to callers:
// options, the arguments of an operation and its result, and the buffer a
// message's payload is held in. The protocol is in proto/EXCHANGE.md.

#include <cstdint>
#include <functional>
#include <memory>
#include <new>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/units.h"
#include "daemon/peer/memory_budget.h"
#include "longhaul/shm_progress.h"
#include "longhaul/v1/exchange.pb.h"

namespace longhaul::exchange {

// The largest segment of a message's payload (proto/EXCHANGE.md, Segments).
inline constexpr uint64_t kSegmentBytes = 4ull << 20;

// Allocates without value-initializing: a message buffer is always filled
// from the network before it is read, so zeroing it first is wasted work.
template <typename T>
struct DefaultInitAllocator : std::allocator<T> {
  template <typename U>
  struct rebind {
    using other = DefaultInitAllocator<U>;
  };
  using std::allocator<T>::allocator;
  template <typename U>
  void construct(U* p) noexcept {
    ::new (static_cast<void*>(p)) U;
  }
  template <typename U, typename... Args>
  void construct(U* p, Args&&... args) {
    ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
  }
};
using Payload = std::vector<uint8_t, DefaultInitAllocator<uint8_t>>;

struct HubOptions {
  // Payload bytes the hub holds for messages not yet taken by an operation.
  uint64_t max_buffered_bytes = 8ull << 30;
  // Largest single message (one all-reduce contribution, one send).
  uint64_t max_message_bytes = 4ull << 30;
  // Messages from one peer site that no operation has asked for yet.
  uint32_t max_unclaimed_messages_per_peer = 4096;
  // Not owned, may be null (no byte limit per peer): the bytes of a peer's
  // unclaimed messages are reserved here under its site while they wait.
  peer::PeerMemoryBudget* memory_budget = nullptr;
  // This site's uplink rate (config link.bandwidth): each exchange link is
  // paced at most at it, and the links a collective sends on at once share
  // it (Links, Pacing). Zero: unpaced.
  Bandwidth uplink = Bandwidth::Zero();
  // false: all-reduces of three or more members run as the direct all-to-all
  // exchange instead of sharded (every member must agree; for comparisons).
  bool sharded_all_reduce = true;
};

struct OpResult {
  absl::Status status;
  std::string lost_peer;  // set when `status` is the loss of this peer
  v1::OpStats stats;
  uint64_t bytes = 0;  // Recv: length of the message received
  v1::GroupView view;  // the group after the op
};

struct AllReduceArgs {
  std::string group;
  std::string op_id;
  uint64_t seq = 0;
  v1::ExchangeDType dtype = v1::FLOAT32;
  v1::ReduceOp op = v1::SUM;
  bool quantize_int8 = false;
  std::string tag;
  absl::Duration timeout = absl::Seconds(60);
  // Polled while waiting: true once the client has gone away.
  std::function<bool()> client_gone;
  // A streamed buffer's progress word (longhaul/shm_progress.h), as
  // P2PArgs::progress for a Send: the client is still writing the buffer,
  // and each segment is read once the word says it is written.
  std::optional<shm::ProgressWord> progress = std::nullopt;
};

// An all-gather or a broadcast (proto/EXCHANGE.md, All-gather, Broadcast).
struct GatherArgs {
  std::string group;
  std::string op_id;
  uint64_t seq = 0;  // shared with the all-reduces: one counter per group
  std::string tag;
  std::string root;  // Broadcast: the member whose buffer every member gets
  absl::Duration timeout = absl::Seconds(60);
  // Polled while waiting: true once the client has gone away.
  std::function<bool()> client_gone;
};

struct P2PArgs {
  std::string group;
  std::string op_id;
  std::string peer;
  std::string tag;
  absl::Duration timeout = absl::Seconds(60);
  std::function<bool()> client_gone;
  // A streamed buffer's progress word (longhaul/shm_progress.h); it lives as
  // long as the buffer. Send: the client is still writing the buffer, and
  // each segment goes out once the word says it is written; a client that
  // has not written it all by the timeout fails the call. Recv: the hub
  // publishes in it what has landed in the buffer.
  std::optional<shm::ProgressWord> progress = std::nullopt;
};

}  // namespace longhaul::exchange

#endif  // LONGHAUL_DAEMON_EXCHANGE_EXCHANGE_TYPES_H_
