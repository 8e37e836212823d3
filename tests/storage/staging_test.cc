#include "storage/staging.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "storage/chunk_io.h"
#include "storage/file_system.h"
#include "storage/posix_util.h"
#include "tests/storage/test_util.h"

namespace longhaul::storage {
namespace {

using testing::Bytes;
using testing::Exists;
using testing::MakeDirs;
using testing::ReadFile;
using testing::TempDir;
using testing::WriteFile;

constexpr int64_t kMtime = 1700000000123456789;  // ns precision on purpose

v1::ManifestFile File(const std::string& path, uint64_t size, uint32_t mode, int64_t mtime) {
  v1::ManifestFile f;
  f.set_path(path);
  f.set_size(size);
  f.set_mode(mode);
  f.set_mtime_ns(mtime);
  return f;
}

class StagingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    MakeDirs(dir_.Sub("export"));
    exports_ = {{"data", dir_.Sub("export")}};
    m_.set_chunk_size(64 << 10);
    // A DCP-like checkpoint: data shards, a metadata marker, a COMPLETE marker.
    *m_.add_files() = File("shard-0.distcp", 70000, 0644, kMtime);
    *m_.add_files() = File("nested/shard-1.distcp", 1, 0600, kMtime + 1);
    *m_.add_files() = File(".metadata", 300, 0644, kMtime + 2);
    *m_.add_files() = File("nested/COMPLETE", 0, 0444, kMtime + 3);
    *m_.add_files() = File("model.index.json", 50, 0640, kMtime + 4);
    m_.add_empty_dirs("logs/empty");
    opts_.commit_last = {".metadata", "*.index.json", "COMPLETE"};
  }

  absl::StatusOr<Staging> Open(const std::string& rel, const std::string& id) {
    return Staging::Open(PosixFileSystem(), Resolve(rel), id);
  }

  ResolvedDestination Resolve(const std::string& rel) {
    auto r = ResolveDestination(exports_, "data", rel);
    EXPECT_TRUE(r.ok()) << r.status();
    return *r;
  }

  // Stages every non-empty file of m_ with deterministic content, as the
  // receiver would; 0-byte files are left to Publish.
  void StageAll(Staging& s) {
    for (int i = 0; i < m_.files_size(); ++i) {
      if (m_.files(i).size() == 0) continue;
      auto file = s.OpenFile(i, m_.files(i));
      ASSERT_TRUE(file.ok()) << file.status();
      auto data = Bytes(m_.files(i).size(), i);
      ASSERT_TRUE((*file)->WriteAt(0, data).ok());
      ASSERT_TRUE((*file)->Sync().ok());
    }
  }

  void ExpectPublished(const std::string& root) { ExpectPublishedFiles(root, m_.files_size()); }
  void ExpectPublishedExceptLast(const std::string& root) {
    ExpectPublishedFiles(root, m_.files_size() - 1);
  }

  void ExpectPublishedFiles(const std::string& root, int files) {
    for (int i = 0; i < files; ++i) {
      const v1::ManifestFile& f = m_.files(i);
      const std::string path = root + "/" + f.path();
      auto data = Bytes(f.size(), i);
      EXPECT_EQ(ReadFile(path), std::string(data.begin(), data.end())) << path;
      struct stat st;
      ASSERT_EQ(lstat(path.c_str(), &st), 0) << path;
      EXPECT_EQ(st.st_mode & 07777, f.mode()) << path;
      EXPECT_EQ(st.st_mtim.tv_sec * 1000000000LL + st.st_mtim.tv_nsec, f.mtime_ns()) << path;
    }
    struct stat st;
    ASSERT_EQ(stat((root + "/logs/empty").c_str(), &st), 0);
    EXPECT_TRUE(S_ISDIR(st.st_mode));
  }

  TempDir dir_;
  std::vector<Export> exports_;
  v1::Manifest m_;
  PublishOptions opts_;
};

