#include "daemon/transfer/transfer_manager.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <limits>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/checkpoints.h"
#include "common/clock.h"
#include "common/fmt_absl.h"
#include "daemon/peer/messaging.h"
#include "daemon/transfer/fanout_sender.h"
#include "daemon/transfer/session_options.h"
#include "daemon/wire/messaging.h"
#include "spdlog/spdlog.h"
#include "storage/chunk_io.h"
#include "storage/chunk_plan.h"
#include "storage/file_io.h"
#include "storage/file_system.h"
#include "storage/manifest.h"
#include "storage/retention.h"

namespace longhaul::daemon {
namespace {

// How long Pause and Shutdown let chunks in flight finish before cutting them.
constexpr absl::Duration kDrainTimeout = absl::Seconds(20);
// AwaitStatus's longest wait between looks: `seconds` and the rate move
// without a change to wake it, and a FakeClock moves without one too.
constexpr TimeDelta kAwaitPoll = TimeDelta::Milliseconds(50);

std::string NewTransferId() {
  absl::BitGen gen;
  return absl::StrFormat("t-%016x", absl::Uniform<uint64_t>(gen));
}

// What a transfer stopped by an unwritable journal shows: the journal's
// error and the operator's way out.
std::string JournalPauseError(const absl::Status& journal_error, const std::string& id) {
  return absl::StrCat(journal_error.message(), ": ",
                      journal_error.code() == absl::StatusCode::kResourceExhausted
                          ? "free space"
                          : "repair the state disk",
                      ", then `longhaul resume ", id, "`");
}

// The bytes `record` plans to deliver: its manifest's, once per destination
// of a fan-out.
uint64_t PlannedTotalBytes(const v1::OutgoingTransfer& record) {
  uint64_t total = 0;
  for (const auto& f : record.manifest().files()) {
    total += storage::PlannedBytes(f, record.manifest().chunk_size());
  }
  return total * std::max(1, record.legs_size());
}

}  // namespace

v1::TransferStatus ExpiredStatus(const v1::IncomingTransfer& record, const DaemonConfig& config) {
  v1::TransferStatus status;
  status.set_id(record.id());
  status.set_state(v1::EXPIRED);
  status.mutable_spec()->set_dest_site(config.site);
  status.mutable_spec()->set_dest_export(record.export_name());
  status.mutable_spec()->set_dest_path(record.dest_path());
  status.set_files(record.expired_files());
  status.set_bytes_total(record.expired_bytes());
  status.set_created_unix_ms(record.created_unix_ms());
  status.set_finished_unix_ms(record.ended_unix_ms());
  status.set_error(
      absl::StrCat("incoming from ", record.source_site(), ": no activity for ",
                   absl::FormatDuration(absl::Microseconds(config.peer_limits.incoming_expiry_us)),
                   "; its staged data was removed"));
  return status;
}

bool IsEndState(v1::TransferState state) {
  return state == v1::COMPLETED || state == v1::FAILED || state == v1::CANCELLED ||
         state == v1::EXPIRED;
}

TransferManager::TransferManager(const DaemonConfig& config,
                                 const transport::TransportSet& transports,
                                 storage::Journal& journal, peer::PriorityGate& gate,
                                 const Clock& clock)
    : config_(config),
      transports_(transports),
      control_transport_(*transport::FindTransport(transports, "tcp")),
      gate_(gate),
      journal_(journal),
      clock_(clock),
      source_access_(config.exports, DaemonSecrets(config)),
      destination_access_(config.exports, DaemonSecrets(config)) {}

TransferManager::~TransferManager() { Shutdown(); }

absl::Status TransferManager::Start() {
  auto records = journal_.ListOutgoing();
  if (!records.ok()) return records.status();
  absl::MutexLock lock(&mu_);
  int resumed = 0;
  for (v1::OutgoingTransfer& record : *records) {
    std::unique_ptr<Transfer> t = NewTransfer();
    // A remote transfer's state is the source's, asked for again on Get.
    if (!IsRemote(record) && (record.state() == v1::RUNNING || record.state() == v1::PUBLISHING)) {
      record.set_state(v1::QUEUED);
      ++resumed;
    }
    t->progress.Update([&](peer::TransferProgress::Snapshot& s) {
      s.bytes_done = record.bytes_done();
      s.chunks_done = record.chunks_done();
      s.bytes_sent = record.bytes_sent();
      s.resent_bytes = record.resent_bytes();
      s.files_unchanged = record.files_unchanged();
      s.attempts = record.attempts();
      s.error = record.error();
      s.bytes_total = PlannedTotalBytes(record);
    });
    t->record = std::move(record);
    transfers_[t->record.id()] = std::move(t);
  }
  if (resumed > 0) spdlog::info("resuming {} unfinished transfers from the journal", resumed);
  // A cancel's or a failure's abort may not have reached its destination
  // before the restart: ask again while the destination may still hold the
  // staging.
  const int64_t recent_ms =
      absl::ToUnixMillis(clock_.WallNow()) - config_.peer_limits.incoming_expiry_us / 1000;
  for (const auto& [id, t] : transfers_) {
    if ((t->record.state() == v1::CANCELLED || t->record.state() == v1::FAILED) &&
        !IsRemote(t->record) && t->record.finished_unix_ms() >= recent_ms) {
      aborts_pending_[id] = AbortedAt(t->record);
    }
  }
  ScheduleLocked();
  if (!shutting_down_ && !abort_retry_thread_.joinable()) {
    abort_retry_thread_ = std::thread([this] { AbortRetryLoop(); });
  }
  return absl::OkStatus();
}

void TransferManager::Shutdown() {
  {
    absl::MutexLock lock(&mu_);
    if (shutting_down_) return;
    shutting_down_ = true;
  }
  // It ends at its next look at shutting_down_ (a question to a destination
  // in progress is answered or times out first).
  if (abort_retry_thread_.joinable()) abort_retry_thread_.join();
  absl::MutexLock lock(&mu_);
  for (auto& [id, t] : transfers_) {
    if (t->sender) {
      t->stop_reason = StopReason::kShutdown;
      t->sender->Drain();
    }
  }
  auto none_running = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return running_threads_ == 0; };
  if (!mu_.AwaitWithTimeout(absl::Condition(&none_running), kDrainTimeout)) {
    spdlog::warn("chunks still in flight after {}; stopping them",
                 absl::FormatDuration(kDrainTimeout));
    for (auto& [id, t] : transfers_) {
      if (t->sender) t->sender->Stop();
    }
    mu_.Await(absl::Condition(&none_running));
  }
}

