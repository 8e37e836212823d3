// TransferSender: the pacing of a transfer's streams, and the order in which
// it opens a session's connections.

#include "daemon/peer/sender.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "daemon/peer/messaging.h"
#include "daemon/wire/frames.h"
#include "daemon/wire/messaging.h"

namespace longhaul::peer {
namespace {

// A Channel over in-memory bytes: Write appends to `written`, ReadExactly
// serves `to_read`. Also the codec's scratch pad: SendProto into one and
// ReadProto out of one.
class MemoryChannel : public transport::Channel {
 public:
  absl::Status Write(absl::Span<const absl::Span<const uint8_t>> parts) override {
    for (auto part : parts) written.insert(written.end(), part.begin(), part.end());
    return absl::OkStatus();
  }
  absl::Status ReadExactly(absl::Span<uint8_t> out) override {
    if (to_read.size() - read_offset < out.size()) return absl::UnavailableError("no more bytes");
    std::copy_n(to_read.begin() + read_offset, out.size(), out.begin());
    read_offset += out.size();
    return absl::OkStatus();
  }
  void Abort() override {}
  const std::string& peer_site() const override { return site_; }
  const std::string& peer_address() const override { return site_; }
  transport::LinkStats Stats() const override { return {}; }

  std::vector<uint8_t> written;
  std::vector<uint8_t> to_read;
  size_t read_offset = 0;

 private:
  std::string site_ = "site-b";
};

// The control connection of a peer that answers the sender's Open only once
// `data_dials` reached `wanted` (or after 10 s), and then refuses it, which
// ends the transfer.
class OpenAfterDataDials : public MemoryChannel {
 public:
  OpenAfterDataDials(std::atomic<int>* data_dials, int wanted, std::atomic<int>* seen_at_open)
      : data_dials_(data_dials), wanted_(wanted), seen_at_open_(seen_at_open) {}
  absl::Status ReadExactly(absl::Span<uint8_t> out) override {
    if (to_read.empty()) {
      const absl::Time deadline = absl::Now() + absl::Seconds(10);
      while (data_dials_->load() < wanted_ && absl::Now() < deadline)
        absl::SleepFor(absl::Milliseconds(1));
      seen_at_open_->store(data_dials_->load());
      MemoryChannel sent;  // what the sender wrote: its Hello, then the Open request
      sent.to_read = written;
      v1::Hello hello;
      v1::PeerMessage request;
      if (absl::Status s =
              wire::ReadProto(sent, wire::FrameType::kHello, wire::SessionIdFor("t-1"), &hello);
          !s.ok())
        return s;
      if (absl::Status s =
              wire::ReadProto(sent, wire::FrameType::kControl, wire::SessionIdFor("t-1"), &request);
          !s.ok())
        return s;
      MemoryChannel answer;
      (void)wire::SendProto(
          answer, wire::FrameType::kControl, wire::SessionIdFor("t-1"),
          ErrorAnswer(request.request_id(), absl::FailedPreconditionError("refused by the test")));
      to_read = std::move(answer.written);
    }
    return MemoryChannel::ReadExactly(out);
  }

 private:
  std::atomic<int>* data_dials_;
  int wanted_;
  std::atomic<int>* seen_at_open_;
};

class FakeTransport : public transport::Transport {
 public:
  explicit FakeTransport(std::function<std::unique_ptr<transport::Channel>()> make)
      : make_(std::move(make)) {}
  absl::StatusOr<std::unique_ptr<transport::Channel>> Dial(const std::string&,
                                                           const std::string&) override {
    ++dials;
    return make_();
  }
  absl::Status Listen(const std::string&, transport::ChannelHandler) override {
    return absl::UnimplementedError("dial only");
  }
  uint16_t listen_port() const override { return 0; }
  void Shutdown() override {}

  std::atomic<int> dials{0};

