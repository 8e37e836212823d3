#include "daemon/control_service.h"

#include <algorithm>
#include <limits>
#include <thread>

#include <openssl/crypto.h>

#include "absl/strings/str_cat.h"
#include "common/fmt_absl.h"
#include "spdlog/spdlog.h"

#include "google/protobuf/util/message_differencer.h"

namespace longhaul::daemon {

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  // absl and gRPC share the canonical code numbering.
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

namespace {

template <typename Response>
void AddLimits(const peer::RateLimiter& limiter, Response* response) {
  for (const peer::RateLimiter::Limit& l : limiter.Limits()) {
    v1::RateLimit* out = response->add_limits();
    if (l.peer.empty()) {
      out->set_priority(l.priority);
    } else {
      out->set_peer(l.peer);
    }
    out->set_bits_per_second(static_cast<uint64_t>(l.rate.ToBitsPerSecond()));
  }
}

template <typename Response>
grpc::Status Reply(const absl::StatusOr<v1::TransferStatus>& status, Response* response) {
  if (!status.ok()) return ToGrpcStatus(status.status());
  *response->mutable_status() = *status;
  return grpc::Status::OK;
}

}  // namespace

grpc::Status ControlService::Authorize(const grpc::ServerContext* context, const char* method) const {
  if (token_.empty()) return grpc::Status::OK;
  const std::string expected = "Bearer " + token_;
  const auto& metadata = context->client_metadata();
  auto it = metadata.find("authorization");
  const char* problem = "no bearer token";
  if (it != metadata.end()) {
    const grpc::string_ref& got = it->second;
    // Constant time: the comparison must not tell how much of a guess matched.
    if (got.size() == expected.size() && CRYPTO_memcmp(got.data(), expected.data(), expected.size()) == 0) {
      return grpc::Status::OK;
    }
    problem = "a wrong bearer token";
  }
  spdlog::warn("control call {} from {} refused: {} (TCP control needs \"authorization: Bearer <token>\")",
               method, context->peer(), problem);
  return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                      absl::StrCat("refused: ", problem, "; the TCP control address needs the token in the "
                                   "daemon's control_token_file (longhaul --token-file FILE or $LONGHAUL_TOKEN_FILE)"));
}

grpc::Status ControlService::Submit(grpc::ServerContext* context, const v1::SubmitRequest* request,
                                    v1::SubmitResponse* response) {
  if (grpc::Status denied = Authorize(context, "Submit"); !denied.ok()) return denied;
  return Reply(manager_.Submit(request->request_id(), request->spec()), response);
}

grpc::Status ControlService::Get(grpc::ServerContext* context, const v1::GetRequest* request,
                                 v1::GetResponse* response) {
  if (grpc::Status denied = Authorize(context, "Get"); !denied.ok()) return denied;
  return Reply(manager_.Get(request->id()), response);
}

grpc::Status ControlService::List(grpc::ServerContext* context, const v1::ListRequest* request,
                                  v1::ListResponse* response) {
  if (grpc::Status denied = Authorize(context, "List"); !denied.ok()) return denied;
  for (v1::TransferStatus& s : manager_.List(request->all())) *response->add_transfers() = std::move(s);
  return grpc::Status::OK;
}

grpc::Status ControlService::Watch(grpc::ServerContext* context, const v1::WatchRequest* request,
                                   grpc::ServerWriter<v1::TransferStatus>* writer) {
  if (grpc::Status denied = Authorize(context, "Watch"); !denied.ok()) return denied;
  // Polls the manager: progress changes at chunk granularity, and a poll at
  // this rate costs nothing next to a chunk.
  constexpr auto kPoll = std::chrono::milliseconds(200);
  v1::TransferStatus last;
  bool first = true;
  while (!context->IsCancelled()) {
    auto status = manager_.Get(request->id());
    if (!status.ok()) return ToGrpcStatus(status.status());
    bool changed = first || status->state() != last.state() ||
                   status->bytes_done() != last.bytes_done() || status->error() != last.error() ||
                   status->active_streams() != last.active_streams();
    if (changed || status->seconds() - last.seconds() >= 1.0) {
      if (!writer->Write(*status)) return grpc::Status::OK;
      last = *status;
      first = false;
    }
    if (IsEndState(status->state())) return grpc::Status::OK;
    std::this_thread::sleep_for(kPoll);
  }
  return grpc::Status::OK;
}

