#include "storage/journal_wal.h"

#include <algorithm>
#include <memory>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "boost/crc.hpp"
#include "rocksdb/env.h"

namespace longhaul::storage::internal {
namespace {

// db/log_format.h of RocksDB 7.8.
constexpr uint64_t kBlockSize = 32768;
constexpr size_t kHeaderSize = 4 + 2 + 1;
enum RecordType : uint8_t {
  kZeroType = 0,
  kFullType = 1,
  kFirstType = 2,
  kMiddleType = 3,
  kLastType = 4
};
// util/crc32c.h: stored CRCs are masked, since a CRC of data that embeds CRCs
// is weak.
constexpr uint32_t kMaskDelta = 0xa282ead8u;
// db/write_batch.cc: sequence (fixed64) and count (fixed32) lead every batch.
constexpr size_t kBatchHeaderSize = 12;

uint32_t Unmask(uint32_t masked) {
  uint32_t rot = masked - kMaskDelta;
  return (rot >> 17) | (rot << 15);
}

uint32_t DecodeFixed32(const char* p) {
  auto b = [p](int i) { return static_cast<uint32_t>(static_cast<uint8_t>(p[i])); };
  return b(0) | (b(1) << 8) | (b(2) << 16) | (b(3) << 24);
}

uint64_t DecodeFixed64(const char* p) {
  return static_cast<uint64_t>(DecodeFixed32(p)) |
         (static_cast<uint64_t>(DecodeFixed32(p + 4)) << 32);
}


// Assembles fragments into batches, block by block, the way RocksDB's
// log::Reader does in point-in-time recovery mode.
class Scanner {
 public:
  explicit Scanner(WalScan& scan) : scan_(scan) {}

  void Block(uint64_t block_start, const char* data, size_t len, bool last) {
    size_t pos = 0;
    while (true) {
      const size_t left = len - pos;
      const uint64_t offset = block_start + pos;
      if (left < kHeaderSize) {
        // A block ends in zero padding when a header no longer fits; the
        // file's last block ending so means a header was cut short.
        if (last && left > 0) Damage(offset, "truncated header");
        return;
      }
      const char* header = data + pos;
      const size_t length = static_cast<uint8_t>(header[4]) |
                            (static_cast<size_t>(static_cast<uint8_t>(header[5])) << 8);
      const uint8_t type = static_cast<uint8_t>(header[6]);
      // Damage inside a fragmented record is reported where that record
      // starts: all of it is lost.
      const uint64_t damaged_at = in_record_ ? record_offset_ : offset;
      if (kHeaderSize + length > left) {
        Damage(damaged_at, last ? "truncated record body" : "bad record length");
        in_record_ = false;
        return;
      }
      if (type == kZeroType && length == 0) {
        // Preallocated, never written: RocksDB skips the rest of the block.
        if (in_record_) Damage(record_offset_, "error in middle of record");
        in_record_ = false;
        return;
      }
      pos += kHeaderSize + length;
      if (Unmask(DecodeFixed32(header)) != Crc32c(header + 6, 1 + length)) {
        Damage(damaged_at, "checksum mismatch");
        in_record_ = false;
        continue;
      }
      const char* payload = header + kHeaderSize;
      const uint64_t end = offset + kHeaderSize + length;
      switch (type) {
        case kFullType:
          if (in_record_) Damage(record_offset_, "partial record without end(1)");
          in_record_ = false;
          Batch(offset, end, payload, length);
          break;
        case kFirstType:
          if (in_record_) Damage(record_offset_, "partial record without end(2)");
          in_record_ = true;
          record_offset_ = offset;
          record_.assign(payload, length);
          break;
        case kMiddleType:
          if (!in_record_) {
            Damage(offset, "missing start of fragmented record(1)");
          } else {
            record_.append(payload, length);
          }
          break;
        case kLastType:
          if (!in_record_) {
            Damage(offset, "missing start of fragmented record(2)");
          } else {
            record_.append(payload, length);
            in_record_ = false;
            Batch(record_offset_, end, record_.data(), record_.size());
          }
          break;
        default:
          Damage(damaged_at, absl::StrCat("unknown record type ", type));
          in_record_ = false;
          break;
      }
    }
  }

  void End() {
    if (in_record_) Damage(record_offset_, "error reading trailing data");
    in_record_ = false;
  }

 private:
  void Damage(uint64_t offset, std::string reason) {
    if (scan_.damage_offset.has_value()) return;
    scan_.damage_offset = offset;
    scan_.damage = std::move(reason);
  }

  void Batch(uint64_t offset, uint64_t end, const char* data, size_t size) {
    if (size < kBatchHeaderSize) {
      Damage(offset, "log record too small");
      return;
    }
    scan_.batches.push_back({offset, end, DecodeFixed64(data), DecodeFixed32(data + 8)});
  }

