// TransferSender's view of its sources: the content digests of
// sync --checksum, and finding and re-reading a source that changed during
// the transfer (the session itself is in sender.cc).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/fmt_absl.h"
#include "daemon/peer/sender.h"
#include "spdlog/spdlog.h"
#include "storage/chunk_io.h"
#include "storage/chunk_plan.h"
#include "storage/content_check.h"
#include "storage/file_io.h"
#include "storage/file_system.h"
#include "storage/manifest.h"

namespace longhaul::peer {
namespace {

// Read size when hashing whole source files for sync --checksum.
constexpr size_t kDigestReadSize = size_t{8} << 20;

}  // namespace

absl::Status TransferSender::DigestSources() {
  const v1::OutgoingTransfer record = this->record();
  const v1::Manifest& manifest = record.manifest();
  std::unique_ptr<storage::FileIo> io;
  std::vector<uint8_t> buffer;
  const Timestamp start = clock_.Now();
  uint64_t files = 0, bytes = 0;
  for (int f = 0; f < manifest.files_size(); ++f) {
    const v1::ManifestFile& file = manifest.files(f);
    if (!file.content_xxh128().empty()) continue;
    if (stopping()) return absl::CancelledError("stopped");
    if (io == nullptr) {
      io = storage::MakeFileIo();
      buffer.resize(kDigestReadSize);
    }
    const std::string& path = record.source_paths(f);
    const int fd = storage::OpenCheckedSource(path);
    if (fd < 0) {
      if (errno == ENOENT) {
        return absl::FailedPreconditionError(
            absl::StrCat("source file ", path, " was removed during the transfer"));
      }
      return absl::UnavailableError(absl::StrCat("cannot open ", path, ": ", std::strerror(errno)));
    }
    // The identity is checked before and after the read, so the digest
    // belongs to the file the manifest describes.
    auto read_digest = [&]() -> absl::StatusOr<storage::Xxh128> {
      if (absl::Status s = storage::CheckSourceUnchanged(file, fd); !s.ok()) return s;
      absl::StatusOr<storage::Xxh128> d = storage::HashFileContent(
          *io, fd, file.size(), absl::MakeSpan(buffer), [this] { return stopping(); });
      if (!d.ok()) return d;
      if (absl::Status s = storage::CheckSourceUnchanged(file, fd); !s.ok()) return s;
      return d;
    };
    const absl::StatusOr<storage::Xxh128> digest = read_digest();
    ::close(fd);
    if (absl::IsAborted(digest.status())) {
      spdlog::info("transfer {}: {}; it will be hashed again", record.id(),
                   digest.status().message());
      absl::MutexLock lock(&mu_);
      changed_file_ = f;
      return digest.status();
    }
    if (!digest.ok()) return digest.status();
    const std::array<uint8_t, 16> digest_bytes = digest->ToBytes();
    {
      absl::MutexLock lock(&mu_);
      record_.mutable_manifest()->mutable_files(f)->set_content_xxh128(digest_bytes.data(),
                                                                       digest_bytes.size());
    }
    ++files;
    bytes += file.size();
  }
  if (files == 0) return absl::OkStatus();
  spdlog::info("transfer {}: hashed {} files ({} bytes) for --checksum in {:.2f} s", record.id(),
               files, bytes, (clock_.Now() - start).ToSecondsF());
  // Unsynced: digests lost in a power loss are only computed again.
  if (absl::Status s = Persist(this->record(), /*sync=*/false); !s.ok()) {
    spdlog::warn("transfer {}: cannot journal content digests: {}", record.id(), s.message());
  }
  return absl::OkStatus();
}

std::optional<uint32_t> TransferSender::FindChangedSource() {
  const v1::OutgoingTransfer record = this->record();
  for (int f = 0; f < record.manifest().files_size(); ++f) {
    int fd = storage::OpenCheckedSource(record.source_paths(f));
    if (fd < 0) return f;
    absl::Status s = storage::CheckSourceUnchanged(record.manifest().files(f), fd);
    ::close(fd);
    if (!s.ok()) {
      spdlog::info("transfer {}: {}", record.id(), s.message());
      return f;
    }
  }
  return std::nullopt;
}

absl::Status TransferSender::RefreshChangedFile(uint32_t file_index) {
  v1::OutgoingTransfer copy;
  {
    absl::MutexLock lock(&mu_);
    v1::Manifest& manifest = *record_.mutable_manifest();
    // A hard-link group changes as one: its first name and every link to
    // it are stat'ed again, so links keep the size and mode of their target
    // (ValidateManifest). A name that is no longer the target's file leaves
    // the group and is sent as a file of its own.
    const uint32_t link_of = manifest.files(static_cast<int>(file_index)).link_of();
    const uint32_t first = link_of != 0 ? link_of - 1 : file_index;
    std::vector<uint32_t> group = {first};
    for (int i = static_cast<int>(first) + 1; i < manifest.files_size(); ++i) {
      if (manifest.files(i).link_of() == first + 1) group.push_back(static_cast<uint32_t>(i));
    }
    struct stat first_st;
    for (uint32_t f : group) {
      const std::string& path = record_.source_paths(f);
      struct stat st;
      if (::stat(path.c_str(), &st) != 0) {
        return absl::FailedPreconditionError(absl::StrCat(
            "source file ", path, " changed and can no longer be read: ", std::strerror(errno)));
      }
      if (!S_ISREG(st.st_mode)) {
        return absl::FailedPreconditionError(
            absl::StrCat("source ", path, " is no longer a regular file"));
      }
      v1::ManifestFile* file = manifest.mutable_files(static_cast<int>(f));
      if (f == first) {
        first_st = st;
      } else if (st.st_dev == first_st.st_dev && st.st_ino == first_st.st_ino) {
        // One file: one identity, even if it changes between the two stats.
        st = first_st;
      } else {
        file->clear_link_of();
      }
      storage::RecordSourceIdentity(st, *file);
      storage::RecordDataExtents(path, st, *file);
      file->clear_content_xxh128();
      file->set_generation(file->generation() + 1);
    }
    copy = record_;
  }
  return Persist(copy, /*sync=*/true);
}

absl::StatusOr<std::vector<SourceDigests::Entry>> TransferSender::DigestsOfAwaitedChunks(
    const google::protobuf::RepeatedPtrField<v1::ChunkId>& awaited,
    std::unique_ptr<storage::AlignedBuffer>& buffer) {
  std::vector<SourceDigests::Entry> found;
  if (options_.source_digests == nullptr) return found;
  const v1::OutgoingTransfer record = this->record();
  const v1::Manifest& manifest = record.manifest();
  std::unique_ptr<storage::FileIo> io;
  absl::flat_hash_set<std::pair<uint32_t, uint32_t>> seen;
  for (const v1::ChunkId& id : awaited) {
    if (found.size() >= kMaxAwaitedPerAsk) break;
    if (id.file_index() >= static_cast<uint32_t>(manifest.files_size()) ||
        id.file_index() >= static_cast<uint32_t>(record.source_paths_size()) ||
        !seen.insert({id.file_index(), id.chunk_index()}).second) {
      continue;
    }
    const v1::ManifestFile& file = manifest.files(id.file_index());
    if (id.chunk_index() >= storage::ChunkCount(file, manifest.chunk_size())) continue;
    SourceDigests::Entry entry{id.file_index(), id.chunk_index(), file.generation(), {}};
    if (std::optional<storage::Xxh128> known =
            options_.source_digests->Find(id.file_index(), id.chunk_index(), file.generation())) {
      entry.xxh128 = *known;
      found.push_back(entry);
      continue;
    }
    // The relay holds a chunk no leg read here (it had it before this
    // run): read it, between two identity checks, like a chunk sent.
    const std::string& path = record.source_paths(id.file_index());
    const int fd = storage::OpenCheckedSource(path);
    if (fd < 0) {
      spdlog::warn("transfer {}: cannot open {} to vouch for a relayed chunk: {}", record.id(),
                   path, std::strerror(errno));
      continue;
    }
    if (io == nullptr) io = storage::MakeFileIo();
    if (buffer == nullptr) buffer = std::make_unique<storage::AlignedBuffer>(manifest.chunk_size());
    const uint64_t size = storage::ChunkSize(file, id.chunk_index(), manifest.chunk_size());
    absl::StatusOr<storage::Xxh128> digest;
    if (absl::Status s = storage::CheckSourceUnchanged(file, fd); !s.ok()) {
      digest = s;
    } else {
      digest = storage::ReadChunkHashed(*io, fd, uint64_t{id.chunk_index()} * manifest.chunk_size(),
                                        buffer->span(size));
      if (absl::Status after = storage::CheckSourceUnchanged(file, fd);
          digest.ok() && !after.ok()) {
        digest = after;
      }
    }
    ::close(fd);
    if (absl::IsAborted(digest.status())) {
      // Sent again whole under a new generation, like a chunk read to send.
      spdlog::info("transfer {}: {}; it will be sent again whole", record.id(),
                   digest.status().message());
      absl::MutexLock lock(&mu_);
      changed_file_ = id.file_index();
      return digest.status();
    }
    if (!digest.ok()) {
      spdlog::warn("transfer {}: cannot vouch for chunk {} of {}: {}", record.id(),
                   id.chunk_index(), path, digest.status().message());
      continue;
    }
    entry.xxh128 = *digest;
    options_.source_digests->Add(entry);
    found.push_back(entry);
  }
  return found;
}

}  // namespace longhaul::peer
