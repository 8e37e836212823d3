#include "storage/manifest.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "storage/chunk_plan.h"
#include "tests/storage/test_util.h"

namespace longhaul::storage {
namespace {

using testing::Bytes;
using testing::MakeDirs;
using testing::TempDir;
using testing::WriteFile;

constexpr uint64_t kChunk = 64 << 10;

class BuildManifestTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // src/
    //   empty.bin (0 B), one.bin (1 B), big.bin (2.5 chunks)
    //   sub/deep/x.txt, hollow/ (empty), link -> one.bin (skipped)
    const std::string src = dir_.Sub("src");
    MakeDirs(src + "/sub/deep");
    MakeDirs(src + "/hollow");
    WriteFile(src + "/empty.bin", std::string());
    WriteFile(src + "/one.bin", std::string("x"));
    WriteFile(src + "/big.bin", Bytes(kChunk * 2 + kChunk / 2, 3));
    WriteFile(src + "/sub/deep/x.txt", std::string("hello"));
    ASSERT_EQ(chmod((src + "/one.bin").c_str(), 0640), 0);
    ASSERT_EQ(symlink("one.bin", (src + "/link").c_str()), 0);
  }
  TempDir dir_;
};

TEST_F(BuildManifestTest, DirectoryTreeIsSortedRegularFilesOnly) {
  auto b = BuildManifest({dir_.Sub("src")}, kChunk);
  ASSERT_TRUE(b.ok()) << b.status();
  const v1::Manifest& m = b->manifest;
  EXPECT_FALSE(b->single_file);
  EXPECT_EQ(m.chunk_size(), kChunk);
  ASSERT_EQ(m.files_size(), 4);
  EXPECT_EQ(m.files(0).path(), "big.bin");
  EXPECT_EQ(m.files(1).path(), "empty.bin");
  EXPECT_EQ(m.files(2).path(), "one.bin");
  EXPECT_EQ(m.files(3).path(), "sub/deep/x.txt");
  ASSERT_EQ(m.empty_dirs_size(), 1);
  EXPECT_EQ(m.empty_dirs(0), "hollow");
  ASSERT_EQ(b->source_paths.size(), 4u);
  EXPECT_EQ(b->source_paths[3], dir_.Sub("src") + "/sub/deep/x.txt");

  const v1::ManifestFile& one = m.files(2);
  EXPECT_EQ(one.size(), 1u);
  EXPECT_EQ(one.mode(), 0640u);
  struct stat st;
  ASSERT_EQ(stat(b->source_paths[2].c_str(), &st), 0);
  EXPECT_EQ(one.inode(), st.st_ino);
  EXPECT_EQ(one.device(), st.st_dev);
  EXPECT_EQ(one.mtime_ns(), st.st_mtim.tv_sec * 1000000000LL + st.st_mtim.tv_nsec);
  EXPECT_EQ(one.ctime_ns(), st.st_ctim.tv_sec * 1000000000LL + st.st_ctim.tv_nsec);
  EXPECT_EQ(one.generation(), 0u);
  EXPECT_TRUE(one.content_xxh128().empty());

  EXPECT_EQ(ChunkCount(m.files(0), kChunk), 3u);
  EXPECT_EQ(ChunkSize(m.files(0), 0, kChunk), kChunk);
  EXPECT_EQ(ChunkSize(m.files(0), 2, kChunk), kChunk / 2);
  EXPECT_EQ(ChunkCount(m.files(1), kChunk), 0u);
  EXPECT_EQ(ChunkCount(m.files(2), kChunk), 1u);
  EXPECT_EQ(ChunkSize(m.files(2), 0, kChunk), 1u);
  EXPECT_TRUE(ValidateManifest(m).ok());

  // Deterministic: the same tree gives the same manifest.
  auto again = BuildManifest({dir_.Sub("src")}, kChunk);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->manifest.SerializeAsString(), m.SerializeAsString());
}

TEST_F(BuildManifestTest, SingleFileUsesItsBasename) {
  auto b = BuildManifest({dir_.Sub("src/big.bin")}, kChunk);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_TRUE(b->single_file);
  ASSERT_EQ(b->manifest.files_size(), 1);
  EXPECT_EQ(b->manifest.files(0).path(), "big.bin");
}

