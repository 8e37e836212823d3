// Staged chunk I/O with O_DIRECT on a file system that takes it (ext4 under
// TEST_TMPDIR or /tmp) and buffered on one that refuses it (tmpfs /dev/shm).
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "storage/chunk_io.h"
#include "storage/exports.h"
#include "storage/file_io.h"
#include "storage/file_system.h"
#include "storage/staging.h"
#include "tests/storage/test_util.h"

namespace longhaul::storage {
namespace {

using testing::Bytes;
using testing::IsTmpfs;
using testing::MakeDirs;
using testing::ShmDir;
using testing::TempDir;

constexpr uint64_t kChunk = 64 << 10;
// Three whole chunks and a last one that is not a multiple of the block size.
constexpr uint64_t kFileSize = 3 * kChunk + 1000;

// How many of the pages of [offset, offset + len) of `fd` are in the page
// cache (mincore on a mapping, which does not fault them in).
size_t ResidentPages(int fd, uint64_t offset, size_t len) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  void* map = mmap(nullptr, len, PROT_READ, MAP_SHARED, fd, static_cast<off_t>(offset));
  if (map == MAP_FAILED) {
    ADD_FAILURE() << "mmap: " << std::strerror(errno);
    return 0;
  }
  std::vector<unsigned char> vec((len + page - 1) / page);
  size_t resident = 0;
  if (mincore(map, len, vec.data()) != 0) {
    ADD_FAILURE() << "mincore: " << std::strerror(errno);
  } else {
    for (unsigned char v : vec) resident += v & 1;
  }
  munmap(map, len);
  return resident;
}

std::vector<uint8_t> Pread(int fd, uint64_t offset, size_t len) {
  std::vector<uint8_t> out(len);
  ssize_t n = pread(fd, out.data(), len, static_cast<off_t>(offset));
  out.resize(n < 0 ? 0 : static_cast<size_t>(n));
  return out;
}

// Param: true = io_uring, false = pread/pwrite.
class DirectIoTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    auto io = testing::FileIoUnderTest(GetParam());
    if (!io.ok()) GTEST_SKIP() << "io_uring unavailable here: " << io.status();
    io_ = *std::move(io);
    data_ = Bytes(kFileSize, 7);
  }

  // Creates `name` in `dir` sized (not reserved) to kFileSize, as staging does.
  std::unique_ptr<File> Create(Directory& dir, const std::string& name) {
    auto f = PosixFileSystem().OpenFile(dir, name, OpenMode::kCreateExclusive);
    EXPECT_TRUE(f.ok()) << f.status();
    if (!f.ok()) return nullptr;
    EXPECT_TRUE((*f)->Resize(kFileSize).ok());
    return *std::move(f);
  }

  // Writes every chunk of data_ through WriteChunk: chunk 1 from an
  // unaligned address (the copy path), the others from aligned buffers.
  void WriteAllChunks(File& file) {
    for (uint64_t c = 0; c * kChunk < kFileSize; ++c) {
      const size_t size = std::min<uint64_t>(kChunk, kFileSize - c * kChunk);
      AlignedBuffer buf(size + 1);
      uint8_t* start = buf.data() + (c == 1 ? 1 : 0);
      std::memcpy(start, data_.data() + c * kChunk, size);
      ASSERT_TRUE(WriteChunk(*io_, file, c * kChunk, absl::MakeConstSpan(start, size)).ok());
    }
    ASSERT_TRUE(io_->SyncData(file.fd()).ok());
  }

  // Reads every chunk back through ReadChunkHashed(File) and compares the
  // digests and the bytes with data_.
  void ExpectChunksReadBack(File& file) {
    AlignedBuffer buf(kChunk);
    for (uint64_t c = 0; c * kChunk < kFileSize; ++c) {
      const size_t size = std::min<uint64_t>(kChunk, kFileSize - c * kChunk);
      auto want = absl::MakeConstSpan(data_).subspan(c * kChunk, size);
      auto h = ReadChunkHashed(*io_, file, c * kChunk, buf.span(size));
      ASSERT_TRUE(h.ok()) << h.status();
      EXPECT_EQ(*h, HashBytes(want)) << "chunk " << c;
      EXPECT_EQ(std::memcmp(buf.data(), want.data(), size), 0) << "chunk " << c;
    }
  }

  std::unique_ptr<FileIo> io_;
  std::vector<uint8_t> data_;
};

TEST(AlignedBufferTest, AddressAndCapacityAreAligned) {
  for (size_t size : {size_t{0}, size_t{1}, size_t{4096}, size_t{70000}}) {
    AlignedBuffer buf(size);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(buf.data()) % kDirectIoAlignment, 0u);
    EXPECT_EQ(buf.capacity() % kDirectIoAlignment, 0u);
    EXPECT_GE(buf.capacity(), size);
  }
}

