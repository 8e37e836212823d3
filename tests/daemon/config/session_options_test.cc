#include "daemon/transfer/session_options.h"

#include <string>
#include <vector>

#include "absl/time/time.h"
#include "common/units.h"
#include "gtest/gtest.h"

namespace longhaul::daemon {
namespace {

constexpr char kConfig[] = R"(
site: site-a
peers:
  - site: site-b
    address: 10.0.0.2:7700
exports:
  - name: ckpt
    path: /srv/ckpt
    writers: [site-b]
    umask: "027"
transfer:
  streams: 6
  give_up_after: 90s
  max_chunk_size: 32MiB
  read_back_while_receiving: false
peer_limits:
  memory_per_peer: 256MiB
  incoming_expiry: 2h
link:
  bandwidth: 2.5Gbit
)";

TEST(SessionOptionsTest, ASenderGetsTheDestinationAndTheTransferSettings) {
  auto config = ParseConfig(kConfig);
  ASSERT_TRUE(config.ok()) << config.status();
  peer::SenderOptions options = SenderOptionsFor(*config, "site-b");
  EXPECT_EQ(options.local_site, "site-a");
  ASSERT_TRUE(options.destination.has_value());
  EXPECT_EQ(options.destination->site, "site-b");
  EXPECT_EQ(options.destination->address, "10.0.0.2:7700");
  EXPECT_EQ(options.default_streams, 6u);
  EXPECT_EQ(options.give_up_after, TimeDelta::Seconds(90));
  EXPECT_EQ(options.link_bandwidth, Bandwidth::BitsPerSecond(2'500'000'000));
}

TEST(SessionOptionsTest, ADestinationThatIsNotAPeerHasNoAddress) {
  auto config = ParseConfig(kConfig);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_FALSE(SenderOptionsFor(*config, "site-c").destination.has_value());
}

TEST(SessionOptionsTest, AReceiverGetsTheExportsWritersAndModeMask) {
  auto config = ParseConfig(kConfig);
  ASSERT_TRUE(config.ok()) << config.status();
  peer::ReceiverOptions options = ReceiverOptionsFor(*config);
  EXPECT_EQ(options.local_site, "site-a");
  const peer::ReceiverOptions::Export* e = options.FindExport("ckpt");
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->path, "/srv/ckpt");
  EXPECT_TRUE(e->IsWriter("site-b"));
  EXPECT_FALSE(e->IsWriter("site-c"));
  EXPECT_EQ(e->mode_mask, 0750u);
  EXPECT_EQ(options.FindExport("other"), nullptr);
  EXPECT_EQ(options.incoming_expiry, absl::Hours(2));
  EXPECT_EQ(options.max_chunk_size, 32ull << 20);
  EXPECT_FALSE(options.read_back_while_receiving);
  EXPECT_EQ(options.memory_per_peer, 256ull << 20);
}

// A session built without a config (as the peer tests build them) behaves as
// one built from a config that sets nothing.
TEST(SessionOptionsTest, TheOptionsDefaultsAreTheConfigsDefaults) {
  DaemonConfig config;
  config.peers.push_back({.site = "site-b", .address = "10.0.0.2:7700"});
  peer::SenderOptions sender = SenderOptionsFor(config, "site-b");
  peer::SenderOptions sender_default;
  EXPECT_EQ(sender.default_streams, sender_default.default_streams);
  EXPECT_EQ(sender.give_up_after, sender_default.give_up_after);
  EXPECT_EQ(sender.link_bandwidth, sender_default.link_bandwidth);

  peer::ReceiverOptions receiver = ReceiverOptionsFor(config);
  peer::ReceiverOptions receiver_default;
  EXPECT_EQ(receiver.incoming_expiry, receiver_default.incoming_expiry);
  EXPECT_EQ(receiver.max_chunk_size, receiver_default.max_chunk_size);
  EXPECT_EQ(receiver.read_back_while_receiving, receiver_default.read_back_while_receiving);
  EXPECT_EQ(receiver.memory_per_peer, receiver_default.memory_per_peer);
}

}  // namespace
}  // namespace longhaul::daemon
