// Loopback tests of whom the tls transport admits: a CRL that lists a peer
// refuses its new handshakes, and ReloadTrust aborts its open tcp channels and
// udp flows; a CRL that does not load changes nothing; a dialed peer must
// present the certificate of the site dialed.

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <future>
#include <string>

#include "daemon/peer/messaging.h"
#include "daemon/peer/router.h"
#include "daemon/transport/transport.h"
#include "daemon/transport/udp_transport.h"

namespace longhaul::transport {
namespace {

// A fresh PKI for site-a, site-b and site-c per test: tests revoke in it.
class Pki {
 public:
  Pki() {
    char tmpl[] = "/tmp/tls_revocation_test.XXXXXX";
    dir_ = mkdtemp(tmpl);
    EXPECT_EQ(Run(dir_ + " site-a site-b site-c"), 0);
  }
  ~Pki() {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  const std::string& dir() const { return dir_; }
  std::string crl() const { return dir_ + "/crl.pem"; }
  int Revoke(const std::string& site) const { return Run("revoke " + dir_ + " " + site); }

  TlsIdentity Identity(const std::string& site, std::vector<std::string> peers) const {
    return TlsIdentity{dir_ + "/ca.pem",           dir_ + "/" + site + ".pem",
                       dir_ + "/" + site + ".key", site,
                       std::move(peers),           crl()};
  }

 private:
  static int Run(const std::string& args) {
    return std::system(
        (std::string("bash ") + LONGHAUL_PKI_SCRIPT + " " + args + " >/dev/null 2>&1").c_str());
  }
  std::string dir_;
};

// One daemon's transports; every authenticated channel is handed to
// `accepted` (tcp channels by their Hello role DATA, udp flows the same way).
struct Site {
  Site(const Pki& pki, const std::string& name, std::vector<std::string> peers)
      : identity(pki.Identity(name, std::move(peers))) {
    TcpTuning tuning;
    tuning.socket_buffer_bytes = 1 << 20;
    tuning.congestion_control = "";
    auto made = MakeTcpTlsTransport(identity, tuning);
    EXPECT_TRUE(made.ok()) << made.status();
    tcp = *std::move(made);
    udp = *MakeUdpTransport(*tcp, UdpOptions{});
    router.Register(v1::Hello::UDP_HANDSHAKE, [this](std::unique_ptr<Channel> c, const v1::Hello&) {
      udp->AcceptHandshake(std::move(c));
    });
    router.Register(v1::Hello::DATA, [this](std::unique_ptr<Channel> c, const v1::Hello&) {
      accepted.set_value(std::move(c));
    });
    EXPECT_TRUE(tcp->Listen("127.0.0.1:0", [this](auto c) { router.Serve(std::move(c)); }).ok());
    EXPECT_TRUE(udp->Listen("127.0.0.1:0", [this](auto c) { router.Serve(std::move(c)); }).ok());
  }
  ~Site() {
    udp->Shutdown();
    tcp->Shutdown();
  }
  std::string address() const { return "127.0.0.1:" + std::to_string(tcp->listen_port()); }

  // Dials `site` over `transport` with Hello{DATA}; returns the dialed end.
  absl::StatusOr<std::unique_ptr<Channel>> Open(Transport& transport, const std::string& site,
                                                const Site& other) {
    v1::Hello hello;
    hello.set_role(v1::Hello::DATA);
    hello.set_transfer_id("t1");
    return peer::DialSession(transport, site, other.address(), hello);
  }

  std::unique_ptr<Channel> TakeAccepted() {
    auto future = accepted.get_future();
    EXPECT_EQ(future.wait_for(std::chrono::seconds(10)), std::future_status::ready);
    accepted = {};
    return future.get();
  }

  absl::Status Reload() {
    absl::Status s = tcp->ReloadTrust(identity);
    if (s.ok()) s = udp->ReloadTrust(identity);
    return s;
  }