TEST_F(BuildManifestTest, SeveralSourcesLandUnderTheirBasenames) {
  auto b = BuildManifest({dir_.Sub("src/sub"), dir_.Sub("src/one.bin"), dir_.Sub("src/hollow")},
                         kChunk);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_FALSE(b->single_file);
  ASSERT_EQ(b->manifest.files_size(), 2);
  EXPECT_EQ(b->manifest.files(0).path(), "sub/deep/x.txt");
  EXPECT_EQ(b->manifest.files(1).path(), "one.bin");
  ASSERT_EQ(b->manifest.empty_dirs_size(), 1);
  EXPECT_EQ(b->manifest.empty_dirs(0), "hollow");
}

TEST_F(BuildManifestTest, ErrorsNameThePath) {
  auto missing = BuildManifest({dir_.Sub("nope")}, kChunk);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find(dir_.Sub("nope")), absl::string_view::npos);
  EXPECT_EQ(BuildManifest({"relative/path"}, kChunk).status().code(),
            absl::StatusCode::kInvalidArgument);
  MakeDirs(dir_.Sub("other/one.bin"));
  EXPECT_EQ(BuildManifest({dir_.Sub("src/one.bin"), dir_.Sub("other/one.bin")}, kChunk)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

// The tree of SetUp plus symlinks of every kind:
//   link -> one.bin (in the tree), sub/up -> ../big.bin (in the tree),
//   abs -> <absolute path of one.bin>, out -> ../outside.bin (escapes),
//   sub/deep/dir -> .. (a directory in the tree, a loop when followed),
//   dangling -> nowhere, odd -> ./one.bin (not in normal form).
class SymlinkManifestTest : public BuildManifestTest {
 protected:
  void SetUp() override {
    BuildManifestTest::SetUp();
    const std::string src = dir_.Sub("src");
    WriteFile(dir_.Sub("outside.bin"), std::string("outside"));
    ASSERT_EQ(symlink("../big.bin", (src + "/sub/up").c_str()), 0);
    ASSERT_EQ(symlink((src + "/one.bin").c_str(), (src + "/abs").c_str()), 0);
    ASSERT_EQ(symlink("../outside.bin", (src + "/out").c_str()), 0);
    ASSERT_EQ(symlink("..", (src + "/sub/deep/dir").c_str()), 0);
    ASSERT_EQ(symlink("nowhere", (src + "/dangling").c_str()), 0);
    ASSERT_EQ(symlink("./one.bin", (src + "/odd").c_str()), 0);
  }

  static std::map<std::string, std::string> Skipped(const ManifestBuild& b) {
    std::map<std::string, std::string> out;
    for (const SkippedEntry& e : b.skipped) out[e.path] = e.why;
    return out;
  }
};

TEST_F(SymlinkManifestTest, KeepSendsInTreeRelativeLinksAndListsTheOthers) {
  auto b = BuildManifest({dir_.Sub("src")}, kChunk, {.symlinks = SymlinkPolicy::kKeep});
  ASSERT_TRUE(b.ok()) << b.status();
  std::map<std::string, std::string> kept;
  for (const v1::ManifestSymlink& l : b->manifest.symlinks()) kept[l.path()] = l.target();
  EXPECT_EQ(kept, (std::map<std::string, std::string>{{"dangling", "nowhere"},
                                                      {"link", "one.bin"},
                                                      {"sub/deep/dir", ".."},
                                                      {"sub/up", "../big.bin"}}));
  const auto skipped = Skipped(*b);
  ASSERT_EQ(skipped.size(), 3u);
  EXPECT_NE(skipped.at("abs").find("absolute"), std::string::npos) << skipped.at("abs");
  EXPECT_NE(skipped.at("out").find("outside the transferred tree"), std::string::npos);
  EXPECT_NE(skipped.at("odd").find("\".\""), std::string::npos) << skipped.at("odd");
  EXPECT_EQ(b->manifest.files_size(), 4);  // regular files only
  EXPECT_TRUE(ValidateManifest(b->manifest).ok());
}

TEST_F(SymlinkManifestTest, KeepJudgesEachSourceOfSeveralOnItsOwn) {
  // sub/up -> ../big.bin stays inside src, but with `sub` sent as one of
  // several sources its target would be outside what is sent.
  auto b = BuildManifest({dir_.Sub("src/sub"), dir_.Sub("src/one.bin")}, kChunk);
  ASSERT_TRUE(b.ok()) << b.status();
  ASSERT_EQ(b->manifest.symlinks_size(), 1);
  EXPECT_EQ(b->manifest.symlinks(0).path(), "sub/deep/dir");
  EXPECT_EQ(Skipped(*b).count("sub/up"), 1u);
}

TEST_F(SymlinkManifestTest, FollowSendsTargetsAndSkipsLoopsAndDanglingLinks) {
  auto b = BuildManifest({dir_.Sub("src")}, kChunk, {.symlinks = SymlinkPolicy::kFollow});
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->manifest.symlinks_size(), 0);
  std::map<std::string, std::string> files;  // path -> followed link
  for (int i = 0; i < b->manifest.files_size(); ++i) {
    files[b->manifest.files(i).path()] = b->file_links[i];
  }
  EXPECT_EQ(files.at("link"), "link");
  EXPECT_EQ(files.at("abs"), "abs");
  EXPECT_EQ(files.at("out"), "out");  // the caller's access check decides
  EXPECT_EQ(files.at("sub/up"), "sub/up");
  EXPECT_EQ(files.at("odd"), "odd");
  EXPECT_EQ(files.at("one.bin"), "");
  EXPECT_EQ(b->source_paths.size(), b->file_links.size());
  const auto skipped = Skipped(*b);
  ASSERT_EQ(skipped.size(), 2u);
  EXPECT_NE(skipped.at("dangling").find("does not exist"), std::string::npos);
  EXPECT_NE(skipped.at("sub/deep/dir").find("loop"), std::string::npos);
  EXPECT_TRUE(ValidateManifest(b->manifest).ok());

  // A followed link whose target the caller may not read goes with all it reached.
  DropFollowed({"out", "sub/up"}, *b);
  for (const auto& f : b->manifest.files()) {
    EXPECT_NE(f.path(), "out");
    EXPECT_NE(f.path(), "sub/up");
  }
  EXPECT_EQ(b->source_paths.size(), static_cast<size_t>(b->manifest.files_size()));
  EXPECT_EQ(b->file_links.size(), static_cast<size_t>(b->manifest.files_size()));
}

