#ifndef LONGHAUL_DAEMON_EXCHANGE_OPERATIONS_H_
#define LONGHAUL_DAEMON_EXCHANGE_OPERATIONS_H_

// The exchange's calls: the join round, all-reduce and point-to-point
// (proto/EXCHANGE.md, Joining, All-reduce, Point to point).
//
// All-reduce. Every member sends its whole buffer to every other member,
// then each reduces the same inputs in the same (sorted site) order, so the
// result is bit-identical everywhere (see reduce.h). A member that has every
// input sends DONE and waits for every other member's DONE; a member that
// gives up before its DONE (timeout, cancel, mismatch) sends ABORT instead,
// so the others fail too rather than finish an op it abandoned. Operations
// are matched across sites by the client's sequence number, which every
// member must issue in the same program order.
//
// Thread-safe: any number of calls run at once, each on its caller's thread
// (an all-reduce adds one sender thread per peer). They block up to their
// deadline and end early on cancel (Op::stop, Op::cancelled), on a lost peer
// and on shutdown. They wait on and change HubState under HubState::mu, and
// send through Links without holding it.

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "daemon/exchange/exchange_types.h"
#include "daemon/exchange/hub_state.h"
#include "daemon/exchange/links.h"
#include "daemon/peer/priority_gate.h"
#include "longhaul/v1/exchange.pb.h"

namespace longhaul::exchange {

class Operations {
 public:
  // Not owned, all outlive this: `state`, `links`, `gate` (may be null).
  // `peers` are the sites this daemon may exchange with; `lose(site, why)`
  // declares a peer lost (the hub's PeerLost).
  Operations(std::string local_site, std::vector<std::string> peers, HubState* state, Links* links,
             peer::PriorityGate* gate, Links::LostFn lose);

  absl::StatusOr<v1::GroupView> Join(const std::string& group, std::vector<std::string> sites,
                                     absl::Duration timeout);
  OpResult AllReduce(const AllReduceArgs& args, absl::Span<uint8_t> buffer);
  OpResult Send(const P2PArgs& args, absl::Span<const uint8_t> data);
  OpResult Recv(const P2PArgs& args, absl::Span<uint8_t> out);

 private:
  // The commit round of an all-reduce whose inputs are all here: sends DONE
  // and waits for every peer's DONE.
  absl::Status Commit(const AllReduceArgs& args, const std::string& what, uint64_t generation,
                      const std::vector<std::string>& peers, std::string* lost_peer);
  void SendAborts(const std::string& group, uint64_t generation, uint64_t seq,
                  const std::vector<std::string>& peers, const std::string& reason);
  // The first of `peers`' ABORTs of the all-reduce `seq_id` in `group`, or null.
  const Message* AbortFrom(const std::string& group, const std::string& seq_id,
                           const std::vector<std::string>& peers)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_->mu);
  // Whether the mailbox holds a message under every one of `keys`.
  bool HoldsAll(const std::vector<std::string>& keys) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_->mu);
  // Whether `group` is gone or past `generation`: an op of that generation
  // can no longer complete.
  bool GroupMoved(const std::string& group, uint64_t generation) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_->mu);
  // AlreadyExists while an op of `op_id` runs, else OK.
  absl::Status OpIdFree(const std::string& op_id) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_->mu);
  std::shared_ptr<Op> StartOp(const std::string& op_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_->mu);
  void EndOp(const std::string& op_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_->mu);
  // The OpResult of an op that saw `g` move past `generation`.
  OpResult Lost(const std::string& what, const Group& g, uint64_t generation) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_->mu);
  OpResult Lost(const LostPeer& lost, const Group& g) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_->mu);

  const std::string local_site_;
  const std::vector<std::string> peers_;
  HubState* const state_;
  Links* const links_;
  peer::PriorityGate* const gate_;
  const Links::LostFn lose_;
};

}  // namespace longhaul::exchange

#endif  // LONGHAUL_DAEMON_EXCHANGE_OPERATIONS_H_
