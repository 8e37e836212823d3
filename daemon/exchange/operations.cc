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
#include "common/fmt_absl.h"
#include "daemon/exchange/deadline.h"
#include "daemon/exchange/reduce.h"
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

// Waits until the client of a streamed Send has written the first `end` of
// its `total` buffer bytes (longhaul/shm_progress.h). The client writes at
// memory speed, far ahead of the link, so this waits only for the first
// segment unless the client stalls: it naps from 20 us up to 1 ms, so
// `clock` is read at least every millisecond. Cancelled once `stop` is set;
// DeadlineExceeded at `deadline`; Aborted once `client_gone` (asked after
// every kPoll of naps) says the client has gone away. Counts every look that
// finds the segment unwritten in `looks`.
absl::Status WaitFilled(const shm::ProgressWord& word, uint64_t end, uint64_t total,
                        const Clock& clock, Timestamp deadline, const std::atomic<bool>& stop,
                        const std::function<bool()>& client_gone, std::atomic<uint64_t>& looks) {
  absl::Duration nap = absl::Microseconds(20);
  absl::Duration napped;  // since `client_gone` was last asked
  while (true) {
    const uint64_t ready = word.Ready();
    if (ready >= end) return absl::OkStatus();
    ++looks;
    if (stop.load()) return absl::CancelledError("stopped");
    const Timestamp now = clock.Now();
    if (now >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat("its client had written only ", ready,
                                                      " of the ", total, " bytes of the buffer"));
    }
    if (client_gone && napped >= kPoll) {
      if (client_gone()) {
        return absl::AbortedError(absl::StrCat("its client went away after writing ", ready,
                                               " of the ", total, " bytes of the buffer"));
      }
      napped = absl::ZeroDuration();
    }
    const absl::Duration sleep = std::min(nap, ToDuration(deadline - now));
    absl::SleepFor(sleep);
    napped += sleep;
    nap = std::min(nap * 2, absl::Milliseconds(1));
  }
}

// The senders of one operation: one thread per destination, each sending
// the same message. Not thread-safe; owned by the operation's thread.
class SenderSet {
 public:
  using SendFn = std::function<absl::Status(const std::string& site)>;
  // `clock` (not owned) outlives the set.
  SenderSet(const std::vector<std::string>& sites, const Clock& clock, SendFn send)
      : sites_(sites), clock_(clock) {
    statuses_.resize(sites.size());
    done_ = std::make_unique<std::atomic<bool>[]>(sites.size());
    for (size_t i = 0; i < sites.size(); ++i) {
      done_[i] = false;
      threads_.emplace_back([this, i, send] {
        statuses_[i] = send(sites_[i]);
        absl::MutexLock lock(&mu_);
        done_[i] = true;
        ++finished_;
      });
    }
  }
  ~SenderSet() {
    for (auto& t : threads_) {
      if (t.joinable()) t.join();
    }
  }

  // Waits for every sender until `deadline`; calls `cut(site)` for each one
  // still running then (which must make its write fail), and joins all.
  void Finish(Timestamp deadline, const std::function<void(const std::string&)>& cut) {
    {
      absl::MutexLock lock(&mu_);
      auto all = [this]()
                     ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return finished_ == threads_.size(); };
      AwaitUntil(mu_, absl::Condition(&all), clock_, deadline);
    }
    for (size_t i = 0; i < threads_.size(); ++i) {
      if (!done_[i]) cut(sites_[i]);
    }
    for (auto& t : threads_) t.join();
  }

  const std::vector<absl::Status>& statuses() const { return statuses_; }

 private:
  const std::vector<std::string> sites_;
  const Clock& clock_;
  std::vector<absl::Status> statuses_;
  std::unique_ptr<std::atomic<bool>[]> done_;
  std::vector<std::thread> threads_;
  absl::Mutex mu_;
  size_t finished_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace

Operations::Operations(std::string local_site, std::vector<std::string> peers, HubState* state,
                       Links* links, peer::PriorityGate* gate, Links::LostFn lose)
    : local_site_(std::move(local_site)),
      peers_(std::move(peers)),
      state_(state),
      links_(links),
      gate_(gate),
      lose_(std::move(lose)) {}

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
    const bool stale = (kind == Msg::REDUCE_DATA || kind == Msg::DONE || kind == Msg::ABORT) &&
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

