#include "daemon/transfer/remote_copy.h"

#include <atomic>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/notification.h"
#include "daemon/peer/messaging.h"
#include "daemon/wire/messaging.h"

namespace longhaul::daemon {

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
  auto answer = peer::Call(**channel, /*session_id=*/0, std::move(request));
  answered.Notify();
  watchdog.join();
  if (timed_out) {
    return absl::DeadlineExceededError(
        absl::StrCat(site.site, " did not answer within ", absl::FormatDuration(timeout)));
  }
  if (!answer.ok()) return answer.status();
  if (!answer->has_remote_reply()) {
    return absl::InvalidArgumentError(absl::StrCat(site.site, " answered with no transfer status"));
  }
  return answer->remote_reply().status();
}

}  // namespace longhaul::daemon
