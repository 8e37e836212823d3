#include "daemon/peer/destination_owners.h"

#include <set>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace longhaul::peer {
namespace {

v1::IncomingTransfer Record(const std::string& site, const std::string& dest,
                            v1::IncomingTransfer::State state, int64_t created_ms = 0) {
  v1::IncomingTransfer r;
  r.set_id("t-" + site + "-" + dest);
  r.set_source_site(site);
  r.set_export_name("ckpt");
  r.set_dest_path(dest);
  r.set_state(state);
  r.set_created_unix_ms(created_ms);
  return r;
}

class DestinationOwnersTest : public ::testing::Test {
 protected:
  DestinationOwnersTest()
      : owners_(
            [this]() -> absl::StatusOr<std::vector<v1::IncomingTransfer>> {
              ++loads_;
              if (!journal_error_.ok()) return journal_error_;
              return records_;
            },
            [this](const std::string& export_name, const std::string& relative) {
              return existing_.contains({export_name, relative});
            }) {}

  // site-a published ckpt:run1/step-1, which exists.
  void SiteAPublishedStep1() {
    records_.push_back(Record("site-a", "run1/step-1", v1::IncomingTransfer::PUBLISHED));
    existing_.insert({"ckpt", "run1/step-1"});
  }

  std::vector<v1::IncomingTransfer> records_;
  std::set<std::pair<std::string, std::string>> existing_;
  absl::Status journal_error_;
  int loads_ = 0;
  DestinationOwners owners_;
};

TEST_F(DestinationOwnersTest, OnlyPublishedRecordsMakeAnOwner) {
  SiteAPublishedStep1();
  records_.push_back(Record("site-a", "run1/step-2", v1::IncomingTransfer::RECEIVING));
  records_.push_back(Record("site-a", "run1/step-3", v1::IncomingTransfer::ABORTED));
  existing_.insert({"ckpt", "run1/step-2"});
  existing_.insert({"ckpt", "run1/step-3"});

  absl::Status s = owners_.Check("ckpt", "run1/step-1", "site-c");
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
  EXPECT_EQ(s.message(),
            "site-c may not publish ckpt:run1/step-1: ckpt:run1/step-1 was published by another "
            "site, and a site replaces or writes inside only what it published itself");
  EXPECT_TRUE(owners_.Check("ckpt", "run1/step-1", "site-a").ok());
  EXPECT_TRUE(owners_.Check("ckpt", "run1/step-2", "site-c").ok());
  EXPECT_TRUE(owners_.Check("ckpt", "run1/step-3", "site-c").ok());
  EXPECT_EQ(loads_, 1);  // read once, then kept up to date
}

TEST_F(DestinationOwnersTest, RefusesInsideAndAboveAnotherSitesDestination) {
  SiteAPublishedStep1();
  // Inside it, above it (replacing run1 would replace step-1 too).
  for (const char* path : {"run1/step-1/model.pt", "run1/step-1/a/b", "run1"}) {
    absl::Status s = owners_.Check("ckpt", path, "site-c");
    EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << path;
    EXPECT_NE(s.message().find("ckpt:run1/step-1 was published by another site"), std::string::npos)
        << s;
    EXPECT_EQ(s.message().find("site-a"), std::string::npos) << s;  // not site-c's business
  }
  // Beside it, including a name it is a prefix of, and in another export.
  for (const char* path : {"run1/step-2", "run1/step-10", "run1/step-1.bak", "run2"}) {
    EXPECT_TRUE(owners_.Check("ckpt", path, "site-c").ok()) << path;
  }
  EXPECT_TRUE(owners_.Check("scratch", "run1/step-1", "site-c").ok());
}

TEST_F(DestinationOwnersTest, AJournaledPathIsCleanedAsResolveDestinationDoes) {
  records_.push_back(Record("site-a", "./run1//step-1/", v1::IncomingTransfer::PUBLISHED));
  existing_.insert({"ckpt", "run1/step-1"});
  EXPECT_EQ(owners_.Check("ckpt", "run1/step-1", "site-c").code(),
            absl::StatusCode::kPermissionDenied);
}

TEST_F(DestinationOwnersTest, AGoneDestinationIsFreeForAnyWriter) {
  records_.push_back(Record("site-a", "run1/step-1", v1::IncomingTransfer::PUBLISHED));
  // Not in existing_: removed since.
  EXPECT_TRUE(owners_.Check("ckpt", "run1/step-1", "site-c").ok());
  owners_.Published("ckpt", "run1/step-1", "site-c");
  existing_.insert({"ckpt", "run1/step-1"});
  EXPECT_EQ(owners_.Check("ckpt", "run1/step-1", "site-a").code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(owners_.Check("ckpt", "run1/step-1", "site-c").ok());
}

TEST_F(DestinationOwnersTest, TheLastCreatedPublishOwnsAPath) {
  records_.push_back(Record("site-c", "run1/step-1", v1::IncomingTransfer::PUBLISHED, 2000));
  records_.push_back(Record("site-a", "run1/step-1", v1::IncomingTransfer::PUBLISHED, 1000));
  existing_.insert({"ckpt", "run1/step-1"});
  EXPECT_TRUE(owners_.Check("ckpt", "run1/step-1", "site-c").ok());
  EXPECT_FALSE(owners_.Check("ckpt", "run1/step-1", "site-a").ok());
}

TEST_F(DestinationOwnersTest, AClaimMakesOtherSitesWaitForOverlappingPaths) {
  ASSERT_TRUE(owners_.Claim("ckpt", "run1/step-1", "site-a").ok());
  for (const char* path : {"run1/step-1", "run1", "run1/step-1/x"}) {
    absl::Status s = owners_.Check("ckpt", path, "site-c");
    EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << path;
    EXPECT_NE(s.message().find("another site is publishing ckpt:"), std::string::npos) << s;
    EXPECT_EQ(owners_.Claim("ckpt", path, "site-c").code(), absl::StatusCode::kUnavailable);
  }
  EXPECT_TRUE(owners_.Check("ckpt", "run1/step-2", "site-c").ok());
  // The same site's second transfer to the path is not held up.
  ASSERT_TRUE(owners_.Claim("ckpt", "run1/step-1", "site-a").ok());
  owners_.Release("ckpt", "run1/step-1", "site-a");
  EXPECT_EQ(owners_.Check("ckpt", "run1", "site-c").code(), absl::StatusCode::kUnavailable);
  owners_.Release("ckpt", "run1/step-1", "site-a");
  EXPECT_TRUE(owners_.Check("ckpt", "run1", "site-c").ok());
}

TEST_F(DestinationOwnersTest, OwnedBelowListsTheSitesOwnChildrenOnly) {
  SiteAPublishedStep1();
  for (const char* dest : {"run1/step-2", "run1/step-2/extra", "run2/step-1", "run1"}) {
    records_.push_back(Record("site-a", dest, v1::IncomingTransfer::PUBLISHED));
  }
  records_.push_back(Record("site-c", "run1/step-5", v1::IncomingTransfer::PUBLISHED));
  auto a = owners_.OwnedBelow("ckpt", "run1", "site-a");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(*a, (absl::flat_hash_set<std::string>{"step-1", "step-2"}));
  auto c = owners_.OwnedBelow("ckpt", "run1", "site-c");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(*c, absl::flat_hash_set<std::string>{"step-5"});
  auto root = owners_.OwnedBelow("ckpt", "", "site-a");
  ASSERT_TRUE(root.ok());
  EXPECT_EQ(*root, absl::flat_hash_set<std::string>{"run1"});
  owners_.Forget("ckpt", "run1/step-1");
  EXPECT_EQ(*owners_.OwnedBelow("ckpt", "run1", "site-a"),
            absl::flat_hash_set<std::string>{"step-2"});
}

TEST_F(DestinationOwnersTest, AnUnreadableJournalRefusesUntilItCanBeRead) {
  SiteAPublishedStep1();
  journal_error_ = absl::DataLossError("bad record");
  absl::Status s = owners_.Check("ckpt", "run2", "site-c");
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(s.message().find("bad record"), std::string::npos);
  EXPECT_FALSE(owners_.OwnedBelow("ckpt", "run1", "site-a").ok());
  journal_error_ = absl::OkStatus();
  EXPECT_TRUE(owners_.Check("ckpt", "run2", "site-c").ok());
  EXPECT_FALSE(owners_.Check("ckpt", "run1/step-1", "site-c").ok());
}

// A third-party copy is published by its source on its requester's
// request: the two together are its publisher, apart from the source alone.
TEST_F(DestinationOwnersTest, APublishOnAnotherSitesRequestBelongsToBothSites) {
  SiteAPublishedStep1();
  v1::IncomingTransfer copied = Record("site-a", "run1/step-2", v1::IncomingTransfer::PUBLISHED);
  copied.set_requested_by("site-c");
  records_.push_back(copied);
  existing_.insert({"ckpt", "run1/step-2"});

  absl::Status s = owners_.Check("ckpt", "run1/step-1", "site-a", "site-c");
  EXPECT_EQ(s.message(),
            "site-a on site-c's request may not publish ckpt:run1/step-1: ckpt:run1/step-1 was "
            "published by site-a, and a site replaces or writes inside only what it published "
            "itself");
  s = owners_.Check("ckpt", "run1/step-2", "site-a");
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(s.message().find("was published by site-a on site-c's request"),
            absl::string_view::npos)
      << s;
  EXPECT_TRUE(owners_.Check("ckpt", "run1/step-2", "site-a", "site-c").ok());
  EXPECT_EQ(*owners_.OwnedBelow("ckpt", "run1", "site-a"),
            absl::flat_hash_set<std::string>({"step-1"}));
  EXPECT_EQ(*owners_.OwnedBelow("ckpt", "run1", "site-a", "site-c"),
            absl::flat_hash_set<std::string>({"step-2"}));

  // A claim by one publisher keeps the other out meanwhile.
  ASSERT_TRUE(owners_.Claim("ckpt", "run1/step-3", "site-a", "site-c").ok());
  EXPECT_EQ(owners_.Check("ckpt", "run1/step-3", "site-a").code(), absl::StatusCode::kUnavailable);
  owners_.Release("ckpt", "run1/step-3", "site-a", "site-c");
  EXPECT_TRUE(owners_.Check("ckpt", "run1/step-3", "site-a").ok());
}

}  // namespace
}  // namespace longhaul::peer
