// Internal to the Receiver's files (receiver*.cc): the per-transfer Session
// and the helpers those files share. Nothing outside the Receiver includes it.
#ifndef LONGHAUL_DAEMON_PEER_RECEIVER_SESSION_H_
#define LONGHAUL_DAEMON_PEER_RECEIVER_SESSION_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "daemon/peer/receiver.h"
#include "daemon/transport/channel_registry.h"
#include "storage/chunk_plan.h"
#include "storage/journal.h"
#include "storage/staging.h"

namespace longhaul::peer {
namespace receiver_internal {

// InvalidArgument unless `id` can name a staging directory: one short path
// component.
inline absl::Status CheckTransferId(const std::string& id) {
  if (id.empty() || id.size() > 128 || id == "." || id == ".." ||
      id.find_first_of("/\\") != std::string::npos || id.find('\0') != std::string::npos) {
    return absl::InvalidArgumentError("transfer id must be a short single path component");
  }
  return absl::OkStatus();
}

// The directory part of an export-relative path ("" at the export's root).
inline std::string ParentOf(const std::string& relative) {
  const size_t slash = relative.rfind('/');
  return slash == std::string::npos ? "" : relative.substr(0, slash);
}

}  // namespace receiver_internal

// One incoming transfer while its peer has channels open. The record and the
// durable set mirror the journal; staging is open while receiving.
struct Receiver::Session {
  absl::Mutex mu;
  v1::IncomingTransfer record ABSL_GUARDED_BY(mu);
  storage::ResolvedDestination dest ABSL_GUARDED_BY(mu);
  std::optional<storage::Staging> staging ABSL_GUARDED_BY(mu);
  // Chunks journaled durable, each with the number of the write that made
  // it so: a chunk written again gets a new number.
  absl::flat_hash_map<storage::ChunkId, uint64_t> durable ABSL_GUARDED_BY(mu);
  // The digest each chunk of `durable` was acknowledged with (a relay sends it on).
  absl::flat_hash_map<storage::ChunkId, storage::Xxh128> durable_digests ABSL_GUARDED_BY(mu);
  uint64_t writes ABSL_GUARDED_BY(mu) = 0;
  // Chunks read back and found matching since, with the number of the write
  // they were read back after. A chunk counts as checked only while that is
  // still its number in `durable`.
  absl::flat_hash_map<storage::ChunkId, uint64_t> read_back ABSL_GUARDED_BY(mu);
  // Chunks of which a prefix is durable: its length.
  absl::flat_hash_map<storage::ChunkId, uint64_t> partial ABSL_GUARDED_BY(mu);
  // The sender takes CHUNK_PROGRESS and resumes inside chunks
  // (OpenRequest.durable_pieces).
  bool durable_pieces ABSL_GUARDED_BY(mu) = false;
  // The DATA channels serving this transfer. Added to only with mu held.
  transport::ChannelRegistry data_channels;
  // Counts DrainDataChannels calls: a stream waiting with mu released (for
  // an owner digest) gives up when it moves.
  uint64_t drains ABSL_GUARDED_BY(mu) = 0;

  // Fan-out: the digest of each chunk as the owner read it from its source
  // (ProgressRequest.digests), with the generation it is of. A relayed
  // chunk is taken only when its bytes hash to this; kept across opens, as
  // a generation names the same bytes in each.
  struct OwnerDigest {
    uint32_t generation = 0;
    storage::Xxh128 xxh128;
  };
  absl::flat_hash_map<storage::ChunkId, OwnerDigest> owner_digests ABSL_GUARDED_BY(mu);
  // Relayed chunks whose frame waits for the owner's digest.
  absl::flat_hash_set<storage::ChunkId> awaiting_digests ABSL_GUARDED_BY(mu);
  // The relay that delivered a chunk not matching the owner's digest, and
  // why: it is refused until the owner opens naming another relay or none.
  std::string refused_relay ABSL_GUARDED_BY(mu);
  std::string relay_refused ABSL_GUARDED_BY(mu);

  // Stops the data channels of an older attempt and waits until they are
  // gone, so staging fds are not in use while files change underneath.
  // Waits with mu released (a channel's thread may need it before it lets
  // go) and returns with mu held and no data channel registered; one that
  // registered while mu was released is aborted too.
  void DrainDataChannels() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    ++drains;
    while (true) {
      data_channels.AbortAll();
      if (data_channels.empty()) return;
      mu.Unlock();
      data_channels.WaitUntilEmpty();
      mu.Lock();
    }
  }
};

}  // namespace longhaul::peer

#endif  // LONGHAUL_DAEMON_PEER_RECEIVER_SESSION_H_