absl::Status Operations::Commit(const AllReduceArgs& args, const std::string& what,
                                uint64_t generation, const std::vector<std::string>& peers,
                                std::string* lost_peer) {
  Msg done;
  done.set_kind(Msg::DONE);
  done.set_group(args.group);
  done.set_generation(generation);
  done.set_seq(args.seq);
  for (const std::string& p : peers) {
    // A failed write loses the peer; the wait below reports it.
    links_->Send(p, done, {}, nullptr).IgnoreError();
  }
  const std::string seq_id = absl::StrCat(args.seq);
  std::vector<std::string> keys;
  for (const auto& p : peers) keys.push_back(Mailbox::Key(args.group, Msg::DONE, p, seq_id));
  // Committed: a cancel or the deadline no longer ends the op (a peer may
  // already have finished it); only an abort, a lost peer or shutdown does,
  // or a peer silent long past the deadline.
  const Timestamp give_up =
      After(After(state_->clock.Now(), ToTimeDelta(args.timeout)), kSenderGrace);
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
  if (HoldsAll(keys)) return absl::OkStatus();
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
  const Clock& clock = state_->clock;
  const Timestamp start = clock.Now();
  const Timestamp deadline = After(start, ToTimeDelta(args.timeout));
  OpResult result;
  const size_t es = ElementSize(args.dtype);
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
  const size_t count = buffer.size() / es;
  const std::string what = absl::StrCat("all-reduce #", args.seq,
                                        args.tag.empty() ? "" : absl::StrCat(" (", args.tag, ")"),
                                        " in group ", args.group);
  std::shared_ptr<Op> op;
  uint64_t generation;
  std::vector<std::string> members;
  {
    absl::MutexLock lock(&state_->mu);
    const Group* g = state_->membership.Formed(args.group);
    if (g == nullptr) {
      result.status = absl::FailedPreconditionError(
          absl::StrCat("this site has not joined group ", args.group));
      return result;
    }
    if (result.status = OpIdFree(args.op_id); !result.status.ok()) return result;
    generation = g->generation;
    members = g->members;
    op = StartOp(args.op_id);
  }
  std::vector<std::string> peers;
  for (const auto& m : members) {
    if (m != local_site_) peers.push_back(m);
  }
  std::vector<peer::PriorityGate::Scope> scopes;
  if (gate_ != nullptr) {
    for (const auto& p : peers) scopes.push_back(gate_->Enter(p, v1::EXCHANGE));
  }

  std::vector<uint8_t> quantized;
  absl::Span<const uint8_t> own = buffer;
  if (args.quantize_int8) {
    quantized.resize(QuantizedSize(count));
    Quantize(args.dtype, buffer, count, absl::MakeSpan(quantized));
    own = quantized;
  }
  Msg header;
  header.set_kind(Msg::REDUCE_DATA);
  header.set_group(args.group);
  header.set_generation(generation);
  header.set_seq(args.seq);
  header.set_tag(args.tag);
  header.set_dtype(args.dtype);
  header.set_op(args.op);
  header.set_count(count);
  header.set_quantized(args.quantize_int8);
  SenderSet senders(peers, clock, [&](const std::string& site) {
    return links_->Send(site, header, own, &op->stop);
  });

  // Wait for every peer's contribution, or for a reason to stop.
  const std::string seq_id = absl::StrCat(args.seq);
  std::vector<std::string> keys;
  for (const auto& p : peers) keys.push_back(Mailbox::Key(args.group, Msg::REDUCE_DATA, p, seq_id));
  std::vector<Message> taken(peers.size());
  absl::Status failure;
  std::string lost_peer;
  {
    absl::MutexLock lock(&state_->mu);
    auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_->mu) {
      return state_->shutdown || op->cancelled || AbortFrom(args.group, seq_id, peers) != nullptr ||
             HoldsAll(keys) || GroupMoved(args.group, generation);
    };
    while (!ready() && clock.Now() < deadline) {
      state_->mu.AwaitWithTimeout(absl::Condition(&ready),
                                  std::min(WaitSlice(clock, deadline), kPoll));
      if (!op->cancelled && args.client_gone && args.client_gone()) op->cancelled = true;
    }
    if (const Message* abort = AbortFrom(args.group, seq_id, peers); abort != nullptr) {
      const Message& m = *abort;
      failure = absl::AbortedError(
          absl::StrCat(what, ": ", m.from, " gave up on it (", m.header.reason(), ")"));
    } else if (op->cancelled) {
      failure = absl::CancelledError(absl::StrCat(what, " cancelled"));
    } else if (state_->shutdown) {
      failure = absl::UnavailableError(absl::StrCat(what, ": the daemon is shutting down"));
    } else if (HoldsAll(keys)) {
      for (size_t i = 0; i < keys.size(); ++i) {
        taken[i] = state_->mailbox.Take(keys[i]);
        taken[i].claim.Reset();
      }
    } else if (GroupMoved(args.group, generation)) {
      const Group* g = state_->membership.Find(args.group);
      if (g == nullptr) {
        failure = absl::CancelledError(absl::StrCat(what, ": this site left the group"));
      } else {
        OpResult lost = Lost(what, *g, generation);
        failure = lost.status;
        lost_peer = lost.lost_peer;
      }
    } else {
      std::vector<std::string> waiting;
      for (size_t i = 0; i < keys.size(); ++i) {
        if (!state_->mailbox.Has(keys[i])) waiting.push_back(peers[i]);
      }
      failure = absl::DeadlineExceededError(
          absl::StrCat(what, " timed out after ", DurationText(args.timeout), " waiting for ",
                       absl::StrJoin(waiting, ", ")));
    }
  }

  // Check what the peers sent against what this site does.
  for (size_t i = 0; failure.ok() && i < taken.size(); ++i) {
    const Msg& h = taken[i].header;
    if (h.generation() != generation) {
      failure = absl::UnavailableError(absl::StrCat(what, ": ", peers[i], " ran it at generation ",
                                                    h.generation(), ", this site at ", generation,
                                                    "; retry"));
    } else if (h.count() != count || h.dtype() != args.dtype ||
               h.quantized() != args.quantize_int8 || h.op() != args.op || h.tag() != args.tag) {
      failure = absl::FailedPreconditionError(absl::StrCat(
          what, ": ", peers[i], " passed ", h.count(), " ", v1::ExchangeDType_Name(h.dtype()), " ",
          v1::ReduceOp_Name(h.op()), h.quantized() ? " int8" : "", " tag '", h.tag(),
          "', this site ", count, " ", v1::ExchangeDType_Name(args.dtype), " ",
          v1::ReduceOp_Name(args.op), args.quantize_int8 ? " int8" : "", " tag '", args.tag, "'"));
    } else if (taken[i].payload.size() != ContributionSize(args.dtype, args.quantize_int8, count)) {
      failure = absl::InvalidArgumentError(
          absl::StrCat(what, ": ", peers[i], " sent ", taken[i].payload.size(), " bytes"));
    }
  }

  std::vector<float> acc;
  if (failure.ok()) {
    acc.resize(count);
    bool first = true;
    for (const std::string& m : members) {
      absl::Span<const uint8_t> contribution = own;
      if (m != local_site_) {
        size_t i = std::find(peers.begin(), peers.end(), m) - peers.begin();
        contribution = taken[i].payload;
      }
      Accumulate(args.dtype, args.quantize_int8, contribution, first, absl::MakeSpan(acc));
      first = false;
    }
  } else {
    op->stop = true;
  }
  senders.Finish(After(std::max(deadline, clock.Now()), kSenderGrace),
                 [&](const std::string& site) { lose_(site, "it stopped taking data"); });
  uint64_t sent = 0;
  for (size_t i = 0; i < peers.size(); ++i) {
    const absl::Status& s = senders.statuses()[i];
    if (s.ok()) {
      sent += own.size();
    } else if (failure.ok() && s.code() == absl::StatusCode::kResourceExhausted) {
      failure = absl::ResourceExhaustedError(absl::StrCat(what, ": ", s.message()));
    } else if (failure.ok()) {
      // A peer that missed our contribution cannot finish: neither may we.
      absl::MutexLock lock(&state_->mu);
      const Group* g = state_->membership.Find(args.group);
      if (g != nullptr && g->generation != generation) {
        OpResult lost = Lost(what, *g, generation);
        failure = lost.status;
        lost_peer = lost.lost_peer;
      } else {
        failure = absl::UnavailableError(absl::StrCat(what, ": ", s.message()));
        lost_peer = peers[i];
      }
    }
  }
  if (failure.ok()) {
    failure = Commit(args, what, generation, peers, &lost_peer);
  } else if (lost_peer.empty()) {
    SendAborts(args.group, generation, args.seq, peers, std::string(failure.message()));
  }
  if (failure.ok()) Finish(args.dtype, args.op, members.size(), acc, buffer);

  absl::MutexLock lock(&state_->mu);
  EndOp(args.op_id);
  if (Group* g = state_->membership.Find(args.group); g != nullptr) {
    if (g->generation == generation) g->finished.insert(args.seq);
    result.view = state_->membership.ViewOf(*g);
  }
  for (const auto& p : peers) {
    keys.push_back(Mailbox::Key(args.group, Msg::DONE, p, seq_id));
    keys.push_back(Mailbox::Key(args.group, Msg::ABORT, p, seq_id));
  }
  for (const auto& k : keys) state_->mailbox.Erase(k);
  result.status = failure;
  result.lost_peer = lost_peer;
  uint64_t received = 0;
  for (auto& m : taken) {
    received += m.payload.size();
    state_->pool.Recycle(std::move(m.payload));
  }
  result.stats.set_bytes_sent(sent);
  result.stats.set_bytes_received(received);
  result.stats.set_peers(peers.size());
  result.stats.set_seconds((clock.Now() - start).ToSecondsF());
  result.stats.set_generation(generation);
  return result;
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
  Links::ReadyFn filled;
  if (args.progress) {
    filled = [&](uint64_t end) {
      return WaitFilled(*args.progress, end, data.size(), clock, deadline, op->stop,
                        args.client_gone, state_->unfilled_looks);
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
