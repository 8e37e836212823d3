// TransferSender: the pacing of a transfer's streams, the order in which it
// opens a session's connections, and a relayed fan-out leg's digests.

#include "daemon/peer/sender.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "daemon/peer/messaging.h"
#include "daemon/wire/messaging.h"
#include "storage/chunk_io.h"
#include "tests/test_tools/fake_transport.h"

namespace longhaul::peer {
namespace {

using transport::testing::FakeTransport;

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

    FakeTransport data("site-a");
    ASSERT_TRUE(data.Listen("198.18.0.2:7700", [](std::unique_ptr<transport::Channel>) {}).ok());
    // The destination answers the Open once the 4 data channels were dialed
    // (or 10 s passed), and refuses it, which ends the transfer.
    FakeTransport control("site-a");
    std::atomic<int> seen_at_open{-1};
    auto answer_open = [&](std::unique_ptr<transport::Channel> channel) {
      v1::Hello hello;
      v1::PeerMessage request;
      ASSERT_TRUE(wire::ReadProto(*channel, wire::FrameType::kHello, 0, &hello).ok());
      ASSERT_TRUE(
          wire::ReadProto(*channel, wire::FrameType::kControl, wire::SessionIdFor("t-1"), &request)
              .ok());
      data.WaitForDials(4, absl::Seconds(10));
      seen_at_open.store(data.dials());
      const absl::Status refusal = absl::FailedPreconditionError("refused by the test");
      EXPECT_TRUE(wire::SendProto(*channel, wire::FrameType::kControl, wire::SessionIdFor("t-1"),
                                  ErrorAnswer(request.request_id(), refusal))
                      .ok());
    };
    ASSERT_TRUE(control.Listen("198.18.0.2:7700", answer_open).ok());
    PriorityGate gate;
    TransferProgress progress;
    TransferSender sender(options, control, data, gate, **journal, record, progress, nullptr);
    absl::Status status = sender.Run();

    EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
    EXPECT_EQ(control.dials(), 1);
    EXPECT_EQ(seen_at_open.load(), 4) << "data channels dialed before the Open was answered";
  }
  std::filesystem::remove_all(dir);
}

