#ifndef LONGHAUL_COMMON_FD_PASSING_H_
#define LONGHAUL_COMMON_FD_PASSING_H_

// Passing a file descriptor over a Unix socket (SCM_RIGHTS): how exchange
// clients lend their sealed memfds to the daemon.

#include <sys/socket.h>
#include <sys/types.h>
#include <sys/uio.h>

#include <cstring>

namespace longhaul {

// Sends the one byte `tag` on `socket` with `fd` attached (none if fd < 0).
// Returns sendmsg's result: 1 when sent, -1 with errno set otherwise.
// Only syscalls, so a forked child may call it too.
inline ssize_t SendByteWithFd(int socket, char tag, int fd, int flags) {
  iovec iov{&tag, 1};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  if (fd >= 0) {
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(c), &fd, sizeof(int));
  }
  return sendmsg(socket, &msg, flags);
}

}  // namespace longhaul

#endif  // LONGHAUL_COMMON_FD_PASSING_H_
