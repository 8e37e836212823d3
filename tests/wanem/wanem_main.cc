// longhaul-wanem: an emulated long-haul link between two network namespaces,
// or an N-site star of them.
//
//   longhaul-wanem [--rate=1Gbit --delay=20ms --loss=1% ...]   run a link
//   longhaul-wanem --sites=N [--siteK=SPEC ...]                run a star
//   longhaul-wanem ctl SOCKET CMD                              talk to one
//   longhaul-wanem --cleanup-stale                             remove leftovers
//
// See Usage() below and tests/wanem/README.md.

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "tests/wanem/emulator.h"
#include "tests/wanem/link_config.h"
#include "tests/wanem/netns.h"
#include "tests/wanem/relay.h"
#include "tests/wanem/star_emulator.h"
#include "tests/wanem/star_topology.h"

namespace longhaul::wanem {
namespace {

constexpr char kUsage[] = R"(usage:
  longhaul-wanem [options]          run a link until SIGTERM/SIGINT or 'quit'
  longhaul-wanem --sites=N [options]  run an N-site star (N = 2..8) instead
  longhaul-wanem ctl SOCKET CMD     send CMD to a running link's control socket
  longhaul-wanem --cleanup-stale    delete namespaces left by dead emulators

Link (both directions; --a2b/--b2a override per direction):
  --rate=R        bottleneck rate: 1Gbit, 500Mbit, 0 = unlimited   [0]
  --delay=D       one-way delay: 20ms                               [0ms]
  --jitter=D      uniform +-jitter on the delay, never reorders     [0ms]
  --loss=P        i.i.d. loss: 0.01 or 1%                           [0]
  --queue=B       drop-tail queue: bytes (5MB, 4MiB) or 'bdp'       [bdp]
  --a2b=SPEC      e.g. "rate=1Gbit,delay=20ms,loss=1%,queue=bdp"
  --b2a=SPEC
  --mtu=N         MTU of both TUN devices                           [9000]
  --seed=N        seed of the loss/jitter generator                 [1]

Process:
  --control=PATH     unix control socket (commands below)
  --ready-file=PATH  written once the link is up, shell-sourceable:
                     LHW_NS_A, LHW_NS_B, LHW_ADDR_A, LHW_ADDR_B, LHW_DEV, ...
  --stats-json=PATH  counters as JSON, written on exit
  --stay-without-parent  do not exit when the parent process dies

Site a is namespace lhw-<pid>-a with 198.18.0.1/30, site b lhw-<pid>-b with
198.18.0.2/30, each on TUN device lhw0. a2b is the direction a -> b.

Star (--sites=N): site K (1..N) is namespace lhw-<pid>-K with 198.18.1.K/24
on TUN device lhw0, joined to a core by its own access link: an uplink
(K -> core, shared by all of K's peers) and a downlink (core -> K). Both
directions take --rate/--delay/--jitter/--loss/--queue, so K -> J crosses
delay_K + delay_J one way (RTT 4 x delay), and 'bdp' is rate x 4 x delay.
  --siteK=SPEC       override both directions of site K's access link
  --siteK-up=SPEC    only its uplink;  --siteK-down=SPEC  only its downlink
The ready file then has LHW_SITES, LHW_NS_1..N, LHW_ADDR_1..N, LHW_DEV, ...

Control commands (also: SIGUSR1 = cut all, SIGUSR2 = restore all):
  cut [a2b|b2a|both]   restore [a2b|b2a|both]   stats   info   quit
  loss P [a2b|b2a|both]  a loss burst: lose packets with probability P (or the
                       configured loss if larger) until 'loss 0'
  star: cut [all | K [up|down|both]]   restore [all | K [up|down|both]]
        loss P [all | K [up|down|both]]
)";

struct Options {
  DirectionSpec a2b;
  DirectionSpec b2a;
  // Star mode when sites > 0: every access link starts from `base`.
  int sites = 0;
  DirectionSpec base;
  std::vector<SiteOption> site_options;
  int mtu = 9000;
  uint64_t seed = 1;
  std::string control;
  std::string ready_file;
  std::string stats_json;
  bool cleanup_stale = false;
  bool exit_with_parent = true;
};

absl::StatusOr<Options> ParseOptions(int argc, char** argv) {
  Options o;
  DirectionSpec both;
  std::string a2b_overrides, b2a_overrides;
  for (int i = 1; i < argc; ++i) {
    absl::string_view arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      std::cout << kUsage;
      std::exit(0);
    }
    if (!absl::ConsumePrefix(&arg, "--")) {
      return absl::InvalidArgumentError(absl::StrCat("unexpected '", arg, "'"));
    }
    std::string key, value;
    bool has_value = false;
    if (size_t eq = arg.find('='); eq != absl::string_view::npos) {
      key = std::string(arg.substr(0, eq));
      value = std::string(arg.substr(eq + 1));
      has_value = true;
    } else {
      key = std::string(arg);
    }
    absl::StrReplaceAll({{"_", "-"}}, &key);
    if (key == "cleanup-stale") {
      o.cleanup_stale = true;
      continue;
    }
    if (key == "stay-without-parent") {
      o.exit_with_parent = false;
      continue;
    }
    if (!has_value) {
      if (i + 1 >= argc) {
        return absl::InvalidArgumentError(absl::StrCat("--", key, " needs a value"));
      }
      value = argv[++i];
    }
    if (key == "rate") {
      both.rate = value;
    } else if (key == "delay") {
      both.delay = value;
    } else if (key == "jitter") {
      both.jitter = value;
    } else if (key == "loss") {
      both.loss = value;
    } else if (key == "queue") {
      both.queue = value;
    } else if (key == "sites") {
      if (!absl::SimpleAtoi(value, &o.sites) || o.sites < kMinStarSites ||
          o.sites > kMaxStarSites) {
        return absl::InvalidArgumentError(
            absl::StrCat("--sites must be within ", kMinStarSites, "..", kMaxStarSites));
      }
    } else if (IsSiteOptionKey(key)) {
      o.site_options.push_back({key, value});
    } else if (key == "a2b") {
      a2b_overrides = value;
    } else if (key == "b2a") {
      b2a_overrides = value;
    } else if (key == "mtu") {
      if (!absl::SimpleAtoi(value, &o.mtu) || o.mtu < 576 || o.mtu > 65000) {
        return absl::InvalidArgumentError("--mtu must be within 576..65000");
      }
    } else if (key == "seed") {
      if (!absl::SimpleAtoi(value, &o.seed)) {
        return absl::InvalidArgumentError("bad --seed");
      }
    } else if (key == "control") {
      o.control = value;
    } else if (key == "ready-file") {
      o.ready_file = value;
    } else if (key == "stats-json") {
      o.stats_json = value;
    } else {
      return absl::InvalidArgumentError(absl::StrCat("unknown option --", key));
    }
  }
  if (o.sites > 0 && (!a2b_overrides.empty() || !b2a_overrides.empty())) {
    return absl::InvalidArgumentError(
        "--a2b/--b2a are for the two-site link; a star takes --siteK");
  }
  if (o.sites == 0 && !o.site_options.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", o.site_options[0].key, " needs --sites=N"));
  }
  o.base = both;
  o.a2b = both;
  o.b2a = both;
  if (absl::Status s = ApplyOverrides(a2b_overrides, o.a2b); !s.ok()) return s;
  if (absl::Status s = ApplyOverrides(b2a_overrides, o.b2a); !s.ok()) return s;
  return o;
}

absl::Status WriteFileAtomically(const std::string& path, const std::string& text) {
  const std::string tmp = absl::StrCat(path, ".tmp.", getpid());
  {
    std::ofstream f(tmp);
    f << text;
    f.close();
    if (!f) return absl::InternalError(absl::StrCat("cannot write ", tmp));
  }
  if (rename(tmp.c_str(), path.c_str()) != 0) {
    return absl::InternalError(absl::StrCat("rename ", tmp, ": ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

// The two-site link: two sites and the two relay threads between them.
// Owned and driven by main's thread; the relays run on their own threads.
class TwoSiteEmulator : public Emulator {
 public:
  explicit TwoSiteEmulator(Options options) : options_(std::move(options)) {
    const std::string base = absl::StrCat(kNamespacePrefix, getpid());
    sites_[0] = {absl::StrCat(base, "-a"), "lhw0", "198.18.0.1", 30, options_.mtu};
    sites_[1] = {absl::StrCat(base, "-b"), "lhw0", "198.18.0.2", 30, options_.mtu};
  }
  ~TwoSiteEmulator() override { Stop(); }

  absl::Status Start() override {
    absl::StatusOr<DirectionParams> a2b = Resolve(options_.a2b);
    if (!a2b.ok()) return a2b.status();
    absl::StatusOr<DirectionParams> b2a = Resolve(options_.b2a);
    if (!b2a.ok()) return b2a.status();
    for (int i = 0; i < 2; ++i) {
      absl::StatusOr<int> fd = CreateSite(sites_[i]);
      if (!fd.ok()) return fd.status();
      tun_fds_[i] = *fd;
    }
    stop_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (stop_fd_ < 0) return absl::InternalError("eventfd failed");
    relays_[0] = std::make_unique<Relay>("a2b", tun_fds_[0], tun_fds_[1], stop_fd_, *a2b,
                                         options_.seed, options_.mtu);
    relays_[1] = std::make_unique<Relay>("b2a", tun_fds_[1], tun_fds_[0], stop_fd_, *b2a,
                                         options_.seed + 1, options_.mtu);
    for (int i = 0; i < 2; ++i) {
      threads_[i] = std::thread([r = relays_[i].get()] { r->Run(); });
    }
    return absl::OkStatus();
  }

  void Stop() override {
    if (stopped_) return;
    stopped_ = true;
    StopThreadsAndDeleteSites(stop_fd_, absl::MakeSpan(threads_), absl::MakeSpan(tun_fds_), sites_);
  }

  // Applies "cut"/"restore" to "a2b", "b2a" or "both" (the default).
  absl::Status SetCut(bool cut, absl::string_view which) override {
    return ForRelays(which, [cut](Relay& relay) { relay.set_cut(cut); });
  }

  absl::Status SetBurstLoss(double loss, absl::string_view which) override {
    return ForRelays(which, [loss](Relay& relay) { relay.set_burst_loss(loss); });
  }

  // Calls `apply` for the directions `which` names: "" or "both", "a2b",
  // "b2a". Before Start() there are none.
  absl::Status ForRelays(absl::string_view which, absl::FunctionRef<void(Relay&)> apply) {
    const bool a2b = which.empty() || which == "both" || which == "a2b";
    const bool b2a = which.empty() || which == "both" || which == "b2a";
    if (!a2b && !b2a) {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown direction '", which, "' (a2b, b2a, both)"));
    }
    if (a2b && relays_[0] != nullptr) apply(*relays_[0]);
    if (b2a && relays_[1] != nullptr) apply(*relays_[1]);
    return absl::OkStatus();
  }

  std::string InfoJson() const override {
    return absl::StrCat("{\"pid\":", getpid(), ",\"ns_a\":\"", sites_[0].ns, "\",\"ns_b\":\"",
                        sites_[1].ns, "\",\"addr_a\":\"", sites_[0].address, "\",\"addr_b\":\"",
                        sites_[1].address, "\",\"dev\":\"lhw0\",\"mtu\":", options_.mtu, "}");
  }

  std::string StatsJson() const override {
    std::string out = InfoJson();
    out.pop_back();  // The closing brace: the directions join the object.
    if (relays_[0] == nullptr) return absl::StrCat(out, "}");
    return absl::StrCat(out, ",\"a2b\":", relays_[0]->StatsJson(),
                        ",\"b2a\":", relays_[1]->StatsJson(), "}");
  }

  std::string ReadyFileText() const override {
    return absl::StrCat(
        "LHW_PID=", getpid(), "\nLHW_NS_A=", sites_[0].ns, "\nLHW_NS_B=", sites_[1].ns,
        "\nLHW_ADDR_A=", sites_[0].address, "\nLHW_ADDR_B=", sites_[1].address,
        "\nLHW_DEV=lhw0\nLHW_MTU=", options_.mtu, "\nLHW_CONTROL=", options_.control, "\n");
  }

  std::string Summary() const override {
    std::string out;
    for (const auto& r : relays_) {
      if (r == nullptr) continue;
      const DirectionCounters& c = r->counters();
      absl::StrAppend(&out, "longhaul-wanem ", r->name(), ": forwarded ",
                      c.forwarded_packets.load(), " packets (", c.forwarded_bytes.load(),
                      " bytes), dropped by queue ", c.dropped_queue.load(), ", by loss ",
                      c.dropped_loss.load(), ", by cut ", c.dropped_cut.load(), ", by overflow ",
                      c.dropped_overflow.load(), "\n");
    }
    return out;
  }

 private:
  Options options_;
  SiteSpec sites_[2];
  int tun_fds_[2] = {-1, -1};
  int stop_fd_ = -1;
  std::unique_ptr<Relay> relays_[2];
  std::thread threads_[2];
  bool stopped_ = false;
};

// The star when --sites is given, else the two-site link; null (after saying
// why) when the star's options do not resolve.
std::unique_ptr<Emulator> NewEmulator(const Options& options) {
  if (options.sites == 0) return std::make_unique<TwoSiteEmulator>(options);
  absl::StatusOr<std::vector<AccessLinkParams>> links =
      BuildStar(options.sites, options.base, options.site_options);
  if (!links.ok()) {
    std::cerr << "longhaul-wanem: " << links.status().message() << "\n";
    return nullptr;
  }
  return NewStarEmulator({*std::move(links), options.mtu, options.seed, options.control});
}

// Executes one control command; returns the reply line.
std::string HandleCommand(Emulator& emu, absl::string_view line, bool& quit) {
  std::vector<absl::string_view> words =
      absl::StrSplit(absl::StripAsciiWhitespace(line), ' ', absl::SkipEmpty());
  if (words.empty()) return "error: empty command";
  if (words[0] == "cut" || words[0] == "restore") {
    const std::string which = absl::StrJoin(words.begin() + 1, words.end(), " ");
    absl::Status s = emu.SetCut(words[0] == "cut", which);
    return s.ok() ? "ok" : absl::StrCat("error: ", s.message());
  }
  if (words[0] == "loss") {
    double loss;
    if (words.size() < 2 || !absl::SimpleAtod(words[1], &loss) || !(loss >= 0 && loss <= 1)) {
      return "error: usage: loss PROBABILITY [LINK] (PROBABILITY in [0, 1]; 0 ends the burst)";
    }
    const std::string which = absl::StrJoin(words.begin() + 2, words.end(), " ");
    absl::Status s = emu.SetBurstLoss(loss, which);
    return s.ok() ? "ok" : absl::StrCat("error: ", s.message());
  }
  if (words[0] == "stats") return emu.StatsJson();
  if (words[0] == "info") return emu.InfoJson();
  if (words[0] == "quit") {
    quit = true;
    return "ok";
  }
  return absl::StrCat("error: unknown command '", words[0],
                      "' (cut, restore, loss, stats, info, quit)");
}

int ListenUnix(const std::string& path) {
  struct sockaddr_un addr;
  std::memset(&addr, 0, sizeof(addr));
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof(addr.sun_path)) return -1;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  unlink(path.c_str());
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || listen(fd, 16) != 0) {
    close(fd);
    return -1;
  }
  chmod(path.c_str(), 0660);
  return fd;
}

void ServeClient(Emulator& emu, int listen_fd, bool& quit) {
  const int c = accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
  if (c < 0) return;
  struct timeval tv = {1, 0};
  setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  std::string line;
  char buf[256];
  while (line.find('\n') == std::string::npos && line.size() < 4096) {
    const ssize_t n = read(c, buf, sizeof(buf));
    if (n <= 0) break;
    line.append(buf, n);
  }
  line = line.substr(0, line.find('\n'));
  const std::string reply = HandleCommand(emu, line, quit) + "\n";
  [[maybe_unused]] ssize_t n = write(c, reply.data(), reply.size());
  close(c);
}

int CtlMain(int argc, char** argv) {
  if (argc < 4) {
    std::cerr << kUsage;
    return 2;
  }
  std::vector<std::string> words(argv + 3, argv + argc);
  const std::string cmd = absl::StrJoin(words, " ") + "\n";
  struct sockaddr_un addr;
  std::memset(&addr, 0, sizeof(addr));
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, argv[2], sizeof(addr.sun_path) - 1);
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0 || connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    std::cerr << "longhaul-wanem ctl: cannot connect to " << argv[2] << ": " << std::strerror(errno)
              << "\n";
    return 1;
  }
  if (write(fd, cmd.data(), cmd.size()) != static_cast<ssize_t>(cmd.size())) {
    std::cerr << "longhaul-wanem ctl: write failed\n";
    return 1;
  }
  std::string reply;
  char buf[4096];
  ssize_t n;
  while ((n = read(fd, buf, sizeof(buf))) > 0) reply.append(buf, n);
  close(fd);
  std::cout << reply;
  return absl::StartsWith(reply, "error") || reply.empty() ? 1 : 0;
}

int RunMain(int argc, char** argv) {
  absl::StatusOr<Options> options = ParseOptions(argc, argv);
  if (!options.ok()) {
    std::cerr << "longhaul-wanem: " << options.status().message() << "\n\n" << kUsage;
    return 2;
  }
  // Made (not started) before anything else, so bad star options change
  // nothing on the host.
  std::unique_ptr<Emulator> emulator = NewEmulator(*options);
  if (emulator == nullptr) return 2;
  absl::StatusOr<std::vector<std::string>> stale = CleanupStaleNamespaces();
  if (!stale.ok()) {
    std::cerr << "longhaul-wanem: cleanup: " << stale.status().message() << "\n";
  } else {
    for (const std::string& ns : *stale) {
      std::cerr << "longhaul-wanem: removed stale namespace " << ns << "\n";
    }
  }
  if (options->cleanup_stale) return stale.ok() ? 0 : 1;

  // Signals are taken synchronously through a signalfd on this thread; the
  // relay threads inherit the blocked mask.
  sigset_t mask;
  sigemptyset(&mask);
  for (int sig : {SIGTERM, SIGINT, SIGHUP, SIGUSR1, SIGUSR2}) {
    sigaddset(&mask, sig);
  }
  sigprocmask(SIG_BLOCK, &mask, nullptr);
  signal(SIGPIPE, SIG_IGN);
  const int sig_fd = signalfd(-1, &mask, SFD_CLOEXEC);
  if (options->exit_with_parent) {
    // If whoever started us dies (even by SIGKILL), tear the link down.
    const pid_t parent = getppid();
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) return 1;
  }