TEST_P(DirectIoTest, DirectOnDiskBypassesThePageCacheAndSurvivesReopen) {
  TempDir tmp;
  if (IsTmpfs(tmp.path())) GTEST_SKIP() << tmp.path() << " is tmpfs; set TEST_TMPDIR to a disk";
  auto dir = PosixFileSystem().OpenRoot(tmp.path());
  ASSERT_TRUE(dir.ok()) << dir.status();
  std::unique_ptr<File> file = Create(**dir, "staged");
  ASSERT_NE(file, nullptr);
  EXPECT_EQ(file->direct_fd(), -1);
  auto direct = file->EnableDirectIo();
  ASSERT_TRUE(direct.ok()) << direct.status();
  if (!*direct) GTEST_SKIP() << tmp.path() << " refuses O_DIRECT";
  EXPECT_GE(file->direct_fd(), 0);
  EXPECT_NE(file->direct_fd(), file->fd());
  auto again = file->EnableDirectIo();
  ASSERT_TRUE(again.ok() && *again);

  WriteAllChunks(*file);
  // The whole blocks went around the page cache (the block holding the
  // unaligned tail was written buffered).
  const uint64_t whole = kFileSize / kDirectIoAlignment * kDirectIoAlignment;
  EXPECT_EQ(ResidentPages(file->fd(), 0, whole), 0u);
  auto info = file->Stat();
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->size, kFileSize);
  ExpectChunksReadBack(*file);

  // Reported durable (written and fdatasync'ed): a fresh open, buffered and
  // direct, reads the same bytes.
  file.reset();
  auto reopened = PosixFileSystem().OpenFile(**dir, "staged", OpenMode::kReadWrite);
  ASSERT_TRUE(reopened.ok()) << reopened.status();
  EXPECT_EQ(Pread((*reopened)->fd(), 0, kFileSize + 1), data_);
  auto direct2 = (*reopened)->EnableDirectIo();
  ASSERT_TRUE(direct2.ok() && *direct2);
  ExpectChunksReadBack(**reopened);
}

TEST_P(DirectIoTest, BufferedWhereTheFileSystemRefusesODirect) {
  ShmDir shm;
  if (shm.path().empty()) GTEST_SKIP() << "no tmpfs /dev/shm here";
  const std::string& path = shm.path();
  auto dir = PosixFileSystem().OpenRoot(path);
  ASSERT_TRUE(dir.ok()) << dir.status();
  std::unique_ptr<File> file = Create(**dir, "staged");
  ASSERT_NE(file, nullptr);
  auto direct = file->EnableDirectIo();
  ASSERT_TRUE(direct.ok()) << direct.status();
  EXPECT_FALSE(*direct);
  EXPECT_EQ(file->direct_fd(), -1);

  WriteAllChunks(*file);
  ExpectChunksReadBack(*file);
  file.reset();
  auto reopened = PosixFileSystem().OpenFile(**dir, "staged", OpenMode::kRead);
  ASSERT_TRUE(reopened.ok()) << reopened.status();
  EXPECT_EQ(Pread((*reopened)->fd(), 0, kFileSize + 1), data_);
}

TEST_P(DirectIoTest, ReadOfAShortStagedFileIsAborted) {
  TempDir tmp;
  auto dir = PosixFileSystem().OpenRoot(tmp.path());
  ASSERT_TRUE(dir.ok()) << dir.status();
  std::unique_ptr<File> file = Create(**dir, "staged");
  ASSERT_NE(file, nullptr);
  ASSERT_TRUE(file->EnableDirectIo().ok());
  WriteAllChunks(*file);
  ASSERT_TRUE(file->Resize(2 * kChunk + 100).ok());
  AlignedBuffer buf(kChunk);
  auto h = ReadChunkHashed(*io_, *file, 2 * kChunk, buf.span(kChunk));
  EXPECT_TRUE(absl::IsAborted(h.status())) << h.status();
}

TEST(StagingDirectIoTest, StagedFilesGetADirectDescriptorOnlyWhereTheFileSystemTakesIt) {
  TempDir disk;
  std::vector<std::string> roots = {disk.path() + "/export"};
  ShmDir shm;
  if (!shm.path().empty()) roots.push_back(shm.path() + "/export");
  for (const std::string& root : roots) {
    MakeDirs(root);
    std::vector<Export> exports = {{"data", root}};
    auto dest = ResolveDestination(exports, "data", "ckpt");
    ASSERT_TRUE(dest.ok()) << dest.status();
    auto staging = Staging::Open(PosixFileSystem(), *dest, "t1");
    ASSERT_TRUE(staging.ok()) << staging.status();
    v1::ManifestFile mf;
    mf.set_path("shard");
    mf.set_size(kFileSize);
    auto file = staging->OpenFile(0, mf);
    ASSERT_TRUE(file.ok()) << file.status();
    if (IsTmpfs(root)) {
      EXPECT_EQ((*file)->direct_fd(), -1) << root;
    } else {
      EXPECT_GE((*file)->direct_fd(), 0) << root;
    }
    ASSERT_TRUE(staging->Remove().ok());
  }
}

INSTANTIATE_TEST_SUITE_P(Io, DirectIoTest, ::testing::Values(true, false),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "IoUring" : "Pread";
                         });

}  // namespace
}  // namespace longhaul::storage
