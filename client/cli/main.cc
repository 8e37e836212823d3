// longhaul: the operator's CLI. Talks to the local longhauld over its control
// socket. Exit codes (README's table): 0 ok, 1 transfer failed (or verify
// found a mismatch), 2 usage error or a refused request, 3 daemon
// unreachable, 130 Ctrl-C while waiting (the transfer goes on).

#include <signal.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "absl/random/random.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/cli/lookup.h"
#include "client/cli/output.h"
#include "client/cli/quantities.h"
#include "client/deadline.h"
#include "common/checkpoints.h"
#include "common/units_parse.h"
#include "common/version.h"
#include "longhaul/client.h"

namespace longhaul::cli {
namespace {

constexpr int kExitOk = 0;
constexpr int kExitFailed = 1;
constexpr int kExitUsage = 2;
constexpr int kExitUnreachable = 3;
// Ctrl-C while following a transfer: the CLI stops, the transfer goes on.
constexpr int kExitInterrupted = 130;

struct Globals {
  std::string daemon;
  std::string token_file;
  bool json = false;
  bool quiet = false;    // -q: errors and the transfer id only (cron)
  bool verbose = false;  // -v: where the daemon is, what is submitted, every update
  // How long `--wait` and `status --watch` keep reconnecting to a daemon
  // that went away (a restart, a crash) before they give up with exit 3.
  absl::Duration reconnect_timeout = absl::Minutes(2);
};

// A Watch that ended because the daemon went away (killed, restarting, its
// socket gone), not because the daemon answered: worth reconnecting for.
// The CLI never cancels its own call, so a cancelled stream is the
// daemon's shutdown too.
bool DaemonLost(const absl::Status& status) {
  return status.code() == absl::StatusCode::kUnavailable ||
         status.code() == absl::StatusCode::kCancelled;
}

int Report(const absl::Status& status) {
  std::fprintf(stderr, "longhaul: %s\n", std::string(status.message()).c_str());
  if (status.code() == absl::StatusCode::kUnavailable &&
      status.message().find("cannot reach longhauld") != absl::string_view::npos) {
    return kExitUnreachable;
  }
  return IsRefusal(status) ? kExitUsage : kExitFailed;
}

absl::StatusOr<std::unique_ptr<Client>> Connect(const Globals& g) {
  std::string address = g.daemon;
  if (address.empty()) {
    const char* env = std::getenv("LONGHAUL_DAEMON");
    address = env ? env : "unix:/var/lib/longhaul/control.sock";
  }
  auto resolved = ControlAddress(address);
  if (!resolved.ok()) return resolved.status();
  address = *resolved;
  if (g.verbose) std::fprintf(stderr, "longhaul: daemon at %s\n", address.c_str());
  Client::Options options;
  std::string token_file = g.token_file;
  if (token_file.empty()) {
    const char* env = std::getenv("LONGHAUL_TOKEN_FILE");
    token_file = env ? env : "";
  }
  if (!token_file.empty()) {
    std::ifstream in(token_file);
    if (!in || !std::getline(in, options.token)) {
      return absl::InvalidArgumentError(absl::StrCat("cannot read the token file ", token_file));
    }
    options.token = std::string(absl::StripAsciiWhitespace(options.token));
  }
  return Client::Connect(address, options);
}

// The width of the terminal on stdout, read again for each update so that
// a resized window is followed; $COLUMNS when the tty does not say; else 80.
int TerminalWidth() {
  struct winsize w;
  if (ioctl(STDOUT_FILENO, TIOCGWINSZ, &w) == 0 && w.ws_col > 0) return w.ws_col;
  if (const char* columns = std::getenv("COLUMNS"); columns != nullptr && std::atoi(columns) > 0) {
    return std::atoi(columns);
  }
  return 80;
}

// What Ctrl-C prints while a transfer is followed, formatted beforehand:
// the handler may only write(2) and _exit(2).
char interrupt_message[1024];
size_t interrupt_message_size = 0;

void OnInterrupt(int) {
  ssize_t ignored = write(STDERR_FILENO, interrupt_message, interrupt_message_size);
  (void)ignored;
  _exit(kExitInterrupted);
}

// From here until the process ends, Ctrl-C (or SIGTERM) says that transfer
// `id` goes on at the daemon and how to follow or cancel it.
void ExplainInterruptFor(const std::string& id, const Globals& g) {
  const std::string cli =
      g.daemon.empty() ? "longhaul" : absl::StrCat("longhaul --daemon ", g.daemon);
  const std::string message = absl::StrCat(
      "\nlonghaul: stopped waiting; transfer ", id, " goes on at the daemon. Follow it: ", cli,
      " status --watch ", id, "; cancel it: ", cli, " cancel ", id, "\n");
  interrupt_message_size = std::min(message.size(), sizeof(interrupt_message));
  std::copy_n(message.data(), interrupt_message_size, interrupt_message);
  struct sigaction action {};
  action.sa_handler = OnInterrupt;
  sigemptyset(&action.sa_mask);
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);
}

int ExitFor(const v1::TransferStatus& s) { return s.state() == v1::COMPLETED ? kExitOk : kExitFailed; }

// Follows a transfer to its end, drawing progress; returns the exit code.
// A daemon that goes away meanwhile (a restart, a crash) is waited for: the
// same transfer is followed again once it answers, so the exit code is the
// transfer's. Only a daemon that stays away for g.reconnect_timeout gives
// kExitUnreachable; the transfer may still be running then.
int Follow(Client& client, const std::string& id, const Globals& g, bool json_lines) {
  const bool tty = isatty(STDOUT_FILENO) && !g.json && !g.quiet;
  ExplainInterruptFor(id, g);
  std::string last_line;
  bool lost = false;     // the daemon went away and has not answered since
  bool updated = false;  // the current Watch delivered an update
  auto on_update = [&](const v1::TransferStatus& s) {
    updated = true;
    if (lost) {
      lost = false;
      std::fprintf(stderr, "longhaul: longhauld is back; still waiting for transfer %s\n",
                   id.c_str());
    }
    if (json_lines) {
      std::cout << TransferJson(s).str() << std::endl;
    } else if (tty) {
      std::cout << "\r" << ProgressBar(s, TerminalWidth()) << "\x1b[K" << std::flush;
    } else if (!g.json && !g.quiet) {
      std::string line = ProgressLine(s);
      if (line != last_line || g.verbose) std::cout << line << std::endl;
      last_line = line;
    }
  };
  constexpr absl::Duration kFirstRetry = absl::Milliseconds(100);
  constexpr absl::Duration kMaxRetry = absl::Seconds(2);
  absl::Duration retry = kFirstRetry;
  absl::Time give_up = absl::InfiniteFuture();
  absl::StatusOr<v1::TransferStatus> final_status;
  while (true) {
    updated = false;
    final_status = client.Watch(id, on_update);
    if (final_status.ok() || !DaemonLost(final_status.status())) break;
    const absl::Time now = client_internal::MonotonicNow();
    if (updated || give_up == absl::InfiniteFuture()) {
      // Lost now (again): a fresh window from here.
      give_up = now + g.reconnect_timeout;
      retry = kFirstRetry;
      lost = true;
      if (tty) std::cout << std::endl;
      std::fprintf(stderr,
                   "longhaul: lost longhauld while waiting for transfer %s (%s); reconnecting "
                   "for up to %s\n",
                   id.c_str(), std::string(final_status.status().message()).c_str(),
                   absl::FormatDuration(g.reconnect_timeout).c_str());
    }
    if (now >= give_up) {
      std::fprintf(stderr,
                   "longhaul: longhauld did not come back within %s (%s); transfer %s may still "
                   "be running: see `longhaul status %s` once the daemon is up\n",
                   absl::FormatDuration(g.reconnect_timeout).c_str(),
                   std::string(final_status.status().message()).c_str(), id.c_str(), id.c_str());
      return kExitUnreachable;
    }
    absl::SleepFor(std::min(retry, give_up - now));
    retry = std::min(retry * 2, kMaxRetry);
  }
  if (!final_status.ok()) {
    if (tty) std::cout << std::endl;
    return Report(final_status.status());
  }
  if (tty) std::cout << std::endl;
  if (g.json && !json_lines) {
    std::cout << TransferJson(*final_status).str() << std::endl;
  } else if (g.quiet) {
    if (ExitFor(*final_status) != kExitOk) std::cerr << Summary(*final_status) << std::endl;
  } else if (!json_lines) {
    const std::string summary = g.verbose ? DetailText(*final_status) : Summary(*final_status);
    std::cout << (tty ? Fold(summary, TerminalWidth()) : summary) << std::endl;
  }
  return ExitFor(*final_status);
}

struct CopyOptions {
  std::vector<std::string> args;  // SRC... DEST
  uint32_t streams = 0;
  std::string chunk_size;
  std::vector<std::string> commit_last;
  bool wait = false;
  std::string transport;
  std::string priority;
  std::string request_id;
  // sync only: SRC is a directory of checkpoints (see ListCheckpoints).
  uint32_t keep = 0;
  std::string only_complete;
  bool checksum = false;
  std::string symlinks;  // keep|follow|refuse; "" is keep
  bool hard_links = false;
  std::vector<std::string> also;  // fan-out: more destinations, in chain order
  bool replace = false;           // cp: replace a destination that differs
  bool no_delete = false;         // sync: keep destination-only files
  bool dry_run = false;           // list what would change, change nothing
};

// A checkpoint directory of a sync SRC and the commit markers it holds.
struct Checkpoint {
  std::string name;
  std::vector<std::string> markers;  // relative paths, sorted; empty: still being written
};

// The checkpoints of `dir`: its subdirectories (not symlinks, not hidden), in
// natural name order, each with the marker files it holds. With
// `only_complete` that is the one file it names; otherwise every regular
// file whose path is a commit marker by `globs`. Symlinks are never followed.
std::vector<Checkpoint> ListCheckpoints(const std::filesystem::path& dir,
                                        const std::string& only_complete,
                                        const std::vector<std::string>& globs) {
  namespace fs = std::filesystem;
  std::vector<Checkpoint> checkpoints;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.empty() || name[0] == '.' || entry.is_symlink(ec) || !entry.is_directory(ec)) continue;
    Checkpoint c{name, {}};
    if (!only_complete.empty()) {
      if (fs::is_regular_file(fs::symlink_status(entry.path() / only_complete, ec))) {
        c.markers.push_back(only_complete);
      }
    } else {
      for (auto it = fs::recursive_directory_iterator(entry.path(), ec);
           !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
        if (!fs::is_regular_file(it->symlink_status(ec))) continue;
        const std::string rel = it->path().lexically_relative(entry.path()).string();
        if (IsCommitMarker(globs, rel)) c.markers.push_back(rel);
      }
      ec.clear();
      std::sort(c.markers.begin(), c.markers.end());
    }
    checkpoints.push_back(std::move(c));
  }
  std::sort(checkpoints.begin(), checkpoints.end(),
            [](const Checkpoint& a, const Checkpoint& b) { return NaturalLess(a.name, b.name); });
  return checkpoints;
}

