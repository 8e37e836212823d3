#ifndef LONGHAUL_DAEMON_EXCHANGE_EXCHANGE_HUB_H_
#define LONGHAUL_DAEMON_EXCHANGE_EXCHANGE_HUB_H_

// The daemon's exchange engine: named groups of sites, point-to-point
// messages by tag, and all-reduce, carried between daemons on EXCHANGE-role
// peer channels.
//
// Links. For every peer site the hub dials one outbound channel and only
// writes to it; the peer's dial of us is the inbound channel, which the hub
// only reads (ServeInbound, on the router's thread for that channel). So no
// channel is ever read and written by two threads. Writes to one outbound
// channel are serialized by its own mutex, one frame at a time.
//
// Wire. Every message is a CONTROL frame holding a v1::ExchangePeerMessage;
// a payload travels in segments of at most kSegmentBytes, each a frame
// followed by exactly `payload_bytes` raw bytes. Every length from the
// network is checked against the message's declared size and the hub's
// memory limit.
//
// Receiving in place. A Recv that is already waiting when its message starts
// to arrive offers its buffer: the inbound reader reads the payload segments
// straight into it, so nothing is copied once the last byte is in. A message
// that arrives first (or does not fit the waiting buffer) is assembled in a
// hub buffer and copied out by the Recv that takes it. See Landing in the .cc
// for who may touch an offered buffer when.
//
// Priority. While an operation sends to a peer it holds the `exchange` class
// on that link (PriorityGate), so bulk transfers there pause. A Send's write
// ends when its last bytes are in the socket buffer, up to a buffer's worth
// (two BDPs) before they are on the wire; the hub keeps the class held until
// the transport has sent them, or bulk traffic would share the link with the
// message's tail. Bytes already sent are ahead of anything sent later in the
// path's (FIFO) bottleneck queue, so the hold ends there, not a round trip
// later with the acknowledgements.
//
// Groups. Join sends JOIN (members, proposed generation) to every member and
// waits for every member's JOIN; the group forms at the largest proposal.
// When a member's link breaks, every group holding it drops it and moves to
// the next generation, so the next operation runs with the remaining sites;
// operations in flight that still needed the member fail with a retryable
// Unavailable error that names it (OpResult::lost_peer).
//
// All-reduce. Every member sends its whole buffer to every other member,
// then each reduces the same inputs in the same (sorted site) order, so the
// result is bit-identical everywhere (see reduce.h). A member that has every
// input sends DONE and waits for every other member's DONE; a member that
// gives up before its DONE (timeout, cancel, mismatch) sends ABORT instead,
// so the others fail too rather than finish an op it abandoned. (Only a
// member lost between its DONEs to different peers can still leave them
// with different outcomes; that needs consensus, which this does not run.) Operations are matched
// across sites by the client's sequence number, which every member must
// issue in the same program order.
//
// Membership. JOIN is taken from any configured peer whose proposal names
// both it and this site. Every other message for a group (data, DONE,
// ABORT, P2P) is taken only from a member of the group as formed here, or
// of the Join in progress here; before this site joins, it is held keyed by
// its sender (the authenticated site of the channel it came on, never a
// name inside the message), and when the group forms, what non-members and
// older generations left for it is dropped. So a site outside a group
// cannot fail, finish or feed that group's operations.
//
// Limits. A message no operation has asked for yet (zero-byte ones
// included) counts against its sender's limits until it is taken:
// HubOptions::max_unclaimed_messages_per_peer messages, and its bytes
// against the sender's share of HubOptions::memory_budget. Past either the
// message is read and discarded and the hub tells the sender (REFUSED, on
// the link to it if there is one and it is idle); a Send or AllReduce still
// sending that message fails with ResourceExhausted and the reason, and both
// sites log the refusal.
//
// Thread-safe. Calls block up to their deadline; they end early on
// Cancel(op_id), on a lost peer and on Shutdown.

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <list>
#include <memory>
#include <new>
#include <optional>
#include <utility>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "daemon/peer/memory_budget.h"
#include "daemon/peer/priority_gate.h"
#include "daemon/peer/rate_limiter.h"
#include "daemon/transport/transport.h"
#include "longhaul/shm_progress.h"
#include "longhaul/v1/exchange.pb.h"

namespace longhaul::exchange {

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
};

struct OpResult {
  absl::Status status;
  std::string lost_peer;  // set when `status` is the loss of this peer
  v1::OpStats stats;
  uint64_t bytes = 0;     // Recv: length of the message received
  v1::GroupView view;     // the group after the op
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

class ExchangeHub {
 public:
  // Opens an outbound EXCHANGE channel to a peer site (Hello already sent).
  using Dialer =
      std::function<absl::StatusOr<std::unique_ptr<transport::Channel>>(const std::string& site)>;

