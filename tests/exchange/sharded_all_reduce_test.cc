// The sharded all-reduce (daemon/exchange/sharded_all_reduce.cc,
// proto/EXCHANGE.md, All-reduce) on ExchangeHubs of three and four sites in
// one process: results bit-identical at every site and equal to the
// direct exchange's fixed-order reduction, the bytes each site sends, a site
// lost at each step, a hostile member's shards, and how every all-reduce
// (two sites too) reads its client's buffer: once, a segment at a time.

#include <algorithm>
#include <cstring>
#include <functional>
#include <future>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/time/clock.h"
#include "daemon/exchange/exchange_hub.h"
#include "daemon/exchange/reduce.h"
#include "daemon/exchange/shards.h"
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

// Element i of `v` (count elements of `dtype`) as a float.
float Element(v1::ExchangeDType dtype, const std::vector<uint8_t>& v, size_t i) {
  if (dtype == v1::FLOAT32) {
    float f;
    std::memcpy(&f, v.data() + 4 * i, 4);
    return f;
  }
  uint16_t h;
  std::memcpy(&h, v.data() + 2 * i, 2);
  return dtype == v1::BFLOAT16 ? BFloat16ToFloat(h) : HalfToFloat(h);
}

// Random buffers of `count` elements of `dtype` for `sites`, seeded.
Buffers RandomInputs(const std::vector<std::string>& sites, v1::ExchangeDType dtype, size_t count,
                     uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0, 100);
  Buffers buffers;
  const size_t es = ElementSize(dtype);
  for (const auto& s : sites) {
    buffers[s].resize(count * es);
    for (size_t i = 0; i < count; ++i) {
      const float x = dist(rng);
      if (dtype == v1::FLOAT32) {
        std::memcpy(buffers[s].data() + 4 * i, &x, 4);
      } else {
        const uint16_t h = dtype == v1::BFLOAT16 ? FloatToBFloat16(x) : FloatToHalf(x);
        std::memcpy(buffers[s].data() + 2 * i, &h, 2);
      }
    }
  }
  return buffers;
}

// The direct exchange's result, computed here: float32 accumulation in
// sorted site order from the first member's value, the average divided in
// float32, rounded to the dtype.
std::vector<uint8_t> Reference(const Buffers& inputs, v1::ExchangeDType dtype, v1::ReduceOp op) {
  const size_t es = ElementSize(dtype);
  const size_t count = inputs.begin()->second.size() / es;
  std::vector<uint8_t> out(count * es);
  for (size_t i = 0; i < count; ++i) {
    float acc = 0;
    bool first = true;
    for (const auto& [site, v] : inputs) {  // std::map: sorted site order
      acc = first ? Element(dtype, v, i) : acc + Element(dtype, v, i);
      first = false;
    }
    if (op == v1::AVG) acc /= static_cast<float>(inputs.size());
    if (dtype == v1::FLOAT32) {
      std::memcpy(out.data() + 4 * i, &acc, 4);
    } else {
      const uint16_t h = dtype == v1::BFLOAT16 ? FloatToBFloat16(acc) : FloatToHalf(acc);
      std::memcpy(out.data() + 2 * i, &h, 2);
    }
  }
  return out;
}

// Runs seq at `sites` with random inputs and expects every site's buffer
// to be the reference, bit for bit.
void ExpectReduces(Net& net, const std::vector<std::string>& sites, uint64_t seq,
                   v1::ExchangeDType dtype, v1::ReduceOp op, size_t count) {
  Buffers buffers = RandomInputs(sites, dtype, count, static_cast<uint32_t>(seq * 31 + count));
  const std::vector<uint8_t> want = Reference(buffers, dtype, op);
  auto results = RunAll(net, sites, Args(seq, dtype, op), buffers);
  for (const auto& s : sites) {
    ASSERT_TRUE(results[s].status.ok()) << s << " #" << seq << ": " << results[s].status;
    EXPECT_EQ(results[s].stats.generation(), net.hub(s).View("g")->generation());
    ASSERT_TRUE(buffers[s] == want) << s << " #" << seq << " differs from the reference";
  }
}

