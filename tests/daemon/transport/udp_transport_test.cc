// Loopback tests of the udp transport: whole flows between two in-process
// "sites" (tcp transport for the key agreement, udp transport for the data),
// and single connections over a socketpair for the failure paths.

#include "daemon/transport/udp_transport.h"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <netinet/udp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <deque>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "congestion/bbr3.h"
#include "congestion/random.h"
#include "daemon/peer/messaging.h"
#include "daemon/peer/router.h"
#include "daemon/transport/udp_connection.h"
#include "daemon/wire/messaging.h"

namespace longhaul::transport {
namespace {

std::string PkiDir() {
  static const std::string dir = [] {
    char tmpl[] = "/tmp/udp_transport_test.XXXXXX";
    std::string d = mkdtemp(tmpl);
    std::string cmd = std::string("bash ") + LONGHAUL_PKI_SCRIPT + " " + d +
                      " site-a site-b >/dev/null 2>&1";
    EXPECT_EQ(std::system(cmd.c_str()), 0);
    return d;
  }();
  return dir;
}

// One daemon's transports and router, listening on loopback.
struct Site {
  Site(const std::string& name, const std::string& peer, const UdpOptions& options) : name(name) {
    const std::string d = PkiDir();
    TlsIdentity identity{d + "/ca.pem", d + "/" + name + ".pem", d + "/" + name + ".key", name, {peer}};
    TcpTuning tuning;
    tuning.congestion_control = "";
    tcp = *MakeTcpTlsTransport(identity, tuning);
    udp = *MakeUdpTransport(*tcp, options);
    router.Register(v1::Hello::UDP_HANDSHAKE,
                    [this](std::unique_ptr<Channel> c, const v1::Hello&) {
                      udp->AcceptHandshake(std::move(c));
                    });
    router.Register(v1::Hello::DATA, [this](std::unique_ptr<Channel> c, const v1::Hello&) {
      absl::MutexLock lock(&mu);
      accepted.push_back(std::move(c));
    });
    EXPECT_TRUE(tcp->Listen("127.0.0.1:0", [this](auto c) { router.Serve(std::move(c)); }).ok());
    EXPECT_TRUE(udp->Listen("127.0.0.1:0", [this](auto c) { router.Serve(std::move(c)); }).ok());
  }
  ~Site() {
    udp->Shutdown();
    tcp->Shutdown();
  }
  std::string address() const { return "127.0.0.1:" + std::to_string(tcp->listen_port()); }

  const std::string name;
  std::unique_ptr<Transport> tcp;
  std::unique_ptr<UdpTransport> udp;
  peer::PeerRouter router;
  // The next DATA channel dialed to this site, or null after 10 s.
  std::unique_ptr<Channel> NextAccepted() {
    absl::MutexLock lock(&mu);
    auto arrived = +[](std::deque<std::unique_ptr<Channel>>* q) { return !q->empty(); };
    if (!mu.AwaitWithTimeout(absl::Condition(arrived, &accepted), absl::Seconds(10))) {
      return nullptr;
    }
    std::unique_ptr<Channel> c = std::move(accepted.front());
    accepted.pop_front();
    return c;
  }

