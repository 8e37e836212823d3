// libFuzzer target for the udp transport's packet parser (proto/UDP.md):
// the clear header, then the frame parser on the rest, as a receiver would
// run it after decryption. Anything is allowed to fail; nothing may crash,
// read out of bounds or hand a visitor a span outside the input.

#include <cstddef>
#include <cstdint>

#include "daemon/transport/udp_packet.h"

namespace {

using namespace longhaul::transport::udp;

class Checker final : public FrameVisitor {
 public:
  Checker(const uint8_t* begin, const uint8_t* end) : begin_(begin), end_(end) {}
  absl::Status OnAck(const AckFrame& ack) override {
    if (ack.range_count == 0 || ack.range_count > kMaxAckRanges) __builtin_trap();
    for (size_t i = 0; i < ack.range_count; ++i) {
      if (ack.ranges[i].smallest > ack.ranges[i].largest) __builtin_trap();
      if (i > 0 && ack.ranges[i].largest + 1 >= ack.ranges[i - 1].smallest) __builtin_trap();
    }
    // Round trip: what we parsed encodes to something that parses the same.
    uint8_t buf[1 + 8 + 4 + 1 + 4 + 8 * kMaxAckRanges];
    if (WriteAck(ack, absl::MakeSpan(buf)) != AckFrameSize(ack)) __builtin_trap();
    return absl::OkStatus();
  }
  absl::Status OnStream(const StreamFrame& frame) override {
    if (frame.data.empty() || frame.data.data() < begin_ || frame.data.data() + frame.data.size() > end_) {
      __builtin_trap();
    }
    if (frame.offset + frame.data.size() > kMaxStreamOffset) __builtin_trap();
    return absl::OkStatus();
  }
  absl::Status OnMaxData(uint64_t max_data) override {
    if (max_data > kMaxStreamOffset) __builtin_trap();
    return absl::OkStatus();
  }
  absl::Status OnClose(const CloseFrame& frame) override {
    if (frame.reason.size() > kMaxCloseReason) __builtin_trap();
    return absl::OkStatus();
  }

 private:
  const uint8_t* begin_;
  const uint8_t* end_;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  absl::Span<const uint8_t> input(data, size);
  (void)ParseHeader(input);
  Checker checker(data, data + size);
  (void)ParseFrames(input, checker);
  if (size > kHeaderSize) {
    Checker tail_checker(data + kHeaderSize, data + size);
    (void)ParseFrames(input.subspan(kHeaderSize), tail_checker);
  }
  return 0;
}
