// Two Daemons in one process on loopback (port 0, certificates made by
// deploy/pki.sh in a temporary directory): a transfer from site-a to site-b
// through site-a's control socket, a shutdown in the middle of one, and a
// start that cannot create its state directory.
#include "daemon/daemon.h"

#include <signal.h>
#include <sys/stat.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/clock.h"
#include "daemon/config.h"
#include "gtest/gtest.h"
#include "longhaul/client.h"
#include "tests/storage/test_util.h"
#include "tests/test_tools/eventually.h"

namespace longhaul::daemon {
namespace {

using ::longhaul::testing::Eventually;

using storage::testing::Bytes;
using storage::testing::MakeDirs;
using storage::testing::ReadFile;
using storage::testing::TempDir;
using storage::testing::WriteFile;

// Relative path -> contents.
using Tree = std::map<std::string, std::string>;

// Every regular file below `root`, or nullopt when `root` does not exist.
std::optional<Tree> ReadTree(const std::string& root) {
  if (!std::filesystem::exists(root)) return std::nullopt;
  Tree tree;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(root)) {
    if (entry.is_regular_file()) {
      tree[std::filesystem::relative(entry.path(), root).string()] = ReadFile(entry.path());
    }
  }
  return tree;
}

class DaemonTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    // As longhauld does: a peer that hangs up is an error value.
    signal(SIGPIPE, SIG_IGN);
  }

  void SetUp() override {
    pki_ = dir_.Sub("pki");
    const std::string cmd =
        absl::StrCat("bash ", LONGHAUL_PKI_SCRIPT, " ", pki_, " site-a site-b >/dev/null 2>&1");
    ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
    MakeDirs(dir_.Sub("site-a/data"));
    MakeDirs(dir_.Sub("site-b/ckpt"));
  }

  // Writes site's config file and loads it. site-b takes writes from
  // site-a into its export `ckpt`; site-a sends from its export `local`.
  // `peer_port` is the other site's (0 when it is not known yet: site-b
  // never dials site-a here).
  DaemonOptions OptionsFor(const std::string& site, uint16_t peer_port,
                           const std::string& extra = "") {
    const std::string other = site == "site-a" ? "site-b" : "site-a";
    const std::string path = dir_.Sub(site + "/longhauld.yaml");
    std::ofstream(path) << "site: " << site << "\n"
                        << "listen: 127.0.0.1:0\n"
                        << "state_dir: " << dir_.Sub(site + "/state") << "\n"
                        << "control_socket: " << dir_.Sub(site + "/control.sock") << "\n"
                        << "tls:\n"
                        << "  ca: " << pki_ << "/ca.pem\n"
                        << "  cert: " << pki_ << "/" << site << ".pem\n"
                        << "  key: " << pki_ << "/" << site << ".key\n"
                        << "exports:\n"
                        << "  - name: ckpt\n"
                        << "    path: " << dir_.Sub(site + "/ckpt") << "\n"
                        << "    writers: [" << other << "]\n"
                        << "  - name: local\n"
                        << "    path: " << dir_.Sub(site + "/data") << "\n"
                        << "peers:\n"
                        << "  - site: " << other << "\n"
                        << "    address: 127.0.0.1:" << peer_port << "\n"
                        << "link:\n"
                        << "  bandwidth: 10Gbit\n"
                        << "  rtt: 1ms\n"
                        << "metrics:\n"
                        << "  listen: 127.0.0.1:0\n"
                        << extra;
    MakeDirs(dir_.Sub(site + "/ckpt"));
    absl::StatusOr<DaemonConfig> config = LoadConfig(path);
    EXPECT_TRUE(config.ok()) << config.status();
    DaemonOptions options;
    if (config.ok()) options.config = *std::move(config);
    options.config_path = path;
    return options;
  }

  // Starts site-b, then site-a pointed at site-b's bound port.
  void StartBoth(const Clock* clock_a = nullptr, const std::string& extra_a = "") {
    auto b = Daemon::Start(OptionsFor("site-b", 0));
    ASSERT_TRUE(b.ok()) << b.status();
    b_ = *std::move(b);
    ASSERT_NE(b_->peer_port(), 0);
    DaemonOptions options_a = OptionsFor("site-a", b_->peer_port(), extra_a);
    options_a.clock = clock_a;
    auto a = Daemon::Start(std::move(options_a));
    ASSERT_TRUE(a.ok()) << a.status();
    a_ = *std::move(a);
    auto client = Client::Connect("unix:" + a_->control_socket(), absl::Seconds(30));
    ASSERT_TRUE(client.ok()) << client.status();
    client_ = *std::move(client);
  }

  // A checkpoint directory at site-a: two shards and its commit marker.
  Tree WriteCheckpoint(const std::string& name, size_t shard_bytes) {
    Tree tree;
    for (int i = 0; i < 2; ++i) {
      const std::vector<uint8_t> bytes = Bytes(shard_bytes + i * 4099, 17 + i);
      tree[absl::StrCat("shard-", i)] = std::string(bytes.begin(), bytes.end());
    }
    tree[".metadata"] = "{\"step\": 100}";
    MakeDirs(dir_.Sub("site-a/data/" + name));
    for (const auto& [rel, contents] : tree) {
      WriteFile(dir_.Sub(absl::StrCat("site-a/data/", name, "/", rel)), contents);
    }
    return tree;
  }

  absl::StatusOr<v1::TransferStatus> SubmitCheckpoint(const std::string& name) {
    v1::TransferSpec spec;
    spec.add_sources(dir_.Sub("site-a/data/" + name));
    spec.set_dest_site("site-b");
    spec.set_dest_export("ckpt");
    spec.set_dest_path("run/" + name);
    spec.set_chunk_size(1 << 20);
    return client_->Submit(spec);
  }

  std::string Destination(const std::string& name) const {
    return dir_.Sub("site-b/ckpt/run/" + name);
  }

  TempDir dir_;
  std::string pki_;
  // Declared after the directory they use, so that they stop before it goes.
  std::unique_ptr<Daemon> b_;
  std::unique_ptr<Daemon> a_;
  std::unique_ptr<Client> client_;
};

