#include "daemon/exchange/operations.h"

#include <algorithm>
#include <cstring>
#include <optional>
#include <thread>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/check.h"
#include "common/fmt_absl.h"
#include "daemon/exchange/client_buffer.h"
#include "daemon/exchange/deadline.h"
#include "daemon/exchange/reduce.h"
#include "daemon/exchange/sender_set.h"
#include "daemon/exchange/shards.h"
#include "spdlog/spdlog.h"

namespace longhaul::exchange {
namespace {

using Msg = v1::ExchangePeerMessage;

// How often (in real time) a waiting op looks at things no mutex guards
// (its client).
constexpr absl::Duration kPoll = absl::Milliseconds(50);

std::string DurationText(absl::Duration d) {
  return absl::FormatDuration(absl::Trunc(d, absl::Milliseconds(1)));
}

}  // namespace

Operations::Operations(std::string local_site, std::vector<std::string> peers, HubState* state,
                       Links* links, peer::PriorityGate* gate, Links::LostFn lose,
                       bool sharded_all_reduce)
    : local_site_(std::move(local_site)),
      peers_(std::move(peers)),
      state_(state),
      links_(links),
      gate_(gate),
      lose_(std::move(lose)),
      sharded_all_reduce_(sharded_all_reduce) {}

absl::Status Operations::OpIdFree(const std::string& op_id) const {
  if (!state_->ops.contains(op_id)) return absl::OkStatus();
  return absl::AlreadyExistsError(absl::StrCat("operation ", op_id, " is already running"));
}

std::shared_ptr<Op> Operations::StartOp(const std::string& op_id) {
  auto op = std::make_shared<Op>();
  if (!op_id.empty()) state_->ops[op_id] = op;
  return op;
}

void Operations::EndOp(const std::string& op_id) {
  if (!op_id.empty()) state_->ops.erase(op_id);
}

OpResult Operations::Lost(const std::string& what, const Group& g, uint64_t generation) const {
  return Lost(state_->membership.LostResult(what, g, generation), g);
}

OpResult Operations::Lost(const LostPeer& lost, const Group& g) const {
  OpResult r;
  r.status = lost.status;
  r.lost_peer = lost.lost_peer;
  r.view = state_->membership.ViewOf(g);
  return r;
}

absl::StatusOr<v1::GroupView> Operations::Join(const std::string& group,
                                               std::vector<std::string> sites,
                                               absl::Duration timeout) {
  if (group.empty() || group.size() > 256) {
    return absl::InvalidArgumentError("a group name must have 1 to 256 characters");
  }
  std::sort(sites.begin(), sites.end());
  sites.erase(std::unique(sites.begin(), sites.end()), sites.end());
  if (std::find(sites.begin(), sites.end(), local_site_) == sites.end()) {
    return absl::InvalidArgumentError(absl::StrCat("the sites of group ", group, " ",
                                                   Members(sites), " do not include this site (",
                                                   local_site_, ")"));
  }
  std::vector<std::string> others;
  for (const std::string& s : sites) {
    if (s == local_site_) continue;
    if (std::find(peers_.begin(), peers_.end(), s) == peers_.end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          s, " is not a configured peer of ", local_site_, " (peers: ", Members(peers_), ")"));
    }
    others.push_back(s);
  }
  const Clock& clock = state_->clock;
  const Timestamp deadline = After(clock.Now(), ToTimeDelta(timeout));
  uint64_t proposal;
  {
    absl::MutexLock lock(&state_->mu);
    // From now on the new members' messages are taken (they may form and
    // send before this site has their JOIN).
    proposal = state_->membership.BeginJoin(group, sites);
  }
  absl::Cleanup not_joining = [&] {
    absl::MutexLock lock(&state_->mu);
    state_->membership.EndJoin(group, sites);
  };
  Msg join;
  join.set_kind(Msg::JOIN);
  join.set_group(group);
  join.set_generation(proposal);
  for (const auto& s : sites) join.add_members(s);
  join.set_join_nonce(absl::Uniform<uint64_t>(absl::BitGen()));
  for (const std::string& p : others) {
    while (true) {
      absl::Status s = links_->Send(p, join, {}, nullptr);
      if (s.ok()) break;
      if (After(clock.Now(), TimeDelta::Milliseconds(100)) >= deadline) {
        return absl::DeadlineExceededError(
            absl::StrCat("joining group ", group, ": ", s.message()));
      }
      absl::SleepFor(absl::Milliseconds(100));
    }
  }
  absl::MutexLock lock(&state_->mu);
  auto joined = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_->mu) {
    if (state_->shutdown) return true;
    for (const std::string& p : others) {
      if (!state_->mailbox.Has(Mailbox::Key(group, Msg::JOIN, p, ""))) return false;
    }
    return true;
  };
  AwaitUntil(state_->mu, absl::Condition(&joined), clock, deadline);
  if (state_->shutdown) return absl::UnavailableError("the daemon is shutting down");
  std::vector<std::string> missing;
  uint64_t generation = proposal;
  for (const std::string& p : others) {
    const std::string key = Mailbox::Key(group, Msg::JOIN, p, "");
    // The latest JOIN: a new one replaces what a site sent before.
    const Message* join = state_->mailbox.Front(key);
    if (join == nullptr) {
      missing.push_back(p);
      continue;
    }
    const Msg& theirs = join->header;
    std::vector<std::string> their_sites(theirs.members().begin(), theirs.members().end());
    std::sort(their_sites.begin(), their_sites.end());
    if (their_sites != sites) {
      state_->mailbox.Erase(key);
      return absl::InvalidArgumentError(absl::StrCat(p, " joined group ", group, " with sites ",
                                                     Members(their_sites), ", this site with ",
                                                     Members(sites)));
    }
    generation = std::max<uint64_t>(generation, theirs.generation());
  }
  if (!missing.empty()) {
    return absl::DeadlineExceededError(
        absl::StrCat("group ", group, ": ", absl::StrJoin(missing, ", "), " did not join within ",
                     DurationText(timeout)));
  }
  for (const std::string& p : others) state_->mailbox.Erase(Mailbox::Key(group, Msg::JOIN, p, ""));
  const Group& g = state_->membership.Form(group, sites, generation);
  // Drop what non-members and older generations left for this group.
  state_->mailbox.DropIf([&](const Message& m) {
    const Msg::Kind kind = m.header.kind();
    const bool stale =
        (kind == Msg::REDUCE_DATA || kind == Msg::REDUCE_RESULT || kind == Msg::GATHER_DATA ||
         kind == Msg::BCAST_DATA || kind == Msg::DONE || kind == Msg::ABORT) &&
        m.header.generation() < generation;
    return m.header.group() == group && (stale || !Contains(sites, m.from));
  });
  spdlog::info("exchange group {} formed: generation {} with {}", group, generation,
               Members(sites));
  return state_->membership.ViewOf(g);
}

