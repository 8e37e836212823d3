#include "storage/journal.h"

#include <algorithm>
#include <cerrno>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <map>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/memory/memory.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/fmt_absl.h"
#include "rocksdb/db.h"
#include "rocksdb/env.h"
#include "rocksdb/listener.h"
#include "rocksdb/options.h"
#include "rocksdb/wal_filter.h"
#include "rocksdb/write_batch.h"
#include "spdlog/spdlog.h"
#include "storage/journal_wal.h"
#include "storage/posix_util.h"

namespace longhaul::storage {
namespace {

using internal::Av;

void AppendBigEndian32(std::string& out, uint32_t v) {
  out.push_back(static_cast<char>(v >> 24));
  out.push_back(static_cast<char>(v >> 16));
  out.push_back(static_cast<char>(v >> 8));
  out.push_back(static_cast<char>(v));
}

uint32_t ReadBigEndian32(const char* p) {
  auto b = [p](int i) { return static_cast<uint32_t>(static_cast<uint8_t>(p[i])); };
  return (b(0) << 24) | (b(1) << 16) | (b(2) << 8) | b(3);
}

// Prefix of every chunk key of a transfer: id + '\0'.
std::string ChunkPrefix(std::string_view transfer_id) {
  std::string key(transfer_id);
  key.push_back('\0');
  return key;
}

absl::Status CheckId(std::string_view id, std::string_view what) {
  if (id.empty()) return absl::InvalidArgumentError(absl::StrCat("empty ", Av(what)));
  if (id.find('\0') != std::string_view::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat(Av(what), " \"", absl::CHexEscape(Av(id)), "\" contains a NUL byte"));
  }
  return absl::OkStatus();
}

// Marks the errors of writes refused by an unwritable journal.
constexpr char kUnwritablePayload[] = "type.googleapis.com/longhaul.storage.JournalUnwritable";

// The error an unwritable journal gives for every write: what happened to the
// state disk, naming the directory.
absl::Status UnwritableError(const rocksdb::Status& cause, std::string_view dir) {
  absl::Status error;
  if (cause.IsNoSpace()) {
    error = absl::ResourceExhaustedError(
        absl::StrCat("state disk full at ", Av(dir), " (", std::strerror(ENOSPC), ")"));
  } else {
    error = absl::UnavailableError(
        absl::StrCat("state disk error at ", Av(dir), " (", cause.ToString(), ")"));
  }
  error.SetPayload(kUnwritablePayload, absl::Cord(Av(dir)));
  return error;
}

absl::Status FromRocks(const rocksdb::Status& s, std::string_view what, std::string_view dir) {
  if (s.ok()) return absl::OkStatus();
  if (s.IsNoSpace()) {
    return absl::ResourceExhaustedError(absl::StrCat("state disk full at ", Av(dir), " (",
                                                     std::strerror(ENOSPC), "): ", Av(what), ": ",
                                                     s.ToString()));
  }
  std::string msg = absl::StrCat("journal ", Av(dir), ": ", Av(what), ": ", s.ToString());
  switch (s.code()) {
    case rocksdb::Status::kNotFound:
      return absl::NotFoundError(msg);
    case rocksdb::Status::kCorruption:
      return absl::DataLossError(msg);
    case rocksdb::Status::kInvalidArgument:
      return absl::InvalidArgumentError(msg);
    case rocksdb::Status::kBusy:
    case rocksdb::Status::kTimedOut:
    case rocksdb::Status::kTryAgain:
      return absl::UnavailableError(msg);
    case rocksdb::Status::kIOError:
      if (s.subcode() == rocksdb::Status::kLockTimeout) return absl::UnavailableError(msg);
      return absl::InternalError(msg);
    default:
      return absl::InternalError(msg);
  }
}

rocksdb::Slice ToSlice(std::string_view s) { return rocksdb::Slice(s.data(), s.size()); }

template <typename Proto>
absl::StatusOr<Proto> Parse(std::string_view value, std::string_view cf, std::string_view key) {
  Proto p;
  if (!p.ParseFromArray(value.data(), static_cast<int>(value.size()))) {
    return absl::DataLossError(absl::StrCat("journal: corrupt ", p.GetTypeName(), " in column family ",
                                            Av(cf), " at key \"", absl::CHexEscape(Av(key)), "\""));
  }
  return p;
}

// RocksDB's info log, into the daemon's log. RocksDB's own file logger writes
// LOG on the state disk, and in RocksDB 7.8 its next line after a failed
// append asserts (WritableFileWriter::AssertFalseAndGetStatusForPrevError):
// a full state disk killed the daemon from a log line.
class SpdlogLogger final : public rocksdb::Logger {
 public:
  // Chatty INFO lines are formatted only when the daemon logs at debug.
  SpdlogLogger()
      : rocksdb::Logger(spdlog::should_log(spdlog::level::debug)
                            ? rocksdb::InfoLogLevel::INFO_LEVEL
                            : rocksdb::InfoLogLevel::WARN_LEVEL) {}

