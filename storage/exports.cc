#include "storage/exports.h"

#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/errno_status.h"
#include "storage/posix_util.h"

namespace longhaul::storage {

using internal::JoinPath;
using internal::ScopedFd;

namespace {

absl::Status Refuse(std::string_view dest_path, std::string_view why) {
  return absl::PermissionDeniedError(absl::StrCat(
      "destination \"", absl::CHexEscape(internal::Av(dest_path)), "\" refused: ", internal::Av(why)));
}

}  // namespace

absl::StatusOr<int> OpenDirBeneath(int dir_fd, std::string_view relative, bool create,
                                   std::string_view what) {
  ScopedFd cur(fcntl(dir_fd, F_DUPFD_CLOEXEC, 0));
  if (!cur.valid()) return ErrnoError(errno, "dup of directory fd for", what);
  std::string walked;
  for (absl::string_view comp : absl::StrSplit(internal::Av(relative), '/', absl::SkipEmpty())) {
    if (comp == "." ) continue;
    if (comp == "..") {
      return absl::PermissionDeniedError(
          absl::StrCat("path ", JoinPath(what, relative), " has a \"..\" component"));
    }
    const std::string name(comp);
    walked = walked.empty() ? name : absl::StrCat(walked, "/", name);
    int fd = openat(cur.get(), name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0 && errno == ENOENT && create) {
      if (mkdirat(cur.get(), name.c_str(), 0755) != 0 && errno != EEXIST) {
        return ErrnoError(errno, "cannot create directory", JoinPath(what, walked));
      }
      if (fsync(cur.get()) != 0) {
        return ErrnoError(errno, "cannot fsync directory containing", JoinPath(what, walked));
      }
      fd = openat(cur.get(), name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    }
    if (fd < 0) {
      const int err = errno;
      if (err == ELOOP || err == ENOTDIR) {
        struct stat st;
        if (fstatat(cur.get(), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 &&
            S_ISLNK(st.st_mode)) {
          return absl::PermissionDeniedError(absl::StrCat(
              JoinPath(what, walked), " is a symlink; longhaul does not follow symlinks under an export"));
        }
        return absl::FailedPreconditionError(
            absl::StrCat(JoinPath(what, walked), " exists and is not a directory"));
      }
      return ErrnoError(err, "cannot open directory", JoinPath(what, walked));
    }
    cur.reset(fd);
  }
  return cur.release();
}

absl::StatusOr<ResolvedDestination> ResolveDestination(const std::vector<Export>& exports,
                                                       std::string_view export_name,
                                                       std::string_view dest_path) {
  const Export* exp = nullptr;
  for (const Export& e : exports) {
    if (e.name == export_name) exp = &e;
  }
  if (exp == nullptr) {
    std::vector<absl::string_view> names;
    for (const Export& e : exports) names.push_back(e.name);
    return absl::PermissionDeniedError(
        absl::StrCat("site has no export named \"", absl::CHexEscape(internal::Av(export_name)),
                     "\"; exports: ", names.empty() ? "(none)" : absl::StrJoin(names, ", ")));
  }

  if (dest_path.empty()) return Refuse(dest_path, "the path is empty");
  if (dest_path.find('\0') != std::string_view::npos) {
    return Refuse(dest_path, "the path contains a NUL byte");
  }
  if (dest_path.front() == '/') {
    return Refuse(dest_path, absl::StrCat("the path is absolute; give it relative to export ",
                                          exp->name));
  }
  std::vector<absl::string_view> comps;
  for (absl::string_view comp : absl::StrSplit(internal::Av(dest_path), '/')) {
    if (comp.empty() || comp == ".") continue;
    if (comp == "..") return Refuse(dest_path, "the path has a \"..\" component");
    if (comp.size() > NAME_MAX) return Refuse(dest_path, "a path component is too long");
    comps.push_back(comp);
  }
  if (comps.empty()) return Refuse(dest_path, "the path names the export root itself");
  if (comps[0] == kLonghaulDirName) {
    return Refuse(dest_path, absl::StrCat(kLonghaulDirName,
                                          " is longhaul's staging directory, not a destination"));
  }
  const std::string relative = absl::StrJoin(comps, "/");
  if (relative.size() > PATH_MAX / 2) return Refuse(dest_path, "the path is too long");

  char real[PATH_MAX];
  if (realpath(exp->path.c_str(), real) == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("export ", exp->name, " (", exp->path, ") is not usable: ",
                     ErrnoError(errno, "realpath", exp->path).message()));
  }
  ResolvedDestination out;
  out.export_root = real;
  ScopedFd cur(open(real, O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!cur.valid()) {
    return absl::FailedPreconditionError(
        absl::StrCat("export ", exp->name, " is not usable: ",
                     ErrnoError(errno, "cannot open directory", out.export_root).message()));
  }
  // Walk the existing part of the path without following anything.
  std::string walked;
  for (size_t i = 0; i < comps.size(); ++i) {
    const std::string name(comps[i]);
    walked = walked.empty() ? name : absl::StrCat(walked, "/", name);
    struct stat st;
    if (fstatat(cur.get(), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
      if (errno == ENOENT) break;  // the rest will be created by publish
      return ErrnoError(errno, "cannot inspect destination", JoinPath(out.export_root, walked));
    }
    if (S_ISLNK(st.st_mode)) {
      return Refuse(dest_path, absl::StrCat(JoinPath(out.export_root, walked),
                                            " is a symlink; longhaul does not follow symlinks "
                                            "under an export"));
    }
    if (i + 1 == comps.size()) break;  // the destination itself may be a file or a dir
    if (!S_ISDIR(st.st_mode)) {
      return absl::FailedPreconditionError(
          absl::StrCat("destination ", JoinPath(out.export_root, relative), ": ",
                       JoinPath(out.export_root, walked), " is not a directory"));
    }
    int fd = openat(cur.get(), name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) {
      if (errno == ELOOP || errno == ENOTDIR) {
        return Refuse(dest_path, absl::StrCat(JoinPath(out.export_root, walked),
                                              " changed into a symlink while being checked"));
      }
      return ErrnoError(errno, "cannot open destination directory",
                        JoinPath(out.export_root, walked));
    }
    cur.reset(fd);
  }
  out.relative = relative;
  out.absolute = JoinPath(out.export_root, relative);
  return out;
}

}  // namespace longhaul::storage
