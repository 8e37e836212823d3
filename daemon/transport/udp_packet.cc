#include "daemon/transport/udp_packet.h"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace longhaul::transport::udp {
namespace {

// A bounds-checked little-endian reader over one span.
class Reader {
 public:
  explicit Reader(absl::Span<const uint8_t> in) : in_(in) {}
  size_t remaining() const { return in_.size() - pos_; }
  bool ReadU8(uint8_t* v) { return ReadLe(v, 1); }
  bool ReadU16(uint16_t* v) { return ReadLe(v, 2); }
  bool ReadU32(uint32_t* v) { return ReadLe(v, 4); }
  bool ReadU64(uint64_t* v) { return ReadLe(v, 8); }
  bool ReadBytes(size_t n, absl::Span<const uint8_t>* out) {
    if (remaining() < n) return false;
    *out = in_.subspan(pos_, n);
    pos_ += n;
    return true;
  }

 private:
  template <typename T>
  bool ReadLe(T* v, size_t n) {
    if (remaining() < n) return false;
    uint64_t x = 0;
    for (size_t i = 0; i < n; ++i) x |= static_cast<uint64_t>(in_[pos_ + i]) << (8 * i);
    pos_ += n;
    *v = static_cast<T>(x);
    return true;
  }
  absl::Span<const uint8_t> in_;
  size_t pos_ = 0;
};

void PutLe(uint8_t* out, uint64_t v, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<uint8_t>(v >> (8 * i));
}

absl::Status Truncated(absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("truncated ", what, " frame"));
}

}  // namespace

absl::StatusOr<PacketHeader> ParseHeader(absl::Span<const uint8_t> datagram) {
  if (datagram.size() < kPacketOverhead + 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("datagram of ", datagram.size(), " bytes is shorter than a packet"));
  }
  const uint8_t flags = datagram[0];
  if ((flags & ~kHeaderKeyPhaseBit) != kHeaderFixedBits) {
    return absl::InvalidArgumentError(absl::StrCat("unknown header flags 0x", absl::Hex(flags)));
  }
  Reader r(datagram.subspan(1, kHeaderSize - 1));
  PacketHeader h;
  r.ReadU64(&h.connection_id);
  r.ReadU64(&h.packet_number);
  h.key_phase = (flags & kHeaderKeyPhaseBit) != 0;
  return h;
}

void WriteHeader(const PacketHeader& header, absl::Span<uint8_t> out) {
  out[0] = kHeaderFixedBits | (header.key_phase ? kHeaderKeyPhaseBit : 0);
  PutLe(&out[1], header.connection_id, 8);
  PutLe(&out[9], header.packet_number, 8);
}

absl::Status ParseFrames(absl::Span<const uint8_t> payload, FrameVisitor& visitor) {
  if (payload.empty()) return absl::InvalidArgumentError("packet has no frames");
  Reader r(payload);
  while (r.remaining() > 0) {
    uint8_t type;
    r.ReadU8(&type);
    absl::Status status;
    switch (static_cast<FrameType>(type)) {
      case FrameType::kPadding:
        break;
      case FrameType::kPing:
        status = visitor.OnPing();
        break;
      case FrameType::kAck: {
        AckFrame ack;
        uint64_t largest;
        uint32_t delay, first_length;
        uint8_t count;
        if (!r.ReadU64(&largest) || !r.ReadU32(&delay) || !r.ReadU8(&count) ||
            !r.ReadU32(&first_length)) {
          return Truncated("ACK");
        }
        if (count == 0 || count > kMaxAckRanges) {
          return absl::InvalidArgumentError(absl::StrCat("ACK with ", count, " ranges"));
        }
        if (first_length > largest) return absl::InvalidArgumentError("ACK range below zero");
        ack.ack_delay_us = delay;
        ack.ranges[0] = {largest - first_length, largest};
        for (size_t i = 1; i < count; ++i) {
          uint32_t gap, length;
          if (!r.ReadU32(&gap) || !r.ReadU32(&length)) return Truncated("ACK");
          const uint64_t prev_smallest = ack.ranges[i - 1].smallest;
          // This range's largest is prev_smallest - gap - 2 (at least one
          // unacknowledged packet between ranges).
          if (prev_smallest < uint64_t{gap} + 2 + length) {
            return absl::InvalidArgumentError("ACK range below zero");
          }
          const uint64_t hi = prev_smallest - gap - 2;
          ack.ranges[i] = {hi - length, hi};
        }
        ack.range_count = count;
        status = visitor.OnAck(ack);
        break;
      }
      case FrameType::kStream: {
        StreamFrame frame;
        uint16_t length;
        if (!r.ReadU64(&frame.offset) || !r.ReadU16(&length)) return Truncated("STREAM");
        if (length == 0) return absl::InvalidArgumentError("empty STREAM frame");
        if (frame.offset >= kMaxStreamOffset || kMaxStreamOffset - frame.offset < length) {
          return absl::InvalidArgumentError("STREAM frame beyond the largest stream offset");
        }
        if (!r.ReadBytes(length, &frame.data)) return Truncated("STREAM");
        status = visitor.OnStream(frame);
        break;
      }
      case FrameType::kMaxData: {
        uint64_t max_data;
        if (!r.ReadU64(&max_data)) return Truncated("MAX_DATA");
        if (max_data > kMaxStreamOffset) {
          return absl::InvalidArgumentError("MAX_DATA beyond the largest stream offset");
        }
        status = visitor.OnMaxData(max_data);
        break;
      }
      case FrameType::kClose: {
        CloseFrame frame;
        uint16_t length;
        absl::Span<const uint8_t> reason;
        if (!r.ReadU16(&frame.code) || !r.ReadU16(&length)) return Truncated("CLOSE");
        if (length > kMaxCloseReason) {
          return absl::InvalidArgumentError(absl::StrCat("CLOSE reason of ", length, " bytes"));
        }
        if (!r.ReadBytes(length, &reason)) return Truncated("CLOSE");
        frame.reason = absl::string_view(reinterpret_cast<const char*>(reason.data()), reason.size());
        status = visitor.OnClose(frame);
        break;
      }
      default:
        return absl::InvalidArgumentError(absl::StrCat("unknown frame type 0x", absl::Hex(type)));
    }
    if (!status.ok()) return status;
  }
  return absl::OkStatus();
}

