#include "daemon/transfer/remote_copy.h"

#include <algorithm>
#include <atomic>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/notification.h"
#include "daemon/peer/messaging.h"
#include "daemon/wire/messaging.h"
#include "google/protobuf/io/coded_stream.h"

namespace longhaul::daemon {
namespace {

// Bytes an element of a repeated message field numbered 16 to 2047 takes on
// the wire: its two-byte tag, its length and itself.
template <typename Message>
size_t ElementBytes(const Message& m) {
  const size_t bytes = m.ByteSizeLong();
  return 2 + google::protobuf::io::CodedOutputStream::VarintSize64(bytes) + bytes;
}

// Keeps the longest prefix of `list` that takes at most `budget` bytes;
// returns how many elements it dropped.
template <typename Message>
int KeepPrefixWithin(google::protobuf::RepeatedPtrField<Message>& list, size_t budget) {
  int kept = 0;
  size_t used = 0;
  while (kept < list.size() && used + ElementBytes(list.Get(kept)) <= budget) {
    used += ElementBytes(list.Get(kept));
    ++kept;
  }
  const int dropped = list.size() - kept;
  if (dropped > 0) list.DeleteSubrange(kept, dropped);
  return dropped;
}

template <typename Message>
size_t ListBytes(const google::protobuf::RepeatedPtrField<Message>& list) {
  size_t bytes = 0;
  for (const Message& m : list) bytes += ElementBytes(m);
  return bytes;
}

// Room kept for the skipped entry that counts those left out.
constexpr size_t kSkippedNoteBytes = 128;

}  // namespace

absl::StatusOr<const ExportConfig*> CheckRemoteSubmit(const DaemonConfig& config,
                                                      const std::string& requester,
                                                      const v1::TransferSpec& spec) {
  if (spec.sources_size() > 0) {
    return absl::InvalidArgumentError(
        "a remote copy names its source by source_export and source_path, not by local paths");
  }
  // Who asks is the channel's certificate; a request claiming someone else
  // is refused rather than silently corrected, so the attempt is logged.
  if (!spec.requested_by().empty() && spec.requested_by() != requester) {
    return absl::PermissionDeniedError(absl::StrCat("the request names '", spec.requested_by(),
                                                    "' as its requester, but it came from ",
                                                    requester, " (by its certificate); refused"));
  }
  if (!spec.source_site().empty() && spec.source_site() != config.site) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the request names source site '", spec.source_site(), "', but this is ", config.site));
  }
  // One answer whether the export is missing or does not list the
  // requester: which exports exist is not a non-reader's business.
  const ExportConfig* e = config.FindExport(spec.source_export());
  if (e == nullptr || !e->IsReader(requester)) {
    return absl::PermissionDeniedError(absl::StrCat(
        config.site, "'s export '", spec.source_export(), "' does not exist or does not list ",
        requester, " in readers; add it to exports[].readers at ", config.site));
  }
  const std::string& path = spec.source_path();
  if (path.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("name a path below ", config.site, ":/", e->name,
                                                   "/; a whole export is not sent"));
  }
  if (path.front() == '/') {
    return absl::InvalidArgumentError(
        absl::StrCat("source path '", path, "' must be relative to export '", e->name, "'"));
  }
  const std::vector<std::string> parts = absl::StrSplit(path, '/');
  for (const std::string& part : parts) {
    if (part.empty() || part == "." || part == ".." || part.find('\0') != std::string::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("source path '", path, "' must be clean: no empty, '.' or '..' components"));
    }
  }
  if (parts.front() == ".longhaul") {
    return absl::PermissionDeniedError(
        absl::StrCat(config.site, " does not send its own work directory ", e->name, "/.longhaul"));
  }
  if (spec.dest_site() == config.site) {
    return absl::InvalidArgumentError(
        absl::StrCat("the destination is ", config.site, " itself, the source site; copy locally"));
  }
  return e;
}

