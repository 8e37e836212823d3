#include "daemon/local_control_server.h"

#include <fcntl.h>
#include <grpcpp/create_channel_posix.h>
#include <grpcpp/grpcpp.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/fd_passing.h"
#include "gtest/gtest.h"
#include "longhaul/v1/control.grpc.pb.h"
#include "tests/storage/test_util.h"

namespace longhaul::daemon {
namespace {

using storage::testing::TempDir;

constexpr uid_t kNobody = 65534;

// Answers Get with the caller it was made for.
class WhoAmI final : public v1::Control::Service {
 public:
  explicit WhoAmI(Caller caller) : caller_(std::move(caller)) {}
  grpc::Status Get(grpc::ServerContext*, const v1::GetRequest*,
                   v1::GetResponse* response) override {
    response->mutable_status()->set_id(absl::StrCat("uid=", caller_.uid, " gid=", caller_.gid));
    return grpc::Status::OK;
  }

 private:
  const Caller caller_;
};

std::vector<std::unique_ptr<grpc::Service>> MakeWhoAmI(const Caller& caller) {
  std::vector<std::unique_ptr<grpc::Service>> services;
  services.push_back(std::make_unique<WhoAmI>(caller));
  return services;
}

// Connects to the socket at `path` from a child process running as
// uid/gid, and returns the connected fd (SO_PEERCRED names the child's
// credentials at connect(2)), or -1.
int ConnectAs(const std::string& path, uid_t uid, gid_t gid) {
  int pair[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) != 0) return -1;
  const pid_t pid = fork();
  if (pid == 0) {
    // Only async-signal-safe calls: this process forked from a threaded one.
    if (syscall(SYS_setgroups, 0, nullptr) != 0 || syscall(SYS_setresgid, gid, gid, gid) != 0 ||
        syscall(SYS_setresuid, uid, uid, uid) != 0) {
      _exit(2);
    }
    const int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, path.data(), path.size());
    if (connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0) _exit(3);
    _exit(SendByteWithFd(pair[1], 0, fd, 0) == 1 ? 0 : 4);
  }
  close(pair[1]);
  int fd = -1;
  char byte;
  iovec iov{&byte, 1};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  if (recvmsg(pair[0], &msg, MSG_CMSG_CLOEXEC) == 1) {
    if (cmsghdr* cmsg = CMSG_FIRSTHDR(&msg); cmsg != nullptr && cmsg->cmsg_type == SCM_RIGHTS) {
      std::memcpy(&fd, CMSG_DATA(cmsg), sizeof(int));
    }
  }
  close(pair[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    if (fd >= 0) close(fd);
    return -1;
  }
  return fd;
}

class LocalControlServerTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_EQ(chmod(dir_.path().c_str(), 0755), 0); }

  void Start(LocalControlServer::Options options) {
    options.path = path_;
    auto server = LocalControlServer::Start(options, MakeWhoAmI, {});
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
  }

  // Who the server takes the caller on `channel` for ("uid=0 gid=0"), or
  // the call's error.
  static std::string Who(const std::shared_ptr<grpc::Channel>& channel) {
    auto stub = v1::Control::NewStub(channel);
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::GetRequest request;
    v1::GetResponse response;
    grpc::Status status = stub->Get(&context, request, &response);
    if (!status.ok())
      return absl::StrCat("error ", status.error_code(), ": ", status.error_message());
    return response.status().id();
  }

  std::shared_ptr<grpc::Channel> AsThisProcess() const {
    return grpc::CreateChannel("unix:" + path_, grpc::InsecureChannelCredentials());
  }

  // A channel whose connection was made by uid/gid; null when it could not be.
  std::shared_ptr<grpc::Channel> As(uid_t uid, gid_t gid) const {
    const int fd = ConnectAs(path_, uid, gid);
    if (fd < 0) return nullptr;
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    return grpc::CreateInsecureChannelFromFd("", fd);
  }

  TempDir dir_;
  const std::string path_ = dir_.Sub("control.sock");
  std::unique_ptr<LocalControlServer> server_;
};

TEST_F(LocalControlServerTest, EachConnectionIsServedAsTheUserWhoMadeIt) {
  if (geteuid() != 0) GTEST_SKIP() << "connecting as another user needs root";
  Start({.path = "", .mode = 0666});
  const std::string self = absl::StrCat("uid=0 gid=", getegid());
  // Connections come and go, so fd numbers are reused across callers.
  for (int round = 0; round < 5; ++round) {
    auto nobody = As(kNobody, kNobody);
    ASSERT_NE(nobody, nullptr);
    EXPECT_EQ(Who(nobody), "uid=65534 gid=65534") << "round " << round;
    EXPECT_EQ(Who(AsThisProcess()), self) << "round " << round;
    auto other_group = As(kNobody, 0);
    ASSERT_NE(other_group, nullptr);
    EXPECT_EQ(Who(other_group), "uid=65534 gid=0") << "round " << round;
    EXPECT_EQ(Who(nobody), "uid=65534 gid=65534") << "round " << round;
  }
}

TEST_F(LocalControlServerTest, TheSocketHasItsModeBeforeAnyoneCanConnect) {
  Start({.path = "", .mode = 0600});
  struct stat st;
  ASSERT_EQ(stat(path_.c_str(), &st), 0);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  EXPECT_EQ(st.st_mode & 07777, 0600u);
  if (geteuid() == 0) {
    // The kernel, not the server, turns away who the mode excludes: as root
    // the test can only show that a stranger's connect(2) fails.
    ASSERT_EQ(chmod(path_.c_str(), 0600), 0);
    EXPECT_EQ(As(kNobody, kNobody), nullptr);
  }
}

TEST_F(LocalControlServerTest, CallersBeyondTheLimitAreTurnedAwayOthersStayServed) {
  if (geteuid() != 0) GTEST_SKIP() << "connecting as another user needs root";
  Start({.path = "", .mode = 0666, .max_callers = 1});
  const std::string self = absl::StrCat("uid=0 gid=", getegid());
  EXPECT_EQ(Who(AsThisProcess()), self);
  auto nobody = As(kNobody, kNobody);
  ASSERT_NE(nobody, nullptr);
  EXPECT_NE(Who(nobody).find("error 14"), std::string::npos);  // UNAVAILABLE
  EXPECT_EQ(Who(AsThisProcess()), self);
}

TEST_F(LocalControlServerTest, ReplacesAStaleSocketAndStopsServingOnShutdown) {
  {
    const int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, path_.data(), path_.size());
    ASSERT_EQ(bind(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)), 0);
    close(fd);
  }
  Start({});
  EXPECT_EQ(Who(AsThisProcess()).rfind("uid=", 0), 0u);
  server_->Shutdown(gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC), gpr_time_from_seconds(1, GPR_TIMESPAN)));
  server_->Shutdown(gpr_now(GPR_CLOCK_MONOTONIC));
  EXPECT_NE(Who(AsThisProcess()).find("error 14"), std::string::npos);
}

}  // namespace
}  // namespace longhaul::daemon
