// The Receiver's part in fan-out: the owner's progress question, the relay's
// attach to a transfer the owner opened with relay_by, and the reader a relay
// of this site uses to send on the chunks durable here.
#include <fcntl.h>

#include "absl/strings/str_cat.h"
#include "daemon/peer/messaging.h"
#include "daemon/peer/receiver.h"
#include "daemon/peer/receiver_session.h"
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
  v1::PeerMessage answer;
  answer.set_request_id(request.request_id());
  v1::ProgressReply* reply = answer.mutable_progress_reply();
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