TEST_F(StagingTest, StagesByIndexNotByPath) {
  auto s = Open("ckpt/step-1", "t1");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->dir(), Resolve("ckpt/step-1").export_root + "/.longhaul/staging/t1");
  auto file = s->OpenFile(1, m_.files(1));
  ASSERT_TRUE(file.ok()) << file.status();
  auto again = s->OpenFile(1, m_.files(1));
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*file, *again);  // cached
  EXPECT_GE((*file)->fd(), 0);
  struct stat st;
  ASSERT_EQ(stat((s->dir() + "/f/1").c_str(), &st), 0);
  EXPECT_EQ(static_cast<uint64_t>(st.st_size), m_.files(1).size());
  EXPECT_FALSE(Exists(s->dir() + "/f/nested"));
  EXPECT_FALSE(Exists(dir_.Sub("export/ckpt")));  // nothing at the destination yet

  ASSERT_TRUE(s->DiscardFile(1).ok());
  EXPECT_FALSE(Exists(s->dir() + "/f/1"));
  EXPECT_EQ(Open("x", "../evil").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(StagingTest, PublishesANewTreeWholeInOneRename) {
  const std::string dest = dir_.Sub("export/ckpt/step-1");
  auto s = Open("ckpt/step-1", "t1");
  ASSERT_TRUE(s.ok()) << s.status();
  StageAll(*s);
  int hook_calls = 0;
  opts_.before_install = [&] {
    ++hook_calls;
    // Complete beside the destination, and nothing of it visible yet.
    EXPECT_FALSE(Exists(dest));
    EXPECT_TRUE(Exists(s->dir() + "/next/.metadata"));
    EXPECT_TRUE(Exists(s->dir() + "/next/logs/empty"));
  };
  const std::string staging_dir = s->dir();
  absl::Status st = s->Publish(m_, opts_);
  ASSERT_TRUE(st.ok()) << st;
  EXPECT_EQ(hook_calls, 1);
  ExpectPublished(dest);
  ASSERT_TRUE(s->Remove().ok());
  EXPECT_FALSE(Exists(staging_dir));

  for (const auto& f : m_.files()) {
    auto match = PublishedFileMatches(PosixFileSystem(), Resolve("ckpt/step-1"), false, f);
    ASSERT_TRUE(match.ok()) << match.status();
    EXPECT_TRUE(*match) << f.path();
  }
  v1::ManifestFile changed = m_.files(0);
  changed.set_mtime_ns(kMtime + 100);
  EXPECT_FALSE(*PublishedFileMatches(PosixFileSystem(), Resolve("ckpt/step-1"), false, changed));
  EXPECT_FALSE(
      *PublishedFileMatches(PosixFileSystem(), Resolve("ckpt/step-1"), false, File("nope", 0, 0, 0)));
}

TEST_F(StagingTest, ReplacesAnExistingDirectoryWithOneExchange) {
  const std::string dest = dir_.Sub("export/ckpt");
  MakeDirs(dest + "/nested");
  WriteFile(dest + "/old-only.txt", std::string("of the old version"));
  WriteFile(dest + "/shard-0.distcp", std::string("old contents"));
  WriteFile(dest + "/.metadata", std::string("old marker"));
  struct stat old_dir;
  ASSERT_EQ(stat(dest.c_str(), &old_dir), 0);
  auto s = Open("ckpt", "t2");
  ASSERT_TRUE(s.ok()) << s.status();
  StageAll(*s);
  opts_.before_install = [&] {
    // Right before the point of no return the old version is untouched.
    EXPECT_EQ(ReadFile(dest + "/shard-0.distcp"), "old contents");
    EXPECT_EQ(ReadFile(dest + "/.metadata"), "old marker");
  };
  absl::Status st = s->Publish(m_, opts_);
  ASSERT_TRUE(st.ok()) << st;
  ExpectPublished(dest);
  // The destination is exactly the new version: another directory, without
  // the old version's files.
  struct stat new_dir;
  ASSERT_EQ(stat(dest.c_str(), &new_dir), 0);
  EXPECT_NE(new_dir.st_ino, old_dir.st_ino);
  EXPECT_FALSE(Exists(dest + "/old-only.txt"));
  EXPECT_FALSE(Exists(s->dir() + "/next"));
}

TEST_F(StagingTest, UnchangedFilesAreHardLinkedIntoTheNewVersion) {
  const std::string dest = dir_.Sub("export/ckpt");
  MakeDirs(dest);
  WriteFile(dest + "/shard-0.distcp", std::string(70000, 'k'));
  struct timespec times[2] = {{0, UTIME_OMIT}, {kMtime / 1000000000, kMtime % 1000000000}};
  ASSERT_EQ(utimensat(AT_FDCWD, (dest + "/shard-0.distcp").c_str(), times, 0), 0);
  struct stat before;
  ASSERT_EQ(stat((dest + "/shard-0.distcp").c_str(), &before), 0);
  auto s = Open("ckpt", "t3");
  ASSERT_TRUE(s.ok());
  for (int i = 1; i < m_.files_size(); ++i) {
    if (m_.files(i).size() == 0) continue;
    ASSERT_TRUE(s->OpenFile(i, m_.files(i)).ok());
  }
  opts_.skip_files = {0};
  absl::Status st = s->Publish(m_, opts_);
  ASSERT_TRUE(st.ok()) << st;
  struct stat after;
  ASSERT_EQ(stat((dest + "/shard-0.distcp").c_str(), &after), 0);
  EXPECT_EQ(after.st_ino, before.st_ino);
  EXPECT_EQ(ReadFile(dest + "/shard-0.distcp"), std::string(70000, 'k'));
  EXPECT_TRUE(Exists(dest + "/.metadata"));
}

// ManifestFile.link_of: a linked name is no staged file of its own but a
// hard link, in the new version, of its target's file: staged, or unchanged
// and linked from the current destination.
TEST_F(StagingTest, HardLinksArePublishedAsOneFileWithTheirTarget) {
  const std::string dest = dir_.Sub("export/ckpt");
  MakeDirs(dest);
  WriteFile(dest + "/shard-0.distcp", std::string(70000, 'k'));
  struct timespec times[2] = {{0, UTIME_OMIT}, {kMtime / 1000000000, kMtime % 1000000000}};
  ASSERT_EQ(utimensat(AT_FDCWD, (dest + "/shard-0.distcp").c_str(), times, 0), 0);
  struct stat unchanged;
  ASSERT_EQ(stat((dest + "/shard-0.distcp").c_str(), &unchanged), 0);
  v1::ManifestFile staged_link = m_.files(2);  // .metadata, staged
  staged_link.set_path("other/metadata-again");
  staged_link.set_link_of(3);
  *m_.add_files() = staged_link;  // 5
  v1::ManifestFile unchanged_link = m_.files(0);
  unchanged_link.set_path("shard-0-again");
  unchanged_link.set_link_of(1);
  *m_.add_files() = unchanged_link;  // 6
  auto s = Open("ckpt", "t-links");
  ASSERT_TRUE(s.ok());
  for (int i = 1; i <= 4; ++i) {
    if (m_.files(i).size() == 0) continue;
    auto file = s->OpenFile(i, m_.files(i));
    ASSERT_TRUE(file.ok()) << file.status();
    auto data = Bytes(m_.files(i).size(), i);
    ASSERT_TRUE((*file)->WriteAt(0, data).ok());
    ASSERT_TRUE((*file)->Sync().ok());
  }
  // An earlier, interrupted run left another file under a linked name.
  MakeDirs(s->dir() + "/next/other");
  WriteFile(s->dir() + "/next/other/metadata-again", std::string(300, 'o'));
  opts_.skip_files = {0};
  absl::Status st = s->Publish(m_, opts_);
  ASSERT_TRUE(st.ok()) << st;

  struct stat target, link;
  ASSERT_EQ(stat((dest + "/.metadata").c_str(), &target), 0);
  ASSERT_EQ(stat((dest + "/other/metadata-again").c_str(), &link), 0);
  EXPECT_EQ(link.st_ino, target.st_ino);
  EXPECT_EQ(link.st_nlink, 2u);
  const auto metadata = Bytes(300, 2);
  EXPECT_EQ(ReadFile(dest + "/other/metadata-again"),
            std::string(metadata.begin(), metadata.end()));
  ASSERT_EQ(stat((dest + "/shard-0-again").c_str(), &link), 0);
  EXPECT_EQ(link.st_ino, unchanged.st_ino);
  EXPECT_EQ(ReadFile(dest + "/shard-0-again"), std::string(70000, 'k'));
  EXPECT_FALSE(Exists(s->dir() + "/f/5"));  // never staged
}

TEST_F(StagingTest, AHardLinkWaitsForItsLostTargetAndIsNotAskedFor) {
  v1::ManifestFile link = m_.files(0);
  link.set_path("shard-0-again");
  link.set_link_of(1);
  *m_.add_files() = link;  // 5
  auto s = Open("ckpt/step-links", "t-lost-link");
  ASSERT_TRUE(s.ok());
  for (int i = 1; i <= 4; ++i) {
    if (m_.files(i).size() == 0) continue;
    auto file = s->OpenFile(i, m_.files(i));
    ASSERT_TRUE(file.ok()) << file.status();
    ASSERT_TRUE((*file)->WriteAt(0, Bytes(m_.files(i).size(), i)).ok());
  }
  std::vector<uint32_t> resend;
  absl::Status st = s->Publish(m_, opts_, &resend);
  EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable) << st;
  EXPECT_EQ(resend, std::vector<uint32_t>{0});
  EXPECT_FALSE(Exists(dir_.Sub("export/ckpt/step-links")));
}

