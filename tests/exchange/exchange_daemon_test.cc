// Real daemons (deploy/local-sites.sh on loopback) and the C++ client:
// all-reduce through shared memory and the EXCHANGE peer links, two sites
// and three; and raw local clients of the Exchange service, as hostile ones
// would be.

#include <arpa/inet.h>
#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <random>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/notification.h"
#include "client/exchange_testing.h"
#include "common/fd_passing.h"
#include "gtest/gtest.h"
#include "longhaul/client.h"
#include "longhaul/exchange.h"
#include "longhaul/shm_progress.h"
#include "longhaul/v1/exchange.grpc.pb.h"
#include "tests/test_tools/eventually.h"

namespace longhaul {
namespace {

using ::longhaul::testing::Eventually;

constexpr size_t kMiB = 1 << 20;

std::string Shell(const std::string& command) {
  std::string out;
  FILE* p = popen(command.c_str(), "r");
  if (p == nullptr) return out;
  char buf[512];
  while (fgets(buf, sizeof buf, p) != nullptr) out += buf;
  pclose(p);
  return out;
}

// deploy/local-sites.sh with LONGHAUL_LOCAL_SITES set to `sites`.
std::string LocalSites(const std::vector<std::string>& sites, const std::string& verb,
                       const std::string& dir) {
  return Shell(absl::StrCat("LONGHAUL_BIN=", LONGHAUL_BIN_DIR, " LONGHAUL_LOCAL_SITES='",
                            absl::StrJoin(sites, " "), "' ", LONGHAUL_SOURCE_DIR,
                            "/deploy/local-sites.sh ", verb, " ", dir));
}

// Starts local daemons of `sites` in a new temporary directory, returned
// in `dir`; true once every one runs.
bool StartSites(const std::vector<std::string>& sites, std::string* dir) {
  char tmpl[] = "/tmp/longhaul-exchange-test-XXXXXX";
  *dir = mkdtemp(tmpl);
  const std::string out = LocalSites(sites, "up", *dir);
  return std::all_of(sites.begin(), sites.end(), [&](const std::string& s) {
    std::string var = s.substr(s.find('-') + 1);
    std::transform(var.begin(), var.end(), var.begin(), ::toupper);
    return out.find("LONGHAUL_SITE_" + var) != std::string::npos;
  });
}

void StopSites(const std::vector<std::string>& sites, const std::string& dir) {
  LocalSites(sites, "down", dir);
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
}

// Every one of `sites` (daemons at `addresses`) joins `name` at once.
std::vector<std::unique_ptr<ExchangeGroup>> JoinAll(const std::vector<std::string>& addresses,
                                                    const std::vector<std::string>& sites,
                                                    const std::string& name) {
  std::vector<std::future<absl::StatusOr<std::unique_ptr<ExchangeGroup>>>> joins;
  for (const std::string& address : addresses) {
    joins.push_back(std::async(std::launch::async, [&, address] {
      return ExchangeGroup::Join(address, name, sites, absl::Seconds(20));
    }));
  }
  std::vector<std::unique_ptr<ExchangeGroup>> groups;
  for (auto& j : joins) {
    auto g = j.get();
    EXPECT_TRUE(g.ok()) << g.status();
    if (!g.ok()) return {};
    groups.push_back(*std::move(g));
  }
  return groups;
}

// Starts site-a and site-b for the whole suite and always stops them.
class ExchangeDaemonTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    ok_ = StartSites(kSites, &dir_);
    site_a_ = absl::StrCat("unix:", dir_, "/site-a/control.sock");
    site_b_ = absl::StrCat("unix:", dir_, "/site-b/control.sock");
  }
  static void TearDownTestSuite() { StopSites(kSites, dir_); }
  void SetUp() override { ASSERT_TRUE(ok_) << "local sites did not start; see " << dir_; }
  void TearDown() override { client_internal::SetPiecePublishedForTesting(nullptr); }

  // Both sites join `name`.
  std::pair<std::unique_ptr<ExchangeGroup>, std::unique_ptr<ExchangeGroup>> JoinBoth(
      const std::string& name) {
    auto groups = JoinAll({site_a_, site_b_}, kSites, name);
    if (groups.size() != 2) return {};
    return {std::move(groups[0]), std::move(groups[1])};
  }

  static inline const std::vector<std::string> kSites = {"site-a", "site-b"};
  static inline std::string dir_;
  static inline bool ok_ = false;
  static inline std::string site_a_, site_b_;
};

