// Who calls the control API, and which local files a caller may have this
// daemon send.
#ifndef LONGHAUL_DAEMON_TRANSFER_SOURCE_ACCESS_H_
#define LONGHAUL_DAEMON_TRANSFER_SOURCE_ACCESS_H_

#include <sys/types.h>

#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "daemon/config.h"
#include "storage/manifest.h"

namespace longhaul::daemon {

// The caller of one control call, as the control service identified it: a
// local user on the Unix socket (uid and gid from SO_PEERCRED), or a client
// of the TCP control address holding a role's token, or a peer site asking
// for a pull or third-party copy (its name from its TLS certificate).
struct Caller {
  enum class Kind { kLocalUser, kToken, kPeerSite };

  static Caller LocalUser(uid_t uid, gid_t gid);
  static Caller Token(ControlRole role, std::string address);
  static Caller PeerSite(std::string site);

  // "uid 65534 (nobody)", or "ipv4:127.0.0.1:5000 (token role viewer)".
  std::string ToString() const;
  // Who asked, as journaled with a transfer and compared when a sync would
  // attach to a running one: "uid:1000", "token:operator" or "site:site-b".
  // Never an address, which changes from one connection to the next.
  std::string RequesterKey() const;
  // The caller a RequesterKey() names, with `gid` for a local user (a token
  // caller's address is not kept); nullopt for a key it did not make.
  static std::optional<Caller> FromRequesterKey(absl::string_view key, gid_t gid);

  Kind kind = Kind::kLocalUser;
  uid_t uid = 0;
  gid_t gid = 0;
  // A local user may do everything; the Unix socket's mode decides who
  // connects at all.
  ControlRole role = ControlRole::kOperator;
  std::string address;  // a token caller's address; a peer caller's site
};

// The supplementary groups of `uid` in the group database (getgrouplist of
// its passwd entry, primary group included); empty for a uid without one.
std::vector<gid_t> SystemGroupsOf(uid_t uid);

// A path no caller gets, nor anything below it.
struct SourceAccessForbidden {
  std::string path;
  std::string what;  // "this site's TLS private key"
};

// What no caller may have this daemon send, whatever the exports say: its
// TLS key and the directories of tls.key and tls.ca (where a CA's key is
// kept), its state_dir and its control tokens.
std::vector<SourceAccessForbidden> DaemonSecrets(const DaemonConfig& config);

// Decides which local files a caller may have this daemon send.
//  - Every source, and every file and directory the manifest walk reaches,
//    must resolve (realpath) inside one of the exports. An explicitly named
//    source that is a symlink is judged by its target.
//  - The daemon's own secrets are never sent, whoever asks (`forbidden`:
//    its TLS key, control tokens, state_dir; anything below them too).
//  - A local user other than root gets only what that user could read: the
//    search bit of every directory on the way, the read bit of every file and
//    of every directory the walk lists, taken from the owner, group or other
//    bits by the user's uid, its gid from SO_PEERCRED and its groups in the
//    group database (POSIX ACLs and capabilities are not consulted, so what
//    only they would grant is refused). A token caller and a peer site read
//    with the daemon's rights, inside the exports (a peer site's SourceAccess
//    holds only the one export that lists it in `readers`).
// Refusals are PermissionDenied (NotFound for a missing source named by a
// caller who may see that it is missing), naming the path, the caller and
// the exports. A non-root local user is not told whether a path outside the
// exports, or below a directory it cannot search, exists.
//
// Thread-safe: const after construction. Export paths are resolved on every
// check, so an export created after the daemon started counts.
class SourceAccess {
 public:
  using Forbidden = SourceAccessForbidden;
  using GroupsOf = std::function<std::vector<gid_t>(uid_t)>;

  SourceAccess(std::vector<ExportConfig> exports, std::vector<Forbidden> forbidden,
               GroupsOf groups_of = SystemGroupsOf);

  // Before the walk: each of `sources` (absolute, as the caller named them)
  // must resolve inside an export and be readable by `caller`. Returns their
  // resolved paths, in order.
  absl::StatusOr<std::vector<std::string>> CheckSources(
      const Caller& caller, const std::vector<std::string>& sources) const;

  // After the walk: every file and empty directory of `build`, built from
  // `sources` (resolved to `resolved` by CheckSources), passes the same
  // checks. An entry reached through a followed symlink (file_links) may
  // resolve outside the source trees; when it fails a check, the symlink is
  // skipped with everything reached through it, and listed in
  // build->skipped with the reason. Any other refusal fails the call. On
  // success build->source_paths hold the resolved paths that were checked,
  // so that the sender opens exactly those.
  absl::Status CheckBuild(const Caller& caller, const std::vector<std::string>& sources,
                          const std::vector<std::string>& resolved,
                          storage::ManifestBuild* build) const;

 private:
  class Check;

  std::vector<ExportConfig> exports_;
  std::vector<Forbidden> forbidden_;
  GroupsOf groups_of_;
};

}  // namespace longhaul::daemon

#endif  // LONGHAUL_DAEMON_TRANSFER_SOURCE_ACCESS_H_