// With --symlinks follow and --hard-links, a followed link is one more name
// of its target; dropping a followed link (the caller may not read it)
// forms the groups again over the files kept.
TEST_F(SymlinkManifestTest, FollowedNamesOfOneFileAreGroupedAgainWhenOneIsDropped) {
  auto b = BuildManifest({dir_.Sub("src")}, kChunk,
                         {.symlinks = SymlinkPolicy::kFollow, .hard_links = true});
  ASSERT_TRUE(b.ok()) << b.status();
  auto links = [&] {  // linked name -> the first name of its file
    std::map<std::string, std::string> out;
    for (const v1::ManifestFile& f : b->manifest.files()) {
      if (f.link_of() != 0) out[f.path()] = b->manifest.files(f.link_of() - 1).path();
    }
    return out;
  };
  // abs, link, odd -> one.bin; sub/up -> ../big.bin.
  EXPECT_EQ(links(),
            (std::map<std::string, std::string>{
                {"link", "abs"}, {"odd", "abs"}, {"one.bin", "abs"}, {"sub/up", "big.bin"}}));
  EXPECT_TRUE(ValidateManifest(b->manifest).ok());
  DropFollowed({"abs"}, *b);
  EXPECT_EQ(links(), (std::map<std::string, std::string>{
                         {"odd", "link"}, {"one.bin", "link"}, {"sub/up", "big.bin"}}));
  EXPECT_TRUE(ValidateManifest(b->manifest).ok()) << ValidateManifest(b->manifest);
}

