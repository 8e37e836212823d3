// Frames on a channel: the growing reader holds only what arrived, and
// ReadProto refuses a payload over its type's ceiling before reading any.
#include "daemon/peer/messaging.h"

#include <algorithm>
#include <string>
#include <thread>
#include <vector>

#include "daemon/wire/frames.h"
#include "daemon/wire/messaging.h"
#include "gtest/gtest.h"
#include "tests/test_tools/fake_channel.h"

namespace longhaul::peer {
namespace {

using transport::testing::FakeChannel;
using transport::testing::MakeChannelPair;

// The receiving end of a channel whose peer wrote `bytes` and closed it.
std::unique_ptr<FakeChannel> Serving(const std::vector<uint8_t>& bytes) {
  transport::testing::ChannelPair pair = MakeChannelPair("site-a", "site-c");
  EXPECT_TRUE(pair.a->Write({absl::MakeConstSpan(bytes)}).ok());
  return std::move(pair.b);
}

std::vector<uint8_t> Pattern(size_t n) {
  std::vector<uint8_t> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<uint8_t>(i * 131 + 7);
  return out;
}

std::vector<uint8_t> Header(wire::FrameType type, uint32_t payload_length,
                            uint64_t session_id = 0) {
  std::array<uint8_t, wire::kFrameHeaderSize> header;
  wire::EncodeFrameHeader({type, payload_length, session_id}, header);
  return {header.begin(), header.end()};
}

TEST(GrowingBufferTest, ReadsInPiecesAndGrowsOnlyWithWhatArrived) {
  const size_t length = 5 * wire::kReadPiece + 123;
  const std::vector<uint8_t> bytes = Pattern(length);
  std::unique_ptr<FakeChannel> channel = Serving(bytes);
  wire::GrowingBuffer buffer;
  size_t capacity = 0;
  absl::Status s = buffer.Read(*channel, length, [&](size_t added) {
    // Grows only once what arrived fills it: at most twice that, or a piece.
    EXPECT_EQ(channel->bytes_read(), capacity);
    capacity += added;
    EXPECT_LE(capacity, std::max(wire::kReadPiece, 2 * channel->bytes_read()));
    EXPECT_LE(capacity, length);
    return absl::OkStatus();
  });
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(buffer.capacity(), capacity);
  EXPECT_TRUE(std::equal(bytes.begin(), bytes.end(), buffer.data().begin(), buffer.data().end()));
  for (size_t n : channel->read_sizes()) EXPECT_LE(n, wire::kReadPiece);
}

TEST(GrowingBufferTest, AHugeDeclaredLengthWithLittleSentHoldsLittle) {
  std::unique_ptr<FakeChannel> channel = Serving(Pattern(100 << 10));
  wire::GrowingBuffer buffer;
  absl::Status s = buffer.Read(*channel, size_t{200} << 20);
  EXPECT_TRUE(absl::IsUnavailable(s)) << s;
  EXPECT_LE(buffer.capacity(), size_t{256} << 10);
  EXPECT_TRUE(buffer.data().empty());
}

TEST(GrowingBufferTest, ARefusedGrowthEndsTheReadWithItsError) {
  std::unique_ptr<FakeChannel> channel = Serving(Pattern(4 * wire::kReadPiece));
  wire::GrowingBuffer buffer;
  absl::Status s = buffer.Read(*channel, 4 * wire::kReadPiece, [&](size_t added) {
    if (buffer.capacity() + added > 2 * wire::kReadPiece)
      return absl::ResourceExhaustedError("budget");
    return absl::OkStatus();
  });
  EXPECT_TRUE(absl::IsResourceExhausted(s)) << s;
  EXPECT_EQ(buffer.capacity(), 2 * wire::kReadPiece);
  EXPECT_EQ(channel->bytes_read(), 2 * wire::kReadPiece);
}

TEST(GrowingBufferTest, KeepsItsStorageForTheNextReadOfNoMore) {
  const std::vector<uint8_t> first = Pattern(3 * wire::kReadPiece);
  std::vector<uint8_t> both = first;
  both.insert(both.end(), first.rbegin(), first.rend());
  std::unique_ptr<FakeChannel> channel = Serving(both);
  wire::GrowingBuffer buffer;
  ASSERT_TRUE(buffer.Read(*channel, first.size()).ok());
  const size_t capacity = buffer.capacity();
  int growths = 0;
  ASSERT_TRUE(buffer
                  .Read(*channel, first.size(),
                        [&](size_t) {
                          ++growths;
                          return absl::OkStatus();
                        })
                  .ok());
  EXPECT_EQ(growths, 0);
  EXPECT_EQ(buffer.capacity(), capacity);
  EXPECT_TRUE(std::equal(first.rbegin(), first.rend(), buffer.data().begin(), buffer.data().end()));
  buffer.Release();
  EXPECT_EQ(buffer.capacity(), 0u);
}

TEST(ReadProtoTest, AHelloOverItsCeilingIsRefusedBeforeAnyPayloadIsRead) {
  std::vector<uint8_t> bytes = Header(wire::FrameType::kHello, wire::kMaxHelloPayload + 1);
  const std::vector<uint8_t> payload = Pattern(64 << 10);
  bytes.insert(bytes.end(), payload.begin(), payload.end());
  std::unique_ptr<FakeChannel> channel = Serving(bytes);
  v1::Hello hello;
  absl::Status s = wire::ReadProto(*channel, wire::FrameType::kHello, 0, &hello);
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_NE(s.message().find("HELLO"), std::string::npos) << s;
  EXPECT_NE(s.message().find(std::to_string(wire::kMaxHelloPayload)), std::string::npos) << s;
  EXPECT_EQ(channel->bytes_read(), wire::kFrameHeaderSize);
}

TEST(ReadProtoTest, AControlMessageOverItsCeilingIsRefused) {
  std::unique_ptr<FakeChannel> channel =
      Serving(Header(wire::FrameType::kControl, wire::kMaxControlPayload + 1));
  v1::PeerMessage message;
  absl::Status s = wire::ReadProto(*channel, wire::FrameType::kControl, 0, &message);
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_NE(s.message().find(std::to_string(wire::kMaxControlPayload)), std::string::npos) << s;
}

TEST(ReadProtoTest, AHeaderDeclaringMoreThanIsSentHoldsOnlyWhatArrived) {
  std::vector<uint8_t> bytes = Header(wire::FrameType::kControl, 100u << 20);
  const std::vector<uint8_t> payload = Pattern(96 << 10);
  bytes.insert(bytes.end(), payload.begin(), payload.end());
  std::unique_ptr<FakeChannel> channel = Serving(bytes);
  v1::PeerMessage message;
  size_t charged = 0;
  absl::Status s =
      wire::ReadProto(*channel, wire::FrameType::kControl, 0, &message, [&](size_t added) {
        charged += added;
        return absl::OkStatus();
      });
  EXPECT_TRUE(absl::IsUnavailable(s)) << s;
  EXPECT_LE(charged, size_t{2} * wire::kReadPiece);
}

TEST(ReadProtoTest, ReadsWhatSendProtoWrote) {
  transport::testing::ChannelPair pair = MakeChannelPair("site-a", "site-c");
  v1::PeerMessage sent;
  sent.set_request_id(42);
  v1::Manifest* manifest = sent.mutable_open()->mutable_manifest();
  for (int i = 0; i < 20000; ++i) manifest->add_files()->set_path("shard-" + std::to_string(i));
  ASSERT_GT(sent.ByteSizeLong(), 2 * wire::kReadPiece);
  ASSERT_TRUE(wire::SendProto(*pair.a, wire::FrameType::kControl, 9, sent).ok());
  v1::PeerMessage received;
  size_t charged = 0;
  ASSERT_TRUE(wire::ReadProto(*pair.b, wire::FrameType::kControl, 9, &received, [&](size_t added) {
                charged += added;
                return absl::OkStatus();
              }).ok());
  EXPECT_EQ(received.SerializeAsString(), sent.SerializeAsString());
  EXPECT_EQ(charged, sent.ByteSizeLong());
}

TEST(ReadProtoTest, ACallersLowerCeilingRefusesBeforeAnyPayloadIsReadNamingThePeer) {
  constexpr uint32_t kCeiling = 64u << 10;
  std::vector<uint8_t> bytes = Header(wire::FrameType::kControl, kCeiling + 1);
  const std::vector<uint8_t> payload = Pattern(kCeiling + 1);
  bytes.insert(bytes.end(), payload.begin(), payload.end());
  std::unique_ptr<FakeChannel> channel = Serving(bytes);
  v1::PeerMessage message;
  absl::Status s = wire::ReadProto(*channel, wire::FrameType::kControl, 0, kCeiling, &message);
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_NE(s.message().find("site-c"), std::string::npos) << s;
  EXPECT_NE(s.message().find(std::to_string(kCeiling)), std::string::npos) << s;
  EXPECT_EQ(channel->bytes_read(), wire::kFrameHeaderSize);
}

TEST(ReadProtoTest, ACallerCannotRaiseItsTypesCeiling) {
  std::unique_ptr<FakeChannel> channel =
      Serving(Header(wire::FrameType::kHello, wire::kMaxHelloPayload + 1));
  v1::Hello hello;
  absl::Status s =
      wire::ReadProto(*channel, wire::FrameType::kHello, 0, wire::kMaxControlPayload, &hello);
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_NE(s.message().find(std::to_string(wire::kMaxHelloPayload)), std::string::npos) << s;
}

// The peer site-b answers every request with `answer` (its request id set).
class AnsweringPeer {
 public:
  explicit AnsweringPeer(v1::PeerMessage answer) : answer_(std::move(answer)) {
    thread_ = std::thread([this] {
      v1::PeerMessage request;
      while (wire::ReadProto(*pair_.b, wire::FrameType::kControl, 0, &request).ok()) {
        answer_.set_request_id(request.request_id());
        if (!wire::SendProto(*pair_.b, wire::FrameType::kControl, 0, answer_).ok()) return;
      }
    });
  }
  ~AnsweringPeer() {
    pair_.a->Abort();
    thread_.join();
  }
  // This site's end: its peer is site-b.
  transport::Channel& channel() { return *pair_.a; }
  FakeChannel& end() { return *pair_.a; }