TEST_F(StagingTest, AnUnchangedFileThatChangedMeanwhileIsAskedForAgain) {
  const std::string dest = dir_.Sub("export/ckpt");
  MakeDirs(dest);
  WriteFile(dest + "/shard-0.distcp", std::string("another version, other size"));
  WriteFile(dest + "/.metadata", std::string("old marker"));
  auto s = Open("ckpt", "t3b");
  ASSERT_TRUE(s.ok());
  StageAll(*s);
  opts_.skip_files = {0};
  std::vector<uint32_t> resend;
  absl::Status st = s->Publish(m_, opts_, &resend);
  EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable) << st;
  EXPECT_EQ(resend, std::vector<uint32_t>{0});
  EXPECT_EQ(ReadFile(dest + "/.metadata"), "old marker");  // not touched
}

// sync --checksum: an unchanged file is linked when its content still has
// the manifest's digest, whatever its mtime, and asked for again otherwise.
TEST_F(StagingTest, ContentComparedUnchangedFilesAreLinkedByDigest) {
  const std::string dest = dir_.Sub("export/ckpt");
  MakeDirs(dest);
  auto same = Bytes(70000, 0);
  WriteFile(dest + "/shard-0.distcp", same);  // today's mtime, not the manifest's
  auto digest = HashBytes(same).ToBytes();
  m_.mutable_files(0)->set_content_xxh128(digest.data(), digest.size());
  opts_.skip_files = {0};
  opts_.compare_content = true;
  {
    auto s = Open("ckpt", "c1");
    ASSERT_TRUE(s.ok());
    StageAll(*s);
    absl::Status st = s->Publish(m_, opts_);
    ASSERT_TRUE(st.ok()) << st;
    EXPECT_EQ(ReadFile(dest + "/shard-0.distcp"), std::string(same.begin(), same.end()));
    ASSERT_TRUE(s->Remove().ok());
  }
  // Same size, one byte different: not the same content any more.
  same[100] ^= 1;
  WriteFile(dest + "/shard-0.distcp", same);
  auto s = Open("ckpt", "c2");
  ASSERT_TRUE(s.ok());
  StageAll(*s);
  std::vector<uint32_t> resend;
  absl::Status st = s->Publish(m_, opts_, &resend);
  EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable) << st;
  EXPECT_EQ(resend, std::vector<uint32_t>{0});
}

