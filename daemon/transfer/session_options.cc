#include "daemon/transfer/session_options.h"

#include <cstdint>

#include "absl/time/time.h"
#include "common/units.h"

namespace longhaul::daemon {

peer::SenderOptions SenderOptionsFor(const DaemonConfig& config, absl::string_view dest_site) {
  peer::SenderOptions options;
  options.local_site = config.site;
  if (const PeerConfig* peer = config.FindPeer(dest_site)) {
    options.destination = peer::SenderOptions::Destination{peer->site, peer->address};
  }
  options.default_streams = config.transfer.streams;
  options.give_up_after = TimeDelta::Microseconds(config.transfer.give_up_after_us);
  options.link_bandwidth =
      Bandwidth::BitsPerSecond(static_cast<int64_t>(config.link.bandwidth_bps));
  return options;
}

peer::ReceiverOptions ReceiverOptionsFor(const DaemonConfig& config) {
  peer::ReceiverOptions options;
  options.local_site = config.site;
  for (const ExportConfig& e : config.exports) {
    options.exports.push_back({e.name, e.path, e.writers, e.ModeMask(), e.readers});
  }
  options.incoming_expiry = absl::Microseconds(config.peer_limits.incoming_expiry_us);
  options.trash_retention = absl::Microseconds(config.transfer.trash_retention_us);
  options.max_chunk_size = config.transfer.max_chunk_size;
  options.read_back_while_receiving = config.transfer.read_back_while_receiving;
  options.memory_per_peer = config.peer_limits.memory_per_peer;
  options.content_check_bytes_per_second = config.peer_limits.content_check_bytes_per_second;
  return options;
}

}  // namespace longhaul::daemon
