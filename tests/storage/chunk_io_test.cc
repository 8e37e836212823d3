#include "storage/chunk_io.h"

#include <fcntl.h>
#include <unistd.h>

#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "gtest/gtest.h"
#include "tests/storage/test_util.h"

namespace longhaul::storage {
namespace {

using testing::Bytes;
using testing::TempDir;
using testing::WriteFile;

TEST(Xxh128Test, BytesAreLittleEndianLowThenHigh) {
  Xxh128 h{0x0706050403020100ull, 0x0f0e0d0c0b0a0908ull};
  auto b = h.ToBytes();
  for (int i = 0; i < 16; ++i) EXPECT_EQ(b[i], i);
  auto back = Xxh128::FromBytes(absl::MakeConstSpan(b));
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(*back, h);
  EXPECT_EQ(h.ToString(), "0f0e0d0c0b0a09080706050403020100");
  EXPECT_FALSE(Xxh128::FromBytes(std::string_view("short")).has_value());
}

TEST(Xxh128Test, KnownDigestOfEmptyInput) {
  // XXH3_128bits("") from the xxHash reference (xxhsum -H2 /dev/null).
  EXPECT_EQ(HashBytes({}).ToString(), "99aa06d3014798d86001c324468d497f");
}

class ChunkIoTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    auto io = testing::FileIoUnderTest(GetParam());
    if (!io.ok()) GTEST_SKIP() << "io_uring unavailable here: " << io.status();
    io_ = *std::move(io);
  }
  TempDir dir_;
  std::unique_ptr<FileIo> io_;
};

TEST_P(ChunkIoTest, HashWhileReadingEqualsHashOfTheBytes) {
  const auto data = Bytes(FileIo::kSubBlockSize * 3 + 777, 42);
  const std::string path = dir_.Sub("src");
  WriteFile(path, data);
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  // A chunk in the middle of the file, spanning several sub-blocks.
  const uint64_t offset = 1000;
  std::vector<uint8_t> buf(FileIo::kSubBlockSize * 2 + 5);
  auto h = ReadChunkHashed(*io_, fd, offset, absl::MakeSpan(buf));
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(*h, HashBytes(absl::MakeConstSpan(data).subspan(offset, buf.size())));
  EXPECT_TRUE(std::equal(buf.begin(), buf.end(), data.begin() + offset));
  close(fd);
}

TEST_P(ChunkIoTest, ShrunkSourceIsAbortedNamingTheFile) {
  const std::string path = dir_.Sub("shrinking");
  WriteFile(path, Bytes(1000, 1));
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(truncate(path.c_str(), 600), 0);
  std::vector<uint8_t> buf(1000);
  auto h = ReadChunkHashed(*io_, fd, 0, absl::MakeSpan(buf));
  EXPECT_EQ(h.status().code(), absl::StatusCode::kAborted);
  EXPECT_NE(h.status().message().find("shrank"), absl::string_view::npos) << h.status();
  EXPECT_NE(h.status().message().find(path), absl::string_view::npos) << h.status();
  close(fd);
}

TEST_P(ChunkIoTest, HashFileChunksGivesEachChunkItsDigestInOrder) {
  constexpr uint64_t kChunk = 4096;
  const auto data = Bytes(kChunk * 2 + 100, 7);  // two whole chunks and a short one
  const std::string path = dir_.Sub("chunks");
  WriteFile(path, data);
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  v1::ManifestFile file;
  file.set_size(data.size());
  std::vector<uint8_t> buf(kChunk);
  std::vector<std::tuple<uint32_t, uint64_t, Xxh128>> seen;
  absl::Status s = HashFileChunks(*io_, fd, file, kChunk, absl::MakeSpan(buf),
                                  [&](uint32_t c, uint64_t size, const Xxh128& digest) {
                                    seen.emplace_back(c, size, digest);
                                    return true;
                                  });
  close(fd);
  ASSERT_TRUE(s.ok()) << s;
  const auto bytes = absl::MakeConstSpan(data);
  ASSERT_EQ(seen.size(), 3u);
  EXPECT_EQ(seen[0], std::make_tuple(0u, kChunk, HashBytes(bytes.subspan(0, kChunk))));
  EXPECT_EQ(seen[1], std::make_tuple(1u, kChunk, HashBytes(bytes.subspan(kChunk, kChunk))));
  EXPECT_EQ(seen[2], std::make_tuple(2u, uint64_t{100}, HashBytes(bytes.subspan(2 * kChunk))));
}

TEST_P(ChunkIoTest, HashFileChunksStopsWhenTheCallerSaysSo) {
  constexpr uint64_t kChunk = 4096;
  const std::string path = dir_.Sub("chunks");
  WriteFile(path, Bytes(kChunk * 3, 8));
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  v1::ManifestFile file;
  file.set_size(kChunk * 3);
  std::vector<uint8_t> buf(kChunk);
  std::vector<uint32_t> seen;
  absl::Status s = HashFileChunks(*io_, fd, file, kChunk, absl::MakeSpan(buf),
                                  [&](uint32_t c, uint64_t, const Xxh128&) {
                                    seen.push_back(c);
                                    return c < 1;
                                  });
  close(fd);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(seen, (std::vector<uint32_t>{0, 1}));
}

TEST_P(ChunkIoTest, HashFileChunksOfAnEmptyFileCallsNothing) {
  const std::string path = dir_.Sub("empty");
  WriteFile(path, std::string());
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  v1::ManifestFile file;  // size 0
  int calls = 0;
  absl::Status s = HashFileChunks(*io_, fd, file, 4096, {}, [&](uint32_t, uint64_t, const Xxh128&) {
    ++calls;
    return true;
  });
  close(fd);
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(calls, 0);
}

TEST_P(ChunkIoTest, HashFileChunksOfAShorterFileStopsAtTheShortChunk) {
  constexpr uint64_t kChunk = 4096;
  const std::string path = dir_.Sub("short");
  WriteFile(path, Bytes(kChunk + 10, 9));
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  v1::ManifestFile file;
  file.set_size(kChunk * 3);  // what the manifest says; the file has less
  std::vector<uint8_t> buf(kChunk);
  std::vector<uint32_t> seen;
  absl::Status s = HashFileChunks(*io_, fd, file, kChunk, absl::MakeSpan(buf),
                                  [&](uint32_t c, uint64_t, const Xxh128&) {
                                    seen.push_back(c);
                                    return true;
                                  });
  close(fd);
  EXPECT_EQ(s.code(), absl::StatusCode::kAborted) << s;
  EXPECT_EQ(seen, (std::vector<uint32_t>{0}));
}

INSTANTIATE_TEST_SUITE_P(Implementations, ChunkIoTest, ::testing::Bool(),
                         [](const auto& info) {
                           return info.param ? std::string("IoUring") : std::string("Posix");
                         });

}  // namespace
}  // namespace longhaul::storage
