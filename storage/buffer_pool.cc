#include "storage/buffer_pool.h"

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/check.h"
#include "common/chunk_memory.h"
#include "storage/chunk_io.h"
#include "storage/file_system.h"

namespace longhaul::storage {
BufferPool::Lease::Lease(Lease&& other) noexcept
    : pool_(std::exchange(other.pool_, nullptr)), index_(other.index_) {}

BufferPool::Lease& BufferPool::Lease::operator=(Lease&& other) noexcept {
  if (this != &other) {
    Reset();
    pool_ = std::exchange(other.pool_, nullptr);
    index_ = other.index_;
  }
  return *this;
}

BufferPool::Lease::~Lease() { Reset(); }

uint8_t* BufferPool::Lease::data() const {
  LONGHAUL_CHECK(pool_ != nullptr) << "data() of an invalid buffer lease";
  return pool_->base_ + index_ * pool_->buffer_size_;
}

size_t BufferPool::Lease::size() const {
  LONGHAUL_CHECK(pool_ != nullptr) << "size() of an invalid buffer lease";
  return pool_->buffer_size_;
}

void BufferPool::Lease::Reset() {
  if (pool_ == nullptr) return;
  std::exchange(pool_, nullptr)->Return(index_);
}

absl::StatusOr<std::unique_ptr<BufferPool>> BufferPool::Create(size_t count, size_t buffer_size) {
  if (count == 0 || buffer_size == 0 || buffer_size % kDirectIoAlignment != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("buffer pool of ", count, " buffers of ", buffer_size,
                     " bytes: need at least one buffer and a size that is a positive multiple of ",
                     kDirectIoAlignment));
  }
  if (buffer_size > SIZE_MAX / count) {
    return absl::InvalidArgumentError(
        absl::StrCat("buffer pool of ", count, " buffers of ", buffer_size, " bytes overflows"));
  }
  const size_t bytes = count * buffer_size;
  uint8_t* p = MapChunkMemory(bytes);
  if (p == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat("mapping a buffer pool of ", bytes, " bytes: ", std::strerror(errno)));
  }
  return std::unique_ptr<BufferPool>(new BufferPool(p, count, buffer_size));
}

BufferPool::BufferPool(uint8_t* base, size_t count, size_t buffer_size)
    : base_(base), count_(count), buffer_size_(buffer_size) {
  free_.reserve(count);
  for (size_t i = count; i > 0; --i) free_.push_back(i - 1);
}

BufferPool::~BufferPool() {
  {
    absl::MutexLock lock(&mu_);
    LONGHAUL_CHECK(free_.size() == count_) << "buffer pool destroyed with leases outstanding";
  }
  LONGHAUL_CHECK(registrations_.load() == 0)
      << "buffer pool destroyed while registered with an io_uring ring";
  UnmapChunkMemory(base_, region_size());
}

absl::StatusOr<BufferPool::Lease> BufferPool::Acquire(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return shut_down_ || !free_.empty(); };
  if (!ready()) {
    ++waiting_;
    mu_.AwaitWithTimeout(absl::Condition(&ready), timeout);
    --waiting_;
  }
  if (shut_down_) return absl::CancelledError("buffer pool is shut down");
  if (free_.empty()) {
    return absl::DeadlineExceededError(
        absl::StrCat("no free buffer among ", count_, " within the timeout"));
  }
  const size_t index = free_.back();
  free_.pop_back();
  return Lease(this, index);
}

std::optional<BufferPool::Lease> BufferPool::TryAcquire() {
  absl::MutexLock lock(&mu_);
  if (shut_down_ || free_.empty()) return std::nullopt;
  const size_t index = free_.back();
  free_.pop_back();
  return Lease(this, index);
}

size_t BufferPool::waiting() const {
  absl::MutexLock lock(&mu_);
  return waiting_;
}

void BufferPool::Shutdown() {
  absl::MutexLock lock(&mu_);
  shut_down_ = true;
}

size_t BufferPool::free_count() const {
  absl::MutexLock lock(&mu_);
  return free_.size();
}

int BufferPool::BufferIndexOf(const uint8_t* p, size_t len) const {
  const auto addr = reinterpret_cast<uintptr_t>(p);
  const auto base = reinterpret_cast<uintptr_t>(base_);
  if (len == 0 || addr < base || addr - base >= region_size()) return -1;
  const size_t index = (addr - base) / buffer_size_;
  const size_t end_in_buffer = (addr - base) % buffer_size_ + len;
  if (end_in_buffer > buffer_size_) return -1;
  return static_cast<int>(index);
}

void BufferPool::Return(size_t index) {
  absl::MutexLock lock(&mu_);
  free_.push_back(index);
}

}  // namespace longhaul::storage
