#include "absl/strings/string_view.h"
#include "daemon/config.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <fstream>
#include <set>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/units_parse.h"

namespace longhaul::daemon {
namespace {

// Rejects keys of `node` outside `known`, naming the section.
absl::Status CheckKeys(const YAML::Node& node, absl::string_view section,
                       std::initializer_list<absl::string_view> known) {
  if (!node.IsMap()) return absl::InvalidArgumentError(absl::StrCat(section, " must be a mapping"));
  for (const auto& kv : node) {
    std::string key = kv.first.as<std::string>();
    bool ok = false;
    for (absl::string_view k : known) ok = ok || key == k;
    if (!ok) {
      return absl::InvalidArgumentError(absl::StrCat("unknown key '", key, "' in ", section,
                                                     " (known: ", absl::StrJoin(known, ", "), ")"));
    }
  }
  return absl::OkStatus();
}

template <typename T>
absl::Status Read(const YAML::Node& node, const char* key, T* out) {
  if (node[key]) *out = node[key].as<T>();
  return absl::OkStatus();
}

absl::Status ReadSize(const YAML::Node& node, const char* key, absl::string_view section,
                      uint64_t* out) {
  if (!node[key]) return absl::OkStatus();
  auto v = ParseByteSize(node[key].as<std::string>());
  if (!v.ok()) return absl::InvalidArgumentError(absl::StrCat(section, ".", key, ": ", v.status().message()));
  *out = *v;
  return absl::OkStatus();
}

absl::Status ReadDuration(const YAML::Node& node, const char* key, absl::string_view section,
                          int64_t* out) {
  if (!node[key]) return absl::OkStatus();
  auto v = ParseDurationMicros(node[key].as<std::string>());
  if (!v.ok()) return absl::InvalidArgumentError(absl::StrCat(section, ".", key, ": ", v.status().message()));
  *out = *v;
  return absl::OkStatus();
}

// An octal permission mask such as "022" or "0027".
absl::Status ReadUmask(const YAML::Node& node, absl::string_view section, uint32_t* out) {
  if (!node["umask"]) return absl::OkStatus();
  const std::string text = node["umask"].as<std::string>();
  uint32_t value = 0;
  bool ok = !text.empty() && text.size() <= 4;
  for (char ch : text) {
    ok = ok && ch >= '0' && ch <= '7';
    value = value * 8 + static_cast<uint32_t>(ch - '0');
  }
  if (!ok || value > 0777) {
    return absl::InvalidArgumentError(absl::StrCat(
        section, ".umask: '", text, "' is not an octal permission mask such as \"022\" (at most 0777)"));
  }
  *out = value;
  return absl::OkStatus();
}

// A list of site names; each must be a configured peer, listed once.
absl::Status ReadSites(const YAML::Node& node, const char* key, absl::string_view section,
                       const std::vector<PeerConfig>& peers, std::vector<std::string>* out) {
  if (!node[key]) return absl::OkStatus();
  if (!node[key].IsSequence()) {
    return absl::InvalidArgumentError(
        absl::StrCat(section, ".", key, " must be a list of peer sites, e.g. [site-a]"));
  }
  for (const YAML::Node& n : node[key]) {
    std::string site = n.as<std::string>();
    const bool known = std::any_of(peers.begin(), peers.end(),
                                   [&](const PeerConfig& p) { return p.site == site; });
    if (!known) {
      std::vector<std::string> names;
      for (const PeerConfig& p : peers) names.push_back(p.site);
      return absl::InvalidArgumentError(absl::StrCat(
          section, ".", key, ": '", site, "' is not a configured peer (peers: ",
          names.empty() ? "none" : absl::StrJoin(names, ", "), ")"));
    }
    if (std::find(out->begin(), out->end(), site) != out->end()) {
      return absl::InvalidArgumentError(
          absl::StrCat(section, ".", key, ": '", site, "' is listed twice"));
    }
    out->push_back(std::move(site));
  }
  return absl::OkStatus();
}

#define LH_RETURN_IF_ERROR(expr)        \
  do {                                  \
    absl::Status _st = (expr);          \
    if (!_st.ok()) return _st;          \
  } while (0)

absl::StatusOr<DaemonConfig> ParseNode(const YAML::Node& root) {
  DaemonConfig c;
  LH_RETURN_IF_ERROR(
      CheckKeys(root, "config",
                {"site", "listen", "state_dir", "control_socket", "control_listen",
                 "control_token_file", "control_tokens", "tls", "exports", "peers", "transfer",
                 "link", "log_level", "metrics", "limits", "udp", "peer_limits", "exchange"}));
  LH_RETURN_IF_ERROR(Read(root, "site", &c.site));
  if (c.site.empty()) return absl::InvalidArgumentError("config: 'site' (this site's name) is required");
  LH_RETURN_IF_ERROR(Read(root, "listen", &c.listen));
  LH_RETURN_IF_ERROR(Read(root, "state_dir", &c.state_dir));
  LH_RETURN_IF_ERROR(Read(root, "control_socket", &c.control_socket));
  LH_RETURN_IF_ERROR(Read(root, "log_level", &c.log_level));
  if (c.control_socket.empty()) c.control_socket = c.state_dir + "/control.sock";
  LH_RETURN_IF_ERROR(Read(root, "control_listen", &c.control_listen));
  LH_RETURN_IF_ERROR(Read(root, "control_token_file", &c.control_token_file));
  if (YAML::Node tokens = root["control_tokens"]) {
    LH_RETURN_IF_ERROR(CheckKeys(tokens, "control_tokens", {"operator", "viewer"}));
    for (ControlRole role : {ControlRole::kOperator, ControlRole::kViewer}) {
      const std::string name(ControlRoleName(role));
      if (!tokens[name]) continue;
      ControlToken token{role, tokens[name].as<std::string>()};
      if (token.file.empty()) {
        return absl::InvalidArgumentError(absl::StrCat("control_tokens.", name, " needs a file"));
      }
      c.control_tokens.push_back(std::move(token));
    }
  }
  if (!c.control_token_file.empty()) {
    for (const ControlToken& t : c.control_tokens) {
      if (t.role == ControlRole::kOperator) {
        return absl::InvalidArgumentError(
            "config: 'control_token_file' is the operator token; it and 'control_tokens.operator' "
            "cannot both be given");
      }
    }
    c.control_tokens.insert(c.control_tokens.begin(),
                            {ControlRole::kOperator, c.control_token_file});
  }
  if (!c.control_listen.empty() && c.control_tokens.empty()) {
    return absl::InvalidArgumentError(
        "config: 'control_listen' needs 'control_token_file' or 'control_tokens': a TCP control "
        "address without a token would let anyone who can reach it drive this daemon");
  }

  c.tls.ca = "/etc/longhaul/tls/ca.pem";
  c.tls.cert = absl::StrCat("/etc/longhaul/tls/", c.site, ".pem");
  c.tls.key = absl::StrCat("/etc/longhaul/tls/", c.site, ".key");
  if (YAML::Node tls = root["tls"]) {
    LH_RETURN_IF_ERROR(CheckKeys(tls, "tls", {"ca", "cert", "key", "crl"}));
    LH_RETURN_IF_ERROR(Read(tls, "ca", &c.tls.ca));
    LH_RETURN_IF_ERROR(Read(tls, "cert", &c.tls.cert));
    LH_RETURN_IF_ERROR(Read(tls, "key", &c.tls.key));
    LH_RETURN_IF_ERROR(Read(tls, "crl", &c.tls.crl));
  }

  if (YAML::Node peers = root["peers"]) {
    if (!peers.IsSequence()) return absl::InvalidArgumentError("peers must be a list");
    std::set<std::string> sites;
    for (const YAML::Node& p : peers) {
      LH_RETURN_IF_ERROR(CheckKeys(p, "peers[]", {"site", "address", "transport", "streams"}));
      PeerConfig peer;
      LH_RETURN_IF_ERROR(Read(p, "site", &peer.site));
      LH_RETURN_IF_ERROR(Read(p, "address", &peer.address));
      LH_RETURN_IF_ERROR(Read(p, "transport", &peer.transport));
      LH_RETURN_IF_ERROR(Read(p, "streams", &peer.streams));
      if (peer.site.empty() || peer.address.empty()) {
        return absl::InvalidArgumentError("each peer needs a site and an address (host:port)");
      }
      if (peer.site == c.site) {
        return absl::InvalidArgumentError(absl::StrCat("peer '", peer.site, "' is this site itself"));
      }
      if (peer.transport != "tcp" && peer.transport != "udp") {
        return absl::InvalidArgumentError(absl::StrCat("peer ", peer.site, ": unknown transport '",
                                                       peer.transport, "' (tcp or udp)"));
      }
      if (!sites.insert(peer.site).second) {
        return absl::InvalidArgumentError(absl::StrCat("peer '", peer.site, "' is listed twice"));
      }
      c.peers.push_back(peer);
    }
  }

  // After the peers: writers and readers must name configured peers.
  std::set<std::string> names;
  if (YAML::Node exports = root["exports"]) {
    if (!exports.IsSequence()) return absl::InvalidArgumentError("exports must be a list");
    for (const YAML::Node& e : exports) {
      LH_RETURN_IF_ERROR(CheckKeys(e, "exports[]", {"name", "path", "writers", "readers", "umask"}));
      ExportConfig ex;
      LH_RETURN_IF_ERROR(Read(e, "name", &ex.name));
      LH_RETURN_IF_ERROR(Read(e, "path", &ex.path));
      if (ex.name.empty() || ex.name.find('/') != std::string::npos || ex.path.empty() ||
          ex.path[0] != '/') {
        return absl::InvalidArgumentError(
            "each export needs a name without '/' and an absolute path");
      }
      if (!names.insert(ex.name).second) {
        return absl::InvalidArgumentError(absl::StrCat("export '", ex.name, "' is listed twice"));
      }
      const std::string section = absl::StrCat("exports[", ex.name, "]");
      LH_RETURN_IF_ERROR(ReadSites(e, "writers", section, c.peers, &ex.writers));
      LH_RETURN_IF_ERROR(ReadSites(e, "readers", section, c.peers, &ex.readers));
      LH_RETURN_IF_ERROR(ReadUmask(e, section, &ex.umask));
      c.exports.push_back(ex);
    }
  }

  if (YAML::Node t = root["transfer"]) {
    LH_RETURN_IF_ERROR(
        CheckKeys(t, "transfer",
                  {"chunk_size", "streams", "commit_last", "max_active", "give_up_after",
                   "max_chunk_size", "read_back_while_receiving", "trash_retention"}));
    LH_RETURN_IF_ERROR(ReadSize(t, "chunk_size", "transfer", &c.transfer.chunk_size));
    LH_RETURN_IF_ERROR(ReadSize(t, "max_chunk_size", "transfer", &c.transfer.max_chunk_size));
    LH_RETURN_IF_ERROR(Read(t, "streams", &c.transfer.streams));
    LH_RETURN_IF_ERROR(Read(t, "max_active", &c.transfer.max_active));
    LH_RETURN_IF_ERROR(
        Read(t, "read_back_while_receiving", &c.transfer.read_back_while_receiving));
    LH_RETURN_IF_ERROR(ReadDuration(t, "give_up_after", "transfer", &c.transfer.give_up_after_us));
    LH_RETURN_IF_ERROR(
        ReadDuration(t, "trash_retention", "transfer", &c.transfer.trash_retention_us));
    if (c.transfer.trash_retention_us <= 0) {
      return absl::InvalidArgumentError(
          "transfer.trash_retention must be positive (what a publish replaced stays in each "
          "export's .longhaul/trash this long)");
    }
    if (t["commit_last"]) c.transfer.commit_last = t["commit_last"].as<std::vector<std::string>>();
  }
  if (c.transfer.chunk_size < (64u << 10) || c.transfer.chunk_size > c.transfer.max_chunk_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "transfer.chunk_size must be between 64KiB and transfer.max_chunk_size (",
        FormatBytes(c.transfer.max_chunk_size), ")"));
  }
  if (c.transfer.streams < 1 || c.transfer.streams > 64) {
    return absl::InvalidArgumentError("transfer.streams must be between 1 and 64");
  }
  if (c.transfer.max_active < 1) return absl::InvalidArgumentError("transfer.max_active must be >= 1");

