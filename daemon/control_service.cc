#include "daemon/control_service.h"

#include <openssl/crypto.h>

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/fmt_absl.h"
#include "google/protobuf/util/message_differencer.h"
#include "spdlog/spdlog.h"

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

absl::StatusOr<Caller> ControlService::Authorize(const grpc::ServerContext* context,
                                                 const char* method, ControlRole role) const {
  if (!tcp_) return local_caller_;
  const auto& metadata = context->client_metadata();
  auto it = metadata.find("authorization");
  const char* problem = "no bearer token";
  if (it != metadata.end()) {
    const grpc::string_ref& got = it->second;
    // Constant time, and every token compared: the answer must not tell how
    // much of a guess matched, nor which token it was close to.
    const RoleToken* match = nullptr;
    for (const RoleToken& t : tokens_) {
      const std::string expected = "Bearer " + t.token;
      const bool equal = got.size() == expected.size() &&
                         CRYPTO_memcmp(got.data(), expected.data(), expected.size()) == 0;
      if (equal) match = &t;
    }
    if (match != nullptr) {
      Caller caller = Caller::Token(match->role, context->peer());
      if (match->role == ControlRole::kOperator || role == ControlRole::kViewer) return caller;
      const std::string why =
          absl::StrCat("the ", ControlRoleName(match->role), " role may not ", method,
                       "; it needs the ", ControlRoleName(role), " token");
      spdlog::warn("control call {} from {} refused: {}", method, caller.ToString(), why);
      return absl::PermissionDeniedError(absl::StrCat("refused: ", why));
    }
    problem = "a wrong bearer token";
  }
  spdlog::warn("control call {} from {} refused: {} (TCP control needs \"authorization: Bearer <token>\")",
               method, context->peer(), problem);
  return absl::UnauthenticatedError(
      absl::StrCat("refused: ", problem,
                   "; the TCP control address needs a token of the daemon's "
                   "control_tokens (longhaul --token-file FILE or $LONGHAUL_TOKEN_FILE)"));
}

grpc::Status ControlService::Submit(grpc::ServerContext* context, const v1::SubmitRequest* request,
                                    v1::SubmitResponse* response) {
  auto caller = Authorize(context, "Submit", ControlRole::kOperator);
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  auto submitted = manager_.Submit(request->request_id(), request->spec(), *caller);
  if (absl::IsPermissionDenied(submitted.status())) {
    spdlog::warn("control call Submit from {} refused: {}", caller->ToString(),
                 submitted.status().message());
  }
  return Reply(submitted, response);
}

grpc::Status ControlService::Get(grpc::ServerContext* context, const v1::GetRequest* request,
                                 v1::GetResponse* response) {
  if (auto caller = Authorize(context, "Get", ControlRole::kViewer); !caller.ok()) {
    return ToGrpcStatus(caller.status());
  }
  return Reply(manager_.Get(request->id()), response);
}

grpc::Status ControlService::List(grpc::ServerContext* context, const v1::ListRequest* request,
                                  v1::ListResponse* response) {
  if (auto caller = Authorize(context, "List", ControlRole::kViewer); !caller.ok()) {
    return ToGrpcStatus(caller.status());
  }
  for (v1::TransferStatus& s : manager_.List(request->all())) *response->add_transfers() = std::move(s);
  return grpc::Status::OK;
}

grpc::Status ControlService::Watch(grpc::ServerContext* context, const v1::WatchRequest* request,
                                   grpc::ServerWriter<v1::TransferStatus>* writer) {
  if (auto caller = Authorize(context, "Watch", ControlRole::kViewer); !caller.ok()) {
    return ToGrpcStatus(caller.status());
  }
  // A new state, error or stream count goes out as soon as it happens;
  // progress at most every kPoll of the manager's clock (it moves with
  // every piece acknowledged), and the elapsed time every second. The
  // predicate is asked at least every 50 ms of real time, so it notices a
  // cancelled call whatever the clock does.
  constexpr absl::Duration kPoll = absl::Milliseconds(200);
  v1::TransferStatus last;
  bool first = true;
  auto moved = [&](const v1::TransferStatus& s) {
    return first || s.state() != last.state() || s.error() != last.error() ||
           s.active_streams() != last.active_streams();
  };
  while (!context->IsCancelled()) {
    auto status = manager_.AwaitStatus(
        request->id(),
        [&](const v1::TransferStatus& s) { return moved(s) || context->IsCancelled(); }, kPoll);
    if (!status.ok()) return ToGrpcStatus(status.status());
    if (moved(*status) || status->bytes_done() != last.bytes_done() ||
        status->seconds() - last.seconds() >= 1.0) {
      if (!writer->Write(*status)) return grpc::Status::OK;
      last = *status;
      first = false;
    }
    if (IsEndState(status->state())) return grpc::Status::OK;
  }
  return grpc::Status::OK;
}

