#ifndef LONGHAUL_DAEMON_UNIX_LISTENER_H_
#define LONGHAUL_DAEMON_UNIX_LISTENER_H_

// The daemon's local Unix sockets (the control socket and the exchange
// segment socket) are made the same way: a stale socket at the path is
// replaced, and the mode is set before listen(2), so nobody connects under
// the mode the socket was created with.

#include <sys/types.h>

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace longhaul::daemon {

// A non-blocking, close-on-exec listening socket at `path` with `mode`, and
// an eventfd to wake the loop that accepts on it; the caller owns both.
// `what` names the socket in errors ("control socket").
struct UnixListener {
  int fd = -1;
  int wake = -1;
};
absl::StatusOr<UnixListener> ListenOnUnixSocket(const std::string& path, mode_t mode,
                                                absl::string_view what);

}  // namespace longhaul::daemon

#endif  // LONGHAUL_DAEMON_UNIX_LISTENER_H_
