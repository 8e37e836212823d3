// TransferManager end to end in one process: a FakeTransport carries its
// sessions to a real peer::Receiver over a temporary export, and both sites
// journal in temporary RocksDB directories.
#include "daemon/transfer/transfer_manager.h"

#include <algorithm>
#include <array>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "common/clock.h"
#include "daemon/peer/priority_gate.h"
#include "daemon/peer/rate_limiter.h"
#include "daemon/peer/receiver.h"
#include "daemon/peer/router.h"
#include "daemon/transfer/fanout_sender.h"
#include "daemon/transfer/remote_copy.h"
#include "daemon/wire/messaging.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/storage/test_util.h"
#include "tests/test_tools/fake_transport.h"

namespace longhaul::daemon {
namespace {

using storage::testing::Bytes;
using storage::testing::Exists;
using storage::testing::MakeDirs;
using storage::testing::ReadFile;
using storage::testing::TempDir;
using storage::testing::WriteFile;
using ::testing::HasSubstr;

constexpr uint64_t kChunk = 64 << 10;  // the smallest chunk size a transfer may have
constexpr char kPeerAddress[] = "site-b.test:7700";

std::string AsString(const std::vector<uint8_t>& bytes) { return {bytes.begin(), bytes.end()}; }

std::string RealPath(const std::string& path) {
  char buf[PATH_MAX];
  EXPECT_NE(realpath(path.c_str(), buf), nullptr) << path;
  return buf;
}

class TransferManagerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // The source: job/shard-0 is one chunk, job/shard-1 four.
    MakeDirs(dir_.Sub("src/job"));
    MakeDirs(dir_.Sub("dest"));
    WriteFile(dir_.Sub("src/job/shard-0"), Bytes(kChunk, 1));
    WriteFile(dir_.Sub("src/job/shard-1"), Bytes(3 * kChunk + 1000, 2));

    config_.site = "site-a";
    config_.state_dir = dir_.Sub("state");
    config_.tls.key = dir_.Sub("pki/site-a.key");  // a directory of its own: never sent
    config_.exports = {{"data", dir_.Sub("src"), {}, {}, 022}};
    config_.peers = {{"site-b", kPeerAddress, "tcp", 0}};
    config_.transfer.chunk_size = kChunk;
    config_.transfer.streams = 1;  // chunks go in manifest order
    OpenJournal();

    auto dest_journal = storage::Journal::Open(dir_.Sub("journal-b"));
    ASSERT_TRUE(dest_journal.ok()) << dest_journal.status();
    dest_journal_ = std::move(*dest_journal);
    peer::ReceiverOptions options;
    options.local_site = "site-b";
    options.exports = {{"ckpt", dir_.Sub("dest"), {"site-a"}}};
    receiver_ = std::make_unique<peer::Receiver>(options, *dest_journal_);
    auto serve = [this](std::unique_ptr<transport::Channel> channel, const v1::Hello& hello) {
      receiver_->Serve(std::move(channel), hello);
    };
    router_.Register(v1::Hello::CONTROL, serve);
    router_.Register(v1::Hello::DATA, serve);
    // site-b as the source of a pull: it answers every request with remote_answer_.
    router_.Register(
        v1::Hello::REMOTE, [this](std::unique_ptr<transport::Channel> channel, const v1::Hello&) {
          v1::PeerMessage request;
          while (wire::ReadProto(*channel, wire::FrameType::kControl, 0, &request).ok()) {
            v1::PeerMessage answer;
            answer.set_request_id(request.request_id());
            *answer.mutable_remote_reply()->mutable_status() = remote_answer_;
            if (!wire::SendProto(*channel, wire::FrameType::kControl, 0, answer).ok()) return;
          }
        });
    ASSERT_TRUE(transport_
                    .Listen(kPeerAddress,
                            [this](std::unique_ptr<transport::Channel> channel) {
                              router_.Serve(std::move(channel));
                            })
                    .ok());
  }

  void OpenJournal() {
    auto journal = storage::Journal::Open(dir_.Sub("journal-a"));
    ASSERT_TRUE(journal.ok()) << journal.status();
    journal_ = std::move(*journal);
  }

