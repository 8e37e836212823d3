// Chunk I/O from BufferPool buffers registered with io_uring rings
// (READ_FIXED / WRITE_FIXED): direct on a disk (ext4 under TEST_TMPDIR or
// /tmp), buffered on tmpfs /dev/shm, and the fallbacks when a span is not in
// the pool or the kernel refuses the registration.
#include <fcntl.h>
#include <linux/capability.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"
#include "storage/buffer_pool.h"
#include "storage/chunk_io.h"
#include "storage/file_io.h"
#include "storage/file_system.h"
#include "tests/storage/test_util.h"

namespace longhaul::storage {
namespace {

using testing::Bytes;
using testing::IsTmpfs;
using testing::ShmDir;
using testing::TempDir;

constexpr size_t kSub = FileIo::kSubBlockSize;
constexpr size_t kBuffer = 4 * kSub;
constexpr size_t kBuffers = 4;

std::vector<uint8_t> Pread(int fd, uint64_t offset, size_t len) {
  std::vector<uint8_t> out(len);
  ssize_t n = pread(fd, out.data(), len, static_cast<off_t>(offset));
  out.resize(n < 0 ? 0 : static_cast<size_t>(n));
  return out;
}

std::vector<uint8_t> Copy(absl::Span<const uint8_t> s) { return {s.begin(), s.end()}; }

// While it lives, memory io_uring rings set up by this thread pin is charged
// to RLIMIT_MEMLOCK: CAP_IPC_LOCK (which io_uring checks at ring setup) is
// out of the thread's effective set.
class NoIpcLock {
 public:
  NoIpcLock() {
    header_.version = _LINUX_CAPABILITY_VERSION_3;
    header_.pid = 0;
    if (syscall(SYS_capget, &header_, caps_) != 0) return;
    const uint32_t bit = 1u << CAP_IPC_LOCK;
    if ((caps_[0].effective & bit) == 0) {
      ok_ = true;
      return;
    }
    __user_cap_data_struct dropped[2] = {caps_[0], caps_[1]};
    dropped[0].effective &= ~bit;
    if (syscall(SYS_capset, &header_, dropped) == 0) ok_ = dropped_ = true;
  }
  ~NoIpcLock() {
    if (dropped_) syscall(SYS_capset, &header_, caps_);
  }
  NoIpcLock(const NoIpcLock&) = delete;
  NoIpcLock& operator=(const NoIpcLock&) = delete;
  bool ok() const { return ok_; }

 private:
  __user_cap_header_struct header_{};
  __user_cap_data_struct caps_[2]{};
  bool ok_ = false;
  bool dropped_ = false;
};

// RLIMIT_MEMLOCK lowered to 0 while it lives, so nothing more can be pinned.
class NoMemlock {
 public:
  NoMemlock() {
    if (getrlimit(RLIMIT_MEMLOCK, &saved_) != 0) return;
    rlimit zero = {0, saved_.rlim_max};
    ok_ = setrlimit(RLIMIT_MEMLOCK, &zero) == 0;
  }
  ~NoMemlock() {
    if (ok_) setrlimit(RLIMIT_MEMLOCK, &saved_);
  }
  NoMemlock(const NoMemlock&) = delete;
  NoMemlock& operator=(const NoMemlock&) = delete;
  bool ok() const { return ok_; }

 private:
  rlimit saved_{};
  bool ok_ = false;
};

// Param: true = direct on a disk, false = buffered on /dev/shm.
class RegisteredBuffersTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    auto io = IoUringFileIo::Create();
    if (!io.ok()) GTEST_SKIP() << "io_uring unavailable here: " << io.status();
    io_ = *std::move(io);
    auto pool = BufferPool::Create(kBuffers, kBuffer);
    ASSERT_TRUE(pool.ok()) << pool.status();
    pool_ = *std::move(pool);
    const absl::Status registered = io_->RegisterBuffers(*pool_);
    if (!registered.ok())
      GTEST_SKIP() << "this kernel or limit refuses registration: " << registered;
    EXPECT_EQ(io_->registered_pool(), pool_.get());

