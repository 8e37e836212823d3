// The all-gather and the broadcast (daemon/exchange/gather.cc,
// proto/EXCHANGE.md, All-gather and Broadcast) on ExchangeHubs of two to
// four sites in one process: results bit-identical at every site and in
// member order, the bytes each site sends, a hostile member's sizes, a site
// lost during each op with the survivors failing, then continuing, and a
// client that scribbles over its buffer while it is sent.

#include <algorithm>
#include <atomic>
#include <cstring>
#include <functional>
#include <future>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "common/clock.h"
#include "daemon/exchange/exchange_hub.h"
#include "daemon/peer/rate_limiter.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/exchange/hub_net.h"
#include "tests/test_tools/eventually.h"

namespace longhaul::exchange {
namespace {

using ::longhaul::testing::Eventually;
using ::testing::HasSubstr;
using Msg = v1::ExchangePeerMessage;
using Buffers = std::map<std::string, std::vector<uint8_t>>;

Buffers RandomBytes(const std::vector<std::string>& sites, size_t bytes, uint32_t seed) {
  std::mt19937 rng(seed);
  Buffers buffers;
  for (const auto& s : sites) {
    buffers[s].resize(bytes);
    for (auto& b : buffers[s]) b = static_cast<uint8_t>(rng());
  }
  return buffers;
}

GatherArgs GArgs(uint64_t seq, absl::Duration timeout = absl::Seconds(20)) {
  GatherArgs a;
  a.group = "g";
  a.op_id = absl::StrCat("gather-", seq, "-", std::rand());
  a.seq = seq;
  a.timeout = timeout;
  return a;
}

// One all-gather at each of `sites` at once; outputs[s] is sized for
// `members` parts.
std::map<std::string, OpResult> GatherAll(Net& net, const std::vector<std::string>& sites,
                                          const GatherArgs& args, Buffers& inputs, Buffers& outputs,
                                          size_t members) {
  std::map<std::string, std::future<OpResult>> futures;
  for (const auto& s : sites) {
    outputs[s].assign(members * inputs[s].size(), 0xEE);
    GatherArgs a = args;
    a.op_id = absl::StrCat(args.op_id, "@", s);
    futures[s] = std::async(std::launch::async, [&, s, a] {
      return net.hub(s).AllGather(a, inputs[s], absl::MakeSpan(outputs[s]));
    });
  }
  std::map<std::string, OpResult> results;
  for (auto& [s, f] : futures) results[s] = f.get();
  return results;
}

// One broadcast from `root` at each of `sites` at once.
std::map<std::string, OpResult> BroadcastAll(Net& net, const std::vector<std::string>& sites,
                                             GatherArgs args, const std::string& root,
                                             Buffers& buffers) {
  args.root = root;
  std::map<std::string, std::future<OpResult>> futures;
  for (const auto& s : sites) {
    GatherArgs a = args;
    a.op_id = absl::StrCat(args.op_id, "@", s);
    futures[s] = std::async(std::launch::async, [&, s, a] {
      return net.hub(s).Broadcast(a, absl::MakeSpan(buffers[s]));
    });
  }
  std::map<std::string, OpResult> results;
  for (auto& [s, f] : futures) results[s] = f.get();
  return results;
}

// The inputs concatenated in sorted site order.
std::vector<uint8_t> Concatenation(const Buffers& inputs) {
  std::vector<uint8_t> want;
  for (const auto& [s, v] : inputs) want.insert(want.end(), v.begin(), v.end());
  return want;
}

void ExpectGathers(Net& net, const std::vector<std::string>& sites, uint64_t seq, size_t bytes) {
  Buffers inputs = RandomBytes(sites, bytes, static_cast<uint32_t>(seq * 17 + bytes));
  Buffers outputs;
  auto results = GatherAll(net, sites, GArgs(seq), inputs, outputs, sites.size());
  const std::vector<uint8_t> want = Concatenation(inputs);
  for (const auto& s : sites) {
    ASSERT_TRUE(results[s].status.ok()) << s << " #" << seq << ": " << results[s].status;
    EXPECT_EQ(results[s].stats.peers(), sites.size() - 1);
    EXPECT_EQ(results[s].stats.generation(), net.hub(s).View("g")->generation());
    ASSERT_TRUE(outputs[s] == want) << s << " #" << seq << " is not the concatenation";
  }
}

void ExpectBroadcasts(Net& net, const std::vector<std::string>& sites, uint64_t seq,
                      const std::string& root, size_t bytes) {
  Buffers buffers = RandomBytes(sites, bytes, static_cast<uint32_t>(seq * 13 + bytes));
  const std::vector<uint8_t> want = buffers[root];
  auto results = BroadcastAll(net, sites, GArgs(seq), root, buffers);
  for (const auto& s : sites) {
    ASSERT_TRUE(results[s].status.ok()) << s << " #" << seq << ": " << results[s].status;
    ASSERT_TRUE(buffers[s] == want) << s << " #" << seq << " differs from " << root << "'s";
  }
}

// ---------------------------------------------------------------- results

class GatherTest : public ::testing::TestWithParam<int> {};

// Sizes of one byte, none, an odd size, and several 4 MiB segments.
TEST_P(GatherTest, AllGatherIsTheConcatenationInMemberOrderEverywhere) {
  Net net(GetParam());
  net.JoinAll("g", net.names());
  uint64_t seq = 0;
  for (size_t bytes : {size_t{1}, size_t{0}, size_t{100003}, size_t{(9u << 20) + 7}}) {
    SCOPED_TRACE(bytes);
    ExpectGathers(net, net.names(), seq++, bytes);
  }
}

TEST_P(GatherTest, BroadcastGivesEveryMemberTheRootsBuffer) {
  Net net(GetParam());
  net.JoinAll("g", net.names());
  uint64_t seq = 0;
  for (const auto& root : net.names()) {
    for (size_t bytes : {size_t{0}, size_t{4099}, size_t{(5u << 20) + 1}}) {
      SCOPED_TRACE(root + " " + std::to_string(bytes));
      ExpectBroadcasts(net, net.names(), seq++, root, bytes);
    }
  }
}

// All three collectives share the group's sequence numbers.
TEST_P(GatherTest, CollectivesInterleaveOnOneSequence) {
  Net net(GetParam());
  net.JoinAll("g", net.names());
  std::map<std::string, std::vector<float>> reduce;
  for (const auto& s : net.names()) reduce[s].assign(1000, 1.0f);
  ExpectGathers(net, net.names(), 0, 4096);
  std::map<std::string, std::future<OpResult>> futures;
  for (const auto& s : net.names()) {
    futures[s] = std::async(std::launch::async, [&, s] {
      AllReduceArgs a = Args(1, v1::FLOAT32);
      a.op_id += s;
      return net.hub(s).AllReduce(a, Bytes(reduce[s]));
    });
  }
  for (auto& [s, f] : futures) ASSERT_TRUE(f.get().status.ok()) << s;
  EXPECT_EQ(reduce["site-a"][999], static_cast<float>(GetParam()));
  ExpectBroadcasts(net, net.names(), 2, net.names().back(), 4096);
  ExpectGathers(net, net.names(), 3, 17);
}

INSTANTIATE_TEST_SUITE_P(Sites, GatherTest, ::testing::Values(2, 3, 4));

// Each member sends its part to every other one: (N - 1) parts out and in.
// The root of a broadcast sends (N - 1) buffers; the others send none.
TEST(GatherStatsTest, BytesSentAndReceived) {
  Net net(4);
  net.JoinAll("g", net.names());
  const size_t bytes = 3 << 20;
  Buffers inputs = RandomBytes(net.names(), bytes, 5);
  Buffers outputs;
  auto gathered = GatherAll(net, net.names(), GArgs(0), inputs, outputs, 4);
  for (const auto& s : net.names()) {
    ASSERT_TRUE(gathered[s].status.ok()) << gathered[s].status;
    EXPECT_EQ(gathered[s].stats.bytes_sent(), 3 * bytes) << s;
    EXPECT_EQ(gathered[s].stats.bytes_received(), 3 * bytes) << s;
  }
  auto sent = BroadcastAll(net, net.names(), GArgs(1), "site-c", inputs);
  for (const auto& s : net.names()) {
    ASSERT_TRUE(sent[s].status.ok()) << sent[s].status;
    EXPECT_EQ(sent[s].stats.bytes_sent(), s == "site-c" ? 3 * bytes : 0) << s;
    EXPECT_EQ(sent[s].stats.bytes_received(), s == "site-c" ? 0 : bytes) << s;
  }
}

// ---------------------------------------------------------------- caller errors

TEST(GatherErrorsTest, DifferentSizesFailEveryMemberNamingTheOther) {
  Net net(2);
  net.JoinAll("g", net.names());
  Buffers inputs = RandomBytes(net.names(), 100, 6);
  inputs["site-b"].resize(120);
  Buffers outputs;
  auto results = GatherAll(net, net.names(), GArgs(0), inputs, outputs, 2);
  // Each site finds the mismatch itself, or first hears of the other's ABORT.
  EXPECT_THAT(std::string(results["site-a"].status.message()),
              ::testing::AnyOf(HasSubstr("site-b contributes 120 bytes, this site 100"),
                               HasSubstr("site-b gave up on it")));
  EXPECT_THAT(std::string(results["site-b"].status.message()),
              ::testing::AnyOf(HasSubstr("site-a contributes 100 bytes, this site 120"),
                               HasSubstr("site-a gave up on it")));
  EXPECT_TRUE(results["site-a"].status.code() == absl::StatusCode::kFailedPrecondition ||
              results["site-b"].status.code() == absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(outputs["site-a"] == std::vector<uint8_t>(200, 0xEE));
  ExpectGathers(net, net.names(), 1, 100);
}

TEST(GatherErrorsTest, BroadcastBuffersOfDifferentSizesFail) {
  Net net(3);
  net.JoinAll("g", net.names());
  Buffers buffers = RandomBytes(net.names(), 100, 7);
  buffers["site-c"].resize(64);
  const Buffers before = buffers;
  auto results = BroadcastAll(net, net.names(), GArgs(0), "site-a", buffers);
  EXPECT_EQ(results["site-c"].status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(results["site-c"].status.message()),
              HasSubstr("site-a broadcasts 100 bytes into a buffer of 64 here"));
  EXPECT_TRUE(buffers["site-c"] == before.at("site-c"));
  // The others learn it from site-c's ABORT.
  for (const char* s : {"site-a", "site-b"}) {
    EXPECT_EQ(results[s].status.code(), absl::StatusCode::kAborted) << s;
    EXPECT_THAT(std::string(results[s].status.message()), HasSubstr("site-c gave up on it"));
  }
  ExpectBroadcasts(net, net.names(), 1, "site-a", 100);
}

TEST(GatherErrorsTest, OutputTooSmallFailsEveryMember) {
  Net net(3);
  net.JoinAll("g", net.names());
  Buffers inputs = RandomBytes(net.names(), 10, 8);
  std::map<std::string, std::future<OpResult>> futures;
  Buffers outputs;
  for (const auto& s : net.names()) {
    outputs[s].resize(s == "site-b" ? 20 : 30);
    futures[s] = std::async(std::launch::async, [&, s] {
      GatherArgs a = GArgs(0);
      a.op_id += s;
      return net.hub(s).AllGather(a, inputs[s], absl::MakeSpan(outputs[s]));
    });
  }
  std::map<std::string, OpResult> results;
  for (auto& [s, f] : futures) results[s] = f.get();
  EXPECT_EQ(results["site-b"].status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(results["site-b"].status.message()),
              HasSubstr("the output holds 20 bytes, 3 members of 10 bytes need 30"));
  for (const char* s : {"site-a", "site-c"}) {
    EXPECT_EQ(results[s].status.code(), absl::StatusCode::kAborted) << s;
    EXPECT_LT(results[s].stats.seconds(), 10) << s;
  }
}

TEST(GatherErrorsTest, BroadcastFromANonMemberIsRefused) {
  Net net(3);
  net.JoinAll("g", {"site-a", "site-b"});
  std::vector<uint8_t> buffer(10);
  GatherArgs a = GArgs(0);
  a.root = "site-c";
  OpResult r = net.hub("site-a").Broadcast(a, absl::MakeSpan(buffer));
  EXPECT_EQ(r.status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(r.status.message()), HasSubstr("the root site-c is not a member"));
  a.root = "";
  r = net.hub("site-a").Broadcast(a, absl::MakeSpan(buffer));
  EXPECT_EQ(r.status.code(), absl::StatusCode::kInvalidArgument);
}

TEST(GatherErrorsTest, CancelEndsTheOpEverywhere) {
  Net net(2);
  net.JoinAll("g", net.names());
  std::vector<uint8_t> in(10), out(20);
  GatherArgs a = GArgs(0);
  a.op_id = "cancel-me";
  auto f = std::async(std::launch::async,
                      [&] { return net.hub("site-a").AllGather(a, in, absl::MakeSpan(out)); });
  ASSERT_TRUE(Eventually([&] { return net.hub("site-a").Cancel("cancel-me"); }));
  OpResult r = f.get();
  EXPECT_EQ(r.status.code(), absl::StatusCode::kCancelled) << r.status;
  // site-b, arriving late, sees site-a's ABORT.
  GatherArgs b = GArgs(0);
  OpResult rb = net.hub("site-b").AllGather(b, in, absl::MakeSpan(out));
  EXPECT_EQ(rb.status.code(), absl::StatusCode::kAborted) << rb.status;
}

// ---------------------------------------------------------------- a hostile member

struct Hostile {
  std::string name;
  Msg::Kind kind;
  // site-c's message header fields and payload length.
  uint64_t count;
  size_t payload;
  std::string root;  // BCAST_DATA
  int copies;
  std::string error;
  absl::StatusCode code;
};

Msg HostileHeader(const Hostile& h, uint64_t generation) {
  Msg m;
  m.set_kind(h.kind);
  m.set_group("g");
  m.set_generation(generation);
  m.set_seq(0);
  m.set_count(h.count);
  m.set_root(h.root);
  return m;
}

class GatherHostileTest : public ::testing::TestWithParam<Hostile> {};

// site-c writes to site-a and site-b what the case says; the op of 100
// bytes at site-a and site-b (root site-c for a broadcast) fails at both
// with a clear error naming site-c and leaves their buffers as they were; nothing
// hangs; then all three run the next op.
TEST_P(GatherHostileTest, FailsTheOpNamingIt) {
  const Hostile& hostile = GetParam();
  Net net(3);
  net.JoinAll("g", net.names());
  const uint64_t generation = net.hub("site-a").View("g")->generation();
  std::vector<uint8_t> payload(hostile.payload, 7);
  // The raw links stay open: closing one would lose site-c.
  std::vector<std::unique_ptr<transport::Channel>> raw;
  for (const char* to : {"site-a", "site-b"}) {
    raw.push_back(net.RawDial("site-c", to));
    for (int i = 0; i < hostile.copies; ++i) {
      ASSERT_TRUE(Plant(*raw.back(), HostileHeader(hostile, generation), payload).ok());
    }
    ASSERT_TRUE(Eventually([&] {
      return net.hub(to).unclaimed_messages("site-c") == static_cast<uint32_t>(hostile.copies);
    }));
  }
  const std::vector<std::string> good = {"site-a", "site-b"};
  Buffers buffers = RandomBytes(good, 100, 9);
  const Buffers before = buffers;
  Buffers outputs;
  auto results = hostile.kind == Msg::GATHER_DATA
                     ? GatherAll(net, good, GArgs(0, absl::Seconds(10)), buffers, outputs, 3)
                     : BroadcastAll(net, good, GArgs(0, absl::Seconds(10)), "site-c", buffers);
  // A site finds it itself, or first hears of the other's ABORT, whose
  // reason carries the same words.
  EXPECT_TRUE(results["site-a"].status.code() == hostile.code ||
              results["site-b"].status.code() == hostile.code);
  for (const auto& s : good) {
    EXPECT_THAT(results[s].status.code(),
                ::testing::AnyOf(hostile.code, absl::StatusCode::kAborted))
        << s << ": " << results[s].status;
    EXPECT_THAT(std::string(results[s].status.message()), HasSubstr(hostile.error)) << s;
    EXPECT_LT(results[s].stats.seconds(), 8) << s;
    EXPECT_TRUE(buffers[s] == before.at(s)) << s;
  }
  ExpectGathers(net, net.names(), 1, 100);
  ExpectBroadcasts(net, net.names(), 2, "site-c", 100);
}

INSTANTIATE_TEST_SUITE_P(
    Messages, GatherHostileTest,
    ::testing::Values(Hostile{"GatherPayloadShorterThanItsCount", Msg::GATHER_DATA, 100, 99, "", 1,
                              "site-c sent 99 bytes of payload for a part of 100",
                              absl::StatusCode::kInvalidArgument},
                      Hostile{"GatherLargerPart", Msg::GATHER_DATA, 5000, 5000, "", 1,
                              "site-c contributes 5000 bytes, this site 100",
                              absl::StatusCode::kFailedPrecondition},
                      Hostile{"GatherHugeCount", Msg::GATHER_DATA, ~uint64_t{0}, 100, "", 1,
                              "site-c contributes 18446744073709551615 bytes, this site 100",
                              absl::StatusCode::kFailedPrecondition},
                      Hostile{"GatherTwice", Msg::GATHER_DATA, 100, 100, "", 2,
                              "site-c sent its GATHER_DATA twice",
                              absl::StatusCode::kInvalidArgument},
                      Hostile{"BroadcastWrongSize", Msg::BCAST_DATA, 64, 64, "site-c", 1,
                              "site-c broadcasts 64 bytes into a buffer of 100 here",
                              absl::StatusCode::kFailedPrecondition},
                      Hostile{"BroadcastPayloadShort", Msg::BCAST_DATA, 100, 3, "site-c", 1,
                              "site-c sent 3 bytes of payload for a part of 100",
                              absl::StatusCode::kInvalidArgument},
                      Hostile{"BroadcastNamesAnotherRoot", Msg::BCAST_DATA, 100, 100, "site-a", 1,
                              "site-c broadcasts from root 'site-a', this site from 'site-c'",
                              absl::StatusCode::kFailedPrecondition},
                      Hostile{"BroadcastTwice", Msg::BCAST_DATA, 100, 100, "site-c", 2,
                              "site-c sent its BCAST_DATA twice",
                              absl::StatusCode::kInvalidArgument}),
    [](const ::testing::TestParamInfo<Hostile>& info) { return info.param.name; });

// ---------------------------------------------------------------- a lost site

// Every survivor fails with the retryable error naming site-d, well before
// its deadline; the survivors re-Join and run the next ops on three sites;
// then site-d Joins again and all four run them.
void ExpectLossThenRecovery(Net& net, std::map<std::string, OpResult>& results) {
  const std::vector<std::string> survivors = {"site-a", "site-b", "site-c"};
  for (const auto& s : survivors) {
    const OpResult& r = results[s];
    EXPECT_EQ(r.status.code(), absl::StatusCode::kUnavailable) << s << ": " << r.status;
    EXPECT_EQ(r.lost_peer, "site-d") << s;
    EXPECT_THAT(std::string(r.status.message()), HasSubstr("peer site-d was lost")) << s;
    EXPECT_EQ(r.view.members_size(), 3) << s;
    EXPECT_LT(r.stats.seconds(), 20) << s;
  }
  net.JoinAll("g", survivors);
  ExpectGathers(net, survivors, 1, 100003);
  ExpectBroadcasts(net, survivors, 2, "site-b", 100003);
  net.JoinAll("g", net.names());
  ExpectGathers(net, net.names(), 3, 1000);
  ExpectBroadcasts(net, net.names(), 4, "site-d", 1000);
}

const std::vector<std::string> kSurvivors = {"site-a", "site-b", "site-c"};

// site-d never calls; it is cut once it holds `held` messages from each
// survivor.
std::thread CutDOnce(Net& net, std::map<std::string, uint32_t> held) {
  return std::thread([&net, held] {
    ASSERT_TRUE(Eventually([&] {
      for (const auto& [s, n] : held) {
        if (net.hub("site-d").unclaimed_messages(s) != n) return false;
      }
      return true;
    }));
    net.Cut("site-d");
  });
}

TEST(GatherLossTest, SiteLostDuringAllGather) {
  Net net(4);
  net.JoinAll("g", net.names());
  Buffers inputs = RandomBytes(kSurvivors, 1 << 20, 10);
  Buffers outputs;
  std::thread cutter = CutDOnce(net, {{"site-a", 1}, {"site-b", 1}, {"site-c", 1}});
  auto results = GatherAll(net, kSurvivors, GArgs(0, absl::Seconds(30)), inputs, outputs, 4);
  cutter.join();
  for (const auto& s : kSurvivors) EXPECT_TRUE(outputs[s] == std::vector<uint8_t>(4 << 20, 0xEE));
  ExpectLossThenRecovery(net, results);
}

// site-d, the root, never sends its buffer: the others wait for it.
TEST(GatherLossTest, RootLostDuringBroadcast) {
  Net net(4);
  net.JoinAll("g", net.names());
  Buffers buffers = RandomBytes(kSurvivors, 1 << 20, 11);
  std::thread cutter([&] {
    absl::SleepFor(absl::Milliseconds(300));
    net.Cut("site-d");
  });
  auto results = BroadcastAll(net, kSurvivors, GArgs(0, absl::Seconds(30)), "site-d", buffers);
  cutter.join();
  ExpectLossThenRecovery(net, results);
}

// site-a, the root, has sent site-d its buffer and every member its DONE,
// and site-b and site-c theirs; site-d is lost before its DONE: every
// survivor, the root included, fails.
TEST(GatherLossTest, MemberLostDuringBroadcast) {
  Net net(4);
  net.JoinAll("g", net.names());
  Buffers buffers = RandomBytes(kSurvivors, 1 << 20, 12);
  std::thread cutter = CutDOnce(net, {{"site-a", 2}, {"site-b", 1}, {"site-c", 1}});
  auto results = BroadcastAll(net, kSurvivors, GArgs(0, absl::Seconds(30)), "site-a", buffers);
  cutter.join();
  ExpectLossThenRecovery(net, results);
}

// A broadcast whose root was lost earlier fails with the retryable loss.
TEST(GatherLossTest, BroadcastFromALostRootIsRetryable) {
  Net net(3);
  net.JoinAll("g", net.names());
  net.Cut("site-c");
  ASSERT_TRUE(Eventually([&] { return net.hub("site-a").View("g")->members_size() == 2; }));
  std::vector<uint8_t> buffer(10);
  GatherArgs a = GArgs(0);
  a.root = "site-c";
  OpResult r = net.hub("site-a").Broadcast(a, absl::MakeSpan(buffer));
  EXPECT_EQ(r.status.code(), absl::StatusCode::kUnavailable) << r.status;
  EXPECT_EQ(r.lost_peer, "site-c");
}

// ------------------------------------------------- reading the client buffer

// site-a's sends to site-c wait on a cap (on a clock that stands still)
// after their first 4 MiB segment, while those to site-b go through; site-b
// has called no op yet, so what site-a sends it is held there whole. Then
// site-a's client rewrites its whole buffer and the cap is lifted. Each
// segment was read out of the client's buffer once, before the rewrite, and
// both peers got that copy: the same bytes, the buffer as it was. Read
// twice, site-c's second segment would be the rewritten bytes.
class GatherRewriteTest : public ::testing::Test {
 protected:
  GatherRewriteTest() : limiter_(clock_), net_(3, &limiter_, {}, 0, clock_) {
    net_.JoinAll("g", net_.names());
    limiter_.SetPeerLimit("site-c", Bandwidth::MbitsPerSecond(8));
  }

  // Once site-b holds site-a's message whole, rewrites `buffer` (site-a's
  // client) and lifts the cap.
  void RewriteWhenSiteBHasItAll(std::vector<uint8_t>& buffer) {
    ASSERT_TRUE(Eventually([&] {
      return net_.hub("site-b").messages_held() == 1 &&
             limiter_.ChargedToPeer("site-c") == kSegmentBytes;
    }));
    for (uint8_t& x : buffer) x = ~x;
    limiter_.SetPeerLimit("site-c", Bandwidth::Zero());
  }

  static constexpr size_t kBytes = kSegmentBytes + 4099;  // two segments
  FakeClock clock_;
  peer::RateLimiter limiter_;
  Net net_;
};

TEST_F(GatherRewriteTest, AllGatherSendsEveryMemberTheCopyItReadOnce) {
  Buffers inputs = RandomBytes(net_.names(), kBytes, 21);
  const std::vector<uint8_t> sent = inputs["site-a"];
  Buffers outputs;
  for (const auto& s : net_.names()) outputs[s].assign(3 * kBytes, 0xEE);
  auto op = [&](const std::string& s) {
    GatherArgs a = GArgs(0);
    a.op_id += s;
    return std::async(std::launch::async, [&, s, a] {
      return net_.hub(s).AllGather(a, inputs[s], absl::MakeSpan(outputs[s]));
    });
  };
  auto at_a = op("site-a");
  RewriteWhenSiteBHasItAll(inputs["site-a"]);
  auto at_b = op("site-b");
  auto at_c = op("site-c");
  for (auto* f : {&at_a, &at_b, &at_c}) {
    OpResult r = f->get();
    ASSERT_TRUE(r.status.ok()) << r.status;
  }
  // site-a is member 0: its part comes first.
  for (const std::string s : {"site-b", "site-c"}) {
    EXPECT_TRUE(std::equal(sent.begin(), sent.end(), outputs[s].begin()))
        << s << " did not get site-a's buffer as it was read";
  }
  EXPECT_EQ(net_.hub("site-a").client_bytes_read(), kBytes) << "not read once";
  EXPECT_LE(net_.hub("site-a").largest_client_read(), kSegmentBytes);
}

TEST_F(GatherRewriteTest, BroadcastSendsEveryMemberTheCopyItReadOnce) {
  Buffers buffers = RandomBytes(net_.names(), kBytes, 23);
  const std::vector<uint8_t> sent = buffers["site-a"];
  auto op = [&](const std::string& s) {
    GatherArgs a = GArgs(0);
    a.op_id += s;
    a.root = "site-a";
    return std::async(std::launch::async,
                      [&, s, a] { return net_.hub(s).Broadcast(a, absl::MakeSpan(buffers[s])); });
  };
  auto at_a = op("site-a");
  RewriteWhenSiteBHasItAll(buffers["site-a"]);
  auto at_b = op("site-b");
  auto at_c = op("site-c");
  for (auto* f : {&at_a, &at_b, &at_c}) {
    OpResult r = f->get();
    ASSERT_TRUE(r.status.ok()) << r.status;
  }
  EXPECT_TRUE(buffers["site-b"] == sent) << "site-b did not get the buffer as it was read";
  EXPECT_TRUE(buffers["site-c"] == sent) << "site-c did not get the buffer as it was read";
  EXPECT_EQ(net_.hub("site-a").client_bytes_read(), kBytes) << "not read once";
  EXPECT_LE(net_.hub("site-a").largest_client_read(), kSegmentBytes);
}

// Buffers of many segments, and a peer that takes them slower than the
// others (a cap, on a clock that moves), so the faster senders of each
// buffer wait for it: every member gets every byte, and each byte is read
// out of its client's buffer once, a segment at most at a time.
TEST(GatherFanOutTest, ManySegmentsPastASlowPeerArriveWholeAndAreReadOnce) {
  FakeClock clock;
  peer::RateLimiter limiter(clock);
  Net net(4, &limiter, {}, 0, clock);
  net.JoinAll("g", net.names());
  limiter.SetPeerLimit("site-d", Bandwidth::MbitsPerSecond(800));
  std::atomic<bool> done{false};
  std::thread ticker([&] {
    while (!done.load()) {
      clock.Advance(TimeDelta::Milliseconds(2));
      absl::SleepFor(absl::Milliseconds(1));
    }
  });
  ExpectGathers(net, net.names(), 0, (17u << 20) + 3);  // five segments
  ExpectBroadcasts(net, net.names(), 1, "site-b", (13u << 20) + 1);
  done = true;
  ticker.join();
  for (const auto& s : net.names()) {
    EXPECT_LE(net.hub(s).largest_client_read(), kSegmentBytes) << s;
  }
  EXPECT_EQ(net.hub("site-b").client_bytes_read(), (17u << 20) + 3 + (13u << 20) + 1)
      << "each byte read once";
}

}  // namespace
}  // namespace longhaul::exchange
