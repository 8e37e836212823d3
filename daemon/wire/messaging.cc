#include "daemon/wire/messaging.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <new>
#include <string>

#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "common/chunk_memory.h"
#include "xxhash.h"

namespace longhaul::wire {
namespace {

// The most a protobuf frame of `type` carries on any channel; a caller may
// only lower it.
uint32_t ProtoCeiling(FrameType type) {
  return type == FrameType::kHello ? kMaxHelloPayload : kMaxControlPayload;
}

}  // namespace

uint64_t SessionIdFor(absl::string_view transfer_id) {
  return XXH3_64bits(transfer_id.data(), transfer_id.size());
}

absl::Status SendFrame(ByteStream& stream, FrameType type, uint64_t session_id,
                       absl::Span<const absl::Span<const uint8_t>> parts) {
  uint64_t length = 0;
  for (auto part : parts) length += part.size();
  if (length > UINT32_MAX) return absl::InternalError("frame payload too large");
  std::array<uint8_t, kFrameHeaderSize> header;
  EncodeFrameHeader({type, static_cast<uint32_t>(length), session_id}, header);
  absl::InlinedVector<absl::Span<const uint8_t>, 4> all;
  all.push_back(header);
  all.insert(all.end(), parts.begin(), parts.end());
  return stream.Write(all);
}

absl::Status SendProto(ByteStream& stream, FrameType type, uint64_t session_id,
                       const google::protobuf::MessageLite& message) {
  std::string bytes = message.SerializeAsString();
  absl::Span<const uint8_t> part(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  return SendFrame(stream, type, session_id, {part});
}

absl::StatusOr<FrameHeader> ReadFrameHeader(ByteStream& stream, uint32_t max_payload) {
  std::array<uint8_t, kFrameHeaderSize> bytes;
  if (absl::Status s = stream.ReadExactly(absl::MakeSpan(bytes)); !s.ok()) return s;
  return ParseFrameHeader(bytes, max_payload);
}

absl::Status GrowingBuffer::Read(ByteStream& stream, size_t length, GrowHook on_grow) {
  size_ = 0;
  size_t filled = 0;
  while (filled < length) {
    const size_t piece = std::min(kReadPiece, length - filled);
    if (filled + piece > capacity_) {
      const size_t grown = std::min(length, std::max(filled + piece, 2 * capacity_));
      if (absl::Status s = on_grow(grown - capacity_); !s.ok()) return s;
      Storage storage = Allocate(grown);
      if (storage == nullptr) {
        return absl::ResourceExhaustedError(
            absl::StrCat("cannot allocate a ", grown, "-byte receive buffer"));
      }
      if (filled > 0) std::memcpy(storage.get(), storage_.get(), filled);
      storage_ = std::move(storage);
      capacity_ = grown;
    }
    if (absl::Status s = stream.ReadExactly(absl::MakeSpan(storage_.get() + filled, piece));
        !s.ok()) {
      return s;
    }
    filled += piece;
  }
  size_ = length;
  return absl::OkStatus();
}

absl::Status GrowingBuffer::Read(ByteStream& stream, size_t length) {
  return Read(stream, length, [](size_t) { return absl::OkStatus(); });
}

GrowingBuffer::Storage GrowingBuffer::Allocate(size_t capacity) {
  if (capacity < kMapThreshold) {
    return Storage(new (std::nothrow) uint8_t[capacity], Free{capacity});
  }
  return Storage(MapChunkMemory(capacity), Free{capacity});
}

void GrowingBuffer::Free::operator()(uint8_t* p) const {
  if (capacity < kMapThreshold) {
    delete[] p;
  } else {
    UnmapChunkMemory(p, capacity);
  }
}

void GrowingBuffer::Release() {
  storage_.reset();
  capacity_ = 0;
  size_ = 0;
}

absl::Status ReadProto(ByteStream& stream, FrameType type, uint64_t session_id,
                       google::protobuf::MessageLite* message) {
  return ReadProto(stream, type, session_id, ProtoCeiling(type), message);
}

absl::Status ReadProto(ByteStream& stream, FrameType type, uint64_t session_id,
                       google::protobuf::MessageLite* message, GrowingBuffer::GrowHook on_grow) {
  return ReadProto(stream, type, session_id, ProtoCeiling(type), message, on_grow);
}

absl::Status ReadProto(ByteStream& stream, FrameType type, uint64_t session_id,
                       uint32_t max_payload, google::protobuf::MessageLite* message) {
  return ReadProto(stream, type, session_id, max_payload, message,
                   [](size_t) { return absl::OkStatus(); });
}

absl::Status ReadProto(ByteStream& stream, FrameType type, uint64_t session_id,
                       uint32_t max_payload, google::protobuf::MessageLite* message,
                       GrowingBuffer::GrowHook on_grow) {
  auto header = ReadFrameHeader(stream, std::min(max_payload, ProtoCeiling(type)));
  if (!header.ok()) {
    // A refused header is the peer's doing: say which peer, for its operator.
    if (!absl::IsInvalidArgument(header.status())) return header.status();
    return absl::InvalidArgumentError(
        absl::StrCat(stream.peer_site(), ": ", header.status().message()));
  }
  if (header->type != type) {
    return absl::InvalidArgumentError(absl::StrCat("expected frame type ", static_cast<int>(type),
                                                   ", got ", static_cast<int>(header->type)));
  }
  if (session_id != 0 && header->session_id != session_id) {
    return absl::InvalidArgumentError("frame for another session on this connection");
  }
  GrowingBuffer payload;
  if (absl::Status s = payload.Read(stream, header->payload_length, on_grow); !s.ok()) return s;
  if (!message->ParseFromArray(payload.data().data(), static_cast<int>(payload.data().size()))) {
    return absl::InvalidArgumentError(
        absl::StrCat("malformed ", message->GetTypeName(), " from ", stream.peer_site()));
  }
  return absl::OkStatus();
}

absl::Status SendHello(ByteStream& stream, v1::Hello hello) {
  hello.set_protocol_version(kProtocolVersion);
  return SendProto(stream, FrameType::kHello, SessionIdFor(hello.transfer_id()), hello);
}

}  // namespace longhaul::wire