absl::StatusOr<v1::TransferStatus> TransferManager::Submit(const std::string& request_id,
                                                           v1::TransferSpec spec,
                                                           const Caller& caller) {
  if (!spec.source_site().empty() || !spec.source_export().empty() || !spec.source_path().empty()) {
    if (!spec.also().empty()) {
      return absl::InvalidArgumentError(
          "a fan-out (--also) needs local sources; pull to one site, then fan out from there");
    }
    return SubmitRemote(request_id, std::move(spec), caller);
  }
  if (!spec.requested_by().empty()) {
    return absl::InvalidArgumentError("requested_by is set by a source site only");
  }
  return SubmitLocal(request_id, std::move(spec), caller, source_access_);
}

absl::StatusOr<v1::TransferStatus> TransferManager::SubmitLocal(const std::string& request_id,
                                                                v1::TransferSpec spec,
                                                                const Caller& caller,
                                                                const SourceAccess& access) {
  absl::MutexLock submit_lock(&submit_mu_);
  if (!request_id.empty()) {
    auto existing = journal_.LookupRequest(request_id);
    if (!existing.ok()) return existing.status();
    if (*existing) return Get(**existing);
  }
  if (spec.sources().empty()) return absl::InvalidArgumentError("no source given");
  for (const std::string& source : spec.sources()) {
    if (source.empty() || source[0] != '/') {
      return absl::InvalidArgumentError(
          absl::StrCat("source '", source, "' must be an absolute path"));
    }
  }
  // Before anything else may answer with a transfer (a sync attaching).
  const std::vector<std::string> sources(spec.sources().begin(), spec.sources().end());
  auto resolved = access.CheckSources(caller, sources);
  if (!resolved.ok()) return resolved.status();
  if (spec.sync()) {
    // Overlapping cron runs: a second sync of the same sources to the same
    // destination attaches to the one not yet ended instead of racing it.
    // Only the same requester's: another would see its transfer, and a
    // cancel of either would end both.
    absl::MutexLock lock(&mu_);
    for (const auto& [id, t] : transfers_) {
      const v1::TransferSpec& other = t->record.spec();
      if (other.sync() && !spec.dry_run() && !IsEndState(t->record.state()) &&
          t->record.submitted_by() == caller.RequesterKey() &&
          other.dest_site() == spec.dest_site() && other.dest_export() == spec.dest_export() &&
          other.dest_path() == spec.dest_path() &&
          std::equal(other.sources().begin(), other.sources().end(), spec.sources().begin(),
                     spec.sources().end())) {
        spdlog::info("sync to {}:/{}/{} attaches to transfer {}, which is still {}",
                     spec.dest_site(), spec.dest_export(), spec.dest_path(), id,
                     v1::TransferState_Name(t->record.state()));
        return StatusOf(*t);
      }
    }
  }
  if (absl::Status s = ValidateCheckpointMarker(spec.checkpoint_marker()); !s.ok()) {
    return s;
  }
  if (spec.keep_checkpoints() > 0 && spec.checkpoint_marker().empty()) {
    return absl::InvalidArgumentError(
        "keep_checkpoints needs checkpoint_marker, the file a finished checkpoint holds: only "
        "checkpoints holding it are counted and pruned at the destination");
  }
  if (spec.no_delete() && !spec.sync()) {
    return absl::InvalidArgumentError(
        "no_delete keeps destination files the source lacks, so it applies to sync only");
  }
  if (spec.replace() && spec.sync()) {
    return absl::InvalidArgumentError(
        "replace applies to cp only: sync always updates the destination");
  }
  if (spec.checksum() && !spec.sync()) {
    return absl::InvalidArgumentError(
        "checksum compares files already at the destination, so it applies to sync only");
  }
  for (const std::string& source : spec.sources()) {
    if (source.empty() || source[0] != '/') {
      return absl::InvalidArgumentError(
          absl::StrCat("source '", source, "' must be an absolute path"));
    }
  }
  if (config_.FindPeer(spec.dest_site()) == nullptr) {
    std::vector<std::string> sites;
    for (const PeerConfig& p : config_.peers) sites.push_back(p.site);
    return absl::InvalidArgumentError(absl::StrCat(
        "unknown peer site '", spec.dest_site(),
        "'; configured peers: ", sites.empty() ? "(none)" : absl::StrJoin(sites, ", ")));
  }
  if (spec.dest_export().empty()) {
    return absl::InvalidArgumentError("destination must be SITE:/EXPORT/PATH (no export given)");
  }
  if (spec.streams() > 64) return absl::InvalidArgumentError("streams must be between 1 and 64");
  if (spec.streams() == 0) {
    const PeerConfig* peer = config_.FindPeer(spec.dest_site());
    spec.set_streams(peer->streams ? peer->streams : config_.transfer.streams);
  }
  if (spec.chunk_size() == 0) spec.set_chunk_size(config_.transfer.chunk_size);
  if (spec.chunk_size() < (64u << 10) || spec.chunk_size() > config_.transfer.max_chunk_size) {
    return absl::InvalidArgumentError(absl::StrCat("chunk size must be between 64KiB and ",
                                                   config_.transfer.max_chunk_size, " bytes"));
  }
  if (spec.transport().empty()) spec.set_transport(config_.FindPeer(spec.dest_site())->transport);
  if (transport::FindTransport(transports_, spec.transport()) == nullptr) {
    std::vector<std::string> names;
    for (const auto& [name, t] : transports_) names.push_back(name);
    return absl::InvalidArgumentError(
        absl::StrCat("unknown transport '", spec.transport(),
                     "' (this daemon runs: ", absl::StrJoin(names, ", "), ")"));
  }

  absl::StatusOr<storage::SymlinkPolicy> symlinks = storage::ParseSymlinkPolicy(spec.symlinks());
  if (!symlinks.ok()) return symlinks.status();
  storage::ManifestOptions manifest_options;
  manifest_options.symlinks = *symlinks;
  manifest_options.hard_links = spec.hard_links();
  auto built = storage::BuildManifest(sources, spec.chunk_size(), manifest_options);
  if (!built.ok()) return built.status();
  if (absl::Status s = access.CheckBuild(caller, sources, *resolved, &*built); !s.ok()) {
    return s;
  }
  if (built->single_file && spec.dest_path().empty()) {
    return absl::InvalidArgumentError("copying a single file needs a destination file name");
  }

  v1::OutgoingTransfer record;
  record.set_id(NewTransferId());
  record.set_request_id(request_id);
  record.set_submitted_by(caller.RequesterKey());
  *record.mutable_manifest() = std::move(built->manifest);
  for (std::string& p : built->source_paths) record.add_source_paths(std::move(p));
  for (storage::SkippedEntry& e : built->skipped) {
    v1::SkippedEntry* skipped = record.add_skipped();
    skipped->set_path(std::move(e.path));
    skipped->set_why(std::move(e.why));
  }
  record.set_single_file(built->single_file);
  for (const std::string& g : config_.transfer.commit_last) record.add_commit_last(g);
  for (const std::string& g : spec.commit_last()) record.add_commit_last(g);
  *record.mutable_spec() = std::move(spec);
  if (absl::Status s = PlanFanout(record); !s.ok()) return s;
  if (record.spec().dry_run()) {
    v1::TransferStatus would;
    *would.mutable_spec() = record.spec();
    would.set_files(record.manifest().files_size());
    if (absl::Status s = CheckBeforeSubmit(record, &would); !s.ok()) return s;
    return would;  // nothing journaled, no id
  }
  if (absl::Status s = CheckBeforeSubmit(record, nullptr); !s.ok()) return s;
  record.set_state(v1::QUEUED);
  record.set_created_unix_ms(absl::ToUnixMillis(clock_.WallNow()));

  absl::Status persisted = request_id.empty() ? journal_.PutOutgoing(record, /*sync=*/true)
                                              : journal_.PutOutgoingWithRequest(record, request_id);
  if (!persisted.ok()) return persisted;

  absl::MutexLock lock(&mu_);
  if (shutting_down_) return absl::UnavailableError("daemon is shutting down");
  std::unique_ptr<Transfer> t = NewTransfer();
  const uint64_t total = PlannedTotalBytes(record);
  t->progress.Update([&](peer::TransferProgress::Snapshot& s) { s.bytes_total = total; });
  t->record = std::move(record);
  Transfer& ref = *t;
  transfers_[ref.record.id()] = std::move(t);
  spdlog::info("transfer {} queued for {}: {} files, {} bytes to {}:/{}/{}", ref.record.id(),
               caller.ToString(), ref.record.manifest().files_size(), total,
               ref.record.spec().dest_site(), ref.record.spec().dest_export(),
               ref.record.spec().dest_path());
  ScheduleLocked();
  return StatusOf(ref);
}