// ---------------------------------------------------------------- results

class ShardedAllReduceTest
    : public ::testing::TestWithParam<std::tuple<int, v1::ExchangeDType, v1::ReduceOp>> {};

// Counts not divisible by the sites, fewer elements than sites (empty
// shards), an empty buffer, and shards of several 1 MiB pieces.
TEST_P(ShardedAllReduceTest, BitIdenticalAtEverySiteAndEqualToTheFixedOrderReduction) {
  const auto [sites, dtype, op] = GetParam();
  Net net(sites);
  net.JoinAll("g", net.names());
  uint64_t seq = 0;
  for (size_t count :
       {size_t{1000003}, size_t{1}, size_t{2}, size_t{0}, size_t{7}, size_t{(9u << 20) / 2 + 5}}) {
    SCOPED_TRACE(count);
    ExpectReduces(net, net.names(), seq++, dtype, op, count);
  }
}

INSTANTIATE_TEST_SUITE_P(SitesDTypesOps, ShardedAllReduceTest,
                         ::testing::Combine(::testing::Values(3, 4),
                                            ::testing::Values(v1::FLOAT32, v1::BFLOAT16,
                                                              v1::FLOAT16),
                                            ::testing::Values(v1::SUM, v1::AVG)));

// Each site sends its peers' parts of their shards and its own shard's
// result to every peer: 2 (N - 1) / N of the buffer, not N - 1 buffers, and
// receives as much.
TEST(ShardedAllReduceStatsTest, EachSiteSendsTwiceNMinusOneOverNOfTheBuffer) {
  for (int n : {3, 4}) {
    Net net(n);
    net.JoinAll("g", net.names());
    const size_t count = 3 << 20;  // 12 MiB of float32
    Buffers buffers = RandomInputs(net.names(), v1::FLOAT32, count, 7);
    auto results = RunAll(net, net.names(), Args(0, v1::FLOAT32), buffers);
    const double want = 2.0 * (n - 1) / n * count * 4;
    for (const auto& s : net.names()) {
      ASSERT_TRUE(results[s].status.ok()) << results[s].status;
      // Shards differ by at most one element (4 bytes) each way.
      EXPECT_NEAR(results[s].stats.bytes_sent(), want, 2 * n * 4) << n << " sites, " << s;
      EXPECT_NEAR(results[s].stats.bytes_received(), want, 2 * n * 4) << n << " sites, " << s;
      EXPECT_EQ(results[s].stats.peers(), static_cast<uint32_t>(n - 1));
    }
  }
}

// While an all-reduce runs, the links it sends on share the uplink: each of
// site-a's two is paced at half of 90 % of the uplink's rate; once it is
// over, each gets the whole rate back.
TEST(ShardedAllReduceStatsTest, TheLinksOfAnOpShareTheUplinkWhileItRuns) {
  HubOptions options;
  options.uplink = Bandwidth::GbitsPerSecond(1);
  Net net(3, nullptr, options);
  net.JoinAll("g", net.names());
  const size_t count = 3000;
  Buffers buffers = RandomInputs(net.names(), v1::FLOAT32, count, 8);
  const std::vector<uint8_t> want = Reference(buffers, v1::FLOAT32, v1::SUM);
  const AllReduceArgs args = Args(0, v1::FLOAT32);
  auto run = [&](const std::string& s) {
    AllReduceArgs a = args;
    a.op_id += s;
    return std::async(std::launch::async,
                      [&, s, a] { return net.hub(s).AllReduce(a, absl::MakeSpan(buffers[s])); });
  };
  // site-c has not called yet: site-a sent its parts and waits for site-c's.
  auto a = run("site-a");
  auto b = run("site-b");
  const int64_t half = 450'000'000;
  EXPECT_TRUE(Eventually([&] {
    return net.Pacing("site-a", "site-b") == half && net.Pacing("site-a", "site-c") == half;
  })) << net.Pacing("site-a", "site-b")
      << " " << net.Pacing("site-a", "site-c");
  auto c = run("site-c");
  for (auto* f : {&a, &b, &c}) {
    OpResult r = f->get();
    ASSERT_TRUE(r.status.ok()) << r.status;
  }
  EXPECT_TRUE(buffers["site-a"] == want);
  for (const char* to : {"site-b", "site-c"}) {
    EXPECT_EQ(net.Pacing("site-a", to), 1'000'000'000) << to;
  }
}

// ---------------------------------------------------------------- a lost site

// Every survivor fails with the retryable error naming site-d, within the
// op's 30 s deadline (so the loss ended it); the survivors re-Join and run
// the next op on three sites; then site-d Joins again and all four run one.
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
  ExpectReduces(net, survivors, 1, v1::FLOAT32, v1::AVG, 100003);
  net.JoinAll("g", net.names());
  ExpectReduces(net, net.names(), 2, v1::BFLOAT16, v1::SUM, 100003);
}

