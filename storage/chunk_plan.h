// How a manifest's files split into chunks: the id of a chunk, chunk
// arithmetic, and walking a manifest chunk by chunk. Reading a file's chunks
// with their digests is HashFileChunks (chunk_io.h).
#ifndef LONGHAUL_STORAGE_CHUNK_PLAN_H_
#define LONGHAUL_STORAGE_CHUNK_PLAN_H_

#include <compare>
#include <cstdint>
#include <utility>

#include "absl/functional/function_ref.h"
#include "longhaul/v1/peer.pb.h"

namespace longhaul::storage {

// Chunk `chunk_index` of manifest file `file_index`: the key of a chunk in
// the sessions' per-chunk maps. Hashable (absl); ordered by file, then chunk.
struct ChunkId {
  uint32_t file_index = 0;
  uint32_t chunk_index = 0;

  friend bool operator==(const ChunkId&, const ChunkId&) = default;
  friend std::strong_ordering operator<=>(const ChunkId&, const ChunkId&) = default;
  template <typename H>
  friend H AbslHashValue(H h, const ChunkId& id) {
    return H::combine(std::move(h), id.file_index, id.chunk_index);
  }
};

// Number of chunks of a file of `file_size` bytes: 0 for an empty file, and a
// short last chunk counts as one. chunk_size > 0.
constexpr uint64_t ChunkCount(uint64_t file_size, uint64_t chunk_size) {
  return file_size / chunk_size + (file_size % chunk_size != 0 ? 1 : 0);
}
uint64_t ChunkCount(const v1::ManifestFile& file, uint64_t chunk_size);

// Size of chunk `chunk_index` of a file of `file_size` bytes: chunk_size, less
// for a short last chunk, 0 past the end. chunk_size > 0.
uint64_t ChunkSize(uint64_t file_size, uint64_t chunk_index, uint64_t chunk_size);
uint64_t ChunkSize(const v1::ManifestFile& file, uint64_t chunk_index, uint64_t chunk_size);

// The bytes of `file` the plan sends: the sizes of its chunks with data; 0
// for a hard link of an earlier file (ManifestFile.link_of).
uint64_t PlannedBytes(const v1::ManifestFile& file, uint64_t chunk_size);

// Whether the plan sends no chunk of `file` (0 bytes, all holes, or a hard
// link of an earlier file).
bool HasNoPlannedChunk(const v1::ManifestFile& file, uint64_t chunk_size);

// Calls fn(id, size) for every chunk of file `file_index` of `manifest` that
// has data, in chunk order: all of them, except for a sparse file
// (ManifestFile.sparse) the chunks lying wholly in its holes, which are
// never sent and read as zeros in a file made `size` bytes long without
// writing them, and none of a hard link of an earlier file
// (ManifestFile.link_of), which is published as a link to that file.
// file_index < manifest.files_size().
void ForEachChunkOfFile(const v1::Manifest& manifest, uint32_t file_index,
                        absl::FunctionRef<void(ChunkId id, uint64_t size)> fn);

// The manifest as a receiver plans it, by what its OpenReply announced:
// without `sparse_files` (an older receiver) every file is planned whole,
// holes sent as zeros; without `hard_links` every linked name is planned as
// an independent file, its bytes read from its own source path. Returns
// `manifest` unchanged when both are announced.
v1::Manifest ManifestAsPlannedBy(const v1::Manifest& manifest, bool sparse_files, bool hard_links);

// Calls fn(id, size) for every chunk of `manifest` that has data: file by
// file, each in chunk order. An empty file has none.
void ForEachChunk(const v1::Manifest& manifest,
                  absl::FunctionRef<void(ChunkId id, uint64_t size)> fn);

}  // namespace longhaul::storage

#endif  // LONGHAUL_STORAGE_CHUNK_PLAN_H_