// The marker the destination counts checkpoints by when it prunes (it holds
// no glob, one path): the first marker of `newest` that every checkpoint in
// `complete` holds too, so that older checkpoints of the same run still
// count; else newest's first, which keeps checkpoints marked otherwise out of
// the count (never removed) rather than counting unfinished directories.
std::string DestinationMarker(const std::vector<Checkpoint>& complete, const Checkpoint& newest) {
  for (const std::string& marker : newest.markers) {
    if (std::all_of(complete.begin(), complete.end(), [&](const Checkpoint& c) {
          return std::binary_search(c.markers.begin(), c.markers.end(), marker);
        })) {
      return marker;
    }
  }
  return newest.markers.front();
}

// Reports a failed submit; returns the exit code. Copying to the site
// itself reads as an unknown peer to the daemon: the operator is told it is
// the local site.
int ReportRefusedSubmit(Client& client, const v1::TransferSpec& spec, const absl::Status& status) {
  if (absl::StrContains(status.message(), "unknown peer site")) {
    auto peers = client.Peers(/*probe=*/false);
    if (peers.ok() && peers->site() == spec.dest_site()) {
      std::fprintf(stderr,
                   "longhaul: %s is the local site (the daemon this CLI talks to), not a peer; "
                   "copy to a peer site, or use cp(1) within the site\n",
                   spec.dest_site().c_str());
      return kExitUsage;
    }
  }
  return Report(status);
}