std::map<std::string, OpResult> RunSurvivors(Net& net, Buffers& buffers) {
  return RunAll(net, {"site-a", "site-b", "site-c"},
                Args(0, v1::FLOAT32, v1::SUM, absl::Seconds(30)), buffers);
}

// site-d's real hub is a member but makes no call; the test writes what it
// sends on raw links to each survivor.
struct ScriptedD {
  explicit ScriptedD(Net& net) {
    for (const char* s : {"site-a", "site-b", "site-c"}) raw[s] = net.RawDial("site-d", s);
  }
  // site-d's message of `kind` for shard `shard` of the all-reduce #0.
  void Send(const std::string& to, Msg::Kind kind, uint32_t shard, absl::Span<const uint8_t> bytes,
            size_t count, uint64_t generation) {
    Msg h;
    h.set_kind(kind);
    h.set_group("g");
    h.set_generation(generation);
    h.set_seq(0);
    h.set_dtype(v1::FLOAT32);
    h.set_op(v1::SUM);
    h.set_count(count);
    h.set_shards(4);
    h.set_shard(shard);
    ASSERT_TRUE(Plant(*raw.at(to), h, bytes).ok());
  }
  std::map<std::string, std::unique_ptr<transport::Channel>> raw;
};

absl::Span<const uint8_t> ShardOfBuffer(const std::vector<uint8_t>& v, size_t count, uint32_t k) {
  const ShardRange r = ShardOf(count, 4, k);
  return absl::MakeConstSpan(v).subspan(r.begin * 4, r.size() * 4);
}

TEST(ShardedAllReduceLossTest, SiteLostBeforeItsContribution) {
  Net net(4);
  net.JoinAll("g", net.names());
  const size_t count = 1 << 20;
  Buffers buffers = RandomInputs({"site-a", "site-b", "site-c"}, v1::FLOAT32, count, 1);
  // site-d never calls; it is cut once every survivor has sent it its part.
  std::thread cutter([&] {
    ASSERT_TRUE(Eventually([&] {
      for (const char* s : {"site-a", "site-b", "site-c"}) {
        if (net.hub("site-d").unclaimed_messages(s) != 1) return false;
      }
      return true;
    }));
    net.Cut("site-d");
  });
  auto results = RunSurvivors(net, buffers);
  cutter.join();
  ExpectLossThenRecovery(net, results);
}

TEST(ShardedAllReduceLossTest, SiteLostDuringTheAllGather) {
  Net net(4);
  net.JoinAll("g", net.names());
  const uint64_t generation = net.hub("site-a").View("g")->generation();
  const size_t count = 1 << 20;
  Buffers buffers = RandomInputs(net.names(), v1::FLOAT32, count, 2);
  ScriptedD d(net);
  // site-d sends every owner its part, then is cut before its own result:
  // the survivors have reduced their shards and sent it their results.
  std::thread script([&] {
    const std::vector<std::string> owners = {"site-a", "site-b", "site-c"};
    for (uint32_t k = 0; k < 3; ++k) {
      d.Send(owners[k], Msg::REDUCE_DATA, k, ShardOfBuffer(buffers["site-d"], count, k), count,
             generation);
    }
    ASSERT_TRUE(Eventually([&] {
      for (const auto& s : owners) {
        if (net.hub("site-d").unclaimed_messages(s) != 2) return false;
      }
      return true;
    }));
    net.Cut("site-d");
  });
  auto results = RunSurvivors(net, buffers);
  script.join();
  ExpectLossThenRecovery(net, results);
}

