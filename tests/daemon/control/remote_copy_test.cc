#include "daemon/transfer/remote_copy.h"

#include <functional>
#include <string>

#include "daemon/wire/messaging.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/test_tools/fake_transport.h"

namespace longhaul::daemon {
namespace {

// site-a, whose export "ckpt" lets site-b read (not site-c), as a source
// asked by a peer over a REMOTE channel.
class CheckRemoteSubmitTest : public ::testing::Test {
 protected:
  void SetUp() override {
    config_.site = "site-a";
    config_.peers = {{"site-b", "127.0.0.1:1", "tcp", 0}, {"site-c", "127.0.0.1:2", "tcp", 0}};
    ExportConfig e;
    e.name = "ckpt";
    e.path = "/data/ckpt";
    e.writers = {"site-c"};
    e.readers = {"site-b"};
    config_.exports = {e};
  }

  static v1::TransferSpec Pull(const std::string& path, const std::string& dest = "site-b") {
    v1::TransferSpec spec;
    spec.set_source_export("ckpt");
    spec.set_source_path(path);
    spec.set_dest_site(dest);
    spec.set_dest_export("ckpt");
    spec.set_dest_path("step-100");
    return spec;
  }

  DaemonConfig config_;
};

TEST_F(CheckRemoteSubmitTest, AReaderPullsAndAThirdPartyReaderCopiesAPathInsideTheExport) {
  auto pull = CheckRemoteSubmit(config_, "site-b", Pull("runs/step-100"));
  ASSERT_TRUE(pull.ok()) << pull.status();
  EXPECT_EQ((*pull)->name, "ckpt");
  EXPECT_EQ(RemoteSourcePath(**pull, Pull("runs/step-100")), "/data/ckpt/runs/step-100");
  // Third party: site-b asks site-a to send to site-c.
  EXPECT_TRUE(CheckRemoteSubmit(config_, "site-b", Pull("step-100", "site-c")).ok());
}

TEST_F(CheckRemoteSubmitTest, ASiteNotInReadersIsRefusedWithWhatToFix) {
  // site-c may write into the export, which is not reading it.
  auto refused = CheckRemoteSubmit(config_, "site-c", Pull("step-100", "site-c"));
  ASSERT_TRUE(absl::IsPermissionDenied(refused.status())) << refused.status();
  EXPECT_EQ(refused.status().message(),
            "site-a's export 'ckpt' does not exist or does not list site-c in readers; add it to "
            "exports[].readers at site-a");
  config_.exports[0].readers.clear();
  EXPECT_TRUE(
      absl::IsPermissionDenied(CheckRemoteSubmit(config_, "site-b", Pull("step-100")).status()));
}

TEST_F(CheckRemoteSubmitTest, PathsThatAreNotCleanAndBelowTheExportAreRefused) {
  for (const char* path : {"", "/etc/passwd", "..", "../outside", "step-100/../../x", "a//b",
                           "./step-100", "step-100/.", ".longhaul", ".longhaul/staging/t-1"}) {
    EXPECT_FALSE(CheckRemoteSubmit(config_, "site-b", Pull(path)).ok()) << path;
  }
  // An export that does not exist is refused as one that does not list the
  // requester: a non-reader learns nothing of which exports exist.
  v1::TransferSpec other = Pull("x");
  other.set_source_export("other");
  const absl::Status missing = CheckRemoteSubmit(config_, "site-c", other).status();
  other.set_source_export("ckpt");
  const absl::Status not_listed = CheckRemoteSubmit(config_, "site-c", other).status();
  EXPECT_TRUE(absl::IsPermissionDenied(missing)) << missing;
  EXPECT_EQ(missing.code(), not_listed.code());
  EXPECT_EQ(missing.message(),
            "site-a's export 'other' does not exist or does not list site-c in readers; add it "
            "to exports[].readers at site-a");
}

TEST_F(CheckRemoteSubmitTest, ARequesterIsItsChannelsSiteNeverAClaimedOne) {
  // site-c is no reader; claiming to be site-b does not make it one.
  v1::TransferSpec claimed = Pull("step-100", "site-c");
  claimed.set_requested_by("site-b");
  auto refused = CheckRemoteSubmit(config_, "site-c", claimed);
  ASSERT_TRUE(absl::IsPermissionDenied(refused.status())) << refused.status();
  EXPECT_NE(refused.status().message().find("came from site-c"), absl::string_view::npos);
}

TEST_F(CheckRemoteSubmitTest, LocalSourcesAndThisSiteAsDestinationAreRefused) {
  v1::TransferSpec local = Pull("step-100");
  local.add_sources("/etc");
  EXPECT_TRUE(absl::IsInvalidArgument(CheckRemoteSubmit(config_, "site-b", local).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(
      CheckRemoteSubmit(config_, "site-b", Pull("step-100", "site-a")).status()));
  v1::TransferSpec elsewhere = Pull("step-100");
  elsewhere.set_source_site("site-c");
  EXPECT_TRUE(absl::IsInvalidArgument(CheckRemoteSubmit(config_, "site-b", elsewhere).status()));
}

using ::testing::EndsWith;
using ::testing::HasSubstr;

// A source site-b, reached over a FakeTransport, that answers every REMOTE
// request with the status `answer_` (a hostile or a merely verbose source).
class CallRemoteTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(
        transport_
            .Listen(site_.address,
                    [this](std::unique_ptr<transport::Channel> channel) {
                      v1::Hello hello;
                      if (!wire::ReadProto(*channel, wire::FrameType::kHello, 0, &hello).ok()) {
                        return;
                      }
                      v1::PeerMessage request;
                      while (
                          wire::ReadProto(*channel, wire::FrameType::kControl, 0, &request).ok()) {
                        v1::PeerMessage answer;
                        answer.set_request_id(request.request_id());
                        *answer.mutable_remote_reply()->mutable_status() = answer_;
                        if (!wire::SendProto(*channel, wire::FrameType::kControl, 0, answer).ok()) {
                          return;
                        }
                      }
                    })
            .ok());
  }

