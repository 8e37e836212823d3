// The Receiver's verification, read-back and publish: chunks read back
// against their digests while receiving and before publish, the commit and
// verify requests, interrupted publishes finished at start, and pruning of
// old checkpoints after a publish.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/errno_status.h"
#include "common/fmt_absl.h"
#include "daemon/peer/messaging.h"
#include "daemon/peer/receiver.h"
#include "daemon/peer/receiver_session.h"
#include "spdlog/spdlog.h"
#include "storage/chunk_io.h"
#include "storage/chunk_plan.h"
#include "storage/manifest.h"
#include "storage/retention.h"
#include "storage/staging.h"
#include "storage/trash.h"
#include "storage/xxh3.h"

namespace longhaul::peer {

using receiver_internal::CheckTransferId;
using receiver_internal::ParentOf;

namespace {

// Threads that read staged chunks back before a publish (at most one per core).
constexpr size_t kMaxVerifyThreads = 4;

// `failed`, the error of a publish, as the answer to a commit. A publish that
// failed past its point of no return (an install's rename or fsync failed)
// has committed the destination to this version: the sender's next commit,
// or this daemon's next start, finishes it. So the sender must retry, not
// give up and report a failure for a version that will appear.
absl::Status AsCommitError(std::optional<storage::Staging>& staging, absl::Status failed) {
  if (!staging) return failed;
  absl::StatusOr<bool> past = staging->PastPointOfNoReturn();
  if (!past.ok() || !*past) return failed;
  return absl::UnavailableError(absl::StrCat(
      "publish interrupted past its point of no return (the next commit finishes it): ",
      failed.message()));
}

}  // namespace

absl::Status Receiver::RefuseDifferent(const v1::OpenRequest& open, const std::string& peer_site,
                                       const storage::ResolvedDestination& dest) {
  if (!open.refuse_different() || open.skip_unchanged()) return absl::OkStatus();
  auto differs = storage::DestinationDiffers(fs_, dest, open.single_file(), open.manifest());
  if (!differs.ok()) return differs.status();
  if (!differs->has_value()) return absl::OkStatus();
  spdlog::info("transfer {} from {}: refused: {} exists and {}", open.transfer_id(), peer_site,
               dest.absolute, **differs);
  return absl::FailedPreconditionError(absl::StrCat(
      "destination ", open.export_name(), ":", open.dest_path(), " exists and ", **differs,
      "; cp does not replace it: use cp --replace to replace it whole (the old version is "
      "kept in the export's .longhaul/trash), or sync to update it"));
}

v1::PeerMessage Receiver::CheckOpen(const v1::PeerMessage& request,
                                    const DestinationAuthority::Change& change,
                                    const storage::ResolvedDestination& dest) {
  const v1::OpenRequest& open = request.open();
  auto fail = [&](const absl::Status& s) { return ErrorAnswer(request.request_id(), s); };
  // A check stands for a submit: of a transfer not opened here yet. One of
  // a known id says nothing more, and is nobody's way into that transfer.
  auto known = journal_.GetIncoming(open.transfer_id());
  if (!known.ok()) return fail(known.status());
  if (*known) {
    return fail(absl::PermissionDeniedError(absl::StrCat(
        "transfer ", open.transfer_id(), " is known here already; a check is for a new one")));
  }
  if (absl::Status s = RefuseDifferent(open, change.source, dest); !s.ok()) return fail(s);
  absl::flat_hash_set<uint32_t> unchanged;
  v1::PeerMessage answer;
  answer.set_request_id(request.request_id());
  v1::OpenReply* reply = answer.mutable_open_reply();
  reply->set_sparse_files(true);
  reply->set_hard_links(true);
  for (int f = 0; open.skip_unchanged() && f < open.manifest().files_size(); ++f) {
    if (open.manifest().files(f).link_of() != 0) continue;
    auto same =
        storage::PublishedFileMatches(fs_, dest, open.single_file(), open.manifest().files(f));
    if (!same.ok()) return fail(same.status());
    if (*same) {
      unchanged.insert(static_cast<uint32_t>(f));
      reply->add_unchanged_files(static_cast<uint32_t>(f));
    }
  }
  absl::StatusOr<v1::PublishReport> would = storage::WouldReplace(
      fs_, dest, open.single_file(), open.manifest(), unchanged, open.keep_deleted());
  if (!would.ok()) return fail(would.status());
  // The names of files only the destination holds go to a peer that may
  // know them; the others are names of the manifest's own files.
  if (!authority_.MayCompareContent(change)) would->clear_deleted();
  *reply->mutable_would() = std::move(*would);
  return answer;
}

storage::PublishOptions Receiver::PublishOptionsOf(const v1::IncomingTransfer& record) const {
  storage::PublishOptions options;
  options.single_file = record.single_file();
  options.commit_last.assign(record.commit_last().begin(), record.commit_last().end());
  for (uint32_t f : record.unchanged_files()) options.skip_files.insert(f);
  options.compare_content = record.compare_content();
  options.keep_deleted = record.keep_deleted();
  options.trash_entry = storage::TrashEntryName(absl::ToUnixMillis(clock_.WallNow()), record.id());
  if (const ReceiverOptions::Export* e = options_.FindExport(record.export_name())) {
    options.mode_mask = e->mode_mask;
  }
  return options;
}

// After a publish, the old checkpoints beside the destination that the same
// source site published go; nothing else of the export is counted or
// touched. The transfer itself succeeded, so a failure here is logged for
// the operator and does not fail it; the next sync retries.
std::vector<std::string> Receiver::PruneOldCheckpoints(const v1::IncomingTransfer& record,
                                                       const storage::ResolvedDestination& dest) {
  if (record.keep_checkpoints() == 0 || record.single_file()) return {};
  const std::string parent = ParentOf(dest.relative);
  absl::StatusOr<absl::flat_hash_set<std::string>> owned =
      authority_.Prunable(DestinationAuthority::Change::Of(record, dest.relative), parent);
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
    return {};
  }
  for (const std::string& name : *removed) {
    authority_.Pruned(record.export_name(),
                      parent.empty() ? name : absl::StrCat(parent, "/", name));
  }
  if (!removed->empty()) {
    spdlog::info("transfer {}: kept the newest {} checkpoints of {} in {}; removed {}", record.id(),
                 record.keep_checkpoints(), record.source_site(),
                 dest.absolute.substr(0, dest.absolute.rfind('/')), absl::StrJoin(*removed, ", "));
  }
  return std::move(*removed);
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
  const storage::ChunkId key{file_index, chunk_index};
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
    auto hash =
        storage::ReadChunkHashed(worker.io(), *file, chunk_index * chunk_size, worker.Buffer(size));
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
  const Timestamp start = clock_.Now();
  const std::string& id = session.record.id();
  const v1::Manifest& manifest = session.record.manifest();
  auto listed = journal_.ListDurableChunks(id);
  if (!listed.ok()) return listed.status();
  std::vector<storage::ChunkDurability> chunks;
  uint64_t bytes_checked_early = 0;
  for (storage::ChunkDurability& c : *listed) {
    if (skip_files.contains(c.file_index)) continue;
    if (c.chunk.generation() != manifest.files(c.file_index).generation()) continue;
    const storage::ChunkId key{c.file_index, c.chunk_index};
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
        spdlog::error(
            "transfer {}: staged chunk {} of {} does not match its digest; re-fetching the file",
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
  spdlog::info(
      "transfer {}: read back {} staged bytes against their digests in {:.2f} s "
      "({} more were read back while receiving)",
      id, bytes_read.load(), (clock_.Now() - start).ToSecondsF(), bytes_checked_early);
  for (uint32_t f : bad_files) {
    if (absl::Status s = journal_.DeleteFileChunks(id, f); !s.ok()) return s;
    if (absl::Status s = session.staging->DiscardFile(f); !s.ok()) return s;
    storage::ForEachChunkOfFile(manifest, f, [&](storage::ChunkId id, uint64_t) {
      session.mu.AssertHeld();  // held here; clang 14 does not carry it into a lambda
      session.durable.erase(id);
    });
    // Not under mu_: the session lock is held, and mu_ is taken before it elsewhere.
    staged_corruptions_.fetch_add(1);
  }
  if (!bad_files.empty()) {
    return absl::UnavailableError(
        absl::StrCat(bad_files.size(),
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
      +[](Arg* a)
           ABSL_NO_THREAD_SAFETY_ANALYSIS { return !a->self->publishing_.contains(*a->path); },
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
  // Decided before the publish makes the source this destination's publisher.
  bool may_name_deleted = false;
  {
    // One publisher per destination path: a second one waits its turn, so
    // each publish swaps one whole version for another.
    LockDestination(session.dest.absolute);
    storage::PublishOptions options = PublishOptionsOf(record);
    may_name_deleted = authority_.MayCompareContent(
        DestinationAuthority::Change::Of(record, session.dest.relative));
    record.clear_publish_report();
    options.report = record.mutable_publish_report();
    published = session.staging->Publish(record.manifest(), options, &resend);
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
      storage::ForEachChunkOfFile(record.manifest(), f, [&](storage::ChunkId id, uint64_t) {
        session.mu.AssertHeld();  // held here; clang 14 does not carry it into a lambda
        session.durable.erase(id);
      });
    }
    if (absl::Status s = journal_.PutIncoming(record); !s.ok()) return s;
    return published;
  }
  // Names of files only the destination held go to a source that may know
  // them (it published them, or may read the export); others get counts.
  if (!may_name_deleted) record.mutable_publish_report()->clear_deleted();
  record.set_state(v1::IncomingTransfer::PUBLISHED);
  if (absl::Status s = journal_.PutIncoming(record); !s.ok()) return s;
  if (absl::Status s = session.staging->Remove(); !s.ok()) {
    spdlog::warn("transfer {}: published, but its staging {} was not removed: {}", id,
                 session.staging->dir(), s.message());
    NoteStagingLeft();
  }
  session.staging.reset();
  authority_.Published(DestinationAuthority::Change::Of(record, session.dest.relative));
  spdlog::info("transfer {} from {}: published {} files at {}", id, record.source_site(),
               record.manifest().files_size() - record.unchanged_files_size(),
               session.dest.absolute);
  std::vector<std::string> pruned = PruneOldCheckpoints(record, session.dest);
  if (!pruned.empty()) {
    for (std::string& name : pruned) record.mutable_publish_report()->add_pruned(std::move(name));
    if (absl::Status s = journal_.PutIncoming(record); !s.ok()) {
      spdlog::warn("transfer {}: the checkpoints it pruned are not journaled: {}", id, s.message());
    }
  }
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

v1::PeerMessage Receiver::HandleCommit(const std::string& peer_site,
                                       const v1::PeerMessage& request) {
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
      NoteStagingLeft();
    }
    answer.mutable_commit_reply()->set_files_published(record.manifest().files_size() -
                                                       record.unchanged_files_size());
    *answer.mutable_commit_reply()->mutable_report() = record.publish_report();
    return answer;
  }
  if (record.state() == v1::IncomingTransfer::EXPIRED) {
    return fail(absl::FailedPreconditionError(
        absl::StrCat("transfer ", id, " expired here; its staged data was removed")));
  }
  const v1::Manifest& manifest = record.manifest();
  const storage::PublishOptions options = PublishOptionsOf(record);
  uint64_t missing = 0;
  storage::ForEachChunk(manifest, [&](storage::ChunkId id, uint64_t) {
    session->mu.AssertHeld();  // held here; clang 14 does not carry it into a lambda
    missing += !options.skip_files.contains(id.file_index) && !session->durable.contains(id);
  });
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
    if (absl::Status s = PublishLocked(*session); !s.ok()) {
      return fail(AsCommitError(session->staging, s));
    }
  } else {
    // Asked again: the config may have changed since the open, and another
    // site may have published over this path meanwhile.
    const DestinationAuthority::Change change =
        DestinationAuthority::Change::Of(record, session->dest.relative);
    if (absl::Status s = authority_.Claim(change); !s.ok()) return fail(s);
    absl::Status s = VerifyStaged(*session, options.skip_files);
    if (s.ok()) s = PublishLocked(*session);
    authority_.Release(change);
    if (!s.ok()) return fail(AsCommitError(session->staging, s));
  }
  answer.mutable_commit_reply()->set_files_published(manifest.files_size() -
                                                     record.unchanged_files_size());
  *answer.mutable_commit_reply()->mutable_report() = record.publish_report();
  return answer;
}

v1::PeerMessage Receiver::HandleVerify(const std::string& peer_site,
                                       const v1::PeerMessage& request) {
  const std::string& id = request.verify().transfer_id();
  auto fail = [&](const absl::Status& s) { return ErrorAnswer(request.request_id(), s); };
  if (absl::Status s = CheckTransferId(id); !s.ok()) return fail(s);
  auto record = journal_.GetIncoming(id);
  if (!record.ok()) return fail(record.status());
  if (!*record || (*record)->source_site() != peer_site) {
    return fail(
        absl::NotFoundError(absl::StrCat("no transfer ", id, " from ", peer_site, " here")));
  }
  if ((*record)->state() != v1::IncomingTransfer::PUBLISHED) {
    return fail(
        absl::FailedPreconditionError(absl::StrCat("transfer ", id, " is not published yet")));
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
  MemoryReservation reserved = MemoryReservation::TryTake(budget_, peer_site, buffer_size);
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
    std::string path =
        (*record)->single_file() ? dest->absolute : dest->absolute + "/" + file.path();
    int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) {
      digest->set_error(ForPeer(ErrnoError(errno, "cannot open", path).message(), export_roots_));
      continue;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || static_cast<uint64_t>(st.st_size) != file.size()) {
      digest->set_error(ForPeer(
          absl::StrCat(path, " has size ", st.st_size, ", expected ", file.size()), export_roots_));
      ::close(fd);
      continue;
    }
    absl::Status read = storage::HashFileChunks(
        *io, fd, file, manifest.chunk_size(), absl::MakeSpan(buffer.get(), buffer_size),
        [&](uint32_t, uint64_t, const storage::Xxh128& chunk_digest) {
          const auto bytes = chunk_digest.ToBytes();
          digest->add_chunk_xxh128(bytes.data(), bytes.size());
          return true;
        });
    if (!read.ok()) digest->set_error(ForPeer(read.message(), export_roots_));
    ::close(fd);
  }
  return answer;
}

}  // namespace longhaul::peer