// site-d sends its parts, its result to site-a and site-b only, and DONE to
// every survivor (it is lost between its result sends and its commit
// having reached everyone). site-c waits for site-d's result; site-a and
// site-b commit and wait for site-c's DONE, which never comes: all three
// fail on the loss, although site-d's DONE reached each of them.
TEST(ShardedAllReduceLossTest, SiteLostAfterItsDone) {
  Net net(4);
  net.JoinAll("g", net.names());
  const uint64_t generation = net.hub("site-a").View("g")->generation();
  const size_t count = 1 << 20;
  Buffers buffers = RandomInputs(net.names(), v1::FLOAT32, count, 3);
  const std::vector<uint8_t> want = Reference(buffers, v1::FLOAT32, v1::SUM);
  ScriptedD d(net);
  std::thread script([&] {
    const std::vector<std::string> owners = {"site-a", "site-b", "site-c"};
    for (uint32_t k = 0; k < 3; ++k) {
      d.Send(owners[k], Msg::REDUCE_DATA, k, ShardOfBuffer(buffers["site-d"], count, k), count,
             generation);
    }
    for (const char* s : {"site-a", "site-b"}) {
      d.Send(s, Msg::REDUCE_RESULT, 3, ShardOfBuffer(want, count, 3), count, generation);
    }
    for (const auto& s : owners) {
      Msg done;
      done.set_kind(Msg::DONE);
      done.set_group("g");
      done.set_generation(generation);
      done.set_seq(0);
      ASSERT_TRUE(Plant(*d.raw.at(s), done).ok());
    }
    // site-a and site-b have committed: site-c holds their results and DONEs.
    ASSERT_TRUE(Eventually([&] {
      return net.hub("site-c").unclaimed_messages("site-a") == 2 &&
             net.hub("site-c").unclaimed_messages("site-b") == 2;
    }));
    net.Cut("site-d");
  });
  auto results = RunSurvivors(net, buffers);
  script.join();
  ExpectLossThenRecovery(net, results);
}

// ---------------------------------------------------------------- a hostile member

struct Hostile {
  std::string name;
  // What site-c writes to site-a (owner of shard 0 of 3) for the all-reduce
  // #0 of `count` float32 elements at `generation`.
  std::function<void(transport::Channel&, uint64_t generation, size_t count)> plant;
  int messages;       // how many it writes
  std::string error;  // in site-a's failure
  absl::StatusCode code = absl::StatusCode::kInvalidArgument;
};

Msg Header(Msg::Kind kind, uint64_t generation, size_t count, uint32_t shard) {
  Msg h;
  h.set_kind(kind);
  h.set_group("g");
  h.set_generation(generation);
  h.set_seq(0);
  h.set_dtype(v1::FLOAT32);
  h.set_op(v1::SUM);
  h.set_count(count);
  h.set_shards(3);
  h.set_shard(shard);
  return h;
}

std::vector<float> Floats(size_t n) { return std::vector<float>(n, 1.0f); }

class ShardedAllReduceHostileTest : public ::testing::TestWithParam<Hostile> {};

