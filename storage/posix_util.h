// Internal helpers for the POSIX adapters of storage/. Not part of the
// module's interface.
#ifndef LONGHAUL_STORAGE_POSIX_UTIL_H_
#define LONGHAUL_STORAGE_POSIX_UTIL_H_

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace longhaul::storage::internal {

// Best-effort path of an open fd (readlink of /proc/self/fd/N), for messages.
std::string FdPath(int fd);

// Owns a file descriptor; closes it on destruction.
class ScopedFd {
 public:
  ScopedFd() = default;
  explicit ScopedFd(int fd) : fd_(fd) {}
  ScopedFd(ScopedFd&& o) noexcept : fd_(o.release()) {}
  ScopedFd& operator=(ScopedFd&& o) noexcept;
  ScopedFd(const ScopedFd&) = delete;
  ScopedFd& operator=(const ScopedFd&) = delete;
  ~ScopedFd() { reset(); }

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release() {
    int fd = fd_;
    fd_ = -1;
    return fd;
  }
  void reset(int fd = -1);

 private:
  int fd_ = -1;
};

// Debian's abseil keeps its own absl::string_view (ABSL_OPTION_USE_STD_STRING_VIEW
// is 0), which does not convert from std::string_view implicitly.
inline absl::string_view Av(std::string_view s) { return absl::string_view(s.data(), s.size()); }
inline std::string_view Sv(absl::string_view s) { return std::string_view(s.data(), s.size()); }

// Joins a directory and a relative path for messages ("" + x = x).
std::string JoinPath(std::string_view dir, std::string_view rel);

// fsync(2) of `fd`; `desc` names it in the error.
absl::Status FsyncFd(int fd, std::string_view desc);

// The entries of the directory `dir_fd` (not "." and ".."), unsorted. The
// fd stays the caller's. `desc` names the directory in errors.
absl::StatusOr<std::vector<std::string>> ListDirAt(int dir_fd, std::string_view desc);

}  // namespace longhaul::storage::internal

#endif  // LONGHAUL_STORAGE_POSIX_UTIL_H_
