#include "storage/file_io.h"

#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/storage/test_util.h"

namespace longhaul::storage {
namespace {

using testing::Bytes;
using testing::ReadFile;
using testing::TempDir;
using testing::WriteFile;

// Every FileIo implementation must behave the same; io_uring cases are
// skipped (with a note) where the kernel or sandbox does not offer it.
class FileIoTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    auto io = testing::FileIoUnderTest(GetParam() == "io_uring");
    if (!io.ok()) GTEST_SKIP() << "io_uring unavailable here: " << io.status();
    io_ = *std::move(io);
    EXPECT_EQ(io_->name(), GetParam());
  }

  int OpenFd(const std::string& path, int flags) {
    int fd = open(path.c_str(), flags | O_CLOEXEC, 0644);
    EXPECT_GE(fd, 0) << path;
    fds_.push_back(fd);
    return fd;
  }
  void TearDown() override {
    for (int fd : fds_) close(fd);
  }

  TempDir dir_;
  std::unique_ptr<FileIo> io_;
  std::vector<int> fds_;
};

TEST_P(FileIoTest, WritesThenReadsBackAcrossSubBlocks) {
  // 3.5 sub-blocks, written at an offset, so requests are split and the last is short.
  const auto data = Bytes(FileIo::kSubBlockSize * 3 + FileIo::kSubBlockSize / 2, 7);
  const std::string path = dir_.Sub("f");
  int fd = OpenFd(path, O_RDWR | O_CREAT);
  ASSERT_TRUE(io_->WriteAt(fd, 4096, data).ok());
  ASSERT_TRUE(io_->SyncData(fd).ok());
  EXPECT_EQ(ReadFile(path).size(), data.size() + 4096);

  std::vector<uint8_t> back(data.size());
  auto n = io_->ReadAt(fd, 4096, absl::MakeSpan(back));
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(*n, data.size());
  EXPECT_EQ(back, data);
}

TEST_P(FileIoTest, StreamingDeliversSubBlocksInOrder) {
  const auto data = Bytes(FileIo::kSubBlockSize * 5 + 123, 8);
  const std::string path = dir_.Sub("f");
  WriteFile(path, data);
  int fd = OpenFd(path, O_RDONLY);
  std::vector<uint8_t> buf(data.size());
  std::vector<uint8_t> seen;
  std::vector<size_t> sizes;
  auto n = io_->ReadAtStreaming(fd, 0, absl::MakeSpan(buf), [&](absl::Span<const uint8_t> b) {
    EXPECT_EQ(b.data(), buf.data() + seen.size());  // contiguous, in order
    seen.insert(seen.end(), b.begin(), b.end());
    sizes.push_back(b.size());
  });
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(*n, data.size());
  EXPECT_EQ(seen, data);
  ASSERT_EQ(sizes.size(), 6u);
  EXPECT_EQ(sizes[0], FileIo::kSubBlockSize);
  EXPECT_EQ(sizes[5], 123u);
}

TEST_P(FileIoTest, ReadIsShortOnlyAtEof) {
  const auto data = Bytes(FileIo::kSubBlockSize + 1000, 9);
  const std::string path = dir_.Sub("f");
  WriteFile(path, data);
  int fd = OpenFd(path, O_RDONLY);
  std::vector<uint8_t> buf(FileIo::kSubBlockSize * 4);
  size_t streamed = 0;
  auto n = io_->ReadAtStreaming(fd, 500, absl::MakeSpan(buf),
                                [&](absl::Span<const uint8_t> b) { streamed += b.size(); });
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(*n, data.size() - 500);
  EXPECT_EQ(streamed, *n);
  EXPECT_TRUE(std::equal(buf.begin(), buf.begin() + *n, data.begin() + 500));

  auto past = io_->ReadAt(fd, data.size() + 10, absl::MakeSpan(buf));
  ASSERT_TRUE(past.ok());
  EXPECT_EQ(*past, 0u);
}

TEST_P(FileIoTest, ErrorsNameTheFile) {
  const std::string path = dir_.Sub("readonly");
  WriteFile(path, "x");
  int fd = OpenFd(path, O_RDONLY);
  const auto data = Bytes(10, 1);
  absl::Status s = io_->WriteAt(fd, 0, data);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find(path), absl::string_view::npos) << s;
}

INSTANTIATE_TEST_SUITE_P(Implementations, FileIoTest, ::testing::Values("io_uring", "pread"),
                         [](const auto& info) {
                           return info.param == "io_uring" ? std::string("IoUring")
                                                           : std::string("Posix");
                         });

TEST(MakeFileIoTest, EnvironmentForcesTheFallback) {
  setenv("LONGHAUL_NO_IO_URING", "1", 1);
  EXPECT_EQ(MakeFileIo()->name(), "pread");
  unsetenv("LONGHAUL_NO_IO_URING");
  EXPECT_EQ(MakeFileIo(/*prefer_io_uring=*/false)->name(), "pread");
  const bool ring_works = IoUringFileIo::Create().ok();
  EXPECT_EQ(MakeFileIo()->name(), ring_works ? "io_uring" : "pread");
}

}  // namespace
}  // namespace longhaul::storage
