// BufferPool: a fixed set of page-aligned chunk buffers shared by the
// streams of a daemon, so that the chunk path never allocates or zero-fills.
#ifndef LONGHAUL_STORAGE_BUFFER_POOL_H_
#define LONGHAUL_STORAGE_BUFFER_POOL_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

namespace longhaul::storage {

class IoUringFileIo;

// `count` buffers of `buffer_size` bytes each, mapped once as one contiguous,
// page-aligned region (buffer i starts at base() + i * buffer_size) and never
// unmapped, re-zeroed or re-allocated while the pool lives. A buffer's pages
// are zero-filled by the kernel the first time they are touched, and never
// again: a lease hands out whatever the previous holder left there, so a
// caller must not rely on the contents (it writes before it reads).
//
// Pages are not mlock'ed by the pool: registering the pool with an io_uring
// ring (IoUringFileIo::RegisterBuffers) pins them for as long as the ring
// holds them, and without registration a pageable buffer costs only a fault
// on reuse after swap. The mapping asks for transparent huge pages
// (MADV_HUGEPAGE), which the kernel may ignore.
//
// Buffers are lent out as Leases. Acquire() waits for a free buffer; at most
// `count` leases exist at a time. A lease returns its buffer when destroyed.
// Shutdown() makes every waiting and later Acquire() fail; leases already out
// stay valid and are returned as usual.
//
// The pool must outlive its leases and every ring it is registered with
// (the destructor aborts otherwise: a buffer unmapped under a lease or a ring
// would be a use after free).
//
// Thread-safe.
class BufferPool {
 public:
  // A buffer on loan: exclusive use of `size()` bytes at `data()` until it is
  // destroyed or moved from. Movable, not copyable. Not thread-safe itself
  // (one holder at a time), but leases of one pool may be used and returned
  // on any threads.
  class Lease {
   public:
    Lease() = default;
    Lease(Lease&& other) noexcept;
    Lease& operator=(Lease&& other) noexcept;
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    ~Lease();

    // False for a default-constructed or moved-from lease.
    bool valid() const { return pool_ != nullptr; }
    uint8_t* data() const;
    size_t size() const;
    // The whole buffer (size() bytes).
    absl::Span<uint8_t> span() const { return absl::Span<uint8_t>(data(), size()); }
    // Which buffer of the pool this is, in [0, count()).
    size_t index() const { return index_; }

    // Returns the buffer to the pool now; the lease becomes invalid.
    void Reset();

   private:
    friend class BufferPool;
    Lease(BufferPool* pool, size_t index) : pool_(pool), index_(index) {}
    BufferPool* pool_ = nullptr;
    size_t index_ = 0;
  };

  // Maps `count` buffers of `buffer_size` bytes. InvalidArgument unless
  // count >= 1 and buffer_size is a positive multiple of
  // kDirectIoAlignment (4096); ResourceExhausted when the mapping fails.
  static absl::StatusOr<std::unique_ptr<BufferPool>> Create(size_t count, size_t buffer_size);

  ~BufferPool();
  BufferPool(const BufferPool&) = delete;
  BufferPool& operator=(const BufferPool&) = delete;

  // Lends a free buffer, waiting until one is returned if none is free.
  // DeadlineExceeded when `timeout` passes first (a real-time mutex wait);
  // Cancelled once Shutdown() was called (also for callers already waiting).
  // A zero timeout still takes a buffer that is free now.
  absl::StatusOr<Lease> Acquire(absl::Duration timeout);
  // Lends a free buffer if there is one now; std::nullopt otherwise or after
  // Shutdown().
  std::optional<Lease> TryAcquire();

  // Wakes every waiting Acquire() (they fail) and refuses new ones. Idempotent.
  void Shutdown();

  size_t count() const { return count_; }
  size_t buffer_size() const { return buffer_size_; }
  // Buffers not on loan now.
  size_t free_count() const;
  // Acquire() calls waiting for a buffer now.
  size_t waiting() const;

  // The region holding every buffer: count() * buffer_size() bytes.
  uint8_t* base() const { return base_; }
  size_t region_size() const { return count_ * buffer_size_; }
  // The buffer whose bytes include all of [p, p + len), or -1. A span that
  // crosses from one buffer into the next belongs to neither. len 0 is never
  // inside a buffer.
  int BufferIndexOf(const uint8_t* p, size_t len) const;

 private:
  friend class IoUringFileIo;  // counts the rings holding the pool
  BufferPool(uint8_t* base, size_t count, size_t buffer_size);
  void Return(size_t index);

  uint8_t* const base_;
  const size_t count_;
  const size_t buffer_size_;
  mutable std::atomic<int> registrations_{0};

  mutable absl::Mutex mu_;
  std::vector<size_t> free_ ABSL_GUARDED_BY(mu_);  // a stack: the last returned is reused first
  size_t waiting_ ABSL_GUARDED_BY(mu_) = 0;
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace longhaul::storage

#endif  // LONGHAUL_STORAGE_BUFFER_POOL_H_