  if (YAML::Node p = root["peer_limits"]) {
    LH_RETURN_IF_ERROR(CheckKeys(
        p, "peer_limits",
        {"handshake_timeout", "max_pending_handshakes", "max_pending_handshakes_per_address",
         "max_connections_per_peer", "idle_timeout", "memory_per_peer",
         "max_unclaimed_messages_per_peer", "incoming_expiry", "content_check_bytes_per_second"}));
    DaemonConfig::PeerLimits& pl = c.peer_limits;
    LH_RETURN_IF_ERROR(ReadDuration(p, "handshake_timeout", "peer_limits", &pl.handshake_timeout_us));
    LH_RETURN_IF_ERROR(Read(p, "max_pending_handshakes", &pl.max_pending_handshakes));
    LH_RETURN_IF_ERROR(
        Read(p, "max_pending_handshakes_per_address", &pl.max_pending_handshakes_per_address));
    LH_RETURN_IF_ERROR(Read(p, "max_connections_per_peer", &pl.max_connections_per_peer));
    LH_RETURN_IF_ERROR(ReadDuration(p, "idle_timeout", "peer_limits", &pl.idle_timeout_us));
    LH_RETURN_IF_ERROR(ReadSize(p, "memory_per_peer", "peer_limits", &pl.memory_per_peer));
    LH_RETURN_IF_ERROR(
        Read(p, "max_unclaimed_messages_per_peer", &pl.max_unclaimed_messages_per_peer));
    LH_RETURN_IF_ERROR(ReadDuration(p, "incoming_expiry", "peer_limits", &pl.incoming_expiry_us));
    LH_RETURN_IF_ERROR(ReadSize(p, "content_check_bytes_per_second", "peer_limits",
                                &pl.content_check_bytes_per_second));
    if (pl.handshake_timeout_us <= 0 || pl.idle_timeout_us <= 0 || pl.incoming_expiry_us <= 0) {
      return absl::InvalidArgumentError(
          "peer_limits: handshake_timeout, idle_timeout and incoming_expiry must be positive");
    }
    if (pl.max_pending_handshakes < 1 || pl.max_pending_handshakes_per_address < 1 ||
        pl.max_connections_per_peer < 1 || pl.max_unclaimed_messages_per_peer < 1) {
      return absl::InvalidArgumentError("peer_limits: every count must be at least 1");
    }
  }
  // Each receiving stream holds one chunk: a peer's streams must fit its budget.
  if (c.peer_limits.memory_per_peer < 2 * c.transfer.max_chunk_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "peer_limits.memory_per_peer (", FormatBytes(c.peer_limits.memory_per_peer),
        ") must hold at least two chunks of transfer.max_chunk_size (",
        FormatBytes(c.transfer.max_chunk_size), ")"));
  }

  if (YAML::Node l = root["link"]) {
    LH_RETURN_IF_ERROR(CheckKeys(l, "link", {"bandwidth", "rtt", "congestion_control"}));
    if (l["bandwidth"]) {
      auto v = ParseBitRate(l["bandwidth"].as<std::string>());
      if (!v.ok()) return absl::InvalidArgumentError(absl::StrCat("link.bandwidth: ", v.status().message()));
      c.link.bandwidth_bps = *v;
    }
    LH_RETURN_IF_ERROR(ReadDuration(l, "rtt", "link", &c.link.rtt_us));
    LH_RETURN_IF_ERROR(Read(l, "congestion_control", &c.link.congestion_control));
  }

  if (YAML::Node u = root["udp"]) {
    LH_RETURN_IF_ERROR(CheckKeys(u, "udp", {"coupled"}));
    LH_RETURN_IF_ERROR(Read(u, "coupled", &c.udp.coupled));
  }

  if (YAML::Node x = root["exchange"]) {
    LH_RETURN_IF_ERROR(CheckKeys(x, "exchange", {"allreduce"}));
    std::string algorithm = "auto";
    LH_RETURN_IF_ERROR(Read(x, "allreduce", &algorithm));
    if (algorithm != "auto" && algorithm != "direct") {
      return absl::InvalidArgumentError(
          absl::StrCat("exchange.allreduce: unknown algorithm '", algorithm, "' (auto or direct)"));
    }
    c.exchange.sharded_all_reduce = algorithm == "auto";
  }

  if (YAML::Node m = root["metrics"]) {
    LH_RETURN_IF_ERROR(CheckKeys(m, "metrics", {"listen", "max_connections", "request_timeout"}));
    LH_RETURN_IF_ERROR(Read(m, "listen", &c.metrics.listen));
    LH_RETURN_IF_ERROR(Read(m, "max_connections", &c.metrics.max_connections));
    LH_RETURN_IF_ERROR(ReadDuration(m, "request_timeout", "metrics", &c.metrics.request_timeout_us));
    if (c.metrics.max_connections < 1 || c.metrics.request_timeout_us <= 0) {
      return absl::InvalidArgumentError(
          "metrics.max_connections must be at least 1 and metrics.request_timeout positive");
    }
    if (!c.metrics.listen.empty() && c.metrics.listen.rfind(':') == std::string::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("metrics.listen '", c.metrics.listen, "' is not host:port (\"\" disables)"));
    }
  }

  if (YAML::Node limits = root["limits"]) {
    LH_RETURN_IF_ERROR(CheckKeys(limits, "limits", {"peers", "classes"}));
    // A rate, or "off" / 0 for no cap.
    auto read_rates = [](const YAML::Node& node, absl::string_view section,
                         std::map<std::string, uint64_t>* out) -> absl::Status {
      if (!node) return absl::OkStatus();
      if (!node.IsMap()) return absl::InvalidArgumentError(absl::StrCat(section, " must be a mapping"));
      for (const auto& kv : node) {
        std::string key = kv.first.as<std::string>();
        std::string text = kv.second.as<std::string>();
        uint64_t bps = 0;
        if (text != "off") {
          auto v = ParseBitRate(text);
          if (!v.ok()) {
            return absl::InvalidArgumentError(
                absl::StrCat(section, ".", key, ": ", v.status().message()));
          }
          bps = *v;
        }
        (*out)[key] = bps;
      }
      return absl::OkStatus();
    };
    LH_RETURN_IF_ERROR(read_rates(limits["peers"], "limits.peers", &c.limits.peers));
    LH_RETURN_IF_ERROR(read_rates(limits["classes"], "limits.classes", &c.limits.classes));
    for (const auto& [site, bps] : c.limits.peers) {
      if (c.FindPeer(site) == nullptr) {
        return absl::InvalidArgumentError(
            absl::StrCat("limits.peers: '", site, "' is not a configured peer"));
      }
    }
    for (const auto& [cls, bps] : c.limits.classes) {
      if (cls != "exchange" && cls != "checkpoint" && cls != "background") {
        return absl::InvalidArgumentError(absl::StrCat(
            "limits.classes: unknown class '", cls, "' (exchange, checkpoint or background)"));
      }
    }
  }
  return c;
}

}  // namespace