// Submits every spec, then prints their ids or (with --wait) follows them in
// turn. `labels[i]`, when given, names what spec i sends (a checkpoint) on
// each output line. Returns the worst exit code.
int SubmitAll(const std::vector<v1::TransferSpec>& specs,
              const std::vector<std::string>& request_ids, bool wait, const Globals& g,
              const std::vector<std::string>& labels = {}) {
  auto client = Connect(g);
  if (!client.ok()) return Report(client.status());
  std::vector<std::string> ids;
  const bool tty = isatty(STDOUT_FILENO) && !g.json;
  for (size_t i = 0; i < specs.size(); ++i) {
    const std::string label = i < labels.size() ? absl::StrCat("  ", labels[i]) : "";
    if (g.verbose) {
      std::fprintf(stderr, "longhaul: submitting%s: %s\n", label.c_str(),
                   SpecText(specs[i]).c_str());
    }
    auto submitted = (*client)->Submit(specs[i], request_ids[i]);
    if (!submitted.ok()) {
      return ReportRefusedSubmit(**client, specs[i], submitted.status());
    }
    if (specs[i].dry_run()) {
      std::cout << (g.json ? TransferJson(*submitted).str() : DryRunText(*submitted)) << std::endl;
      continue;
    }
    ids.push_back(submitted->id());
    if (specs[i].checksum() && !submitted->spec().checksum()) {
      std::fprintf(stderr,
                   "longhaul: attached to sync %s, which is still running without --checksum; "
                   "run again once it has ended to compare checksums\n",
                   submitted->id().c_str());
    }
    if (g.json) {
      if (!wait) std::cout << TransferJson(*submitted).str() << std::endl;
    } else if (!wait || g.quiet) {
      std::cout << submitted->id() << (g.quiet ? "" : label) << std::endl;
    } else if (tty) {
      // Known before the bar starts, so that a closed terminal loses nothing.
      std::cout << "transfer " << submitted->id() << label << " submitted" << std::endl;
    } else if (!label.empty()) {
      std::cout << submitted->id() << label << std::endl;
    }
  }
  int worst = kExitOk;
  if (wait) {
    for (const std::string& id : ids) worst = std::max(worst, Follow(**client, id, g, /*json_lines=*/false));
  }
  return worst;
}

std::string RandomRequestId() {
  absl::BitGen gen;
  return absl::StrFormat("cli-%016x%016x", absl::Uniform<uint64_t>(gen), absl::Uniform<uint64_t>(gen));
}