const Message* Operations::AbortFrom(const std::string& group, const std::string& seq_id,
                                     const std::vector<std::string>& peers) {
  for (const std::string& p : peers) {
    if (const Message* m = state_->mailbox.Front(Mailbox::Key(group, Msg::ABORT, p, seq_id)))
      return m;
  }
  return nullptr;
}

bool Operations::HoldsAll(const std::vector<std::string>& keys) const {
  for (const std::string& key : keys) {
    if (!state_->mailbox.Has(key)) return false;
  }
  return true;
}

bool Operations::GroupMoved(const std::string& group, uint64_t generation) const {
  const Group* g = state_->membership.Find(group);
  return g == nullptr || g->generation != generation;
}

absl::Status Operations::Commit(const ReduceRun& run, const FinalDigests& digests,
                                std::string* lost_peer) {
  const AllReduceArgs& args = run.args;
  const std::string& what = run.what;
  const uint64_t generation = run.generation;
  const std::vector<std::string>& peers = run.peers;
  Msg done;
  done.set_kind(Msg::DONE);
  done.set_group(args.group);
  done.set_generation(generation);
  done.set_seq(args.seq);
  for (const std::string& d : digests.parts) done.add_digests(d);
  for (const std::string& p : peers) {
    // A failed write loses the peer; the wait below reports it.
    links_->Send(p, done, {}, nullptr).IgnoreError();
  }
  const std::string seq_id = absl::StrCat(args.seq);
  std::vector<std::string> keys;
  for (const auto& p : peers) keys.push_back(Mailbox::Key(args.group, Msg::DONE, p, seq_id));
  // Committed: a cancel or the deadline no longer ends the op (a peer may
  // already have finished it); only an abort, a lost peer or shutdown does,
  // or a peer silent until the op's deadline plus kSenderGrace, wherever in
  // the op this wait began.
  const Timestamp give_up = After(run.deadline, kSenderGrace);
  absl::MutexLock lock(&state_->mu);
  auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_->mu) {
    return state_->shutdown || AbortFrom(args.group, seq_id, peers) != nullptr || HoldsAll(keys) ||
           GroupMoved(args.group, generation);
  };
  AwaitUntil(state_->mu, absl::Condition(&ready), state_->clock, give_up);
  if (const Message* abort = AbortFrom(args.group, seq_id, peers); abort != nullptr) {
    const Message& m = *abort;
    return absl::AbortedError(
        absl::StrCat(what, ": ", m.from, " gave up on it (", m.header.reason(), ")"));
  }
  if (HoldsAll(keys)) {
    std::vector<std::vector<std::string>> theirs;
    for (const std::string& key : keys) {
      const Msg& header = state_->mailbox.Front(key)->header;
      theirs.emplace_back(header.digests().begin(), header.digests().end());
    }
    return CompareDigests(what, local_site_, digests, peers, theirs);
  }
  if (state_->shutdown)
    return absl::UnavailableError(absl::StrCat(what, ": the daemon is shutting down"));
  if (GroupMoved(args.group, generation)) {
    const Group* g = state_->membership.Find(args.group);
    if (g == nullptr) return absl::CancelledError(absl::StrCat(what, ": this site left the group"));
    OpResult lost = Lost(what, *g, generation);
    *lost_peer = lost.lost_peer;
    return lost.status;
  }
  std::vector<std::string> waiting;
  for (size_t i = 0; i < keys.size(); ++i) {
    if (!state_->mailbox.Has(keys[i])) waiting.push_back(peers[i]);
  }
  return absl::DeadlineExceededError(
      absl::StrCat(what, " timed out waiting for ", absl::StrJoin(waiting, ", "), " to commit"));
}

