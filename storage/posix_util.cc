#include "storage/posix_util.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/errno_status.h"

namespace longhaul::storage::internal {

std::string FdPath(int fd) {
  char buf[4096];
  const std::string link = absl::StrCat("/proc/self/fd/", fd);
  ssize_t n = readlink(link.c_str(), buf, sizeof(buf) - 1);
  if (n <= 0) return absl::StrCat("<fd ", fd, ">");
  return std::string(buf, static_cast<size_t>(n));
}

ScopedFd& ScopedFd::operator=(ScopedFd&& o) noexcept {
  if (this != &o) reset(o.release());
  return *this;
}

void ScopedFd::reset(int fd) {
  if (fd_ >= 0) close(fd_);
  fd_ = fd;
}

std::string JoinPath(std::string_view dir, std::string_view rel) {
  if (dir.empty()) return std::string(rel);
  if (rel.empty()) return std::string(dir);
  if (dir.back() == '/') return absl::StrCat(Av(dir), Av(rel));
  return absl::StrCat(Av(dir), "/", Av(rel));
}

absl::Status FsyncFd(int fd, std::string_view desc) {
  if (fsync(fd) != 0) return ErrnoError(errno, "cannot fsync", desc);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::string>> ListDirAt(int dir_fd, std::string_view desc) {
  int fd = fcntl(dir_fd, F_DUPFD_CLOEXEC, 0);  // fdopendir takes ownership
  if (fd < 0) return ErrnoError(errno, "cannot list directory", desc);
  DIR* d = fdopendir(fd);
  if (d == nullptr) {
    const int err = errno;
    close(fd);
    return ErrnoError(err, "cannot list directory", desc);
  }
  rewinddir(d);  // the dup shares the offset of an fd that may have been read
  std::vector<std::string> names;
  // readdir answers NULL both at the end and on an error; only errno tells
  // them apart. A listing cut short by an error is not the directory's
  // contents: a caller removing it would find it "not empty", one copying it
  // would miss files.
  while (true) {
    errno = 0;
    struct dirent* e = readdir(d);
    if (e == nullptr) break;
    std::string_view n = e->d_name;
    if (n != "." && n != "..") names.emplace_back(n);
  }
  const int err = errno;
  closedir(d);
  // ENOENT: the directory was removed while open; it has no entries.
  if (err != 0 && err != ENOENT) return ErrnoError(err, "cannot list directory", desc);
  return names;
}

}  // namespace longhaul::storage::internal