// An operator's resume of a transfer waiting to try again after an error
// (`longhaul resume ID`) tries at once, not when the backoff (here an hour)
// ends; a stop ends the wait too.
TEST(TransferSenderTest, RetryNowCutsTheBackoffShort) {
  std::string dir = ::testing::TempDir() + "sender_test.XXXXXX";
  ASSERT_NE(mkdtemp(dir.data()), nullptr);
  {
    auto journal = storage::Journal::Open(dir + "/journal");
    ASSERT_TRUE(journal.ok()) << journal.status();
    SenderOptions options;
    options.local_site = "site-a";
    options.destination = SenderOptions::Destination{"site-b", "198.18.0.2:7700"};
    options.default_streams = 1;
    options.first_retry_backoff = TimeDelta::Seconds(3600);
    v1::OutgoingTransfer record;
    record.set_id("t-1");
    record.mutable_spec()->set_dest_site("site-b");
    record.mutable_manifest()->set_chunk_size(1 << 20);
    record.mutable_manifest()->add_files()->set_size(1 << 20);
    // Nothing listens: every dial is refused, a retryable error.
    FakeTransport control("site-a");
    FakeTransport data("site-a");
    PriorityGate gate;
    TransferProgress progress;
    TransferSender sender(options, control, data, gate, **journal, record, progress, nullptr);
    absl::Status status;
    std::thread run([&] { status = sender.Run(); });

    ASSERT_TRUE(control.WaitForDials(1, absl::Seconds(60)));
    sender.RetryNow();
    EXPECT_TRUE(control.WaitForDials(2, absl::Seconds(60)))
        << "the second attempt waited for the backoff";
    sender.Stop();
    run.join();
    EXPECT_EQ(status.code(), absl::StatusCode::kCancelled) << status;
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

// Fan-out: the digests a transfer's legs read from the source are kept once
// per chunk and generation, in the order they were read.
TEST(SourceDigestsTest, KeepsTheFirstDigestOfEachChunkInOrder) {
  SourceDigests digests;
  const storage::Xxh128 a{1, 2}, b{3, 4};
  digests.Add({0, 0, 0, a});
  digests.Add({0, 0, 0, b});  // read again: the first stays
  digests.Add({0, 0, 1, b});  // another generation is another entry
  digests.Add({1, 5, 0, b});
  EXPECT_EQ(digests.size(), 3u);
  EXPECT_EQ(digests.Find(0, 0, 0), a);
  EXPECT_EQ(digests.Find(0, 0, 1), b);
  EXPECT_FALSE(digests.Find(0, 1, 0).has_value());
  const std::vector<SourceDigests::Entry> since = digests.Since(1, 10);
  ASSERT_EQ(since.size(), 2u);
  EXPECT_EQ(since[0].generation, 1u);
  EXPECT_EQ(since[1].chunk_index, 5u);
  EXPECT_TRUE(digests.Since(3, 10).empty());
  EXPECT_EQ(digests.Since(0, 1).size(), 1u);
}

// A relayed leg hands its destination, over its own session, the digest of
// every chunk the source read, and reads from the source those the
// destination awaits; when the destination refuses the relay, the leg
// bypasses it and opens again without it.
TEST(TransferSenderTest, ARelayedLegVouchesForItsChunksAndBypassesARefusedRelay) {
  std::string dir = ::testing::TempDir() + "sender_relayed_test.XXXXXX";
  ASSERT_NE(mkdtemp(dir.data()), nullptr);
  {
    constexpr uint64_t kChunk = 1 << 20;
    std::string content(2 * kChunk - 100, '\0');
    for (size_t i = 0; i < content.size(); ++i) content[i] = static_cast<char>(i * 7 + i / 4099);
    const std::string path = dir + "/x.bin";
    {
      std::ofstream out(path, std::ios::binary);
      out.write(content.data(), static_cast<std::streamsize>(content.size()));
    }
    struct stat st;
    ASSERT_EQ(::stat(path.c_str(), &st), 0);
    auto digest_of = [&](uint32_t chunk) {
      const std::string_view bytes = std::string_view(content).substr(chunk * kChunk, kChunk);
      return storage::HashBytes(
          absl::MakeSpan(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()));
    };

    auto journal = storage::Journal::Open(dir + "/journal");
    ASSERT_TRUE(journal.ok()) << journal.status();
    SourceDigests digests;
    digests.Add({0, 0, 0, digest_of(0)});  // read by the leg that sends to the relay
    SenderOptions options;
    options.local_site = "site-a";
    options.destination = SenderOptions::Destination{"site-c", "198.18.0.3:7700"};
    options.source_digests = &digests;
    v1::OutgoingTransfer record;
    record.set_id("t-1.1");
    record.set_relay_by("site-b");
    record.mutable_spec()->set_dest_site("site-c");
    record.add_source_paths(path);
    record.mutable_manifest()->set_chunk_size(kChunk);
    v1::ManifestFile* file = record.mutable_manifest()->add_files();
    file->set_path("x.bin");
    file->set_size(content.size());
    file->set_mtime_ns(int64_t{st.st_mtim.tv_sec} * 1'000'000'000 + st.st_mtim.tv_nsec);
    file->set_inode(st.st_ino);
    file->set_device(st.st_dev);

    FakeTransport data("site-a");
    ASSERT_TRUE(data.Listen("198.18.0.3:7700", [](std::unique_ptr<transport::Channel>) {}).ok());
    // site-c: the first session names the relay; the owner's digests come in
    // its progress requests. The second (after the bypass) is refused,
    // which ends the transfer.
    FakeTransport control("site-a");
    absl::Mutex mu;
    int sessions = 0;
    std::vector<v1::ProgressRequest> asked;
    std::vector<std::string> opened_relay_by;
    const uint64_t session_id = wire::SessionIdFor("t-1.1");
    auto serve = [&](std::unique_ptr<transport::Channel> channel) {
      v1::Hello hello;
      v1::PeerMessage request;
      ASSERT_TRUE(wire::ReadProto(*channel, wire::FrameType::kHello, 0, &hello).ok());
      ASSERT_TRUE(wire::ReadProto(*channel, wire::FrameType::kControl, session_id, &request).ok());
      int session;
      {
        absl::MutexLock lock(&mu);
        session = ++sessions;
        opened_relay_by.push_back(request.open().relay_by());
      }
      v1::PeerMessage answer;
      answer.set_request_id(request.request_id());
      if (session > 1) {
        answer = ErrorAnswer(request.request_id(), absl::FailedPreconditionError("test done"));
        EXPECT_TRUE(wire::SendProto(*channel, wire::FrameType::kControl, session_id, answer).ok());
        return;
      }
      answer.mutable_open_reply();
      ASSERT_TRUE(wire::SendProto(*channel, wire::FrameType::kControl, session_id, answer).ok());
      for (int ask = 0; ask < 2; ++ask) {
        ASSERT_TRUE(
            wire::ReadProto(*channel, wire::FrameType::kControl, session_id, &request).ok());
        {
          absl::MutexLock lock(&mu);
          asked.push_back(request.progress());
        }
        answer.Clear();
        answer.set_request_id(request.request_id());
        v1::ProgressReply* reply = answer.mutable_progress_reply();
        if (ask == 0) {
          // The chunk it waits for, and what a hostile destination adds:
          // the same chunk again, and ids outside the manifest.
          for (auto [file_index, chunk_index] :
               {std::pair<uint32_t, uint32_t>{0, 1}, {0, 1}, {7, 0}, {0, 99}}) {
            v1::ChunkId* awaited = reply->add_awaiting_digests();
            awaited->set_file_index(file_index);
            awaited->set_chunk_index(chunk_index);
          }
        } else {
          reply->set_relay_refused("relay site-b sent chunk 1 of x.bin with another digest");
        }
        ASSERT_TRUE(wire::SendProto(*channel, wire::FrameType::kControl, session_id, answer).ok());
      }
    };
    ASSERT_TRUE(control.Listen("198.18.0.3:7700", serve).ok());
    PriorityGate gate;
    TransferProgress progress;
    TransferSender sender(options, control, data, gate, **journal, record, progress, nullptr);
    const absl::Status status = sender.Run();

    EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
    EXPECT_EQ(sender.record().relay_by(), "");
    absl::MutexLock lock(&mu);
    EXPECT_EQ(opened_relay_by, (std::vector<std::string>{"site-b", ""}));
    ASSERT_EQ(asked.size(), 2u);
    // First what the source read, then the chunk site-c awaited, read now,
    // once; the ids outside the manifest are not answered.
    for (int ask = 0; ask < 2; ++ask) {
      ASSERT_EQ(asked[ask].digests_size(), 1) << ask;
      const v1::SourceDigest& d = asked[ask].digests(0);
      EXPECT_EQ(d.file_index(), 0u);
      EXPECT_EQ(d.chunk_index(), static_cast<uint32_t>(ask));
      EXPECT_EQ(d.generation(), 0u);
      EXPECT_EQ(storage::Xxh128::FromBytes(d.xxh128()), digest_of(ask)) << ask;
    }
    EXPECT_EQ(digests.Find(0, 1, 0), digest_of(1));
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace longhaul::peer
