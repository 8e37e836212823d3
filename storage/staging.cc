#include "storage/staging.h"

#include <dirent.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <optional>
#include <string_view>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"
#include "storage/posix_util.h"

namespace longhaul::storage {

using internal::ErrnoError;
using internal::FsyncFd;
using internal::JoinPath;
using internal::RemoveTreeAt;
using internal::ScopedFd;

namespace {

constexpr char kStagingRel[] = ".longhaul/staging";
constexpr char kFilesDir[] = "f";
constexpr char kTreeDir[] = "tree";

int64_t MtimeNs(const struct stat& st) {
  return static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
}

bool Matches(const struct stat& st, const v1::ManifestFile& f) {
  return S_ISREG(st.st_mode) && static_cast<uint64_t>(st.st_size) == f.size() &&
         MtimeNs(st) == f.mtime_ns();
}

// Splits "a/b/c" into {"a/b", "c"} and "c" into {"", "c"}.
std::pair<std::string_view, std::string_view> SplitParent(std::string_view path) {
  size_t slash = path.rfind('/');
  if (slash == std::string_view::npos) return {"", path};
  return {path.substr(0, slash), path.substr(slash + 1)};
}

// lstat relative to a directory; nullopt when it does not exist.
absl::StatusOr<std::optional<struct stat>> StatAt(int dir_fd, const std::string& name,
                                                  std::string_view desc) {
  struct stat st;
  if (fstatat(dir_fd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
    if (errno == ENOENT) return std::nullopt;
    return ErrnoError(errno, "cannot stat", desc);
  }
  return st;
}

// Directories below one base directory, opened (and created) without
// following symlinks, with the ones that received renames fsync'ed on demand.
class DirCache {
 public:
  DirCache(int base_fd, std::string desc) : base_fd_(base_fd), desc_(std::move(desc)) {}

  absl::StatusOr<int> Get(std::string_view rel, bool create) {
    if (rel.empty()) return base_fd_;
    auto it = dirs_.find(internal::Av(rel));
    if (it != dirs_.end()) return it->second.fd.get();
    absl::StatusOr<int> fd = OpenDirBeneath(base_fd_, rel, create, desc_);
    if (!fd.ok()) return fd.status();
    Entry& e = dirs_[std::string(rel)];
    e.fd.reset(*fd);
    return *fd;
  }

  void MarkDirty(std::string_view rel) {
    if (rel.empty()) {
      base_dirty_ = true;
    } else if (auto it = dirs_.find(internal::Av(rel)); it != dirs_.end()) {
      it->second.dirty = true;
    }
  }

  absl::Status SyncDirty() {
    for (auto& [rel, e] : dirs_) {
      if (!e.dirty) continue;
      if (absl::Status s = FsyncFd(e.fd.get(), JoinPath(desc_, rel)); !s.ok()) return s;
      e.dirty = false;
    }
    if (base_dirty_) {
      if (absl::Status s = FsyncFd(base_fd_, desc_); !s.ok()) return s;
      base_dirty_ = false;
    }
    return absl::OkStatus();
  }

 private:
  struct Entry {
    ScopedFd fd;
    bool dirty = false;
  };
  const int base_fd_;
  const std::string desc_;
  bool base_dirty_ = false;
  absl::flat_hash_map<std::string, Entry> dirs_;
};

bool IsMarker(const std::vector<std::string>& globs, std::string_view path) {
  const std::string full(path);
  const std::string base(SplitParent(path).second);
  for (const std::string& g : globs) {
    if (fnmatch(g.c_str(), base.c_str(), 0) == 0) return true;
    if (fnmatch(g.c_str(), full.c_str(), FNM_PATHNAME) == 0) return true;
  }
  return false;
}

absl::Status CheckTransferId(std::string_view id) {
  if (id.empty() || id.size() > 200 || id == "." || id == ".." ||
      id.find('/') != std::string_view::npos || id.find('\0') != std::string_view::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        "transfer id \"", absl::CHexEscape(internal::Av(id)), "\" cannot name a staging directory"));
  }
  return absl::OkStatus();
}

}  // namespace

// -------------------------------------------------------------- Staging ----

Staging::State::~State() {
  {
    absl::MutexLock lock(&mu);
    for (auto& [index, fd] : open_files) close(fd);
    open_files.clear();
  }
  for (int fd : {files_fd, staging_fd, parent_fd, root_fd}) {
    if (fd >= 0) close(fd);
  }
}

