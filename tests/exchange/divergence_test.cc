// A hostile member that sends different members different bytes: different
// REDUCE_RESULTs of the shard it owns, different contributions, different
// all-gather parts, different broadcast buffers. The commit round's digests
// (daemon/exchange/digest.h, proto/EXCHANGE.md, Commit round) fail the op
// at every member that follows the protocol, naming the hostile one, and
// leave their buffers as they were: no call succeeds with bytes another
// member does not hold.
//
// The hostile site's real hub is a member but makes no call; the test
// writes what it sends on raw links, and its DONE either carries no digests
// (as a build before them) or, worse, the digests of what each victim holds.

#include <cstring>
#include <future>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "daemon/exchange/digest.h"
#include "daemon/exchange/exchange_hub.h"
#include "daemon/exchange/reduce.h"
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

std::vector<uint8_t> Filled(size_t bytes, uint8_t value) {
  return std::vector<uint8_t>(bytes, value);
}

std::vector<uint8_t> FloatsOf(size_t n, float value) {
  std::vector<float> f(n, value);
  auto bytes = Bytes(f);
  return {bytes.begin(), bytes.end()};
}

Msg Header(Msg::Kind kind, uint64_t generation, uint64_t seq = 0) {
  Msg h;
  h.set_kind(kind);
  h.set_group("g");
  h.set_generation(generation);
  h.set_seq(seq);
  return h;
}

// The DONE of the op `seq`, with `digests` (none: a build before them).
Msg Done(uint64_t generation, const std::vector<std::vector<uint8_t>>& parts, bool digests) {
  Msg h = Header(Msg::DONE, generation);
  if (digests) {
    for (const auto& part : parts) h.add_digests(Digest(part));
  }
  return h;
}

// The raw links of the hostile site `from` to each of `to`. They stay open
// to the end of the test: closing one would lose that site.
struct Hostile {
  Hostile(Net& net, const std::string& from, const std::vector<std::string>& to) : net(net) {
    for (const auto& s : to) raw[s] = net.RawDial(from, s);
    site = from;
  }
  void Send(const std::string& to, const Msg& h, absl::Span<const uint8_t> payload = {}) {
    ASSERT_TRUE(Plant(*raw.at(to), h, payload).ok());
    ++planted[to];
  }
  // Every planted message is held before the op starts.
  void AwaitHeld() {
    for (const auto& entry : planted) {  // clang 14 captures no structured bindings
      const std::string& to = entry.first;
      const uint32_t n = entry.second;
      ASSERT_TRUE(Eventually([&] { return net.hub(to).unclaimed_messages(site) == n; })) << to;
    }
  }
  Net& net;
  std::string site;
  std::map<std::string, std::unique_ptr<transport::Channel>> raw;
  std::map<std::string, uint32_t> planted;
};

void ExpectFailsNaming(std::map<std::string, OpResult>& results, const Buffers& before,
                       const Buffers& after, const std::string& words) {
  for (const auto& [s, r] : results) {
    EXPECT_EQ(r.status.code(), absl::StatusCode::kDataLoss) << s << ": " << r.status;
    EXPECT_THAT(std::string(r.status.message()), HasSubstr(words)) << s;
    EXPECT_TRUE(after.at(s) == before.at(s)) << s << "'s buffer changed";
  }
}

class DivergenceTest : public ::testing::TestWithParam<bool> {};

// Sharded all-reduce of three: site-c, owner of shard 2, sends its honest
// contributions but a REDUCE_RESULT of ones to site-a and of twos to
// site-b.
TEST_P(DivergenceTest, ShardOwnerSendingDifferentResultsFailsEveryMemberNamingIt) {
  const bool digests = GetParam();
  Net net(3);
  net.JoinAll("g", net.names());
  const uint64_t gen = net.hub("site-a").View("g")->generation();
  const size_t count = 3001;  // shards of 1000, 1000 and 1001 elements
  const auto zeros = FloatsOf(1000, 0.0f);
  Hostile c(net, "site-c", {"site-a", "site-b"});
  Msg data = Header(Msg::REDUCE_DATA, gen);
  data.set_dtype(v1::FLOAT32);
  data.set_op(v1::SUM);
  data.set_count(count);
  data.set_shards(3);
  Msg result = data;
  result.set_kind(Msg::REDUCE_RESULT);
  result.set_shard(2);
  std::map<std::string, std::vector<uint8_t>> shard2 = {{"site-a", FloatsOf(1001, 1.0f)},
                                                        {"site-b", FloatsOf(1001, 2.0f)}};
  for (const auto& [to, shard] : std::map<std::string, uint32_t>{{"site-a", 0}, {"site-b", 1}}) {
    data.set_shard(shard);
    c.Send(to, data, zeros);
    c.Send(to, result, shard2[to]);
    // What each victim holds: zeros in shards 0 and 1, its shard 2.
    c.Send(to, Done(gen, {zeros, zeros, shard2[to]}, digests));
  }
  c.AwaitHeld();
  Buffers buffers = {{"site-a", FloatsOf(count, 0.0f)}, {"site-b", FloatsOf(count, 0.0f)}};
  const Buffers before = buffers;
  auto results = RunAll(net, {"site-a", "site-b"}, Args(0, v1::FLOAT32), buffers);
  ExpectFailsNaming(results, before, buffers,
                    "because of site-c: site-c sent different members different bytes of its "
                    "shard (");
  // The group goes on: the next all-reduce of all three succeeds.
  Buffers next = {{"site-a", FloatsOf(count, 1.0f)},
                  {"site-b", FloatsOf(count, 2.0f)},
                  {"site-c", FloatsOf(count, 3.0f)}};
  for (auto& [s, r] : RunAll(net, net.names(), Args(1, v1::FLOAT32), next)) {
    ASSERT_TRUE(r.status.ok()) << s << ": " << r.status;
    EXPECT_TRUE(next[s] == FloatsOf(count, 6.0f)) << s;
  }
}

