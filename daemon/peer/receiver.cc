#include "daemon/peer/receiver.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <optional>
#include <thread>


#include "absl/cleanup/cleanup.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/checkpoints.h"
#include "common/fmt_absl.h"
#include "daemon/peer/messaging.h"
#include "spdlog/spdlog.h"
#include "storage/chunk_io.h"
#include "storage/manifest.h"
#include "storage/retention.h"
#include "storage/staging.h"
#include "storage/xxh3.h"

namespace longhaul::peer {
namespace {

// Threads that read staged chunks back before a publish (at most one per core).
constexpr size_t kMaxVerifyThreads = 4;
// Threads that read chunks back while their transfer is still receiving, and
// how many chunks may wait for them (the rest wait for the publish).
constexpr size_t kReadBackThreads = 2;
constexpr size_t kMaxQueuedReadBacks = 4096;

uint64_t ChunkKey(uint32_t file_index, uint32_t chunk_index) {
  return (static_cast<uint64_t>(file_index) << 32) | chunk_index;
}

bool SameContentIdentity(const v1::ManifestFile& a, const v1::ManifestFile& b) {
  return a.path() == b.path() && a.size() == b.size() && a.mtime_ns() == b.mtime_ns() &&
         a.generation() == b.generation();
}

absl::Status CheckTransferId(const std::string& id) {
  if (id.empty() || id.size() > 128 || id == "." || id == ".." ||
      id.find_first_of("/\\") != std::string::npos || id.find('\0') != std::string::npos) {
    return absl::InvalidArgumentError("transfer id must be a short single path component");
  }
  return absl::OkStatus();
}

// When a RECEIVING record last saw activity that was persisted.
absl::Time LastActive(const v1::IncomingTransfer& r) {
  return absl::FromUnixMillis(std::max(r.active_unix_ms(), r.created_unix_ms()));
}

// Feeds the bytes [offset, offset + length) of a staged file to `state`
// (storage::ReadStagedHashing). DataLoss when the file ends first. Reads
// kReadPiece bytes at a time (as much as a stream's scratch for skipped
// payload): it runs once per resumed chunk, and holds nothing beside the
// stream's budgeted piece buffer.
absl::Status HashStagedRange(storage::FileIo& io, const storage::File& file, uint64_t offset,
                             uint64_t length, XXH3_state_t& state) {
  storage::AlignedBuffer buffer(std::min<uint64_t>(length, kReadPiece));
  for (uint64_t done = 0; done < length;) {
    const size_t n = std::min<uint64_t>(length - done, buffer.capacity());
    absl::StatusOr<size_t> got =
        storage::ReadStagedHashing(io, file, offset + done, buffer.span(n), state);
    if (!got.ok()) return got.status();
    if (*got != n) {
      return absl::DataLossError(absl::StrCat("staged file ", file.path(), " ends at byte ",
                                              offset + done + *got, ", inside a durable prefix"));
    }
    done += n;
  }
  return absl::OkStatus();
}

std::string ParentOf(const std::string& relative) {
  const size_t slash = relative.rfind('/');
  return slash == std::string::npos ? "" : relative.substr(0, slash);
}

}  // namespace

// One incoming transfer while its peer has channels open. The record and the
// durable set mirror the journal; staging is open while receiving.
struct Receiver::Session {
  absl::Mutex mu;
  v1::IncomingTransfer record ABSL_GUARDED_BY(mu);
  storage::ResolvedDestination dest ABSL_GUARDED_BY(mu);
  std::optional<storage::Staging> staging ABSL_GUARDED_BY(mu);
  // Chunks journaled durable (ChunkKey), each with the number of the write
  // that made it so: a chunk written again gets a new number.
  absl::flat_hash_map<uint64_t, uint64_t> durable ABSL_GUARDED_BY(mu);
  uint64_t writes ABSL_GUARDED_BY(mu) = 0;
  // Chunks read back and found matching since, with the number of the write
  // they were read back after. A chunk counts as checked only while that is
  // still its number in `durable`.
  absl::flat_hash_map<uint64_t, uint64_t> read_back ABSL_GUARDED_BY(mu);
  // Chunks of which a prefix is durable: its length, by chunk key.
  absl::flat_hash_map<uint64_t, uint64_t> partial ABSL_GUARDED_BY(mu);
  // The sender takes CHUNK_PROGRESS and resumes inside chunks
  // (OpenRequest.durable_pieces).
  bool durable_pieces ABSL_GUARDED_BY(mu) = false;
  absl::flat_hash_set<transport::Channel*> data_channels ABSL_GUARDED_BY(mu);

  // Stops the data channels of an older attempt and waits until they are
  // gone, so staging fds are not in use while files change underneath.
  void DrainDataChannels() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    for (transport::Channel* c : data_channels) c->Abort();
    mu.Await(absl::Condition(
        +[](Session* s) ABSL_NO_THREAD_SAFETY_ANALYSIS { return s->data_channels.empty(); }, this));
  }
};

bool ReceiverOptions::Export::IsWriter(absl::string_view site) const {
  return std::find(writers.begin(), writers.end(), site) != writers.end();
}

const ReceiverOptions::Export* ReceiverOptions::FindExport(absl::string_view name) const {
  for (const Export& e : exports) {
    if (e.name == name) return &e;
  }
  return nullptr;
}

Receiver::Receiver(ReceiverOptions options, storage::Journal& journal, storage::FileSystem& fs,
                   PeerMemoryBudget* budget, WallClock wall_clock)
    : options_(std::move(options)),
      journal_(journal),
      fs_(fs),
      own_budget_(budget == nullptr ? std::make_unique<PeerMemoryBudget>(options_.memory_per_peer)
                                    : nullptr),
      budget_(budget == nullptr ? own_budget_.get() : budget),
      wall_clock_(std::move(wall_clock)),
      committer_(journal),
      owners_([this] { return journal_.ListIncoming(); },
              [this](const std::string& export_name, const std::string& relative) {
                return DestinationExists(export_name, relative);
              }),
      read_back_pool_(kReadBackThreads, kMaxQueuedReadBacks) {
  // Only address space until bytes arrive; a failed mapping is out of memory.
  absl::StatusOr<std::unique_ptr<storage::BufferPool>> pool =
      storage::BufferPool::Create(kReceiveBuffers, kDurablePiece);
  if (!pool.ok()) {
    spdlog::critical("receiver: {}", pool.status().message());
    std::abort();
  }
  piece_buffers_ = std::move(*pool);
  for (const ReceiverOptions::Export& e : options_.exports) exports_.push_back({e.name, e.path});
}

bool Receiver::DestinationExists(const std::string& export_name, const std::string& relative) {
  const ReceiverOptions::Export* e = options_.FindExport(export_name);
  if (e == nullptr) return false;  // not an export any more: nothing to protect there
  absl::StatusOr<std::unique_ptr<storage::Directory>> root = fs_.OpenRoot(e->path);
  if (!root.ok()) return true;
  const size_t slash = relative.rfind('/');
  const std::string parent = ParentOf(relative);
  const std::string base = slash == std::string::npos ? relative : relative.substr(slash + 1);
  absl::StatusOr<std::unique_ptr<storage::Directory>> dir =
      storage::OpenDirBeneath(fs_, **root, parent, /*create=*/false);
  if (absl::IsNotFound(dir.status()) || absl::IsFailedPrecondition(dir.status())) return false;
  if (!dir.ok()) return true;
  absl::StatusOr<std::optional<storage::FileInfo>> st = fs_.Stat(**dir, base);
  return !st.ok() || st->has_value();
}

void Receiver::CountRefusal(const std::string& peer_site, const std::string& export_name) {
  if (options_.FindExport(export_name) == nullptr) return;
  absl::MutexLock lock(&refused_mu_);
  ++access_refused_[{peer_site, export_name}];
}

absl::Status Receiver::CheckWriter(const std::string& peer_site, const std::string& export_name) {
  const ReceiverOptions::Export* e = options_.FindExport(export_name);
  if (e == nullptr || e->IsWriter(peer_site)) return absl::OkStatus();  // unknown: Resolve says so
  spdlog::warn("export {}: refusing to let {} write; its writers are [{}]", export_name, peer_site,
               absl::StrJoin(e->writers, ", "));
  CountRefusal(peer_site, export_name);
  return absl::PermissionDeniedError(absl::StrCat(
      peer_site, " may not write into export ", export_name, " of ", options_.local_site,
      ": it is not one of the export's writers (exports[].writers in ", options_.local_site,
      "'s config)"));
}

