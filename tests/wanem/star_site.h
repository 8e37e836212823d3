#ifndef LONGHAUL_TESTS_WANEM_STAR_SITE_H_
#define LONGHAUL_TESTS_WANEM_STAR_SITE_H_

#include <atomic>
#include <cstdint>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "tests/wanem/link_shaper.h"
#include "tests/wanem/packet_ring.h"
#include "tests/wanem/relay.h"
#include "tests/wanem/star_topology.h"

namespace longhaul::wanem {

// The core -> site direction of one site's access link: packets that reached
// the core for this site wait here for the downlink's queue, serialization
// and delay, then leave into the site's TUN device.
//
// Thread-safe: Accept() is called by the thread of every sending site, and
// WriteDue() only by the owning site's thread. Packets are copied in; nothing
// is allocated per packet. The mutex is held to shape and copy, not while the
// owner writes to the TUN device.
class Downlink {
 public:
  // `wake_fd` (an eventfd, borrowed) is signalled when a packet arrives at an
  // empty downlink, so the owner's thread can sleep until its next departure.
  Downlink(const DirectionParams& params, uint64_t seed, int mtu, int wake_fd);

  // A packet reached the core at `arrival_ns` (MonotonicNanos() time, its
  // uplink departure). Arrivals from different uplinks may come slightly out
  // of order; each is shaped as arriving no earlier than the one before.
  void Accept(absl::Span<const uint8_t> packet, int64_t arrival_ns);

  // Writes every packet due at `now_ns` to `out_fd` (dropping them while
  // cut) and returns the departure time of the next one, or -1 if none.
  int64_t WriteDue(int out_fd, int64_t now_ns);

  void set_cut(bool cut) { cut_.store(cut, std::memory_order_relaxed); }
  bool cut() const { return cut_.load(std::memory_order_relaxed); }
  // LinkShaper::set_burst_loss, from any thread.
  void set_burst_loss(double loss) { burst_loss_.store(loss, std::memory_order_relaxed); }
  const DirectionCounters& counters() const { return counters_; }
  const DirectionParams& params() const { return params_; }

 private:
  const DirectionParams params_;
  const int wake_fd_;
  std::atomic<bool> cut_{false};
  std::atomic<double> burst_loss_{0.0};
  DirectionCounters counters_;
  absl::Mutex mu_;
  LinkShaper shaper_ ABSL_GUARDED_BY(mu_);
  // Only the owner pops, and Accept() writes only into free space, so the
  // front packet may be read without the mutex while it is written out.
  PacketRing ring_ ABSL_GUARDED_BY(mu_);
  int64_t last_arrival_ns_ ABSL_GUARDED_BY(mu_) = 0;
};

// One site of the star: its TUN descriptor, its uplink (site -> core) and its
// Downlink. Run() is the body of the site's own thread: it reads what the
// site sends, shapes it through the uplink (stamped when read, as Relay
// does), hands each packet to the destination's Downlink when it reaches the
// core, and writes what its own Downlink releases into the TUN device.
// Packets to no other site of the star are dropped and counted unroutable.
//
// Connect() must be called before Run(). set_uplink_cut(), downlink() and
// the counters may be used from any thread. Descriptors are borrowed and must
// outlive Run().
class StarSite {
 public:
  // `index` is 1-based; `tun_fd` non-blocking; `stop_fd` an eventfd that
  // becomes readable when Run() must return.
  StarSite(int index, int tun_fd, int stop_fd, const AccessLinkParams& link, uint64_t seed,
           int mtu);
  ~StarSite();
  StarSite(const StarSite&) = delete;
  StarSite& operator=(const StarSite&) = delete;

  // `downlinks[k - 1]` is site k's Downlink (this site's own included).
  void Connect(std::vector<Downlink*> downlinks);

  void Run();

  void set_uplink_cut(bool cut) { uplink_cut_.store(cut, std::memory_order_relaxed); }
  bool uplink_cut() const { return uplink_cut_.load(std::memory_order_relaxed); }
  void set_uplink_burst_loss(double loss) {
    uplink_burst_loss_.store(loss, std::memory_order_relaxed);
  }
  Downlink& downlink() { return downlink_; }
  const Downlink& downlink() const { return downlink_; }
  const DirectionCounters& uplink_counters() const { return uplink_counters_; }
  const DirectionParams& uplink_params() const { return uplink_.params(); }
  uint64_t dropped_unroutable() const {
    return dropped_unroutable_.load(std::memory_order_relaxed);
  }
  int index() const { return index_; }

 private:
  static constexpr int kReadBatch = 64;

  // Hands the uplink's due packets to their downlinks.
  void ReleaseUplink(int64_t now);
  // Reads up to kReadBatch packets; returns how many reads were made.
  int ReadBatch();

  const int index_;
  const int tun_fd_;
  const int stop_fd_;
  const int wake_fd_;
  LinkShaper uplink_;
  PacketRing uplink_ring_;
  std::atomic<bool> uplink_cut_{false};
  std::atomic<double> uplink_burst_loss_{0.0};
  DirectionCounters uplink_counters_;
  std::atomic<uint64_t> dropped_unroutable_{0};
  Downlink downlink_;
  std::vector<Downlink*> downlinks_;
};

}  // namespace longhaul::wanem

#endif  // LONGHAUL_TESTS_WANEM_STAR_SITE_H_