// Direct all-reduce of three (int8 quantization runs direct): site-c sends
// site-a and site-b different contributions.
TEST_P(DivergenceTest, DifferentContributionsFailEveryMemberNamingTheirSender) {
  const bool digests = GetParam();
  Net net(3);
  net.JoinAll("g", net.names());
  const uint64_t gen = net.hub("site-a").View("g")->generation();
  const size_t count = 512;
  Hostile c(net, "site-c", {"site-a", "site-b"});
  Msg data = Header(Msg::REDUCE_DATA, gen);
  data.set_dtype(v1::FLOAT32);
  data.set_op(v1::SUM);
  data.set_count(count);
  data.set_quantized(true);
  // Blocks of min 0, step 0 to site-a; min 1 to site-b.
  std::map<std::string, std::vector<uint8_t>> part = {{"site-a", Filled(QuantizedSize(count), 0)},
                                                      {"site-b", Filled(QuantizedSize(count), 0)}};
  const float one = 1.0f;
  std::memcpy(part["site-b"].data(), &one, sizeof one);
  // What each victim holds: every member's contribution as it got it
  // (site-a's and site-b's quantized zeros, site-c's), then the result:
  // zeros at site-a; at site-b, ones in site-c's first block.
  std::vector<uint8_t> quantized_zeros(QuantizedSize(count));
  const auto zeros = FloatsOf(count, 0.0f);
  Quantize(v1::FLOAT32, zeros, count, absl::MakeSpan(quantized_zeros));
  std::map<std::string, std::vector<uint8_t>> result = {{"site-a", zeros}, {"site-b", zeros}};
  std::memcpy(result["site-b"].data(), FloatsOf(kQuantBlock, 1.0f).data(), kQuantBlock * 4);
  for (const std::string to : {"site-a", "site-b"}) {
    c.Send(to, data, part[to]);
    c.Send(to, Done(gen, {quantized_zeros, quantized_zeros, part[to], result[to]}, digests));
  }
  c.AwaitHeld();
  Buffers buffers = {{"site-a", FloatsOf(count, 0.0f)}, {"site-b", FloatsOf(count, 0.0f)}};
  const Buffers before = buffers;
  AllReduceArgs args = Args(0, v1::FLOAT32);
  args.quantize_int8 = true;
  auto results = RunAll(net, {"site-a", "site-b"}, args, buffers);
  ExpectFailsNaming(results, before, buffers,
                    "because of site-c: site-c sent different members different bytes of its "
                    "contribution (");
}

// All-gather of three: site-c sends site-a a part of ones, site-b of twos.
TEST_P(DivergenceTest, AllGatherPartsThatDifferFailEveryMemberNamingTheirSender) {
  const bool digests = GetParam();
  Net net(3);
  net.JoinAll("g", net.names());
  const uint64_t gen = net.hub("site-a").View("g")->generation();
  Buffers inputs = {{"site-a", Filled(100, 0xA)}, {"site-b", Filled(100, 0xB)}};
  Hostile c(net, "site-c", {"site-a", "site-b"});
  Msg data = Header(Msg::GATHER_DATA, gen);
  data.set_count(100);
  std::map<std::string, std::vector<uint8_t>> part = {{"site-a", Filled(100, 1)},
                                                      {"site-b", Filled(100, 2)}};
  for (const std::string to : {"site-a", "site-b"}) {
    c.Send(to, data, part[to]);
    c.Send(to, Done(gen, {inputs["site-a"], inputs["site-b"], part[to]}, digests));
  }
  c.AwaitHeld();
  Buffers outputs = {{"site-a", Filled(300, 0xEE)}, {"site-b", Filled(300, 0xEE)}};
  const Buffers before = outputs;
  std::map<std::string, std::future<OpResult>> futures;
  for (const std::string s : {"site-a", "site-b"}) {
    GatherArgs a;
    a.group = "g";
    a.op_id = absl::StrCat("gather@", s);
    a.timeout = absl::Seconds(20);
    futures[s] = std::async(std::launch::async, [&, s, a] {
      return net.hub(s).AllGather(a, inputs[s], absl::MakeSpan(outputs[s]));
    });
  }
  std::map<std::string, OpResult> results;
  for (auto& [s, f] : futures) results[s] = f.get();
  ExpectFailsNaming(results, before, outputs,
                    "because of site-c: site-c sent different members different bytes of its "
                    "part (");
}

