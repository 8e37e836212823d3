#ifndef LONGHAUL_DAEMON_EXCHANGE_LINKS_H_
#define LONGHAUL_DAEMON_EXCHANGE_LINKS_H_

// The exchange's channels to its peer sites (proto/EXCHANGE.md, Links).
//
// For every peer site Links dials one outbound channel and only writes to
// it; the peer's dial of us is the inbound channel, which Links only reads
// (Serve, on the router's thread for that channel, through
// ReadPeerMessages). So no channel is ever read and written by two threads.
// Writes to one outbound channel are serialized by its own mutex, one frame
// at a time.
//
// Priority. While an operation sends to a peer it holds the `exchange` class
// on that link (PriorityGate), so bulk transfers there pause. A Send's write
// ends when its last bytes are in the socket buffer, up to a buffer's worth
// (two BDPs) before they are on the wire; HoldUntilSent keeps the class held
// until the transport has sent them, or bulk traffic would share the link
// with the message's tail. Bytes already sent are ahead of anything sent
// later in the path's (FIFO) bottleneck queue, so the hold ends there, not a
// round trip later with the acknowledgements.
//
// Pacing. Each outbound link is paced at most at the uplink's rate (the
// config's link.bandwidth), so the kernel's congestion control cannot
// overshoot into the bottleneck queue while it probes (BBR's startup paces
// at 2.89x its estimate) and lose a message's packets there. A collective
// sends to all its peers at once through the one uplink: while an
// UplinkShare names them, each link in a share is paced at 90 % of the
// uplink's rate over the number of such links, so together they fill the
// uplink without overfilling its queue.
//
// Thread-safe. Links has its own mutex, never held while it calls out (the
// dialer, the sink, `on_lost`), so the hub may call it under its state
// mutex: the lock order is the hub's state mutex, then this one.

#include <atomic>
#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/clock.h"
#include "common/units.h"
#include "daemon/exchange/peer_reader.h"
#include "daemon/peer/priority_gate.h"
#include "daemon/peer/rate_limiter.h"
#include "daemon/transport/channel_registry.h"
#include "daemon/transport/transport.h"
#include "longhaul/v1/exchange.pb.h"

namespace longhaul::exchange {

class Links {
 public:
  // Opens an outbound EXCHANGE channel to a peer site (Hello already sent).
  using Dialer =
      std::function<absl::StatusOr<std::unique_ptr<transport::Channel>>(const std::string& site)>;
  // Told that the link to or from `site` broke, and why.
  using LostFn = std::function<void(const std::string& site, const std::string& reason)>;
  // Waits until payload[0, end) may be read; an error stops the message.
  using ReadyFn = std::function<absl::Status(uint64_t end)>;
  // The bytes to write for payload[offset, offset + n): a private copy the
  // caller made of them, valid until it is called again or Send returns.
  // An error stops the message.
  using StageFn =
      std::function<absl::StatusOr<absl::Span<const uint8_t>>(uint64_t offset, uint64_t n)>;

  // `limiter` (not owned, may be null) holds the operators' caps: every
  // payload segment is charged to the `exchange` class cap and to the cap of
  // the peer it goes to before it is written. `clock` (not owned, outlives
  // this) times deadlines, holds and the refusal log. `uplink` paces the
  // links (see Pacing above); zero leaves them unpaced.
  Links(std::string local_site, Dialer dialer, peer::RateLimiter* limiter, LostFn on_lost,
        const Clock& clock, Bandwidth uplink = Bandwidth::Zero());
  // Shuts down and joins the drain thread.
  ~Links();
  Links(const Links&) = delete;
  Links& operator=(const Links&) = delete;

  // Sends one message (header + payload in segments of kSegmentBytes) on
  // the calling thread, dialing `site` first if there is no link to it.
  // Sets the header's msg_id, total_bytes, offset and payload_bytes. Stops
  // between segments (and while waiting for a rate cap) once `stop` is set
  // or `deadline` (on the clock) has passed, or when `ready`
  // (if set), asked before each segment, fails; a message stopped after its
  // first segment is followed by DISCARD. With `stage`, each segment's bytes
  // are what it returns, and `payload` gives only the length. A REFUSED notice for it stops it
  // with ResourceExhausted. A failed write breaks the link and calls
  // on_lost.
  absl::Status Send(const std::string& site, v1::ExchangePeerMessage header,
                    absl::Span<const uint8_t> payload, const std::atomic<bool>* stop,
                    Timestamp deadline = Timestamp::Infinite(), const ReadyFn& ready = nullptr,
                    const StageFn& stage = nullptr);
  // Whether there is an unbroken outbound link to `site` (never dials).
  bool Linked(const std::string& site);

