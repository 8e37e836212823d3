#ifndef LONGHAUL_COMMON_CHUNK_MEMORY_H_
#define LONGHAUL_COMMON_CHUNK_MEMORY_H_

#include <cstddef>
#include <cstdint>

namespace longhaul {

// Anonymous memory for chunk data: `bytes` mapped privately, page aligned,
// zero-filled by the kernel on first touch, asking for transparent huge pages
// (fewer page-table walks when the kernel pins the pages for direct I/O, and
// fewer TLB misses when hashing). nullptr when the mapping fails. Released
// with UnmapChunkMemory(p, bytes), with the same `bytes`.
//
// A memory facility, not a file one: the frame buffers of daemon/wire and the
// buffer pools of storage/ both take their chunk memory from here.
uint8_t* MapChunkMemory(size_t bytes);
void UnmapChunkMemory(uint8_t* p, size_t bytes);

}  // namespace longhaul

#endif  // LONGHAUL_COMMON_CHUNK_MEMORY_H_
