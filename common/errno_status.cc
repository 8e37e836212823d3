#include "common/errno_status.h"

#include <cerrno>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"

namespace longhaul {

absl::StatusCode ErrnoCode(int err) {
  switch (err) {
    case ENOENT:
      return absl::StatusCode::kNotFound;
    case EEXIST:
      return absl::StatusCode::kAlreadyExists;
    case EACCES:
    case EPERM:
    case ELOOP:
      return absl::StatusCode::kPermissionDenied;
    case ENOSPC:
    case EDQUOT:
    case EMFILE:
    case ENFILE:
    case ENOMEM:
    case ENOBUFS:
      return absl::StatusCode::kResourceExhausted;
    case EINTR:
    case EAGAIN:
    case ECONNREFUSED:
    case ECONNRESET:
    case ECONNABORTED:
    case EPIPE:
    case ETIMEDOUT:
    case EHOSTUNREACH:
    case ENETUNREACH:
    case ENETDOWN:
    case EADDRINUSE:
    case EADDRNOTAVAIL:
      return absl::StatusCode::kUnavailable;
    case EINVAL:
    case ENAMETOOLONG:
      return absl::StatusCode::kInvalidArgument;
    case ENOTDIR:
    case EISDIR:
    case ENOTEMPTY:
    case EXDEV:
    case EROFS:
      return absl::StatusCode::kFailedPrecondition;
    default:
      return absl::StatusCode::kInternal;
  }
}

absl::Status ErrnoError(int err, absl::string_view context) {
  return absl::Status(ErrnoCode(err), absl::StrCat(context, ": ", std::strerror(err)));
}

absl::Status ErrnoError(int err, std::string_view what, std::string_view path) {
  return absl::Status(ErrnoCode(err), absl::StrCat(absl::string_view(what.data(), what.size()), " ",
                                                   absl::string_view(path.data(), path.size()),
                                                   ": ", std::strerror(err)));
}

}  // namespace longhaul