  using rocksdb::Logger::Logv;
  void Logv(const char* format, va_list ap) override {
    Logv(rocksdb::InfoLogLevel::INFO_LEVEL, format, ap);
  }
  void Logv(const rocksdb::InfoLogLevel level, const char* format, va_list ap) override {
    if (level < GetInfoLogLevel()) return;
    spdlog::level::level_enum to;
    switch (level) {
      case rocksdb::InfoLogLevel::DEBUG_LEVEL:
      case rocksdb::InfoLogLevel::HEADER_LEVEL:  // the options, at every open
        to = spdlog::level::trace;
        break;
      case rocksdb::InfoLogLevel::INFO_LEVEL:
        to = spdlog::level::debug;
        break;
      case rocksdb::InfoLogLevel::WARN_LEVEL:
        to = spdlog::level::warn;
        break;
      default:
        to = spdlog::level::err;
        break;
    }
    if (!spdlog::should_log(to)) return;
    char small[512];
    va_list copy;
    va_copy(copy, ap);
    const int n = std::vsnprintf(small, sizeof(small), format, copy);
    va_end(copy);
    if (n < 0) return;
    std::string line;
    if (static_cast<size_t>(n) < sizeof(small)) {
      line.assign(small, static_cast<size_t>(n));
    } else {
      line.resize(static_cast<size_t>(n) + 1);
      std::vsnprintf(line.data(), line.size(), format, ap);
      line.resize(static_cast<size_t>(n));
    }
    while (!line.empty() && (line.back() == '\n' || line.back() == ' ')) line.pop_back();
    std::replace(line.begin(), line.end(), '\n', ' ');  // one message, one line
    spdlog::log(to, "rocksdb: {}", line);
  }
};

// Keeps RocksDB from resuming a stopped database on its own. In RocksDB 7.8
// a resume with empty memtables clears the error but keeps the log writer
// that failed, and the next write into it asserts; the Journal reopens the
// database instead (see MaybeRecover). Soft errors (a compaction out of
// space) never touch the log and are left to RocksDB.
class NoAutoResume final : public rocksdb::EventListener {
 public:
  const char* Name() const override { return "longhaul.NoAutoResume"; }
  void OnErrorRecoveryBegin(rocksdb::BackgroundErrorReason, rocksdb::Status bg_error,
                            bool* auto_recovery) override {
    if (bg_error.severity() >= rocksdb::Status::Severity::kHardError) *auto_recovery = false;
    bg_error.PermitUncheckedError();
  }
};

}  // namespace

bool IsJournalUnwritable(const absl::Status& status) {
  return status.GetPayload(kUnwritablePayload).has_value();
}

// Which batches RocksDB replayed from which log file while opening, so that
// Journal::OpenDbLocked can compare them with its own scan of the files.
class Journal::WalReplay final : public rocksdb::WalFilter {
 public:
  const char* Name() const override { return "longhaul.WalReplay"; }

  void ColumnFamilyLogNumberMap(const std::map<uint32_t, uint64_t>& cf_lognumber_map,
                                const std::map<std::string, uint32_t>&) override {
    // Logs older than every column family's log number are skipped.
    uint64_t min_log = UINT64_MAX;
    for (const auto& [cf, number] : cf_lognumber_map) min_log = std::min(min_log, number);
    min_log_number_ = min_log;
  }

  WalProcessingOption LogRecordFound(unsigned long long log_number, const std::string&,
                                     const rocksdb::WriteBatch& batch, rocksdb::WriteBatch*,
                                     bool*) override {
    const std::string& rep = batch.Data();
    if (rep.size() >= 8) {
      uint64_t sequence = 0;
      for (int i = 7; i >= 0; --i) sequence = (sequence << 8) | static_cast<uint8_t>(rep[i]);
      replayed_[log_number].insert(sequence);
    }
    return WalProcessingOption::kContinueProcessing;
  }