grpc::Status ControlService::Cancel(grpc::ServerContext* context, const v1::ControlRequest* request,
                                    v1::ControlResponse* response) {
  if (auto caller = Authorize(context, "Cancel", ControlRole::kOperator); !caller.ok()) {
    return ToGrpcStatus(caller.status());
  }
  return Reply(manager_.Cancel(request->id()), response);
}

grpc::Status ControlService::Pause(grpc::ServerContext* context, const v1::ControlRequest* request,
                                   v1::ControlResponse* response) {
  if (auto caller = Authorize(context, "Pause", ControlRole::kOperator); !caller.ok()) {
    return ToGrpcStatus(caller.status());
  }
  return Reply(manager_.Pause(request->id()), response);
}

grpc::Status ControlService::Resume(grpc::ServerContext* context, const v1::ControlRequest* request,
                                    v1::ControlResponse* response) {
  if (auto caller = Authorize(context, "Resume", ControlRole::kOperator); !caller.ok()) {
    return ToGrpcStatus(caller.status());
  }
  return Reply(manager_.Resume(request->id()), response);
}

grpc::Status ControlService::Verify(grpc::ServerContext* context, const v1::VerifyRequestC* request,
                                    v1::VerifyResponse* response) {
  if (auto caller = Authorize(context, "Verify", ControlRole::kViewer); !caller.ok()) {
    return ToGrpcStatus(caller.status());
  }
  auto result = manager_.Verify(request->id());
  if (!result.ok()) return ToGrpcStatus(result.status());
  *response = std::move(*result);
  return grpc::Status::OK;
}

grpc::Status ControlService::Peers(grpc::ServerContext* context, const v1::PeersRequest* request,
                                   v1::PeersResponse* response) {
  if (auto caller = Authorize(context, "Peers", ControlRole::kViewer); !caller.ok()) {
    return ToGrpcStatus(caller.status());
  }
  *response = manager_.Peers(request->probe());
  return grpc::Status::OK;
}

grpc::Status ControlService::SetLimit(grpc::ServerContext* context, const v1::SetLimitRequest* request,
                                      v1::SetLimitResponse* response) {
  auto caller = Authorize(context, "SetLimit", ControlRole::kOperator);
  if (!caller.ok()) return ToGrpcStatus(caller.status());
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
      spdlog::info("rate cap to peer {} set to {} by {}", limit.peer(), shown, caller->ToString());
      break;
    case v1::RateLimit::kPriority:
      if (limit.priority() == v1::PRIORITY_UNSPECIFIED || !v1::PriorityClass_IsValid(limit.priority())) {
        return ToGrpcStatus(absl::InvalidArgumentError(
            "a class cap needs a class: exchange, checkpoint or background"));
      }
      rate_limiter_->SetClassLimit(limit.priority(), rate);
      spdlog::info("rate cap on class {} set to {} by {}",
                   peer::PriorityClassName(limit.priority()), shown, caller->ToString());
      break;
    default:
      return ToGrpcStatus(absl::InvalidArgumentError("a cap names a peer site or a class"));
  }
  AddLimits(*rate_limiter_, response);
  return grpc::Status::OK;
}

grpc::Status ControlService::GetLimits(grpc::ServerContext* context, const v1::GetLimitsRequest*,
                                       v1::GetLimitsResponse* response) {
  if (auto caller = Authorize(context, "GetLimits", ControlRole::kViewer); !caller.ok()) {
    return ToGrpcStatus(caller.status());
  }
  if (rate_limiter_ != nullptr) AddLimits(*rate_limiter_, response);
  return grpc::Status::OK;
}

}  // namespace longhaul::daemon