// The export's umask 027: mode_mask 0750.
TEST_F(StagingTest, PublishedModesAreMaskedAndNeverSetuid) {
  v1::Manifest m;
  m.set_chunk_size(64 << 10);
  *m.add_files() = File("bin/id", 10, 06755, kMtime);
  *m.add_files() = File("bin/sticky", 10, 01777, kMtime);
  *m.add_files() = File("world-writable", 10, 0777, kMtime);
  *m.add_files() = File("private", 10, 0600, kMtime);
  *m.add_files() = File("empty-setgid", 0, 02775, kMtime);
  m.add_empty_dirs("logs/empty");
  auto s = Open("runs/run1/step-1", "t-modes");
  ASSERT_TRUE(s.ok()) << s.status();
  for (int i = 0; i < m.files_size(); ++i) {
    if (m.files(i).size() == 0) continue;
    auto file = s->OpenFile(i, m.files(i));
    ASSERT_TRUE(file.ok()) << file.status();
    ASSERT_TRUE((*file)->WriteAt(0, Bytes(10, i)).ok());
  }
  PublishOptions opts;
  opts.mode_mask = 0750;
  // A setgid export: Linux gives new directories in it the setgid bit too.
  ASSERT_EQ(chmod(dir_.Sub("export").c_str(), 02775), 0);
  // Directories get exactly 0777 & mode_mask whatever the process umask.
  const mode_t old_umask = umask(077);
  absl::Status st = s->Publish(m, opts);
  umask(old_umask);
  ASSERT_TRUE(st.ok()) << st;

  auto mode_of = [&](const std::string& rel) -> uint32_t {
    struct stat sb;
    EXPECT_EQ(lstat(dir_.Sub("export/" + rel).c_str(), &sb), 0) << rel;
    return sb.st_mode & 07777;
  };
  const std::string dest = "runs/run1/step-1/";
  EXPECT_EQ(mode_of(dest + "bin/id"), 0750u);
  EXPECT_EQ(mode_of(dest + "bin/sticky"), 0750u);
  EXPECT_EQ(mode_of(dest + "world-writable"), 0750u);
  EXPECT_EQ(mode_of(dest + "private"), 0600u);
  EXPECT_EQ(mode_of(dest + "empty-setgid"), 0750u);
  for (const char* dir : {"runs", "runs/run1", "runs/run1/step-1", "runs/run1/step-1/bin",
                          "runs/run1/step-1/logs", "runs/run1/step-1/logs/empty"}) {
    EXPECT_EQ(mode_of(dir), 0750u) << dir;
  }

  // A single file, with the default mask (umask 022).
  v1::Manifest one;
  one.set_chunk_size(64 << 10);
  *one.add_files() = File("id", 10, 04777, kMtime);
  auto single = Open("tools/id", "t-mode-file");
  ASSERT_TRUE(single.ok()) << single.status();
  auto file = single->OpenFile(0, one.files(0));
  ASSERT_TRUE(file.ok());
  ASSERT_TRUE((*file)->WriteAt(0, Bytes(10, 0)).ok());
  PublishOptions single_opts;
  single_opts.single_file = true;
  ASSERT_TRUE(single->Publish(one, single_opts).ok());
  EXPECT_EQ(mode_of("tools/id"), 0755u);
  EXPECT_EQ(mode_of("tools"), 0755u);
}

