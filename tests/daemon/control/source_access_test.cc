#include "daemon/transfer/source_access.h"

#include <sys/stat.h>
#include <unistd.h>

#include <climits>
#include <cstdlib>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "storage/manifest.h"
#include "tests/storage/test_util.h"

namespace longhaul::daemon {
namespace {

using storage::testing::MakeDirs;
using storage::testing::TempDir;
using storage::testing::WriteFile;

// A local user that owns none of the test's files; its only group is the
// test's group when `in_group`.
constexpr uid_t kStranger = 65534;

std::string Real(const std::string& path) {
  char buf[PATH_MAX];
  EXPECT_NE(realpath(path.c_str(), buf), nullptr) << path;
  return buf;
}

class SourceAccessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // The temporary directory and its parents must be searchable by the
    // stranger for any of its files to be readable.
    ASSERT_EQ(chmod(dir_.path().c_str(), 0755), 0);
    MakeDirs(dir_.Sub("export/ckpt"));
    MakeDirs(dir_.Sub("outside"));
    WriteFile(dir_.Sub("outside/secret.bin"), std::string("outside"));
    exports_ = {{"ckpt", dir_.Sub("export"), {}, {}, 022}};
  }

  SourceAccess Access(bool stranger_in_group = false) const {
    const gid_t group = getegid();
    return SourceAccess(exports_, {{dir_.Sub("export/site.key"), "this site's TLS private key"}},
                        [stranger_in_group, group](uid_t uid) {
                          return uid == kStranger && stranger_in_group ? std::vector<gid_t>{group}
                                                                       : std::vector<gid_t>{};
                        });
  }

  static Caller Stranger() { return Caller::LocalUser(kStranger, kStranger); }
  static Caller Root() { return Caller::LocalUser(0, 0); }

  std::string File(const std::string& rel, mode_t mode) {
    WriteFile(dir_.Sub(rel), std::string("data of ") + rel);
    EXPECT_EQ(chmod(dir_.Sub(rel).c_str(), mode), 0);
    return dir_.Sub(rel);
  }

  absl::Status Sources(const SourceAccess& access, const Caller& caller,
                       std::vector<std::string> sources) {
    return access.CheckSources(caller, sources).status();
  }

  TempDir dir_;
  std::vector<ExportConfig> exports_;
};

void ExpectRefused(const absl::Status& s, const std::string& needle) {
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
  EXPECT_NE(s.message().find(needle), absl::string_view::npos) << s << "\nexpected: " << needle;
}

TEST_F(SourceAccessTest, RefusesSourcesOutsideEveryExportNamingTheExports) {
  const std::string secret = dir_.Sub("outside/secret.bin");
  for (const Caller& caller : {Root(), Caller::Token(ControlRole::kOperator, "ipv4:127.0.0.1:1")}) {
    absl::Status s = Sources(Access(), caller, {secret});
    ExpectRefused(s, "source " + secret +
                         " is outside this site's exports (ckpt: " + dir_.Sub("export") + ")");
  }
  File("export/ckpt/ok.bin", 0644);
  auto resolved = Access().CheckSources(Root(), {dir_.Sub("export/ckpt/ok.bin")});
  ASSERT_TRUE(resolved.ok()) << resolved.status();
  EXPECT_EQ(*resolved, std::vector<std::string>{Real(dir_.Sub("export/ckpt/ok.bin"))});
}

TEST_F(SourceAccessTest, JudgesASymlinkedSourceByItsTarget) {
  ASSERT_EQ(symlink(dir_.Sub("outside/secret.bin").c_str(), dir_.Sub("export/leak").c_str()), 0);
  ASSERT_EQ(symlink(dir_.Sub("outside").c_str(), dir_.Sub("export/leakdir").c_str()), 0);
  ExpectRefused(
      Sources(Access(), Root(), {dir_.Sub("export/leak")}),
      "(resolves to " + Real(dir_.Sub("outside/secret.bin")) + ") is outside this site's exports");
  ExpectRefused(Sources(Access(), Root(), {dir_.Sub("export/leakdir")}),
                "is outside this site's exports");
  // A symlink from outside into an export is judged by where it lands.
  File("export/ckpt/in.bin", 0644);
  ASSERT_EQ(symlink(dir_.Sub("export/ckpt/in.bin").c_str(), dir_.Sub("outside/in-link").c_str()),
            0);
  auto resolved = Access().CheckSources(Root(), {dir_.Sub("outside/in-link")});
  ASSERT_TRUE(resolved.ok()) << resolved.status();
  EXPECT_EQ((*resolved)[0], Real(dir_.Sub("export/ckpt/in.bin")));
}