uint16_t ToHalfBitsSlow(float f) {
  // k/4 values used below are exact in binary16: build the bits directly.
  if (f == 0) return std::signbit(f) ? 0x8000 : 0;
  uint16_t sign = f < 0 ? 0x8000 : 0;
  float a = std::fabs(f);
  int e;
  float m = std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1)
  uint16_t exp = static_cast<uint16_t>(e - 1 + 15);
  uint16_t mant = static_cast<uint16_t>((m * 2 - 1) * 1024);
  return sign | static_cast<uint16_t>(exp << 10) | mant;
}

float FromHalfBitsSlow(uint16_t h) {
  int exp = (h >> 10) & 0x1f;
  int mant = h & 0x3ff;
  float v = exp == 0 ? std::ldexp(static_cast<float>(mant), -24)
                     : std::ldexp(1.0f + mant / 1024.0f, exp - 15);
  return (h & 0x8000) ? -v : v;
}

TEST_F(ExchangeDaemonTest, AllReduceEachDtypeMatchesTheLocalSumAtBothSites) {
  auto [a, b] = JoinBoth("dtypes");
  ASSERT_TRUE(a && b);
  EXPECT_EQ(a->generation(), b->generation());
  const size_t count = 100000;
  for (DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    std::vector<float> va(count), vb(count);
    for (size_t i = 0; i < count; ++i) {
      va[i] = static_cast<float>(static_cast<int>(i % 101) - 50) / 4;
      vb[i] = static_cast<float>(static_cast<int>((i * 3) % 89) - 44) / 4;
    }
    std::vector<uint8_t> ba(count * ElementSize(dtype)), bb(ba.size());
    for (size_t i = 0; i < count; ++i) {
      if (dtype == DType::kFloat32) {
        std::memcpy(&ba[4 * i], &va[i], 4);
        std::memcpy(&bb[4 * i], &vb[i], 4);
      } else if (dtype == DType::kBFloat16) {
        uint32_t x, y;
        std::memcpy(&x, &va[i], 4);
        std::memcpy(&y, &vb[i], 4);
        uint16_t hx = x >> 16, hy = y >> 16;  // exact: these values fit in 8 mantissa bits
        std::memcpy(&ba[2 * i], &hx, 2);
        std::memcpy(&bb[2 * i], &hy, 2);
      } else {
        uint16_t hx = ToHalfBitsSlow(va[i]), hy = ToHalfBitsSlow(vb[i]);
        std::memcpy(&ba[2 * i], &hx, 2);
        std::memcpy(&bb[2 * i], &hy, 2);
      }
    }
    auto wa = a->AllReduce(ba.data(), count, dtype);
    auto wb = b->AllReduce(bb.data(), count, dtype);
    ASSERT_TRUE(wa->Wait(absl::Seconds(60)).ok());
    absl::Status sb = wb->Wait(absl::Seconds(60));
    ASSERT_TRUE(sb.ok()) << sb;
    EXPECT_TRUE(wa->Test());
    EXPECT_EQ(wa->Stats().peers, 1u);
    EXPECT_EQ(wa->Stats().bytes_sent, ba.size());
    EXPECT_EQ(wa->Stats().bytes_received, ba.size());
    ASSERT_EQ(ba, bb) << "results differ between sites";
    for (size_t i = 0; i < count; ++i) {
      float got;
      if (dtype == DType::kFloat32) {
        std::memcpy(&got, &ba[4 * i], 4);
      } else if (dtype == DType::kBFloat16) {
        uint16_t h;
        std::memcpy(&h, &ba[2 * i], 2);
        uint32_t x = static_cast<uint32_t>(h) << 16;
        std::memcpy(&got, &x, 4);
      } else {
        uint16_t h;
        std::memcpy(&h, &ba[2 * i], 2);
        got = FromHalfBitsSlow(h);
      }
      ASSERT_EQ(got, va[i] + vb[i]) << "element " << i;
    }
  }
}

// Streamed (both clients copy their buffers in while the daemons work), the
// average is the same bytes at both sites, and the fixed-order one.
TEST_F(ExchangeDaemonTest, RandomFloat32AverageIsBitIdenticalAtBothSites) {
  auto [a, b] = JoinBoth("bits");
  ASSERT_TRUE(a && b);
  std::atomic<int> streamed{0};  // copies that published their last piece
  client_internal::SetPiecePublishedForTesting(
      [&](size_t published, size_t total) { streamed += published == total; });
  const size_t count = 4 << 20;  // 16 MiB
  std::mt19937 rng(3);
  std::normal_distribution<float> dist(0, 1);
  std::vector<float> va(count), vb(count);
  for (auto& x : va) x = dist(rng);
  for (auto& x : vb) x = dist(rng);
  std::vector<float> want(count);
  for (size_t i = 0; i < count; ++i) want[i] = (va[i] + vb[i]) / 2;
  AllReduceOptions avg;
  avg.op = ReduceOp::kAvg;
  auto wa = a->AllReduce(va.data(), count, DType::kFloat32, avg);
  ASSERT_TRUE(b->AllReduceSync(vb.data(), count, DType::kFloat32, avg).ok());
  ASSERT_TRUE(wa->Wait().ok());
  ASSERT_EQ(0, std::memcmp(va.data(), vb.data(), count * 4));
  ASSERT_EQ(0, std::memcmp(va.data(), want.data(), count * 4));
  EXPECT_EQ(streamed.load(), 2);
}

