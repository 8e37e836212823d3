#include "daemon/exchange/shards.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/check.h"
#include "daemon/exchange/reduce.h"

namespace longhaul::exchange {

using Msg = v1::ExchangePeerMessage;

ShardRange ShardOf(uint64_t count, uint32_t shards, uint32_t k) {
  LONGHAUL_CHECK(shards > 0 && k < shards) << "shard " << k << " of " << shards;
  // 128 bits: k * count must not wrap, whatever count a caller passes.
  using Wide = unsigned __int128;
  return {static_cast<uint64_t>(Wide{k} * count / shards),
          static_cast<uint64_t>(Wide{k + 1ull} * count / shards)};
}

namespace {
uint64_t PieceElements(size_t element_size) { return kShardPieceBytes / element_size; }
}  // namespace

uint32_t PieceCount(const ShardRange& shard, size_t element_size) {
  const uint64_t per_piece = PieceElements(element_size);
  return static_cast<uint32_t>(std::max<uint64_t>(1, (shard.size() + per_piece - 1) / per_piece));
}

ShardRange PieceOf(const ShardRange& shard, size_t element_size, uint32_t i) {
  LONGHAUL_CHECK(i < PieceCount(shard, element_size)) << "piece " << i;
  const uint64_t per_piece = PieceElements(element_size);
  const uint64_t begin = shard.begin + i * per_piece;
  return {begin, std::min(shard.end, begin + per_piece)};
}

bool RunsSharded(size_t members, bool quantized) { return members >= 3 && !quantized; }

absl::Status CheckReduceHeader(const std::string& what, const std::string& from, const Msg& h,
                               const ReduceCall& call) {
  if (h.generation() != call.generation) {
    return absl::UnavailableError(absl::StrCat(what, ": ", from, " ran it at generation ",
                                               h.generation(), ", this site at ", call.generation,
                                               "; retry"));
  }
  if (h.count() != call.count || h.dtype() != call.dtype || h.quantized() != call.quantized ||
      h.op() != call.op || h.tag() != call.tag) {
    return absl::FailedPreconditionError(absl::StrCat(
        what, ": ", from, " passed ", h.count(), " ", v1::ExchangeDType_Name(h.dtype()), " ",
        v1::ReduceOp_Name(h.op()), h.quantized() ? " int8" : "", " tag '", h.tag(), "', this site ",
        call.count, " ", v1::ExchangeDType_Name(call.dtype), " ", v1::ReduceOp_Name(call.op),
        call.quantized ? " int8" : "", " tag '", call.tag, "'"));
  }
  if (h.shards() != call.shards) {
    return absl::FailedPreconditionError(absl::StrCat(what, ": ", from, " cut it into ", h.shards(),
                                                      " shards, this site into ", call.shards,
                                                      " (0: not sharded)"));
  }
  return absl::OkStatus();
}

absl::Status CheckShardMessage(const std::string& what, const std::string& from, const Msg& h,
                               uint64_t payload_bytes, const ReduceCall& call, uint32_t want_shard,
                               uint32_t want_piece) {
  if (absl::Status s = CheckReduceHeader(what, from, h, call); !s.ok()) return s;
  const char* kind = h.kind() == Msg::REDUCE_RESULT ? "result" : "contribution";
  if (h.shard() != want_shard) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", from, " sent a ", kind,
                                                   " for shard ", h.shard(), ", expected shard ",
                                                   want_shard, " of ", call.shards));
  }
  const size_t es = ElementSize(call.dtype);
  const ShardRange shard = ShardOf(call.count, call.shards, want_shard);
  if (h.piece() != want_piece) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": ", from, " sent piece ", h.piece(), " of shard ", want_shard, "'s ",
                     kind, ", expected piece ", want_piece, " of ", PieceCount(shard, es)));
  }
  const uint64_t want = PieceOf(shard, es, want_piece).size() * es;
  if (payload_bytes != want) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", from, " sent a ", kind, " of ",
                                                   payload_bytes, " bytes for piece ", want_piece,
                                                   " of shard ", want_shard, ", which has ", want));
  }
  return absl::OkStatus();
}

}  // namespace longhaul::exchange