  absl::Mutex mu;
  std::deque<std::unique_ptr<Channel>> accepted ABSL_GUARDED_BY(mu);
};

std::vector<uint8_t> Pattern(size_t n, uint64_t seed) {
  std::vector<uint8_t> v(n);
  congestion::SplitMix64Random r(seed);
  for (size_t i = 0; i < n; i += 8) {
    uint64_t x = r.NextUint64();
    std::memcpy(&v[i], &x, std::min<size_t>(8, n - i));
  }
  return v;
}

// A DATA session dialed over udp from `from` to `to`, and the channel `to` accepted for it;
// either is null if that step failed.
struct DataSession {
  std::unique_ptr<Channel> dialed;
  std::unique_ptr<Channel> accepted;
};
DataSession DialData(Site& from, Site& to, const std::string& transfer_id) {
  v1::Hello hello;
  hello.set_role(v1::Hello::DATA);
  hello.set_transfer_id(transfer_id);
  auto dialed = peer::DialSession(*from.udp, to.name, to.address(), hello);
  EXPECT_TRUE(dialed.ok()) << dialed.status();
  if (!dialed.ok()) return {};
  return DataSession{std::move(*dialed), to.NextAccepted()};
}

// Dials b from a, moves `bytes` a -> b in 1 MiB writes and a short answer
// back, and returns the two channels' counters.
void MoveBytes(const UdpOptions& options, size_t bytes, udp::UdpConnection::Counters* sender,
               udp::UdpConnection::Counters* receiver) {
  Site a("site-a", "site-b", options);
  Site b("site-b", "site-a", options);
  DataSession session = DialData(a, b, "t1");
  std::unique_ptr<Channel>& dialed = session.dialed;
  std::unique_ptr<Channel>& accepted = session.accepted;
  ASSERT_NE(dialed, nullptr);
  ASSERT_NE(accepted, nullptr);
  EXPECT_EQ(accepted->peer_site(), "site-a");
  EXPECT_EQ(dialed->peer_site(), "site-b");

  const std::vector<uint8_t> data = Pattern(bytes, 7);
  std::thread writer([&] {
    for (size_t at = 0; at < data.size(); at += 1 << 20) {
      absl::Span<const uint8_t> part(&data[at], std::min<size_t>(1 << 20, data.size() - at));
      ASSERT_TRUE(dialed->Write({part}).ok());
    }
  });
  std::vector<uint8_t> got(bytes);
  // Uneven reads, to cross ring boundaries at odd offsets.
  for (size_t at = 0; at < got.size();) {
    size_t n = std::min<size_t>(got.size() - at, 777'777);
    ASSERT_TRUE(accepted->ReadExactly(absl::MakeSpan(&got[at], n)).ok());
    at += n;
  }
  writer.join();
  EXPECT_TRUE(got == data) << "received bytes differ";
  const uint8_t answer[3] = {'a', 'c', 'k'};
  ASSERT_TRUE(accepted->Write({absl::Span<const uint8_t>(answer)}).ok());
  uint8_t back[3];
  ASSERT_TRUE(dialed->ReadExactly(absl::MakeSpan(back)).ok());
  EXPECT_EQ(std::memcmp(back, answer, 3), 0);
  EXPECT_FALSE(dialed->Stats().congestion_control.empty());
  *sender = dynamic_cast<udp::UdpConnection&>(*dialed).counters();
  // The dialer closes; the listener then sees a clean close.
  dialed.reset();
  uint8_t more;
  absl::Status closed = accepted->ReadExactly(absl::MakeSpan(&more, 1));
  EXPECT_EQ(closed.code(), absl::StatusCode::kUnavailable) << closed;
  *receiver = dynamic_cast<udp::UdpConnection&>(*accepted).counters();
}

TEST(UdpTransportTest, Moves64MiBByteIdentical) {
  UdpOptions options;
  udp::UdpConnection::Counters s, r;
  MoveBytes(options, 64 << 20, &s, &r);
  EXPECT_GT(s.datagrams_sent, 64u << 20 >> 14);
  EXPECT_EQ(r.auth_failures, 0u);
  // Most stream bytes were decrypted straight to their place, many into the reader's buffer.
  EXPECT_GT(r.stream_bytes_placed, 32u << 20);
  EXPECT_GT(r.stream_bytes_placed_in_reader, 0u);
}

TEST(UdpTransportTest, Moves64MiBWithEvery50thDatagramDropped) {
  UdpOptions options;
  options.drop_every_nth_received_datagram = 50;
  udp::UdpConnection::Counters s, r;
  MoveBytes(options, 64 << 20, &s, &r);
  EXPECT_GT(r.dropped_for_test, 100u);
  EXPECT_GT(s.lost, 0u);
  EXPECT_GT(s.retransmitted_bytes, 0u);
  EXPECT_GT(r.stream_bytes_placed_in_reader, 0u);
}

TEST(UdpTransportTest, SmallDatagramsAndFrequentKeyUpdates) {
  UdpOptions options;
  options.max_datagram = 1200;
  options.key_update_interval = 1000;
  options.drop_every_nth_received_datagram = 97;
  options.coupled = false;
  udp::UdpConnection::Counters s, r;
  MoveBytes(options, 8 << 20, &s, &r);
  EXPECT_GT(s.key_updates_sent, 5u);
  EXPECT_GT(r.key_updates_received, 5u);
}

// site-b's tcp transport alone, without the udp plane: what a peer that
// speaks only tcp, or answers the key agreement its own way, listens with.
std::unique_ptr<Transport> TcpOnlySiteB() {
  const std::string d = PkiDir();
  TlsIdentity identity{d + "/ca.pem", d + "/site-b.pem", d + "/site-b.key", "site-b", {"site-a"}};
  TcpTuning tuning;
  tuning.congestion_control = "";
  return *MakeTcpTlsTransport(identity, tuning);
}

TEST(UdpTransportTest, DialToSiteWithoutUdpIsRefused) {
  UdpOptions options;
  Site a("site-a", "site-b", options);
  auto tcp_only = TcpOnlySiteB();
  peer::PeerRouter router;  // no UDP_HANDSHAKE role
  ASSERT_TRUE(tcp_only->Listen("127.0.0.1:0", [&](auto c) { router.Serve(std::move(c)); }).ok());
  auto dialed = a.udp->Dial("site-b", "127.0.0.1:" + std::to_string(tcp_only->listen_port()));
  EXPECT_FALSE(dialed.ok());
  tcp_only->Shutdown();
}

// A listener that answers the key agreement with a handshake past its
// ceiling is refused before the dialer reads the answer, naming the limit.
TEST(UdpTransportTest, AnOversizedHandshakeAnswerIsRefusedUnread) {
  UdpOptions options;
  Site a("site-a", "site-b", options);
  auto hostile = TcpOnlySiteB();
  peer::PeerRouter router;
  router.Register(v1::Hello::UDP_HANDSHAKE, [](std::unique_ptr<Channel> c, const v1::Hello&) {
    v1::UdpHandshake theirs;
    if (!wire::ReadProto(*c, wire::FrameType::kControl, 0, &theirs).ok()) return;
    v1::UdpHandshake answer;
    answer.set_error(std::string(size_t{1} << 20, 'x'));
    (void)wire::SendProto(*c, wire::FrameType::kControl, 0, answer);
  });
  ASSERT_TRUE(hostile->Listen("127.0.0.1:0", [&](auto c) { router.Serve(std::move(c)); }).ok());
  auto dialed = a.udp->Dial("site-b", "127.0.0.1:" + std::to_string(hostile->listen_port()));
  ASSERT_FALSE(dialed.ok());
  EXPECT_EQ(dialed.status().code(), absl::StatusCode::kInvalidArgument)
      << dialed.status().ToString().substr(0, 200);
  EXPECT_NE(dialed.status().message().find("limit of 16384 bytes"), std::string::npos)
      << dialed.status().ToString().substr(0, 200);
  hostile->Shutdown();
}

// The state of the congestion model behind a udp channel, e.g. "Startup".
std::string CongestionState(const Channel& channel) { return channel.Stats().congestion_state; }

// Coupled flows to one site share one model while any of them is open; once the last has
// closed, the next flow starts a fresh model in Startup instead of inheriting a rate (and a
// view of competing traffic) learned from a transfer that is over.
TEST(UdpTransportTest, CoupledFlowsShareAModelUntilTheLastCloses) {
  UdpOptions options;
  Site a("site-a", "site-b", options);
  Site b("site-b", "site-a", options);
  DataSession first = DialData(a, b, "t1");
  ASSERT_NE(first.dialed, nullptr);
  ASSERT_NE(first.accepted, nullptr);
  EXPECT_EQ(CongestionState(*first.dialed), "Startup");

  // Enough data for the model to fill the loopback pipe and leave Startup.
  const std::vector<uint8_t> data = Pattern(8 << 20, 3);
  std::vector<uint8_t> got(data.size());
  for (int i = 0; i < 64 && CongestionState(*first.dialed) == "Startup"; ++i) {
    std::thread writer([&] { ASSERT_TRUE(first.dialed->Write({absl::MakeConstSpan(data)}).ok()); });
    ASSERT_TRUE(first.accepted->ReadExactly(absl::MakeSpan(got)).ok());
    writer.join();
  }
  ASSERT_NE(CongestionState(*first.dialed), "Startup")
      << "512 MiB did not take the model out of Startup";

  // A second flow while the first is open joins its model.
  DataSession second = DialData(a, b, "t2");
  ASSERT_NE(second.dialed, nullptr);
  EXPECT_NE(CongestionState(*second.dialed), "Startup");
  EXPECT_EQ(second.dialed->Stats().congestion_control, "bbr3-coupled");

  first.dialed.reset();
  second.dialed.reset();
  DataSession third = DialData(a, b, "t3");
  ASSERT_NE(third.dialed, nullptr);
  EXPECT_EQ(CongestionState(*third.dialed), "Startup");
}

// Two connections over a socketpair, built directly.
struct Pair {
  explicit Pair(bool same_keys, int io_thread_nice = 0, uint32_t b_drops_every_nth = 0)
      : io_thread_nice(io_thread_nice) {
    int fds[2];
    EXPECT_EQ(socketpair(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0, fds), 0);
    udp::DirectionKeys k1, k2;
    k1.key[0] = 1;
    k2.key[0] = 2;
    udp::DirectionKeys k1_seen_by_b = k1;
    if (!same_keys) k1_seen_by_b.key[1] = 9;
    a = Make(fds[0], 11, 22, k1, k2);
    b = Make(fds[1], 22, 11, k2, k1_seen_by_b, b_drops_every_nth);
  }
  std::unique_ptr<udp::UdpConnection> Make(int fd, uint64_t local, uint64_t peer,
                                           const udp::DirectionKeys& send,
                                           const udp::DirectionKeys& receive,
                                           uint32_t drops_every_nth = 0) {
    udp::UdpConnectionParams p;
    p.fd = fd;
    p.local_connection_id = local;
    p.peer_connection_id = peer;
    p.send_keys = send;
    p.receive_keys = receive;
    p.max_datagram = 1400;
    p.peer_site = "peer";
    p.peer_address = "socketpair";
    p.controller_mu = std::make_shared<absl::Mutex>();
    p.controller = congestion::CreateBbr3({}, random, RealClock::Get().Now());
    p.congestion_control_name = "bbr3";
    p.idle_timeout = TimeDelta::Seconds(5);
    p.io_thread_nice = io_thread_nice;
    p.drop_every_nth_received = drops_every_nth;
    p.gso = false;  // a unix socket would carry a GSO batch as one datagram
    return std::make_unique<udp::UdpConnection>(std::move(p));
  }
  int io_thread_nice;
  congestion::SplitMix64Random random{1};
  std::unique_ptr<udp::UdpConnection> a, b;
};

TEST(UdpConnectionTest, PacketsFailingAuthenticationAreDroppedAndCounted) {
  Pair pair(/*same_keys=*/false);
  const uint8_t data[100] = {1, 2, 3};
  ASSERT_TRUE(pair.a->Write({absl::Span<const uint8_t>(data)}).ok());
  for (int i = 0; i < 100 && pair.b->counters().auth_failures == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_GT(pair.b->counters().auth_failures, 0u);
  EXPECT_EQ(pair.b->counters().duplicates, 0u);
  pair.a->Abort();
  pair.b->Abort();
}

TEST(UdpConnectionTest, AbortFailsABlockedRead) {
  Pair pair(/*same_keys=*/true);
  std::thread aborter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    pair.b->Abort();
  });
  uint8_t byte;
  absl::Status s = pair.b->ReadExactly(absl::MakeSpan(&byte, 1));
  aborter.join();
  EXPECT_EQ(s.code(), absl::StatusCode::kCancelled);
  // The peer hears about it: its read fails rather than hanging.
  absl::Status peer = pair.a->ReadExactly(absl::MakeSpan(&byte, 1));
  EXPECT_EQ(peer.code(), absl::StatusCode::kUnavailable) << peer;
}

TEST(UdpConnectionTest, LongReadsFillTheCallersBufferUnderLossAndReordering) {
  // b loses every 7th datagram, so retransmissions arrive after later data: a lent buffer
  // takes over ranges that came early (out of order) from the ring, and gets the rest in place.
  Pair pair(/*same_keys=*/true, /*io_thread_nice=*/0, /*b_drops_every_nth=*/7);
  const std::vector<uint8_t> data = Pattern(12 << 20, 3);
  std::thread writer([&] {
    for (size_t at = 0; at < data.size(); at += 300'000) {
      absl::Span<const uint8_t> part(&data[at], std::min<size_t>(300'000, data.size() - at));
      absl::Status w = pair.a->Write({part});
      ASSERT_TRUE(w.ok()) << w;
    }
  });
  std::vector<uint8_t> got(data.size());
  // Short reads through the ring, long ones lent to the I/O thread, one longer than half the
  // 4 MiB window (lent in two halves).
  const size_t sizes[] = {5, 100 << 10, 3 << 20, 16 << 10, (16 << 10) - 1, 1 << 20, 777'777};
  size_t at = 0;
  for (size_t i = 0; at < got.size(); ++i) {
    const size_t n = std::min(got.size() - at, sizes[i % std::size(sizes)]);
    absl::Status s = pair.b->ReadExactly(absl::MakeSpan(&got[at], n));
    ASSERT_TRUE(s.ok()) << s << " at " << at;
    at += n;
  }
  writer.join();
  EXPECT_TRUE(got == data) << "received bytes differ";
  const udp::UdpConnection::Counters c = pair.b->counters();
  EXPECT_GT(c.dropped_for_test, 0u);
  EXPECT_GT(c.stream_bytes_placed_in_reader, 0u);
  EXPECT_EQ(c.auth_failures, 0u);
  pair.a->Abort();
  pair.b->Abort();
}

// The read returns only once the I/O thread has given the buffer back (ASan would see a write
// into it after it is freed).
TEST(UdpConnectionTest, AbortFailsALongReadThatLentItsBuffer) {
  Pair pair(/*same_keys=*/true);
  std::vector<uint8_t> big(1 << 20);
  std::thread aborter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    pair.b->Abort();
  });
  absl::Status s = pair.b->ReadExactly(absl::MakeSpan(big));
  aborter.join();
  EXPECT_EQ(s.code(), absl::StatusCode::kCancelled) << s;
  pair.a->Abort();
}

// A real UDP socket with GRO, fed by hand-sealed packets sent as one GSO batch.
struct GroReceiver {
  GroReceiver() {
    raw = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    int one = 1;
    EXPECT_EQ(setsockopt(fd, SOL_UDP, 104 /* UDP_GRO */, &one, sizeof one), 0);
    sockaddr_in addr = {};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof addr;
    sockaddr_in a = addr, b = addr;
    EXPECT_EQ(bind(raw, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    EXPECT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&b), sizeof b), 0);
    getsockname(raw, reinterpret_cast<sockaddr*>(&a), &len);
    getsockname(fd, reinterpret_cast<sockaddr*>(&b), &len);
    EXPECT_EQ(connect(raw, reinterpret_cast<sockaddr*>(&b), sizeof b), 0);
    EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    udp::UdpConnectionParams p;
    p.fd = fd;
    p.local_connection_id = 22;
    p.peer_connection_id = 11;
    p.send_keys.key[0] = 6;
    p.receive_keys = keys;
    p.max_datagram = 9000;
    p.peer_site = "peer";
    p.peer_address = "loopback";
    p.controller_mu = std::make_shared<absl::Mutex>();
    p.controller = congestion::CreateBbr3({}, random, RealClock::Get().Now());
    p.congestion_control_name = "bbr3";
    conn = std::make_unique<udp::UdpConnection>(std::move(p));
  }
  ~GroReceiver() {
    conn->Abort();
    conn.reset();
    close(raw);
  }
  // A packet carrying stream bytes [offset, offset + data.size()).
  std::vector<uint8_t> Packet(uint64_t pn, uint64_t offset, absl::Span<const uint8_t> data) {
    std::vector<uint8_t> packet(udp::kPacketOverhead + udp::kStreamFrameHeaderSize + data.size());
    const absl::Span<uint8_t> payload = absl::MakeSpan(packet).subspan(udp::kHeaderSize);
    udp::WriteStreamHeader(offset, static_cast<uint16_t>(data.size()), payload);
    std::memcpy(&payload[udp::kStreamFrameHeaderSize], data.data(), data.size());
    EXPECT_TRUE(
        sealer.Seal(22, pn, absl::MakeSpan(packet), packet.size() - udp::kPacketOverhead).ok());
    return packet;
  }
  // Sends equal-sized packets as one UDP_SEGMENT batch.
  void SendBatch(const std::vector<std::vector<uint8_t>>& packets) {
    std::vector<uint8_t> all;
    for (const auto& p : packets) all.insert(all.end(), p.begin(), p.end());
    EXPECT_EQ(udp::SendSegmented(raw, all, static_cast<uint16_t>(packets[0].size())),
              static_cast<ssize_t>(all.size()));
  }
  int raw = -1;
  udp::DirectionKeys keys = [] {
    udp::DirectionKeys k;
    k.key[0] = 5;
    return k;
  }();
  udp::PacketSealer sealer{keys, udp::kDefaultKeyUpdateInterval};
  congestion::SplitMix64Random random{2};
  std::unique_ptr<udp::UdpConnection> conn;
};

TEST(UdpConnectionTest, GroBatchIsSplitAndATamperedSegmentIsDroppedAlone) {
  GroReceiver r;
  const std::vector<uint8_t> data = Pattern(4 * 8000, 11);
  auto piece = [&](size_t i) { return absl::MakeConstSpan(data).subspan(i * 8000, 8000); };
  std::vector<std::vector<uint8_t>> batch;
  for (size_t i = 0; i < 4; ++i) batch.push_back(r.Packet(i + 1, i * 8000, piece(i)));
  batch[1][udp::kHeaderSize + 4000] ^= 0x20;  // inside the second packet's stream data
  r.SendBatch(batch);
  std::vector<uint8_t> got(data.size());
  ASSERT_TRUE(r.conn->ReadExactly(absl::MakeSpan(got.data(), 8000)).ok());
  udp::UdpConnection::Counters c = r.conn->counters();
  EXPECT_EQ(c.gro_datagrams, 4u);  // one receive held all four
  EXPECT_EQ(c.auth_failures, 1u);
  EXPECT_EQ(c.datagrams_received, 4u);
  // The tampered packet delivered nothing, so the stream waits at its offset. Its data sent
  // again (a new packet number) completes it, with what arrived after it intact.
  std::thread late([&] { r.SendBatch({r.Packet(5, 8000, piece(1))}); });
  ASSERT_TRUE(r.conn->ReadExactly(absl::MakeSpan(got.data() + 8000, 3 * 8000)).ok());
  late.join();
  EXPECT_TRUE(got == data) << "received bytes differ";
  EXPECT_EQ(r.conn->counters().auth_failures, 1u);
}

// Threads of this process whose nice value (field 19 of /proc/self/task/TID/stat) is `nice`.
int ThreadsWithNice(int nice) {
  int n = 0;
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task")) {
    std::ifstream in(task.path() / "stat");
    std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const size_t close = stat.rfind(')');  // the command name may contain spaces
    if (close == std::string::npos) continue;
    std::istringstream fields(stat.substr(close + 2));
    std::string field;
    // Fields after the name start at 3 (state); nice is field 19.
    for (int i = 3; i <= 19 && fields >> field; ++i) {
      if (i == 19 && field == std::to_string(nice)) ++n;
    }
  }
  return n;
}

TEST(UdpConnectionTest, IoThreadRunsAtTheConfiguredNiceValue) {
  // A higher nice value (lower priority) needs no privilege, so the test runs anywhere; the
  // transport's default asks for a lower one, best effort.
  constexpr int kNice = 7;
  ASSERT_EQ(ThreadsWithNice(kNice), 0);
  Pair pair(/*same_keys=*/true, kNice);
  // The I/O threads set their priority as they start.
  for (int i = 0; i < 500 && ThreadsWithNice(kNice) < 2; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(ThreadsWithNice(kNice), 2);  // one I/O thread per connection; callers untouched
  const uint8_t data[3] = {1, 2, 3};
  ASSERT_TRUE(pair.a->Write({absl::Span<const uint8_t>(data)}).ok());
  uint8_t got[3];
  ASSERT_TRUE(pair.b->ReadExactly(absl::MakeSpan(got)).ok());
  EXPECT_EQ(std::memcmp(got, data, 3), 0);
  pair.a->Abort();
  pair.b->Abort();
}

}  // namespace
}  // namespace longhaul::transport
