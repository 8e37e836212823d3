#ifndef LONGHAUL_DAEMON_PEER_RECEIVER_H_
#define LONGHAUL_DAEMON_PEER_RECEIVER_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "daemon/peer/content_check_budget.h"
#include "daemon/peer/destination_authority.h"
#include "daemon/peer/durability_committer.h"
#include "daemon/peer/memory_budget.h"
#include "daemon/peer/peer_errors.h"
#include "daemon/peer/read_back_pool.h"
#include "daemon/peer/relay_chunk_source.h"
#include "daemon/transport/channel_registry.h"
#include "daemon/transport/transport.h"
#include "daemon/wire/frames.h"
#include "storage/buffer_pool.h"
#include "storage/chunk_io.h"
#include "storage/exports.h"
#include "storage/file_io.h"
#include "storage/file_system.h"
#include "storage/journal.h"
#include "storage/staging.h"

namespace longhaul::peer {

// Counters of the destination side, for metrics and tests.
struct ReceiverStats {
  uint64_t chunks_durable = 0;
  uint64_t bytes_durable = 0;
  uint64_t hash_mismatches = 0;
  uint64_t frames_refused = 0;
  uint64_t staged_corruptions = 0;  // staged files that failed re-verification
  // Staged chunk bytes read back against their digests: while their transfer
  // was receiving (ReadBackPool), and in the read-back before publish.
  uint64_t bytes_read_back_receiving = 0;
  uint64_t bytes_read_back_at_publish = 0;
  // Requests refused because the peer may not write there (not one of the
  // export's writers, or the destination is another site's), by (peer
  // site, export name). Only configured exports are counted.
  std::map<std::pair<std::string, std::string>, uint64_t> access_refused;
};

// What a Receiver takes from the daemon's configuration.
struct ReceiverOptions {
  // One export a peer may send into.
  struct Export {
    std::string name;
    std::string path;
    // Peer sites that may send into it. Empty: nobody.
    std::vector<std::string> writers;
    // The mode bits a file or directory published here may keep.
    uint32_t mode_mask = 0755;
    // Peer sites that may fetch from it: they may also compare content
    // here (sync --checksum).
    std::vector<std::string> readers{};

    bool IsWriter(absl::string_view site) const;
  };

  // This daemon's site, named in refusals.
  std::string local_site;
  std::vector<Export> exports;
  // An incoming transfer untouched for this long expires.
  absl::Duration incoming_expiry = absl::Hours(7 * 24);
  // What a publish replaced stays in the export's .longhaul/trash this long.
  absl::Duration trash_retention = absl::Hours(24);
  // The largest chunk accepted from a peer.
  uint64_t max_chunk_size = 64ull << 20;
  // Reads each durable piece back and checks its digest while receiving.
  bool read_back_while_receiving = true;
  // The per-peer memory budget the Receiver keeps when it is given none.
  uint64_t memory_per_peer = 1ull << 30;
  // Bytes of files here that each peer may have hashed for sync --checksum
  // per second (ContentCheckBudget); 0: no bound.
  uint64_t content_check_bytes_per_second = 1ull << 30;
  // A pull this site issued: whether the change may be made as that pull's
  // (DestinationAuthority::Options::pull_granted; null: no pulls).
  DestinationAuthority::PullGrant pull_granted;
  // Fan-out: told after every open of a transfer that is receiving here
  // which transfer of which site it relays its chunks to (an empty target:
  // none, and a relay running for it stops). Called with the transfer's
  // session lock held: it must not block nor call back into the Receiver.
  std::function<void(const std::string& transfer_id, const v1::RelayTarget& target)> relay;