    std::string root;
    if (direct()) {
      if (IsTmpfs(disk_.path()))
        GTEST_SKIP() << disk_.path() << " is tmpfs; set TEST_TMPDIR to a disk";
      root = disk_.path();
    } else {
      if (shm_.path().empty()) GTEST_SKIP() << "no tmpfs /dev/shm here";
      root = shm_.path();
    }
    auto dir = PosixFileSystem().OpenRoot(root);
    ASSERT_TRUE(dir.ok()) << dir.status();
    auto file = PosixFileSystem().OpenFile(**dir, "staged", OpenMode::kCreateExclusive);
    ASSERT_TRUE(file.ok()) << file.status();
    file_ = *std::move(file);
    ASSERT_TRUE(file_->Resize(2 * kBuffer).ok());
    auto enabled = file_->EnableDirectIo();
    ASSERT_TRUE(enabled.ok()) << enabled.status();
    if (direct() && !*enabled) GTEST_SKIP() << root << " refuses O_DIRECT";
    ASSERT_EQ(*enabled, direct());
  }

  bool direct() const { return GetParam(); }
  // The descriptor whole aligned blocks go to.
  int data_fd() const { return direct() ? file_->direct_fd() : file_->fd(); }

  BufferPool::Lease TakeLease() {
    auto lease = pool_->TryAcquire();
    EXPECT_TRUE(lease.has_value());
    return lease.has_value() ? std::move(*lease) : BufferPool::Lease();
  }

  TempDir disk_;
  ShmDir shm_;
  std::unique_ptr<BufferPool> pool_;
  std::unique_ptr<IoUringFileIo> io_;  // destroyed before the pool registered with it
  std::unique_ptr<File> file_;
};

INSTANTIATE_TEST_SUITE_P(Modes, RegisteredBuffersTest, ::testing::Values(true, false),
                         [](const auto& info) {
                           return info.param ? "DirectOnDisk" : "BufferedOnShm";
                         });

TEST_P(RegisteredBuffersTest, WholeBufferRoundTripsThroughFixedOps) {
  BufferPool::Lease out = TakeLease();
  const auto data = Bytes(kBuffer, 11);
  std::memcpy(out.data(), data.data(), data.size());
  ASSERT_TRUE(io_->WriteAt(data_fd(), kBuffer, out.span()).ok());
  EXPECT_EQ(io_->fixed_requests(), kBuffer / kSub);
  ASSERT_TRUE(io_->SyncData(file_->fd()).ok());
  EXPECT_EQ(Pread(file_->fd(), kBuffer, kBuffer), data);

  BufferPool::Lease in = TakeLease();
  std::memset(in.data(), 0xee, in.size());
  auto n = io_->ReadAt(data_fd(), kBuffer, in.span());
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(*n, kBuffer);
  EXPECT_EQ(Copy(in.span()), data);
  EXPECT_EQ(io_->fixed_requests(), 2 * kBuffer / kSub);
}

TEST_P(RegisteredBuffersTest, ChunkWithUnalignedTailRoundTripsThroughWriteChunk) {
  const size_t size = 3 * kSub + 5000;  // whole blocks, then a 904-byte tail
  const auto data = Bytes(size, 12);
  BufferPool::Lease out = TakeLease();
  std::memcpy(out.data(), data.data(), size);
  ASSERT_TRUE(WriteChunk(*io_, *file_, 0, out.span().first(size)).ok());
  ASSERT_TRUE(io_->SyncData(file_->fd()).ok());
  // Direct: four sub-requests for the whole blocks, one for the tail through
  // fd(). Buffered: the four sub-requests of one write.
  const uint64_t requests = direct() ? 5 : 4;
  EXPECT_EQ(io_->fixed_requests(), requests);
  EXPECT_EQ(Pread(file_->fd(), 0, size), data);

  BufferPool::Lease in = TakeLease();
  std::memset(in.data(), 0, in.size());
  auto digest = ReadChunkHashed(*io_, *file_, 0, in.span().first(size));
  ASSERT_TRUE(digest.ok()) << digest.status();
  EXPECT_EQ(*digest, HashBytes(data));
  EXPECT_EQ(Copy(in.span().first(size)), data);
  EXPECT_EQ(io_->fixed_requests(), 2 * requests);
}

