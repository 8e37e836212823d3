// The star's data path on real descriptors and real time, without root:
// Unix SEQPACKET socket pairs stand in for the sites' TUN devices (one packet
// per read and write, like TUN). The test writes what a site sends into one
// end; the site's thread reads the other end and writes there what its
// downlink releases. Timing checks are lower bounds (a slow machine only
// makes paths longer) with generous upper limits that only catch a packet
// that never comes.
#include "tests/wanem/star_site.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace longhaul::wanem {
namespace {

constexpr int kMtu = 2000;

DirectionParams Link(int64_t rate_bps, absl::Duration delay) {
  DirectionParams p;
  p.rate_bps = rate_bps;
  p.delay = delay;
  return p;
}

// N sites on socket pairs, each on its own thread; stopped, joined and closed
// on destruction, so a failed ASSERT leaves no thread or descriptor.
class RunningStar {
 public:
  explicit RunningStar(const std::vector<AccessLinkParams>& links)
      : stop_(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {
    std::vector<Downlink*> downlinks;
    for (size_t k = 0; k < links.size(); ++k) {
      std::array<int, 2> fds;
      EXPECT_EQ(socketpair(AF_UNIX, SOCK_SEQPACKET, 0, fds.data()), 0);
      EXPECT_EQ(fcntl(fds[1], F_SETFL, O_NONBLOCK), 0);
      fds_.push_back(fds);
      sites_.push_back(std::make_unique<StarSite>(static_cast<int>(k) + 1, fds[1], stop_, links[k],
                                                  1 + 2 * k, kMtu));
      downlinks.push_back(&sites_.back()->downlink());
    }
    for (auto& site : sites_) site->Connect(downlinks);
    for (auto& site : sites_) threads_.emplace_back([s = site.get()] { s->Run(); });
  }
  ~RunningStar() {
    const uint64_t one = 1;
    EXPECT_EQ(write(stop_, &one, sizeof one), static_cast<ssize_t>(sizeof one));
    for (std::thread& t : threads_) t.join();
    for (const std::array<int, 2>& fds : fds_) {
      close(fds[0]);
      close(fds[1]);
    }
    close(stop_);
  }

  // Site `from` sends `bytes` to site `to`; the first payload byte is `tag`.
  void Send(int from, int to, size_t bytes, uint8_t tag) {
    std::array<uint8_t, kMtu> p{};
    p[0] = 0x45;
    p[16] = 198;
    p[17] = 18;
    p[18] = 1;
    p[19] = static_cast<uint8_t>(to);
    p[20] = tag;
    ASSERT_EQ(write(fds_[from - 1][0], p.data(), bytes), static_cast<ssize_t>(bytes));
  }

  // Waits up to `limit` for a packet at `site`; returns its tag, or -1.
  int Receive(int site, absl::Duration limit) {
    struct pollfd pfd = {fds_[site - 1][0], POLLIN, 0};
    if (poll(&pfd, 1, static_cast<int>(absl::ToInt64Milliseconds(limit))) != 1) return -1;
    std::array<uint8_t, kMtu> p;
    const ssize_t n = read(fds_[site - 1][0], p.data(), p.size());
    return n > 20 ? p[20] : -1;
  }

  StarSite& site(int k) { return *sites_[k - 1]; }

 private:
  const int stop_;
  std::vector<std::array<int, 2>> fds_;
  std::vector<std::unique_ptr<StarSite>> sites_;
  std::vector<std::thread> threads_;
};

TEST(StarSiteTest, APacketCrossesTheSendersUplinkAndTheReceiversDownlink) {
  const std::vector<AccessLinkParams> links = {
      {Link(0, absl::Milliseconds(30)), Link(0, absl::Milliseconds(30))},
      {Link(0, absl::Milliseconds(50)), Link(0, absl::Milliseconds(50))},
      {Link(0, absl::Milliseconds(5)), Link(0, absl::Milliseconds(5))}};
  RunningStar star(links);
  const absl::Time sent = absl::Now();
  star.Send(1, 2, 100, 'x');
  ASSERT_EQ(star.Receive(2, absl::Seconds(5)), 'x');
  EXPECT_GE(absl::Now() - sent, absl::Milliseconds(80)) << "30 ms up + 50 ms down";
  EXPECT_EQ(star.Receive(3, absl::Milliseconds(100)), -1) << "delivered to the wrong site";
  EXPECT_EQ(star.Receive(1, absl::Milliseconds(1)), -1) << "echoed to the sender";
}

TEST(StarSiteTest, AllDestinationsShareTheSendersUplink) {
  // 8 Mbit/s = 1 byte/us everywhere. 100 packets of 1000 bytes from site 1,
  // half to site 2 and half to site 3, take 100 ms through one shared
  // uplink; with an uplink per destination they would take 50 ms.
  const AccessLinkParams link = {Link(8'000'000, absl::ZeroDuration()),
                                 Link(8'000'000, absl::ZeroDuration())};
  RunningStar star({link, link, link});
  const absl::Time sent = absl::Now();
  for (int i = 0; i < 100; ++i) star.Send(1, 2 + i % 2, 1000, 'd');
  int received[4] = {0, 0, 0, 0};
  for (int i = 0; i < 100; ++i) {
    bool any = false;
    for (int site = 2; site <= 3 && !any; ++site) {
      if (star.Receive(site, absl::Milliseconds(1)) == 'd') {
        ++received[site];
        any = true;
      }
    }
    if (!any) --i;
    ASSERT_LT(absl::Now() - sent, absl::Seconds(10)) << "packets lost";
  }
  EXPECT_EQ(received[2], 50);
  EXPECT_EQ(received[3], 50);
  EXPECT_GE(absl::Now() - sent, absl::Milliseconds(99));
  EXPECT_EQ(star.site(1).uplink_counters().forwarded_packets.load(), 100u);
}

TEST(StarSiteTest, AllSendersShareTheReceiversDownlink) {
  // Sites 1 and 2 each send 50 packets of 1000 bytes to site 3, whose
  // downlink (8 Mbit/s) needs 100 ms for them; the uplinks are unlimited.
  const AccessLinkParams fast = {Link(0, absl::ZeroDuration()), Link(0, absl::ZeroDuration())};
  const AccessLinkParams slow_down = {Link(0, absl::ZeroDuration()),
                                      Link(8'000'000, absl::ZeroDuration())};
  RunningStar star({fast, fast, slow_down});
  const absl::Time sent = absl::Now();
  for (int i = 0; i < 50; ++i) {
    star.Send(1, 3, 1000, 'a');
    star.Send(2, 3, 1000, 'b');
  }
  for (int i = 0; i < 100; ++i) {
    ASSERT_NE(star.Receive(3, absl::Seconds(5)), -1) << "only " << i << " arrived";
  }
  EXPECT_GE(absl::Now() - sent, absl::Milliseconds(99));
}

TEST(StarSiteTest, ACutUplinkSilencesOnlyThatSite) {
  const AccessLinkParams link = {Link(0, absl::Milliseconds(2)), Link(0, absl::Milliseconds(2))};
  RunningStar star({link, link, link});
  star.site(1).set_uplink_cut(true);
  star.Send(1, 2, 100, 'c');
  star.Send(2, 3, 100, 'k');
  EXPECT_EQ(star.Receive(3, absl::Seconds(5)), 'k') << "the other sites stopped too";
  EXPECT_EQ(star.Receive(2, absl::Milliseconds(100)), -1) << "passed a cut uplink";
  EXPECT_EQ(star.site(1).uplink_counters().dropped_cut.load(), 1u);
  star.site(1).set_uplink_cut(false);
  star.Send(1, 2, 100, 'r');
  EXPECT_EQ(star.Receive(2, absl::Seconds(5)), 'r') << "no traffic after restore";
}

TEST(StarSiteTest, PacketsForNoSiteAreDroppedAndCounted) {
  const AccessLinkParams link = {Link(0, absl::ZeroDuration()), Link(0, absl::ZeroDuration())};
  RunningStar star({link, link});
  star.Send(1, 9, 100, 'n');  // 198.18.1.9: no such site.
  star.Send(1, 1, 100, 's');  // Itself: the kernel never sends this out.
  star.Send(1, 2, 100, 'y');
  EXPECT_EQ(star.Receive(2, absl::Seconds(5)), 'y');
  EXPECT_EQ(star.site(1).dropped_unroutable(), 2u);
}

}  // namespace
}  // namespace longhaul::wanem
