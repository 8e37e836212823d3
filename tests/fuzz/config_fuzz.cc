// Fuzzes longhauld's config loader (daemon/config.h) with arbitrary YAML.
// A file an operator wrote is untrusted in the sense that a typo must give
// an error, never a crash, an exception, or a config that breaks the
// documented invariants.

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <set>
#include <string>

#include "daemon/config.h"

namespace {

void Fail(const char* what) {
  std::fprintf(stderr, "config_fuzz: accepted config breaks a contract: %s\n", what);
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<longhaul::daemon::DaemonConfig> config;
  try {
    config = longhaul::daemon::ParseConfig(text);
  } catch (...) {
    Fail("ParseConfig threw an exception");
  }
  if (!config.ok()) {
    if (config.status().message().empty()) Fail("error without a message");
    return 0;
  }
  const auto& c = *config;
  if (c.site.empty()) Fail("empty site");
  if (c.transfer.chunk_size < (64u << 10) || c.transfer.chunk_size > c.transfer.max_chunk_size) {
    Fail("chunk_size out of range");
  }
  if (c.transfer.streams < 1 || c.transfer.streams > 64) Fail("streams out of range");
  if (c.transfer.max_active < 1) Fail("max_active < 1");
  if (c.control_socket.empty()) Fail("no control socket");
  std::set<std::string> sites;
  for (const auto& p : c.peers) {
    if (p.site.empty() || p.address.empty()) Fail("peer without site or address");
    if (p.site == c.site) Fail("peer is this site");
    if (p.transport != "tcp" && p.transport != "udp") Fail("unknown transport");
    if (!sites.insert(p.site).second) Fail("duplicate peer");
  }
  std::set<std::string> names;
  for (const auto& e : c.exports) {
    if (e.name.empty() || e.name.find('/') != std::string::npos) Fail("bad export name");
    if (e.path.empty() || e.path[0] != '/') Fail("relative export path");
    if (!names.insert(e.name).second) Fail("duplicate export");
  }
  for (const auto& [site, bps] : c.limits.peers) {
    if (c.FindPeer(site) == nullptr) Fail("cap on an unknown peer");
  }
  for (const auto& [cls, bps] : c.limits.classes) {
    if (cls != "exchange" && cls != "checkpoint" && cls != "background") Fail("cap on an unknown class");
  }
  (void)c.BandwidthDelayProduct();
  return 0;
}
