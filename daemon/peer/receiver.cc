// The Receiver's session table and control channel: construction and
// shutdown, Serve, the open and abort requests, and who may write where.
// The data path is in receiver_data.cc, verification, read-back and publish
// in receiver_publish.cc, expiry in receiver_expiry.cc.
#include "daemon/peer/receiver.h"

#include <algorithm>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/check.h"
#include "common/checkpoints.h"
#include "common/fmt_absl.h"
#include "daemon/peer/messaging.h"
#include "daemon/peer/receiver_session.h"
#include "daemon/wire/frames.h"
#include "daemon/wire/messaging.h"
#include "spdlog/spdlog.h"
#include "storage/chunk_plan.h"
#include "storage/manifest.h"
#include "storage/staging.h"

namespace longhaul::peer {

using receiver_internal::CheckTransferId;
using receiver_internal::ParentOf;

namespace {

// Threads that read chunks back while their transfer is still receiving, and
// how many chunks may wait for them (the rest wait for the publish).
constexpr size_t kReadBackThreads = 2;
constexpr size_t kMaxQueuedReadBacks = 4096;

bool SameContentIdentity(const v1::ManifestFile& a, const v1::ManifestFile& b) {
  return a.path() == b.path() && a.size() == b.size() && a.mtime_ns() == b.mtime_ns() &&
         a.generation() == b.generation();
}

DestinationAuthority::Options AuthorityOptionsOf(
    const ReceiverOptions& options,
    std::function<void(const std::string& site, const std::string& export_name)> refused) {
  DestinationAuthority::Options authority;
  authority.local_site = options.local_site;
  for (const ReceiverOptions::Export& e : options.exports) {
    authority.exports.push_back({e.name, e.writers, e.readers});
  }
  authority.pull_granted = options.pull_granted;
  authority.refused = std::move(refused);
  return authority;
}

}  // namespace

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
                   PeerMemoryBudget* budget, const Clock& clock)
    : options_(std::move(options)),
      journal_(journal),
      fs_(fs),
      own_budget_(budget == nullptr ? std::make_unique<PeerMemoryBudget>(options_.memory_per_peer)
                                    : nullptr),
      budget_(budget == nullptr ? own_budget_.get() : budget),
      clock_(clock),
      committer_(journal),
      authority_(
          AuthorityOptionsOf(options_,
                             [this](const std::string& site, const std::string& export_name) {
                               CountRefusal(site, export_name);
                             }),
          [this] { return journal_.ListIncoming(); },
          [this](const std::string& export_name, const std::string& relative) {
            return DestinationExists(export_name, relative);
          }),
      content_check_budget_(options_.content_check_bytes_per_second, clock_),
      read_back_pool_(kReadBackThreads, kMaxQueuedReadBacks) {
  // Only address space until bytes arrive; a failed mapping is out of memory.
  absl::StatusOr<std::unique_ptr<storage::BufferPool>> pool =
      storage::BufferPool::Create(kReceiveBuffers, kDurablePiece);
  LONGHAUL_CHECK(pool.ok()) << "receiver: " << pool.status().message();
  piece_buffers_ = std::move(*pool);
  std::vector<std::pair<std::string, std::string>> names_and_paths;
  for (const ReceiverOptions::Export& e : options_.exports) {
    exports_.push_back({e.name, e.path});
    names_and_paths.emplace_back(e.name, e.path);
  }
  export_roots_ = ResolveExportRoots(names_and_paths);
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

Receiver::~Receiver() {
  Shutdown();
  if (sweep_thread_.joinable()) sweep_thread_.join();
}

void Receiver::Shutdown() {
  {
    absl::MutexLock lock(&sweep_mu_);
    sweep_stop_ = true;
  }
  absl::MutexLock lock(&mu_);
  shutting_down_ = true;
  channels_.Close();
  piece_buffers_->Shutdown();
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
  const transport::ChannelRegistry::Registration registration = channels_.Add(*channel);
  if (!registration) return;  // shutting down
  if (hello.role() == v1::Hello::CONTROL) {
    ServeControl(*channel, hello.transfer_id());
  } else if (hello.role() == v1::Hello::DATA) {
    ServeData(*channel, hello.transfer_id());
  }
}

void Receiver::ServeControl(transport::Channel& channel, const std::string& transfer_id) {
  const uint64_t session_id = wire::SessionIdFor(transfer_id);
  while (true) {
    v1::PeerMessage request;
    uint64_t charged = 0;
    absl::Status status = wire::ReadProto(
        channel, wire::FrameType::kControl, session_id, &request, [&](size_t added) {
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
      case v1::PeerMessage::kRelayAttach:
        answer = HandleRelayAttach(channel.peer_site(), request);
        break;
      case v1::PeerMessage::kProgress:
        answer = HandleProgress(channel.peer_site(), request);
        break;
      default:
        answer = ErrorAnswer(request.request_id(),
                             absl::InvalidArgumentError("unexpected control message"));
    }
    if (!answer.error().empty()) {
      spdlog::warn("refused request from {} for transfer {}: {}", channel.peer_site(), transfer_id,
                   answer.error());
      answer.set_error(ForPeer(answer.error(), export_roots_));
    }
    if (!wire::SendProto(channel, wire::FrameType::kControl, session_id, answer).ok()) return;
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
  // Who may change what is decided first, before anything is staged, and
  // whether the source may write into the export at all before the path is
  // even looked at: a site learns nothing of an export it may not write.
  DestinationAuthority::Change change{.source = peer_site,
                                      .requester = open.requested_by(),
                                      .export_name = open.export_name(),
                                      .dest_path = open.dest_path(),
                                      .transfer_id = open.transfer_id(),
                                      .prunes = open.keep_checkpoints() > 0 && !open.single_file()};
  if (absl::Status s = authority_.MayWriteInto(change); !s.ok()) return fail(s);
  auto dest = storage::ResolveDestination(exports_, open.export_name(), open.dest_path());
  if (!dest.ok()) return fail(dest.status());
  change.relative = dest->relative;
  {
    // Opened again after its publish (the sender missed the commit answer):
    // nothing will be written. Read again under the session lock below.
    auto previous = journal_.GetIncoming(open.transfer_id());
    if (!previous.ok()) return fail(previous.status());
    change.published = *previous && (*previous)->source_site() == peer_site &&
                       (*previous)->export_name() == open.export_name() &&
                       (*previous)->dest_path() == open.dest_path() &&
                       (*previous)->state() == v1::IncomingTransfer::PUBLISHED;
  }
  if (absl::Status s = authority_.MayWrite(change); !s.ok()) return fail(s);
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
  if (open.single_file() &&
      (open.manifest().files_size() != 1 || open.manifest().symlinks_size() != 0)) {
    return fail(absl::InvalidArgumentError(
        "a single-file transfer must have exactly one file and no symlink"));
  }
  if (absl::Status s = ValidateCheckpointMarker(open.checkpoint_marker()); !s.ok()) {
    return fail(s);
  }
  // Fan-out: the relay writes the chunks, so it must be allowed to write
  // here too; it cannot be the owner itself, nor this site.
  if (!open.relay_by().empty()) {
    if (open.relay_by() == peer_site || open.relay_by() == options_.local_site) {
      return fail(absl::InvalidArgumentError(
          absl::StrCat("relay_by must name another destination, not ", open.relay_by())));
    }
    if (absl::Status s = authority_.MayRelay(change, open.relay_by()); !s.ok()) {
      return fail(absl::PermissionDeniedError(absl::StrCat("relay refused: ", s.message())));
    }
  }
  if (open.has_relay_to()) {
    if (absl::Status s = CheckTransferId(open.relay_to().transfer_id()); !s.ok()) return fail(s);
    if (open.relay_to().site().empty() || open.relay_to().site() == options_.local_site ||
        open.relay_to().site() == peer_site) {
      return fail(absl::InvalidArgumentError(absl::StrCat(
          "relay_to must name another destination, not '", open.relay_to().site(), "'")));
    }
  }

  // Submit's check: decided as an open would be, with nothing kept.
  if (open.check_only()) return CheckOpen(request, change, *dest);

  // Open and abort of one transfer are serialized by its session lock, so an
  // abort that overtakes a slow open cannot leave staging behind.
  std::shared_ptr<Session> session = SessionFor(open.transfer_id());
  absl::MutexLock lock(&session->mu);

  auto existing = journal_.GetIncoming(open.transfer_id());
  if (!existing.ok()) return fail(existing.status());
  if (*existing) {
    const v1::IncomingTransfer& old = **existing;
    if (old.source_site() != peer_site) {
      // Which site owns a transfer is not the opener's business: the answer
      // says what commit, abort and verify say; the log names the owner.
      spdlog::warn("open of transfer {} from {} refused: it belongs to {}", open.transfer_id(),
                   peer_site, old.source_site());
      return fail(absl::PermissionDeniedError(
          absl::StrCat("transfer ", open.transfer_id(), " belongs to another site")));
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
      return fail(absl::InvalidArgumentError(absl::StrCat(
          "transfer ", open.transfer_id(), " was opened with another destination or file list")));
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
  record.set_relay_by(open.relay_by());
  record.set_requested_by(open.requested_by());
  record.set_keep_deleted(open.keep_deleted());
  if (open.has_relay_to()) *record.mutable_relay_to() = open.relay_to();
  record.set_state(v1::IncomingTransfer::RECEIVING);
  const int64_t now_ms = absl::ToUnixMillis(clock_.WallNow());
  record.set_created_unix_ms(*existing ? (*existing)->created_unix_ms() : now_ms);
  record.set_active_unix_ms(now_ms);

  v1::PeerMessage answer;
  answer.set_request_id(request.request_id());
  v1::OpenReply* reply = answer.mutable_open_reply();
  reply->set_sparse_files(true);
  reply->set_hard_links(true);
  const bool published = *existing && (*existing)->state() == v1::IncomingTransfer::PUBLISHED;
  if (published != change.published) {
    // It was published, or something else, in between: decide again.
    change.published = published;
    if (absl::Status s = authority_.MayWrite(change); !s.ok()) return fail(s);
  }

  // A transfer already published (the sender missed our commit answer, maybe
  // because this daemon restarted since): everything is durable, and the
  // session keeps the published record, so commit finds it published.
  if (published) {
    const v1::IncomingTransfer& old = **existing;
    for (uint32_t f : old.unchanged_files()) reply->add_unchanged_files(f);
    storage::ForEachChunk(old.manifest(), [&](storage::ChunkId chunk, uint64_t) {
      v1::ChunkId* id = reply->add_durable();
      id->set_file_index(chunk.file_index);
      id->set_chunk_index(chunk.chunk_index);
    });
    session->dest = *dest;
    session->record = old;
    spdlog::info("transfer {} from {}: opened again; it was published at {} already",
                 open.transfer_id(), peer_site, dest->absolute);
    return answer;
  }

  // Past its point of no return without a PUBLISHED record: the publish ran,
  // but its record could not be journaled (a full state disk). Its files are
  // in the destination, not in staging, so receiving them again cannot work:
  // finish the publish, as a restart would, and answer as published.
  if (*existing) {
    session->DrainDataChannels();
    auto staging = storage::Staging::Open(fs_, *dest, open.transfer_id());
    if (!staging.ok()) return fail(staging.status());
    absl::StatusOr<bool> past = staging->PastPointOfNoReturn();
    if (!past.ok()) return fail(past.status());
    if (*past) {
      session->record = **existing;
      session->dest = *dest;
      session->staging.emplace(std::move(*staging));
      if (absl::Status s = PublishLocked(*session); !s.ok()) return fail(s);
      for (uint32_t f : session->record.unchanged_files()) reply->add_unchanged_files(f);
      storage::ForEachChunk(session->record.manifest(), [&](storage::ChunkId chunk, uint64_t) {
        v1::ChunkId* id = reply->add_durable();
        id->set_file_index(chunk.file_index);
        id->set_chunk_index(chunk.chunk_index);
      });
      spdlog::info("transfer {} from {}: opened again; finished its interrupted publish at {}",
                   open.transfer_id(), peer_site, dest->absolute);
      return answer;
    }
  }

  // cp without --replace: nothing at the destination is replaced by
  // surprise. Checked once, before anything is staged; a re-open (resume,
  // retry) finds the transfer journaled and goes on. The answer says only
  // what a writer of the path may learn: that something else is there.
  if (!*existing) {
    if (absl::Status s = RefuseDifferent(open, peer_site, *dest); !s.ok()) return fail(s);
  }

  if (open.skip_unchanged()) {
    // Comparing content tells the peer what the files here hold: only for
    // what it may know, and within its budget of bytes read.
    const bool may_compare = !open.compare_content() || authority_.MayCompareContent(change);
    if (!may_compare) {
      spdlog::info(
          "transfer {} from {}: {} neither published {}:{} nor may read {}; every file "
          "is sent instead of compared",
          open.transfer_id(), peer_site, peer_site, open.export_name(), open.dest_path(),
          open.export_name());
    }
    uint64_t over_budget = 0;
    for (int f = 0; may_compare && f < open.manifest().files_size(); ++f) {
      const v1::ManifestFile& file = open.manifest().files(f);
      // A hard link is made again from its target's new version, so the
      // group stays one file whether or not its target is unchanged.
      if (file.link_of() != 0) continue;
      if (open.compare_content() && !content_check_budget_.TryTake(peer_site, file.size())) {
        ++over_budget;
        continue;
      }
      auto same = storage::PublishedFileMatches(fs_, *dest, open.single_file(), file,
                                                open.compare_content());
      if (!same.ok()) return fail(same.status());
      if (*same) record.add_unchanged_files(f);
    }
    if (over_budget > 0) {
      spdlog::info(
          "transfer {} from {}: {} files sent instead of compared: {} read its "
          "peer_limits.content_check_bytes_per_second",
          open.transfer_id(), peer_site, over_budget, peer_site);
    }
  }

  session->DrainDataChannels();
  // A first open that fails before its record is journaled leaves no
  // staging behind: no record would name it, so nothing would remove it.
  auto fail_unrecorded = [&](const absl::Status& s) {
    session->mu.AssertHeld();  // held here; clang 14 does not carry it into a lambda
    if (!*existing) {
      absl::Status removed = session->staging.has_value()
                                 ? session->staging->Remove()
                                 : storage::Staging::RemoveLeftover(fs_, *dest, open.transfer_id());
      session->staging.reset();
      if (!removed.ok()) {
        spdlog::warn("transfer {}: cannot remove the staging of its failed open: {}",
                     open.transfer_id(), removed.message());
        NoteStagingLeft();
      }
    }
    return fail(s);
  };
  if (!session->staging) {
    auto staging = storage::Staging::Open(fs_, *dest, open.transfer_id());
    if (!staging.ok()) return fail_unrecorded(staging.status());
    session->staging.emplace(std::move(*staging));
  }
  // Files whose source changed since the last attempt start over.
  if (*existing) {
    const v1::Manifest& old = (*existing)->manifest();
    for (int f = 0; f < old.files_size(); ++f) {
      if (SameContentIdentity(old.files(f), open.manifest().files(f))) continue;
      spdlog::info("transfer {}: {} changed at the source; discarding its staged chunks",
                   open.transfer_id(), open.manifest().files(f).path());
      if (absl::Status s = journal_.DeleteFileChunks(open.transfer_id(), f); !s.ok())
        return fail(s);
      if (absl::Status s = session->staging->DiscardFile(f); !s.ok()) return fail(s);
    }
  }
  if (absl::Status s = journal_.PutIncoming(record); !s.ok()) return fail_unrecorded(s);

  auto chunks = journal_.ListDurableChunks(open.transfer_id());
  if (!chunks.ok()) return fail(chunks.status());
  session->durable.clear();
  session->durable_digests.clear();
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
    spdlog::warn(
        "transfer {}: the staged bytes of {} are gone though its chunks were journaled "
        "durable; asking for the file again",
        open.transfer_id(), file.path());
    if (absl::Status s = journal_.DeleteFileChunks(open.transfer_id(), c.file_index); !s.ok()) {
      return fail(s);
    }
    if (absl::Status s = session->staging->DiscardFile(c.file_index); !s.ok()) return fail(s);
  }
  for (const storage::ChunkDurability& c : *chunks) {
    const v1::ManifestFile& file = record.manifest().files(c.file_index);
    if (c.chunk.generation() != file.generation() || !held[c.file_index]) continue;
    const uint64_t write = session->durable[{c.file_index, c.chunk_index}] = ++session->writes;
    if (auto digest = storage::Xxh128::FromBytes(c.chunk.xxh128())) {
      session->durable_digests[{c.file_index, c.chunk_index}] = *digest;
    }
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
      const storage::ChunkId key{c.file_index, c.chunk_index};
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
  // A relay refused for forging stays refused while the owner names it.
  if (session->refused_relay != session->record.relay_by()) {
    session->refused_relay.clear();
    session->relay_refused.clear();
  }
  if (options_.relay) options_.relay(open.transfer_id(), open.relay_to());
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
    const std::string& transfer_id, const std::string& peer_site, bool or_relay) {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(transfer_id);
  if (it == sessions_.end()) {
    return absl::UnavailableError(absl::StrCat("transfer ", transfer_id, " is not open here"));
  }
  absl::MutexLock session_lock(&it->second->mu);
  const std::string& relay_by = it->second->record.relay_by();
  const bool relay = or_relay && !relay_by.empty() && relay_by == peer_site &&
                     it->second->refused_relay != peer_site;
  if (it->second->record.source_site() != peer_site && !relay) {
    return absl::PermissionDeniedError(
        absl::StrCat("transfer ", transfer_id, " belongs to another site"));
  }
  return it->second;
}

v1::PeerMessage Receiver::HandleAbort(const std::string& peer_site,
                                      const v1::PeerMessage& request) {
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
    if (!authority_.MayNoteAbort(peer_site)) return answer;
    // Not opened yet: leave a tombstone so a late open is refused.
    v1::IncomingTransfer tombstone;
    tombstone.set_id(id);
    tombstone.set_source_site(peer_site);
    tombstone.set_state(v1::IncomingTransfer::ABORTED);
    tombstone.set_ended_unix_ms(absl::ToUnixMillis(clock_.WallNow()));
    if (absl::Status s = journal_.PutIncoming(tombstone); !s.ok()) return fail(s);
    return answer;
  }
  if ((*record)->source_site() != peer_site) {
    return fail(
        absl::PermissionDeniedError(absl::StrCat("transfer ", id, " belongs to another site")));
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
  // ABORTED is journaled before the staging goes, so a staging that cannot
  // be removed now (a full or failing file system, a crash) is removed by
  // RemoveStrayStaging, soon (NoteStagingLeft) or at the next start. The
  // removal is tried whatever the journal says: on a full disk it is what
  // frees the space.
  absl::Status journaled = journal_.DeleteChunks(id);
  if (journaled.ok()) {
    (*record)->set_state(v1::IncomingTransfer::ABORTED);
    (*record)->set_ended_unix_ms(absl::ToUnixMillis(clock_.WallNow()));
    journaled = journal_.PutIncoming(**record);
  }
  const absl::Status removed = session->staging->Remove();
  session->staging.reset();
  if (!journaled.ok()) return fail(journaled);
  if (!removed.ok()) {
    spdlog::warn("transfer {} from {}: aborted ({}); its staging could not be removed yet: {}", id,
                 peer_site, request.abort().reason(), removed.message());
    NoteStagingLeft();
    return answer;
  }
  spdlog::info("transfer {} from {}: aborted ({}); staging removed", id, peer_site,
               request.abort().reason());
  return answer;
}

}  // namespace longhaul::peer