  // Logs numbered below this were not replayed; nullopt if RocksDB replayed
  // no log at all.
  std::optional<uint64_t> min_log_number() const { return min_log_number_; }
  const absl::flat_hash_set<uint64_t>& replayed(uint64_t log_number) const {
    static const absl::flat_hash_set<uint64_t> kNone;
    auto it = replayed_.find(log_number);
    return it == replayed_.end() ? kNone : it->second;
  }

 private:
  std::optional<uint64_t> min_log_number_;
  absl::flat_hash_map<uint64_t, absl::flat_hash_set<uint64_t>> replayed_;
};

std::string ChunkKey(std::string_view transfer_id, uint32_t file_index, uint32_t chunk_index) {
  std::string key = ChunkPrefix(transfer_id);
  AppendBigEndian32(key, file_index);
  AppendBigEndian32(key, chunk_index);
  return key;
}

absl::StatusOr<std::unique_ptr<Journal>> Journal::Open(const std::string& dir,
                                                       const JournalOptions& options) {
  auto journal = absl::WrapUnique(new Journal(dir, options));
  absl::MutexLock lock(&journal->db_mu_);
  if (absl::Status s = journal->OpenDbLocked(); !s.ok()) return s;
  return journal;
}

absl::StatusOr<std::unique_ptr<Journal>> Journal::Open(const std::string& dir,
                                                       const Clock* clock) {
  JournalOptions options;
  options.clock = clock;
  return Open(dir, options);
}

Journal::Journal(std::string dir, const JournalOptions& options)
    : dir_(std::move(dir)),
      clock_(options.clock != nullptr ? *options.clock : RealClock::Get()),
      env_(options.env != nullptr ? options.env : rocksdb::Env::Default()) {}

Journal::~Journal() {
  absl::MutexLock lock(&db_mu_);
  CloseDbLocked();
}

absl::Status Journal::OpenDbLocked() {
  wal_replay_ = std::make_unique<WalReplay>();
  rocksdb::Options options;
  options.env = env_;
  options.create_if_missing = true;
  options.create_missing_column_families = true;
  // Records are small and few; keep RocksDB's own footprint modest.
  options.max_open_files = 256;
  options.info_log = std::make_shared<SpdlogLogger>();
  options.listeners.push_back(std::make_shared<NoAutoResume>());
  // No resume thread for retryable I/O errors either: see NoAutoResume.
  options.max_bgerror_resume_count = 0;
  options.wal_filter = wal_replay_.get();
  // RocksDB creates the directory only after it has looked into it, which it
  // reports as an error when it uses a logger of ours.
  if (rocksdb::Status s = env_->CreateDirIfMissing(dir_); !s.ok()) {
    return FromRocks(s, "create directory", dir_);
  }

  // Before RocksDB replays (and then deletes) the logs: its point-in-time
  // recovery drops a damaged record and everything after it, and says so
  // only in bytes, and not for the intact records it stops at.
  std::vector<internal::WalScan> scans;
  absl::StatusOr<std::vector<std::pair<uint64_t, std::string>>> wals =
      internal::ListWals(*env_, dir_);
  if (!wals.ok()) {
    spdlog::warn("journal {}: cannot list its write-ahead logs to check them: {}", dir_,
                 wals.status().message());
  } else {
    for (const auto& [number, path] : *wals) {
      absl::StatusOr<internal::WalScan> scan = internal::ScanWal(*env_, path, number);
      if (!scan.ok()) {
        spdlog::warn("journal: cannot check WAL {}: {}", path, scan.status().message());
        continue;
      }
      scans.push_back(*std::move(scan));
    }
  }

  std::vector<std::string> names;
  rocksdb::Status s = rocksdb::DB::ListColumnFamilies(options, dir_, &names);
  if (!s.ok()) names.clear();  // a new database: only ours
  for (const char* cf : {rocksdb::kDefaultColumnFamilyName.c_str(), kOutgoingCf, kIncomingCf,
                         kChunksCf, kRequestsCf, kCountersCf, kPartialChunksCf}) {
    if (std::find(names.begin(), names.end(), cf) == names.end()) names.push_back(cf);
  }
  std::vector<rocksdb::ColumnFamilyDescriptor> descriptors;
  for (const std::string& name : names) {
    descriptors.emplace_back(name, rocksdb::ColumnFamilyOptions(options));
  }
  std::vector<rocksdb::ColumnFamilyHandle*> handles;
  rocksdb::DB* raw = nullptr;
  s = rocksdb::DB::Open(options, dir_, descriptors, &handles, &raw);
  if (!s.ok()) {
    for (const internal::WalScan& scan : scans) {
      if (scan.damage_offset.has_value()) {
        spdlog::error("journal: WAL {} is damaged at byte {} ({})", scan.path, *scan.damage_offset,
                      scan.damage);
      }
    }
    return FromRocks(s, "open", dir_);
  }
  db_.reset(raw);
  handles_ = std::move(handles);
  for (rocksdb::ColumnFamilyHandle* h : handles_) {
    if (h->GetName() == kOutgoingCf) outgoing_ = h;
    if (h->GetName() == kIncomingCf) incoming_ = h;
    if (h->GetName() == kChunksCf) chunks_ = h;
    if (h->GetName() == kRequestsCf) requests_ = h;
    if (h->GetName() == kCountersCf) counters_ = h;
    if (h->GetName() == kPartialChunksCf) partial_chunks_ = h;
  }

  wal_recoveries_.clear();
  if (std::optional<uint64_t> min_log = wal_replay_->min_log_number(); min_log.has_value()) {
    for (const internal::WalScan& scan : scans) {
      if (scan.number < *min_log) continue;  // flushed before: not replayed, not needed
      std::optional<WalRecovery> dropped =
          internal::DroppedFrom(scan, wal_replay_->replayed(scan.number));
      if (!dropped.has_value()) continue;
      if (dropped->torn_tail) {
        spdlog::warn("{}", internal::Describe(*dropped));
      } else {
        spdlog::error("{}", internal::Describe(*dropped));
      }
      wal_recoveries_.push_back(*std::move(dropped));
    }
  }
  return absl::OkStatus();
}