int Copy(const CopyOptions& o, const Globals& g, bool sync) {
  if (o.args.size() < 2) {
    std::fprintf(stderr, "longhaul: need at least one source and a destination SITE:/EXPORT/PATH\n");
    return kExitUsage;
  }
  auto dest = ParseDestination(o.args.back());
  if (!dest.ok()) return Report(dest.status());
  if (dest->path.empty()) {
    std::fprintf(stderr, "longhaul: destination %s needs a path below the export, e.g. %s:/%s/NAME\n",
                 o.args.back().c_str(), dest->site.c_str(), dest->export_name.c_str());
    return kExitUsage;
  }
  v1::TransferSpec spec;
  // Pull or third-party copy: the one source is SITE:/EXPORT/PATH (as with
  // rsync, a colon before the first slash; write ./a:b for a local file).
  if (IsRemoteLocation(o.args.front())) {
    if (o.args.size() != 2) {
      std::fprintf(stderr,
                   "longhaul: a remote source SITE:/EXPORT/PATH is copied alone; give one "
                   "source and the destination\n");
      return kExitUsage;
    }
    if (o.keep > 0 || !o.only_complete.empty()) {
      std::fprintf(stderr, "longhaul: --keep and --only-complete need a local SRC\n");
      return kExitUsage;
    }
    auto source = ParseDestination(o.args.front());
    if (!source.ok()) return Report(source.status());
    if (source->path.empty()) {
      std::fprintf(stderr, "longhaul: source %s needs a path below the export\n",
                   o.args.front().c_str());
      return kExitUsage;
    }
    spec.set_source_site(source->site);
    spec.set_source_export(source->export_name);
    spec.set_source_path(source->path);
  }
  for (size_t i = 0; spec.source_site().empty() && i + 1 < o.args.size(); ++i) {
    std::error_code ec;
    std::filesystem::path p = std::filesystem::absolute(o.args[i], ec).lexically_normal();
    std::string s = p.string();
    while (s.size() > 1 && s.back() == '/') s.pop_back();
    if (!std::filesystem::exists(p, ec)) {
      std::fprintf(stderr, "longhaul: source %s does not exist\n", o.args[i].c_str());
      return kExitUsage;
    }
    spec.add_sources(s);
  }
  spec.set_dest_site(dest->site);
  spec.set_dest_export(dest->export_name);
  spec.set_dest_path(dest->path);
  for (const std::string& text : o.also) {
    auto also = ParseDestination(text);
    if (!also.ok())
      return Report(absl::InvalidArgumentError(absl::StrCat("--also: ", also.status().message())));
    if (also->path.empty()) {
      std::fprintf(stderr, "longhaul: --also %s needs a path below the export, e.g. %s:/%s/NAME\n",
                   text.c_str(), also->site.c_str(), also->export_name.c_str());
      return kExitUsage;
    }
    v1::Destination* d = spec.add_also();
    d->set_site(also->site);
    d->set_export_name(also->export_name);
    d->set_path(also->path);
  }
  if (!spec.also().empty() && !spec.source_site().empty()) {
    std::fprintf(
        stderr,
        "longhaul: --also needs local sources; pull to one site, then fan out from there\n");
    return kExitUsage;
  }
  spec.set_streams(o.streams);
  if (!o.chunk_size.empty()) {
    // The daemon's transfer.max_chunk_size may allow less than the top.
    auto size =
        ParseSize(o.chunk_size, "--chunk-size", {.min_bytes = 64 << 10, .max_bytes = 1 << 30});
    if (!size.ok()) return Report(size.status());
    spec.set_chunk_size(*size);
  }
  for (const std::string& glob : o.commit_last) spec.add_commit_last(glob);
  spec.set_sync(sync);
  spec.set_checksum(o.checksum);
  spec.set_replace(o.replace);
  spec.set_no_delete(o.no_delete);
  spec.set_dry_run(o.dry_run);
  spec.set_symlinks(o.symlinks);
  spec.set_hard_links(o.hard_links);
  spec.set_transport(o.transport);
  if (o.priority == "exchange") spec.set_priority(v1::EXCHANGE);
  if (o.priority == "background") spec.set_priority(v1::BACKGROUND);
  if (o.priority.empty() || o.priority == "checkpoint") spec.set_priority(v1::CHECKPOINT);
  const std::string request_id = o.request_id.empty() ? RandomRequestId() : o.request_id;
  if (o.keep == 0 && o.only_complete.empty()) return SubmitAll({spec}, {request_id}, o.wait, g);

  // Cron replication: one sync per selected checkpoint, to DEST/NAME, so each
  // checkpoint is published (and retained) as a unit.
  if (spec.sources_size() != 1 || !std::filesystem::is_directory(spec.sources(0))) {
    std::fprintf(stderr, "longhaul: with --keep or --only-complete, give one SRC: the directory that holds "
                         "the checkpoints (one subdirectory each)\n");
    return kExitUsage;
  }
  if (absl::Status s = ValidateCheckpointMarker(o.only_complete); !s.ok()) return Report(s);
  // A checkpoint counts once it holds its marker: --only-complete's, else
  // a commit marker (the defaults and --commit-last), which is what marks a
  // checkpoint finished when it is published too.
  std::vector<std::string> globs;
  std::string marker_desc = o.only_complete;
  if (o.only_complete.empty()) {
    globs.assign(kDefaultCommitMarkers.begin(), kDefaultCommitMarkers.end());
    globs.insert(globs.end(), o.commit_last.begin(), o.commit_last.end());
    marker_desc = absl::StrCat("commit marker (", absl::StrJoin(globs, ", "), ")");
  }
  const std::vector<Checkpoint> all = ListCheckpoints(spec.sources(0), o.only_complete, globs);
  std::vector<Checkpoint> complete;
  for (const Checkpoint& c : all) {
    if (!c.markers.empty()) complete.push_back(c);
  }
  if (complete.empty() && !all.empty() && o.only_complete.empty()) {
    std::fprintf(stderr,
                 "longhaul: --keep sends and keeps only finished checkpoints, but none of the %zu "
                 "directories in %s holds a %s, so none can be told finished; name the file a "
                 "finished checkpoint holds with --only-complete FILE, or add its glob with "
                 "--commit-last GLOB\n",
                 all.size(), spec.sources(0).c_str(), marker_desc.c_str());
    return kExitUsage;
  }
  for (const Checkpoint& c : all) {
    if (c.markers.empty() && !g.quiet) {
      std::fprintf(stderr, "longhaul: skipping %s: no %s yet (still being written?)\n",
                   c.name.c_str(), marker_desc.c_str());
    }
  }
  if (complete.empty()) {
    std::fprintf(stderr, "longhaul: no complete checkpoint in %s; nothing to send\n", spec.sources(0).c_str());
    return kExitOk;
  }
  std::vector<Checkpoint> selected = complete;
  if (o.keep > 0 && selected.size() > o.keep)
    selected.erase(selected.begin(), selected.end() - o.keep);
  const std::string dest_marker = DestinationMarker(complete, complete.back());
  std::vector<v1::TransferSpec> specs;
  std::vector<std::string> request_ids;
  std::vector<std::string> labels;
  for (const Checkpoint& c : selected) {
    labels.push_back(c.name);
    v1::TransferSpec one = spec;
    one.set_sources(0, absl::StrCat(spec.sources(0), "/", c.name));
    one.set_dest_path(absl::StrCat(spec.dest_path(), "/", c.name));
    for (v1::Destination& d : *one.mutable_also()) d.set_path(absl::StrCat(d.path(), "/", c.name));
    one.set_keep_checkpoints(o.keep);
    one.set_checkpoint_marker(dest_marker);
    // The markers are published last, whatever the daemon's own defaults.
    for (const std::string& m : c.markers) one.add_commit_last(GlobMatchingOnly(m));
    specs.push_back(std::move(one));
    request_ids.push_back(absl::StrCat(request_id, "/", c.name));
  }
  return SubmitAll(specs, request_ids, o.wait, g, labels);
}