storage::PublishOptions Receiver::PublishOptionsOf(const v1::IncomingTransfer& record) const {
  storage::PublishOptions options;
  options.single_file = record.single_file();
  options.commit_last.assign(record.commit_last().begin(), record.commit_last().end());
  for (uint32_t f : record.unchanged_files()) options.skip_files.insert(f);
  options.compare_content = record.compare_content();
  if (const ReceiverOptions::Export* e = options_.FindExport(record.export_name())) {
    options.mode_mask = e->mode_mask;
  }
  return options;
}

// After a publish, the old checkpoints beside the destination that the same
// source site published go; nothing else of the export is counted or
// touched. The transfer itself succeeded, so a failure here is logged for
// the operator and does not fail it; the next sync retries.
void Receiver::PruneOldCheckpoints(const v1::IncomingTransfer& record,
                                   const storage::ResolvedDestination& dest) {
  if (record.keep_checkpoints() == 0 || record.single_file()) return;
  const std::string parent = ParentOf(dest.relative);
  absl::StatusOr<absl::flat_hash_set<std::string>> owned =
      owners_.OwnedBelow(record.export_name(), parent, record.source_site());
  absl::StatusOr<std::vector<std::string>> removed;
  if (owned.ok()) {
    storage::RetentionPolicy policy{
        .keep = record.keep_checkpoints(),
        .complete_marker = record.checkpoint_marker(),
        .marker_globs = {record.commit_last().begin(), record.commit_last().end()},
        .owned = std::move(*owned)};
    removed = storage::PruneCheckpoints(fs_, dest.export_root, parent, policy);
  } else {
    removed = owned.status();
  }
  if (!removed.ok()) {
    spdlog::warn("transfer {}: published, but old checkpoints beside {} were not pruned: {}",
                 record.id(), dest.absolute, removed.status().message());
    return;
  }
  for (const std::string& name : *removed) {
    owners_.Forget(record.export_name(), parent.empty() ? name : absl::StrCat(parent, "/", name));
  }
  if (!removed->empty()) {
    spdlog::info("transfer {}: kept the newest {} checkpoints of {} in {}; removed {}", record.id(),
                 record.keep_checkpoints(), record.source_site(),
                 dest.absolute.substr(0, dest.absolute.rfind('/')), absl::StrJoin(*removed, ", "));
  }
}

Receiver::~Receiver() {
  Shutdown();
  if (sweep_thread_.joinable()) sweep_thread_.join();
}

void Receiver::Shutdown() {
  absl::MutexLock lock(&mu_);
  shutting_down_ = true;
  for (transport::Channel* c : channels_) c->Abort();
  piece_buffers_->Shutdown();
}

absl::Duration Receiver::ExpirySweepInterval(absl::Duration expiry) {
  return std::clamp(expiry / 10, absl::Milliseconds(100), absl::Hours(1));
}

void Receiver::StartExpirySweep() {
  const absl::Duration interval = ExpirySweepInterval(options_.incoming_expiry);
  sweep_thread_ = std::thread([this, interval] {
    while (true) {
      ExpireAbandoned();
      absl::MutexLock lock(&mu_);
      if (mu_.AwaitWithTimeout(absl::Condition(&shutting_down_), interval)) return;
    }
  });
}

size_t Receiver::ExpireAbandoned() {
  const absl::Duration expiry = options_.incoming_expiry;
  const absl::Time now = wall_clock_();
  auto incoming = journal_.ListIncoming();
  if (!incoming.ok()) {
    spdlog::error("cannot list incoming transfers to expire abandoned ones: {}",
                  incoming.status().message());
    return 0;
  }
  size_t changed = 0;
  for (const v1::IncomingTransfer& record : *incoming) {
    switch (record.state()) {
      case v1::IncomingTransfer::RECEIVING:
        changed += ExpireIfAbandoned(record, now, expiry);
        break;
      case v1::IncomingTransfer::ABORTED:
      case v1::IncomingTransfer::EXPIRED:
        changed += RemoveIfAged(record, now, expiry);
        break;
      default:
        break;
    }
  }
  return changed;
}

bool Receiver::ExpireIfAbandoned(const v1::IncomingTransfer& listed, absl::Time now,
                                 absl::Duration expiry) {
  const std::string& id = listed.id();
  std::shared_ptr<Session> session;
  {
    absl::MutexLock lock(&mu_);
    if (auto it = sessions_.find(id); it != sessions_.end()) session = it->second;
  }
  // Without a session only an expiry needs one: none is made for the rest.
  if (!session) {
    if (now - LastActive(listed) < expiry) return false;
    session = SessionFor(id);
  }
  bool expired = false;
  {
    absl::MutexLock lock(&session->mu);
    auto current = journal_.GetIncoming(id);
    if (!current.ok() || !*current || (*current)->state() != v1::IncomingTransfer::RECEIVING) {
      return false;
    }
    v1::IncomingTransfer& record = **current;
    if (!session->data_channels.empty()) {
      // Receiving now: keep the persisted activity fresh enough that a
      // restart does not find it stale.
      if (now - LastActive(record) >= expiry / 2 && session->record.id() == id) {
        session->record.set_active_unix_ms(absl::ToUnixMillis(now));
        if (absl::Status s = journal_.PutIncoming(session->record); !s.ok()) {
          spdlog::warn("transfer {}: cannot record its activity: {}", id, s.message());
        }
      }
      return false;
    }
    if (now - LastActive(record) < expiry) return false;

    auto dest = Resolve(record);
    if (dest.ok()) {
      if (!session->staging) {
        auto staging = storage::Staging::Open(fs_, *dest, id);
        if (!staging.ok()) {
          spdlog::warn("transfer {}: cannot open its staging to expire it: {}", id,
                       staging.status().message());
          return false;
        }
        session->staging.emplace(std::move(*staging));
      }
      absl::StatusOr<bool> past = session->staging->PastPointOfNoReturn();
      if (!past.ok()) return false;
      if (*past) {
        // The new version is complete and durable: finish it, never leave
        // the destination to a half-done publish.
        session->record = record;
        session->dest = *dest;
        if (absl::Status s = PublishLocked(*session); !s.ok()) {
          spdlog::error(
              "transfer {}: abandoned past its point of no return, and its publish "
              "failed: {}",
              id, s.message());
          return false;
        }
        spdlog::info("transfer {}: abandoned past its point of no return; published", id);
        return true;
      }
      if (absl::Status s = session->staging->Remove(); !s.ok()) {
        spdlog::warn("transfer {}: cannot remove its staging to expire it: {}", id, s.message());
        return false;
      }
      session->staging.reset();
    } else {
      spdlog::warn("transfer {}: expiring it without removing its staging: {}", id,
                   dest.status().message());
    }
    if (absl::Status s = journal_.DeleteChunks(id); !s.ok()) {
      spdlog::warn("transfer {}: cannot delete its chunk records to expire it: {}", id,
                   s.message());
      return false;
    }
    v1::IncomingTransfer ended;
    ended.set_id(id);
    ended.set_source_site(record.source_site());
    ended.set_export_name(record.export_name());
    ended.set_dest_path(record.dest_path());
    ended.set_single_file(record.single_file());
    ended.set_created_unix_ms(record.created_unix_ms());
    ended.set_active_unix_ms(record.active_unix_ms());
    ended.set_state(v1::IncomingTransfer::EXPIRED);
    ended.set_ended_unix_ms(absl::ToUnixMillis(now));
    ended.set_expired_files(record.manifest().files_size());
    uint64_t bytes = 0;
    for (const v1::ManifestFile& f : record.manifest().files()) bytes += f.size();
    ended.set_expired_bytes(bytes);
    if (absl::Status s = journal_.PutIncoming(ended); !s.ok()) {
      spdlog::warn("transfer {}: cannot record its expiry: {}", id, s.message());
      return false;
    }
    session->record = ended;
    session->durable.clear();
    session->read_back.clear();
    spdlog::info(
        "transfer {} from {}: expired after {} without activity (last {}); its staging "
        "and chunk records were removed",
        id, record.source_site(), absl::FormatDuration(now - LastActive(record)),
        absl::FormatTime(LastActive(record)));
    expired = true;
  }
  session.reset();
  ForgetEndedSession(id);
  return expired;
}