TEST_F(SymlinkManifestTest, FollowingALoopOfDirectoriesEnds) {
  const std::string src = dir_.Sub("loop");
  MakeDirs(src + "/a");
  ASSERT_EQ(symlink("../b", (src + "/a/to-b").c_str()), 0);
  MakeDirs(src + "/b");
  ASSERT_EQ(symlink("../a", (src + "/b/to-a").c_str()), 0);
  WriteFile(src + "/b/x", std::string("x"));
  auto b = BuildManifest({src}, kChunk, {.symlinks = SymlinkPolicy::kFollow});
  ASSERT_TRUE(b.ok()) << b.status();
  // a/to-b/x, a/to-b/to-a is a loop; b/x, b/to-a/to-b is a loop.
  std::vector<std::string> paths;
  for (const auto& f : b->manifest.files()) paths.push_back(f.path());
  EXPECT_EQ(paths, (std::vector<std::string>{"a/to-b/x", "b/x"}));
  EXPECT_EQ(Skipped(*b).count("a/to-b/to-a"), 1u);
  EXPECT_EQ(Skipped(*b).count("b/to-a/to-b"), 1u);
}

TEST_F(SymlinkManifestTest, RefuseFailsNamingTheLink) {
  auto b = BuildManifest({dir_.Sub("src")}, kChunk, {.symlinks = SymlinkPolicy::kRefuse});
  EXPECT_EQ(b.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(b.status().message().find(dir_.Sub("src") + "/abs"), absl::string_view::npos)
      << b.status();
  EXPECT_NE(b.status().message().find("--symlinks"), absl::string_view::npos);
  // Without symlinks in the tree, refuse changes nothing.
  EXPECT_TRUE(
      BuildManifest({dir_.Sub("src/hollow")}, kChunk, {.symlinks = SymlinkPolicy::kRefuse}).ok());
  EXPECT_EQ(ParseSymlinkPolicy("sometimes").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(*ParseSymlinkPolicy(""), SymlinkPolicy::kKeep);
}

TEST_F(BuildManifestTest, HardLinksGroupByInodeOnlyWhenAsked) {
  // src/ gains a.bin with two more names, sub/deep/b.bin and sub/deep/c.bin,
  // and a fourth one outside src, which is not part of the transfer.
  const std::string src = dir_.Sub("src");
  WriteFile(src + "/a.bin", Bytes(kChunk + 7, 5));
  ASSERT_EQ(link((src + "/a.bin").c_str(), (src + "/sub/deep/b.bin").c_str()), 0);
  ASSERT_EQ(link((src + "/a.bin").c_str(), (src + "/sub/deep/c.bin").c_str()), 0);
  ASSERT_EQ(link((src + "/a.bin").c_str(), dir_.Sub("outside.bin").c_str()), 0);

  auto linked = BuildManifest({src}, kChunk, {.hard_links = true});
  ASSERT_TRUE(linked.ok()) << linked.status();
  const v1::Manifest& m = linked->manifest;
  std::map<std::string, uint32_t> link_of;
  for (const v1::ManifestFile& f : m.files()) link_of[f.path()] = f.link_of();
  // Walk order: a.bin, big.bin, empty.bin, one.bin, sub/deep/b.bin, ...
  ASSERT_EQ(m.files(0).path(), "a.bin");
  EXPECT_EQ(link_of, (std::map<std::string, uint32_t>{{"a.bin", 0},
                                                      {"big.bin", 0},
                                                      {"empty.bin", 0},
                                                      {"one.bin", 0},
                                                      {"sub/deep/b.bin", 1},
                                                      {"sub/deep/c.bin", 1},
                                                      {"sub/deep/x.txt", 0}}));
  EXPECT_TRUE(ValidateManifest(m).ok()) << ValidateManifest(m);
  uint64_t planned = 0;
  ForEachChunk(m, [&](ChunkId, uint64_t size) { planned += size; });
  EXPECT_EQ(planned, (kChunk + 7) + (kChunk * 2 + kChunk / 2) + 1 + 5);  // a.bin once

  // A group is found again over what is left when names are dropped.
  v1::Manifest without_first = m;
  without_first.mutable_files()->erase(without_first.mutable_files()->begin());
  GroupHardLinks(without_first);
  for (const v1::ManifestFile& f : without_first.files()) link_of[f.path()] = f.link_of();
  EXPECT_EQ(link_of.at("sub/deep/b.bin"), 0u);
  EXPECT_EQ(link_of.at("sub/deep/c.bin"), 4u);  // 1 + index of sub/deep/b.bin
  EXPECT_TRUE(ValidateManifest(without_first).ok());

  auto independent = BuildManifest({src}, kChunk);
  ASSERT_TRUE(independent.ok()) << independent.status();
  for (const v1::ManifestFile& f : independent->manifest.files()) {
    EXPECT_EQ(f.link_of(), 0u) << f.path();
  }
}

TEST_F(BuildManifestTest, SpecialFilesAreListedAsSkipped) {
  ASSERT_EQ(mkfifo(dir_.Sub("src/fifo").c_str(), 0600), 0);
  auto b = BuildManifest({dir_.Sub("src")}, kChunk);
  ASSERT_TRUE(b.ok()) << b.status();
  ASSERT_EQ(b->skipped.size(), 1u);
  EXPECT_EQ(b->skipped[0].path, "fifo");
}

TEST_F(BuildManifestTest, SparseFilesCarryTheirDataExtents) {
  const std::string path = dir_.Sub("sparse/file");
  MakeDirs(dir_.Sub("sparse"));
  const off_t size = off_t{64} << 20;
  {
    const int fd = open(path.c_str(), O_CREAT | O_WRONLY | O_TRUNC, 0644);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(ftruncate(fd, size), 0);
    const std::string data(256 << 10, 'd');
    ASSERT_EQ(pwrite(fd, data.data(), data.size(), off_t{8} << 20),
              static_cast<ssize_t>(data.size()));
    close(fd);
  }
  struct stat st;
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  if (st.st_blocks * 512 >= size) GTEST_SKIP() << "the test directory's file system keeps no holes";
  auto b = BuildManifest({dir_.Sub("sparse")}, kChunk);
  ASSERT_TRUE(b.ok()) << b.status();
  const v1::ManifestFile& f = b->manifest.files(0);
  ASSERT_TRUE(f.sparse());
  uint64_t data_bytes = 0;
  for (const v1::Extent& e : f.data()) {
    EXPECT_LE(e.offset(), uint64_t{8} << 20);
    EXPECT_GE(e.offset() + e.length(), (uint64_t{8} << 20) + (256 << 10));
    data_bytes += e.length();
  }
  EXPECT_GE(data_bytes, uint64_t{256} << 10);
  EXPECT_LT(data_bytes, uint64_t{2} << 20);  // file systems round to blocks, not more
  EXPECT_LE(PlannedBytes(f, kChunk), uint64_t{2} << 20);
  EXPECT_TRUE(ValidateManifest(b->manifest).ok());
  // A file without holes is not sparse.
  EXPECT_FALSE(BuildManifest({dir_.Sub("src/big.bin")}, kChunk)->manifest.files(0).sparse());
}

TEST_F(BuildManifestTest, SourceChangeIsDetected) {
  const std::string path = dir_.Sub("src/big.bin");
  auto b = BuildManifest({path}, kChunk);
  ASSERT_TRUE(b.ok());
  int fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  EXPECT_TRUE(CheckSourceUnchanged(b->manifest.files(0), fd).ok());
  ASSERT_EQ(ftruncate(fd, 10), 0);
  absl::Status s = CheckSourceUnchanged(b->manifest.files(0), fd);
  EXPECT_EQ(s.code(), absl::StatusCode::kAborted);
  EXPECT_NE(s.message().find("changed since its manifest"), absl::string_view::npos) << s;
  close(fd);

  v1::ManifestFile other_inode = b->manifest.files(0);
  other_inode.set_inode(other_inode.inode() + 1);
  other_inode.set_size(10);
  struct stat st;
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  other_inode.set_mtime_ns(st.st_mtim.tv_sec * 1000000000LL + st.st_mtim.tv_nsec);
  fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  EXPECT_EQ(CheckSourceUnchanged(other_inode, fd).code(), absl::StatusCode::kAborted);
  close(fd);
}

TEST_F(BuildManifestTest, CtimeAloneTellsARewriteWithTheMtimePutBack) {
  const std::string path = dir_.Sub("src/big.bin");
  auto b = BuildManifest({path}, kChunk);
  ASSERT_TRUE(b.ok());
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  ASSERT_TRUE(CheckSourceUnchanged(b->manifest.files(0), fd).ok());

  // What the manifest holds when the file was rewritten in place after it
  // was built, and `touch -r` put the size and mtime back: only the ctime
  // differs from the file's.
  v1::ManifestFile before = b->manifest.files(0);
  before.set_ctime_ns(before.ctime_ns() - 1);
  absl::Status s = CheckSourceUnchanged(before, fd);
  EXPECT_EQ(s.code(), absl::StatusCode::kAborted);
  EXPECT_NE(s.message().find("ctime is"), absl::string_view::npos) << s;

  // Manifests journaled before ctimes were recorded: not compared.
  before.set_ctime_ns(0);
  EXPECT_TRUE(CheckSourceUnchanged(before, fd).ok());
  close(fd);
}

TEST_F(BuildManifestTest, RecordSourceIdentityKeepsPathGenerationAndDigest) {
  const std::string path = dir_.Sub("src/one.bin");
  struct stat st;
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  v1::ManifestFile f;
  f.set_path("kept");
  f.set_generation(4);
  f.set_content_xxh128(std::string(16, 'x'));
  RecordSourceIdentity(st, f);
  EXPECT_EQ(f.path(), "kept");
  EXPECT_EQ(f.generation(), 4u);
  EXPECT_EQ(f.content_xxh128(), std::string(16, 'x'));
  EXPECT_EQ(f.size(), 1u);
  EXPECT_EQ(f.mode(), 0640u);
  EXPECT_EQ(f.ctime_ns(), st.st_ctim.tv_sec * 1000000000LL + st.st_ctim.tv_nsec);
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  EXPECT_TRUE(CheckSourceUnchanged(f, fd).ok());
  close(fd);
}

// --- ValidateManifest ---------------------------------------------------------

v1::Manifest Good() {
  v1::Manifest m;
  m.set_chunk_size(16 << 20);
  for (const char* p : {"a/b/c.bin", "a/d.bin", "e"}) {
    v1::ManifestFile* f = m.add_files();
    f->set_path(p);
    f->set_size(100);
    f->set_mode(0644);
  }
  m.add_empty_dirs("a/empty");
  return m;
}

TEST(ValidateManifestTest, AcceptsAGoodManifest) { EXPECT_TRUE(ValidateManifest(Good()).ok()); }

TEST(ValidateManifestTest, RejectsChunkSizeOutOfRange) {
  v1::Manifest m = Good();
  m.set_chunk_size((64 << 10) - 1);
  EXPECT_EQ(ValidateManifest(m).code(), absl::StatusCode::kInvalidArgument);
  m.set_chunk_size((uint64_t{1} << 30) + 1);
  EXPECT_EQ(ValidateManifest(m).code(), absl::StatusCode::kInvalidArgument);
  m.set_chunk_size(0);
  EXPECT_EQ(ValidateManifest(m).code(), absl::StatusCode::kInvalidArgument);
}

TEST(ValidateManifestTest, RejectsTooManyFiles) {
  ManifestLimits limits;
  limits.max_files = 2;
  EXPECT_EQ(ValidateManifest(Good(), limits).code(), absl::StatusCode::kInvalidArgument);
}

TEST(ValidateManifestTest, RejectsEveryBadPath) {
  const std::string too_long(4097, 'x');
  const std::vector<std::string> bad = {
      "",      "/abs",     "a//b",  "a/",       "./a",      "a/./b",     "..",
      "a/..",  "../etc",   "a/../b", std::string("a\0b", 3), too_long, "."};
  for (const std::string& p : bad) {
    v1::Manifest m = Good();
    m.mutable_files(1)->set_path(p);
    absl::Status s = ValidateManifest(m);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << "path: " << p;
    EXPECT_NE(s.message().find("manifest file 1"), absl::string_view::npos) << s;
  }
}

TEST(ValidateManifestTest, RejectsDuplicatesAndFileDirectoryClashes) {
  v1::Manifest dup = Good();
  dup.mutable_files(2)->set_path("a/d.bin");
  absl::Status s = ValidateManifest(dup);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("duplicate"), absl::string_view::npos) << s;

  v1::Manifest clash = Good();
  clash.mutable_files(2)->set_path("a/b");  // a file, and the parent of a/b/c.bin
  s = ValidateManifest(clash);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("also a file"), absl::string_view::npos) << s;

  v1::Manifest dir_clash = Good();
  dir_clash.add_empty_dirs("e/under-a-file");
  EXPECT_EQ(ValidateManifest(dir_clash).code(), absl::StatusCode::kInvalidArgument);
  v1::Manifest dir_is_file = Good();
  dir_is_file.add_empty_dirs("e");
  EXPECT_EQ(ValidateManifest(dir_is_file).code(), absl::StatusCode::kInvalidArgument);
  v1::Manifest bad_dir = Good();
  bad_dir.add_empty_dirs("../x");
  EXPECT_EQ(ValidateManifest(bad_dir).code(), absl::StatusCode::kInvalidArgument);
}

