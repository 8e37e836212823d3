#include "storage/journal.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "gtest/gtest.h"
#include "rocksdb/db.h"
#include "rocksdb/env.h"
#include "rocksdb/file_system.h"
#include "spdlog/sinks/ringbuffer_sink.h"
#include "spdlog/spdlog.h"
#include "tests/storage/fillable_file_system.h"
#include "tests/storage/test_util.h"

namespace longhaul::storage {
namespace {

using testing::FillableFileSystem;
using testing::TempDir;

bool Contains(absl::string_view text, absl::string_view part) {
  return text.find(part) != absl::string_view::npos;
}

// Routes spdlog's default logger into a ring buffer for the test's lifetime.
class LogCapture {
 public:
  LogCapture()
      : sink_(std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(256)),
        previous_(spdlog::default_logger()) {
    sink_->set_pattern("%l %v");
    spdlog::set_default_logger(std::make_shared<spdlog::logger>("capture", sink_));
  }
  ~LogCapture() { spdlog::set_default_logger(previous_); }

  // Lines at warning level or above that contain `part`.
  std::vector<std::string> Problems(absl::string_view part) const {
    std::vector<std::string> out;
    for (const std::string& line : sink_->last_formatted()) {
      if ((line.rfind("warning ", 0) == 0 || line.rfind("error ", 0) == 0) &&
          Contains(line, part)) {
        out.push_back(line);
      }
    }
    return out;
  }

 private:
  std::shared_ptr<spdlog::sinks::ringbuffer_sink_mt> sink_;
  std::shared_ptr<spdlog::logger> previous_;
};

class JournalTest : public ::testing::Test {
 protected:
  // Options for a journal whose files go through fillable_, a disk the test
  // can fill.
  JournalOptions OnFillableDisk() {
    fillable_ = std::make_shared<FillableFileSystem>();
    fillable_env_ = rocksdb::NewCompositeEnv(fillable_);
    JournalOptions options;
    options.clock = &clock_;
    options.env = fillable_env_.get();
    return options;
  }

  std::unique_ptr<Journal> OpenJournal() {
    absl::StatusOr<std::unique_ptr<Journal>> j = Journal::Open(dir_.Sub("journal"), &clock_);
    EXPECT_TRUE(j.ok()) << j.status();
    return j.ok() ? *std::move(j) : nullptr;
  }

  static v1::OutgoingTransfer Outgoing(const std::string& id) {
    v1::OutgoingTransfer t;
    t.set_id(id);
    t.set_request_id("req-" + id);
    t.set_state(v1::RUNNING);
    t.mutable_manifest()->set_chunk_size(1 << 20);
    v1::ManifestFile* f = t.mutable_manifest()->add_files();
    f->set_path("a/b.bin");
    f->set_size(12345);
    t.add_source_paths("/src/a/b.bin");
    t.set_bytes_sent(777);
    return t;
  }

  static v1::IncomingTransfer Incoming(const std::string& id) {
    v1::IncomingTransfer t;
    t.set_id(id);
    t.set_source_site("site-a");
    t.set_export_name("data");
    t.set_dest_path("ckpt/step-100");
    t.set_state(v1::IncomingTransfer::RECEIVING);
    t.add_commit_last(".metadata");
    return t;
  }

  static ChunkDurability Chunk(uint32_t file, uint32_t chunk, uint64_t size) {
    ChunkDurability c;
    c.file_index = file;
    c.chunk_index = chunk;
    c.chunk.set_size(size);
    c.chunk.set_xxh128(std::string(16, static_cast<char>(file * 16 + chunk)));
    c.chunk.set_generation(1);
    return c;
  }

  // The journal's write-ahead log with the highest number (the live one).
  std::string NewestWal() const {
    std::string newest;
    for (const auto& entry : std::filesystem::directory_iterator(dir_.Sub("journal"))) {
      const std::string path = entry.path().string();
      if (entry.path().extension() == ".log" && path > newest) newest = path;
    }
    EXPECT_FALSE(newest.empty()) << "no WAL in " << dir_.Sub("journal");
    return newest;
  }

