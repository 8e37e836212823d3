#ifndef LONGHAUL_DAEMON_EXCHANGE_EXCHANGE_HUB_H_
#define LONGHAUL_DAEMON_EXCHANGE_EXCHANGE_HUB_H_

// The daemon's exchange engine: named groups of sites, point-to-point
// messages by tag, and all-reduce, carried between daemons on EXCHANGE-role
// peer channels. The wire protocol (frames, segments, JOIN/DONE/ABORT,
// generations, peer loss, limits) is proto/EXCHANGE.md.
//
// The hub puts four pieces together and is the only one callers see:
//  - Links (links.h): the channels to peer sites, their read loops
//    (peer_reader.h) and the priority hold after a Send;
//  - Mailbox (mailbox.h): arriving messages, the buffers waiting Recvs
//    offer, payload memory and each sender's limits;
//  - Membership (membership.h): groups, generations, peer loss, and whose
//    messages a group takes;
//  - Operations (operations.h): Join, AllReduce, AllGather, Broadcast, Send
//    and Recv.
// The hub itself is the sink of every link's reader: it admits what arrives
// (Membership) and files it (Mailbox), and it turns a broken link into a
// peer loss.
//
// Thread-safe. Calls block up to their deadline; they end early on
// Cancel(op_id), on a lost peer and on Shutdown. Locking: HubState::mu
// (hub_state.h says why it is one) guards the mailbox, the membership and
// the running operations; Links and the buffer pool lock on their own,
// after it.

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/clock.h"
#include "daemon/exchange/exchange_types.h"
#include "daemon/exchange/hub_state.h"
#include "daemon/exchange/links.h"
#include "daemon/exchange/operations.h"
#include "daemon/exchange/peer_reader.h"
#include "daemon/peer/priority_gate.h"
#include "daemon/peer/rate_limiter.h"
#include "daemon/transport/transport.h"
#include "longhaul/v1/exchange.pb.h"

namespace longhaul::exchange {

class ExchangeHub : private InboundSink {
 public:
  using Dialer = Links::Dialer;

  // `peers` are the sites this daemon may exchange with (its configured
  // peers); `gate` (not owned, may be null) learns when exchanges use a link,
  // so bulk transfers on it yield; `limiter` (not owned, may be null) holds
  // the operators' caps: every payload segment is charged to the `exchange`
  // class cap and to the cap of the peer it goes to before it is written;
  // `clock` (must outlive the hub) times every deadline (deadline.h).
  ExchangeHub(std::string local_site, std::vector<std::string> peers, Dialer dialer,
              peer::PriorityGate* gate, HubOptions options = {},
              peer::RateLimiter* limiter = nullptr, const Clock& clock = RealClock::Get());
  ~ExchangeHub() override;
  ExchangeHub(const ExchangeHub&) = delete;
  ExchangeHub& operator=(const ExchangeHub&) = delete;

  // Reads an inbound EXCHANGE channel until it closes. Blocks.
  void ServeInbound(std::unique_ptr<transport::Channel> channel);

  // Sends JOIN to every other site and waits for every one's JOIN; the group
  // forms at the largest proposed generation.
  absl::StatusOr<v1::GroupView> Join(const std::string& group, std::vector<std::string> sites,
                                     absl::Duration timeout);
  // Forgets the group and drops the messages held for it.
  void Leave(const std::string& group);
  absl::StatusOr<v1::GroupView> View(const std::string& group);

  // Reduces `buffer` (count elements of args.dtype) in place with the group.
  // Reads each byte of `buffer` once, a segment at a time into private
  // scratch (client_buffer.h), so a client writing it meanwhile cannot make
  // the members disagree; writes the result into it only after the commit
  // round. With args.progress, reads each segment only once the client has
  // published it as written.
  OpResult AllReduce(const AllReduceArgs& args, absl::Span<uint8_t> buffer);
  // Gathers every member's `input` (the same size everywhere) into
  // `output`, in member order; OpResult.stats.peers + 1 parts were written.
  // Reads `input` once, a segment at a time into private memory, and sends
  // that copy to every peer (client_buffer.h, FanOutReader), so a client
  // writing it meanwhile cannot make the peers receive different bytes.
  OpResult AllGather(const GatherArgs& args, absl::Span<const uint8_t> input,
                     absl::Span<uint8_t> output);
  // Copies args.root's `buffer` into every other member's, in place. The
  // root reads it as AllGather reads `input`.
  OpResult Broadcast(const GatherArgs& args, absl::Span<uint8_t> buffer);
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
  // Messages from `site` held for no operation yet (proto/EXCHANGE.md,
  // Limits), counted from their first segment on.
  uint32_t unclaimed_messages(const std::string& site);
  // Whole messages (every segment in) held for no operation yet.
  size_t messages_held();
  // Looks by streamed Sends at their client's progress word that found the
  // next segment not yet written; a Send waiting for its client adds one at
  // least every millisecond.
  uint64_t unfilled_looks() const { return state_.client_reads.unfilled.load(); }
  // Bytes collectives (all-reduce, all-gather, broadcast) have copied out of
  // their clients' buffers (each byte once), and the largest single copy (at
  // most kSegmentBytes: no whole-buffer copy).
  uint64_t client_bytes_read() const { return state_.client_reads.bytes.load(); }
  uint64_t largest_client_read() const { return state_.client_reads.largest.load(); }
  // REFUSED notices this hub has received from its peers.
  uint64_t refusals_received() const { return links_.refusals_received(); }

 private:
  // InboundSink, called by each link's reader.
  void OnMessage(const std::string& from, const v1::ExchangePeerMessage& header) override;
  std::unique_ptr<Incoming> Begin(const std::string& from,
                                  const v1::ExchangePeerMessage& header) override;
  std::optional<absl::Span<uint8_t>> Into(Incoming& in, uint64_t received, uint64_t end,
                                          transport::Channel& channel) override;
  void Read(Incoming& in, uint64_t bytes, bool ok) override;
  void Complete(const std::string& from, std::unique_ptr<Incoming> in) override;
  void Abandon(std::unique_ptr<Incoming> in) override;

  // Files a whole message from `from` for the operation that will take it,
  // or drops it (not admitted, an op already ended, an unknown kind).
  void Deliver(const std::string& from, v1::ExchangePeerMessage header, Payload payload,
               Unclaimed claim) ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_.mu);
  // `site`'s link broke: the link is dropped and every group holding it
  // moves to its next generation.
  void PeerLost(const std::string& site, const std::string& reason);

  const std::string local_site_;
  const HubOptions options_;
  std::atomic<uint64_t> bytes_in_place_{0};
  HubState state_;
  Links links_;
  Operations operations_;
};

}  // namespace longhaul::exchange

#endif  // LONGHAUL_DAEMON_EXCHANGE_EXCHANGE_HUB_H_
