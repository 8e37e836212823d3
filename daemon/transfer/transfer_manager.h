#ifndef LONGHAUL_DAEMON_TRANSFER_TRANSFER_MANAGER_H_
#define LONGHAUL_DAEMON_TRANSFER_TRANSFER_MANAGER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/units.h"
#include "daemon/config.h"
#include "daemon/peer/destination_authority.h"
#include "daemon/peer/sender.h"
#include "daemon/transfer/destination_access.h"
#include "daemon/transfer/source_access.h"
#include "daemon/transport/transport.h"
#include "longhaul/v1/control.pb.h"
#include "longhaul/v1/journal.pb.h"
#include "storage/journal.h"

namespace longhaul::daemon {

// The source side's scheduler: accepts transfers, journals them, runs up to
// transfer.max_active at once (exchange before checkpoint before background,
// then oldest first), and carries each to an end state. Pause, resume and
// cancel act at chunk boundaries. After a restart, Start() picks up every
// transfer that was queued or running.
//
// When the journal becomes unwritable (a full state disk), running
// transfers are paused at their next acknowledged chunk and queued ones as
// they would start, each with an error naming the state directory and the
// `longhaul resume` to run once it is fixed; Resume refuses while the
// journal still cannot record it. Status and listing keep answering from
// memory.
//
// Pull and third-party copy (daemon/transfer/remote_copy.h). A spec whose
// source_site is another site is a *remote* transfer: Submit asks that site
// to push the path (RemoteSubmitRequest) and journals a record under the id
// the source gave, which is also the id at the destination. That record is
// never run here: Get, List and AwaitStatus ask the source for its state (at
// most every kRemoteRefresh), Cancel asks the source to cancel, and Pause,
// Resume and Verify say to use them at the source. When this site is the
// destination (a pull), the source may write that one destination with that
// one transfer while the pull has not ended (PullGranted), though it is not
// one of the export's writers, and only where the caller who asked for the
// pull could write itself (DestinationAccess): checked at submit, and again
// at the source's open and commit. What a source answers is refused past
// kMaxRemoteMessage and kept fitted to it, its error cut at kMaxRemoteError,
// so a source cannot grow this site's journal or memory. The source side of
// the same protocol is ServeRemote.
//
// Thread-safe.
class TransferManager {
 public:
  // `transports` must hold "tcp"; transfers may pick any other by name.
  // `clock` times runs (Now) and dates records (WallNow); it must outlive
  // the manager.
  TransferManager(const DaemonConfig& config, const transport::TransportSet& transports,
                  storage::Journal& journal, longhaul::peer::PriorityGate& gate,
                  const Clock& clock = RealClock::Get());
  ~TransferManager();

  // Operators' rate caps for every sender this manager starts (nullptr:
  // none). Call before Start(); `limiter` must outlive the manager.
  void SetRateLimiter(longhaul::peer::RateLimiter* limiter) { rate_limiter_ = limiter; }

  // Loads the journal and resumes unfinished transfers.
  absl::Status Start();
  // Drains running transfers (chunks in flight finish) and keeps them
  // resumable. Idempotent.
  void Shutdown();