  Emulator& emu = *emulator;
  if (absl::Status s = emu.Start(); !s.ok()) {
    std::cerr << "longhaul-wanem: " << s.message() << "\n";
    emu.Stop();
    return 1;
  }
  int listen_fd = -1;
  if (!options->control.empty()) {
    listen_fd = ListenUnix(options->control);
    if (listen_fd < 0) {
      std::cerr << "longhaul-wanem: cannot listen on " << options->control << ": "
                << std::strerror(errno) << "\n";
      emu.Stop();
      return 1;
    }
  }
  if (!options->ready_file.empty()) {
    if (absl::Status s = WriteFileAtomically(options->ready_file, emu.ReadyFileText()); !s.ok()) {
      std::cerr << "longhaul-wanem: " << s.message() << "\n";
      emu.Stop();
      return 1;
    }
  }
  std::cerr << "longhaul-wanem: up: " << emu.StatsJson() << "\n";

  bool quit = false;
  while (!quit) {
    struct pollfd fds[2] = {{sig_fd, POLLIN, 0}, {listen_fd, POLLIN, 0}};
    if (poll(fds, listen_fd >= 0 ? 2 : 1, -1) < 0) {
      if (errno == EINTR) continue;
      break;
    }
    if (fds[0].revents & POLLIN) {
      struct signalfd_siginfo si;
      if (read(sig_fd, &si, sizeof(si)) == sizeof(si)) {
        if (si.ssi_signo == SIGUSR1) {
          emu.SetCut(true, "").IgnoreError();
        } else if (si.ssi_signo == SIGUSR2) {
          emu.SetCut(false, "").IgnoreError();
        } else {
          quit = true;
        }
      }
    }
    if (listen_fd >= 0 && (fds[1].revents & POLLIN)) {
      ServeClient(emu, listen_fd, quit);
    }
  }

  emu.Stop();
  const std::string stats = emu.StatsJson();
  std::cout << emu.Summary() << std::flush;
  if (!options->stats_json.empty()) {
    if (absl::Status s = WriteFileAtomically(options->stats_json, stats + "\n"); !s.ok()) {
      std::cerr << "longhaul-wanem: " << s.message() << "\n";
    }
  }
  if (listen_fd >= 0) {
    close(listen_fd);
    unlink(options->control.c_str());
  }
  if (!options->ready_file.empty()) unlink(options->ready_file.c_str());
  return 0;
}

}  // namespace
}  // namespace longhaul::wanem

int main(int argc, char** argv) {
  if (argc >= 2 && std::strcmp(argv[1], "ctl") == 0) {
    return longhaul::wanem::CtlMain(argc, argv);
  }
  return longhaul::wanem::RunMain(argc, argv);
}
