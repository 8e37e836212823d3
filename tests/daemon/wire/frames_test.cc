// The frame codecs: chunk headers with an offset, progress reports, and the
// checks of a chunk frame's extent against what the receiver holds.
#include "daemon/wire/frames.h"

#include <array>
#include <string>

#include "gtest/gtest.h"

namespace longhaul::wire {
namespace {

absl::Span<const uint8_t> Bytes(const std::string& s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

TEST(ChunkHeaderTest, CarriesTheOffsetWithinTheChunk) {
  std::array<uint8_t, kChunkHeaderSize> bytes;
  EncodeChunkHeader({7, 9, 2, 0x1122334455667788ull, 0x99aabbccddeeff00ull, 8u << 20}, bytes);
  EXPECT_EQ(bytes[12] | bytes[13] << 8 | bytes[14] << 16 | bytes[15] << 24, 8 << 20);
  auto header = ParseChunkHeader(bytes);
  ASSERT_TRUE(header.ok()) << header.status();
  EXPECT_EQ(header->file_index, 7u);
  EXPECT_EQ(header->chunk_index, 9u);
  EXPECT_EQ(header->generation, 2u);
  EXPECT_EQ(header->offset, 8u << 20);
  EXPECT_EQ(header->xxh128_low, 0x1122334455667788ull);
  EXPECT_EQ(header->xxh128_high, 0x99aabbccddeeff00ull);
}

TEST(ChunkProgressTest, RoundTrips) {
  const std::string bytes = EncodeChunkProgress({3, 4, 5, uint64_t{12} << 30});
  ASSERT_EQ(bytes.size(), kChunkProgressSize);
  auto progress = ParseChunkProgress(Bytes(bytes));
  ASSERT_TRUE(progress.ok()) << progress.status();
  EXPECT_EQ(progress->file_index, 3u);
  EXPECT_EQ(progress->chunk_index, 4u);
  EXPECT_EQ(progress->generation, 5u);
  EXPECT_EQ(progress->durable_bytes, uint64_t{12} << 30);
}

TEST(ChunkProgressTest, RefusesMalformedReports) {
  const std::string good = EncodeChunkProgress({0, 1, 0, 4096});
  EXPECT_FALSE(ParseChunkProgress(Bytes(good.substr(0, kChunkProgressSize - 1))).ok());
  EXPECT_FALSE(ParseChunkProgress(Bytes(good + "x")).ok());
  std::string reserved = good;
  reserved[13] = 1;
  EXPECT_EQ(ParseChunkProgress(Bytes(reserved)).status().message(),
            "chunk progress has reserved bits set");
  EXPECT_EQ(ParseChunkProgress(Bytes(EncodeChunkProgress({0, 1, 0, 0}))).status().message(),
            "chunk progress reports no durable bytes");
}

TEST(FrameHeaderTest, KnowsTheProgressTypeAndNoneAfterIt) {
  std::array<uint8_t, kFrameHeaderSize> bytes;
  EncodeFrameHeader({FrameType::kChunkProgress, kChunkProgressSize, 42}, bytes);
  auto header = ParseFrameHeader(bytes, kChunkProgressSize);
  ASSERT_TRUE(header.ok()) << header.status();
  EXPECT_EQ(header->type, FrameType::kChunkProgress);
  bytes[5] = 6;
  EXPECT_EQ(ParseFrameHeader(bytes, kChunkProgressSize).status().message(), "unknown frame type 6");
}

TEST(ChunkExtentTest, AFrameRunsFromZeroOrTheDurablePrefixToTheChunksEnd) {
  constexpr uint64_t kChunk = 16u << 20;
  constexpr uint64_t kPrefix = 8u << 20;
  EXPECT_TRUE(CheckChunkExtent(0, kChunk, kChunk, 0).ok());
  EXPECT_TRUE(CheckChunkExtent(0, kChunk, kChunk, kPrefix).ok());  // sent again whole
  EXPECT_TRUE(CheckChunkExtent(kPrefix, kChunk - kPrefix, kChunk, kPrefix).ok());
}

TEST(ChunkExtentTest, RefusesHostileExtents) {
  constexpr uint64_t kChunk = 16u << 20;
  constexpr uint64_t kPrefix = 8u << 20;
  // Past the chunk's end: more payload than the chunk has from the offset.
  EXPECT_FALSE(CheckChunkExtent(kPrefix, kChunk - kPrefix + 1, kChunk, kPrefix).ok());
  EXPECT_FALSE(CheckChunkExtent(0, kChunk + 1, kChunk, 0).ok());
  // An offset past the chunk, and one whose payload would wrap around.
  EXPECT_FALSE(CheckChunkExtent(kChunk + 1, 0, kChunk, kChunk + 1).ok());
  EXPECT_FALSE(
      CheckChunkExtent(UINT32_MAX, UINT64_MAX - UINT32_MAX + 1 + kChunk, kChunk, UINT32_MAX).ok());
  // Short of the chunk's end.
  EXPECT_FALSE(CheckChunkExtent(0, kChunk - 1, kChunk, 0).ok());
  // An offset that is not the durable prefix, before or after it, or with
  // nothing durable.
  absl::Status s = CheckChunkExtent(4u << 20, kChunk - (4u << 20), kChunk, kPrefix);
  EXPECT_EQ(s.message(),
            "a chunk frame starts at offset 4194304 of its chunk, where 8388608 bytes are "
            "durable: it must start at 0 or there");
  EXPECT_FALSE(CheckChunkExtent(12u << 20, kChunk - (12u << 20), kChunk, kPrefix).ok());
  EXPECT_FALSE(CheckChunkExtent(kPrefix, kChunk - kPrefix, kChunk, 0).ok());
}

}  // namespace
}  // namespace longhaul::wire
