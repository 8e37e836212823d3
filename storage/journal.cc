#include "storage/journal.h"

#include <algorithm>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "rocksdb/db.h"
#include "rocksdb/options.h"
#include "rocksdb/write_batch.h"
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

absl::Status FromRocks(const rocksdb::Status& s, std::string_view what, std::string_view dir) {
  if (s.ok()) return absl::OkStatus();
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
      if (s.subcode() == rocksdb::Status::kNoSpace) return absl::ResourceExhaustedError(msg);
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

}  // namespace

std::string ChunkKey(std::string_view transfer_id, uint32_t file_index, uint32_t chunk_index) {
  std::string key = ChunkPrefix(transfer_id);
  AppendBigEndian32(key, file_index);
  AppendBigEndian32(key, chunk_index);
  return key;
}

absl::StatusOr<std::unique_ptr<Journal>> Journal::Open(const std::string& dir,
                                                       const Clock* clock) {
  rocksdb::Options options;
  options.create_if_missing = true;
  options.create_missing_column_families = true;
  // Records are small and few; keep RocksDB's own footprint modest.
  options.max_open_files = 256;
  options.keep_log_file_num = 4;

  std::vector<std::string> names;
  rocksdb::Status s = rocksdb::DB::ListColumnFamilies(options, dir, &names);
  if (!s.ok()) names.clear();  // a new database: only ours
  for (const char* cf : {rocksdb::kDefaultColumnFamilyName.c_str(), kOutgoingCf, kIncomingCf,
                         kChunksCf, kRequestsCf, kCountersCf}) {
    if (std::find(names.begin(), names.end(), cf) == names.end()) names.push_back(cf);
  }
  std::vector<rocksdb::ColumnFamilyDescriptor> descriptors;
  for (const std::string& name : names) {
    descriptors.emplace_back(name, rocksdb::ColumnFamilyOptions(options));
  }
  std::vector<rocksdb::ColumnFamilyHandle*> handles;
  rocksdb::DB* raw = nullptr;
  s = rocksdb::DB::Open(options, dir, descriptors, &handles, &raw);
  if (!s.ok()) return FromRocks(s, "open", dir);
  std::unique_ptr<rocksdb::DB> db(raw);
  const Clock& c = clock != nullptr ? *clock : RealClock::Get();
  return std::unique_ptr<Journal>(new Journal(std::move(db), std::move(handles), c, dir));
}

Journal::Journal(std::unique_ptr<rocksdb::DB> db,
                 std::vector<rocksdb::ColumnFamilyHandle*> handles, const Clock& clock,
                 std::string dir)
    : dir_(std::move(dir)), clock_(clock), db_(std::move(db)), handles_(std::move(handles)) {
  for (rocksdb::ColumnFamilyHandle* h : handles_) {
    if (h->GetName() == kOutgoingCf) outgoing_ = h;
    if (h->GetName() == kIncomingCf) incoming_ = h;
    if (h->GetName() == kChunksCf) chunks_ = h;
    if (h->GetName() == kRequestsCf) requests_ = h;
    if (h->GetName() == kCountersCf) counters_ = h;
  }
}

Journal::~Journal() {
  for (rocksdb::ColumnFamilyHandle* h : handles_) db_->DestroyColumnFamilyHandle(h);
  // Flush of the WAL happens in Close; synced writes are already durable.
  db_->Close().PermitUncheckedError();
}

absl::Status Journal::Write(rocksdb::WriteBatch& batch, bool sync, std::string_view what) {
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
  return FromRocks(s, what, dir_);
}

