// Loopback tests of the tcp transport's channel queries and of the bounds
// on the connections it accepts (ConnectionLimits).

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <future>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "common/clock.h"
#include "daemon/transport/transport.h"
#include "tests/test_tools/eventually.h"

namespace longhaul::transport {
namespace {

using ::longhaul::testing::Eventually;

std::string PkiDir() {
  static const std::string dir = [] {
    char tmpl[] = "/tmp/tcp_tls_transport_test.XXXXXX";
    std::string d = mkdtemp(tmpl);
    std::string cmd = std::string("bash ") + LONGHAUL_PKI_SCRIPT + " " + d +
                      " site-a site-b >/dev/null 2>&1";
    EXPECT_EQ(std::system(cmd.c_str()), 0);
    return d;
  }();
  return dir;
}

std::unique_ptr<Transport> MakeSite(const std::string& name, const std::string& peer,
                                    const ConnectionLimits& limits = {}) {
  const std::string d = PkiDir();
  TlsIdentity identity{d + "/ca.pem", d + "/" + name + ".pem", d + "/" + name + ".key", name, {peer}};
  TcpTuning tuning;
  tuning.socket_buffer_bytes = 1 << 20;
  tuning.congestion_control = "";
  return *MakeTcpTlsTransport(identity, tuning, limits);
}

// Two sites on loopback and one channel between them: `dialed` (site-a's end)
// and `server` (site-b's).
class TcpTlsChannelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    a = MakeSite("site-a", "site-b");
    b = MakeSite("site-b", "site-a");
    std::promise<std::unique_ptr<Channel>> accepted;
    ASSERT_TRUE(b->Listen("127.0.0.1:0", [&](auto c) { accepted.set_value(std::move(c)); }).ok());
    auto channel = a->Dial("site-b", "127.0.0.1:" + std::to_string(b->listen_port()));
    ASSERT_TRUE(channel.ok()) << channel.status();
    dialed = std::move(*channel);
    // The listener hands a channel over once the peer has sent something.
    const uint8_t hello = 7;
    ASSERT_TRUE(dialed->Write({absl::MakeConstSpan(&hello, 1)}).ok());
    auto future = accepted.get_future();
    ASSERT_EQ(future.wait_for(std::chrono::seconds(10)), std::future_status::ready);
    server = future.get();
    uint8_t got = 0;
    ASSERT_TRUE(server->ReadExactly(absl::MakeSpan(&got, 1)).ok());
    ASSERT_EQ(got, hello);
    server->EndHandshake();
  }
  void TearDown() override {
    dialed.reset();
    server.reset();
    if (a) a->Shutdown();
    if (b) b->Shutdown();
  }

  std::unique_ptr<Transport> a, b;
  std::unique_ptr<Channel> dialed, server;
};

// UnsentBytes counts what the peer's window has not let out yet, and drops
// to zero once the peer reads: the exchange hub holds bulk traffic back on
// this figure.
TEST_F(TcpTlsChannelTest, UnsentBytesFollowWhatThePeerHasNotTakenYet) {
  EXPECT_EQ(dialed->UnsentBytes(), 0u);

  // More than the peer's receive buffer can take while nobody reads it.
  const std::vector<uint8_t> data(8 << 20, 0x5a);
  std::thread writer([&] { EXPECT_TRUE(dialed->Write({absl::MakeConstSpan(data)}).ok()); });
  EXPECT_TRUE(Eventually([&] { return dialed->UnsentBytes() > 0; }));

  std::vector<uint8_t> got(data.size());
  ASSERT_TRUE(server->ReadExactly(absl::MakeSpan(got)).ok());
  writer.join();
  EXPECT_TRUE(got == data);
  EXPECT_TRUE(Eventually([&] { return dialed->UnsentBytes() == 0; }));
}

// LimitPacingRate caps the socket's pacing (the exchange link at the link's
// rate, bulk streams at their share), also when another thread sets it.
TEST_F(TcpTlsChannelTest, LimitPacingRateCapsTheSocket) {
  EXPECT_EQ(dialed->Stats().max_pacing_rate_bytes_per_second, 0u);

  dialed->LimitPacingRate(Bandwidth::MbitsPerSecond(800));
  EXPECT_EQ(dialed->Stats().max_pacing_rate_bytes_per_second, 100'000'000u);
  std::thread other([&] { dialed->LimitPacingRate(Bandwidth::MbitsPerSecond(400)); });
  other.join();
  EXPECT_EQ(dialed->Stats().max_pacing_rate_bytes_per_second, 50'000'000u);
}

