#ifndef LONGHAUL_DAEMON_CONTROL_SERVICE_H_
#define LONGHAUL_DAEMON_CONTROL_SERVICE_H_

#include <string>
#include <vector>

#include "daemon/config.h"
#include "daemon/peer/rate_limiter.h"
#include "daemon/transfer/source_access.h"
#include "daemon/transfer/transfer_manager.h"
#include "longhaul/v1/control.grpc.pb.h"

namespace longhaul::daemon {

// The gRPC face of the TransferManager (proto/longhaul/v1/control.proto).
// Converts absl::Status to gRPC status codes with the same messages.
//
// Each call is made by a Caller. On the Unix socket the service is built for
// one local user (LocalControlServer gives each its own) and every call is
// that user's: Submit sends only what that user could read. On the TCP
// control address every call must carry "authorization: Bearer <token>"
// with one of the configured tokens, and gets what that token's role
// allows: a viewer reads (Get, List, Watch, Peers, Verify, GetLimits), an
// operator also changes things (Submit, Cancel, Pause, Resume, SetLimit).
// Every refused call is logged with its caller (uid, or address and role).
//
// Thread-safe: gRPC calls it from its own thread pool.
class ControlService final : public v1::Control::Service {
 public:
  struct RoleToken {
    ControlRole role;
    std::string token;
  };

  // Every call is `caller`'s.
  ControlService(TransferManager& manager, Caller caller)
      : manager_(manager), local_caller_(std::move(caller)), tcp_(false) {}
  // Every call must carry one of `tokens` (the TCP control address).
  ControlService(TransferManager& manager, std::vector<RoleToken> tokens)
      : manager_(manager), tokens_(std::move(tokens)), tcp_(true) {}

  // Serves SetLimit/GetLimits on `limiter` (without one they fail with
  // FailedPrecondition). `peer_sites` are the sites a peer cap may name. Call
  // before serving; `limiter` must outlive the service.
  void SetRateLimiter(longhaul::peer::RateLimiter* limiter, std::vector<std::string> peer_sites) {
    rate_limiter_ = limiter;
    peer_sites_ = std::move(peer_sites);
  }

  grpc::Status Submit(grpc::ServerContext*, const v1::SubmitRequest*, v1::SubmitResponse*) override;
  grpc::Status Get(grpc::ServerContext*, const v1::GetRequest*, v1::GetResponse*) override;
  grpc::Status List(grpc::ServerContext*, const v1::ListRequest*, v1::ListResponse*) override;
  grpc::Status Watch(grpc::ServerContext*, const v1::WatchRequest*,
                     grpc::ServerWriter<v1::TransferStatus>*) override;
  grpc::Status Cancel(grpc::ServerContext*, const v1::ControlRequest*, v1::ControlResponse*) override;
  grpc::Status Pause(grpc::ServerContext*, const v1::ControlRequest*, v1::ControlResponse*) override;
  grpc::Status Resume(grpc::ServerContext*, const v1::ControlRequest*, v1::ControlResponse*) override;
  grpc::Status Verify(grpc::ServerContext*, const v1::VerifyRequestC*, v1::VerifyResponse*) override;
  grpc::Status Peers(grpc::ServerContext*, const v1::PeersRequest*, v1::PeersResponse*) override;
  grpc::Status SetLimit(grpc::ServerContext*, const v1::SetLimitRequest*,
                        v1::SetLimitResponse*) override;
  grpc::Status GetLimits(grpc::ServerContext*, const v1::GetLimitsRequest*,
                         v1::GetLimitsResponse*) override;

 private:
  // The caller of this call when it may call `method`, which needs `role`.
  // Otherwise UNAUTHENTICATED (TCP without a known token) or
  // PERMISSION_DENIED (a role short of `role`), logged with the caller.
  absl::StatusOr<Caller> Authorize(const grpc::ServerContext* context, const char* method,
                                   ControlRole role) const;

  TransferManager& manager_;
  const Caller local_caller_;
  const std::vector<RoleToken> tokens_;
  const bool tcp_;
  longhaul::peer::RateLimiter* rate_limiter_ = nullptr;
  std::vector<std::string> peer_sites_;
};

grpc::Status ToGrpcStatus(const absl::Status& status);

}  // namespace longhaul::daemon

#endif  // LONGHAUL_DAEMON_CONTROL_SERVICE_H_