  // A manager on the journal, started. `limiter`: the operators' caps.
  void StartManager(peer::RateLimiter* limiter = nullptr) {
    manager_ = std::make_unique<TransferManager>(config_, transports_, *journal_, gate_);
    manager_->SetRateLimiter(limiter);
    ASSERT_TRUE(manager_->Start().ok());
  }

  // The daemon going down and coming back on the same state directory.
  void Restart() {
    manager_.reset();
    journal_.reset();
    OpenJournal();
    StartManager();
  }

  static v1::TransferSpec JobSpec() {
    v1::TransferSpec spec;
    spec.set_dest_site("site-b");
    spec.set_dest_export("ckpt");
    spec.set_dest_path("job");
    return spec;
  }

  absl::StatusOr<v1::TransferStatus> SubmitJob(const std::string& request_id = "") {
    v1::TransferSpec spec = JobSpec();
    spec.add_sources(dir_.Sub("src/job"));
    return manager_->Submit(request_id, spec, caller_);
  }

  // The first status for which `done` holds, or the last one if none does
  // within a minute: the timeout only bounds a hang, the caller's assertions
  // on the status decide.
  v1::TransferStatus AwaitStatus(const std::string& id,
                                 const std::function<bool(const v1::TransferStatus&)>& done) {
    absl::StatusOr<v1::TransferStatus> status = manager_->AwaitStatus(id, done, absl::Seconds(60));
    if (!status.ok()) {
      ADD_FAILURE() << status.status();
      return {};
    }
    return *status;
  }
  // Polls the destination's journal likewise; true once `chunks` chunks of
  // transfer `id` are durable there.
  bool AwaitChunksDurableAtDestination(const std::string& id, size_t chunks) {
    const absl::Time deadline = absl::Now() + absl::Seconds(60);
    while (absl::Now() < deadline) {
      auto durable = dest_journal_->ListDurableChunks(id);
      if (durable.ok() && durable->size() >= chunks) return durable->size() == chunks;
      absl::SleepFor(absl::Milliseconds(5));
    }
    return false;
  }
  v1::TransferStatus AwaitState(const std::string& id, v1::TransferState state) {
    return AwaitStatus(id, [state](const v1::TransferStatus& s) { return s.state() == state; });
  }

  void ExpectJobPublished(const std::string& shard_1) {
    EXPECT_TRUE(ReadFile(dir_.Sub("dest/job/shard-0")) == AsString(Bytes(kChunk, 1)));
    EXPECT_TRUE(ReadFile(dir_.Sub("dest/job/shard-1")) == shard_1);
  }

  // Caps site-b so that exactly one chunk goes: a new cap holds a burst of
  // one chunk (64 KiB); taking a byte of it leaves the first chunk to put
  // the cap in debt, and the cap's clock never moves, so that debt is never
  // paid off. The stream waits on the cap before it reads that chunk's ack,
  // so the destination holds the chunk before the source counts it done.
  // Release() lifts the cap and the rest goes.
  void HoldAfterOneChunk() {
    one_chunk_limiter_.SetPeerLimit("site-b", Bandwidth::BitsPerSecond(8));
    ASSERT_TRUE(one_chunk_limiter_.TryAcquire("site-b", v1::CHECKPOINT, 1).IsZero());
  }
  void Release() { one_chunk_limiter_.SetPeerLimit("site-b", Bandwidth::Zero()); }

  // Starts the manager under HoldAfterOneChunk, submits the job and returns
  // its id in `id` once its first chunk is durable at the destination.
  void SubmitHeldAfterOneChunk(std::string* id) {
    HoldAfterOneChunk();
    StartManager(&one_chunk_limiter_);
    absl::StatusOr<v1::TransferStatus> submitted = SubmitJob();
    ASSERT_TRUE(submitted.ok()) << submitted.status();
    *id = submitted->id();
    ASSERT_TRUE(AwaitChunksDurableAtDestination(*id, 1));
  }

