#include "daemon/peer/router.h"

#include "common/fmt_absl.h"
#include "daemon/peer/messaging.h"
#include "daemon/wire/frames.h"
#include "daemon/wire/messaging.h"
#include "spdlog/spdlog.h"

namespace longhaul::peer {

void PeerRouter::Register(v1::Hello::Role role, Handler handler) {
  handlers_[static_cast<int>(role)] = std::move(handler);
}

void PeerRouter::Serve(std::unique_ptr<transport::Channel> channel) const {
  v1::Hello hello;
  absl::Status status = wire::ReadProto(*channel, wire::FrameType::kHello, 0, &hello);
  if (absl::IsUnavailable(status)) {
    // Closed before a word, so nothing was lost: usually a sender's spare data channel, dialed
    // ahead of a session that needed fewer streams (TransferSender::RunAttempt).
    spdlog::debug("connection from {} ({}) ended before its hello: {}", channel->peer_site(),
                  channel->peer_address(), status.message());
    return;
  }
  if (!status.ok()) {
    spdlog::warn("closing connection from {} ({}): no valid hello: {}", channel->peer_site(),
                 channel->peer_address(), status.message());
    return;
  }
  // The HELLO is in: from here the idle timeout applies, not the handshake deadline.
  channel->EndHandshake();
  if (hello.role() == v1::Hello::EXCHANGE) channel->KeepWhenIdle();
  if (hello.protocol_version() != wire::kProtocolVersion) {
    spdlog::warn("closing connection from {}: protocol version {} (we speak {})",
                 channel->peer_site(), hello.protocol_version(), wire::kProtocolVersion);
    return;
  }
  auto it = handlers_.find(static_cast<int>(hello.role()));
  if (it == handlers_.end()) {
    spdlog::warn("closing connection from {}: role {} is not served here", channel->peer_site(),
                 v1::Hello::Role_Name(hello.role()));
    return;
  }
  it->second(std::move(channel), hello);
}

}  // namespace longhaul::peer