TEST_F(SourceAccessTest, NeverSendsTheDaemonsSecretsEvenInsideAnExport) {
  const std::string key = File("export/site.key", 0600);
  ExpectRefused(Sources(Access(), Root(), {key}), "is this site's TLS private key");
  // Nor as part of a directory.
  storage::ManifestBuild build;
  const std::string root = dir_.Sub("export");
  auto resolved = Access().CheckSources(Root(), {root});
  ASSERT_TRUE(resolved.ok()) << resolved.status();
  auto built = storage::BuildManifest({root}, 1 << 20);
  ASSERT_TRUE(built.ok()) << built.status();
  ExpectRefused(Access().CheckBuild(Root(), {root}, *resolved, &*built),
                "is this site's TLS private key");
}

TEST_F(SourceAccessTest, AStrangerGetsOnlyWhatTheModeBitsGiveIt) {
  const std::string closed = File("export/ckpt/closed.bin", 0600);
  const std::string open = File("export/ckpt/open.bin", 0604);
  const std::string group = File("export/ckpt/group.bin", 0640);
  ExpectRefused(Sources(Access(), Stranger(), {closed}),
                "uid 65534 (nobody) may not read " + Real(closed) + " (owner ");
  EXPECT_TRUE(Sources(Access(), Stranger(), {open}).ok());
  ExpectRefused(Sources(Access(), Stranger(), {group}), "may not read");
  EXPECT_TRUE(Sources(Access(/*stranger_in_group=*/true), Stranger(), {group}).ok());
  // The gid the caller connected with counts as one of its groups.
  EXPECT_TRUE(Sources(Access(), Caller::LocalUser(kStranger, getegid()), {group}).ok());
  // Root reads everything inside the exports.
  EXPECT_TRUE(Sources(Access(), Root(), {closed}).ok());
}

TEST_F(SourceAccessTest, TheOwnerClassDecidesForTheFilesOwner) {
  const std::string f = File("export/ckpt/owned.bin", 0044);
  uid_t owner = geteuid();
  if (owner == 0) {
    ASSERT_EQ(chown(f.c_str(), kStranger, static_cast<gid_t>(-1)), 0);
    owner = kStranger;
  }
  // Group and other may read it, its owner may not.
  ExpectRefused(Sources(Access(true), Caller::LocalUser(owner, getegid()), {f}), "may not read");
  ASSERT_EQ(chmod(f.c_str(), 0400), 0);
  EXPECT_TRUE(Sources(Access(true), Caller::LocalUser(owner, getegid()), {f}).ok());
}

TEST_F(SourceAccessTest, EveryDirectoryOnTheWayMustBeSearchable) {
  MakeDirs(dir_.Sub("export/ckpt/private"));
  const std::string f = File("export/ckpt/private/open.bin", 0644);
  ASSERT_EQ(chmod(dir_.Sub("export/ckpt/private").c_str(), 0700), 0);
  const std::string expected = "uid 65534 (nobody) may not search directory " +
                               Real(dir_.Sub("export/ckpt/private")) + " (owner ";
  absl::Status existing = Sources(Access(), Stranger(), {f});
  ExpectRefused(existing, expected);
  EXPECT_NE(existing.message().find("on the way to " + Real(f)), absl::string_view::npos)
      << existing;
  // A missing file there gets the same answer: the stranger learns nothing
  // it could not see itself.
  ExpectRefused(Sources(Access(), Stranger(), {dir_.Sub("export/ckpt/private/missing.bin")}),
                expected);
}

TEST_F(SourceAccessTest, AStrangerIsNotToldWhatExistsOutsideTheExports) {
  absl::Status existing = Sources(Access(), Stranger(), {dir_.Sub("outside/secret.bin")});
  absl::Status missing = Sources(Access(), Stranger(), {dir_.Sub("outside/missing.bin")});
  ExpectRefused(existing, "does not exist or is outside this site's exports (ckpt: ");
  ExpectRefused(missing, "does not exist or is outside this site's exports (ckpt: ");
  EXPECT_EQ(existing.message().find("resolves to"), absl::string_view::npos) << existing;
  // Root is told precisely.
  absl::Status root_missing = Sources(Access(), Root(), {dir_.Sub("outside/missing.bin")});
  EXPECT_EQ(root_missing.code(), absl::StatusCode::kInvalidArgument) << root_missing;
  EXPECT_NE(root_missing.message().find("No such file or directory"), absl::string_view::npos);
}