  TlsIdentity identity;
  std::unique_ptr<Transport> tcp;
  std::unique_ptr<UdpTransport> udp;
  peer::PeerRouter router;
  std::promise<std::unique_ptr<Channel>> accepted;
};

absl::Status ReadOne(Channel& channel) {
  uint8_t byte;
  return channel.ReadExactly(absl::MakeSpan(&byte, 1));
}

absl::Status WriteOne(Channel& channel) {
  const uint8_t byte = 'x';
  return channel.Write({absl::Span<const uint8_t>(&byte, 1)});
}

class TlsRevocationTest : public ::testing::Test {
 protected:
  Pki pki;
  Site a{pki, "site-a", {"site-b"}};
  Site b{pki, "site-b", {"site-a", "site-c"}};
  Site c{pki, "site-c", {"site-b"}};
};

TEST_F(TlsRevocationTest, ReloadAbortsTheRevokedPeersChannelsAndFlowsOnly) {
  auto from_a = a.Open(*a.tcp, "site-b", b);
  ASSERT_TRUE(from_a.ok()) << from_a.status();
  std::unique_ptr<Channel> at_b_from_a = b.TakeAccepted();
  auto flow_from_a = a.Open(*a.udp, "site-b", b);
  ASSERT_TRUE(flow_from_a.ok()) << flow_from_a.status();
  std::unique_ptr<Channel> flow_at_b_from_a = b.TakeAccepted();
  auto from_c = c.Open(*c.tcp, "site-b", b);
  ASSERT_TRUE(from_c.ok()) << from_c.status();
  std::unique_ptr<Channel> at_b_from_c = b.TakeAccepted();
  ASSERT_NE(at_b_from_a->peer_certificate(), nullptr);

  ASSERT_EQ(pki.Revoke("site-a"), 0);
  ASSERT_TRUE(b.Reload().ok());

  absl::Status tcp_read = ReadOne(*at_b_from_a);
  EXPECT_EQ(tcp_read.code(), absl::StatusCode::kCancelled) << tcp_read;
  absl::Status udp_read = ReadOne(*flow_at_b_from_a);
  EXPECT_EQ(udp_read.code(), absl::StatusCode::kCancelled) << udp_read;
  absl::Status check = b.tcp->CheckPeer(*at_b_from_a->peer_certificate());
  EXPECT_EQ(check.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(check.message().find("certificate of site-a (serial "), std::string::npos) << check;
  EXPECT_NE(check.message().find("is revoked by tls.crl " + pki.crl()), std::string::npos) << check;

  // site-c's channel lived through the reload.
  ASSERT_TRUE(WriteOne(**from_c).ok());
  EXPECT_TRUE(ReadOne(*at_b_from_c).ok());
  EXPECT_TRUE(b.tcp->CheckPeer(*at_b_from_c->peer_certificate()).ok());
}

TEST_F(TlsRevocationTest, RevokedPeerIsRefusedBothWays) {
  ASSERT_EQ(pki.Revoke("site-a"), 0);
  ASSERT_TRUE(b.Reload().ok());

  // TLS 1.3: site-a's handshake ends before site-b judges its certificate,
  // so site-a learns the verdict on its first read.
  auto dialed = a.Open(*a.tcp, "site-b", b);
  absl::Status refused = dialed.ok() ? ReadOne(**dialed) : dialed.status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kPermissionDenied) << refused;
  EXPECT_NE(refused.message().find("refused our certificate"), std::string::npos) << refused;
  EXPECT_NE(refused.message().find("revoked"), std::string::npos) << refused;

  auto to_a = b.tcp->Dial("site-a", a.address());
  ASSERT_FALSE(to_a.ok());
  EXPECT_EQ(to_a.status().code(), absl::StatusCode::kPermissionDenied) << to_a.status();
  EXPECT_NE(to_a.status().message().find("certificate of site-a (serial "), std::string::npos)
      << to_a.status();
  EXPECT_NE(to_a.status().message().find("is revoked"), std::string::npos) << to_a.status();
  auto flow_to_a = b.udp->Dial("site-a", a.address());
  EXPECT_EQ(flow_to_a.status().code(), absl::StatusCode::kPermissionDenied) << flow_to_a.status();

  auto to_c = b.tcp->Dial("site-c", c.address());
  EXPECT_TRUE(to_c.ok()) << to_c.status();
}

TEST_F(TlsRevocationTest, CrlThatDoesNotLoadChangesNothing) {
  auto from_a = a.Open(*a.tcp, "site-b", b);
  ASSERT_TRUE(from_a.ok()) << from_a.status();
  std::unique_ptr<Channel> at_b = b.TakeAccepted();
  ASSERT_EQ(pki.Revoke("site-a"), 0);

  // Signed by another CA.
  Pki other;
  std::filesystem::copy_file(other.crl(), pki.crl(),
                             std::filesystem::copy_options::overwrite_existing);
  absl::Status foreign = b.Reload();
  EXPECT_EQ(foreign.code(), absl::StatusCode::kInvalidArgument) << foreign;
  EXPECT_NE(foreign.message().find("is not signed by the CA in tls.ca"), std::string::npos)
      << foreign;

  std::ofstream(pki.crl()) << "-----BEGIN X509 CRL-----\nbm90IGEgY3Js\n-----END X509 CRL-----\n";
  absl::Status garbled = b.Reload();
  EXPECT_EQ(garbled.code(), absl::StatusCode::kInvalidArgument) << garbled;
  EXPECT_NE(garbled.message().find("tls.crl " + pki.crl()), std::string::npos) << garbled;

  std::ofstream(pki.crl(), std::ios::trunc) << "";
  absl::Status empty = b.Reload();
  EXPECT_NE(empty.message().find("holds no PEM CRL"), std::string::npos) << empty;

  // The old trust stands: site-a's channel is open, and site-a may dial.
  ASSERT_TRUE(WriteOne(**from_a).ok());
  EXPECT_TRUE(ReadOne(*at_b).ok());
  auto again = a.Open(*a.tcp, "site-b", b);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(b.TakeAccepted()->peer_site(), "site-a");
}

using TlsPeerIdentityTest = TlsRevocationTest;

TEST_F(TlsPeerIdentityTest, DialedPeerMustPresentTheCertificateOfTheSiteDialed) {
  // site-a's address, dialed as site-c: site-a's valid certificate is not enough.
  auto dialed = b.tcp->Dial("site-c", a.address());
  ASSERT_FALSE(dialed.ok());
  EXPECT_EQ(dialed.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(dialed.status().message().find("presented a certificate for site-a, expected site-c"),
            std::string::npos)
      << dialed.status();
}

TEST_F(TlsRevocationTest, StartingWithAMissingCrlIsAnErrorNamingIt) {
  TlsIdentity identity = pki.Identity("site-b", {"site-a"});
  identity.crl_file = pki.dir() + "/absent.pem";
  auto made = MakeTcpTlsTransport(identity, TcpTuning{});
  ASSERT_FALSE(made.ok());
  EXPECT_NE(made.status().message().find("cannot read tls.crl " + identity.crl_file),
            std::string::npos)
      << made.status();
}

}  // namespace
}  // namespace longhaul::transport