// The channels a listener hands over, in order.
class AcceptedChannels {
 public:
  ChannelHandler Handler() {
    return [this](std::unique_ptr<Channel> c) {
      std::lock_guard lock(mu_);
      channels_.push_back(std::move(c));
      cv_.notify_all();
    };
  }
  // The next channel, or nullptr if none comes within 10 s.
  std::unique_ptr<Channel> Take() {
    std::unique_lock lock(mu_);
    if (!cv_.wait_for(lock, std::chrono::seconds(10), [&] { return !channels_.empty(); })) {
      return nullptr;
    }
    auto c = std::move(channels_.front());
    channels_.pop_front();
    return c;
  }
  size_t size() {
    std::lock_guard lock(mu_);
    return channels_.size();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::unique_ptr<Channel>> channels_;
};

absl::Status WriteByte(Channel& channel) {
  const uint8_t byte = 1;
  return channel.Write({absl::MakeConstSpan(&byte, 1)});
}

absl::Status ReadByte(Channel& channel) {
  uint8_t byte = 0;
  return channel.ReadExactly(absl::MakeSpan(&byte, 1));
}

// A plain TCP connection to 127.0.0.1:`port` that sends nothing.
int ConnectTcp(uint16_t port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  return fd;
}

class TcpTlsLimitsTest : public ::testing::Test {
 protected:
  void Start(const ConnectionLimits& limits) {
    a = MakeSite("site-a", "site-b");
    b = MakeSite("site-b", "site-a", limits);
    ASSERT_TRUE(b->Listen("127.0.0.1:0", accepted.Handler()).ok());
  }
  std::string address() const { return "127.0.0.1:" + std::to_string(b->listen_port()); }

  // Dials b, sends the first byte, and takes b's end once b hands it over.
  std::unique_ptr<Channel> Connect(std::unique_ptr<Channel>* dialed) {
    auto channel = a->Dial("site-b", address());
    EXPECT_TRUE(channel.ok()) << channel.status();
    if (!channel.ok()) return nullptr;
    *dialed = std::move(*channel);
    EXPECT_TRUE(WriteByte(**dialed).ok());
    auto server = accepted.Take();
    if (server != nullptr) {
      EXPECT_TRUE(ReadByte(*server).ok());
    }
    return server;
  }

  // Starts b with a 1 s idle timeout on `clock` and connects past the
  // HELLO: the channel the idle sweep judges (b's end) and a's end in
  // *dialed. An activity source that names no site counts b's sweeps.
  std::unique_ptr<Channel> ConnectWithOneSecondIdleTimeout(std::unique_ptr<Channel>* dialed) {
    ConnectionLimits limits;
    limits.idle_timeout = TimeDelta::Seconds(1);
    limits.clock = &clock;
    Start(limits);
    b->AddActivitySource([this] {
      sweeps.fetch_add(1);
      return std::vector<std::string>{};
    });
    auto server = Connect(dialed);
    if (server != nullptr) server->EndHandshake();
    return server;
  }

  // Moves the clock forward by `d` between two sweeps. A sweep reads the
  // clock, calls the sources, then reads the sites' activity and judges.
  // Before the advance: the sweep that makes the second call from now on
  // has read the clock before the advance and sees what the test did up to
  // here. After it: the sweep that makes the second call has read the
  // advanced clock, and the third call comes after its judgments.
  void AdvanceAndSweep(TimeDelta d) {
    uint64_t seen = sweeps.load();
    ASSERT_TRUE(Eventually([&] { return sweeps.load() >= seen + 2; }));
    clock.Advance(d);
    seen = sweeps.load();
    ASSERT_TRUE(Eventually([&] { return sweeps.load() >= seen + 3; }));
  }

  void TearDown() override {
    if (a) a->Shutdown();
    if (b) b->Shutdown();
  }

