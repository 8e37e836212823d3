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
class Env;
class Status;
class WriteBatch;
}  // namespace rocksdb

namespace longhaul::storage {

// Column family names (part of the on-disk format; see README.md).
inline constexpr char kOutgoingCf[] = "outgoing";
inline constexpr char kIncomingCf[] = "incoming";
inline constexpr char kChunksCf[] = "chunks";
inline constexpr char kRequestsCf[] = "requests";
inline constexpr char kCountersCf[] = "counters";
inline constexpr char kPartialChunksCf[] = "partial_chunks";

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

// One chunk made durable at the destination, whole or (prefix_bytes > 0)
// only its first prefix_bytes bytes.
struct ChunkDurability {
  uint32_t file_index = 0;
  uint32_t chunk_index = 0;
  // A whole chunk: digest, size and generation. A partial one: only
  // chunk.generation is used.
  v1::DurableChunk chunk;
  // 0: the whole chunk is durable (a record of the `chunks` column family).
  // Otherwise the bytes [0, prefix_bytes) of the chunk are written and
  // synced and the rest is not (a record of `partial_chunks`).
  uint64_t prefix_bytes = 0;
};

struct JournalOptions {
  // Times synced writes; nullptr means RealClock::Get(). Must outlive the
  // Journal.
  const Clock* clock = nullptr;
  // Every file the journal touches goes through this Env (tests inject a
  // file system that fails); nullptr means rocksdb::Env::Default(). Must
  // outlive the Journal.
  rocksdb::Env* env = nullptr;
};

// What opening the journal dropped from one write-ahead log file: a torn or
// damaged record and, after damage, the records RocksDB's point-in-time
// recovery no longer replays. See "Journal failure modes" in README.md.
struct WalRecovery {
  std::string path;
  uint64_t records_recovered = 0;       // replayed from this file
  uint64_t intact_records_dropped = 0;  // checksums fine, not replayed
  uint64_t bytes_dropped = 0;           // from the end of the last replayed record
  // The first damaged byte and why it is damaged, in RocksDB's words
  // ("truncated record body", "checksum mismatch"...); unset when the file
  // is intact and only lost records after damage in an earlier file.
  std::optional<uint64_t> damage_offset;
  std::string damage;
  // The damage is the file's last record and nothing intact was dropped:
  // what a crash, a power loss or a full disk leaves of a write that did not
  // complete. A synced write is never torn.
  bool torn_tail = false;
};

// Bytes the state file system must have free before a journal that ran out
// of space tries to reopen (RocksDB flushes the replayed log on open).
inline constexpr uint64_t kJournalMinFreeBytesToReopen = 4u << 20;

// True if `status` is the error of a write refused because the journal is
// unwritable (Journal::writable()), as opposed to bad arguments or data.
bool IsJournalUnwritable(const absl::Status& status);

// Durable record of transfers: one RocksDB instance under a directory.
//
// Contract: a write that returns OK with sync (every Put* except
// PutOutgoing(sync=false), RecordDurableChunks, PutOutgoingWithRequest and
// all deletes) survives a crash or power loss. Get/List return what was
// written last. A value that does not parse yields absl::DataLossError
// naming the key. Transfer ids are non-empty and contain no NUL
// (InvalidArgument otherwise).
//
// A write that fails on the file system (disk full, I/O error) makes the
// journal unwritable: that write and every later one return the error of
// writable() (ResourceExhausted "state disk full at DIR (...)" or
// Unavailable "state disk error at DIR (...)"; IsJournalUnwritable() holds)
// while reads go on. A write on an unwritable journal first reopens the
// database if the file system has kJournalMinFreeBytesToReopen free (a
// disk-full error) or at once (any other error); reopening replays the log,
// so a write that failed may or may not be found afterwards. A reopen that
// fails leaves the journal closed and every call failing until one succeeds.
// Opening reports what the log's recovery dropped (wal_recoveries(), and a
// warning or error in the log naming the file); it never drops silently.
//
// Thread-safe: any method may be called from any thread concurrently.
// Returned protos are copies owned by the caller.
class Journal {
 public:
  // Opens (creating if missing) the database under `dir` and its column
  // families.
  static absl::StatusOr<std::unique_ptr<Journal>> Open(const std::string& dir,
                                                       const JournalOptions& options);
  // Same, with default options but `clock`.
  static absl::StatusOr<std::unique_ptr<Journal>> Open(const std::string& dir,
                                                       const Clock* clock = nullptr);
  ~Journal();
  Journal(const Journal&) = delete;
  Journal& operator=(const Journal&) = delete;

  // OK while writes can succeed; otherwise the error every write returns
  // (see the class comment) until a reopen succeeds.
  absl::Status writable() const;