  // A pull of site-b's ckpt/job into this site's export "data".
  static v1::TransferSpec PullSpec() {
    v1::TransferSpec spec;
    spec.set_source_site("site-b");
    spec.set_source_export("ckpt");
    spec.set_source_path("job");
    spec.set_dest_site("site-a");
    spec.set_dest_export("data");
    spec.set_dest_path("pulled");
    return spec;
  }

  // Destroyed bottom-up: the manager drains its senders first, and the
  // transport joins its handlers (which use the router and the receiver)
  // before those go.
  TempDir dir_;
  // What site-b answers a REMOTE request with; set before the request.
  v1::TransferStatus remote_answer_;
  std::unique_ptr<storage::Journal> dest_journal_;
  std::unique_ptr<peer::Receiver> receiver_;
  peer::PeerRouter router_;
  transport::testing::FakeTransport transport_{"site-a"};
  const transport::TransportSet transports_{{"tcp", &transport_}};
  DaemonConfig config_;
  std::unique_ptr<storage::Journal> journal_;
  peer::PriorityGate gate_;
  const Caller caller_ = Caller::Token(ControlRole::kOperator, "ipv4:127.0.0.1:5000");
  FakeClock frozen_clock_;
  peer::RateLimiter one_chunk_limiter_{frozen_clock_};
  std::unique_ptr<TransferManager> manager_;
};

TEST_F(TransferManagerTest, ASubmittedTransferCompletesAndItsBytesVerify) {
  StartManager();
  absl::StatusOr<v1::TransferStatus> submitted = SubmitJob("req-1");
  ASSERT_TRUE(submitted.ok()) << submitted.status();
  EXPECT_EQ(submitted->files(), 2u);
  EXPECT_EQ(submitted->bytes_total(), 4 * kChunk + 1000);

  v1::TransferStatus done = AwaitState(submitted->id(), v1::COMPLETED);
  ASSERT_EQ(done.state(), v1::COMPLETED) << done.error();
  EXPECT_EQ(done.bytes_done(), done.bytes_total());
  EXPECT_EQ(done.chunks_done(), 5u);
  EXPECT_EQ(done.resent_bytes(), 0u);
  ExpectJobPublished(AsString(Bytes(3 * kChunk + 1000, 2)));

  absl::StatusOr<v1::VerifyResponse> verified = manager_->Verify(submitted->id());
  ASSERT_TRUE(verified.ok()) << verified.status();
  EXPECT_TRUE(verified->ok()) << ::testing::PrintToString(verified->mismatches());
  EXPECT_EQ(verified->files_checked(), 2u);
  EXPECT_EQ(verified->bytes_checked(), 4 * kChunk + 1000);

  // A retried request is answered with the same transfer, not a second one.
  absl::StatusOr<v1::TransferStatus> retried = SubmitJob("req-1");
  ASSERT_TRUE(retried.ok()) << retried.status();
  EXPECT_EQ(retried->id(), submitted->id());
  EXPECT_EQ(manager_->List(/*all=*/true).size(), 1u);
  EXPECT_TRUE(manager_->List(/*all=*/false).empty());  // ended
}

// AwaitStatus returns as soon as a change satisfies it; when none does, it
// returns the latest status once its timeout has passed on the manager's
// clock.
// Overlapping cron runs of one requester share a sync; another requester's
// run of the same sync is a transfer of its own, which it alone sees and
// cancels.
TEST_F(TransferManagerTest, ASyncAttachesOnlyToTheSameRequestersRunningSync) {
  config_.transfer.max_active = 0;  // submitted transfers stay queued
  StartManager();
  v1::TransferSpec spec = JobSpec();
  spec.add_sources(dir_.Sub("src/job"));
  spec.set_sync(true);
  absl::StatusOr<v1::TransferStatus> first = manager_->Submit("", spec, caller_);
  ASSERT_TRUE(first.ok()) << first.status();

  absl::StatusOr<v1::TransferStatus> again = manager_->Submit("", spec, caller_);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->id(), first->id());

  const Caller root = Caller::LocalUser(0, 0);
  absl::StatusOr<v1::TransferStatus> other = manager_->Submit("", spec, root);
  ASSERT_TRUE(other.ok()) << other.status();
  EXPECT_NE(other->id(), first->id());
  const Caller operator_elsewhere =
      Caller::Token(ControlRole::kOperator, "ipv4:127.0.0.1:6000");  // same role, new connection
  absl::StatusOr<v1::TransferStatus> same_role = manager_->Submit("", spec, operator_elsewhere);
  ASSERT_TRUE(same_role.ok()) << same_role.status();
  EXPECT_EQ(same_role->id(), first->id());

  ASSERT_TRUE(manager_->Cancel(other->id()).ok());
  absl::StatusOr<v1::TransferStatus> still = manager_->Get(first->id());
  ASSERT_TRUE(still.ok()) << still.status();
  EXPECT_EQ(still->state(), v1::QUEUED);
}

