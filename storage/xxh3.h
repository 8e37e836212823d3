// XXH3 from libxxhash, with the state type visible (so a hash state can live on
// the stack) and, on x86-64, the library's runtime CPU dispatch.
//
// Debian builds libxxhash for the x86-64 baseline (SSE2); its *_dispatch entry
// points pick AVX2 or AVX-512 at run time and hash about twice as fast. The
// dispatch header redefines XXH3_64bits, XXH3_128bits and their _update calls
// to those entry points, so every file that hashes data includes this header
// instead of <xxhash.h>. The digests are identical on every path.
#ifndef LONGHAUL_STORAGE_XXH3_H_
#define LONGHAUL_STORAGE_XXH3_H_

#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>
#if defined(__x86_64__)
#include <xxh_x86dispatch.h>
#endif

#endif  // LONGHAUL_STORAGE_XXH3_H_
