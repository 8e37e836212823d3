#include "storage/exports.h"

#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <unistd.h>

#include "gtest/gtest.h"
#include "tests/storage/test_util.h"

namespace longhaul::storage {
namespace {

using testing::MakeDirs;
using testing::TempDir;
using testing::WriteFile;

class ResolveDestinationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    MakeDirs(dir_.Sub("export/ckpt"));
    MakeDirs(dir_.Sub("outside"));
    WriteFile(dir_.Sub("export/plain"), std::string("x"));
    ASSERT_EQ(symlink(dir_.Sub("outside").c_str(), dir_.Sub("export/escape").c_str()), 0);
    ASSERT_EQ(symlink("ckpt", dir_.Sub("export/inner-link").c_str()), 0);
    exports_ = {{"data", dir_.Sub("export")}, {"scratch", dir_.Sub("outside")}};
  }
  absl::StatusCode Code(std::string_view path) {
    return ResolveDestination(exports_, "data", path).status().code();
  }
  TempDir dir_;
  std::vector<Export> exports_;
};

TEST_F(ResolveDestinationTest, ResolvesCleanPaths) {
  auto r = ResolveDestination(exports_, "data", "ckpt/step-1/");
  ASSERT_TRUE(r.ok()) << r.status();
  char real[PATH_MAX];
  ASSERT_NE(realpath(dir_.Sub("export").c_str(), real), nullptr);
  EXPECT_EQ(r->export_root, real);
  EXPECT_EQ(r->relative, "ckpt/step-1");
  EXPECT_EQ(r->absolute, std::string(real) + "/ckpt/step-1");

  r = ResolveDestination(exports_, "data", "./new//dir/./x");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->relative, "new/dir/x");
  // An existing regular file may be the destination itself (single file).
  EXPECT_TRUE(ResolveDestination(exports_, "data", "plain").ok());
}

TEST_F(ResolveDestinationTest, RefusesUnknownExportListingTheKnownOnes) {
  auto r = ResolveDestination(exports_, "nope", "x");
  EXPECT_EQ(r.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(r.status().message().find("no export named \"nope\"; exports: data, scratch"),
            absl::string_view::npos)
      << r.status();
}

TEST_F(ResolveDestinationTest, RefusesBadPaths) {
  EXPECT_EQ(Code(""), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(Code("."), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(Code("/etc/passwd"), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(Code(".."), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(Code("ckpt/../../outside"), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(Code("a/.."), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(Code(std::string("a\0b", 3)), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(Code(".longhaul"), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(Code(".longhaul/staging/t1"), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(Code("./.longhaul/x"), absl::StatusCode::kPermissionDenied);
}

TEST_F(ResolveDestinationTest, RefusesSymlinkEscapes) {
  auto r = ResolveDestination(exports_, "data", "escape/file");
  EXPECT_EQ(r.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(r.status().message().find("symlink"), absl::string_view::npos) << r.status();
  // Even a symlink that stays inside the export is refused: nothing is followed.
  EXPECT_EQ(Code("inner-link/x"), absl::StatusCode::kPermissionDenied);
  // ...including as the last component.
  EXPECT_EQ(Code("escape"), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(Code("plain/below-a-file"), absl::StatusCode::kFailedPrecondition);
}

TEST_F(ResolveDestinationTest, OpenDirBeneathRefusesSymlinksAndCreates) {
  int root = open(dir_.Sub("export").c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  ASSERT_GE(root, 0);
  auto fd = OpenDirBeneath(root, "escape", /*create=*/true, "export");
  EXPECT_EQ(fd.status().code(), absl::StatusCode::kPermissionDenied);
  fd = OpenDirBeneath(root, "made/for/you", /*create=*/false, "export");
  EXPECT_EQ(fd.status().code(), absl::StatusCode::kNotFound);
  fd = OpenDirBeneath(root, "made/for/you", /*create=*/true, "export");
  ASSERT_TRUE(fd.ok()) << fd.status();
  close(*fd);
  EXPECT_TRUE(testing::Exists(dir_.Sub("export/made/for/you")));
  close(root);
}

}  // namespace
}  // namespace longhaul::storage