void Operations::SendAborts(const std::string& group, uint64_t generation, uint64_t seq,
                            const std::vector<std::string>& peers, const std::string& reason) {
  Msg abort;
  abort.set_kind(Msg::ABORT);
  abort.set_group(group);
  abort.set_generation(generation);
  abort.set_seq(seq);
  abort.set_reason(reason);
  for (const std::string& p : peers) {
    if (!links_->Linked(p)) continue;                   // never reached, or lost
    links_->Send(p, abort, {}, nullptr).IgnoreError();  // best effort: a lost peer needs no abort
  }
}

OpResult Operations::AllReduce(const AllReduceArgs& args, absl::Span<uint8_t> buffer) {
  const size_t es = ElementSize(args.dtype);
  OpResult result;
  if (es == 0) {
    result.status =
        absl::InvalidArgumentError("all-reduce needs a dtype: float32, bfloat16 or float16");
    return result;
  }
  if (buffer.size() % es != 0) {
    result.status = absl::InvalidArgumentError(
        absl::StrCat("all-reduce buffer of ", buffer.size(), " bytes is not a whole number of ",
                     v1::ExchangeDType_Name(args.dtype), " elements"));
    return result;
  }
  const std::string what = absl::StrCat("all-reduce #", args.seq,
                                        args.tag.empty() ? "" : absl::StrCat(" (", args.tag, ")"),
                                        " in group ", args.group);
  static constexpr Msg::Kind kKinds[] = {Msg::REDUCE_DATA, Msg::REDUCE_RESULT, Msg::DONE,
                                         Msg::ABORT};
  return RunOp(args, /*root=*/"", what, kKinds, [&](ReduceRun& run) {
    run.count = buffer.size() / es;
    ClientBuffer input(buffer, args.progress, state_->clock, run.deadline, run.op->stop,
                       args.client_gone, state_->client_reads);
    run.input = &input;
    return sharded_all_reduce_ && RunsSharded(run.members.size(), args.quantize_int8)
               ? ShardedAllReduce(run, buffer)
               : DirectAllReduce(run, buffer);
  });
}

OpResult Operations::RunOp(const AllReduceArgs& args, const std::string& root,
                           const std::string& what, absl::Span<const Msg::Kind> kinds,
                           absl::FunctionRef<ReduceOutcome(ReduceRun&)> body) {
  const Clock& clock = state_->clock;
  ReduceRun run(args);
  run.start = clock.Now();
  run.deadline = After(run.start, ToTimeDelta(args.timeout));
  run.what = what;
  run.seq_id = absl::StrCat(args.seq);
  OpResult result;
  {
    absl::MutexLock lock(&state_->mu);
    const Group* g = state_->membership.Formed(args.group);
    if (g == nullptr) {
      result.status = absl::FailedPreconditionError(
          absl::StrCat("this site has not joined group ", args.group));
      return result;
    }
    if (!root.empty() && !g->HasMember(root)) {
      // A root lost earlier is the retryable loss; any other is the caller's error.
      LostPeer lost = state_->membership.LostMember(what, *g, root);
      if (!lost.status.ok()) return Lost(lost, *g);
      result.status = absl::InvalidArgumentError(
          absl::StrCat(what, ": the root ", root, " is not a member of ", Members(g->members)));
      return result;
    }
    if (result.status = OpIdFree(args.op_id); !result.status.ok()) return result;
    run.generation = g->generation;
    run.members = g->members;
    run.op = StartOp(args.op_id);
  }
  for (const auto& m : run.members) {
    if (m != local_site_) run.peers.push_back(m);
  }
  std::vector<peer::PriorityGate::Scope> scopes;
  if (gate_ != nullptr) {
    for (const auto& p : run.peers) scopes.push_back(gate_->Enter(p, v1::EXCHANGE));
  }

  ReduceOutcome out;
  {
    // A collective sends to all its peers at once.
    Links::UplinkShare share(*links_, run.peers);
    out = body(run);
  }

  absl::MutexLock lock(&state_->mu);
  EndOp(args.op_id);
  if (Group* g = state_->membership.Find(args.group); g != nullptr) {
    if (g->generation == run.generation) g->finished.insert(args.seq);
    result.view = state_->membership.ViewOf(*g);
  }
  for (const auto& p : run.peers) {
    for (Msg::Kind kind : kinds)
      state_->mailbox.Erase(Mailbox::Key(args.group, kind, p, run.seq_id));
  }
  result.status = out.status;
  result.lost_peer = out.lost_peer;
  uint64_t received = out.released;
  for (auto& m : out.taken) {
    received += m.payload.size();
    state_->pool.Recycle(std::move(m.payload));
  }
  result.stats.set_bytes_sent(out.sent);
  result.stats.set_bytes_received(received);
  result.stats.set_peers(run.peers.size());
  result.stats.set_seconds((clock.Now() - run.start).ToSecondsF());
  result.stats.set_generation(run.generation);
  return result;
}

