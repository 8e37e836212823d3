#ifndef LONGHAUL_COMMON_ERRNO_STATUS_H_
#define LONGHAUL_COMMON_ERRNO_STATUS_H_

#include "absl/strings/string_view.h"
#include <cerrno>
#include <cstring>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace longhaul {

// Converts an errno value into a Status whose message reads
// "<context>: <strerror>", with a code a caller can branch on
// (e.g. ENOSPC -> ResourceExhausted, which transfers treat as retryable).
inline absl::Status ErrnoError(int err, absl::string_view context) {
  std::string message = absl::StrCat(context, ": ", std::strerror(err));
  switch (err) {
    case ENOENT:
      return absl::NotFoundError(message);
    case EEXIST:
      return absl::AlreadyExistsError(message);
    case EACCES:
    case EPERM:
      return absl::PermissionDeniedError(message);
    case ENOSPC:
    case EDQUOT:
    case ENOMEM:
    case EMFILE:
    case ENFILE:
      return absl::ResourceExhaustedError(message);
    case EINVAL:
    case ENAMETOOLONG:
    case ENOTDIR:
    case EISDIR:
    case ELOOP:
      return absl::InvalidArgumentError(message);
    case ECONNREFUSED:
    case ECONNRESET:
    case EPIPE:
    case ETIMEDOUT:
    case EHOSTUNREACH:
    case ENETUNREACH:
    case EAGAIN:
    case EINTR:
      return absl::UnavailableError(message);
    default:
      return absl::InternalError(message);
  }
}

inline absl::Status ErrnoError(absl::string_view context) { return ErrnoError(errno, context); }

}  // namespace longhaul

#endif  // LONGHAUL_COMMON_ERRNO_STATUS_H_
