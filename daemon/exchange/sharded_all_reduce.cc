// The sharded all-reduce (proto/EXCHANGE.md, All-reduce, Sharded): a
// reduce-scatter to each shard's owner, then an all-gather of the owners'
// final bytes, then the commit round the direct exchange runs too.

#include <algorithm>
#include <cstring>
#include <optional>
#include <utility>

#include "absl/functional/function_ref.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "daemon/exchange/operations.h"
#include "daemon/exchange/reduce.h"
#include "daemon/exchange/sender_set.h"
#include "daemon/exchange/shards.h"

namespace longhaul::exchange {

using Msg = v1::ExchangePeerMessage;

absl::Status Operations::CheckAll(const ReduceRun& run, const std::vector<std::string>& keys,
                                  const ReduceOutcome& out, const ReduceCall& call,
                                  absl::FunctionRef<uint32_t(size_t)> want_shard) {
  if (!out.status.ok()) return out.status;
  const size_t first = out.taken.size() - keys.size();
  for (size_t i = 0; i < keys.size(); ++i) {
    const Message& m = out.taken[first + i];
    absl::Status s =
        CheckShardMessage(run.what, run.peers[i], m.header, m.payload.size(), call, want_shard(i));
    if (!s.ok()) return s;
  }
  absl::MutexLock lock(&state_->mu);
  for (size_t i = 0; i < keys.size(); ++i) {
    if (state_->mailbox.Has(keys[i])) {
      return absl::InvalidArgumentError(
          absl::StrCat(run.what, ": ", run.peers[i], " sent its ",
                       Msg::Kind_Name(out.taken[first + i].header.kind()), " twice"));
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
  auto shard_bytes = [&](uint32_t k) {
    const ShardRange r = ShardOf(run.count, shards, k);
    return buffer.subspan(r.begin * es, r.size() * es);
  };
  const uint32_t mine = index_of(local_site_);
  Msg header = ReduceHeader(run, Msg::REDUCE_DATA);
  header.set_shards(shards);
  const ReduceCall call = Call(run, shards);

  // Reduce-scatter: each owner gets this site's part of its shard, read out
  // of `buffer` once, a segment at a time, into its sender's scratch.
  // `buffer` is read until `contributions` is finished, so the result goes
  // to it only after that.
  std::vector<uint64_t> contribution_bytes;
  for (const std::string& p : run.peers)
    contribution_bytes.push_back(shard_bytes(index_of(p)).size());
  SenderSet contributions(run.peers, state_->clock, [&](const std::string& site) {
    Msg h = header;
    h.set_shard(index_of(site));
    const absl::Span<uint8_t> part = shard_bytes(h.shard());
    const uint64_t begin = part.data() - buffer.data();
    Payload scratch = state_->pool.Take(std::min<uint64_t>(kSegmentBytes, part.size()));
    absl::Status s =
        links_->Send(site, h, part, &run.op->stop, Timestamp::Infinite(), nullptr,
                     [&](uint64_t offset, uint64_t n) -> absl::StatusOr<absl::Span<const uint8_t>> {
                       absl::Span<uint8_t> piece = absl::MakeSpan(scratch).subspan(0, n);
                       if (absl::Status r = run.input->Read(begin + offset, piece); !r.ok())
                         return r;
                       return piece;
                     });
    state_->pool.Recycle(std::move(scratch));
    return s;
  });
  std::vector<std::string> keys;
  for (const auto& p : run.peers) {
    keys.push_back(Mailbox::Key(args.group, Msg::REDUCE_DATA, p, run.seq_id));
  }
  ReduceOutcome out;
  out.status = AwaitAll(run, keys, &out.taken, &out.lost_peer);
  out.status = CheckAll(run, keys, out, call, [&](size_t) { return mine; });

  // Reduce this site's shard in member order, its own part included, as
  // soon as its parts are here; then send the result to every peer at once.
  Payload result;
  std::optional<SenderSet> results;
  std::vector<float> acc;
  if (out.status.ok()) {
    const absl::Span<uint8_t> own = shard_bytes(mine);
    const uint64_t own_begin = own.data() - buffer.data();
    acc.resize(own.size() / es);
    Payload scratch = state_->pool.Take(std::min<uint64_t>(kSegmentBytes, own.size()));
    bool first = true;
    for (const std::string& m : run.members) {
      if (m == local_site_) {
        // This site's part, read once into `scratch` a segment at a time.
        out.status = run.input->ReadPieces(
            own_begin, own.size(), absl::MakeSpan(scratch),
            [&](uint64_t offset, absl::Span<const uint8_t> piece) {
              Accumulate(args.dtype, /*quantized=*/false, piece, first,
                         absl::MakeSpan(acc).subspan((offset - own_begin) / es, piece.size() / es));
            });
      } else {
        const size_t i = std::find(run.peers.begin(), run.peers.end(), m) - run.peers.begin();
        Accumulate(args.dtype, /*quantized=*/false, out.taken[i].payload, first,
                   absl::MakeSpan(acc));
      }
      first = false;
    }
    state_->pool.Recycle(std::move(scratch));
  }
  if (out.status.ok()) {
    result.resize(shard_bytes(mine).size());
    Finish(args.dtype, args.op, run.members.size(), acc, absl::MakeSpan(result));
    Msg h = header;
    h.set_kind(Msg::REDUCE_RESULT);
    h.set_shard(mine);
    results.emplace(run.peers, state_->clock, [this, &run, &result, h](const std::string& site) {
      return links_->Send(site, h, result, &run.op->stop);
    });
  }

  // All-gather: every other owner's result.
  const size_t contributions_taken = out.taken.size();
  if (out.status.ok()) {
    keys.clear();
    for (const auto& p : run.peers) {
      keys.push_back(Mailbox::Key(args.group, Msg::REDUCE_RESULT, p, run.seq_id));
    }
    out.status = AwaitAll(run, keys, &out.taken, &out.lost_peer);
    out.status = CheckAll(run, keys, out, call, [&](size_t i) { return index_of(run.peers[i]); });
  }
  if (!out.status.ok()) run.op->stop = true;
  CollectSends(run, contributions, contribution_bytes, &out);
  if (results) {
    CollectSends(run, *results, std::vector<uint64_t>(run.peers.size(), result.size()), &out);
  }
  Settle(run, &out);
  if (out.status.ok()) {
    auto place = [&](uint32_t k, const Payload& bytes) {
      if (!bytes.empty()) std::memcpy(shard_bytes(k).data(), bytes.data(), bytes.size());
    };
    place(mine, result);
    for (size_t i = 0; i < run.peers.size(); ++i) {
      place(index_of(run.peers[i]), out.taken[contributions_taken + i].payload);
    }
  }
  state_->pool.Recycle(std::move(result));
  return out;
}

}  // namespace longhaul::exchange
