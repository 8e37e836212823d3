// Submit's check with the destination (OpenRequest.check_only) and --dry-run.

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "daemon/peer/messaging.h"
#include "daemon/peer/sender.h"
#include "daemon/transfer/transfer_manager.h"
#include "daemon/wire/messaging.h"
#include "spdlog/spdlog.h"

namespace longhaul::daemon {

absl::StatusOr<v1::OpenReply> TransferManager::CheckWithDestination(
    const v1::OutgoingTransfer& record) {
  const v1::TransferSpec& spec = record.spec();
  const PeerConfig* peer = config_.FindPeer(spec.dest_site());
  if (peer == nullptr) return absl::InvalidArgumentError("destination site is not a peer");
  v1::Hello hello;
  hello.set_role(v1::Hello::CONTROL);
  hello.set_transfer_id(record.id());
  auto channel = peer::DialSession(control_transport_, peer->site, peer->address, hello);
  // Not a decision of the destination (down, or TLS refused either way):
  // the transfer's own open meets it again, and reports it, as before.
  if (!channel.ok()) return absl::UnavailableError(channel.status().message());
  v1::PeerMessage request;
  v1::OpenRequest* open = request.mutable_open();
  *open = peer::OpenRequestFor(record, config_.site);
  open->set_check_only(true);
  auto answer = peer::Call(**channel, wire::SessionIdFor(record.id()), request);
  if (!answer.ok()) return answer.status();
  return answer->open_reply();
}

absl::Status TransferManager::CheckBeforeSubmit(const v1::OutgoingTransfer& record,
                                                v1::TransferStatus* dry_run) {
  const v1::TransferSpec& spec = record.spec();
  absl::StatusOr<v1::OpenReply> reply = CheckWithDestination(record);
  if (!reply.ok()) {
    const absl::Status& s = reply.status();
    if (absl::IsUnavailable(s) || absl::IsDeadlineExceeded(s) || absl::IsResourceExhausted(s)) {
      // Not reached now: a real submit is queued and checked when it opens;
      // a dry run cannot answer.
      if (dry_run != nullptr) {
        return absl::UnavailableError(
            absl::StrCat("dry run: cannot reach ", spec.dest_site(), ": ", s.message()));
      }
      spdlog::info(
          "transfer {}: {} not reachable to check the destination before submit ({}); "
          "it is checked when the transfer opens there",
          record.id(), spec.dest_site(), s.message());
      return absl::OkStatus();
    }
    // The destination refuses it: the caller's to fix (exit code 2).
    const absl::StatusCode code = absl::IsPermissionDenied(s) ? absl::StatusCode::kPermissionDenied
                                                              : absl::StatusCode::kInvalidArgument;
    return absl::Status(code,
                        absl::StrCat(spec.dest_site(), " refuses ", spec.dest_site(), ":/",
                                     spec.dest_export(), "/", spec.dest_path(), ": ", s.message()));
  }
  if (dry_run == nullptr) return absl::OkStatus();
  absl::flat_hash_set<uint32_t> unchanged(reply->unchanged_files().begin(),
                                          reply->unchanged_files().end());
  std::vector<std::string> send;
  for (int f = 0; f < record.manifest().files_size(); ++f) {
    if (!unchanged.contains(static_cast<uint32_t>(f)))
      send.push_back(record.manifest().files(f).path());
  }
  std::sort(send.begin(), send.end());
  dry_run->set_would_send_count(send.size());
  for (size_t i = 0; i < send.size() && i < 1000; ++i) dry_run->add_would_send(send[i]);
  dry_run->set_files_unchanged(unchanged.size());
  *dry_run->mutable_publish_report() = reply->would();
  return absl::OkStatus();
}

}  // namespace longhaul::daemon