void Journal::CloseDbLocked() {
  if (db_ == nullptr) return;
  for (rocksdb::ColumnFamilyHandle* h : handles_) db_->DestroyColumnFamilyHandle(h);
  handles_.clear();
  outgoing_ = incoming_ = chunks_ = requests_ = counters_ = partial_chunks_ = nullptr;
  // Synced writes are already durable; a database stopped by an error
  // reports that error again here.
  db_->Close().PermitUncheckedError();
  db_.reset();
}

absl::Status Journal::writable() const {
  absl::MutexLock lock(&error_mu_);
  return error_;
}

std::vector<WalRecovery> Journal::wal_recoveries() const {
  absl::ReaderMutexLock lock(&db_mu_);
  return wal_recoveries_;
}

void Journal::MaybeRecover(bool writing) {
  absl::Status error = writable();
  if (error.ok()) return;
  absl::MutexLock lock(&db_mu_);
  error = writable();
  if (error.ok()) return;                  // another caller reopened it
  if (!writing && db_ != nullptr) return;  // a stopped database still serves reads
  if (error.code() == absl::StatusCode::kResourceExhausted) {
    uint64_t free_bytes = 0;
    rocksdb::Status space = env_->GetFreeSpace(dir_, &free_bytes);
    if (space.ok() && free_bytes < kJournalMinFreeBytesToReopen) return;
  }
  CloseDbLocked();
  if (absl::Status opened = OpenDbLocked(); !opened.ok()) {
    spdlog::error("journal {}: cannot reopen, it stays closed: {}", dir_, opened.message());
    return;
  }
  {
    absl::MutexLock error_lock(&error_mu_);
    error_ = absl::OkStatus();
  }
  spdlog::info("journal {}: reopened, writable again", dir_);
}

absl::Status Journal::OpenedLocked() const {
  if (db_ != nullptr) return absl::OkStatus();
  return writable();
}

absl::Status Journal::MarkUnwritable(const rocksdb::Status& cause, std::string_view what) {
  {
    absl::MutexLock lock(&error_mu_);
    if (!error_.ok()) return error_;
    error_ = UnwritableError(cause, dir_);
  }
  spdlog::error("journal {}: {} failed: {}; writes are refused until it can reopen", dir_, what,
                cause.ToString());
  return writable();
}

absl::Status Journal::WriteLocked(rocksdb::WriteBatch& batch, bool sync, std::string_view what) {
  // A database stopped by a failed write is not written again before it is
  // reopened.
  if (absl::Status s = writable(); !s.ok()) return s;
  rocksdb::WriteOptions wo;
  wo.sync = sync;
  const Timestamp start = sync ? clock_.Now() : Timestamp();
  rocksdb::Status s = db_->Write(wo, &batch);
  if (sync) {
    const int64_t us = std::max<int64_t>(0, (clock_.Now() - start).ToMicroseconds());
    absl::MutexLock lock(&stats_mu_);
    ++stats_.synced_writes;
    stats_.synced_total_us += static_cast<uint64_t>(us);
    stats_.synced_max_us = std::max(stats_.synced_max_us, static_cast<uint64_t>(us));
    size_t bucket = 0;
    while (bucket < kJournalLatencyBoundsUs.size() &&
           static_cast<uint64_t>(us) > kJournalLatencyBoundsUs[bucket]) {
      ++bucket;
    }
    ++stats_.synced_buckets[bucket];
  }
  if (s.IsIOError()) return MarkUnwritable(s, what);
  return FromRocks(s, what, dir_);
}