TEST_F(TransferManagerTest, AwaitStatusWakesOnAChangeAndGivesUpOnTheManagersClock) {
  config_.transfer.max_active = 0;  // a submitted transfer stays queued
  FakeClock clock;
  manager_ = std::make_unique<TransferManager>(config_, transports_, *journal_, gate_, clock);
  ASSERT_TRUE(manager_->Start().ok());
  absl::StatusOr<v1::TransferStatus> submitted = SubmitJob();
  ASSERT_TRUE(submitted.ok()) << submitted.status();
  const std::string id = submitted->id();

  auto paused = std::async(std::launch::async, [&] {
    return manager_->AwaitStatus(
        id, [](const v1::TransferStatus& s) { return s.state() == v1::PAUSED; }, absl::Hours(1));
  });
  ASSERT_TRUE(manager_->Pause(id).ok());
  absl::StatusOr<v1::TransferStatus> status = paused.get();
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_EQ(status->state(), v1::PAUSED);

  auto never = std::async(std::launch::async, [&] {
    return manager_->AwaitStatus(
        id, [](const v1::TransferStatus&) { return false; }, absl::Seconds(10));
  });
  // Advanced until the wait, whenever it began, has seen its timeout pass.
  while (never.wait_for(std::chrono::milliseconds(10)) != std::future_status::ready) {
    clock.Advance(TimeDelta::Seconds(10));
  }
  status = never.get();
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_EQ(status->state(), v1::PAUSED);

  EXPECT_EQ(manager_
                ->AwaitStatus(
                    "t-none", [](const v1::TransferStatus&) { return true; }, absl::Seconds(1))
                .status()
                .code(),
            absl::StatusCode::kNotFound);
  manager_.reset();  // before `clock`
}

TEST_F(TransferManagerTest, ASourceOutsideTheExportsIsRefusedAndNothingIsJournaled) {
  StartManager();
  MakeDirs(dir_.Sub("elsewhere"));
  WriteFile(dir_.Sub("elsewhere/secret"), std::string("secret"));
  v1::TransferSpec spec = JobSpec();
  spec.add_sources(dir_.Sub("elsewhere/secret"));
  absl::StatusOr<v1::TransferStatus> refused = manager_->Submit("", spec, caller_);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kPermissionDenied) << refused.status();
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("elsewhere/secret"));
  EXPECT_TRUE(manager_->List(/*all=*/true).empty());
  EXPECT_TRUE(journal_->ListOutgoing()->empty());
  EXPECT_EQ(transport_.dials(), 0);
}