 private:
  std::function<std::unique_ptr<transport::Channel>()> make_;
};

// The data channels are dialed while the control session opens, not after the
// Open answer: a dial is round trips (TCP, TLS, udp keys) that the first byte
// of a transfer would otherwise wait for on top of the Open's.
TEST(TransferSenderTest, DialsTheDataChannelsWhileTheSessionOpens) {
  std::string dir = ::testing::TempDir() + "sender_test.XXXXXX";
  ASSERT_NE(mkdtemp(dir.data()), nullptr);
  {
    auto journal = storage::Journal::Open(dir + "/journal");
    ASSERT_TRUE(journal.ok()) << journal.status();
    SenderOptions options;
    options.local_site = "site-a";
    options.destination = SenderOptions::Destination{"site-b", "198.18.0.2:7700"};
    options.default_streams = 4;
    v1::OutgoingTransfer record;
    record.set_id("t-1");
    record.mutable_spec()->set_dest_site("site-b");
    record.mutable_manifest()->set_chunk_size(1 << 20);
    record.mutable_manifest()->add_files()->set_size(8 << 20);  // 8 chunks, so all 4 streams

    std::atomic<int> seen_at_open{-1};
    FakeTransport data([] { return std::make_unique<MemoryChannel>(); });
    FakeTransport control(
        [&] { return std::make_unique<OpenAfterDataDials>(&data.dials, 4, &seen_at_open); });
    PriorityGate gate;
    TransferProgress progress;
    TransferSender sender(options, control, data, gate, **journal, record, progress, nullptr);
    absl::Status status = sender.Run();

    EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
    EXPECT_EQ(control.dials.load(), 1);
    EXPECT_EQ(seen_at_open.load(), 4) << "data channels dialed before the Open was answered";
  }
  std::filesystem::remove_all(dir);
}

// Whatever the number of streams, together they pace just below the
// configured link, so they cannot keep its bottleneck queue full.
TEST(TransferSenderTest, StreamsTogetherPaceJustBelowTheConfiguredLink) {
  const Bandwidth link = Bandwidth::GbitsPerSecond(1);
  for (uint32_t streams : {1u, 2u, 8u, 32u}) {
    const Bandwidth each = TransferSender::StreamPacingLimit(link, streams);
    const int64_t together = each.ToBitsPerSecond() * streams;
    EXPECT_LT(together, link.ToBitsPerSecond()) << streams << " streams";
    EXPECT_GE(together, link.ToBitsPerSecond() * 9 / 10) << streams << " streams";
  }
  EXPECT_EQ(TransferSender::StreamPacingLimit(link, 0), TransferSender::StreamPacingLimit(link, 1));
}

// The per-stream window: one chunk size unacknowledged, slid by progress
// reports, and answers checked against what was sent.
constexpr uint64_t kMiB = 1 << 20;

TEST(SendWindowTest, ProgressSlidesTheWindowIntoTheNextChunk) {
  SendWindow window(16 * kMiB);
  window.Begin(0, 0, 16 * kMiB, 0);
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(window.Fits(4 * kMiB));
    window.Sent(4 * kMiB);
  }
  window.Begin(0, 1, 16 * kMiB, 0);
  EXPECT_FALSE(window.Fits(4 * kMiB));  // a whole chunk size is unacknowledged
  auto added = window.Progress({0, 0, 0, 4 * kMiB});
  ASSERT_TRUE(added.ok()) << added.status();
  EXPECT_EQ(*added, 4 * kMiB);
  EXPECT_EQ(window.unacked_bytes(), 12 * kMiB);
  ASSERT_TRUE(window.Fits(4 * kMiB));
  window.Sent(4 * kMiB);
  EXPECT_FALSE(window.Fits(1));
  auto acked = window.Ack({0, 0, 0, wire::ChunkAck::Result::kDurable, ""});
  ASSERT_TRUE(acked.ok()) << acked.status();
  EXPECT_EQ(acked->durable, 4 * kMiB);  // the ack covers the rest
  EXPECT_EQ(window.unacked_bytes(), 4 * kMiB);
  EXPECT_TRUE(window.Fits(12 * kMiB));
  EXPECT_FALSE(window.Fits(12 * kMiB + 1));
}

TEST(SendWindowTest, AResumedChunkCountsOnlyWhatIsSentFromItsPrefix) {
  SendWindow window(16 * kMiB);
  window.Begin(2, 3, 16 * kMiB, 8 * kMiB);
  window.Sent(8 * kMiB);
  EXPECT_EQ(window.unacked_bytes(), 8 * kMiB);
  // The prefix itself is not news.
  EXPECT_FALSE(window.Progress({2, 3, 0, 8 * kMiB}).ok());
  auto added = window.Progress({2, 3, 0, 12 * kMiB});
  ASSERT_TRUE(added.ok());
  EXPECT_EQ(*added, 4 * kMiB);
  auto acked = window.Ack({2, 3, 0, wire::ChunkAck::Result::kDurable, ""});
  ASSERT_TRUE(acked.ok());
  EXPECT_EQ(acked->start, 8 * kMiB);
  EXPECT_TRUE(window.empty());
  EXPECT_EQ(window.unacked_bytes(), 0u);
}

TEST(SendWindowTest, RefusesAnswersForWhatWasNotSent) {
  SendWindow window(16 * kMiB);
  // Nothing sent at all.
  EXPECT_FALSE(window.Progress({0, 0, 0, 4 * kMiB}).ok());
  EXPECT_FALSE(window.Ack({0, 0, 0, wire::ChunkAck::Result::kDurable, ""}).ok());
  window.Begin(0, 0, 16 * kMiB, 0);
  window.Sent(8 * kMiB);
  // Progress on a chunk that is not the one being received.
  EXPECT_EQ(window.Progress({0, 1, 0, 4 * kMiB}).status().message(),
            "reported progress on chunk 1 of file 0, which is not the chunk it is receiving");
  EXPECT_FALSE(window.Progress({1, 0, 0, 4 * kMiB}).ok());
  // Beyond the bytes sent, at or past the chunk's end.
  EXPECT_FALSE(window.Progress({0, 0, 0, 8 * kMiB + 1}).ok());
  EXPECT_FALSE(window.Progress({0, 0, 0, 16 * kMiB}).ok());
  // Backwards.
  ASSERT_TRUE(window.Progress({0, 0, 0, 8 * kMiB}).ok());
  EXPECT_FALSE(window.Progress({0, 0, 0, 4 * kMiB}).ok());
  // Durable before all of it was sent; a refusal may come any time.
  EXPECT_FALSE(window.Ack({0, 0, 0, wire::ChunkAck::Result::kDurable, ""}).ok());
  EXPECT_FALSE(window.Ack({0, 0, 0, wire::ChunkAck::Result::kHashMismatch, ""}).ok());
  EXPECT_FALSE(window.Ack({0, 1, 0, wire::ChunkAck::Result::kRefused, ""}).ok());
  EXPECT_TRUE(window.Ack({0, 0, 0, wire::ChunkAck::Result::kRefused, "no"}).ok());
  EXPECT_TRUE(window.empty());
}

TEST(SendWindowTest, WithoutPiecesTwoWholeChunksFit) {
  SendWindow window(32 * kMiB);
  window.Begin(0, 0, 16 * kMiB, 0);
  ASSERT_TRUE(window.Fits(16 * kMiB));
  window.Sent(16 * kMiB);
  window.Begin(0, 1, 16 * kMiB, 0);
  ASSERT_TRUE(window.Fits(16 * kMiB));
  window.Sent(16 * kMiB);
  window.Begin(0, 2, 16 * kMiB, 0);
  EXPECT_FALSE(window.Fits(16 * kMiB));
  ASSERT_TRUE(window.Ack({0, 0, 0, wire::ChunkAck::Result::kDurable, ""}).ok());
  EXPECT_TRUE(window.Fits(16 * kMiB));
}

TEST(SendWindowTest, SmallChunksAreCappedInNumber) {
  SendWindow window(16 * kMiB);
  for (size_t i = 0; i < SendWindow::kMaxChunks; ++i) {
    window.Begin(0, static_cast<uint32_t>(i), 4096, 0);
    ASSERT_TRUE(window.Fits(4096)) << i;
    window.Sent(4096);
  }
  window.Begin(0, SendWindow::kMaxChunks, 4096, 0);
  EXPECT_FALSE(window.Fits(4096));
}

}  // namespace
}  // namespace longhaul::peer