  // Reads an inbound channel into `sink` until it closes, then calls
  // on_lost unless Links is shutting down. Blocks.
  void Serve(std::unique_ptr<transport::Channel> channel, uint64_t max_message_bytes,
             InboundSink& sink);

  // Logs (at most every few seconds per peer and limit) and tells `from`
  // that its message `msg_id` was dropped for `why`, on the link to it if
  // there is one and it is idle; never blocks.
  void Refuse(const std::string& from, uint64_t msg_id, const absl::Status& why);
  // A REFUSED notice from `from`: stops the Send still sending that message.
  void Refused(const std::string& from, const v1::ExchangePeerMessage& notice);
  uint64_t refusals_received() const { return refusals_received_.load(); }

  // Keeps `scope` (a Send's hold on its link to `site`) until the link has
  // no unsent bytes, the link breaks, or kDrainLimit passes.
  void HoldUntilSent(const std::string& site, peer::PriorityGate::Scope scope);

  // While it lives, the links to `sites` share the uplink (see Pacing
  // above). Shares may overlap; a site in two counts once.
  class UplinkShare {
   public:
    UplinkShare(Links& links, std::vector<std::string> sites);
    ~UplinkShare();
    UplinkShare(const UplinkShare&) = delete;
    UplinkShare& operator=(const UplinkShare&) = delete;

   private:
    Links& links_;
    const std::vector<std::string> sites_;
  };
  // Breaks and forgets the outbound link to `site`.
  void Drop(const std::string& site);
  // Aborts every link, refuses new ones and waits for every Serve to
  // return. Idempotent.
  void Shutdown();

 private:
  struct Outbound {
    std::unique_ptr<transport::Channel> channel;
    absl::Mutex write_mu;
    std::atomic<bool> broken{false};
  };
  struct Draining {
    std::shared_ptr<Outbound> link;
    peer::PriorityGate::Scope scope;
    Timestamp until;
  };
  // A message of several segments being sent, so a REFUSED notice can stop it.
  struct Sending {
    std::string to;
    std::string refusal;  // guarded by mu_; set by a REFUSED notice
  };
  // Refusals of a peer's messages (by the limit on messages, by bytes), and
  // of ours by it, not yet logged, and when each was last logged (unset:
  // never).
  struct RefusalLog {
    uint64_t refused[2] = {0, 0};
    std::optional<Timestamp> refused_logged[2];
    uint64_t refusals = 0;
    std::optional<Timestamp> refusals_logged;
  };

  absl::StatusOr<std::shared_ptr<Outbound>> LinkTo(const std::string& site);
  // The unbroken outbound link to `site`, or null.
  std::shared_ptr<Outbound> Existing(const std::string& site);
  void Break(Outbound& link, const std::string& site, const absl::Status& why);
  // Sets every outbound link's pacing cap from shares_.
  void Repace() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The pacing cap of the link to `site` (dialed or not yet) under shares_.
  Bandwidth PacingOf(const std::string& site) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The thread that releases the holds of HoldUntilSent.
  void DrainLoop();

  const std::string local_site_;
  const Dialer dialer_;
  peer::RateLimiter* const limiter_;
  const LostFn on_lost_;
  const Clock& clock_;
  const Bandwidth uplink_;
  std::atomic<uint64_t> next_msg_id_{1};
  std::atomic<uint64_t> refusals_received_{0};

  absl::Mutex dial_mu_;  // one dial at a time, so a site gets one outbound link
  absl::Mutex mu_;
  bool shutdown_ ABSL_GUARDED_BY(mu_) = false;
  absl::flat_hash_map<std::string, std::shared_ptr<Outbound>> outbound_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, std::shared_ptr<Sending>> sending_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, RefusalLog> refusal_log_ ABSL_GUARDED_BY(mu_);
  // How many live UplinkShares name each site (absent: none).
  absl::flat_hash_map<std::string, int> shares_ ABSL_GUARDED_BY(mu_);
  // The inbound links Serve is reading (its own lock); closed by Shutdown.
  transport::ChannelRegistry inbound_;

  // Holds of finished Sends whose bytes are not all sent yet.
  absl::Mutex drain_mu_;
  std::list<Draining> draining_ ABSL_GUARDED_BY(drain_mu_);
  bool drain_stop_ ABSL_GUARDED_BY(drain_mu_) = false;
  std::thread drain_thread_;
};

}  // namespace longhaul::exchange

#endif  // LONGHAUL_DAEMON_EXCHANGE_LINKS_H_
