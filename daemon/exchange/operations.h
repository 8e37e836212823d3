#ifndef LONGHAUL_DAEMON_EXCHANGE_OPERATIONS_H_
#define LONGHAUL_DAEMON_EXCHANGE_OPERATIONS_H_

// The exchange's calls: the join round, all-reduce, all-gather, broadcast
// and point-to-point (proto/EXCHANGE.md, Joining, All-reduce, All-gather,
// Broadcast, Point to point). All-gather and broadcast (gather.cc) run on the
// all-reduce's machinery below: its waits, sends, commit round and loss
// handling, with their own data kinds.
//
// All-reduce (two algorithms, one commit round). With two members, or
// with int8 quantization, the direct exchange: every member sends its whole
// buffer to every other member, then each reduces the same inputs in the
// same (sorted site) order. From three members on, the sharded one
// (sharded_all_reduce.cc): the buffer is cut into one shard per member
// (shards.h), member k owns shard k; a reduce-scatter sends each owner the
// others' parts of its shard, the owner reduces them in member order (the
// same float operations the direct exchange does on those elements) and an
// all-gather sends the owner's final bytes to every member. Each site so
// pushes 2(N-1)/N of the buffer instead of N-1 buffers, and every site's
// result is bit-identical to the direct exchange's (see reduce.h). A
// member that has every input (every result shard) sends DONE and waits
// for every other member's DONE; a member that gives up before its DONE
// (timeout, cancel, mismatch) sends ABORT instead, so the others fail too
// rather than finish an op it abandoned. Operations are matched across
// sites by the client's sequence number, which every member must issue in
// the same program order.
//
// Thread-safe: any number of calls run at once, each on its caller's thread
// (an all-reduce adds one sender thread per peer, two in the sharded one). They block up to their
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
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/units.h"
#include "daemon/exchange/client_buffer.h"
#include "daemon/exchange/digest.h"
#include "daemon/exchange/exchange_types.h"
#include "daemon/exchange/gather_checks.h"
#include "daemon/exchange/hub_state.h"
#include "daemon/exchange/links.h"
#include "daemon/exchange/sender_set.h"
#include "daemon/exchange/shards.h"
#include "daemon/peer/priority_gate.h"
#include "longhaul/v1/exchange.pb.h"

namespace longhaul::exchange {

class Operations {
 public:
  // Not owned, all outlive this: `state`, `links`, `gate` (may be null).
  // `peers` are the sites this daemon may exchange with; `lose(site, why)`
  // declares a peer lost (the hub's PeerLost).
  Operations(std::string local_site, std::vector<std::string> peers, HubState* state, Links* links,
             peer::PriorityGate* gate, Links::LostFn lose, bool sharded_all_reduce = true);

  absl::StatusOr<v1::GroupView> Join(const std::string& group, std::vector<std::string> sites,
                                     absl::Duration timeout);
  OpResult AllReduce(const AllReduceArgs& args, absl::Span<uint8_t> buffer);
  // gather.cc. `output` must hold members x input.size() bytes; on success
  // its first members x input.size() bytes are the members' inputs in
  // member order. `input` may lie inside `output`.
  OpResult AllGather(const GatherArgs& args, absl::Span<const uint8_t> input,
                     absl::Span<uint8_t> output);
  // gather.cc. args.root's `buffer` into every member's, in place.
  OpResult Broadcast(const GatherArgs& args, absl::Span<uint8_t> buffer);
  OpResult Send(const P2PArgs& args, absl::Span<const uint8_t> data);
  OpResult Recv(const P2PArgs& args, absl::Span<uint8_t> out);

 private:
  // One all-reduce call as both algorithms see it.
  struct ReduceRun {
    explicit ReduceRun(const AllReduceArgs& args) : args(args) {}
    const AllReduceArgs& args;
    std::string what;    // names the op in errors
    std::string seq_id;  // the mailbox id of its messages
    uint64_t count = 0;  // elements
    uint64_t generation = 0;
    std::vector<std::string> members;  // sorted, this site included
    std::vector<std::string> peers;    // members but this site, sorted
    std::shared_ptr<Op> op;
    Timestamp start;
    Timestamp deadline;
    ClientBuffer* input = nullptr;  // the only reader of the client's buffer
  };
  struct ReduceOutcome {
    absl::Status status;
    std::string lost_peer;
    uint64_t sent = 0;           // payload bytes the peers took
    std::vector<Message> taken;  // every message whose payload this op used
    uint64_t released = 0;       // payload bytes of taken messages given back early
    // Of the final buffer, for the commit round: set by a body that
    // succeeded so far (none in a group of one).
    FinalDigests digests;
  };