v1::Manifest WithSymlink(const std::string& path, const std::string& target) {
  v1::Manifest m = Good();
  v1::ManifestSymlink* l = m.add_symlinks();
  l->set_path(path);
  l->set_target(target);
  return m;
}

TEST(ValidateManifestTest, AcceptsSymlinksThatStayInTheTree) {
  for (const auto& [path, target] : std::vector<std::pair<std::string, std::string>>{
           {"latest", "a/d.bin"}, {"a/b/up", "../../e"}, {"a/top", ".."}, {"x", "nowhere"}}) {
    absl::Status s = ValidateManifest(WithSymlink(path, target));
    EXPECT_TRUE(s.ok()) << path << " -> " << target << ": " << s;
  }
}

// What a hostile peer could send to make the destination point, or write,
// outside the transferred tree.
TEST(ValidateManifestTest, RejectsSymlinksThatEscapeOrClash) {
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"l", "/etc/passwd"},     // absolute
      {"l", ".."},              // the tree's parent
      {"a/l", "../.."},         // likewise from a subdirectory
      {"a/b/l", "../../../x"},  // one ".." too many
      {"l", "a/../../x"},       // ".." after a name
      {"l", "a/b/../../.."},    // escapes only after normalization
      {"l", "./x"},             // not in normal form
      {"l", "a//b"},            // empty component
      {"l", ""},                // empty target
      {"l", std::string("a\0b", 3)},
      {"../l", "x"},  // bad link path
      {"/l", "x"},
      {"e", "a/d.bin"},      // the path of a file
      {"a/empty", "x"},      // the path of an empty dir
      {"a/b/c.bin/l", "x"},  // below a file
  };
  for (const auto& [path, target] : bad) {
    absl::Status s = ValidateManifest(WithSymlink(path, target));
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << path << " -> " << target;
  }
  // A symlink as the parent of another entry: writing that entry would go
  // through the symlink.
  v1::Manifest through = WithSymlink("a/b", "../e");
  absl::Status s = ValidateManifest(through);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("symlink"), absl::string_view::npos) << s;
  v1::Manifest twice = WithSymlink("l", "e");
  *twice.add_symlinks() = twice.symlinks(0);
  EXPECT_EQ(ValidateManifest(twice).code(), absl::StatusCode::kInvalidArgument);
  v1::Manifest over_dir = WithSymlink("a/empty/l", "x");
  over_dir.mutable_symlinks(0)->set_path("q");
  over_dir.add_empty_dirs("q/sub");
  EXPECT_EQ(ValidateManifest(over_dir).code(), absl::StatusCode::kInvalidArgument);
}

