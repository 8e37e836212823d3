#ifndef LONGHAUL_DAEMON_PEER_SENDER_H_
#define LONGHAUL_DAEMON_PEER_SENDER_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "common/clock.h"
#include "common/units.h"
#include "daemon/peer/messaging.h"
#include "daemon/peer/priority_gate.h"
#include "daemon/peer/rate_limiter.h"
#include "daemon/peer/relay_chunk_source.h"
#include "daemon/peer/source_digests.h"
#include "daemon/transport/channel_registry.h"
#include "daemon/transport/transport.h"
#include "daemon/wire/frames.h"
#include "longhaul/v1/journal.pb.h"
#include "longhaul/v1/peer.pb.h"
#include "storage/chunk_io.h"
#include "storage/journal.h"

namespace longhaul::peer {

// The OPEN of `record` from `local_site` (its own transfer, not a relay's):
// what the destination decides the transfer by. The sender's open and
// submit's check (OpenRequest.check_only) are built by it alike, so that
// the check decides as the open will.
v1::OpenRequest OpenRequestFor(const v1::OutgoingTransfer& record, const std::string& local_site);

// Live figures of one outgoing transfer, read by the control service while
// the sender updates them. Thread-safe.
class TransferProgress {
 public:
  // `on_change` (may be empty) is called after every Update, on the
  // updating thread and outside this object's lock.
  explicit TransferProgress(std::function<void()> on_change = nullptr)
      : on_change_(std::move(on_change)) {}

  struct Snapshot {
    uint64_t bytes_total = 0;
    uint64_t bytes_done = 0;
    uint64_t chunks_total = 0;
    uint64_t chunks_done = 0;
    uint64_t bytes_sent = 0;
    uint64_t resent_bytes = 0;
    uint64_t files_unchanged = 0;
    uint32_t active_streams = 0;
    uint32_t attempts = 0;
    std::string error;
  };
  Snapshot Get() const {
    absl::MutexLock lock(&mu_);
    return s_;
  }
  template <typename F>
  void Update(F&& f) {
    {
      absl::MutexLock lock(&mu_);
      f(s_);
    }
    if (on_change_) on_change_();
  }

 private:
  const std::function<void()> on_change_;
  mutable absl::Mutex mu_;
  Snapshot s_ ABSL_GUARDED_BY(mu_);
};

// What one stream has sent and the receiver has not yet acknowledged
// durable, chunk by chunk, oldest first (a receiver answers a stream's chunks
// in order). Acks and progress reports are checked against it, so a peer
// cannot acknowledge bytes that were not sent. Not thread-safe.
class SendWindow {
 public:
  struct Entry {
    uint32_t file_index = 0;
    uint32_t chunk_index = 0;
    uint64_t size = 0;     // the whole chunk
    uint64_t start = 0;    // the chunk frame's first byte (ChunkHeader.offset)
    uint64_t sent = 0;     // bytes [0, sent) of the chunk are sent or were durable before
    uint64_t durable = 0;  // bytes [0, durable) are acknowledged durable (start at first)
  };

  // Most chunks open at once, however small.
  static constexpr size_t kMaxChunks = 64;

  // At most `limit` bytes sent and not acknowledged durable.
  explicit SendWindow(uint64_t limit) : limit_(limit) {}

  // Whether `bytes` more may be sent now: with nothing unacknowledged
  // always; otherwise when the unacknowledged bytes plus these stay within
  // the limit and at most kMaxChunks chunks are open (the one being sent
  // among them).
  bool Fits(uint64_t bytes) const;
  // A chunk frame of the `size`-byte chunk starts at byte `start` of it.
  void Begin(uint32_t file_index, uint32_t chunk_index, uint64_t size, uint64_t start);
  // `bytes` more of the chunk begun last have been sent.
  void Sent(uint64_t bytes);
  // Applies a progress report and returns how many bytes it newly covers.
  // InvalidArgument when it is not about the oldest open chunk, does not
  // move forward, reaches the chunk's end (that is an ack's) or covers
  // bytes not sent.
  absl::StatusOr<uint64_t> Progress(const wire::ChunkProgress& progress);
  // Closes the oldest open chunk with its ack and returns it. InvalidArgument
  // when the ack is about another chunk, or reports it durable or corrupted
  // before all of it was sent.
  absl::StatusOr<Entry> Ack(const wire::ChunkAck& ack);

