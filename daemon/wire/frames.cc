#include "daemon/wire/frames.h"

#include <bit>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace longhaul::wire {
namespace {

// The wire is little-endian; so is every host we build for.
static_assert(std::endian::native == std::endian::little, "frames assume a little-endian host");

template <typename T>
T Load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
template <typename T>
void Store(uint8_t* p, T v) {
  std::memcpy(p, &v, sizeof v);
}
uint32_t Load32(const uint8_t* p) { return Load<uint32_t>(p); }
const char* TypeName(FrameType type) {
  switch (type) {
    case FrameType::kHello:
      return "HELLO";
    case FrameType::kControl:
      return "CONTROL";
    case FrameType::kChunk:
      return "CHUNK";
    case FrameType::kChunkAck:
      return "CHUNK_ACK";
    case FrameType::kChunkProgress:
      return "CHUNK_PROGRESS";
  }
  return "unknown";
}
uint64_t Load64(const uint8_t* p) { return Load<uint64_t>(p); }
void Store16(uint8_t* p, uint16_t v) { Store(p, v); }
void Store32(uint8_t* p, uint32_t v) { Store(p, v); }
void Store64(uint8_t* p, uint64_t v) { Store(p, v); }

}  // namespace

// Layout: magic u32 | version u8 | type u8 | flags u16 | payload_length u32 |
// reserved u32 | session_id u64.
void EncodeFrameHeader(const FrameHeader& header, std::array<uint8_t, kFrameHeaderSize>& out) {
  uint8_t* p = out.data();
  Store32(p, kFrameMagic);
  p[4] = kFrameVersion;
  p[5] = static_cast<uint8_t>(header.type);
  Store16(p + 6, 0);
  Store32(p + 8, header.payload_length);
  Store32(p + 12, 0);
  Store64(p + 16, header.session_id);
}

absl::StatusOr<FrameHeader> ParseFrameHeader(absl::Span<const uint8_t> bytes,
                                             uint32_t max_payload) {
  if (bytes.size() < kFrameHeaderSize) {
    return absl::InvalidArgumentError(
        absl::StrCat("frame header truncated: ", bytes.size(), " of ", kFrameHeaderSize, " bytes"));
  }
  const uint8_t* p = bytes.data();
  if (Load32(p) != kFrameMagic) {
    return absl::InvalidArgumentError(
        "not a longhaul frame (bad magic): the peer speaks another protocol or version");
  }
  if (p[4] != kFrameVersion) {
    return absl::InvalidArgumentError(absl::StrCat("unsupported frame version ", p[4],
                                                   " (this daemon speaks ", kFrameVersion, ")"));
  }
  uint8_t type = p[5];
  if (type < static_cast<uint8_t>(FrameType::kHello) ||
      type > static_cast<uint8_t>(FrameType::kChunkProgress)) {
    return absl::InvalidArgumentError(absl::StrCat("unknown frame type ", type));
  }
  if ((p[6] | p[7]) != 0 || Load32(p + 12) != 0) {
    return absl::InvalidArgumentError("frame header has reserved bits set");
  }
  FrameHeader header;
  header.type = static_cast<FrameType>(type);
  header.payload_length = Load32(p + 8);
  header.session_id = Load64(p + 16);
  if (header.payload_length > max_payload) {
    return absl::InvalidArgumentError(
        absl::StrCat(TypeName(header.type), " frame payload of ", header.payload_length,
                     " bytes exceeds the limit of ", max_payload, " bytes for this frame here"));
  }
  return header;
}

// Layout: file_index u32 | chunk_index u32 | generation u32 | offset u32 |
// xxh128 low u64 | xxh128 high u64.
void EncodeChunkHeader(const ChunkHeader& header, std::array<uint8_t, kChunkHeaderSize>& out) {
  uint8_t* p = out.data();
  Store32(p, header.file_index);
  Store32(p + 4, header.chunk_index);
  Store32(p + 8, header.generation);
  Store32(p + 12, header.offset);
  Store64(p + 16, header.xxh128_low);
  Store64(p + 24, header.xxh128_high);
}

