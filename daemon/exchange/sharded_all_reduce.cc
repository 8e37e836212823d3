// The sharded all-reduce (proto/EXCHANGE.md, All-reduce, Sharded): a
// reduce-scatter to each shard's owner and an all-gather of the owners'
// final bytes, pipelined a 1 MiB piece at a time, then the commit round the
// direct exchange runs too.

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/functional/function_ref.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "daemon/exchange/digest.h"
#include "daemon/exchange/operations.h"
#include "daemon/exchange/reduce.h"
#include "daemon/exchange/sender_set.h"
#include "daemon/exchange/shards.h"

namespace longhaul::exchange {

using Msg = v1::ExchangePeerMessage;

namespace {

// How far the owner has reduced its shard: its result senders wait here for
// each piece.
class ReducedPieces {
 public:
  void Add() {
    absl::MutexLock lock(&mu_);
    ++reduced_;
  }
  void Fail() {
    absl::MutexLock lock(&mu_);
    failed_ = true;
  }
  // Waits until piece `i` is reduced (true) or the reduction failed (false).
  bool Await(uint32_t i) {
    absl::MutexLock lock(&mu_);
    auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return reduced_ > i || failed_; };
    mu_.Await(absl::Condition(&ready));
    return reduced_ > i;
  }

 private:
  absl::Mutex mu_;
  uint32_t reduced_ ABSL_GUARDED_BY(mu_) = 0;
  bool failed_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace

absl::Status Operations::TakePieces(const ReduceRun& run, const std::vector<std::string>& from,
                                    Msg::Kind kind, const ReduceCall& call,
                                    absl::FunctionRef<uint32_t(const std::string&)> shard_of,
                                    uint32_t piece, ReduceOutcome* out) {
  std::vector<std::string> keys;
  for (const std::string& p : from)
    keys.push_back(Mailbox::Key(run.args.group, kind, p, run.seq_id));
  if (absl::Status s = AwaitAll(run, keys, &out->taken, &out->lost_peer); !s.ok()) return s;
  const size_t first = out->taken.size() - keys.size();
  for (size_t i = 0; i < keys.size(); ++i) {
    const Message& m = out->taken[first + i];
    absl::Status s = CheckShardMessage(run.what, from[i], m.header, m.payload.size(), call,
                                       shard_of(from[i]), piece);
    if (!s.ok()) return s;
  }
  const size_t es = ElementSize(call.dtype);
  absl::MutexLock lock(&state_->mu);
  for (size_t i = 0; i < keys.size(); ++i) {
    const uint32_t shard = shard_of(from[i]);
    if (piece + 1 == PieceCount(ShardOf(call.count, call.shards, shard), es) &&
        state_->mailbox.Has(keys[i])) {
      return absl::InvalidArgumentError(
          absl::StrCat(run.what, ": ", from[i], " sent more pieces of its ", Msg::Kind_Name(kind),
                       " than shard ", shard, " has"));
    }
  }
  return absl::OkStatus();
}

Operations::ReduceOutcome Operations::ShardedAllReduce(const ReduceRun& run,
                                                       absl::Span<uint8_t> buffer) {
  const AllReduceArgs& args = run.args;
  const auto shards = static_cast<uint32_t>(run.members.size());
  const size_t es = ElementSize(args.dtype);
  auto index_of = [&](const std::string& site) -> uint32_t {
    return static_cast<uint32_t>(std::find(run.members.begin(), run.members.end(), site) -
                                 run.members.begin());
  };
  auto shard_of = [&](uint32_t k) { return ShardOf(run.count, shards, k); };
  auto bytes_of = [&](const ShardRange& r) { return buffer.subspan(r.begin * es, r.size() * es); };
  const uint32_t mine = index_of(local_site_);
  const ShardRange own = shard_of(mine);
  const uint32_t own_pieces = PieceCount(own, es);
  Msg header = ReduceHeader(run, Msg::REDUCE_DATA);
  header.set_shards(shards);
  const ReduceCall call = Call(run, shards);

  // Reduce-scatter: each owner gets this site's part of its shard piece by
  // piece, each read out of `buffer` once into its sender's scratch.
  // `buffer` is read until `contributions` is finished, so the result goes
  // to it only after that.
  std::vector<uint64_t> contribution_bytes;
  for (const std::string& p : run.peers)
    contribution_bytes.push_back(bytes_of(shard_of(index_of(p))).size());
  SenderSet contributions(run.peers, state_->clock, [&](const std::string& site) {
    Msg h = header;
    h.set_shard(index_of(site));
    const ShardRange shard = shard_of(h.shard());
    Payload scratch = state_->pool.Take(std::min<uint64_t>(kShardPieceBytes, shard.size() * es));
    absl::Status s;
    for (uint32_t i = 0; s.ok() && i < PieceCount(shard, es); ++i) {
      const ShardRange piece = PieceOf(shard, es, i);
      const absl::Span<uint8_t> bytes = absl::MakeSpan(scratch).subspan(0, piece.size() * es);
      h.set_piece(i);
      s = run.input->Read(piece.begin * es, bytes);
      if (s.ok()) s = links_->Send(site, h, bytes, &run.op->stop);
    }
    state_->pool.Recycle(std::move(scratch));
    return s;
  });

  // This site's shard, reduced a piece at a time in member order as soon as
  // every peer's part of that piece is here; each reduced piece goes to
  // every peer at once while the next is reduced.
  Payload result(own.size() * es);
  ReducedPieces reduced;
  Msg result_header = header;
  result_header.set_kind(Msg::REDUCE_RESULT);
  result_header.set_shard(mine);
  SenderSet results(run.peers, state_->clock, [&](const std::string& site) {
    Msg h = result_header;
    for (uint32_t i = 0; i < own_pieces; ++i) {
      if (!reduced.Await(i)) return absl::CancelledError("the shard's reduction failed");
      h.set_piece(i);
      const ShardRange piece = PieceOf(own, es, i);
      absl::Status s = links_->Send(
          site, h,
          absl::MakeSpan(result).subspan((piece.begin - own.begin) * es, piece.size() * es),
          &run.op->stop);
      if (!s.ok()) return s;
    }
    return absl::OkStatus();
  });
  ReduceOutcome out;
  {
    std::vector<float> acc;
    Payload scratch = state_->pool.Take(std::min<uint64_t>(kShardPieceBytes, own.size() * es));
    for (uint32_t i = 0; out.status.ok() && i < own_pieces; ++i) {
      const size_t first_part = out.taken.size();
      out.status = TakePieces(
          run, run.peers, Msg::REDUCE_DATA, call, [&](const std::string&) { return mine; }, i,
          &out);
      if (!out.status.ok()) break;
      const ShardRange piece = PieceOf(own, es, i);
      acc.resize(piece.size());
      bool first = true;
      for (const std::string& m : run.members) {
        if (m == local_site_) {
          const absl::Span<uint8_t> part = absl::MakeSpan(scratch).subspan(0, piece.size() * es);
          out.status = run.input->Read(piece.begin * es, part);
          if (!out.status.ok()) break;
          Accumulate(args.dtype, /*quantized=*/false, part, first, absl::MakeSpan(acc));
        } else {
          const size_t p = std::find(run.peers.begin(), run.peers.end(), m) - run.peers.begin();
          Accumulate(args.dtype, /*quantized=*/false, out.taken[first_part + p].payload, first,
                     absl::MakeSpan(acc));
        }
        first = false;
      }
      if (!out.status.ok()) break;
      Finish(args.dtype, args.op, run.members.size(), acc,
             absl::MakeSpan(result).subspan((piece.begin - own.begin) * es, piece.size() * es));
      // The parts are reduced: give their memory back now, not at the end.
      while (out.taken.size() > first_part) {
        out.released += out.taken.back().payload.size();
        state_->pool.Recycle(std::move(out.taken.back().payload));
        out.taken.pop_back();
      }
      reduced.Add();
    }
    state_->pool.Recycle(std::move(scratch));
  }
  if (!out.status.ok()) reduced.Fail();

  // All-gather: every other owner's result, piece i of each owner's shard
  // at a time; `placed` is where each taken piece goes.
  uint32_t most_pieces = 0;
  for (const std::string& p : run.peers) {
    most_pieces = std::max(most_pieces, PieceCount(shard_of(index_of(p)), es));
  }
  const size_t first_result = out.taken.size();
  std::vector<ShardRange> placed;
  std::vector<uint32_t> placed_shard;  // whose shard each taken piece is
  for (uint32_t i = 0; out.status.ok() && i < most_pieces; ++i) {
    std::vector<std::string> owners;
    for (const std::string& p : run.peers) {
      if (i < PieceCount(shard_of(index_of(p)), es)) owners.push_back(p);
    }
    out.status = TakePieces(run, owners, Msg::REDUCE_RESULT, call, index_of, i, &out);
    for (const std::string& p : owners) {
      placed.push_back(PieceOf(shard_of(index_of(p)), es, i));
      placed_shard.push_back(index_of(p));
    }
  }
  if (out.status.ok() && !run.peers.empty()) {
    // Each shard's final bytes, from its owner: pieces of one shard are
    // taken in order, so each shard's digest is fed its bytes in order.
    std::vector<StreamingDigest> digests(shards);
    digests[mine].Update(result);
    for (size_t j = 0; j < placed.size(); ++j)
      digests[placed_shard[j]].Update(out.taken[first_result + j].payload);
    out.digests.noun = "shard";
    out.digests.owners = run.members;
    for (const StreamingDigest& d : digests) out.digests.parts.push_back(d.Final());
  }
  if (!out.status.ok()) run.op->stop = true;
  CollectSends(run, contributions, contribution_bytes, &out);
  CollectSends(run, results, std::vector<uint64_t>(run.peers.size(), result.size()), &out);
  Settle(run, &out);
  if (out.status.ok()) {
    std::memcpy(bytes_of(own).data(), result.data(), result.size());
    for (size_t j = 0; j < placed.size(); ++j) {
      const Payload& piece = out.taken[first_result + j].payload;
      if (!piece.empty()) std::memcpy(bytes_of(placed[j]).data(), piece.data(), piece.size());
    }
  }
  state_->pool.Recycle(std::move(result));
  return out;
}

}  // namespace longhaul::exchange