Msg Operations::ReduceHeader(const ReduceRun& run, Msg::Kind kind) const {
  Msg header;
  header.set_kind(kind);
  header.set_group(run.args.group);
  header.set_generation(run.generation);
  header.set_seq(run.args.seq);
  header.set_tag(run.args.tag);
  header.set_dtype(run.args.dtype);
  header.set_op(run.args.op);
  header.set_count(run.count);
  header.set_quantized(run.args.quantize_int8);
  return header;
}

ReduceCall Operations::Call(const ReduceRun& run, uint32_t shards) const {
  ReduceCall call;
  call.generation = run.generation;
  call.dtype = run.args.dtype;
  call.op = run.args.op;
  call.count = run.count;
  call.quantized = run.args.quantize_int8;
  call.tag = run.args.tag;
  call.shards = shards;
  return call;
}

absl::Status Operations::AwaitAll(const ReduceRun& run, const std::vector<std::string>& keys,
                                  std::vector<Message>* taken, std::string* lost_peer) {
  const Clock& clock = state_->clock;
  const AllReduceArgs& args = run.args;
  const std::string& what = run.what;
  Op& op = *run.op;
  // A sender thread that found this site's client at fault (a broken
  // progress word) ends the op: the peers wait for what it did not send.
  auto client_failed = [&] { return run.input != nullptr && !run.input->status().ok(); };
  absl::MutexLock lock(&state_->mu);
  auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_->mu) {
    return state_->shutdown || op.cancelled ||
           AbortFrom(args.group, run.seq_id, run.peers) != nullptr || HoldsAll(keys) ||
           GroupMoved(args.group, run.generation) || client_failed();
  };
  while (!ready() && clock.Now() < run.deadline) {
    state_->mu.AwaitWithTimeout(absl::Condition(&ready),
                                std::min(WaitSlice(clock, run.deadline), kPoll));
    if (!op.cancelled && args.client_gone && args.client_gone()) op.cancelled = true;
  }
  if (client_failed()) return run.input->status();  // Settle says whose fault
  if (const Message* abort = AbortFrom(args.group, run.seq_id, run.peers); abort != nullptr) {
    const Message& m = *abort;
    return absl::AbortedError(
        absl::StrCat(what, ": ", m.from, " gave up on it (", m.header.reason(), ")"));
  }
  if (op.cancelled) return absl::CancelledError(absl::StrCat(what, " cancelled"));
  if (state_->shutdown) {
    return absl::UnavailableError(absl::StrCat(what, ": the daemon is shutting down"));
  }
  if (HoldsAll(keys)) {
    for (const std::string& key : keys) {
      taken->push_back(state_->mailbox.Take(key));
      taken->back().claim.Reset();
    }
    return absl::OkStatus();
  }
  if (GroupMoved(args.group, run.generation)) {
    const Group* g = state_->membership.Find(args.group);
    if (g == nullptr) return absl::CancelledError(absl::StrCat(what, ": this site left the group"));
    OpResult lost = Lost(what, *g, run.generation);
    *lost_peer = lost.lost_peer;
    return lost.status;
  }
  std::vector<std::string> waiting;
  for (size_t i = 0; i < keys.size(); ++i) {
    if (!state_->mailbox.Has(keys[i])) waiting.push_back(run.peers[i]);
  }
  return absl::DeadlineExceededError(absl::StrCat(what, " timed out after ",
                                                  DurationText(args.timeout), " waiting for ",
                                                  absl::StrJoin(waiting, ", ")));
}

