#include "daemon/config.h"

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <yaml-cpp/yaml.h>

#include "gtest/gtest.h"

namespace longhaul::daemon {
namespace {

constexpr char kTwoSites[] = R"(
site: site-a
peers:
  - site: site-b
    address: 10.0.0.2:7700
)";

TEST(ConfigMetricsTest, DefaultServesOnLoopback) {
  auto c = ParseConfig(kTwoSites);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->metrics.listen, "127.0.0.1:7701");
  EXPECT_TRUE(c->limits.peers.empty());
  EXPECT_TRUE(c->limits.classes.empty());
}

TEST(ConfigMetricsTest, EmptyListenDisablesAndBadAddressIsRefused) {
  auto off = ParseConfig(std::string(kTwoSites) + "metrics: {listen: \"\"}\n");
  ASSERT_TRUE(off.ok()) << off.status();
  EXPECT_EQ(off->metrics.listen, "");
  auto bad = ParseConfig(std::string(kTwoSites) + "metrics: {listen: localhost}\n");
  EXPECT_FALSE(bad.ok());
  auto typo = ParseConfig(std::string(kTwoSites) + "metrics: {listne: 0.0.0.0:1}\n");
  ASSERT_FALSE(typo.ok());
  EXPECT_NE(typo.status().message().find("unknown key 'listne' in metrics"), absl::string_view::npos);
}

TEST(ConfigControlTest, TcpControlNeedsATokenFile) {
  auto off = ParseConfig(kTwoSites);
  ASSERT_TRUE(off.ok()) << off.status();
  EXPECT_EQ(off->control_listen, "");
  auto bare = ParseConfig(std::string(kTwoSites) + "control_listen: 127.0.0.1:7702\n");
  ASSERT_FALSE(bare.ok());
  EXPECT_NE(bare.status().message().find("needs 'control_token_file'"), std::string::npos) << bare.status();
  auto ok = ParseConfig(std::string(kTwoSites) +
                        "control_listen: 127.0.0.1:7702\ncontrol_token_file: /etc/longhaul/control.token\n");
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->control_listen, "127.0.0.1:7702");
  EXPECT_EQ(ok->control_token_file, "/etc/longhaul/control.token");
}

TEST(ConfigControlTest, TokensPerRole) {
  auto both = ParseConfig(
      std::string(kTwoSites) +
      "control_listen: 127.0.0.1:7702\n"
      "control_tokens: {operator: /etc/longhaul/op.token, viewer: /etc/longhaul/view.token}\n");
  ASSERT_TRUE(both.ok()) << both.status();
  ASSERT_EQ(both->control_tokens.size(), 2u);
  EXPECT_EQ(both->control_tokens[0].role, ControlRole::kOperator);
  EXPECT_EQ(both->control_tokens[0].file, "/etc/longhaul/op.token");
  EXPECT_EQ(both->control_tokens[1].role, ControlRole::kViewer);
  EXPECT_EQ(both->control_tokens[1].file, "/etc/longhaul/view.token");

  // control_token_file is the operator's token; a viewer may be added.
  auto legacy = ParseConfig(
      std::string(kTwoSites) +
      "control_listen: 127.0.0.1:7702\ncontrol_token_file: /etc/longhaul/control.token\n"
      "control_tokens: {viewer: /etc/longhaul/view.token}\n");
  ASSERT_TRUE(legacy.ok()) << legacy.status();
  ASSERT_EQ(legacy->control_tokens.size(), 2u);
  EXPECT_EQ(legacy->control_tokens[0].role, ControlRole::kOperator);
  EXPECT_EQ(legacy->control_tokens[0].file, "/etc/longhaul/control.token");

  // A viewer token alone is enough to serve the TCP address (read-only).
  EXPECT_TRUE(ParseConfig(std::string(kTwoSites) +
                          "control_listen: 127.0.0.1:7702\n"
                          "control_tokens: {viewer: /etc/longhaul/view.token}\n")
                  .ok());

  auto twice = ParseConfig(
      std::string(kTwoSites) +
      "control_listen: 127.0.0.1:7702\ncontrol_token_file: /a\ncontrol_tokens: {operator: /b}\n");
  ASSERT_FALSE(twice.ok());
  EXPECT_NE(twice.status().message().find("cannot both be given"), absl::string_view::npos)
      << twice.status();

  auto unknown = ParseConfig(
      std::string(kTwoSites) +
      "control_listen: 127.0.0.1:7702\ncontrol_tokens: {admin: /etc/longhaul/a.token}\n");
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.status().message().find(
                "unknown key 'admin' in control_tokens (known: operator, viewer)"),
            absl::string_view::npos)
      << unknown.status();
}

