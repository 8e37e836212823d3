#ifndef LONGHAUL_DAEMON_WIRE_BYTE_STREAM_H_
#define LONGHAUL_DAEMON_WIRE_BYTE_STREAM_H_

// The stream the frame helpers (messaging.h) read and write: reliable,
// ordered bytes to one authenticated peer site. transport::Channel is one;
// the wire sits below the transports so that a transport's own key exchange
// (udp) can speak the frame format without reaching up into the sessions.

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace longhaul::wire {

// Not thread-safe: one thread reads and writes a stream.
class ByteStream {
 public:
  virtual ~ByteStream() = default;

  // Writes all parts, in order, or fails.
  virtual absl::Status Write(absl::Span<const absl::Span<const uint8_t>> parts) = 0;
  // Fills `out` completely or fails (a clean close by the peer is Unavailable).
  virtual absl::Status ReadExactly(absl::Span<uint8_t> out) = 0;
  // The site named by the peer's verified certificate.
  virtual const std::string& peer_site() const = 0;
};

}  // namespace longhaul::wire

#endif  // LONGHAUL_DAEMON_WIRE_BYTE_STREAM_H_
