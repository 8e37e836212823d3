#include "longhaul/client.h"

#include <grpcpp/grpcpp.h>

#include <filesystem>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "client/deadline.h"
#include "longhaul/v1/control.grpc.pb.h"

namespace longhaul {
namespace {

absl::Status FromGrpc(const grpc::Status& status, absl::string_view address) {
  if (status.ok()) return absl::OkStatus();
  if (status.error_code() == grpc::StatusCode::UNAVAILABLE &&
      status.error_message().find("connect") != std::string::npos) {
    return absl::UnavailableError(
        absl::StrCat("cannot reach longhauld at ", address, ": ", status.error_message()));
  }
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
}

}  // namespace

absl::StatusOr<Destination> ParseDestination(absl::string_view text) {
  size_t colon = text.find(':');
  if (colon == absl::string_view::npos || colon == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("destination '", text, "' is not SITE:/EXPORT/PATH"));
  }
  Destination d;
  d.site = std::string(text.substr(0, colon));
  absl::string_view rest = text.substr(colon + 1);
  if (rest.empty() || rest[0] != '/') {
    return absl::InvalidArgumentError(
        absl::StrCat("destination '", text, "' must name an export: SITE:/EXPORT/PATH"));
  }
  rest.remove_prefix(1);
  size_t slash = rest.find('/');
  d.export_name = std::string(rest.substr(0, slash));
  // The path goes to the destination daemon as typed (less trailing
  // slashes): it alone decides what is inside its export, and refuses ".."
  // and absolute paths with a message that names them.
  if (slash != absl::string_view::npos) d.path = std::string(rest.substr(slash + 1));
  while (!d.path.empty() && d.path.back() == '/') d.path.pop_back();
  if (d.export_name.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("destination '", text, "' has no export name"));
  }
  return d;
}

bool IsRemoteLocation(absl::string_view text) {
  const size_t colon = text.find(':');
  const size_t slash = text.find('/');
  return colon != absl::string_view::npos && colon > 0 && colon + 1 == slash;
}

bool IsEndState(v1::TransferState state) {
  return state == v1::COMPLETED || state == v1::FAILED || state == v1::CANCELLED;
}

struct Client::Impl {
  std::string address;
  std::string token;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::Control::Stub> stub;

  // Every call carries the token, when there is one. (Call credentials
  // would refuse a plaintext channel, so it is plain metadata.)
  void Authorize(grpc::ClientContext& context) const {
    if (!token.empty()) context.AddMetadata("authorization", "Bearer " + token);
  }

  template <typename Request, typename Response, typename Method>
  absl::StatusOr<Response> Unary(Method method, const Request& request) {
    grpc::ClientContext context;
    Authorize(context);
    Response response;
    grpc::Status status = (stub.get()->*method)(&context, request, &response);
    if (absl::Status s = FromGrpc(status, address); !s.ok()) return s;
    return response;
  }
};