TEST(ConfigLimitsTest, ParsesPeerAndClassCaps) {
  auto c = ParseConfig(std::string(kTwoSites) +
                       "limits:\n  peers: {site-b: 500Mbit}\n  classes: {background: 100Mbit, "
                       "exchange: off}\n");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->limits.peers.at("site-b"), 500'000'000u);
  EXPECT_EQ(c->limits.classes.at("background"), 100'000'000u);
  EXPECT_EQ(c->limits.classes.at("exchange"), 0u);
}

TEST(ConfigLimitsTest, RefusesUnknownPeerClassOrRate) {
  auto peer = ParseConfig(std::string(kTwoSites) + "limits: {peers: {site-z: 1Gbit}}\n");
  ASSERT_FALSE(peer.ok());
  EXPECT_NE(peer.status().message().find("'site-z' is not a configured peer"), absl::string_view::npos);
  auto cls = ParseConfig(std::string(kTwoSites) + "limits: {classes: {bulk: 1Gbit}}\n");
  ASSERT_FALSE(cls.ok());
  EXPECT_NE(cls.status().message().find("unknown class 'bulk'"), absl::string_view::npos);
  auto rate = ParseConfig(std::string(kTwoSites) + "limits: {peers: {site-b: fast}}\n");
  ASSERT_FALSE(rate.ok());
  EXPECT_NE(rate.status().message().find("limits.peers.site-b"), absl::string_view::npos);
}

constexpr char kThreeSites[] = R"(
site: site-b
peers:
  - {site: site-a, address: 10.0.0.1:7700}
  - {site: site-c, address: 10.0.0.3:7700}
)";

TEST(ConfigExportsTest, WritersReadersAndUmask) {
  auto c = ParseConfig(std::string(kThreeSites) + R"(
exports:
  - name: ckpt
    path: /data/ckpt
    writers: [site-a]
    readers: [site-c]
    umask: "027"
)");
  ASSERT_TRUE(c.ok()) << c.status();
  const ExportConfig* e = c->FindExport("ckpt");
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->writers, std::vector<std::string>{"site-a"});
  EXPECT_EQ(e->readers, std::vector<std::string>{"site-c"});
  EXPECT_TRUE(e->IsWriter("site-a"));
  // A reader is not a writer.
  EXPECT_FALSE(e->IsWriter("site-c"));
  EXPECT_TRUE(e->IsReader("site-c"));
  EXPECT_FALSE(e->IsReader("site-a"));
  EXPECT_EQ(e->umask, 027u);
  EXPECT_EQ(e->ModeMask(), 0750u);
  EXPECT_EQ(c->FindExport("nope"), nullptr);
}

TEST(ConfigExportsTest, NoListsMeansNobodyAndTheUmaskDefaultsTo022) {
  auto c = ParseConfig(std::string(kThreeSites) + "exports: [{name: ckpt, path: /data/ckpt}]\n");
  ASSERT_TRUE(c.ok()) << c.status();
  const ExportConfig& e = c->exports[0];
  EXPECT_TRUE(e.writers.empty());
  EXPECT_TRUE(e.readers.empty());
  EXPECT_FALSE(e.IsWriter("site-a"));
  EXPECT_FALSE(e.IsReader("site-c"));
  EXPECT_EQ(e.umask, 022u);
  EXPECT_EQ(e.ModeMask(), 0755u);
  // An unquoted YAML number is read as the octal digits it shows.
  auto bare = ParseConfig(std::string(kThreeSites) +
                          "exports: [{name: ckpt, path: /data/ckpt, umask: 077}]\n");
  ASSERT_TRUE(bare.ok()) << bare.status();
  EXPECT_EQ(bare->exports[0].ModeMask(), 0700u);
}

