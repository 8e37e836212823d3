#ifndef LONGHAUL_DAEMON_PEER_MESSAGING_H_
#define LONGHAUL_DAEMON_PEER_MESSAGING_H_

// Frames on a Channel: the helpers both ends of a peer session use to send
// and receive HELLO/CONTROL protobufs and chunk frames.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
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

// The most GrowingBuffer adds per read from its channel.
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

  // Reads exactly `length` bytes from `channel`, replacing what data() held.
  // On error data() holds no valid payload.
  absl::Status Read(transport::Channel& channel, size_t length, GrowHook on_grow);
  absl::Status Read(transport::Channel& channel, size_t length);

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
absl::StatusOr<FrameHeader> ReadFrameHeader(transport::Channel& channel, uint32_t max_payload);
// Reads a frame that must be of `type` (kHello or kControl) and parses its
// protobuf payload. A payload declared over its type's ceiling
// (kMaxHelloPayload, kMaxControlPayload) is refused (InvalidArgument naming
// the limit) before any of it is read; the caller closes the connection.
// The payload is held in a GrowingBuffer, freed before this returns; with
// `on_grow` each growth is charged first (what it charged is the caller's to
// give back after the call), and its error ends the read.
absl::Status ReadProto(transport::Channel& channel, FrameType type, uint64_t session_id,
                       google::protobuf::MessageLite* message);
absl::Status ReadProto(transport::Channel& channel, FrameType type, uint64_t session_id,
                       google::protobuf::MessageLite* message, GrowingBuffer::GrowHook on_grow);

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
