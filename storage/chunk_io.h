// Reading chunks with their XXH3-128 digest computed while reading.
#ifndef LONGHAUL_STORAGE_CHUNK_IO_H_
#define LONGHAUL_STORAGE_CHUNK_IO_H_

#include <array>
#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "storage/file_io.h"

namespace longhaul::storage {

// An XXH3-128 digest. On the wire and in the journal it is 16 bytes:
// `low` little-endian, then `high` little-endian (see DurableChunk.xxh128).
struct Xxh128 {
  uint64_t low = 0;
  uint64_t high = 0;

  std::array<uint8_t, 16> ToBytes() const;
  // Accepts exactly 16 bytes; std::nullopt otherwise.
  static std::optional<Xxh128> FromBytes(absl::Span<const uint8_t> bytes);
  static std::optional<Xxh128> FromBytes(std::string_view bytes);
  // 32 lowercase hex digits, `high` first: xxhsum's canonical form.
  std::string ToString() const;

  friend bool operator==(const Xxh128& a, const Xxh128& b) = default;
};

// XXH3-128 of `data` (seed 0).
Xxh128 HashBytes(absl::Span<const uint8_t> data);

// Reads exactly buf.size() bytes at `offset` into `buf` and returns their
// XXH3-128, hashing each sub-block as soon as it is complete (with io_uring,
// while the next sub-blocks are in flight). A file that ends early yields
// absl::AbortedError("source file <path> shrank: ...") — the same code as
// CheckSourceUnchanged, meaning "re-read this file whole".
absl::StatusOr<Xxh128> ReadChunkHashed(FileIo& io, int fd, uint64_t offset,
                                       absl::Span<uint8_t> buf);

}  // namespace longhaul::storage

#endif  // LONGHAUL_STORAGE_CHUNK_IO_H_