  // Idempotent by `request_id`: a retried request returns the first one's
  // transfer. The sources must be ones `caller` may send (SourceAccess);
  // otherwise PermissionDenied, naming the path and the exports, and
  // nothing is journaled.
  absl::StatusOr<v1::TransferStatus> Submit(const std::string& request_id, v1::TransferSpec spec,
                                            const Caller& caller);
  absl::StatusOr<v1::TransferStatus> Get(const std::string& id);
  // Waits until the status of transfer `id` satisfies `done` and returns
  // it, or returns the latest status once `timeout` (on the clock) passes
  // first: the caller judges it. Wakes on every change of the transfer's
  // state or progress; `seconds` and the rate, which move with time alone,
  // are looked at again at least every 50 ms. NotFound for an unknown id.
  absl::StatusOr<v1::TransferStatus> AwaitStatus(
      const std::string& id, absl::FunctionRef<bool(const v1::TransferStatus&)> done,
      absl::Duration timeout);
  // Transfers this site sends or asked another site to send; with `all`,
  // ended ones too, and incoming transfers that EXPIRED here (see
  // peer::Receiver). Without `with_remote`, only what this site sends, and
  // no source site is asked anything (for metrics: another site's bytes are
  // not this site's).
  std::vector<v1::TransferStatus> List(bool all, bool with_remote = true);
  // Stops the transfer and tells the destination to drop its staging. When
  // the destination answers that it had already published the transfer, the
  // transfer is COMPLETED instead and the answer is FailedPrecondition
  // saying so. When the destination cannot be reached or refuses, the
  // transfer is CANCELLED all the same, and the destination is asked again
  // every kAbortRetry until it has dropped the staging. After a restart,
  // the destinations of every transfer cancelled within the last
  // peer_limits.incoming_expiry are asked again the same way (past it, the
  // destination has expired the staging itself).
  // A second Cancel while one is in progress is FailedPrecondition.
  absl::StatusOr<v1::TransferStatus> Cancel(const std::string& id);
  absl::StatusOr<v1::TransferStatus> Pause(const std::string& id);
  absl::StatusOr<v1::TransferStatus> Resume(const std::string& id);
  // Re-reads the source and the published destination and compares digests.
  absl::StatusOr<v1::VerifyResponse> Verify(const std::string& id);
  v1::PeersResponse Peers(bool probe);

  // Source side of pull and third-party copy: answers the requests of one
  // REMOTE channel until it closes. The requester is channel.peer_site().
  void ServeRemote(transport::Channel& channel);
  // A RemoteSubmitRequest from `requester`: CheckRemoteSubmit, then the path
  // is resolved inside that one export with the daemon's rights (never its
  // secrets nor the export's .longhaul) and pushed like a local submit.
  // Idempotent by (requester, request_id).
  absl::StatusOr<v1::TransferStatus> SubmitForPeer(const std::string& requester,
                                                   const std::string& request_id,
                                                   v1::TransferSpec spec);
  // Status and cancel of a transfer `requester` asked for; NotFound for any other.
  absl::StatusOr<v1::TransferStatus> GetForPeer(const std::string& requester,
                                                const std::string& id);
  absl::StatusOr<v1::TransferStatus> CancelForPeer(const std::string& requester,
                                                   const std::string& id);

  // Destination side of a pull issued here (DestinationAuthority's
  // pull_granted): whether `change` (transfer `transfer_id` of `source`
  // into `dest_path` of export `export_name`) is this site's asking: the
  // pull of that id, not yet ended, or (while the source has not answered
  // with the id) a pull of that path being submitted; NotFound otherwise.
  // Then, unless the change writes nothing (`published`), the pull's
  // requester must still be allowed to write there (DestinationAccess):
  // PermissionDenied saying why.
  absl::Status PullGranted(const longhaul::peer::DestinationAuthority::Change& change) const;

  // How stale a remote transfer's status may be before Get asks its source again.
  static constexpr absl::Duration kRemoteRefresh = absl::Milliseconds(500);
  // How often destinations that did not confirm a cancel are asked again.
  static constexpr absl::Duration kAbortRetry = absl::Seconds(5);

 private:
  enum class StopReason { kNone, kPause, kCancel, kShutdown };
  struct Transfer {
    // `on_change` is told of every progress update.
    explicit Transfer(std::function<void()> on_change) : progress(std::move(on_change)) {}

