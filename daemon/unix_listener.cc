#include "daemon/unix_listener.h"

#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/errno_status.h"

namespace longhaul::daemon {

absl::StatusOr<UnixListener> ListenOnUnixSocket(const std::string& path, mode_t mode,
                                                absl::string_view what) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat(what, " path '", path, "' must be 1 to ",
                                                   sizeof(addr.sun_path) - 1, " bytes long"));
  }
  std::memcpy(addr.sun_path, path.data(), path.size());
  struct stat st;
  if (lstat(path.c_str(), &st) == 0 && S_ISSOCK(st.st_mode)) unlink(path.c_str());

  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return ErrnoError(absl::StrCat("cannot create the ", what));
  if (bind(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0) {
    absl::Status s = ErrnoError(absl::StrCat("cannot bind the ", what, " ", path));
    close(fd);
    return s;
  }
  if (chmod(path.c_str(), mode) != 0 || listen(fd, SOMAXCONN) != 0) {
    absl::Status s = ErrnoError(absl::StrCat("cannot listen on the ", what, " ", path));
    close(fd);
    return s;
  }
  const int wake = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake < 0) {
    absl::Status s = ErrnoError("cannot create an eventfd");
    close(fd);
    return s;
  }
  return UnixListener{fd, wake};
}

}  // namespace longhaul::daemon
