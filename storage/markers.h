// Commit markers: the files (PyTorch DCP's `.metadata`, `*.index.json`,
// `COMPLETE`, or configured globs) whose presence says a checkpoint is whole.
#ifndef LONGHAUL_STORAGE_MARKERS_H_
#define LONGHAUL_STORAGE_MARKERS_H_

#include <string>
#include <string_view>
#include <vector>

namespace longhaul::storage {

// True when one of the fnmatch(3) `globs` matches the basename of `path`
// ('/'-separated, relative), or the whole path (FNM_PATHNAME).
bool IsCommitMarker(const std::vector<std::string>& globs, std::string_view path);

}  // namespace longhaul::storage

#endif  // LONGHAUL_STORAGE_MARKERS_H_
