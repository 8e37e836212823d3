#include "daemon/transfer/remote_copy.h"

#include <string>

#include "gtest/gtest.h"

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

}  // namespace
}  // namespace longhaul::daemon