absl::StatusOr<std::optional<std::string>> Journal::GetRawLocked(rocksdb::ColumnFamilyHandle* cf,
                                                                 std::string_view key) {
  std::string value;
  rocksdb::Status s = db_->Get(rocksdb::ReadOptions(), cf, ToSlice(key), &value);
  if (s.IsNotFound()) return std::nullopt;
  if (!s.ok()) {
    return FromRocks(s, absl::StrCat("read ", cf->GetName(), " \"", absl::CHexEscape(Av(key)), "\""),
                     dir_);
  }
  return value;
}

JournalStats Journal::stats() const {
  absl::MutexLock lock(&stats_mu_);
  return stats_;
}

namespace {

// Values of `cf` in key order, parsed as Proto; keys for messages.
template <typename Proto>
absl::StatusOr<std::vector<Proto>> ListAll(rocksdb::DB* db, rocksdb::ColumnFamilyHandle* cf,
                                           std::string_view dir) {
  std::vector<Proto> out;
  std::unique_ptr<rocksdb::Iterator> it(db->NewIterator(rocksdb::ReadOptions(), cf));
  for (it->SeekToFirst(); it->Valid(); it->Next()) {
    absl::StatusOr<Proto> p = Parse<Proto>(std::string_view(it->value().data(), it->value().size()),
                                           cf->GetName(), it->key().ToStringView());
    if (!p.ok()) return p.status();
    out.push_back(*std::move(p));
  }
  if (!it->status().ok()) return FromRocks(it->status(), absl::StrCat("scan ", cf->GetName()), dir);
  return out;
}

}  // namespace

// Every call below first reopens an unwritable journal when that can help,
// then holds db_mu_ shared while it uses the database.

// ------------------------------------------------------------- outgoing ----

absl::Status Journal::PutOutgoing(const v1::OutgoingTransfer& transfer, bool sync) {
  if (absl::Status s = CheckId(transfer.id(), "transfer id"); !s.ok()) return s;
  MaybeRecover(/*writing=*/true);
  absl::ReaderMutexLock lock(&db_mu_);
  if (absl::Status s = OpenedLocked(); !s.ok()) return s;
  rocksdb::WriteBatch batch;
  rocksdb::Status s = batch.Put(outgoing_, ToSlice(transfer.id()), transfer.SerializeAsString());
  if (!s.ok()) return FromRocks(s, "batch", dir_);
  return WriteLocked(batch, sync, absl::StrCat("write outgoing transfer ", transfer.id()));
}

absl::Status Journal::PutOutgoingWithRequest(const v1::OutgoingTransfer& transfer,
                                             std::string_view request_id) {
  if (absl::Status s = CheckId(transfer.id(), "transfer id"); !s.ok()) return s;
  if (request_id.empty()) return absl::InvalidArgumentError("empty request id");
  MaybeRecover(/*writing=*/true);
  absl::ReaderMutexLock lock(&db_mu_);
  if (absl::Status s = OpenedLocked(); !s.ok()) return s;
  rocksdb::WriteBatch batch;
  rocksdb::Status s = batch.Put(outgoing_, ToSlice(transfer.id()), transfer.SerializeAsString());
  if (s.ok()) s = batch.Put(requests_, ToSlice(request_id), ToSlice(transfer.id()));
  if (!s.ok()) return FromRocks(s, "batch", dir_);
  return WriteLocked(batch, /*sync=*/true, absl::StrCat("write outgoing transfer ", transfer.id()));
}

absl::StatusOr<std::optional<std::string>> Journal::LookupRequest(std::string_view request_id) {
  MaybeRecover(/*writing=*/false);
  absl::ReaderMutexLock lock(&db_mu_);
  if (absl::Status s = OpenedLocked(); !s.ok()) return s;
  return GetRawLocked(requests_, request_id);
}