TEST_P(RegisteredBuffersTest, SpanOutsideThePoolUsesTheNormalOps) {
  const auto data = Bytes(2 * kSub, 13);
  AlignedBuffer heap(data.size());
  std::memcpy(heap.data(), data.data(), data.size());
  ASSERT_TRUE(io_->WriteAt(data_fd(), 0, heap.span(data.size())).ok());
  ASSERT_TRUE(io_->SyncData(file_->fd()).ok());
  std::memset(heap.data(), 0, data.size());
  auto n = io_->ReadAt(data_fd(), 0, heap.span(data.size()));
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(Copy(heap.span(data.size())), data);
  EXPECT_EQ(io_->fixed_requests(), 0u);
}

TEST_P(RegisteredBuffersTest, SpanAcrossTwoBuffersUsesFixedOpsWhereASubRequestFitsInOne) {
  // Buffers 0 and 1 are adjacent; a span from the middle of one into the
  // next is split into sub-requests, and only the one that straddles the
  // boundary is done with the normal op.
  std::vector<BufferPool::Lease> leases;
  for (size_t i = 0; i < kBuffers; ++i) leases.push_back(TakeLease());
  const size_t start = kBuffer - kSub / 2;  // in buffer 0, half a sub-block before its end
  const size_t size = 3 * kSub;
  const auto data = Bytes(size, 14);
  uint8_t* p = pool_->base() + start;
  std::memcpy(p, data.data(), size);
  ASSERT_TRUE(io_->WriteAt(data_fd(), 0, absl::MakeConstSpan(p, size)).ok());
  ASSERT_TRUE(io_->SyncData(file_->fd()).ok());
  EXPECT_EQ(Pread(file_->fd(), 0, size), data);
  EXPECT_EQ(io_->fixed_requests(), 2u);
}

TEST_P(RegisteredBuffersTest, AfterUnregisterThePoolIsDoneWithNormalOps) {
  io_->UnregisterBuffers();
  EXPECT_EQ(io_->registered_pool(), nullptr);
  BufferPool::Lease out = TakeLease();
  const auto data = Bytes(kSub, 15);
  std::memcpy(out.data(), data.data(), data.size());
  ASSERT_TRUE(io_->WriteAt(data_fd(), 0, out.span().first(kSub)).ok());
  ASSERT_TRUE(io_->SyncData(file_->fd()).ok());
  EXPECT_EQ(Pread(file_->fd(), 0, kSub), data);
  EXPECT_EQ(io_->fixed_requests(), 0u);
  // Registering again works.
  EXPECT_TRUE(io_->RegisterBuffers(*pool_).ok());
}

TEST_P(RegisteredBuffersTest, ASecondPoolIsRefusedAndStillWorks) {
  auto other = BufferPool::Create(1, kSub);
  ASSERT_TRUE(other.ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(io_->RegisterBuffers(**other)));
  EXPECT_EQ(io_->registered_pool(), pool_.get());
  auto lease = (*other)->TryAcquire();
  ASSERT_TRUE(lease.has_value());
  const auto data = Bytes(kSub, 16);
  std::memcpy(lease->data(), data.data(), data.size());
  ASSERT_TRUE(io_->WriteAt(data_fd(), 0, lease->span()).ok());
  ASSERT_TRUE(io_->SyncData(file_->fd()).ok());
  EXPECT_EQ(Pread(file_->fd(), 0, kSub), data);
  EXPECT_EQ(io_->fixed_requests(), 0u);
}