void Operations::CollectSends(const ReduceRun& run, SenderSet& senders,
                              const std::vector<uint64_t>& bytes, ReduceOutcome* out) {
  const Clock& clock = state_->clock;
  senders.Finish(After(std::max(run.deadline, clock.Now()), kSenderGrace),
                 [&](const std::string& site) { lose_(site, "it stopped taking data"); });
  for (size_t i = 0; i < run.peers.size(); ++i) {
    const absl::Status& s = senders.statuses()[i];
    if (s.ok()) {
      out->sent += bytes[i];
    } else if (out->status.ok() && s.code() == absl::StatusCode::kResourceExhausted) {
      out->status = absl::ResourceExhaustedError(absl::StrCat(run.what, ": ", s.message()));
    } else if (out->status.ok()) {
      // A peer that missed our message cannot finish: neither may we.
      absl::MutexLock lock(&state_->mu);
      const Group* g = state_->membership.Find(run.args.group);
      if (g != nullptr && g->generation != run.generation) {
        OpResult lost = Lost(run.what, *g, run.generation);
        out->status = lost.status;
        out->lost_peer = lost.lost_peer;
      } else {
        out->status = absl::UnavailableError(absl::StrCat(run.what, ": ", s.message()));
        out->lost_peer = run.peers[i];
      }
    }
  }
}

void Operations::Settle(const ReduceRun& run, ReduceOutcome* out) {
  // A client that stalled, left or broke its progress word fails the op as
  // its own fault.
  if (absl::Status s = run.input != nullptr ? run.input->status() : absl::OkStatus(); !s.ok()) {
    out->lost_peer.clear();
    if (s.code() == absl::StatusCode::kAborted) {
      out->status = absl::CancelledError(absl::StrCat(run.what, ": ", s.message()));
    } else if (s.code() == absl::StatusCode::kDeadlineExceeded) {
      out->status = absl::DeadlineExceededError(absl::StrCat(
          run.what, " timed out after ", DurationText(run.args.timeout), ": ", s.message()));
    } else {
      out->status = absl::Status(s.code(), absl::StrCat(run.what, ": ", s.message()));
    }
  }
  if (out->status.ok()) {
    out->status = Commit(run, out->digests, &out->lost_peer);
  } else if (out->lost_peer.empty()) {
    SendAborts(run.args.group, run.generation, run.args.seq, run.peers,
               std::string(out->status.message()));
  }
}

