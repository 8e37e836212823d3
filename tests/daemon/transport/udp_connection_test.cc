// UdpConnection's state machine (proto/UDP.md) between two connections on a
// FakeClock. Each connection owns one end of an AF_UNIX datagram socket pair;
// a Relay carries datagrams between the other ends and lets a test drop,
// hold, duplicate, garble or forge them. Time moves only when a test advances
// the clock, so a timer (ACK delay, PTO, idle timeout) fires exactly when a
// test says; the waits below are condition waits for the I/O threads.

#include "daemon/transport/udp_connection.h"

#include <gtest/gtest.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/clock.h"
#include "congestion/controller.h"
#include "daemon/transport/udp_crypto.h"
#include "daemon/transport/udp_packet.h"
#include "tests/test_tools/eventually.h"

namespace longhaul::transport::udp {
namespace {

using ::longhaul::testing::Eventually;

using Datagram = std::vector<uint8_t>;

constexpr uint64_t kIdA = 0xA1A1;
constexpr uint64_t kIdB = 0xB2B2;
constexpr size_t kMaxDatagram = 1200;

// A fixed window, unpaced unless a test sets a pacing rate, that counts what the connection
// reports to it. Thread-safe: the counts are read, and the rate set, by the test thread.
class CountingController final : public congestion::Controller {
 public:
  void OnPacketSent(Timestamp, uint64_t, ByteCount, ByteCount, bool) override {
    sent_.fetch_add(1);
  }
  void OnCongestionEvent(Timestamp, ByteCount, absl::Span<const congestion::AckedPacket> acked,
                         absl::Span<const congestion::LostPacket> lost) override {
    acked_.fetch_add(acked.size());
    lost_.fetch_add(lost.size());
  }
  void OnAppLimited() override {}
  ByteCount cwnd() const override { return 1 << 20; }
  Bandwidth pacing_rate() const override { return Bandwidth::BitsPerSecond(pacing_bps_.load()); }
  ByteCount send_quantum() const override { return 64 << 10; }
  congestion::ControllerState DebugState() const override { return {}; }

  void set_pacing_rate(Bandwidth rate) { pacing_bps_.store(rate.ToBitsPerSecond()); }

  uint64_t sent() const { return sent_.load(); }
  uint64_t acked() const { return acked_.load(); }
  uint64_t lost() const { return lost_.load(); }

 private:
  std::atomic<uint64_t> sent_{0};
  std::atomic<uint64_t> acked_{0};
  std::atomic<uint64_t> lost_{0};
  std::atomic<int64_t> pacing_bps_{Bandwidth::Infinite().ToBitsPerSecond()};
};

enum Direction { kAToB = 0, kBToA = 1 };

// Carries datagrams between the test's ends of the two socket pairs on its
// own thread. For each datagram the filter (if any) fills `out` with what to
// deliver instead; without a filter a datagram is forwarded as it is.
// Thread-safe.
class Relay {
 public:
  using Filter =
      std::function<void(Direction, uint64_t index, const Datagram&, std::vector<Datagram>* out)>;

  Relay(int a_end, int b_end) : fds_{a_end, b_end}, thread_([this] { Run(); }) {}
  ~Relay() {
    stop_.store(true);
    thread_.join();
  }

  void SetFilter(Filter filter) {
    absl::MutexLock lock(&mu_);
    filter_ = std::move(filter);
  }
  // Delivers `datagram` as if it had come from the sender of `direction`.
  void Inject(Direction direction, const Datagram& datagram) {
    [[maybe_unused]] ssize_t n = ::send(fds_[1 - direction], datagram.data(), datagram.size(), 0);
  }
  // Datagrams the relay has taken from the sender of `direction`.
  uint64_t seen(Direction direction) const {
    absl::MutexLock lock(&mu_);
    return seen_[direction];
  }