// A peer's extents decide which chunks it never sends: they must be sane.
TEST(ValidateManifestTest, RejectsDataExtentsThatLieOrOverlap) {
  auto with = [](bool sparse, std::vector<std::pair<uint64_t, uint64_t>> extents) {
    v1::Manifest m = Good();  // files of 100 bytes
    v1::ManifestFile* f = m.mutable_files(0);
    f->set_sparse(sparse);
    for (const auto& [offset, length] : extents) {
      v1::Extent* e = f->add_data();
      e->set_offset(offset);
      e->set_length(length);
    }
    return ValidateManifest(m);
  };
  EXPECT_TRUE(with(true, {}).ok());  // all holes
  EXPECT_TRUE(with(true, {{0, 10}, {50, 50}}).ok());
  EXPECT_EQ(with(false, {{0, 10}}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(with(true, {{0, 10}, {5, 10}}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(with(true, {{50, 10}, {0, 10}}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(with(true, {{10, 0}}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(with(true, {{90, 11}}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(with(true, {{100, 1}}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(with(true, {{1, UINT64_MAX}}).code(), absl::StatusCode::kInvalidArgument);
  ManifestLimits limits;
  limits.max_data_extents = 1;
  v1::Manifest two = Good();
  two.mutable_files(0)->set_sparse(true);
  for (uint64_t o : {0, 10}) {
    v1::Extent* e = two.mutable_files(0)->add_data();
    e->set_offset(o);
    e->set_length(1);
  }
  EXPECT_EQ(ValidateManifest(two, limits).code(), absl::StatusCode::kInvalidArgument);
}

TEST(ValidateManifestTest, RejectsHardLinksThatDoNotNameAnEarlierFile) {
  // Good(): files 0..2 of 100 bytes, mode 0644.
  auto with = [](std::vector<std::pair<int, uint32_t>> links,
                 void (*edit)(v1::Manifest&) = nullptr) {
    v1::Manifest m = Good();
    for (const auto& [file, link_of] : links) m.mutable_files(file)->set_link_of(link_of);
    if (edit != nullptr) edit(m);
    return ValidateManifest(m);
  };
  EXPECT_TRUE(with({{1, 1}, {2, 1}}).ok()) << with({{1, 1}, {2, 1}});
  EXPECT_TRUE(with({{2, 2}}).ok());
  const absl::Status forward = with({{0, 3}});
  EXPECT_EQ(forward.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(forward.message().find("does not come before it"), std::string::npos) << forward;
  EXPECT_EQ(with({{1, 2}}).code(), absl::StatusCode::kInvalidArgument);  // itself
  EXPECT_EQ(with({{2, 4}}).code(), absl::StatusCode::kInvalidArgument);  // past the end
  EXPECT_EQ(with({{2, UINT32_MAX}}).code(), absl::StatusCode::kInvalidArgument);
  const absl::Status chained = with({{1, 1}, {2, 2}});  // a link of a link
  EXPECT_EQ(chained.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(chained.message().find("itself a hard link"), std::string::npos) << chained;
  const absl::Status size =
      with({{1, 1}}, [](v1::Manifest& m) { m.mutable_files(1)->set_size(101); });
  EXPECT_EQ(size.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(size.message().find("differs"), std::string::npos) << size;
  EXPECT_EQ(with({{1, 1}}, [](v1::Manifest& m) { m.mutable_files(1)->set_mode(0600); }).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(ValidateManifestTest, RejectsHugeSizesAndBadModes) {
  v1::Manifest big = Good();
  big.mutable_files(0)->set_size((uint64_t{1} << 50) + 1);
  EXPECT_EQ(ValidateManifest(big).code(), absl::StatusCode::kInvalidArgument);

  v1::Manifest too_many_chunks = Good();
  too_many_chunks.set_chunk_size(64 << 10);
  too_many_chunks.mutable_files(0)->set_size(uint64_t{1} << 50);  // 2^34 chunks
  EXPECT_EQ(ValidateManifest(too_many_chunks).code(), absl::StatusCode::kInvalidArgument);

  v1::Manifest mode = Good();
  mode.mutable_files(0)->set_mode(0100644);  // S_IFREG bits
  absl::Status s = ValidateManifest(mode);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("mode"), absl::string_view::npos) << s;
}

TEST(ValidateManifestTest, ContentDigestIsEmptyOrSixteenBytes) {
  v1::Manifest digest = Good();
  digest.mutable_files(1)->set_content_xxh128(std::string(16, '\0'));
  EXPECT_TRUE(ValidateManifest(digest).ok());
  digest.mutable_files(1)->set_content_xxh128(std::string(15, '\0'));
  absl::Status s = ValidateManifest(digest);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("content digest"), absl::string_view::npos) << s;
}

}  // namespace
}  // namespace longhaul::storage
