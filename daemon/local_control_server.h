// The control API on a Unix socket, for callers known by uid.
#ifndef LONGHAUL_DAEMON_LOCAL_CONTROL_SERVER_H_
#define LONGHAUL_DAEMON_LOCAL_CONTROL_SERVER_H_

#include <grpc/support/time.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/impl/service_type.h>
#include <sys/types.h>

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "daemon/transfer/source_access.h"

namespace longhaul::daemon {

// Serves gRPC on a Unix socket and knows who is calling.
//
// gRPC 1.51 does not tell a handler who is at the other end of a Unix
// socket: ServerContext::peer() is "unix:" (or "fd:N" for a connection
// handed over by fd) and the AuthContext of LocalServerCredentials(UDS)
// holds no uid. So this server accepts on the socket itself, reads each
// connection's SO_PEERCRED (the uid and gid of the process that connected,
// as the kernel saw them at connect(2)), and hands the connection with
// grpc::AddInsecureChannelFromFd to a gRPC server of that (uid, gid)'s own,
// built on its first connection. That server's services were made for that
// caller alone, so no call can be taken for another caller's, whatever the
// order in which connections come and go and fd numbers are reused.
//
// At most `max_callers` distinct (uid, gid) are served over the server's
// life (each costs a gRPC server and its poller thread); connections of
// further callers are closed and logged.
//
// Thread-safe. One thread accepts; gRPC runs the calls on its own.
class LocalControlServer {
 public:
  struct Options {
    std::string path;  // the socket; a stale socket there is replaced
    mode_t mode = 0660;
    size_t max_callers = 64;
  };
  // Makes the services that act for `caller` (the control API). Called on
  // the accepting thread, once per distinct caller.
  using ServiceFactory =
      std::function<std::vector<std::unique_ptr<grpc::Service>>(const Caller& caller)>;

  // Binds and listens on options.path (mode set before the first connection
  // can be accepted) and starts accepting. `shared` services (the exchange
  // API) are served to every caller; they must outlive this server.
  static absl::StatusOr<std::unique_ptr<LocalControlServer>> Start(
      Options options, ServiceFactory factory, std::vector<grpc::Service*> shared);
  ~LocalControlServer();

  // Stops accepting (connect(2) is refused from then on), then shuts every
  // caller's server down, cancelling calls still running at `deadline`.
  // Idempotent.
  void Shutdown(gpr_timespec deadline);

  LocalControlServer(const LocalControlServer&) = delete;
  LocalControlServer& operator=(const LocalControlServer&) = delete;

 private:
  struct PerCaller {
    std::vector<std::unique_ptr<grpc::Service>> services;
    std::unique_ptr<grpc::Server> server;
  };

  LocalControlServer(Options options, ServiceFactory factory, std::vector<grpc::Service*> shared,
                     int listen_fd, int wake_fd);
  void AcceptLoop();
  // Hands `fd` (accepted, non-blocking) to its caller's server, or closes it.
  void Serve(int fd);

  const Options options_;
  const ServiceFactory factory_;
  const std::vector<grpc::Service*> shared_;
  const int listen_fd_;  // closed by Shutdown
  const int wake_fd_;    // eventfd: wakes the accepting thread to stop
  std::thread accept_thread_;

  absl::Mutex mu_;
  std::map<std::pair<uid_t, gid_t>, PerCaller> callers_ ABSL_GUARDED_BY(mu_);
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace longhaul::daemon

#endif  // LONGHAUL_DAEMON_LOCAL_CONTROL_SERVER_H_
