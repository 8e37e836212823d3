#include "daemon/transfer/destination_access.h"

#include <sys/stat.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/storage/test_util.h"

namespace longhaul::daemon {
namespace {

using storage::testing::MakeDirs;
using storage::testing::TempDir;
using storage::testing::WriteFile;
using ::testing::HasSubstr;

// A local user that owns none of the test's files, and a group it is in
// only when a test says so.
constexpr uid_t kStranger = 65534;
constexpr gid_t kTeam = 4242;

// Files and directories with owners and modes, below a fresh directory
// that every user may search. Needs root (chown); a test skips without it.
class OwnedTree {
 public:
  OwnedTree() { EXPECT_EQ(chmod(dir_.path().c_str(), 0755), 0); }

  std::string Dir(const std::string& rel, mode_t mode, uid_t uid = 0, gid_t gid = 0) {
    const std::string path = dir_.Sub(rel);
    MakeDirs(path);
    EXPECT_EQ(chown(path.c_str(), uid, gid), 0);
    EXPECT_EQ(chmod(path.c_str(), mode), 0);
    return path;
  }
  std::string File(const std::string& rel, uid_t uid = 0) {
    const std::string path = dir_.Sub(rel);
    WriteFile(path, std::string("data"));
    EXPECT_EQ(chown(path.c_str(), uid, 0), 0);
    EXPECT_EQ(chmod(path.c_str(), 0644), 0);
    return path;
  }

 private:
  TempDir dir_;
};

// Each case runs against both judges, which must agree where the mode bits
// tell everything (no ACLs here).
class JudgeWriteTest : public ::testing::TestWithParam<WriteJudge> {
 protected:
  void SetUp() override {
    if (geteuid() != 0) GTEST_SKIP() << "needs root: files are owned by other users";
  }

  std::string Dir(const std::string& rel, mode_t mode, uid_t uid = 0, gid_t gid = 0) {
    return tree_.Dir(rel, mode, uid, gid);
  }
  std::string File(const std::string& rel, uid_t uid = 0) { return tree_.File(rel, uid); }

  absl::Status Judge(const std::string& path, std::vector<gid_t> groups = {}) const {
    return JudgeWrite(GetParam(), {.uid = kStranger, .gid = kStranger, .groups = groups}, path);
  }

