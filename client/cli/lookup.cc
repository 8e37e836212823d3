#include "client/cli/lookup.h"

#include <algorithm>
#include <filesystem>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace longhaul::cli {

bool IsRefusal(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kNotFound:
    case absl::StatusCode::kAlreadyExists:
    case absl::StatusCode::kPermissionDenied:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kOutOfRange:
      return true;
    default:
      return false;
  }
}

absl::StatusOr<std::string> ControlAddress(const std::string& address) {
  std::string resolved = address;
  if (resolved.starts_with('/') || resolved.starts_with("./") || resolved.starts_with("../")) {
    resolved = absl::StrCat("unix:", resolved);
  }
  // Said at once: a connect to a missing socket would wait for its timeout.
  if (resolved.starts_with("unix:")) {
    const std::string path = resolved.substr(5);
    std::error_code ec;
    if (!std::filesystem::exists(path, ec)) {
      return absl::UnavailableError(absl::StrCat(
          "cannot reach longhauld at ", resolved, ": there is no socket ", path,
          "; start the daemon (`systemctl start longhauld`, or `longhauld --config FILE`) or "
          "name its socket with --daemon PATH or $LONGHAUL_DAEMON"));
    }
  }
  return resolved;
}

absl::StatusOr<std::string> ResolveId(Client& client, const std::string& text) {
  absl::StatusOr<v1::TransferStatus> exact = client.Get(text);
  if (exact.ok()) return text;
  if (!absl::IsNotFound(exact.status()) || text.empty()) return exact.status();
  auto list = client.List(/*all=*/true);
  if (!list.ok()) return list.status();
  std::vector<std::string> candidates;
  for (const v1::TransferStatus& s : *list) {
    if (s.id().starts_with(text)) candidates.push_back(s.id());
  }
  if (candidates.empty()) return exact.status();
  if (candidates.size() > 1) {
    std::sort(candidates.begin(), candidates.end());
    return absl::InvalidArgumentError(
        absl::StrCat("id prefix '", text, "' matches ", candidates.size(),
                     " transfers: ", absl::StrJoin(candidates, ", "), "; give more of the id"));
  }
  return candidates.front();
}

bool Listed(const v1::TransferStatus& s, const ListFilter& f, absl::Time now) {
  if (f.failed && s.state() != v1::FAILED) return false;
  const bool ended = IsEndState(s.state()) || s.state() == v1::EXPIRED;
  if (f.all || !ended) return true;
  const int64_t ended_ms = s.finished_unix_ms() ? s.finished_unix_ms() : s.created_unix_ms();
  return absl::FromUnixMillis(ended_ms) >= now - f.since;
}

}  // namespace longhaul::cli
