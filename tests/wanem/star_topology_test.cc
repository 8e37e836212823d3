#include "tests/wanem/star_topology.h"

#include <array>
#include <cstdint>

#include "gtest/gtest.h"

namespace longhaul::wanem {
namespace {

// An IPv4 header (RFC 791) with just the fields routing reads.
std::array<uint8_t, 20> Ipv4To(uint8_t a, uint8_t b, uint8_t c, uint8_t d) {
  std::array<uint8_t, 20> h{};
  h[0] = 0x45;
  h[16] = a;
  h[17] = b;
  h[18] = c;
  h[19] = d;
  return h;
}

TEST(StarTopologyTest, SiteAddressesShareOneSubnet) {
  EXPECT_EQ(StarSiteAddress(1), "198.18.1.1");
  EXPECT_EQ(StarSiteAddress(8), "198.18.1.8");
}

TEST(StarTopologyTest, RoutesByDestinationAddress) {
  EXPECT_EQ(DestinationSite(Ipv4To(198, 18, 1, 3), 4), 3);
  EXPECT_EQ(DestinationSite(Ipv4To(198, 18, 1, 1), 4), 1);
  EXPECT_EQ(DestinationSite(Ipv4To(198, 18, 1, 4), 4), 4);
}

TEST(StarTopologyTest, DoesNotRouteWhatNoSiteOwns) {
  EXPECT_EQ(DestinationSite(Ipv4To(198, 18, 1, 5), 4), 0);    // Beyond N.
  EXPECT_EQ(DestinationSite(Ipv4To(198, 18, 1, 0), 4), 0);    // Network.
  EXPECT_EQ(DestinationSite(Ipv4To(198, 18, 1, 255), 4), 0);  // Broadcast.
  EXPECT_EQ(DestinationSite(Ipv4To(198, 18, 0, 2), 4), 0);    // Two-site net.
  std::array<uint8_t, 20> v6 = Ipv4To(198, 18, 1, 2);
  v6[0] = 0x60;
  EXPECT_EQ(DestinationSite(v6, 4), 0);
  std::array<uint8_t, 20> h = Ipv4To(198, 18, 1, 2);
  EXPECT_EQ(DestinationSite(absl::MakeConstSpan(h).first(19), 4), 0);
}

TEST(StarTopologyTest, EveryAccessLinkStartsFromTheBaseInBothDirections) {
  DirectionSpec base;
  base.rate = "1Gbit";
  base.delay = "20ms";
  base.loss = "1%";
  absl::StatusOr<std::vector<AccessLinkParams>> star = BuildStar(3, base, {});
  ASSERT_TRUE(star.ok()) << star.status();
  ASSERT_EQ(star->size(), 3u);
  for (const AccessLinkParams& link : *star) {
    for (const DirectionParams* d : {&link.up, &link.down}) {
      EXPECT_EQ(d->rate_bps, 1'000'000'000);
      EXPECT_EQ(d->delay, absl::Milliseconds(20));
      EXPECT_DOUBLE_EQ(d->loss, 0.01);
      // 'bdp' covers the site-to-site round trip: 1 Gbit/s x 4 x 20 ms.
      EXPECT_EQ(d->queue_bytes, 10'000'000);
    }
  }
}

TEST(StarTopologyTest, SiteOptionsOverrideOneSiteAndOneDirection) {
  DirectionSpec base;
  base.rate = "1Gbit";
  base.delay = "20ms";
  absl::StatusOr<std::vector<AccessLinkParams>> star =
      BuildStar(4, base,
                {{"site2", "rate=500Mbit,delay=30ms"},
                 {"site3-up", "loss=2%"},
                 {"site4-down", "rate=100Mbit"}});
  ASSERT_TRUE(star.ok()) << star.status();
  const std::vector<AccessLinkParams>& s = *star;
  EXPECT_EQ(s[0].up.rate_bps, 1'000'000'000);
  EXPECT_EQ(s[1].up.rate_bps, 500'000'000);
  EXPECT_EQ(s[1].down.rate_bps, 500'000'000);
  EXPECT_EQ(s[1].down.delay, absl::Milliseconds(30));
  EXPECT_DOUBLE_EQ(s[2].up.loss, 0.02);
  EXPECT_DOUBLE_EQ(s[2].down.loss, 0.0);
  EXPECT_EQ(s[3].up.rate_bps, 1'000'000'000);
  EXPECT_EQ(s[3].down.rate_bps, 100'000'000);
}

TEST(StarTopologyTest, RejectsBadStarsWithTheOptionInTheMessage) {
  DirectionSpec base;
  EXPECT_FALSE(BuildStar(1, base, {}).ok());
  EXPECT_FALSE(BuildStar(9, base, {}).ok());
  absl::Status beyond = BuildStar(3, base, {{"site4", "rate=1Gbit"}}).status();
  EXPECT_FALSE(beyond.ok());
  EXPECT_NE(beyond.message().find("site4"), std::string::npos);
  absl::Status bad_value = BuildStar(3, base, {{"site2", "rate=fast"}}).status();
  EXPECT_FALSE(bad_value.ok());
  EXPECT_NE(bad_value.message().find("site 2 uplink"), std::string::npos);
  EXPECT_FALSE(BuildStar(3, base, {{"site2-sideways", "rate=1Gbit"}}).ok());
}

TEST(StarTopologyTest, RecognisesSiteOptionKeys) {
  EXPECT_TRUE(IsSiteOptionKey("site2"));
  EXPECT_TRUE(IsSiteOptionKey("site8-up"));
  EXPECT_TRUE(IsSiteOptionKey("site3-down"));
  EXPECT_FALSE(IsSiteOptionKey("sites"));
  EXPECT_FALSE(IsSiteOptionKey("site"));
  EXPECT_FALSE(IsSiteOptionKey("rate"));
}

}  // namespace
}  // namespace longhaul::wanem
