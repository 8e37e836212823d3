#ifndef LONGHAUL_DAEMON_EXCHANGE_MAILBOX_H_
#define LONGHAUL_DAEMON_EXCHANGE_MAILBOX_H_

// Where arriving exchange messages wait for the operation that takes them:
// complete messages by key, the buffers that waiting Recvs offer, the
// payload bytes held and each sender's share of them (proto/EXCHANGE.md,
// Limits), and a pool of spare payload buffers.
//
// Receiving in place. A Recv that is already waiting when its message starts
// to arrive offers its buffer (a Landing): the link's reader reads the
// payload straight into it, so nothing is copied once the last byte is in.
// A message that arrives first, or does not fit the waiting buffer, is
// assembled in a hub buffer (an Arrival's payload) and copied out by the
// Recv that takes it. Landing says who may touch an offered buffer when.
//
// Not thread-safe, except BufferPool and Unclaimed. The hub keeps the
// mailbox under its state mutex (HubState::mu), shared with Membership and
// the operations: an operation waits on one condition that spans all three
// (its messages are here, or its group moved on, or it was cancelled), and
// admitting a message and filing it must be one step against a Join that
// drops what non-members left. The calls that wait or unlock take that
// mutex as `mu`.

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "common/clock.h"
#include "common/units.h"
#include "daemon/exchange/exchange_types.h"
#include "daemon/exchange/peer_reader.h"
#include "daemon/peer/memory_budget.h"
#include "daemon/transport/transport.h"
#include "longhaul/shm_progress.h"
#include "longhaul/v1/exchange.pb.h"

namespace longhaul::exchange {

// After an op gives up, how long its senders (and a peer feeding a Recv's
// buffer) may take to reach a segment boundary before their links are cut.
inline constexpr TimeDelta kSenderGrace = TimeDelta::Seconds(2);
// A segment read into a waiting Recv's buffer goes in pieces of this size: a
// Recv that ends mid-message waits for the piece being read, so unless the
// link is below ~1 Mbit/s that takes well under kSenderGrace, after which
// the link would be cut.
inline constexpr uint64_t kInPlacePieceBytes = 256 << 10;

// A sender's unclaimed messages. Thread-safe.
struct PeerUse {
  std::atomic<uint32_t> messages{0};
};

// One unclaimed message's share of its sender's limits, returned when it
// goes. Thread-safe: no lock needed.
class Unclaimed {
 public:
  Unclaimed() = default;
  Unclaimed(peer::MemoryReservation bytes, std::shared_ptr<PeerUse> use);
  Unclaimed(Unclaimed&& other) noexcept = default;
  Unclaimed& operator=(Unclaimed&& other) noexcept;
  ~Unclaimed() { Reset(); }

  void Reset();

 private:
  peer::MemoryReservation bytes_;
  std::shared_ptr<PeerUse> use_;
};

struct Message {
  std::string from;
  v1::ExchangePeerMessage header;
  Payload payload;
  Unclaimed claim;
};

// A waiting Recv's buffer, offered to the next message under its key so the
// link's reader fills it in place. Every field is guarded by the state mutex.
//
// Lifetime contract (the Recv unmaps `out` once it returns):
//  - The reader writes into `out` only while `writing` is set (one piece of
//    at most kInPlacePieceBytes), and sets it only in kFilling, under mu.
//  - Only the Recv moves the landing out of kWaiting into kHandingOver or
//    kWithdrawn (Withdraw). From kHandingOver on, the reader starts no write
//    into `out` and waits for kWithdrawn before it touches the message again;
//    the Recv waits for `writing` to clear before it returns.
// So once Withdraw has returned, nothing but the Recv's thread uses `out`.
struct Landing {
  enum class State {
    kWaiting,      // offered, no message bound
    kFilling,      // bound to a message whose segments are arriving
    kComplete,     // the whole bound message is in `out`
    kHandingOver,  // the Recv is leaving; the reader must not start a write
    kWithdrawn,    // the Recv left; the reader continues in `spill`
  };
  std::string key;
  absl::Span<uint8_t> out;
  State state = State::kWaiting;
  std::string from;                // sender of the bound message
  v1::ExchangePeerMessage header;  // of the bound message
  uint64_t filled = 0;             // bytes of the bound message in `out`
  // Where the Recv's client learns what has landed (same lifetime as
  // `out`), and the epoch of the bound message there: a new one for every
  // message bound, since a message that replaces an unbound one rewrites
  // `out` from its start.
  std::optional<shm::ProgressWord> progress;
  uint32_t epoch = 0;
  bool writing = false;                   // the reader is reading a segment into `out`
  transport::Channel* channel = nullptr;  // that reader's link; valid while `writing`
  // kWithdrawn: the bytes that arrived and room for the rest (counted in
  // the buffered bytes); empty when the memory limit dropped the message.
  std::optional<Payload> spill;
  Unclaimed spill_claim;  // the spilled message's share of its sender's limits

