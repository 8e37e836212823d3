#ifndef LONGHAUL_DAEMON_PEER_MESSAGING_H_
#define LONGHAUL_DAEMON_PEER_MESSAGING_H_

// A peer session's requests and answers on a control channel, and the dial
// that opens a session. The frames themselves, and reading and writing them,
// are the wire's (wire/frames.h, wire/messaging.h).

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "daemon/transport/transport.h"
#include "daemon/wire/frames.h"
#include "longhaul/v1/peer.pb.h"

namespace longhaul::peer {

// Sends `request` on a control channel and waits for its answer. An answer
// carrying an error becomes that status: Unavailable when the peer marked it
// retryable, otherwise the peer's code, with the peer's words. An answer
// declaring more than `max_answer` bytes is refused before it is read
// (InvalidArgument naming the peer and the limit); the channel is then not
// to be used again.
absl::StatusOr<v1::PeerMessage> Call(transport::Channel& channel, uint64_t session_id,
                                     v1::PeerMessage request,
                                     uint32_t max_answer = wire::kMaxControlPayload);

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