  // `peers` are the sites this daemon may exchange with (its configured
  // peers); `gate` (not owned, may be null) learns when exchanges use a link,
  // so bulk transfers on it yield; `limiter` (not owned, may be null) holds
  // the operators' caps: every payload segment is charged to the `exchange`
  // class cap and to the cap of the peer it goes to before it is written.
  ExchangeHub(std::string local_site, std::vector<std::string> peers, Dialer dialer,
              peer::PriorityGate* gate, HubOptions options = {},
              peer::RateLimiter* limiter = nullptr);
  ~ExchangeHub();
  ExchangeHub(const ExchangeHub&) = delete;
  ExchangeHub& operator=(const ExchangeHub&) = delete;

  // Reads an inbound EXCHANGE channel until it closes. Blocks.
  void ServeInbound(std::unique_ptr<transport::Channel> channel);

  absl::StatusOr<v1::GroupView> Join(const std::string& group, std::vector<std::string> sites,
                                     absl::Duration timeout);
  // Forgets the group and drops the messages held for it.
  void Leave(const std::string& group);
  absl::StatusOr<v1::GroupView> View(const std::string& group);

  // Reduces `buffer` (count elements of args.dtype) in place with the group.
  OpResult AllReduce(const AllReduceArgs& args, absl::Span<uint8_t> buffer);
  // Sends `data` to args.peer under args.tag; done once it is on the link.
  // With args.progress, reads each segment of `data` only once the client
  // has written it (a Send whose client stalls ends at its timeout, and the
  // peer drops what it got).
  OpResult Send(const P2PArgs& args, absl::Span<const uint8_t> data);
  // Waits for a message from args.peer under args.tag and puts it into `out`
  // (in place as it arrives when this call is already waiting). `out` stays
  // the caller's: the hub never touches it after Recv returns, whatever the
  // outcome. If the call ends (cancel, timeout, lost peer, shutdown) while a
  // message is arriving into `out`, it first waits for the piece being read
  // (256 KiB; if the peer stalls inside it for 2 s, the link is cut and the
  // peer lost); the part that arrived is then moved to a hub buffer and the
  // message kept for the next Recv, as if it had arrived before this one.
  // With args.progress, publishes there how much of the message has landed
  // in `out`, after each piece, so the client can copy it out early; the
  // last value before a successful return is {epoch, the message's length}.
  OpResult Recv(const P2PArgs& args, absl::Span<uint8_t> out);

  // Ends the operation `op_id` with Cancelled; false if it is not running.
  bool Cancel(const std::string& op_id);

  // Fails every operation, closes every link and makes ServeInbound return.
  // Idempotent.
  void Shutdown();

  const std::string& local_site() const { return local_site_; }

  // Payload bytes read straight into a waiting Recv's buffer so far (the
  // rest went through hub buffers and a copy).
  uint64_t bytes_received_in_place() const { return bytes_in_place_.load(); }
  // Recv calls waiting with their buffer offered to a message not yet begun.
  size_t receives_waiting();
  // Messages from `site` held for no operation yet (see Limits above).
  uint32_t unclaimed_messages(const std::string& site);
  // REFUSED notices this hub has received from its peers.
  uint64_t refusals_received() const { return refusals_received_.load(); }

 private:
  struct Outbound;
  struct Message;
  struct Landing;
  struct Assembly;
  struct Group;
  struct Op;
  struct Draining;
  struct PeerUse;
  class Unclaimed;
  struct Sending;

