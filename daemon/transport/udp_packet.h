#ifndef LONGHAUL_DAEMON_TRANSPORT_UDP_PACKET_H_
#define LONGHAUL_DAEMON_TRANSPORT_UDP_PACKET_H_

// The udp transport's wire codec (proto/UDP.md): the 17-byte short header and
// the frames inside a packet's encrypted payload. Pure functions over spans:
// no sockets, no keys, no allocation. Every length and offset read from the
// wire is checked against the bytes that are actually there; malformed input
// is an InvalidArgument status, never a crash.

#include <array>
#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace longhaul::transport::udp {

// Byte 0: 0b0100'000K. The fixed bits name protocol version 1; K is the key phase.
inline constexpr uint8_t kHeaderFixedBits = 0x40;
inline constexpr uint8_t kHeaderKeyPhaseBit = 0x01;
inline constexpr size_t kHeaderSize = 17;  // flags(1) connection_id(8) packet_number(8)
inline constexpr size_t kAeadTagSize = 16;
inline constexpr size_t kPacketOverhead = kHeaderSize + kAeadTagSize;
// Stream offsets stay below 2^62 so offset + length never overflows.
inline constexpr uint64_t kMaxStreamOffset = uint64_t{1} << 62;
inline constexpr size_t kMaxAckRanges = 32;
inline constexpr size_t kMaxCloseReason = 512;

struct PacketHeader {
  uint64_t connection_id = 0;
  uint64_t packet_number = 0;
  bool key_phase = false;
};

enum class FrameType : uint8_t {
  kPadding = 0x00,
  kPing = 0x01,
  kAck = 0x02,
  kStream = 0x03,
  kMaxData = 0x04,
  kClose = 0x05,
};

// A closed range of packet numbers [smallest, largest].
struct PacketRange {
  uint64_t smallest = 0;
  uint64_t largest = 0;
};

// ranges[0] holds the largest acknowledged packet; ranges are in decreasing
// order, disjoint and not adjacent.
struct AckFrame {
  uint64_t ack_delay_us = 0;
  size_t range_count = 0;
  std::array<PacketRange, kMaxAckRanges> ranges{};
  uint64_t largest_acked() const { return ranges[0].largest; }
};

struct StreamFrame {
  uint64_t offset = 0;
  absl::Span<const uint8_t> data;  // points into the packet being parsed
};

struct CloseFrame {
  uint16_t code = 0;
  absl::string_view reason;  // points into the packet being parsed
};

inline constexpr uint16_t kCloseNoError = 0;
inline constexpr uint16_t kCloseAborted = 1;
inline constexpr uint16_t kCloseProtocolViolation = 2;
inline constexpr uint16_t kCloseIdleTimeout = 3;

// Receives the frames of one packet in wire order. A non-OK return stops the
// parse and is returned by ParseFrames.
class FrameVisitor {
 public:
  virtual ~FrameVisitor() = default;
  virtual absl::Status OnPing() { return absl::OkStatus(); }
  virtual absl::Status OnAck(const AckFrame& ack) = 0;
  virtual absl::Status OnStream(const StreamFrame& frame) = 0;
  virtual absl::Status OnMaxData(uint64_t max_data) = 0;
  virtual absl::Status OnClose(const CloseFrame& frame) = 0;
};

// Parses the clear header at the front of `datagram`. Checks the fixed bits and
// that the datagram can hold a header, one frame byte and a tag.
absl::StatusOr<PacketHeader> ParseHeader(absl::Span<const uint8_t> datagram);
void WriteHeader(const PacketHeader& header, absl::Span<uint8_t> out);  // out.size() >= kHeaderSize

// Parses every frame of a decrypted payload. An empty payload, an unknown
// frame type, a truncated field, an ACK whose ranges underflow or exceed
// kMaxAckRanges, a STREAM frame past kMaxStreamOffset or a CLOSE reason longer
// than kMaxCloseReason is InvalidArgument.
absl::Status ParseFrames(absl::Span<const uint8_t> payload, FrameVisitor& visitor);

// A STREAM frame that ends its packet: its data is payload bytes
// [data_start, payload length).
struct TrailingStream {
  size_t frame_start = 0;  // the frames before it are payload[0, frame_start)
  size_t data_start = 0;
  uint64_t offset = 0;
  size_t length = 0;
};
// Finds the STREAM frame that ends a payload of `payload_length` bytes from
// its first bytes `head`, skipping the PADDING, PING, ACK and MAX_DATA frames
// before it by their sizes alone (nothing else is checked: ParseFrames still
// parses them). False when `head` does not reach that frame's data, another
// frame type comes first, or the frame is malformed or does not end the
// payload. Safe on any bytes: it never reads outside `head`.
bool FindTrailingStream(absl::Span<const uint8_t> head, size_t payload_length, TrailingStream* out);

// Appends frames to a caller-owned buffer. Each returns the bytes written, or
// 0 if `out` is too small (nothing is written then).
size_t WritePing(absl::Span<uint8_t> out);
size_t WritePadding(absl::Span<uint8_t> out, size_t n);
size_t WriteAck(const AckFrame& ack, absl::Span<uint8_t> out);
size_t AckFrameSize(const AckFrame& ack);
// Writes a STREAM frame header for `length` bytes at `offset`; the caller
// copies the data into out[kStreamFrameHeaderSize, +length).
inline constexpr size_t kStreamFrameHeaderSize = 1 + 8 + 2;
size_t WriteStreamHeader(uint64_t offset, uint16_t length, absl::Span<uint8_t> out);
inline constexpr size_t kMaxDataFrameSize = 1 + 8;
size_t WriteMaxData(uint64_t max_data, absl::Span<uint8_t> out);
size_t WriteClose(uint16_t code, absl::string_view reason, absl::Span<uint8_t> out);

}  // namespace longhaul::transport::udp

#endif  // LONGHAUL_DAEMON_TRANSPORT_UDP_PACKET_H_