  uint64_t unacked_bytes() const { return unacked_; }
  bool empty() const { return entries_.empty(); }

 private:
  const uint64_t limit_;
  std::deque<Entry> entries_;
  uint64_t unacked_ = 0;
};

// Link figures a sender saw last for its peer (for `longhaul peers`).
using LinkObserver = std::function<void(const std::string& site, const transport::LinkStats&)>;

// What a TransferSender takes from the daemon's configuration.
struct SenderOptions {
  // This daemon's site, named in the OPEN.
  std::string local_site;
  // Where the destination site listens ("host:port"); nullopt when it is not
  // a configured peer, which fails the transfer (FailedPrecondition).
  struct Destination {
    std::string site;
    std::string address;
  };
  std::optional<Destination> destination;
  // Streams when the transfer's spec names none.
  uint32_t default_streams = 8;
  // A transfer without progress for this long fails; zero or less: never.
  TimeDelta give_up_after = TimeDelta::Seconds(3600);
  // The first wait before trying again after a retryable error; each
  // further failure doubles it, up to 30 s (or this, when longer).
  TimeDelta first_retry_backoff = TimeDelta::Milliseconds(500);
  // The configured link's rate, which the streams pace just below.
  Bandwidth link_bandwidth = Bandwidth::GbitsPerSecond(10);
  // Times give_up_after and the digest pass (not owned, outlives the
  // sender); null: RealClock::Get().
  const Clock* clock = nullptr;

