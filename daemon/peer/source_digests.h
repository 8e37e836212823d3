#ifndef LONGHAUL_DAEMON_PEER_SOURCE_DIGESTS_H_
#define LONGHAUL_DAEMON_PEER_SOURCE_DIGESTS_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <tuple>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "storage/chunk_io.h"

namespace longhaul::peer {

// Fan-out: the digests of a transfer's chunks as its source read them,
// shared by the legs of the transfer (daemon::FanoutSender). A leg that reads
// chunks from the source files records each digest here; a relayed leg hands
// them to its destination over its own session (ProgressRequest.digests),
// which takes a chunk from the relay only when it matches. An append-only
// log, so each relayed leg keeps its own position in it.
//
// Thread-safe.
class SourceDigests {
 public:
  struct Entry {
    uint32_t file_index = 0;
    uint32_t chunk_index = 0;
    uint32_t generation = 0;
    storage::Xxh128 xxh128;
  };

  // Records `entry`; a chunk already recorded at that generation keeps its
  // first digest (the source is checked unchanged around every read).
  void Add(const Entry& entry);
  // The digest of that chunk at that generation, if recorded.
  std::optional<storage::Xxh128> Find(uint32_t file_index, uint32_t chunk_index,
                                      uint32_t generation) const;
  // The entries recorded at positions [from, from + max), in order.
  std::vector<Entry> Since(size_t from, size_t max) const;
  // How many entries are recorded.
  size_t size() const;
  // Returns once more than `known` entries are recorded, or after `timeout`.
  void WaitForMore(size_t known, absl::Duration timeout) const;

 private:
  using Key = std::tuple<uint32_t, uint32_t, uint32_t>;  // file, chunk, generation

  mutable absl::Mutex mu_;
  std::vector<Entry> log_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<Key, size_t> positions_ ABSL_GUARDED_BY(mu_);
};

}  // namespace longhaul::peer

#endif  // LONGHAUL_DAEMON_PEER_SOURCE_DIGESTS_H_