std::string RemoteSourcePath(const ExportConfig& e, const v1::TransferSpec& spec) {
  std::string root = e.path;
  while (root.size() > 1 && root.back() == '/') root.pop_back();
  return absl::StrCat(root, root == "/" ? "" : "/", spec.source_path());
}

absl::StatusOr<v1::TransferStatus> CallRemote(transport::Transport& transport,
                                              const PeerConfig& site, v1::PeerMessage request,
                                              absl::Duration timeout) {
  v1::Hello hello;
  hello.set_role(v1::Hello::REMOTE);
  auto channel = peer::DialSession(transport, site.site, site.address, hello);
  if (!channel.ok()) {
    return absl::Status(channel.status().code(),
                        absl::StrCat("cannot reach ", site.site, ": ", channel.status().message()));
  }
  absl::Notification answered;
  std::atomic<bool> timed_out{false};
  std::thread watchdog([&] {
    if (!answered.WaitForNotificationWithTimeout(timeout)) {
      timed_out = true;
      (*channel)->Abort();
    }
  });
  auto answer = peer::Call(**channel, /*session_id=*/0, std::move(request), kMaxRemoteMessage);
  answered.Notify();
  watchdog.join();
  if (timed_out) {
    return absl::DeadlineExceededError(
        absl::StrCat(site.site, " did not answer within ", absl::FormatDuration(timeout)));
  }
  if (!answer.ok()) {
    // The source's words may be journaled (a lost transfer's error): bounded.
    std::string message(answer.status().message());
    CutText(message, kMaxRemoteError);
    return absl::Status(answer.status().code(), message);
  }
  if (!answer->has_remote_reply()) {
    return absl::InvalidArgumentError(absl::StrCat(site.site, " answered with no transfer status"));
  }
  v1::TransferStatus status = std::move(*answer->mutable_remote_reply()->mutable_status());
  FitRemoteStatus(status, kMaxRemoteMessage);
  return status;
}

void CutText(std::string& text, size_t max_bytes) {
  if (text.size() <= max_bytes) return;
  static constexpr absl::string_view kMark = " [cut]";
  size_t end = max_bytes - kMark.size();
  // Back off to the start of a UTF-8 sequence (never into a continuation byte).
  while (end > 0 && (static_cast<uint8_t>(text[end]) & 0xC0) == 0x80) --end;
  text.resize(end);
  text.append(kMark.data(), kMark.size());
}

void FitRemoteStatus(v1::TransferStatus& status, size_t max_bytes) {
  CutText(*status.mutable_error(), kMaxRemoteError);
  for (v1::DestinationStatus& d : *status.mutable_destinations()) {
    CutText(*d.mutable_error(), kMaxRemoteError);
  }
  for (v1::SkippedEntry& e : *status.mutable_skipped()) {
    CutText(*e.mutable_path(), kMaxRemoteError);
    CutText(*e.mutable_why(), kMaxRemoteError);
  }
  size_t size = status.ByteSizeLong();
  if (size <= max_bytes) return;
  status.clear_spec();
  size = status.ByteSizeLong();
  if (size <= max_bytes) return;
  // Fewer skipped entries: as many as fit beside the rest and the note.
  const size_t others = size - std::min(size, ListBytes(status.skipped()));
  const size_t room =
      max_bytes > others + kSkippedNoteBytes ? max_bytes - others - kSkippedNoteBytes : 0;
  if (const int dropped = KeepPrefixWithin(*status.mutable_skipped(), room); dropped > 0) {
    v1::SkippedEntry* note = status.add_skipped();
    note->set_path("...");
    note->set_why(absl::StrCat(dropped, " more entries were not sent; not listed here"));
  }
  size = status.ByteSizeLong();
  if (size <= max_bytes) return;
  const size_t rest = size - std::min(size, ListBytes(status.destinations()));
  KeepPrefixWithin(*status.mutable_destinations(), max_bytes > rest ? max_bytes - rest : 0);
  if (status.ByteSizeLong() > max_bytes) status.clear_skipped();
}

}  // namespace longhaul::daemon
