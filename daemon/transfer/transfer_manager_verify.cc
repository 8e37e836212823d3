// TransferManager::Verify: a completed transfer's destination, read back
// chunk by chunk there and compared with the source's chunks read here.
#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "daemon/peer/messaging.h"
#include "daemon/transfer/transfer_manager.h"
#include "daemon/wire/messaging.h"
#include "storage/chunk_io.h"
#include "storage/chunk_plan.h"
#include "storage/file_io.h"
#include "storage/manifest.h"

namespace longhaul::daemon {

absl::StatusOr<v1::VerifyResponse> TransferManager::Verify(const std::string& id) {
  v1::OutgoingTransfer record;
  {
    absl::MutexLock lock(&mu_);
    auto found = FindLocked(id);
    if (!found.ok()) return found.status();
    record = (*found)->record;
  }
  if (IsRemote(record)) return RunsElsewhere(record, "verified");
  if (record.state() != v1::COMPLETED) {
    return absl::FailedPreconditionError(
        absl::StrCat("transfer ", id, " is ", v1::TransferState_Name(record.state()),
                     "; only completed transfers can be verified"));
  }
  v1::VerifyResponse response;
  if (record.legs_size() == 0) {
    if (absl::Status s = VerifyDestination(record, record.spec().dest_site(), id, "", response);
        !s.ok()) {
      return s;
    }
  } else {
    for (const v1::FanoutLeg& leg : record.legs()) {
      const std::string& site = leg.destination().site();
      if (absl::Status s = VerifyDestination(record, site, leg.transfer_id(),
                                             absl::StrCat(site, ": "), response);
          !s.ok()) {
        return absl::Status(s.code(), absl::StrCat(site, ": ", s.message()));
      }
    }
  }
  response.set_ok(response.mismatches().empty());
  return response;
}

absl::Status TransferManager::VerifyDestination(const v1::OutgoingTransfer& record,
                                                const std::string& site,
                                                const std::string& transfer_id,
                                                const std::string& prefix,
                                                v1::VerifyResponse& response) {
  const PeerConfig* peer = config_.FindPeer(site);
  if (peer == nullptr) return absl::FailedPreconditionError("destination site is no longer a peer");
  v1::Hello hello;
  hello.set_role(v1::Hello::CONTROL);
  hello.set_transfer_id(transfer_id);
  auto channel = peer::DialSession(control_transport_, peer->site, peer->address, hello);
  if (!channel.ok()) return channel.status();
  v1::PeerMessage request;
  request.mutable_verify()->set_transfer_id(transfer_id);
  auto answer = peer::Call(**channel, wire::SessionIdFor(transfer_id), request);
  if (!answer.ok()) return answer.status();
  const v1::VerifyReply& reply = answer->verify_reply();

  const v1::Manifest& manifest = record.manifest();
  std::unique_ptr<storage::FileIo> io = storage::MakeFileIo();
  std::vector<uint8_t> buffer(manifest.chunk_size());
  for (const v1::FileDigest& remote : reply.files()) {
    if (remote.file_index() >= static_cast<uint32_t>(manifest.files_size())) continue;
    const v1::ManifestFile& file = manifest.files(remote.file_index());
    const std::string& source = record.source_paths(remote.file_index());
    response.set_files_checked(response.files_checked() + 1);
    if (!remote.error().empty()) {
      response.add_mismatches(absl::StrCat(prefix, file.path(), ": destination: ", remote.error()));
      continue;
    }
    int fd = storage::OpenCheckedSource(source);
    if (fd < 0) {
      response.add_mismatches(absl::StrCat(prefix, file.path(), ": cannot read source ", source));
      continue;
    }
    uint64_t n = storage::ChunkCount(file, manifest.chunk_size());
    std::string problem;
    if (storage::CheckSourceUnchanged(file, fd).code() == absl::StatusCode::kAborted) {
      problem = "source changed since the transfer";
    } else if (static_cast<uint64_t>(remote.chunk_xxh128_size()) != n) {
      problem = "destination has a different number of chunks";
    }
    if (problem.empty()) {
      absl::Status read = storage::HashFileChunks(
          *io, fd, file, manifest.chunk_size(), absl::MakeSpan(buffer),
          [&](uint32_t c, uint64_t size, const storage::Xxh128& digest) {
            response.set_bytes_checked(response.bytes_checked() + size);
            const auto bytes = digest.ToBytes();
            if (remote.chunk_xxh128(c) == std::string(bytes.begin(), bytes.end())) return true;
            problem = absl::StrCat("chunk ", c, " differs");
            return false;
          });
      if (!read.ok()) problem = std::string(read.message());
    }
    ::close(fd);
    if (!problem.empty()) response.add_mismatches(absl::StrCat(prefix, file.path(), ": ", problem));
  }
  if (reply.files_size() != manifest.files_size()) {
    response.add_mismatches(
        absl::StrCat(prefix, "destination reported a different number of files"));
  }
  return absl::OkStatus();
}

}  // namespace longhaul::daemon
