#include "daemon/peer/read_back_pool.h"

#include <utility>

namespace longhaul::peer {

absl::Span<uint8_t> ReadBackPool::Worker::Buffer(size_t size) {
  if (!buffer_ || buffer_->capacity() < size) {
    buffer_.reset();  // the old one goes first: only one per thread at a time
    buffer_ = std::make_unique<storage::AlignedBuffer>(size);
  }
  return buffer_->span(size);
}

ReadBackPool::ReadBackPool(size_t threads, size_t max_queued) : max_queued_(max_queued) {
  for (size_t i = 0; i < threads; ++i) threads_.emplace_back([this] { Run(); });
}

ReadBackPool::~ReadBackPool() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
    queue_.clear();
  }
  for (std::thread& t : threads_) t.join();
}

bool ReadBackPool::Submit(Task task) {
  absl::MutexLock lock(&mu_);
  if (stop_ || queue_.size() >= max_queued_) return false;
  queue_.push_back(std::move(task));
  return true;
}

void ReadBackPool::Run() {
  Worker worker;
  worker.io_ = storage::MakeFileIo();
  while (true) {
    Task task;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](ReadBackPool* p) ABSL_NO_THREAD_SAFETY_ANALYSIS { return p->stop_ || !p->queue_.empty(); },
          this));
      if (stop_) return;
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    task(worker);
  }
}

}  // namespace longhaul::peer
