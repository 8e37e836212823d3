#include "storage/chunk_io.h"

#define XXH_STATIC_LINKING_ONLY  // XXH3_state_t on the stack: no allocation
#include <xxhash.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "storage/posix_util.h"

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

absl::StatusOr<Xxh128> ReadChunkHashed(FileIo& io, int fd, uint64_t offset,
                                       absl::Span<uint8_t> buf) {
  XXH3_state_t state;
  XXH3_INITSTATE(&state);
  XXH3_128bits_reset(&state);
  absl::StatusOr<size_t> n =
      io.ReadAtStreaming(fd, offset, buf, [&state](absl::Span<const uint8_t> block) {
        XXH3_128bits_update(&state, block.data(), block.size());
      });
  if (!n.ok()) return n.status();
  if (*n != buf.size()) {
    return absl::AbortedError(absl::StrCat("source file ", internal::FdPath(fd),
                                           " shrank: expected ", buf.size(),
                                           " bytes at offset ", offset, ", found ", *n));
  }
  XXH128_hash_t h = XXH3_128bits_digest(&state);
  return Xxh128{h.low64, h.high64};
}

}  // namespace longhaul::storage