 private:
  void Run() {
    Datagram buffer(65536);
    while (!stop_.load()) {
      struct pollfd fds[2] = {{fds_[0], POLLIN, 0}, {fds_[1], POLLIN, 0}};
      if (::poll(fds, 2, 5) <= 0) continue;
      for (int d = 0; d < 2; ++d) {
        if (!(fds[d].revents & POLLIN)) continue;
        const ssize_t n = ::recv(fds_[d], buffer.data(), buffer.size(), MSG_DONTWAIT);
        if (n < 0) continue;
        Datagram datagram(buffer.begin(), buffer.begin() + n);
        std::vector<Datagram> out;
        {
          absl::MutexLock lock(&mu_);
          const uint64_t index = seen_[d]++;
          if (filter_) {
            filter_(static_cast<Direction>(d), index, datagram, &out);
          } else {
            out.push_back(std::move(datagram));
          }
        }
        for (const Datagram& o : out) Inject(static_cast<Direction>(d), o);
      }
    }
  }

  const int fds_[2];
  mutable absl::Mutex mu_;
  Filter filter_ ABSL_GUARDED_BY(mu_);
  uint64_t seen_[2] ABSL_GUARDED_BY(mu_) = {0, 0};
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

DirectionKeys Keys(uint8_t seed) {
  DirectionKeys keys;
  for (size_t i = 0; i < keys.key.size(); ++i) keys.key[i] = static_cast<uint8_t>(seed + i);
  for (size_t i = 0; i < keys.iv.size(); ++i) keys.iv[i] = static_cast<uint8_t>(seed * 3 + i);
  return keys;
}

std::string Pattern(size_t n, uint8_t seed) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>((i * 7 + seed) & 0xff);
  return s;
}

absl::Status WriteString(Channel& channel, const std::string& s) {
  const absl::Span<const uint8_t> part(reinterpret_cast<const uint8_t*>(s.data()), s.size());
  return channel.Write({&part, 1});
}

absl::StatusOr<std::string> ReadString(Channel& channel, size_t n) {
  std::string s(n, '\0');
  absl::Status status =
      channel.ReadExactly(absl::MakeSpan(reinterpret_cast<uint8_t*>(s.data()), n));
  if (!status.ok()) return status;
  return s;
}

class UdpConnectionStateTest : public ::testing::Test {
 protected:
  void SetUp() override {
    int a_pair[2], b_pair[2];
    ASSERT_EQ(::socketpair(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0, a_pair), 0);
    ASSERT_EQ(::socketpair(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0, b_pair), 0);
    relay_ends_[0] = a_pair[1];
    relay_ends_[1] = b_pair[1];
    relay = std::make_unique<Relay>(a_pair[1], b_pair[1]);
    a = Make(a_pair[0], kIdA, kIdB, Keys(1), Keys(2), "site-b", &a_cc);
    b = Make(b_pair[0], kIdB, kIdA, Keys(2), Keys(1), "site-a", &b_cc);
  }

  void TearDown() override {
    // Abort first: a connection that closes cleanly lingers until its data is acknowledged,
    // which on a clock that stands still may be never.
    if (a) a->Abort();
    if (b) b->Abort();
    a.reset();
    b.reset();
    relay.reset();
    ::close(relay_ends_[0]);
    ::close(relay_ends_[1]);
  }

  std::unique_ptr<UdpConnection> Make(int fd, uint64_t local_id, uint64_t peer_id,
                                      DirectionKeys send, DirectionKeys receive,
                                      const std::string& peer_site, CountingController** cc,
                                      std::function<void()> on_destroy = nullptr) {
    UdpConnectionParams params;
    params.on_destroy = std::move(on_destroy);
    params.fd = fd;
    params.local_connection_id = local_id;
    params.peer_connection_id = peer_id;
    params.send_keys = send;
    params.receive_keys = receive;
    params.max_datagram = kMaxDatagram;
    params.window_bytes = 1 << 20;
    params.peer_window_bytes = 1 << 20;
    params.gso = false;  // AF_UNIX has no UDP_SEGMENT
    params.peer_site = peer_site;
    params.peer_address = "test";
    auto controller = std::make_unique<CountingController>();
    *cc = controller.get();
    params.controller = std::move(controller);
    params.controller_mu = std::make_shared<absl::Mutex>();
    params.congestion_control_name = "counting";
    params.clock = &clock;
    params.idle_timeout = kIdleTimeout;
    return std::make_unique<UdpConnection>(std::move(params));
  }