// AllGather and Broadcast through the client: the concatenation in member
// order and the root's bytes at both sites, interleaved with an all-reduce
// on the same sequence.
TEST_F(ExchangeDaemonTest, AllGatherAndBroadcastGiveBothSitesTheSameBytes) {
  auto [a, b] = JoinBoth("gather");
  ASSERT_TRUE(a && b);
  const size_t bytes = (5 << 20) + 3;
  std::mt19937 rng(9);
  std::vector<uint8_t> ia(bytes), ib(bytes);
  for (auto& x : ia) x = static_cast<uint8_t>(rng());
  for (auto& x : ib) x = static_cast<uint8_t>(rng());
  std::vector<uint8_t> oa(2 * bytes), ob(2 * bytes + 100, 0xEE);
  auto wa = a->AllGather(ia.data(), bytes, oa.data(), oa.size());
  ASSERT_TRUE(b->AllGatherSync(ib.data(), bytes, ob.data(), ob.size()).ok());
  ASSERT_TRUE(wa->Wait().ok());
  EXPECT_EQ(wa->Stats().peers, 1u);
  EXPECT_EQ(wa->Stats().bytes_sent, bytes);
  std::vector<uint8_t> want = ia;
  want.insert(want.end(), ib.begin(), ib.end());
  EXPECT_TRUE(oa == want);
  EXPECT_TRUE(std::equal(want.begin(), want.end(), ob.begin()));
  EXPECT_EQ(ob.back(), 0xEE);  // past the result: untouched

  float fa = 1, fb = 2;
  auto ra = a->AllReduce(&fa, 1, DType::kFloat32);
  ASSERT_TRUE(b->AllReduceSync(&fb, 1, DType::kFloat32).ok());
  ASSERT_TRUE(ra->Wait().ok());
  EXPECT_EQ(fa, 3);

  std::vector<uint8_t> root = ib;
  auto ba = a->Broadcast(ia.data(), bytes, "site-b");
  ASSERT_TRUE(b->BroadcastSync(ib.data(), bytes, "site-b").ok());
  ASSERT_TRUE(ba->Wait().ok());
  EXPECT_TRUE(ia == root);
  EXPECT_TRUE(ib == root);
}

TEST_F(ExchangeDaemonTest, SendRecvCancelAndTimeout) {
  auto [a, b] = JoinBoth("p2p");
  ASSERT_TRUE(a && b);
  std::string msg(3 << 20, 'm');
  ASSERT_TRUE(a->Send("site-b", "t1", msg.data(), msg.size()).ok());
  std::string out(4 << 20, '\0');
  auto n = b->Recv("site-a", "t1", out.data(), out.size());
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(*n, msg.size());
  EXPECT_EQ(out.substr(0, *n), msg);

  // Timeout: site-b never joins this call.
  std::vector<float> x(1024, 1.0f);
  AllReduceOptions quick;
  quick.timeout = absl::Milliseconds(300);
  absl::Status s = a->AllReduceSync(x.data(), x.size(), DType::kFloat32, quick);
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_NE(s.message().find("waiting for site-b"), absl::string_view::npos) << s;
  // site-b's matching call learns that site-a gave up.
  s = b->AllReduceSync(x.data(), x.size(), DType::kFloat32);
  EXPECT_EQ(s.code(), absl::StatusCode::kAborted) << s;

  // Cancel: Wait reports Cancelled promptly.
  auto work = a->AllReduce(x.data(), x.size(), DType::kFloat32);
  EXPECT_FALSE(work->Test());
  EXPECT_EQ(work->Wait(absl::Milliseconds(100)).code(), absl::StatusCode::kDeadlineExceeded);
  work->Cancel();
  s = work->Wait(absl::Seconds(10));
  EXPECT_EQ(s.code(), absl::StatusCode::kCancelled) << s;
  EXPECT_FALSE(IsPeerLost(s));
}

