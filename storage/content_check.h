// Whole-file content digests, for `longhaul sync --checksum`: the source
// hashes every file it offers, the destination hashes the published copy of
// each file of equal size, and a file counts unchanged only when the two
// digests are equal.
#ifndef LONGHAUL_STORAGE_CONTENT_CHECK_H_
#define LONGHAUL_STORAGE_CONTENT_CHECK_H_

#include <cstdint>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "longhaul/v1/peer.pb.h"
#include "storage/chunk_io.h"
#include "storage/exports.h"
#include "storage/file_io.h"
#include "storage/file_system.h"

namespace longhaul::storage {

// XXH3-128 (seed 0) of the first `size` bytes of `fd`, read through `io` in
// `buffer`-sized requests and hashed while they are read. `buffer` is the
// caller's scratch space (any non-zero size). The result equals
// HashBytes(whole content) for a file of exactly `size` bytes. A file that
// ends early yields absl::AbortedError ("... shrank ..."), the code of
// CheckSourceUnchanged. `cancelled` is asked between requests; once it says
// true the call returns absl::CancelledError.
absl::StatusOr<Xxh128> HashFileContent(FileIo& io, int fd, uint64_t size,
                                       absl::Span<uint8_t> buffer,
                                       absl::FunctionRef<bool()> cancelled);

// For sync --checksum: true when `name` in `dir` is a regular file of the
// manifest's size whose content has the 16-byte digest
// file.content_xxh128(). Its mtime is not compared. False when it does not
// exist, is not a regular file, differs in size or content, or the manifest
// gives no digest.
absl::StatusOr<bool> ContentMatches(FileSystem& fs, Directory& dir, const std::string& name,
                                    const v1::ManifestFile& file);

}  // namespace longhaul::storage

#endif  // LONGHAUL_STORAGE_CONTENT_CHECK_H_
