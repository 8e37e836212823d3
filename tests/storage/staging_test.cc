#include "storage/staging.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "gtest/gtest.h"
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
      auto fd = s.OpenFile(i, m_.files(i));
      ASSERT_TRUE(fd.ok()) << fd.status();
      auto data = Bytes(m_.files(i).size(), i);
      ASSERT_EQ(pwrite(*fd, data.data(), data.size(), 0), static_cast<ssize_t>(data.size()));
      ASSERT_EQ(fdatasync(*fd), 0);
    }
  }

  void ExpectPublished(const std::string& root) {
    for (int i = 0; i < m_.files_size(); ++i) {
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
  auto s = Staging::Open(Resolve("ckpt/step-1"), "t1");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->dir(), Resolve("ckpt/step-1").export_root + "/.longhaul/staging/t1");
  auto fd = s->OpenFile(1, m_.files(1));
  ASSERT_TRUE(fd.ok()) << fd.status();
  auto again = s->OpenFile(1, m_.files(1));
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*fd, *again);  // cached
  struct stat st;
  ASSERT_EQ(stat((s->dir() + "/f/1").c_str(), &st), 0);
  EXPECT_EQ(static_cast<uint64_t>(st.st_size), m_.files(1).size());  // preallocated
  EXPECT_FALSE(Exists(s->dir() + "/f/nested"));
  EXPECT_FALSE(Exists(dir_.Sub("export/ckpt")));  // nothing at the destination yet

  ASSERT_TRUE(s->DiscardFile(1).ok());
  EXPECT_FALSE(Exists(s->dir() + "/f/1"));
  EXPECT_EQ(Staging::Open(Resolve("x"), "../evil").status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(StagingTest, PublishesANewTreeWholeInOneRename) {
  const std::string dest = dir_.Sub("export/ckpt/step-1");
  auto s = Staging::Open(Resolve("ckpt/step-1"), "t1");
  ASSERT_TRUE(s.ok()) << s.status();
  StageAll(*s);
  int hook_calls = 0;
  opts_.before_markers = [&] {
    ++hook_calls;
    // By the time the tree is visible, its markers are in it too.
    EXPECT_TRUE(Exists(dest + "/shard-0.distcp"));
    EXPECT_TRUE(Exists(dest + "/nested/shard-1.distcp"));
    EXPECT_TRUE(Exists(dest + "/logs/empty"));
    EXPECT_TRUE(Exists(dest + "/.metadata"));
    EXPECT_TRUE(Exists(dest + "/nested/COMPLETE"));
    EXPECT_TRUE(Exists(dest + "/model.index.json"));
  };
  const std::string staging_dir = s->dir();
  absl::Status st = s->Publish(m_, opts_);
  ASSERT_TRUE(st.ok()) << st;
  EXPECT_EQ(hook_calls, 1);
  ExpectPublished(dest);
  EXPECT_FALSE(Exists(staging_dir));

  for (const auto& f : m_.files()) {
    auto match = PublishedFileMatches(Resolve("ckpt/step-1"), false, f);
    ASSERT_TRUE(match.ok()) << match.status();
    EXPECT_TRUE(*match) << f.path();
  }
  v1::ManifestFile changed = m_.files(0);
  changed.set_mtime_ns(kMtime + 100);
  EXPECT_FALSE(*PublishedFileMatches(Resolve("ckpt/step-1"), false, changed));
  EXPECT_FALSE(*PublishedFileMatches(Resolve("ckpt/step-1"), false, File("nope", 0, 0, 0)));
}

TEST_F(StagingTest, PublishesIntoAnExistingDirectory) {
  const std::string dest = dir_.Sub("export/ckpt");
  MakeDirs(dest + "/nested");
  WriteFile(dest + "/keep.txt", std::string("untouched"));
  WriteFile(dest + "/shard-0.distcp", std::string("old contents"));
  auto s = Staging::Open(Resolve("ckpt"), "t2");
  ASSERT_TRUE(s.ok()) << s.status();
  StageAll(*s);
  opts_.before_markers = [&] {
    EXPECT_EQ(ReadFile(dest + "/shard-0.distcp").size(), 70000u);
    EXPECT_FALSE(Exists(dest + "/.metadata"));
    EXPECT_FALSE(Exists(dest + "/nested/COMPLETE"));
  };
  absl::Status st = s->Publish(m_, opts_);
  ASSERT_TRUE(st.ok()) << st;
  ExpectPublished(dest);
  EXPECT_EQ(ReadFile(dest + "/keep.txt"), "untouched");
}

TEST_F(StagingTest, SkippedFilesAreLeftAlone) {
  const std::string dest = dir_.Sub("export/ckpt");
  MakeDirs(dest);
  WriteFile(dest + "/shard-0.distcp", std::string("kept"));
  auto s = Staging::Open(Resolve("ckpt"), "t3");
  ASSERT_TRUE(s.ok());
  for (int i = 1; i < m_.files_size(); ++i) {
    if (m_.files(i).size() == 0) continue;
    auto fd = s->OpenFile(i, m_.files(i));
    ASSERT_TRUE(fd.ok());
  }
  opts_.skip_files = {0};
  absl::Status st = s->Publish(m_, opts_);
  ASSERT_TRUE(st.ok()) << st;
  EXPECT_EQ(ReadFile(dest + "/shard-0.distcp"), "kept");
  EXPECT_TRUE(Exists(dest + "/.metadata"));
}

TEST_F(StagingTest, PublishesASingleFile) {
  v1::Manifest m;
  m.set_chunk_size(64 << 10);
  *m.add_files() = File("weights.bin", 1000, 0600, kMtime);
  auto s = Staging::Open(Resolve("models/w.bin"), "t4");
  ASSERT_TRUE(s.ok()) << s.status();
  auto fd = s->OpenFile(0, m.files(0));
  ASSERT_TRUE(fd.ok());
  auto data = Bytes(1000, 0);
  ASSERT_EQ(pwrite(*fd, data.data(), data.size(), 0), 1000);
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
  auto match = PublishedFileMatches(Resolve("models/w.bin"), true, m.files(0));
  ASSERT_TRUE(match.ok());
  EXPECT_TRUE(*match);

  // Re-running publish after it finished is a no-op that succeeds.
  auto again = Staging::Open(Resolve("models/w.bin"), "t4");
  ASSERT_TRUE(again.ok());
  st = again->Publish(m, opts);
  EXPECT_TRUE(st.ok()) << st;
  EXPECT_EQ(ReadFile(dest), std::string(data.begin(), data.end()));
}

TEST_F(StagingTest, PublishResumesAfterACrashAfterTheTreeRename) {
  const std::string dest = dir_.Sub("export/ckpt/step-2");
  {
    auto s = Staging::Open(Resolve("ckpt/step-2"), "t5");
    ASSERT_TRUE(s.ok());
    StageAll(*s);
    // A child process publishes and dies abruptly (no cleanup, like kill -9)
    // right after the tree rename.
    opts_.before_markers = [] { _exit(0); };
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
  // The tree arrived whole, markers included.
  EXPECT_TRUE(Exists(dest + "/shard-0.distcp"));
  EXPECT_TRUE(Exists(dest + "/.metadata"));
  // The restarted daemon re-opens staging and publishes again: a no-op.
  opts_.before_markers = nullptr;
  auto s = Staging::Open(Resolve("ckpt/step-2"), "t5");
  ASSERT_TRUE(s.ok());
  // Verification before that publish finds the moved files not staged, and
  // looking does not create an empty one in their place.
  EXPECT_EQ(s->OpenStagedFile(0, m_.files(0)).status().code(), absl::StatusCode::kNotFound);
  EXPECT_FALSE(Exists(s->dir() + "/f/0"));
  absl::Status st = s->Publish(m_, opts_);
  ASSERT_TRUE(st.ok()) << st;
  ExpectPublished(dest);
  // And once more, with the staging directory already gone.
  auto s2 = Staging::Open(Resolve("ckpt/step-2"), "t5");
  ASSERT_TRUE(s2.ok());
  st = s2->Publish(m_, opts_);
  ASSERT_TRUE(st.ok()) << st;
  ExpectPublished(dest);
}

TEST_F(StagingTest, PublishResumesWithAHalfBuiltTree) {
  const std::string dest = dir_.Sub("export/ckpt/step-3");
  auto s = Staging::Open(Resolve("ckpt/step-3"), "t6");
  ASSERT_TRUE(s.ok());
  StageAll(*s);
  // Simulate a crash while tree/ was being assembled: one file already moved.
  MakeDirs(s->dir() + "/tree/nested");
  ASSERT_EQ(rename((s->dir() + "/f/1").c_str(), (s->dir() + "/tree/nested/shard-1.distcp").c_str()),
            0);
  struct timespec times[2] = {{0, UTIME_OMIT}, {kMtime / 1000000000, (kMtime + 1) % 1000000000}};
  ASSERT_EQ(utimensat(AT_FDCWD, (s->dir() + "/tree/nested/shard-1.distcp").c_str(), times, 0), 0);
  ASSERT_EQ(chmod((s->dir() + "/tree/nested/shard-1.distcp").c_str(), 0600), 0);
  absl::Status st = s->Publish(m_, opts_);
  ASSERT_TRUE(st.ok()) << st;
  ExpectPublished(dest);
}

TEST_F(StagingTest, MissingStagedDataIsDataLoss) {
  auto s = Staging::Open(Resolve("ckpt/step-4"), "t7");
  ASSERT_TRUE(s.ok());
  absl::Status st = s->Publish(m_, opts_);  // nothing staged
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss) << st;
  EXPECT_NE(st.message().find("shard-0.distcp"), absl::string_view::npos) << st;
}

TEST_F(StagingTest, RefusesToPublishThroughASymlink) {
  MakeDirs(dir_.Sub("outside"));
  MakeDirs(dir_.Sub("export/ckpt"));
  auto resolved = Resolve("ckpt/new/step");
  ASSERT_EQ(symlink(dir_.Sub("outside").c_str(), dir_.Sub("export/ckpt/new").c_str()), 0);
  auto s = Staging::Open(resolved, "t8");
  ASSERT_TRUE(s.ok());
  StageAll(*s);
  absl::Status st = s->Publish(m_, opts_);
  EXPECT_EQ(st.code(), absl::StatusCode::kPermissionDenied) << st;
  EXPECT_FALSE(Exists(dir_.Sub("outside/step")));
}

TEST_F(StagingTest, RemoveDeletesStaging) {
  auto s = Staging::Open(Resolve("ckpt"), "t9");
  ASSERT_TRUE(s.ok());
  StageAll(*s);
  const std::string d = s->dir();
  ASSERT_TRUE(Exists(d + "/f/0"));
  ASSERT_TRUE(s->Remove().ok());
  EXPECT_FALSE(Exists(d));
  EXPECT_TRUE(Exists(dir_.Sub("export/.longhaul/staging")));
}

}  // namespace
}  // namespace longhaul::storage
