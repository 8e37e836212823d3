// RestartCongestionControlIfIdle (daemon/transport/tcp_info.h) on plain
// loopback TCP sockets with the kernel's BBR: an idle socket's BBR starts
// over (its bandwidth estimate is gone), a busy one is left alone.

#include "daemon/transport/tcp_info.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <linux/inet_diag.h>
#include <linux/sockios.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "tests/test_tools/eventually.h"

namespace longhaul::transport {
namespace {

using ::longhaul::testing::Eventually;

class BbrSocketPair : public ::testing::Test {
 protected:
  void SetUp() override {
    int listener = socket(AF_INET, SOCK_STREAM, 0);
    ASSERT_GE(listener, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
    socklen_t len = sizeof addr;
    ASSERT_EQ(getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len), 0);
    ASSERT_EQ(listen(listener, 1), 0);
    sender_ = socket(AF_INET, SOCK_STREAM, 0);
    if (setsockopt(sender_, IPPROTO_TCP, TCP_CONGESTION, "bbr", 3) != 0) {
      close(listener);
      GTEST_SKIP() << "the kernel has no bbr module";
    }
    ASSERT_EQ(connect(sender_, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
    receiver_ = accept(listener, nullptr, nullptr);
    close(listener);
    ASSERT_GE(receiver_, 0);
  }
  void TearDown() override {
    if (sender_ >= 0) close(sender_);
    if (receiver_ >= 0) close(receiver_);
  }

  // Sends `bytes` and reads them all at the receiver.
  void SendAndDrain(size_t bytes) {
    std::thread reader([&] {
      std::vector<char> buf(1 << 20);
      size_t got = 0;
      while (got < bytes) {
        ssize_t n = recv(receiver_, buf.data(), std::min(buf.size(), bytes - got), 0);
        if (n <= 0) return;
        got += static_cast<size_t>(n);
      }
    });
    std::vector<char> buf(bytes);
    EXPECT_EQ(send(sender_, buf.data(), buf.size(), 0), static_cast<ssize_t>(bytes));
    reader.join();
  }

  int Queued() const {
    int queued = -1;
    ioctl(sender_, SIOCOUTQ, &queued);
    return queued;
  }

  uint64_t BbrBandwidth() const {
    tcp_bbr_info info{};
    socklen_t len = sizeof info;
    EXPECT_EQ(getsockopt(sender_, IPPROTO_TCP, TCP_CC_INFO, &info, &len), 0);
    return (static_cast<uint64_t>(info.bbr_bw_hi) << 32) | info.bbr_bw_lo;
  }

  std::string Module() const {
    char name[16] = {};
    socklen_t len = sizeof name;
    EXPECT_EQ(getsockopt(sender_, IPPROTO_TCP, TCP_CONGESTION, name, &len), 0);
    return std::string(name, strnlen(name, sizeof name));
  }

  int sender_ = -1;
  int receiver_ = -1;
};

TEST_F(BbrSocketPair, AnIdleSocketsBbrStartsOver) {
  SendAndDrain(4 << 20);
  ASSERT_TRUE(Eventually([&] { return Queued() == 0; }));
  ASSERT_GT(BbrBandwidth(), 0u) << "BBR measured nothing: the test proves nothing";

  EXPECT_TRUE(RestartCongestionControlIfIdle(sender_, "bbr"));

  EXPECT_EQ(BbrBandwidth(), 0u);
  EXPECT_EQ(Module(), "bbr");
  SendAndDrain(1 << 20);  // and the socket still carries data
}

TEST_F(BbrSocketPair, ABusySocketIsLeftAlone) {
  SendAndDrain(4 << 20);
  // The receiver stops reading: what the sender writes now stays queued.
  int flags = fcntl(sender_, F_GETFL);
  ASSERT_EQ(fcntl(sender_, F_SETFL, flags | O_NONBLOCK), 0);
  std::vector<char> buf(1 << 20);
  while (send(sender_, buf.data(), buf.size(), 0) > 0) {
  }
  ASSERT_GT(Queued(), 0);
  const uint64_t before = BbrBandwidth();
  ASSERT_GT(before, 0u);

  EXPECT_FALSE(RestartCongestionControlIfIdle(sender_, "bbr"));

  EXPECT_GT(BbrBandwidth(), 0u);
  EXPECT_EQ(Module(), "bbr");
}

TEST_F(BbrSocketPair, NoModuleOrRenoChangesNothing) {
  SendAndDrain(1 << 20);
  ASSERT_TRUE(Eventually([&] { return Queued() == 0; }));
  EXPECT_FALSE(RestartCongestionControlIfIdle(sender_, ""));
  EXPECT_FALSE(RestartCongestionControlIfIdle(sender_, "reno"));
  EXPECT_EQ(Module(), "bbr");
  EXPECT_GT(BbrBandwidth(), 0u);
}

}  // namespace
}  // namespace longhaul::transport