// A raw client names memory the daemon cannot keep mapped safely: a POSIX
// shm_open segment (it could be truncated under the mapping) or a token no
// open registration holds. Each call fails alone, with a reason; the daemon
// keeps serving the group.
TEST_F(ExchangeDaemonTest, RequestsNamingUnsealedMemoryFailAloneWithAReason) {
  auto [a, b] = JoinBoth("raw");
  ASSERT_TRUE(a && b);
  auto stub =
      v1::Exchange::NewStub(grpc::CreateChannel(site_a_, grpc::InsecureChannelCredentials()));
  v1::RecvRequest request;
  request.set_group("raw");
  request.set_op_id("raw-legacy");
  request.set_peer("site-b");
  request.set_tag("never-sent");
  request.set_timeout_ms(5000);
  request.mutable_buffer()->set_name("/longhaul-legacy-segment");
  request.mutable_buffer()->set_offset(4096);
  request.mutable_buffer()->set_length(4096);
  {
    grpc::ClientContext context;
    v1::OpResponse response;
    ASSERT_TRUE(stub->Recv(&context, request, &response).ok());
    EXPECT_EQ(response.error().code(), static_cast<int>(absl::StatusCode::kFailedPrecondition));
    EXPECT_NE(response.error().message().find("(shm_open) is not accepted"), std::string::npos)
        << response.error().message();
  }
  request.set_op_id("raw-token");
  request.mutable_buffer()->clear_name();
  request.mutable_buffer()->set_segment("00000000000000000000000000000000");
  {
    grpc::ClientContext context;
    v1::OpResponse response;
    ASSERT_TRUE(stub->Recv(&context, request, &response).ok());
    EXPECT_EQ(response.error().code(), static_cast<int>(absl::StatusCode::kNotFound));
    EXPECT_NE(response.error().message().find("no segment is registered"), std::string::npos)
        << response.error().message();
  }
  // A buffer no message could fill would only make the daemon populate it.
  request.set_op_id("raw-huge");
  request.mutable_buffer()->set_length(uint64_t{8} << 30);
  {
    grpc::ClientContext context;
    v1::OpResponse response;
    ASSERT_TRUE(stub->Recv(&context, request, &response).ok());
    EXPECT_EQ(response.error().code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
    EXPECT_NE(response.error().message().find("larger than the largest exchange message"),
              std::string::npos)
        << response.error().message();
  }

  std::string msg(1 << 20, 'r');
  ASSERT_TRUE(b->Send("site-a", "after", msg.data(), msg.size()).ok());
  std::string out(msg.size(), '\0');
  auto n = a->Recv("site-b", "after", out.data(), out.size());
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(out, msg);
}

// Both directions at once, through the streamed path (the client fills the
// segment while the daemon sends, and copies out while the message lands):
// every byte arrives, in buffers that held other data before (a reused
// segment and a stale output buffer), over several rounds.
TEST_F(ExchangeDaemonTest, StreamedSendAndRecvBothWaysDeliverExactBytesEveryRound) {
  auto [a, b] = JoinBoth("streamed");
  ASSERT_TRUE(a && b);
  std::mt19937_64 rng(7);
  const size_t size = (17 << 20) + 3;  // five wire segments, not a multiple of a piece
  std::vector<uint8_t> from_a(size), from_b(size), at_a(size + 100, 0xee), at_b(size + 100, 0xee);
  for (int round = 0; round < 3; ++round) {
    for (auto& v : from_a) v = static_cast<uint8_t>(rng());
    for (auto& v : from_b) v = static_cast<uint8_t>(rng());
    const std::string tag = absl::StrCat("round-", round);
    auto send_a = a->SendAsync("site-b", tag, from_a.data(), size);
    auto send_b = b->SendAsync("site-a", tag, from_b.data(), size);
    // `&b = b`: clang 14 cannot capture a structured binding.
    auto recv_b = std::async(std::launch::async, [&, &b = b] {
      return b->Recv("site-a", tag, at_b.data(), at_b.size());
    });
    auto n = a->Recv("site-b", tag, at_a.data(), at_a.size());
    ASSERT_TRUE(n.ok()) << n.status();
    EXPECT_EQ(*n, size);
    auto m = recv_b.get();
    ASSERT_TRUE(m.ok()) << m.status();
    EXPECT_EQ(*m, size);
    ASSERT_TRUE(send_a->Wait(absl::Seconds(30)).ok());
    ASSERT_TRUE(send_b->Wait(absl::Seconds(30)).ok());
    EXPECT_EQ(send_a->Stats().bytes_sent, size);
    ASSERT_EQ(0, std::memcmp(at_a.data(), from_b.data(), size)) << "round " << round;
    ASSERT_EQ(0, std::memcmp(at_b.data(), from_a.data(), size)) << "round " << round;
    EXPECT_EQ(at_a[size], 0xee) << "wrote past the message";
  }
}

// A Recv whose message comes before it is waiting (so the daemon copies it
// into the segment in one go) still delivers it whole.
TEST_F(ExchangeDaemonTest, StreamedRecvOfAMessageThatArrivedFirst) {
  auto [a, b] = JoinBoth("early");
  ASSERT_TRUE(a && b);
  std::vector<uint8_t> msg(5 << 20);
  for (size_t i = 0; i < msg.size(); ++i) msg[i] = static_cast<uint8_t>(i * 7 + (i >> 16));
  ASSERT_TRUE(a->Send("site-b", "early", msg.data(), msg.size()).ok());
  // Site-a's messages to site-b share one link, read in order, each filed
  // before the next is read: once the fence is received, `early` is held
  // whole at site-b.
  const std::string fence = "fence";
  ASSERT_TRUE(a->Send("site-b", "fence", fence.data(), fence.size()).ok());
  std::string fenced(fence.size(), '\0');
  ASSERT_TRUE(b->Recv("site-a", "fence", fenced.data(), fenced.size()).ok());
  std::vector<uint8_t> out(msg.size(), 0);
  auto n = b->Recv("site-a", "early", out.data(), out.size());
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(*n, msg.size());
  EXPECT_TRUE(out == msg);
}

// --------------------------------------------------------- streamed all-reduce

// A sealed memfd segment a raw client registered on a daemon's segment
// socket (exchange.proto, ShmRegion), laid out as longhaul/shm_progress.h
// says: the progress word, then `bytes` of buffer at shm::kDataOffset.
class RawSegment {
 public:
  RawSegment(const std::string& socket_path, size_t bytes) : bytes_(bytes) {
    const int fd = memfd_create("longhaul-raw", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    EXPECT_GE(fd, 0);
    EXPECT_EQ(ftruncate(fd, mapped()), 0);
    EXPECT_EQ(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL), 0);
    void* base = mmap(nullptr, mapped(), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    EXPECT_NE(base, MAP_FAILED);
    mapping_ = static_cast<uint8_t*>(base);
    conn_ = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, socket_path.c_str(), sizeof(addr.sun_path) - 1);
    EXPECT_EQ(connect(conn_, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)), 0)
        << socket_path;
    EXPECT_EQ(SendByteWithFd(conn_, 'S', fd, MSG_NOSIGNAL), 1);
    close(fd);
    std::string answer;
    char c;
    while (read(conn_, &c, 1) == 1 && c != '\n') answer += c;
    EXPECT_EQ(answer.substr(0, 3), "ok ") << answer;
    token_ = answer.substr(3);
  }
  ~RawSegment() {
    munmap(mapping_, mapped());
    close(conn_);  // unregisters it
  }
  RawSegment(const RawSegment&) = delete;
  RawSegment& operator=(const RawSegment&) = delete;

  float* floats() { return reinterpret_cast<float*>(mapping_ + shm::kDataOffset); }
  shm::ProgressWord progress() { return shm::ProgressWord(reinterpret_cast<uint64_t*>(mapping_)); }
  // Names the buffer, starting `offset` bytes into the segment.
  void Describe(v1::ShmRegion* region, uint64_t offset = shm::kDataOffset) const {
    region->set_segment(token_);
    region->set_offset(offset);
    region->set_length(bytes_);
  }

 private:
  size_t mapped() const { return shm::kDataOffset + bytes_; }
  const size_t bytes_;
  uint8_t* mapping_ = nullptr;
  int conn_ = -1;
  std::string token_;
};