// A pull into this site is refused before its source is asked when it
// would prune, or when its caller may not write the destination itself.
TEST_F(TransferManagerTest, APullIsRefusedAtSubmitWhenItWouldPruneOrItsCallerMayNotWrite) {
  MakeDirs(dir_.Sub("pulled"));
  config_.exports.push_back({"ckpt", dir_.Sub("pulled"), {}, {}, 022});
  StartManager();
  v1::TransferSpec spec;
  spec.set_source_site("site-b");
  spec.set_source_export("ckpt");
  spec.set_source_path("run/step-3");
  spec.set_dest_site("site-a");
  spec.set_dest_export("ckpt");
  spec.set_dest_path("run/step-3");

  v1::TransferSpec pruning = spec;
  pruning.set_keep_checkpoints(2);
  pruning.set_checkpoint_marker("done");
  absl::StatusOr<v1::TransferStatus> refused = manager_->Submit("", pruning, caller_);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << refused.status();
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("a pull never prunes"));

  // The test's directory is mode 0700: a stranger may not even search it.
  refused = manager_->Submit("", spec, Caller::LocalUser(65534, 65534));
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kPermissionDenied) << refused.status();
  EXPECT_THAT(std::string(refused.status().message()),
              HasSubstr("uid 65534 (nobody) may not write " + RealPath(dir_.Sub("pulled")) +
                        "/run/step-3: no search permission on directory"));
  EXPECT_TRUE(manager_->List(/*all=*/true).empty());
  EXPECT_TRUE(journal_->ListOutgoing()->empty());
  EXPECT_EQ(transport_.dials(), 0);
}

TEST_F(TransferManagerTest, ARemoteAnswerPastTheLimitIsRefusedAndNothingIsJournaled) {
  StartManager();
  remote_answer_.set_id("t-hostile");
  remote_answer_.set_state(v1::RUNNING);
  remote_answer_.set_error(std::string(size_t{1} << 20, 'x'));
  absl::StatusOr<v1::TransferStatus> refused = manager_->Submit("", PullSpec(), caller_);
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << refused.status();
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("site-b"));
  EXPECT_THAT(std::string(refused.status().message()),
              HasSubstr("limit of " + std::to_string(kMaxRemoteMessage) + " bytes"));
  EXPECT_TRUE(manager_->List(/*all=*/true).empty());
  EXPECT_TRUE(journal_->ListOutgoing()->empty());
}

TEST_F(TransferManagerTest, WhatIsJournaledAboutARemoteTransferIsBounded) {
  StartManager();
  // Within the message limit, but an error no status needs.
  remote_answer_.set_id("t-verbose");
  remote_answer_.set_state(v1::RUNNING);
  remote_answer_.set_error(std::string(60 << 10, 'x'));
  absl::StatusOr<v1::TransferStatus> submitted = manager_->Submit("", PullSpec(), caller_);
  ASSERT_TRUE(submitted.ok()) << submitted.status();
  EXPECT_LE(submitted->error().size(), kMaxRemoteError);
  absl::StatusOr<std::optional<v1::OutgoingTransfer>> journaled =
      journal_->GetOutgoing("t-verbose");
  ASSERT_TRUE(journaled.ok() && journaled->has_value()) << journaled.status();
  EXPECT_LE((*journaled)->error().size(), kMaxRemoteError);
  EXPECT_LE((*journaled)->ByteSizeLong(), kMaxRemoteError + 1024);
  // Status and listing answer, bounded the same way.
  const std::vector<v1::TransferStatus> listed = manager_->List(/*all=*/true);
  ASSERT_EQ(listed.size(), 1u);
  EXPECT_EQ(listed[0].state(), v1::RUNNING);
  EXPECT_LE(listed[0].error().size(), kMaxRemoteError);
}

TEST_F(TransferManagerTest, ARemoteRequestPastTheLimitIsRefusedBeforeItIsRead) {
  StartManager();
  transport::testing::ChannelPair pair = transport::testing::MakeChannelPair("site-b", "site-a");
  std::vector<uint8_t> bytes(wire::kFrameHeaderSize + kMaxRemoteMessage + 1, 'x');
  std::array<uint8_t, wire::kFrameHeaderSize> header;
  wire::EncodeFrameHeader({wire::FrameType::kControl, kMaxRemoteMessage + 1, 0}, header);
  std::copy(header.begin(), header.end(), bytes.begin());
  ASSERT_TRUE(pair.b->Write({absl::MakeConstSpan(bytes)}).ok());
  manager_->ServeRemote(*pair.a);  // returns once it refuses the request
  EXPECT_EQ(pair.a->bytes_read(), wire::kFrameHeaderSize);
  EXPECT_TRUE(journal_->ListOutgoing()->empty());
}