absl::Status TransferManager::PlanFanout(v1::OutgoingTransfer& record) const {
  const v1::TransferSpec& spec = record.spec();
  if (spec.also().empty()) return absl::OkStatus();
  std::vector<std::string> sites = {spec.dest_site()};
  for (const v1::Destination& d : spec.also()) {
    if (config_.FindPeer(d.site()) == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown peer site '", d.site(), "' in --also"));
    }
    if (d.export_name().empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--also ", d.site(), ": a destination must be SITE:/EXPORT/PATH"));
    }
    if (record.single_file() && d.path().empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--also ", d.site(), ": copying a single file needs a destination file name"));
    }
    // A site relays to the next: it cannot be its own relay nor relay twice.
    if (std::find(sites.begin(), sites.end(), d.site()) != sites.end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "site ", d.site(), " is named twice; each destination of a fan-out is another site"));
    }
    sites.push_back(d.site());
  }
  for (v1::FanoutLeg& leg : PlanFanoutLegs(record.id(), spec)) *record.add_legs() = std::move(leg);
  return absl::OkStatus();
}

void TransferManager::ScheduleLocked() {
  if (shutting_down_) return;
  int running = 0;
  std::vector<Transfer*> queued;
  for (auto& [id, t] : transfers_) {
    if (t->sender) ++running;
    if (t->record.state() == v1::QUEUED && !t->sender && !t->cancelling && !IsRemote(t->record)) {
      queued.push_back(t.get());
    }
  }
  std::sort(queued.begin(), queued.end(), [](const Transfer* a, const Transfer* b) {
    int pa = peer::PriorityGate::Rank(a->record.spec().priority());
    int pb = peer::PriorityGate::Rank(b->record.spec().priority());
    if (pa != pb) return pa < pb;
    return a->record.created_unix_ms() < b->record.created_unix_ms();
  });
  for (Transfer* t : queued) {
    if (running >= static_cast<int>(config_.transfer.max_active)) break;
    if (StartLocked(*t)) ++running;
  }
}

