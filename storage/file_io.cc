#include "storage/file_io.h"

#include <liburing.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "common/check.h"
#include "common/errno_status.h"
#include "spdlog/spdlog.h"
#include "storage/posix_util.h"

namespace longhaul::storage {

using internal::FdPath;

absl::Status FileIo::RegisterBuffers(const BufferPool& /*pool*/) {
  return absl::UnimplementedError(absl::StrCat(std::string(name()), " has no registered buffers"));
}

absl::StatusOr<size_t> FileIo::ReadAt(int fd, uint64_t offset, absl::Span<uint8_t> buf) {
  return ReadAtStreaming(fd, offset, buf, [](absl::Span<const uint8_t>) {});
}

// ---------------------------------------------------------------- Posix ----

absl::StatusOr<size_t> PosixFileIo::ReadAtStreaming(
    int fd, uint64_t offset, absl::Span<uint8_t> buf,
    absl::FunctionRef<void(absl::Span<const uint8_t>)> on_block) {
  size_t done = 0;
  while (done < buf.size()) {
    const size_t block = std::min(kSubBlockSize, buf.size() - done);
    size_t got = 0;
    while (got < block) {
      ssize_t n = pread(fd, buf.data() + done + got, block - got,
                        static_cast<off_t>(offset + done + got));
      if (n < 0) {
        if (errno == EINTR) continue;
        return ErrnoError(errno, absl::StrCat("read at offset ", offset + done + got, " of"),
                          FdPath(fd));
      }
      if (n == 0) break;  // EOF
      got += static_cast<size_t>(n);
    }
    if (got > 0) on_block(absl::Span<const uint8_t>(buf.data() + done, got));
    done += got;
    if (got < block) break;
  }
  return done;
}

absl::Status PosixFileIo::WriteAt(int fd, uint64_t offset, absl::Span<const uint8_t> data) {
  size_t done = 0;
  while (done < data.size()) {
    ssize_t n = pwrite(fd, data.data() + done, data.size() - done,
                       static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoError(errno, absl::StrCat("write at offset ", offset + done, " of"),
                        FdPath(fd));
    }
    if (n == 0) {
      return ErrnoError(EIO, absl::StrCat("write at offset ", offset + done, " of"), FdPath(fd));
    }
    done += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

absl::Status PosixFileIo::SyncData(int fd) {
  while (fdatasync(fd) != 0) {
    if (errno == EINTR) continue;
    return ErrnoError(errno, "fdatasync", FdPath(fd));
  }
  return absl::OkStatus();
}

// ------------------------------------------------------------- io_uring ----

struct IoUringFileIo::Ring {
  io_uring ring;
};

absl::StatusOr<std::unique_ptr<IoUringFileIo>> IoUringFileIo::Create(unsigned queue_depth) {
  queue_depth = std::max(1u, queue_depth);
  auto ring = std::make_unique<Ring>();
  int ret = io_uring_queue_init(queue_depth, &ring->ring, 0);
  if (ret < 0) return ErrnoError(-ret, "io_uring_queue_init", "(ring setup)");
  return std::unique_ptr<IoUringFileIo>(new IoUringFileIo(std::move(ring), queue_depth));
}

IoUringFileIo::IoUringFileIo(std::unique_ptr<Ring> ring, unsigned queue_depth)
    : ring_(std::move(ring)), queue_depth_(queue_depth) {}

IoUringFileIo::~IoUringFileIo() {
  io_uring_queue_exit(&ring_->ring);  // drops the registered buffers with the ring
  if (pool_ != nullptr) pool_->registrations_.fetch_sub(1);
}

absl::Status IoUringFileIo::RegisterBuffers(const BufferPool& pool) {
  if (pool_ != nullptr) {
    return absl::FailedPreconditionError("this io_uring ring already has a buffer pool registered");
  }
  std::vector<iovec> iovecs(pool.count());
  for (size_t i = 0; i < pool.count(); ++i) {
    iovecs[i].iov_base = pool.base() + i * pool.buffer_size();
    iovecs[i].iov_len = pool.buffer_size();
  }
  const int ret =
      io_uring_register_buffers(&ring_->ring, iovecs.data(), static_cast<unsigned>(iovecs.size()));
  if (ret < 0) {
    absl::Status refused = ErrnoError(-ret,
                                      absl::StrCat("io_uring_register_buffers (", pool.count(),
                                                   " x ", pool.buffer_size(), " bytes)"),
                                      "of the chunk buffer pool");
    if (ret == -ENOMEM) {
      refused = absl::ResourceExhaustedError(
          absl::StrCat(refused.message(), "; RLIMIT_MEMLOCK (ulimit -l) is too low to pin it"));
    }
    static std::atomic<bool> logged{false};
    if (!logged.exchange(true)) {
      spdlog::warn(
          "storage: chunk buffers not registered with io_uring, using normal reads and "
          "writes: {}",
          std::string(refused.message()));
    }
    return refused;
  }
  pool_ = &pool;
  pool.registrations_.fetch_add(1);
  return absl::OkStatus();
}

void IoUringFileIo::UnregisterBuffers() {
  if (pool_ == nullptr) return;
  const int ret = io_uring_unregister_buffers(&ring_->ring);
  if (ret < 0) {
    // The kernel still pins the pool for this ring; keeping pool_ set keeps
    // the pool's destructor from unmapping it under the ring.
    spdlog::error("storage: io_uring_unregister_buffers: {}", std::strerror(-ret));
    return;
  }
  pool_->registrations_.fetch_sub(1);
  pool_ = nullptr;
}

namespace {

// One sub-request of a split read or write.
struct SubRequest {
  size_t start = 0;  // offset within the caller's buffer
  size_t len = 0;
  size_t done = 0;
  bool finished = false;  // complete, or ended early at EOF
};

// The ring and what it needs to prepare one request.
struct RingContext {
  io_uring* ring;
  const BufferPool* pool;    // registered with `ring`, or nullptr
  uint64_t* fixed_requests;  // counts READ_FIXED / WRITE_FIXED submissions
};

void PrepSub(const RingContext& ctx, bool write, int fd, uint64_t offset, uint8_t* base,
             const SubRequest& sub, uint64_t user_data) {
  io_uring_sqe* sqe = io_uring_get_sqe(ctx.ring);
  // Never null: at most queue_depth requests are in flight and every prepared
  // SQE is submitted before the next wait.
  const size_t pos = sub.start + sub.done;
  const auto len = static_cast<unsigned>(sub.len - sub.done);
  const int fixed = ctx.pool == nullptr ? -1 : ctx.pool->BufferIndexOf(base + pos, len);
  if (fixed >= 0) {
    ++*ctx.fixed_requests;
    if (write) {
      io_uring_prep_write_fixed(sqe, fd, base + pos, len, offset + pos, fixed);
    } else {
      io_uring_prep_read_fixed(sqe, fd, base + pos, len, offset + pos, fixed);
    }
  } else if (write) {
    io_uring_prep_write(sqe, fd, base + pos, len, offset + pos);
  } else {
    io_uring_prep_read(sqe, fd, base + pos, len, offset + pos);
  }
  io_uring_sqe_set_data64(sqe, user_data);
}

// Runs a split read or write with up to `depth` sub-requests in flight.
// Reads deliver completed sub-blocks to `on_block` in order and stop at EOF.
// Always drains every request in flight before returning, since they point
// into the caller's buffer.
absl::StatusOr<size_t> RunSplit(const RingContext& ctx, unsigned depth, bool write, int fd,
                                uint64_t offset, uint8_t* base, size_t size,
                                absl::FunctionRef<void(absl::Span<const uint8_t>)> on_block) {
  const size_t block = FileIo::kSubBlockSize;
  const size_t count = (size + block - 1) / block;
  absl::InlinedVector<SubRequest, 64> subs(count);
  for (size_t i = 0; i < count; ++i) {
    subs[i].start = i * block;
    subs[i].len = std::min(block, size - i * block);
  }
  size_t next_submit = 0;
  size_t next_deliver = 0;
  size_t delivered_bytes = 0;
  unsigned inflight = 0;
  bool stop = false;  // EOF reached or an error: submit no more
  absl::Status error;

  while (true) {
    while (!stop && inflight < depth && next_submit < count) {
      PrepSub(ctx, write, fd, offset, base, subs[next_submit], next_submit);
      ++next_submit;
      ++inflight;
    }
    if (inflight == 0) break;
    // Submits whatever is prepared (including after a transient failure)
    // and waits for one completion.
    int ret = io_uring_submit_and_wait(ctx.ring, 1);
    if (ret < 0 && ret != -EINTR && ret != -EAGAIN && ret != -EBUSY) {
      // The ring itself is unusable (EBADF, EFAULT, ...) while the kernel may
      // still hold pointers into the caller's buffer: an invariant is broken.
      LONGHAUL_CHECK(false) << "storage: io_uring_submit_and_wait failed: " << std::strerror(-ret);
    }
    io_uring_cqe* cqe = nullptr;
    if (io_uring_peek_cqe(ctx.ring, &cqe) != 0 || cqe == nullptr) continue;
    const size_t idx = static_cast<size_t>(io_uring_cqe_get_data64(cqe));
    const int res = cqe->res;
    io_uring_cqe_seen(ctx.ring, cqe);
    --inflight;
    SubRequest& sub = subs[idx];
    if (res == -EINTR || res == -EAGAIN) {
      PrepSub(ctx, write, fd, offset, base, sub, idx);
      ++inflight;
      continue;
    }
    if (res < 0) {
      if (error.ok()) {
        error = ErrnoError(-res,
                           absl::StrCat(write ? "write" : "read", " at offset ",
                                        offset + sub.start + sub.done, " of"),
                           FdPath(fd));
      }
      stop = true;
      sub.finished = true;
      continue;
    }
    if (res == 0) {
      if (write) {
        if (error.ok()) error = ErrnoError(EIO, "zero-length write to", FdPath(fd));
      }
      // EOF for reads: this sub-request ends early.
      sub.finished = true;
      stop = true;
    } else {
      sub.done += static_cast<size_t>(res);
      if (sub.done < sub.len) {
        PrepSub(ctx, write, fd, offset, base, sub, idx);  // short: continue
        ++inflight;
      } else {
        sub.finished = true;
      }
    }
    // Deliver the in-order prefix of finished sub-requests.
    while (!write && error.ok() && next_deliver < count && subs[next_deliver].finished) {
      const SubRequest& d = subs[next_deliver];
      if (d.done > 0) on_block(absl::Span<const uint8_t>(base + d.start, d.done));
      delivered_bytes += d.done;
      if (d.done < d.len) {
        next_deliver = count;  // EOF inside this block: nothing after it counts
        break;
      }
      ++next_deliver;
    }
  }
  if (!error.ok()) return error;
  if (write) return size;
  return delivered_bytes;
}

}  // namespace

absl::StatusOr<size_t> IoUringFileIo::ReadAtStreaming(
    int fd, uint64_t offset, absl::Span<uint8_t> buf,
    absl::FunctionRef<void(absl::Span<const uint8_t>)> on_block) {
  if (buf.empty()) return 0;
  return RunSplit({&ring_->ring, pool_, &fixed_requests_}, queue_depth_, /*write=*/false, fd,
                  offset, buf.data(), buf.size(), on_block);
}

absl::Status IoUringFileIo::WriteAt(int fd, uint64_t offset, absl::Span<const uint8_t> data) {
  if (data.empty()) return absl::OkStatus();
  // The kernel only reads from the buffer for a write.
  auto* base = const_cast<uint8_t*>(data.data());
  absl::StatusOr<size_t> n =
      RunSplit({&ring_->ring, pool_, &fixed_requests_}, queue_depth_, /*write=*/true, fd, offset,
               base, data.size(), [](absl::Span<const uint8_t>) {});
  return n.status();
}

absl::Status IoUringFileIo::SyncData(int fd) {
  while (true) {
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_->ring);
    io_uring_prep_fsync(sqe, fd, IORING_FSYNC_DATASYNC);
    io_uring_sqe_set_data64(sqe, 0);
    io_uring_cqe* cqe = nullptr;
    while (true) {
      int ret = io_uring_submit_and_wait(&ring_->ring, 1);
      if (ret < 0 && ret != -EINTR && ret != -EAGAIN && ret != -EBUSY) {
        return ErrnoError(-ret, "io_uring_submit_and_wait (fdatasync) for", FdPath(fd));
      }
      if (io_uring_peek_cqe(&ring_->ring, &cqe) == 0 && cqe != nullptr) break;
    }
    const int res = cqe->res;
    io_uring_cqe_seen(&ring_->ring, cqe);
    if (res == -EINTR || res == -EAGAIN) continue;
    if (res < 0) return ErrnoError(-res, "fdatasync", FdPath(fd));
    return absl::OkStatus();
  }
}

// -------------------------------------------------------------- factory ----

std::unique_ptr<FileIo> MakeFileIo(bool prefer_io_uring) {
  const char* env = std::getenv("LONGHAUL_NO_IO_URING");
  if (env != nullptr && std::strcmp(env, "") != 0 && std::strcmp(env, "0") != 0) {
    spdlog::info("storage: LONGHAUL_NO_IO_URING is set; using pread/pwrite");
    return std::make_unique<PosixFileIo>();
  }
  if (!prefer_io_uring) return std::make_unique<PosixFileIo>();
  absl::StatusOr<std::unique_ptr<IoUringFileIo>> ring = IoUringFileIo::Create();
  if (!ring.ok()) {
    spdlog::warn("storage: io_uring unavailable ({}); falling back to pread/pwrite",
                 std::string(ring.status().message()));
    return std::make_unique<PosixFileIo>();
  }
  return *std::move(ring);
}

}  // namespace longhaul::storage