bool Receiver::RemoveIfAged(const v1::IncomingTransfer& listed, absl::Time now,
                            absl::Duration expiry) {
  const std::string& id = listed.id();
  if (listed.ended_unix_ms() != 0 && now - absl::FromUnixMillis(listed.ended_unix_ms()) < expiry) {
    return false;
  }
  std::shared_ptr<Session> session = SessionFor(id);
  bool removed = false;
  {
    absl::MutexLock lock(&session->mu);
    auto current = journal_.GetIncoming(id);
    if (!current.ok() || !*current) return false;
    v1::IncomingTransfer& record = **current;
    if (record.state() != v1::IncomingTransfer::ABORTED &&
        record.state() != v1::IncomingTransfer::EXPIRED) {
      return false;
    }
    if (record.ended_unix_ms() == 0) {
      // Written by a version that did not date it: it ages from now.
      record.set_ended_unix_ms(absl::ToUnixMillis(now));
      if (absl::Status s = journal_.PutIncoming(record); !s.ok()) {
        spdlog::warn("transfer {}: cannot date its ended record: {}", id, s.message());
      }
      return false;
    }
    if (now - absl::FromUnixMillis(record.ended_unix_ms()) < expiry) return false;
    if (absl::Status s = journal_.DeleteIncoming(id); !s.ok()) {
      spdlog::warn("transfer {}: cannot remove its ended record: {}", id, s.message());
      return false;
    }
    session->record.Clear();
    spdlog::info("transfer {} from {}: removed its {} record after {}", id, record.source_site(),
                 v1::IncomingTransfer::State_Name(record.state()), absl::FormatDuration(expiry));
    removed = true;
  }
  session.reset();
  ForgetEndedSession(id);
  return removed;
}

void Receiver::ForgetEndedSession(const std::string& id) {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(id);
  if (it == sessions_.end() || it->second.use_count() > 1) return;
  Session& session = *it->second;
  bool forget;
  {
    absl::MutexLock session_lock(&session.mu);
    const v1::IncomingTransfer::State state = session.record.state();
    const bool ended = session.record.id().empty() || state == v1::IncomingTransfer::ABORTED ||
                       state == v1::IncomingTransfer::EXPIRED;
    forget = ended && !session.staging && session.data_channels.empty();
  }
  // Erased after its lock is released: the erase destroys the session, and
  // nobody else can reach it while mu_ is held and the map owns the only reference.
  if (forget) sessions_.erase(it);
}

ReceiverStats Receiver::stats() const {
  ReceiverStats stats;
  {
    absl::MutexLock lock(&mu_);
    stats = stats_;
  }
  stats.staged_corruptions = staged_corruptions_.load();
  stats.bytes_read_back_receiving = bytes_read_back_receiving_.load();
  stats.bytes_read_back_at_publish = bytes_read_back_at_publish_.load();
  absl::MutexLock lock(&refused_mu_);
  stats.access_refused = access_refused_;
  return stats;
}

void Receiver::Serve(std::unique_ptr<transport::Channel> channel, const v1::Hello& hello) {
  {
    absl::MutexLock lock(&mu_);
    if (shutting_down_) return;
    channels_.insert(channel.get());
  }
  if (hello.role() == v1::Hello::CONTROL) {
    ServeControl(*channel, hello.transfer_id());
  } else if (hello.role() == v1::Hello::DATA) {
    ServeData(*channel, hello.transfer_id());
  }
  absl::MutexLock lock(&mu_);
  channels_.erase(channel.get());
}

void Receiver::ServeControl(transport::Channel& channel, const std::string& transfer_id) {
  const uint64_t session_id = SessionIdFor(transfer_id);
  while (true) {
    v1::PeerMessage request;
    uint64_t charged = 0;
    absl::Status status =
        ReadProto(channel, FrameType::kControl, session_id, &request, [&](size_t added) {
          if (!budget_->TryReserve(channel.peer_site(), added)) {
            return absl::ResourceExhaustedError(
                absl::StrCat("a control message from ", channel.peer_site(),
                             " would take what it holds here past peer_limits.memory_per_peer (",
                             budget_->bytes_per_peer(), " bytes)"));
          }
          charged += added;
          return absl::OkStatus();
        });
    if (charged > 0) budget_->Release(channel.peer_site(), charged);
    if (!status.ok()) {
      if (status.code() == absl::StatusCode::kInvalidArgument ||
          status.code() == absl::StatusCode::kResourceExhausted) {
        spdlog::warn("closing control channel from {}: {}", channel.peer_site(), status.message());
        absl::MutexLock lock(&mu_);
        ++stats_.frames_refused;
      }
      return;
    }
    v1::PeerMessage answer;
    switch (request.body_case()) {
      case v1::PeerMessage::kOpen:
        answer = HandleOpen(channel, request);
        break;
      case v1::PeerMessage::kCommit:
        answer = HandleCommit(channel.peer_site(), request);
        break;
      case v1::PeerMessage::kAbort:
        answer = HandleAbort(channel.peer_site(), request);
        break;
      case v1::PeerMessage::kVerify:
        answer = HandleVerify(channel.peer_site(), request);
        break;
      default:
        answer = ErrorAnswer(request.request_id(),
                             absl::InvalidArgumentError("unexpected control message"));
    }
    if (!answer.error().empty()) {
      spdlog::warn("refused request from {} for transfer {}: {}", channel.peer_site(), transfer_id,
                   answer.error());
    }
    if (!SendProto(channel, FrameType::kControl, session_id, answer).ok()) return;
  }
}

absl::StatusOr<storage::ResolvedDestination> Receiver::Resolve(const v1::IncomingTransfer& record) {
  return storage::ResolveDestination(exports_, record.export_name(), record.dest_path());
}

