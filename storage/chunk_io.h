// Reading chunks with their XXH3-128 digest computed while reading.
#ifndef LONGHAUL_STORAGE_CHUNK_IO_H_
#define LONGHAUL_STORAGE_CHUNK_IO_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "longhaul/v1/peer.pb.h"
#include "storage/file_io.h"
#include "storage/file_system.h"

struct XXH3_state_s;  // xxhash.h

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

// Reads the chunks of `file` (a manifest file cut into `chunk_size` chunks)
// from the open descriptor `fd`, in order, with ReadChunkHashed into
// `buffer`, which holds at least min(chunk_size, file.size()) bytes, and
// calls on_chunk(chunk_index, size, digest) for each. Stops early when
// on_chunk returns false. Returns the first read error (AbortedError when the
// file ends before file.size()); no chunk is read after it.
absl::Status HashFileChunks(
    FileIo& io, int fd, const v1::ManifestFile& file, uint64_t chunk_size,
    absl::Span<uint8_t> buffer,
    absl::FunctionRef<bool(uint32_t chunk_index, uint64_t size, const Xxh128& digest)> on_chunk);

// A buffer whose address and capacity are multiples of kDirectIoAlignment,
// for direct I/O (common/chunk_memory.h's MapChunkMemory from 1 MiB on). The contents start
// undefined.
class AlignedBuffer {
 public:
  // Room for at least `size` bytes (capacity() is `size` rounded up).
  // Aborts when memory is exhausted, like operator new.
  explicit AlignedBuffer(size_t size);
  uint8_t* data() const { return data_.get(); }
  size_t capacity() const { return capacity_; }
  absl::Span<uint8_t> span(size_t size) const { return absl::Span<uint8_t>(data_.get(), size); }

 private:
  struct Free {
    void operator()(uint8_t* p) const;
    size_t capacity;
  };
  std::unique_ptr<uint8_t, Free> data_;
  size_t capacity_ = 0;
};

// Writes all of `data` at `offset` of a staged `file` through `io`; a file
// with no OS descriptor (fd() < 0: a test's in-memory FileSystem) is written
// through File::WriteAt instead. Where the file has a direct_fd() and `offset` is aligned,
// the whole blocks go there, bypassing the page cache (from `data` itself
// when its address is aligned, else from an aligned copy), and a last
// partial block goes through fd(): padding it would make the file longer
// than its declared size until a truncate, and would be a file-extending
// direct write, which takes the inode lock exclusively. A direct write the
// device refuses (EINVAL: alignment) is done through fd() instead.
// Not durable by itself: file.SyncData() covers both descriptors.
absl::Status WriteChunk(FileIo& io, File& file, uint64_t offset, absl::Span<const uint8_t> data);

// Reads buf.size() bytes of a staged `file` at `offset` into `buf` and feeds
// them, in order, to `state` (an XXH3-128 state: xxhash.h with
// XXH_STATIC_LINKING_ONLY), the way ReadChunkHashed below reads them. Returns
// the bytes read: fewer only where the file ends. A range the device refuses
// direct is read again buffered, with `state` as it was before. A file with
// no OS descriptor (fd() < 0) is read through File::ReadAt.
absl::StatusOr<size_t> ReadStagedHashing(FileIo& io, File& file, uint64_t offset,
                                         absl::Span<uint8_t> buf, XXH3_state_s& state);

// ReadChunkHashed of a staged `file`: the whole blocks are read from its
// direct_fd() where it has one, `offset` is aligned and `buf` starts at an
// aligned address (an AlignedBuffer), so the bytes hashed are the ones on
// the device and not a cached copy; a last partial block, and everything
// otherwise, is read through fd().
absl::StatusOr<Xxh128> ReadChunkHashed(FileIo& io, File& file, uint64_t offset,
                                       absl::Span<uint8_t> buf);

}  // namespace longhaul::storage

#endif  // LONGHAUL_STORAGE_CHUNK_IO_H_