  absl::StatusOr<std::shared_ptr<Outbound>> LinkTo(const std::string& site);
  // Waits until payload[0, end) may be read; an error stops the message.
  using ReadyFn = std::function<absl::Status(uint64_t end)>;
  // Sends one message (header + payload in segments) on the calling thread.
  // Stops between segments (and while waiting for a rate cap) once `stop` is
  // set or `deadline` (on the hub's monotonic time line, see MonotonicNow in
  // exchange_hub.cc) has passed, or when `ready` (if set) fails, which it is
  // asked before each segment. A failed write breaks the link and loses the
  // peer.
  absl::Status SendMessage(const std::string& site, v1::ExchangePeerMessage header,
                           absl::Span<const uint8_t> payload, const std::atomic<bool>* stop,
                           absl::Time deadline = absl::InfiniteFuture(),
                           const ReadyFn& ready = nullptr);
  absl::Status ReadLoop(transport::Channel& channel);
  void Deliver(const std::string& from, v1::ExchangePeerMessage header, Payload payload,
               Unclaimed claim) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether a message from `from` with `header` may be kept (Membership).
  bool Admits(const std::string& from, const v1::ExchangePeerMessage& header) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Counts a message of `bytes` from `from` that no operation has asked for
  // against from's limits; ResourceExhausted (and nothing counted) past one.
  absl::StatusOr<Unclaimed> TryClaim(const std::string& from, uint64_t bytes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Logs (at most every few seconds per peer and limit) and tells `from`
  // that its message `msg_id` was dropped for `why`; never blocks.
  void Refuse(const std::string& from, uint64_t msg_id, const absl::Status& why);
  // A REFUSED notice from `from`: fails the Send still sending that message.
  void Refused(const std::string& from, const v1::ExchangePeerMessage& notice)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A buffer of `bytes` for an arriving message, reused from a message that
  // was taken if one is large enough (its pages are already mapped).
  Payload TakeBuffer(uint64_t bytes);
  // Keeps `payload` for reuse (up to kSpareBytes in all), or frees it.
  void Recycle(Payload payload) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void PeerLost(const std::string& site, const std::string& reason);
  // Keeps `scope` (a Send's hold on its link to `site`) until the link has
  // no unsent bytes, the link breaks, or kDrainLimit passes.
  void HoldUntilSent(const std::string& site, peer::PriorityGate::Scope scope);
  // The thread that releases those holds.
  void DrainLoop();
  // Ends the offer of a Recv's buffer; afterwards the hub never touches
  // `landing.out`. Returns true if a whole message landed in it first. May
  // wait for the segment being read into it (cutting the link if that
  // stalls) and release mu_ while it copies a partly arrived message out.
  bool Withdraw(Landing& landing) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The commit round of an all-reduce whose inputs are all here: sends DONE
  // and waits for every peer's DONE.
  absl::Status Commit(const AllReduceArgs& args, const std::string& what, uint64_t generation,
                      const std::vector<std::string>& peers, std::string* lost_peer);
  void SendAborts(const std::string& group, uint64_t generation, uint64_t seq,
                  const std::vector<std::string>& peers, const std::string& reason);

  // The first of `peers`' ABORTs of the all-reduce `seq_id` in `group`, or null.
  const Message* AbortFrom(const std::string& group, const std::string& seq_id,
                           const std::vector<std::string>& peers) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::shared_ptr<Op> StartOp(const std::string& op_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EndOp(const std::string& op_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  v1::GroupView ViewOf(const Group& g) const;
  // Builds the error of an op that saw its group move past `generation`.
  OpResult LostResult(const std::string& what, const Group& g, uint64_t generation) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  static std::string Key(absl::string_view group, int kind, absl::string_view from,
                         absl::string_view id);

  const std::string local_site_;
  const std::vector<std::string> peers_;
  const Dialer dialer_;
  peer::PriorityGate* const gate_;
  const HubOptions options_;
  peer::RateLimiter* const limiter_;
  std::atomic<uint64_t> next_msg_id_{1};

  absl::Mutex mu_;
  bool shutdown_ ABSL_GUARDED_BY(mu_) = false;
  absl::flat_hash_map<std::string, std::shared_ptr<Outbound>> outbound_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<transport::Channel*> inbound_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, std::unique_ptr<Group>> groups_ ABSL_GUARDED_BY(mu_);
  // Complete messages by Key(); FIFO per key.
  absl::flat_hash_map<std::string, std::deque<Message>> mailbox_ ABSL_GUARDED_BY(mu_);
  // Removes the unclaimed messages `drop` selects (their bytes go back to
  // their senders' budgets).
  void DropUnclaimedLocked(absl::FunctionRef<bool(const Message&)> drop)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Messages whose segments are still arriving, by "from/msg_id".
  absl::flat_hash_map<std::string, std::shared_ptr<Assembly>> assembling_ ABSL_GUARDED_BY(mu_);
  // Buffers of waiting Recvs not yet bound to a message, by Key(); FIFO per key.
  absl::flat_hash_map<std::string, std::deque<std::shared_ptr<Landing>>> waiting_
      ABSL_GUARDED_BY(mu_);
  std::atomic<uint64_t> bytes_in_place_{0};
  std::atomic<uint64_t> refusals_received_{0};
  // Unclaimed messages by sender site.
  absl::flat_hash_map<std::string, std::shared_ptr<PeerUse>> unclaimed_ ABSL_GUARDED_BY(mu_);
  // Messages of more than one segment being sent, by msg_id, so a REFUSED
  // notice can stop them.
  absl::flat_hash_map<uint64_t, std::shared_ptr<Sending>> sending_ ABSL_GUARDED_BY(mu_);
  uint64_t buffered_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  // Buffers of taken messages kept for the next ones (faulting in and
  // zeroing fresh pages costs more CPU than the copy itself).
  static constexpr uint64_t kSpareBytes = 256ull << 20;
  static constexpr uint64_t kMinSpareBytes = 1ull << 20;  // smaller ones: malloc is cheap
  std::vector<Payload> spare_ ABSL_GUARDED_BY(mu_);
  uint64_t spare_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<std::string, std::shared_ptr<Op>> ops_ ABSL_GUARDED_BY(mu_);
  absl::Mutex dial_mu_;  // one dial at a time, so a site gets one outbound link

  // Holds of finished Sends whose bytes are not all sent yet.
  absl::Mutex drain_mu_;
  std::list<Draining> draining_ ABSL_GUARDED_BY(drain_mu_);
  bool drain_stop_ ABSL_GUARDED_BY(drain_mu_) = false;
  std::thread drain_thread_;
};

}  // namespace longhaul::exchange

#endif  // LONGHAUL_DAEMON_EXCHANGE_EXCHANGE_HUB_H_