bool TransferManager::StartLocked(Transfer& t) {
  t.record.set_state(v1::RUNNING);
  t.stop_reason = StopReason::kNone;
  t.journal_error.clear();
  if (absl::Status s = PersistLocked(t); storage::IsJournalUnwritable(s)) {
    PauseForJournalLocked(t, s);
    return false;
  }
  t.running_since = clock_.Now();
  t.run_start_bytes = t.progress.Get().bytes_done;
  std::string site = t.record.spec().dest_site();
  transport::Transport* data = transport::FindTransport(transports_, t.record.spec().transport());
  if (data == nullptr) data = &control_transport_;  // journaled before that transport was removed
  peer::LinkObserver observer = [this, tp = &t](const std::string& peer_site,
                                                const transport::LinkStats& stats) {
    absl::MutexLock lock(&mu_);
    link_stats_[peer_site] = stats;
    // Called after every chunk acknowledged durable. The sender journals
    // its counters before each chunk and carries on when that fails, so
    // this is where a journal gone unwritable stops the transfer.
    if (absl::Status journal = journal_.writable(); !journal.ok()) {
      PauseForJournalLocked(*tp, journal);
    }
  };
  if (t.record.legs_size() > 0) {
    t.sender = std::make_unique<FanoutSender>(config_, transports_, gate_, journal_, t.record,
                                              t.progress, std::move(observer), clock_);
  } else {
    peer::SenderOptions options = SenderOptionsFor(config_, site);
    options.clock = &clock_;
    t.sender =
        std::make_unique<peer::TransferSender>(std::move(options), control_transport_, *data, gate_,
                                               journal_, t.record, t.progress, std::move(observer));
  }
  t.sender->set_rate_limiter(rate_limiter_);
  ++running_threads_;
  std::thread([this, tp = &t] { RunTransfer(tp); }).detach();
  return true;
}

