#include "daemon/local_control_server.h"

#include <grpcpp/server_posix.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/errno_status.h"
#include "daemon/unix_listener.h"
#include "spdlog/spdlog.h"

namespace longhaul::daemon {

absl::StatusOr<std::unique_ptr<LocalControlServer>> LocalControlServer::Start(
    Options options, ServiceFactory factory, std::vector<grpc::Service*> shared) {
  auto listener = ListenOnUnixSocket(options.path, options.mode, "control socket");
  if (!listener.ok()) return listener.status();
  const int fd = listener->fd;
  const int wake = listener->wake;
  auto server = std::unique_ptr<LocalControlServer>(
      new LocalControlServer(std::move(options), std::move(factory), std::move(shared), fd, wake));
  server->accept_thread_ = std::thread([s = server.get()] { s->AcceptLoop(); });
  return server;
}

LocalControlServer::LocalControlServer(Options options, ServiceFactory factory,
                                       std::vector<grpc::Service*> shared, int listen_fd,
                                       int wake_fd)
    : options_(std::move(options)),
      factory_(std::move(factory)),
      shared_(std::move(shared)),
      listen_fd_(listen_fd),
      wake_fd_(wake_fd) {}

LocalControlServer::~LocalControlServer() {
  Shutdown(gpr_now(GPR_CLOCK_MONOTONIC));
  close(wake_fd_);
}

void LocalControlServer::Shutdown(gpr_timespec deadline) {
  {
    absl::MutexLock lock(&mu_);
    if (shut_down_) return;
    shut_down_ = true;
  }
  const uint64_t one = 1;
  if (write(wake_fd_, &one, sizeof(one)) != sizeof(one)) {
    spdlog::error("cannot wake the control socket's accepting thread: {}", std::strerror(errno));
  }
  if (accept_thread_.joinable()) accept_thread_.join();
  // New connections are refused from here on, and none is handed to a
  // server any more: the servers can go.
  close(listen_fd_);
  absl::MutexLock lock(&mu_);
  for (auto& [id, per_caller] : callers_) per_caller.server->Shutdown(deadline);
  for (auto& [id, per_caller] : callers_) per_caller.server->Wait();
}

void LocalControlServer::AcceptLoop() {
  pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
  for (;;) {
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      spdlog::critical("control socket {}: poll failed: {}; local control stops", options_.path,
                       std::strerror(errno));
      return;
    }
    if (fds[1].revents != 0) return;
    if ((fds[0].revents & POLLIN) == 0) continue;
    const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      if (errno == EAGAIN || errno == EINTR || errno == ECONNABORTED) continue;
      // Out of fds or memory: fail this connection, not the daemon.
      spdlog::error("control socket {}: accept failed: {}", options_.path, std::strerror(errno));
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        poll(nullptr, 0, 100);
      }
      continue;
    }
    Serve(fd);
  }
}

void LocalControlServer::Serve(int fd) {
  ucred cred{};
  socklen_t len = sizeof(cred);
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0 || len != sizeof(cred)) {
    spdlog::error(
        "control socket {}: cannot tell who connected (SO_PEERCRED: {}); connection closed",
        options_.path, std::strerror(errno));
    close(fd);
    return;
  }
  const Caller caller = Caller::LocalUser(cred.uid, cred.gid);
  absl::MutexLock lock(&mu_);
  if (shut_down_) {
    close(fd);
    return;
  }
  auto it = callers_.find({cred.uid, cred.gid});
  if (it == callers_.end()) {
    if (callers_.size() >= options_.max_callers) {
      spdlog::error(
          "control socket {}: connection from {} (pid {}) closed: already serving {} distinct "
          "callers (uid and gid), the most this daemon serves until it restarts",
          options_.path, caller.ToString(), cred.pid, callers_.size());
      close(fd);
      return;
    }
    PerCaller per_caller;
    per_caller.services = factory_(caller);
    grpc::ServerBuilder builder;
    for (const auto& service : per_caller.services) builder.RegisterService(service.get());
    for (grpc::Service* service : shared_) builder.RegisterService(service);
    per_caller.server = builder.BuildAndStart();
    if (!per_caller.server) {
      spdlog::error("control socket {}: cannot start a server for {}; connection closed",
                    options_.path, caller.ToString());
      close(fd);
      return;
    }
    spdlog::debug("control socket {}: first call from {}", options_.path, caller.ToString());
    it = callers_.emplace(std::make_pair(cred.uid, cred.gid), std::move(per_caller)).first;
  }
  grpc::AddInsecureChannelFromFd(it->second.server.get(), fd);
}

}  // namespace longhaul::daemon
