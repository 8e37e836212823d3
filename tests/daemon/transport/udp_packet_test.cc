#include "daemon/transport/udp_packet.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace longhaul::transport::udp {
namespace {

// Records every frame it sees.
class Recorder : public FrameVisitor {
 public:
  absl::Status OnPing() override {
    ++pings;
    return absl::OkStatus();
  }
  absl::Status OnAck(const AckFrame& ack) override {
    acks.push_back(ack);
    return absl::OkStatus();
  }
  absl::Status OnStream(const StreamFrame& frame) override {
    streams.emplace_back(frame.offset, std::string(frame.data.begin(), frame.data.end()));
    return absl::OkStatus();
  }
  absl::Status OnMaxData(uint64_t max_data) override {
    max_datas.push_back(max_data);
    return absl::OkStatus();
  }
  absl::Status OnClose(const CloseFrame& frame) override {
    closes.emplace_back(frame.code, std::string(frame.reason));
    return absl::OkStatus();
  }
  int pings = 0;
  std::vector<AckFrame> acks;
  std::vector<std::pair<uint64_t, std::string>> streams;
  std::vector<uint64_t> max_datas;
  std::vector<std::pair<uint16_t, std::string>> closes;
};

absl::Status Parse(const std::vector<uint8_t>& bytes) {
  Recorder r;
  return ParseFrames(bytes, r);
}

TEST(UdpPacketTest, HeaderRoundTrip) {
  std::vector<uint8_t> datagram(kPacketOverhead + 1);
  WriteHeader({0x1122334455667788ull, 0xabcdef0123ull, true}, absl::MakeSpan(datagram));
  auto h = ParseHeader(datagram);
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(h->connection_id, 0x1122334455667788ull);
  EXPECT_EQ(h->packet_number, 0xabcdef0123ull);
  EXPECT_TRUE(h->key_phase);
}

TEST(UdpPacketTest, HeaderRejectsShortDatagramAndUnknownFlags) {
  std::vector<uint8_t> datagram(kPacketOverhead);  // no room for a frame
  WriteHeader({1, 1, false}, absl::MakeSpan(datagram));
  EXPECT_FALSE(ParseHeader(datagram).ok());
  datagram.resize(kPacketOverhead + 1);
  for (uint8_t flags : {0x00, 0x80, 0x42, 0xc0, 0x7f}) {
    datagram[0] = flags;
    EXPECT_FALSE(ParseHeader(datagram).ok()) << int{flags};
  }
  datagram[0] = 0x41;
  EXPECT_TRUE(ParseHeader(datagram).ok());
}

TEST(UdpPacketTest, FramesRoundTrip) {
  std::vector<uint8_t> buf(2000);
  absl::Span<uint8_t> out(buf);
  size_t n = 0;
  AckFrame ack;
  ack.ack_delay_us = 1234;
  ack.range_count = 3;
  ack.ranges[0] = {90, 100};
  ack.ranges[1] = {50, 80};
  ack.ranges[2] = {7, 7};
  n += WriteAck(ack, out.subspan(n));
  n += WritePing(out.subspan(n));
  const std::string data = "hello, long haul";
  size_t h = WriteStreamHeader(1ull << 40, static_cast<uint16_t>(data.size()), out.subspan(n));
  ASSERT_EQ(h, kStreamFrameHeaderSize);
  std::copy(data.begin(), data.end(), buf.begin() + n + h);
  n += h + data.size();
  n += WriteMaxData(99999, out.subspan(n));
  n += WritePadding(out.subspan(n), 3);
  n += WriteClose(kCloseAborted, "stopped by operator", out.subspan(n));
  buf.resize(n);

  Recorder r;
  ASSERT_TRUE(ParseFrames(buf, r).ok());
  ASSERT_EQ(r.acks.size(), 1u);
  EXPECT_EQ(r.acks[0].ack_delay_us, 1234u);
  ASSERT_EQ(r.acks[0].range_count, 3u);
  EXPECT_EQ(r.acks[0].ranges[0].smallest, 90u);
  EXPECT_EQ(r.acks[0].ranges[0].largest, 100u);
  EXPECT_EQ(r.acks[0].ranges[1].smallest, 50u);
  EXPECT_EQ(r.acks[0].ranges[1].largest, 80u);
  EXPECT_EQ(r.acks[0].ranges[2].smallest, 7u);
  EXPECT_EQ(r.acks[0].ranges[2].largest, 7u);
  EXPECT_EQ(r.pings, 1);
  ASSERT_EQ(r.streams.size(), 1u);
  EXPECT_EQ(r.streams[0].first, 1ull << 40);
  EXPECT_EQ(r.streams[0].second, data);
  EXPECT_EQ(r.max_datas, std::vector<uint64_t>{99999});
  ASSERT_EQ(r.closes.size(), 1u);
  EXPECT_EQ(r.closes[0].first, kCloseAborted);
  EXPECT_EQ(r.closes[0].second, "stopped by operator");
}

TEST(UdpPacketTest, WritersRefuseTooSmallBuffers) {
  std::vector<uint8_t> buf(4);
  AckFrame ack;
  ack.range_count = 1;
  EXPECT_EQ(WriteAck(ack, absl::MakeSpan(buf)), 0u);
  EXPECT_EQ(WriteStreamHeader(0, 10, absl::MakeSpan(buf)), 0u);
  EXPECT_EQ(WriteMaxData(1, absl::MakeSpan(buf)), 0u);
  EXPECT_EQ(WriteClose(0, "reason", absl::MakeSpan(buf)), 0u);
  EXPECT_EQ(WritePing(absl::Span<uint8_t>()), 0u);
}

// Every prefix of a valid frame is a truncated frame, and must be refused.
TEST(UdpPacketTest, EveryTruncationIsRejected) {
  std::vector<uint8_t> buf(200);
  AckFrame ack;
  ack.range_count = 2;
  ack.ranges[0] = {10, 20};
  ack.ranges[1] = {1, 5};
  std::vector<std::vector<uint8_t>> frames;
  auto take = [&](size_t n) { frames.emplace_back(buf.begin(), buf.begin() + n); };
  take(WriteAck(ack, absl::MakeSpan(buf)));
  size_t h = WriteStreamHeader(5, 4, absl::MakeSpan(buf));
  take(h + 4);
  take(WriteMaxData(7, absl::MakeSpan(buf)));
  take(WriteClose(2, "bye", absl::MakeSpan(buf)));
  for (const auto& frame : frames) {
    EXPECT_TRUE(Parse(frame).ok());
    for (size_t len = 1; len < frame.size(); ++len) {
      std::vector<uint8_t> cut(frame.begin(), frame.begin() + len);
      EXPECT_FALSE(Parse(cut).ok()) << "type " << int{frame[0]} << " cut at " << len;
    }
  }
}

std::vector<uint8_t> RawAck(uint64_t largest, uint8_t count, uint32_t first,
                            std::vector<std::pair<uint32_t, uint32_t>> more) {
  std::vector<uint8_t> b = {static_cast<uint8_t>(FrameType::kAck)};
  auto put = [&](uint64_t v, int n) {
    for (int i = 0; i < n; ++i) b.push_back(static_cast<uint8_t>(v >> (8 * i)));
  };
  put(largest, 8);
  put(0, 4);
  b.push_back(count);
  put(first, 4);
  for (auto [gap, len] : more) {
    put(gap, 4);
    put(len, 4);
  }
  return b;
}

TEST(UdpPacketTest, MalformedAcksAreRejected) {
  EXPECT_TRUE(Parse(RawAck(10, 1, 10, {})).ok());
  EXPECT_FALSE(Parse(RawAck(10, 0, 0, {})).ok());                 // no ranges
  EXPECT_FALSE(Parse(RawAck(10, 33, 0, {})).ok());                // too many ranges
  EXPECT_FALSE(Parse(RawAck(10, 1, 11, {})).ok());                // first range below zero
  EXPECT_TRUE(Parse(RawAck(10, 2, 2, {{0, 6}})).ok());            // [8,10] then [0,6]
  EXPECT_FALSE(Parse(RawAck(10, 2, 2, {{0, 7}})).ok());           // second range below zero
  EXPECT_FALSE(Parse(RawAck(10, 2, 2, {{7, 0}})).ok());           // gap below zero
  EXPECT_FALSE(Parse(RawAck(10, 2, 2, {{0xffffffff, 0}})).ok());  // huge gap
}

TEST(UdpPacketTest, MalformedFramesAreRejected) {
  EXPECT_FALSE(Parse({}).ok());                  // no frames
  EXPECT_FALSE(Parse({0x06}).ok());              // unknown type
  EXPECT_FALSE(Parse({0xff}).ok());
  // STREAM with length 0.
  EXPECT_FALSE(Parse({0x03, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}).ok());
  // STREAM at offset 2^62.
  EXPECT_FALSE(Parse({0x03, 0, 0, 0, 0, 0, 0, 0, 0x40, 1, 0, 0xaa}).ok());
  // STREAM whose length runs past the packet.
  EXPECT_FALSE(Parse({0x03, 0, 0, 0, 0, 0, 0, 0, 0, 5, 0, 1, 2}).ok());
  // MAX_DATA beyond 2^62.
  EXPECT_FALSE(Parse({0x04, 0, 0, 0, 0, 0, 0, 0, 0x80}).ok());
  // CLOSE with a reason longer than allowed.
  std::vector<uint8_t> close = {0x05, 0, 0, 0x01, 0x02};  // 513 bytes
  close.resize(close.size() + 513, 'x');
  EXPECT_FALSE(Parse(close).ok());
  // Padding alone is fine.
  EXPECT_TRUE(Parse({0, 0, 0}).ok());
}

TEST(UdpPacketTest, VisitorErrorStopsTheParse) {
  class Refuser : public Recorder {
    absl::Status OnMaxData(uint64_t) override { return absl::InvalidArgumentError("no"); }
  } r;
  std::vector<uint8_t> buf(20);
  size_t n = WriteMaxData(1, absl::MakeSpan(buf));
  n += WritePing(absl::MakeSpan(buf).subspan(n));
  buf.resize(n);
  EXPECT_FALSE(ParseFrames(buf, r).ok());
  EXPECT_EQ(r.pings, 0);
}

TEST(UdpPacketTest, FindTrailingStreamSkipsLeadingFramesBySize) {
  std::vector<uint8_t> payload(2000);
  absl::Span<uint8_t> out(payload);
  AckFrame ack;
  ack.range_count = 3;
  ack.ranges[0] = {90, 100};
  ack.ranges[1] = {50, 80};
  ack.ranges[2] = {10, 20};
  size_t used = WriteAck(ack, out);
  used += WriteMaxData(1 << 20, out.subspan(used));
  used += WritePing(out.subspan(used));
  used += WritePadding(out.subspan(used), 3);
  const size_t frame_start = used;
  const size_t data = 1500;
  used += WriteStreamHeader(4096, data, out.subspan(used));
  const size_t length = used + data;
  TrailingStream found;
  ASSERT_TRUE(FindTrailingStream(absl::MakeConstSpan(payload).subspan(0, 384), length, &found));
  EXPECT_EQ(found.frame_start, frame_start);
  EXPECT_EQ(found.data_start, frame_start + kStreamFrameHeaderSize);
  EXPECT_EQ(found.offset, 4096u);
  EXPECT_EQ(found.length, data);
  // ParseFrames agrees on the whole payload.
  Recorder r;
  ASSERT_TRUE(ParseFrames(absl::MakeConstSpan(payload).subspan(0, length), r).ok());
  ASSERT_EQ(r.streams.size(), 1u);
  EXPECT_EQ(r.streams[0].first, 4096u);

  // Not a trailing frame (the payload goes on past its data), a head that ends inside the
  // STREAM header, or a head longer than the payload.
  EXPECT_FALSE(
      FindTrailingStream(absl::MakeConstSpan(payload).subspan(0, 384), length + 1, &found));
  EXPECT_FALSE(
      FindTrailingStream(absl::MakeConstSpan(payload).subspan(0, frame_start + 5), length, &found));
  EXPECT_FALSE(FindTrailingStream(absl::MakeConstSpan(payload).subspan(0, 384), 100, &found));
}

TEST(UdpPacketTest, FindTrailingStreamRefusesWhatItCannotSkip) {
  std::vector<uint8_t> payload(600, 0);
  absl::Span<uint8_t> out(payload);
  // A CLOSE before the data: its length is not skipped, so no placement.
  size_t used = WriteClose(kCloseNoError, "bye", out);
  used += WriteStreamHeader(0, 10, out.subspan(used));
  TrailingStream found;
  EXPECT_FALSE(
      FindTrailingStream(absl::MakeConstSpan(payload).subspan(0, used), used + 10, &found));
  // An unknown frame type, an ACK with no ranges, an empty STREAM frame.
  payload.assign(600, 0);
  payload[0] = 0x7f;
  EXPECT_FALSE(FindTrailingStream(absl::MakeConstSpan(payload).subspan(0, 100), 100, &found));
  payload.assign(600, 0);
  payload[0] = static_cast<uint8_t>(FrameType::kAck);  // range_count at byte 13 stays 0
  EXPECT_FALSE(FindTrailingStream(absl::MakeConstSpan(payload).subspan(0, 100), 100, &found));
  payload.assign(600, 0);
  payload[0] = static_cast<uint8_t>(FrameType::kStream);  // length 0
  EXPECT_FALSE(FindTrailingStream(absl::MakeConstSpan(payload).subspan(0, 11), 11, &found));
  // All padding: no STREAM frame at all.
  payload.assign(600, 0);
  EXPECT_FALSE(FindTrailingStream(absl::MakeConstSpan(payload).subspan(0, 384), 600, &found));
}

}  // namespace
}  // namespace longhaul::transport::udp