TEST_F(StagingTest, PublishesASingleFile) {
  v1::Manifest m;
  m.set_chunk_size(64 << 10);
  *m.add_files() = File("weights.bin", 1000, 0600, kMtime);
  auto s = Open("models/w.bin", "t4");
  ASSERT_TRUE(s.ok()) << s.status();
  auto file = s->OpenFile(0, m.files(0));
  ASSERT_TRUE(file.ok());
  auto data = Bytes(1000, 0);
  ASSERT_TRUE((*file)->WriteAt(0, data).ok());
  PublishOptions opts;
  opts.single_file = true;
  absl::Status st = s->Publish(m, opts);
  ASSERT_TRUE(st.ok()) << st;
  const std::string dest = dir_.Sub("export/models/w.bin");
  EXPECT_EQ(ReadFile(dest), std::string(data.begin(), data.end()));
  struct stat sb;
  ASSERT_EQ(stat(dest.c_str(), &sb), 0);
  EXPECT_EQ(sb.st_mode & 07777, 0600u);
  EXPECT_EQ(sb.st_mtim.tv_sec * 1000000000LL + sb.st_mtim.tv_nsec, kMtime);
  auto match = PublishedFileMatches(PosixFileSystem(), Resolve("models/w.bin"), true, m.files(0));
  ASSERT_TRUE(match.ok());
  EXPECT_TRUE(*match);

  // Re-running publish before the staging was removed finds it installed.
  auto again = Open("models/w.bin", "t4");
  ASSERT_TRUE(again.ok());
  st = again->Publish(m, opts);
  EXPECT_TRUE(st.ok()) << st;
  EXPECT_EQ(ReadFile(dest), std::string(data.begin(), data.end()));
  ASSERT_TRUE(again->Remove().ok());
}

// A real process dies (no cleanup, like kill -9) at the point of no return;
// the restarted one converges to the new version.
TEST_F(StagingTest, PublishResumesAfterAKillAtThePointOfNoReturn) {
  const std::string dest = dir_.Sub("export/ckpt/step-2");
  MakeDirs(dest);
  WriteFile(dest + "/.metadata", std::string("old marker"));
  {
    auto s = Open("ckpt/step-2", "t5");
    ASSERT_TRUE(s.ok());
    StageAll(*s);
    opts_.before_install = [] { _exit(0); };
    pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      (void)s->Publish(m_, opts_);
      _exit(1);  // not reached
    }
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFEXITED(status));
    ASSERT_EQ(WEXITSTATUS(status), 0);
  }
  EXPECT_EQ(ReadFile(dest + "/.metadata"), "old marker");
  opts_.before_install = nullptr;
  auto s = Open("ckpt/step-2", "t5");
  ASSERT_TRUE(s.ok());
  // The staged files moved into next/ still count as held.
  for (int i = 0; i < m_.files_size(); ++i) {
    auto held = s->HoldsFile(i, m_.files(i));
    ASSERT_TRUE(held.ok()) << held.status();
    EXPECT_TRUE(*held) << m_.files(i).path();
  }
  EXPECT_EQ(s->OpenStagedFile(0, m_.files(0)).status().code(), absl::StatusCode::kNotFound);
  EXPECT_FALSE(Exists(s->dir() + "/f/0"));
  absl::Status st = s->Publish(m_, opts_);
  ASSERT_TRUE(st.ok()) << st;
  ExpectPublished(dest);
}