    v1::OutgoingTransfer record;
    longhaul::peer::TransferProgress progress;
    // A TransferSender, or a FanoutSender for a transfer with legs.
    std::unique_ptr<longhaul::peer::OutgoingRun> sender;
    StopReason stop_reason = StopReason::kNone;
    // Cancel is waiting for the destination's answer: nothing else may
    // start, pause or resume the transfer meanwhile.
    bool cancelling = false;
    // Monotonic start of the current run (clock_); unset while not running.
    std::optional<Timestamp> running_since;
    uint64_t run_start_bytes = 0;
    // Set when the transfer is paused because the journal cannot be written:
    // what happened and what to do, shown as its error while PAUSED.
    std::string journal_error;
    // A remote transfer (IsRemote): its status as the source last answered,
    // when it answered (clock_), and why the last question failed.
    std::optional<v1::TransferStatus> remote_status;
    std::optional<Timestamp> remote_asked;
    std::string remote_error;
  };
  // A pull being submitted: the destination it lets the source write, and
  // the caller whose right to write there it is.
  struct PullGrant {
    std::string source_site, export_name, dest_path;
    Caller caller;
  };

  // Submits a push of local files `spec.sources`, checked by `access` for `caller`.
  absl::StatusOr<v1::TransferStatus> SubmitLocal(const std::string& request_id,
                                                 v1::TransferSpec spec, const Caller& caller,
                                                 const SourceAccess& access);
  // Submits a spec whose source_site is set (see the class comment).
  absl::StatusOr<v1::TransferStatus> SubmitRemote(const std::string& request_id,
                                                  v1::TransferSpec spec, const Caller& caller);
  // Whether `record` is a transfer another site sends on this site's request.
  bool IsRemote(const v1::OutgoingTransfer& record) const;
  // Asks the source of remote transfer `id` for its status, unless it
  // answered less than kRemoteRefresh ago or the transfer has ended.
  void RefreshRemote(const std::string& id) ABSL_LOCKS_EXCLUDED(mu_);
  // Takes the source's answer `status` as remote transfer `t`'s state.
  void ApplyRemoteLocked(Transfer& t, const v1::TransferStatus& status)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  v1::TransferStatus RemoteStatusOf(const Transfer& t) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Asks the destination to decide an open of `record` with nothing kept
  // (OpenRequest.check_only); returns its answer.
  absl::StatusOr<v1::OpenReply> CheckWithDestination(const v1::OutgoingTransfer& record);
  // Before a submit returns an id: the destination's refusal (a missing
  // export, a bad path, no permission, cp onto something else) becomes
  // InvalidArgument or PermissionDenied naming the destination. A
  // destination not reachable now passes (the open checks it again), except
  // for a dry run. With `dry_run`, fills it with what the transfer would
  // send, replace and delete.
  absl::Status CheckBeforeSubmit(const v1::OutgoingTransfer& record, v1::TransferStatus* dry_run);
  // Checks spec.also and plans `record`'s fan-out legs (no also: none).
  absl::Status PlanFanout(v1::OutgoingTransfer& record) const;
  // Re-hashes the source of `record` and compares it with what destination
  // `site` published as transfer `transfer_id`; mismatches go to `response`
  // prefixed with `prefix`.
  absl::Status VerifyDestination(const v1::OutgoingTransfer& record, const std::string& site,
                                 const std::string& transfer_id, const std::string& prefix,
                                 v1::VerifyResponse& response);
  // Asks the source of remote transfer `record` to cancel it.
  absl::StatusOr<v1::TransferStatus> CancelRemote(const v1::OutgoingTransfer& record);
  // The refusal of `what` ("paused") for a remote transfer: it is done at its source.
  absl::Status RunsElsewhere(const v1::OutgoingTransfer& record, absl::string_view what) const;

