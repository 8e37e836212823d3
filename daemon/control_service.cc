#include "daemon/control_service.h"

#include <thread>

#include "google/protobuf/util/message_differencer.h"

namespace longhaul::daemon {

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  // absl and gRPC share the canonical code numbering.
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

namespace {

template <typename Response>
grpc::Status Reply(const absl::StatusOr<v1::TransferStatus>& status, Response* response) {
  if (!status.ok()) return ToGrpcStatus(status.status());
  *response->mutable_status() = *status;
  return grpc::Status::OK;
}

}  // namespace

grpc::Status ControlService::Submit(grpc::ServerContext*, const v1::SubmitRequest* request,
                                    v1::SubmitResponse* response) {
  return Reply(manager_.Submit(request->request_id(), request->spec()), response);
}

grpc::Status ControlService::Get(grpc::ServerContext*, const v1::GetRequest* request,
                                 v1::GetResponse* response) {
  return Reply(manager_.Get(request->id()), response);
}

grpc::Status ControlService::List(grpc::ServerContext*, const v1::ListRequest* request,
                                  v1::ListResponse* response) {
  for (v1::TransferStatus& s : manager_.List(request->all())) *response->add_transfers() = std::move(s);
  return grpc::Status::OK;
}

grpc::Status ControlService::Watch(grpc::ServerContext* context, const v1::WatchRequest* request,
                                   grpc::ServerWriter<v1::TransferStatus>* writer) {
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

grpc::Status ControlService::Cancel(grpc::ServerContext*, const v1::ControlRequest* request,
                                    v1::ControlResponse* response) {
  return Reply(manager_.Cancel(request->id()), response);
}

grpc::Status ControlService::Pause(grpc::ServerContext*, const v1::ControlRequest* request,
                                   v1::ControlResponse* response) {
  return Reply(manager_.Pause(request->id()), response);
}

grpc::Status ControlService::Resume(grpc::ServerContext*, const v1::ControlRequest* request,
                                    v1::ControlResponse* response) {
  return Reply(manager_.Resume(request->id()), response);
}

grpc::Status ControlService::Verify(grpc::ServerContext*, const v1::VerifyRequestC* request,
                                    v1::VerifyResponse* response) {
  auto result = manager_.Verify(request->id());
  if (!result.ok()) return ToGrpcStatus(result.status());
  *response = std::move(*result);
  return grpc::Status::OK;
}

grpc::Status ControlService::Peers(grpc::ServerContext*, const v1::PeersRequest* request,
                                   v1::PeersResponse* response) {
  *response = manager_.Peers(request->probe());
  return grpc::Status::OK;
}

}  // namespace longhaul::daemon