TEST_F(StagingTest, LostStagedBytesAreAskedForAgainNotDataLoss) {
  auto s = Open("ckpt/step-4", "t7");
  ASSERT_TRUE(s.ok());
  StageAll(*s);
  ASSERT_EQ(unlink((s->dir() + "/f/0").c_str()), 0);
  ASSERT_EQ(truncate((s->dir() + "/f/2").c_str(), 10), 0);
  auto held = s->HoldsFile(0, m_.files(0));
  ASSERT_TRUE(held.ok());
  EXPECT_FALSE(*held);
  EXPECT_FALSE(*s->HoldsFile(2, m_.files(2)));
  EXPECT_TRUE(*s->HoldsFile(1, m_.files(1)));
  std::vector<uint32_t> resend;
  absl::Status st = s->Publish(m_, opts_, &resend);
  EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable) << st;
  EXPECT_EQ(resend, (std::vector<uint32_t>{0, 2}));
  EXPECT_FALSE(Exists(dir_.Sub("export/ckpt/step-4")));
}

TEST_F(StagingTest, RefusesToPublishThroughASymlink) {
  MakeDirs(dir_.Sub("outside"));
  MakeDirs(dir_.Sub("export/ckpt"));
  auto resolved = Resolve("ckpt/new/step");
  ASSERT_EQ(symlink(dir_.Sub("outside").c_str(), dir_.Sub("export/ckpt/new").c_str()), 0);
  auto s = Staging::Open(PosixFileSystem(), resolved, "t8");
  ASSERT_TRUE(s.ok());
  StageAll(*s);
  absl::Status st = s->Publish(m_, opts_);
  EXPECT_EQ(st.code(), absl::StatusCode::kPermissionDenied) << st;
  EXPECT_FALSE(Exists(dir_.Sub("outside/step")));
}

TEST_F(StagingTest, SymlinksArePublishedWithTheTree) {
  const std::string dest = dir_.Sub("export/ckpt");
  v1::ManifestSymlink* latest = m_.add_symlinks();
  latest->set_path("latest");
  latest->set_target("nested/shard-1.distcp");
  v1::ManifestSymlink* up = m_.add_symlinks();
  up->set_path("nested/up");
  up->set_target("../shard-0.distcp");
  auto s = Open("ckpt", "t-links");
  ASSERT_TRUE(s.ok()) << s.status();
  StageAll(*s);
  opts_.before_install = [&] { EXPECT_FALSE(Exists(dest)); };
  absl::Status st = s->Publish(m_, opts_);
  ASSERT_TRUE(st.ok()) << st;
  ExpectPublished(dest);
  auto read_link = [](const std::string& path) {
    char target[256];
    const ssize_t n = readlink(path.c_str(), target, sizeof(target));
    return n < 0 ? std::string("(not a symlink)") : std::string(target, n);
  };
  EXPECT_EQ(read_link(dest + "/latest"), "nested/shard-1.distcp");
  EXPECT_EQ(read_link(dest + "/nested/up"), "../shard-0.distcp");
  EXPECT_EQ(ReadFile(dest + "/latest"), ReadFile(dest + "/nested/shard-1.distcp"));
}