absl::string_view ControlRoleName(ControlRole role) {
  switch (role) {
    case ControlRole::kOperator:
      return "operator";
    case ControlRole::kViewer:
      return "viewer";
  }
  return "unknown";
}

uint64_t DaemonConfig::BandwidthDelayProduct() const {
  return static_cast<uint64_t>(static_cast<double>(link.bandwidth_bps) / 8.0 *
                               static_cast<double>(link.rtt_us) / 1e6);
}

const PeerConfig* DaemonConfig::FindPeer(absl::string_view site) const {
  for (const PeerConfig& p : peers) {
    if (p.site == site) return &p;
  }
  return nullptr;
}

const ExportConfig* DaemonConfig::FindExport(absl::string_view name) const {
  for (const ExportConfig& e : exports) {
    if (e.name == name) return &e;
  }
  return nullptr;
}

bool ExportConfig::IsWriter(absl::string_view site) const {
  return std::find(writers.begin(), writers.end(), site) != writers.end();
}

bool ExportConfig::IsReader(absl::string_view site) const {
  return std::find(readers.begin(), readers.end(), site) != readers.end();
}

absl::StatusOr<DaemonConfig> ParseConfig(absl::string_view yaml_text) {
  try {
    YAML::Node root = YAML::Load(std::string(yaml_text));
    if (!root.IsDefined() || root.IsNull()) return absl::InvalidArgumentError("config is empty");
    return ParseNode(root);
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("config: ", e.what()));
  }
}

absl::StatusOr<DaemonConfig> LoadConfig(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open config file ", path));
  std::stringstream ss;
  ss << in.rdbuf();
  auto config = ParseConfig(ss.str());
  if (!config.ok()) {
    return absl::Status(config.status().code(), absl::StrCat(path, ": ", config.status().message()));
  }
  return config;
}

}  // namespace longhaul::daemon