TEST_F(DaemonTest, TransfersACheckpointToItsPeerThroughTheControlSocket) {
  FakeClock clock_a;
  ASSERT_NO_FATAL_FAILURE(StartBoth(&clock_a));
  EXPECT_NE(a_->metrics_port(), 0);
  const Tree sent = WriteCheckpoint("step-100", 3 << 20);

  absl::StatusOr<v1::TransferStatus> submitted = SubmitCheckpoint("step-100");
  ASSERT_TRUE(submitted.ok()) << submitted.status();
  absl::StatusOr<v1::TransferStatus> done = client_->Wait(submitted->id(), absl::Seconds(120));
  ASSERT_TRUE(done.ok()) << done.status();
  ASSERT_EQ(done->state(), v1::COMPLETED) << done->error();
  EXPECT_EQ(done->files(), sent.size());

  // Every byte, the commit marker included, and nothing else.
  EXPECT_EQ(ReadTree(Destination("step-100")), std::optional<Tree>(sent));
  // site-a dated the transfer by the clock it was given.
  EXPECT_EQ(done->created_unix_ms(), absl::ToUnixMillis(clock_a.WallNow()));
  EXPECT_EQ(done->finished_unix_ms(), absl::ToUnixMillis(clock_a.WallNow()));
}

TEST_F(DaemonTest, ShutdownDuringATransferLeavesTheDestinationAbsentOrWhole) {
  // A cap that keeps the transfer running for seconds.
  ASSERT_NO_FATAL_FAILURE(StartBoth(nullptr, "limits:\n  peers: {site-b: 32Mbit}\n"));
  const Tree sent = WriteCheckpoint("step-200", 16 << 20);
  absl::StatusOr<v1::TransferStatus> submitted = SubmitCheckpoint("step-200");
  ASSERT_TRUE(submitted.ok()) << submitted.status();
  ASSERT_TRUE(Eventually(
      [&] {
        absl::StatusOr<v1::TransferStatus> status = client_->Get(submitted->id());
        return status.ok() && status->state() == v1::RUNNING && status->bytes_done() > 0;
      },
      absl::Seconds(60)));

  client_.reset();
  a_->Shutdown();
  b_->Shutdown();
  a_->Shutdown();  // idempotent

  const std::optional<Tree> landed = ReadTree(Destination("step-200"));
  if (landed.has_value()) {
    EXPECT_EQ(*landed, sent);
  }
}

TEST_F(DaemonTest, StartFailsWhenTheStateDirectoryIsAFile) {
  DaemonOptions options = OptionsFor("site-b", 0);
  WriteFile(options.config.state_dir, "not a directory");
  absl::StatusOr<std::unique_ptr<Daemon>> daemon = Daemon::Start(std::move(options));
  ASSERT_FALSE(daemon.ok());
  EXPECT_NE(daemon.status().message().find("cannot create state_dir"), std::string::npos)
      << daemon.status();
  EXPECT_NE(daemon.status().message().find(dir_.Sub("site-b/state")), std::string::npos)
      << daemon.status();
  // Nothing was left listening on the control socket.
  EXPECT_FALSE(std::filesystem::exists(dir_.Sub("site-b/control.sock")));
}

// A hostile local user who can read a control token can act as its role:
// the daemon refuses to serve a token that everyone can read, one too short
// to resist guessing, and one shared by two roles, each with what to fix.
TEST_F(DaemonTest, RefusesControlTokensThatAreReadableByEveryoneShortOrShared) {
  const std::string operator_token = dir_.Sub("site-b/operator.token");
  const std::string viewer_token = dir_.Sub("site-b/viewer.token");
  const std::string tcp_control =
      absl::StrCat("control_listen: 127.0.0.1:0\n", "control_tokens:\n  operator: ", operator_token,
                   "\n  viewer: ", viewer_token, "\n");
  auto start_with_tokens = [&](const std::string& op, mode_t op_mode, const std::string& viewer) {
    WriteFile(operator_token, op + "\n");
    chmod(operator_token.c_str(), op_mode);
    WriteFile(viewer_token, viewer + "\n");
    chmod(viewer_token.c_str(), 0600);
    return Daemon::Start(OptionsFor("site-b", 0, tcp_control));
  };
  const std::string good = "0123456789abcdef0123456789abcdef";
  const std::string other = "fedcba9876543210fedcba9876543210";

  absl::StatusOr<std::unique_ptr<Daemon>> daemon = start_with_tokens(good, 0644, other);
  ASSERT_FALSE(daemon.ok());
  EXPECT_NE(daemon.status().message().find("is readable by everyone; chmod 600"), std::string::npos)
      << daemon.status();

  daemon = start_with_tokens("short", 0600, other);
  ASSERT_FALSE(daemon.ok());
  EXPECT_NE(daemon.status().message().find("at least 16 characters"), std::string::npos)
      << daemon.status();

  daemon = start_with_tokens(good, 0600, good);
  ASSERT_FALSE(daemon.ok());
  EXPECT_NE(daemon.status().message().find("each role needs its own"), std::string::npos)
      << daemon.status();

  // Fixed as the messages say, the same configuration serves.
  daemon = start_with_tokens(good, 0600, other);
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  (*daemon)->Shutdown();
}

}  // namespace
}  // namespace longhaul::daemon
