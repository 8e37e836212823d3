#include "storage/content_check.h"
#include "storage/staging.h"
#include "storage/file_system.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/storage/test_util.h"

namespace longhaul::storage {
namespace {

using testing::Bytes;
using testing::MakeDirs;
using testing::TempDir;
using testing::WriteFile;

std::string DigestBytes(const std::vector<uint8_t>& content) {
  auto bytes = HashBytes(content).ToBytes();
  return std::string(bytes.begin(), bytes.end());
}

TEST(HashFileContentTest, EqualsTheDigestOfTheWholeContent) {
  TempDir dir;
  PosixFileIo io;
  // Odd sizes, so neither the buffer nor FileIo's sub-blocks divide the file.
  for (size_t size : {size_t{0}, size_t{1}, (size_t{5} << 20) / 2 + 7}) {
    const std::vector<uint8_t> content = Bytes(size, 9);
    const std::string path = dir.Sub("f" + std::to_string(size));
    WriteFile(path, content);
    int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    ASSERT_GE(fd, 0);
    std::vector<uint8_t> buffer((1 << 20) + 3);
    auto digest = HashFileContent(io, fd, size, absl::MakeSpan(buffer), [] { return false; });
    close(fd);
    ASSERT_TRUE(digest.ok()) << digest.status();
    EXPECT_EQ(*digest, HashBytes(content)) << size;
  }
}

TEST(HashFileContentTest, AShorterFileIsAbortedAndCancellingStops) {
  TempDir dir;
  PosixFileIo io;
  const std::string path = dir.Sub("f");
  WriteFile(path, Bytes(3 << 20, 1));
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  std::vector<uint8_t> buffer(1 << 20);
  auto shrank =
      HashFileContent(io, fd, (3 << 20) + 1, absl::MakeSpan(buffer), [] { return false; });
  EXPECT_EQ(shrank.status().code(), absl::StatusCode::kAborted) << shrank.status();
  int asked = 0;
  auto cancelled =
      HashFileContent(io, fd, 3 << 20, absl::MakeSpan(buffer), [&] { return ++asked > 1; });
  EXPECT_EQ(cancelled.status().code(), absl::StatusCode::kCancelled) << cancelled.status();
  EXPECT_EQ(asked, 2);
  close(fd);
}

class PublishedContentTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dest_.export_root = dir_.path();
    dest_.relative = "ckpt/step-1";
    dest_.absolute = dir_.Sub("ckpt/step-1");
    MakeDirs(dest_.absolute + "/sub");
    WriteFile(dest_.absolute + "/sub/w.bin", content_);
    file_.set_path("sub/w.bin");
    file_.set_size(content_.size());
    file_.set_content_xxh128(DigestBytes(content_));
  }

  absl::StatusOr<bool> Matches(const v1::ManifestFile& f) {
    return PublishedFileMatches(PosixFileSystem(), dest_, /*single_file=*/false, f, /*compare_content=*/true);
  }

  TempDir dir_;
  ResolvedDestination dest_;
  const std::vector<uint8_t> content_ = Bytes((3 << 20) + 11, 4);
  v1::ManifestFile file_;
};

TEST_F(PublishedContentTest, SameContentMatchesWhateverTheMtime) {
  struct timespec times[2] = {{0, UTIME_OMIT}, {12345, 0}};
  ASSERT_EQ(utimensat(AT_FDCWD, (dest_.absolute + "/sub/w.bin").c_str(), times, 0), 0);
  file_.set_mtime_ns(999);
  auto same = Matches(file_);
  ASSERT_TRUE(same.ok()) << same.status();
  EXPECT_TRUE(*same);
}

TEST_F(PublishedContentTest, OneChangedByteAtTheSameSizeDoesNotMatch) {
  std::vector<uint8_t> changed = content_;
  changed[(1 << 20) + 5] ^= 0x01;
  WriteFile(dest_.absolute + "/sub/w.bin", changed);
  auto same = Matches(file_);
  ASSERT_TRUE(same.ok()) << same.status();
  EXPECT_FALSE(*same);
}

TEST_F(PublishedContentTest, OtherSizeMissingFileOrNoDigestDoNotMatch) {
  v1::ManifestFile longer = file_;
  longer.set_size(file_.size() + 1);
  EXPECT_FALSE(Matches(longer).value_or(true)) << longer.path();
  v1::ManifestFile missing = file_;
  missing.set_path("sub/nope.bin");
  EXPECT_FALSE(Matches(missing).value_or(true)) << missing.path();
  v1::ManifestFile missing_dir = file_;
  missing_dir.set_path("nodir/w.bin");
  EXPECT_FALSE(Matches(missing_dir).value_or(true)) << missing_dir.path();
  v1::ManifestFile no_digest = file_;
  no_digest.clear_content_xxh128();
  EXPECT_FALSE(Matches(no_digest).value_or(true)) << no_digest.path();
}

TEST_F(PublishedContentTest, NoSymlinkIsFollowed) {
  // A symlink in the file's place, to a file with the right content.
  WriteFile(dir_.Sub("elsewhere.bin"), content_);
  ASSERT_EQ(symlink(dir_.Sub("elsewhere.bin").c_str(), (dest_.absolute + "/sub/link.bin").c_str()),
            0);
  v1::ManifestFile link = file_;
  link.set_path("sub/link.bin");
  auto same = Matches(link);
  ASSERT_TRUE(same.ok()) << same.status();
  EXPECT_FALSE(*same);

  // A symlinked directory on the way is refused, as publish would refuse it.
  ASSERT_EQ(symlink((dest_.absolute + "/sub").c_str(), (dest_.absolute + "/via").c_str()), 0);
  v1::ManifestFile via = file_;
  via.set_path("via/w.bin");
  EXPECT_EQ(Matches(via).status().code(), absl::StatusCode::kPermissionDenied);
}

TEST_F(PublishedContentTest, SingleFileDestinationIsTheFileItself) {
  dest_.relative = "ckpt/step-1/sub/w.bin";
  dest_.absolute = dir_.Sub(dest_.relative);
  v1::ManifestFile single = file_;
  single.set_path("w.bin");
  auto same = PublishedFileMatches(PosixFileSystem(), dest_, /*single_file=*/true, single, /*compare_content=*/true);
  ASSERT_TRUE(same.ok()) << same.status();
  EXPECT_TRUE(*same);
}

}  // namespace
}  // namespace longhaul::storage
