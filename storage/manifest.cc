#include "storage/manifest.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <string_view>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/errno_status.h"
#include "spdlog/spdlog.h"
#include "storage/chunk_plan.h"
#include "storage/posix_util.h"

namespace longhaul::storage {

using internal::JoinPath;

namespace {

int64_t Nanoseconds(const struct timespec& t) {
  return static_cast<int64_t>(t.tv_sec) * 1000000000 + t.tv_nsec;
}

std::string_view Basename(std::string_view path) {
  while (path.size() > 1 && path.back() == '/') path.remove_suffix(1);
  size_t slash = path.rfind('/');
  return slash == std::string_view::npos ? path : path.substr(slash + 1);
}

std::string ReadLinkTarget(const std::string& path) {
  std::string target(4096, '\0');
  ssize_t n = readlink(path.c_str(), target.data(), target.size());
  if (n < 0) return "";
  target.resize(static_cast<size_t>(n));
  return target;
}

class Builder {
 public:
  Builder(ManifestBuild& out, const ManifestOptions& options) : out_(out), options_(options) {}

  // Components of a relative path above the tree root a symlink's target is
  // judged against: 1 for an entry of one of several sources.
  void set_root_depth(size_t depth) { root_depth_ = depth; }

  void AddFile(std::string rel, const std::string& abs, const struct stat& st,
               const std::string& link) {
    v1::ManifestFile* f = out_.manifest.add_files();
    f->set_path(std::move(rel));
    RecordSourceIdentity(st, *f);
    RecordDataExtents(abs, st, *f);
    f->set_generation(0);
    out_.source_paths.push_back(abs);
    out_.file_links.push_back(link);
  }

  // Adds the contents of directory `abs` under relative prefix `rel` ("" for
  // the transfer root), reached through symlink `link` ("" if none).
  // Records `rel` as an empty dir if nothing lands in it.
  absl::Status WalkDir(const std::string& abs, const std::string& rel, const std::string& link) {
    struct stat self;
    if (stat(abs.c_str(), &self) != 0) return ErrnoError(errno, "cannot stat source", abs);
    walking_.push_back({self.st_dev, self.st_ino});
    absl::Status s = WalkDirContents(abs, rel, link);
    walking_.pop_back();
    return s;
  }

