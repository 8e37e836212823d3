#ifndef LONGHAUL_DAEMON_EXCHANGE_HUB_STATE_H_
#define LONGHAUL_DAEMON_EXCHANGE_HUB_STATE_H_

// What the hub's operations, its inbound sink and its membership share, and
// the one mutex that guards it all.
//
// Why one mutex: an operation waits on a single condition across the
// mailbox, the membership and its own cancellation (its messages are here,
// or its group moved on, or it was cancelled, or the daemon is stopping),
// and a message must be admitted (Membership::Admits) and filed in the same
// step that a Join forming the group could otherwise slip between, leaving
// a non-member's message behind. Links and BufferPool, which need neither,
// have mutexes of their own; the lock order is `mu`, then theirs.

#include <atomic>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "daemon/exchange/client_buffer.h"
#include "daemon/exchange/exchange_types.h"
#include "daemon/exchange/mailbox.h"
#include "daemon/exchange/membership.h"

namespace longhaul::exchange {

// A running operation, registered under its client's op_id.
struct Op {
  std::atomic<bool> stop{false};  // its senders stop at the next segment
  bool cancelled = false;         // guarded by HubState::mu
};

struct HubState {
  // `clock` (not owned) outlives the hub.
  HubState(const std::string& local_site, const HubOptions& options, const Clock& clock)
      : clock(clock), mailbox(local_site, options, &pool, clock), membership(local_site) {}

  // Every deadline and elapsed time of the hub (deadline.h).
  const Clock& clock;
  // Reads of client buffers (ExchangeHub::client_bytes_read() and
  // unfilled_looks()).
  ClientReadCounters client_reads;
  absl::Mutex mu;
  bool shutdown ABSL_GUARDED_BY(mu) = false;
  BufferPool pool;
  Mailbox mailbox ABSL_GUARDED_BY(mu);
  Membership membership ABSL_GUARDED_BY(mu);
  absl::flat_hash_map<std::string, std::shared_ptr<Op>> ops ABSL_GUARDED_BY(mu);
};

}  // namespace longhaul::exchange

#endif  // LONGHAUL_DAEMON_EXCHANGE_HUB_STATE_H_
