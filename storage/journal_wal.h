// Internal to storage/: reads the journal's RocksDB write-ahead log files on
// its own, so that opening the journal can say what recovery dropped. Not
// part of the module's interface.
#ifndef LONGHAUL_STORAGE_JOURNAL_WAL_H_
#define LONGHAUL_STORAGE_JOURNAL_WAL_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "storage/journal.h"

namespace rocksdb {
class Env;
}  // namespace rocksdb

namespace longhaul::storage::internal {

// One logical record of a WAL (a RocksDB WriteBatch) whose fragments all
// passed their checksums.
struct WalBatch {
  uint64_t offset = 0;    // of the header of its first fragment
  uint64_t end = 0;       // one past its last byte
  uint64_t sequence = 0;  // of its first entry
  uint32_t count = 0;     // entries
};

// What a scan of one WAL file found.
struct WalScan {
  std::string path;
  uint64_t number = 0;  // the log number, from the name NNNNNN.log
  uint64_t size = 0;
  std::vector<WalBatch> batches;  // in file order
  // The first damaged byte and why, in the words RocksDB's reader reports.
  std::optional<uint64_t> damage_offset;
  std::string damage;
};

// The WAL files (NNNNNN.log) in `dir`, as (number, path), by number. A
// missing directory has none.
absl::StatusOr<std::vector<std::pair<uint64_t, std::string>>> ListWals(rocksdb::Env& env,
                                                                       const std::string& dir);

// Reads the WAL at `path` through `env`. The format is RocksDB's legacy log
// format (db/log_format.h, RocksDB 7.8): 32 KiB blocks of fragments with a
// 7-byte header (masked CRC32C of type and payload, little-endian length,
// type). The journal enables neither recycled logs nor WAL compression, so
// other record types count as damage. After a fragment with a bad checksum
// the scan goes on past it by its length, so that intact records after the
// damage are counted; RocksDB's reader drops the rest of the block instead.
absl::StatusOr<WalScan> ScanWal(rocksdb::Env& env, const std::string& path, uint64_t number);

// What recovery dropped from `scan`, given the sequence numbers of the
// batches RocksDB replayed from it; nullopt if it dropped nothing.
std::optional<WalRecovery> DroppedFrom(const WalScan& scan,
                                       const absl::flat_hash_set<uint64_t>& replayed);

// One line for the daemon's log: the file, the damage, what was kept and what
// was dropped.
std::string Describe(const WalRecovery& recovery);

// CRC-32C (Castagnoli) of `n` bytes, as RocksDB's crc32c::Value.
uint32_t Crc32c(const char* data, size_t n);

}  // namespace longhaul::storage::internal

#endif  // LONGHAUL_STORAGE_JOURNAL_WAL_H_
