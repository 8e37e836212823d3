#ifndef LONGHAUL_COMMON_ERRNO_STATUS_H_
#define LONGHAUL_COMMON_ERRNO_STATUS_H_

// errno values as absl::Status, with one errno-to-code mapping for every
// module, so a caller can branch on the code: ENOSPC and the other
// exhausted resources are ResourceExhausted (transfers treat it as
// retryable), refused or broken connections and EAGAIN/EINTR Unavailable,
// ENOENT NotFound, EACCES/EPERM/ELOOP PermissionDenied (ELOOP is what
// O_NOFOLLOW reports for a symlink), bad names InvalidArgument, a path of
// the wrong kind or a read-only file system FailedPrecondition, the rest
// Internal.

#include <cerrno>
#include <string_view>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace longhaul {

// The code ErrnoError gives `err`.
absl::StatusCode ErrnoCode(int err);

// "<context>: <strerror(err)>" with the code of `err`.
absl::Status ErrnoError(int err, absl::string_view context);

// ErrnoError(errno, context): call it right after the failing call.
inline absl::Status ErrnoError(absl::string_view context) { return ErrnoError(errno, context); }

// "<what> <path>: <strerror(err)>" with the code of `err`, for a call on a
// named file (e.g. ErrnoError(errno, "cannot open", path)).
absl::Status ErrnoError(int err, std::string_view what, std::string_view path);

}  // namespace longhaul

#endif  // LONGHAUL_COMMON_ERRNO_STATUS_H_
