#include "storage/manifest.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <string>

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
