// longhaul-faultfs BACKING_DIR MOUNTPOINT --control=SOCKET [--ready-file=F]
//
// Mounts MOUNTPOINT as a passthrough of BACKING_DIR that can fail operations
// with EIO, freeze, and lose every write not made durable (a power loss).
// Commands arrive one per line on the control socket; see README.md.
// Exits, unmounting, on SIGTERM/SIGINT and when its parent dies.

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "tests/chaos/faultfs/fault_state.h"
#include "tests/chaos/faultfs/passthrough.h"
#include "tests/chaos/faultfs/request_loop.h"

namespace longhaul::faultfs {
namespace {

constexpr char kUsage[] =
    "usage: longhaul-faultfs BACKING_DIR MOUNTPOINT --control=SOCKET [--ready-file=FILE]\n"
    "control commands (one per line): seed N | eio OPS PROBABILITY [PATH_SUBSTRING] |\n"
    "  eio off | freeze | thaw | drop-unsynced | stats\n"
    "  OPS: comma list of read,write,fsync,create,rename,unlink,mkdir,open\n";

// Kernel FUSE readers. Requests of a frozen mount do not occupy them.
constexpr int kReaderThreads = 4;

struct Options {
  std::string backing{};
  std::string mountpoint{};
  std::string control{};
  std::string ready_file{};
};

bool ParseOptions(int argc, char** argv, Options* options, std::string* error) {
  std::vector<std::string> positional;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg.rfind("--control=", 0) == 0) {
      options->control = arg.substr(10);
    } else if (arg.rfind("--ready-file=", 0) == 0) {
      options->ready_file = arg.substr(13);
    } else if (arg.rfind("--", 0) == 0) {
      *error = "unknown option " + arg;
      return false;
    } else {
      positional.push_back(arg);
    }
  }
  if (positional.size() != 2) {
    *error = "need BACKING_DIR and MOUNTPOINT";
    return false;
  }
  if (options->control.empty()) {
    *error = "need --control=SOCKET";
    return false;
  }
  options->backing = positional[0];
  options->mountpoint = positional[1];
  return true;
}

int ListenUnix(const std::string& path) {
  sockaddr_un addr{};
  if (path.size() >= sizeof(addr.sun_path)) {
    errno = ENAMETOOLONG;
    return -1;
  }
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  unlink(path.c_str());
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || listen(fd, 8) != 0) {
    int err = errno;
    close(fd);
    errno = err;
    return -1;
  }
  return fd;
}

class Controller {
 public:
  Controller(FaultState& state, RequestLoop& loop) : state_(state), loop_(loop) {}

  // Answers one command line: "ok ..." or "error ...".
  std::string Handle(const std::string& line) {
    std::istringstream in(line);
    std::string cmd;
    in >> cmd;
    if (cmd == "seed") {
      uint64_t seed = 0;
      if (!(in >> seed)) return "error seed needs a number";
      state_.SetSeed(seed);
      return "ok seed " + std::to_string(seed);
    }
    if (cmd == "eio") return Eio(in);
    if (cmd == "freeze") {
      loop_.Freeze();
      return "ok frozen";
    }
    if (cmd == "thaw") {
      loop_.Thaw();
      return "ok thawed";
    }
    if (cmd == "drop-unsynced") {
      if (!loop_.frozen()) {
        return "error drop-unsynced needs a frozen mount: freeze, kill the writers, then "
               "drop-unsynced";
      }
      std::string errors;
      uint64_t files = state_.DropUnsynced(&errors);
      if (!errors.empty()) return "error restoring: " + errors;
      return "ok dropped " + std::to_string(files) + " files";
    }
    if (cmd == "stats") return "ok " + StatsJson();
    return "error unknown command '" + cmd + "' (seed, eio, freeze, thaw, drop-unsynced, stats)";
  }

  std::string StatsJson() {
    Counters c = state_.counters();
    std::ostringstream out;
    out << "{\"ops\": " << c.ops << ", \"eio_injected\": " << c.eio_injected
        << ", \"bytes_undone\": " << c.bytes_undone << ", \"files_undone\": " << c.files_undone
        << ", \"unsynced_files\": " << c.unsynced_files
        << ", \"frozen\": " << (loop_.frozen() ? "true" : "false")
        << ", \"parked\": " << loop_.parked() << ", \"parked_pids\": [";
    const char* separator = "";
    for (uint32_t pid : loop_.parked_pids()) {
      out << separator << pid;
      separator = ", ";
    }
    out << "], \"interrupted\": " << loop_.interrupted() << "}";
    return out.str();
  }

 private:
  std::string Eio(std::istringstream& in) {
    std::string ops;
    in >> ops;
    if (ops == "off") {
      state_.ClearEio();
      return "ok eio off";
    }
    uint32_t mask = 0;
    if (std::string bad = ParseOpKinds(ops, &mask); !bad.empty() || mask == 0) {
      return "error unknown operation kind '" + bad +
             "' (read,write,fsync,create,rename,unlink,mkdir,open)";
    }
    double probability = -1;
    if (!(in >> probability) || probability < 0 || probability > 1) {
      return "error eio needs a probability in [0, 1]";
    }
    std::string substring;
    in >> substring;
    state_.SetEio(mask, probability, substring);
    return "ok eio " + ops + " " + std::to_string(probability) +
           (substring.empty() ? "" : " " + substring);
  }