TEST(ConfigExportsTest, RefusesUnknownSitesAndBadUmasks) {
  auto expect_error = [](const std::string& exports, const std::string& needle) {
    auto c = ParseConfig(std::string(kThreeSites) + "exports:\n  - {name: ckpt, path: /d, " +
                         exports + "}\n");
    ASSERT_FALSE(c.ok()) << exports;
    EXPECT_NE(c.status().message().find(needle), absl::string_view::npos) << c.status();
  };
  expect_error("writers: [site-z]",
               "exports[ckpt].writers: 'site-z' is not a configured peer (peers: site-a, site-c)");
  expect_error("readers: [site-z]", "exports[ckpt].readers: 'site-z' is not a configured peer");
  // This site itself is not a peer.
  expect_error("writers: [site-b]", "'site-b' is not a configured peer");
  expect_error("writers: [site-a, site-a]", "'site-a' is listed twice");
  expect_error("writers: site-a", "exports[ckpt].writers must be a list of peer sites");
  expect_error("umask: \"0o22\"", "exports[ckpt].umask: '0o22' is not an octal permission mask");
  expect_error("umask: \"089\"", "is not an octal permission mask");
  expect_error("umask: \"1022\"", "at most 0777");
  expect_error("owners: [site-a]", "unknown key 'owners' in exports[]");
}

// Every example an operator might copy must load as it is.
TEST(DeployExamplesTest, EveryExampleConfigParses) {
  const std::filesystem::path dir = std::filesystem::path(LONGHAUL_DEPLOY_DIR) / "examples";
  std::vector<std::filesystem::path> files;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(dir)) {
    if (entry.path().extension() == ".yaml") files.push_back(entry.path());
  }
  ASSERT_GE(files.size(), 5u) << "expected the two- and three-site examples in " << dir;
  for (const auto& path : files) {
    auto c = LoadConfig(path.string());
    EXPECT_TRUE(c.ok()) << path << ": " << c.status();
    // Each export says who may write into it, so the examples work as they are.
    if (c.ok()) {
      for (const ExportConfig& e : c->exports) EXPECT_FALSE(e.writers.empty()) << path << ": " << e.name;
    }
  }
}

// The commented example the package installs as
// /etc/longhaul/longhauld.yaml.example starts a site as it is (the install
// test starts longhauld from it), with the documented defaults.
TEST(DeployExamplesTest, PackagedExampleConfigParsesWithTheDefaults) {
  const std::filesystem::path path =
      std::filesystem::path(LONGHAUL_DEPLOY_DIR) / "longhauld.yaml.example";
  auto c = LoadConfig(path.string());
  ASSERT_TRUE(c.ok()) << path << ": " << c.status();
  auto defaults = ParseConfig("site: site-a\n");
  ASSERT_TRUE(defaults.ok()) << defaults.status();
  EXPECT_EQ(c->site, "site-a");
  EXPECT_EQ(c->state_dir, defaults->state_dir);
  EXPECT_EQ(c->tls.ca, defaults->tls.ca);
  EXPECT_EQ(c->tls.cert, defaults->tls.cert);
  EXPECT_EQ(c->tls.key, defaults->tls.key);
  EXPECT_EQ(c->log_level, defaults->log_level);
}

// The configs embedded in the Kubernetes ConfigMaps must load too.
TEST(DeployExamplesTest, EveryKubernetesConfigMapConfigParses) {
  const std::filesystem::path dir = std::filesystem::path(LONGHAUL_DEPLOY_DIR) / "k8s";
  int configs = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().extension() != ".yaml") continue;
    for (const YAML::Node& doc : YAML::LoadAllFromFile(entry.path().string())) {
      if (!doc.IsMap() || !doc["kind"] || doc["kind"].as<std::string>() != "ConfigMap") continue;
      auto c = ParseConfig(doc["data"]["longhauld.yaml"].as<std::string>());
      EXPECT_TRUE(c.ok()) << entry.path() << ": " << c.status();
      if (c.ok()) {
        for (const ExportConfig& e : c->exports) {
          EXPECT_FALSE(e.writers.empty()) << entry.path() << ": " << e.name;
        }
      }
      ++configs;
    }
  }
  EXPECT_GE(configs, 2);
}

}  // namespace
}  // namespace longhaul::daemon