absl::StatusOr<std::optional<v1::OutgoingTransfer>> Journal::GetOutgoing(std::string_view id) {
  MaybeRecover(/*writing=*/false);
  absl::ReaderMutexLock lock(&db_mu_);
  if (absl::Status s = OpenedLocked(); !s.ok()) return s;
  absl::StatusOr<std::optional<std::string>> raw = GetRawLocked(outgoing_, id);
  if (!raw.ok()) return raw.status();
  if (!raw->has_value()) return std::nullopt;
  absl::StatusOr<v1::OutgoingTransfer> p = Parse<v1::OutgoingTransfer>(**raw, kOutgoingCf, id);
  if (!p.ok()) return p.status();
  return *std::move(p);
}

absl::StatusOr<std::vector<v1::OutgoingTransfer>> Journal::ListOutgoing() {
  MaybeRecover(/*writing=*/false);
  absl::ReaderMutexLock lock(&db_mu_);
  if (absl::Status s = OpenedLocked(); !s.ok()) return s;
  return ListAll<v1::OutgoingTransfer>(db_.get(), outgoing_, dir_);
}

absl::Status Journal::DeleteOutgoing(std::string_view id) {
  MaybeRecover(/*writing=*/true);
  absl::ReaderMutexLock lock(&db_mu_);
  if (absl::Status s = OpenedLocked(); !s.ok()) return s;
  rocksdb::WriteBatch batch;
  // Drop the request mapping too, when the record can still tell us which.
  absl::StatusOr<std::optional<std::string>> raw = GetRawLocked(outgoing_, id);
  if (raw.ok() && raw->has_value()) {
    absl::StatusOr<v1::OutgoingTransfer> old = Parse<v1::OutgoingTransfer>(**raw, kOutgoingCf, id);
    if (old.ok() && !old->request_id().empty()) {
      absl::StatusOr<std::optional<std::string>> mapped =
          GetRawLocked(requests_, old->request_id());
      if (mapped.ok() && mapped->has_value() && **mapped == id) {
        batch.Delete(requests_, ToSlice(old->request_id())).PermitUncheckedError();
      }
    }
  }
  rocksdb::Status s = batch.Delete(outgoing_, ToSlice(id));
  if (s.ok()) s = batch.Delete(counters_, ToSlice(id));
  if (!s.ok()) return FromRocks(s, "batch", dir_);
  return WriteLocked(batch, /*sync=*/true, absl::StrCat("delete outgoing transfer ", Av(id)));
}

absl::Status Journal::PutOutgoingCounters(std::string_view id,
                                           const v1::OutgoingCounters& counters) {
  if (absl::Status s = CheckId(id, "transfer id"); !s.ok()) return s;
  MaybeRecover(/*writing=*/true);
  absl::ReaderMutexLock lock(&db_mu_);
  if (absl::Status s = OpenedLocked(); !s.ok()) return s;
  rocksdb::WriteBatch batch;
  rocksdb::Status s = batch.Put(counters_, ToSlice(id), counters.SerializeAsString());
  if (!s.ok()) return FromRocks(s, "batch", dir_);
  return WriteLocked(batch, /*sync=*/false, absl::StrCat("write counters of ", Av(id)));
}

absl::StatusOr<std::optional<v1::OutgoingCounters>> Journal::GetOutgoingCounters(
    std::string_view id) {
  MaybeRecover(/*writing=*/false);
  absl::ReaderMutexLock lock(&db_mu_);
  if (absl::Status s = OpenedLocked(); !s.ok()) return s;
  absl::StatusOr<std::optional<std::string>> raw = GetRawLocked(counters_, id);
  if (!raw.ok()) return raw.status();
  if (!raw->has_value()) return std::nullopt;
  absl::StatusOr<v1::OutgoingCounters> p = Parse<v1::OutgoingCounters>(**raw, kCountersCf, id);
  if (!p.ok()) return p.status();
  return *std::move(p);
}

// ------------------------------------------------------------- incoming ----

absl::Status Journal::PutIncoming(const v1::IncomingTransfer& transfer) {
  if (absl::Status s = CheckId(transfer.id(), "transfer id"); !s.ok()) return s;
  MaybeRecover(/*writing=*/true);
  absl::ReaderMutexLock lock(&db_mu_);
  if (absl::Status s = OpenedLocked(); !s.ok()) return s;
  rocksdb::WriteBatch batch;
  rocksdb::Status s = batch.Put(incoming_, ToSlice(transfer.id()), transfer.SerializeAsString());
  if (!s.ok()) return FromRocks(s, "batch", dir_);
  return WriteLocked(batch, /*sync=*/true, absl::StrCat("write incoming transfer ", transfer.id()));
}

