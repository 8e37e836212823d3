#include "storage/chunk_plan.h"

#include <algorithm>

namespace longhaul::storage {

uint64_t ChunkCount(const v1::ManifestFile& file, uint64_t chunk_size) {
  return ChunkCount(file.size(), chunk_size);
}

uint64_t ChunkSize(uint64_t file_size, uint64_t chunk_index, uint64_t chunk_size) {
  // Past the end first: chunk_index * chunk_size may not fit in 64 bits.
  if (chunk_index >= ChunkCount(file_size, chunk_size)) return 0;
  return std::min(chunk_size, file_size - chunk_index * chunk_size);
}

uint64_t ChunkSize(const v1::ManifestFile& file, uint64_t chunk_index, uint64_t chunk_size) {
  return ChunkSize(file.size(), chunk_index, chunk_size);
}

void ForEachChunkOfFile(const v1::Manifest& manifest, uint32_t file_index,
                        absl::FunctionRef<void(ChunkId id, uint64_t size)> fn) {
  const uint64_t chunk_size = manifest.chunk_size();
  const uint64_t file_size = manifest.files(static_cast<int>(file_index)).size();
  const uint64_t n = ChunkCount(file_size, chunk_size);
  for (uint64_t c = 0; c < n; ++c) {
    fn(ChunkId{file_index, static_cast<uint32_t>(c)}, ChunkSize(file_size, c, chunk_size));
  }
}

void ForEachChunk(const v1::Manifest& manifest,
                  absl::FunctionRef<void(ChunkId id, uint64_t size)> fn) {
  for (int f = 0; f < manifest.files_size(); ++f) {
    ForEachChunkOfFile(manifest, static_cast<uint32_t>(f), fn);
  }
}

}  // namespace longhaul::storage
