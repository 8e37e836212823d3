// The exchange link reader without sockets: segment checks (SegmentTracker)
// and ReadPeerMessages over frames held in memory.

#include "daemon/exchange/peer_reader.h"

#include <map>
#include <string>
#include <vector>

#include "daemon/exchange/exchange_types.h"
#include "daemon/peer/messaging.h"
#include "daemon/wire/frames.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/test_tools/fake_channel.h"

namespace longhaul::exchange {
namespace {

using ::testing::HasSubstr;
using Msg = v1::ExchangePeerMessage;
using Step = SegmentTracker::Step;

Msg Segment(uint64_t msg_id, uint64_t offset, uint64_t n, uint64_t total) {
  Msg h;
  h.set_kind(Msg::P2P);
  h.set_group("g");
  h.set_tag("t");
  h.set_msg_id(msg_id);
  h.set_offset(offset);
  h.set_payload_bytes(n);
  h.set_total_bytes(total);
  return h;
}

TEST(SegmentTrackerTest, FollowsAMessageFromItsFirstSegmentToItsLast) {
  SegmentTracker t("site-b", 1 << 20);
  EXPECT_EQ(*t.OnHeader(Segment(1, 0, 10, 25)), Step::kFirst);
  EXPECT_EQ(t.open_messages(), 1u);
  EXPECT_EQ(*t.OnHeader(Segment(1, 10, 10, 25)), Step::kNext);
  EXPECT_EQ(*t.OnHeader(Segment(1, 20, 5, 25)), Step::kNext);
  EXPECT_EQ(t.open_messages(), 0u);
  // The id may start a new message once the old one ended.
  EXPECT_EQ(*t.OnHeader(Segment(1, 0, 5, 5)), Step::kFirst);
}

TEST(SegmentTrackerTest, MessagesWithoutPayloadAndDiscards) {
  SegmentTracker t("site-b", 1 << 20);
  Msg done;
  done.set_kind(Msg::DONE);
  EXPECT_EQ(*t.OnHeader(done), Step::kMessage);
  ASSERT_EQ(*t.OnHeader(Segment(7, 0, 10, 30)), Step::kFirst);
  Msg discard;
  discard.set_kind(Msg::DISCARD);
  discard.set_msg_id(7);
  EXPECT_EQ(*t.OnHeader(discard), Step::kDiscard);
  EXPECT_EQ(t.open_messages(), 0u);
  // After a DISCARD the message is gone: a later segment of it never started.
  EXPECT_FALSE(t.OnHeader(Segment(7, 10, 10, 30)).ok());
}

TEST(SegmentTrackerTest, RefusesSegmentsOutsideTheRules) {
  SegmentTracker t("site-b", 1 << 20);
  auto refused = [&](const Msg& h, const char* why) {
    auto s = t.OnHeader(h);
    ASSERT_FALSE(s.ok()) << why;
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(s.status().message()), HasSubstr("site-b")) << why;
  };
  refused(Segment(1, 0, 0, 10), "empty");
  refused(Segment(1, 0, kSegmentBytes + 1, 8 * kSegmentBytes), "over a segment");
  refused(Segment(1, 0, 10, (1 << 20) + 1), "over the message limit");
  refused(Segment(1, 0, 11, 10), "past the total");
  refused(Segment(1, 11, 1, 10), "offset past the total");
  refused(Segment(1, 5, 5, 10), "never started");
  ASSERT_EQ(*t.OnHeader(Segment(2, 0, 5, 20)), Step::kFirst);
  refused(Segment(2, 10, 5, 20), "a gap");
  refused(Segment(2, 5, 5, 30), "another total");
}

// A link from site-b on which the given messages arrive, each followed by
// its payload, and then site-b's close.
class InboundLink {
 public:
  void Add(const Msg& h, const std::string& payload = "") {
    std::string body = h.SerializeAsString();
    std::array<uint8_t, wire::kFrameHeaderSize> header;
    wire::EncodeFrameHeader({wire::FrameType::kControl, static_cast<uint32_t>(body.size()), 0},
                            header);
    auto bytes = [](const std::string& s) {
      return absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(s.data()), s.size());
    };
    ASSERT_TRUE(pair_.b->Write({absl::MakeConstSpan(header), bytes(body), bytes(payload)}).ok());
  }
  // The receiving end, once everything was added.
  transport::Channel& Closed() {
    pair_.b->Close();
    return *pair_.a;
  }

