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
#include "daemon/transport/transport.h"
#include "storage/journal.h"
#include "storage/staging.h"

namespace longhaul::peer {
namespace receiver_internal {

// The key of a chunk in Session::durable, read_back and partial.
inline uint64_t ChunkKey(uint32_t file_index, uint32_t chunk_index) {
  return (static_cast<uint64_t>(file_index) << 32) | chunk_index;
}

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
  // Chunks journaled durable (ChunkKey), each with the number of the write
  // that made it so: a chunk written again gets a new number.
  absl::flat_hash_map<uint64_t, uint64_t> durable ABSL_GUARDED_BY(mu);
  uint64_t writes ABSL_GUARDED_BY(mu) = 0;
  // Chunks read back and found matching since, with the number of the write
  // they were read back after. A chunk counts as checked only while that is
  // still its number in `durable`.
  absl::flat_hash_map<uint64_t, uint64_t> read_back ABSL_GUARDED_BY(mu);
  // Chunks of which a prefix is durable: its length, by chunk key.
  absl::flat_hash_map<uint64_t, uint64_t> partial ABSL_GUARDED_BY(mu);
  // The sender takes CHUNK_PROGRESS and resumes inside chunks
  // (OpenRequest.durable_pieces).
  bool durable_pieces ABSL_GUARDED_BY(mu) = false;
  absl::flat_hash_set<transport::Channel*> data_channels ABSL_GUARDED_BY(mu);

  // Stops the data channels of an older attempt and waits until they are
  // gone, so staging fds are not in use while files change underneath.
  void DrainDataChannels() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    for (transport::Channel* c : data_channels) c->Abort();
    mu.Await(absl::Condition(
        +[](Session* s) ABSL_NO_THREAD_SAFETY_ANALYSIS { return s->data_channels.empty(); }, this));
  }
};

}  // namespace longhaul::peer

#endif  // LONGHAUL_DAEMON_PEER_RECEIVER_SESSION_H_
