// The all-gather and the broadcast (proto/EXCHANGE.md, All-gather,
// Broadcast): the same op registration, mailbox keys, generation checks,
// peer-loss handling and DONE/ABORT commit round as the all-reduce, with
// their own data kinds, GATHER_DATA and BCAST_DATA (header checks in
// gather_checks.h). The buffer a member sends to every peer is read out of
// its client's segment once, a piece at a time (FanOutReader), so every
// peer gets the same bytes.

#include <algorithm>
#include <cstring>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "daemon/exchange/client_buffer.h"
#include "daemon/exchange/deadline.h"
#include "daemon/exchange/digest.h"
#include "daemon/exchange/gather_checks.h"
#include "daemon/exchange/mailbox.h"
#include "daemon/exchange/operations.h"
#include "daemon/exchange/sender_set.h"

namespace longhaul::exchange {

using Msg = v1::ExchangePeerMessage;

namespace {

// What this site's GATHER_DATA or BCAST_DATA (`kind`) of the op at
// `generation` carries, and so what it expects of its peers' ones.
GatherCall CallOf(Msg::Kind kind, uint64_t generation, const GatherArgs& args, uint64_t bytes) {
  GatherCall call;
  call.kind = kind;
  call.generation = generation;
  call.bytes = bytes;
  call.tag = args.tag;
  if (kind == Msg::BCAST_DATA) call.root = args.root;
  return call;
}

// The header of this site's message of `call`.
Msg HeaderOf(const GatherCall& call, const GatherArgs& args) {
  Msg header;
  header.set_kind(call.kind);
  header.set_group(args.group);
  header.set_generation(call.generation);
  header.set_seq(args.seq);
  header.set_tag(call.tag);
  header.set_count(call.bytes);
  header.set_root(call.root);
  return header;
}

// Pieces of a fanned-out buffer held at once: the fastest sender may be one
// piece ahead of the slowest one.
constexpr size_t kFanOutSlots = 2;

// The sends of one buffer, `payload` (read only through `input`), to every
// one of `peers`: one sender thread each, every piece read once into one of
// kFanOutSlots slots from `pool` and written to every peer from there.
// Not thread-safe; owned by the op's thread. The arguments outlive it.
class FanOut {
 public:
  FanOut(const std::vector<std::string>& peers, const Msg& header,
         absl::Span<const uint8_t> payload, ClientBuffer& input, const std::atomic<bool>& stop,
         Links& links, BufferPool& pool, const Clock& clock)
      : pool_(pool) {
    std::vector<absl::Span<uint8_t>> slots;
    if (!payload.empty()) {
      slots_.reserve(kFanOutSlots);
      for (size_t i = 0; i < kFanOutSlots; ++i) {
        slots_.push_back(pool.Take(std::min<uint64_t>(kSegmentBytes, payload.size())));
        slots.push_back(absl::MakeSpan(slots_.back()));
      }
      reader_.emplace(input, peers.size(), std::move(slots), stop, &digest_);
    }
    // `payload` by value: the parameter ends with the constructor.
    senders_.emplace(
        peers, clock, [&peers, &header, payload, &stop, &links, this](const std::string& site) {
          const size_t i = std::find(peers.begin(), peers.end(), site) - peers.begin();
          Links::StageFn stage;
          if (reader_) {
            stage = [this, i](uint64_t offset, uint64_t n) { return reader_->Piece(i, offset, n); };
          }
          absl::Status s =
              links.Send(site, header, payload, &stop, Timestamp::Infinite(), nullptr, stage);
          if (reader_) reader_->Done(i);
          return s;
        });
  }
  ~FanOut() {
    senders_.reset();  // joins them: nothing reads the slots after this
    for (Payload& slot : slots_) pool_.Recycle(std::move(slot));
  }
  FanOut(const FanOut&) = delete;
  FanOut& operator=(const FanOut&) = delete;

  SenderSet& senders() { return *senders_; }
  // The digest of the bytes every peer got; valid once senders() finished
  // and every send succeeded.
  std::string digest() const { return digest_.Final(); }