grpc::Status ControlService::Cancel(grpc::ServerContext* context, const v1::ControlRequest* request,
                                    v1::ControlResponse* response) {
  if (grpc::Status denied = Authorize(context, "Cancel"); !denied.ok()) return denied;
  return Reply(manager_.Cancel(request->id()), response);
}

grpc::Status ControlService::Pause(grpc::ServerContext* context, const v1::ControlRequest* request,
                                   v1::ControlResponse* response) {
  if (grpc::Status denied = Authorize(context, "Pause"); !denied.ok()) return denied;
  return Reply(manager_.Pause(request->id()), response);
}

grpc::Status ControlService::Resume(grpc::ServerContext* context, const v1::ControlRequest* request,
                                    v1::ControlResponse* response) {
  if (grpc::Status denied = Authorize(context, "Resume"); !denied.ok()) return denied;
  return Reply(manager_.Resume(request->id()), response);
}

grpc::Status ControlService::Verify(grpc::ServerContext* context, const v1::VerifyRequestC* request,
                                    v1::VerifyResponse* response) {
  if (grpc::Status denied = Authorize(context, "Verify"); !denied.ok()) return denied;
  auto result = manager_.Verify(request->id());
  if (!result.ok()) return ToGrpcStatus(result.status());
  *response = std::move(*result);
  return grpc::Status::OK;
}

grpc::Status ControlService::Peers(grpc::ServerContext* context, const v1::PeersRequest* request,
                                   v1::PeersResponse* response) {
  if (grpc::Status denied = Authorize(context, "Peers"); !denied.ok()) return denied;
  *response = manager_.Peers(request->probe());
  return grpc::Status::OK;
}

grpc::Status ControlService::SetLimit(grpc::ServerContext* context, const v1::SetLimitRequest* request,
                                      v1::SetLimitResponse* response) {
  if (grpc::Status denied = Authorize(context, "SetLimit"); !denied.ok()) return denied;
  if (rate_limiter_ == nullptr) {
    return ToGrpcStatus(absl::FailedPreconditionError("this daemon has no rate limiter"));
  }
  const v1::RateLimit& limit = request->limit();
  const uint64_t bps = std::min<uint64_t>(limit.bits_per_second(),
                                          std::numeric_limits<int64_t>::max());
  const Bandwidth rate = Bandwidth::BitsPerSecond(static_cast<int64_t>(bps));
  const std::string shown = bps == 0 ? "off" : rate.ToString();
  switch (limit.scope_case()) {
    case v1::RateLimit::kPeer:
      if (std::find(peer_sites_.begin(), peer_sites_.end(), limit.peer()) == peer_sites_.end()) {
        return ToGrpcStatus(absl::NotFoundError(
            absl::StrCat("'", limit.peer(), "' is not a configured peer site")));
      }
      rate_limiter_->SetPeerLimit(limit.peer(), rate);
      spdlog::info("rate cap to peer {} set to {} by an operator", limit.peer(), shown);
      break;
    case v1::RateLimit::kPriority:
      if (limit.priority() == v1::PRIORITY_UNSPECIFIED || !v1::PriorityClass_IsValid(limit.priority())) {
        return ToGrpcStatus(absl::InvalidArgumentError(
            "a class cap needs a class: exchange, checkpoint or background"));
      }
      rate_limiter_->SetClassLimit(limit.priority(), rate);
      spdlog::info("rate cap on class {} set to {} by an operator",
                   peer::PriorityClassName(limit.priority()), shown);
      break;
    default:
      return ToGrpcStatus(absl::InvalidArgumentError("a cap names a peer site or a class"));
  }
  AddLimits(*rate_limiter_, response);
  return grpc::Status::OK;
}

grpc::Status ControlService::GetLimits(grpc::ServerContext* context, const v1::GetLimitsRequest*,
                                       v1::GetLimitsResponse* response) {
  if (grpc::Status denied = Authorize(context, "GetLimits"); !denied.ok()) return denied;
  if (rate_limiter_ != nullptr) AddLimits(*rate_limiter_, response);
  return grpc::Status::OK;
}

}  // namespace longhaul::daemon