Client::Client(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Client::~Client() = default;

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(const std::string& address,
                                                        const Options& options) {
  auto impl = std::make_unique<Impl>();
  impl->address = address;
  impl->token = options.token;
  // A daemon that restarts is redialed within a second of coming back, not
  // after gRPC's default backoff of up to two minutes: a caller waiting on
  // a transfer (Watch, Wait) sees it again as soon as it answers.
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  impl->channel = grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
  if (!impl->channel->WaitForConnected(client_internal::GrpcDeadlineIn(options.timeout))) {
    return absl::UnavailableError(absl::StrCat(
        "cannot reach longhauld at ", address, " (is it running? check --daemon or $LONGHAUL_DAEMON)"));
  }
  impl->stub = v1::Control::NewStub(impl->channel);
  return std::unique_ptr<Client>(new Client(std::move(impl)));
}

absl::StatusOr<v1::TransferStatus> Client::Submit(const v1::TransferSpec& spec,
                                                  const std::string& request_id) {
  v1::SubmitRequest request;
  request.set_request_id(request_id);
  *request.mutable_spec() = spec;
  // The daemon cannot know this process's working directory: local sources
  // go as absolute, normalized paths without trailing slashes, as the CLI
  // sends them.
  for (std::string& source : *request.mutable_spec()->mutable_sources()) {
    if (source.empty()) continue;  // the daemon names what is wrong with it
    std::error_code ec;
    std::filesystem::path absolute = std::filesystem::absolute(source, ec);
    if (ec) {
      return absl::InvalidArgumentError(
          absl::StrCat("cannot resolve source ", source, ": ", ec.message()));
    }
    source = absolute.lexically_normal().string();
    while (source.size() > 1 && source.back() == '/') source.pop_back();
  }
  auto r = impl_->Unary<v1::SubmitRequest, v1::SubmitResponse>(&v1::Control::Stub::Submit, request);
  if (!r.ok()) return r.status();
  return r->status();
}

absl::StatusOr<v1::TransferStatus> Client::Get(const std::string& id) {
  v1::GetRequest request;
  request.set_id(id);
  auto r = impl_->Unary<v1::GetRequest, v1::GetResponse>(&v1::Control::Stub::Get, request);
  if (!r.ok()) return r.status();
  return r->status();
}

absl::StatusOr<std::vector<v1::TransferStatus>> Client::List(bool all) {
  v1::ListRequest request;
  request.set_all(all);
  auto r = impl_->Unary<v1::ListRequest, v1::ListResponse>(&v1::Control::Stub::List, request);
  if (!r.ok()) return r.status();
  return std::vector<v1::TransferStatus>(r->transfers().begin(), r->transfers().end());
}

#define LONGHAUL_CONTROL_CALL(Name)                                                              \
  absl::StatusOr<v1::TransferStatus> Client::Name(const std::string& id) {                      \
    v1::ControlRequest request;                                                                  \
    request.set_id(id);                                                                          \
    auto r = impl_->Unary<v1::ControlRequest, v1::ControlResponse>(&v1::Control::Stub::Name, \
                                                                   request);                     \
    if (!r.ok()) return r.status();                                                              \
    return r->status();                                                                          \
  }
LONGHAUL_CONTROL_CALL(Cancel)
LONGHAUL_CONTROL_CALL(Pause)
LONGHAUL_CONTROL_CALL(Resume)
#undef LONGHAUL_CONTROL_CALL

absl::StatusOr<v1::VerifyResponse> Client::Verify(const std::string& id) {
  v1::VerifyRequestC request;
  request.set_id(id);
  return impl_->Unary<v1::VerifyRequestC, v1::VerifyResponse>(&v1::Control::Stub::Verify, request);
}

absl::StatusOr<v1::PeersResponse> Client::Peers(bool probe) {
  v1::PeersRequest request;
  request.set_probe(probe);
  return impl_->Unary<v1::PeersRequest, v1::PeersResponse>(&v1::Control::Stub::Peers, request);
}

absl::StatusOr<std::vector<v1::RateLimit>> Client::SetLimit(const v1::RateLimit& limit) {
  v1::SetLimitRequest request;
  *request.mutable_limit() = limit;
  auto r = impl_->Unary<v1::SetLimitRequest, v1::SetLimitResponse>(&v1::Control::Stub::SetLimit,
                                                                    request);
  if (!r.ok()) return r.status();
  return std::vector<v1::RateLimit>(r->limits().begin(), r->limits().end());
}

absl::StatusOr<std::vector<v1::RateLimit>> Client::GetLimits() {
  auto r = impl_->Unary<v1::GetLimitsRequest, v1::GetLimitsResponse>(
      &v1::Control::Stub::GetLimits, v1::GetLimitsRequest());
  if (!r.ok()) return r.status();
  return std::vector<v1::RateLimit>(r->limits().begin(), r->limits().end());
}

absl::StatusOr<v1::TransferStatus> Client::Watch(
    const std::string& id, const std::function<void(const v1::TransferStatus&)>& on_update) {
  grpc::ClientContext context;
  impl_->Authorize(context);
  v1::WatchRequest request;
  request.set_id(id);
  auto reader = impl_->stub->Watch(&context, request);
  v1::TransferStatus status;
  bool any = false;
  while (reader->Read(&status)) {
    any = true;
    if (on_update) on_update(status);
  }
  if (absl::Status s = FromGrpc(reader->Finish(), impl_->address); !s.ok()) return s;
  if (!any || !IsEndState(status.state())) {
    return absl::UnavailableError("the daemon ended the progress stream early (did it stop?)");
  }
  return status;
}

absl::StatusOr<v1::TransferStatus> Client::Wait(
    const std::string& id, absl::Duration timeout,
    const std::function<void(const v1::TransferStatus&)>& on_progress) {
  const absl::Time deadline = client_internal::MonotonicNow() + timeout;
  while (true) {
    auto status = Get(id);
    if (!status.ok()) return status.status();
    if (on_progress) on_progress(*status);
    if (IsEndState(status->state())) return status;
    const absl::Time now = client_internal::MonotonicNow();
    if (now >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat("transfer ", id, " still ",
                                                      v1::TransferState_Name(status->state())));
    }
    absl::SleepFor(std::min(absl::Milliseconds(200), deadline - now));
  }
}

}  // namespace longhaul