// A symlink planted inside staging (by someone with write access to the
// export) where publish builds the new version: publish refuses to go
// through it, and nothing lands where it points.
TEST_F(StagingTest, APlantedSymlinkInStagingDoesNotRedirectPublish) {
  const std::string outside = dir_.Sub("outside");
  MakeDirs(outside);
  auto s = Open("ckpt", "t-planted");
  ASSERT_TRUE(s.ok()) << s.status();
  StageAll(*s);
  // next/nested is where nested/shard-1.distcp and nested/COMPLETE go.
  MakeDirs(s->dir() + "/next");
  ASSERT_EQ(symlink(outside.c_str(), (s->dir() + "/next/nested").c_str()), 0);
  absl::Status st = s->Publish(m_, opts_);
  EXPECT_EQ(st.code(), absl::StatusCode::kPermissionDenied) << st;
  EXPECT_FALSE(Exists(outside + "/shard-1.distcp"));
  EXPECT_FALSE(Exists(outside + "/COMPLETE"));
  EXPECT_FALSE(Exists(dir_.Sub("export/ckpt")));

  // A staged file swapped for a symlink to a file outside: not finalized
  // (chmod/utimes) nor moved through.
  ASSERT_EQ(unlink((s->dir() + "/next/nested").c_str()), 0);
  WriteFile(outside + "/victim", std::string("precious"));
  ASSERT_EQ(chmod((outside + "/victim").c_str(), 0600), 0);
  ASSERT_EQ(unlink((s->dir() + "/f/4").c_str()), 0);  // model.index.json
  ASSERT_EQ(symlink((outside + "/victim").c_str(), (s->dir() + "/f/4").c_str()), 0);
  std::vector<uint32_t> resend;
  st = s->Publish(m_, opts_, &resend);
  EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable) << st;
  EXPECT_EQ(resend, std::vector<uint32_t>{4});
  EXPECT_EQ(ReadFile(outside + "/victim"), "precious");
  struct stat vst;
  ASSERT_EQ(stat((outside + "/victim").c_str(), &vst), 0);
  EXPECT_EQ(vst.st_mode & 07777, 0600u);
  EXPECT_FALSE(Exists(dir_.Sub("export/ckpt")));
}

// A symlink of the manifest is never a directory publish writes through,
// even if a hostile manifest got past validation.
TEST_F(StagingTest, ASymlinkEntryAtAFilesParentIsNotFollowed) {
  const std::string outside = dir_.Sub("outside");
  MakeDirs(outside);
  v1::ManifestSymlink* evil = m_.add_symlinks();
  evil->set_path("nested");
  evil->set_target("../../../outside");
  auto s = Open("ckpt", "t-evil");
  ASSERT_TRUE(s.ok()) << s.status();
  StageAll(*s);
  absl::Status st = s->Publish(m_, opts_);
  EXPECT_FALSE(st.ok());
  EXPECT_FALSE(Exists(outside + "/shard-1.distcp"));
  EXPECT_FALSE(Exists(dir_.Sub("export/ckpt")));
}

// A sparse file whose chunks all lie in holes gets no chunk: publish makes
// it at its size, all hole.
TEST_F(StagingTest, AFileOfHolesOnlyIsPublishedAtItsSizeAsAHole) {
  const std::string dest = dir_.Sub("export/ckpt");
  v1::ManifestFile hollow = File("hollow.bin", uint64_t{32} << 20, 0644, kMtime + 5);
  hollow.set_sparse(true);
  auto s = Open("ckpt", "t-hollow");
  ASSERT_TRUE(s.ok()) << s.status();
  StageAll(*s);
  *m_.add_files() = hollow;
  absl::Status st = s->Publish(m_, opts_);
  ASSERT_TRUE(st.ok()) << st;
  ExpectPublishedExceptLast(dest);
  struct stat hs;
  ASSERT_EQ(stat((dest + "/hollow.bin").c_str(), &hs), 0);
  EXPECT_EQ(static_cast<uint64_t>(hs.st_size), hollow.size());
  EXPECT_LT(hs.st_blocks * 512, 1 << 20);  // a hole, not 32 MiB of zeros
  EXPECT_EQ(hs.st_mtim.tv_sec * 1000000000LL + hs.st_mtim.tv_nsec, hollow.mtime_ns());
  // Without `sparse` the same missing staged file is lost bytes, asked for again.
  auto again = Open("ckpt2", "t-hollow2");
  ASSERT_TRUE(again.ok());
  m_.mutable_files(m_.files_size() - 1)->set_sparse(false);
  std::vector<uint32_t> resend;
  st = again->Publish(m_, opts_, &resend);
  EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable) << st;
  EXPECT_NE(std::find(resend.begin(), resend.end(), 5u), resend.end());
}