absl::StatusOr<std::optional<v1::IncomingTransfer>> Journal::GetIncoming(std::string_view id) {
  MaybeRecover(/*writing=*/false);
  absl::ReaderMutexLock lock(&db_mu_);
  if (absl::Status s = OpenedLocked(); !s.ok()) return s;
  absl::StatusOr<std::optional<std::string>> raw = GetRawLocked(incoming_, id);
  if (!raw.ok()) return raw.status();
  if (!raw->has_value()) return std::nullopt;
  absl::StatusOr<v1::IncomingTransfer> p = Parse<v1::IncomingTransfer>(**raw, kIncomingCf, id);
  if (!p.ok()) return p.status();
  return *std::move(p);
}

absl::StatusOr<std::vector<v1::IncomingTransfer>> Journal::ListIncoming() {
  MaybeRecover(/*writing=*/false);
  absl::ReaderMutexLock lock(&db_mu_);
  if (absl::Status s = OpenedLocked(); !s.ok()) return s;
  return ListAll<v1::IncomingTransfer>(db_.get(), incoming_, dir_);
}

absl::Status Journal::DeleteIncoming(std::string_view id) {
  MaybeRecover(/*writing=*/true);
  absl::ReaderMutexLock lock(&db_mu_);
  if (absl::Status s = OpenedLocked(); !s.ok()) return s;
  rocksdb::WriteBatch batch;
  rocksdb::Status s = batch.Delete(incoming_, ToSlice(id));
  if (!s.ok()) return FromRocks(s, "batch", dir_);
  return WriteLocked(batch, /*sync=*/true, absl::StrCat("delete incoming transfer ", Av(id)));
}

// --------------------------------------------------------------- chunks ----

absl::Status Journal::RecordDurableChunks(std::string_view transfer_id,
                                          absl::Span<const ChunkDurability> chunks) {
  if (absl::Status s = CheckId(transfer_id, "transfer id"); !s.ok()) return s;
  if (chunks.empty()) return absl::OkStatus();
  MaybeRecover(/*writing=*/true);
  absl::ReaderMutexLock lock(&db_mu_);
  if (absl::Status s = OpenedLocked(); !s.ok()) return s;
  rocksdb::WriteBatch batch;
  std::string value;
  for (const ChunkDurability& c : chunks) {
    const std::string key = ChunkKey(transfer_id, c.file_index, c.chunk_index);
    value.clear();
    rocksdb::Status s;
    if (c.prefix_bytes == 0) {
      c.chunk.SerializeToString(&value);
      s = batch.Put(chunks_, ToSlice(key), value);
      if (s.ok()) s = batch.Delete(partial_chunks_, ToSlice(key));
    } else {
      v1::DurablePrefix partial;
      partial.set_durable_bytes(c.prefix_bytes);
      partial.set_generation(c.chunk.generation());
      partial.SerializeToString(&value);
      s = batch.Put(partial_chunks_, ToSlice(key), value);
    }
    if (!s.ok()) return FromRocks(s, "batch", dir_);
  }
  return WriteLocked(
      batch, /*sync=*/true,
      absl::StrCat("record ", chunks.size(), " durable chunks of ", Av(transfer_id)));
}

absl::StatusOr<std::vector<ChunkDurability>> Journal::ListChunksLocked(
    rocksdb::ColumnFamilyHandle* cf, const char* cf_name, std::string_view transfer_id,
    bool partial) {
  const std::string prefix = ChunkPrefix(transfer_id);
  std::vector<ChunkDurability> out;
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions(), cf));
  for (it->Seek(prefix); it->Valid(); it->Next()) {
    std::string_view key = it->key().ToStringView();
    if (key.substr(0, prefix.size()) != prefix) break;
    if (key.size() != prefix.size() + 8) {
      return absl::DataLossError(absl::StrCat("journal: malformed chunk key \"",
                                              absl::CHexEscape(Av(key)), "\" in column family ",
                                              cf_name));
    }
    ChunkDurability c;
    c.file_index = ReadBigEndian32(key.data() + prefix.size());
    c.chunk_index = ReadBigEndian32(key.data() + prefix.size() + 4);
    if (partial) {
      absl::StatusOr<v1::DurablePrefix> p =
          Parse<v1::DurablePrefix>(it->value().ToStringView(), cf_name, key);
      if (!p.ok()) return p.status();
      if (p->durable_bytes() == 0) {
        return absl::DataLossError(absl::StrCat("journal: partial chunk record \"",
                                                absl::CHexEscape(Av(key)),
                                                "\" holds no durable bytes"));
      }
      c.prefix_bytes = p->durable_bytes();
      c.chunk.set_generation(p->generation());
    } else {
      absl::StatusOr<v1::DurableChunk> p =
          Parse<v1::DurableChunk>(it->value().ToStringView(), cf_name, key);
      if (!p.ok()) return p.status();
      c.chunk = *std::move(p);
    }
    out.push_back(std::move(c));
  }
  if (!it->status().ok()) return FromRocks(it->status(), "scan chunks", dir_);
  return out;
}

