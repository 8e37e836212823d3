#ifndef LONGHAUL_DAEMON_PEER_RELAY_CHUNK_SOURCE_H_
#define LONGHAUL_DAEMON_PEER_RELAY_CHUNK_SOURCE_H_

#include <cstdint>
#include <functional>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "storage/chunk_io.h"

namespace longhaul::peer {

// Where a relaying TransferSender reads chunks (fan-out): another transfer's
// copy at this site (Receiver::RelayReader). One per stream.
class RelayChunkSource {
 public:
  virtual ~RelayChunkSource() = default;
  // Waits until the chunk is here, reads it into `out` (an aligned buffer of
  // the chunk's size) and returns the digest the source gave it. Cancelled
  // once `stopping`; any other error ends the relay.
  virtual absl::StatusOr<storage::Xxh128> Read(uint32_t file_index, uint32_t chunk_index,
                                               uint32_t generation, absl::Span<uint8_t> out,
                                               const std::function<bool()>& stopping) = 0;
};

}  // namespace longhaul::peer

#endif  // LONGHAUL_DAEMON_PEER_RELAY_CHUNK_SOURCE_H_