TEST_F(StagingTest, AStagedFileUsesDiskOnlyForTheBytesReceived) {
  auto s = Open("ckpt/big", "t11");
  ASSERT_TRUE(s.ok()) << s.status();
  const v1::ManifestFile big = File("big.bin", 8ull << 30, 0644, kMtime);
  auto file = s->OpenFile(0, big);
  ASSERT_TRUE(file.ok()) << file.status();
  auto data = Bytes(64 << 10, 7);
  ASSERT_TRUE((*file)->WriteAt(0, data).ok());
  ASSERT_TRUE((*file)->Sync().ok());
  struct stat st;
  ASSERT_EQ(stat((s->dir() + "/f/0").c_str(), &st), 0);
  EXPECT_EQ(static_cast<uint64_t>(st.st_size), big.size());
  EXPECT_LT(static_cast<uint64_t>(st.st_blocks) * 512, 16ull << 20);
  // Resumed: the staged bytes stay, nothing more is reserved.
  auto again = Open("ckpt/big", "t11");
  ASSERT_TRUE(again.ok()) << again.status();
  auto reopened = again->OpenFile(0, big);
  ASSERT_TRUE(reopened.ok()) << reopened.status();
  std::vector<uint8_t> back(data.size());
  auto n = (*reopened)->ReadAt(0, absl::MakeSpan(back));
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(back, data);
  ASSERT_EQ(stat((s->dir() + "/f/0").c_str(), &st), 0);
  EXPECT_LT(static_cast<uint64_t>(st.st_blocks) * 512, 16ull << 20);
}

TEST_F(StagingTest, RemoveDeletesStaging) {
  auto s = Open("ckpt", "t9");
  ASSERT_TRUE(s.ok());
  StageAll(*s);
  const std::string d = s->dir();
  ASSERT_TRUE(Exists(d + "/f/0"));
  ASSERT_TRUE(s->Remove().ok());
  EXPECT_FALSE(Exists(d));
  EXPECT_TRUE(Exists(dir_.Sub("export/.longhaul/staging")));
}

TEST_F(StagingTest, RemoveLeftoverRemovesOnlyWhatIsThere) {
  // Nothing staged: nothing is created either.
  ASSERT_TRUE(Staging::RemoveLeftover(PosixFileSystem(), Resolve("ckpt"), "t10").ok());
  EXPECT_FALSE(Exists(dir_.Sub("export/.longhaul")));
  auto s = Open("ckpt", "t10");
  ASSERT_TRUE(s.ok());
  StageAll(*s);
  const std::string d = s->dir();
  ASSERT_TRUE(Staging::RemoveLeftover(PosixFileSystem(), Resolve("ckpt"), "t10").ok());
  EXPECT_FALSE(Exists(d));
  EXPECT_TRUE(Exists(dir_.Sub("export/.longhaul/staging")));
}

// A listing that fails part-way must not pass for the directory's contents:
// RemoveTree would then leave entries it never saw and report the directory
// "not empty" (seen with EIO from a failing disk). An O_PATH descriptor
// opens as a directory stream but cannot be read: readdir fails at once.
TEST(ListDirAtTest, AReadErrorIsAnErrorNotAnEmptyDirectory) {
  TempDir dir;
  WriteFile(dir.Sub("entry"), "x");
  const int fd = open(dir.path().c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  absl::StatusOr<std::vector<std::string>> listed = internal::ListDirAt(fd, dir.path());
  close(fd);
  ASSERT_FALSE(listed.ok()) << "listed " << listed->size() << " entries";
  EXPECT_NE(listed.status().message().find("cannot list directory"), std::string::npos)
      << listed.status();
}

TEST(ListDirAtTest, ADirectoryRemovedWhileOpenListsEmpty) {
  TempDir dir;
  ASSERT_EQ(mkdir(dir.Sub("gone").c_str(), 0755), 0);
  const int fd = open(dir.Sub("gone").c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(rmdir(dir.Sub("gone").c_str()), 0);
  absl::StatusOr<std::vector<std::string>> listed = internal::ListDirAt(fd, "gone");
  close(fd);
  ASSERT_TRUE(listed.ok()) << listed.status();
  EXPECT_TRUE(listed->empty());
}

TEST(StoredMtimeMatchesTest, ToleratesCoarseGranularityOnly) {
  EXPECT_TRUE(StoredMtimeMatches(kMtime, kMtime));
  EXPECT_TRUE(StoredMtimeMatches(1700000000000000000, kMtime));  // whole seconds
  EXPECT_TRUE(StoredMtimeMatches(1700000000123456000, kMtime));  // microseconds
  EXPECT_FALSE(StoredMtimeMatches(1700000001000000000, kMtime));  // rounded up: not a truncation
  EXPECT_FALSE(StoredMtimeMatches(1700000000123000001, kMtime));
  EXPECT_FALSE(StoredMtimeMatches(kMtime - 2000000000, kMtime));
}

}  // namespace
}  // namespace longhaul::storage
