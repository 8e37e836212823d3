// The Receiver's part in fan-out: the owner's progress question, the relay's
// attach to a transfer the owner opened with relay_by, and the reader a relay
// of this site uses to send on the chunks durable here.
#include <fcntl.h>

#include "absl/strings/str_cat.h"
#include "daemon/peer/messaging.h"
#include "daemon/peer/receiver.h"
#include "daemon/peer/receiver_session.h"
#include "spdlog/spdlog.h"
#include "storage/chunk_io.h"
#include "storage/chunk_plan.h"

namespace longhaul::peer {

using receiver_internal::CheckTransferId;

namespace {

// How often a relay stream waiting for a chunk looks at its stop condition.
constexpr absl::Duration kRelayWaitSlice = absl::Milliseconds(100);

}  // namespace

v1::PeerMessage Receiver::HandleRelayAttach(const std::string& peer_site,
                                            const v1::PeerMessage& request) {
  const std::string& id = request.relay_attach().transfer_id();
  auto fail = [&](const absl::Status& s) { return ErrorAnswer(request.request_id(), s); };
  if (absl::Status s = CheckTransferId(id); !s.ok()) return fail(s);
  std::shared_ptr<Session> session;
  {
    absl::MutexLock lock(&mu_);
    auto it = sessions_.find(id);
    if (it != sessions_.end()) session = it->second;
  }
  if (session == nullptr) {
    return fail(absl::UnavailableError(absl::StrCat(
        "transfer ", id, " is not open at ", options_.local_site, "; its source opens it again")));
  }
  absl::MutexLock lock(&session->mu);
  if (session->record.relay_by().empty() || session->record.relay_by() != peer_site) {
    return fail(absl::PermissionDeniedError(
        absl::StrCat("transfer ", id, " is not relayed by ", peer_site)));
  }
  // The relay delivers the chunks of its own source's transfer: aimed at a
  // transfer of another source (by a relay_to that source did not choose),
  // it is refused before it sends a chunk that would get it refused.
  const std::string& owner = request.relay_attach().owner();
  if (owner != session->record.source_site()) {
    spdlog::warn("transfer {}: relay {} attaches for {}, but its source is {}", id, peer_site,
                 owner, session->record.source_site());
    const std::string for_whom = owner.empty() ? "an unnamed site" : owner;
    return fail(absl::PermissionDeniedError(absl::StrCat(
        "transfer ", id, " at ", options_.local_site, " is not relayed by ", peer_site, " for ",
        for_whom, ": the relay_to that aimed it here did not come from its source")));
  }
  if (session->refused_relay == peer_site) {
    return fail(absl::PermissionDeniedError(session->relay_refused));
  }
  if (session->record.state() != v1::IncomingTransfer::RECEIVING || !session->staging) {
    return fail(absl::FailedPreconditionError(
        absl::StrCat("transfer ", id, " is not receiving at ", options_.local_site)));
  }
  v1::PeerMessage answer;
  answer.set_request_id(request.request_id());
  v1::OpenReply* reply = answer.mutable_open_reply();
  // The relay plans by the manifest as this site received it.
  reply->set_sparse_files(true);
  reply->set_hard_links(true);
  for (const auto& [chunk, write] : session->durable) {
    v1::ChunkId* durable = reply->add_durable();
    durable->set_file_index(chunk.file_index);
    durable->set_chunk_index(chunk.chunk_index);
  }
  if (session->durable_pieces) {
    reply->set_durable_piece(kDurablePiece);
    for (const auto& [chunk, bytes] : session->partial) {
      v1::PartialChunk* p = reply->add_partial();
      p->set_file_index(chunk.file_index);
      p->set_chunk_index(chunk.chunk_index);
      p->set_durable_bytes(bytes);
    }
  }
  for (uint32_t f : session->record.unchanged_files()) reply->add_unchanged_files(f);
  return answer;
}

v1::PeerMessage Receiver::HandleProgress(const std::string& peer_site,
                                         const v1::PeerMessage& request) {
  const std::string& id = request.progress().transfer_id();
  auto fail = [&](const absl::Status& s) { return ErrorAnswer(request.request_id(), s); };
  if (absl::Status s = CheckTransferId(id); !s.ok()) return fail(s);
  auto found = FindSession(id, peer_site);
  if (!found.ok()) return fail(found.status());
  Session& session = **found;
  absl::MutexLock lock(&session.mu);
  const v1::Manifest& manifest = session.record.manifest();
  // Only the owner gets here (FindSession): its digests are the source's.
  for (const v1::SourceDigest& d : request.progress().digests()) {
    const std::optional<storage::Xxh128> digest = storage::Xxh128::FromBytes(d.xxh128());
    const bool known_file = d.file_index() < static_cast<uint32_t>(manifest.files_size());
    if (!digest || !known_file ||
        d.chunk_index() >=
            storage::ChunkCount(manifest.files(d.file_index()), manifest.chunk_size())) {
      return fail(absl::InvalidArgumentError(
          absl::StrCat("source digest of chunk ", d.chunk_index(), " of file ", d.file_index(),
                       " names no chunk of transfer ", id, " or is not 16 bytes")));
    }
    // Another generation: the owner read it before or after this open.
    if (d.generation() != manifest.files(d.file_index()).generation()) continue;
    session.owner_digests[{d.file_index(), d.chunk_index()}] = {d.generation(), *digest};
  }
  v1::PeerMessage answer;
  answer.set_request_id(request.request_id());
  v1::ProgressReply* reply = answer.mutable_progress_reply();
  for (const storage::ChunkId& chunk : session.awaiting_digests) {
    auto known = session.owner_digests.find(chunk);
    if (known != session.owner_digests.end() &&
        known->second.generation == manifest.files(chunk.file_index).generation()) {
      continue;  // its stream takes it once this lock is released
    }
    v1::ChunkId* awaited = reply->add_awaiting_digests();
    awaited->set_file_index(chunk.file_index);
    awaited->set_chunk_index(chunk.chunk_index);
  }
  reply->set_relay_refused(session.relay_refused);
  reply->set_published(session.record.state() == v1::IncomingTransfer::PUBLISHED);
  uint64_t bytes = 0;
  for (const auto& [chunk, write] : session.durable) {
    if (chunk.file_index >= static_cast<uint32_t>(manifest.files_size())) continue;
    bytes += storage::ChunkSize(manifest.files(chunk.file_index), chunk.chunk_index,
                                manifest.chunk_size());
  }
  for (const auto& [chunk, prefix] : session.partial) bytes += prefix;
  reply->set_chunks_durable(session.durable.size());
  reply->set_bytes_durable(bytes);
  return answer;
}

absl::Status Receiver::AwaitOwnerDigest(Session& session, const std::string& relay,
                                        const wire::ChunkHeader& chunk, const std::string& path) {
  const storage::ChunkId key{chunk.file_index, chunk.chunk_index};
  const storage::Xxh128 framed{chunk.xxh128_low, chunk.xxh128_high};
  const absl::Time deadline = absl::Now() + kOwnerDigestWait;
  session.mu.Lock();
  const uint64_t drains = session.drains;
  struct Wanted {
    Session* session;
    const std::string* relay;
    storage::ChunkId key;
    uint32_t generation;
    uint64_t drains;
  } wanted{&session, &relay, key, chunk.generation, drains};
  const absl::Condition known(
      +[](Wanted* w) ABSL_NO_THREAD_SAFETY_ANALYSIS {
        auto it = w->session->owner_digests.find(w->key);
        return (it != w->session->owner_digests.end() && it->second.generation == w->generation) ||
               w->session->drains != w->drains || w->session->refused_relay == *w->relay;
      },
      &wanted);
  session.awaiting_digests.insert(key);
  // In slices, so that a shutdown (under mu_, taken before a session's
  // lock) is noticed within one.
  while (!session.mu.AwaitWithTimeout(known, kRelayWaitSlice) && absl::Now() < deadline) {
    session.mu.Unlock();
    bool shutting_down;
    {
      absl::MutexLock lock(&mu_);
      shutting_down = shutting_down_;
    }
    session.mu.Lock();
    if (shutting_down) break;
  }
  session.awaiting_digests.erase(key);
  absl::Status result = absl::OkStatus();
  auto it = session.owner_digests.find(key);
  if (session.drains != drains) {
    result = absl::CancelledError("the owner opened the transfer again");
  } else if (session.refused_relay == relay) {
    result = absl::PermissionDeniedError(session.relay_refused);  // by another of its streams
  } else if (it == session.owner_digests.end() || it->second.generation != chunk.generation) {
    result = absl::UnavailableError(
        absl::StrCat(options_.local_site, " has no digest from ", session.record.source_site(),
                     " for chunk ", chunk.chunk_index, " of ", path, " yet; retry later"));
  } else if (!(it->second.xxh128 == framed)) {
    result = RefuseRelayLocked(session, relay,
                               absl::StrCat("relay ", relay, " sent chunk ", chunk.chunk_index,
                                            " of ", path, " with a digest that is not the one ",
                                            session.record.source_site(), " read from its source"));
  }
  session.mu.Unlock();
  return result;
}

absl::Status Receiver::RefuseRelayLocked(Session& session, const std::string& relay,
                                         const std::string& why) {
  if (session.refused_relay != relay) {
    spdlog::warn("transfer {}: {}; taking nothing more from {}", session.record.id(), why, relay);
    session.refused_relay = relay;
    session.relay_refused = why;
  }
  return absl::PermissionDeniedError(why);
}

Receiver::RelayReader::RelayReader(Receiver& receiver, std::string transfer_id)
    : receiver_(receiver), transfer_id_(std::move(transfer_id)), io_(storage::MakeFileIo()) {}

Receiver::RelayReader::~RelayReader() = default;

absl::StatusOr<storage::Xxh128> Receiver::RelayReader::Read(uint32_t file_index,
                                                            uint32_t chunk_index,
                                                            uint32_t generation,
                                                            absl::Span<uint8_t> out,
                                                            const std::function<bool()>& stopping) {
  std::shared_ptr<Session> session;
  {
    absl::MutexLock lock(&receiver_.mu_);
    auto it = receiver_.sessions_.find(transfer_id_);
    if (it != receiver_.sessions_.end()) session = it->second;
  }
  if (session == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("transfer ", transfer_id_, " is no longer open here"));
  }
  const storage::ChunkId key{file_index, chunk_index};
  storage::Xxh128 expected;
  uint64_t offset;
  {
    absl::MutexLock lock(&session->mu);
    while (true) {
      const v1::IncomingTransfer::State state = session->record.state();
      const bool receiving = state == v1::IncomingTransfer::RECEIVING;
      if (!receiving && state != v1::IncomingTransfer::PUBLISHED) {
        return absl::FailedPreconditionError(
            absl::StrCat("transfer ", transfer_id_, " stopped receiving here"));
      }
      const v1::Manifest& manifest = session->record.manifest();
      if (file_index >= static_cast<uint32_t>(manifest.files_size()) ||
          manifest.files(file_index).generation() != generation) {
        return absl::FailedPreconditionError(absl::StrCat(
            "file ", file_index, " of transfer ", transfer_id_, " is at another generation here"));
      }
      auto digest = session->durable_digests.find(key);
      if (session->durable.contains(key) && digest != session->durable_digests.end()) {
        expected = digest->second;
        break;
      }
      if (!receiving) {
        return absl::FailedPreconditionError(
            absl::StrCat("transfer ", transfer_id_, " was published here without chunk ",
                         chunk_index, " of file ", file_index, " on record"));
      }
      if (stopping()) return absl::CancelledError("stopped");
      struct Wanted {
        Session* session;
        storage::ChunkId key;
      } wanted{session.get(), key};
      session->mu.AwaitWithTimeout(absl::Condition(
                                       +[](Wanted* w) ABSL_NO_THREAD_SAFETY_ANALYSIS {
                                         return w->session->durable.contains(w->key) ||
                                                w->session->record.state() !=
                                                    v1::IncomingTransfer::RECEIVING;
                                       },
                                       &wanted),
                                   kRelayWaitSlice);
    }
    offset = uint64_t{chunk_index} * session->record.manifest().chunk_size();
    if (file_index_ != file_index) {
      // Kept open: the descriptor reads the bytes wherever the publish moves them.
      file_.reset();
      file_index_ = UINT32_MAX;
      const v1::ManifestFile& file = session->record.manifest().files(file_index);
      absl::StatusOr<std::unique_ptr<storage::File>> opened;
      if (session->staging) {
        opened = session->staging->OpenForReadBack(file_index, file);
      } else {
        // Published: read where it was published; the digest check below
        // catches anything changed there since.
        const std::string base = session->dest.absolute;
        const std::string path = session->record.single_file() ? base : base + "/" + file.path();
        const size_t slash = path.rfind('/');
        absl::StatusOr<std::unique_ptr<storage::Directory>> dir =
            receiver_.fs_.OpenRoot(path.substr(0, slash));
        if (dir.ok()) {
          opened = receiver_.fs_.OpenFile(**dir, path.substr(slash + 1), storage::OpenMode::kRead);
        } else {
          opened = dir.status();
        }
      }
      if (!opened.ok()) return opened.status();
      file_ = std::move(*opened);
      file_index_ = file_index;
    }
  }
  absl::StatusOr<storage::Xxh128> read = storage::ReadChunkHashed(*io_, *file_, offset, out);
  if (!read.ok()) return read.status();
  if (!(*read == expected)) {
    return absl::DataLossError(absl::StrCat("chunk ", chunk_index, " of file ", file_index,
                                            " of transfer ", transfer_id_,
                                            " does not read back as it was acknowledged"));
  }
  return expected;
}

}  // namespace longhaul::peer