  // Fan-out. Set for a relay (daemon/transfer/relay.h): the chunks come from these
  // readers, not from source files; the sender attaches to the session the
  // source opened at the destination (RelayAttachRequest) instead of opening
  // it, journals nothing, and never commits (the source does).
  std::function<std::unique_ptr<RelayChunkSource>()> relay_source;
  // With relay_source: the source of the transfer relayed (its owner), named
  // in the attach; the destination refuses a relay for any other.
  std::string relay_owner{};
  // Told of every failed attempt (the legs this one relays to are then
  // bypassed: FanoutSender).
  std::function<void(const absl::Status&)> on_attempt_failed;
  // Fan-out, a relayed leg: the files its relay's destination took as
  // unchanged (sync), which the relay therefore cannot deliver; nullopt
  // until that destination has answered an open. A leg that needs one of
  // them bypasses its relay at once.
  std::function<std::optional<absl::flat_hash_set<uint32_t>>()> relay_unchanged_files;
  // Fan-out: the transfer's chunk digests as the source read them (not
  // owned; outlives the sender; null: none kept). A leg that reads the
  // source records each chunk's here; a relayed leg hands them to its
  // destination over its own session, which takes a relayed chunk only when
  // it matches, and reads from the source those it asks for that are not
  // here (ProgressReply.awaiting_digests).
  SourceDigests* source_digests = nullptr;
  // Journals the record when the sender changes it (content digests, a new
  // generation); unset: Journal::PutOutgoing. A fan-out leg's record is
  // part of its transfer's.
  std::function<absl::Status(const v1::OutgoingTransfer&, bool sync)> persist;
};

// What the TransferManager runs for one outgoing transfer: a TransferSender,
// or a daemon::FanoutSender driving one per destination.
class OutgoingRun {
 public:
  virtual ~OutgoingRun() = default;
  // OK: published at every destination. Cancelled: stopped by Drain/Stop.
  // Another error: the transfer cannot complete without an operator.
  virtual absl::Status Run() = 0;
  // Finish the chunks in flight, then stop (SIGTERM, pause).
  virtual void Drain() = 0;
  // Stop now, abandoning chunks in flight.
  virtual void Stop() = 0;
  // An operator's resume of a transfer waiting to try again: try at once.
  // A run that does not wait between attempts ignores it.
  virtual void RetryNow() {}
  // The record as last journaled (the manifest may have new generations).
  virtual v1::OutgoingTransfer record() const = 0;
  // Fan-out: every destination's state and progress now (empty otherwise).
  virtual std::vector<v1::FanoutLeg> legs() const { return {}; }
  // Operators' rate caps, asked before every chunk (nullptr: none). Set
  // before Run(); `limiter` must outlive the sender.
  virtual void set_rate_limiter(RateLimiter* limiter) = 0;
};

// Drives one outgoing transfer to its end: opens a session with the
// destination, sends every chunk it lacks over N streams, re-sends files
// whose source changed, and asks the destination to publish. Per stream at
// most one chunk size of bytes (two durable pieces, if that is more) is
// unacknowledged: the destination reports durable pieces of a chunk as they
// are synced (CHUNK_PROGRESS) and, after a crash, the durable prefix of each
// chunk it holds part of, which is not sent again. So a crash of either side
// re-sends at most streams x max(chunk size, 2 pieces). A
// destination without durable pieces (an older version) acknowledges whole
// chunks only; then two chunk sizes per stream are unacknowledged, and a
// crash re-sends up to twice as much.
// Transient failures (a broken connection, a restarted peer, a full disk at
// the destination) are retried with exponential backoff; the journal record
// is kept current so a restarted daemon resumes where this one stopped.
//
// Fan-out legs (record.relay_by set): the destination is opened naming the
// relay that delivers its chunks; this sender then only asks the
// destination's progress (ProgressRequest) until every chunk is there, and
// commits. When the relay makes no progress for kRelayStall, or
// BypassRelay() is called, the leg drops the relay and sends the chunks
// itself from the next attempt on: the destination keeps what it has.
//
// Run() is called once, on a thread of its own; Drain() and Stop() may be
// called from any thread.
class TransferSender : public OutgoingRun {
 public:
  // Control messages go over `control` (TLS over TCP, also the key source
  // for other transports); chunks over `data`.
  TransferSender(SenderOptions options, transport::Transport& control, transport::Transport& data,
                 PriorityGate& gate, storage::Journal& journal, v1::OutgoingTransfer record,
                 TransferProgress& progress, LinkObserver observer);

  absl::Status Run() override;
  void Drain() override;
  void Stop() override;
  void RetryNow() override;
  // Fan-out: a relayed leg stops waiting for its relay and sends the chunks
  // itself. No effect on a leg sent directly.
  void BypassRelay();
  // Fan-out: the next opens no longer ask the destination to relay.
  void StopRelaying();

  // A relayed leg whose destination gains nothing for this long bypasses
  // its relay.
  static constexpr absl::Duration kRelayStall = absl::Seconds(10);

  v1::OutgoingTransfer record() const override;
  void set_rate_limiter(RateLimiter* limiter) override { rate_limiter_ = limiter; }
  // The files the destination took as unchanged (sync) at the last open;
  // nullopt before the first.
  std::optional<absl::flat_hash_set<uint32_t>> unchanged_at_destination() const;

  // The pacing rate each of a transfer's `streams` is capped at on a link
  // configured at `link`: together they stay just below it. Kernel
  // congestion control of parallel flows otherwise keeps the path's
  // bottleneck queue full (their summed estimates overshoot it), and every
  // exchange on the link waits a full queue behind them and loses packets
  // to it. `streams` are those still sending chunks, so the last streams of
  // a transfer get the whole budget. Per transfer: concurrent transfers each
  // get this much.
  static Bandwidth StreamPacingLimit(Bandwidth link, uint32_t streams);

 private:
  struct Chunk {
    uint32_t file_index;
    uint32_t chunk_index;
    uint64_t size;
    uint64_t start = 0;  // bytes [0, start) are durable at the destination already
  };