// One site's daemon's /metrics (its log names the port).
class Metrics {
 public:
  Metrics(const std::string& dir, const std::string& site) {
    std::ifstream log(dir + "/" + site + "/longhauld.log");
    std::stringstream text;
    text << log.rdbuf();
    const std::string s = text.str();
    std::smatch m;
    if (std::regex_search(s, m, std::regex(R"(metrics on http://127\.0\.0\.1:(\d+)/metrics)"))) {
      port_ = std::stoi(m[1]);
    }
    EXPECT_NE(port_, 0) << "no metrics port in " << site << "'s log";
  }

  // The bytes the daemon has charged to the exchange class's cap
  // (longhaul_rate_capped_bytes_total): every payload segment it put on a
  // peer link while a cap was set, charged before it is written.
  uint64_t ExchangeBytesCapped() const {
    const std::string page = Get();
    std::smatch m;
    static const std::regex kLine(
        R"re(\nlonghaul_rate_capped_bytes_total\{scope="class",name="exchange"\} (\S+))re");
    if (!std::regex_search(page, m, kLine)) return 0;
    return static_cast<uint64_t>(std::stod(m[1]));
  }

 private:
  std::string Get() const {
    const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port_));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    std::string page;
    if (connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) == 0) {
      const std::string request =
          "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
      if (write(fd, request.data(), request.size()) == static_cast<ssize_t>(request.size())) {
        char buf[4096];
        for (ssize_t n; (n = read(fd, buf, sizeof(buf))) > 0;) page.append(buf, n);
      }
    }
    close(fd);
    return page;
  }
  int port_ = 0;
};