 private:
  absl::Status WalkDirContents(const std::string& abs, const std::string& rel,
                               const std::string& link) {
    DIR* d = opendir(abs.c_str());
    if (d == nullptr) return ErrnoError(errno, "cannot open source directory", abs);
    std::vector<std::string> names;
    errno = 0;
    while (struct dirent* e = readdir(d)) {
      std::string_view name = e->d_name;
      if (name == "." || name == "..") continue;
      names.emplace_back(name);
      errno = 0;
    }
    const int err = errno;
    closedir(d);
    if (err != 0) return ErrnoError(err, "cannot list source directory", abs);
    std::sort(names.begin(), names.end());

    bool has_entries = false;
    for (const std::string& name : names) {
      const std::string child_abs = JoinPath(abs, name);
      const std::string child_rel = rel.empty() ? name : absl::StrCat(rel, "/", name);
      struct stat st;
      if (lstat(child_abs.c_str(), &st) != 0) {
        if (errno == ENOENT) continue;  // removed while we walked
        return ErrnoError(errno, "cannot stat source", child_abs);
      }
      std::string child_link = link;
      if (S_ISLNK(st.st_mode)) {
        const std::string target = ReadLinkTarget(child_abs);
        switch (options_.symlinks) {
          case SymlinkPolicy::kRefuse:
            return absl::FailedPreconditionError(
                absl::StrCat("source ", child_abs, " is a symlink (to \"", target,
                             "\") and symlinks are refused for this transfer; remove it, or choose "
                             "--symlinks keep or --symlinks follow"));
          case SymlinkPolicy::kKeep:
            if (std::string why = SymlinkTargetProblem(child_rel, target, root_depth_);
                !why.empty()) {
              Skip(child_rel, absl::StrCat("symlink to \"", target, "\" not kept: ", why));
            } else {
              v1::ManifestSymlink* l = out_.manifest.add_symlinks();
              l->set_path(child_rel);
              l->set_target(target);
              has_entries = true;
            }
            continue;
          case SymlinkPolicy::kFollow:
            if (stat(child_abs.c_str(), &st) != 0) {
              const int e = errno;
              Skip(child_rel, absl::StrCat("symlink to \"", target, "\" not followed: ",
                                           e == ENOENT  ? "its target does not exist"
                                           : e == ELOOP ? "it is part of a symlink loop"
                                                        : std::strerror(e)));
              continue;
            }
            if (S_ISDIR(st.st_mode) && IsBeingWalked(st)) {
              Skip(child_rel, absl::StrCat("symlink to \"", target,
                                           "\" not followed: it leads back to a directory that "
                                           "contains it (a loop)"));
              continue;
            }
            child_link = child_rel;
            break;
        }
      }
      if (S_ISDIR(st.st_mode)) {
        has_entries = true;
        if (absl::Status s = WalkDir(child_abs, child_rel, child_link); !s.ok()) return s;
      } else if (S_ISREG(st.st_mode)) {
        has_entries = true;
        AddFile(child_rel, child_abs, st, child_link);
      } else {
        Skip(child_rel, "not a regular file, directory or symlink");
      }
    }
    if (!has_entries && !rel.empty()) {
      out_.manifest.add_empty_dirs(rel);
      out_.empty_dir_paths.push_back(abs);
      out_.empty_dir_links.push_back(link);
    }
    return absl::OkStatus();
  }

  void Skip(const std::string& rel, std::string why) {
    spdlog::warn("storage: skipping {}: {}", rel, why);
    out_.skipped.push_back({rel, std::move(why)});
  }

  bool IsBeingWalked(const struct stat& st) const {
    return std::find(walking_.begin(), walking_.end(), std::make_pair(st.st_dev, st.st_ino)) !=
           walking_.end();
  }

  ManifestBuild& out_;
  const ManifestOptions& options_;
  size_t root_depth_ = 0;
  // (device, inode) of the directories being walked, outermost first.
  std::vector<std::pair<dev_t, ino_t>> walking_;
};

}  // namespace

absl::StatusOr<SymlinkPolicy> ParseSymlinkPolicy(std::string_view name) {
  if (name.empty() || name == "keep") return SymlinkPolicy::kKeep;
  if (name == "follow") return SymlinkPolicy::kFollow;
  if (name == "refuse") return SymlinkPolicy::kRefuse;
  return absl::InvalidArgumentError(absl::StrCat("symlink policy \"", internal::Av(name),
                                                 "\" is not one of keep, follow, refuse"));
}

absl::StatusOr<ManifestBuild> BuildManifest(const std::vector<std::string>& sources,
                                            uint64_t chunk_size, const ManifestOptions& options) {
  if (sources.empty()) return absl::InvalidArgumentError("no source paths given");
  if (chunk_size == 0) return absl::InvalidArgumentError("chunk size must be positive");
  ManifestBuild out;
  out.manifest.set_chunk_size(chunk_size);
  Builder builder(out, options);
  builder.set_root_depth(sources.size() > 1 ? 1 : 0);
  absl::flat_hash_set<std::string> basenames;
  for (const std::string& source : sources) {
    if (source.empty() || source.front() != '/') {
      return absl::InvalidArgumentError(
          absl::StrCat("source path \"", source, "\" is not absolute"));
    }
    struct stat st;
    // A source named explicitly is followed if it is a symlink.
    if (stat(source.c_str(), &st) != 0) return ErrnoError(errno, "cannot stat source", source);
    const std::string base(Basename(source));
    if (sources.size() > 1) {
      if (base.empty() || base == "/" || base == "." || base == "..") {
        return absl::InvalidArgumentError(
            absl::StrCat("source ", source, " has no usable name to place it under"));
      }
      if (!basenames.insert(base).second) {
        return absl::InvalidArgumentError(absl::StrCat(
            "two sources are named \"", base, "\" (", source, "); they would collide"));
      }
    }
    if (S_ISREG(st.st_mode)) {
      if (base.empty() || base == "/" || base == "." || base == "..") {
        return absl::InvalidArgumentError(absl::StrCat("source ", source, " has no file name"));
      }
      builder.AddFile(base, source, st, /*link=*/"");
      out.single_file = sources.size() == 1;
    } else if (S_ISDIR(st.st_mode)) {
      if (absl::Status s = builder.WalkDir(source, sources.size() > 1 ? base : "", /*link=*/"");
          !s.ok()) {
        return s;
      }
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("source ", source, " is not a regular file or directory"));
    }
  }
  if (options.hard_links) GroupHardLinks(out.manifest);
  return out;
}

