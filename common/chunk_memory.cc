#include "common/chunk_memory.h"

#include <sys/mman.h>

namespace longhaul {

uint8_t* MapChunkMemory(size_t bytes) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return nullptr;
  (void)madvise(p, bytes, MADV_HUGEPAGE);  // advisory: ignored where THP is off
  return static_cast<uint8_t*>(p);
}

void UnmapChunkMemory(uint8_t* p, size_t bytes) {
  if (p != nullptr) munmap(p, bytes);
}

}  // namespace longhaul