absl::StatusOr<std::vector<ChunkDurability>> Journal::ListDurableChunks(
    std::string_view transfer_id) {
  if (absl::Status s = CheckId(transfer_id, "transfer id"); !s.ok()) return s;
  MaybeRecover(/*writing=*/false);
  absl::ReaderMutexLock lock(&db_mu_);
  if (absl::Status s = OpenedLocked(); !s.ok()) return s;
  return ListChunksLocked(chunks_, kChunksCf, transfer_id, /*partial=*/false);
}

absl::StatusOr<std::vector<ChunkDurability>> Journal::ListPartialChunks(
    std::string_view transfer_id) {
  if (absl::Status s = CheckId(transfer_id, "transfer id"); !s.ok()) return s;
  MaybeRecover(/*writing=*/false);
  absl::ReaderMutexLock lock(&db_mu_);
  if (absl::Status s = OpenedLocked(); !s.ok()) return s;
  return ListChunksLocked(partial_chunks_, kPartialChunksCf, transfer_id, /*partial=*/true);
}

absl::Status Journal::DeletePartialChunk(std::string_view transfer_id, uint32_t file_index,
                                         uint32_t chunk_index) {
  if (absl::Status s = CheckId(transfer_id, "transfer id"); !s.ok()) return s;
  MaybeRecover(/*writing=*/true);
  absl::ReaderMutexLock lock(&db_mu_);
  if (absl::Status s = OpenedLocked(); !s.ok()) return s;
  rocksdb::WriteBatch batch;
  rocksdb::Status s =
      batch.Delete(partial_chunks_, ToSlice(ChunkKey(transfer_id, file_index, chunk_index)));
  if (!s.ok()) return FromRocks(s, "batch", dir_);
  return WriteLocked(batch, /*sync=*/true,
                     absl::StrCat("delete partial chunk ", chunk_index, " of file ", file_index,
                                  " of ", Av(transfer_id)));
}

absl::Status Journal::DeleteChunks(std::string_view transfer_id) {
  if (absl::Status s = CheckId(transfer_id, "transfer id"); !s.ok()) return s;
  MaybeRecover(/*writing=*/true);
  absl::ReaderMutexLock lock(&db_mu_);
  if (absl::Status s = OpenedLocked(); !s.ok()) return s;
  std::string begin = ChunkPrefix(transfer_id);
  std::string end(transfer_id);
  end.push_back('\1');
  rocksdb::WriteBatch batch;
  rocksdb::Status s = batch.DeleteRange(chunks_, begin, end);
  if (s.ok()) s = batch.DeleteRange(partial_chunks_, begin, end);
  if (!s.ok()) return FromRocks(s, "batch", dir_);
  return WriteLocked(batch, /*sync=*/true, absl::StrCat("delete chunks of ", Av(transfer_id)));
}

absl::Status Journal::DeleteFileChunks(std::string_view transfer_id, uint32_t file_index) {
  if (absl::Status s = CheckId(transfer_id, "transfer id"); !s.ok()) return s;
  MaybeRecover(/*writing=*/true);
  absl::ReaderMutexLock lock(&db_mu_);
  if (absl::Status s = OpenedLocked(); !s.ok()) return s;
  std::string begin = ChunkPrefix(transfer_id);
  AppendBigEndian32(begin, file_index);
  std::string end;
  if (file_index == UINT32_MAX) {
    end = std::string(transfer_id);
    end.push_back('\1');
  } else {
    end = ChunkPrefix(transfer_id);
    AppendBigEndian32(end, file_index + 1);
  }
  rocksdb::WriteBatch batch;
  rocksdb::Status s = batch.DeleteRange(chunks_, begin, end);
  if (s.ok()) s = batch.DeleteRange(partial_chunks_, begin, end);
  if (!s.ok()) return FromRocks(s, "batch", dir_);
  return WriteLocked(batch, /*sync=*/true,
                     absl::StrCat("delete chunks of file ", file_index, " of ", Av(transfer_id)));
}

}  // namespace longhaul::storage
