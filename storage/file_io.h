// FileIo: the seam through which chunk data is read from and written to
// files. Two implementations: IoUringFileIo (liburing) and PosixFileIo
// (pread/pwrite/fdatasync). Pick one with MakeFileIo().
#ifndef LONGHAUL_STORAGE_FILE_IO_H_
#define LONGHAUL_STORAGE_FILE_IO_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "storage/buffer_pool.h"

namespace longhaul::storage {

// Positional I/O on file descriptors that the caller owns (FileIo never
// closes them). Buffers stay owned by the caller and must outlive the call;
// no call keeps a reference after it returns.
//
// Threading: an instance is used by one thread at a time. IoUringFileIo owns
// one ring, so make one FileIo per I/O thread. Different instances may work
// on the same fd concurrently (positional I/O has no shared file offset).
//
// Errors carry the file's path (from /proc/self/fd) and strerror.
class FileIo {
 public:
  virtual ~FileIo() = default;

  // Reads up to buf.size() bytes at `offset`. Returns the number read; it is
  // short only when the file ends before offset + buf.size().
  virtual absl::StatusOr<size_t> ReadAt(int fd, uint64_t offset, absl::Span<uint8_t> buf);

  // Like ReadAt, and hands each completed sub-block of `buf` to `on_block` in
  // file order, each byte exactly once, so the caller can consume (hash)
  // sub-block k while later ones are still being read. Sub-blocks are
  // kSubBlockSize bytes except the last one (or the one at EOF). `on_block`
  // is called on the calling thread; the span points into `buf`.
  virtual absl::StatusOr<size_t> ReadAtStreaming(
      int fd, uint64_t offset, absl::Span<uint8_t> buf,
      absl::FunctionRef<void(absl::Span<const uint8_t>)> on_block) = 0;

  // Writes all of `data` at `offset`, or fails.
  virtual absl::Status WriteAt(int fd, uint64_t offset, absl::Span<const uint8_t> data) = 0;

  // fdatasync(2): the data written so far (and the size) is durable on return.
  virtual absl::Status SyncData(int fd) = 0;

  // Lets this FileIo do the I/O of every (sub-)request whose bytes lie inside
  // one buffer of `pool` with the kernel's standing pin of that buffer
  // (io_uring registered buffers, IORING_OP_READ_FIXED / WRITE_FIXED) rather
  // than pinning the caller's pages per request. The caller needs to do
  // nothing else: ReadAt*/WriteAt find the buffer from the span's address,
  // and every other span is done as before. Buffered and O_DIRECT
  // descriptors both work.
  //
  // At most one pool per FileIo, and any number of FileIos may register the
  // same pool (each ring pins it once). `pool` must outlive this FileIo or
  // its UnregisterBuffers() (BufferPool's destructor aborts otherwise).
  //
  // An error means nothing was registered and the FileIo goes on with the
  // normal operations: Unimplemented for PosixFileIo; for IoUringFileIo the
  // kernel's refusal (ResourceExhausted for RLIMIT_MEMLOCK, InvalidArgument
  // on an old kernel), logged at warning level the first
  // time in the process; FailedPrecondition when a pool is already registered.
  virtual absl::Status RegisterBuffers(const BufferPool& pool);
  // Drops the registration, if any; later requests use the normal operations.
  virtual void UnregisterBuffers() {}

  // "io_uring" or "pread", for logs and metrics.
  virtual std::string_view name() const = 0;

  // Large requests are split into sub-requests of this size.
  static constexpr size_t kSubBlockSize = size_t{1} << 20;
};

// pread/pwrite/fdatasync. Stateless; any number of threads may share one.
class PosixFileIo final : public FileIo {
 public:
  absl::StatusOr<size_t> ReadAtStreaming(
      int fd, uint64_t offset, absl::Span<uint8_t> buf,
      absl::FunctionRef<void(absl::Span<const uint8_t>)> on_block) override;
  absl::Status WriteAt(int fd, uint64_t offset, absl::Span<const uint8_t> data) override;
  absl::Status SyncData(int fd) override;
  std::string_view name() const override { return "pread"; }
};

// io_uring through liburing. A request larger than kSubBlockSize is split
// into sub-requests kept `queue_depth` deep in flight.
// Not thread-safe: one per I/O thread (it owns one ring).
class IoUringFileIo final : public FileIo {
 public:
  // Sets up a ring; fails (with the errno of io_uring_queue_init) where
  // io_uring is unavailable, e.g. blocked by seccomp or an old kernel.
  static absl::StatusOr<std::unique_ptr<IoUringFileIo>> Create(unsigned queue_depth = 8);
  ~IoUringFileIo() override;
  IoUringFileIo(const IoUringFileIo&) = delete;
  IoUringFileIo& operator=(const IoUringFileIo&) = delete;

  absl::StatusOr<size_t> ReadAtStreaming(
      int fd, uint64_t offset, absl::Span<uint8_t> buf,
      absl::FunctionRef<void(absl::Span<const uint8_t>)> on_block) override;
  absl::Status WriteAt(int fd, uint64_t offset, absl::Span<const uint8_t> data) override;
  absl::Status SyncData(int fd) override;
  absl::Status RegisterBuffers(const BufferPool& pool) override;
  void UnregisterBuffers() override;
  std::string_view name() const override { return "io_uring"; }

  // The pool registered with this ring, or nullptr.
  const BufferPool* registered_pool() const { return pool_; }
  // Sub-requests submitted as READ_FIXED / WRITE_FIXED so far (for tests and
  // metrics): each is one that did not pin pages itself.
  uint64_t fixed_requests() const { return fixed_requests_; }

 private:
  struct Ring;  // liburing's io_uring, kept out of this header
  IoUringFileIo(std::unique_ptr<Ring> ring, unsigned queue_depth);
  std::unique_ptr<Ring> ring_;
  const unsigned queue_depth_;
  const BufferPool* pool_ = nullptr;
  uint64_t fixed_requests_ = 0;
};

// Returns an IoUringFileIo when `prefer_io_uring` and io_uring works here,
// else a PosixFileIo (logging why at warning level). The environment
// variable LONGHAUL_NO_IO_URING=1 forces the fallback.
std::unique_ptr<FileIo> MakeFileIo(bool prefer_io_uring = true);

}  // namespace longhaul::storage

#endif  // LONGHAUL_STORAGE_FILE_IO_H_
