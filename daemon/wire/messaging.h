#ifndef LONGHAUL_DAEMON_WIRE_MESSAGING_H_
#define LONGHAUL_DAEMON_WIRE_MESSAGING_H_

// Frames on a ByteStream: the helpers that send and receive HELLO and
// CONTROL protobufs and chunk frames. Both ends of a peer session use them,
// and so does the udp transport's key exchange over its tls channel.

#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "daemon/wire/byte_stream.h"
#include "daemon/wire/frames.h"
#include "google/protobuf/message_lite.h"
#include "longhaul/v1/peer.pb.h"

namespace longhaul::wire {

inline constexpr uint32_t kProtocolVersion = 1;

// The session id frames of one transfer carry (a stable hash of its id).
uint64_t SessionIdFor(absl::string_view transfer_id);

// Sends a frame whose payload is `parts` concatenated.
absl::Status SendFrame(ByteStream& stream, FrameType type, uint64_t session_id,
                       absl::Span<const absl::Span<const uint8_t>> parts);
absl::Status SendProto(ByteStream& stream, FrameType type, uint64_t session_id,
                       const google::protobuf::MessageLite& message);

// The most GrowingBuffer adds per read from its stream.
inline constexpr size_t kReadPiece = 64u << 10;

// A receive buffer that grows only as payload arrives, so that a peer that
// declares a large payload and sends little makes this daemon hold little.
// Read() reads in pieces of at most kReadPiece bytes; when the bytes that
// arrived fill the buffer it grows to twice its size (at least one piece),
// never past the length being read. Storage is kept across reads until
// Release(), so a stream of equal frames allocates once. Storage of
// kMapThreshold bytes or more is mapped on its own and unmapped when
// replaced, so what the buffer outgrew leaves the process rather than
// staying in the allocator's arenas. Not thread-safe.
class GrowingBuffer {
 public:
  // Told how many bytes the buffer is about to grow by; an error stops the
  // read with that error, the buffer unchanged.
  using GrowHook = absl::FunctionRef<absl::Status(size_t added)>;

  // Reads exactly `length` bytes from `stream`, replacing what data() held.
  // On error data() holds no valid payload.
  absl::Status Read(ByteStream& stream, size_t length, GrowHook on_grow);
  absl::Status Read(ByteStream& stream, size_t length);

  // The bytes of the last successful Read; valid until the next call.
  absl::Span<const uint8_t> data() const { return {storage_.get(), size_}; }
  // Bytes allocated now (what a budget should be charged for).
  size_t capacity() const { return capacity_; }
  // Frees the storage.
  void Release();

  static constexpr size_t kMapThreshold = 1u << 20;

 private:
  // Frees `capacity` bytes allocated for a buffer of that capacity.
  struct Free {
    Free() : capacity(0) {}
    explicit Free(size_t c) : capacity(c) {}
    void operator()(uint8_t* p) const;
    size_t capacity;
  };
  using Storage = std::unique_ptr<uint8_t[], Free>;
  static Storage Allocate(size_t capacity);

  Storage storage_;
  size_t capacity_ = 0;
  size_t size_ = 0;
};

// Reads one frame header; refuses payloads over `max_payload`.
absl::StatusOr<FrameHeader> ReadFrameHeader(ByteStream& stream, uint32_t max_payload);
// Reads a frame that must be of `type` (kHello or kControl) and parses its
// protobuf payload. A payload declared over `max_payload` (by default its
// type's ceiling: kMaxHelloPayload, kMaxControlPayload) is refused
// (InvalidArgument naming the peer and the limit) before any of it is read;
// the caller closes the connection. The payload is held in a GrowingBuffer,
// freed before this returns; with `on_grow` each growth is charged first
// (what it charged is the caller's to give back after the call), and its
// error ends the read.
absl::Status ReadProto(ByteStream& stream, FrameType type, uint64_t session_id,
                       google::protobuf::MessageLite* message);
absl::Status ReadProto(ByteStream& stream, FrameType type, uint64_t session_id,
                       google::protobuf::MessageLite* message, GrowingBuffer::GrowHook on_grow);
absl::Status ReadProto(ByteStream& stream, FrameType type, uint64_t session_id,
                       uint32_t max_payload, google::protobuf::MessageLite* message);
absl::Status ReadProto(ByteStream& stream, FrameType type, uint64_t session_id,
                       uint32_t max_payload, google::protobuf::MessageLite* message,
                       GrowingBuffer::GrowHook on_grow);

// Introduces a connection just dialed: the peer routes it by `hello`.
absl::Status SendHello(ByteStream& stream, v1::Hello hello);

}  // namespace longhaul::wire

#endif  // LONGHAUL_DAEMON_WIRE_MESSAGING_H_
