// Two real daemons (deploy/local-sites.sh on loopback) and the C++ client:
// all-reduce through shared memory and the EXCHANGE peer links.

#include <grpcpp/grpcpp.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <future>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "longhaul/exchange.h"
#include "longhaul/v1/exchange.grpc.pb.h"

namespace longhaul {
namespace {

std::string Shell(const std::string& command) {
  std::string out;
  FILE* p = popen(command.c_str(), "r");
  if (p == nullptr) return out;
  char buf[512];
  while (fgets(buf, sizeof buf, p) != nullptr) out += buf;
  pclose(p);
  return out;
}

// Starts site-a and site-b for the whole suite and always stops them.
class ExchangeDaemonTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    char tmpl[] = "/tmp/longhaul-exchange-test-XXXXXX";
    dir_ = mkdtemp(tmpl);
    std::string env = absl::StrCat("LONGHAUL_BIN=", LONGHAUL_BIN_DIR, " ");
    std::string out = Shell(absl::StrCat(env, LONGHAUL_SOURCE_DIR, "/deploy/local-sites.sh up ", dir_));
    ok_ = out.find("LONGHAUL_SITE_B") != std::string::npos;
    site_a_ = absl::StrCat("unix:", dir_, "/site-a/control.sock");
    site_b_ = absl::StrCat("unix:", dir_, "/site-b/control.sock");
  }
  static void TearDownTestSuite() {
    Shell(absl::StrCat(LONGHAUL_SOURCE_DIR, "/deploy/local-sites.sh down ", dir_));
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  void SetUp() override { ASSERT_TRUE(ok_) << "local sites did not start; see " << dir_; }

  // Both sites join `name`.
  std::pair<std::unique_ptr<ExchangeGroup>, std::unique_ptr<ExchangeGroup>> JoinBoth(
      const std::string& name) {
    auto fb = std::async(std::launch::async, [&] {
      return ExchangeGroup::Join(site_b_, name, {"site-a", "site-b"}, absl::Seconds(20));
    });
    auto a = ExchangeGroup::Join(site_a_, name, {"site-a", "site-b"}, absl::Seconds(20));
    auto b = fb.get();
    EXPECT_TRUE(a.ok()) << a.status();
    EXPECT_TRUE(b.ok()) << b.status();
    if (!a.ok() || !b.ok()) return {};
    return {std::move(*a), std::move(*b)};
  }

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

TEST_F(ExchangeDaemonTest, RandomFloat32AverageIsBitIdenticalAtBothSites) {
  auto [a, b] = JoinBoth("bits");
  ASSERT_TRUE(a && b);
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

}  // namespace
}  // namespace longhaul