  // Advances the clock by `step` until `done` holds (about ten seconds of real time at most).
  template <typename F>
  bool AdvanceUntil(F done, TimeDelta step = TimeDelta::Milliseconds(1)) {
    for (int i = 0; i < 2000 && !done(); ++i) {
      clock.Advance(step);
      absl::SleepFor(absl::Milliseconds(5));
    }
    return done();
  }

  // A packet from b to a, sealed with b's keys under packet number `pn`, carrying `payload`.
  static Datagram SealFromB(uint64_t pn, const std::vector<uint8_t>& payload) {
    PacketSealer sealer(Keys(2), kDefaultKeyUpdateInterval);
    Datagram packet(kHeaderSize + payload.size() + kAeadTagSize);
    std::copy(payload.begin(), payload.end(), packet.begin() + kHeaderSize);
    auto length = sealer.Seal(kIdA, pn, absl::MakeSpan(packet), payload.size());
    EXPECT_TRUE(length.ok()) << length.status();
    packet.resize(length.ok() ? *length : 0);
    return packet;
  }

  static constexpr TimeDelta kIdleTimeout = TimeDelta::Seconds(30);

  FakeClock clock;
  std::vector<Datagram> held;  // by a test's relay filter, under the relay's lock
  int relay_ends_[2] = {-1, -1};
  std::unique_ptr<Relay> relay;
  CountingController* a_cc = nullptr;
  CountingController* b_cc = nullptr;
  std::unique_ptr<UdpConnection> a, b;
};

TEST_F(UdpConnectionStateTest, EstablishedConnectionCarriesBytesBothWays) {
  const std::string to_b = Pattern(3000, 1), to_a = Pattern(500, 2);
  ASSERT_TRUE(WriteString(*a, to_b).ok());
  ASSERT_TRUE(WriteString(*b, to_a).ok());
  EXPECT_EQ(ReadString(*b, to_b.size()).value_or(""), to_b);
  EXPECT_EQ(ReadString(*a, to_a.size()).value_or(""), to_a);
  // Every data packet is acknowledged once the receiver's ACK delay has passed.
  EXPECT_TRUE(AdvanceUntil([&] { return a_cc->acked() == a_cc->sent(); }));
  EXPECT_EQ(a_cc->lost(), 0u);
  EXPECT_EQ(a->counters().retransmitted_bytes, 0u);
  EXPECT_EQ(a->Stats().congestion_control, "counting");
}

// The transport's registry hook (on_destroy) may find another thread
// aborting the connection while it waits for the registry's lock (the
// transport's Shutdown or ReloadTrust): that Abort must not write to a
// descriptor the connection has given back, which by then may be anyone's.
TEST_F(UdpConnectionStateTest,
       AnAbortWhileTheRegistryForgetsTheConnectionWritesNoClosedDescriptor) {
  int pair[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0, pair), 0);
  UdpConnection* raw = nullptr;
  uint64_t stray_wakes = 0;
  auto on_destroy = [&] {
    // Descriptors opened now take the lowest numbers free, among them any
    // the connection has closed already.
    std::vector<int> fds;
    for (int i = 0; i < 16; ++i) fds.push_back(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
    raw->Abort();  // as the transport does, under the lock the hook waits for
    for (int fd : fds) {
      uint64_t n = 0;
      if (::read(fd, &n, sizeof n) == sizeof n) stray_wakes += n;
      ::close(fd);
    }
  };
  CountingController* cc = nullptr;
  std::unique_ptr<UdpConnection> c =
      Make(pair[0], 0xC3C3, 0xD4D4, Keys(3), Keys(4), "site-c", &cc, on_destroy);
  raw = c.get();
  c->Abort();  // no linger
  c.reset();
  ::close(pair[1]);
  EXPECT_EQ(stray_wakes, 0u);
}

TEST_F(UdpConnectionStateTest, ReorderedAndDuplicatedDatagramsAreDeliveredOnceInOrder) {
  relay->SetFilter(
      [&](Direction d, uint64_t index, const Datagram& datagram, std::vector<Datagram>* out) {
        if (d == kAToB && index == 0) {
          held.push_back(datagram);  // arrives after the ones behind it
          return;
        }
        out->push_back(datagram);
        if (d == kAToB && index == 2) out->push_back(datagram);
        if (d == kAToB && index == 4) {
          out->insert(out->end(), held.begin(), held.end());
          held.clear();
        }
      });
  const std::string data = Pattern(10000, 3);
  ASSERT_TRUE(WriteString(*a, data).ok());
  EXPECT_EQ(ReadString(*b, data.size()).value_or(""), data);
  EXPECT_TRUE(Eventually([&] { return b->counters().duplicates >= 1; }));
  // What follows is the next bytes of the stream, not a second copy of earlier ones.
  const std::string next = Pattern(100, 4);
  ASSERT_TRUE(WriteString(*a, next).ok());
  EXPECT_EQ(ReadString(*b, next.size()).value_or(""), next);
}

TEST_F(UdpConnectionStateTest, LostDatagramIsRetransmittedAfterTheProbeTimeout) {
  relay->SetFilter(
      [](Direction d, uint64_t index, const Datagram& datagram, std::vector<Datagram>* out) {
        if (d == kAToB && index == 0) return;  // lost
        out->push_back(datagram);
      });
  const std::string data = Pattern(100, 5);
  ASSERT_TRUE(WriteString(*a, data).ok());
  ASSERT_TRUE(Eventually([&] { return relay->seen(kAToB) == 1; }));
  // With the clock standing still nothing is resent.
  EXPECT_EQ(b->counters().datagrams_received, 0u);
  EXPECT_EQ(a->counters().retransmitted_bytes, 0u);
  clock.Advance(TimeDelta::Seconds(1));  // past the PTO, short of the dead-peer timeout
  EXPECT_EQ(ReadString(*b, data.size()).value_or(""), data);
  EXPECT_TRUE(Eventually([&] { return a->counters().retransmitted_bytes >= data.size(); }));
}

TEST_F(UdpConnectionStateTest, DuplicateAndStaleAcksAreIgnored) {
  const std::string data = Pattern(3000, 6);
  ASSERT_TRUE(WriteString(*a, data).ok());
  ASSERT_EQ(ReadString(*b, data.size()).value_or(""), data);
  ASSERT_TRUE(AdvanceUntil([&] { return a_cc->acked() == a_cc->sent(); }));
  const uint64_t acked = a_cc->acked();

  // A fresh packet that acknowledges a's packet 1 again, delivered twice: the first copy is
  // read and changes nothing, the second is a duplicate packet.
  AckFrame ack;
  ack.range_count = 1;
  ack.ranges[0] = {1, 1};
  std::vector<uint8_t> payload(AckFrameSize(ack));
  WriteAck(ack, absl::MakeSpan(payload));
  const Datagram stale = SealFromB(uint64_t{1} << 40, payload);
  relay->Inject(kBToA, stale);
  relay->Inject(kBToA, stale);
  EXPECT_TRUE(Eventually([&] { return a->counters().duplicates == 1; }));
  EXPECT_EQ(a->counters().auth_failures + a->counters().malformed, 0u);
  EXPECT_EQ(a_cc->acked(), acked);
  EXPECT_EQ(a_cc->lost(), 0u);
  // The connection carries on.
  const std::string next = Pattern(200, 7);
  ASSERT_TRUE(WriteString(*a, next).ok());
  EXPECT_EQ(ReadString(*b, next.size()).value_or(""), next);
}

// A controller's pacing rate may collapse for a moment (Bbr3 restarts its bandwidth estimate at
// what a round of heavy loss delivered) and recover once its flows' ACKs bring new samples. A
// quantum sent at the collapsed rate must not hold the flow back for the minutes that rate would
// take: nothing is in flight then, so no timer fails the flow and no ACK wakes it.
TEST_F(UdpConnectionStateTest, FlowResumesAtOnceWhenItsPacingRateRecovers) {
  // The controller's quantum (64 KiB, 55 datagrams) goes out at once; at 100 bytes/s the next
  // would be due 11 minutes later.
  a_cc->set_pacing_rate(Bandwidth::BytesPerSecond(100));
  const std::string data = Pattern(200 * kMaxDatagram, 11);
  ASSERT_TRUE(WriteString(*a, data).ok());
  ASSERT_TRUE(Eventually([&] { return a_cc->sent() >= 55; }));
  ASSERT_LT(a_cc->sent(), 200u);

  a_cc->set_pacing_rate(Bandwidth::MbitsPerSecond(100));
  // The rest goes out within AdvanceUntil's two (fake) seconds, not 11 minutes later. The
  // connection reports each stream packet to its controller, so this needs no read on b, which
  // would block for good if the data never came.
  ASSERT_TRUE(AdvanceUntil([&] { return a_cc->sent() >= 200; })) << a_cc->sent() << " sent";
  EXPECT_EQ(ReadString(*b, data.size()).value_or(""), data);
}

TEST_F(UdpConnectionStateTest, SilentPeerIsClosedAtTheIdleTimeout) {
  relay->SetFilter([](Direction, uint64_t, const Datagram&, std::vector<Datagram>*) {});
  clock.Advance(kIdleTimeout + TimeDelta::Seconds(1));
  auto read = ReadString(*a, 1);
  EXPECT_EQ(read.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(read.status().message().find("no packets from site-b"), std::string::npos)
      << read.status();
  read = ReadString(*b, 1);
  EXPECT_NE(read.status().message().find("no packets from site-a"), std::string::npos)
      << read.status();
}

TEST_F(UdpConnectionStateTest, AbortReachesThePeer) {
  const std::string data = Pattern(100, 8);
  ASSERT_TRUE(WriteString(*a, data).ok());
  ASSERT_EQ(ReadString(*b, data.size()).value_or(""), data);
  a->Abort();
  EXPECT_EQ(WriteString(*a, "x").code(), absl::StatusCode::kCancelled);
  auto read = ReadString(*b, 1);
  EXPECT_EQ(read.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(read.status().message().find("closed the connection: aborted"), std::string::npos)
      << read.status();
}

TEST_F(UdpConnectionStateTest, CloseAfterEverythingIsAcknowledgedReachesThePeer) {
  const std::string data = Pattern(100, 9);
  ASSERT_TRUE(WriteString(*a, data).ok());
  ASSERT_EQ(ReadString(*b, data.size()).value_or(""), data);
  ASSERT_TRUE(AdvanceUntil([&] { return a_cc->acked() == a_cc->sent(); }));
  a.reset();  // nothing left to linger for
  auto read = ReadString(*b, 1);
  EXPECT_EQ(read.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(read.status().message().find("closed the connection"), std::string::npos)
      << read.status();
  EXPECT_EQ(read.status().message().find("aborted"), std::string::npos) << read.status();
}

TEST_F(UdpConnectionStateTest, GarbledAndForgedDatagramsAreDroppedWithoutStateChange) {
  relay->SetFilter(
      [](Direction d, uint64_t index, const Datagram& datagram, std::vector<Datagram>* out) {
        if (d == kAToB && index == 0) {
          // A copy with one ciphertext bit flipped goes first; then the real one.
          Datagram garbled = datagram;
          garbled[kHeaderSize + 20] ^= 0x40;
          out->push_back(std::move(garbled));
        }
        out->push_back(datagram);
      });
  // Garbage, and a well-formed header naming another connection.
  relay->Inject(kAToB, Datagram(40, 0xee));
  Datagram other(kHeaderSize + kAeadTagSize + 8, 0);
  WriteHeader({.connection_id = 0x5555, .packet_number = 1}, absl::MakeSpan(other));
  relay->Inject(kAToB, other);
  ASSERT_TRUE(Eventually([&] { return b->counters().malformed == 2; }));

  const std::string data = Pattern(2000, 10);
  ASSERT_TRUE(WriteString(*a, data).ok());
  EXPECT_EQ(ReadString(*b, data.size()).value_or(""), data);
  const UdpConnection::Counters counters = b->counters();
  EXPECT_EQ(counters.auth_failures, 1u);
  EXPECT_EQ(counters.malformed, 2u);
  // The garbled copy's packet number was not taken: the real packet was not a duplicate.
  EXPECT_EQ(counters.duplicates, 0u);
  EXPECT_EQ(a->counters().retransmitted_bytes, 0u);
}

}  // namespace
}  // namespace longhaul::transport::udp