  FakeClock clock;  // before a and b, which read it until they are destroyed
  std::atomic<uint64_t> sweeps{0};
  AcceptedChannels accepted;
  std::unique_ptr<Transport> a, b;
};

// A peer that completes TLS and then sends nothing gets no thread and is
// closed at the handshake deadline.
TEST_F(TcpTlsLimitsTest, SilentPeerAfterTlsIsClosedAtTheDeadlineAndNeverHandedOver) {
  ConnectionLimits limits;
  limits.handshake_timeout = TimeDelta::Milliseconds(300);
  Start(limits);
  auto dialed = a->Dial("site-b", address());
  ASSERT_TRUE(dialed.ok()) << dialed.status();
  EXPECT_FALSE(ReadByte(**dialed).ok());
  EXPECT_EQ(accepted.size(), 0u);
  EXPECT_TRUE(Eventually([&] { return b->connection_counters().handshakes_timed_out == 1; }));
  EXPECT_TRUE(Eventually([&] { return b->connection_counters().pending_handshakes == 0; }));
}

// The deadline covers the HELLO too: a channel handed over on its first
// bytes whose server never calls EndHandshake is aborted at it.
TEST_F(TcpTlsLimitsTest, ChannelWithoutEndHandshakeIsAbortedAtTheDeadline) {
  ConnectionLimits limits;
  limits.handshake_timeout = TimeDelta::Milliseconds(300);
  Start(limits);
  std::unique_ptr<Channel> dialed;
  auto server = Connect(&dialed);
  ASSERT_NE(server, nullptr);
  EXPECT_EQ(b->connection_counters().pending_handshakes, 1u);
  EXPECT_FALSE(ReadByte(*server).ok());
  EXPECT_EQ(b->connection_counters().handshakes_timed_out, 1u);
  server.reset();
  EXPECT_EQ(b->connection_counters().pending_handshakes, 0u);
}

// A peer that accepts TCP and never answers TLS (hung, stopped, or a
// firewall that completes the handshake): the dial fails at the handshake
// deadline, every time, and the transport then dials a real peer. The
// watchdog that ends such a handshake once removed its entry twice, and the
// daemon died of SIGSEGV about 10 s after a peer hung.
TEST(TcpTlsDialTest, PeerThatNeverAnswersTlsFailsTheDialAtTheDeadlineAndTheTransportLivesOn) {
  ConnectionLimits limits;
  limits.handshake_timeout = TimeDelta::Milliseconds(300);
  auto a = MakeSite("site-a", "site-b", limits);

  int mute = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(mute, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(::listen(mute, 16), 0);  // the kernel accepts; nobody answers
  socklen_t len = sizeof addr;
  ASSERT_EQ(::getsockname(mute, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  const std::string mute_address = "127.0.0.1:" + std::to_string(ntohs(addr.sin_port));

  for (int i = 0; i < 3; ++i) {
    auto dialed = a->Dial("site-b", mute_address);
    ASSERT_FALSE(dialed.ok());
    EXPECT_NE(dialed.status().message().find("TLS handshake"), absl::string_view::npos)
        << dialed.status();
  }
  ::close(mute);

  auto b = MakeSite("site-b", "site-a");
  AcceptedChannels accepted;
  ASSERT_TRUE(b->Listen("127.0.0.1:0", accepted.Handler()).ok());
  auto dialed = a->Dial("site-b", "127.0.0.1:" + std::to_string(b->listen_port()));
  EXPECT_TRUE(dialed.ok()) << dialed.status();
  a->Shutdown();
  b->Shutdown();
}

TEST_F(TcpTlsLimitsTest, PendingHandshakesFromOneAddressAreCapped) {
  ConnectionLimits limits;
  limits.max_pending_handshakes_per_address = 2;
  Start(limits);
  std::vector<int> fds;
  for (int i = 0; i < 3; ++i) fds.push_back(ConnectTcp(b->listen_port()));
  EXPECT_TRUE(
      Eventually([&] { return b->connection_counters().refused_too_many_from_address == 1; }));
  EXPECT_EQ(b->connection_counters().pending_handshakes, 2u);
  // The refused one was closed at once: it reads EOF.
  char byte;
  EXPECT_EQ(::recv(fds[2], &byte, 1, 0), 0);
  for (int fd : fds) ::close(fd);
  EXPECT_TRUE(Eventually([&] { return b->connection_counters().pending_handshakes == 0; }));
  // Room again: a real peer gets through.
  std::unique_ptr<Channel> dialed;
  EXPECT_NE(Connect(&dialed), nullptr);
}

TEST_F(TcpTlsLimitsTest, PendingHandshakesInTotalAreCapped) {
  ConnectionLimits limits;
  limits.max_pending_handshakes = 1;
  Start(limits);
  int first = ConnectTcp(b->listen_port());
  int second = ConnectTcp(b->listen_port());
  EXPECT_TRUE(Eventually([&] { return b->connection_counters().refused_too_many_pending == 1; }));
  char byte;
  EXPECT_EQ(::recv(second, &byte, 1, 0), 0);
  ::close(first);
  ::close(second);
}

TEST_F(TcpTlsLimitsTest, ConnectionsPerPeerAreCapped) {
  ConnectionLimits limits;
  limits.max_connections_per_peer = 1;
  Start(limits);
  std::unique_ptr<Channel> dialed;
  auto server = Connect(&dialed);
  ASSERT_NE(server, nullptr);
  server->EndHandshake();

  // TLS 1.3 finishes the client's side first; the refusal shows on a read.
  auto second = a->Dial("site-b", address());
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_FALSE(ReadByte(**second).ok());
  EXPECT_EQ(b->connection_counters().refused_too_many_for_peer, 1u);
  EXPECT_EQ(accepted.size(), 0u);

  server.reset();
  std::unique_ptr<Channel> third;
  EXPECT_NE(Connect(&third), nullptr);
}

TEST_F(TcpTlsLimitsTest, IdleChannelIsClosedAndABusyOneIsNot) {
  std::unique_ptr<Channel> dialed;
  auto server = ConnectWithOneSecondIdleTimeout(&dialed);
  ASSERT_NE(server, nullptr);
  // Traffic in either direction keeps it: a round trip every half idle
  // timeout, four times, spans twice the idle timeout.
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(WriteByte(*dialed).ok());
    ASSERT_TRUE(ReadByte(*server).ok()) << "round trip " << i;
    AdvanceAndSweep(TimeDelta::Milliseconds(500));
  }
  EXPECT_EQ(b->connection_counters().idle_closed, 0u);
  // Then nothing for the idle timeout: closed.
  AdvanceAndSweep(TimeDelta::Seconds(1));
  EXPECT_FALSE(ReadByte(*server).ok());
  EXPECT_EQ(b->connection_counters().idle_closed, 1u);
  EXPECT_FALSE(ReadByte(*dialed).ok());
}

TEST_F(TcpTlsLimitsTest, AChannelKeptWhenIdleOutlivesTheIdleTimeout) {
  std::unique_ptr<Channel> dialed;
  auto server = ConnectWithOneSecondIdleTimeout(&dialed);
  ASSERT_NE(server, nullptr);
  server->KeepWhenIdle();
  // Silent for three idle timeouts, judged by a sweep after each.
  for (int i = 0; i < 3; ++i) AdvanceAndSweep(TimeDelta::Seconds(1));
  ASSERT_TRUE(WriteByte(*dialed).ok());
  EXPECT_TRUE(ReadByte(*server).ok());
  EXPECT_EQ(b->connection_counters().idle_closed, 0u);
}

TEST_F(TcpTlsLimitsTest, ASiteAnotherTransportIsActiveWithIsNotIdle) {
  std::unique_ptr<Channel> dialed;
  auto server = ConnectWithOneSecondIdleTimeout(&dialed);
  ASSERT_NE(server, nullptr);
  const std::string site = server->peer_site();
  const uint64_t source =
      b->AddActivitySource([site] { return std::vector<std::string>{site}; });
  // Silent on this transport for three idle timeouts, busy on the other.
  for (int i = 0; i < 3; ++i) AdvanceAndSweep(TimeDelta::Seconds(1));
  ASSERT_TRUE(WriteByte(*dialed).ok());
  EXPECT_TRUE(ReadByte(*server).ok());
  EXPECT_EQ(b->connection_counters().idle_closed, 0u);
  // Once the other transport lets go, the idle timeout applies again.
  b->RemoveActivitySource(source);
  AdvanceAndSweep(TimeDelta::Seconds(1));
  EXPECT_FALSE(ReadByte(*server).ok());
  EXPECT_EQ(b->connection_counters().idle_closed, 1u);
}

}  // namespace
}  // namespace longhaul::transport