 private:
  transport::testing::ChannelPair pair_ = transport::testing::MakeChannelPair("site-b", "site-a");
};

// Assembles what arrives, reading at most 3 bytes at a time.
class RecordingSink final : public InboundSink {
 public:
  struct In : Incoming {
    uint64_t id = 0;
    std::string bytes;
    char piece[3];
  };
  void OnMessage(const std::string& from, const Msg& h) override {
    events.push_back(absl::StrCat("message ", Msg::Kind_Name(h.kind()), " from ", from));
  }
  std::unique_ptr<Incoming> Begin(const std::string& from, const Msg& h) override {
    auto in = std::make_unique<In>();
    in->id = h.msg_id();
    events.push_back(absl::StrCat("begin ", h.msg_id()));
    return in;
  }
  std::optional<absl::Span<uint8_t>> Into(Incoming& in, uint64_t received, uint64_t end,
                                          transport::Channel&) override {
    auto& i = static_cast<In&>(in);
    return absl::MakeSpan(reinterpret_cast<uint8_t*>(i.piece),
                          std::min<uint64_t>(sizeof i.piece, end - received));
  }
  void Read(Incoming& in, uint64_t bytes, bool ok) override {
    auto& i = static_cast<In&>(in);
    if (ok) i.bytes.append(i.piece, bytes);
  }
  void Complete(const std::string& from, std::unique_ptr<Incoming> in) override {
    auto& i = static_cast<In&>(*in);
    events.push_back(absl::StrCat("complete ", i.id, " '", i.bytes, "'"));
  }
  void Abandon(std::unique_ptr<Incoming> in) override {
    auto& i = static_cast<In&>(*in);
    events.push_back(absl::StrCat("abandon ", i.id, " '", i.bytes, "'"));
  }
  std::vector<std::string> events;
};

TEST(ReadPeerMessagesTest, InterleavedSegmentsDiscardsAndTheLinksEnd) {
  InboundLink link;
  Msg join;
  join.set_kind(Msg::JOIN);
  link.Add(join);
  link.Add(Segment(1, 0, 5, 11), "hello");
  link.Add(Segment(2, 0, 4, 4), "abcd");
  link.Add(Segment(1, 5, 6, 11), " world");
  link.Add(Segment(3, 0, 2, 9), "xy");
  Msg discard;
  discard.set_kind(Msg::DISCARD);
  discard.set_msg_id(3);
  link.Add(discard);
  link.Add(Segment(4, 0, 3, 8), "par");
  RecordingSink sink;
  absl::Status s = ReadPeerMessages(link.Closed(), 1 << 20, sink);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(sink.events,
              ::testing::ElementsAre("message JOIN from site-b", "begin 1", "begin 2",
                                     "complete 2 'abcd'", "complete 1 'hello world'", "begin 3",
                                     "abandon 3 'xy'", "begin 4", "abandon 4 'par'"));
}

TEST(ReadPeerMessagesTest, AMalformedSegmentEndsTheReadAndAbandonsWhatWasOpen) {
  InboundLink link;
  link.Add(Segment(1, 0, 2, 6), "ab");
  link.Add(Segment(1, 4, 2, 6), "ef");  // skips bytes 2..4
  RecordingSink sink;
  absl::Status s = ReadPeerMessages(link.Closed(), 1 << 20, sink);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("out of order"));
  EXPECT_THAT(sink.events, ::testing::ElementsAre("begin 1", "abandon 1 'ab'"));
}

TEST(ReadPeerMessagesTest, AHeaderPastItsCeilingEndsTheReadBeforeItIsRead) {
  Msg join;
  join.set_kind(Msg::JOIN);
  for (int i = 0; i < 20; ++i) join.add_members(std::string(64 << 10, 'a' + i));
  ASSERT_GT(join.ByteSizeLong(), kMaxPeerHeaderBytes);
  InboundLink link;
  link.Add(join);
  RecordingSink sink;
  absl::Status s = ReadPeerMessages(link.Closed(), 1 << 20, sink);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("site-b"));
  EXPECT_THAT(std::string(s.message()), HasSubstr(std::to_string(kMaxPeerHeaderBytes)));
  EXPECT_TRUE(sink.events.empty());
}

}  // namespace
}  // namespace longhaul::exchange