TEST_F(SourceAccessTest, ATokenCallerReadsWithTheDaemonsRightsInsideTheExports) {
  const std::string closed = File("export/ckpt/closed.bin", 0600);
  const Caller viewer = Caller::Token(ControlRole::kOperator, "ipv4:10.0.0.1:5");
  EXPECT_TRUE(Sources(Access(), viewer, {closed}).ok());
  EXPECT_EQ(viewer.ToString(), "ipv4:10.0.0.1:5 (token role operator)");
}

class SourceAccessBuildTest : public SourceAccessTest {
 protected:
  // CheckSources, BuildManifest and CheckBuild as the manager runs them.
  absl::Status Submit(const SourceAccess& access, const Caller& caller,
                      const std::vector<std::string>& sources,
                      storage::ManifestBuild* out = nullptr) {
    auto resolved = access.CheckSources(caller, sources);
    if (!resolved.ok()) return resolved.status();
    auto built = storage::BuildManifest(sources, 1 << 20);
    if (!built.ok()) return built.status();
    absl::Status s = access.CheckBuild(caller, sources, *resolved, &*built);
    if (out != nullptr) *out = std::move(*built);
    return s;
  }
};

TEST_F(SourceAccessBuildTest, EveryFileTheWalkReachesIsChecked) {
  MakeDirs(dir_.Sub("export/ckpt/run/step-1"));
  File("export/ckpt/run/step-1/a.bin", 0644);
  const std::string b = File("export/ckpt/run/step-1/b.bin", 0600);
  const std::string run = dir_.Sub("export/ckpt/run");
  ExpectRefused(Submit(Access(), Stranger(), {run}), "may not read " + Real(b));
  ASSERT_EQ(chmod(b.c_str(), 0644), 0);
  EXPECT_TRUE(Submit(Access(), Stranger(), {run}).ok());
  // A directory the walk lists must be listable, not only searchable.
  ASSERT_EQ(chmod(dir_.Sub("export/ckpt/run/step-1").c_str(), 0711), 0);
  ExpectRefused(Submit(Access(), Stranger(), {run}),
                "may not list directory " + Real(dir_.Sub("export/ckpt/run/step-1")));
  // Above the source, searching is enough.
  ASSERT_EQ(chmod(dir_.Sub("export/ckpt/run/step-1").c_str(), 0755), 0);
  ASSERT_EQ(chmod(dir_.Sub("export/ckpt").c_str(), 0711), 0);
  EXPECT_TRUE(Submit(Access(), Stranger(), {run}).ok());
}

TEST_F(SourceAccessBuildTest, EmptyDirectoriesAreCheckedToo) {
  MakeDirs(dir_.Sub("export/ckpt/run/closed/empty"));
  File("export/ckpt/run/a.bin", 0644);
  ASSERT_EQ(chmod(dir_.Sub("export/ckpt/run/closed").c_str(), 0700), 0);
  ExpectRefused(Submit(Access(), Stranger(), {dir_.Sub("export/ckpt/run")}),
                "may not search directory " + Real(dir_.Sub("export/ckpt/run/closed")));
  // With several sources, an empty directory lands under its source's name.
  MakeDirs(dir_.Sub("export/ckpt/other"));
  ExpectRefused(
      Submit(Access(), Stranger(), {dir_.Sub("export/ckpt/other"), dir_.Sub("export/ckpt/run")}),
      "may not search directory " + Real(dir_.Sub("export/ckpt/run/closed")));
  EXPECT_TRUE(
      Submit(Access(), Root(), {dir_.Sub("export/ckpt/other"), dir_.Sub("export/ckpt/run")}).ok());
}

TEST_F(SourceAccessBuildTest, TheSenderGetsTheResolvedPathsThatWereChecked) {
  MakeDirs(dir_.Sub("export/ckpt/real"));
  File("export/ckpt/real/a.bin", 0644);
  ASSERT_EQ(symlink(dir_.Sub("export/ckpt/real").c_str(), dir_.Sub("export/ckpt/alias").c_str()),
            0);
  storage::ManifestBuild build;
  ASSERT_TRUE(Submit(Access(), Stranger(), {dir_.Sub("export/ckpt/alias")}, &build).ok());
  ASSERT_EQ(build.source_paths.size(), 1u);
  EXPECT_EQ(build.source_paths[0], Real(dir_.Sub("export/ckpt/real/a.bin")));
  EXPECT_EQ(build.manifest.files(0).path(), "a.bin");
}

}  // namespace
}  // namespace longhaul::daemon