  absl::StatusOr<v1::TransferStatus> AskStatus() {
    v1::PeerMessage request;
    request.mutable_remote_get()->set_transfer_id("t-1");
    return CallRemote(transport_, site_, request);
  }

  const PeerConfig site_{"site-b", "site-b.test:7700", "tcp", 0};
  v1::TransferStatus answer_;
  transport::testing::FakeTransport transport_{"site-a"};
};

TEST_F(CallRemoteTest, AnAnswerPastTheRemoteLimitIsRefusedNamingTheSourceAndTheLimit) {
  answer_.set_id("t-1");
  answer_.set_state(v1::RUNNING);
  answer_.set_error(std::string(size_t{1} << 20, 'x'));
  absl::StatusOr<v1::TransferStatus> status = AskStatus();
  ASSERT_TRUE(absl::IsInvalidArgument(status.status()))
      << (status.ok() ? "accepted an answer of " + std::to_string(status->ByteSizeLong()) + " bytes"
                      : status.status().ToString());
  EXPECT_THAT(std::string(status.status().message()), HasSubstr("site-b"));
  EXPECT_THAT(std::string(status.status().message()),
              HasSubstr("limit of " + std::to_string(kMaxRemoteMessage) + " bytes"));
}

TEST_F(CallRemoteTest, AnAnswerWithinTheLimitIsKeptWithItsErrorCut) {
  answer_.set_id("t-1");
  answer_.set_state(v1::RUNNING);
  answer_.set_error(std::string(60 << 10, 'x'));
  absl::StatusOr<v1::TransferStatus> status = AskStatus();
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_EQ(status->id(), "t-1");
  EXPECT_LE(status->error().size(), kMaxRemoteError);
  EXPECT_THAT(status->error(), EndsWith(" [cut]"));
}

TEST(FitRemoteStatusTest, ListsFewerSkippedEntriesAndSaysHowManyMore) {
  v1::TransferStatus status;
  status.set_id("t-1");
  status.mutable_spec()->set_dest_path(std::string(1000, 'd'));
  for (int i = 0; i < 5000; ++i) {
    v1::SkippedEntry* e = status.add_skipped();
    e->set_path("dir/link-" + std::to_string(i));
    e->set_why("symlink not followed: its target is outside the export");
  }
  ASSERT_GT(status.ByteSizeLong(), kMaxRemoteMessage);
  FitRemoteStatus(status, kMaxRemoteMessage);
  EXPECT_LE(status.ByteSizeLong(), kMaxRemoteMessage);
  EXPECT_EQ(status.id(), "t-1");
  EXPECT_FALSE(status.has_spec());  // the requester keeps its own
  ASSERT_GT(status.skipped_size(), 100);
  EXPECT_EQ(status.skipped(0).path(), "dir/link-0");
  const int listed = status.skipped_size() - 1;
  EXPECT_EQ(status.skipped(listed - 1).path(), "dir/link-" + std::to_string(listed - 1));
  EXPECT_THAT(status.skipped(listed).why(),
              HasSubstr(std::to_string(5000 - listed) + " more entries"));
}

TEST(FitRemoteStatusTest, AStatusThatFitsKeepsEverythingButOverlongErrors) {
  v1::TransferStatus status;
  status.set_id("t-1");
  status.mutable_spec()->set_dest_path("step-100");
  status.add_skipped()->set_path("a");
  status.add_destinations()->set_error(std::string(10000, 'e'));
  status.set_error("disk full at site-c");
  FitRemoteStatus(status, kMaxRemoteMessage);
  EXPECT_EQ(status.spec().dest_path(), "step-100");
  EXPECT_EQ(status.skipped_size(), 1);
  EXPECT_EQ(status.error(), "disk full at site-c");
  EXPECT_LE(status.destinations(0).error().size(), kMaxRemoteError);
}

TEST(CutTextTest, CutsOnACharacterBoundaryAndMarksTheCut) {
  std::string text;
  for (int i = 0; i < 100; ++i) text += "\xc3\xa9\xe2\x82\xac";  // "é€"
  std::string cut = text;
  CutText(cut, 64);
  EXPECT_LE(cut.size(), 64u);
  ASSERT_THAT(cut, EndsWith(" [cut]"));
  const std::string kept = cut.substr(0, cut.size() - 6);
  EXPECT_EQ(text.compare(0, kept.size(), kept), 0);
  // It ends where a character ends: the next byte of the original starts one.
  EXPECT_NE(static_cast<uint8_t>(text[kept.size()]) & 0xC0, 0x80);
  std::string short_text = "fine";
  CutText(short_text, 64);
  EXPECT_EQ(short_text, "fine");
}

}  // namespace
}  // namespace longhaul::daemon