v1::PeerMessage Receiver::HandleOpen(transport::Channel& channel, const v1::PeerMessage& request) {
  const v1::OpenRequest& open = request.open();
  const std::string& peer_site = channel.peer_site();
  auto fail = [&](const absl::Status& s) { return ErrorAnswer(request.request_id(), s); };

  if (absl::Status s = CheckTransferId(open.transfer_id()); !s.ok()) return fail(s);
  if (absl::Status s = CheckWriter(peer_site, open.export_name()); !s.ok()) return fail(s);
  // Each DATA stream holds up to a chunk in memory: the receiver's maximum
  // bounds it, whatever the sender asks for.
  if (open.manifest().chunk_size() > options_.max_chunk_size) {
    return fail(absl::InvalidArgumentError(
        absl::StrCat("chunk size ", open.manifest().chunk_size(), " exceeds ", options_.local_site,
                     "'s transfer.max_chunk_size (", options_.max_chunk_size, " bytes)")));
  }
  storage::ManifestLimits limits;
  limits.max_chunk_size = options_.max_chunk_size;
  if (absl::Status s = storage::ValidateManifest(open.manifest(), limits); !s.ok()) {
    return fail(absl::InvalidArgumentError(absl::StrCat("manifest refused: ", s.message())));
  }
  if (open.single_file() && open.manifest().files_size() != 1) {
    return fail(absl::InvalidArgumentError("a single-file transfer must have exactly one file"));
  }
  if (absl::Status s = ValidateCheckpointMarker(open.checkpoint_marker()); !s.ok()) {
    return fail(s);
  }

  // Open and abort of one transfer are serialized by its session lock, so an
  // abort that overtakes a slow open cannot leave staging behind.
  std::shared_ptr<Session> session = SessionFor(open.transfer_id());
  absl::MutexLock lock(&session->mu);

  auto existing = journal_.GetIncoming(open.transfer_id());
  if (!existing.ok()) return fail(existing.status());
  if (*existing) {
    const v1::IncomingTransfer& old = **existing;
    if (old.source_site() != peer_site) {
      return fail(absl::PermissionDeniedError(
          absl::StrCat("transfer ", open.transfer_id(), " belongs to site ", old.source_site())));
    }
    if (old.state() == v1::IncomingTransfer::ABORTED) {
      return fail(absl::FailedPreconditionError(
          absl::StrCat("transfer ", open.transfer_id(), " was cancelled")));
    }
    if (old.state() == v1::IncomingTransfer::EXPIRED) {
      return fail(absl::FailedPreconditionError(
          absl::StrCat("transfer ", open.transfer_id(), " expired at ", options_.local_site,
                       " after ", absl::FormatDuration(options_.incoming_expiry),
                       " without activity and its staged data was removed; submit it again")));
    }
    if (old.export_name() != open.export_name() || old.dest_path() != open.dest_path() ||
        old.manifest().files_size() != open.manifest().files_size()) {
      return fail(absl::InvalidArgumentError(
          absl::StrCat("transfer ", open.transfer_id(), " was opened with another destination or file list")));
    }
  }

  v1::IncomingTransfer record;
  record.set_id(open.transfer_id());
  record.set_source_site(peer_site);
  record.set_export_name(open.export_name());
  record.set_dest_path(open.dest_path());
  *record.mutable_manifest() = open.manifest();
  *record.mutable_commit_last() = open.commit_last();
  record.set_skip_unchanged(open.skip_unchanged());
  record.set_compare_content(open.compare_content());
  record.set_single_file(open.single_file());
  record.set_keep_checkpoints(open.keep_checkpoints());
  record.set_checkpoint_marker(open.checkpoint_marker());
  record.set_state(v1::IncomingTransfer::RECEIVING);
  const int64_t now_ms = absl::ToUnixMillis(wall_clock_());
  record.set_created_unix_ms(*existing ? (*existing)->created_unix_ms() : now_ms);
  record.set_active_unix_ms(now_ms);

  auto dest = Resolve(record);
  if (!dest.ok()) return fail(dest.status());

  v1::PeerMessage answer;
  answer.set_request_id(request.request_id());
  v1::OpenReply* reply = answer.mutable_open_reply();
  const bool published = *existing && (*existing)->state() == v1::IncomingTransfer::PUBLISHED;
  if (!published) {
    if (absl::Status s = owners_.Check(open.export_name(), dest->relative, peer_site); !s.ok()) {
      if (absl::IsPermissionDenied(s)) CountRefusal(peer_site, open.export_name());
      return fail(s);
    }
  }

  // A transfer already published (the sender missed our commit answer, maybe
  // because this daemon restarted since): everything is durable, and the
  // session keeps the published record, so commit finds it published.
  if (published) {
    const v1::IncomingTransfer& old = **existing;
    for (uint32_t f : old.unchanged_files()) reply->add_unchanged_files(f);
    for (int f = 0; f < old.manifest().files_size(); ++f) {
      uint64_t n = storage::ChunkCount(old.manifest().files(f), old.manifest().chunk_size());
      for (uint64_t c = 0; c < n; ++c) {
        v1::ChunkId* id = reply->add_durable();
        id->set_file_index(f);
        id->set_chunk_index(static_cast<uint32_t>(c));
      }
    }
    session->dest = *dest;
    session->record = old;
    spdlog::info("transfer {} from {}: opened again; it was published at {} already",
                 open.transfer_id(), peer_site, dest->absolute);
    return answer;
  }

  if (open.skip_unchanged()) {
    for (int f = 0; f < open.manifest().files_size(); ++f) {
      const v1::ManifestFile& file = open.manifest().files(f);
      auto same = storage::PublishedFileMatches(fs_, *dest, open.single_file(), file,
                                                open.compare_content());
      if (!same.ok()) return fail(same.status());
      if (*same) record.add_unchanged_files(f);
    }
  }

  session->DrainDataChannels();
  if (!session->staging) {
    auto staging = storage::Staging::Open(fs_, *dest, open.transfer_id());
    if (!staging.ok()) return fail(staging.status());
    session->staging.emplace(std::move(*staging));
  }
  // Files whose source changed since the last attempt start over.
  if (*existing) {
    const v1::Manifest& old = (*existing)->manifest();
    for (int f = 0; f < old.files_size(); ++f) {
      if (SameContentIdentity(old.files(f), open.manifest().files(f))) continue;
      spdlog::info("transfer {}: {} changed at the source; discarding its staged chunks",
                   open.transfer_id(), open.manifest().files(f).path());
      if (absl::Status s = journal_.DeleteFileChunks(open.transfer_id(), f); !s.ok()) return fail(s);
      if (absl::Status s = session->staging->DiscardFile(f); !s.ok()) return fail(s);
    }
  }
  if (absl::Status s = journal_.PutIncoming(record); !s.ok()) return fail(s);

  auto chunks = journal_.ListDurableChunks(open.transfer_id());
  if (!chunks.ok()) return fail(chunks.status());
  session->durable.clear();
  session->read_back.clear();
  // Journal and disk reconcile: chunks recorded durable whose staged file is
  // gone or short (removed by someone, or lost) are asked for again.
  absl::flat_hash_map<uint32_t, bool> held;
  for (const storage::ChunkDurability& c : *chunks) {
    const v1::ManifestFile& file = record.manifest().files(c.file_index);
    if (c.chunk.generation() != file.generation() || held.contains(c.file_index)) continue;
    absl::StatusOr<bool> holds = session->staging->HoldsFile(c.file_index, file);
    if (!holds.ok()) return fail(holds.status());
    held[c.file_index] = *holds;
    if (*holds) continue;
    spdlog::warn("transfer {}: the staged bytes of {} are gone though its chunks were journaled "
                 "durable; asking for the file again", open.transfer_id(), file.path());
    if (absl::Status s = journal_.DeleteFileChunks(open.transfer_id(), c.file_index); !s.ok()) {
      return fail(s);
    }
    if (absl::Status s = session->staging->DiscardFile(c.file_index); !s.ok()) return fail(s);
  }
  for (const storage::ChunkDurability& c : *chunks) {
    const v1::ManifestFile& file = record.manifest().files(c.file_index);
    if (c.chunk.generation() != file.generation() || !held[c.file_index]) continue;
    const uint64_t key = ChunkKey(c.file_index, c.chunk_index);
    const uint64_t write = session->durable[key] = ++session->writes;
    QueueReadBack(session, c, write);
    v1::ChunkId* id = reply->add_durable();
    id->set_file_index(c.file_index);
    id->set_chunk_index(c.chunk_index);
  }
  session->partial.clear();
  session->durable_pieces = open.durable_pieces();
  if (open.durable_pieces()) {
    reply->set_durable_piece(kDurablePiece);
    auto partials = journal_.ListPartialChunks(open.transfer_id());
    if (!partials.ok()) return fail(partials.status());
    const uint64_t chunk_size = record.manifest().chunk_size();
    for (const storage::ChunkDurability& c : *partials) {
      if (c.file_index >= static_cast<uint32_t>(record.manifest().files_size())) continue;
      const v1::ManifestFile& file = record.manifest().files(c.file_index);
      const uint64_t key = ChunkKey(c.file_index, c.chunk_index);
      if (c.chunk.generation() != file.generation() || session->durable.contains(key) ||
          c.chunk_index >= storage::ChunkCount(file, chunk_size) ||
          c.prefix_bytes >= storage::ChunkSize(file, c.chunk_index, chunk_size)) {
        continue;
      }
      if (!held.contains(c.file_index)) {
        absl::StatusOr<bool> holds = session->staging->HoldsFile(c.file_index, file);
        if (!holds.ok()) return fail(holds.status());
        held[c.file_index] = *holds;
      }
      if (!held[c.file_index]) continue;
      session->partial[key] = c.prefix_bytes;
      v1::PartialChunk* p = reply->add_partial();
      p->set_file_index(c.file_index);
      p->set_chunk_index(c.chunk_index);
      p->set_durable_bytes(c.prefix_bytes);
    }
  }
  for (uint32_t f : record.unchanged_files()) reply->add_unchanged_files(f);
  session->dest = *dest;
  session->record = std::move(record);
  spdlog::info(
      "transfer {} from {}: opened into {}:{} ({} files, {} chunks already durable, {} in part)",
      open.transfer_id(), peer_site, open.export_name(), open.dest_path(),
      open.manifest().files_size(), reply->durable_size(), reply->partial_size());
  return answer;
}

std::shared_ptr<Receiver::Session> Receiver::SessionFor(const std::string& transfer_id) {
  absl::MutexLock lock(&mu_);
  auto& slot = sessions_[transfer_id];
  if (!slot) slot = std::make_shared<Session>();
  return slot;
}

absl::StatusOr<std::shared_ptr<Receiver::Session>> Receiver::FindSession(
    const std::string& transfer_id, const std::string& peer_site) {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(transfer_id);
  if (it == sessions_.end()) {
    return absl::UnavailableError(absl::StrCat("transfer ", transfer_id, " is not open here"));
  }
  absl::MutexLock session_lock(&it->second->mu);
  if (it->second->record.source_site() != peer_site) {
    return absl::PermissionDeniedError(
        absl::StrCat("transfer ", transfer_id, " belongs to another site"));
  }
  return it->second;
}

