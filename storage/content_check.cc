#include "storage/content_check.h"

#define XXH_STATIC_LINKING_ONLY  // XXH3_state_t on the stack: no allocation
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <memory>
#include <string>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "storage/posix_util.h"

namespace longhaul::storage {

using internal::ErrnoError;
using internal::JoinPath;
using internal::ScopedFd;

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
      return absl::AbortedError(absl::StrCat("file ", internal::FdPath(fd), " shrank: expected ",
                                             size, " bytes, found ", offset + *n));
    }
    offset += want;
  }
  XXH128_hash_t h = XXH3_128bits_digest(&state);
  return Xxh128{h.low64, h.high64};
}

absl::StatusOr<bool> PublishedContentMatches(const ResolvedDestination& dest, bool single_file,
                                             const v1::ManifestFile& file) {
  const std::optional<Xxh128> expected = Xxh128::FromBytes(file.content_xxh128());
  if (!expected) return false;
  const std::string rel =
      single_file ? dest.relative : absl::StrCat(dest.relative, "/", file.path());
  const size_t slash = rel.rfind('/');
  const std::string_view parent =
      slash == std::string::npos ? std::string_view() : std::string_view(rel).substr(0, slash);
  const std::string base = slash == std::string::npos ? rel : rel.substr(slash + 1);
  const std::string desc = JoinPath(dest.export_root, rel);

  ScopedFd root(open(dest.export_root.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!root.valid()) return ErrnoError(errno, "cannot open export root", dest.export_root);
  absl::StatusOr<int> dir = OpenDirBeneath(root.get(), parent, /*create=*/false, dest.export_root);
  if (!dir.ok()) {
    if (absl::IsNotFound(dir.status()) || absl::IsFailedPrecondition(dir.status())) return false;
    return dir.status();
  }
  ScopedFd dir_fd(*dir);
  // O_NONBLOCK: a FIFO planted in the file's place must not block the open.
  ScopedFd fd(openat(dir_fd.get(), base.c_str(),
                     O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC));
  if (!fd.valid()) {
    if (errno == ENOENT || errno == ELOOP || errno == ENXIO) return false;
    return ErrnoError(errno, "cannot open", desc);
  }
  struct stat st;
  if (fstat(fd.get(), &st) != 0) return ErrnoError(errno, "cannot stat", desc);
  if (!S_ISREG(st.st_mode) || static_cast<uint64_t>(st.st_size) != file.size()) return false;

  PosixFileIo io;
  const size_t buffer_size = static_cast<size_t>(std::clamp<uint64_t>(file.size(), 1, kReadSize));
  std::unique_ptr<uint8_t[]> buffer(new uint8_t[buffer_size]);
  absl::StatusOr<Xxh128> actual = HashFileContent(
      io, fd.get(), file.size(), absl::MakeSpan(buffer.get(), buffer_size), [] { return false; });
  if (absl::IsAborted(actual.status())) return false;  // shrank while being read
  if (!actual.ok()) return actual.status();
  return *actual == *expected;
}

}  // namespace longhaul::storage