void TransferManager::PauseForJournalLocked(Transfer& t, const absl::Status& error) {
  if (!t.journal_error.empty()) return;  // already pausing for it
  t.journal_error = JournalPauseError(error, t.record.id());
  spdlog::error("pausing transfer {}: {}", t.record.id(), t.journal_error);
  if (t.sender) {
    // RunTransfer records PAUSED once the chunks in flight are answered.
    if (t.stop_reason == StopReason::kNone) {
      t.stop_reason = StopReason::kPause;
      t.sender->Drain();
    }
    return;
  }
  t.record.set_state(v1::PAUSED);
  t.progress.Update([&](peer::TransferProgress::Snapshot& s) { s.error = t.journal_error; });
  PersistLocked(t).IgnoreError();  // logged; the journal cannot take it yet
}

void TransferManager::RunTransfer(Transfer* t) {
  absl::Status result = t->sender->Run();
  {
    absl::MutexLock lock(&mu_);
    v1::OutgoingTransfer updated = t->sender->record();
    t->record.mutable_manifest()->Swap(updated.mutable_manifest());
    t->record.mutable_legs()->Swap(updated.mutable_legs());
    t->record.set_attempts(updated.attempts());
    if (updated.has_publish_report()) {
      t->record.mutable_publish_report()->Swap(updated.mutable_publish_report());
    }
    t->record.set_active_seconds(t->record.active_seconds() +
                                 (clock_.Now() - *t->running_since).ToSecondsF());
    t->running_since.reset();
    if (result.ok()) {
      t->record.set_state(v1::COMPLETED);
      t->record.clear_error();
      spdlog::info("transfer {} completed", t->record.id());
    } else if (result.code() == absl::StatusCode::kCancelled) {
      switch (t->stop_reason) {
        case StopReason::kPause:
          t->record.set_state(v1::PAUSED);
          break;
        default:
          // Cancel: Cancel sets the end state once the destination answers.
          // Shutdown: stays RUNNING in the journal, resumed on start.
          break;
      }
    } else if (storage::IsJournalUnwritable(result)) {
      t->record.set_state(v1::PAUSED);
      if (t->journal_error.empty()) {
        t->journal_error = JournalPauseError(result, t->record.id());
        spdlog::error("transfer {} paused: {}", t->record.id(), t->journal_error);
      }
    } else {
      t->record.set_state(v1::FAILED);
      t->record.set_error(std::string(result.message()));
      spdlog::error("transfer {} failed: {}", t->record.id(), result.message());
      // A failed transfer is over: its staging at the destination goes, as
      // a cancel's does (asked until the destination confirms).
      if (!IsRemote(t->record)) aborts_pending_[t->record.id()] = AbortedAt(t->record);
    }
    if (t->record.state() == v1::PAUSED && !t->journal_error.empty()) {
      t->progress.Update([&](peer::TransferProgress::Snapshot& s) { s.error = t->journal_error; });
    }
    if (IsEndState(t->record.state())) {
      t->record.set_finished_unix_ms(absl::ToUnixMillis(clock_.WallNow()));
    }
    PersistLocked(*t).IgnoreError();  // logged
    t->sender.reset();
  }
  absl::MutexLock lock(&mu_);
  --running_threads_;
  ScheduleLocked();
}

absl::Status TransferManager::PersistLocked(Transfer& t) {
  peer::TransferProgress::Snapshot s = t.progress.Get();
  t.record.set_bytes_done(s.bytes_done);
  t.record.set_chunks_done(s.chunks_done);
  t.record.set_resent_bytes(s.resent_bytes);
  t.record.set_files_unchanged(s.files_unchanged);
  if (s.bytes_sent > t.record.bytes_sent()) t.record.set_bytes_sent(s.bytes_sent);
  if (!s.error.empty() && t.record.state() != v1::COMPLETED && t.record.error().empty()) {
    t.record.set_error(s.error);
  }
  // Unsynced, so the lock is never held across an fsync: a state written
  // here and lost in an OS crash only makes the transfer run again after
  // reboot, which is safe (the destination answers from its own synced
  // journal and publishing is idempotent). Submit's own write is synced.
  absl::Status st = journal_.PutOutgoing(t.record, /*sync=*/false);
  if (!st.ok()) spdlog::error("cannot journal transfer {}: {}", t.record.id(), st.message());
  NoteChange();
  return st;
}

std::unique_ptr<TransferManager::Transfer> TransferManager::NewTransfer() {
  return std::make_unique<Transfer>([this] { NoteChange(); });
}

void TransferManager::NoteChange() {
  absl::MutexLock lock(&changes_mu_);
  ++changes_;
}

