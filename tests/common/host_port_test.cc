#include "common/host_port.h"

#include <string>

#include "absl/status/status.h"
#include "gtest/gtest.h"

namespace longhaul {
namespace {

TEST(HostPortTest, NameAndPort) {
  absl::StatusOr<HostPort> hp = ParseHostPort("site-b.example:7443");
  ASSERT_TRUE(hp.ok()) << hp.status();
  EXPECT_EQ(hp->host, "site-b.example");
  EXPECT_EQ(hp->port, 7443);
}

TEST(HostPortTest, BracketedIpv6) {
  absl::StatusOr<HostPort> hp = ParseHostPort("[::1]:65535");
  ASSERT_TRUE(hp.ok()) << hp.status();
  EXPECT_EQ(hp->host, "::1");
  EXPECT_EQ(hp->port, 65535);
}

TEST(HostPortTest, PortZeroIsAccepted) {
  absl::StatusOr<HostPort> hp = ParseHostPort("127.0.0.1:0");
  ASSERT_TRUE(hp.ok()) << hp.status();
  EXPECT_EQ(hp->host, "127.0.0.1");
  EXPECT_EQ(hp->port, 0);
}

void ExpectRejected(const std::string& address, const std::string& why) {
  absl::StatusOr<HostPort> hp = ParseHostPort(address);
  ASSERT_FALSE(hp.ok()) << address << " parsed as " << hp->host << " port " << hp->port;
  EXPECT_EQ(hp.status().code(), absl::StatusCode::kInvalidArgument) << address;
  EXPECT_NE(hp.status().message().find("'" + address + "'"), std::string::npos) << hp.status();
  EXPECT_NE(hp.status().message().find(why), std::string::npos) << hp.status();
}

TEST(HostPortTest, HostileInputsAreRejectedWithTheReason) {
  ExpectRejected("", "no ':port'");
  ExpectRejected("host", "no ':port'");
  ExpectRejected("host:", "empty port");
  ExpectRejected(":7443", "empty host");
  ExpectRejected("host:99999", "out of range");
  ExpectRejected("host:65536", "out of range");
  ExpectRejected("host:0000080", "out of range");
  ExpectRejected("host:-1", "not a decimal number");
  ExpectRejected("host:+80", "not a decimal number");
  ExpectRejected("host: 80", "not a decimal number");
  ExpectRejected("host:80x", "not a decimal number");
  ExpectRejected("host:port:extra", "more than one ':'");
  ExpectRejected("host:80:81", "more than one ':'");
  ExpectRejected("::1:80", "more than one ':'");
  ExpectRejected("[::1", "no closing ']'");
  ExpectRejected("[::1]", "no ':port' after ']'");
  ExpectRejected("[::1]80", "no ':port' after ']'");
  ExpectRejected("[::1]:80:81", "not a decimal number");
  ExpectRejected("[]:80", "empty host");
  ExpectRejected("[[::1]]:80", "no ':port' after ']'");
  ExpectRejected("[a[b]:80", "stray bracket");
  ExpectRejected("ho]st:80", "stray bracket");
}

}  // namespace
}  // namespace longhaul
