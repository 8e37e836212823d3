#include "daemon/peer/messaging.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <new>
#include <string>

#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "storage/chunk_io.h"
#include "xxhash.h"

namespace longhaul::peer {

uint64_t SessionIdFor(absl::string_view transfer_id) {
  return XXH3_64bits(transfer_id.data(), transfer_id.size());
}

absl::Status SendFrame(transport::Channel& channel, FrameType type, uint64_t session_id,
                       absl::Span<const absl::Span<const uint8_t>> parts) {
  uint64_t length = 0;
  for (auto part : parts) length += part.size();
  if (length > UINT32_MAX) return absl::InternalError("frame payload too large");
  std::array<uint8_t, kFrameHeaderSize> header;
  EncodeFrameHeader({type, static_cast<uint32_t>(length), session_id}, header);
  absl::InlinedVector<absl::Span<const uint8_t>, 4> all;
  all.push_back(header);
  all.insert(all.end(), parts.begin(), parts.end());
  return channel.Write(all);
}

absl::Status SendProto(transport::Channel& channel, FrameType type, uint64_t session_id,
                       const google::protobuf::MessageLite& message) {
  std::string bytes = message.SerializeAsString();
  absl::Span<const uint8_t> part(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  return SendFrame(channel, type, session_id, {part});
}

absl::StatusOr<FrameHeader> ReadFrameHeader(transport::Channel& channel, uint32_t max_payload) {
  std::array<uint8_t, kFrameHeaderSize> bytes;
  if (absl::Status s = channel.ReadExactly(absl::MakeSpan(bytes)); !s.ok()) return s;
  return ParseFrameHeader(bytes, max_payload);
}

absl::Status GrowingBuffer::Read(transport::Channel& channel, size_t length, GrowHook on_grow) {
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
    if (absl::Status s = channel.ReadExactly(absl::MakeSpan(storage_.get() + filled, piece));
        !s.ok()) {
      return s;
    }
    filled += piece;
  }
  size_ = length;
  return absl::OkStatus();
}

absl::Status GrowingBuffer::Read(transport::Channel& channel, size_t length) {
  return Read(channel, length, [](size_t) { return absl::OkStatus(); });
}

GrowingBuffer::Storage GrowingBuffer::Allocate(size_t capacity) {
  if (capacity < kMapThreshold) {
    return Storage(new (std::nothrow) uint8_t[capacity], Free{capacity});
  }
  return Storage(storage::MapChunkMemory(capacity), Free{capacity});
}

void GrowingBuffer::Free::operator()(uint8_t* p) const {
  if (capacity < kMapThreshold) {
    delete[] p;
  } else {
    storage::UnmapChunkMemory(p, capacity);
  }
}

void GrowingBuffer::Release() {
  storage_.reset();
  capacity_ = 0;
  size_ = 0;
}

absl::Status ReadProto(transport::Channel& channel, FrameType type, uint64_t session_id,
                       google::protobuf::MessageLite* message) {
  return ReadProto(channel, type, session_id, message, [](size_t) { return absl::OkStatus(); });
}

absl::Status ReadProto(transport::Channel& channel, FrameType type, uint64_t session_id,
                       google::protobuf::MessageLite* message, GrowingBuffer::GrowHook on_grow) {
  const uint32_t ceiling = type == FrameType::kHello ? kMaxHelloPayload : kMaxControlPayload;
  auto header = ReadFrameHeader(channel, ceiling);
  if (!header.ok()) return header.status();
  if (header->type != type) {
    return absl::InvalidArgumentError(absl::StrCat("expected frame type ", static_cast<int>(type),
                                                   ", got ", static_cast<int>(header->type)));
  }
  if (session_id != 0 && header->session_id != session_id) {
    return absl::InvalidArgumentError("frame for another session on this connection");
  }
  GrowingBuffer payload;
  if (absl::Status s = payload.Read(channel, header->payload_length, on_grow); !s.ok()) return s;
  if (!message->ParseFromArray(payload.data().data(), static_cast<int>(payload.data().size()))) {
    return absl::InvalidArgumentError(
        absl::StrCat("malformed ", message->GetTypeName(), " from ", channel.peer_site()));
  }
  return absl::OkStatus();
}

v1::PeerMessage ErrorAnswer(uint64_t request_id, const absl::Status& status) {
  v1::PeerMessage answer;
  answer.set_request_id(request_id);
  answer.set_error(std::string(status.message()));
  answer.set_error_code(static_cast<int32_t>(status.code()));
  answer.set_retryable(status.code() == absl::StatusCode::kUnavailable ||
                       status.code() == absl::StatusCode::kResourceExhausted ||
                       status.code() == absl::StatusCode::kAborted ||
                       status.code() == absl::StatusCode::kDeadlineExceeded);
  return answer;
}

absl::Status StatusFromAnswer(const v1::PeerMessage& answer) {
  if (answer.error().empty()) return absl::OkStatus();
  absl::StatusCode code = static_cast<absl::StatusCode>(answer.error_code());
  if (code == absl::StatusCode::kOk) code = absl::StatusCode::kUnknown;
  // A retryable answer must stay retryable whatever its code, and a
  // permanent one must not look transient.
  if (answer.retryable() && code != absl::StatusCode::kResourceExhausted) {
    code = absl::StatusCode::kUnavailable;
  }
  if (!answer.retryable() &&
      (code == absl::StatusCode::kUnavailable || code == absl::StatusCode::kResourceExhausted)) {
    code = absl::StatusCode::kFailedPrecondition;
  }
  return absl::Status(code, answer.error());
}

absl::StatusOr<v1::PeerMessage> Call(transport::Channel& channel, uint64_t session_id,
                                     v1::PeerMessage request) {
  static std::atomic<uint64_t> next_request_id{1};
  request.set_request_id(next_request_id.fetch_add(1));
  if (absl::Status s = SendProto(channel, FrameType::kControl, session_id, request); !s.ok()) {
    return s;
  }
  v1::PeerMessage answer;
  if (absl::Status s = ReadProto(channel, FrameType::kControl, session_id, &answer); !s.ok()) {
    return s;
  }
  if (answer.request_id() != request.request_id()) {
    return absl::InvalidArgumentError(
        absl::StrCat(channel.peer_site(), " answered another request"));
  }
  if (absl::Status s = StatusFromAnswer(answer); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat(channel.peer_site(), ": ", s.message()));
  }
  return answer;
}

absl::StatusOr<std::unique_ptr<transport::Channel>> DialSession(transport::Transport& transport,
                                                                const std::string& site,
                                                                const std::string& address,
                                                                v1::Hello hello) {
  auto channel = transport.Dial(site, address);
  if (!channel.ok()) return channel.status();
  if (absl::Status s = SendHello(**channel, std::move(hello)); !s.ok()) return s;
  return channel;
}

absl::Status SendHello(transport::Channel& channel, v1::Hello hello) {
  hello.set_protocol_version(kProtocolVersion);
  return SendProto(channel, FrameType::kHello, SessionIdFor(hello.transfer_id()), hello);
}

}  // namespace longhaul::peer