  // The export named `name`, or nullptr.
  const Export* FindExport(absl::string_view name) const;
};

// The destination side of peer sessions. The PeerRouter hands it CONTROL and
// DATA channels; Serve() answers control requests (open, commit, abort,
// verify) and receives chunk frames until the channel closes. Nothing is
// written outside the transfer's staging directory before commit, and a chunk
// (or, with CHUNK_PROGRESS, a prefix of one) is acknowledged only after
// DurabilityCommitter made it durable. A chunk is acknowledged whole only
// once its XXH3-128 over every byte, the durable prefix of a resumed chunk
// read back from its staged file included, matches the sender's; on a
// mismatch its prefix record is dropped and it is asked for from byte 0.
// Fan-out: a chunk from the relay must carry, and hash to, the digest the
// owner sent for it (ProgressRequest.digests); a relay whose chunk does not
// is refused from then on, and its chunk with it.
//
// Authorization: every change at a destination (open, commit, pruning after publish, an abort's
// record) is decided by DestinationAuthority, against the source and, for a pull or third-party
// copy, the requester its open names: only the export's writers, or the source of a pull this site
// issued into that destination, may open or commit a transfer into it, only where no other
// publisher's destination is, and pruning needs writers' authority; a refused open writes nothing,
// not even staging. Commit, abort and verify act only on the asking site's own transfers.
// Published files keep the manifest's mode masked by the export's umask.
//
// Memory: what a peer makes it hold grows only with bytes received and is
// charged to the peer's PeerMemoryBudget: control messages while they are
// read, each DATA channel's piece buffer (a chunk is received in pieces of
// kDurablePiece: the smaller of that and the chunk frame's payload, reserved
// before its payload is read, and kept for the stream's next chunks), and the
// read buffer of a verify. A DATA channel's piece buffer is one of the
// kReceiveBuffers buffers of kDurablePiece bytes that all peers' streams
// share (storage::BufferPool: mapped once, never re-zeroed, resident only
// where bytes were received), so received chunks cost no allocation, and at
// most kReceiveBuffers x kDurablePiece bytes in all. A chunk that would take
// the peer past its budget, or finds every buffer taken, waits up to
// kBudgetWait; then its payload is read and dropped and it is answered
// kRetryLater, so the sender slows down.
// A control message past the budget closes its channel.
//
// Expiry: an incoming RECEIVING transfer with no open and no data channel
// for ReceiverOptions::incoming_expiry becomes EXPIRED: its staging and chunk
// records are removed, its record shrinks to what `ls --all` shows, and a
// later open of it is refused (FailedPrecondition). ABORTED and EXPIRED
// records are removed one expiry after they ended; an open after that
// starts over from nothing. A transfer past its publish's point of no
// return is published instead of expired. Times are wall-clock
// (`clock`'s WallNow), persisted in the records, so a restart does not reset
// them.
//
// Thread-safe: Serve runs on each channel's own thread; the expiry sweep
// (StartExpirySweep) on one thread of its own.
class Receiver {
 public:
  // `fs` holds staging and destinations (storage::PosixFileSystem() in the
  // daemon); it must outlive the Receiver. `budget` is the daemon's per-peer
  // memory budget (shared with the exchange hub); it must outlive the
  // Receiver. Null: the Receiver keeps its own, of
  // options.memory_per_peer. `clock`'s WallNow dates records and decides
  // expiry (tests pass a FakeClock); it must outlive the Receiver.
  Receiver(ReceiverOptions options, storage::Journal& journal,
           storage::FileSystem& fs = storage::PosixFileSystem(), PeerMemoryBudget* budget = nullptr,
           const Clock& clock = RealClock::Get());
  ~Receiver();