  FaultState& state_;
  RequestLoop& loop_;
};

// Serves one control connection: one answer per line until EOF.
void ServeClient(int listen_fd, Controller& controller) {
  int fd = accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
  if (fd < 0) return;
  std::string pending;
  char buf[4096];
  ssize_t n;
  while ((n = read(fd, buf, sizeof(buf))) > 0) {
    pending.append(buf, static_cast<size_t>(n));
    size_t nl;
    while ((nl = pending.find('\n')) != std::string::npos) {
      std::string line = pending.substr(0, nl);
      pending.erase(0, nl + 1);
      std::string reply = controller.Handle(line) + "\n";
      std::cerr << "longhaul-faultfs: " << line << " -> " << reply;
      if (send(fd, reply.data(), reply.size(), MSG_NOSIGNAL) < 0) break;
    }
  }
  close(fd);
}

int Run(int argc, char** argv) {
  Options options;
  std::string error;
  if (!ParseOptions(argc, argv, &options, &error)) {
    std::cerr << "longhaul-faultfs: " << error << "\n" << kUsage;
    return 2;
  }
  sigset_t mask;
  sigemptyset(&mask);
  sigaddset(&mask, SIGTERM);
  sigaddset(&mask, SIGINT);
  sigprocmask(SIG_BLOCK, &mask, nullptr);  // the FUSE readers inherit it
  signal(SIGPIPE, SIG_IGN);
  const int sig_fd = signalfd(-1, &mask, SFD_CLOEXEC);
  const pid_t parent = getppid();
  prctl(PR_SET_PDEATHSIG, SIGTERM);  // a dead test leaves no mount behind
  if (getppid() != parent) return 1;

  PassthroughContext context;
  FaultState state;
  context.state = &state;
  context.backing_fd = open(options.backing.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (context.backing_fd < 0) {
    std::cerr << "longhaul-faultfs: cannot open backing directory " << options.backing << ": "
              << std::strerror(errno) << "\n";
    return 1;
  }
  const int listen_fd = ListenUnix(options.control);
  if (listen_fd < 0) {
    std::cerr << "longhaul-faultfs: cannot listen on " << options.control << ": "
              << std::strerror(errno) << "\n";
    return 1;
  }

  // allow_other: the daemon under test and the test may be other users;
  // default_permissions: the kernel checks modes, as on a local disk.
  std::vector<std::string> args = {"longhaul-faultfs", "-o",
                                   "allow_other,default_permissions,fsname=longhaul-faultfs,"
                                   "subtype=faultfs"};
  std::vector<char*> argv_fuse;
  for (std::string& a : args) argv_fuse.push_back(a.data());
  fuse_args fargs = FUSE_ARGS_INIT(static_cast<int>(argv_fuse.size()), argv_fuse.data());
  fuse* fs = fuse_new(&fargs, &PassthroughOperations(), sizeof(fuse_operations), &context);
  if (fs == nullptr) {
    std::cerr << "longhaul-faultfs: fuse_new failed\n";
    return 1;
  }
  if (fuse_mount(fs, options.mountpoint.c_str()) != 0) {
    std::cerr << "longhaul-faultfs: cannot mount " << options.mountpoint
              << " (is /dev/fuse there, and are we root?)\n";
    return 1;
  }
  RequestLoop loop(fuse_get_session(fs));
  loop.Start(kReaderThreads);
  Controller controller(state, loop);

  if (!options.ready_file.empty()) {
    const std::string tmp = options.ready_file + ".tmp";
    FILE* f = std::fopen(tmp.c_str(), "w");
    if (f == nullptr || std::fprintf(f, "%d\n", getpid()) < 0 || std::fclose(f) != 0 ||
        rename(tmp.c_str(), options.ready_file.c_str()) != 0) {
      std::cerr << "longhaul-faultfs: cannot write " << options.ready_file << "\n";
      fuse_unmount(fs);
      return 1;
    }
  }
  std::cerr << "longhaul-faultfs: " << options.mountpoint << " mounted over " << options.backing
            << "\n";

  bool quit = false;
  while (!quit && !fuse_session_exited(fuse_get_session(fs))) {
    pollfd fds[2] = {{sig_fd, POLLIN, 0}, {listen_fd, POLLIN, 0}};
    if (poll(fds, 2, 1000) < 0 && errno != EINTR) break;
    if (fds[0].revents & POLLIN) quit = true;
    if (!quit && (fds[1].revents & POLLIN)) ServeClient(listen_fd, controller);
  }

  // Held requests run first, so no task stays blocked on the mount; then
  // the unmount (lazy when busy) ends the readers with the process.
  loop.Thaw();
  std::cerr << "longhaul-faultfs: unmounting " << options.mountpoint << ": "
            << controller.StatsJson() << "\n";
  fuse_session_exit(fuse_get_session(fs));
  fuse_unmount(fs);
  close(listen_fd);
  unlink(options.control.c_str());
  if (!options.ready_file.empty()) unlink(options.ready_file.c_str());
  std::_Exit(0);
}

}  // namespace
}  // namespace longhaul::faultfs

int main(int argc, char** argv) { return longhaul::faultfs::Run(argc, argv); }
