#include "tests/wanem/star_site.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "absl/time/time.h"

namespace longhaul::wanem {

Downlink::Downlink(const DirectionParams& params, uint64_t seed, int mtu, int wake_fd)
    : params_(params),
      wake_fd_(wake_fd),
      shaper_(params, seed),
      ring_(RingCapacity(params), static_cast<size_t>(mtu)) {}

void Downlink::Accept(absl::Span<const uint8_t> packet, int64_t arrival_ns) {
  bool was_empty;
  {
    absl::MutexLock lock(&mu_);
    shaper_.set_cut(cut());
    shaper_.set_burst_loss(burst_loss_.load(std::memory_order_relaxed));
    // LinkShaper needs arrivals in order; two uplinks' departures can be
    // handed over a few microseconds out of order.
    arrival_ns = std::max(arrival_ns, last_arrival_ns_);
    last_arrival_ns_ = arrival_ns;
    const Decision d =
        shaper_.Offer(absl::FromUnixNanos(arrival_ns), static_cast<int64_t>(packet.size()));
    if (d.verdict != Verdict::kForward) {
      CountDrop(d.verdict, counters_);
      return;
    }
    absl::Span<uint8_t> slot = ring_.Reserve();
    if (slot.size() < packet.size()) {
      counters_.dropped_overflow.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    std::memcpy(slot.data(), packet.data(), packet.size());
    was_empty = ring_.empty();
    ring_.Commit(packet.size(), absl::ToUnixNanos(d.deliver_at));
  }
  // Departures only ever join behind later ones, so the owner needs waking
  // only when this packet is the new front.
  if (was_empty) {
    const uint64_t one = 1;
    [[maybe_unused]] ssize_t n = write(wake_fd_, &one, sizeof(one));
  }
}

int64_t Downlink::WriteDue(int out_fd, int64_t now_ns) {
  for (;;) {
    absl::Span<const uint8_t> packet;
    {
      absl::MutexLock lock(&mu_);
      if (ring_.empty()) return -1;
      if (ring_.FrontDue() > now_ns) return ring_.FrontDue();
      packet = ring_.Front();
    }
    if (cut()) {
      // A cut black-holes packets in flight too.
      counters_.dropped_cut.fetch_add(1, std::memory_order_relaxed);
    } else if (write(out_fd, packet.data(), packet.size()) == static_cast<ssize_t>(packet.size())) {
      counters_.forwarded_packets.fetch_add(1, std::memory_order_relaxed);
      counters_.forwarded_bytes.fetch_add(packet.size(), std::memory_order_relaxed);
    } else {
      counters_.write_errors.fetch_add(1, std::memory_order_relaxed);
    }
    absl::MutexLock lock(&mu_);
    ring_.Pop();
  }
}

StarSite::StarSite(int index, int tun_fd, int stop_fd, const AccessLinkParams& link, uint64_t seed,
                   int mtu)
    : index_(index),
      tun_fd_(tun_fd),
      stop_fd_(stop_fd),
      wake_fd_(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)),
      uplink_(link.up, seed),
      uplink_ring_(RingCapacity(link.up), static_cast<size_t>(mtu)),
      // A seed of its own, so up and down do not lose the same packets.
      downlink_(link.down, seed ^ 0x9e3779b97f4a7c15ULL, mtu, wake_fd_) {}

StarSite::~StarSite() {
  if (wake_fd_ >= 0) close(wake_fd_);
}

void StarSite::Connect(std::vector<Downlink*> downlinks) { downlinks_ = std::move(downlinks); }

void StarSite::ReleaseUplink(int64_t now) {
  const bool cut = uplink_cut();
  while (!uplink_ring_.empty() && uplink_ring_.FrontDue() <= now) {
    absl::Span<const uint8_t> packet = uplink_ring_.Front();
    if (cut) {
      uplink_counters_.dropped_cut.fetch_add(1, std::memory_order_relaxed);
    } else {
      // Routed when read; the destination cannot have changed since.
      const int dst = DestinationSite(packet, static_cast<int>(downlinks_.size()));
      downlinks_[dst - 1]->Accept(packet, uplink_ring_.FrontDue());
      uplink_counters_.forwarded_packets.fetch_add(1, std::memory_order_relaxed);
      uplink_counters_.forwarded_bytes.fetch_add(packet.size(), std::memory_order_relaxed);
    }
    uplink_ring_.Pop();
  }
}

int StarSite::ReadBatch() {
  // Where a packet goes when it is dropped before the ring: read and dropped.
  static thread_local uint8_t overflow[65536];
  uplink_.set_cut(uplink_cut());
  uplink_.set_burst_loss(uplink_burst_loss_.load(std::memory_order_relaxed));
  const int sites = static_cast<int>(downlinks_.size());
  int reads = 0;
  for (; reads < kReadBatch; ++reads) {
    absl::Span<uint8_t> slot = uplink_ring_.Reserve();
    const bool full = slot.empty();
    const ssize_t n =
        full ? read(tun_fd_, overflow, sizeof(overflow)) : read(tun_fd_, slot.data(), slot.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno != EAGAIN) {
        std::fprintf(stderr, "longhaul-wanem site %d: read: %s\n", index_, std::strerror(errno));
      }
      break;
    }
    if (full) {
      uplink_counters_.dropped_overflow.fetch_add(1, std::memory_order_relaxed);
      continue;
    }
    const absl::Span<const uint8_t> packet(slot.data(), static_cast<size_t>(n));
    const int dst = DestinationSite(packet, sites);
    if (dst == 0 || dst == index_) {
      dropped_unroutable_.fetch_add(1, std::memory_order_relaxed);
      continue;
    }
    // Stamped when read, as Relay does, so a busy thread never shortens the
    // link.
    const Decision d = uplink_.Offer(absl::FromUnixNanos(MonotonicNanos()), n);
    if (d.verdict == Verdict::kForward) {
      uplink_ring_.Commit(static_cast<size_t>(n), absl::ToUnixNanos(d.deliver_at));
    } else {
      CountDrop(d.verdict, uplink_counters_);
    }
  }
  return reads;
}