  // Serves a CONTROL or DATA channel (its hello already read) until it closes.
  void Serve(std::unique_ptr<transport::Channel> channel, const v1::Hello& hello);
  // Run once at start, before serving: publishes that passed their point of
  // no return before a crash are finished now, without waiting for their
  // sender (which may have cancelled, or be gone). Errors are logged; the
  // sender's next commit tries again.
  void FinishInterruptedPublishes();
  // One expiry pass over the journal (see the class comment), at
  // the clock's WallNow. Returns how many records it expired or removed.
  // Errors are logged; the next pass tries again.
  size_t ExpireAbandoned();
  // Removes every staging directory that no transfer here will use again:
  // one whose record is ABORTED, EXPIRED or PUBLISHED (a cancel or publish
  // that could not remove it, e.g. on a full or failing file system, or a
  // crash right after journaling the end), or that has no record at all (an
  // open that failed before journaling it). Returns how many it removed.
  // Errors are logged; the next pass tries again.
  size_t RemoveStrayStaging();
  // Removes the trash entries (storage/trash.h) of every export replaced
  // more than trash_retention ago. Returns how many it removed. Errors are
  // logged; the next pass tries again.
  size_t ExpireTrash();
  // Starts the thread that calls ExpireAbandoned, RemoveStrayStaging and
  // ExpireTrash at once and then every ExpirySweepInterval of the shorter
  // of incoming_expiry and trash_retention until
  // Shutdown; after a staging could not be removed, sooner (see
  // NoteStagingLeft). Call once.
  void StartExpirySweep();
  // A tenth of the expiry, between 100 ms and 1 h: an abandoned transfer
  // goes within 1.1 expiries, and a tiny expiry (tests) is still honoured.
  static absl::Duration ExpirySweepInterval(absl::Duration expiry);

  // Aborts every open channel and stops the expiry sweep; Serve calls
  // return soon after.
  void Shutdown();

  ReceiverStats stats() const;

  // Fan-out: reads the chunks of an incoming transfer as they become durable
  // here, for its relay to the next destination. One per relay stream; not
  // thread-safe.
  class RelayReader : public RelayChunkSource {
   public:
    RelayReader(Receiver& receiver, std::string transfer_id);
    ~RelayReader() override;
    // Waits until whole chunk `chunk_index` of file `file_index` at
    // `generation` is durable here, reads it into `out` (an AlignedBuffer's
    // span of the chunk's size) and checks the bytes against the digest the
    // chunk was acknowledged with, which it returns: the relayed chunk
    // carries the source's digest end to end. Cancelled once `stopping`
    // says so; FailedPrecondition when the transfer stops receiving here or
    // the file moved to another generation; DataLoss when the bytes read do
    // not match.
    absl::StatusOr<storage::Xxh128> Read(uint32_t file_index, uint32_t chunk_index,
                                         uint32_t generation, absl::Span<uint8_t> out,
                                         const std::function<bool()>& stopping) override;

   private:
    Receiver& receiver_;
    const std::string transfer_id_;
    std::unique_ptr<storage::FileIo> io_;
    uint32_t file_index_ = UINT32_MAX;  // the file `file_` holds open
    std::unique_ptr<storage::File> file_;
  };

  // A chunk is received, written and made durable in pieces of this many
  // bytes from its start (a multiple of storage::kDirectIoAlignment); each
  // but the last is answered CHUNK_PROGRESS when the sender asked for it.
  static constexpr uint64_t kDurablePiece = 4u << 20;

  // How long a chunk waits for its peer's memory budget and a piece buffer
  // before it is answered kRetryLater.
  static constexpr absl::Duration kBudgetWait = absl::Seconds(5);

  // How long a relayed chunk waits for its owner's digest
  // (ProgressRequest.digests) before it is answered kRetryLater.
  static constexpr absl::Duration kOwnerDigestWait = absl::Seconds(30);

  // Piece buffers shared by every DATA channel (see "Memory" above).
  static constexpr size_t kReceiveBuffers = 128;

 private:
  struct Session;