v1::TransferStatus TransferManager::StatusOf(const Transfer& t) const {
  if (IsRemote(t.record)) return RemoteStatusOf(t);
  peer::TransferProgress::Snapshot s = t.progress.Get();
  v1::TransferStatus status;
  status.set_id(t.record.id());
  status.set_state(t.record.state());
  *status.mutable_spec() = t.record.spec();
  status.set_bytes_total(s.bytes_total);
  status.set_bytes_done(s.bytes_done);
  status.set_files(t.record.manifest().files_size());
  status.set_chunks_total(s.chunks_total);
  status.set_chunks_done(s.chunks_done);
  status.set_bytes_sent(std::max<uint64_t>(s.bytes_sent, t.record.bytes_sent()));
  status.set_resent_bytes(s.resent_bytes);
  status.set_active_streams(s.active_streams);
  status.set_files_unchanged(s.files_unchanged);
  *status.mutable_skipped() = t.record.skipped();
  if (t.record.has_publish_report()) *status.mutable_publish_report() = t.record.publish_report();
  status.set_attempts(s.attempts);
  double seconds = t.record.active_seconds();
  if (t.running_since) {
    double run = (clock_.Now() - *t.running_since).ToSecondsF();
    seconds += run;
    if (run > 0) status.set_rate_bytes_per_sec((s.bytes_done - t.run_start_bytes) / run);
  } else if (seconds > 0) {
    status.set_rate_bytes_per_sec(s.bytes_total / seconds);
  }
  status.set_seconds(seconds);
  if (t.record.state() == v1::FAILED) {
    status.set_error(t.record.error());
  } else if (!IsEndState(t.record.state())) {
    status.set_error(s.error);
  }
  status.set_created_unix_ms(t.record.created_unix_ms());
  status.set_finished_unix_ms(t.record.finished_unix_ms());
  const std::vector<v1::FanoutLeg> legs =
      t.sender ? t.sender->legs()
               : std::vector<v1::FanoutLeg>(t.record.legs().begin(), t.record.legs().end());
  for (const v1::FanoutLeg& leg : legs) {
    v1::DestinationStatus* d = status.add_destinations();
    *d->mutable_destination() = leg.destination();
    d->set_transfer_id(leg.transfer_id());
    // A leg not ended shows the transfer's state (queued, paused...).
    d->set_state(IsEndState(leg.state()) ? leg.state() : t.record.state());
    d->set_bytes_total(leg.bytes_total());
    d->set_bytes_done(leg.bytes_done());
    d->set_bytes_sent(leg.bytes_sent());
    d->set_relay_by(leg.relay_by());
    d->set_error(leg.error());
  }
  return status;
}

absl::StatusOr<TransferManager::Transfer*> TransferManager::FindLocked(
    const std::string& id) const {
  auto it = transfers_.find(id);
  if (it == transfers_.end()) return absl::NotFoundError(absl::StrCat("no transfer ", id));
  return it->second.get();
}

absl::StatusOr<v1::TransferStatus> TransferManager::Get(const std::string& id) {
  RefreshRemote(id);
  absl::MutexLock lock(&mu_);
  auto t = FindLocked(id);
  if (!t.ok()) return t.status();
  return StatusOf(**t);
}

absl::StatusOr<v1::TransferStatus> TransferManager::AwaitStatus(
    const std::string& id, absl::FunctionRef<bool(const v1::TransferStatus&)> done,
    absl::Duration timeout) {
  // ToInt64Nanoseconds saturates, and so does the deadline.
  const int64_t wait_ns = absl::ToInt64Nanoseconds(timeout);
  const Timestamp start = clock_.Now();
  const Timestamp deadline = wait_ns >= std::numeric_limits<int64_t>::max() - start.ToNanoseconds()
                                 ? Timestamp::Infinite()
                                 : start + TimeDelta::Nanoseconds(wait_ns);
  while (true) {
    // Counted before the look, so a change after it ends the wait below.
    uint64_t seen;
    {
      absl::MutexLock lock(&changes_mu_);
      seen = changes_;
    }
    absl::StatusOr<v1::TransferStatus> status = Get(id);
    if (!status.ok() || done(*status)) return status;
    const TimeDelta left = deadline - clock_.Now();
    if (left <= TimeDelta::Zero()) return status;
    auto changed = [this, seen]()
                       ABSL_EXCLUSIVE_LOCKS_REQUIRED(changes_mu_) { return changes_ != seen; };
    absl::MutexLock lock(&changes_mu_);
    changes_mu_.AwaitWithTimeout(absl::Condition(&changed),
                                 absl::Nanoseconds(std::min(left, kAwaitPoll).ToNanoseconds()));
  }
}

