#ifndef LONGHAUL_DAEMON_CONFIG_H_
#define LONGHAUL_DAEMON_CONFIG_H_

// longhauld's configuration: YAML, documented in deploy/CONFIG.md. Every
// option has a default except the site name; a key the daemon does not know
// is an error, so a typo never silently falls back to a default.

#include "absl/strings/string_view.h"
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/checkpoints.h"

namespace longhaul::daemon {

struct PeerConfig {
  std::string site;
  std::string address;            // host:port of the peer's data/peer port
  std::string transport = "tcp";  // tcp (udp once it lands)
  uint32_t streams = 0;           // 0: transfer.streams
};

// What a TCP control token may do. kOperator: everything. kViewer: only
// read (status, list, watch, peers, verify, the rate caps in force).
enum class ControlRole { kOperator, kViewer };

// "operator" or "viewer".
absl::string_view ControlRoleName(ControlRole role);

struct ControlToken {
  ControlRole role = ControlRole::kOperator;
  std::string file;  // its first line is the token
};

// A directory this site accepts transfers into, and who may use it.
struct ExportConfig {
  std::string name;
  std::string path;
  // Peer sites that may send into this export. Empty: nobody.
  std::vector<std::string> writers;
  // Peer sites that may fetch from this export (pull). Empty: nobody.
  std::vector<std::string> readers;
  // Permission bits cleared from every file and directory published here.
  // Setuid, setgid and sticky bits are never kept, whatever the umask.
  uint32_t umask = 022;

  bool IsWriter(absl::string_view site) const;
  bool IsReader(absl::string_view site) const;
  // The mode bits a published file or directory may keep: 0777 & ~umask.
  uint32_t ModeMask() const { return 0777 & ~umask; }
};

struct DaemonConfig {
  std::string site;
  std::string listen = "0.0.0.0:7700";
  std::string state_dir = "/var/lib/longhaul";
  std::string control_socket;  // default: <state_dir>/control.sock
  // Optional TCP control address ("127.0.0.1:7701"), for clients on other
  // hosts or in other containers. Every request on it must carry
  // "authorization: Bearer <token>" with one of control_tokens, and is
  // allowed what that token's role allows; at least one token is then
  // required. Plaintext: bind to a trusted network only.
  std::string control_listen;
  // `control_token_file: FILE` is short for `control_tokens: {operator: FILE}`.
  std::string control_token_file;
  // At most one per role.
  std::vector<ControlToken> control_tokens;

  // Re-read on SIGHUP: new handshakes use the new files, and open channels
  // of peers they refuse (a revoked certificate) are closed.
  struct Tls {
    std::string ca;    // default: /etc/longhaul/tls/ca.pem
    std::string cert;  // default: /etc/longhaul/tls/<site>.pem
    std::string key;   // default: /etc/longhaul/tls/<site>.key
    std::string crl;   // PEM CRL of the CA (deploy/pki.sh revoke); "": none
  } tls;

  std::vector<ExportConfig> exports;
  std::vector<PeerConfig> peers;

  struct Transfer {
    uint64_t chunk_size = 16ull << 20;
    uint32_t streams = 8;
    std::vector<std::string> commit_last{kDefaultCommitMarkers.begin(),
                                         kDefaultCommitMarkers.end()};
    uint32_t max_active = 4;  // transfers moving data at once
    // A transfer that cannot reach its peer for this long fails (0: never).
    int64_t give_up_after_us = 3600ll * 1000000;
    uint64_t max_chunk_size = 64ull << 20;  // largest chunk accepted from a peer
    // Staged chunks are read back against their digests soon after they
    // become durable (true), or all of them right before publish (false).
    bool read_back_while_receiving = true;
    // What a publish here replaced or deleted stays recoverable in the
    // export's .longhaul/trash this long, then the daemon removes it.
    int64_t trash_retention_us = 24ll * 3600 * 1000000;
  } transfer;

  // What any one peer, authenticated or not, can make this daemon hold:
  // connections, handshakes, memory and disk (deploy/CONFIG.md, "peer_limits").
  struct PeerLimits {
    // TLS plus HELLO must complete within this, or the connection is closed.
    int64_t handshake_timeout_us = 10ll * 1000000;
    // Connections still in their handshake, in total and per source address;
    // past either, a new connection is closed at once.
    uint32_t max_pending_handshakes = 256;
    uint32_t max_pending_handshakes_per_address = 16;
    // Authenticated connections per peer site.
    uint32_t max_connections_per_peer = 256;
    // An authenticated connection with no frame for this long is closed.
    int64_t idle_timeout_us = 15ll * 60 * 1000000;
    // Bytes a peer's receive buffers and unclaimed exchange messages may hold.
    uint64_t memory_per_peer = 1ull << 30;
    // Bytes of this site's files that sync --checksum may read and hash for
    // one peer, per second, over a burst of a minute's worth; 0: no bound.
    uint64_t content_check_bytes_per_second = 1ull << 30;
    // Exchange messages from one peer that no local call has asked for yet.
    uint32_t max_unclaimed_messages_per_peer = 4096;
    // An incoming transfer with no activity for this long is EXPIRED: its
    // staging and journal records are removed. Abort tombstones age out alike.
    int64_t incoming_expiry_us = 7ll * 24 * 3600 * 1000000;
  } peer_limits;

  struct Link {
    uint64_t bandwidth_bps = 10'000'000'000ull;
    int64_t rtt_us = 50'000;
    std::string congestion_control = "bbr";
  } link;

  // The udp transport (proto/UDP.md).
  struct Udp {
    // One BBRv3 model for all flows to a peer; false gives each flow its
    // own Bbr3 (for comparison only).
    bool coupled = true;
  } udp;

  // Collectives between sites (deploy/CONFIG.md, "exchange").
  struct Exchange {
    // false ("direct"): every all-reduce runs as the all-to-all exchange,
    // even with three or more members; for comparisons only.
    bool sharded_all_reduce = true;
  } exchange;

  std::string log_level = "info";

  // Prometheus /metrics and /healthz over HTTP (daemon/metrics/).
  struct Metrics {
    std::string listen = "127.0.0.1:7701";  // "": no metrics server
    uint32_t max_connections = 16;          // open scrape connections
    int64_t request_timeout_us = 10ll * 1000000;  // headers, and idle keep-alive
  } metrics;

  // Operators' rate caps in bits per second; `longhaul limit` changes them at
  // run time. Absent: no cap.
  struct Limits {
    std::map<std::string, uint64_t> peers;    // by peer site
    std::map<std::string, uint64_t> classes;  // exchange, checkpoint, background
  } limits;

  // Bytes in flight that fill the configured link: bandwidth x RTT.
  uint64_t BandwidthDelayProduct() const;
  const PeerConfig* FindPeer(absl::string_view site) const;
  const ExportConfig* FindExport(absl::string_view name) const;
};

absl::StatusOr<DaemonConfig> ParseConfig(absl::string_view yaml_text);
absl::StatusOr<DaemonConfig> LoadConfig(const std::string& path);

}  // namespace longhaul::daemon

#endif  // LONGHAUL_DAEMON_CONFIG_H_