TEST_F(TransferManagerTest, AnUnfinishedTransferResumesAfterARestartFromWhatIsDurable) {
  std::string id;
  ASSERT_NO_FATAL_FAILURE(SubmitHeldAfterOneChunk(&id));
  EXPECT_EQ(manager_->Get(id)->state(), v1::RUNNING);

  // Shut down mid-transfer: the chunk in flight is drained (its ack read),
  // and the journal keeps the transfer RUNNING with its progress.
  manager_.reset();
  absl::StatusOr<std::optional<v1::OutgoingTransfer>> journaled = journal_->GetOutgoing(id);
  ASSERT_TRUE(journaled.ok() && journaled->has_value());
  EXPECT_EQ((*journaled)->state(), v1::RUNNING);
  EXPECT_EQ((*journaled)->bytes_done(), kChunk);

  Restart();
  v1::TransferStatus done = AwaitState(id, v1::COMPLETED);
  ASSERT_EQ(done.state(), v1::COMPLETED) << done.error();
  EXPECT_EQ(done.attempts(), 2u);
  // The chunk that was durable before the restart did not go again.
  EXPECT_EQ(done.bytes_sent(), done.bytes_total());
  EXPECT_EQ(done.resent_bytes(), 0u);
  ExpectJobPublished(AsString(Bytes(3 * kChunk + 1000, 2)));
}