  static uint64_t FileSize(const std::string& path) { return std::filesystem::file_size(path); }

  TempDir dir_;
  FakeClock clock_;
  std::shared_ptr<FillableFileSystem> fillable_;
  std::unique_ptr<rocksdb::Env> fillable_env_;
};

TEST_F(JournalTest, OutgoingRoundTripsAndSurvivesReopen) {
  {
    auto j = OpenJournal();
    ASSERT_TRUE(j);
    ASSERT_TRUE(j->PutOutgoing(Outgoing("t1"), /*sync=*/true).ok());
    ASSERT_TRUE(j->PutOutgoing(Outgoing("t2"), /*sync=*/false).ok());
    auto got = j->GetOutgoing("t1");
    ASSERT_TRUE(got.ok()) << got.status();
    ASSERT_TRUE(got->has_value());
    EXPECT_EQ((*got)->SerializeAsString(), Outgoing("t1").SerializeAsString());
    auto missing = j->GetOutgoing("nope");
    ASSERT_TRUE(missing.ok());
    EXPECT_FALSE(missing->has_value());
  }
  auto j = OpenJournal();
  ASSERT_TRUE(j);
  auto list = j->ListOutgoing();
  ASSERT_TRUE(list.ok()) << list.status();
  ASSERT_EQ(list->size(), 2u);
  EXPECT_EQ((*list)[0].id(), "t1");
  EXPECT_EQ((*list)[1].id(), "t2");
  EXPECT_EQ((*list)[1].bytes_sent(), 777u);
  ASSERT_TRUE(j->DeleteOutgoing("t1").ok());
  list = j->ListOutgoing();
  ASSERT_TRUE(list.ok());
  ASSERT_EQ(list->size(), 1u);
  EXPECT_EQ((*list)[0].id(), "t2");
}

TEST_F(JournalTest, SubmitIsIdempotentByRequestId) {
  auto j = OpenJournal();
  ASSERT_TRUE(j);
  ASSERT_TRUE(j->PutOutgoingWithRequest(Outgoing("t1"), "req-t1").ok());
  auto id = j->LookupRequest("req-t1");
  ASSERT_TRUE(id.ok());
  ASSERT_TRUE(id->has_value());
  EXPECT_EQ(**id, "t1");
  auto none = j->LookupRequest("req-other");
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->has_value());
  // Deleting the transfer drops its request mapping.
  ASSERT_TRUE(j->DeleteOutgoing("t1").ok());
  id = j->LookupRequest("req-t1");
  ASSERT_TRUE(id.ok());
  EXPECT_FALSE(id->has_value());
}

TEST_F(JournalTest, CountersRoundTripAndGoWithTheTransfer) {
  {
    auto j = OpenJournal();
    ASSERT_TRUE(j);
    ASSERT_TRUE(j->PutOutgoing(Outgoing("t1"), /*sync=*/true).ok());
    v1::OutgoingCounters c;
    c.set_bytes_sent(4242);
    ASSERT_TRUE(j->PutOutgoingCounters("t1", c).ok());
  }
  auto j = OpenJournal();
  ASSERT_TRUE(j);
  auto got = j->GetOutgoingCounters("t1");
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_TRUE(got->has_value());
  EXPECT_EQ((*got)->bytes_sent(), 4242u);
  ASSERT_TRUE(j->DeleteOutgoing("t1").ok());
  got = j->GetOutgoingCounters("t1");
  ASSERT_TRUE(got.ok());
  EXPECT_FALSE(got->has_value());
}

TEST_F(JournalTest, IncomingRoundTripsAndSurvivesReopen) {
  {
    auto j = OpenJournal();
    ASSERT_TRUE(j);
    ASSERT_TRUE(j->PutIncoming(Incoming("in1")).ok());
    v1::IncomingTransfer published = Incoming("in2");
    published.set_state(v1::IncomingTransfer::PUBLISHED);
    ASSERT_TRUE(j->PutIncoming(published).ok());
  }
  auto j = OpenJournal();
  ASSERT_TRUE(j);
  auto got = j->GetIncoming("in2");
  ASSERT_TRUE(got.ok());
  ASSERT_TRUE(got->has_value());
  EXPECT_EQ((*got)->state(), v1::IncomingTransfer::PUBLISHED);
  auto list = j->ListIncoming();
  ASSERT_TRUE(list.ok());
  EXPECT_EQ(list->size(), 2u);
  ASSERT_TRUE(j->DeleteIncoming("in1").ok());
  got = j->GetIncoming("in1");
  ASSERT_TRUE(got.ok());
  EXPECT_FALSE(got->has_value());
}

TEST_F(JournalTest, DurableChunksListInOrderAndSurviveReopen) {
  {
    auto j = OpenJournal();
    ASSERT_TRUE(j);
    std::vector<ChunkDurability> batch = {Chunk(1, 0, 10), Chunk(0, 2, 30), Chunk(0, 1, 20),
                                          Chunk(256, 0, 5)};
    ASSERT_TRUE(j->RecordDurableChunks("t1", batch).ok());
    // Another transfer whose id extends "t1" must not show up under t1.
    ASSERT_TRUE(j->RecordDurableChunks("t10", {Chunk(0, 0, 1)}).ok());
    EXPECT_EQ(j->stats().synced_writes, 2u);
  }
  auto j = OpenJournal();
  ASSERT_TRUE(j);
  auto list = j->ListDurableChunks("t1");
  ASSERT_TRUE(list.ok()) << list.status();
  ASSERT_EQ(list->size(), 4u);
  EXPECT_EQ((*list)[0].file_index, 0u);
  EXPECT_EQ((*list)[0].chunk_index, 1u);
  EXPECT_EQ((*list)[0].chunk.size(), 20u);
  EXPECT_EQ((*list)[1].chunk_index, 2u);
  EXPECT_EQ((*list)[2].file_index, 1u);
  EXPECT_EQ((*list)[3].file_index, 256u);
  EXPECT_EQ((*list)[3].chunk.xxh128(), Chunk(256, 0, 5).chunk.xxh128());

  ASSERT_TRUE(j->DeleteFileChunks("t1", 0).ok());
  list = j->ListDurableChunks("t1");
  ASSERT_TRUE(list.ok());
  ASSERT_EQ(list->size(), 2u);
  EXPECT_EQ((*list)[0].file_index, 1u);

  ASSERT_TRUE(j->DeleteChunks("t1").ok());
  list = j->ListDurableChunks("t1");
  ASSERT_TRUE(list.ok());
  EXPECT_TRUE(list->empty());
  auto other = j->ListDurableChunks("t10");
  ASSERT_TRUE(other.ok());
  EXPECT_EQ(other->size(), 1u);
}

TEST_F(JournalTest, PartialChunksAreListedApartAndGiveWayToTheWholeChunk) {
  auto partial = [](uint32_t file, uint32_t chunk, uint64_t prefix) {
    ChunkDurability c;
    c.file_index = file;
    c.chunk_index = chunk;
    c.chunk.set_generation(2);
    c.prefix_bytes = prefix;
    return c;
  };
  {
    auto j = OpenJournal();
    ASSERT_TRUE(j);
    // One batch, as the committer writes a group: whole and partial chunks.
    ASSERT_TRUE(j->RecordDurableChunks("t1", {partial(0, 1, 4096), Chunk(0, 0, 10),
                                              partial(1, 0, 8192)})
                    .ok());
    // A later prefix of the same chunk replaces the earlier one.
    ASSERT_TRUE(j->RecordDurableChunks("t1", {partial(0, 1, 3 * 4096)}).ok());
  }
  auto j = OpenJournal();
  ASSERT_TRUE(j);
  auto whole = j->ListDurableChunks("t1");
  ASSERT_TRUE(whole.ok()) << whole.status();
  ASSERT_EQ(whole->size(), 1u);  // never a partial one
  EXPECT_EQ((*whole)[0].chunk_index, 0u);
  EXPECT_EQ((*whole)[0].prefix_bytes, 0u);
  auto parts = j->ListPartialChunks("t1");
  ASSERT_TRUE(parts.ok()) << parts.status();
  ASSERT_EQ(parts->size(), 2u);
  EXPECT_EQ((*parts)[0].file_index, 0u);
  EXPECT_EQ((*parts)[0].chunk_index, 1u);
  EXPECT_EQ((*parts)[0].prefix_bytes, 3 * 4096u);
  EXPECT_EQ((*parts)[0].chunk.generation(), 2u);
  EXPECT_EQ((*parts)[1].file_index, 1u);

  // The whole record of a chunk removes its prefix record in the same batch.
  ASSERT_TRUE(j->RecordDurableChunks("t1", {Chunk(0, 1, 20)}).ok());
  parts = j->ListPartialChunks("t1");
  ASSERT_TRUE(parts.ok());
  ASSERT_EQ(parts->size(), 1u);
  EXPECT_EQ((*parts)[0].file_index, 1u);

  ASSERT_TRUE(j->DeletePartialChunk("t1", 1, 0).ok());
  parts = j->ListPartialChunks("t1");
  ASSERT_TRUE(parts.ok());
  EXPECT_TRUE(parts->empty());

  // Range deletes take prefixes too.
  ASSERT_TRUE(j->RecordDurableChunks("t1", {partial(2, 0, 4096), partial(3, 0, 4096)}).ok());
  ASSERT_TRUE(j->RecordDurableChunks("t10", {partial(2, 0, 4096)}).ok());
  ASSERT_TRUE(j->DeleteFileChunks("t1", 2).ok());
  parts = j->ListPartialChunks("t1");
  ASSERT_TRUE(parts.ok());
  ASSERT_EQ(parts->size(), 1u);
  EXPECT_EQ((*parts)[0].file_index, 3u);
  ASSERT_TRUE(j->DeleteChunks("t1").ok());
  parts = j->ListPartialChunks("t1");
  ASSERT_TRUE(parts.ok());
  EXPECT_TRUE(parts->empty());
  auto other = j->ListPartialChunks("t10");
  ASSERT_TRUE(other.ok());
  EXPECT_EQ(other->size(), 1u);
}

TEST_F(JournalTest, DeleteFileChunksOfLastFileIndex) {
  auto j = OpenJournal();
  ASSERT_TRUE(j);
  ASSERT_TRUE(j->RecordDurableChunks("t", {Chunk(UINT32_MAX, 7, 1), Chunk(3, 0, 1)}).ok());
  ASSERT_TRUE(j->DeleteFileChunks("t", UINT32_MAX).ok());
  auto list = j->ListDurableChunks("t");
  ASSERT_TRUE(list.ok());
  ASSERT_EQ(list->size(), 1u);
  EXPECT_EQ((*list)[0].file_index, 3u);
}

TEST_F(JournalTest, RejectsIdsWithNul) {
  auto j = OpenJournal();
  ASSERT_TRUE(j);
  EXPECT_EQ(j->RecordDurableChunks(std::string("a\0b", 3), {Chunk(0, 0, 1)}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(j->PutIncoming(Incoming("")).code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(JournalTest, SyncedWriteLatencyIsMeasuredWithTheInjectedClock) {
  auto j = OpenJournal();
  ASSERT_TRUE(j);
  ASSERT_TRUE(j->PutOutgoing(Outgoing("t1"), /*sync=*/false).ok());
  EXPECT_EQ(j->stats().synced_writes, 0u);
  ASSERT_TRUE(j->PutIncoming(Incoming("i1")).ok());
  JournalStats s = j->stats();
  EXPECT_EQ(s.synced_writes, 1u);
  EXPECT_EQ(s.synced_total_us, 0u);  // the fake clock did not move
}

TEST_F(JournalTest, CorruptValueIsDataLossNamingTheKey) {
  { ASSERT_TRUE(OpenJournal()); }
  {
    // Write garbage straight into the column families.
    rocksdb::Options options;
    std::vector<std::string> names;
    ASSERT_TRUE(rocksdb::DB::ListColumnFamilies(options, dir_.Sub("journal"), &names).ok());
    std::vector<rocksdb::ColumnFamilyDescriptor> cfs;
    for (const std::string& n : names) cfs.emplace_back(n, rocksdb::ColumnFamilyOptions());
    std::vector<rocksdb::ColumnFamilyHandle*> handles;
    rocksdb::DB* raw = nullptr;
    rocksdb::Status open = rocksdb::DB::Open(options, dir_.Sub("journal"), cfs, &handles, &raw);
    ASSERT_TRUE(open.ok()) << open.ToString();
    std::unique_ptr<rocksdb::DB> db(raw);
    const std::string garbage = "\xff\xff\xff\xff not a protobuf";
    auto cf = [&](const char* name) {
      for (auto* h : handles) {
        if (h->GetName() == name) return h;
      }
      ADD_FAILURE() << "no column family " << name;
      return handles[0];
    };
    ASSERT_TRUE(db->Put({}, cf(kOutgoingCf), "bad-out", garbage).ok());
    ASSERT_TRUE(db->Put({}, cf(kIncomingCf), "bad-in", garbage).ok());
    ASSERT_TRUE(db->Put({}, cf(kChunksCf), ChunkKey("bad-chunk", 0, 0), garbage).ok());
    for (auto* h : handles) ASSERT_TRUE(db->DestroyColumnFamilyHandle(h).ok());
    ASSERT_TRUE(db->Close().ok());
  }
  auto j = OpenJournal();
  ASSERT_TRUE(j);
  auto out = j->GetOutgoing("bad-out");
  EXPECT_EQ(out.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(out.status().message().find("bad-out"), absl::string_view::npos) << out.status();
  EXPECT_EQ(j->ListOutgoing().status().code(), absl::StatusCode::kDataLoss);
  auto in = j->GetIncoming("bad-in");
  EXPECT_EQ(in.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(in.status().message().find("bad-in"), absl::string_view::npos);
  EXPECT_EQ(j->ListIncoming().status().code(), absl::StatusCode::kDataLoss);
  auto chunks = j->ListDurableChunks("bad-chunk");
  EXPECT_EQ(chunks.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(chunks.status().message().find("bad-chunk"), absl::string_view::npos);
}

TEST_F(JournalTest, FullDiskRefusesWritesServesReadsAndReopensWhenSpaceIsBack) {
  JournalOptions options = OnFillableDisk();
  FillableFileSystem* fs = fillable_.get();
  const std::string dir = dir_.Sub("journal");
  LogCapture logs;
  {
    auto opened = Journal::Open(dir, options);
    ASSERT_TRUE(opened.ok()) << opened.status();
    Journal& j = **opened;
    ASSERT_TRUE(j.PutOutgoing(Outgoing("t1"), /*sync=*/true).ok());
    EXPECT_TRUE(j.writable().ok());
    // RocksDB's own info log would be a file on the full disk; it goes to
    // the daemon's log instead.
    EXPECT_FALSE(testing::Exists(dir + "/LOG"));

    fs->set_full(true);
    absl::Status failed = j.PutOutgoing(Outgoing("t2"), /*sync=*/true);
    EXPECT_EQ(failed.code(), absl::StatusCode::kResourceExhausted) << failed;
    EXPECT_TRUE(Contains(failed.message(), "state disk full at " + dir)) << failed;
    EXPECT_TRUE(Contains(failed.message(), "No space left on device")) << failed;
    EXPECT_TRUE(IsJournalUnwritable(failed));
    EXPECT_EQ(j.writable(), failed);
    EXPECT_FALSE(IsJournalUnwritable(absl::ResourceExhaustedError("the peer's disk is full")));

    // Every later write is refused the same way (and none reaches the
    // stopped database, whose next log append would assert in RocksDB 7.8).
    v1::OutgoingCounters counters;
    counters.set_bytes_sent(1);
    EXPECT_EQ(j.PutOutgoingCounters("t1", counters), failed);
    EXPECT_EQ(j.PutIncoming(Incoming("i1")), failed);
    const ChunkDurability chunk = Chunk(0, 0, 100);
    EXPECT_EQ(j.RecordDurableChunks("i1", absl::MakeConstSpan(&chunk, 1)), failed);
    EXPECT_EQ(j.DeleteChunks("i1"), failed);
    EXPECT_EQ(j.DeleteOutgoing("t1"), failed);

    // Reads go on.
    auto t1 = j.GetOutgoing("t1");
    ASSERT_TRUE(t1.ok()) << t1.status();
    EXPECT_TRUE(t1->has_value());
    auto all = j.ListOutgoing();
    ASSERT_TRUE(all.ok()) << all.status();
    EXPECT_EQ(all->size(), 1u);

    fs->set_full(false);
    ASSERT_TRUE(j.PutOutgoing(Outgoing("t3"), /*sync=*/true).ok());
    EXPECT_TRUE(j.writable().ok());
    EXPECT_TRUE(j.PutOutgoingCounters("t1", counters).ok());
    auto t3 = j.GetOutgoing("t3");
    ASSERT_TRUE(t3.ok() && t3->has_value()) << t3.status();
    // The half-written record of the failed write was a torn tail: dropped
    // at the reopen, and said so.
    auto t2 = j.GetOutgoing("t2");
    ASSERT_TRUE(t2.ok()) << t2.status();
    EXPECT_FALSE(t2->has_value());
    std::vector<WalRecovery> dropped = j.wal_recoveries();
    ASSERT_EQ(dropped.size(), 1u);
    EXPECT_TRUE(dropped[0].torn_tail);
    EXPECT_EQ(dropped[0].records_recovered, 1u);
    EXPECT_EQ(logs.Problems("journal: WAL " + dropped[0].path).size(), 1u);
  }
  auto reopened = Journal::Open(dir, options);
  ASSERT_TRUE(reopened.ok()) << reopened.status();
  auto all = (*reopened)->ListOutgoing();
  ASSERT_TRUE(all.ok()) << all.status();
  ASSERT_EQ(all->size(), 2u);
  EXPECT_EQ((*all)[0].id(), "t1");
  EXPECT_EQ((*all)[1].id(), "t3");
}

TEST_F(JournalTest, FullDiskWithEmptyMemtablesRecoversToo) {
  // The case where RocksDB 7.8's DB::Resume keeps the failed log writer and
  // the next write asserts: nothing written since the open.
  JournalOptions options = OnFillableDisk();
  FillableFileSystem* fs = fillable_.get();
  auto opened = Journal::Open(dir_.Sub("journal"), options);
  ASSERT_TRUE(opened.ok()) << opened.status();
  Journal& j = **opened;
  fs->set_full(true);
  EXPECT_TRUE(IsJournalUnwritable(j.PutIncoming(Incoming("i1"))));
  fs->set_full(false);
  ASSERT_TRUE(j.PutIncoming(Incoming("i2")).ok());
  ASSERT_TRUE(j.PutIncoming(Incoming("i3")).ok());
  auto all = j.ListIncoming();
  ASSERT_TRUE(all.ok()) << all.status();
  ASSERT_EQ(all->size(), 2u);
  EXPECT_EQ((*all)[0].id(), "i2");
}

TEST_F(JournalTest, FailedReopenLeavesTheJournalClosedUntilOneSucceeds) {
  JournalOptions options = OnFillableDisk();
  FillableFileSystem* fs = fillable_.get();
  auto opened = Journal::Open(dir_.Sub("journal"), options);
  ASSERT_TRUE(opened.ok()) << opened.status();
  Journal& j = **opened;
  ASSERT_TRUE(j.PutOutgoing(Outgoing("t1"), /*sync=*/true).ok());

  fs->set_full(true);
  ASSERT_FALSE(j.PutOutgoing(Outgoing("t2"), /*sync=*/true).ok());
  // The disk claims space, so the next write reopens, which fails too.
  fs->set_full(true, /*reports_free=*/true);
  absl::Status failed = j.PutOutgoing(Outgoing("t2"), /*sync=*/true);
  EXPECT_TRUE(IsJournalUnwritable(failed)) << failed;
  auto read = j.GetOutgoing("t1");
  EXPECT_EQ(read.status(), j.writable());
  EXPECT_FALSE(j.writable().ok());

  fs->set_full(false);
  read = j.GetOutgoing("t1");
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_TRUE(read->has_value());
  EXPECT_TRUE(j.writable().ok());
  EXPECT_TRUE(j.PutOutgoing(Outgoing("t2"), /*sync=*/true).ok());
}

TEST_F(JournalTest, CleanReopenReportsNothingDropped) {
  LogCapture logs;
  {
    auto j = OpenJournal();
    ASSERT_TRUE(j);
    for (int i = 0; i < 5; ++i)
      ASSERT_TRUE(j->PutOutgoing(Outgoing(absl::StrCat("t", i)), true).ok());
  }
  auto j = OpenJournal();
  ASSERT_TRUE(j);
  EXPECT_TRUE(j->wal_recoveries().empty());
  EXPECT_TRUE(logs.Problems("").empty()) << logs.Problems("")[0];
}

TEST_F(JournalTest, WalTruncatedInItsLastRecordRecoversTheRestAndSaysSo) {
  uint64_t before_last = 0;
  uint64_t after_last = 0;
  std::string wal;
  {
    auto j = OpenJournal();
    ASSERT_TRUE(j);
    for (int i = 0; i < 5; ++i)
      ASSERT_TRUE(j->PutOutgoing(Outgoing(absl::StrCat("t", i)), true).ok());
    wal = NewestWal();
    before_last = FileSize(wal);
    ASSERT_TRUE(j->PutOutgoing(Outgoing("t5"), /*sync=*/true).ok());
    after_last = FileSize(wal);
  }
  const uint64_t cut = (before_last + after_last) / 2;
  ASSERT_EQ(::truncate(wal.c_str(), static_cast<off_t>(cut)), 0);

  LogCapture logs;
  auto j = OpenJournal();
  ASSERT_TRUE(j);
  auto all = j->ListOutgoing();
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_EQ(all->size(), 5u);
  std::vector<WalRecovery> dropped = j->wal_recoveries();
  ASSERT_EQ(dropped.size(), 1u);
  EXPECT_EQ(dropped[0].path, wal);
  EXPECT_TRUE(dropped[0].torn_tail);
  EXPECT_EQ(dropped[0].records_recovered, 5u);
  EXPECT_EQ(dropped[0].intact_records_dropped, 0u);
  EXPECT_EQ(dropped[0].damage_offset, before_last);
  EXPECT_EQ(dropped[0].damage, "truncated record body");
  EXPECT_EQ(dropped[0].bytes_dropped, cut - before_last);
  std::vector<std::string> lines = logs.Problems("journal: WAL " + wal);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0].rfind("warning ", 0), 0u) << lines[0];
  EXPECT_TRUE(Contains(lines[0], "torn record")) << lines[0];
  EXPECT_TRUE(Contains(lines[0], "recovered the 5 records before it")) << lines[0];
  // RocksDB's own report comes through too.
  EXPECT_EQ(logs.Problems("rocksdb: ").size(), 1u);
  EXPECT_TRUE(Contains(logs.Problems("rocksdb: ")[0], "dropping")) << logs.Problems("rocksdb: ")[0];
}

TEST_F(JournalTest, WalCorruptedInTheMiddleDropsTheRestWithAnErrorNamingIt) {
  uint64_t damaged_start = 0;
  uint64_t damaged_end = 0;
  std::string wal;
  {
    auto j = OpenJournal();
    ASSERT_TRUE(j);
    for (int i = 0; i < 6; ++i) {
      if (i == 3) {
        wal = NewestWal();
        damaged_start = FileSize(wal);
      }
      ASSERT_TRUE(j->PutOutgoing(Outgoing(absl::StrCat("t", i)), /*sync=*/true).ok());
      if (i == 3) damaged_end = FileSize(wal);
    }
  }
  {
    int fd = ::open(wal.c_str(), O_RDWR);
    ASSERT_GE(fd, 0);
    const off_t at = static_cast<off_t>((damaged_start + damaged_end) / 2);
    char byte = 0;
    ASSERT_EQ(::pread(fd, &byte, 1, at), 1);
    byte = static_cast<char>(byte ^ 0x5a);
    ASSERT_EQ(::pwrite(fd, &byte, 1, at), 1);
    ::close(fd);
  }

  LogCapture logs;
  auto j = OpenJournal();
  ASSERT_TRUE(j);
  auto all = j->ListOutgoing();
  ASSERT_TRUE(all.ok()) << all.status();
  ASSERT_EQ(all->size(), 3u);
  EXPECT_EQ(all->back().id(), "t2");
  std::vector<WalRecovery> dropped = j->wal_recoveries();
  ASSERT_EQ(dropped.size(), 1u);
  EXPECT_FALSE(dropped[0].torn_tail);
  EXPECT_EQ(dropped[0].records_recovered, 3u);
  EXPECT_EQ(dropped[0].intact_records_dropped, 2u);
  EXPECT_EQ(dropped[0].damage_offset, damaged_start);
  EXPECT_EQ(dropped[0].damage, "checksum mismatch");
  std::vector<std::string> lines = logs.Problems("journal: WAL " + wal);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0].rfind("error ", 0), 0u) << lines[0];
  EXPECT_TRUE(Contains(lines[0], absl::StrCat("damaged at byte ", damaged_start))) << lines[0];
  EXPECT_TRUE(Contains(lines[0], "the 2 intact records after it")) << lines[0];
}

TEST_F(JournalTest, WalRecordsSpanningBlocksAreCountedWhole) {
  // A record larger than a 32 KiB log block is written in fragments.
  auto big = [](const std::string& id) {
    v1::OutgoingTransfer t = Outgoing(id);
    for (int i = 0; i < 1500; ++i) {
      v1::ManifestFile* f = t.mutable_manifest()->add_files();
      f->set_path(absl::StrCat("shard/", std::string(40, 'x'), "/", i, ".distcp"));
      f->set_size(i);
    }
    return t;
  };
  uint64_t before_last = 0;
  uint64_t after_last = 0;
  std::string wal;
  {
    auto j = OpenJournal();
    ASSERT_TRUE(j);
    ASSERT_TRUE(j->PutOutgoing(big("a"), /*sync=*/true).ok());
    ASSERT_TRUE(j->PutOutgoing(Outgoing("b"), /*sync=*/true).ok());
    wal = NewestWal();
    before_last = FileSize(wal);
    ASSERT_TRUE(j->PutOutgoing(big("c"), /*sync=*/true).ok());
    after_last = FileSize(wal);
    ASSERT_GT(after_last - before_last, 2u * 32768);
  }
  ASSERT_EQ(::truncate(wal.c_str(), static_cast<off_t>(before_last + 40000)), 0);

  auto j = OpenJournal();
  ASSERT_TRUE(j);
  auto all = j->ListOutgoing();
  ASSERT_TRUE(all.ok()) << all.status();
  ASSERT_EQ(all->size(), 2u);
  std::vector<WalRecovery> dropped = j->wal_recoveries();
  ASSERT_EQ(dropped.size(), 1u);
  EXPECT_TRUE(dropped[0].torn_tail);
  EXPECT_EQ(dropped[0].records_recovered, 2u);
  EXPECT_EQ(dropped[0].damage_offset, before_last);
}

}  // namespace
}  // namespace longhaul::storage
