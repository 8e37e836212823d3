#include "tests/wanem/relay.h"

#include <poll.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"

namespace longhaul::wanem {

int64_t MonotonicNanos() {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
}

void CountDrop(Verdict verdict, DirectionCounters& c) {
  switch (verdict) {
    case Verdict::kForward:
      break;
    case Verdict::kDropQueue:
      c.dropped_queue.fetch_add(1, std::memory_order_relaxed);
      break;
    case Verdict::kDropLoss:
      c.dropped_loss.fetch_add(1, std::memory_order_relaxed);
      break;
    case Verdict::kDropCut:
      c.dropped_cut.fetch_add(1, std::memory_order_relaxed);
      break;
  }
}

// Room for everything that can be inside one direction at once: the queue,
// plus what is in flight during the delay (at the link rate, or at a generous
// 4 Gbit/s for an unlimited link), with headroom for per-packet overhead.
size_t RingCapacity(const DirectionParams& p) {
  const int64_t rate = p.rate_bps > 0 ? p.rate_bps : int64_t{4'000'000'000};
  const double in_flight =
      static_cast<double>(rate) / 8 * absl::ToDoubleSeconds(p.delay + p.jitter);
  const double queue = p.rate_bps > 0 ? static_cast<double>(p.queue_bytes) : 0;
  return static_cast<size_t>(2 * (in_flight + queue)) + (16 << 20);
}

std::string DirectionStatsJson(const DirectionCounters& c, const DirectionParams& p, bool cut,
                               int mtu) {
  auto get = [](const std::atomic<uint64_t>& v) { return v.load(std::memory_order_relaxed); };
  return absl::StrCat(
      "{\"forwarded_packets\":", get(c.forwarded_packets),
      ",\"forwarded_bytes\":", get(c.forwarded_bytes), ",\"dropped_queue\":", get(c.dropped_queue),
      ",\"dropped_loss\":", get(c.dropped_loss), ",\"dropped_cut\":", get(c.dropped_cut),
      ",\"dropped_overflow\":", get(c.dropped_overflow), ",\"write_errors\":", get(c.write_errors),
      ",\"cut\":", cut ? "true" : "false", ",\"rate_bps\":", p.rate_bps,
      ",\"delay_ms\":", absl::ToDoubleMilliseconds(p.delay),
      ",\"jitter_ms\":", absl::ToDoubleMilliseconds(p.jitter), ",\"loss\":", p.loss,
      ",\"queue_bytes\":", p.queue_bytes, ",\"mtu\":", mtu, "}");
}

Relay::Relay(std::string name, int in_fd, int out_fd, int stop_fd, const DirectionParams& params,
             uint64_t seed, int mtu)
    : name_(std::move(name)),
      in_fd_(in_fd),
      out_fd_(out_fd),
      stop_fd_(stop_fd),
      mtu_(mtu),
      shaper_(params, seed),
      ring_(RingCapacity(params), static_cast<size_t>(mtu)) {}

void Relay::Run() {
  // Wake-ups are the link's timing: ask the kernel not to coalesce them.
  prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);
  // Where a packet goes when the ring is full: read and dropped.
  uint8_t overflow[65536];
  struct pollfd fds[2] = {{in_fd_, POLLIN, 0}, {stop_fd_, POLLIN, 0}};
  for (;;) {
    int64_t now = MonotonicNanos();
    const bool cut = cut_.load(std::memory_order_relaxed);
    shaper_.set_cut(cut);
    shaper_.set_burst_loss(burst_loss_.load(std::memory_order_relaxed));

    // Release what is due. A cut black-holes packets in flight too.
    while (!ring_.empty() && ring_.FrontDue() <= now) {
      absl::Span<const uint8_t> pkt = ring_.Front();
      if (cut) {
        counters_.dropped_cut.fetch_add(1, std::memory_order_relaxed);
      } else if (write(out_fd_, pkt.data(), pkt.size()) == static_cast<ssize_t>(pkt.size())) {
        counters_.forwarded_packets.fetch_add(1, std::memory_order_relaxed);
        counters_.forwarded_bytes.fetch_add(pkt.size(), std::memory_order_relaxed);
      } else {
        counters_.write_errors.fetch_add(1, std::memory_order_relaxed);
      }
      ring_.Pop();
    }

    // Take in a batch of arrivals.
    int reads = 0;
    for (; reads < kReadBatch; ++reads) {
      absl::Span<uint8_t> slot = ring_.Reserve();
      const bool full = slot.empty();
      const ssize_t n =
          full ? read(in_fd_, overflow, sizeof(overflow)) : read(in_fd_, slot.data(), slot.size());
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno != EAGAIN) {
          std::fprintf(stderr, "longhaul-wanem %s: read: %s\n", name_.c_str(),
                       std::strerror(errno));
        }
        break;
      }
      if (full) {
        counters_.dropped_overflow.fetch_add(1, std::memory_order_relaxed);
        continue;
      }
      // Stamp each packet when it is read: a stamp from before this batch would let packets
      // that arrived while the relay was busy (or descheduled) leave early, shortening the link.
      now = MonotonicNanos();
      const Decision d = shaper_.Offer(absl::FromUnixNanos(now), n);
      if (d.verdict == Verdict::kForward) {
        ring_.Commit(static_cast<size_t>(n), absl::ToUnixNanos(d.deliver_at));
      } else {
        CountDrop(d.verdict, counters_);
      }
    }
    if (reads == kReadBatch) continue;  // More may be waiting.

    // Sleep until the next departure or the next arrival.
    struct timespec timeout;
    struct timespec* timeout_ptr = nullptr;
    if (!ring_.empty()) {
      now = MonotonicNanos();
      const int64_t wait = ring_.FrontDue() - now;
      if (wait <= 0) continue;
      timeout.tv_sec = wait / 1'000'000'000;
      timeout.tv_nsec = wait % 1'000'000'000;
      timeout_ptr = &timeout;
    }
    const int rc = ppoll(fds, 2, timeout_ptr, nullptr);
    if (rc < 0 && errno != EINTR) {
      std::fprintf(stderr, "longhaul-wanem %s: ppoll: %s\n", name_.c_str(), std::strerror(errno));
      return;
    }
    if (rc > 0 && (fds[1].revents & POLLIN)) return;
  }
}

std::string Relay::StatsJson() const {
  return DirectionStatsJson(counters_, params(), cut(), mtu_);
}

}  // namespace longhaul::wanem