TEST_F(TransferManagerTest, CancelStopsTheTransferAndTheDestinationDropsItsStaging) {
  std::string id;
  ASSERT_NO_FATAL_FAILURE(SubmitHeldAfterOneChunk(&id));
  const std::string staging = dir_.Sub("dest/.longhaul/staging/" + id);
  ASSERT_TRUE(Exists(staging));

  absl::StatusOr<v1::TransferStatus> cancelled = manager_->Cancel(id);
  ASSERT_TRUE(cancelled.ok()) << cancelled.status();
  EXPECT_EQ(cancelled->state(), v1::CANCELLED);
  EXPECT_FALSE(Exists(staging));
  EXPECT_FALSE(Exists(dir_.Sub("dest/job")));
  absl::StatusOr<std::optional<v1::IncomingTransfer>> incoming = dest_journal_->GetIncoming(id);
  ASSERT_TRUE(incoming.ok() && incoming->has_value());
  EXPECT_EQ((*incoming)->state(), v1::IncomingTransfer::ABORTED);

  // Ended: not listed as active, and not resumable.
  EXPECT_TRUE(manager_->List(/*all=*/false).empty());
  EXPECT_EQ(manager_->Resume(id).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(manager_->Get(id)->state(), v1::CANCELLED);
}

TEST_F(TransferManagerTest, AnUnreachableDestinationIsRetriedWhileTheTransferRuns) {
  transport_.RefuseDials(absl::UnavailableError("connect to site-b: connection refused"));
  StartManager();
  absl::StatusOr<v1::TransferStatus> submitted = SubmitJob();
  ASSERT_TRUE(submitted.ok()) << submitted.status();
  v1::TransferStatus retrying =
      AwaitStatus(submitted->id(), [](const v1::TransferStatus& s) { return s.attempts() >= 2; });
  EXPECT_EQ(retrying.state(), v1::RUNNING);
  EXPECT_GE(retrying.attempts(), 2u);
  EXPECT_EQ(retrying.error(), "connect to site-b: connection refused");

  transport_.RefuseDials(absl::OkStatus());
  v1::TransferStatus done = AwaitState(submitted->id(), v1::COMPLETED);
  ASSERT_EQ(done.state(), v1::COMPLETED) << done.error();
  EXPECT_EQ(done.error(), "");
  ExpectJobPublished(AsString(Bytes(3 * kChunk + 1000, 2)));
}

TEST_F(TransferManagerTest, ADestinationThatFailsAuthenticationFailsTheTransferUntilResumed) {
  const std::string why =
      "peer at site-b.test:7700 presented a certificate for site-c, expected site-b";
  transport_.RefuseDials(absl::PermissionDeniedError(why));
  StartManager();
  absl::StatusOr<v1::TransferStatus> submitted = SubmitJob();
  ASSERT_TRUE(submitted.ok()) << submitted.status();
  v1::TransferStatus failed = AwaitState(submitted->id(), v1::FAILED);
  ASSERT_EQ(failed.state(), v1::FAILED);
  EXPECT_EQ(failed.error(), why);
  EXPECT_EQ(failed.attempts(), 1u);  // not retried
  EXPECT_NE(failed.finished_unix_ms(), 0);

  // Once the operator fixed the cause, a failed transfer can be resumed.
  transport_.RefuseDials(absl::OkStatus());
  ASSERT_TRUE(manager_->Resume(submitted->id()).ok());
  v1::TransferStatus done = AwaitState(submitted->id(), v1::COMPLETED);
  ASSERT_EQ(done.state(), v1::COMPLETED) << done.error();
  ExpectJobPublished(AsString(Bytes(3 * kChunk + 1000, 2)));
}

TEST_F(TransferManagerTest, ASourceFileChangedAfterSubmitIsSentAgainWhole) {
  std::string id;
  ASSERT_NO_FATAL_FAILURE(SubmitHeldAfterOneChunk(&id));

  // shard-0 is at the destination; shard-1 changes before any of it went.
  const std::vector<uint8_t> rewritten = Bytes(2 * kChunk + 7, 3);
  WriteFile(dir_.Sub("src/job/shard-1"), rewritten);
  Release();
  v1::TransferStatus done = AwaitState(id, v1::COMPLETED);
  ASSERT_EQ(done.state(), v1::COMPLETED) << done.error();
  ExpectJobPublished(AsString(rewritten));
  EXPECT_EQ(done.bytes_total(), kChunk + rewritten.size());
}

TEST_F(TransferManagerTest, ASourceFileRemovedAfterSubmitFailsTheTransferNamingIt) {
  std::string id;
  ASSERT_NO_FATAL_FAILURE(SubmitHeldAfterOneChunk(&id));

  const std::string removed = RealPath(dir_.Sub("src/job/shard-1"));
  ASSERT_EQ(std::remove(removed.c_str()), 0);
  Release();
  v1::TransferStatus failed = AwaitState(id, v1::FAILED);
  ASSERT_EQ(failed.state(), v1::FAILED);
  EXPECT_EQ(failed.error(), "source file " + removed + " was removed during the transfer");
  EXPECT_FALSE(Exists(dir_.Sub("dest/job")));  // nothing published half
}

TEST(PlanFanoutLegsTest, EachDestinationIsRelayedByTheOneBeforeItUnderItsOwnId) {
  v1::TransferSpec spec;
  spec.set_dest_site("site-b");
  spec.set_dest_export("ckpt");
  spec.set_dest_path("x");
  for (const char* site : {"site-c", "site-d"}) {
    v1::Destination* also = spec.add_also();
    also->set_site(site);
    also->set_export_name("mirror");
    also->set_path("y");
  }
  const std::vector<v1::FanoutLeg> legs = PlanFanoutLegs("t-1", spec);
  ASSERT_EQ(legs.size(), 3u);
  EXPECT_EQ(legs[0].transfer_id(), "t-1");
  EXPECT_EQ(legs[0].destination().site(), "site-b");
  EXPECT_EQ(legs[0].destination().export_name(), "ckpt");
  EXPECT_EQ(legs[0].relay_by(), "");
  EXPECT_EQ(legs[1].transfer_id(), "t-1.1");
  EXPECT_EQ(legs[1].destination().path(), "y");
  EXPECT_EQ(legs[1].relay_by(), "site-b");
  EXPECT_EQ(legs[2].transfer_id(), "t-1.2");
  EXPECT_EQ(legs[2].relay_by(), "site-c");
  for (const v1::FanoutLeg& leg : legs) EXPECT_EQ(leg.state(), v1::QUEUED);
}

}  // namespace
}  // namespace longhaul::daemon