Operations::ReduceOutcome Operations::DirectAllReduce(const ReduceRun& run,
                                                      absl::Span<uint8_t> buffer) {
  const AllReduceArgs& args = run.args;
  const size_t count = run.count;
  const size_t es = ElementSize(args.dtype);
  ClientBuffer& input = *run.input;
  // Each segment of the buffer is read once into `scratch`. Quantized: each
  // piece is quantized into `quantized`, which goes to every peer. Not
  // quantized with one peer: the piece goes to it and is decoded into `acc`,
  // which so holds this site's contribution exactly as sent. Not quantized
  // with several peers (only when exchange.allreduce is direct): the pieces
  // are copied into `copy`, which goes to every peer.
  Payload scratch = state_->pool.Take(std::min<uint64_t>(kSegmentBytes, buffer.size()));
  const bool several = !args.quantize_int8 && run.peers.size() > 1;
  std::vector<uint8_t> copy;
  std::vector<uint8_t> quantized;
  std::vector<float> acc;
  absl::Span<const uint8_t> own;  // what the peers get: its bytes, for the length
  ReduceOutcome out;
  if (args.quantize_int8) {
    quantized.resize(QuantizedSize(count));
    // Pieces of kSegmentBytes hold whole kQuantBlock blocks, so each one
    // quantizes on its own into its part of `quantized`.
    out.status = input.ReadPieces(
        0, buffer.size(), absl::MakeSpan(scratch),
        [&](uint64_t offset, absl::Span<const uint8_t> piece) {
          const size_t first = offset / es;
          const size_t n = piece.size() / es;
          Quantize(args.dtype, piece, n,
                   absl::MakeSpan(quantized).subspan(QuantizedSize(first), QuantizedSize(n)));
        });
    own = quantized;
  } else if (several) {
    copy.resize(buffer.size());
    out.status = input.ReadPieces(0, buffer.size(), absl::MakeSpan(scratch),
                                  [&](uint64_t offset, absl::Span<const uint8_t> piece) {
                                    std::memcpy(copy.data() + offset, piece.data(), piece.size());
                                  });
    own = copy;
  } else {
    acc.resize(count);
    own = buffer;
  }
  auto decode = [&](uint64_t offset, absl::Span<const uint8_t> piece) {
    Accumulate(args.dtype, /*quantized=*/false, piece, /*first=*/true,
               absl::MakeSpan(acc).subspan(offset / es, piece.size() / es));
  };
  if (!args.quantize_int8 && run.peers.empty()) {
    out.status = input.ReadPieces(0, buffer.size(), absl::MakeSpan(scratch), decode);
  }
  const Msg header = ReduceHeader(run, Msg::REDUCE_DATA);
  Links::StageFn stage;
  if (!args.quantize_int8 && !several) {
    stage = [&](uint64_t offset, uint64_t n) -> absl::StatusOr<absl::Span<const uint8_t>> {
      absl::Span<uint8_t> piece = absl::MakeSpan(scratch).subspan(0, n);
      if (absl::Status s = input.Read(offset, piece); !s.ok()) return s;
      decode(offset, piece);
      return piece;
    };
  }
  const bool unread = !out.status.ok();  // the client stalled or left
  SenderSet senders(run.peers, state_->clock, [&](const std::string& site) {
    if (unread) return absl::CancelledError("stopped");
    return links_->Send(site, header, own, &run.op->stop, Timestamp::Infinite(), nullptr, stage);
  });

  // Wait for every peer's contribution, or for a reason to stop.
  std::vector<std::string> keys;
  for (const auto& p : run.peers) {
    keys.push_back(Mailbox::Key(args.group, Msg::REDUCE_DATA, p, run.seq_id));
  }
  if (out.status.ok()) out.status = AwaitAll(run, keys, &out.taken, &out.lost_peer);

  // Check what the peers sent against what this site does.
  const ReduceCall call = Call(run, /*shards=*/0);
  for (size_t i = 0; out.status.ok() && i < out.taken.size(); ++i) {
    const Message& m = out.taken[i];
    out.status = CheckReduceHeader(run.what, run.peers[i], m.header, call);
    if (out.status.ok() &&
        m.payload.size() != ContributionSize(args.dtype, args.quantize_int8, count)) {
      out.status = absl::InvalidArgumentError(
          absl::StrCat(run.what, ": ", run.peers[i], " sent ", m.payload.size(), " bytes"));
    }
  }
  if (!out.status.ok()) run.op->stop = true;
  // `acc` holds this site's contribution once its sender is done.
  CollectSends(run, senders, std::vector<uint64_t>(run.peers.size(), own.size()), &out);
  state_->pool.Recycle(std::move(scratch));

  if (out.status.ok() && (args.quantize_int8 || several)) {
    acc.resize(count);
    bool first = true;
    for (const std::string& m : run.members) {
      absl::Span<const uint8_t> contribution = own;
      if (m != local_site_) {
        size_t i = std::find(run.peers.begin(), run.peers.end(), m) - run.peers.begin();
        contribution = out.taken[i].payload;
      }
      Accumulate(args.dtype, args.quantize_int8, contribution, first, absl::MakeSpan(acc));
      first = false;
    }
  } else if (out.status.ok() && !run.peers.empty()) {
    // Two members, in sorted order: the first one's value, plus the second.
    const Payload& theirs = out.taken[0].payload;
    if (run.members[0] == local_site_) {
      Accumulate(args.dtype, /*quantized=*/false, theirs, /*first=*/false, absl::MakeSpan(acc));
    } else {
      AccumulateBefore(args.dtype, theirs, absl::MakeSpan(acc));
    }
  }
  if (out.status.ok() && !run.peers.empty()) {
    // Three or more members: each contribution as this site used it, so a
    // member that sent members different ones is named; then the result.
    FinalDigests& d = out.digests;
    d.noun = "contribution";
    if (run.members.size() > 2) {
      for (const std::string& m : run.members) {
        absl::Span<const uint8_t> contribution = own;  // private: `copy` or `quantized`
        if (m != local_site_) {
          size_t i = std::find(run.peers.begin(), run.peers.end(), m) - run.peers.begin();
          contribution = out.taken[i].payload;
        }
        d.parts.push_back(Digest(contribution));
        d.owners.push_back(m);
      }
    }
    // The result's bytes, a segment at a time; they go to `buffer` only
    // after the commit round.
    Payload finished = state_->pool.Take(std::min<uint64_t>(kSegmentBytes, buffer.size()));
    const size_t per_piece = std::max<size_t>(1, finished.size() / es);
    StreamingDigest result;
    for (size_t first = 0; first < count; first += per_piece) {
      const size_t n = std::min(per_piece, count - first);
      const absl::Span<uint8_t> piece = absl::MakeSpan(finished).subspan(0, n * es);
      Finish(args.dtype, args.op, run.members.size(), absl::MakeConstSpan(acc).subspan(first, n),
             piece);
      result.Update(piece);
    }
    state_->pool.Recycle(std::move(finished));
    d.parts.push_back(result.Final());
    d.owners.push_back("");
  }
  Settle(run, &out);
  if (out.status.ok()) Finish(args.dtype, args.op, run.members.size(), acc, buffer);
  return out;
}