 private:
  BufferPool& pool_;
  StreamingDigest digest_;  // fed by reader_, before the senders start
  std::vector<Payload> slots_;
  std::optional<FanOutReader> reader_;  // none for an empty buffer
  std::optional<SenderSet> senders_;
};

}  // namespace

absl::Status Operations::CheckGathered(const ReduceRun& run, const std::vector<std::string>& keys,
                                       const std::vector<std::string>& peers,
                                       const ReduceOutcome& out, const GatherCall& call) {
  if (!out.status.ok()) return out.status;
  const size_t first = out.taken.size() - keys.size();
  for (size_t i = 0; i < keys.size(); ++i) {
    const Message& m = out.taken[first + i];
    absl::Status s = CheckGatherMessage(run.what, peers[i], m.header, m.payload.size(), call);
    if (!s.ok()) return s;
  }
  absl::MutexLock lock(&state_->mu);
  for (size_t i = 0; i < keys.size(); ++i) {
    if (state_->mailbox.Has(keys[i])) {
      return absl::InvalidArgumentError(absl::StrCat(run.what, ": ", peers[i], " sent its ",
                                                     Msg::Kind_Name(call.kind), " twice"));
    }
  }
  return absl::OkStatus();
}

OpResult Operations::Collective(const GatherArgs& args, const std::string& what,
                                absl::Span<const uint8_t> input, CollectiveBody body) {
  // The all-reduce's machinery reads these fields of AllReduceArgs only.
  AllReduceArgs reduce_args;
  reduce_args.group = args.group;
  reduce_args.op_id = args.op_id;
  reduce_args.seq = args.seq;
  reduce_args.tag = args.tag;
  reduce_args.timeout = args.timeout;
  reduce_args.client_gone = args.client_gone;
  static constexpr Msg::Kind kKinds[] = {Msg::GATHER_DATA, Msg::BCAST_DATA, Msg::DONE, Msg::ABORT};
  return RunOp(reduce_args, args.root, what, kKinds, [&](ReduceRun& run) {
    ClientBuffer buffer(input, std::nullopt, state_->clock, run.deadline, run.op->stop,
                        args.client_gone, state_->client_reads);
    run.input = &buffer;
    return body(run);
  });
}

OpResult Operations::AllGather(const GatherArgs& args, absl::Span<const uint8_t> input,
                               absl::Span<uint8_t> output) {
  const std::string what = absl::StrCat("all-gather #", args.seq,
                                        args.tag.empty() ? "" : absl::StrCat(" (", args.tag, ")"),
                                        " in group ", args.group);
  const uint64_t part = input.size();
  return Collective(args, what, input, [&](const ReduceRun& run) {
    ReduceOutcome out;
    const uint64_t n = run.members.size();
    if (part != 0 && output.size() / part < n) {
      // Before any send: the peers fail on this site's ABORT.
      out.status = absl::InvalidArgumentError(
          absl::StrCat(what, ": the output holds ", output.size(), " bytes, ", n, " members of ",
                       part, " bytes need ", n * part));
      Settle(run, &out);
      return out;
    }
    const GatherCall call = CallOf(Msg::GATHER_DATA, run.generation, args, part);
    const Msg header = HeaderOf(call, args);
    FanOut sends(run.peers, header, input, *run.input, run.op->stop, *links_, state_->pool,
                 state_->clock);
    std::vector<std::string> keys;
    for (const auto& p : run.peers) {
      keys.push_back(Mailbox::Key(args.group, Msg::GATHER_DATA, p, run.seq_id));
    }
    out.status = AwaitAll(run, keys, &out.taken, &out.lost_peer);
    out.status = CheckGathered(run, keys, run.peers, out, call);
    if (!out.status.ok()) run.op->stop = true;
    CollectSends(run, sends.senders(), std::vector<uint64_t>(run.peers.size(), part), &out);
    if (out.status.ok() && !run.peers.empty()) {
      // Its own part as the peers got it: what its client wrote meanwhile
      // is its own to see, not a difference between members.
      out.digests.noun = "part";
      out.digests.owners = run.members;
      for (const std::string& m : run.members) {
        const size_t i = std::find(run.peers.begin(), run.peers.end(), m) - run.peers.begin();
        out.digests.parts.push_back(m == local_site_ ? sends.digest()
                                                     : Digest(out.taken[i].payload));
      }
    }
    Settle(run, &out);
    if (out.status.ok() && part > 0) {
      // Its own part first: `input` may lie in `output`, where a peer's part
      // would overwrite it. Read from the client's buffer again, so a client
      // that rewrote it meanwhile sees its rewrite there: its own output,
      // which it may write anyway; the peers all got the same bytes.
      for (size_t k = 0; k < run.members.size(); ++k) {
        if (run.members[k] == local_site_)
          std::memmove(output.data() + k * part, input.data(), part);
      }
      for (size_t i = 0; i < run.peers.size(); ++i) {
        const size_t k =
            std::find(run.members.begin(), run.members.end(), run.peers[i]) - run.members.begin();
        std::memcpy(output.data() + k * part, out.taken[i].payload.data(), part);
      }
    }
    return out;
  });
}

OpResult Operations::Broadcast(const GatherArgs& args, absl::Span<uint8_t> buffer) {
  const std::string what = absl::StrCat("broadcast #", args.seq, " from ", args.root,
                                        args.tag.empty() ? "" : absl::StrCat(" (", args.tag, ")"),
                                        " in group ", args.group);
  if (args.root.empty()) {
    OpResult result;
    result.status = absl::InvalidArgumentError(absl::StrCat(what, ": it needs a root site"));
    return result;
  }
  return Collective(args, what, buffer, [&](const ReduceRun& run) {
    ReduceOutcome out;
    if (args.root == local_site_) {
      // The root sends its buffer to every member directly: its uplink
      // carries (N - 1) buffers.
      const Msg header =
          HeaderOf(CallOf(Msg::BCAST_DATA, run.generation, args, buffer.size()), args);
      FanOut sends(run.peers, header, buffer, *run.input, run.op->stop, *links_, state_->pool,
                   state_->clock);
      CollectSends(run, sends.senders(), std::vector<uint64_t>(run.peers.size(), buffer.size()),
                   &out);
      out.digests = {{sends.digest()}, {local_site_}, "buffer"};
      Settle(run, &out);
      return out;
    }
    // Wait for the root's buffer alone; an ABORT from another member
    // reaches the commit round, a loss of any member moves the group.
    ReduceRun from_root = run;
    from_root.peers = {args.root};
    const std::vector<std::string> keys = {
        Mailbox::Key(args.group, Msg::BCAST_DATA, args.root, run.seq_id)};
    out.status = AwaitAll(from_root, keys, &out.taken, &out.lost_peer);
    out.status = CheckGathered(run, keys, from_root.peers, out,
                               CallOf(Msg::BCAST_DATA, run.generation, args, buffer.size()));
    if (out.status.ok()) out.digests = {{Digest(out.taken[0].payload)}, {args.root}, "buffer"};
    Settle(run, &out);
    if (out.status.ok() && !buffer.empty()) {
      std::memcpy(buffer.data(), out.taken[0].payload.data(), buffer.size());
    }
    return out;
  });
}

}  // namespace longhaul::exchange