void GroupHardLinks(v1::Manifest& manifest) {
  // (device, inode) -> index of the first file with it.
  absl::flat_hash_map<std::pair<uint64_t, uint64_t>, int> first;
  for (int i = 0; i < manifest.files_size(); ++i) {
    v1::ManifestFile& f = *manifest.mutable_files(i);
    f.clear_link_of();
    auto [it, inserted] = first.try_emplace(std::make_pair(f.device(), f.inode()), i);
    if (inserted) continue;
    const v1::ManifestFile& target = manifest.files(it->second);
    if (target.size() != f.size() || target.mode() != f.mode()) continue;
    f.set_link_of(static_cast<uint32_t>(it->second) + 1);
  }
}

void DropFollowed(const std::vector<std::string>& links, ManifestBuild& build) {
  if (links.empty()) return;
  const bool grouped = std::any_of(build.manifest.files().begin(), build.manifest.files().end(),
                                   [](const v1::ManifestFile& f) { return f.link_of() != 0; });
  const absl::flat_hash_set<std::string> drop(links.begin(), links.end());
  v1::Manifest kept = build.manifest;
  kept.clear_files();
  kept.clear_empty_dirs();
  ManifestBuild out;
  for (int i = 0; i < build.manifest.files_size(); ++i) {
    if (drop.contains(build.file_links[i])) continue;
    *kept.add_files() = build.manifest.files(i);
    out.source_paths.push_back(build.source_paths[i]);
    out.file_links.push_back(build.file_links[i]);
  }
  for (int i = 0; i < build.manifest.empty_dirs_size(); ++i) {
    if (drop.contains(build.empty_dir_links[i])) continue;
    kept.add_empty_dirs(build.manifest.empty_dirs(i));
    out.empty_dir_paths.push_back(build.empty_dir_paths[i]);
    out.empty_dir_links.push_back(build.empty_dir_links[i]);
  }
  build.manifest = std::move(kept);
  build.source_paths = std::move(out.source_paths);
  build.file_links = std::move(out.file_links);
  build.empty_dir_paths = std::move(out.empty_dir_paths);
  build.empty_dir_links = std::move(out.empty_dir_links);
  // Indices moved, and a group may have lost its first name.
  if (grouped) GroupHardLinks(build.manifest);
}

std::string SymlinkTargetProblem(std::string_view link_path, std::string_view target,
                                 size_t root_depth) {
  if (target.empty()) return "its target is empty";
  if (target.find('\0') != std::string_view::npos) return "its target contains a NUL byte";
  if (target.front() == '/') return "its target is absolute";
  const size_t link_depth =
      static_cast<size_t>(std::count(link_path.begin(), link_path.end(), '/'));
  const size_t depth = link_depth > root_depth ? link_depth - root_depth : 0;
  size_t ups = 0;
  bool plain_seen = false;
  for (absl::string_view comp : absl::StrSplit(internal::Av(target), '/')) {
    if (comp.empty()) return "its target has an empty component (\"//\" or a trailing \"/\")";
    if (comp == ".") return "its target has a \".\" component";
    if (comp == "..") {
      if (plain_seen) return "its target has a \"..\" after a name (only leading \"..\" are kept)";
      if (++ups > depth) return "its target points outside the transferred tree";
    } else {
      plain_seen = true;
    }
  }
  return "";
}

