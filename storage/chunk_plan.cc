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

namespace {

// Calls fn(chunk_index) for every chunk of `file` that has data, in order.
// The extents are sorted and disjoint (ValidateManifest), so one pass over
// both suffices.
void ForEachChunkWithData(const v1::ManifestFile& file, uint64_t chunk_size,
                          absl::FunctionRef<void(uint64_t chunk_index)> fn) {
  if (file.link_of() != 0) return;  // its bytes are those of the file it links to
  const uint64_t n = ChunkCount(file.size(), chunk_size);
  if (!file.sparse()) {
    for (uint64_t c = 0; c < n; ++c) fn(c);
    return;
  }
  uint64_t next = 0;  // the first chunk not yet reported
  for (const v1::Extent& e : file.data()) {
    if (e.length() == 0 || e.offset() >= file.size()) continue;
    const uint64_t end = std::min(file.size(), e.offset() + std::min(e.length(), file.size()));
    const uint64_t first = std::max(next, e.offset() / chunk_size);
    const uint64_t last = std::min(n, (end - 1) / chunk_size + 1);  // exclusive
    for (uint64_t c = first; c < last; ++c) fn(c);
    next = std::max(next, last);
  }
}

}  // namespace

uint64_t PlannedBytes(const v1::ManifestFile& file, uint64_t chunk_size) {
  if (file.link_of() != 0) return 0;
  if (!file.sparse()) return file.size();
  uint64_t bytes = 0;
  ForEachChunkWithData(file, chunk_size,
                       [&](uint64_t c) { bytes += ChunkSize(file, c, chunk_size); });
  return bytes;
}

bool HasNoPlannedChunk(const v1::ManifestFile& file, uint64_t chunk_size) {
  return PlannedBytes(file, chunk_size) == 0;
}

void ForEachChunkOfFile(const v1::Manifest& manifest, uint32_t file_index,
                        absl::FunctionRef<void(ChunkId id, uint64_t size)> fn) {
  const uint64_t chunk_size = manifest.chunk_size();
  const v1::ManifestFile& file = manifest.files(static_cast<int>(file_index));
  ForEachChunkWithData(file, chunk_size, [&](uint64_t c) {
    fn(ChunkId{file_index, static_cast<uint32_t>(c)}, ChunkSize(file, c, chunk_size));
  });
}

v1::Manifest ManifestAsPlannedBy(const v1::Manifest& manifest, bool sparse_files, bool hard_links) {
  v1::Manifest plan = manifest;
  if (sparse_files && hard_links) return plan;
  for (v1::ManifestFile& f : *plan.mutable_files()) {
    if (!sparse_files) f.clear_sparse();
    if (!hard_links) f.clear_link_of();
  }
  return plan;
}

void ForEachChunk(const v1::Manifest& manifest,
                  absl::FunctionRef<void(ChunkId id, uint64_t size)> fn) {
  for (int f = 0; f < manifest.files_size(); ++f) {
    ForEachChunkOfFile(manifest, static_cast<uint32_t>(f), fn);
  }
}

}  // namespace longhaul::storage
