// SegmentRegistry and CheckSealedSegment (daemon/exchange/exchange_service.h)
// on a socket in a temporary directory, with a client that speaks the
// registration protocol of exchange.proto (ShmRegion) by hand.

#include <fcntl.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <string>

#include "absl/strings/match.h"
#include "common/fd_passing.h"
#include "daemon/exchange/exchange_service.h"
#include "gtest/gtest.h"

namespace longhaul::exchange {
namespace {

int SealedMemfd(size_t bytes, unsigned seals) {
  const int fd = memfd_create("longhaul-test", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  EXPECT_GE(fd, 0);
  EXPECT_EQ(ftruncate(fd, bytes), 0);
  if (seals != 0) {
    EXPECT_EQ(fcntl(fd, F_ADD_SEALS, seals), 0);
  }
  return fd;
}

class SegmentRegistryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/longhaul-segments-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    auto registry = SegmentRegistry::Start({dir_ + "/control.sock.shm", 0660, 2, 2});
    ASSERT_TRUE(registry.ok()) << registry.status();
    registry_ = *std::move(registry);
  }
  void TearDown() override {
    registry_.reset();
    std::filesystem::remove_all(dir_);
  }

  // Connects and sends `fd` (none if negative); returns the connection and
  // fills `answer` with the daemon's line.
  int Offer(int fd, std::string& answer) {
    const int conn = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strcpy(addr.sun_path, registry_->path().c_str());
    EXPECT_EQ(connect(conn, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)), 0);
    // A refused connection may be closed before the byte goes out.
    SendByteWithFd(conn, 'S', fd, MSG_NOSIGNAL);
    answer.clear();
    char buf[256];
    while (!absl::EndsWith(answer, "\n")) {
      const ssize_t n = read(conn, buf, sizeof(buf));
      if (n <= 0) break;
      answer.append(buf, n);
    }
    return conn;
  }

  std::string dir_;
  std::unique_ptr<SegmentRegistry> registry_;
};

TEST_F(SegmentRegistryTest, SealedMemfdIsTakenAndForgottenWhenItsConnectionCloses) {
  const int memfd = SealedMemfd(1 << 20, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL);
  std::string answer;
  const int conn = Offer(memfd, answer);
  ASSERT_TRUE(absl::StartsWith(answer, "ok ")) << answer;
  const std::string token = answer.substr(3, answer.size() - 4);
  EXPECT_EQ(token.size(), 32u);

  auto dup = registry_->Dup(token);
  ASSERT_TRUE(dup.ok()) << dup.status();
  EXPECT_GE(fcntl(*dup, F_GET_SEALS) & F_SEAL_SHRINK, 1);
  close(*dup);
  // Truncating the client's own fd is refused by the kernel.
  EXPECT_NE(ftruncate(memfd, 0), 0);
  EXPECT_EQ(errno, EPERM);

  close(conn);
  // The registry's thread notices the close on its own; wait for it.
  absl::Status gone;
  for (int i = 0; i < 10000; ++i) {
    gone = registry_->Dup(token).status();
    if (!gone.ok()) break;
    usleep(1000);
  }
  EXPECT_EQ(gone.code(), absl::StatusCode::kNotFound) << gone;
  close(memfd);
}

TEST_F(SegmentRegistryTest, RefusesWhatCouldBeShrunkOrIsNoMemfd) {
  std::string answer;
  const int unsealed = SealedMemfd(4096, 0);
  close(Offer(unsealed, answer));
  EXPECT_TRUE(absl::StartsWith(answer, "error ")) << answer;
  EXPECT_TRUE(absl::StrContains(answer, "F_SEAL_SHRINK")) << answer;
  EXPECT_FALSE(CheckSealedSegment(unsealed).ok());
  close(unsealed);

  const std::string file = dir_ + "/regular";
  const int regular = open(file.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  ASSERT_GE(regular, 0);
  close(Offer(regular, answer));
  EXPECT_TRUE(absl::StrContains(answer, "not a memfd")) << answer;
  close(regular);

  close(Offer(-1, answer));
  EXPECT_TRUE(absl::StrContains(answer, "exactly one memfd")) << answer;
}

TEST_F(SegmentRegistryTest, ConnectionsBeyondTheCapAreRefused) {
  const int memfd = SealedMemfd(4096, F_SEAL_SHRINK);
  std::string answer;
  const int first = Offer(memfd, answer);
  ASSERT_TRUE(absl::StartsWith(answer, "ok ")) << answer;
  const int second = Offer(memfd, answer);
  ASSERT_TRUE(absl::StartsWith(answer, "ok ")) << answer;
  close(Offer(memfd, answer));
  EXPECT_TRUE(absl::StrContains(answer, "segments already, the most it takes")) << answer;
  close(first);
  close(second);
  close(memfd);
}

TEST_F(SegmentRegistryTest, OneUserCannotTakeEverySlot) {
  registry_.reset();
  auto registry = SegmentRegistry::Start({dir_ + "/per-user.shm", 0660, 4, 1});
  ASSERT_TRUE(registry.ok()) << registry.status();
  registry_ = *std::move(registry);
  const int memfd = SealedMemfd(4096, F_SEAL_SHRINK);
  std::string answer;
  const int first = Offer(memfd, answer);
  ASSERT_TRUE(absl::StartsWith(answer, "ok ")) << answer;
  close(Offer(memfd, answer));
  EXPECT_TRUE(absl::StrContains(answer, "the most it takes per user")) << answer;
  close(first);
  close(memfd);
}

}  // namespace
}  // namespace longhaul::exchange