void RecordDataExtents(const std::string& path, const struct stat& st, v1::ManifestFile& file) {
  file.clear_sparse();
  file.clear_data();
  // Blocks below the size are the cheap sign of holes; most files have none.
  if (st.st_size == 0 || static_cast<uint64_t>(st.st_blocks) * 512 >= file.size()) return;
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
  if (fd < 0) return;  // the sender's own open reports it
  const off_t size = static_cast<off_t>(file.size());
  std::vector<std::pair<off_t, off_t>> extents;
  bool whole = false;
  for (off_t pos = 0; pos < size;) {
    const off_t data = lseek(fd, pos, SEEK_DATA);
    if (data < 0) {
      whole = errno != ENXIO;  // ENXIO: only holes from pos on
      break;
    }
    if (data >= size) break;
    off_t hole = lseek(fd, data, SEEK_HOLE);
    if (hole < 0) {
      whole = true;
      break;
    }
    hole = std::min(hole, size);
    if (static_cast<int>(extents.size()) == kMaxDataExtents) {
      whole = true;
      break;
    }
    extents.emplace_back(data, hole - data);
    pos = hole;
  }
  close(fd);
  uint64_t data_bytes = 0;
  for (const auto& [offset, length] : extents) data_bytes += static_cast<uint64_t>(length);
  if (whole || data_bytes >= file.size()) return;
  file.set_sparse(true);
  for (const auto& [offset, length] : extents) {
    v1::Extent* e = file.add_data();
    e->set_offset(static_cast<uint64_t>(offset));
    e->set_length(static_cast<uint64_t>(length));
  }
}

void RecordSourceIdentity(const struct stat& st, v1::ManifestFile& file) {
  file.set_size(static_cast<uint64_t>(st.st_size));
  file.set_mtime_ns(Nanoseconds(st.st_mtim));
  file.set_ctime_ns(Nanoseconds(st.st_ctim));
  file.set_mode(st.st_mode & 07777);
  file.set_inode(st.st_ino);
  file.set_device(st.st_dev);
}

namespace {

// Checks one relative path; returns a description of what is wrong or "".
std::string PathProblem(std::string_view path, size_t max_len) {
  if (path.empty()) return "path is empty";
  if (path.size() > max_len) return absl::StrCat("path is longer than ", max_len, " bytes");
  if (path.find('\0') != std::string_view::npos) return "path contains a NUL byte";
  if (path.front() == '/') return "path is absolute";
  size_t start = 0;
  while (true) {
    size_t slash = path.find('/', start);
    std::string_view comp =
        path.substr(start, slash == std::string_view::npos ? std::string_view::npos
                                                            : slash - start);
    if (comp.empty()) return "path has an empty component";
    if (comp == ".") return "path has a \".\" component";
    if (comp == "..") return "path has a \"..\" component";
    if (comp.size() > 255) return "path has a component longer than 255 bytes";
    if (slash == std::string_view::npos) break;
    start = slash + 1;
  }
  return "";
}

std::string Quote(std::string_view s) {
  return absl::StrCat("\"", absl::CHexEscape(internal::Av(s.substr(0, 512))), s.size() > 512 ? "...\"" : "\"");
}

}  // namespace

