// Helpers shared by SourceAccess and DestinationAccess, which judge local
// paths for a local user: names of users and groups for refusals, and
// resolved-path arithmetic.
#ifndef LONGHAUL_DAEMON_TRANSFER_LOCAL_PATHS_H_
#define LONGHAUL_DAEMON_TRANSFER_LOCAL_PATHS_H_

#include <sys/types.h>

#include <string>

#include "absl/strings/string_view.h"

namespace longhaul::daemon {

// The access(2) bits (R_OK, W_OK, X_OK), which are also a mode's bits for
// its owner, group and others: what a judge asks for.
inline constexpr int kRead = 4;
inline constexpr int kWrite = 2;
inline constexpr int kSearch = 1;

// The user's (group's) name in the system database, or its number.
std::string UserName(uid_t uid);
std::string GroupName(gid_t gid);

// The directory holding absolute `path` ("/" for a path directly below it).
std::string ParentOf(absl::string_view path);

// True when `path` is `root` or below it (both absolute and clean).
bool IsWithin(absl::string_view path, absl::string_view root);

}  // namespace longhaul::daemon

#endif  // LONGHAUL_DAEMON_TRANSFER_LOCAL_PATHS_H_