namespace longhaul::daemon {
namespace {

TEST(ConfigPeerLimitsTest, DefaultsBoundEveryPeerAndKeysParse) {
  auto c = ParseConfig(kTwoSites);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->transfer.max_chunk_size, 64ull << 20);
  EXPECT_EQ(c->peer_limits.handshake_timeout_us, 10'000'000);
  EXPECT_EQ(c->peer_limits.incoming_expiry_us, 7ll * 24 * 3600 * 1'000'000);
  EXPECT_EQ(c->peer_limits.content_check_bytes_per_second, 1ull << 30);
  EXPECT_EQ(c->metrics.max_connections, 16u);

  auto set = ParseConfig(std::string(kTwoSites) +
                         "peer_limits: {handshake_timeout: 2s, max_pending_handshakes: 9, "
                         "memory_per_peer: 256MiB, incoming_expiry: 1h, "
                         "content_check_bytes_per_second: 100MiB}\n");
  ASSERT_TRUE(set.ok()) << set.status();
  EXPECT_EQ(set->peer_limits.handshake_timeout_us, 2'000'000);
  EXPECT_EQ(set->peer_limits.max_pending_handshakes, 9u);
  EXPECT_EQ(set->peer_limits.memory_per_peer, 256ull << 20);
  EXPECT_EQ(set->peer_limits.incoming_expiry_us, 3600ll * 1'000'000);
  EXPECT_EQ(set->peer_limits.content_check_bytes_per_second, 100ull << 20);
}

TEST(ConfigTransferTest, TrashRetentionDefaultsToADayAndMustBePositive) {
  auto c = ParseConfig(kTwoSites);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->transfer.trash_retention_us, 24ll * 3600 * 1'000'000);
  auto set = ParseConfig(std::string(kTwoSites) + "transfer: {trash_retention: 90m}\n");
  ASSERT_TRUE(set.ok()) << set.status();
  EXPECT_EQ(set->transfer.trash_retention_us, 90ll * 60 * 1'000'000);
  auto zero = ParseConfig(std::string(kTwoSites) + "transfer: {trash_retention: 0s}\n");
  ASSERT_FALSE(zero.ok());
  EXPECT_NE(zero.status().message().find("trash_retention"), std::string::npos);
}

TEST(ConfigPeerLimitsTest, RefusesABudgetSmallerThanTwoChunksAndUnknownKeys) {
  auto small = ParseConfig(std::string(kTwoSites) + "peer_limits: {memory_per_peer: 64MiB}\n");
  ASSERT_FALSE(small.ok());
  EXPECT_NE(small.status().message().find("memory_per_peer"), std::string::npos);
  EXPECT_FALSE(ParseConfig(std::string(kTwoSites) + "peer_limits: {max_pending: 1}\n").ok());
  EXPECT_FALSE(ParseConfig(std::string(kTwoSites) + "peer_limits: {max_pending_handshakes: 0}\n").ok());
}

TEST(ConfigExchangeTest, AllReduceIsShardedUnlessForcedDirect) {
  auto c = ParseConfig(kTwoSites);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->exchange.sharded_all_reduce);
  auto direct = ParseConfig(std::string(kTwoSites) + "exchange: {allreduce: direct}\n");
  ASSERT_TRUE(direct.ok()) << direct.status();
  EXPECT_FALSE(direct->exchange.sharded_all_reduce);
  auto automatic = ParseConfig(std::string(kTwoSites) + "exchange: {allreduce: auto}\n");
  ASSERT_TRUE(automatic.ok()) << automatic.status();
  EXPECT_TRUE(automatic->exchange.sharded_all_reduce);
  auto bad = ParseConfig(std::string(kTwoSites) + "exchange: {allreduce: ring}\n");
  EXPECT_FALSE(bad.ok());
  auto typo = ParseConfig(std::string(kTwoSites) + "exchange: {allreduc: direct}\n");
  EXPECT_FALSE(typo.ok());
}

}  // namespace
}  // namespace longhaul::daemon