std::vector<v1::TransferStatus> TransferManager::List(bool all, bool with_remote) {
  std::vector<v1::TransferStatus> out;
  std::vector<std::string> remote;
  if (with_remote) {
    absl::MutexLock lock(&mu_);
    for (const auto& [id, t] : transfers_) {
      if (IsRemote(t->record) && !IsEndState(t->record.state())) remote.push_back(id);
    }
  }
  for (const std::string& id : remote) RefreshRemote(id);
  if (all) {
    // Incoming transfers abandoned by their sender, for the operator.
    auto incoming = journal_.ListIncoming();
    if (!incoming.ok()) {
      spdlog::warn("ls --all: cannot list incoming transfers: {}", incoming.status().message());
    } else {
      for (const v1::IncomingTransfer& r : *incoming) {
        if (r.state() == v1::IncomingTransfer::EXPIRED) out.push_back(ExpiredStatus(r, config_));
      }
    }
  }
  absl::MutexLock lock(&mu_);
  for (const auto& [id, t] : transfers_) {
    if (!with_remote && IsRemote(t->record)) continue;
    if (all || !IsEndState(t->record.state())) out.push_back(StatusOf(*t));
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) {
    return a.created_unix_ms() != b.created_unix_ms() ? a.created_unix_ms() < b.created_unix_ms()
                                                      : a.id() < b.id();
  });
  return out;
}

void TransferManager::StopLocked(Transfer& t, StopReason reason) {
  t.stop_reason = reason;
  if (reason == StopReason::kPause) {
    t.sender->Drain();
  } else {
    t.sender->Stop();
  }
  auto stopped = [&t]() { return t.sender == nullptr; };
  if (!mu_.AwaitWithTimeout(absl::Condition(&stopped), kDrainTimeout) && t.sender) {
    t.sender->Stop();
    mu_.Await(absl::Condition(&stopped));
  }
}

absl::StatusOr<v1::TransferStatus> TransferManager::Cancel(const std::string& id) {
  Transfer* t;
  v1::OutgoingTransfer record;
  {
    absl::MutexLock lock(&mu_);
    auto found = FindLocked(id);
    if (!found.ok()) return found.status();
    t = *found;
    if (IsRemote(t->record)) record = t->record;
  }
  if (IsRemote(record)) return CancelRemote(record);
  {
    absl::MutexLock lock(&mu_);
    if (t->cancelling) {
      return absl::FailedPreconditionError(absl::StrCat("transfer ", id, " is being cancelled"));
    }
    if (t->record.state() == v1::CANCELLED) return StatusOf(*t);
    if (t->record.state() != v1::COMPLETED) {
      t->cancelling = true;
      if (t->sender) StopLocked(*t, StopReason::kCancel);
    }
    if (t->record.state() == v1::COMPLETED) {  // also: its commit answer came before the stop
      t->cancelling = false;
      return absl::FailedPreconditionError(absl::StrCat("transfer ", id, " already completed"));
    }
    record = t->record;
  }
  // Not under mu_: the destination may be in the middle of publishing this
  // transfer and answers only when it is done. A fan-out aborts every
  // destination that has not published; it counts as published only when
  // all had.
  absl::StatusOr<bool> published = true;
  std::vector<std::string> unconfirmed;  // asked again later (RetryPendingAborts)
  for (const std::string& there : AbortedAt(record)) {
    absl::StatusOr<bool> answer = AbortRemote(DestinationOf(record, there), there);
    if (!answer.ok()) unconfirmed.push_back(there);
    if (record.legs_size() == 0 || !answer.ok() || !*answer) published = answer;
  }
  absl::MutexLock lock(&mu_);
  t->cancelling = false;
  t->record.set_finished_unix_ms(absl::ToUnixMillis(clock_.WallNow()));
  if (published.ok() && *published) {
    t->record.set_state(v1::COMPLETED);
    t->record.clear_error();
    t->progress.Update([](peer::TransferProgress::Snapshot& s) { s.error.clear(); });
    PersistLocked(*t).IgnoreError();  // logged
    spdlog::info("transfer {} completed: {} had published it before the cancel arrived", id,
                 record.spec().dest_site());
    return absl::FailedPreconditionError(
        absl::StrCat("transfer ", id, " was not cancelled: ", record.spec().dest_site(),
                     " had already published it, so it is COMPLETED"));
  }
  if (!published.ok()) {
    spdlog::warn("transfer {}: could not remove staging at {} yet ({}); asking again every {}", id,
                 record.spec().dest_site(), published.status().message(),
                 absl::FormatDuration(kAbortRetry));
  }
  if (!unconfirmed.empty()) aborts_pending_[id] = std::move(unconfirmed);
  t->record.set_state(v1::CANCELLED);
  PersistLocked(*t).IgnoreError();  // logged
  return StatusOf(*t);
}

absl::StatusOr<v1::TransferStatus> TransferManager::Pause(const std::string& id) {
  absl::MutexLock lock(&mu_);
  auto found = FindLocked(id);
  if (!found.ok()) return found.status();
  Transfer& t = **found;
  if (IsRemote(t.record)) return RunsElsewhere(t.record, "paused");
  if (t.cancelling) {
    return absl::FailedPreconditionError(absl::StrCat("transfer ", id, " is being cancelled"));
  }
  if (t.sender) {
    StopLocked(t, StopReason::kPause);
  } else if (t.record.state() == v1::QUEUED) {
    t.record.set_state(v1::PAUSED);
    PersistLocked(t).IgnoreError();  // logged
  } else if (t.record.state() != v1::PAUSED) {
    return absl::FailedPreconditionError(absl::StrCat("transfer ", id, " is ",
                                                      v1::TransferState_Name(t.record.state()),
                                                      " and cannot be paused"));
  }
  return StatusOf(t);
}

