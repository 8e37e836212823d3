#include "storage/content_check.h"


#include <algorithm>
#include <cerrno>
#include <memory>
#include <string>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "storage/posix_util.h"
#include "storage/xxh3.h"

namespace longhaul::storage {

using internal::FdPath;

namespace {

// Read size of the destination-side hash: large enough for sequential
// throughput, small enough to allocate per file.
constexpr uint64_t kReadSize = uint64_t{4} << 20;

}  // namespace

absl::StatusOr<Xxh128> HashFileContent(FileIo& io, int fd, uint64_t size,
                                       absl::Span<uint8_t> buffer,
                                       absl::FunctionRef<bool()> cancelled) {
  if (buffer.empty()) return absl::InvalidArgumentError("HashFileContent needs a buffer");
  XXH3_state_t state;
  XXH3_INITSTATE(&state);
  XXH3_128bits_reset(&state);
  for (uint64_t offset = 0; offset < size;) {
    if (cancelled()) return absl::CancelledError("stopped");
    const size_t want = static_cast<size_t>(std::min<uint64_t>(buffer.size(), size - offset));
    absl::StatusOr<size_t> n = io.ReadAtStreaming(
        fd, offset, buffer.subspan(0, want), [&state](absl::Span<const uint8_t> block) {
          XXH3_128bits_update(&state, block.data(), block.size());
        });
    if (!n.ok()) return n.status();
    if (*n != want) {
      return absl::AbortedError(absl::StrCat("file ", FdPath(fd), " shrank: expected ",
                                             size, " bytes, found ", offset + *n));
    }
    offset += want;
  }
  XXH128_hash_t h = XXH3_128bits_digest(&state);
  return Xxh128{h.low64, h.high64};
}

absl::StatusOr<bool> ContentMatches(FileSystem& fs, Directory& dir, const std::string& name,
                                    const v1::ManifestFile& file) {
  const std::optional<Xxh128> expected = Xxh128::FromBytes(file.content_xxh128());
  if (!expected) return false;
  absl::StatusOr<std::optional<FileInfo>> st = fs.Stat(dir, name);
  if (!st.ok()) return st.status();
  if (!st->has_value() || !(*st)->is_regular() || (*st)->size != file.size()) return false;
  absl::StatusOr<std::unique_ptr<File>> f = fs.OpenFile(dir, name, OpenMode::kRead);
  if (absl::IsNotFound(f.status()) || absl::IsPermissionDenied(f.status()) ||
      absl::IsFailedPrecondition(f.status())) {
    return false;  // replaced meanwhile
  }
  if (!f.ok()) return f.status();
  const size_t buffer_size = static_cast<size_t>(std::clamp<uint64_t>(file.size(), 1, kReadSize));
  std::unique_ptr<uint8_t[]> buffer(new uint8_t[buffer_size]);
  XXH3_state_t state;
  XXH3_INITSTATE(&state);
  XXH3_128bits_reset(&state);
  for (uint64_t offset = 0; offset < file.size();) {
    const size_t want = static_cast<size_t>(std::min<uint64_t>(buffer_size, file.size() - offset));
    absl::StatusOr<size_t> n = (*f)->ReadAt(offset, absl::MakeSpan(buffer.get(), want));
    if (!n.ok()) return n.status();
    if (*n != want) return false;  // shrank while being read
    XXH3_128bits_update(&state, buffer.get(), want);
    offset += want;
  }
  XXH128_hash_t h = XXH3_128bits_digest(&state);
  return Xxh128{h.low64, h.high64} == *expected;
}

}  // namespace longhaul::storage
