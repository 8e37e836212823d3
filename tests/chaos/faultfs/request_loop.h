// The request loop of longhaul-faultfs: libfuse's session loop, plus a
// freeze that holds every new request unanswered until thaw.
//
// A frozen request is read from /dev/fuse and parked, not handed to a
// handler: no thread blocks on it, so the readers keep reading, and the
// kernel's INTERRUPT for a parked request (sent when the waiting task gets a
// signal, SIGKILL included) is answered at once with EINTR. A task blocked
// on a frozen file system therefore dies when killed, as it would on a hung
// disk with a killable wait; requests of live tasks wait for thaw and then
// run in arrival order.

#ifndef LONGHAUL_TESTS_CHAOS_FAULTFS_REQUEST_LOOP_H_
#define LONGHAUL_TESTS_CHAOS_FAULTFS_REQUEST_LOOP_H_

#define FUSE_USE_VERSION 35
#include <fuse_lowlevel.h>
#include <linux/fuse.h>

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

namespace longhaul::faultfs {

class RequestLoop {
 public:
  explicit RequestLoop(fuse_session* session) : session_(session) {}
  RequestLoop(const RequestLoop&) = delete;
  RequestLoop& operator=(const RequestLoop&) = delete;

  // Starts `threads` readers. They stop when the session ends (unmount);
  // the process may exit without joining them.
  void Start(int threads);

  // Holds new requests; returns once no request is being handled, so that
  // nothing reaches the backing directory until Thaw.
  void Freeze();
  // Runs the held requests in arrival order, then lets new ones through.
  void Thaw();

  bool frozen();
  uint64_t parked();
  // The task ids of the parked requests' callers (0 for the kernel's own,
  // such as a release sent in the background), so that a test can tell its
  // writer's request from another.
  std::vector<uint32_t> parked_pids();
  uint64_t interrupted();  // parked requests answered EINTR

 private:
  struct Parked {
    uint64_t unique = 0;
    uint32_t pid = 0;
    fuse_buf buf{};
  };

  void ReadRequests();
  // True when `unique` was parked: it is then answered EINTR and dropped.
  // While frozen, an interrupt for a request not parked yet (another reader
  // holds it on its way to the queue) is remembered for Park.
  bool InterruptParked(uint64_t unique);
  // Parks a request read while frozen, or answers it EINTR at once when its
  // interrupt came first. Takes ownership of `buf`'s memory.
  void Park(const fuse_in_header& in, fuse_buf& buf);
  void AnswerInterrupted(uint64_t unique);  // under mu_

  fuse_session* const session_;
  std::vector<std::thread> readers_;
  std::mutex mu_;
  std::condition_variable idle_;
  bool frozen_ = false;
  int handling_ = 0;  // requests being handled right now
  std::deque<Parked> parked_;
  std::vector<uint64_t> early_interrupts_;
  uint64_t interrupted_ = 0;
};

}  // namespace longhaul::faultfs

#endif  // LONGHAUL_TESTS_CHAOS_FAULTFS_REQUEST_LOOP_H_