int Status(const std::string& id_or_prefix, bool watch, const Globals& g) {
  auto client = Connect(g);
  if (!client.ok()) return Report(client.status());
  auto id = ResolveId(**client, id_or_prefix);
  if (!id.ok()) return Report(id.status());
  if (watch) return Follow(**client, *id, g, /*json_lines=*/g.json);
  auto status = (*client)->Get(*id);
  if (!status.ok()) return Report(status.status());
  std::cout << (g.json ? TransferJson(*status).str() : StatusText(*status)) << std::endl;
  return kExitOk;
}

int ListTransfers(const ListFilter& filter, const Globals& g) {
  auto client = Connect(g);
  if (!client.ok()) return Report(client.status());
  auto listed = (*client)->List(/*all=*/true);
  if (!listed.ok()) return Report(listed.status());
  std::vector<v1::TransferStatus> shown;
  const absl::Time now = absl::Now();
  for (v1::TransferStatus& s : *listed) {
    if (Listed(s, filter, now)) shown.push_back(std::move(s));
  }
  const std::vector<v1::TransferStatus>* list = &shown;
  if (g.json) {
    std::vector<std::string> items;
    for (const auto& s : *list) items.push_back(TransferJson(s).str());
    std::cout << JsonObject().AddRaw("transfers", JsonArray(items)).str() << std::endl;
    return kExitOk;
  }
  if (g.quiet) {
    for (const auto& s : *list) std::cout << s.id() << "\n";
    return kExitOk;
  }
  std::cout << absl::StrFormat("%-20s %-10s %7s  %s\n", "ID", "STATE", "DONE", "DESTINATION");
  for (const auto& s : *list) {
    double pct = s.bytes_total() ? 100.0 * s.bytes_done() / s.bytes_total() : 100.0;
    std::string from;
    if (!s.spec().source_site().empty()) {
      from = absl::StrCat("  (from ", s.spec().source_site(), ":/", s.spec().source_export(), "/",
                          s.spec().source_path(), ")");
    } else if (!s.spec().requested_by().empty()) {
      from = absl::StrCat("  (requested by ", s.spec().requested_by(), ")");
    }
    if (s.destinations_size() > 1) {
      absl::StrAppend(&from, "  (+", s.destinations_size() - 1, " more: status ", s.id(), ")");
    }
    std::cout << absl::StrFormat("%-20s %-10s %6.1f%%  %s:/%s/%s%s\n", s.id(), StateName(s.state()),
                                 pct, s.spec().dest_site(), s.spec().dest_export(),
                                 s.spec().dest_path(), from);
    if (g.verbose && !s.error().empty()) std::cout << "    error: " << s.error() << "\n";
  }
  return kExitOk;
}

