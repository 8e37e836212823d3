#ifndef LONGHAUL_DAEMON_EXCHANGE_GATHER_CHECKS_H_
#define LONGHAUL_DAEMON_EXCHANGE_GATHER_CHECKS_H_

// The checks every member makes of a peer's GATHER_DATA or BCAST_DATA
// header before it uses the payload (proto/EXCHANGE.md, All-gather,
// Broadcast). The operations themselves are Operations::AllGather and
// Operations::Broadcast (gather.cc). Pure functions: no threads, no I/O, so
// the exchange_peer fuzz target runs them on what a peer sends.

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "longhaul/v1/exchange.pb.h"

namespace longhaul::exchange {

// What an all-gather or broadcast call expects every peer's message of its
// op to carry.
struct GatherCall {
  v1::ExchangePeerMessage::Kind kind = v1::ExchangePeerMessage::GATHER_DATA;
  uint64_t generation = 0;
  // All-gather: each member's part; broadcast: the whole buffer.
  uint64_t bytes = 0;
  std::string tag;
  std::string root;  // broadcast only
};

// Checks the message `h` with `payload_bytes` of payload that `from` sent
// for the op `what` against `call`: Unavailable (retry) for another
// generation; FailedPrecondition, naming `from`, for another kind, tag, root
// (a broadcast's message must come from its root) or size (`count`);
// InvalidArgument when the payload is not `count` bytes.
absl::Status CheckGatherMessage(const std::string& what, const std::string& from,
                                const v1::ExchangePeerMessage& h, uint64_t payload_bytes,
                                const GatherCall& call);

}  // namespace longhaul::exchange

#endif  // LONGHAUL_DAEMON_EXCHANGE_GATHER_CHECKS_H_
