#ifndef LONGHAUL_DAEMON_WIRE_FRAMES_H_
#define LONGHAUL_DAEMON_WIRE_FRAMES_H_

// The data-plane frame format between daemons (documented in proto/FRAMES.md).
// Every frame is a fixed 24-byte little-endian header and a payload whose
// length the header gives. Parsing is pure and bounds-checked: bytes from the
// network are untrusted, and a malformed frame is an error value, never a crash.

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace longhaul::wire {

inline constexpr uint32_t kFrameMagic = 0x4D46484C;  // "LHFM" on the wire
inline constexpr uint8_t kFrameVersion = 1;
inline constexpr size_t kFrameHeaderSize = 24;
inline constexpr size_t kChunkHeaderSize = 32;
inline constexpr size_t kChunkAckFixedSize = 16;
inline constexpr size_t kChunkProgressSize = 24;
inline constexpr size_t kMaxAckMessage = 1024;
// Payload ceilings by frame type; a frame declaring more is refused before
// any of its payload is read. A HELLO names a role, a transfer id and a
// stream: a few hundred bytes.
inline constexpr uint32_t kMaxHelloPayload = 16u << 10;
// A control message carries, in OPEN, the transfer's whole manifest: a file
// costs about 50 bytes plus its path, so 256 MiB holds some 2.5 million files
// with 50-byte paths (a larger tree is refused, naming this limit). Its
// bytes are held only as they arrive (GrowingBuffer), and on the receiver's
// control channels they count against the peer's memory budget.
inline constexpr uint32_t kMaxControlPayload = 256u << 20;

enum class FrameType : uint8_t {
  kHello = 1,     // payload: v1::Hello
  kControl = 2,   // payload: v1::PeerMessage
  kChunk = 3,     // payload: ChunkHeader + chunk bytes
  kChunkAck = 4,  // payload: ChunkAck
  // payload: ChunkProgress. Sent only to a sender whose open asked for it
  // (OpenRequest.durable_pieces): older peers refuse the type.
  kChunkProgress = 5,
};

struct FrameHeader {
  FrameType type = FrameType::kHello;
  uint32_t payload_length = 0;
  uint64_t session_id = 0;
};

// Writes the header into `out`.
void EncodeFrameHeader(const FrameHeader& header, std::array<uint8_t, kFrameHeaderSize>& out);
// Parses and checks magic, version, type and that the payload length is at
// most `max_payload` (the caller's limit for what it is ready to receive).
absl::StatusOr<FrameHeader> ParseFrameHeader(absl::Span<const uint8_t> bytes, uint32_t max_payload);

// Leads a kChunk payload; the chunk's bytes from `offset` to its end follow
// it. The digest is always the whole chunk's.
struct ChunkHeader {
  uint32_t file_index = 0;
  uint32_t chunk_index = 0;
  uint32_t generation = 0;
  uint64_t xxh128_low = 0;
  uint64_t xxh128_high = 0;
  // Where the payload starts within the chunk: 0, or the durable prefix the
  // receiver reported (OpenReply.partial), which it does not receive again.
  uint32_t offset = 0;
};
void EncodeChunkHeader(const ChunkHeader& header, std::array<uint8_t, kChunkHeaderSize>& out);
absl::StatusOr<ChunkHeader> ParseChunkHeader(absl::Span<const uint8_t> bytes);

// The receiver's answer to one chunk, sent only once the chunk is durable
// (kDurable) or refused.
struct ChunkAck {
  enum class Result : uint32_t {
    kDurable = 0,       // written, synced and journaled
    kHashMismatch = 1,  // bytes differ from the digest: send the chunk again
    kRetryLater = 2,    // e.g. disk full; the transfer waits and retries
    kRefused = 3,       // the transfer cannot go on (message says why)
  };
  uint32_t file_index = 0;
  uint32_t chunk_index = 0;
  uint32_t generation = 0;
  Result result = Result::kDurable;
  std::string message;  // at most kMaxAckMessage bytes
};
std::string EncodeChunkAck(const ChunkAck& ack);
absl::StatusOr<ChunkAck> ParseChunkAck(absl::Span<const uint8_t> bytes);

// Checks a chunk frame's extent against what the receiver holds: its
// payload of `payload_bytes` starts at `header_offset` and must run exactly
// to the end of the chunk (`chunk_bytes` long), and it may start only at 0
// or at `durable_prefix`, the bytes of the chunk the receiver has durable.
// InvalidArgument, saying which, otherwise.
absl::Status CheckChunkExtent(uint64_t header_offset, uint64_t payload_bytes, uint64_t chunk_bytes,
                              uint64_t durable_prefix);

// The receiver's report, mid-chunk, that the chunk's first `durable_bytes`
// bytes are durable (written, synced and journaled); the sender may count
// them as acknowledged. The chunk's end is still answered by a ChunkAck.
struct ChunkProgress {
  uint32_t file_index = 0;
  uint32_t chunk_index = 0;
  uint32_t generation = 0;
  uint64_t durable_bytes = 0;
};
std::string EncodeChunkProgress(const ChunkProgress& progress);
// Exactly kChunkProgressSize bytes, reserved bits 0, durable_bytes > 0.
absl::StatusOr<ChunkProgress> ParseChunkProgress(absl::Span<const uint8_t> bytes);

}  // namespace longhaul::wire

#endif  // LONGHAUL_DAEMON_WIRE_FRAMES_H_