  absl::Status RunAttempt();
  // The relayed leg's wait: asks the destination's progress on `control`
  // until it holds `totals`'s chunks. Aborted once the relay is bypassed,
  // or when the relay's destination holds one of `unchanged` (this
  // destination's unchanged files) as unchanged.
  absl::Status AwaitRelayedChunks(transport::Channel& control, uint64_t session_id,
                                  const TransferProgress::Snapshot& totals,
                                  const absl::flat_hash_set<uint32_t>& unchanged);
  // Sends chunks on one stream. `durable_piece`: OpenReply.durable_piece
  // (0: the destination acknowledges whole chunks only).
  absl::Status StreamLoop(uint32_t stream_index, uint64_t session_id, uint64_t durable_piece,
                          std::unique_ptr<transport::Channel> channel);
  // A stream starts (+1) or stops (-1) sending chunks: every stream's pacing
  // cap becomes StreamPacingLimit(link, streams still sending).
  void ChangeSendingStreams(int delta);
  // sync --checksum: gives each file without a content digest the XXH3-128
  // of its content, read between two identity checks. Aborted, with
  // changed_file_ set, when a file changed meanwhile.
  absl::Status DigestSources();
  // Re-reads the source file's identity, drops its content digest and bumps
  // its generation.
  absl::Status RefreshChangedFile(uint32_t file_index);
  // Fan-out, a relayed leg: the source digests of the chunks `awaited` at
  // the destination (file and chunk index), from options_.source_digests or
  // else read from the source into `buffer` (allocated on first use) and
  // recorded there. A chunk whose source cannot be read is left out (its
  // relayed frame then waits and is retried); a source changed since the
  // manifest sets changed_file_ and is Aborted. The list is the
  // destination's: ids outside the manifest and repeats are skipped, and at
  // most kMaxAwaitedPerAsk are answered per ask.
  static constexpr size_t kMaxAwaitedPerAsk = 64 * 1024;
  absl::StatusOr<std::vector<SourceDigests::Entry>> DigestsOfAwaitedChunks(
      const google::protobuf::RepeatedPtrField<v1::ChunkId>& awaited,
      std::unique_ptr<storage::AlignedBuffer>& buffer);
  // Any source file whose identity differs from the manifest, or nullopt.
  std::optional<uint32_t> FindChangedSource();
  bool stopping() const { return drain_.load() || stop_.load(); }
  absl::Status Persist(const v1::OutgoingTransfer& record, bool sync);
  void AbortChannels();
  void AddBytesSent(uint64_t bytes);

  const SenderOptions options_;
  const Clock& clock_;
  transport::Transport& control_transport_;
  transport::Transport& data_transport_;
  PriorityGate& gate_;
  storage::Journal& journal_;
  TransferProgress& progress_;
  LinkObserver observer_;
  std::string peer_address_;

  mutable absl::Mutex mu_;
  v1::OutgoingTransfer record_ ABSL_GUARDED_BY(mu_);
  std::deque<Chunk> queue_ ABSL_GUARDED_BY(mu_);
  uint64_t in_flight_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  std::optional<uint32_t> changed_file_ ABSL_GUARDED_BY(mu_);
  std::optional<absl::flat_hash_set<uint32_t>> unchanged_at_destination_ ABSL_GUARDED_BY(mu_);
  uint32_t sending_streams_ ABSL_GUARDED_BY(mu_) = 0;
  // The control and data channels of the running attempt.
  transport::ChannelRegistry channels_;

  RateLimiter* rate_limiter_ = nullptr;

  std::atomic<bool> drain_{false};
  std::atomic<bool> stop_{false};
  std::atomic<bool> bypass_relay_{false};
  // Cut a retry backoff short: Drain/Stop (stopping()) and RetryNow.
  absl::Mutex wake_mu_;
  bool woken_ ABSL_GUARDED_BY(wake_mu_) = false;
};

}  // namespace longhaul::peer

#endif  // LONGHAUL_DAEMON_PEER_SENDER_H_
