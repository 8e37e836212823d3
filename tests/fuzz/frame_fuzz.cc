// Fuzzes the data-plane frame parsers and the receiver's chunk-extent check
// (daemon/wire/frames.h) with bytes as a peer could send them. Beyond "no
// crash, no sanitizer report", it checks the
// parsers' contracts: limits hold, and whatever parses re-encodes to the
// same bytes (so the parser accepts exactly the documented layout).

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <tuple>

#include "daemon/wire/frames.h"

namespace {

void Fail(const char* what) {
  std::fprintf(stderr, "frame_fuzz: contract broken: %s\n", what);
  std::abort();
}

void CheckFrameHeader(absl::Span<const uint8_t> in, uint32_t max_payload) {
  using longhaul::wire::FrameHeader;
  auto header = longhaul::wire::ParseFrameHeader(in, max_payload);
  if (!header.ok()) return;
  if (in.size() < longhaul::wire::kFrameHeaderSize) Fail("parsed a truncated frame header");
  if (header->payload_length > max_payload) Fail("payload length above the caller's limit");
  std::array<uint8_t, longhaul::wire::kFrameHeaderSize> again;
  longhaul::wire::EncodeFrameHeader(*header, again);
  if (std::memcmp(again.data(), in.data(), again.size()) != 0) {
    Fail("frame header does not re-encode to its bytes");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  absl::Span<const uint8_t> in(data, size);

  // The limits the daemon uses: control payloads, acks, and one taken from
  // the input so the length check is exercised at every boundary.
  CheckFrameHeader(in, longhaul::wire::kMaxControlPayload);
  CheckFrameHeader(in, longhaul::wire::kChunkAckFixedSize + longhaul::wire::kMaxAckMessage);
  if (size >= 28) {
    uint32_t limit;
    std::memcpy(&limit, data + 24, sizeof limit);
    CheckFrameHeader(in, limit);
  }

  if (auto chunk = longhaul::wire::ParseChunkHeader(in); chunk.ok()) {
    if (size < longhaul::wire::kChunkHeaderSize) Fail("parsed a truncated chunk header");
    std::array<uint8_t, longhaul::wire::kChunkHeaderSize> again;
    longhaul::wire::EncodeChunkHeader(*chunk, again);
    if (std::memcmp(again.data(), data, again.size()) != 0) {
      Fail("chunk header does not re-encode to its bytes");
    }
  }

  if (auto ack = longhaul::wire::ParseChunkAck(in); ack.ok()) {
    if (ack->message.size() > longhaul::wire::kMaxAckMessage) Fail("ack message above the limit");
    if (static_cast<uint32_t>(ack->result) >
        static_cast<uint32_t>(longhaul::wire::ChunkAck::Result::kRefused)) {
      Fail("ack result outside the enum");
    }
    std::string again = longhaul::wire::EncodeChunkAck(*ack);
    if (again.size() != size || std::memcmp(again.data(), data, size) != 0) {
      Fail("chunk ack does not re-encode to its bytes");
    }
  }
  if (auto progress = longhaul::wire::ParseChunkProgress(in); progress.ok()) {
    if (size != longhaul::wire::kChunkProgressSize) Fail("parsed chunk progress of a wrong size");
    if (progress->durable_bytes == 0) Fail("chunk progress of zero durable bytes");
    std::string again = longhaul::wire::EncodeChunkProgress(*progress);
    if (std::memcmp(again.data(), data, size) != 0) {
      Fail("chunk progress does not re-encode to its bytes");
    }
  }

  // The receiver's extent check, on four lengths a peer controls: an
  // accepted frame ends exactly at the chunk's end and starts at 0 or at the
  // durable prefix, whatever wraps.
  if (size >= 32) {
    uint64_t v[4];
    std::memcpy(v, data, sizeof v);
    const auto [offset, payload, chunk, prefix] = std::tuple(v[0], v[1], v[2], v[3]);
    if (longhaul::wire::CheckChunkExtent(offset, payload, chunk, prefix).ok()) {
      if (offset > chunk) Fail("extent accepted from past the chunk's end");
      if (offset + payload != chunk) Fail("extent accepted that does not end at the chunk's end");
      if (offset != 0 && offset != prefix) Fail("extent accepted from neither 0 nor the prefix");
    }
  }
  return 0;
}