  void ScheduleLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // False if the transfer could not start: its journal write failed, and it
  // is PAUSED with that error.
  bool StartLocked(Transfer& t) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RunTransfer(Transfer* t);
  // Pauses a transfer that stopped for, or whose writes would fail on, an
  // unwritable journal (`error`, IsJournalUnwritable), with an error that
  // says what to do. Running transfers are drained, not waited for.
  void PauseForJournalLocked(Transfer& t, const absl::Status& error)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Stops a running transfer and waits (bounded) until it has stopped.
  void StopLocked(Transfer& t, StopReason reason) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  v1::TransferStatus StatusOf(const Transfer& t) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<Transfer*> FindLocked(const std::string& id) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Writes the record (unsynced); failures are logged and returned. Every
  // change of a record comes through here, so it also wakes AwaitStatus.
  absl::Status PersistLocked(Transfer& t) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::unique_ptr<Transfer> NewTransfer();
  // A transfer's status may have changed: wakes AwaitStatus.
  void NoteChange() ABSL_LOCKS_EXCLUDED(changes_mu_);
  // Tells the destination to drop the staging of `record`. True when it
  // answered that it had published the transfer already (so nothing was
  // dropped); an error when it could not be asked or refused.
  absl::StatusOr<bool> AbortRemote(const std::string& site, const std::string& transfer_id);
  // The destination site of `transfer_id`: `record`'s own (its id), or
  // that of the fan-out leg with that id. Empty when there is none.
  static std::string DestinationOf(const v1::OutgoingTransfer& record,
                                   const std::string& transfer_id);
  // The destination transfer ids (its own, or its legs') whose staging a
  // cancel or a failure of `record` removes.
  static std::vector<std::string> AbortedAt(const v1::OutgoingTransfer& record);
  // Asks every destination in aborts_pending_ again (AbortRemote), and
  // forgets those that answered. Not under mu_: a dial may take a while.
  void RetryPendingAborts() ABSL_LOCKS_EXCLUDED(mu_);
  // Runs RetryPendingAborts every kAbortRetry until Shutdown.
  void AbortRetryLoop() ABSL_LOCKS_EXCLUDED(mu_);

  const DaemonConfig& config_;
  const transport::TransportSet transports_;
  transport::Transport& control_transport_;  // "tcp"
  longhaul::peer::PriorityGate& gate_;
  storage::Journal& journal_;
  const Clock& clock_;
  longhaul::peer::RateLimiter* rate_limiter_ = nullptr;
  const SourceAccess source_access_;
  // Where a pull issued here may write for its caller.
  const DestinationAccess destination_access_;

  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::unique_ptr<Transfer>> transfers_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, transport::LinkStats> link_stats_ ABSL_GUARDED_BY(mu_);
  int running_threads_ ABSL_GUARDED_BY(mu_) = 0;
  bool shutting_down_ ABSL_GUARDED_BY(mu_) = false;
  // Changes of any transfer's status, counted so that AwaitStatus misses
  // none between its look and its wait. A leaf lock: taken alone or under
  // mu_ (progress updates come from sender threads and from under mu_).
  mutable absl::Mutex changes_mu_ ABSL_ACQUIRED_AFTER(mu_);
  uint64_t changes_ ABSL_GUARDED_BY(changes_mu_) = 0;
  absl::Mutex submit_mu_;  // makes request-id lookup and insert one step
  std::vector<PullGrant> pending_pulls_ ABSL_GUARDED_BY(mu_);
  // Cancelled and failed transfers (by id) whose destinations (transfer ids
  // there) have not confirmed that they dropped the staging.
  absl::flat_hash_map<std::string, std::vector<std::string>> aborts_pending_ ABSL_GUARDED_BY(mu_);
  // AbortRetryLoop; started by Start, joined by Shutdown.
  std::thread abort_retry_thread_;
};

bool IsEndState(v1::TransferState state);

// How `ls --all` shows an EXPIRED incoming record of this site (`config`):
// state EXPIRED, the destination, and what it held when it expired.
v1::TransferStatus ExpiredStatus(const v1::IncomingTransfer& record, const DaemonConfig& config);

}  // namespace longhaul::daemon

#endif  // LONGHAUL_DAEMON_TRANSFER_TRANSFER_MANAGER_H_
