// longhauld: a site's transfer daemon. See README.md and deploy/CONFIG.md.
// The daemon itself is daemon/daemon.h; this file is the process around it:
// flags, logging, the open-file limit and signals.

#include <signal.h>
#include <sys/resource.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/fmt_absl.h"
#include "common/version.h"
#include "daemon/config.h"
#include "daemon/daemon.h"
#include "spdlog/spdlog.h"

namespace longhaul::daemon {
namespace {

// Each peer connection, pending or served, holds a descriptor: take the
// whole hard limit rather than a soft default of 1024.
void RaiseOpenFileLimit() {
  struct rlimit limit;
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0) {
    spdlog::warn("cannot read the open-file limit: {}", strerror(errno));
    return;
  }
  if (limit.rlim_cur < limit.rlim_max) {
    rlim_t soft = limit.rlim_cur;
    limit.rlim_cur = limit.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &limit) != 0) {
      spdlog::warn("cannot raise the open-file limit from {} to {}: {}", soft, limit.rlim_max,
                   strerror(errno));
      limit.rlim_cur = soft;
    }
  }
  spdlog::info("open-file limit {}", limit.rlim_cur);
}

// `signals` are blocked in every thread; they are taken here, by sigwait.
int Run(const std::string& config_path, const std::string& log_level_override,
        const sigset_t& signals) {
  auto config = LoadConfig(config_path);
  if (!config.ok()) {
    spdlog::critical(
        "bad configuration in {}: {} (`man longhauld` and /usr/share/doc/longhaul/CONFIG.md "
        "describe every key; /etc/longhaul/longhauld.yaml.example is a commented example)",
        config_path, config.status().message());
    return 1;
  }
  spdlog::set_level(spdlog::level::from_str(log_level_override.empty() ? config->log_level
                                                                       : log_level_override));
  spdlog::set_pattern(absl::StrCat("%Y-%m-%dT%H:%M:%S.%e %^%l%$ [", config->site, "] %v"));
  RaiseOpenFileLimit();

  auto daemon = Daemon::Start({.config = *std::move(config), .config_path = config_path});
  if (!daemon.ok()) {
    // Most start failures are the configuration's files (certificates,
    // directories, addresses): point a new operator at what explains them.
    spdlog::critical(
        "{} (configuration {}: `man longhauld` and /usr/share/doc/longhaul/CONFIG.md describe "
        "it; `longhaul-pki DIR SITE...` makes the tls files)",
        daemon.status().message(), config_path);
    return 1;
  }
  int received = 0;
  while (sigwait(&signals, &received) == 0 && received == SIGHUP) {
    (void)(*daemon)->ReloadTrust();  // a failure is logged and keeps the previous trust
  }
  spdlog::info("received {}; draining", strsignal(received));
  (*daemon)->Shutdown();
  return 0;
}

}  // namespace
}  // namespace longhaul::daemon

int main(int argc, char** argv) {
  CLI::App app{"longhauld: moves training data between sites over long-haul links"};
  std::string config_path;
  std::string log_level;
  app.add_option("--config", config_path, "YAML configuration file")->required();
  app.add_option("--log-level", log_level, "trace|debug|info|warn|error (overrides the config)");
  app.set_version_flag("--version", std::string(longhaul::Version()));
  // CLI11 exits with its own codes (106 for a missing option); a usage error
  // is 2 here, as for the CLI and most Unix tools.
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }

  // Signals are taken by sigwait in Run; every thread started later inherits
  // the mask. A peer that hangs up must be an error value, not SIGPIPE.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  signal(SIGPIPE, SIG_IGN);
  return longhaul::daemon::Run(config_path, log_level, signals);
}