  OwnedTree tree_;
};

TEST_P(JudgeWriteTest, AStrangerWritesNothingInARootDirectory) {
  const std::string root_dir = Dir("root", 0755);
  const std::string file = File("root/model.bin");
  for (const std::string& path : {file, root_dir + "/new.bin", root_dir + "/a/b/new.bin"}) {
    absl::Status s = Judge(path);
    EXPECT_TRUE(absl::IsPermissionDenied(s)) << path << ": " << s;
    EXPECT_THAT(s.message(), HasSubstr("no write permission on directory " + root_dir +
                                       " (owner root, group root, mode 0755)"))
        << path;
  }
  // Root may.
  EXPECT_TRUE(JudgeWrite(GetParam(), {.uid = 0, .gid = 0}, file).ok());
}

TEST_P(JudgeWriteTest, AUserReplacesAndCreatesInADirectoryItMayWrite) {
  const std::string own = Dir("own", 0755, kStranger, kStranger);
  // Root's file in the user's directory: the user may replace the entry,
  // as `mv` over it would.
  EXPECT_TRUE(Judge(File("own/roots.bin")).ok());
  EXPECT_TRUE(Judge(own + "/new.bin").ok());
  EXPECT_TRUE(Judge(own + "/a/b/new").ok());  // the directories between are the pull's
  EXPECT_TRUE(Judge(Dir("own/tree", 0755)).ok());
}

TEST_P(JudgeWriteTest, GroupWritableDirectoriesNeedTheGroup) {
  const std::string team = Dir("team", 0770, 0, kTeam);
  EXPECT_TRUE(Judge(team + "/new.bin", {kTeam}).ok());
  EXPECT_TRUE(absl::IsPermissionDenied(Judge(team + "/new.bin")));
}

TEST_P(JudgeWriteTest, InAStickyDirectoryOnlyWhatTheUserOwnsIsReplaced) {
  const std::string shared = Dir("shared", 01777);
  EXPECT_TRUE(Judge(shared + "/new.bin").ok());
  EXPECT_TRUE(Judge(File("shared/mine.bin", kStranger)).ok());
  const std::string roots = File("shared/roots.bin");
  absl::Status s = Judge(roots);
  EXPECT_TRUE(absl::IsPermissionDenied(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("directory " + shared +
                                     " (owner root, group root, mode 1777) is sticky and uid "
                                     "65534 owns neither it nor " +
                                     roots));
}

TEST_P(JudgeWriteTest, EveryDirectoryOnTheWayMustBeSearchable) {
  const std::string closed = Dir("closed", 0700);
  const std::string open = Dir("closed/open", 0777, kStranger, kStranger);
  absl::Status s = Judge(open + "/new.bin");
  EXPECT_TRUE(absl::IsPermissionDenied(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("no search permission on directory " + closed +
                                     " (owner root, group root, mode 0700)"));
}

INSTANTIATE_TEST_SUITE_P(BothJudges, JudgeWriteTest,
                         ::testing::Values(WriteJudge::kKernel, WriteJudge::kModeBits),
                         [](const ::testing::TestParamInfo<WriteJudge>& info) {
                           return info.param == WriteJudge::kKernel ? "Kernel" : "ModeBits";
                         });

class DestinationAccessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (geteuid() != 0) GTEST_SKIP() << "needs root: files are owned by other users";
    export_ = tree_.Dir("export", 0755);
    tree_.Dir("export/pki", 0700);
    key_ = tree_.File("export/pki/site.key");
  }

  DestinationAccess Access() const {
    return DestinationAccess({{"ckpt", export_, {}, {}, 022}},
                             {{key_, "this site's TLS private key"}},
                             [](uid_t) { return std::vector<gid_t>{}; });
  }

  OwnedTree tree_;
  std::string export_;
  std::string key_;
};

TEST_F(DestinationAccessTest, ALocalUserPullsOnlyWhereItCouldWriteItself) {
  tree_.File("export/model.bin");
  tree_.Dir("export/mine", 0755, kStranger, kStranger);
  const DestinationAccess access = Access();
  const Caller stranger = Caller::LocalUser(kStranger, kStranger);
  absl::Status s = access.MayWrite(stranger, "ckpt", "model.bin");
  EXPECT_TRUE(absl::IsPermissionDenied(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("uid 65534 (nobody) may not write " + export_ +
                                     "/model.bin: no write permission on directory " + export_));
  EXPECT_THAT(s.message(), HasSubstr("a pull writes only where the user who asks for it could"));
  EXPECT_TRUE(access.MayWrite(stranger, "ckpt", "mine/model.bin").ok());
  EXPECT_TRUE(access.MayWrite(Caller::LocalUser(0, 0), "ckpt", "model.bin").ok());
  // An operator token writes with the daemon's rights; a viewer not at all.
  EXPECT_TRUE(access.MayWrite(Caller::Token(ControlRole::kOperator, "ip"), "ckpt", "x").ok());
  EXPECT_TRUE(absl::IsPermissionDenied(
      access.MayWrite(Caller::Token(ControlRole::kViewer, "ip"), "ckpt", "x")));
  // What the destination resolves refuses first.
  EXPECT_TRUE(absl::IsPermissionDenied(access.MayWrite(Caller::LocalUser(0, 0), "ckpt", "../x")));
}

TEST_F(DestinationAccessTest, TheSiteKeyAndWhatHoldsItAreNeverWrittenWhoeverAsks) {
  const DestinationAccess access = Access();
  for (const Caller& caller :
       {Caller::LocalUser(0, 0), Caller::Token(ControlRole::kOperator, "ip")}) {
    absl::Status key = access.MayWrite(caller, "ckpt", "pki/site.key");
    EXPECT_TRUE(absl::IsPermissionDenied(key)) << key;
    EXPECT_EQ(key.message(), "destination " + key_ + " is this site's TLS private key (" + key_ +
                                 "); a pull never writes it, whoever asks");
    absl::Status holder = access.MayWrite(caller, "ckpt", "pki");
    EXPECT_TRUE(absl::IsPermissionDenied(holder)) << holder;
    EXPECT_THAT(holder.message(), HasSubstr(" holds this site's TLS private key"));
  }
}

}  // namespace
}  // namespace longhaul::daemon