  // Publishes `filled` to the client. Only while the Recv has not left
  // (state before kWithdrawn), under the state mutex.
  void Publish() {
    if (progress) progress->PublishLanded({epoch, filled});
  }
};

// A message with payload whose segments are arriving on one link; only that
// link's reader holds it. Its payload bytes are counted in the buffered
// bytes; one read into a Recv's buffer (`landing`) has no payload and is
// not counted.
struct Arrival : InboundSink::Incoming {
  std::string from;
  v1::ExchangePeerMessage header;
  Payload payload;
  bool dropped = false;  // refused or not admitted: read and discarded
  std::shared_ptr<Landing> landing;
  Unclaimed claim;  // while in a hub buffer
};

// Payload buffers of taken messages kept for the next ones: faulting in and
// zeroing fresh pages costs more CPU than the copy itself. Thread-safe.
class BufferPool {
 public:
  static constexpr uint64_t kSpareBytes = 256ull << 20;
  static constexpr uint64_t kMinSpareBytes = 1ull << 20;  // smaller ones: malloc is cheap

  // A buffer of `bytes`, reused from a spare if one fits and is not much
  // larger (its pages are already mapped). Not zeroed.
  Payload Take(uint64_t bytes);
  // Keeps `payload` for reuse (up to kSpareBytes in all), or frees it.
  void Recycle(Payload payload);

 private:
  absl::Mutex mu_;
  std::vector<Payload> spare_ ABSL_GUARDED_BY(mu_);
  uint64_t spare_bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

class Mailbox {
 public:
  // `clock` (not owned) times the grace of Withdraw.
  Mailbox(std::string local_site, const HubOptions& options, BufferPool* pool, const Clock& clock)
      : local_site_(std::move(local_site)), options_(options), pool_(pool), clock_(clock) {}

  // The key messages are filed and offered buffers are waiting under.
  static std::string Key(absl::string_view group, int kind, absl::string_view from,
                         absl::string_view id);

  bool Has(const std::string& key) const;
  // The first message under `key`, or null.
  const Message* Front(const std::string& key) const;
  // Removes and returns the first message under `key` (which Has); its
  // bytes stop counting as buffered.
  Message Take(const std::string& key);
  void File(const std::string& key, Message message);
  // Drops every message under `key`.
  void Erase(const std::string& key);
  // Removes the messages `drop` selects (their bytes go back to their
  // senders' budgets).
  void DropIf(absl::FunctionRef<bool(const Message&)> drop);

  // Counts a message of `bytes` from `from` that no operation has asked for
  // against from's limits; ResourceExhausted (and nothing counted) past one.
  absl::StatusOr<Unclaimed> TryClaim(const std::string& from, uint64_t bytes);
  // Counts `bytes` as buffered unless that would pass max_buffered_bytes.
  bool TryBuffer(uint64_t bytes);
  void Unbuffer(uint64_t bytes) { buffered_bytes_ -= bytes; }

  // Offers a Recv's buffer under landing->key, behind the ones waiting.
  void Offer(std::shared_ptr<Landing> landing);
  bool HasWaiting(const std::string& key) const { return waiting_.contains(key); }
  // The first buffer waiting under `key`, now bound to the arriving message
  // `header` from `from`, if it fits it and no earlier message is filed
  // there for that Recv to take first; else null.
  std::shared_ptr<Landing> Bind(const std::string& key, const std::string& from,
                                const v1::ExchangePeerMessage& header);
  // Recv calls waiting with their buffer offered to a message not yet begun.
  size_t waiting() const;
  uint32_t unclaimed_messages(const std::string& site) const;
  // Whole messages filed and not taken.
  size_t held() const;

  // Ends the offer of a Recv's buffer; afterwards the hub never touches
  // `landing.out`. Returns true if a whole message landed in it first. May
  // wait for the piece being read into it (cutting the link if that stalls)
  // and release `mu` while it copies a partly arrived message out.
  bool Withdraw(Landing& landing, absl::Mutex& mu) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

  // The reader's side of an Arrival. Settle brings one that fills a Recv's
  // buffer up to date: waits out a Recv that is handing it over, and once
  // the Recv has left carries on in the buffer it handed over. Afterwards
  // a.landing is null or kFilling.
  void Settle(Arrival& a, absl::Mutex& mu) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Where the next piece of [received, end) of `a` goes, in place or in its
  // payload; nullopt when it is dropped.
  std::optional<absl::Span<uint8_t>> Into(Arrival& a, uint64_t received, uint64_t end,
                                          transport::Channel& channel, absl::Mutex& mu)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // After a read of `bytes` into what Into gave; returns the bytes that
  // landed in a Recv's buffer.
  uint64_t Read(Arrival& a, uint64_t bytes, bool ok);
  // `a` will not complete: a Recv it was filling waits on, first in line for
  // the next message; a hub buffer's bytes stop counting.
  void Abandon(Arrival& a, absl::Mutex& mu) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

  BufferPool& pool() { return *pool_; }

 private:
  const std::string local_site_;
  const HubOptions options_;
  BufferPool* const pool_;
  const Clock& clock_;
  // Complete messages by Key(); FIFO per key.
  absl::flat_hash_map<std::string, std::deque<Message>> messages_;
  // Buffers of waiting Recvs not yet bound to a message, by Key(); FIFO per key.
  absl::flat_hash_map<std::string, std::deque<std::shared_ptr<Landing>>> waiting_;
  // Unclaimed messages by sender site.
  absl::flat_hash_map<std::string, std::shared_ptr<PeerUse>> unclaimed_;
  uint64_t buffered_bytes_ = 0;
};

}  // namespace longhaul::exchange

#endif  // LONGHAUL_DAEMON_EXCHANGE_MAILBOX_H_
