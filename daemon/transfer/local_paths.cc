#include "daemon/transfer/local_paths.h"

#include <grp.h>
#include <pwd.h>

#include "absl/strings/str_cat.h"

namespace longhaul::daemon {

std::string UserName(uid_t uid) {
  struct passwd pw;
  struct passwd* found = nullptr;
  char buffer[4096];
  if (getpwuid_r(uid, &pw, buffer, sizeof(buffer), &found) == 0 && found != nullptr) {
    return found->pw_name;
  }
  return absl::StrCat(uid);
}

std::string GroupName(gid_t gid) {
  struct group gr;
  struct group* found = nullptr;
  char buffer[4096];
  if (getgrgid_r(gid, &gr, buffer, sizeof(buffer), &found) == 0 && found != nullptr) {
    return found->gr_name;
  }
  return absl::StrCat(gid);
}

std::string ParentOf(absl::string_view path) {
  const size_t slash = path.rfind('/');
  if (slash == absl::string_view::npos || slash == 0) return "/";
  return std::string(path.substr(0, slash));
}

bool IsWithin(absl::string_view path, absl::string_view root) {
  if (root.empty()) return false;
  if (root == "/") return true;
  return path == root || (path.size() > root.size() && path.substr(0, root.size()) == root &&
                          path[root.size()] == '/');
}

}  // namespace longhaul::daemon