absl::StatusOr<v1::TransferStatus> TransferManager::Resume(const std::string& id) {
  absl::MutexLock lock(&mu_);
  auto found = FindLocked(id);
  if (!found.ok()) return found.status();
  Transfer& t = **found;
  if (IsRemote(t.record)) return RunsElsewhere(t.record, "resumed");
  if (t.cancelling) {
    return absl::FailedPreconditionError(absl::StrCat("transfer ", id, " is being cancelled"));
  }
  // A failed transfer can be resumed too, once the operator fixed the cause.
  if (t.record.state() == v1::PAUSED || t.record.state() == v1::FAILED) {
    const v1::TransferState state = t.record.state();
    const std::string record_error = t.record.error();
    const std::string shown_error = t.progress.Get().error;
    t.record.set_state(v1::QUEUED);
    t.record.clear_error();
    t.progress.Update([](peer::TransferProgress::Snapshot& s) { s.error.clear(); });
    // Only once the journal can record it: a resume it loses would leave
    // the transfer paused after a restart.
    if (absl::Status s = PersistLocked(t); storage::IsJournalUnwritable(s)) {
      t.record.set_state(state);
      t.record.set_error(record_error);
      t.journal_error = JournalPauseError(s, id);
      t.progress.Update([&](peer::TransferProgress::Snapshot& p) {
        p.error = state == v1::PAUSED ? t.journal_error : shown_error;
      });
      return absl::Status(s.code(), t.journal_error);
    }
    ScheduleLocked();
  } else if (t.record.state() == v1::RUNNING && t.sender) {
    // Waiting to try again after an error: the operator says now.
    t.sender->RetryNow();
  } else if (t.record.state() == v1::COMPLETED || t.record.state() == v1::CANCELLED) {
    return absl::FailedPreconditionError(absl::StrCat(
        "transfer ", id, " has ended (", v1::TransferState_Name(t.record.state()), ")"));
  }
  return StatusOf(t);
}

absl::StatusOr<bool> TransferManager::AbortRemote(const std::string& site,
                                                  const std::string& transfer_id) {
  const PeerConfig* peer = config_.FindPeer(site);
  if (peer == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat("site ", site, " is no longer a peer"));
  }
  v1::Hello hello;
  hello.set_role(v1::Hello::CONTROL);
  hello.set_transfer_id(transfer_id);
  auto channel = peer::DialSession(control_transport_, peer->site, peer->address, hello);
  if (!channel.ok()) return channel.status();
  v1::PeerMessage request;
  request.mutable_abort()->set_transfer_id(transfer_id);
  request.mutable_abort()->set_reason("cancelled by the source site's operator");
  auto answer = peer::Call(**channel, wire::SessionIdFor(transfer_id), request);
  if (!answer.ok()) return answer.status();
  return answer->abort_reply().published();
}

v1::PeersResponse TransferManager::Peers(bool probe) {
  v1::PeersResponse response;
  response.set_site(config_.site);
  for (const PeerConfig& peer : config_.peers) {
    v1::PeerStatus* status = response.add_peers();
    status->set_site(peer.site);
    status->set_address(peer.address);
    status->set_transport(peer.transport);
    if (probe) {
      v1::Hello hello;
      hello.set_role(v1::Hello::PROBE);
      const Timestamp start = clock_.Now();
      auto channel = peer::DialSession(control_transport_, peer.site, peer.address, hello);
      status->set_reachable(channel.ok());
      if (channel.ok()) {
        status->set_handshake_ms((clock_.Now() - start).ToMillisecondsF());
        transport::LinkStats stats = (*channel)->Stats();
        status->set_congestion_control(stats.congestion_control);
        status->set_rtt_ms(stats.rtt_ms);
        status->set_socket_buffer_bytes(stats.socket_buffer_bytes);
      } else {
        status->set_error(std::string(channel.status().message()));
      }
    }
    absl::MutexLock lock(&mu_);
    auto it = link_stats_.find(peer.site);
    if (it != link_stats_.end()) {
      const transport::LinkStats& s = it->second;
      status->set_congestion_control(s.congestion_control);
      status->set_rtt_ms(s.rtt_ms);
      status->set_delivery_rate_mbit(s.delivery_rate_mbit);
      status->set_retransmits(s.retransmits);
      status->set_socket_buffer_bytes(s.socket_buffer_bytes);
    }
    uint32_t streams = 0;
    for (const auto& [id, t] : transfers_) {
      if (t->record.spec().dest_site() == peer.site) streams += t->progress.Get().active_streams;
    }
    status->set_active_streams(streams);
  }
  return response;
}

}  // namespace longhaul::daemon