OpResult Operations::Send(const P2PArgs& args, absl::Span<const uint8_t> data) {
  const Clock& clock = state_->clock;
  const Timestamp start = clock.Now();
  OpResult result;
  const std::string what =
      absl::StrCat("send to ", args.peer, " tag '", args.tag, "' in group ", args.group);
  std::shared_ptr<Op> op;
  uint64_t generation;
  {
    absl::MutexLock lock(&state_->mu);
    const Group* g = state_->membership.Formed(args.group);
    if (g == nullptr) {
      result.status = absl::FailedPreconditionError(
          absl::StrCat("this site has not joined group ", args.group));
      return result;
    }
    if (args.peer == local_site_ || !g->HasMember(args.peer)) {
      LostPeer lost = state_->membership.LostMember(what, *g, args.peer);
      if (!lost.status.ok()) return Lost(lost, *g);
      result.status = absl::InvalidArgumentError(
          absl::StrCat(what, ": ", args.peer, " is not another member of ", Members(g->members)));
      return result;
    }
    if (result.status = OpIdFree(args.op_id); !result.status.ok()) return result;
    generation = g->generation;
    op = StartOp(args.op_id);
  }
  std::optional<peer::PriorityGate::Scope> scope;
  if (gate_ != nullptr) scope.emplace(gate_->Enter(args.peer, v1::EXCHANGE));
  Msg header;
  header.set_kind(Msg::P2P);
  header.set_group(args.group);
  header.set_generation(generation);
  header.set_tag(args.tag);
  const Timestamp deadline = After(start, ToTimeDelta(args.timeout));
  std::optional<FillProgress> progress;
  Links::ReadyFn filled;
  if (args.progress) {
    progress.emplace(*args.progress, data.size());
    filled = [&](uint64_t end) {
      return progress->WaitFilled(end, clock, deadline, op->stop, args.client_gone,
                                  state_->client_reads.unfilled);
    };
  }
  // On this thread: one peer needs no sender thread, and a small message
  // should not wait for one to be scheduled. It stops at a segment boundary
  // once the op is cancelled or late.
  absl::Status s = links_->Send(args.peer, header, data, &op->stop, deadline, filled);
  if (s.ok() && scope) {
    links_->HoldUntilSent(args.peer, *std::move(scope));
    scope.reset();
  }
  absl::MutexLock lock(&state_->mu);
  EndOp(args.op_id);
  const Group* g = state_->membership.Find(args.group);
  if (g != nullptr) result.view = state_->membership.ViewOf(*g);
  if (!s.ok()) {
    if (s.code() == absl::StatusCode::kDeadlineExceeded) {  // its client stalled
      result.status = absl::DeadlineExceededError(
          absl::StrCat(what, " timed out after ", DurationText(args.timeout), ": ", s.message()));
    } else if (s.code() == absl::StatusCode::kAborted) {
      result.status = absl::CancelledError(absl::StrCat(what, ": ", s.message()));
    } else if (s.code() == absl::StatusCode::kInvalidArgument) {  // its progress word
      result.status = absl::InvalidArgumentError(absl::StrCat(what, ": ", s.message()));
    } else if (s.code() == absl::StatusCode::kResourceExhausted) {
      result.status = absl::ResourceExhaustedError(absl::StrCat(what, ": ", s.message()));
    } else if (s.code() == absl::StatusCode::kCancelled && !op->cancelled && !state_->shutdown) {
      result.status = absl::DeadlineExceededError(
          absl::StrCat(what, " timed out after ", DurationText(args.timeout)));
    } else if (s.code() == absl::StatusCode::kCancelled) {
      result.status = absl::CancelledError(absl::StrCat(what, " cancelled"));
    } else if (g != nullptr && g->generation != generation) {
      return Lost(what, *g, generation);
    } else {
      result.status = absl::UnavailableError(absl::StrCat(what, ": ", s.message()));
    }
    return result;
  }
  result.stats.set_bytes_sent(data.size());
  result.stats.set_peers(1);
  result.stats.set_seconds((clock.Now() - start).ToSecondsF());
  result.stats.set_generation(generation);
  result.bytes = data.size();
  return result;
}

