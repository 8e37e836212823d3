// Relay's timing contract on real descriptors: a packet never leaves before
// it has spent the link's delay inside the relay, even when the relay was busy
// writing when the packet arrived. (A stamp taken before a busy loop iteration
// once let such packets leave early, so a 40 ms path measured 26 ms under load.)
//
// Unix SEQPACKET socket pairs stand in for the TUN devices: like a TUN
// descriptor they carry one packet per read and write. The test only asserts
// lower bounds on delay, which a slow machine can only make larger.
#include "tests/wanem/relay.h"

#include <fcntl.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <cstdint>
#include <thread>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace longhaul::wanem {
namespace {

class SocketPair {
 public:
  SocketPair() { EXPECT_EQ(socketpair(AF_UNIX, SOCK_SEQPACKET, 0, fds_.data()), 0); }
  ~SocketPair() {
    close(fds_[0]);
    close(fds_[1]);
  }
  int end(int i) const { return fds_[i]; }

 private:
  std::array<int, 2> fds_{-1, -1};
};

// A Relay running on its own thread; stopped and joined on destruction, so a
// failed ASSERT cannot leave a joinable thread (std::terminate) or the eventfd.
class RunningRelay {
 public:
  RunningRelay(int in_fd, int out_fd, const DirectionParams& params)
      : stop_(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)),
        relay_("test", in_fd, out_fd, stop_, params, /*seed=*/1, /*mtu=*/2000),
        thread_([this] { relay_.Run(); }) {}
  ~RunningRelay() {
    const uint64_t one = 1;
    EXPECT_EQ(write(stop_, &one, sizeof one), static_cast<ssize_t>(sizeof one));
    thread_.join();
    close(stop_);
  }

 private:
  const int stop_;
  Relay relay_;
  std::thread thread_;
};

TEST(RelayTest, PacketsArrivingWhileTheRelayIsBusyStillTakeTheFullDelay) {
  constexpr absl::Duration kDelay = absl::Milliseconds(200);
  constexpr size_t kPacket = 1000;
  SocketPair in;   // the test writes end 0, the relay reads end 1
  SocketPair out;  // the relay writes end 0, the test reads end 1
  ASSERT_EQ(fcntl(in.end(1), F_SETFL, O_NONBLOCK), 0);
  // A small send buffer, left blocking, so the relay stalls in write() while
  // nobody reads the far end.
  int sndbuf = 4096;
  ASSERT_EQ(setsockopt(out.end(0), SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof sndbuf), 0);

  DirectionParams params;
  params.delay = kDelay;
  RunningRelay relay(in.end(1), out.end(0), params);  // stopped before the sockets close

  // Fillers: more than the out socket can hold, so once they come due the
  // relay blocks writing them.
  std::array<uint8_t, kPacket> packet{};
  constexpr int kFillers = 64;
  for (int i = 0; i < kFillers; ++i) {
    packet[0] = 'F';
    ASSERT_EQ(write(in.end(0), packet.data(), packet.size()), static_cast<ssize_t>(kPacket));
  }
  // The probe arrives while the relay is stuck writing the fillers.
  absl::SleepFor(kDelay + absl::Milliseconds(50));
  packet[0] = 'P';
  const absl::Time probe_sent = absl::Now();
  ASSERT_EQ(write(in.end(0), packet.data(), packet.size()), static_cast<ssize_t>(kPacket));
  absl::SleepFor(absl::Milliseconds(100));

  // Drain; note when the probe comes out.
  absl::Time probe_received = absl::InfiniteFuture();
  int fillers = 0;
  while (probe_received == absl::InfiniteFuture() && absl::Now() < probe_sent + absl::Seconds(30)) {
    std::array<uint8_t, 4096> buf;
    const ssize_t n = recv(out.end(1), buf.data(), buf.size(), MSG_DONTWAIT);
    if (n <= 0) {
      absl::SleepFor(absl::Microseconds(200));
      continue;
    }
    if (buf[0] == 'P') {
      probe_received = absl::Now();
    } else {
      ++fillers;
    }
  }
  EXPECT_EQ(fillers, kFillers);
  ASSERT_NE(probe_received, absl::InfiniteFuture()) << "the probe never came out";
  EXPECT_GE(probe_received - probe_sent, kDelay)
      << "the probe left " << absl::FormatDuration(kDelay - (probe_received - probe_sent))
      << " early";
}

}  // namespace
}  // namespace longhaul::wanem
