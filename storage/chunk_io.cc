#include "storage/chunk_io.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/check.h"
#include "common/chunk_memory.h"
#include "storage/chunk_plan.h"
#include "storage/posix_util.h"
#include "storage/xxh3.h"

namespace longhaul::storage {

std::array<uint8_t, 16> Xxh128::ToBytes() const {
  std::array<uint8_t, 16> out;
  for (int i = 0; i < 8; ++i) {
    out[i] = static_cast<uint8_t>(low >> (8 * i));
    out[8 + i] = static_cast<uint8_t>(high >> (8 * i));
  }
  return out;
}

std::optional<Xxh128> Xxh128::FromBytes(absl::Span<const uint8_t> bytes) {
  if (bytes.size() != 16) return std::nullopt;
  Xxh128 h;
  for (int i = 0; i < 8; ++i) {
    h.low |= uint64_t{bytes[i]} << (8 * i);
    h.high |= uint64_t{bytes[8 + i]} << (8 * i);
  }
  return h;
}

std::optional<Xxh128> Xxh128::FromBytes(std::string_view bytes) {
  return FromBytes(absl::Span<const uint8_t>(reinterpret_cast<const uint8_t*>(bytes.data()),
                                             bytes.size()));
}

std::string Xxh128::ToString() const { return absl::StrFormat("%016x%016x", high, low); }

Xxh128 HashBytes(absl::Span<const uint8_t> data) {
  XXH128_hash_t h = XXH3_128bits(data.data(), data.size());
  return Xxh128{h.low64, h.high64};
}

namespace {

bool IsAligned(uint64_t value) { return value % kDirectIoAlignment == 0; }
bool IsAligned(const void* p) { return IsAligned(reinterpret_cast<uintptr_t>(p)); }

// Reads buf.size() bytes at `offset` of `fd` into `buf`, feeding them to
// `state`; returns the number read (short at end of file).
absl::StatusOr<size_t> ReadHashing(FileIo& io, int fd, uint64_t offset, absl::Span<uint8_t> buf,
                                   XXH3_state_t& state) {
  return io.ReadAtStreaming(fd, offset, buf, [&state](absl::Span<const uint8_t> block) {
    XXH3_128bits_update(&state, block.data(), block.size());
  });
}

// `what` names the file: "source file /x/y".
absl::Status ShrankError(const std::string& what, uint64_t offset, size_t wanted, size_t found) {
  return absl::AbortedError(absl::StrCat(what, " shrank: expected ", wanted, " bytes at offset ",
                                         offset, ", found ", found));
}

}  // namespace

absl::StatusOr<Xxh128> ReadChunkHashed(FileIo& io, int fd, uint64_t offset,
                                       absl::Span<uint8_t> buf) {
  XXH3_state_t state;
  XXH3_INITSTATE(&state);
  XXH3_128bits_reset(&state);
  absl::StatusOr<size_t> n = ReadHashing(io, fd, offset, buf, state);
  if (!n.ok()) return n.status();
  if (*n != buf.size()) {
    return ShrankError(absl::StrCat("source file ", internal::FdPath(fd)), offset, buf.size(), *n);
  }
  XXH128_hash_t h = XXH3_128bits_digest(&state);
  return Xxh128{h.low64, h.high64};
}

namespace {
constexpr size_t kMapAlignedFrom = 1u << 20;
}  // namespace

AlignedBuffer::AlignedBuffer(size_t size)
    : data_(nullptr, Free{(std::max<size_t>(size, 1) + kDirectIoAlignment - 1) /
                          kDirectIoAlignment * kDirectIoAlignment}),
      capacity_(data_.get_deleter().capacity) {
  void* p = capacity_ >= kMapAlignedFrom ? MapChunkMemory(capacity_)
                                         : std::aligned_alloc(kDirectIoAlignment, capacity_);
  LONGHAUL_CHECK(p != nullptr) << "out of memory for a " << capacity_ << "-byte chunk buffer";
  data_.reset(static_cast<uint8_t*>(p));
}

void AlignedBuffer::Free::operator()(uint8_t* p) const {
  if (capacity >= kMapAlignedFrom) {
    UnmapChunkMemory(p, capacity);
  } else {
    std::free(p);
  }
}

absl::Status WriteChunk(FileIo& io, File& file, uint64_t offset, absl::Span<const uint8_t> data) {
  if (file.fd() < 0) return file.WriteAt(offset, data);
  const int direct = file.direct_fd();
  const size_t whole = data.size() - data.size() % kDirectIoAlignment;
  if (direct < 0 || !IsAligned(offset) || whole == 0) return io.WriteAt(file.fd(), offset, data);
  absl::Span<const uint8_t> blocks = data.first(whole);
  std::optional<AlignedBuffer> copy;
  if (!IsAligned(blocks.data())) {
    copy.emplace(whole);
    std::memcpy(copy->data(), blocks.data(), whole);
    blocks = absl::Span<const uint8_t>(copy->data(), whole);
  }
  absl::Status written = io.WriteAt(direct, offset, blocks);
  if (absl::IsInvalidArgument(written)) written = io.WriteAt(file.fd(), offset, data.first(whole));
  if (!written.ok()) return written;
  return io.WriteAt(file.fd(), offset + whole, data.subspan(whole));
}

absl::StatusOr<size_t> ReadStagedHashing(FileIo& io, File& file, uint64_t offset,
                                         absl::Span<uint8_t> buf, XXH3_state_t& state) {
  if (file.fd() < 0) {
    absl::StatusOr<size_t> n = file.ReadAt(offset, buf);
    if (n.ok()) XXH3_128bits_update(&state, buf.data(), *n);
    return n;
  }
  const int direct = file.direct_fd();
  const size_t whole = buf.size() - buf.size() % kDirectIoAlignment;
  if (direct < 0 || !IsAligned(offset) || !IsAligned(buf.data()) || whole == 0) {
    return ReadHashing(io, file.fd(), offset, buf, state);
  }
  XXH3_state_t before;
  XXH3_copyState(&before, &state);
  absl::StatusOr<size_t> n = ReadHashing(io, direct, offset, buf.first(whole), state);
  if (absl::IsInvalidArgument(n.status())) {
    XXH3_copyState(&state, &before);
    return ReadHashing(io, file.fd(), offset, buf, state);
  }
  if (!n.ok() || *n != whole) return n;
  absl::StatusOr<size_t> tail = ReadHashing(io, file.fd(), offset + whole, buf.subspan(whole), state);
  if (!tail.ok()) return tail.status();
  return whole + *tail;
}

absl::StatusOr<Xxh128> ReadChunkHashed(FileIo& io, File& file, uint64_t offset,
                                       absl::Span<uint8_t> buf) {
  XXH3_state_t state;
  XXH3_INITSTATE(&state);
  XXH3_128bits_reset(&state);
  absl::StatusOr<size_t> n = ReadStagedHashing(io, file, offset, buf, state);
  if (!n.ok()) return n.status();
  if (*n != buf.size()) {
    return ShrankError(absl::StrCat("staged file ", file.path()), offset, buf.size(), *n);
  }
  XXH128_hash_t h = XXH3_128bits_digest(&state);
  return Xxh128{h.low64, h.high64};
}

absl::Status HashFileChunks(
    FileIo& io, int fd, const v1::ManifestFile& file, uint64_t chunk_size,
    absl::Span<uint8_t> buffer,
    absl::FunctionRef<bool(uint32_t chunk_index, uint64_t size, const Xxh128& digest)> on_chunk) {
  const uint64_t n = ChunkCount(file, chunk_size);
  for (uint64_t c = 0; c < n; ++c) {
    const uint64_t size = ChunkSize(file, c, chunk_size);
    LONGHAUL_CHECK(size <= buffer.size());
    absl::StatusOr<Xxh128> digest =
        ReadChunkHashed(io, fd, c * chunk_size, buffer.subspan(0, size));
    if (!digest.ok()) return digest.status();
    if (!on_chunk(static_cast<uint32_t>(c), size, *digest)) break;
  }
  return absl::OkStatus();
}

}  // namespace longhaul::storage