int Control(const std::string& verb, const std::string& id_or_prefix, const Globals& g) {
  auto client = Connect(g);
  if (!client.ok()) return Report(client.status());
  auto id = ResolveId(**client, id_or_prefix);
  if (!id.ok()) return Report(id.status());
  absl::StatusOr<v1::TransferStatus> status = verb == "cancel"  ? (*client)->Cancel(*id)
                                              : verb == "pause" ? (*client)->Pause(*id)
                                                                : (*client)->Resume(*id);
  if (!status.ok()) return Report(status.status());
  std::cout << (g.json ? TransferJson(*status).str() : ProgressLine(*status)) << std::endl;
  return kExitOk;
}

int Verify(const std::string& id_or_prefix, const Globals& g) {
  auto client = Connect(g);
  if (!client.ok()) return Report(client.status());
  auto resolved = ResolveId(**client, id_or_prefix);
  if (!resolved.ok()) return Report(resolved.status());
  const std::string& id = *resolved;
  auto result = (*client)->Verify(id);
  if (!result.ok()) return Report(result.status());
  if (g.json) {
    std::vector<std::string> mismatches;
    for (const auto& m : result->mismatches()) mismatches.push_back(JsonString(m));
    std::cout << JsonObject()
                     .Add("id", id)
                     .Add("ok", result->ok())
                     .Add("files_checked", result->files_checked())
                     .Add("bytes_checked", result->bytes_checked())
                     .AddRaw("mismatches", JsonArray(mismatches))
                     .str()
              << std::endl;
  } else {
    std::cout << absl::StrFormat("%s: %s (%d files, %s checked)\n", id,
                                 result->ok() ? "verified, source and destination match" : "MISMATCH",
                                 result->files_checked(), FormatBytes(result->bytes_checked()));
    for (const auto& m : result->mismatches()) std::cout << "  " << m << "\n";
  }
  return result->ok() ? kExitOk : kExitFailed;
}

int Peers(const Globals& g) {
  auto client = Connect(g);
  if (!client.ok()) return Report(client.status());
  auto peers = (*client)->Peers(true);
  if (!peers.ok()) return Report(peers.status());
  if (g.json) {
    std::vector<std::string> items;
    for (const auto& p : peers->peers()) {
      JsonObject o;
      o.Add("site", p.site()).Add("address", p.address()).Add("transport", p.transport())
          .Add("reachable", p.reachable()).Add("handshake_ms", p.handshake_ms())
          .Add("congestion_control", p.congestion_control()).Add("rtt_ms", p.rtt_ms())
          .Add("delivery_rate_mbit", p.delivery_rate_mbit()).Add("retransmits", p.retransmits())
          .Add("active_streams", static_cast<uint64_t>(p.active_streams()))
          .Add("socket_buffer_bytes", p.socket_buffer_bytes());
      if (!p.error().empty()) o.Add("error", p.error());
      items.push_back(o.str());
    }
    std::cout << JsonObject().Add("site", peers->site()).AddRaw("peers", JsonArray(items)).str() << std::endl;
    return kExitOk;
  }
  std::cout << absl::StrFormat("%-12s %-22s %-5s %-10s %8s %8s %10s %7s %s\n", "SITE", "ADDRESS", "XPORT",
                               "STATE", "RTT_MS", "CC", "RATE_MBIT", "STREAMS", "NOTE");
  for (const auto& p : peers->peers()) {
    std::cout << absl::StrFormat("%-12s %-22s %-5s %-10s %8.2f %8s %10.0f %7u %s\n", p.site(), p.address(),
                                 p.transport(), p.reachable() ? "up" : "DOWN", p.rtt_ms(),
                                 p.congestion_control(), p.delivery_rate_mbit(), p.active_streams(),
                                 p.error());
  }
  return kExitOk;
}

std::string LimitScope(const v1::RateLimit& l) {
  if (l.scope_case() == v1::RateLimit::kPeer) return absl::StrCat("peer ", l.peer());
  std::string cls = v1::PriorityClass_Name(l.priority());
  for (char& c : cls) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return absl::StrCat("class ", cls);
}