// site-c writes to site-a what the case says, and a good part of shard 1
// to site-b. site-a fails the op with a clear error and leaves its buffer
// as it was; site-b, told by site-a's ABORT, fails too; neither hangs, and
// the next op of the three succeeds.
TEST_P(ShardedAllReduceHostileTest, FailsTheOpWithAClearError) {
  const Hostile& hostile = GetParam();
  Net net(3);
  net.JoinAll("g", net.names());
  const uint64_t generation = net.hub("site-a").View("g")->generation();
  const size_t count = 3001;  // shards of 1000, 1000 and 1001 elements
  auto raw = net.RawDial("site-c", "site-a");
  hostile.plant(*raw, generation, count);
  // site-b gets a good part of its shard, so it reduces and sends site-a
  // its result.
  auto to_b = net.RawDial("site-c", "site-b");
  auto part = Floats(1000);
  ASSERT_TRUE(Plant(*to_b, Header(Msg::REDUCE_DATA, generation, count, 1), Bytes(part)).ok());
  // All of it is here before the op starts, duplicates included.
  ASSERT_TRUE(Eventually([&] {
    return net.hub("site-a").unclaimed_messages("site-c") ==
           static_cast<uint32_t>(hostile.messages);
  }));
  Buffers buffers = RandomInputs({"site-a", "site-b"}, v1::FLOAT32, count, 4);
  const Buffers before = buffers;
  auto results = RunAll(net, {"site-a", "site-b"}, Args(0, v1::FLOAT32), buffers);
  const OpResult& a = results["site-a"];
  EXPECT_EQ(a.status.code(), hostile.code) << a.status;
  EXPECT_THAT(std::string(a.status.message()), HasSubstr(hostile.error)) << a.status;
  EXPECT_TRUE(buffers["site-a"] == before.at("site-a"));
  const OpResult& b = results["site-b"];
  EXPECT_EQ(b.status.code(), absl::StatusCode::kAborted) << b.status;
  EXPECT_THAT(std::string(b.status.message()), HasSubstr("site-a gave up on it"));
  EXPECT_LT(b.stats.seconds(), 10);
  // The raw links stay open: closing one would lose site-c.
  ExpectReduces(net, net.names(), 1, v1::FLOAT32, v1::SUM, count);
}

INSTANTIATE_TEST_SUITE_P(
    Messages, ShardedAllReduceHostileTest,
    ::testing::Values(
        Hostile{"WrongShardIndex",
                [](transport::Channel& raw, uint64_t gen, size_t count) {
                  auto part = Floats(1000);
                  ASSERT_TRUE(
                      Plant(raw, Header(Msg::REDUCE_DATA, gen, count, 1), Bytes(part)).ok());
                },
                1, "site-c sent a contribution for shard 1, expected shard 0 of 3"},
        Hostile{
            "WrongSize",
            [](transport::Channel& raw, uint64_t gen, size_t count) {
              auto part = Floats(1001);
              ASSERT_TRUE(Plant(raw, Header(Msg::REDUCE_DATA, gen, count, 0), Bytes(part)).ok());
            },
            1, "site-c sent a contribution of 4004 bytes for piece 0 of shard 0, which has 4000"},
        Hostile{
            "ShardOutOfRange",
            [](transport::Channel& raw, uint64_t gen, size_t count) {
              auto part = Floats(1000);
              ASSERT_TRUE(
                  Plant(raw, Header(Msg::REDUCE_DATA, gen, count, 4000000000u), Bytes(part)).ok());
            },
            1, "shard 4000000000, expected shard 0 of 3"},
        Hostile{
            "ResultForAShardItDoesNotOwn",
            [](transport::Channel& raw, uint64_t gen, size_t count) {
              auto part = Floats(1000);
              ASSERT_TRUE(Plant(raw, Header(Msg::REDUCE_DATA, gen, count, 0), Bytes(part)).ok());
              ASSERT_TRUE(Plant(raw, Header(Msg::REDUCE_RESULT, gen, count, 0), Bytes(part)).ok());
            },
            2, "site-c sent a result for shard 0, expected shard 2 of 3"},
        Hostile{"DuplicateContribution",
                [](transport::Channel& raw, uint64_t gen, size_t count) {
                  auto part = Floats(1000);
                  for (int i = 0; i < 2; ++i) {
                    ASSERT_TRUE(
                        Plant(raw, Header(Msg::REDUCE_DATA, gen, count, 0), Bytes(part)).ok());
                  }
                },
                2, "site-c sent more pieces of its REDUCE_DATA than shard 0 has"},
        Hostile{"DuplicateResult",
                [](transport::Channel& raw, uint64_t gen, size_t count) {
                  auto part = Floats(1000);
                  auto result = Floats(1001);
                  ASSERT_TRUE(
                      Plant(raw, Header(Msg::REDUCE_DATA, gen, count, 0), Bytes(part)).ok());
                  for (int i = 0; i < 2; ++i) {
                    ASSERT_TRUE(
                        Plant(raw, Header(Msg::REDUCE_RESULT, gen, count, 2), Bytes(result)).ok());
                  }
                },
                3, "site-c sent more pieces of its REDUCE_RESULT than shard 2 has"},
        Hostile{"PieceOutOfOrder",
                [](transport::Channel& raw, uint64_t gen, size_t count) {
                  auto part = Floats(1000);
                  Msg h = Header(Msg::REDUCE_DATA, gen, count, 0);
                  h.set_piece(1);
                  ASSERT_TRUE(Plant(raw, h, Bytes(part)).ok());
                },
                1, "site-c sent piece 1 of shard 0's contribution, expected piece 0 of 1"},
        Hostile{"NotSharded",
                [](transport::Channel& raw, uint64_t gen, size_t count) {
                  auto part = Floats(1000);
                  Msg h = Header(Msg::REDUCE_DATA, gen, count, 0);
                  h.set_shards(0);
                  ASSERT_TRUE(Plant(raw, h, Bytes(part)).ok());
                },
                1, "site-c cut it into 0 shards, this site into 3",
                absl::StatusCode::kFailedPrecondition}),
    [](const ::testing::TestParamInfo<Hostile>& info) { return info.param.name; });