bool FindTrailingStream(absl::Span<const uint8_t> head, size_t payload_length,
                        TrailingStream* out) {
  if (head.size() > payload_length) return false;
  Reader r(head);
  while (r.remaining() > 0) {
    const size_t frame_start = head.size() - r.remaining();
    uint8_t type;
    r.ReadU8(&type);
    absl::Span<const uint8_t> skipped;
    switch (static_cast<FrameType>(type)) {
      case FrameType::kPadding:
      case FrameType::kPing:
        break;
      case FrameType::kAck: {
        // largest u64, ack_delay_us u32, range_count u8, first_range u32, then pairs.
        uint64_t largest;
        uint32_t delay, first;
        uint8_t count;
        if (!r.ReadU64(&largest) || !r.ReadU32(&delay) || !r.ReadU8(&count) || !r.ReadU32(&first) ||
            count == 0 || count > kMaxAckRanges ||
            !r.ReadBytes(size_t{8} * (count - 1), &skipped)) {
          return false;
        }
        break;
      }
      case FrameType::kMaxData:
        if (!r.ReadBytes(8, &skipped)) return false;
        break;
      case FrameType::kStream: {
        uint64_t offset;
        uint16_t length;
        if (!r.ReadU64(&offset) || !r.ReadU16(&length)) return false;
        const size_t data_start = head.size() - r.remaining();
        if (length == 0 || offset >= kMaxStreamOffset || kMaxStreamOffset - offset < length ||
            data_start + length != payload_length) {
          return false;
        }
        *out = {frame_start, data_start, offset, length};
        return true;
      }
      default:
        return false;
    }
  }
  return false;
}

size_t WritePing(absl::Span<uint8_t> out) {
  if (out.empty()) return 0;
  out[0] = static_cast<uint8_t>(FrameType::kPing);
  return 1;
}

size_t WritePadding(absl::Span<uint8_t> out, size_t n) {
  if (out.size() < n) return 0;
  std::memset(out.data(), 0, n);
  return n;
}

size_t AckFrameSize(const AckFrame& ack) { return 1 + 8 + 4 + 1 + 4 + 8 * (ack.range_count - 1); }

size_t WriteAck(const AckFrame& ack, absl::Span<uint8_t> out) {
  if (ack.range_count == 0 || ack.range_count > kMaxAckRanges) return 0;
  const size_t size = AckFrameSize(ack);
  if (out.size() < size) return 0;
  uint8_t* p = out.data();
  *p++ = static_cast<uint8_t>(FrameType::kAck);
  PutLe(p, ack.ranges[0].largest, 8);
  p += 8;
  PutLe(p, std::min<uint64_t>(ack.ack_delay_us, UINT32_MAX), 4);
  p += 4;
  *p++ = static_cast<uint8_t>(ack.range_count);
  PutLe(p, ack.ranges[0].largest - ack.ranges[0].smallest, 4);
  p += 4;
  for (size_t i = 1; i < ack.range_count; ++i) {
    PutLe(p, ack.ranges[i - 1].smallest - ack.ranges[i].largest - 2, 4);
    p += 4;
    PutLe(p, ack.ranges[i].largest - ack.ranges[i].smallest, 4);
    p += 4;
  }
  return size;
}

size_t WriteStreamHeader(uint64_t offset, uint16_t length, absl::Span<uint8_t> out) {
  if (out.size() < kStreamFrameHeaderSize + length) return 0;
  out[0] = static_cast<uint8_t>(FrameType::kStream);
  PutLe(&out[1], offset, 8);
  PutLe(&out[9], length, 2);
  return kStreamFrameHeaderSize;
}

size_t WriteMaxData(uint64_t max_data, absl::Span<uint8_t> out) {
  if (out.size() < kMaxDataFrameSize) return 0;
  out[0] = static_cast<uint8_t>(FrameType::kMaxData);
  PutLe(&out[1], max_data, 8);
  return kMaxDataFrameSize;
}

size_t WriteClose(uint16_t code, absl::string_view reason, absl::Span<uint8_t> out) {
  if (reason.size() > kMaxCloseReason) reason = reason.substr(0, kMaxCloseReason);
  const size_t size = 1 + 2 + 2 + reason.size();
  if (out.size() < size) return 0;
  out[0] = static_cast<uint8_t>(FrameType::kClose);
  PutLe(&out[1], code, 2);
  PutLe(&out[3], reason.size(), 2);
  if (!reason.empty()) std::memcpy(&out[5], reason.data(), reason.size());
  return size;
}

}  // namespace longhaul::transport::udp