// `longhaul limit [--peer SITE | --class CLASS] RATE|off`, or no argument to
// list the caps in force.
int Limit(const std::string& peer, const std::string& cls, const std::string& rate,
          const Globals& g) {
  auto client = Connect(g);
  if (!client.ok()) return Report(client.status());
  absl::StatusOr<std::vector<v1::RateLimit>> limits;
  if (rate.empty()) {
    if (!peer.empty() || !cls.empty()) {
      std::fprintf(stderr, "longhaul: give a RATE (e.g. 500Mbit) or 'off'\n");
      return kExitUsage;
    }
    limits = (*client)->GetLimits();
  } else {
    if (peer.empty() == cls.empty()) {
      std::fprintf(stderr, "longhaul: name exactly one of --peer SITE or --class CLASS\n");
      return kExitUsage;
    }
    v1::RateLimit limit;
    if (!peer.empty()) {
      limit.set_peer(peer);
    } else {
      limit.set_priority(cls == "exchange"     ? v1::EXCHANGE
                         : cls == "background" ? v1::BACKGROUND
                                               : v1::CHECKPOINT);
    }
    if (rate != "off" && rate != "0") {
      auto bps = ParseRate(
          rate, "RATE", {.min_bits_per_second = 64'000, .max_bits_per_second = 10'000'000'000'000});
      if (!bps.ok()) return Report(bps.status());
      limit.set_bits_per_second(*bps);
    }
    limits = (*client)->SetLimit(limit);
  }
  if (!limits.ok()) return Report(limits.status());
  if (g.json) {
    std::vector<std::string> items;
    for (const v1::RateLimit& l : *limits) {
      JsonObject o;
      if (l.scope_case() == v1::RateLimit::kPeer) {
        o.Add("peer", l.peer());
      } else {
        o.Add("class", LimitScope(l).substr(6));
      }
      o.Add("bits_per_second", l.bits_per_second());
      items.push_back(o.str());
    }
    std::cout << JsonObject().AddRaw("limits", JsonArray(items)).str() << std::endl;
    return kExitOk;
  }
  if (limits->empty()) std::cout << "no rate caps" << std::endl;
  for (const v1::RateLimit& l : *limits) {
    std::cout << absl::StrFormat("%-24s %10.1f Mbit/s\n", LimitScope(l),
                                 static_cast<double>(l.bits_per_second()) / 1e6);
  }
  return kExitOk;
}

int Main(int argc, char** argv) {
  CLI::App app{"longhaul: replicate checkpoints and data between sites through longhauld"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string(Version()));
  Globals g;
  app.add_option("--daemon", g.daemon,
                 "control address of longhauld: unix:PATH or HOST:PORT (default $LONGHAUL_DAEMON)");
  app.add_option("--token-file", g.token_file,
                 "bearer token for a TCP control address (default $LONGHAUL_TOKEN_FILE)");
  app.add_flag("--json", g.json, "print JSON");
  app.add_flag("-q,--quiet", g.quiet, "print only errors and transfer ids (for cron)");
  app.add_flag("-v,--verbose", g.verbose,
               "print detail: the daemon, what is submitted, every update");
  // -q, -v, --daemon... may follow the command too.
  app.fallthrough();
  std::string reconnect_timeout;
  app.add_option("--reconnect-timeout", reconnect_timeout,
                 "how long --wait and status --watch wait for a daemon that went away (restart, "
                 "crash) to come back, e.g. 30s, 10m (default 2m; 0: give up at once)");

  CopyOptions copy;
  auto add_copy_options = [&](CLI::App* cmd, bool with_tuning) {
    cmd->add_option("args", copy.args,
                    "SRC... SITE:/EXPORT/PATH, or SITE:/EXPORT/PATH SITE:/EXPORT/PATH (pull, "
                    "third-party copy)")
        ->required();
    cmd->add_flag("--wait", copy.wait, "follow the transfer until it ends");
    cmd->add_flag("--dry-run", copy.dry_run,
                  "list what would be sent, replaced, deleted and pruned; change nothing at "
                  "either site");
    cmd->add_flag("--json", g.json, "print JSON");
    cmd->add_option("--transport", copy.transport, "tcp (default: the peer's)");
    cmd->add_option("--priority", copy.priority, "exchange|checkpoint|background")
        ->check(CLI::IsMember({"exchange", "checkpoint", "background"}));
    cmd->add_option("--request-id", copy.request_id, "idempotency key: resubmitting returns the same transfer");
    // Repeatable options take one value per flag: the positionals after
    // them stay positionals.
    cmd->add_option("--commit-last", copy.commit_last,
                    "glob of commit markers to publish last (repeatable)")
        ->allow_extra_args(false);
    cmd->add_option("--symlinks", copy.symlinks,
                    "keep (in-tree relative links stay links), follow (send targets inside a "
                    "readable export) or refuse; what is not sent is listed as skipped")
        ->check(CLI::IsMember({"keep", "follow", "refuse"}));
    cmd->add_flag("--hard-links", copy.hard_links,
                  "names of one file inside the sources arrive as hard links of one file, "
                  "sent once");
    cmd->add_option("--also", copy.also,
                    "another destination SITE:/EXPORT/PATH (repeatable): the source sends the "
                    "bytes once, each destination relays them to the next")
        ->allow_extra_args(false);
    if (with_tuning) {
      cmd->add_option("--streams", copy.streams, "parallel streams")->check(CLI::Range(1, 64));
      cmd->add_option(
          "--chunk-size", copy.chunk_size,
          "chunk size, e.g. 16MiB or 4MB (k, M, G: powers of 1000; Ki, Mi, Gi: of 1024)");
    }
  };
  CLI::App* cp =
      app.add_subcommand("cp", "copy files or trees to another site, or between two sites");
  add_copy_options(cp, true);
  cp->add_flag("--replace", copy.replace,
               "replace a destination that exists and holds something else, whole (the old "
               "version is kept in the export's .longhaul/trash); without it cp refuses");
  CLI::App* sync = app.add_subcommand("sync", "send only what changed (idempotent; for cron)");
  add_copy_options(sync, true);
  sync->add_flag("--no-delete", copy.no_delete,
                 "keep files at the destination that the source does not hold");
  sync->add_flag("--checksum", copy.checksum,
                 "compare files by the XXH3-128 of their content, not by size and mtime "
                 "(reads every file at both ends)");
  sync->add_option(
      "--keep", copy.keep,
      "SRC holds checkpoints: send the newest K finished ones (holding --only-complete's "
      "MARKER, else a commit marker: .metadata, *.index.json, COMPLETE, --commit-last), "
      "and keep only the newest K finished ones at the destination");
  sync->add_option("--only-complete", copy.only_complete,
                   "SRC holds checkpoints: send only those holding MARKER (e.g. model.index.json), "
                   "published last");

  std::string id;
  bool watch = false;
  ListFilter list_filter;
  std::string since;
  CLI::App* status = app.add_subcommand("status", "show one transfer");
  status->add_option("id", id, "a transfer id, or a prefix that names one")->required();
  status->add_flag("--watch", watch, "follow until it ends");
  status->add_flag("--json", g.json, "print JSON (one object per line with --watch)");
  CLI::App* ls = app.add_subcommand("ls", "list transfers");
  ls->add_flag("--all", list_filter.all, "include every ended transfer the daemon remembers");
  ls->add_flag("--failed", list_filter.failed, "only FAILED transfers");
  ls->add_option("--since", since,
                 "include transfers that ended within this age, e.g. 30m, 12h, 7d (default 1d)");
  ls->add_flag("--json", g.json, "print JSON");
  std::vector<CLI::App*> verbs;
  for (const char* verb : {"cancel", "pause", "resume"}) {
    CLI::App* cmd = app.add_subcommand(verb, absl::StrCat(verb, " a transfer"));
    cmd->add_option("id", id, "a transfer id, or a prefix that names one")->required();
    cmd->add_flag("--json", g.json, "print JSON");
    verbs.push_back(cmd);
  }
  CLI::App* verify = app.add_subcommand("verify", "re-read the destination and compare digests");
  verify->add_option("id", id, "a transfer id, or a prefix that names one")->required();
  verify->add_flag("--json", g.json, "print JSON");
  CLI::App* peers = app.add_subcommand("peers", "show peer sites and their links");
  peers->add_flag("--json", g.json, "print JSON");

  std::string limit_peer, limit_class, limit_rate;
  CLI::App* limit = app.add_subcommand(
      "limit", "cap the sending rate to a peer or of a class at run time (no RATE: list caps)");
  limit->add_option("rate", limit_rate,
                    "e.g. 500Mbit, 2Gbps (bits) or 100MB/s, 50MiB/s (bytes), or off");
  limit->add_option("--peer", limit_peer, "the peer site to cap");
  limit->add_option("--class", limit_class, "the priority class to cap")
      ->check(CLI::IsMember({"exchange", "checkpoint", "background"}));
  limit->add_flag("--json", g.json, "print JSON");

  try {
    app.parse(argc, argv);
  } catch (const CLI::RequiredError& e) {
    app.exit(e);
    // A positional is missing: an option before it may have taken it.
    if (std::string_view(e.what()).find("subcommand") == std::string_view::npos) {
      std::fprintf(stderr,
                   "longhaul: an option given a value may have taken the argument (e.g. "
                   "`--also X` takes only X); check that every option has its value\n");
    }
    return kExitUsage;
  } catch (const CLI::ParseError& e) {
    int code = app.exit(e);
    return code == 0 ? kExitOk : kExitUsage;
  }
  if (g.quiet && g.verbose) {
    std::fprintf(stderr, "longhaul: -q and -v exclude each other\n");
    return kExitUsage;
  }
  if (!since.empty()) {
    auto age = ParseAge(since, "--since");
    if (!age.ok()) return Report(age.status());
    list_filter.since = *age;
  }
  if (!reconnect_timeout.empty() &&
      (!absl::ParseDuration(reconnect_timeout, &g.reconnect_timeout) ||
       g.reconnect_timeout < absl::ZeroDuration() ||
       g.reconnect_timeout == absl::InfiniteDuration())) {
    std::fprintf(stderr,
                 "longhaul: --reconnect-timeout %s is not a duration such as 30s, 10m or 0\n",
                 reconnect_timeout.c_str());
    return kExitUsage;
  }
  if (cp->parsed()) return Copy(copy, g, false);
  if (sync->parsed()) return Copy(copy, g, true);
  if (status->parsed()) return Status(id, watch, g);
  if (ls->parsed()) return ListTransfers(list_filter, g);
  for (CLI::App* cmd : verbs) {
    if (cmd->parsed()) return Control(cmd->get_name(), id, g);
  }
  if (verify->parsed()) return Verify(id, g);
  if (peers->parsed()) return Peers(g);
  if (limit->parsed()) return Limit(limit_peer, limit_class, limit_rate, g);
  return kExitUsage;
}

}  // namespace
}  // namespace longhaul::cli

int main(int argc, char** argv) { return longhaul::cli::Main(argc, argv); }