OpResult Operations::Recv(const P2PArgs& args, absl::Span<uint8_t> out) {
  using State = Landing::State;
  const Clock& clock = state_->clock;
  const Timestamp start = clock.Now();
  const Timestamp deadline = After(start, ToTimeDelta(args.timeout));
  OpResult result;
  const std::string what =
      absl::StrCat("receive from ", args.peer, " tag '", args.tag, "' in group ", args.group);
  const std::string key = Mailbox::Key(args.group, Msg::P2P, args.peer, args.tag);
  absl::MutexLock lock(&state_->mu);
  const Group* g = state_->membership.Formed(args.group);
  if (g == nullptr) {
    result.status =
        absl::FailedPreconditionError(absl::StrCat("this site has not joined group ", args.group));
    return result;
  }
  if (result.status = OpIdFree(args.op_id); !result.status.ok()) return result;
  const uint64_t generation = g->generation;
  if (args.peer == local_site_ || !g->HasMember(args.peer)) {
    LostPeer lost = state_->membership.LostMember(what, *g, args.peer);
    if (!lost.status.ok()) return Lost(lost, *g);
    result.status = absl::InvalidArgumentError(
        absl::StrCat(what, ": ", args.peer, " is not another member of ", Members(g->members)));
    return result;
  }
  std::shared_ptr<Op> op = StartOp(args.op_id);
  auto peer_gone = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_->mu) {
    const Group* now = state_->membership.Find(args.group);
    return now == nullptr || !now->HasMember(args.peer);
  };
  auto queued = [&]()
                    ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_->mu) { return state_->mailbox.Has(key); };
  // Offer `out` to the next message under the key, unless one is already
  // here for this call to take.
  std::shared_ptr<Landing> landing;
  if (!queued()) {
    landing = std::make_shared<Landing>();
    landing->key = key;
    landing->out = out;
    landing->progress = args.progress;
    state_->mailbox.Offer(landing);
  }
  auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_->mu) {
    if (state_->shutdown || op->cancelled || peer_gone()) return true;
    if (landing && landing->state == State::kComplete) return true;
    // Bound to a message that is arriving: that one is this call's.
    if (landing && landing->state == State::kFilling) return false;
    return queued();
  };
  while (!ready() && clock.Now() < deadline) {
    state_->mu.AwaitWithTimeout(absl::Condition(&ready),
                                std::min(WaitSlice(clock, deadline), kPoll));
    if (!op->cancelled && args.client_gone && args.client_gone()) op->cancelled = true;
  }
  EndOp(args.op_id);
  // From here on the hub no longer touches `out` (whatever the outcome).
  const bool landed = landing && state_->mailbox.Withdraw(*landing, state_->mu);
  g = state_->membership.Find(args.group);
  if (g != nullptr) result.view = state_->membership.ViewOf(*g);
  auto succeed = [&](uint64_t bytes) {
    result.bytes = bytes;
    result.stats.set_bytes_received(bytes);
    result.stats.set_peers(1);
    result.stats.set_seconds((clock.Now() - start).ToSecondsF());
    result.stats.set_generation(generation);
  };
  if (landed) {
    succeed(landing->header.total_bytes());
    return result;
  }
  if (state_->mailbox.Has(key)) {
    Message msg = state_->mailbox.Take(key);
    if (msg.payload.size() > out.size()) {
      result.status = absl::InvalidArgumentError(
          absl::StrCat(what, ": the message is ", msg.payload.size(), " bytes, the buffer holds ",
                       out.size(), " (the message is dropped)"));
      return result;
    }
    // A new epoch: whatever the client copied of a message that was bound
    // to `out` earlier is stale.
    const uint32_t epoch = landing ? landing->epoch + 1 : 1;
    // Unlocked: the message is this call's alone now, and the inbound
    // readers should not wait for a large copy.
    state_->mu.Unlock();
    std::memcpy(out.data(), msg.payload.data(), msg.payload.size());
    if (args.progress) args.progress->PublishLanded({epoch, msg.payload.size()});
    state_->mu.Lock();
    succeed(msg.payload.size());
    state_->pool.Recycle(std::move(msg.payload));
    return result;
  }
  if (op->cancelled) {
    result.status = absl::CancelledError(absl::StrCat(what, " cancelled"));
  } else if (state_->shutdown) {
    result.status = absl::UnavailableError(absl::StrCat(what, ": the daemon is shutting down"));
  } else if (peer_gone()) {
    if (g == nullptr) {
      result.status = absl::CancelledError(absl::StrCat(what, ": this site left the group"));
    } else {
      return Lost(what, *g, generation);
    }
  } else {
    result.status = absl::DeadlineExceededError(
        absl::StrCat(what, " timed out after ", DurationText(args.timeout)));
  }
  return result;
}

}  // namespace longhaul::exchange