absl::StatusOr<std::optional<std::string>> Journal::GetRaw(rocksdb::ColumnFamilyHandle* cf,
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

// ------------------------------------------------------------- outgoing ----

absl::Status Journal::PutOutgoing(const v1::OutgoingTransfer& transfer, bool sync) {
  if (absl::Status s = CheckId(transfer.id(), "transfer id"); !s.ok()) return s;
  rocksdb::WriteBatch batch;
  rocksdb::Status s = batch.Put(outgoing_, ToSlice(transfer.id()), transfer.SerializeAsString());
  if (!s.ok()) return FromRocks(s, "batch", dir_);
  return Write(batch, sync, absl::StrCat("write outgoing transfer ", transfer.id()));
}

absl::Status Journal::PutOutgoingWithRequest(const v1::OutgoingTransfer& transfer,
                                             std::string_view request_id) {
  if (absl::Status s = CheckId(transfer.id(), "transfer id"); !s.ok()) return s;
  if (request_id.empty()) return absl::InvalidArgumentError("empty request id");
  rocksdb::WriteBatch batch;
  rocksdb::Status s = batch.Put(outgoing_, ToSlice(transfer.id()), transfer.SerializeAsString());
  if (s.ok()) s = batch.Put(requests_, ToSlice(request_id), ToSlice(transfer.id()));
  if (!s.ok()) return FromRocks(s, "batch", dir_);
  return Write(batch, /*sync=*/true, absl::StrCat("write outgoing transfer ", transfer.id()));
}

absl::StatusOr<std::optional<std::string>> Journal::LookupRequest(std::string_view request_id) {
  return GetRaw(requests_, request_id);
}

absl::StatusOr<std::optional<v1::OutgoingTransfer>> Journal::GetOutgoing(std::string_view id) {
  absl::StatusOr<std::optional<std::string>> raw = GetRaw(outgoing_, id);
  if (!raw.ok()) return raw.status();
  if (!raw->has_value()) return std::nullopt;
  absl::StatusOr<v1::OutgoingTransfer> p = Parse<v1::OutgoingTransfer>(**raw, kOutgoingCf, id);
  if (!p.ok()) return p.status();
  return *std::move(p);
}

absl::StatusOr<std::vector<v1::OutgoingTransfer>> Journal::ListOutgoing() {
  return ListAll<v1::OutgoingTransfer>(db_.get(), outgoing_, dir_);
}

absl::Status Journal::DeleteOutgoing(std::string_view id) {
  rocksdb::WriteBatch batch;
  // Drop the request mapping too, when the record can still tell us which.
  absl::StatusOr<std::optional<v1::OutgoingTransfer>> old = GetOutgoing(id);
  if (old.ok() && old->has_value() && !(*old)->request_id().empty()) {
    absl::StatusOr<std::optional<std::string>> mapped = LookupRequest((*old)->request_id());
    if (mapped.ok() && mapped->has_value() && **mapped == id) {
      batch.Delete(requests_, ToSlice((*old)->request_id())).PermitUncheckedError();
    }
  }
  rocksdb::Status s = batch.Delete(outgoing_, ToSlice(id));
  if (s.ok()) s = batch.Delete(counters_, ToSlice(id));
  if (!s.ok()) return FromRocks(s, "batch", dir_);
  return Write(batch, /*sync=*/true, absl::StrCat("delete outgoing transfer ", Av(id)));
}

absl::Status Journal::PutOutgoingCounters(std::string_view id,
                                           const v1::OutgoingCounters& counters) {
  if (absl::Status s = CheckId(id, "transfer id"); !s.ok()) return s;
  rocksdb::WriteBatch batch;
  rocksdb::Status s = batch.Put(counters_, ToSlice(id), counters.SerializeAsString());
  if (!s.ok()) return FromRocks(s, "batch", dir_);
  return Write(batch, /*sync=*/false, absl::StrCat("write counters of ", Av(id)));
}

absl::StatusOr<std::optional<v1::OutgoingCounters>> Journal::GetOutgoingCounters(
    std::string_view id) {
  absl::StatusOr<std::optional<std::string>> raw = GetRaw(counters_, id);
  if (!raw.ok()) return raw.status();
  if (!raw->has_value()) return std::nullopt;
  absl::StatusOr<v1::OutgoingCounters> p = Parse<v1::OutgoingCounters>(**raw, kCountersCf, id);
  if (!p.ok()) return p.status();
  return *std::move(p);
}

// ------------------------------------------------------------- incoming ----

absl::Status Journal::PutIncoming(const v1::IncomingTransfer& transfer) {
  if (absl::Status s = CheckId(transfer.id(), "transfer id"); !s.ok()) return s;
  rocksdb::WriteBatch batch;
  rocksdb::Status s = batch.Put(incoming_, ToSlice(transfer.id()), transfer.SerializeAsString());
  if (!s.ok()) return FromRocks(s, "batch", dir_);
  return Write(batch, /*sync=*/true, absl::StrCat("write incoming transfer ", transfer.id()));
}

absl::StatusOr<std::optional<v1::IncomingTransfer>> Journal::GetIncoming(std::string_view id) {
  absl::StatusOr<std::optional<std::string>> raw = GetRaw(incoming_, id);
  if (!raw.ok()) return raw.status();
  if (!raw->has_value()) return std::nullopt;
  absl::StatusOr<v1::IncomingTransfer> p = Parse<v1::IncomingTransfer>(**raw, kIncomingCf, id);
  if (!p.ok()) return p.status();
  return *std::move(p);
}

absl::StatusOr<std::vector<v1::IncomingTransfer>> Journal::ListIncoming() {
  return ListAll<v1::IncomingTransfer>(db_.get(), incoming_, dir_);
}

absl::Status Journal::DeleteIncoming(std::string_view id) {
  rocksdb::WriteBatch batch;
  rocksdb::Status s = batch.Delete(incoming_, ToSlice(id));
  if (!s.ok()) return FromRocks(s, "batch", dir_);
  return Write(batch, /*sync=*/true, absl::StrCat("delete incoming transfer ", Av(id)));
}

// --------------------------------------------------------------- chunks ----

absl::Status Journal::RecordDurableChunks(std::string_view transfer_id,
                                          absl::Span<const ChunkDurability> chunks) {
  if (absl::Status s = CheckId(transfer_id, "transfer id"); !s.ok()) return s;
  if (chunks.empty()) return absl::OkStatus();
  rocksdb::WriteBatch batch;
  std::string value;
  for (const ChunkDurability& c : chunks) {
    value.clear();
    c.chunk.SerializeToString(&value);
    rocksdb::Status s =
        batch.Put(chunks_, ToSlice(ChunkKey(transfer_id, c.file_index, c.chunk_index)), value);
    if (!s.ok()) return FromRocks(s, "batch", dir_);
  }
  return Write(batch, /*sync=*/true,
               absl::StrCat("record ", chunks.size(), " durable chunks of ", Av(transfer_id)));
}

absl::StatusOr<std::vector<ChunkDurability>> Journal::ListDurableChunks(
    std::string_view transfer_id) {
  if (absl::Status s = CheckId(transfer_id, "transfer id"); !s.ok()) return s;
  const std::string prefix = ChunkPrefix(transfer_id);
  std::vector<ChunkDurability> out;
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions(), chunks_));
  for (it->Seek(prefix); it->Valid(); it->Next()) {
    std::string_view key = it->key().ToStringView();
    if (key.substr(0, prefix.size()) != prefix) break;
    if (key.size() != prefix.size() + 8) {
      return absl::DataLossError(absl::StrCat("journal: malformed chunk key \"",
                                              absl::CHexEscape(Av(key)), "\" in column family ",
                                              kChunksCf));
    }
    ChunkDurability c;
    c.file_index = ReadBigEndian32(key.data() + prefix.size());
    c.chunk_index = ReadBigEndian32(key.data() + prefix.size() + 4);
    absl::StatusOr<v1::DurableChunk> p =
        Parse<v1::DurableChunk>(it->value().ToStringView(), kChunksCf, key);
    if (!p.ok()) return p.status();
    c.chunk = *std::move(p);
    out.push_back(std::move(c));
  }
  if (!it->status().ok()) return FromRocks(it->status(), "scan chunks", dir_);
  return out;
}

absl::Status Journal::DeleteChunks(std::string_view transfer_id) {
  if (absl::Status s = CheckId(transfer_id, "transfer id"); !s.ok()) return s;
  std::string begin = ChunkPrefix(transfer_id);
  std::string end(transfer_id);
  end.push_back('\1');
  rocksdb::WriteBatch batch;
  rocksdb::Status s = batch.DeleteRange(chunks_, begin, end);
  if (!s.ok()) return FromRocks(s, "batch", dir_);
  return Write(batch, /*sync=*/true, absl::StrCat("delete chunks of ", Av(transfer_id)));
}

absl::Status Journal::DeleteFileChunks(std::string_view transfer_id, uint32_t file_index) {
  if (absl::Status s = CheckId(transfer_id, "transfer id"); !s.ok()) return s;
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
  if (!s.ok()) return FromRocks(s, "batch", dir_);
  return Write(batch, /*sync=*/true,
               absl::StrCat("delete chunks of file ", file_index, " of ", Av(transfer_id)));
}

}  // namespace longhaul::storage