// Sets (or with 0, lifts) a cap on the exchange class at the daemon at
// `address`; a cap far above what loopback carries only counts the bytes.
void CapExchange(const std::string& address, uint64_t bits_per_second) {
  auto control = Client::Connect(address);
  ASSERT_TRUE(control.ok()) << control.status();
  v1::RateLimit cap;
  cap.set_priority(v1::EXCHANGE);
  cap.set_bits_per_second(bits_per_second);
  auto limits = (*control)->SetLimit(cap);
  ASSERT_TRUE(limits.ok()) << limits.status();
}
constexpr uint64_t kCountOnly = uint64_t{1} << 40;  // 1 Tbit/s

// Counts the exchange class's bytes at the daemon at `address` (a cap it
// never reaches) for as long as it lives.
class CountExchangeBytes {
 public:
  explicit CountExchangeBytes(std::string address) : address_(std::move(address)) {
    CapExchange(address_, kCountOnly);
  }
  ~CountExchangeBytes() { CapExchange(address_, 0); }

 private:
  const std::string address_;
};

// The daemon reduces and sends a streamed all-reduce's buffer while its
// client is still copying it in. With site-a's copy held after 8 of 32 MiB
// (and site-b not called yet), site-a's daemon puts exactly those 8 MiB on
// the link to site-b, and nothing it was not told is written. Released, the
// call gives both sites the sum.
TEST_F(ExchangeDaemonTest, StreamedAllReduceSendsWhileTheClientIsStillCopying) {
  auto [a, b] = JoinBoth("overlap");
  ASSERT_TRUE(a && b);
  const CountExchangeBytes counting(site_a_);
  const Metrics metrics(dir_, "site-a");

  const size_t count = 8 * kMiB;  // 32 MiB of float32
  std::vector<float> va(count), vb(count), want(count);
  for (size_t i = 0; i < count; ++i) {
    va[i] = static_cast<float>(i % 1000) / 4;
    vb[i] = static_cast<float>((i * 7) % 1000) / 2;
    want[i] = va[i] + vb[i];
  }
  // The first copy to publish 8 MiB waits there until released: site-a's,
  // the only one running until then.
  std::atomic<bool> holding{false};
  std::atomic<size_t> held_at{0};
  absl::Notification held, release;
  client_internal::SetPiecePublishedForTesting([&](size_t published, size_t) {
    if (published < 8 * kMiB || holding.exchange(true)) return;
    held_at = published;
    held.Notify();
    release.WaitForNotificationWithTimeout(absl::Seconds(60));
  });
  struct Release {
    ~Release() {
      if (!n.HasBeenNotified()) n.Notify();
    }
    absl::Notification& n;
  } release_on_exit{release};

  const uint64_t before = metrics.ExchangeBytesCapped();
  AllReduceOptions options;
  options.timeout = absl::Seconds(30);
  auto wa = a->AllReduce(va.data(), count, DType::kFloat32, options);
  ASSERT_TRUE(held.WaitForNotificationWithTimeout(absl::Seconds(20)))
      << "site-a's client never streamed its buffer";
  ASSERT_EQ(held_at.load(), 8 * kMiB);
  ASSERT_TRUE(Eventually([&] { return metrics.ExchangeBytesCapped() - before >= 8 * kMiB; },
                         absl::Seconds(30)))
      << "site-a sent " << metrics.ExchangeBytesCapped() - before
      << " bytes of the 8 MiB its client had published";
  EXPECT_EQ(metrics.ExchangeBytesCapped() - before, 8 * kMiB) << "it sent what was not written";
  EXPECT_FALSE(wa->Test());
  release.Notify();

  ASSERT_TRUE(b->AllReduceSync(vb.data(), count, DType::kFloat32, options).ok());
  absl::Status sa = wa->Wait(absl::Seconds(60));
  ASSERT_TRUE(sa.ok()) << sa;
  EXPECT_EQ(wa->Stats().bytes_sent, count * 4);
  EXPECT_EQ(metrics.ExchangeBytesCapped() - before, count * 4);
  ASSERT_EQ(0, std::memcmp(va.data(), want.data(), count * 4));
  ASSERT_EQ(0, std::memcmp(vb.data(), want.data(), count * 4));
}