  void ServeControl(transport::Channel& channel, const std::string& transfer_id);
  void ServeData(transport::Channel& channel, const std::string& transfer_id);
  v1::PeerMessage HandleOpen(transport::Channel& channel, const v1::PeerMessage& request);
  // OpenRequest.check_only: the open's decision and what a publish would
  // replace and delete, with nothing journaled, staged or kept.
  v1::PeerMessage CheckOpen(const v1::PeerMessage& request,
                            const DestinationAuthority::Change& change,
                            const storage::ResolvedDestination& dest);
  // cp without --replace (OpenRequest.refuse_different): FailedPrecondition,
  // saying what to do, when `dest` holds something else than the manifest.
  absl::Status RefuseDifferent(const v1::OpenRequest& open, const std::string& peer_site,
                               const storage::ResolvedDestination& dest);
  v1::PeerMessage HandleCommit(const std::string& peer_site, const v1::PeerMessage& request);
  v1::PeerMessage HandleAbort(const std::string& peer_site, const v1::PeerMessage& request);
  v1::PeerMessage HandleVerify(const std::string& peer_site, const v1::PeerMessage& request);
  v1::PeerMessage HandleRelayAttach(const std::string& peer_site, const v1::PeerMessage& request);
  v1::PeerMessage HandleProgress(const std::string& peer_site, const v1::PeerMessage& request);
  // Fan-out: waits (at most kOwnerDigestWait) until the owner has sent the
  // digest of the chunk `relay` is delivering in a frame with header
  // `chunk`. OK when the frame carries it; PermissionDenied, and the relay
  // is refused from then on, when it carries another; Unavailable when none
  // came in time; Cancelled when the owner opened the transfer again.
  absl::Status AwaitOwnerDigest(Session& session, const std::string& relay,
                                const wire::ChunkHeader& chunk, const std::string& path)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Refuses every chunk and attach of `relay` from now on, for `why` (the
  // owner reads it in ProgressReply.relay_refused). Returns it as
  // PermissionDenied.
  absl::Status RefuseRelayLocked(Session& session, const std::string& relay,
                                 const std::string& why) ABSL_NO_THREAD_SAFETY_ANALYSIS;

  // Expires the transfer if it is still RECEIVING and was inactive for the expiry;
  // a session seen busy has its activity time persisted now and then.
  // `listed` is the record as the sweep listed it; it is read again under
  // the session lock before anything changes.
  bool ExpireIfAbandoned(const v1::IncomingTransfer& listed, absl::Time now, absl::Duration expiry);
  // Removes the ABORTED or EXPIRED record once it ended an expiry ago.
  bool RemoveIfAged(const v1::IncomingTransfer& listed, absl::Time now, absl::Duration expiry);
  // RemoveStrayStaging for one staging directory, of `id` under `export_root`.
  bool RemoveStagingIfStray(const std::string& export_root, const std::string& id);
  // Drops the cached session of `id` when nothing uses it and its transfer
  // ended here (ABORTED, EXPIRED or removed), so ended ids cost no memory.
  void ForgetEndedSession(const std::string& id) ABSL_LOCKS_EXCLUDED(mu_);

  // The session of `transfer_id`, created empty if there is none.
  std::shared_ptr<Session> SessionFor(const std::string& transfer_id);
  // The open session of `transfer_id` owned by `peer_site` (or, with
  // `or_relay`, whose chunks `peer_site` relays), or an error.
  absl::StatusOr<std::shared_ptr<Session>> FindSession(const std::string& transfer_id,
                                                       const std::string& peer_site,
                                                       bool or_relay = false);
  // Queues `chunk`, durable by write number `write` of the session, to be
  // read back by read_back_pool_; if it matches its digest and was not
  // written again meanwhile, VerifyStaged skips it.
  void QueueReadBack(const std::shared_ptr<Session>& session,
                     const storage::ChunkDurability& chunk, uint64_t write);
  // Re-reads every staged chunk not read back since its last write and
  // compares it with its acknowledged digest.
  absl::Status VerifyStaged(Session& session, const absl::flat_hash_set<uint32_t>& skip_files)
      ABSL_NO_THREAD_SAFETY_ANALYSIS;  // caller holds session.mu
  absl::StatusOr<storage::ResolvedDestination> Resolve(const v1::IncomingTransfer& record);
  // Publishes the session's staging (record, dest and staging set), journals
  // PUBLISHED and prunes. Files whose bytes were lost are forgotten, so the
  // sender's next open sends them again.
  absl::Status PublishLocked(Session& session) ABSL_NO_THREAD_SAFETY_ANALYSIS;  // holds session.mu
  // Counts a refusal of `peer_site` in a configured export.
  void CountRefusal(const std::string& peer_site, const std::string& export_name);
  storage::PublishOptions PublishOptionsOf(const v1::IncomingTransfer& record) const;
  // `longhaul sync --keep`: the source site's old checkpoints beside the
  // destination go. Failures are logged; the transfer succeeded anyway.
  // Returns the names of the checkpoints removed.
  std::vector<std::string> PruneOldCheckpoints(const v1::IncomingTransfer& record,
                                               const storage::ResolvedDestination& dest);
  // Reserves `bytes` of `site`'s budget, waiting up to kBudgetWait (less at
  // shutdown) for other channels to release some. False: nothing reserved.
  bool WaitForBudget(const std::string& site, uint64_t bytes) ABSL_LOCKS_EXCLUDED(mu_);
  // Whether a destination of an export exists (true when it cannot tell).
  bool DestinationExists(const std::string& export_name, const std::string& relative);
  // Waits until no other publish into `path` runs, and claims it.
  void LockDestination(const std::string& path) ABSL_LOCKS_EXCLUDED(publish_mu_);
  void UnlockDestination(const std::string& path) ABSL_LOCKS_EXCLUDED(publish_mu_);

  const ReceiverOptions options_;
  storage::Journal& journal_;
  storage::FileSystem& fs_;
  std::unique_ptr<PeerMemoryBudget> own_budget_;
  PeerMemoryBudget* budget_;
  const Clock& clock_;
  std::vector<storage::Export> exports_;
  // For the host paths in messages to peers (ForPeer).
  std::vector<ExportRoot> export_roots_;
  DurabilityCommitter committer_;
  // Shared with the DATA channels, so that it outlives every lease.
  std::shared_ptr<storage::BufferPool> piece_buffers_;
  DestinationAuthority authority_;
  ContentCheckBudget content_check_budget_;

  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<Session>> sessions_ ABSL_GUARDED_BY(mu_);
  // Every channel Serve is serving; closed at shutdown.
  transport::ChannelRegistry channels_;
  bool shutting_down_ ABSL_GUARDED_BY(mu_) = false;
  std::thread sweep_thread_;
  // The sweep's wake-ups, under a lock of their own: a leaf, taken under
  // session locks (mu_ is taken before them). A staging left by a failing
  // or full file system, faults that usually pass, is tried again after
  // seconds, backing off to the sweep's interval, not an interval later.
  void NoteStagingLeft() ABSL_LOCKS_EXCLUDED(sweep_mu_);
  absl::Mutex sweep_mu_;
  bool sweep_stop_ ABSL_GUARDED_BY(sweep_mu_) = false;
  bool staging_left_ ABSL_GUARDED_BY(sweep_mu_) = false;
  ReceiverStats stats_ ABSL_GUARDED_BY(mu_);
  std::atomic<uint64_t> staged_corruptions_{0};
  std::atomic<uint64_t> bytes_read_back_receiving_{0};
  std::atomic<uint64_t> bytes_read_back_at_publish_{0};
  // Its own lock: refusals are counted while a session lock is held, and
  // mu_ is taken before session locks elsewhere.
  mutable absl::Mutex refused_mu_;
  std::map<std::pair<std::string, std::string>, uint64_t> access_refused_
      ABSL_GUARDED_BY(refused_mu_);
  absl::Mutex publish_mu_;
  // Destinations (absolute paths) with a publish running.
  absl::flat_hash_set<std::string> publishing_ ABSL_GUARDED_BY(publish_mu_);
  // Last, so that it is destroyed first: its tasks use the members above.
  ReadBackPool read_back_pool_;
};

}  // namespace longhaul::peer

#endif  // LONGHAUL_DAEMON_PEER_RECEIVER_H_
