#include "daemon/peer/messaging.h"

#include <atomic>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "daemon/wire/frames.h"
#include "daemon/wire/messaging.h"

namespace longhaul::peer {

v1::PeerMessage ErrorAnswer(uint64_t request_id, const absl::Status& status) {
  v1::PeerMessage answer;
  answer.set_request_id(request_id);
  answer.set_error(std::string(status.message()));
  answer.set_error_code(static_cast<int32_t>(status.code()));
  answer.set_retryable(status.code() == absl::StatusCode::kUnavailable ||
                       status.code() == absl::StatusCode::kResourceExhausted ||
                       status.code() == absl::StatusCode::kAborted ||
                       status.code() == absl::StatusCode::kDeadlineExceeded);
  return answer;
}

absl::Status StatusFromAnswer(const v1::PeerMessage& answer) {
  if (answer.error().empty()) return absl::OkStatus();
  absl::StatusCode code = static_cast<absl::StatusCode>(answer.error_code());
  if (code == absl::StatusCode::kOk) code = absl::StatusCode::kUnknown;
  // A retryable answer must stay retryable whatever its code, and a
  // permanent one must not look transient.
  if (answer.retryable() && code != absl::StatusCode::kResourceExhausted) {
    code = absl::StatusCode::kUnavailable;
  }
  if (!answer.retryable() &&
      (code == absl::StatusCode::kUnavailable || code == absl::StatusCode::kResourceExhausted)) {
    code = absl::StatusCode::kFailedPrecondition;
  }
  return absl::Status(code, answer.error());
}

absl::StatusOr<v1::PeerMessage> Call(transport::Channel& channel, uint64_t session_id,
                                     v1::PeerMessage request, uint32_t max_answer) {
  static std::atomic<uint64_t> next_request_id{1};
  request.set_request_id(next_request_id.fetch_add(1));
  if (absl::Status s = wire::SendProto(channel, wire::FrameType::kControl, session_id, request);
      !s.ok()) {
    return s;
  }
  v1::PeerMessage answer;
  if (absl::Status s =
          wire::ReadProto(channel, wire::FrameType::kControl, session_id, max_answer, &answer);
      !s.ok()) {
    return s;
  }
  if (answer.request_id() != request.request_id()) {
    return absl::InvalidArgumentError(
        absl::StrCat(channel.peer_site(), " answered another request"));
  }
  if (absl::Status s = StatusFromAnswer(answer); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat(channel.peer_site(), ": ", s.message()));
  }
  return answer;
}

absl::StatusOr<std::unique_ptr<transport::Channel>> DialSession(transport::Transport& transport,
                                                                const std::string& site,
                                                                const std::string& address,
                                                                v1::Hello hello) {
  auto channel = transport.Dial(site, address);
  if (!channel.ok()) return channel.status();
  if (absl::Status s = wire::SendHello(**channel, std::move(hello)); !s.ok()) return s;
  return channel;
}

}  // namespace longhaul::peer
