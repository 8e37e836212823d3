#ifndef LONGHAUL_DAEMON_PEER_DURABILITY_COMMITTER_H_
#define LONGHAUL_DAEMON_PEER_DURABILITY_COMMITTER_H_

#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "storage/file_system.h"
#include "storage/journal.h"

namespace longhaul::peer {

// Group commit for received chunks and durable pieces of chunks. Stream
// threads hand in chunks (or a chunk's durable prefix, prefix_bytes > 0)
// whose bytes are already written to a staged file; one thread syncs the
// data of every distinct file of the waiting group once (File::SyncData),
// records the whole group in the journal with synced WriteBatches (whole and
// partial records alike), and only then releases the waiters, who
// acknowledge or report progress.
// Batching lets 8 streams share one fdatasync and one journal sync.
//
// Thread-safe. The files must stay open until MakeDurable returns.
class DurabilityCommitter {
 public:
  explicit DurabilityCommitter(storage::Journal& journal);
  ~DurabilityCommitter();

  // Blocks until the chunk (or its prefix) is durable and journaled, or
  // returns the error that prevented it (then it must not be acknowledged).
  absl::Status MakeDurable(storage::File& file, const std::string& transfer_id,
                           const storage::ChunkDurability& chunk);

 private:
  struct Request {
    storage::File* file;
    const std::string* transfer_id;
    const storage::ChunkDurability* chunk;
    absl::Status result;
    bool done = false;
  };
  void Run();

  storage::Journal& journal_;
  absl::Mutex mu_;
  std::vector<Request*> pending_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace longhaul::peer

#endif  // LONGHAUL_DAEMON_PEER_DURABILITY_COMMITTER_H_
