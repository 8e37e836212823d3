#ifndef LONGHAUL_DAEMON_CONTROL_SERVICE_H_
#define LONGHAUL_DAEMON_CONTROL_SERVICE_H_

#include <string>
#include <vector>

#include "daemon/peer/rate_limiter.h"
#include "daemon/transfer_manager.h"
#include "longhaul/v1/control.grpc.pb.h"

namespace longhaul::daemon {

// The gRPC face of the TransferManager (proto/longhaul/v1/control.proto).
// Converts absl::Status to gRPC status codes with the same messages.
// Thread-safe: gRPC calls it from its own thread pool.
class ControlService final : public v1::Control::Service {
 public:
  explicit ControlService(TransferManager& manager) : manager_(manager) {}

  // Serves SetLimit/GetLimits on `limiter` (without one they fail with
  // FailedPrecondition). `peer_sites` are the sites a peer cap may name. Call
  // before serving; `limiter` must outlive the service.
  void SetRateLimiter(peer::RateLimiter* limiter, std::vector<std::string> peer_sites) {
    rate_limiter_ = limiter;
    peer_sites_ = std::move(peer_sites);
  }

  // Every call must then carry "authorization: Bearer <token>" (the TCP
  // control address); calls without it fail with UNAUTHENTICATED and are
  // logged. Call before serving.
  void RequireToken(std::string token) { token_ = std::move(token); }

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
  // OK, or UNAUTHENTICATED (logged with the caller's address) when a token is
  // required and the call does not carry it.
  grpc::Status Authorize(const grpc::ServerContext* context, const char* method) const;

  TransferManager& manager_;
  std::string token_;
  peer::RateLimiter* rate_limiter_ = nullptr;
  std::vector<std::string> peer_sites_;
};

grpc::Status ToGrpcStatus(const absl::Status& status);

}  // namespace longhaul::daemon

#endif  // LONGHAUL_DAEMON_CONTROL_SERVICE_H_
