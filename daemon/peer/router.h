#ifndef LONGHAUL_DAEMON_PEER_ROUTER_H_
#define LONGHAUL_DAEMON_PEER_ROUTER_H_

#include <functional>
#include <memory>

#include "absl/container/flat_hash_map.h"
#include "daemon/transport/transport.h"
#include "longhaul/v1/peer.pb.h"

namespace longhaul::peer {

// Reads the Hello that opens every admitted peer channel and hands the
// channel to the service registered for its role (transfers, udp key
// agreement, exchanges). Unknown roles and bad hellos are logged and closed.
//
// Register everything before the transport starts listening; Serve is then
// thread-safe (it runs on each channel's own thread).
class PeerRouter {
 public:
  using Handler = std::function<void(std::unique_ptr<transport::Channel>, const v1::Hello&)>;

  void Register(v1::Hello::Role role, Handler handler);
  void Serve(std::unique_ptr<transport::Channel> channel) const;

 private:
  absl::flat_hash_map<int, Handler> handlers_;
};

}  // namespace longhaul::peer

#endif  // LONGHAUL_DAEMON_PEER_ROUTER_H_
