#include "tests/chaos/faultfs/request_loop.h"

#include <linux/fuse.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <iostream>

namespace longhaul::faultfs {

void RequestLoop::Start(int threads) {
  for (int i = 0; i < threads; ++i) {
    readers_.emplace_back([this] { ReadRequests(); });
    readers_.back().detach();
  }
}

void RequestLoop::ReadRequests() {
  fuse_buf buf;
  std::memset(&buf, 0, sizeof(buf));
  while (!fuse_session_exited(session_)) {
    const int res = fuse_session_receive_buf(session_, &buf);
    if (res == -EINTR) continue;
    if (res <= 0) {  // 0: the session ended; -ENODEV: unmounted
      if (res < 0 && res != -ENODEV) {
        std::cerr << "longhaul-faultfs: reading /dev/fuse: " << std::strerror(-res) << "\n";
      }
      fuse_session_exit(session_);
      break;
    }
    if (buf.size < sizeof(fuse_in_header)) continue;
    const auto* in = static_cast<const fuse_in_header*>(buf.mem);
    if (in->opcode == FUSE_INTERRUPT && buf.size >= sizeof(*in) + sizeof(fuse_interrupt_in)) {
      const auto* arg = reinterpret_cast<const fuse_interrupt_in*>(in + 1);
      if (InterruptParked(arg->unique)) continue;
    }
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (frozen_ && in->opcode != FUSE_INTERRUPT) {
        Park(*in, buf);
        continue;
      }
      ++handling_;
    }
    fuse_session_process_buf(session_, &buf);
    std::lock_guard<std::mutex> lock(mu_);
    if (--handling_ == 0) idle_.notify_all();
  }
  free(buf.mem);
}

void RequestLoop::AnswerInterrupted(uint64_t unique) {
  fuse_out_header out;
  std::memset(&out, 0, sizeof(out));
  out.len = sizeof(out);
  out.error = -EINTR;
  out.unique = unique;
  // ENOENT: the kernel has dropped the request already (its task is gone).
  if (write(fuse_session_fd(session_), &out, sizeof(out)) != sizeof(out) && errno != ENOENT) {
    std::cerr << "longhaul-faultfs: answering an interrupted request: " << std::strerror(errno)
              << "\n";
  }
  ++interrupted_;
}

bool RequestLoop::InterruptParked(uint64_t unique) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = parked_.begin(); it != parked_.end(); ++it) {
    if (it->unique != unique) continue;
    AnswerInterrupted(unique);
    free(it->buf.mem);
    parked_.erase(it);
    return true;
  }
  if (frozen_) early_interrupts_.push_back(unique);
  return false;  // also for libfuse: the request may be one being handled
}

void RequestLoop::Park(const fuse_in_header& in, fuse_buf& buf) {
  auto early = std::find(early_interrupts_.begin(), early_interrupts_.end(), in.unique);
  if (early != early_interrupts_.end()) {
    early_interrupts_.erase(early);
    AnswerInterrupted(in.unique);
    free(buf.mem);
  } else {
    parked_.push_back({.unique = in.unique, .pid = in.pid, .buf = buf});
  }
  std::memset(&buf, 0, sizeof(buf));  // the next request gets fresh memory
}

void RequestLoop::Freeze() {
  std::unique_lock<std::mutex> lock(mu_);
  frozen_ = true;
  idle_.wait(lock, [this] { return handling_ == 0; });
}

void RequestLoop::Thaw() {
  std::deque<Parked> held;
  {
    std::lock_guard<std::mutex> lock(mu_);
    frozen_ = false;
    held.swap(parked_);
    early_interrupts_.clear();
    handling_ += static_cast<int>(held.size());
  }
  for (Parked& p : held) {
    fuse_session_process_buf(session_, &p.buf);
    free(p.buf.mem);
    std::lock_guard<std::mutex> lock(mu_);
    if (--handling_ == 0) idle_.notify_all();
  }
}

bool RequestLoop::frozen() {
  std::lock_guard<std::mutex> lock(mu_);
  return frozen_;
}

uint64_t RequestLoop::parked() {
  std::lock_guard<std::mutex> lock(mu_);
  return parked_.size();
}

std::vector<uint32_t> RequestLoop::parked_pids() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<uint32_t> pids;
  for (const Parked& p : parked_) pids.push_back(p.pid);
  return pids;
}

uint64_t RequestLoop::interrupted() {
  std::lock_guard<std::mutex> lock(mu_);
  return interrupted_;
}

}  // namespace longhaul::faultfs