// ------------------------------------------------- reading the client buffer

// Runs seq at every site of `net` with random float32 inputs; site-a's
// buffer is written by `client` (given the buffer) while its op runs.
// Returns the buffers after the ops.
Buffers RunWithClient(Net& net, uint64_t seq, size_t count, AllReduceArgs args,
                      const std::function<void(std::vector<uint8_t>&)>& client,
                      std::map<std::string, OpResult>* results) {
  Buffers buffers = RandomInputs(net.names(), v1::FLOAT32, count, 7 + seq);
  std::thread writer([&] { client(buffers["site-a"]); });
  *results = RunAll(net, net.names(), args, buffers);
  writer.join();
  return buffers;
}

class ClientBufferTest : public ::testing::TestWithParam<int> {};

// Each byte of the client's buffer is copied out once, at most one 4 MiB
// segment at a time: no copy of the whole buffer. Results stay bit-identical
// to the fixed-order reduction at 2, 3 and 4 sites.
TEST_P(ClientBufferTest, ReadsEachByteOnceASegmentAtATime) {
  Net net(GetParam());
  net.JoinAll("g", net.names());
  const size_t count = (9u << 20) / 4 + 3;  // three segments, and a bit
  Buffers buffers = RandomInputs(net.names(), v1::FLOAT32, count, 99);
  const std::vector<uint8_t> want = Reference(buffers, v1::FLOAT32, v1::SUM);
  auto results = RunAll(net, net.names(), Args(0, v1::FLOAT32), buffers);
  for (const auto& s : net.names()) {
    ASSERT_TRUE(results[s].status.ok()) << s << ": " << results[s].status;
    EXPECT_TRUE(buffers[s] == want) << s;
    EXPECT_EQ(net.hub(s).client_bytes_read(), count * 4) << s;
    EXPECT_LE(net.hub(s).largest_client_read(), kSegmentBytes) << s;
  }
}