void StarSite::Run() {
  // Wake-ups are the link's timing: ask the kernel not to coalesce them.
  prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);
  struct pollfd fds[3] = {{tun_fd_, POLLIN, 0}, {stop_fd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
  for (;;) {
    int64_t now = MonotonicNanos();
    ReleaseUplink(now);
    const int64_t next_down = downlink_.WriteDue(tun_fd_, now);
    if (ReadBatch() == kReadBatch) continue;  // More may be waiting.

    // Sleep until the next departure of either direction, an arrival from
    // the site, or a packet reaching an empty downlink.
    int64_t next = next_down;
    if (!uplink_ring_.empty() && (next < 0 || uplink_ring_.FrontDue() < next)) {
      next = uplink_ring_.FrontDue();
    }
    struct timespec timeout;
    struct timespec* timeout_ptr = nullptr;
    if (next >= 0) {
      now = MonotonicNanos();
      const int64_t wait = next - now;
      if (wait <= 0) continue;
      timeout.tv_sec = wait / 1'000'000'000;
      timeout.tv_nsec = wait % 1'000'000'000;
      timeout_ptr = &timeout;
    }
    const int rc = ppoll(fds, 3, timeout_ptr, nullptr);
    if (rc < 0 && errno != EINTR) {
      std::fprintf(stderr, "longhaul-wanem site %d: ppoll: %s\n", index_, std::strerror(errno));
      return;
    }
    if (rc > 0 && (fds[1].revents & POLLIN)) return;
    if (rc > 0 && (fds[2].revents & POLLIN)) {
      uint64_t count;
      [[maybe_unused]] ssize_t n = read(wake_fd_, &count, sizeof(count));
    }
  }
}

}  // namespace longhaul::wanem
