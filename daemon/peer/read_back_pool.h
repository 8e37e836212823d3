#ifndef LONGHAUL_DAEMON_PEER_READ_BACK_POOL_H_
#define LONGHAUL_DAEMON_PEER_READ_BACK_POOL_H_

#include <cstddef>
#include <deque>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/synchronization/mutex.h"
#include "storage/chunk_io.h"
#include "storage/file_io.h"

namespace longhaul::peer {

// A few threads that read staged chunks back against their digests while a
// transfer is still receiving, so that the read-back before publish is left
// with only what they have not checked yet (Receiver). Each thread has its
// own FileIo and an aligned buffer that grows to the largest chunk it read.
//
// Submit never blocks and never grows the queue past `max_queued`: a task
// offered to a full queue is refused (false), and the caller leaves that
// chunk to the read-back before publish. So a backlog costs at most
// `max_queued` tasks of memory and nothing is ever skipped.
//
// Thread-safe. The destructor drops the queued tasks and waits for the
// running ones.
class ReadBackPool {
 public:
  // What a task runs with: the thread's FileIo, and its buffer of at least
  // `size` bytes (contents undefined, address and size aligned for direct
  // I/O; valid until the task returns).
  class Worker {
   public:
    storage::FileIo& io() { return *io_; }
    absl::Span<uint8_t> Buffer(size_t size);

   private:
    friend class ReadBackPool;
    std::unique_ptr<storage::FileIo> io_;
    std::unique_ptr<storage::AlignedBuffer> buffer_;
  };
  using Task = absl::AnyInvocable<void(Worker&)>;

  ReadBackPool(size_t threads, size_t max_queued);
  ~ReadBackPool();
  ReadBackPool(const ReadBackPool&) = delete;
  ReadBackPool& operator=(const ReadBackPool&) = delete;

  // Queues `task` for a worker thread; false (task dropped) when the queue
  // is full or the pool is stopping.
  bool Submit(Task task);

 private:
  void Run();

  const size_t max_queued_;
  absl::Mutex mu_;
  std::deque<Task> queue_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace longhaul::peer

#endif  // LONGHAUL_DAEMON_PEER_READ_BACK_POOL_H_
