#ifndef LONGHAUL_DAEMON_TRANSFER_SESSION_OPTIONS_H_
#define LONGHAUL_DAEMON_TRANSFER_SESSION_OPTIONS_H_

// The daemon's configuration, cut down to what each peer session takes: the
// peer layer knows nothing of DaemonConfig.

#include "absl/strings/string_view.h"
#include "daemon/config.h"
#include "daemon/peer/receiver.h"
#include "daemon/peer/sender.h"

namespace longhaul::daemon {

// For a transfer to `dest_site` (a destination that is not one of
// `config.peers` leaves SenderOptions::destination empty).
peer::SenderOptions SenderOptionsFor(const DaemonConfig& config, absl::string_view dest_site);

peer::ReceiverOptions ReceiverOptionsFor(const DaemonConfig& config);

}  // namespace longhaul::daemon

#endif  // LONGHAUL_DAEMON_TRANSFER_SESSION_OPTIONS_H_
