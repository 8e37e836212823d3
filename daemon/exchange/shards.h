#ifndef LONGHAUL_DAEMON_EXCHANGE_SHARDS_H_
#define LONGHAUL_DAEMON_EXCHANGE_SHARDS_H_

// How an all-reduce is cut into shards, and the checks every member makes
// of a peer's REDUCE_DATA or REDUCE_RESULT header before it uses the payload
// (proto/EXCHANGE.md, All-reduce). Pure functions: no threads, no I/O, so
// the exchange_peer fuzz target runs them on what a peer sends.

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "longhaul/v1/exchange.pb.h"

namespace longhaul::exchange {

// Elements [begin, end) of a buffer.
struct ShardRange {
  uint64_t begin = 0;
  uint64_t end = 0;
  uint64_t size() const { return end - begin; }
};

// Shard `k` of `shards` (> 0, k < shards) over `count` elements:
// [k * count / shards, (k + 1) * count / shards). The shards are contiguous,
// in order, cover every element, and differ in size by at most one; a shard
// is empty when count < shards.
ShardRange ShardOf(uint64_t count, uint32_t shards, uint32_t k);

// A shard travels as pieces of at most kShardPieceBytes of whole elements
// (the last may be shorter), each its own message, so that its owner
// reduces and forwards one piece while the next is still on the wire.
inline constexpr uint64_t kShardPieceBytes = 1ull << 20;

// The pieces of `shard` in elements of `element_size` (> 0) bytes: at least
// one, as an empty shard is one empty piece.
uint32_t PieceCount(const ShardRange& shard, size_t element_size);

// Piece `i` (< PieceCount) of `shard`, in elements of the whole buffer.
ShardRange PieceOf(const ShardRange& shard, size_t element_size, uint32_t i);

// Whether an all-reduce of `members` sites runs sharded (reduce-scatter,
// then all-gather) rather than as the direct all-to-all exchange: from three
// members on, and never with int8 quantization (its error bound is that of
// the direct exchange).
bool RunsSharded(size_t members, bool quantized);

// What an all-reduce call expects every peer's message of its op to carry.
struct ReduceCall {
  uint64_t generation = 0;
  v1::ExchangeDType dtype = v1::FLOAT32;
  v1::ReduceOp op = v1::SUM;
  uint64_t count = 0;  // elements of the whole buffer
  bool quantized = false;
  std::string tag;
  uint32_t shards = 0;  // 0: the direct exchange
};

// Checks the header `h` that `from` sent for the op `what` against `call`:
// Unavailable (retry) for another generation, FailedPrecondition for any
// other field that differs, the number of shards included.
absl::Status CheckReduceHeader(const std::string& what, const std::string& from,
                               const v1::ExchangePeerMessage& h, const ReduceCall& call);

// Checks a sharded REDUCE_DATA or REDUCE_RESULT from `from` with
// `payload_bytes` of payload: CheckReduceHeader, then that it holds piece
// `want_piece` of shard `want_shard` (a contribution: the receiver's own
// shard; a result: the shard its sender owns) and exactly that piece's bytes
// in call.dtype (InvalidArgument).
absl::Status CheckShardMessage(const std::string& what, const std::string& from,
                               const v1::ExchangePeerMessage& h, uint64_t payload_bytes,
                               const ReduceCall& call, uint32_t want_shard, uint32_t want_piece);

}  // namespace longhaul::exchange

#endif  // LONGHAUL_DAEMON_EXCHANGE_SHARDS_H_