  // What the last open or reopen dropped from the write-ahead log, one entry
  // per file that lost anything; empty after a clean start.
  std::vector<WalRecovery> wal_recoveries() const;

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
  // Records chunks, whole or partial, as durable in ONE synced WriteBatch.
  // A whole chunk's record also removes its partial record; a partial one
  // replaces the chunk's earlier partial record. Call only after the chunk
  // data is fdatasync'ed; acknowledge to the sender only after OK.
  absl::Status RecordDurableChunks(std::string_view transfer_id,
                                   absl::Span<const ChunkDurability> chunks);
  // The whole chunks (prefix_bytes 0) in (file_index, chunk_index) order;
  // never a partial one.
  absl::StatusOr<std::vector<ChunkDurability>> ListDurableChunks(std::string_view transfer_id);
  // The partial chunks (prefix_bytes > 0) in (file_index, chunk_index)
  // order. A chunk may have both records only after a crash between the
  // whole record's write and nothing else: the whole one counts.
  absl::StatusOr<std::vector<ChunkDurability>> ListPartialChunks(std::string_view transfer_id);
  // Synced: removes the partial record of one chunk, if any.
  absl::Status DeletePartialChunk(std::string_view transfer_id, uint32_t file_index,
                                  uint32_t chunk_index);
  // Synced range deletes, of whole and partial records alike.
  absl::Status DeleteChunks(std::string_view transfer_id);
  absl::Status DeleteFileChunks(std::string_view transfer_id, uint32_t file_index);

  JournalStats stats() const;

 private:
  class WalReplay;
  Journal(std::string dir, const JournalOptions& options);

  // Opens db_ and the handles, scanning the write-ahead log first to report
  // what recovery drops.
  absl::Status OpenDbLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(db_mu_);
  void CloseDbLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(db_mu_);
  // On an unwritable journal, reopens it when that can help (see the class
  // comment). Reads (`writing` false) reopen only a closed journal.
  void MaybeRecover(bool writing) ABSL_LOCKS_EXCLUDED(db_mu_);
  // OK, or writable()'s error when db_ is closed.
  absl::Status OpenedLocked() const ABSL_SHARED_LOCKS_REQUIRED(db_mu_);
  // Records `cause` as what makes the journal unwritable (the first cause
  // stays) and returns writable()'s error.
  absl::Status MarkUnwritable(const rocksdb::Status& cause, std::string_view what);
  // Writes `batch`; when `sync`, with WriteOptions.sync and timed into stats.
  // This and GetRawLocked need db_ open (OpenedLocked() OK).
  absl::Status WriteLocked(rocksdb::WriteBatch& batch, bool sync, std::string_view what)
      ABSL_SHARED_LOCKS_REQUIRED(db_mu_);
  absl::StatusOr<std::optional<std::string>> GetRawLocked(rocksdb::ColumnFamilyHandle* cf,
                                                          std::string_view key)
      ABSL_SHARED_LOCKS_REQUIRED(db_mu_);

  const std::string dir_;
  const Clock& clock_;
  rocksdb::Env* const env_;

  // Shared by every call, exclusive to (re)open and close.
  mutable absl::Mutex db_mu_;
  std::unique_ptr<rocksdb::DB> db_ ABSL_GUARDED_BY(db_mu_);
  // All opened handles (ours and any unknown ones found on disk); owned,
  // destroyed before db_.
  std::vector<rocksdb::ColumnFamilyHandle*> handles_ ABSL_GUARDED_BY(db_mu_);
  rocksdb::ColumnFamilyHandle* outgoing_ ABSL_GUARDED_BY(db_mu_) = nullptr;
  rocksdb::ColumnFamilyHandle* incoming_ ABSL_GUARDED_BY(db_mu_) = nullptr;
  rocksdb::ColumnFamilyHandle* chunks_ ABSL_GUARDED_BY(db_mu_) = nullptr;
  rocksdb::ColumnFamilyHandle* requests_ ABSL_GUARDED_BY(db_mu_) = nullptr;
  rocksdb::ColumnFamilyHandle* counters_ ABSL_GUARDED_BY(db_mu_) = nullptr;
  rocksdb::ColumnFamilyHandle* partial_chunks_ ABSL_GUARDED_BY(db_mu_) = nullptr;
  // ListDurableChunks and ListPartialChunks: the records of `cf` under the
  // transfer's prefix; partial values are v1::DurablePrefix.
  absl::StatusOr<std::vector<ChunkDurability>> ListChunksLocked(
      rocksdb::ColumnFamilyHandle* cf, const char* cf_name, std::string_view transfer_id,
      bool partial) ABSL_SHARED_LOCKS_REQUIRED(db_mu_);
  // Lives as long as the options that point at it.
  std::unique_ptr<WalReplay> wal_replay_ ABSL_GUARDED_BY(db_mu_);
  std::vector<WalRecovery> wal_recoveries_ ABSL_GUARDED_BY(db_mu_);

  mutable absl::Mutex error_mu_;
  absl::Status error_ ABSL_GUARDED_BY(error_mu_);

  mutable absl::Mutex stats_mu_;
  JournalStats stats_ ABSL_GUARDED_BY(stats_mu_);
};

}  // namespace longhaul::storage

#endif  // LONGHAUL_STORAGE_JOURNAL_H_