  // The direct exchange and the sharded one (sharded_all_reduce.cc); each
  // reads `buffer` only through run.input, ends with Settle and writes
  // `buffer` only on success.
  ReduceOutcome DirectAllReduce(const ReduceRun& run, absl::Span<uint8_t> buffer);
  ReduceOutcome ShardedAllReduce(const ReduceRun& run, absl::Span<uint8_t> buffer);
  // The header every REDUCE_DATA / REDUCE_RESULT of `run` carries.
  v1::ExchangePeerMessage ReduceHeader(const ReduceRun& run,
                                       v1::ExchangePeerMessage::Kind kind) const;
  // What the peers' messages of `run` must carry.
  ReduceCall Call(const ReduceRun& run, uint32_t shards) const;
  // What every collective does around its exchange `body`: the group and op
  // registration (a `root`, if not empty, must be a member), the priority
  // class, the clean-up of its messages of `kinds`, the stats. `what` names
  // it in errors.
  OpResult RunOp(const AllReduceArgs& args, const std::string& root, const std::string& what,
                 absl::Span<const v1::ExchangePeerMessage::Kind> kinds,
                 absl::FunctionRef<ReduceOutcome(ReduceRun&)> body);
  // gather.cc: runs an all-gather or broadcast `body` through RunOp, with
  // run.input reading `input`, the client's buffer it sends.
  using CollectiveBody = absl::FunctionRef<ReduceOutcome(const ReduceRun&)>;
  OpResult Collective(const GatherArgs& args, const std::string& what,
                      absl::Span<const uint8_t> input, CollectiveBody body);
  // gather.cc: checks the GATHER_DATA / BCAST_DATA messages AwaitAll just
  // took under `keys` (the i-th from peers[i]) and that none came twice.
  absl::Status CheckGathered(const ReduceRun& run, const std::vector<std::string>& keys,
                             const std::vector<std::string>& peers, const ReduceOutcome& out,
                             const GatherCall& call);
  // Waits until the mailbox holds a message under each of `keys` (one per
  // peer, in run.peers order) and appends them to `taken` in that order; or
  // fails on an ABORT, a cancel, shutdown, a lost peer (naming it in
  // `lost_peer`), a failed read of run.input (its client's fault) or the
  // deadline (naming the peers it waited for).
  absl::Status AwaitAll(const ReduceRun& run, const std::vector<std::string>& keys,
                        std::vector<Message>* taken, std::string* lost_peer);
  // Finishes `senders` (cutting the links of those still sending 2 s past
  // the deadline) and adds bytes[i] to out->sent for each peer i that took
  // its message; the first failed send fails the op.
  void CollectSends(const ReduceRun& run, SenderSet& senders, const std::vector<uint64_t>& bytes,
                    ReduceOutcome* out);
  // sharded_all_reduce.cc: waits for the next `kind` message of the sharded
  // all-reduce from each of `from`, takes them into out->taken (in `from`
  // order) and checks each is piece `piece` of shard shard_of(sender)
  // (CheckShardMessage) and, if that is the shard's last piece, that no
  // further piece is queued behind it (a duplicate).
  absl::Status TakePieces(const ReduceRun& run, const std::vector<std::string>& from,
                          v1::ExchangePeerMessage::Kind kind, const ReduceCall& call,
                          absl::FunctionRef<uint32_t(const std::string&)> shard_of, uint32_t piece,
                          ReduceOutcome* out);
  // The commit round (with out->digests) if `out` succeeded so far, else ABORT to the peers
  // unless the failure is a lost peer. A client that stalled or left while
  // its streamed buffer was being read fails the op as its own failure
  // (not a peer's).
  void Settle(const ReduceRun& run, ReduceOutcome* out);
  // The commit round of a collective whose inputs are all here: sends DONE
  // with `digests` and waits, until run.deadline plus kSenderGrace, for
  // every peer's DONE; then compares their digests with `digests`.
  absl::Status Commit(const ReduceRun& run, const FinalDigests& digests, std::string* lost_peer);
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
  const bool sharded_all_reduce_;  // false: every all-reduce runs direct
};

}  // namespace longhaul::exchange

#endif  // LONGHAUL_DAEMON_EXCHANGE_OPERATIONS_H_