  WalScan& scan_;
  bool in_record_ = false;
  uint64_t record_offset_ = 0;
  std::string record_;
};

}  // namespace

uint32_t Crc32c(const char* data, size_t n) {
  // CRC-32C (Castagnoli), reflected, as RocksDB's util/crc32c.
  boost::crc_optimal<32, 0x1EDC6F41, 0xFFFFFFFF, 0xFFFFFFFF, true, true> crc;
  crc.process_bytes(data, n);
  return crc.checksum();
}

absl::StatusOr<std::vector<std::pair<uint64_t, std::string>>> ListWals(rocksdb::Env& env,
                                                                       const std::string& dir) {
  std::vector<std::pair<uint64_t, std::string>> wals;
  if (!env.FileExists(dir).ok()) return wals;
  std::vector<std::string> children;
  rocksdb::Status s = env.GetChildren(dir, &children);
  if (!s.ok()) return absl::UnavailableError(absl::StrCat("list ", dir, ": ", s.ToString()));
  constexpr std::string_view kSuffix = ".log";
  for (const std::string& name : children) {
    if (name.size() <= kSuffix.size() ||
        name.compare(name.size() - kSuffix.size(), kSuffix.size(), kSuffix) != 0) {
      continue;
    }
    const std::string digits = name.substr(0, name.size() - kSuffix.size());
    uint64_t number = 0;
    if (!std::all_of(digits.begin(), digits.end(), absl::ascii_isdigit) ||
        !absl::SimpleAtoi(digits, &number)) {
      continue;
    }
    wals.emplace_back(number, absl::StrCat(dir, "/", name));
  }
  std::sort(wals.begin(), wals.end());
  return wals;
}

absl::StatusOr<WalScan> ScanWal(rocksdb::Env& env, const std::string& path, uint64_t number) {
  WalScan scan;
  scan.path = path;
  scan.number = number;
  rocksdb::Status s = env.GetFileSize(path, &scan.size);
  std::unique_ptr<rocksdb::SequentialFile> file;
  if (s.ok()) s = env.NewSequentialFile(path, &file, rocksdb::EnvOptions());
  if (!s.ok()) return absl::UnavailableError(absl::StrCat("read ", path, ": ", s.ToString()));
  Scanner scanner(scan);
  std::string scratch(kBlockSize, '\0');
  for (uint64_t block = 0; block < scan.size; block += kBlockSize) {
    const size_t want = static_cast<size_t>(std::min(kBlockSize, scan.size - block));
    rocksdb::Slice data;
    size_t got = 0;
    // A sequential read may return less than asked before the end.
    std::string buffer;
    while (got < want) {
      s = file->Read(want - got, &data, scratch.data());
      if (!s.ok()) return absl::UnavailableError(absl::StrCat("read ", path, ": ", s.ToString()));
      if (data.empty()) break;
      buffer.append(data.data(), data.size());
      got += data.size();
    }
    const bool last = block + kBlockSize >= scan.size || got < want;
    scanner.Block(block, buffer.data(), buffer.size(), last);
    if (got < want) break;
  }
  scanner.End();
  return scan;
}

std::optional<WalRecovery> DroppedFrom(const WalScan& scan,
                                       const absl::flat_hash_set<uint64_t>& replayed) {
  WalRecovery r;
  r.path = scan.path;
  uint64_t replayed_end = 0;
  for (const WalBatch& b : scan.batches) {
    if (replayed.contains(b.sequence)) {
      ++r.records_recovered;
      replayed_end = std::max(replayed_end, b.end);
    } else {
      ++r.intact_records_dropped;
    }
  }
  // Damage that recovery read past (it replayed records after it) cost nothing.
  const bool damaged = scan.damage_offset.has_value() && *scan.damage_offset >= replayed_end;
  if (!damaged && r.intact_records_dropped == 0) return std::nullopt;
  if (damaged) {
    r.damage_offset = scan.damage_offset;
    r.damage = scan.damage;
  }
  r.bytes_dropped = scan.size - replayed_end;
  r.torn_tail = damaged && r.intact_records_dropped == 0;
  return r;
}

std::string Describe(const WalRecovery& r) {
  if (r.torn_tail) {
    return absl::StrFormat(
        "journal: WAL %s ends in a torn record at byte %d (%s): dropped it (%d bytes) and "
        "recovered the %d records before it. A crash, a power loss or a full disk during a "
        "write leaves this; a synced write is never torn",
        r.path, *r.damage_offset, r.damage, r.bytes_dropped, r.records_recovered);
  }
  if (r.damage_offset.has_value()) {
    return absl::StrFormat(
        "journal: WAL %s is damaged at byte %d (%s): recovered the %d records before it and "
        "dropped the damaged record and the %d intact records after it (%d bytes); synced "
        "writes may be among them",
        r.path, *r.damage_offset, r.damage, r.records_recovered, r.intact_records_dropped,
        r.bytes_dropped);
  }
  return absl::StrFormat(
      "journal: WAL %s: dropped %d intact records (%d bytes) that follow damage in an earlier "
      "WAL, after recovering %d; synced writes may be among them",
      r.path, r.intact_records_dropped, r.bytes_dropped, r.records_recovered);
}

}  // namespace longhaul::storage::internal