// A streamed buffer is read as its client publishes it: the ops wait for
// the client's pieces and still give the fixed-order result. The client
// takes 200 ms to publish its 10 pieces: with two sites the hub's first read
// of site-a's buffer came 50-200 ms into the op on the 2-core machine, after
// a 50 ms fill had ended.
TEST_P(ClientBufferTest, StreamedBufferIsReadAsTheClientFillsIt) {
  Net net(GetParam());
  net.JoinAll("g", net.names());
  const size_t count = (10u << 20) / 4;
  Buffers inputs = RandomInputs(net.names(), v1::FLOAT32, count, 5);
  const std::vector<uint8_t> want = Reference(inputs, v1::FLOAT32, v1::SUM);
  Buffers buffers = inputs;
  std::vector<uint8_t>& a = buffers["site-a"];
  std::fill(a.begin(), a.end(), 0xff);  // not written yet
  alignas(8) uint64_t word = 0;
  std::map<std::string, std::future<OpResult>> futures;
  for (const auto& s : net.names()) {
    AllReduceArgs args = Args(0, v1::FLOAT32);
    args.op_id += s;
    if (s == "site-a") args.progress.emplace(&word);
    futures[s] = std::async(std::launch::async, [&net, &buffers, s, args] {
      return net.hub(s).AllReduce(args, absl::MakeSpan(buffers[s]));
    });
  }
  const std::vector<uint8_t>& src = inputs["site-a"];
  shm::ProgressWord progress(&word);
  for (size_t done = 0; done < src.size();) {
    absl::SleepFor(absl::Milliseconds(20));
    const size_t n = std::min<size_t>(1 << 20, src.size() - done);
    std::memcpy(a.data() + done, src.data() + done, n);
    done += n;
    progress.PublishReady(done);
  }
  for (auto& [s, f] : futures) {
    OpResult r = f.get();
    ASSERT_TRUE(r.status.ok()) << s << ": " << r.status;
    EXPECT_TRUE(buffers[s] == want) << s;
  }
  EXPECT_GT(net.hub("site-a").unfilled_looks(), 0u);
  EXPECT_EQ(net.hub("site-a").client_bytes_read(), count * 4);
}

// A client that scribbles over its buffer while the op reads it changes only
// its own contribution, which every member reads the same: all sites still
// end with the same bytes, and the op succeeds.
TEST_P(ClientBufferTest, ScribblingClientCannotMakeSitesDisagree) {
  Net net(GetParam());
  net.JoinAll("g", net.names());
  const size_t count = (12u << 20) / 4;
  ExchangeHub& a = net.hub("site-a");
  std::map<std::string, OpResult> results;
  Buffers out = RunWithClient(
      net, 0, count, Args(0, v1::FLOAT32),
      [&](std::vector<uint8_t>& buffer) {
        // Until site-a has read every byte (its result is written only
        // after the commit round, which needs a round trip after that).
        std::mt19937 rng(3);
        volatile uint8_t* p = buffer.data();
        // The count is looked at before every write, so none lands after
        // the last read by more than a moment, far less than the round trip.
        size_t at = 0;
        for (size_t i = 0; a.client_bytes_read() < count * 4; i = (i + 4) % 4096) {
          if (i == 0) at = rng() % (buffer.size() - 4096);
          p[at + i] = static_cast<uint8_t>(rng());
        }
      },
      &results);
  for (const auto& s : net.names()) {
    ASSERT_TRUE(results[s].status.ok()) << s << ": " << results[s].status;
    EXPECT_TRUE(out[s] == out["site-b"]) << s << " disagrees with site-b";
  }
}

// Starts the all-reduce seq 0 at every site of `net` on `buffers`, site-a's
// buffer streamed through `word`.
std::map<std::string, std::future<OpResult>> StartStreamedAtSiteA(Net& net, Buffers& buffers,
                                                                  uint64_t* word) {
  std::map<std::string, std::future<OpResult>> futures;
  for (const auto& s : net.names()) {
    AllReduceArgs args = Args(0, v1::FLOAT32);
    args.op_id += s;
    if (s == "site-a") args.progress.emplace(word);
    futures[s] = std::async(std::launch::async, [&net, &buffers, s, args] {
      return net.hub(s).AllReduce(args, absl::MakeSpan(buffers[s]));
    });
  }
  return futures;
}

// The other sites of a failed op fail on site-a's ABORT, which names it and
// carries its reason; none of them counts site-a lost.
void ExpectThePeersAbortNamingSiteA(std::map<std::string, std::future<OpResult>>& futures,
                                    const std::string& reason) {
  for (auto& [s, f] : futures) {
    if (s == "site-a") continue;
    OpResult r = f.get();
    EXPECT_EQ(r.status.code(), absl::StatusCode::kAborted) << s << ": " << r.status;
    EXPECT_THAT(std::string(r.status.message()), HasSubstr("site-a gave up on it")) << s;
    EXPECT_THAT(std::string(r.status.message()), HasSubstr(reason)) << s;
    EXPECT_TRUE(r.lost_peer.empty()) << s;
  }
}

