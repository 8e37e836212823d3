#include "storage/journal.h"

#include <memory>

#include "common/clock.h"
#include "gtest/gtest.h"
#include "rocksdb/db.h"
#include "tests/storage/test_util.h"

namespace longhaul::storage {
namespace {

using testing::TempDir;

class JournalTest : public ::testing::Test {
 protected:
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

  TempDir dir_;
  FakeClock clock_;
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

}  // namespace
}  // namespace longhaul::storage
