// ExchangeHubs of several sites in one process, linked by socketpair
// channels instead of TLS: the group, all-reduce and failure semantics
// without daemons.

#include "daemon/exchange/exchange_hub.h"

#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <future>
#include <map>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "daemon/exchange/deadline.h"
#include "daemon/exchange/reduce.h"
#include "daemon/peer/messaging.h"
#include "daemon/peer/rate_limiter.h"
#include "daemon/wire/frames.h"
#include "daemon/wire/messaging.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/exchange/hub_net.h"
#include "tests/test_tools/eventually.h"

namespace longhaul::exchange {
namespace {

using ::longhaul::testing::Eventually;

using ::testing::HasSubstr;

class ExchangeHubTest : public ::testing::TestWithParam<v1::ExchangeDType> {};

// Values k/4 with small k are exact in every dtype, and so are their sums
// and averages over three sites: the result must equal the local reduction.
TEST_P(ExchangeHubTest, AllReduceEqualsLocalSumAndAverage) {
  const v1::ExchangeDType dtype = GetParam();
  Net net(3);
  net.JoinAll("g", net.names());
  const size_t count = 3000;
  for (v1::ReduceOp op : {v1::SUM, v1::AVG}) {
    std::map<std::string, std::vector<uint8_t>> buffers;
    std::vector<double> expect(count, 0);
    int site_index = 0;
    for (const auto& s : net.names()) {
      std::vector<float> values(count);
      for (size_t i = 0; i < count; ++i) {
        values[i] = static_cast<float>(static_cast<int>((i * 7 + site_index * 13) % 61) - 30) / 4;
        expect[i] += values[i];
      }
      std::vector<uint8_t> raw(count * ElementSize(dtype));
      std::vector<float> acc(values);
      Finish(dtype, v1::SUM, 1, acc, absl::MakeSpan(raw));
      buffers[s] = raw;
      ++site_index;
    }
    auto results = RunAll(net, net.names(), Args(op == v1::SUM ? 0 : 1, dtype, op), buffers);
    for (const auto& s : net.names()) {
      ASSERT_TRUE(results[s].status.ok()) << s << ": " << results[s].status;
      EXPECT_EQ(results[s].stats.peers(), 2u);
      // Sharded (three sites): 2 (N - 1) / N of the buffer.
      EXPECT_EQ(results[s].stats.bytes_sent(), 2 * 2 * (count / 3) * ElementSize(dtype));
      EXPECT_EQ(buffers[s], buffers["site-a"]) << s << " differs from site-a";
    }
    std::vector<float> got(count);
    std::vector<float> unused(count, 0);
    Accumulate(dtype, false, buffers["site-a"], true, absl::MakeSpan(got));
    for (size_t i = 0; i < count; ++i) {
      double want = op == v1::AVG ? expect[i] / 3 : expect[i];
      if (op == v1::AVG) {
        ASSERT_NEAR(got[i], want, std::abs(want) * (dtype == v1::FLOAT32 ? 1e-6 : 1e-2)) << i;
      } else {
        ASSERT_EQ(got[i], want) << i;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, ExchangeHubTest,
                         ::testing::Values(v1::FLOAT32, v1::BFLOAT16, v1::FLOAT16),
                         [](const auto& info) { return v1::ExchangeDType_Name(info.param); });

// At three sites, by the sharded exchange and by the direct one
// (exchange.allreduce: direct, the benchmark's anchor) alike.
class ExchangeHubAlgorithmTest : public ::testing::TestWithParam<bool> {};

TEST_P(ExchangeHubAlgorithmTest, RandomFloatsAreBitIdenticalAtEverySiteAndMatchFixedOrderSum) {
  HubOptions options;
  options.sharded_all_reduce = GetParam();
  Net net(3, nullptr, options);
  net.JoinAll("g", net.names());
  const size_t count = (9u << 20) / 4;  // 9 MiB: three segments per message
  std::mt19937 rng(42);
  std::normal_distribution<float> dist(0, 1);
  std::map<std::string, std::vector<uint8_t>> buffers;
  std::vector<std::vector<float>> inputs;
  for (const auto& s : net.names()) {
    std::vector<float> v(count);
    for (float& x : v) x = dist(rng) * 1e3f;
    inputs.push_back(v);
    buffers[s].resize(count * 4);
    std::memcpy(buffers[s].data(), v.data(), count * 4);
  }
  auto results = RunAll(net, net.names(), Args(0, v1::FLOAT32), buffers);
  for (const auto& s : net.names()) {
    ASSERT_TRUE(results[s].status.ok()) << results[s].status;
    ASSERT_EQ(buffers[s], buffers["site-a"]) << s;
  }
  std::vector<float> got(count);
  std::memcpy(got.data(), buffers["site-a"].data(), count * 4);
  for (size_t i = 0; i < count; ++i) {
    float want = (inputs[0][i] + inputs[1][i]) + inputs[2][i];  // sorted site order
    ASSERT_EQ(got[i], want) << i;
  }
}
INSTANTIATE_TEST_SUITE_P(ShardedAndDirect, ExchangeHubAlgorithmTest, ::testing::Bool());

TEST(ExchangeHubGroupTest, QuantizedAllReduceIsIdenticalAndCloseToTheSum) {
  Net net(2);
  net.JoinAll("g", net.names());
  const size_t count = 5000;
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> dist(-1, 1);
  std::map<std::string, std::vector<uint8_t>> buffers;
  std::vector<double> sum(count, 0);
  for (const auto& s : net.names()) {
    std::vector<float> v(count);
    for (size_t i = 0; i < count; ++i) sum[i] += v[i] = dist(rng);
    buffers[s].resize(count * 4);
    std::memcpy(buffers[s].data(), v.data(), count * 4);
  }
  AllReduceArgs args = Args(0, v1::FLOAT32);
  args.quantize_int8 = true;
  auto results = RunAll(net, net.names(), args, buffers);
  for (const auto& s : net.names()) {
    ASSERT_TRUE(results[s].status.ok()) << results[s].status;
    // int8 codes + 8 bytes per 256-element block, instead of 4 bytes per element.
    EXPECT_EQ(results[s].stats.bytes_sent(), QuantizedSize(count));
  }
  ASSERT_EQ(buffers["site-a"], buffers["site-b"]);
  std::vector<float> got(count);
  std::memcpy(got.data(), buffers["site-a"].data(), count * 4);
  for (size_t i = 0; i < count; ++i) ASSERT_NEAR(got[i], sum[i], 2 * (2.0 / 255 / 2) + 1e-5) << i;
}

TEST(ExchangeHubGroupTest, PeerLostMidAllReduceIsRetryableAndTheNextGenerationWorks) {
  Net net(3);
  net.JoinAll("g", net.names());
  std::map<std::string, std::vector<uint8_t>> buffers;
  const size_t count = 1 << 20;
  for (const auto& s : {"site-a", "site-b"}) buffers[s].assign(count * 4, 0);
  // site-a and site-b start; site-c never does, and dies once both are
  // sending to it.
  std::thread killer([&] {
    ASSERT_TRUE(Eventually([&] {
      return net.hub("site-c").unclaimed_messages("site-a") >= 1 &&
             net.hub("site-c").unclaimed_messages("site-b") >= 1;
    }));
    net.hub("site-c").Shutdown();
  });
  // A 30 s deadline: Unavailable naming site-c, not DeadlineExceeded, shows
  // that the loss ended the op.
  auto results = RunAll(net, {"site-a", "site-b"}, Args(0, v1::FLOAT32, v1::SUM, absl::Seconds(30)),
                        buffers);
  killer.join();
  for (const auto& s : {"site-a", "site-b"}) {
    const OpResult& r = results[s];
    EXPECT_EQ(r.status.code(), absl::StatusCode::kUnavailable) << r.status;
    EXPECT_EQ(r.lost_peer, "site-c");
    EXPECT_THAT(std::string(r.status.message()), HasSubstr("peer site-c was lost"));
    EXPECT_EQ(r.view.generation(), 2u);
    EXPECT_EQ(r.view.members_size(), 2);
  }

  // The next call runs at generation 2 with site-a and site-b.
  std::vector<float> a(count, 1.0f), b(count, 2.0f);
  buffers["site-a"].assign(reinterpret_cast<uint8_t*>(a.data()), reinterpret_cast<uint8_t*>(a.data()) + count * 4);
  buffers["site-b"].assign(reinterpret_cast<uint8_t*>(b.data()), reinterpret_cast<uint8_t*>(b.data()) + count * 4);
  results = RunAll(net, {"site-a", "site-b"}, Args(1, v1::FLOAT32), buffers);
  for (const auto& s : {"site-a", "site-b"}) {
    ASSERT_TRUE(results[s].status.ok()) << results[s].status;
    EXPECT_EQ(results[s].stats.generation(), 2u);
    float first;
    std::memcpy(&first, buffers[s].data(), 4);
    EXPECT_EQ(first, 3.0f);
  }
}

TEST(ExchangeHubGroupTest, TimeoutNamesTheSitesItWaitedFor) {
  Net net(3);
  net.JoinAll("g", net.names());
  std::vector<uint8_t> buffer(64);
  OpResult r = net.hub("site-a").AllReduce(Args(0, v1::FLOAT32, v1::SUM, absl::Milliseconds(300)),
                                           absl::MakeSpan(buffer));
  EXPECT_EQ(r.status.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(std::string(r.status.message()), HasSubstr("waiting for site-b, site-c"));
  EXPECT_TRUE(r.lost_peer.empty());
  // A site that comes late to the same call learns that site-a gave up.
  r = net.hub("site-b").AllReduce(Args(0, v1::FLOAT32, v1::SUM, absl::Seconds(10)), absl::MakeSpan(buffer));
  EXPECT_EQ(r.status.code(), absl::StatusCode::kAborted) << r.status;
  EXPECT_THAT(std::string(r.status.message()), HasSubstr("site-a gave up"));
}

// A member that never commits: the op gives up at its deadline plus 2 s
// (on the hub's clock), however late in the op the wait for that DONE
// began; here 6 s into an op of 8 s.
TEST(ExchangeHubGroupTest, SilentCommitEndsTheOpAtItsDeadlinePlusTwoSeconds) {
  FakeClock clock;
  Net net(2, nullptr, {}, 0, clock);
  net.JoinAll("g", net.names());
  const uint64_t generation = net.hub("site-a").View("g")->generation();
  std::vector<float> buffer(16, 1.0f);
  auto op = std::async(std::launch::async, [&] {
    return net.hub("site-a").AllReduce(Args(0, v1::FLOAT32, v1::SUM, absl::Seconds(8)),
                                       Bytes(buffer));
  });
  // site-b's real hub makes no call; its contribution comes on a raw link
  // 6 s into the op, and its DONE never does.
  ASSERT_TRUE(Eventually([&] { return net.hub("site-b").unclaimed_messages("site-a") == 1; }));
  clock.Advance(TimeDelta::Seconds(6));
  auto raw = net.RawDial("site-b", "site-a");
  v1::ExchangePeerMessage h;
  h.set_kind(v1::ExchangePeerMessage::REDUCE_DATA);
  h.set_group("g");
  h.set_generation(generation);
  h.set_seq(0);
  h.set_dtype(v1::FLOAT32);
  h.set_op(v1::SUM);
  h.set_count(16);
  std::vector<float> theirs(16, 2.0f);
  ASSERT_TRUE(Plant(*raw, h, Bytes(theirs)).ok());
  // site-a committed: its DONE reached site-b.
  ASSERT_TRUE(Eventually([&] { return net.hub("site-b").unclaimed_messages("site-a") == 2; }));
  clock.Advance(TimeDelta::Milliseconds(3999));  // 9.999 s
  absl::SleepFor(4 * kClockPoll);                // the op looks at the clock again
  EXPECT_EQ(op.wait_for(std::chrono::seconds(0)), std::future_status::timeout)
      << "gave up before its deadline plus 2 s";
  clock.Advance(TimeDelta::Milliseconds(1));  // 10 s: the deadline plus 2 s
  const bool ended = op.wait_for(std::chrono::seconds(10)) == std::future_status::ready;
  if (!ended) clock.Advance(TimeDelta::Seconds(30));  // let the overrun end
  OpResult r = op.get();
  EXPECT_TRUE(ended) << "still waiting at its deadline plus 2 s; it gave up " << r.stats.seconds()
                     << " s into the op";
  EXPECT_EQ(r.status.code(), absl::StatusCode::kDeadlineExceeded) << r.status;
  EXPECT_THAT(std::string(r.status.message()), HasSubstr("waiting for site-b to commit"));
  EXPECT_EQ(r.stats.seconds(), 10.0);  // the fake clock stood still at 10 s
  EXPECT_TRUE(buffer == std::vector<float>(16, 1.0f)) << "a failed op wrote the buffer";
}

TEST(ExchangeHubGroupTest, CancelEndsTheCallHereAndAtThePeers) {
  Net net(2);
  net.JoinAll("g", net.names());
  std::vector<uint8_t> buffer(4 << 20);
  AllReduceArgs args = Args(0, v1::FLOAT32, v1::SUM, absl::Seconds(30));
  args.op_id = "to-cancel";
  auto pending = std::async(std::launch::async, [&] {
    return net.hub("site-a").AllReduce(args, absl::MakeSpan(buffer));
  });
  // Cancelled once site-b has begun to get site-a's contribution, so the
  // link to it is up and site-a's ABORT reaches it.
  ASSERT_TRUE(Eventually([&] { return net.hub("site-b").unclaimed_messages("site-a") == 1; }));
  EXPECT_TRUE(net.hub("site-a").Cancel("to-cancel"));
  OpResult r = pending.get();
  EXPECT_EQ(r.status.code(), absl::StatusCode::kCancelled) << r.status;
  EXPECT_FALSE(net.hub("site-a").Cancel("to-cancel"));

  std::vector<uint8_t> other(4 << 20);
  r = net.hub("site-b").AllReduce(Args(0, v1::FLOAT32), absl::MakeSpan(other));
  EXPECT_EQ(r.status.code(), absl::StatusCode::kAborted) << r.status;
  // The group is still usable.
  std::map<std::string, std::vector<uint8_t>> buffers = {{"site-a", std::vector<uint8_t>(16)},
                                                         {"site-b", std::vector<uint8_t>(16)}};
  auto results = RunAll(net, net.names(), Args(1, v1::FLOAT32), buffers);
  for (auto& [s, res] : results) EXPECT_TRUE(res.status.ok()) << s << ": " << res.status;
}

TEST(ExchangeHubGroupTest, MismatchedCallsFailInsteadOfMixingData) {
  Net net(2);
  net.JoinAll("g", net.names());
  std::vector<uint8_t> a(64), b(32);
  auto fa = std::async(std::launch::async, [&] {
    return net.hub("site-a").AllReduce(Args(0, v1::FLOAT32), absl::MakeSpan(a));
  });
  OpResult rb = net.hub("site-b").AllReduce(Args(0, v1::FLOAT32), absl::MakeSpan(b));
  OpResult ra = fa.get();
  // Whichever site notices first fails and aborts the other.
  EXPECT_FALSE(ra.status.ok());
  EXPECT_FALSE(rb.status.ok());
  EXPECT_THAT(std::string(ra.status.message()), HasSubstr("passed"));
  EXPECT_THAT(std::string(rb.status.message()), HasSubstr("passed"));
}

TEST(ExchangeHubGroupTest, SendAndRecvMatchByTag) {
  Net net(2);
  net.JoinAll("g", net.names());
  std::string one = "first message", two(6 << 20, 'x');  // the second spans two segments
  P2PArgs send{"g", "s1", "site-b", "one", absl::Seconds(10), nullptr};
  ASSERT_TRUE(net.hub("site-a").Send(send, {reinterpret_cast<const uint8_t*>(one.data()), one.size()}).status.ok());
  send.tag = "two";
  send.op_id = "s2";
  ASSERT_TRUE(net.hub("site-a").Send(send, {reinterpret_cast<const uint8_t*>(two.data()), two.size()}).status.ok());

  std::vector<uint8_t> out(8 << 20);
  P2PArgs recv{"g", "r1", "site-a", "two", absl::Seconds(10), nullptr};
  OpResult r = net.hub("site-b").Recv(recv, absl::MakeSpan(out));
  ASSERT_TRUE(r.status.ok()) << r.status;
  EXPECT_EQ(r.bytes, two.size());
  EXPECT_EQ(std::string(out.begin(), out.begin() + r.bytes), two);
  recv.tag = "one";
  std::vector<uint8_t> small(4);
  r = net.hub("site-b").Recv(recv, absl::MakeSpan(small));
  EXPECT_EQ(r.status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(r.status.message()), HasSubstr("13 bytes"));
  recv.tag = "three";
  recv.timeout = absl::Milliseconds(100);
  r = net.hub("site-b").Recv(recv, absl::MakeSpan(out));
  EXPECT_EQ(r.status.code(), absl::StatusCode::kDeadlineExceeded);
}

TEST(ExchangeHubGroupTest, JoinChecksMembersAndDeadline) {
  Net net(3);
  auto fa = std::async(std::launch::async, [&] {
    return net.hub("site-a").Join("g", {"site-a", "site-b"}, absl::Seconds(5));
  });
  auto vb = net.hub("site-b").Join("g", {"site-a", "site-b", "site-c"}, absl::Milliseconds(500));
  auto va = fa.get();
  EXPECT_FALSE(va.ok());
  EXPECT_THAT(std::string(va.status().message()), HasSubstr("site-b joined group g with sites"));
  EXPECT_FALSE(vb.ok());

  auto alone = net.hub("site-a").Join("h", {"site-a", "site-c"}, absl::Milliseconds(200));
  EXPECT_EQ(alone.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(std::string(alone.status().message()), HasSubstr("site-c did not join"));
  auto stranger = net.hub("site-a").Join("h", {"site-a", "site-x"}, absl::Seconds(1));
  EXPECT_EQ(stranger.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ExchangeHubGroupTest, OversizedSegmentClosesTheLink) {
  Net net(2);
  net.JoinAll("g", net.names());
  auto raw = net.RawDial("site-a", "site-b");
  v1::ExchangePeerMessage h;
  h.set_kind(v1::ExchangePeerMessage::P2P);
  h.set_group("g");
  h.set_tag("t");
  h.set_msg_id(1);
  h.set_total_bytes(1ull << 40);  // far over the message limit
  h.set_payload_bytes(kSegmentBytes);
  ASSERT_TRUE(wire::SendProto(*raw, wire::FrameType::kControl, 0, h).ok());
  uint8_t byte;
  // site-b closes the link (and counts site-a as lost) instead of allocating.
  EXPECT_FALSE(raw->ReadExactly({&byte, 1}).ok());
  auto view = net.hub("site-b").View("g");
  ASSERT_TRUE(view.ok());
  EXPECT_EQ(view->generation(), 2u);
}

// A Send returns once its bytes are written, but bulk traffic to that peer
// stays paused until the link reports them sent: resumed earlier, it would
// share the link with the message's tail still in the socket buffer.
TEST(ExchangeHubPriorityTest, SendHoldsTheLinkUntilItsBytesAreSent) {
  Net net(2);
  net.JoinAll("g", net.names());
  net.SetUnsent(64 * 1024);
  std::vector<uint8_t> message(64 * 1024, 7);
  P2PArgs send{"g", "held", "site-b", "t", absl::Seconds(10), nullptr};
  OpResult r = net.hub("site-a").Send(send, absl::MakeConstSpan(message));
  ASSERT_TRUE(r.status.ok()) << r.status;
  EXPECT_EQ(net.gate().ActiveCount("site-b", v1::EXCHANGE), 1);
  EXPECT_TRUE(net.gate().HigherActive("site-b", v1::CHECKPOINT));
  EXPECT_FALSE(net.gate().HigherActive("site-a", v1::CHECKPOINT)) << "only the link to site-b is held";

  net.SetUnsent(0);
  EXPECT_TRUE(Eventually([&] { return net.gate().ActiveCount("site-b", v1::EXCHANGE) == 0; }));
  EXPECT_FALSE(net.gate().HigherActive("site-b", v1::CHECKPOINT));

  std::vector<uint8_t> out(message.size());
  P2PArgs recv{"g", "r", "site-a", "t", absl::Seconds(10), nullptr};
  OpResult got = net.hub("site-b").Recv(recv, absl::MakeSpan(out));
  ASSERT_TRUE(got.status.ok()) << got.status;
  EXPECT_TRUE(out == message);
}

// A link whose bytes never leave is stalled: its hold ends once the drain
// limit (2 s on the hub's clock) has passed, and bulk traffic may use it.
TEST(ExchangeHubPriorityTest, AStalledLinkIsHeldUntilTheDrainLimit) {
  FakeClock clock;
  Net net(2, nullptr, {}, 0, clock);
  net.JoinAll("g", net.names());
  net.SetUnsent(4096);  // for good
  std::vector<uint8_t> message(4096, 3);
  P2PArgs send{"g", "held", "site-b", "t", absl::Seconds(10), nullptr};
  ASSERT_TRUE(net.hub("site-a").Send(send, absl::MakeConstSpan(message)).status.ok());
  EXPECT_EQ(net.gate().ActiveCount("site-b", v1::EXCHANGE), 1);

  clock.Advance(TimeDelta::Seconds(2));
  EXPECT_TRUE(Eventually([&] { return net.gate().ActiveCount("site-b", v1::EXCHANGE) == 0; }));
  EXPECT_FALSE(net.gate().HigherActive("site-b", v1::CHECKPOINT));
}

// A hold does not outlive its link: a peer lost while bytes are still
// unsent frees the link for bulk traffic at once.
TEST(ExchangeHubPriorityTest, ABrokenLinkEndsTheHold) {
  Net net(2);
  net.JoinAll("g", net.names());
  net.SetUnsent(4096);
  std::vector<uint8_t> message(4096, 1);
  P2PArgs send{"g", "held", "site-b", "t", absl::Seconds(10), nullptr};
  ASSERT_TRUE(net.hub("site-a").Send(send, absl::MakeConstSpan(message)).status.ok());
  EXPECT_EQ(net.gate().ActiveCount("site-b", v1::EXCHANGE), 1);

  // site-b goes away: site-a reads the end of its link from site-b, loses
  // the peer and breaks the link it holds.
  net.hub("site-b").Shutdown();
  EXPECT_TRUE(Eventually([&] { return net.gate().ActiveCount("site-b", v1::EXCHANGE) == 0; }));
  EXPECT_FALSE(net.gate().HigherActive("site-b", v1::CHECKPOINT));
}

// The operators' `exchange` class cap: every payload segment is charged to
// it before it is written, and a segment waits while the cap is in debt.
TEST(ExchangeHubRateCapTest, ExchangeClassCapChargesEverySegmentAndHoldsTheRest) {
  FakeClock clock;
  peer::RateLimiter limiter(clock);
  limiter.SetClassLimit(v1::EXCHANGE, Bandwidth::MbitsPerSecond(8));  // 1e6 bytes/s
  Net net(2, &limiter);
  net.JoinAll("g", net.names());

  std::vector<uint8_t> message(6 * kMiB);  // two segments: 4 MiB, then 2 MiB
  for (size_t i = 0; i < message.size(); ++i) message[i] = static_cast<uint8_t>(i * 7 + 1);
  P2PArgs send{"g", "capped", "site-b", "t", absl::Seconds(60), nullptr};
  auto sent = std::async(std::launch::async, [&] {
    return net.hub("site-a").Send(send, absl::MakeConstSpan(message));
  });

  // The first segment goes on the full bucket (100 ms at the cap = 1e5
  // bytes) and leaves the cap 4 MiB - 1e5 bytes in debt; the second waits.
  ASSERT_TRUE(Eventually([&] { return limiter.ChargedToClass(v1::EXCHANGE) == 4 * kMiB; }));
  const TimeDelta debt = limiter.TryAcquire("site-b", v1::EXCHANGE, 0);
  EXPECT_NEAR(debt.ToSecondsF(), (4.0 * kMiB - 1e5) * 8 / 8e6, 1e-6);
  EXPECT_EQ(limiter.ChargedToClass(v1::EXCHANGE), 4 * kMiB) << "the second segment went out in debt";
  EXPECT_EQ(limiter.ChargedToClass(v1::CHECKPOINT), 0u);
  EXPECT_EQ(limiter.TryAcquire("site-b", v1::CHECKPOINT, 16 * kMiB), TimeDelta::Zero())
      << "the exchange cap must not hold checkpoint traffic";
  // While it waits, the exchange holds the link: bulk senders to site-b yield.
  EXPECT_EQ(net.gate().ActiveCount("site-b", v1::EXCHANGE), 1);
  EXPECT_TRUE(net.gate().HigherActive("site-b", v1::CHECKPOINT));

  // Once the debt is repaid, the second segment is charged and sent.
  clock.Advance(debt);
  OpResult r = sent.get();
  ASSERT_TRUE(r.status.ok()) << r.status;
  EXPECT_EQ(limiter.ChargedToClass(v1::EXCHANGE), 6 * kMiB);
  EXPECT_NEAR(limiter.TryAcquire("site-b", v1::EXCHANGE, 0).ToSecondsF(), 2.0 * kMiB * 8 / 8e6, 1e-6);
  // Nothing is left unsent on the link: the hold ends.
  EXPECT_TRUE(Eventually([&] { return net.gate().ActiveCount("site-b", v1::EXCHANGE) == 0; }));

  std::vector<uint8_t> out(message.size());
  P2PArgs recv{"g", "r", "site-a", "t", absl::Seconds(10), nullptr};
  OpResult got = net.hub("site-b").Recv(recv, absl::MakeSpan(out));
  ASSERT_TRUE(got.status.ok()) << got.status;
  EXPECT_EQ(got.bytes, message.size());
  EXPECT_TRUE(out == message);
}

TEST(ExchangeHubRateCapTest, PeerCapCountsExchangeTrafficAndCancelStopsAWaitingSend) {
  FakeClock clock;
  peer::RateLimiter limiter(clock);
  limiter.SetPeerLimit("site-b", Bandwidth::MbitsPerSecond(8));
  Net net(2, &limiter);
  net.JoinAll("g", net.names());

  std::vector<uint8_t> small(4096, 1);
  P2PArgs send{"g", "s1", "site-b", "small", absl::Seconds(60), nullptr};
  ASSERT_TRUE(net.hub("site-a").Send(send, absl::MakeConstSpan(small)).status.ok());
  EXPECT_EQ(limiter.ChargedToPeer("site-b"), 4096u);
  EXPECT_EQ(limiter.ChargedToClass(v1::EXCHANGE), 0u) << "no class cap is in force";

  // A big message puts the peer cap in debt; the next one waits for it and
  // a cancel ends that wait (the fake clock never moves).
  std::vector<uint8_t> big(4 * kMiB, 2);
  send.op_id = "s2";
  ASSERT_TRUE(net.hub("site-a").Send(send, absl::MakeConstSpan(big)).status.ok());
  EXPECT_EQ(limiter.ChargedToPeer("site-b"), 4096u + 4 * kMiB);
  send.op_id = "s3";
  auto waiting = std::async(std::launch::async, [&] {
    return net.hub("site-a").Send(send, absl::MakeConstSpan(small));
  });
  ASSERT_TRUE(Eventually([&] { return net.hub("site-a").Cancel("s3"); }));
  OpResult r = waiting.get();
  EXPECT_EQ(r.status.code(), absl::StatusCode::kCancelled) << r.status;
  EXPECT_EQ(limiter.ChargedToPeer("site-b"), 4096u + 4 * kMiB) << "a cancelled send is not charged";
}

// ---------------------------------------------------------------- receiving in place

std::vector<uint8_t> Pattern(size_t bytes, uint8_t seed) {
  std::vector<uint8_t> v(bytes);
  for (size_t i = 0; i < bytes; ++i) v[i] = static_cast<uint8_t>(i * 131 + seed + (i >> 12));
  return v;
}

// A Recv buffer in its own mapping, so a test can unmap it once the Recv has
// returned: a hub that wrote into it afterwards would crash the test.
class MappedBuffer {
 public:
  explicit MappedBuffer(size_t bytes) : bytes_(bytes) {
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    base_ = p == MAP_FAILED ? nullptr : static_cast<uint8_t*>(p);
  }
  ~MappedBuffer() { Unmap(); }
  absl::Span<uint8_t> span() { return {base_, bytes_}; }
  void Unmap() {
    if (base_ != nullptr) munmap(base_, bytes_);
    base_ = nullptr;
  }

 private:
  uint8_t* base_;
  size_t bytes_;
};

// Writes the header of one segment of P2P message `msg_id` (tag `tag` in
// group g) on a raw link, as the peer's hub would; `bytes` of payload must
// follow it.
absl::Status SendSegmentHeader(transport::Channel& raw, uint64_t msg_id, const std::string& tag,
                               uint64_t total_bytes, uint64_t offset, uint64_t bytes) {
  v1::ExchangePeerMessage h;
  h.set_kind(v1::ExchangePeerMessage::P2P);
  h.set_group("g");
  h.set_tag(tag);
  h.set_msg_id(msg_id);
  h.set_total_bytes(total_bytes);
  h.set_offset(offset);
  h.set_payload_bytes(bytes);
  return wire::SendProto(raw, wire::FrameType::kControl, 0, h);
}

// Writes one whole segment (header and payload) of `message`.
absl::Status SendSegment(transport::Channel& raw, uint64_t msg_id, const std::string& tag,
                         absl::Span<const uint8_t> message, uint64_t offset, uint64_t bytes) {
  if (absl::Status s = SendSegmentHeader(raw, msg_id, tag, message.size(), offset, bytes);
      !s.ok()) {
    return s;
  }
  return raw.Write({message.subspan(offset, bytes)});
}

TEST(ExchangeHubInPlaceTest, RecvWaitingBeforeTheMessageGetsItInItsBuffer) {
  Net net(2);
  net.JoinAll("g", net.names());
  const std::vector<uint8_t> message = Pattern(6 * kMiB + 123, 7);  // two segments
  std::vector<uint8_t> out(8 * kMiB, 0);
  P2PArgs recv{"g", "r", "site-a", "t", absl::Seconds(30), nullptr};
  auto got = std::async(std::launch::async,
                        [&] { return net.hub("site-b").Recv(recv, absl::MakeSpan(out)); });
  ASSERT_TRUE(Eventually([&] { return net.hub("site-b").receives_waiting() == 1; }));

  P2PArgs send{"g", "s", "site-b", "t", absl::Seconds(30), nullptr};
  ASSERT_TRUE(net.hub("site-a").Send(send, absl::MakeConstSpan(message)).status.ok());
  OpResult r = got.get();
  ASSERT_TRUE(r.status.ok()) << r.status;
  EXPECT_EQ(r.bytes, message.size());
  EXPECT_EQ(r.stats.bytes_received(), message.size());
  EXPECT_TRUE(std::equal(message.begin(), message.end(), out.begin()));
  EXPECT_EQ(out[message.size()], 0) << "wrote past the message";
  EXPECT_EQ(net.hub("site-b").bytes_received_in_place(), message.size());
  EXPECT_EQ(net.hub("site-b").receives_waiting(), 0u);
}

TEST(ExchangeHubInPlaceTest, MessageBeforeRecvIsBufferedAndCopiedOnce) {
  Net net(2);
  net.JoinAll("g", net.names());
  const std::vector<uint8_t> message = Pattern(5 * kMiB, 3);
  P2PArgs send{"g", "s1", "site-b", "t", absl::Seconds(30), nullptr};
  ASSERT_TRUE(net.hub("site-a").Send(send, absl::MakeConstSpan(message)).status.ok());
  // A later message on the same link: once it is received, the first one
  // has been read whole into a hub buffer.
  send.op_id = "s2";
  send.tag = "later";
  const std::vector<uint8_t> marker = {42};
  ASSERT_TRUE(net.hub("site-a").Send(send, absl::MakeConstSpan(marker)).status.ok());
  std::vector<uint8_t> one(1);
  P2PArgs recv{"g", "r1", "site-a", "later", absl::Seconds(30), nullptr};
  ASSERT_TRUE(net.hub("site-b").Recv(recv, absl::MakeSpan(one)).status.ok());
  const uint64_t in_place = net.hub("site-b").bytes_received_in_place();
  EXPECT_LE(in_place, 1u);

  std::vector<uint8_t> out(message.size());
  recv.op_id = "r2";
  recv.tag = "t";
  OpResult r = net.hub("site-b").Recv(recv, absl::MakeSpan(out));
  ASSERT_TRUE(r.status.ok()) << r.status;
  EXPECT_EQ(r.bytes, message.size());
  EXPECT_TRUE(out == message);
  EXPECT_EQ(net.hub("site-b").bytes_received_in_place(), in_place) << "it arrived before the Recv";
}

TEST(ExchangeHubInPlaceTest, MessageLargerThanTheWaitingBufferFailsThatRecvAndIsDropped) {
  Net net(2);
  net.JoinAll("g", net.names());
  std::vector<uint8_t> small(1 * kMiB);
  P2PArgs recv{"g", "r", "site-a", "t", absl::Seconds(30), nullptr};
  auto got = std::async(std::launch::async,
                        [&] { return net.hub("site-b").Recv(recv, absl::MakeSpan(small)); });
  ASSERT_TRUE(Eventually([&] { return net.hub("site-b").receives_waiting() == 1; }));
  const std::vector<uint8_t> message = Pattern(2 * kMiB, 1);
  P2PArgs send{"g", "s", "site-b", "t", absl::Seconds(30), nullptr};
  ASSERT_TRUE(net.hub("site-a").Send(send, absl::MakeConstSpan(message)).status.ok());
  OpResult r = got.get();
  EXPECT_EQ(r.status.code(), absl::StatusCode::kInvalidArgument) << r.status;
  EXPECT_THAT(std::string(r.status.message()), HasSubstr("the message is 2097152 bytes"));
  EXPECT_EQ(net.hub("site-b").bytes_received_in_place(), 0u);
  // Dropped: the next Recv under the tag waits for a new message.
  recv.op_id = "r2";
  recv.timeout = absl::Milliseconds(100);
  std::vector<uint8_t> big(4 * kMiB);
  EXPECT_EQ(net.hub("site-b").Recv(recv, absl::MakeSpan(big)).status.code(),
            absl::StatusCode::kDeadlineExceeded);
}

// Cancelled between two segments of a message arriving into its buffer: the
// Recv returns, the hub never writes into that buffer again (it is unmapped
// here), and the whole message goes to the next Recv.
TEST(ExchangeHubInPlaceTest, CancelMidMessageKeepsTheMessageAndNeverTouchesTheBufferAgain) {
  Net net(2);
  net.JoinAll("g", net.names());
  auto raw = net.RawDial("site-a", "site-b");
  const std::vector<uint8_t> message = Pattern(6 * kMiB, 9);
  MappedBuffer buffer(8 * kMiB);
  P2PArgs recv{"g", "to-cancel", "site-a", "t", absl::Seconds(60), nullptr};
  auto got =
      std::async(std::launch::async, [&] { return net.hub("site-b").Recv(recv, buffer.span()); });
  ASSERT_TRUE(Eventually([&] { return net.hub("site-b").receives_waiting() == 1; }));
  ASSERT_TRUE(SendSegment(*raw, 1, "t", message, 0, 4 * kMiB).ok());
  ASSERT_TRUE(Eventually([&] { return net.hub("site-b").bytes_received_in_place() == 4 * kMiB; }));

  EXPECT_TRUE(net.hub("site-b").Cancel("to-cancel"));
  OpResult r = got.get();
  EXPECT_EQ(r.status.code(), absl::StatusCode::kCancelled) << r.status;
  buffer.Unmap();

  ASSERT_TRUE(SendSegment(*raw, 1, "t", message, 4 * kMiB, 2 * kMiB).ok());
  std::vector<uint8_t> out(message.size());
  recv.op_id = "again";
  r = net.hub("site-b").Recv(recv, absl::MakeSpan(out));
  ASSERT_TRUE(r.status.ok()) << r.status;
  EXPECT_EQ(r.bytes, message.size());
  EXPECT_TRUE(out == message);
  EXPECT_EQ(net.hub("site-b").bytes_received_in_place(), 4 * kMiB);
}

// Timed out while the peer stalls inside a segment that is being read into
// the Recv's buffer: the Recv still returns (the stalled link is cut after a
// grace period) and the buffer, unmapped right after, is never written.
TEST(ExchangeHubInPlaceTest, TimeoutWhileASegmentStallsCutsTheLinkBeforeReturning) {
  Net net(2);
  net.JoinAll("g", net.names());
  auto raw = net.RawDial("site-a", "site-b");
  const std::vector<uint8_t> message = Pattern(4 * kMiB, 5);
  MappedBuffer buffer(4 * kMiB);
  P2PArgs recv{"g", "r", "site-a", "t", absl::Milliseconds(500), nullptr};
  auto got =
      std::async(std::launch::async, [&] { return net.hub("site-b").Recv(recv, buffer.span()); });
  ASSERT_TRUE(Eventually([&] { return net.hub("site-b").receives_waiting() == 1; }));
  // The header and the first MiB of a 4 MiB segment; the rest never comes.
  ASSERT_TRUE(SendSegmentHeader(*raw, 1, "t", message.size(), 0, message.size()).ok());
  ASSERT_TRUE(raw->Write({absl::MakeConstSpan(message).subspan(0, kMiB)}).ok());

  OpResult r = got.get();
  EXPECT_EQ(r.status.code(), absl::StatusCode::kDeadlineExceeded) << r.status;
  buffer.Unmap();
  // Whatever comes now must not reach the unmapped buffer.
  raw->Write({absl::MakeConstSpan(message).subspan(kMiB)}).IgnoreError();
  // Normally the read was under way and the link got cut: site-a is lost.
  // (Had the Recv given up before the read began, the message would have
  // been kept whole for the next Recv instead.)
  std::vector<uint8_t> out(message.size());
  recv.op_id = "r2";
  recv.timeout = absl::Seconds(10);
  r = net.hub("site-b").Recv(recv, absl::MakeSpan(out));
  if (r.status.ok()) {
    EXPECT_TRUE(out == message);
  } else {
    EXPECT_EQ(r.lost_peer, "site-a") << r.status;
  }
}

// Cancelled in the middle of a segment that is still flowing: the Recv waits
// only for the piece being read, the rest of the segment follows the message
// into a hub buffer, the link stays up and the next Recv gets it whole.
TEST(ExchangeHubInPlaceTest, CancelMidSegmentHandsTheRestToTheNextRecvWithoutCuttingTheLink) {
  Net net(2);
  net.JoinAll("g", net.names());
  auto raw = net.RawDial("site-a", "site-b");
  const std::vector<uint8_t> message = Pattern(4 * kMiB, 11);  // one segment
  MappedBuffer buffer(4 * kMiB);
  P2PArgs recv{"g", "to-cancel", "site-a", "t", absl::Seconds(60), nullptr};
  auto got =
      std::async(std::launch::async, [&] { return net.hub("site-b").Recv(recv, buffer.span()); });
  ASSERT_TRUE(Eventually([&] { return net.hub("site-b").receives_waiting() == 1; }));
  ASSERT_TRUE(SendSegmentHeader(*raw, 1, "t", message.size(), 0, message.size()).ok());
  ASSERT_TRUE(raw->Write({absl::MakeConstSpan(message).subspan(0, kMiB)}).ok());
  ASSERT_TRUE(Eventually([&] { return net.hub("site-b").bytes_received_in_place() == kMiB; }));
  // The rest trickles in (64 KiB every 20 ms) while the Recv is cancelled:
  // the sleep paces the peer, so the cancel finds the segment still flowing.
  std::thread trickle([&] {
    for (uint64_t at = kMiB; at < message.size(); at += 64 << 10) {
      ASSERT_TRUE(raw->Write({absl::MakeConstSpan(message).subspan(at, 64 << 10)}).ok());
      absl::SleepFor(absl::Milliseconds(20));
    }
  });
  EXPECT_TRUE(net.hub("site-b").Cancel("to-cancel"));
  OpResult r = got.get();
  const bool finished_first = r.status.ok();  // only if this thread was starved for a second
  if (finished_first) {
    EXPECT_TRUE(std::equal(message.begin(), message.end(), buffer.span().begin()));
  } else {
    EXPECT_EQ(r.status.code(), absl::StatusCode::kCancelled) << r.status;
  }
  buffer.Unmap();
  trickle.join();

  if (!finished_first) {
    std::vector<uint8_t> out(message.size());
    recv.op_id = "again";
    r = net.hub("site-b").Recv(recv, absl::MakeSpan(out));
    ASSERT_TRUE(r.status.ok()) << r.status;
    EXPECT_TRUE(out == message);
    EXPECT_LT(net.hub("site-b").bytes_received_in_place(), message.size());
  }
  auto view = net.hub("site-b").View("g");
  ASSERT_TRUE(view.ok());
  EXPECT_EQ(view->generation(), 1u) << "the link from site-a was cut";
}

// The link breaks while a message is arriving in place: the Recv learns the
// peer is lost; a sender's DISCARD instead leaves the Recv waiting for the
// next message.
TEST(ExchangeHubInPlaceTest, DiscardMidMessageLeavesTheRecvWaitingAndALostLinkFailsIt) {
  Net net(2);
  net.JoinAll("g", net.names());
  auto raw = net.RawDial("site-a", "site-b");
  const std::vector<uint8_t> first = Pattern(6 * kMiB, 2), second = Pattern(3 * kMiB, 4);
  MappedBuffer buffer(8 * kMiB);
  P2PArgs recv{"g", "r", "site-a", "t", absl::Seconds(60), nullptr};
  auto got =
      std::async(std::launch::async, [&] { return net.hub("site-b").Recv(recv, buffer.span()); });
  ASSERT_TRUE(Eventually([&] { return net.hub("site-b").receives_waiting() == 1; }));
  ASSERT_TRUE(SendSegment(*raw, 1, "t", first, 0, 4 * kMiB).ok());
  v1::ExchangePeerMessage discard;
  discard.set_kind(v1::ExchangePeerMessage::DISCARD);
  discard.set_msg_id(1);
  ASSERT_TRUE(wire::SendProto(*raw, wire::FrameType::kControl, 0, discard).ok());
  ASSERT_TRUE(SendSegment(*raw, 2, "t", second, 0, second.size()).ok());
  OpResult r = got.get();
  ASSERT_TRUE(r.status.ok()) << r.status;
  EXPECT_EQ(r.bytes, second.size());
  EXPECT_TRUE(std::equal(second.begin(), second.end(), buffer.span().begin()));

  recv.op_id = "r2";
  got = std::async(std::launch::async, [&] { return net.hub("site-b").Recv(recv, buffer.span()); });
  ASSERT_TRUE(Eventually([&] { return net.hub("site-b").receives_waiting() == 1; }));
  ASSERT_TRUE(SendSegment(*raw, 3, "t", first, 0, 4 * kMiB).ok());
  ASSERT_TRUE(Eventually(
      [&] { return net.hub("site-b").bytes_received_in_place() == second.size() + 8 * kMiB; }));
  raw.reset();  // the link from site-a closes mid-message
  r = got.get();
  EXPECT_EQ(r.status.code(), absl::StatusCode::kUnavailable) << r.status;
  EXPECT_EQ(r.lost_peer, "site-a");
  EXPECT_EQ(net.hub("site-b").receives_waiting(), 0u);
}

// ---------------------------------------------------------------- streamed buffers

// A progress word as a client's segment holds it (longhaul/shm_progress.h).
struct Word {
  alignas(8) uint64_t value = 0;
  shm::ProgressWord view() { return shm::ProgressWord(&value); }
};

// After a streamed Send to site-b under `send`'s tag was stopped: a fresh
// 1 MiB message (unstreamed, op `op_id`, Pattern `seed`) reaches site-b's
// Recv of `capacity` bytes whole and alone, so site-b dropped the part of
// the stopped one it had.
void ExpectNextMessageArrivesAlone(Net& net, P2PArgs send, const std::string& op_id, uint8_t seed,
                                   size_t capacity) {
  const std::vector<uint8_t> next = Pattern(kMiB, seed);
  send.op_id = op_id;
  send.progress.reset();
  ASSERT_TRUE(net.hub("site-a").Send(send, absl::MakeConstSpan(next)).status.ok());
  std::vector<uint8_t> out(capacity);
  P2PArgs recv{"g", "r", "site-a", "t", absl::Seconds(10), nullptr};
  OpResult r = net.hub("site-b").Recv(recv, absl::MakeSpan(out));
  ASSERT_TRUE(r.status.ok()) << r.status;
  EXPECT_EQ(r.bytes, next.size());
  EXPECT_TRUE(std::equal(next.begin(), next.end(), out.begin()));
}

// A streamed Send reads only what its client has published as written: the
// peer gets nothing until the first segment is ready, and exactly the
// client's bytes in the end.
TEST(ExchangeHubStreamedTest, SendGoesOutAsItsClientFillsTheBuffer) {
  Net net(2);
  net.JoinAll("g", net.names());
  const std::vector<uint8_t> message = Pattern(10 * kMiB + 5, 21);  // three segments
  std::vector<uint8_t> buffer(message.size(), 0);
  Word word;
  std::vector<uint8_t> out(message.size());
  P2PArgs recv{"g", "r", "site-a", "t", absl::Seconds(30), nullptr};
  auto got = std::async(std::launch::async,
                        [&] { return net.hub("site-b").Recv(recv, absl::MakeSpan(out)); });
  ASSERT_TRUE(Eventually([&] { return net.hub("site-b").receives_waiting() == 1; }));
  P2PArgs send{"g", "s", "site-b", "t", absl::Seconds(30), nullptr, word.view()};
  auto sent = std::async(std::launch::async, [&] {
    return net.hub("site-a").Send(send, absl::MakeConstSpan(buffer));
  });
  // The client writes the first segment but one byte: nothing may go out.
  std::memcpy(buffer.data(), message.data(), 4 * kMiB - 1);
  word.view().PublishReady(4 * kMiB - 1);
  // Two more looks: the second began after the first had counted, so after
  // the publish, and it still found the segment unwritten.
  const uint64_t looks = net.hub("site-a").unfilled_looks();
  ASSERT_TRUE(Eventually([&] { return net.hub("site-a").unfilled_looks() >= looks + 2; }));
  EXPECT_EQ(net.hub("site-b").bytes_received_in_place(), 0u);
  // Then the rest, a MiB at a time.
  for (uint64_t at = 4 * kMiB - 1; at < message.size(); at += kMiB) {
    const uint64_t n = std::min<uint64_t>(kMiB, message.size() - at);
    std::memcpy(buffer.data() + at, message.data() + at, n);
    word.view().PublishReady(at + n);
  }
  OpResult s = sent.get();
  ASSERT_TRUE(s.status.ok()) << s.status;
  OpResult r = got.get();
  ASSERT_TRUE(r.status.ok()) << r.status;
  EXPECT_EQ(r.bytes, message.size());
  EXPECT_TRUE(out == message);
}

// A client that stops writing its buffer: the Send fails at its timeout (on
// the hub's clock) with an error that says so, and the peer drops the part
// it got, so the next message under the tag arrives whole and alone.
TEST(ExchangeHubStreamedTest, SendWhoseClientStallsTimesOutAndThePeerDropsThePart) {
  FakeClock clock;
  Net net(2, nullptr, {}, 0, clock);
  net.JoinAll("g", net.names());
  const std::vector<uint8_t> message = Pattern(6 * kMiB, 23);
  Word word;
  word.view().PublishReady(5 * kMiB);  // one segment can go, the second never
  P2PArgs send{"g", "s", "site-b", "t", absl::Seconds(30), nullptr, word.view()};
  auto sent = std::async(std::launch::async, [&] {
    return net.hub("site-a").Send(send, absl::MakeConstSpan(message));
  });
  // Waiting for the second segment: not timed out before its deadline.
  ASSERT_TRUE(Eventually([&] { return net.hub("site-a").unfilled_looks() > 0; }));
  clock.Advance(TimeDelta::Seconds(29));
  const uint64_t looks = net.hub("site-a").unfilled_looks();
  ASSERT_TRUE(Eventually([&] { return net.hub("site-a").unfilled_looks() >= looks + 2; }));
  ASSERT_EQ(sent.wait_for(std::chrono::seconds(0)), std::future_status::timeout);
  clock.Advance(TimeDelta::Seconds(1));
  OpResult s = sent.get();
  EXPECT_EQ(s.status.code(), absl::StatusCode::kDeadlineExceeded) << s.status;
  EXPECT_THAT(std::string(s.status.message()),
              HasSubstr("its client had written only 5242880 of the 6291456 bytes"));

  ExpectNextMessageArrivesAlone(net, send, "s2", 25, message.size());
}

// A progress word that claims more than the buffer, or goes back, is the
// client's error: the Send fails with InvalidArgument, reads nothing on its
// say-so, and the peer drops what it got.
TEST(ExchangeHubStreamedTest, SendWhoseProgressWordIsImpossibleFails) {
  Net net(2);
  net.JoinAll("g", net.names());
  const std::vector<uint8_t> message = Pattern(10 * kMiB, 29);
  Word word;
  word.view().PublishReady(~uint64_t{0});
  P2PArgs send{"g", "s1", "site-b", "t", absl::Seconds(30), nullptr, word.view()};
  OpResult s = net.hub("site-a").Send(send, absl::MakeConstSpan(message));
  EXPECT_EQ(s.status.code(), absl::StatusCode::kInvalidArgument) << s.status;
  EXPECT_THAT(std::string(s.status.message()),
              HasSubstr("its client says 18446744073709551615 bytes of its buffer of 10485760 "
                        "are written"));

  word.view().PublishReady(5 * kMiB);  // the first segment may go, not the second
  send.op_id = "s2";
  auto sent = std::async(std::launch::async, [&] {
    return net.hub("site-a").Send(send, absl::MakeConstSpan(message));
  });
  // A look that found the second segment unwritten came after one that saw 5 MiB.
  ASSERT_TRUE(Eventually([&] { return net.hub("site-a").unfilled_looks() > 0; }));
  word.view().PublishReady(kMiB);
  s = sent.get();
  EXPECT_EQ(s.status.code(), absl::StatusCode::kInvalidArgument) << s.status;
  EXPECT_THAT(std::string(s.status.message()),
              HasSubstr("its client's progress word went back from 5242880 to 1048576 bytes"));

  // The peer dropped the part it got: the next message under the tag
  // arrives whole and alone.
  ExpectNextMessageArrivesAlone(net, send, "s3", 31, message.size());
}

// A client that goes away while writing: the Send ends without waiting for
// its timeout.
TEST(ExchangeHubStreamedTest, SendWhoseClientGoesAwayEndsEarly) {
  Net net(2);
  net.JoinAll("g", net.names());
  const std::vector<uint8_t> message = Pattern(2 * kMiB, 27);
  Word word;
  std::atomic<bool> gone{false};
  P2PArgs send{"g", "s", "site-b", "t", absl::Seconds(60), [&] { return gone.load(); },
               word.view()};
  auto sent = std::async(std::launch::async, [&] {
    return net.hub("site-a").Send(send, absl::MakeConstSpan(message));
  });
  gone = true;  // asked every 50 ms while the Send waits for its client
  ASSERT_EQ(sent.wait_for(std::chrono::seconds(5)), std::future_status::ready);
  OpResult s = sent.get();
  EXPECT_EQ(s.status.code(), absl::StatusCode::kCancelled) << s.status;
  EXPECT_THAT(std::string(s.status.message()), HasSubstr("client went away"));
}

// A streamed Recv publishes each piece as it lands, under one epoch, and
// the bytes below the published count are final; the count reaches the
// message's length before the Recv returns.
TEST(ExchangeHubStreamedTest, RecvPublishesWhatHasLandedAsItArrives) {
  Net net(2);
  net.JoinAll("g", net.names());
  auto raw = net.RawDial("site-a", "site-b");
  const std::vector<uint8_t> message = Pattern(6 * kMiB, 29);
  MappedBuffer buffer(8 * kMiB);
  Word word;
  P2PArgs recv{"g", "r", "site-a", "t", absl::Seconds(30), nullptr, word.view()};
  auto got =
      std::async(std::launch::async, [&] { return net.hub("site-b").Recv(recv, buffer.span()); });
  ASSERT_TRUE(Eventually([&] { return net.hub("site-b").receives_waiting() == 1; }));
  ASSERT_TRUE(SendSegment(*raw, 1, "t", message, 0, 4 * kMiB).ok());
  ASSERT_TRUE(Eventually([&] { return word.view().LoadLanded().bytes == 4 * kMiB; }));
  const shm::Landed first = word.view().LoadLanded();
  EXPECT_EQ(first.epoch, 1u);
  EXPECT_TRUE(std::equal(message.begin(), message.begin() + first.bytes, buffer.span().begin()));
  EXPECT_EQ(got.wait_for(std::chrono::milliseconds(50)), std::future_status::timeout);

  ASSERT_TRUE(SendSegment(*raw, 1, "t", message, 4 * kMiB, 2 * kMiB).ok());
  OpResult r = got.get();
  ASSERT_TRUE(r.status.ok()) << r.status;
  const shm::Landed last = word.view().LoadLanded();
  EXPECT_EQ(last.epoch, first.epoch);
  EXPECT_EQ(last.bytes, message.size());
  EXPECT_TRUE(std::equal(message.begin(), message.end(), buffer.span().begin()));
}

// A message that stops arriving (DISCARD) and another that takes the buffer:
// the epoch moves on, so a client knows what it copied is stale.
TEST(ExchangeHubStreamedTest, RecvStartsANewEpochWhenAnotherMessageRewritesTheBuffer) {
  Net net(2);
  net.JoinAll("g", net.names());
  auto raw = net.RawDial("site-a", "site-b");
  const std::vector<uint8_t> first = Pattern(6 * kMiB, 31), second = Pattern(5 * kMiB, 33);
  MappedBuffer buffer(8 * kMiB);
  Word word;
  P2PArgs recv{"g", "r", "site-a", "t", absl::Seconds(30), nullptr, word.view()};
  auto got =
      std::async(std::launch::async, [&] { return net.hub("site-b").Recv(recv, buffer.span()); });
  ASSERT_TRUE(Eventually([&] { return net.hub("site-b").receives_waiting() == 1; }));
  ASSERT_TRUE(SendSegment(*raw, 1, "t", first, 0, 4 * kMiB).ok());
  ASSERT_TRUE(Eventually([&] { return word.view().LoadLanded().bytes == 4 * kMiB; }));
  const uint32_t stale = word.view().LoadLanded().epoch;
  v1::ExchangePeerMessage discard;
  discard.set_kind(v1::ExchangePeerMessage::DISCARD);
  discard.set_msg_id(1);
  ASSERT_TRUE(wire::SendProto(*raw, wire::FrameType::kControl, 0, discard).ok());
  ASSERT_TRUE(Eventually([&] { return word.view().LoadLanded().epoch != stale; }));
  EXPECT_EQ(word.view().LoadLanded().bytes, 0u);
  ASSERT_TRUE(SendSegment(*raw, 2, "t", second, 0, 4 * kMiB).ok());
  ASSERT_TRUE(SendSegment(*raw, 2, "t", second, 4 * kMiB, kMiB).ok());
  OpResult r = got.get();
  ASSERT_TRUE(r.status.ok()) << r.status;
  EXPECT_EQ(r.bytes, second.size());
  const shm::Landed last = word.view().LoadLanded();
  EXPECT_GT(last.epoch, stale);
  EXPECT_EQ(last.bytes, second.size());
  EXPECT_TRUE(std::equal(second.begin(), second.end(), buffer.span().begin()));
}

// A message that was here before the Recv is copied into the buffer whole;
// the word then names a fresh epoch and the whole length.
TEST(ExchangeHubStreamedTest, RecvOfABufferedMessagePublishesItWhole) {
  Net net(2);
  net.JoinAll("g", net.names());
  const std::vector<uint8_t> message = Pattern(2 * kMiB, 35);
  P2PArgs send{"g", "s", "site-b", "t", absl::Seconds(30), nullptr};
  ASSERT_TRUE(net.hub("site-a").Send(send, absl::MakeConstSpan(message)).status.ok());
  const std::vector<uint8_t> marker = {42};
  send.op_id = "s2";
  send.tag = "later";
  ASSERT_TRUE(net.hub("site-a").Send(send, absl::MakeConstSpan(marker)).status.ok());
  std::vector<uint8_t> one(1);
  P2PArgs recv{"g", "r1", "site-a", "later", absl::Seconds(30), nullptr};
  ASSERT_TRUE(net.hub("site-b").Recv(recv, absl::MakeSpan(one)).status.ok());

  std::vector<uint8_t> out(message.size());
  Word word;
  recv = {"g", "r2", "site-a", "t", absl::Seconds(30), nullptr, word.view()};
  OpResult r = net.hub("site-b").Recv(recv, absl::MakeSpan(out));
  ASSERT_TRUE(r.status.ok()) << r.status;
  EXPECT_TRUE(out == message);
  const shm::Landed landed = word.view().LoadLanded();
  EXPECT_GE(landed.epoch, 1u);
  EXPECT_EQ(landed.bytes, message.size());
}


// ---------------------------------------------------------------- membership and limits

// What a non-member plants for the all-reduces #0-3 of `group`: at each of
// generations 0-3 an ABORT, a DONE and a contribution of `count` floats of
// 1000, and two JOINs (one naming it, one not).
void PlantReduceTraffic(transport::Channel& raw, const std::string& group, size_t count) {
  using Msg = v1::ExchangePeerMessage;
  std::vector<float> junk(count, 1000.0f);
  for (uint64_t seq = 0; seq < 4; ++seq) {
    for (uint64_t gen = 0; gen < 4; ++gen) {
      Msg h;
      h.set_group(group);
      h.set_seq(seq);
      h.set_generation(gen);
      h.set_kind(Msg::ABORT);
      h.set_reason("planted");
      ASSERT_TRUE(Plant(raw, h).ok());
      h.set_kind(Msg::DONE);
      h.clear_reason();
      ASSERT_TRUE(Plant(raw, h).ok());
      h.set_kind(Msg::REDUCE_DATA);
      h.set_dtype(v1::FLOAT32);
      h.set_op(v1::SUM);
      h.set_count(count);
      ASSERT_TRUE(Plant(raw, h, Bytes(junk)).ok());
    }
  }
  Msg join;
  join.set_kind(Msg::JOIN);
  join.set_group(group);
  join.set_generation(7);
  for (const char* s : {"site-a", "site-b", "site-c"}) join.add_members(s);
  ASSERT_TRUE(Plant(raw, join).ok());
  join.clear_members();  // a proposal without its sender is not kept
  for (const char* s : {"site-a", "site-b"}) join.add_members(s);
  ASSERT_TRUE(Plant(raw, join).ok());
}

// A zero-byte message for a group no one has: kept (and counted) as
// unclaimed, so once the count shows it, everything sent before it on the
// same link has been read.
void Probe(transport::Channel& raw, const std::string& tag) {
  v1::ExchangePeerMessage h;
  h.set_kind(v1::ExchangePeerMessage::P2P);
  h.set_group("probe");
  h.set_tag(tag);
  ASSERT_TRUE(Plant(raw, h).ok());
}

// site-c is a configured peer but not a member of site-a + site-b's group.
// What it plants for that group, before the group forms and after, neither
// fails (ABORT), finishes (DONE) nor feeds (data) the members' all-reduces,
// which all complete with the members' sum; and what it left before the
// group formed is gone once it has.
TEST(ExchangeHubMembershipTest, NonMemberCannotAbortFinishOrFeedTheMembersAllReduce) {
  Net net(3);
  const std::vector<std::string> members = {"site-a", "site-b"};
  const size_t count = 1000;
  std::map<std::string, std::unique_ptr<transport::Channel>> raw;
  for (const auto& m : members) {
    raw[m] = net.RawDial("site-c", m);
    PlantReduceTraffic(*raw[m], "g", count);
    Probe(*raw[m], "before");
  }
  for (const auto& m : members) {
    ASSERT_TRUE(Eventually([&] { return net.hub(m).unclaimed_messages("site-c") == 50; }))
        << m << ": " << net.hub(m).unclaimed_messages("site-c");
  }
  net.JoinAll("g", members);
  for (const auto& m : members) EXPECT_EQ(net.hub(m).unclaimed_messages("site-c"), 1u) << m;
  for (const auto& m : members) {
    PlantReduceTraffic(*raw[m], "g", count);
    Probe(*raw[m], "after");
  }
  for (const auto& m : members) {
    // The probe before, and site-c's JOIN naming it: a proposal for a group
    // that would have it, kept (and counted) for a Join that may come.
    ASSERT_TRUE(Eventually([&] { return net.hub(m).unclaimed_messages("site-c") == 3; }))
        << m << ": " << net.hub(m).unclaimed_messages("site-c");
  }
  for (uint64_t seq = 0; seq < 4; ++seq) {
    std::map<std::string, std::vector<uint8_t>> buffers;
    for (size_t k = 0; k < members.size(); ++k) {
      std::vector<float> v(count);
      for (size_t i = 0; i < count; ++i) v[i] = static_cast<float>((k + 1) * i + seq);
      buffers[members[k]].resize(count * 4);
      std::memcpy(buffers[members[k]].data(), v.data(), count * 4);
    }
    auto results = RunAll(net, members, Args(seq, v1::FLOAT32), buffers);
    for (const auto& m : members) {
      ASSERT_TRUE(results[m].status.ok()) << m << " #" << seq << ": " << results[m].status;
      std::vector<float> got(count);
      std::memcpy(got.data(), buffers[m].data(), count * 4);
      for (size_t i = 0; i < count; ++i) {
        ASSERT_EQ(got[i], static_cast<float>(3 * i + 2 * seq)) << m << " #" << seq << " [" << i << "]";
      }
    }
  }
}

// 100 zero-byte messages no one has asked for: site-a keeps the limit's 32,
// refuses the rest back to site-b, and takes new ones again once calls have
// claimed those. A raw flood of 5,000 more for a group no one has stays at
// the limit too.
TEST(ExchangeHubLimitsTest, ZeroByteFloodStopsAtTheMessageLimit) {
  HubOptions options;
  options.max_unclaimed_messages_per_peer = 32;
  Net net(2, nullptr, options);
  net.JoinAll("g", net.names());
  std::vector<uint8_t> none;
  for (int i = 0; i < 100; ++i) {
    P2PArgs send{"g", absl::StrCat("s", i), "site-a", absl::StrCat("t", i), absl::Seconds(10),
                 nullptr};
    OpResult s = net.hub("site-b").Send(send, absl::MakeConstSpan(none));
    ASSERT_TRUE(s.status.ok()) << s.status;
  }
  ASSERT_TRUE(Eventually([&] { return net.hub("site-b").refusals_received() == 68; }));
  EXPECT_EQ(net.hub("site-a").unclaimed_messages("site-b"), 32u);
  uint8_t byte = 0;
  for (int i = 0; i < 32; ++i) {
    P2PArgs recv{"g", absl::StrCat("r", i), "site-b", absl::StrCat("t", i), absl::Seconds(10),
                 nullptr};
    OpResult r = net.hub("site-a").Recv(recv, {&byte, 1});
    ASSERT_TRUE(r.status.ok()) << i << ": " << r.status;
    EXPECT_EQ(r.bytes, 0u);
  }
  EXPECT_EQ(net.hub("site-a").unclaimed_messages("site-b"), 0u);
  P2PArgs refused{"g", "r32", "site-b", "t32", absl::Milliseconds(50), nullptr};
  EXPECT_EQ(net.hub("site-a").Recv(refused, {&byte, 1}).status.code(),
            absl::StatusCode::kDeadlineExceeded);
  P2PArgs again{"g", "s-again", "site-a", "again", absl::Seconds(10), nullptr};
  ASSERT_TRUE(net.hub("site-b").Send(again, absl::MakeConstSpan(none)).status.ok());
  again.op_id = "r-again";
  again.peer = "site-b";
  EXPECT_TRUE(net.hub("site-a").Recv(again, {&byte, 1}).status.ok());

  auto raw = net.RawDial("site-c", "site-a");
  for (int i = 0; i < 5000; ++i) Probe(*raw, absl::StrCat("flood-", i));
  // A malformed segment after them closes the link: once it has, site-a
  // has read all of them.
  v1::ExchangePeerMessage bad;
  bad.set_kind(v1::ExchangePeerMessage::P2P);
  bad.set_group("x");
  bad.set_total_bytes(1ull << 40);
  bad.set_payload_bytes(kSegmentBytes);
  ASSERT_TRUE(wire::SendProto(*raw, wire::FrameType::kControl, 0, bad).ok());
  EXPECT_FALSE(raw->ReadExactly({&byte, 1}).ok());
  EXPECT_EQ(net.hub("site-a").unclaimed_messages("site-c"), 32u);
}

// Bytes of unclaimed messages are charged to the sender's PeerMemoryBudget:
// past it a message is refused, and a Send still sending one fails with the
// reason; what was kept is still received whole.
TEST(ExchangeHubLimitsTest, MessagesPastThePeersMemoryBudgetAreRefused) {
  Net net(2, nullptr, {}, kMiB);
  net.JoinAll("g", net.names());
  const std::vector<uint8_t> kept = Pattern(600 << 10, 31);
  P2PArgs send{"g", "s0", "site-a", "x0", absl::Seconds(10), nullptr};
  ASSERT_TRUE(net.hub("site-b").Send(send, absl::MakeConstSpan(kept)).status.ok());
  ASSERT_TRUE(Eventually([&] { return net.budget("site-a").used("site-b") == kept.size(); }));
  send.op_id = "s1";
  send.tag = "x1";
  ASSERT_TRUE(net.hub("site-b").Send(send, absl::MakeConstSpan(kept)).status.ok());
  ASSERT_TRUE(Eventually([&] { return net.hub("site-b").refusals_received() == 1; }));
  EXPECT_EQ(net.budget("site-a").used("site-b"), kept.size());

  // Three segments; the second waits for its client until site-a's
  // refusal of the first is back, so the third is not sent.
  const std::vector<uint8_t> large = Pattern(10 * kMiB, 33);
  Word word;
  word.view().PublishReady(kSegmentBytes);
  P2PArgs streamed{"g", "s2", "site-a", "x2", absl::Seconds(30), nullptr, word.view()};
  auto sent = std::async(std::launch::async, [&] {
    return net.hub("site-b").Send(streamed, absl::MakeConstSpan(large));
  });
  ASSERT_TRUE(Eventually([&] { return net.hub("site-b").refusals_received() == 2; }));
  word.view().PublishReady(large.size());
  OpResult s = sent.get();
  EXPECT_EQ(s.status.code(), absl::StatusCode::kResourceExhausted) << s.status;
  EXPECT_THAT(std::string(s.status.message()), HasSubstr("site-a refused the message"));
  EXPECT_THAT(std::string(s.status.message()), HasSubstr("peer_limits.memory_per_peer"));

  std::vector<uint8_t> out(large.size());
  P2PArgs recv{"g", "r0", "site-b", "x0", absl::Seconds(10), nullptr};
  OpResult r = net.hub("site-a").Recv(recv, absl::MakeSpan(out));
  ASSERT_TRUE(r.status.ok()) << r.status;
  ASSERT_EQ(r.bytes, kept.size());
  EXPECT_TRUE(std::equal(kept.begin(), kept.end(), out.begin()));
  EXPECT_EQ(net.budget("site-a").used("site-b"), 0u);
  recv.op_id = "r1";
  recv.tag = "x1";
  recv.timeout = absl::Milliseconds(50);
  EXPECT_EQ(net.hub("site-a").Recv(recv, absl::MakeSpan(out)).status.code(),
            absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(net.hub("site-a").unclaimed_messages("site-b"), 0u);
}

// Leaving a group drops what its sites sent that no call took, and frees
// their share of the limits.
TEST(ExchangeHubLimitsTest, LeaveDropsTheGroupsUnclaimedMessages) {
  Net net(2, nullptr, {}, kMiB);
  net.JoinAll("g", net.names());
  const std::vector<uint8_t> message = Pattern(1000, 35);
  for (int i = 0; i < 3; ++i) {
    P2PArgs send{"g", absl::StrCat("s", i), "site-a", absl::StrCat("t", i), absl::Seconds(10),
                 nullptr};
    ASSERT_TRUE(net.hub("site-b").Send(send, absl::MakeConstSpan(message)).status.ok());
  }
  // Counted from their first segment on, but dropped by Leave once whole.
  ASSERT_TRUE(Eventually([&] { return net.hub("site-a").messages_held() == 3; }));
  EXPECT_EQ(net.hub("site-a").unclaimed_messages("site-b"), 3u);
  EXPECT_EQ(net.budget("site-a").used("site-b"), 3 * message.size());
  net.hub("site-a").Leave("g");
  EXPECT_EQ(net.hub("site-a").unclaimed_messages("site-b"), 0u);
  EXPECT_EQ(net.budget("site-a").used("site-b"), 0u);
}

// site-b leaves and re-joins while site-a still holds the group; site-a
// leaves and re-joins after site-b's JOIN arrived. Leave must keep that
// JOIN, or site-a waits for one that never comes again.
TEST(ExchangeHubMembershipTest, AJoinThatArrivedBeforeLeaveStillCounts) {
  Net net(2);
  net.JoinAll("g", net.names());
  net.hub("site-b").Leave("g");
  auto b = std::async(std::launch::async,
                      [&] { return net.hub("site-b").Join("g", net.names(), absl::Seconds(10)); });
  ASSERT_TRUE(Eventually([&] { return net.hub("site-a").messages_held() >= 1; }));
  net.hub("site-a").Leave("g");
  auto a = net.hub("site-a").Join("g", net.names(), absl::Seconds(10));
  ASSERT_TRUE(a.ok()) << a.status();
  auto bv = b.get();
  ASSERT_TRUE(bv.ok()) << bv.status();
  EXPECT_EQ(a->generation(), bv->generation());
}

// A group of site-a + site-b re-formed with site-c: each site starts its
// all-reduce as soon as its own Join returns, so site-c's contribution can
// reach a site whose Join is still waiting; it is taken, being a member's
// of the Join in progress there.
TEST(ExchangeHubMembershipTest, NewMembersDataDuringTheJoinInProgressIsTaken) {
  Net net(3);
  net.JoinAll("g", {"site-a", "site-b"});
  const size_t count = 1000;
  for (int round = 0; round < 5; ++round) {
    std::map<std::string, std::vector<float>> buffers;
    std::map<std::string, std::future<std::pair<absl::Status, OpResult>>> done;
    for (size_t k = 0; k < net.names().size(); ++k) {
      const std::string site = net.names()[k];
      buffers[site].assign(count, static_cast<float>(k + 1));
      done[site] = std::async(std::launch::async, [&, site] {
        auto view = net.hub(site).Join("g", net.names(), absl::Seconds(10));
        if (!view.ok()) return std::make_pair(view.status(), OpResult{});
        AllReduceArgs args = Args(round, v1::FLOAT32);
        args.op_id = absl::StrCat("join-", round, "@", site);
        return std::make_pair(absl::OkStatus(),
                              net.hub(site).AllReduce(args, Bytes(buffers[site])));
      });
    }
    for (const auto& site : net.names()) {
      auto [joined, result] = done[site].get();
      ASSERT_TRUE(joined.ok()) << site << " round " << round << ": " << joined;
      ASSERT_TRUE(result.status.ok()) << site << " round " << round << ": " << result.status;
      for (float x : buffers[site]) ASSERT_EQ(x, 6.0f) << site << " round " << round;
    }
  }
}

}  // namespace
}  // namespace longhaul::exchange