// A streamed client that never writes its buffer fails its op at the
// deadline as its own failure, not a lost peer; the others (given longer)
// fail on its ABORT, which names it and why.
TEST_P(ClientBufferTest, StalledStreamedClientTimesOut) {
  Net net(GetParam());
  net.JoinAll("g", net.names());
  Buffers buffers = RandomInputs(net.names(), v1::FLOAT32, 1 << 20, 1);
  alignas(8) uint64_t word = 0;
  std::map<std::string, std::future<OpResult>> futures;
  for (const auto& s : net.names()) {
    AllReduceArgs args =
        Args(0, v1::FLOAT32, v1::SUM, s == "site-a" ? absl::Milliseconds(500) : absl::Seconds(20));
    args.op_id += s;
    if (s == "site-a") args.progress.emplace(&word);
    futures[s] = std::async(std::launch::async, [&net, &buffers, s, args] {
      return net.hub(s).AllReduce(args, absl::MakeSpan(buffers[s]));
    });
  }
  OpResult r = futures["site-a"].get();
  EXPECT_EQ(r.status.code(), absl::StatusCode::kDeadlineExceeded) << r.status;
  EXPECT_THAT(r.status.message(), HasSubstr("its client had written only 0"));
  EXPECT_TRUE(r.lost_peer.empty());
  ExpectThePeersAbortNamingSiteA(futures, "its client had written only 0");
}

// A progress word past the buffer's length is the client's error, not a
// licence to read: the op fails at once with InvalidArgument here, the
// buffer keeps its input, and the others fail on this site's ABORT.
TEST_P(ClientBufferTest, StreamedClientClaimingMoreThanItsBufferFails) {
  Net net(GetParam());
  net.JoinAll("g", net.names());
  Buffers buffers = RandomInputs(net.names(), v1::FLOAT32, (6u << 20) / 4, 11);
  const std::vector<uint8_t> input = buffers["site-a"];
  alignas(8) uint64_t word = 0;
  shm::ProgressWord(&word).PublishReady(input.size() + 1);
  auto futures = StartStreamedAtSiteA(net, buffers, &word);
  OpResult r = futures["site-a"].get();
  EXPECT_EQ(r.status.code(), absl::StatusCode::kInvalidArgument) << r.status;
  EXPECT_THAT(std::string(r.status.message()),
              HasSubstr("its client says 6291457 bytes of its buffer of 6291456 are written"));
  EXPECT_TRUE(r.lost_peer.empty());
  EXPECT_TRUE(buffers["site-a"] == input) << "a failed op changed its buffer";
  ExpectThePeersAbortNamingSiteA(futures, "6291457 bytes");
}

// A progress word may only grow: one that goes back fails the op with
// InvalidArgument as soon as the hub looks at it again.
TEST_P(ClientBufferTest, StreamedClientWhoseProgressGoesBackFails) {
  Net net(GetParam());
  net.JoinAll("g", net.names());
  Buffers buffers = RandomInputs(net.names(), v1::FLOAT32, (16u << 20) / 4, 13);
  alignas(8) uint64_t word = 0;
  shm::ProgressWord progress(&word);
  progress.PublishReady(8 * kMiB);  // half of it
  auto futures = StartStreamedAtSiteA(net, buffers, &word);
  // Once a piece was read, the hub has seen the word at 8 MiB; some read
  // still waits for the second half and looks at the word again.
  ASSERT_TRUE(Eventually([&] { return net.hub("site-a").client_bytes_read() > 0; }));
  progress.PublishReady(4 * kMiB);
  OpResult r = futures["site-a"].get();
  EXPECT_EQ(r.status.code(), absl::StatusCode::kInvalidArgument) << r.status;
  EXPECT_THAT(std::string(r.status.message()),
              HasSubstr("its client's progress word went back from 8388608 to 4194304 bytes"));
  EXPECT_TRUE(r.lost_peer.empty());
  ExpectThePeersAbortNamingSiteA(futures, "went back");
}

INSTANTIATE_TEST_SUITE_P(Sites, ClientBufferTest, ::testing::Values(2, 3, 4));

}  // namespace
}  // namespace longhaul::exchange