// Broadcast of three from site-c: site-a gets ones, site-b twos.
TEST_P(DivergenceTest, BroadcastRootSendingDifferentBuffersFailsEveryMemberNamingIt) {
  const bool digests = GetParam();
  Net net(3);
  net.JoinAll("g", net.names());
  const uint64_t gen = net.hub("site-a").View("g")->generation();
  Hostile c(net, "site-c", {"site-a", "site-b"});
  Msg data = Header(Msg::BCAST_DATA, gen);
  data.set_count(100);
  data.set_root("site-c");
  std::map<std::string, std::vector<uint8_t>> sent = {{"site-a", Filled(100, 1)},
                                                      {"site-b", Filled(100, 2)}};
  for (const std::string to : {"site-a", "site-b"}) {
    c.Send(to, data, sent[to]);
    c.Send(to, Done(gen, {sent[to]}, digests));
  }
  c.AwaitHeld();
  Buffers buffers = {{"site-a", Filled(100, 0xA)}, {"site-b", Filled(100, 0xB)}};
  const Buffers before = buffers;
  std::map<std::string, std::future<OpResult>> futures;
  for (const std::string s : {"site-a", "site-b"}) {
    GatherArgs a;
    a.group = "g";
    a.op_id = absl::StrCat("bcast@", s);
    a.root = "site-c";
    a.timeout = absl::Seconds(20);
    futures[s] = std::async(std::launch::async, [&, s, a] {
      return net.hub(s).Broadcast(a, absl::MakeSpan(buffers[s]));
    });
  }
  std::map<std::string, OpResult> results;
  for (auto& [s, f] : futures) results[s] = f.get();
  ExpectFailsNaming(results, before, buffers,
                    "because of site-c: site-c sent different members different bytes of its "
                    "buffer (");
}

INSTANTIATE_TEST_SUITE_P(HostileDone, DivergenceTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "WithDigestsOfWhatEachVictimHolds"
                                             : "WithoutDigests";
                         });

// Two sites: site-b's final buffer is not what it sent site-a (its DONE
// says it holds another result, or another part): site-a fails naming it.
TEST(DivergenceTwoSitesTest, AllReduceWhosePeerHoldsAnotherResultFailsNamingIt) {
  Net net(2);
  net.JoinAll("g", net.names());
  const uint64_t gen = net.hub("site-a").View("g")->generation();
  Hostile b(net, "site-b", {"site-a"});
  Msg data = Header(Msg::REDUCE_DATA, gen);
  data.set_dtype(v1::FLOAT32);
  data.set_op(v1::SUM);
  data.set_count(16);
  b.Send("site-a", data, FloatsOf(16, 2.0f));
  // site-a holds 1 + 2 = 3 everywhere; site-b claims 4.
  b.Send("site-a", Done(gen, {FloatsOf(16, 4.0f)}, true));
  b.AwaitHeld();
  Buffers buffers = {{"site-a", FloatsOf(16, 1.0f)}};
  const Buffers before = buffers;
  auto results = RunAll(net, {"site-a"}, Args(0, v1::FLOAT32), buffers);
  ExpectFailsNaming(results, before, buffers,
                    "because of site-b: site-b's result differs from this site's");
}

TEST(DivergenceTwoSitesTest, AllGatherWhosePeerHoldsAnotherPartFailsNamingIt) {
  Net net(2);
  net.JoinAll("g", net.names());
  const uint64_t gen = net.hub("site-a").View("g")->generation();
  Hostile b(net, "site-b", {"site-a"});
  Msg data = Header(Msg::GATHER_DATA, gen);
  data.set_count(10);
  b.Send("site-a", data, Filled(10, 1));
  std::vector<uint8_t> input = Filled(10, 0xA);
  b.Send("site-a", Done(gen, {input, Filled(10, 2)}, true));
  b.AwaitHeld();
  Buffers outputs = {{"site-a", Filled(20, 0xEE)}};
  const Buffers before = outputs;
  GatherArgs a;
  a.group = "g";
  a.op_id = "gather";
  a.timeout = absl::Seconds(20);
  std::map<std::string, OpResult> results;
  results["site-a"] = net.hub("site-a").AllGather(a, input, absl::MakeSpan(outputs["site-a"]));
  ExpectFailsNaming(results, before, outputs,
                    "because of site-b: site-b holds other bytes of its part than it sent this "
                    "site");
}

}  // namespace
}  // namespace longhaul::exchange