absl::Status ValidateManifest(const v1::Manifest& m, const ManifestLimits& limits) {
  if (m.chunk_size() < limits.min_chunk_size || m.chunk_size() > limits.max_chunk_size) {
    return absl::InvalidArgumentError(absl::StrCat("manifest chunk size ", m.chunk_size(),
                                                   " is outside [", limits.min_chunk_size, ", ",
                                                   limits.max_chunk_size, "]"));
  }
  if (static_cast<uint64_t>(m.files_size()) > limits.max_files) {
    return absl::InvalidArgumentError(absl::StrCat("manifest has ", m.files_size(),
                                                   " files; the limit is ", limits.max_files));
  }
  absl::flat_hash_set<std::string_view> files;
  files.reserve(m.files_size());
  for (int i = 0; i < m.files_size(); ++i) {
    const v1::ManifestFile& f = m.files(i);
    auto bad = [&](std::string_view what) {
      return absl::InvalidArgumentError(
          absl::StrCat("manifest file ", i, " ", Quote(f.path()), ": ", internal::Av(what)));
    };
    if (std::string p = PathProblem(f.path(), limits.max_path_length); !p.empty()) return bad(p);
    if (!files.insert(f.path()).second) return bad("duplicate path");
    if (f.size() > limits.max_file_size) {
      return bad(absl::StrCat("size ", f.size(), " exceeds the limit ", limits.max_file_size));
    }
    if (ChunkCount(f, m.chunk_size()) > UINT32_MAX) {
      return bad("size needs more than 2^32-1 chunks at this chunk size");
    }
    if ((f.mode() & ~07777u) != 0) {
      return bad(absl::StrFormat("mode 0%o has bits beyond 07777", f.mode()));
    }
    if (!f.content_xxh128().empty() && f.content_xxh128().size() != 16) {
      return bad(absl::StrCat("content digest is ", f.content_xxh128().size(), " bytes, not 16"));
    }
    if (!f.sparse() && f.data_size() != 0) return bad("data extents on a file that is not sparse");
    if (f.data_size() > limits.max_data_extents) {
      return bad(absl::StrCat("has ", f.data_size(), " data extents; the limit is ",
                              limits.max_data_extents));
    }
    uint64_t data_end = 0;
    for (int e = 0; e < f.data_size(); ++e) {
      const v1::Extent& x = f.data(e);
      if (x.length() == 0 || x.offset() < data_end || x.offset() >= f.size() ||
          x.length() > f.size() - x.offset()) {
        return bad(absl::StrCat("data extent ", e, " [", x.offset(), ", +", x.length(),
                                ") is empty, overlaps or precedes the one before, or ends past "
                                "the size ",
                                f.size()));
      }
      data_end = x.offset() + x.length();
    }
    if (f.link_of() != 0) {
      // Publish links this name to its target's file, placed earlier.
      const uint32_t target = f.link_of() - 1;
      if (target >= static_cast<uint32_t>(i)) {
        return bad(
            absl::StrCat("is a hard link of file ", target, ", which does not come before it"));
      }
      const v1::ManifestFile& t = m.files(static_cast<int>(target));
      if (t.link_of() != 0) {
        return bad(absl::StrCat("is a hard link of file ", target,
                                ", which is itself a hard link (not the first name of its file)"));
      }
      if (t.size() != f.size() || t.mode() != f.mode()) {
        return bad(absl::StrFormat(
            "is a hard link of file %u, but its size %u or mode 0%o differs from %u, 0%o", target,
            f.size(), f.mode(), t.size(), t.mode()));
      }
    }
  }
  // Symlinks: not a parent of anything (a write below one would go through
  // it), so they join `files` for the prefix checks.
  if (static_cast<uint64_t>(m.symlinks_size()) > limits.max_files) {
    return absl::InvalidArgumentError(absl::StrCat("manifest has ", m.symlinks_size(),
                                                   " symlinks; the limit is ", limits.max_files));
  }
  absl::flat_hash_set<std::string_view> links;
  for (int i = 0; i < m.symlinks_size(); ++i) {
    const v1::ManifestSymlink& l = m.symlinks(i);
    auto bad = [&](std::string_view what) {
      return absl::InvalidArgumentError(
          absl::StrCat("manifest symlink ", i, " ", Quote(l.path()), ": ", internal::Av(what)));
    };
    if (std::string p = PathProblem(l.path(), limits.max_path_length); !p.empty()) return bad(p);
    if (files.contains(l.path()) || !links.insert(l.path()).second) return bad("duplicate path");
    if (l.target().size() > limits.max_path_length) {
      return bad(absl::StrCat("target is longer than ", limits.max_path_length, " bytes"));
    }
    if (std::string p = SymlinkTargetProblem(l.path(), l.target()); !p.empty()) {
      return bad(absl::StrCat(p, " (target ", Quote(l.target()), ")"));
    }
  }
  // A path may not be both a file (or symlink) and a directory on the way
  // to another.
  auto check_prefixes = [&](std::string_view path, std::string_view kind,
                            int index) -> absl::Status {
    for (size_t slash = path.find('/'); slash != std::string_view::npos;
         slash = path.find('/', slash + 1)) {
      const std::string_view parent = path.substr(0, slash);
      if (files.contains(parent) || links.contains(parent)) {
        return absl::InvalidArgumentError(
            absl::StrCat("manifest ", internal::Av(kind), " ", index, " ", Quote(path),
                         ": its parent ", Quote(parent), " is also a ",
                         files.contains(parent) ? "file" : "symlink", " in the manifest"));
      }
    }
    return absl::OkStatus();
  };
  for (int i = 0; i < m.files_size(); ++i) {
    if (absl::Status s = check_prefixes(m.files(i).path(), "file", i); !s.ok()) return s;
  }
  for (int i = 0; i < m.symlinks_size(); ++i) {
    if (absl::Status s = check_prefixes(m.symlinks(i).path(), "symlink", i); !s.ok()) return s;
  }
  for (int i = 0; i < m.empty_dirs_size(); ++i) {
    const std::string& d = m.empty_dirs(i);
    if (std::string p = PathProblem(d, limits.max_path_length); !p.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("manifest empty dir ", i, " ", Quote(d), ": ", p));
    }
    if (files.contains(d) || links.contains(d)) {
      return absl::InvalidArgumentError(
          absl::StrCat("manifest empty dir ", i, " ", Quote(d), " is also a file or symlink"));
    }
    if (absl::Status s = check_prefixes(d, "empty dir", i); !s.ok()) return s;
  }
  if (static_cast<uint64_t>(m.empty_dirs_size()) > limits.max_files) {
    return absl::InvalidArgumentError(absl::StrCat("manifest has ", m.empty_dirs_size(),
                                                   " empty dirs; the limit is ",
                                                   limits.max_files));
  }
  return absl::OkStatus();
}

absl::Status CheckSourceUnchanged(const v1::ManifestFile& file, int fd) {
  struct stat st;
  if (fstat(fd, &st) != 0) return ErrnoError(errno, "cannot stat source", internal::FdPath(fd));
  std::string why;
  if (static_cast<uint64_t>(st.st_size) != file.size()) {
    why = absl::StrCat("size is ", st.st_size, ", was ", file.size());
  } else if (Nanoseconds(st.st_mtim) != file.mtime_ns()) {
    why = absl::StrCat("mtime is ", Nanoseconds(st.st_mtim), " ns, was ", file.mtime_ns());
  } else if (st.st_ino != file.inode() || st.st_dev != file.device()) {
    why = "it was replaced by another file (inode or device differs)";
  } else if (file.ctime_ns() != 0 && Nanoseconds(st.st_ctim) != file.ctime_ns()) {
    why = absl::StrCat("ctime is ", Nanoseconds(st.st_ctim), " ns, was ", file.ctime_ns(),
                       " (rewritten with its mtime put back?)");
  } else {
    return absl::OkStatus();
  }
  return absl::AbortedError(absl::StrCat("source file changed since its manifest: ",
                                         internal::FdPath(fd), ": ", why));
}

}  // namespace longhaul::storage
