#ifndef LONGHAUL_DAEMON_PEER_MESSAGING_H_
#define LONGHAUL_DAEMON_PEER_MESSAGING_H_

// Frames on a Channel: the helpers both ends of a peer session use to send
// and receive HELLO/CONTROL protobufs and chunk frames.

#include <cstdint>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "daemon/peer/frames.h"
#include "daemon/transport/transport.h"
#include "google/protobuf/message_lite.h"
#include "longhaul/v1/peer.pb.h"

namespace longhaul::peer {

inline constexpr uint32_t kProtocolVersion = 1;

// The session id frames of one transfer carry (a stable hash of its id).
uint64_t SessionIdFor(absl::string_view transfer_id);

// Sends a frame whose payload is `parts` concatenated.
absl::Status SendFrame(transport::Channel& channel, FrameType type, uint64_t session_id,
                       absl::Span<const absl::Span<const uint8_t>> parts);
absl::Status SendProto(transport::Channel& channel, FrameType type, uint64_t session_id,
                       const google::protobuf::MessageLite& message);

// Reads one frame header; refuses payloads over `max_payload`.
absl::StatusOr<FrameHeader> ReadFrameHeader(transport::Channel& channel, uint32_t max_payload);
// Reads a frame that must be of `type` and parses its protobuf payload.
absl::Status ReadProto(transport::Channel& channel, FrameType type, uint64_t session_id,
                       google::protobuf::MessageLite* message);

// Sends `request` on a control channel and waits for its answer. An answer
// carrying an error becomes that status: Unavailable when the peer marked it
// retryable, otherwise the peer's code, with the peer's words.
absl::StatusOr<v1::PeerMessage> Call(transport::Channel& channel, uint64_t session_id,
                                     v1::PeerMessage request);

// Introduces a connection just dialed: the peer routes it by `hello`.
absl::Status SendHello(transport::Channel& channel, v1::Hello hello);

// Dials `site` and introduces the connection.
absl::StatusOr<std::unique_ptr<transport::Channel>> DialSession(transport::Transport& transport,
                                                                const std::string& site,
                                                                const std::string& address,
                                                                v1::Hello hello);

// The status a peer's error answer stands for (see Call).
v1::PeerMessage ErrorAnswer(uint64_t request_id, const absl::Status& status);
absl::Status StatusFromAnswer(const v1::PeerMessage& answer);

}  // namespace longhaul::peer

#endif  // LONGHAUL_DAEMON_PEER_MESSAGING_H_
