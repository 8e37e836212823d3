#ifndef LONGHAUL_DAEMON_TRANSFER_RELAY_H_
#define LONGHAUL_DAEMON_TRANSFER_RELAY_H_

#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "daemon/config.h"
#include "daemon/peer/priority_gate.h"
#include "daemon/peer/receiver.h"
#include "daemon/peer/sender.h"
#include "daemon/transport/transport.h"
#include "longhaul/v1/peer.pb.h"
#include "storage/journal.h"

namespace longhaul::daemon {

// The relays of this site, one per incoming fan-out transfer whose source
// asked for one (OpenRequest.relay_to): each sends every chunk of the
// incoming transfer, as soon as it is durable here, to the next destination,
// where the source opened the transfer naming this site as its relay.
//
// A relay is a peer::TransferSender reading through a
// peer::Receiver::RelayReader: it attaches to the next destination's
// session, sends the chunks it lacks over the configured streams and ends
// when they are all durable there; the source commits. The next destination
// takes a chunk only when it matches the digest the source itself sent it
// (proto/FRAMES.md, fan-out), and refuses a relay that sends anything else.
// A relay that fails only logs: the source sees
// the next destination stall and sends to it directly. Relays are not
// journaled: after a restart the source, which bypasses a relay it lost,
// sends to the next destination itself.
//
// Thread-safe.
class Relays {
 public:
  // All must outlive this object.
  Relays(const DaemonConfig& config, const transport::TransportSet& transports,
         peer::PriorityGate& gate, storage::Journal& journal, peer::Receiver& receiver);
  ~Relays();

  // ReceiverOptions::relay: incoming transfer `transfer_id` relays to
  // `target` (empty: to nothing). Starts the relay, or replaces one with
  // another target; the same target again leaves a running relay alone.
  // Does not block.
  void Set(const std::string& transfer_id, const v1::RelayTarget& target);

  // Stops every relay and waits for them. Idempotent.
  void Shutdown();

 private:
  struct Relay {
    v1::RelayTarget target;
    peer::TransferProgress progress;
    std::unique_ptr<peer::TransferSender> sender;
    std::thread thread;
    bool stopped = false;               // guarded by Relays::mu_
    std::atomic<bool> finished{false};  // Run returned: the thread can be joined at once
  };

  // Joins and forgets relays whose run ended.
  void ReapFinishedLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Runs `relay`'s sender after `previous` (the one it replaced) has ended.
  void Run(const std::string& transfer_id, Relay* relay, std::shared_ptr<Relay> previous);

  const DaemonConfig& config_;
  const transport::TransportSet transports_;
  peer::PriorityGate& gate_;
  storage::Journal& journal_;
  peer::Receiver& receiver_;

  absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<Relay>> relays_ ABSL_GUARDED_BY(mu_);
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace longhaul::daemon

#endif  // LONGHAUL_DAEMON_TRANSFER_RELAY_H_
