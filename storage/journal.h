// Journal: the daemon's durable record of transfers, in RocksDB.
// The format (column families, keys, values, state machines) is described in
// storage/README.md.
#ifndef LONGHAUL_STORAGE_JOURNAL_H_
#define LONGHAUL_STORAGE_JOURNAL_H_

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "common/clock.h"
#include "longhaul/v1/journal.pb.h"

namespace rocksdb {
class ColumnFamilyHandle;
class DB;
class WriteBatch;
}  // namespace rocksdb

namespace longhaul::storage {

// Column family names (part of the on-disk format; see README.md).
inline constexpr char kOutgoingCf[] = "outgoing";
inline constexpr char kIncomingCf[] = "incoming";
inline constexpr char kChunksCf[] = "chunks";
inline constexpr char kRequestsCf[] = "requests";
inline constexpr char kCountersCf[] = "counters";

// Key of a chunk record: transfer_id, '\0', big-endian file_index,
// big-endian chunk_index. Exposed for tests and tools.
std::string ChunkKey(std::string_view transfer_id, uint32_t file_index, uint32_t chunk_index);

// Upper bounds of the synced-write latency buckets in JournalStats.
inline constexpr std::array<uint64_t, 12> kJournalLatencyBoundsUs = {
    100, 250, 500, 1000, 2500, 5000, 10000, 25000, 50000, 100000, 250000, 1000000};

// Latency of the synced (durability-acknowledging) writes, for metrics.
struct JournalStats {
  uint64_t synced_writes = 0;
  uint64_t synced_total_us = 0;
  uint64_t synced_max_us = 0;
  // synced_buckets[i]: writes that took at most kJournalLatencyBoundsUs[i]
  // and more than the bound before (not cumulative); the last entry counts
  // the writes slower than every bound.
  std::array<uint64_t, kJournalLatencyBoundsUs.size() + 1> synced_buckets{};
};

// One chunk made durable at the destination.
struct ChunkDurability {
  uint32_t file_index = 0;
  uint32_t chunk_index = 0;
  v1::DurableChunk chunk;
};

// Durable record of transfers: one RocksDB instance under a directory.
//
// Contract: a write that returns OK with sync (every Put* except
// PutOutgoing(sync=false), RecordDurableChunks, PutOutgoingWithRequest and
// all deletes) survives a crash or power loss. Get/List return what was
// written last. A value that does not parse yields absl::DataLossError
// naming the key. Transfer ids are non-empty and contain no NUL
// (InvalidArgument otherwise).
//
// Thread-safe: any method may be called from any thread concurrently.
// Returned protos are copies owned by the caller.
class Journal {
 public:
  // Opens (creating if missing) the database under `dir` and its column
  // families. `clock` times synced writes; nullptr means RealClock::Get().
  // The clock, if given, must outlive the Journal.
  static absl::StatusOr<std::unique_ptr<Journal>> Open(const std::string& dir,
                                                       const Clock* clock = nullptr);
  ~Journal();
  Journal(const Journal&) = delete;
  Journal& operator=(const Journal&) = delete;

  // --- Source side ---------------------------------------------------------
  absl::Status PutOutgoing(const v1::OutgoingTransfer& transfer, bool sync);
  absl::StatusOr<std::optional<v1::OutgoingTransfer>> GetOutgoing(std::string_view id);
  // In key (transfer id) order.
  absl::StatusOr<std::vector<v1::OutgoingTransfer>> ListOutgoing();
  // Also removes the transfer's counters and request-id mapping.
  absl::Status DeleteOutgoing(std::string_view id);
  // One synced batch: the record and request_id -> transfer.id(), so a
  // retried Submit with the same request id finds the transfer.
  absl::Status PutOutgoingWithRequest(const v1::OutgoingTransfer& transfer,
                                      std::string_view request_id);
  // The transfer id recorded for `request_id`, if any.
  absl::StatusOr<std::optional<std::string>> LookupRequest(std::string_view request_id);

  // Counters written before every chunk leaves (unsynced: they need only
  // survive a process crash, which unsynced RocksDB writes do).
  absl::Status PutOutgoingCounters(std::string_view id, const v1::OutgoingCounters& counters);
  absl::StatusOr<std::optional<v1::OutgoingCounters>> GetOutgoingCounters(std::string_view id);

  // --- Destination side ----------------------------------------------------
  // Always synced.
  absl::Status PutIncoming(const v1::IncomingTransfer& transfer);
  absl::StatusOr<std::optional<v1::IncomingTransfer>> GetIncoming(std::string_view id);
  absl::StatusOr<std::vector<v1::IncomingTransfer>> ListIncoming();
  absl::Status DeleteIncoming(std::string_view id);

  using ChunkDurability = storage::ChunkDurability;
  // Records chunks as durable in ONE synced WriteBatch. Call only after the
  // chunk data is fdatasync'ed; acknowledge to the sender only after OK.
  absl::Status RecordDurableChunks(std::string_view transfer_id,
                                   absl::Span<const ChunkDurability> chunks);
  // In (file_index, chunk_index) order.
  absl::StatusOr<std::vector<ChunkDurability>> ListDurableChunks(std::string_view transfer_id);
  // Synced range deletes.
  absl::Status DeleteChunks(std::string_view transfer_id);
  absl::Status DeleteFileChunks(std::string_view transfer_id, uint32_t file_index);

  JournalStats stats() const;

 private:
  Journal(std::unique_ptr<rocksdb::DB> db, std::vector<rocksdb::ColumnFamilyHandle*> handles,
          const Clock& clock, std::string dir);
  // Writes `batch`; when `sync`, with WriteOptions.sync and timed into stats.
  absl::Status Write(rocksdb::WriteBatch& batch, bool sync, std::string_view what);
  absl::StatusOr<std::optional<std::string>> GetRaw(rocksdb::ColumnFamilyHandle* cf,
                                                    std::string_view key);

  const std::string dir_;
  const Clock& clock_;
  std::unique_ptr<rocksdb::DB> db_;
  // All opened handles (ours and any unknown ones found on disk); owned,
  // destroyed before db_.
  std::vector<rocksdb::ColumnFamilyHandle*> handles_;
  rocksdb::ColumnFamilyHandle* outgoing_ = nullptr;
  rocksdb::ColumnFamilyHandle* incoming_ = nullptr;
  rocksdb::ColumnFamilyHandle* chunks_ = nullptr;
  rocksdb::ColumnFamilyHandle* requests_ = nullptr;
  rocksdb::ColumnFamilyHandle* counters_ = nullptr;

  mutable absl::Mutex stats_mu_;
  JournalStats stats_ ABSL_GUARDED_BY(stats_mu_);
};

}  // namespace longhaul::storage

#endif  // LONGHAUL_STORAGE_JOURNAL_H_