TEST_P(RegisteredBuffersTest, OnePoolRegisteredWithARingPerThread) {
  // Each thread has its own ring and its own region of the file.
  constexpr int kThreads = 3;
  auto pool = BufferPool::Create(2 * kThreads, kSub);
  ASSERT_TRUE(pool.ok());
  ASSERT_TRUE(file_->Resize(kThreads * kSub).ok());
  std::vector<std::string> failures(kThreads);
  std::vector<uint64_t> fixed(kThreads, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      auto io = IoUringFileIo::Create();
      if (!io.ok()) {
        failures[t] = io.status().ToString();
        return;
      }
      absl::Status registered = (*io)->RegisterBuffers(**pool);
      if (!registered.ok()) {
        failures[t] = registered.ToString();
        return;
      }
      auto out = (*pool)->Acquire(absl::InfiniteDuration());
      auto in = (*pool)->Acquire(absl::InfiniteDuration());
      if (!out.ok() || !in.ok()) {
        failures[t] = "no lease";
        return;
      }
      const auto data = Bytes(kSub, 100 + t);
      std::memcpy(out->data(), data.data(), kSub);
      absl::Status s = (*io)->WriteAt(data_fd(), t * kSub, out->span());
      if (s.ok()) s = (*io)->SyncData(file_->fd());
      if (s.ok()) s = (*io)->ReadAt(data_fd(), t * kSub, in->span()).status();
      if (!s.ok()) {
        failures[t] = s.ToString();
      } else if (Copy(in->span()) != data) {
        failures[t] = "read back other bytes";
      }
      fixed[t] = (*io)->fixed_requests();
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) {
    EXPECT_EQ(failures[t], "") << "thread " << t;
    EXPECT_EQ(fixed[t], 2u) << "thread " << t;
  }
}

TEST_P(RegisteredBuffersTest, RefusedRegistrationFallsBackToNormalOps) {
  std::unique_ptr<IoUringFileIo> io;
  absl::Status refused;
  {
    // The ring itself fits in the limit this process has; the pool does not
    // fit in a limit of 0.
    NoIpcLock no_ipc_lock;
    if (!no_ipc_lock.ok()) GTEST_SKIP() << "cannot drop CAP_IPC_LOCK here";
    auto created = IoUringFileIo::Create();
    ASSERT_TRUE(created.ok()) << created.status();
    io = *std::move(created);
    NoMemlock no_memlock;
    if (!no_memlock.ok()) GTEST_SKIP() << "cannot lower RLIMIT_MEMLOCK here";
    refused = io->RegisterBuffers(*pool_);
  }
  EXPECT_TRUE(absl::IsResourceExhausted(refused)) << refused;
  EXPECT_NE(refused.message().find("RLIMIT_MEMLOCK"), std::string::npos) << refused;
  EXPECT_EQ(io->registered_pool(), nullptr);

  const size_t size = 2 * kSub + 5000;
  const auto data = Bytes(size, 17);
  BufferPool::Lease out = TakeLease();
  std::memcpy(out.data(), data.data(), size);
  ASSERT_TRUE(WriteChunk(*io, *file_, 0, out.span().first(size)).ok());
  ASSERT_TRUE(io->SyncData(file_->fd()).ok());
  EXPECT_EQ(Pread(file_->fd(), 0, size), data);
  BufferPool::Lease in = TakeLease();
  auto digest = ReadChunkHashed(*io, *file_, 0, in.span().first(size));
  ASSERT_TRUE(digest.ok()) << digest.status();
  EXPECT_EQ(*digest, HashBytes(data));
  EXPECT_EQ(io->fixed_requests(), 0u);
}

TEST(PosixRegisteredBuffersTest, PosixFileIoHasNoRegistrationAndStillDoesTheIo) {
  auto pool = BufferPool::Create(1, kSub);
  ASSERT_TRUE(pool.ok());
  PosixFileIo io;
  EXPECT_TRUE(absl::IsUnimplemented(io.RegisterBuffers(**pool)));
  TempDir dir;
  const std::string path = dir.Sub("f");
  int fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  ASSERT_GE(fd, 0);
  auto lease = (*pool)->TryAcquire();
  ASSERT_TRUE(lease.has_value());
  const auto data = Bytes(kSub, 18);
  std::memcpy(lease->data(), data.data(), kSub);
  EXPECT_TRUE(io.WriteAt(fd, 0, lease->span()).ok());
  EXPECT_EQ(Pread(fd, 0, kSub), data);
  close(fd);
}

}  // namespace
}  // namespace longhaul::storage
