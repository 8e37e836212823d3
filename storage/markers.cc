#include "storage/markers.h"

#include <fnmatch.h>

namespace longhaul::storage {

bool IsCommitMarker(const std::vector<std::string>& globs, std::string_view path) {
  const std::string full(path);
  const size_t slash = path.rfind('/');
  const std::string base(slash == std::string_view::npos ? path : path.substr(slash + 1));
  for (const std::string& g : globs) {
    if (fnmatch(g.c_str(), base.c_str(), 0) == 0) return true;
    if (fnmatch(g.c_str(), full.c_str(), FNM_PATHNAME) == 0) return true;
  }
  return false;
}

}  // namespace longhaul::storage