 private:
  transport::testing::ChannelPair pair_ = MakeChannelPair("site-b", "site-a");
  v1::PeerMessage answer_;
  std::thread thread_;
};

TEST(CallTest, AnAnswerPastTheCallersMaximumIsRefusedUnreadNamingThePeerAndTheLimit) {
  constexpr uint32_t kMaxAnswer = 64u << 10;
  v1::PeerMessage answer;
  answer.mutable_remote_reply()->mutable_status()->set_error(std::string(kMaxAnswer, 'x'));
  AnsweringPeer peer(answer);
  v1::PeerMessage request;
  request.mutable_remote_get()->set_transfer_id("t-1");
  absl::StatusOr<v1::PeerMessage> got = Call(peer.channel(), 0, request, kMaxAnswer);
  ASSERT_TRUE(absl::IsInvalidArgument(got.status())) << got.status();
  EXPECT_NE(got.status().message().find("site-b"), std::string::npos) << got.status();
  EXPECT_NE(got.status().message().find(std::to_string(kMaxAnswer)), std::string::npos)
      << got.status();
  EXPECT_EQ(peer.end().bytes_read(), wire::kFrameHeaderSize);
}

TEST(CallTest, AnAnswerWithinTheCallersMaximumIsRead) {
  v1::PeerMessage answer;
  answer.mutable_remote_reply()->mutable_status()->set_error(std::string(1000, 'x'));
  AnsweringPeer peer(answer);
  v1::PeerMessage request;
  request.mutable_remote_get()->set_transfer_id("t-1");
  answer.set_request_id(UINT64_MAX);  // the longest request id there is
  const auto at_most = static_cast<uint32_t>(answer.ByteSizeLong());
  absl::StatusOr<v1::PeerMessage> got = Call(peer.channel(), 0, request, at_most);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->remote_reply().status().error().size(), 1000u);
}

}  // namespace
}  // namespace longhaul::peer
