// Loopback tests of the tcp transport's channel queries.

#include <gtest/gtest.h>

#include <cstdlib>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "daemon/transport/transport.h"

namespace longhaul::transport {
namespace {

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

std::unique_ptr<Transport> MakeSite(const std::string& name, const std::string& peer) {
  const std::string d = PkiDir();
  TlsIdentity identity{d + "/ca.pem", d + "/" + name + ".pem", d + "/" + name + ".key", name, {peer}};
  TcpTuning tuning;
  tuning.socket_buffer_bytes = 1 << 20;
  tuning.congestion_control = "";
  return *MakeTcpTlsTransport(identity, tuning);
}

// Polls (real time, bounded) until `done`; never to judge a speed.
template <typename F>
bool Eventually(F done) {
  for (int i = 0; i < 2000 && !done(); ++i) absl::SleepFor(absl::Milliseconds(5));
  return done();
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

}  // namespace
}  // namespace longhaul::transport