absl::StatusOr<ChunkHeader> ParseChunkHeader(absl::Span<const uint8_t> bytes) {
  if (bytes.size() < kChunkHeaderSize) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk header truncated: ", bytes.size(), " of ", kChunkHeaderSize, " bytes"));
  }
  const uint8_t* p = bytes.data();
  ChunkHeader header;
  header.offset = Load32(p + 12);
  header.file_index = Load32(p);
  header.chunk_index = Load32(p + 4);
  header.generation = Load32(p + 8);
  header.xxh128_low = Load64(p + 16);
  header.xxh128_high = Load64(p + 24);
  return header;
}

// Layout: file_index u32 | chunk_index u32 | generation u32 | result u32 |
// message bytes (the rest, UTF-8, at most kMaxAckMessage).
std::string EncodeChunkAck(const ChunkAck& ack) {
  std::string out(kChunkAckFixedSize, '\0');
  auto* p = reinterpret_cast<uint8_t*>(out.data());
  Store32(p, ack.file_index);
  Store32(p + 4, ack.chunk_index);
  Store32(p + 8, ack.generation);
  Store32(p + 12, static_cast<uint32_t>(ack.result));
  out.append(ack.message.substr(0, kMaxAckMessage));
  return out;
}

absl::StatusOr<ChunkAck> ParseChunkAck(absl::Span<const uint8_t> bytes) {
  if (bytes.size() < kChunkAckFixedSize) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk ack truncated: ", bytes.size(), " of ", kChunkAckFixedSize, " bytes"));
  }
  if (bytes.size() > kChunkAckFixedSize + kMaxAckMessage) {
    return absl::InvalidArgumentError("chunk ack message too long");
  }
  const uint8_t* p = bytes.data();
  uint32_t result = Load32(p + 12);
  if (result > static_cast<uint32_t>(ChunkAck::Result::kRefused)) {
    return absl::InvalidArgumentError(absl::StrCat("unknown chunk ack result ", result));
  }
  ChunkAck ack;
  ack.file_index = Load32(p);
  ack.chunk_index = Load32(p + 4);
  ack.generation = Load32(p + 8);
  ack.result = static_cast<ChunkAck::Result>(result);
  ack.message.assign(reinterpret_cast<const char*>(p + kChunkAckFixedSize),
                     bytes.size() - kChunkAckFixedSize);
  return ack;
}

absl::Status CheckChunkExtent(uint64_t header_offset, uint64_t payload_bytes, uint64_t chunk_bytes,
                              uint64_t durable_prefix) {
  if (header_offset > chunk_bytes || payload_bytes != chunk_bytes - header_offset) {
    return absl::InvalidArgumentError(
        absl::StrCat("a chunk frame of ", payload_bytes, " bytes from offset ", header_offset,
                     " does not end where the ", chunk_bytes, "-byte chunk ends"));
  }
  if (header_offset != 0 && header_offset != durable_prefix) {
    return absl::InvalidArgumentError(
        absl::StrCat("a chunk frame starts at offset ", header_offset, " of its chunk, where ",
                     durable_prefix, " bytes are durable: it must start at 0 or there"));
  }
  return absl::OkStatus();
}

// Layout: file_index u32 | chunk_index u32 | generation u32 | reserved u32 |
// durable_bytes u64.
std::string EncodeChunkProgress(const ChunkProgress& progress) {
  std::string out(kChunkProgressSize, '\0');
  auto* p = reinterpret_cast<uint8_t*>(out.data());
  Store32(p, progress.file_index);
  Store32(p + 4, progress.chunk_index);
  Store32(p + 8, progress.generation);
  Store32(p + 12, 0);
  Store64(p + 16, progress.durable_bytes);
  return out;
}

absl::StatusOr<ChunkProgress> ParseChunkProgress(absl::Span<const uint8_t> bytes) {
  if (bytes.size() != kChunkProgressSize) {
    return absl::InvalidArgumentError(absl::StrCat("chunk progress of ", bytes.size(),
                                                   " bytes (it has ", kChunkProgressSize, ")"));
  }
  const uint8_t* p = bytes.data();
  if (Load32(p + 12) != 0) {
    return absl::InvalidArgumentError("chunk progress has reserved bits set");
  }
  ChunkProgress progress;
  progress.file_index = Load32(p);
  progress.chunk_index = Load32(p + 4);
  progress.generation = Load32(p + 8);
  progress.durable_bytes = Load64(p + 16);
  if (progress.durable_bytes == 0) {
    return absl::InvalidArgumentError("chunk progress reports no durable bytes");
  }
  return progress;
}

}  // namespace longhaul::wire
