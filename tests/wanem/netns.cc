#include "tests/wanem/netns.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/if.h>
#include <linux/if_tun.h>
#include <sched.h>
#include <signal.h>
#include <spawn.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <functional>
#include <sstream>
#include <thread>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "common/errno_status.h"

extern char** environ;

namespace longhaul::wanem {
namespace {

std::string NamespacePath(const std::string& ns) { return absl::StrCat("/run/netns/", ns); }

absl::Status WriteFile(const std::string& path, const std::string& value) {
  std::ofstream f(path);
  f << value;
  f.close();
  if (!f) return absl::InternalError(absl::StrCat("cannot write ", path));
  return absl::OkStatus();
}

// Runs `fn` on a fresh thread that has joined the network namespace `ns`, so
// the calling thread's namespace never changes.
absl::Status InNamespace(const std::string& ns, const std::function<absl::Status()>& fn) {
  absl::Status result;
  std::thread t([&] {
    const int nsfd = open(NamespacePath(ns).c_str(), O_RDONLY | O_CLOEXEC);
    if (nsfd < 0) {
      result = ErrnoError(errno, absl::StrCat("open namespace ", ns));
      return;
    }
    if (setns(nsfd, CLONE_NEWNET) != 0) {
      result = ErrnoError(errno, absl::StrCat("setns ", ns));
      close(nsfd);
      return;
    }
    close(nsfd);
    result = fn();
  });
  t.join();
  return result;
}

bool IsRunningEmulator(int pid) {
  std::ifstream comm(absl::StrCat("/proc/", pid, "/comm"));
  std::string name;
  if (!std::getline(comm, name)) return false;
  return name == "longhaul-wanem";
}

}  // namespace

absl::Status RunCommand(const std::vector<std::string>& argv) {
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  int pipefd[2];
  if (pipe2(pipefd, O_CLOEXEC) != 0) return ErrnoError(errno, "pipe");
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, pipefd[1], STDERR_FILENO);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);
  // The spawned command must not inherit the blocked signal mask of the
  // emulator, or it would ignore SIGTERM.
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t empty;
  sigemptyset(&empty);
  posix_spawnattr_setsigmask(&attr, &empty);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK);
  pid_t pid;
  const int rc = posix_spawnp(&pid, args[0], &actions, &attr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  close(pipefd[1]);
  if (rc != 0) {
    close(pipefd[0]);
    return ErrnoError(rc, absl::StrCat("spawn ", argv[0]));
  }
  std::string err;
  char buf[512];
  ssize_t n;
  while ((n = read(pipefd[0], buf, sizeof(buf))) > 0) err.append(buf, n);
  close(pipefd[0]);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return absl::InternalError(absl::StrCat("'", absl::StrJoin(argv, " "),
                                            "' failed: ", absl::StripTrailingAsciiWhitespace(err)));
  }
  return absl::OkStatus();
}

absl::StatusOr<int> CreateSite(const SiteSpec& site) {
  if (absl::Status s = RunCommand({"ip", "netns", "add", site.ns}); !s.ok()) {
    return s;
  }
  int tun_fd = -1;
  absl::Status s = InNamespace(site.ns, [&]() -> absl::Status {
    tun_fd = open("/dev/net/tun", O_RDWR | O_NONBLOCK | O_CLOEXEC);
    if (tun_fd < 0) return ErrnoError(errno, "open /dev/net/tun");
    struct ifreq ifr;
    std::memset(&ifr, 0, sizeof(ifr));
    ifr.ifr_flags = IFF_TUN | IFF_NO_PI;
    std::strncpy(ifr.ifr_name, site.device.c_str(), IFNAMSIZ - 1);
    if (ioctl(tun_fd, TUNSETIFF, &ifr) != 0) {
      return ErrnoError(errno, absl::StrCat("TUNSETIFF ", site.device));
    }
    // Long fat pipes need windows far above the default 6 MiB; these limits
    // are per namespace, so the host is untouched.
    if (absl::Status w = WriteFile("/proc/sys/net/ipv4/tcp_rmem", "4096 131072 268435456");
        !w.ok()) {
      return w;
    }
    return WriteFile("/proc/sys/net/ipv4/tcp_wmem", "4096 16384 268435456");
  });
  if (s.ok()) {
    const std::string addr = absl::StrCat(site.address, "/", site.prefix_len);
    const std::string mtu = absl::StrCat(site.mtu);
    for (const std::vector<std::string>& cmd : std::vector<std::vector<std::string>>{
             {"ip", "-n", site.ns, "link", "set", "lo", "up"},
             {"ip", "-n", site.ns, "addr", "add", addr, "dev", site.device},
             {"ip", "-n", site.ns, "link", "set", site.device, "mtu", mtu, "txqueuelen", "10000",
              "up"},
         }) {
      s = RunCommand(cmd);
      if (!s.ok()) break;
    }
  }
  if (!s.ok()) {
    if (tun_fd >= 0) close(tun_fd);
    DeleteNamespace(site.ns).IgnoreError();
    return s;
  }
  return tun_fd;
}

std::vector<int> PidsInNamespace(const std::string& ns) {
  std::vector<int> pids;
  struct stat target;
  if (stat(NamespacePath(ns).c_str(), &target) != 0) return pids;
  DIR* proc = opendir("/proc");
  if (proc == nullptr) return pids;
  while (struct dirent* e = readdir(proc)) {
    int pid;
    if (!absl::SimpleAtoi(e->d_name, &pid)) continue;
    struct stat st;
    if (stat(absl::StrCat("/proc/", pid, "/ns/net").c_str(), &st) != 0) {
      continue;
    }
    if (st.st_ino == target.st_ino && st.st_dev == target.st_dev) {
      pids.push_back(pid);
    }
  }
  closedir(proc);
  return pids;
}

absl::Status DeleteNamespace(const std::string& ns) {
  struct stat st;
  if (stat(NamespacePath(ns).c_str(), &st) != 0) return absl::OkStatus();
  std::vector<int> pids = PidsInNamespace(ns);
  for (int pid : pids) kill(pid, SIGTERM);
  for (int i = 0; i < 40 && !pids.empty(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    pids = PidsInNamespace(ns);
  }
  for (int pid : pids) kill(pid, SIGKILL);
  return RunCommand({"ip", "netns", "delete", ns});
}

absl::StatusOr<std::vector<std::string>> CleanupStaleNamespaces() {
  std::vector<std::string> removed;
  DIR* dir = opendir("/run/netns");
  if (dir == nullptr) return removed;
  std::vector<std::string> names;
  while (struct dirent* e = readdir(dir)) {
    if (absl::StartsWith(e->d_name, kNamespacePrefix)) {
      names.push_back(e->d_name);
    }
  }
  closedir(dir);
  absl::Status first_error;
  for (const std::string& name : names) {
    absl::string_view rest = absl::StripPrefix(name, kNamespacePrefix);
    const size_t dash = rest.find('-');
    int owner;
    if (dash == absl::string_view::npos || !absl::SimpleAtoi(rest.substr(0, dash), &owner)) {
      continue;
    }
    if (IsRunningEmulator(owner)) continue;
    absl::Status s = DeleteNamespace(name);
    if (s.ok()) {
      removed.push_back(name);
    } else if (first_error.ok()) {
      first_error = s;
    }
  }
  if (!first_error.ok()) return first_error;
  return removed;
}

}  // namespace longhaul::wanem