void Receiver::ServeData(transport::Channel& channel, const std::string& transfer_id) {
  auto found = FindSession(transfer_id, channel.peer_site());
  if (!found.ok()) {
    spdlog::warn("data connection from {} refused: {}", channel.peer_site(), found.status().message());
    return;
  }
  std::shared_ptr<Session> session = *found;
  uint64_t chunk_size;
  {
    absl::MutexLock lock(&session->mu);
    session->data_channels.insert(&channel);
    chunk_size = session->record.manifest().chunk_size();
  }
  const uint64_t session_id = SessionIdFor(transfer_id);
  const std::string& peer_site = channel.peer_site();
  std::unique_ptr<storage::FileIo> io = storage::MakeFileIo();
  // One piece buffer of the shared pool, taken at the first chunk and kept
  // until the channel ends; `held` bytes of the peer's budget cover what a
  // piece may fill of it.
  const std::shared_ptr<storage::BufferPool> pool = piece_buffers_;
  std::optional<storage::BufferPool::Lease> piece_buffer;
  uint64_t held = 0;
  absl::Cleanup release_held = [&] {
    if (held > 0) budget_->Release(peer_site, held);
  };

  auto refuse = [&](const std::string& why) {
    spdlog::warn("transfer {}: refusing frame from {}: {}", transfer_id, channel.peer_site(), why);
    absl::MutexLock lock(&mu_);
    ++stats_.frames_refused;
  };
  auto send_progress = [&](const ChunkHeader& h, uint64_t durable_bytes) {
    std::string bytes =
        EncodeChunkProgress({h.file_index, h.chunk_index, h.generation, durable_bytes});
    absl::Span<const uint8_t> part(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
    return SendFrame(channel, FrameType::kChunkProgress, session_id, {part});
  };
  auto send_ack = [&](const ChunkHeader& h, ChunkAck::Result result, std::string message) {
    ChunkAck ack{h.file_index, h.chunk_index, h.generation, result, std::move(message)};
    std::string bytes = EncodeChunkAck(ack);
    absl::Span<const uint8_t> part(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
    return SendFrame(channel, FrameType::kChunkAck, session_id, {part});
  };

  while (true) {
    auto header = ReadFrameHeader(channel, static_cast<uint32_t>(kChunkHeaderSize + chunk_size));
    if (!header.ok()) {
      const absl::Status& s = header.status();
      if (s.code() == absl::StatusCode::kInvalidArgument) {
        refuse(std::string(s.message()));
      } else if (s.code() != absl::StatusCode::kCancelled &&
                 !absl::StrContains(s.message(), "closed the connection")) {
        spdlog::warn("transfer {}: data stream from {} broke: {}", transfer_id, channel.peer_site(),
                     s.message());
      }
      break;
    }
    if (header->type != FrameType::kChunk || header->session_id != session_id ||
        header->payload_length < kChunkHeaderSize) {
      refuse("expected a chunk frame of this session");
      break;
    }
    std::array<uint8_t, kChunkHeaderSize> chunk_header_bytes;
    if (!channel.ReadExactly(absl::MakeSpan(chunk_header_bytes)).ok()) break;
    auto chunk = ParseChunkHeader(chunk_header_bytes);
    if (!chunk.ok()) {
      refuse(std::string(chunk.status().message()));
      break;
    }
    const uint64_t data_length = header->payload_length - kChunkHeaderSize;
    const uint64_t key = ChunkKey(chunk->file_index, chunk->chunk_index);

    v1::ManifestFile file;
    uint64_t chunk_bytes = 0;
    bool pieces = false;
    absl::Status valid = absl::OkStatus();
    {
      absl::MutexLock lock(&session->mu);
      const v1::Manifest& manifest = session->record.manifest();
      pieces = session->durable_pieces;
      if (chunk->file_index >= static_cast<uint32_t>(manifest.files_size())) {
        valid = absl::InvalidArgumentError(absl::StrCat("no file ", chunk->file_index));
      } else {
        file = manifest.files(chunk->file_index);
        if (chunk->chunk_index >= storage::ChunkCount(file, chunk_size)) {
          valid = absl::InvalidArgumentError(absl::StrCat("file ", file.path(), " has no chunk ", chunk->chunk_index));
        } else if (chunk->generation != file.generation()) {
          valid = absl::InvalidArgumentError(absl::StrCat("stale generation for ", file.path()));
        } else {
          chunk_bytes = storage::ChunkSize(file, chunk->chunk_index, chunk_size);
          auto prefix = session->partial.find(key);
          valid = CheckChunkExtent(chunk->offset, data_length, chunk_bytes,
                                   prefix == session->partial.end() ? 0 : prefix->second);
          if (!valid.ok()) {
            valid = absl::InvalidArgumentError(absl::StrCat(
                "chunk ", chunk->chunk_index, " of ", file.path(), ": ", valid.message()));
          }
        }
      }
    }
    if (!valid.ok()) {
      refuse(std::string(valid.message()));
      send_ack(*chunk, ChunkAck::Result::kRefused, std::string(valid.message())).IgnoreError();
      break;
    }
    // One piece is held at a time.
    const uint64_t need = std::min(data_length, kDurablePiece);
    std::string why;
    if (held < need) {
      // Give back the smaller reservation first, so that two streams each
      // holding part of what they need cannot starve each other.
      budget_->Release(peer_site, held);
      held = 0;
      if (WaitForBudget(peer_site, need)) {
        held = need;
      } else {
        why = absl::StrCat(options_.local_site, " holds ", budget_->used(peer_site),
                           " bytes of receive buffers for ", peer_site, "; a ", need,
                           "-byte piece would pass peer_limits.memory_per_peer (",
                           budget_->bytes_per_peer(), " bytes); retry later");
      }
    }
    if (why.empty() && !piece_buffer) {
      absl::StatusOr<storage::BufferPool::Lease> lease = pool->Acquire(absl::Now() + kBudgetWait);
      if (lease.ok()) {
        piece_buffer = std::move(*lease);
      } else {
        why = absl::StrCat(options_.local_site, " has all ", kReceiveBuffers,
                           " receive buffers in use; retry later");
      }
    }
    if (!why.empty()) {
      spdlog::warn("transfer {}: chunk {} of {}: {}", transfer_id, chunk->chunk_index,
                   file.path(), why);
      std::array<uint8_t, kReadPiece> scratch;
      absl::Status skipped = absl::OkStatus();
      for (uint64_t left = data_length; left > 0 && skipped.ok();) {
        const size_t piece = std::min<uint64_t>(left, scratch.size());
        skipped = channel.ReadExactly(absl::MakeSpan(scratch.data(), piece));
        left -= piece;
      }
      if (!skipped.ok()) break;
      if (!send_ack(*chunk, ChunkAck::Result::kRetryLater, why).ok()) break;
      continue;
    }

    absl::StatusOr<storage::File*> staged;
    {
      absl::MutexLock lock(&session->mu);
      staged = session->staging ? session->staging->OpenFile(chunk->file_index, file)
                                : absl::UnavailableError("transfer is not receiving");
    }
    absl::Status stored = staged.status();
    const uint64_t chunk_offset = uint64_t{chunk->chunk_index} * chunk_size;
    XXH3_state_t state;
    XXH3_INITSTATE(&state);
    XXH3_128bits_reset(&state);
    // A frame that resumes the chunk: its durable prefix is hashed as it is
    // on disk, so the chunk's digest covers every byte that will be published.
    bool prefix_read = true;
    if (chunk->offset > 0 && stored.ok()) {
      if (absl::Status s = HashStagedRange(*io, **staged, chunk_offset, chunk->offset, state);
          !s.ok()) {
        spdlog::warn("transfer {}: cannot read back the durable prefix of chunk {} of {}: {}",
                     transfer_id, chunk->chunk_index, file.path(), s.message());
        prefix_read = false;
      }
    }
    // Piece by piece: each is hashed, written and, but the last, made
    // durable and reported, so a crash loses at most the piece in flight.
    bool broke = false;
    for (uint64_t pos = chunk->offset; pos < chunk_bytes;) {
      const uint64_t length = std::min(kDurablePiece - pos % kDurablePiece, chunk_bytes - pos);
      const absl::Span<uint8_t> data = piece_buffer->span().first(length);
      if (absl::Status s = channel.ReadExactly(data); !s.ok()) {
        if (s.code() != absl::StatusCode::kCancelled) {
          spdlog::warn("transfer {}: data stream from {} broke mid-chunk: {}", transfer_id,
                       channel.peer_site(), s.message());
        }
        broke = true;
        break;
      }
      XXH3_128bits_update(&state, data.data(), data.size());
      if (stored.ok()) stored = storage::WriteChunk(*io, **staged, chunk_offset + pos, data);
      pos += length;
      if (!pieces || pos == chunk_bytes || !stored.ok() || !prefix_read) continue;
      storage::ChunkDurability piece;
      piece.file_index = chunk->file_index;
      piece.chunk_index = chunk->chunk_index;
      piece.chunk.set_generation(chunk->generation);
      piece.prefix_bytes = pos;
      stored = committer_.MakeDurable((*staged)->fd(), transfer_id, piece);
      if (!stored.ok()) continue;
      {
        absl::MutexLock lock(&session->mu);
        session->partial[key] = pos;
      }
      if (!send_progress(*chunk, pos).ok()) {
        broke = true;
        break;
      }
    }
    if (broke) break;

    const XXH128_hash_t digest = XXH3_128bits_digest(&state);
    const storage::Xxh128 actual{digest.low64, digest.high64};
    const storage::Xxh128 expected{chunk->xxh128_low, chunk->xxh128_high};
    if (!prefix_read || !(actual == expected)) {
      spdlog::warn("transfer {}: chunk {} of {} failed its xxh3-128 check{}; asking for it again",
                   transfer_id, chunk->chunk_index, file.path(),
                   chunk->offset > 0 ? " (with its durable prefix read back)" : "");
      {
        absl::MutexLock lock(&mu_);
        ++stats_.hash_mismatches;
      }
      // It is sent again from byte 0: its prefix is no longer durable data.
      bool had_prefix;
      {
        absl::MutexLock lock(&session->mu);
        had_prefix = session->partial.erase(key) > 0;
      }
      if (had_prefix) {
        if (absl::Status s =
                journal_.DeletePartialChunk(transfer_id, chunk->file_index, chunk->chunk_index);
            !s.ok()) {
          spdlog::warn("transfer {}: cannot drop the durable prefix of chunk {} of {}: {}",
                       transfer_id, chunk->chunk_index, file.path(), s.message());
        }
      }
      if (!send_ack(*chunk, ChunkAck::Result::kHashMismatch, "digest mismatch").ok()) break;
      continue;
    }

    storage::ChunkDurability record;
    record.file_index = chunk->file_index;
    record.chunk_index = chunk->chunk_index;
    auto digest_bytes = actual.ToBytes();
    record.chunk.set_xxh128(digest_bytes.data(), digest_bytes.size());
    record.chunk.set_size(chunk_bytes);
    record.chunk.set_generation(chunk->generation);
    if (stored.ok()) stored = committer_.MakeDurable((*staged)->fd(), transfer_id, record);
    if (!stored.ok()) {
      spdlog::warn("transfer {}: cannot store chunk {} of {}: {}", transfer_id,
                   chunk->chunk_index, file.path(), stored.message());
      if (!send_ack(*chunk, ChunkAck::Result::kRetryLater, std::string(stored.message())).ok()) {
        break;
      }
      continue;
    }
    uint64_t write;
    {
      absl::MutexLock lock(&session->mu);
      write = session->durable[key] = ++session->writes;
      session->partial.erase(key);
    }
    {
      absl::MutexLock lock(&mu_);
      ++stats_.chunks_durable;
      stats_.bytes_durable += data_length;
    }
    if (!send_ack(*chunk, ChunkAck::Result::kDurable, "").ok()) break;
    QueueReadBack(session, record, write);
  }
  absl::MutexLock lock(&session->mu);
  session->data_channels.erase(&channel);
}

bool Receiver::WaitForBudget(const std::string& site, uint64_t bytes) {
  const absl::Time deadline = absl::Now() + kBudgetWait;
  while (!budget_->TryReserve(site, bytes)) {
    {
      absl::MutexLock lock(&mu_);
      if (shutting_down_) return false;
    }
    if (absl::Now() >= deadline) return false;
    absl::SleepFor(absl::Milliseconds(10));
  }
  return true;
}

void Receiver::QueueReadBack(const std::shared_ptr<Session>& session,
                             const storage::ChunkDurability& chunk, uint64_t write) {
  if (!options_.read_back_while_receiving) return;
  auto expected = storage::Xxh128::FromBytes(chunk.chunk.xxh128());
  if (!expected) return;  // the read-back before publish reports it
  std::weak_ptr<Session> weak = session;
  const uint32_t file_index = chunk.file_index;
  const uint32_t chunk_index = chunk.chunk_index;
  const uint64_t generation = chunk.chunk.generation();
  const uint64_t size = chunk.chunk.size();
  const uint64_t key = ChunkKey(file_index, chunk_index);
  // Still receiving, and the chunk's last write is the one being checked.
  // AssertHeld rather than ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu): clang 14 checks
  // a lambda's lock requirement against the closure object, not its argument.
  auto current = [=](Session& s) {
    s.mu.AssertHeld();
    if (!s.staging || s.record.state() != v1::IncomingTransfer::RECEIVING) return false;
    if (file_index >= static_cast<uint32_t>(s.record.manifest().files_size()) ||
        s.record.manifest().files(file_index).generation() != generation) {
      return false;
    }
    auto it = s.durable.find(key);
    return it != s.durable.end() && it->second == write;
  };
  read_back_pool_.Submit([=, this, expected = *expected](ReadBackPool::Worker& worker) {
    std::shared_ptr<Session> s = weak.lock();
    if (!s) return;
    std::unique_ptr<storage::File> file;
    uint64_t chunk_size;
    std::string path;
    {
      absl::MutexLock lock(&s->mu);
      if (!current(*s)) return;
      const v1::ManifestFile& f = s->record.manifest().files(file_index);
      auto opened = s->staging->OpenForReadBack(file_index, f);
      if (!opened.ok()) return;  // left to the read-back before publish
      file = std::move(*opened);
      chunk_size = s->record.manifest().chunk_size();
      path = f.path();
    }
    auto hash = storage::ReadChunkHashed(worker.io(), *file, chunk_index * chunk_size,
                                         worker.Buffer(size));
    if (hash.ok()) bytes_read_back_receiving_.fetch_add(size);
    absl::MutexLock lock(&s->mu);
    if (!current(*s)) return;
    if (hash.ok() && *hash == expected) {
      s->read_back[key] = write;
    } else {
      // The read-back before publish reads it again and acts on it.
      spdlog::warn("transfer {}: staged chunk {} of {} did not read back as written ({})",
                   s->record.id(), chunk_index, path,
                   hash.ok() ? "digest mismatch" : std::string(hash.status().message()));
    }
  });
}

absl::Status Receiver::VerifyStaged(Session& session,
                                    const absl::flat_hash_set<uint32_t>& skip_files) {
  // Every staged byte is read back and checked against the digest it was
  // acknowledged with, so bits that rotted on disk after the ack are caught
  // and never published. A bad file is dropped and sent again whole. Chunks
  // the read-back pool checked since their last write are not read again;
  // the rest sit between the last byte arriving and the publish, so they are
  // split across a few threads (each with its own reader).
  const absl::Time start = absl::Now();
  const std::string& id = session.record.id();
  const v1::Manifest& manifest = session.record.manifest();
  auto listed = journal_.ListDurableChunks(id);
  if (!listed.ok()) return listed.status();
  std::vector<storage::ChunkDurability> chunks;
  uint64_t bytes_checked_early = 0;
  for (storage::ChunkDurability& c : *listed) {
    if (skip_files.contains(c.file_index)) continue;
    if (c.chunk.generation() != manifest.files(c.file_index).generation()) continue;
    const uint64_t key = ChunkKey(c.file_index, c.chunk_index);
    auto durable = session.durable.find(key);
    auto checked = session.read_back.find(key);
    if (durable != session.durable.end() && checked != session.read_back.end() &&
        checked->second == durable->second) {
      bytes_checked_early += c.chunk.size();
      continue;
    }
    chunks.push_back(std::move(c));
  }
  absl::Mutex mu;
  absl::Status first_error;
  absl::flat_hash_set<uint32_t> bad_files;
  std::atomic<size_t> next{0};
  std::atomic<uint64_t> bytes_read{0};
  // Sized by the largest file too: tiny files at a large chunk size need
  // little, and the buffers are not zero-filled.
  uint64_t largest = 0;
  for (const v1::ManifestFile& file : manifest.files()) largest = std::max(largest, file.size());
  const uint64_t buffer_size = std::min<uint64_t>(manifest.chunk_size(), largest);
  // Read here, under session.mu, which the workers run inside of but do not hold.
  storage::Staging& staging = *session.staging;
  auto verify_some = [&] {
    std::unique_ptr<storage::FileIo> io = storage::MakeFileIo();
    storage::AlignedBuffer buffer(buffer_size);
    for (size_t i = next++; i < chunks.size(); i = next++) {
      const storage::ChunkDurability& c = chunks[i];
      {
        absl::MutexLock lock(&mu);
        if (!first_error.ok()) return;
        if (bad_files.contains(c.file_index)) continue;
      }
      const v1::ManifestFile& file = manifest.files(c.file_index);
      // A file no longer staged was verified before an interrupted publish
      // moved it on; Publish finishes that move.
      auto staged = staging.OpenStagedFile(c.file_index, file);
      if (absl::IsNotFound(staged.status())) continue;
      if (!staged.ok()) {
        absl::MutexLock lock(&mu);
        first_error.Update(staged.status());
        return;
      }
      uint64_t size = storage::ChunkSize(file, c.chunk_index, manifest.chunk_size());
      auto hash = storage::ReadChunkHashed(*io, **staged, c.chunk_index * manifest.chunk_size(),
                                           buffer.span(size));
      bytes_read += size;
      auto expected = storage::Xxh128::FromBytes(c.chunk.xxh128());
      if (!hash.ok() || !expected || !(*hash == *expected)) {
        spdlog::error("transfer {}: staged chunk {} of {} does not match its digest; re-fetching the file",
                      id, c.chunk_index, file.path());
        absl::MutexLock lock(&mu);
        bad_files.insert(c.file_index);
      }
    }
  };
  const size_t workers =
      std::clamp<size_t>(std::thread::hardware_concurrency(), 1, kMaxVerifyThreads);
  std::vector<std::thread> threads;
  for (size_t w = 1; w < std::min(workers, chunks.size()); ++w) threads.emplace_back(verify_some);
  verify_some();
  for (std::thread& t : threads) t.join();
  if (!first_error.ok()) return first_error;
  bytes_read_back_at_publish_.fetch_add(bytes_read.load());
  spdlog::info("transfer {}: read back {} staged bytes against their digests in {:.2f} s "
               "({} more were read back while receiving)",
               id, bytes_read.load(), absl::ToDoubleSeconds(absl::Now() - start),
               bytes_checked_early);
  for (uint32_t f : bad_files) {
    if (absl::Status s = journal_.DeleteFileChunks(id, f); !s.ok()) return s;
    if (absl::Status s = session.staging->DiscardFile(f); !s.ok()) return s;
    uint64_t n = storage::ChunkCount(manifest.files(f), manifest.chunk_size());
    for (uint64_t c = 0; c < n; ++c) session.durable.erase(ChunkKey(f, c));
    // Not under mu_: the session lock is held, and mu_ is taken before it elsewhere.
    staged_corruptions_.fetch_add(1);
  }
  if (!bad_files.empty()) {
    return absl::UnavailableError(absl::StrCat(bad_files.size(),
                                               " staged file(s) failed verification before publish; "
                                               "they are being sent again"));
  }
  return absl::OkStatus();
}

void Receiver::LockDestination(const std::string& path) {
  struct Arg {
    Receiver* self;
    const std::string* path;
  } arg{this, &path};
  publish_mu_.LockWhen(absl::Condition(
      +[](Arg* a) ABSL_NO_THREAD_SAFETY_ANALYSIS { return !a->self->publishing_.contains(*a->path); },
      &arg));
  publishing_.insert(path);
  publish_mu_.Unlock();
}

void Receiver::UnlockDestination(const std::string& path) {
  absl::MutexLock lock(&publish_mu_);
  publishing_.erase(path);
}

absl::Status Receiver::PublishLocked(Session& session) {
  v1::IncomingTransfer& record = session.record;
  const std::string& id = record.id();
  std::vector<uint32_t> resend;
  absl::Status published;
  {
    // One publisher per destination path: a second one waits its turn, so
    // each publish swaps one whole version for another.
    LockDestination(session.dest.absolute);
    published = session.staging->Publish(record.manifest(), PublishOptionsOf(record), &resend);
    UnlockDestination(session.dest.absolute);
  }
  if (!published.ok()) {
    if (resend.empty()) return published;
    // Bytes the new version needs are gone: forget them, so that the
    // sender's next open finds them missing and sends them again.
    absl::flat_hash_set<uint32_t> lost(resend.begin(), resend.end());
    google::protobuf::RepeatedField<uint32_t> unchanged;
    for (uint32_t f : record.unchanged_files()) {
      if (!lost.contains(f)) unchanged.Add(f);
    }
    record.mutable_unchanged_files()->Swap(&unchanged);
    for (uint32_t f : resend) {
      if (absl::Status s = journal_.DeleteFileChunks(id, f); !s.ok()) return s;
      if (absl::Status s = session.staging->DiscardFile(f); !s.ok()) return s;
      uint64_t n = storage::ChunkCount(record.manifest().files(f), record.manifest().chunk_size());
      for (uint64_t c = 0; c < n; ++c) session.durable.erase(ChunkKey(f, c));
    }
    if (absl::Status s = journal_.PutIncoming(record); !s.ok()) return s;
    return published;
  }
  record.set_state(v1::IncomingTransfer::PUBLISHED);
  if (absl::Status s = journal_.PutIncoming(record); !s.ok()) return s;
  if (absl::Status s = session.staging->Remove(); !s.ok()) {
    spdlog::warn("transfer {}: published, but its staging {} was not removed: {}", id,
                 session.staging->dir(), s.message());
  }
  session.staging.reset();
  owners_.Published(record.export_name(), session.dest.relative, record.source_site());
  spdlog::info("transfer {} from {}: published {} files at {}", id, record.source_site(),
               record.manifest().files_size() - record.unchanged_files_size(),
               session.dest.absolute);
  PruneOldCheckpoints(record, session.dest);
  return absl::OkStatus();
}

void Receiver::FinishInterruptedPublishes() {
  auto incoming = journal_.ListIncoming();
  if (!incoming.ok()) {
    spdlog::error("cannot list incoming transfers to finish interrupted publishes: {}",
                  incoming.status().message());
    return;
  }
  for (v1::IncomingTransfer& record : *incoming) {
    if (record.state() != v1::IncomingTransfer::RECEIVING) continue;
    auto dest = Resolve(record);
    if (!dest.ok()) continue;
    auto staging = storage::Staging::Open(fs_, *dest, record.id());
    if (!staging.ok()) continue;
    absl::StatusOr<bool> past = staging->PastPointOfNoReturn();
    if (!past.ok() || !*past) continue;
    std::shared_ptr<Session> session = SessionFor(record.id());
    absl::MutexLock lock(&session->mu);
    session->record = std::move(record);
    session->dest = *dest;
    session->staging.emplace(std::move(*staging));
    if (absl::Status s = PublishLocked(*session); !s.ok()) {
      spdlog::error("transfer {}: cannot finish its interrupted publish at {}: {}",
                    session->record.id(), dest->absolute, s.message());
    } else {
      spdlog::info("transfer {}: finished the publish a crash interrupted", session->record.id());
    }
  }
}

v1::PeerMessage Receiver::HandleCommit(const std::string& peer_site, const v1::PeerMessage& request) {
  const std::string& id = request.commit().transfer_id();
  auto fail = [&](const absl::Status& s) { return ErrorAnswer(request.request_id(), s); };
  auto found = FindSession(id, peer_site);
  if (!found.ok()) return fail(found.status());
  std::shared_ptr<Session> session = *found;
  absl::MutexLock lock(&session->mu);
  session->DrainDataChannels();
  v1::IncomingTransfer& record = session->record;
  v1::PeerMessage answer;
  answer.set_request_id(request.request_id());
  if (record.state() == v1::IncomingTransfer::PUBLISHED) {
    // A crash between journaling PUBLISHED and removing the staging left it.
    if (absl::Status s = storage::Staging::RemoveLeftover(fs_, session->dest, id); !s.ok()) {
      spdlog::warn("transfer {}: published, but its staging was not removed: {}", id, s.message());
    }
    answer.mutable_commit_reply()->set_files_published(record.manifest().files_size() -
                                                       record.unchanged_files_size());
    return answer;
  }
  if (record.state() == v1::IncomingTransfer::EXPIRED) {
    return fail(absl::FailedPreconditionError(
        absl::StrCat("transfer ", id, " expired here; its staged data was removed")));
  }
  const v1::Manifest& manifest = record.manifest();
  const storage::PublishOptions options = PublishOptionsOf(record);
  uint64_t missing = 0;
  for (int f = 0; f < manifest.files_size(); ++f) {
    if (options.skip_files.contains(f)) continue;
    uint64_t n = storage::ChunkCount(manifest.files(f), manifest.chunk_size());
    for (uint64_t c = 0; c < n; ++c) missing += !session->durable.contains(ChunkKey(f, c));
  }
  if (missing > 0) {
    return fail(absl::UnavailableError(
        absl::StrCat("cannot publish ", id, ": ", missing, " chunks are not durable yet")));
  }
  if (!session->staging) return fail(absl::UnavailableError("transfer is not staged here"));
  absl::StatusOr<bool> past = session->staging->PastPointOfNoReturn();
  if (!past.ok()) return fail(past.status());
  // Past the point of no return every byte was verified already, and the
  // destination becomes this version whoever may write now.
  if (*past) {
    if (absl::Status s = PublishLocked(*session); !s.ok()) return fail(s);
  } else {
    // Asked again: the config may have changed since the open, and another
    // site may have published over this path meanwhile.
    if (absl::Status s = CheckWriter(peer_site, record.export_name()); !s.ok()) return fail(s);
    const std::string& relative = session->dest.relative;
    if (absl::Status s = owners_.Claim(record.export_name(), relative, peer_site); !s.ok()) {
      if (absl::IsPermissionDenied(s)) CountRefusal(peer_site, record.export_name());
      return fail(s);
    }
    absl::Status s = VerifyStaged(*session, options.skip_files);
    if (s.ok()) s = PublishLocked(*session);
    owners_.Release(record.export_name(), relative, peer_site);
    if (!s.ok()) return fail(s);
  }
  answer.mutable_commit_reply()->set_files_published(manifest.files_size() -
                                                     record.unchanged_files_size());
  return answer;
}

v1::PeerMessage Receiver::HandleAbort(const std::string& peer_site, const v1::PeerMessage& request) {
  const std::string& id = request.abort().transfer_id();
  auto fail = [&](const absl::Status& s) { return ErrorAnswer(request.request_id(), s); };
  if (absl::Status s = CheckTransferId(id); !s.ok()) return fail(s);
  std::shared_ptr<Session> session = SessionFor(id);
  absl::MutexLock lock(&session->mu);
  auto record = journal_.GetIncoming(id);
  if (!record.ok()) return fail(record.status());
  v1::PeerMessage answer;
  answer.set_request_id(request.request_id());
  v1::AbortReply* reply = answer.mutable_abort_reply();
  if (!*record) {
    // A site that may write nowhere could never open it: nothing to note.
    const bool writer =
        std::any_of(options_.exports.begin(), options_.exports.end(),
                    [&](const ReceiverOptions::Export& e) { return e.IsWriter(peer_site); });
    if (!writer) return answer;
    // Not opened yet: leave a tombstone so a late open is refused.
    v1::IncomingTransfer tombstone;
    tombstone.set_id(id);
    tombstone.set_source_site(peer_site);
    tombstone.set_state(v1::IncomingTransfer::ABORTED);
    tombstone.set_ended_unix_ms(absl::ToUnixMillis(wall_clock_()));
    if (absl::Status s = journal_.PutIncoming(tombstone); !s.ok()) return fail(s);
    return answer;
  }
  if ((*record)->source_site() != peer_site) {
    return fail(absl::PermissionDeniedError(absl::StrCat("transfer ", id, " belongs to another site")));
  }
  if ((*record)->state() == v1::IncomingTransfer::PUBLISHED) {
    reply->set_published(true);
    return answer;
  }
  if ((*record)->state() == v1::IncomingTransfer::ABORTED ||
      (*record)->state() == v1::IncomingTransfer::EXPIRED) {
    return answer;
  }
  session->DrainDataChannels();
  auto dest = Resolve(**record);
  if (!dest.ok()) return fail(dest.status());
  if (!session->staging) {
    auto staging = storage::Staging::Open(fs_, *dest, id);
    if (!staging.ok()) return fail(staging.status());
    session->staging.emplace(std::move(*staging));
  }
  absl::StatusOr<bool> past = session->staging->PastPointOfNoReturn();
  if (!past.ok()) return fail(past.status());
  if (*past) {
    // The new version is already what the destination becomes: finish it
    // rather than leave the destination to a half-done publish.
    session->record = **record;
    session->dest = *dest;
    if (absl::Status s = PublishLocked(*session); !s.ok()) return fail(s);
    spdlog::info("transfer {} from {}: cancel came after the point of no return; published instead",
                 id, peer_site);
    reply->set_published(true);
    return answer;
  }
  if (absl::Status s = session->staging->Remove(); !s.ok()) return fail(s);
  session->staging.reset();
  if (absl::Status s = journal_.DeleteChunks(id); !s.ok()) return fail(s);
  (*record)->set_state(v1::IncomingTransfer::ABORTED);
  (*record)->set_ended_unix_ms(absl::ToUnixMillis(wall_clock_()));
  if (absl::Status s = journal_.PutIncoming(**record); !s.ok()) return fail(s);
  spdlog::info("transfer {} from {}: aborted ({}); staging removed", id, peer_site,
               request.abort().reason());
  return answer;
}

v1::PeerMessage Receiver::HandleVerify(const std::string& peer_site, const v1::PeerMessage& request) {
  const std::string& id = request.verify().transfer_id();
  auto fail = [&](const absl::Status& s) { return ErrorAnswer(request.request_id(), s); };
  if (absl::Status s = CheckTransferId(id); !s.ok()) return fail(s);
  auto record = journal_.GetIncoming(id);
  if (!record.ok()) return fail(record.status());
  if (!*record || (*record)->source_site() != peer_site) {
    return fail(absl::NotFoundError(absl::StrCat("no transfer ", id, " from ", peer_site, " here")));
  }
  if ((*record)->state() != v1::IncomingTransfer::PUBLISHED) {
    return fail(absl::FailedPreconditionError(absl::StrCat("transfer ", id, " is not published yet")));
  }
  auto dest = Resolve(**record);
  if (!dest.ok()) return fail(dest.status());
  const v1::Manifest& manifest = (*record)->manifest();
  std::unique_ptr<storage::FileIo> io = storage::MakeFileIo();
  // One chunk at a time, no larger than the largest file, charged to the
  // asking peer: a verify of tiny files at the largest chunk size holds
  // little, and many verifies at once cannot take the daemon past budgets.
  uint64_t largest = 0;
  for (const v1::ManifestFile& file : manifest.files()) largest = std::max(largest, file.size());
  const uint64_t buffer_size = std::min<uint64_t>(manifest.chunk_size(), largest);
  MemoryReservation reserved =
      MemoryReservation::TryTake(budget_, peer_site, buffer_size);
  if (buffer_size > 0 && reserved.bytes() == 0) {
    return fail(absl::ResourceExhaustedError(
        absl::StrCat("verifying ", id, " needs a ", buffer_size, "-byte buffer, past what ",
                     peer_site, " may hold here (peer_limits.memory_per_peer); retry later")));
  }
  auto buffer = std::make_unique_for_overwrite<uint8_t[]>(buffer_size);
  v1::PeerMessage answer;
  answer.set_request_id(request.request_id());
  v1::VerifyReply* reply = answer.mutable_verify_reply();
  for (int f = 0; f < manifest.files_size(); ++f) {
    const v1::ManifestFile& file = manifest.files(f);
    v1::FileDigest* digest = reply->add_files();
    digest->set_file_index(f);
    std::string path = (*record)->single_file() ? dest->absolute : dest->absolute + "/" + file.path();
    int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) {
      digest->set_error(absl::StrCat("cannot open ", path, ": ", std::strerror(errno)));
      continue;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || static_cast<uint64_t>(st.st_size) != file.size()) {
      digest->set_error(absl::StrCat(path, " has size ", st.st_size, ", expected ", file.size()));
      ::close(fd);
      continue;
    }
    uint64_t n = storage::ChunkCount(file, manifest.chunk_size());
    for (uint64_t c = 0; c < n; ++c) {
      uint64_t size = storage::ChunkSize(file, c, manifest.chunk_size());
      auto hash = storage::ReadChunkHashed(*io, fd, c * manifest.chunk_size(),
                                           absl::MakeSpan(buffer.get(), size));
      if (!hash.ok()) {
        digest->set_error(std::string(hash.status().message()));
        break;
      }
      auto bytes = hash->ToBytes();
      digest->add_chunk_xxh128(bytes.data(), bytes.size());
    }
    ::close(fd);
  }
  return answer;
}

}  // namespace longhaul::peer