// A raw local client at site-a streams all-reduces through a progress word
// it never fills, pushes past its buffer, or moves back; site-b calls
// through the C++ client with a longer deadline. Each such call fails at
// site-a alone, with an error that says what its client did (not a lost
// peer); site-b fails on site-a's ABORT, which names site-a and carries the
// reason (retryable, but not peer-lost), and keeps its input; and the
// daemon serves the group's next all-reduce.
TEST_F(ExchangeDaemonTest, HostileStreamedAllReducesFailAtTheirSiteAndTheGroupGoesOn) {
  auto stub =
      v1::Exchange::NewStub(grpc::CreateChannel(site_a_, grpc::InsecureChannelCredentials()));
  auto joining_b = std::async(std::launch::async, [&] {
    return ExchangeGroup::Join(site_b_, "hostile", kSites, absl::Seconds(20));
  });
  v1::JoinRequest join;
  join.set_group("hostile");
  for (const auto& s : kSites) join.add_sites(s);
  join.set_timeout_ms(20000);
  v1::JoinResponse joined;
  {
    grpc::ClientContext context;
    ASSERT_TRUE(stub->Join(&context, join, &joined).ok());
  }
  ASSERT_EQ(joined.error().code(), 0) << joined.error().message();
  EXPECT_TRUE(joined.streamed_all_reduce());
  auto b = joining_b.get();
  ASSERT_TRUE(b.ok()) << b.status();
  const CountExchangeBytes counting(site_a_);
  const Metrics metrics(dir_, "site-a");

  const size_t count = 4 * kMiB;  // 16 MiB of float32
  RawSegment seg(joined.segment_socket(), count * 4);
  uint64_t seq = 0;
  // Site-a's raw all-reduce of `seg` (streamed, the next seq) beside
  // site-b's of a buffer of 2s; `meanwhile` runs while both are under way.
  auto run = [&](uint32_t timeout_ms, const std::function<void()>& meanwhile = nullptr) {
    v1::AllReduceRequest request;
    request.set_group("hostile");
    request.set_op_id(absl::StrCat("hostile-", seq));
    request.set_seq(seq++);
    seg.Describe(request.mutable_buffer());
    request.set_dtype(v1::FLOAT32);
    request.set_timeout_ms(timeout_ms);
    request.set_streamed(true);
    auto at_a = std::async(std::launch::async, [&stub, request] {
      grpc::ClientContext context;
      v1::OpResponse response;
      EXPECT_TRUE(stub->AllReduce(&context, request, &response).ok());
      return response;
    });
    std::vector<float> vb(count, 2.0f);
    AllReduceOptions options;
    options.timeout = absl::Seconds(30);
    auto at_b = (*b)->AllReduce(vb.data(), count, DType::kFloat32, options);
    if (meanwhile) meanwhile();
    v1::OpResponse a_response = at_a.get();
    absl::Status b_status = at_b->Wait();
    return std::make_tuple(a_response, b_status, vb);
  };
  auto expect_b_aborted = [](const absl::Status& s, const std::vector<float>& vb,
                             const std::string& reason) {
    EXPECT_EQ(s.code(), absl::StatusCode::kAborted) << s;
    EXPECT_NE(s.message().find("site-a gave up on it"), absl::string_view::npos) << s;
    EXPECT_NE(s.message().find(reason), absl::string_view::npos) << s;
    EXPECT_FALSE(IsPeerLost(s)) << s;
    EXPECT_TRUE(std::all_of(vb.begin(), vb.end(), [](float x) { return x == 2.0f; }))
        << "a failed all-reduce changed site-b's buffer";
  };

  {  // Never filled: site-a's deadline, its own failure.
    seg.progress().PublishReady(0);
    auto [a, b_status, vb] = run(1000);
    EXPECT_EQ(a.error().code(), static_cast<int>(absl::StatusCode::kDeadlineExceeded));
    EXPECT_NE(a.error().message().find(
                  "timed out after 1s: its client had written only 0 of the 16777216 bytes"),
              std::string::npos)
        << a.error().message();
    EXPECT_EQ(a.error().lost_peer(), "");
    expect_b_aborted(b_status, vb, "its client had written only 0");
  }
  {  // Past the buffer.
    seg.progress().PublishReady(count * 4 + 1);
    auto [a, b_status, vb] = run(30000);
    EXPECT_EQ(a.error().code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
    EXPECT_NE(a.error().message().find(
                  "its client says 16777217 bytes of its buffer of 16777216 are written"),
              std::string::npos)
        << a.error().message();
    EXPECT_EQ(a.error().lost_peer(), "");
    expect_b_aborted(b_status, vb, "16777217 bytes");
  }
  {  // Back: once site-a has sent a segment, it has seen the word at 8 MiB.
    seg.progress().PublishReady(8 * kMiB);
    const uint64_t before = metrics.ExchangeBytesCapped();
    auto [a, b_status, vb] = run(30000, [&] {
      EXPECT_TRUE(
          Eventually([&] { return metrics.ExchangeBytesCapped() > before; }, absl::Seconds(30)));
      seg.progress().PublishReady(4 * kMiB);
    });
    EXPECT_EQ(a.error().code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
    EXPECT_NE(a.error().message().find(
                  "its client's progress word went back from 8388608 to 4194304 bytes"),
              std::string::npos)
        << a.error().message();
    EXPECT_EQ(a.error().lost_peer(), "");
    expect_b_aborted(b_status, vb, "went back");
  }
  {  // A streamed buffer with no room for the word before it: refused
     // before the call runs, so it takes no seq.
    v1::AllReduceRequest request;
    request.set_group("hostile");
    request.set_op_id("hostile-offset");
    request.set_seq(seq);
    seg.Describe(request.mutable_buffer(), /*offset=*/0);
    request.set_dtype(v1::FLOAT32);
    request.set_streamed(true);
    grpc::ClientContext context;
    v1::OpResponse response;
    ASSERT_TRUE(stub->AllReduce(&context, request, &response).ok());
    EXPECT_EQ(response.error().code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
    EXPECT_NE(response.error().message().find("must start at least 4096 bytes into its segment"),
              std::string::npos)
        << response.error().message();
  }
  // The group's next all-reduce, written and published in full.
  std::fill(seg.floats(), seg.floats() + count, 1.0f);
  seg.progress().PublishReady(count * 4);
  auto [a, b_status, vb] = run(30000);
  ASSERT_EQ(a.error().code(), 0) << a.error().message();
  ASSERT_TRUE(b_status.ok()) << b_status;
  EXPECT_TRUE(std::all_of(seg.floats(), seg.floats() + count, [](float x) { return x == 3.0f; }));
  EXPECT_TRUE(std::all_of(vb.begin(), vb.end(), [](float x) { return x == 3.0f; }));
  grpc::ClientContext context;
  v1::LeaveRequest leave;
  leave.set_group("hostile");
  v1::LeaveResponse left;
  stub->Leave(&context, leave, &left);
}

// Starts site-a, site-b and site-c for the whole suite and always stops them.
class ExchangeDaemonThreeSitesTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    ok_ = StartSites(kSites, &dir_);
    for (const auto& s : kSites)
      addresses_.push_back(absl::StrCat("unix:", dir_, "/", s, "/control.sock"));
  }
  static void TearDownTestSuite() { StopSites(kSites, dir_); }
  void SetUp() override { ASSERT_TRUE(ok_) << "local sites did not start; see " << dir_; }
  void TearDown() override { client_internal::SetPiecePublishedForTesting(nullptr); }

  static inline const std::vector<std::string> kSites = {"site-a", "site-b", "site-c"};
  static inline std::string dir_;
  static inline bool ok_ = false;
  static inline std::vector<std::string> addresses_;
};

// Streamed at every site (the sharded exchange reads each shard as it is
// copied in), each round gives every site the same bytes: the fixed-order
// float32 sum, (a + b) + c.
TEST_F(ExchangeDaemonThreeSitesTest, StreamedAllReduceIsBitIdenticalAtEverySite) {
  auto groups = JoinAll(addresses_, kSites, "bits3");
  ASSERT_EQ(groups.size(), 3u);
  std::atomic<int> streamed{0};  // copies that published their last piece
  client_internal::SetPiecePublishedForTesting(
      [&](size_t published, size_t total) { streamed += published == total; });
  const size_t count = (10 * kMiB + 12) / 4;  // shards that straddle wire segments
  std::mt19937 rng(17);
  std::normal_distribution<float> dist(0, 1);
  for (int round = 0; round < 2; ++round) {
    std::vector<std::vector<float>> in(3, std::vector<float>(count));
    for (auto& v : in) {
      for (auto& x : v) x = dist(rng);
    }
    std::vector<float> want(count);
    for (size_t i = 0; i < count; ++i) want[i] = (in[0][i] + in[1][i]) + in[2][i];
    std::vector<std::unique_ptr<ExchangeWork>> works;
    for (int k = 0; k < 3; ++k) {
      works.push_back(groups[k]->AllReduce(in[k].data(), count, DType::kFloat32));
    }
    for (int k = 0; k < 3; ++k) {
      absl::Status s = works[k]->Wait(absl::Seconds(60));
      ASSERT_TRUE(s.ok()) << kSites[k] << ": " << s;
      EXPECT_EQ(works[k]->Stats().peers, 2u);
    }
    for (int k = 0; k < 3; ++k) {
      ASSERT_EQ(0, std::memcmp(in[k].data(), want.data(), count * 4))
          << kSites[k] << ", round " << round;
    }
  }
  EXPECT_EQ(streamed.load(), 6);
}

}  // namespace
}  // namespace longhaul