Staging::Staging(Staging&&) noexcept = default;
Staging& Staging::operator=(Staging&&) noexcept = default;
Staging::~Staging() = default;

absl::StatusOr<Staging> Staging::Open(ResolvedDestination dest, std::string transfer_id) {
  if (absl::Status s = CheckTransferId(transfer_id); !s.ok()) return s;
  auto state = std::make_unique<State>();
  state->dest = std::move(dest);
  state->transfer_id = std::move(transfer_id);
  const std::string staging_parent = JoinPath(state->dest.export_root, kStagingRel);
  state->dir = JoinPath(staging_parent, state->transfer_id);

  state->root_fd = open(state->dest.export_root.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (state->root_fd < 0) {
    return ErrnoError(errno, "cannot open export root", state->dest.export_root);
  }
  absl::StatusOr<int> fd =
      OpenDirBeneath(state->root_fd, kStagingRel, /*create=*/true, state->dest.export_root);
  if (!fd.ok()) return fd.status();
  state->parent_fd = *fd;
  fd = OpenDirBeneath(state->parent_fd, state->transfer_id, /*create=*/true, staging_parent);
  if (!fd.ok()) return fd.status();
  state->staging_fd = *fd;
  fd = OpenDirBeneath(state->staging_fd, kFilesDir, /*create=*/true, state->dir);
  if (!fd.ok()) return fd.status();
  state->files_fd = *fd;
  return Staging(std::move(state));
}

void Staging::CloseFiles() {
  absl::MutexLock lock(&state_->mu);
  for (auto& [index, fd] : state_->open_files) close(fd);
  state_->open_files.clear();
}

absl::StatusOr<int> Staging::OpenFile(uint32_t file_index, const v1::ManifestFile& file) {
  return Open(file_index, file, /*create=*/true);
}

absl::StatusOr<int> Staging::OpenStagedFile(uint32_t file_index, const v1::ManifestFile& file) {
  return Open(file_index, file, /*create=*/false);
}

absl::StatusOr<int> Staging::Open(uint32_t file_index, const v1::ManifestFile& file, bool create) {
  State& s = *state_;
  absl::MutexLock lock(&s.mu);
  if (auto it = s.open_files.find(file_index); it != s.open_files.end()) return it->second;
  if (s.files_fd < 0) return absl::FailedPreconditionError("staging " + s.dir + " was removed");
  const std::string name = std::to_string(file_index);
  const std::string desc = absl::StrCat(s.dir, "/", kFilesDir, "/", name, " (", file.path(), ")");
  bool created = false;
  ScopedFd fd(openat(s.files_fd, name.c_str(), O_RDWR | O_NOFOLLOW | O_CLOEXEC));
  if (!fd.valid() && errno == ENOENT && !create) {
    return absl::NotFoundError(absl::StrCat(desc, " is no longer staged"));
  }
  if (!fd.valid() && errno == ENOENT) {
    fd.reset(openat(s.files_fd, name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC,
                    0600));
    created = fd.valid();
  }
  if (!fd.valid()) return ErrnoError(errno, "cannot open staged file", desc);
  struct stat st;
  if (fstat(fd.get(), &st) != 0) return ErrnoError(errno, "cannot stat staged file", desc);
  if (static_cast<uint64_t>(st.st_size) != file.size()) {
    bool sized = false;
    if (st.st_size == 0 && file.size() > 0) {
      // Reserve the space now so a full disk shows up before any data moves.
      if (fallocate(fd.get(), 0, 0, static_cast<off_t>(file.size())) == 0) {
        sized = true;
      } else if (errno != EOPNOTSUPP && errno != ENOSYS) {
        return ErrnoError(errno, absl::StrCat("cannot reserve ", file.size(), " bytes for"), desc);
      }
    }
    if (!sized && ftruncate(fd.get(), static_cast<off_t>(file.size())) != 0) {
      return ErrnoError(errno, absl::StrCat("cannot size to ", file.size(), " bytes"), desc);
    }
  }
  if (created) {
    // The directory entry must survive a crash once chunks are acknowledged.
    if (absl::Status st2 = FsyncFd(s.files_fd, JoinPath(s.dir, kFilesDir)); !st2.ok()) return st2;
  }
  const int raw = fd.release();
  s.open_files.emplace(file_index, raw);
  return raw;
}

absl::Status Staging::DiscardFile(uint32_t file_index) {
  State& s = *state_;
  absl::MutexLock lock(&s.mu);
  if (auto it = s.open_files.find(file_index); it != s.open_files.end()) {
    close(it->second);
    s.open_files.erase(it);
  }
  if (s.files_fd < 0) return absl::FailedPreconditionError("staging " + s.dir + " was removed");
  const std::string name = std::to_string(file_index);
  if (unlinkat(s.files_fd, name.c_str(), 0) != 0 && errno != ENOENT) {
    return ErrnoError(errno, "cannot discard staged file", JoinPath(s.dir, "f/" + name));
  }
  return FsyncFd(s.files_fd, JoinPath(s.dir, kFilesDir));
}

absl::Status Staging::Remove() {
  CloseFiles();
  State& s = *state_;
  if (s.parent_fd < 0) return absl::OkStatus();
  for (int* fd : {&s.files_fd, &s.staging_fd}) {
    if (*fd >= 0) close(*fd);
    *fd = -1;
  }
  if (absl::Status st = RemoveTreeAt(s.parent_fd, s.transfer_id, s.dir); !st.ok()) return st;
  return FsyncFd(s.parent_fd, JoinPath(s.dest.export_root, kStagingRel));
}

namespace {

// Sets the manifest's mtime and mode on staged file `name` in `files_fd` and
// makes it durable. Safe to repeat.
absl::Status FinalizeStaged(int files_fd, const std::string& name, const v1::ManifestFile& f,
                            const std::string& desc, bool* exists) {
  ScopedFd fd(openat(files_fd, name.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
  if (!fd.valid() && errno == EACCES) {
    // An earlier run already applied a mode without read permission.
    if (fchmodat(files_fd, name.c_str(), 0600, 0) == 0) {
      fd.reset(openat(files_fd, name.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
    }
  }
  if (!fd.valid()) {
    if (errno == ENOENT) {
      *exists = false;
      return absl::OkStatus();
    }
    return ErrnoError(errno, "cannot open staged file", desc);
  }
  *exists = true;
  struct stat st;
  if (fstat(fd.get(), &st) != 0) return ErrnoError(errno, "cannot stat staged file", desc);
  if (static_cast<uint64_t>(st.st_size) != f.size()) {
    return absl::DataLossError(absl::StrCat("staged file ", desc, " has ", st.st_size,
                                            " bytes, the manifest says ", f.size()));
  }
  struct timespec times[2];
  times[0].tv_sec = 0;
  times[0].tv_nsec = UTIME_OMIT;
  times[1].tv_sec = f.mtime_ns() / 1000000000;
  times[1].tv_nsec = f.mtime_ns() % 1000000000;
  if (times[1].tv_nsec < 0) {
    times[1].tv_nsec += 1000000000;
    times[1].tv_sec -= 1;
  }
  if (futimens(fd.get(), times) != 0) return ErrnoError(errno, "cannot set mtime of", desc);
  if (fchmod(fd.get(), f.mode() & 07777) != 0) return ErrnoError(errno, "cannot chmod", desc);
  return FsyncFd(fd.get(), desc);
}

}  // namespace

absl::Status Staging::Publish(const v1::Manifest& manifest, const PublishOptions& options) {
  CloseFiles();
  State& s = *state_;
  if (s.files_fd < 0) return absl::FailedPreconditionError("staging " + s.dir + " was removed");
  const std::string& root = s.dest.export_root;
  const std::string dest_desc = s.dest.absolute;
  auto [parent_rel, base_sv] = SplitParent(s.dest.relative);
  const std::string base(base_sv);

  // The destination's parent, created if needed, with no symlink on the way.
  DirCache root_dirs(s.root_fd, root);
  absl::StatusOr<int> dest_parent = root_dirs.Get(parent_rel, /*create=*/true);
  if (!dest_parent.ok()) return dest_parent.status();
  absl::StatusOr<std::optional<struct stat>> dest_st = StatAt(*dest_parent, base, dest_desc);
  if (!dest_st.ok()) return dest_st.status();
  if (dest_st->has_value() && S_ISLNK((*dest_st)->st_mode)) {
    return absl::PermissionDeniedError(
        absl::StrCat("destination ", dest_desc, " is a symlink; refusing to publish through it"));
  }

  // Places file `i` at `name` in directory `dir_fd`: from staging f/<i>, else
  // from `alt` (a directory holding it under `name`, e.g. tree/), else it is
  // already there. A 0-byte file is created if nothing holds it.
  auto place = [&](int i, int dir_fd, const std::string& name, std::string_view target_desc,
                   int alt_fd) -> absl::Status {
    const v1::ManifestFile& f = manifest.files(i);
    const std::string staged = std::to_string(i);
    const std::string staged_desc =
        absl::StrCat(s.dir, "/", kFilesDir, "/", staged, " (", f.path(), ")");
    bool exists = false;
    if (absl::Status st = FinalizeStaged(s.files_fd, staged, f, staged_desc, &exists); !st.ok()) {
      return st;
    }
    int from_fd = exists ? s.files_fd : -1;
    const std::string* from_name = &staged;
    if (!exists && alt_fd >= 0) {
      absl::StatusOr<std::optional<struct stat>> a = StatAt(alt_fd, name, target_desc);
      if (!a.ok()) return a.status();
      if (a->has_value() && Matches(**a, f)) {
        from_fd = alt_fd;
        from_name = &name;
      }
    }
    if (from_fd < 0) {
      absl::StatusOr<std::optional<struct stat>> t = StatAt(dir_fd, name, target_desc);
      if (!t.ok()) return t.status();
      if (t->has_value() && Matches(**t, f)) return absl::OkStatus();  // published earlier
      if (f.size() != 0) {
        return absl::DataLossError(absl::StrCat("staged file ", staged_desc,
                                                " is missing and ", internal::Av(target_desc),
                                                " does not hold it; the file must be re-sent"));
      }
      ScopedFd created(openat(s.files_fd, staged.c_str(),
                              O_WRONLY | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600));
      if (!created.valid()) return ErrnoError(errno, "cannot create staged file", staged_desc);
      created.reset();
      if (absl::Status st = FinalizeStaged(s.files_fd, staged, f, staged_desc, &exists);
          !st.ok()) {
        return st;
      }
      from_fd = s.files_fd;
    }
    if (renameat(from_fd, from_name->c_str(), dir_fd, name.c_str()) != 0) {
      return ErrnoError(errno, absl::StrCat("cannot move ", f.path(), " into place at"),
                        target_desc);
    }
    return absl::OkStatus();
  };

  const int n = manifest.files_size();
  std::vector<bool> marker(n, false);
  for (int i = 0; i < n; ++i) {
    marker[i] = IsMarker(options.commit_last, manifest.files(i).path());
  }
  auto skipped = [&](int i) { return options.skip_files.contains(static_cast<uint32_t>(i)); };

  if (options.single_file) {
    if (n != 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "a single-file transfer needs exactly one file in its manifest, not ", n));
    }
    if (dest_st->has_value() && S_ISDIR((*dest_st)->st_mode)) {
      return absl::FailedPreconditionError(
          absl::StrCat("destination ", dest_desc, " is a directory; expected a file"));
    }
    if (!skipped(0)) {
      if (options.before_markers) options.before_markers();
      if (absl::Status st = place(0, *dest_parent, base, dest_desc, -1); !st.ok()) return st;
      root_dirs.MarkDirty(parent_rel);
      if (absl::Status st = root_dirs.SyncDirty(); !st.ok()) return st;
    }
    return Remove();
  }

  if (dest_st->has_value() && !S_ISDIR((*dest_st)->st_mode)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "destination ", dest_desc, " exists and is not a directory; cannot publish a tree there"));
  }

  if (!dest_st->has_value()) {
    // New destination: assemble all of it in tree/ in staging, then one
    // rename, so nobody ever sees it partly there.
    absl::StatusOr<int> tree_fd =
        OpenDirBeneath(s.staging_fd, kTreeDir, /*create=*/true, s.dir);
    if (!tree_fd.ok()) return tree_fd.status();
    ScopedFd tree_owner(*tree_fd);
    const std::string tree_desc = JoinPath(s.dir, kTreeDir);
    DirCache tree(*tree_fd, tree_desc);
    for (int i = 0; i < n; ++i) {
      if (skipped(i)) continue;
      const std::string& path = manifest.files(i).path();
      auto [prel, fname] = SplitParent(path);
      absl::StatusOr<int> dir = tree.Get(prel, /*create=*/true);
      if (!dir.ok()) return dir.status();
      // Markers too: the one rename below makes the whole checkpoint appear
      // at once, complete.
      if (absl::Status st = place(i, *dir, std::string(fname), JoinPath(tree_desc, path), -1);
          !st.ok()) {
        return st;
      }
      tree.MarkDirty(prel);
    }
    for (const std::string& d : manifest.empty_dirs()) {
      if (absl::StatusOr<int> dir = tree.Get(d, /*create=*/true); !dir.ok()) return dir.status();
    }
    if (absl::Status st = tree.SyncDirty(); !st.ok()) return st;
    if (absl::Status st = FsyncFd(*tree_fd, tree_desc); !st.ok()) return st;
    if (renameat2(s.staging_fd, kTreeDir, *dest_parent, base.c_str(), RENAME_NOREPLACE) != 0) {
      int err = errno;
      if (err == EINVAL) {  // file system without RENAME_NOREPLACE
        err = renameat(s.staging_fd, kTreeDir, *dest_parent, base.c_str()) == 0 ? 0 : errno;
      }
      if (err == EEXIST || err == ENOTEMPTY) {
        // Created by someone else meanwhile: fall through to the merge below,
        // which also picks files up from tree/.
        spdlog::warn("storage: destination {} appeared during publish; merging into it",
                     dest_desc);
      } else if (err != 0) {
        return ErrnoError(err, absl::StrCat("cannot rename ", tree_desc, " onto"), dest_desc);
      }
    }
    root_dirs.MarkDirty(parent_rel);
    if (absl::Status st = root_dirs.SyncDirty(); !st.ok()) return st;
  }

  // The destination directory exists now: merge into it, markers last.
  // After a fresh tree rename nothing remains staged; on a re-sync or a
  // re-run, every file still staged (or left in tree/) is moved here.
  ScopedFd dest_fd;
  {
    absl::StatusOr<int> fd = OpenDirBeneath(*dest_parent, base, /*create=*/false, dest_desc);
    if (!fd.ok()) return fd.status();
    dest_fd.reset(*fd);
  }
  DirCache dest(dest_fd.get(), dest_desc);
  ScopedFd tree_fd(openat(s.staging_fd, kTreeDir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  std::optional<DirCache> tree;
  if (tree_fd.valid()) tree.emplace(tree_fd.get(), JoinPath(s.dir, kTreeDir));

  auto merge = [&](bool markers) -> absl::Status {
    for (int i = 0; i < n; ++i) {
      if (skipped(i) || marker[i] != markers) continue;
      const std::string& path = manifest.files(i).path();
      auto [prel, fname] = SplitParent(path);
      absl::StatusOr<int> dir = dest.Get(prel, /*create=*/true);
      if (!dir.ok()) return dir.status();
      int alt = -1;
      if (tree.has_value()) {
        absl::StatusOr<int> a = tree->Get(prel, /*create=*/false);
        if (a.ok()) alt = *a;
      }
      if (absl::Status st = place(i, *dir, std::string(fname), JoinPath(dest_desc, path), alt);
          !st.ok()) {
        return st;
      }
      dest.MarkDirty(prel);
    }
    return dest.SyncDirty();
  };
  if (absl::Status st = merge(/*markers=*/false); !st.ok()) return st;
  for (const std::string& d : manifest.empty_dirs()) {
    if (absl::StatusOr<int> dir = dest.Get(d, /*create=*/true); !dir.ok()) return dir.status();
  }
  if (options.before_markers) options.before_markers();
  if (absl::Status st = merge(/*markers=*/true); !st.ok()) return st;
  tree.reset();
  tree_fd.reset();
  return Remove();
}

// ------------------------------------------------------------------ sync ----

absl::StatusOr<bool> PublishedFileMatches(const ResolvedDestination& dest, bool single_file,
                                          const v1::ManifestFile& file) {
  const std::string rel =
      single_file ? dest.relative : absl::StrCat(dest.relative, "/", file.path());
  auto [parent, base] = SplitParent(rel);
  ScopedFd root(open(dest.export_root.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!root.valid()) return ErrnoError(errno, "cannot open export root", dest.export_root);
  absl::StatusOr<int> dir = OpenDirBeneath(root.get(), parent, /*create=*/false, dest.export_root);
  if (!dir.ok()) {
    if (absl::IsNotFound(dir.status()) || absl::IsFailedPrecondition(dir.status())) return false;
    return dir.status();
  }
  ScopedFd dir_owner(*dir);
  absl::StatusOr<std::optional<struct stat>> st =
      StatAt(*dir, std::string(base), JoinPath(dest.export_root, rel));
  if (!st.ok()) return st.status();
  return st->has_value() && Matches(**st, file);
}

}  // namespace longhaul::storage
