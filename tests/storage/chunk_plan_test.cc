#include "storage/chunk_plan.h"

#include <cstdint>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/hash/hash_testing.h"
#include "gtest/gtest.h"

namespace longhaul::storage {
namespace {

constexpr uint64_t kChunk = 64 << 10;

v1::Manifest ManifestOf(std::vector<uint64_t> sizes) {
  v1::Manifest m;
  m.set_chunk_size(kChunk);
  for (uint64_t size : sizes) m.add_files()->set_size(size);
  return m;
}

std::vector<std::pair<ChunkId, uint64_t>> ChunksOf(const v1::Manifest& m) {
  std::vector<std::pair<ChunkId, uint64_t>> chunks;
  ForEachChunk(m, [&](ChunkId id, uint64_t size) { chunks.emplace_back(id, size); });
  return chunks;
}

TEST(ChunkPlanTest, AnEmptyFileHasNoChunks) {
  EXPECT_EQ(ChunkCount(0, kChunk), 0u);
  EXPECT_EQ(ChunkSize(0, 0, kChunk), 0u);
  EXPECT_TRUE(ChunksOf(ManifestOf({0})).empty());
}

TEST(ChunkPlanTest, AnExactMultipleHasOnlyWholeChunks) {
  EXPECT_EQ(ChunkCount(2 * kChunk, kChunk), 2u);
  EXPECT_EQ(ChunkSize(2 * kChunk, 1, kChunk), kChunk);
  EXPECT_EQ(ChunkSize(2 * kChunk, 2, kChunk), 0u);
  EXPECT_EQ(ChunksOf(ManifestOf({2 * kChunk})),
            (std::vector<std::pair<ChunkId, uint64_t>>{{{0, 0}, kChunk}, {{0, 1}, kChunk}}));
}

TEST(ChunkPlanTest, TheLastChunkIsShort) {
  EXPECT_EQ(ChunkCount(kChunk + 1, kChunk), 2u);
  EXPECT_EQ(ChunkSize(kChunk + 1, 1, kChunk), 1u);
  EXPECT_EQ(ChunkCount(1, kChunk), 1u);
  EXPECT_EQ(ChunkSize(1, 0, kChunk), 1u);
  EXPECT_EQ(ChunksOf(ManifestOf({kChunk + 1})),
            (std::vector<std::pair<ChunkId, uint64_t>>{{{0, 0}, kChunk}, {{0, 1}, 1}}));
}

TEST(ChunkPlanTest, PastTheEndOfAHugeFileIsEmptyNotAWrappedOffset) {
  const uint64_t huge = uint64_t{1} << 50;
  EXPECT_EQ(ChunkSize(huge, uint64_t{1} << 62, kChunk), 0u);
  EXPECT_EQ(ChunkSize(huge, ChunkCount(huge, kChunk) - 1, kChunk), kChunk);
}

TEST(ChunkPlanTest, ManifestFileFormsAgreeWithTheSizeForms) {
  v1::ManifestFile file;
  file.set_size(2 * kChunk + 5);
  EXPECT_EQ(ChunkCount(file, kChunk), ChunkCount(file.size(), kChunk));
  EXPECT_EQ(ChunkSize(file, 2, kChunk), 5u);
}

TEST(ChunkPlanTest, ForEachChunkWalksFileByFileSkippingEmptyFiles) {
  const v1::Manifest m = ManifestOf({kChunk + 3, 0, 7});
  EXPECT_EQ(ChunksOf(m), (std::vector<std::pair<ChunkId, uint64_t>>{
                             {{0, 0}, kChunk}, {{0, 1}, 3}, {{2, 0}, 7}}));
  std::vector<ChunkId> of_first;
  ForEachChunkOfFile(m, 0, [&](ChunkId id, uint64_t) { of_first.push_back(id); });
  EXPECT_EQ(of_first, (std::vector<ChunkId>{{0, 0}, {0, 1}}));
}

void AddExtent(v1::ManifestFile& f, uint64_t offset, uint64_t length) {
  f.set_sparse(true);
  v1::Extent* e = f.add_data();
  e->set_offset(offset);
  e->set_length(length);
}

TEST(ChunkPlanTest, ChunksWhollyInHolesAreNotPlanned) {
  // 5 chunks, the last short: data in the end of chunk 1 and the start of
  // chunk 2 (one extent across the boundary), and 1 byte of chunk 4.
  v1::Manifest m = ManifestOf({4 * kChunk + 100});
  v1::ManifestFile& f = *m.mutable_files(0);
  AddExtent(f, 2 * kChunk - 10, 20);
  AddExtent(f, 4 * kChunk + 99, 1);
  EXPECT_EQ(ChunksOf(m), (std::vector<std::pair<ChunkId, uint64_t>>{
                             {{0, 1}, kChunk}, {{0, 2}, kChunk}, {{0, 4}, 100}}));
  EXPECT_EQ(PlannedBytes(f, kChunk), 2 * kChunk + 100);
  EXPECT_FALSE(HasNoPlannedChunk(f, kChunk));
  // Not sparse: every chunk, whatever `data` says.
  f.set_sparse(false);
  EXPECT_EQ(ChunksOf(m).size(), 5u);
  EXPECT_EQ(PlannedBytes(f, kChunk), 4 * kChunk + 100);
}

TEST(ChunkPlanTest, AFileOfHolesOnlyHasNoPlannedChunk) {
  v1::Manifest m = ManifestOf({256 * kChunk, 0, 1});
  m.mutable_files(0)->set_sparse(true);
  EXPECT_EQ(ChunksOf(m), (std::vector<std::pair<ChunkId, uint64_t>>{{{2, 0}, 1}}));
  EXPECT_TRUE(HasNoPlannedChunk(m.files(0), kChunk));
  EXPECT_TRUE(HasNoPlannedChunk(m.files(1), kChunk));
  EXPECT_FALSE(HasNoPlannedChunk(m.files(2), kChunk));
  EXPECT_EQ(PlannedBytes(m.files(0), kChunk), 0u);
}

// ManifestFile.link_of: a linked name's bytes are its target's, sent once.
TEST(ChunkPlanTest, AHardLinkHasNoPlannedChunk) {
  v1::Manifest m = ManifestOf({2 * kChunk, 2 * kChunk, 2 * kChunk});
  m.mutable_files(2)->set_link_of(2);
  std::vector<uint32_t> files;
  ForEachChunk(m, [&](ChunkId id, uint64_t) { files.push_back(id.file_index); });
  EXPECT_EQ(files, (std::vector<uint32_t>{0, 0, 1, 1}));
  EXPECT_EQ(PlannedBytes(m.files(2), kChunk), 0u);
  EXPECT_TRUE(HasNoPlannedChunk(m.files(2), kChunk));
  EXPECT_EQ(PlannedBytes(m.files(1), kChunk), 2 * kChunk);
}

// A receiver that did not announce OpenReply.hard_links ignores link_of: it
// is sent every name whole, so nothing is lost. One that did not announce
// sparse_files is sent holes as zeros.
TEST(ChunkPlanTest, AnOlderReceiverIsPlannedEveryNameAndEveryHole) {
  v1::Manifest m = ManifestOf({2 * kChunk, 2 * kChunk});
  m.mutable_files(1)->set_link_of(1);
  m.mutable_files(0)->set_sparse(true);  // all holes
  EXPECT_TRUE(ChunksOf(ManifestAsPlannedBy(m, true, true)).empty());
  const auto without_links = ChunksOf(ManifestAsPlannedBy(m, true, false));
  ASSERT_EQ(without_links.size(), 2u);  // file 1 only
  EXPECT_EQ(without_links[0].first, (ChunkId{1, 0}));
  EXPECT_EQ(ChunksOf(ManifestAsPlannedBy(m, false, true)).size(), 2u);  // file 0 only
  const v1::Manifest older = ManifestAsPlannedBy(m, false, false);
  EXPECT_EQ(ChunksOf(older).size(), 4u);
  EXPECT_EQ(older.files(1).link_of(), 0u);
}

TEST(ChunkIdTest, HashesAndComparesByFileThenChunk) {
  EXPECT_TRUE(absl::VerifyTypeImplementsAbslHashCorrectly(
      {ChunkId{0, 0}, ChunkId{0, 1}, ChunkId{1, 0}, ChunkId{UINT32_MAX, UINT32_MAX}}));
  EXPECT_LT((ChunkId{0, 9}), (ChunkId{1, 0}));
  EXPECT_LT((ChunkId{1, 0}), (ChunkId{1, 1}));
  // File and chunk are not interchangeable.
  absl::flat_hash_map<ChunkId, int> map;
  map[{1, 2}] = 12;
  map[{2, 1}] = 21;
  EXPECT_EQ(map.at({1, 2}), 12);
  EXPECT_EQ(map.at({2, 1}), 21);
}

}  // namespace
}  // namespace longhaul::storage
