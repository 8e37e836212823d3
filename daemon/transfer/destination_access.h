// Which local paths a caller may have this daemon write: the destination of
// a pull issued at this site, which the daemon would otherwise write with its
// own rights.
#ifndef LONGHAUL_DAEMON_TRANSFER_DESTINATION_ACCESS_H_
#define LONGHAUL_DAEMON_TRANSFER_DESTINATION_ACCESS_H_

#include <sys/types.h>

#include <atomic>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "daemon/config.h"
#include "daemon/transfer/source_access.h"

namespace longhaul::daemon {

// A local user's credentials as the kernel checks them.
struct UserCredentials {
  uid_t uid = 0;
  gid_t gid = 0;
  std::vector<gid_t> groups{};  // supplementary groups
};

// How a write is judged: by the kernel, in a child process that takes the
// user's credentials (needs CAP_SETUID and CAP_SETGID), or from the mode
// bits by this process, for a daemon that may not take them.
enum class WriteJudge { kKernel, kModeBits };

// Whether `user` could create or replace `path` (absolute and clean, with no
// symlink below the export: storage::ResolveDestination's `absolute`), the
// way a publish does: one rename over the entry, a whole directory at once.
//  - `path` exists: search every directory on the way, write and search its
//    parent, and, when that parent is sticky (mode 1000), own `path` or the
//    parent (uid 0 is exempt, as CAP_FOWNER is).
//  - `path` does not exist: search every directory on the way to its
//    deepest existing ancestor and write to that one; the directories
//    between are the pull's own.
// kKernel asks the kernel itself: a forked child drops to `user`
// (setgroups, setresgid, setresuid) and calls faccessat(2), so POSIX ACLs,
// read-only mounts and immutable directories count too; it fails with
// FailedPrecondition "cannot take the credentials" when this process lacks
// the capabilities. kModeBits reads the owner, group and other bits (uid 0
// may write everywhere) and refuses a directory it would judge that carries
// a POSIX access ACL, which it cannot evaluate.
// A refusal is PermissionDenied naming what is missing, e.g. "no write
// permission on directory /x (owner root, group root, mode 0755)".
absl::Status JudgeWrite(WriteJudge judge, const UserCredentials& user, const std::string& path);

// Decides which destinations a pull may write for its caller, at submit and
// again whenever its source opens or commits there:
//  - never the daemon's own secrets (DaemonSecrets: TLS key and the
//    directories of the TLS files, state_dir, control tokens), nor a
//    directory holding one, whoever asks;
//  - a local user (root included): what that user could write itself
//    (JudgeWrite by its uid, the gid from SO_PEERCRED and its groups in the
//    group database), asking the kernel when this daemon may take the
//    user's credentials (running as root) and from the mode bits otherwise;
//  - an operator token: the daemon's own rights inside the exports; a
//    viewer token and a peer site: nothing.
// Refusals are PermissionDenied naming the path and the caller.
//
// Thread-safe.
class DestinationAccess {
 public:
  using GroupsOf = SourceAccess::GroupsOf;

  DestinationAccess(std::vector<ExportConfig> exports, std::vector<SourceAccessForbidden> forbidden,
                    GroupsOf groups_of = SystemGroupsOf);

  // May `caller` have a pull create or replace `dest_path` of export
  // `export_name`?
  absl::Status MayWrite(const Caller& caller, const std::string& export_name,
                        const std::string& dest_path) const;

 private:
  std::vector<ExportConfig> exports_;
  std::vector<SourceAccessForbidden> forbidden_;
  GroupsOf groups_of_;
  // Set once the kernel judge could not take a user's credentials: this
  // process lacks the capabilities, so later checks use the mode bits.
  mutable std::atomic<bool> kernel_unavailable_{false};
};

}  // namespace longhaul::daemon

#endif  // LONGHAUL_DAEMON_TRANSFER_DESTINATION_ACCESS_H_
