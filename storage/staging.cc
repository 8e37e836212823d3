#include "storage/staging.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string_view>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "common/checkpoints.h"
#include "spdlog/spdlog.h"
#include "storage/chunk_plan.h"
#include "storage/content_check.h"
#include "storage/posix_util.h"
#include "storage/trash.h"

namespace longhaul::storage {

using internal::JoinPath;

namespace {

constexpr char kStagingRel[] = ".longhaul/staging";
constexpr char kFilesDir[] = "f";
constexpr char kNextDir[] = "next";
constexpr char kOldDir[] = "old";
constexpr char kInstallRecord[] = "installing";

bool DirectIoDisabled() {
  const char* env = std::getenv("LONGHAUL_NO_DIRECT_IO");
  return env != nullptr && std::strcmp(env, "") != 0 && std::strcmp(env, "0") != 0;
}

// Logs, once per export and mode, how chunks are staged there.
void LogStagingMode(const std::string& export_root, const std::string& mode) {
  static absl::Mutex mu(absl::kConstInit);
  static auto* logged = new absl::flat_hash_set<std::string>();
  const std::string key = absl::StrCat(export_root, "\n", mode);
  {
    absl::MutexLock lock(&mu);
    if (!logged->insert(key).second) return;
  }
  spdlog::info("staging on {}: {}", export_root, mode);
}

// Opens the direct-I/O descriptor of a staged file unless the file system
// refuses it; the file stays usable buffered either way.
void EnableDirectIo(File& file, const std::string& export_root) {
  if (DirectIoDisabled()) {
    LogStagingMode(export_root, "buffered (LONGHAUL_NO_DIRECT_IO is set)");
    return;
  }
  absl::StatusOr<bool> direct = file.EnableDirectIo();
  if (!direct.ok()) {
    spdlog::warn("staging: {}; writing it buffered", std::string(direct.status().message()));
    LogStagingMode(export_root, "buffered (O_DIRECT open failed)");
  } else if (*direct) {
    LogStagingMode(export_root, "direct I/O");
  } else if (file.fd() >= 0) {
    LogStagingMode(export_root, "buffered (filesystem refuses O_DIRECT)");
  }
}

// Splits "a/b/c" into {"a/b", "c"} and "c" into {"", "c"}.
std::pair<std::string_view, std::string_view> SplitParent(std::string_view path) {
  size_t slash = path.rfind('/');
  if (slash == std::string_view::npos) return {"", path};
  return {path.substr(0, slash), path.substr(slash + 1)};
}

absl::Status CheckTransferId(std::string_view id) {
  if (id.empty() || id.size() > 200 || id == "." || id == ".." ||
      id.find('/') != std::string_view::npos || id.find('\0') != std::string_view::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        "transfer id \"", absl::CHexEscape(internal::Av(id)), "\" cannot name a staging directory"));
  }
  return absl::OkStatus();
}

// Directories below one base directory, opened (and created) without
// following symlinks, each opened once.
class DirCache {
 public:
  // Directories created get permission bits `mode`.
  DirCache(FileSystem& fs, Directory& base, uint32_t mode) : fs_(fs), base_(base), mode_(mode) {}

  absl::StatusOr<Directory*> Get(std::string_view rel, bool create) {
    if (rel.empty()) return &base_;
    auto it = dirs_.find(internal::Av(rel));
    if (it != dirs_.end()) return it->second.get();
    absl::StatusOr<std::unique_ptr<Directory>> dir =
        OpenDirBeneath(fs_, base_, rel, create, mode_);
    if (!dir.ok()) return dir.status();
    Directory* raw = dir->get();
    dirs_[std::string(rel)] = std::move(*dir);
    return raw;
  }

  // fsync of every directory opened, the base last.
  absl::Status SyncAll() {
    for (auto& [rel, dir] : dirs_) {
      if (absl::Status s = fs_.SyncDir(*dir); !s.ok()) return s;
    }
    return fs_.SyncDir(base_);
  }

 private:
  FileSystem& fs_;
  Directory& base_;
  const uint32_t mode_;
  absl::flat_hash_map<std::string, std::unique_ptr<Directory>> dirs_;
};

// The identity of the object publish installs, as kept in the record.
std::string FormatIdentity(const FileInfo& info) {
  return absl::StrCat(info.device, " ", info.inode, "\n");
}

absl::StatusOr<FileInfo> ParseIdentity(std::string_view text, const std::string& desc) {
  std::vector<absl::string_view> parts =
      absl::StrSplit(absl::StripTrailingAsciiWhitespace(internal::Av(text)), ' ');
  FileInfo info;
  if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &info.device) ||
      !absl::SimpleAtoi(parts[1], &info.inode)) {
    return absl::DataLossError(absl::StrCat("publish record ", desc, " is damaged"));
  }
  return info;
}

// Applies the manifest's mtime and mode (masked by `mode_mask`) to staged
// file `name` and makes them durable. Done when lstat already shows both:
// the mode is applied last, so a file whose mode forbids opening it was
// finalized before.
absl::Status Finalize(FileSystem& fs, Directory& dir, const std::string& name,
                      const FileInfo& st, const v1::ManifestFile& f, uint32_t mode_mask) {
  const uint32_t mode = f.mode() & mode_mask & 0777;
  if (st.mode == mode && StoredMtimeMatches(st.mtime_ns, f.mtime_ns())) return absl::OkStatus();
  absl::StatusOr<std::unique_ptr<File>> file = fs.OpenFile(dir, name, OpenMode::kReadWrite);
  if (!file.ok()) return file.status();
  if (absl::Status s = (*file)->SetMtime(f.mtime_ns()); !s.ok()) return s;
  // What the file system stored is what later comparisons see.
  absl::StatusOr<FileInfo> stored = (*file)->Stat();
  if (!stored.ok()) return stored.status();
  if (!StoredMtimeMatches(stored->mtime_ns, f.mtime_ns())) {
    spdlog::warn("{} kept mtime {} ns for {} ns; sync will not recognise it as unchanged",
                 (*file)->path(), stored->mtime_ns, f.mtime_ns());
  }
  if (absl::Status s = (*file)->SetMode(mode); !s.ok()) return s;
  return (*file)->Sync();
}

// Unlinks every file of the tree in `dir` that is a commit marker, so that
// an old version moved aside in the no-RENAME_EXCHANGE fallback never
// carries one while it is not whole.
absl::Status UnlinkMarkers(FileSystem& fs, Directory& dir, const std::string& rel,
                           const std::vector<std::string>& globs) {
  absl::StatusOr<std::vector<std::string>> names = fs.List(dir);
  if (!names.ok()) return names.status();
  bool removed = false;
  for (const std::string& n : *names) {
    const std::string path = rel.empty() ? n : absl::StrCat(rel, "/", n);
    absl::StatusOr<std::optional<FileInfo>> st = fs.Stat(dir, n);
    if (!st.ok()) return st.status();
    if (!st->has_value()) continue;
    if ((*st)->is_directory()) {
      absl::StatusOr<std::unique_ptr<Directory>> sub = fs.OpenDir(dir, n, /*create=*/false, kDirMode);
      if (!sub.ok()) return sub.status();
      if (absl::Status s = UnlinkMarkers(fs, **sub, path, globs); !s.ok()) return s;
    } else if (IsCommitMarker(globs, path)) {
      if (absl::Status s = fs.Unlink(dir, n); !s.ok() && !absl::IsNotFound(s)) return s;
      removed = true;
    }
  }
  return removed ? fs.SyncDir(dir) : absl::OkStatus();
}

// The manifest's entries (files and symlinks) by relative path.
absl::flat_hash_set<std::string> ManifestPaths(const v1::Manifest& manifest) {
  absl::flat_hash_set<std::string> paths;
  for (const v1::ManifestFile& f : manifest.files()) paths.insert(f.path());
  for (const v1::ManifestSymlink& l : manifest.symlinks()) paths.insert(l.path());
  return paths;
}

// sync --no-delete: hard-links each file of the current destination `base`
// (in `dest_parent`) that the manifest does not name into next/, and makes
// each such symlink again, at the same relative path. An entry whose place
// the new version already takes (a manifest entry there, or a file where it
// needs a directory) is left out, and so goes to the trash.
absl::Status KeepDestinationOnly(FileSystem& fs, const v1::Manifest& manifest,
                                 Directory& dest_parent, const std::string& base,
                                 DirCache& dest_dirs, DirCache& next_dirs) {
  absl::StatusOr<std::vector<std::string>> there = ListVersion(fs, dest_parent, base);
  if (!there.ok()) return there.status();
  const absl::flat_hash_set<std::string> named = ManifestPaths(manifest);
  for (const std::string& rel : *there) {
    if (named.contains(rel)) continue;
    auto [prel, name_sv] = SplitParent(rel);
    const std::string name(name_sv);
    absl::StatusOr<Directory*> to = next_dirs.Get(prel, /*create=*/true);
    if (absl::IsFailedPrecondition(to.status()) || absl::IsAlreadyExists(to.status())) continue;
    if (!to.ok()) return to.status();
    absl::StatusOr<Directory*> from = dest_dirs.Get(prel, /*create=*/false);
    if (!from.ok()) return from.status();
    absl::StatusOr<std::optional<FileInfo>> st = fs.Stat(**from, name);
    if (!st.ok()) return st.status();
    if (!st->has_value()) continue;  // gone meanwhile
    absl::Status made;
    if ((*st)->type == FileInfo::Type::kSymlink) {
      absl::StatusOr<std::string> target = fs.ReadLink(**from, name);
      if (!target.ok()) return target.status();
      made = fs.Symlink(*target, **to, name);
    } else if ((*st)->is_regular()) {
      made = fs.Link(**from, name, **to, name);
    } else {
      continue;  // neither file nor symlink: not carried over
    }
    if (!made.ok() && !absl::IsAlreadyExists(made)) return made;
  }
  return absl::OkStatus();
}

// Adds to options.report what replacing the old version `old_name` (moved
// aside in `staging`) with `manifest` changed and deleted.
absl::Status ReportReplaced(FileSystem& fs, const v1::Manifest& manifest,
                            const PublishOptions& options, Directory& staging,
                            const std::string& old_name) {
  absl::StatusOr<std::vector<std::string>> there = ListVersion(fs, staging, old_name);
  if (!there.ok()) return there.status();
  options.report->set_replaced(true);
  CompareVersions(std::move(*there), manifest, options.single_file, options.skip_files,
                  options.keep_deleted, *options.report);
  return absl::OkStatus();
}

}  // namespace

// -------------------------------------------------------------- Staging ----

Staging::Staging(Staging&&) noexcept = default;
Staging& Staging::operator=(Staging&&) noexcept = default;
Staging::~Staging() = default;

absl::StatusOr<Staging> Staging::Open(FileSystem& fs, ResolvedDestination dest,
                                      std::string transfer_id) {
  if (absl::Status s = CheckTransferId(transfer_id); !s.ok()) return s;
  auto state = std::make_unique<State>();
  state->fs = &fs;
  state->dest = std::move(dest);
  state->transfer_id = std::move(transfer_id);
  state->dir = JoinPath(JoinPath(state->dest.export_root, kStagingRel), state->transfer_id);

  absl::StatusOr<std::unique_ptr<Directory>> dir = fs.OpenRoot(state->dest.export_root);
  if (!dir.ok()) return dir.status();
  state->root = std::move(*dir);
  dir = OpenDirBeneath(fs, *state->root, kStagingRel, /*create=*/true);
  if (!dir.ok()) return dir.status();
  state->parent = std::move(*dir);
  dir = OpenDirBeneath(fs, *state->parent, state->transfer_id, /*create=*/true);
  if (!dir.ok()) return dir.status();
  state->staging = std::move(*dir);
  dir = OpenDirBeneath(fs, *state->staging, kFilesDir, /*create=*/true);
  if (!dir.ok()) return dir.status();
  state->files = std::move(*dir);
  return Staging(std::move(state));
}

void Staging::CloseFiles() {
  absl::MutexLock lock(&state_->mu);
  state_->open_files.clear();
}

absl::StatusOr<File*> Staging::OpenFile(uint32_t file_index, const v1::ManifestFile& file) {
  return Open(file_index, file, /*create=*/true);
}

absl::StatusOr<File*> Staging::OpenStagedFile(uint32_t file_index, const v1::ManifestFile& file) {
  return Open(file_index, file, /*create=*/false);
}

absl::StatusOr<File*> Staging::Open(uint32_t file_index, const v1::ManifestFile& file,
                                    bool create) {
  State& s = *state_;
  FileSystem& fs = *s.fs;
  absl::MutexLock lock(&s.mu);
  if (auto it = s.open_files.find(file_index); it != s.open_files.end()) return it->second.get();
  if (!s.files) return absl::FailedPreconditionError("staging " + s.dir + " was removed");
  const std::string name = std::to_string(file_index);
  absl::StatusOr<std::unique_ptr<File>> f = fs.OpenFile(*s.files, name, OpenMode::kReadWrite);
  bool created = false;
  if (absl::IsNotFound(f.status())) {
    if (!create) {
      return absl::NotFoundError(
          absl::StrCat(s.dir, "/", kFilesDir, "/", name, " (", file.path(), ") is no longer staged"));
    }
    f = fs.OpenFile(*s.files, name, OpenMode::kCreateExclusive);
    created = true;
  }
  if (!f.ok()) return f.status();
  // Sized, not reserved: disk is used only as chunks arrive, so a peer that
  // declares a large file and sends little costs little.
  if (absl::Status st = (*f)->Resize(file.size()); !st.ok()) return st;
  EnableDirectIo(**f, s.dest.export_root);
  if (created) {
    // The directory entry must survive a crash once chunks are acknowledged.
    if (absl::Status st = fs.SyncDir(*s.files); !st.ok()) return st;
  }
  File* raw = f->get();
  s.open_files.emplace(file_index, std::move(*f));
  return raw;
}

absl::StatusOr<std::unique_ptr<File>> Staging::OpenForReadBack(uint32_t file_index,
                                                                const v1::ManifestFile& file) {
  State& s = *state_;
  absl::MutexLock lock(&s.mu);
  if (!s.files) return absl::FailedPreconditionError("staging " + s.dir + " was removed");
  const std::string name = std::to_string(file_index);
  absl::StatusOr<std::unique_ptr<File>> f = s.fs->OpenFile(*s.files, name, OpenMode::kReadWrite);
  if (absl::IsNotFound(f.status())) {
    return absl::NotFoundError(
        absl::StrCat(s.dir, "/", kFilesDir, "/", name, " (", file.path(), ") is no longer staged"));
  }
  if (!f.ok()) return f.status();
  EnableDirectIo(**f, s.dest.export_root);
  return f;
}

absl::StatusOr<bool> Staging::HoldsFile(uint32_t file_index, const v1::ManifestFile& file) {
  State& s = *state_;
  FileSystem& fs = *s.fs;
  if (!s.files) return false;
  absl::StatusOr<std::optional<FileInfo>> st = fs.Stat(*s.files, std::to_string(file_index));
  if (!st.ok()) return st.status();
  if (st->has_value() && (*st)->is_regular() && (*st)->size == file.size()) return true;
  absl::StatusOr<bool> past = PastPointOfNoReturn();
  if (!past.ok() || *past) return past;
  auto [prel, name] = SplitParent(file.path());
  absl::StatusOr<std::unique_ptr<Directory>> next =
      OpenDirBeneath(fs, *s.staging, JoinPath(kNextDir, prel), /*create=*/false);
  if (absl::IsNotFound(next.status())) return false;
  if (!next.ok()) return next.status();
  st = fs.Stat(**next, std::string(name));
  if (!st.ok()) return st.status();
  return st->has_value() && (*st)->is_regular() && (*st)->size == file.size();
}

absl::Status Staging::DiscardFile(uint32_t file_index) {
  State& s = *state_;
  absl::MutexLock lock(&s.mu);
  s.open_files.erase(file_index);
  if (!s.files) return absl::FailedPreconditionError("staging " + s.dir + " was removed");
  absl::Status removed = s.fs->Unlink(*s.files, std::to_string(file_index));
  if (!removed.ok() && !absl::IsNotFound(removed)) return removed;
  return s.fs->SyncDir(*s.files);
}

absl::StatusOr<bool> Staging::PastPointOfNoReturn() {
  State& s = *state_;
  if (!s.staging) return false;
  absl::StatusOr<std::optional<FileInfo>> st = s.fs->Stat(*s.staging, kInstallRecord);
  if (!st.ok()) return st.status();
  return st->has_value();
}

absl::Status Staging::Remove() {
  CloseFiles();
  State& s = *state_;
  if (!s.parent) return absl::OkStatus();
  s.files.reset();
  s.staging.reset();
  if (absl::Status st = RemoveTree(*s.fs, *s.parent, s.transfer_id); !st.ok()) return st;
  return s.fs->SyncDir(*s.parent);
}

absl::Status Staging::RemoveLeftover(FileSystem& fs, const ResolvedDestination& dest,
                                     const std::string& transfer_id) {
  if (absl::Status s = CheckTransferId(transfer_id); !s.ok()) return s;
  absl::StatusOr<std::unique_ptr<Directory>> root = fs.OpenRoot(dest.export_root);
  if (!root.ok()) return root.status();
  absl::StatusOr<std::unique_ptr<Directory>> parent =
      OpenDirBeneath(fs, **root, kStagingRel, /*create=*/false);
  if (absl::IsNotFound(parent.status())) return absl::OkStatus();
  if (!parent.ok()) return parent.status();
  absl::StatusOr<std::optional<FileInfo>> st = fs.Stat(**parent, transfer_id);
  if (!st.ok()) return st.status();
  if (!st->has_value()) return absl::OkStatus();
  if (absl::Status s = RemoveTree(fs, **parent, transfer_id); !s.ok()) return s;
  return fs.SyncDir(**parent);
}

absl::StatusOr<std::vector<std::string>> Staging::ListStaged(FileSystem& fs,
                                                             const std::string& export_root) {
  absl::StatusOr<std::unique_ptr<Directory>> root = fs.OpenRoot(export_root);
  if (!root.ok()) return root.status();
  absl::StatusOr<std::unique_ptr<Directory>> parent =
      OpenDirBeneath(fs, **root, kStagingRel, /*create=*/false);
  if (absl::IsNotFound(parent.status())) return std::vector<std::string>();
  if (!parent.ok()) return parent.status();
  return fs.List(**parent);
}

absl::Status Staging::Publish(const v1::Manifest& manifest, const PublishOptions& options,
                              std::vector<uint32_t>* resend) {
  CloseFiles();
  State& s = *state_;
  FileSystem& fs = *s.fs;
  if (!s.files) return absl::FailedPreconditionError("staging " + s.dir + " was removed");
  const std::string& dest_desc = s.dest.absolute;
  auto [parent_rel, base_sv] = SplitParent(s.dest.relative);
  const std::string base(base_sv);
  const int n = manifest.files_size();
  auto skipped = [&](int i) { return options.skip_files.contains(static_cast<uint32_t>(i)); };
  // Directories of the new version, and those made on the way to it.
  const uint32_t dir_mode = 0777 & options.mode_mask;
  if (options.single_file && (n != 1 || manifest.symlinks_size() != 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a single-file transfer needs exactly one file and no symlink in its manifest, not ", n,
        " files and ", manifest.symlinks_size(), " symlinks"));
  }

  // The destination's parent, created if needed, with no symlink on the way.
  absl::StatusOr<std::unique_ptr<Directory>> dest_parent =
      OpenDirBeneath(fs, *s.root, parent_rel, /*create=*/true, dir_mode);
  if (!dest_parent.ok()) return dest_parent.status();
  absl::StatusOr<std::optional<FileInfo>> dest_st = fs.Stat(**dest_parent, base);
  if (!dest_st.ok()) return dest_st.status();
  const std::optional<FileInfo> current = *dest_st;
  if (current && current->type == FileInfo::Type::kSymlink) {
    return absl::PermissionDeniedError(
        absl::StrCat("destination ", dest_desc, " is a symlink; refusing to publish through it"));
  }
  if (current && options.single_file && current->is_directory()) {
    return absl::FailedPreconditionError(
        absl::StrCat("destination ", dest_desc, " is a directory; expected a file"));
  }
  if (current && !options.single_file && !current->is_directory()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "destination ", dest_desc, " exists and is not a directory; cannot publish a tree there"));
  }

  // ---- 1-2: the new version, complete and durable, beside the destination.
  std::optional<FileInfo> target;
  bool resumed = false;  // an earlier run passed the point of no return
  if (absl::StatusOr<bool> past = PastPointOfNoReturn(); !past.ok()) {
    return past.status();
  } else if (*past) {
    resumed = true;
    const std::string desc = JoinPath(s.dir, kInstallRecord);
    absl::StatusOr<std::string> text = ReadSmallFile(fs, *s.staging, kInstallRecord);
    if (!text.ok()) return text.status();
    absl::StatusOr<FileInfo> id = ParseIdentity(*text, desc);
    if (!id.ok()) return id.status();
    target = *id;
  } else if (options.single_file && skipped(0)) {
    return absl::OkStatus();  // unchanged: the destination stays as it is
  }

  std::vector<uint32_t> lost;
  // Puts staged file `i` at `name` in `dir`: finalized, then moved from f/.
  // Returns false (and notes it in `lost`) when its bytes are gone.
  auto move_staged = [&](int i, Directory& dir, const std::string& name) -> absl::StatusOr<bool> {
    const v1::ManifestFile& f = manifest.files(i);
    const std::string staged = std::to_string(i);
    absl::StatusOr<std::optional<FileInfo>> st = fs.Stat(*s.files, staged);
    if (!st.ok()) return st.status();
    if (!st->has_value() && HasNoPlannedChunk(f, manifest.chunk_size())) {
      // No chunk was ever sent for it (0 bytes, or all holes).
      absl::StatusOr<std::unique_ptr<File>> created =
          fs.OpenFile(*s.files, staged, OpenMode::kCreateOrOpen);
      if (!created.ok()) return created.status();
      if (absl::Status r = (*created)->Resize(f.size()); !r.ok()) return r;
      created->reset();
      st = fs.Stat(*s.files, staged);
      if (!st.ok()) return st.status();
    }
    if (!st->has_value() || !(*st)->is_regular() || (*st)->size != f.size()) {
      spdlog::warn("staging {}: staged file {} ({}) is {}; asking for it again", s.dir, staged,
                   f.path(), st->has_value() ? "short" : "missing");
      lost.push_back(static_cast<uint32_t>(i));
      return false;
    }
    if (absl::Status s2 = Finalize(fs, *s.files, staged, **st, f, options.mode_mask); !s2.ok()) {
      return s2;
    }
    if (absl::Status s2 = fs.Rename(*s.files, staged, dir, name, RenameMode::kReplace); !s2.ok()) {
      return s2;
    }
    return true;
  };

  if (!target && options.single_file) {
    absl::StatusOr<std::optional<FileInfo>> st = fs.Stat(*s.files, "0");
    if (!st.ok()) return st.status();
    // Finalizes f/0 in place ("moving" it onto itself is not needed).
    const v1::ManifestFile& f = manifest.files(0);
    if (!st->has_value() && HasNoPlannedChunk(f, manifest.chunk_size())) {
      absl::StatusOr<std::unique_ptr<File>> created = fs.OpenFile(*s.files, "0", OpenMode::kCreateOrOpen);
      if (!created.ok()) return created.status();
      if (absl::Status r = (*created)->Resize(f.size()); !r.ok()) return r;
      created->reset();
      if (absl::Status s2 = fs.SyncDir(*s.files); !s2.ok()) return s2;
      st = fs.Stat(*s.files, "0");
      if (!st.ok()) return st.status();
    }
    if (!st->has_value() || !(*st)->is_regular() || (*st)->size != f.size()) {
      lost.push_back(0);
    } else {
      if (absl::Status s2 = Finalize(fs, *s.files, "0", **st, f, options.mode_mask); !s2.ok()) {
        return s2;
      }
      absl::StatusOr<std::optional<FileInfo>> done = fs.Stat(*s.files, "0");
      if (!done.ok()) return done.status();
      target = **done;
    }
  } else if (!target) {
    absl::StatusOr<std::unique_ptr<Directory>> next =
        OpenDirBeneath(fs, *s.staging, kNextDir, /*create=*/true, dir_mode);
    if (!next.ok()) return next.status();
    DirCache next_dirs(fs, **next, dir_mode);
    std::unique_ptr<Directory> dest_dir;
    if (current) {
      absl::StatusOr<std::unique_ptr<Directory>> d =
          fs.OpenDir(**dest_parent, base, /*create=*/false, kDirMode);
      if (!d.ok()) return d.status();
      dest_dir = std::move(*d);
    }
    std::optional<DirCache> dest_dirs;
    if (dest_dir) dest_dirs.emplace(fs, *dest_dir, dir_mode);
    // Puts hard link `i` at `name` in `dir` (where `at` is found): another
    // name of its target's file, placed in next/ earlier in this loop
    // (ValidateManifest: the target comes first and is no link itself).
    // A name an earlier run linked to an older copy of the target is linked
    // again. Nothing when the target is lost: it is linked once the target
    // is sent again.
    auto place_link = [&](int i, Directory& dir, const std::string& name,
                          const std::optional<FileInfo>& at) -> absl::Status {
      const uint32_t t = manifest.files(i).link_of() - 1;
      if (std::find(lost.begin(), lost.end(), t) != lost.end()) return absl::OkStatus();
      auto [tprel, tname_sv] = SplitParent(manifest.files(static_cast<int>(t)).path());
      const std::string tname(tname_sv);
      absl::StatusOr<Directory*> tdir = next_dirs.Get(tprel, /*create=*/false);
      if (!tdir.ok()) return tdir.status();
      absl::StatusOr<std::optional<FileInfo>> target = fs.Stat(**tdir, tname);
      if (!target.ok()) return target.status();
      if (!target->has_value() || !(*target)->is_regular()) {
        return absl::InternalError(absl::StrCat(
            "staging ", s.dir, ": ", manifest.files(i).path(), " links to ",
            manifest.files(static_cast<int>(t)).path(), ", which is not in the new version"));
      }
      if (at.has_value()) {
        if (at->SameObject(**target)) return absl::OkStatus();  // linked by an earlier run
        if (!at->is_regular()) {
          return absl::InvalidArgumentError(
              absl::StrCat("manifest file ", manifest.files(i).path(),
                           " collides with another entry of the new version"));
        }
        if (absl::Status u = fs.Unlink(dir, name); !u.ok()) return u;
      }
      return fs.Link(**tdir, tname, dir, name);
    };
    for (int i = 0; i < n; ++i) {
      const v1::ManifestFile& f = manifest.files(i);
      auto [prel, fname_sv] = SplitParent(f.path());
      const std::string fname(fname_sv);
      absl::StatusOr<Directory*> dir = next_dirs.Get(prel, /*create=*/true);
      if (!dir.ok()) return dir.status();
      absl::StatusOr<std::optional<FileInfo>> at = fs.Stat(**dir, fname);
      if (!at.ok()) return at.status();
      if (f.link_of() != 0) {
        absl::Status l = place_link(i, **dir, fname, *at);
        if (!l.ok()) return l;
        continue;
      }
      const bool placed = at->has_value() && (*at)->is_regular() && (*at)->size == f.size();
      if (skipped(i)) {
        if (placed) continue;  // linked by an earlier run
        // Unchanged at the destination: the same file joins the new version,
        // if the destination still holds what the open found there.
        bool linked = false;
        if (dest_dirs) {
          absl::StatusOr<Directory*> from = dest_dirs->Get(prel, /*create=*/false);
          if (from.ok()) {
            absl::StatusOr<std::optional<FileInfo>> old = fs.Stat(**from, fname);
            if (!old.ok()) return old.status();
            bool same = old->has_value() && (*old)->is_regular() && (*old)->size == f.size();
            if (same && options.compare_content) {
              absl::StatusOr<bool> content = ContentMatches(fs, **from, fname, f);
              if (!content.ok()) return content.status();
              same = *content;
            } else if (same) {
              same = StoredMtimeMatches((*old)->mtime_ns, f.mtime_ns());
            }
            if (same) {
              absl::Status l = fs.Link(**from, fname, **dir, fname);
              if (!l.ok() && !absl::IsAlreadyExists(l)) return l;
              linked = true;
            }
          } else if (!absl::IsNotFound(from.status()) &&
                     !absl::IsFailedPrecondition(from.status())) {
            return from.status();
          }
        }
        if (!linked) {
          spdlog::warn("staging {}: {} is no longer unchanged at {}; asking for it again", s.dir,
                       f.path(), dest_desc);
          lost.push_back(static_cast<uint32_t>(i));
        }
        continue;
      }
      // A staged copy always wins: a file moved into next/ by an earlier run
      // may be of an older generation that was sent again since.
      absl::StatusOr<std::optional<FileInfo>> staged = fs.Stat(*s.files, std::to_string(i));
      if (!staged.ok()) return staged.status();
      if (!staged->has_value() && placed) continue;
      absl::StatusOr<bool> moved = move_staged(i, **dir, fname);
      if (!moved.ok()) return moved.status();
    }
    for (const std::string& d : manifest.empty_dirs()) {
      if (absl::StatusOr<Directory*> dir = next_dirs.Get(d, /*create=*/true); !dir.ok()) {
        return dir.status();
      }
    }
    // Symlinks are made in next/ like any entry of the new version; their
    // parents are opened without following symlinks, and nothing below one
    // is ever written (ValidateManifest), so none is followed here.
    for (const v1::ManifestSymlink& l : manifest.symlinks()) {
      auto [prel, lname_sv] = SplitParent(l.path());
      const std::string lname(lname_sv);
      absl::StatusOr<Directory*> dir = next_dirs.Get(prel, /*create=*/true);
      if (!dir.ok()) return dir.status();
      absl::StatusOr<std::string> have = fs.ReadLink(**dir, lname);
      if (have.ok() && *have == l.target()) continue;  // made by an earlier run
      if (absl::IsFailedPrecondition(have.status())) {
        return absl::InvalidArgumentError(absl::StrCat(
            "manifest symlink ", l.path(), " collides with another entry of the new version"));
      }
      if (have.ok()) {
        if (absl::Status st = fs.Unlink(**dir, lname); !st.ok()) return st;
      } else if (!absl::IsNotFound(have.status())) {
        return have.status();
      }
      if (absl::Status st = fs.Symlink(l.target(), **dir, lname); !st.ok()) return st;
    }
    // sync --no-delete: what only the destination holds joins the new
    // version, unless an entry of the manifest takes its place.
    if (options.keep_deleted && dest_dirs && lost.empty()) {
      absl::Status kept =
          KeepDestinationOnly(fs, manifest, **dest_parent, base, *dest_dirs, next_dirs);
      if (!kept.ok()) return kept;
    }
    if (lost.empty()) {
      if (absl::Status st = next_dirs.SyncAll(); !st.ok()) return st;
      if (absl::Status st = fs.SyncDir(*s.staging); !st.ok()) return st;
      absl::StatusOr<std::optional<FileInfo>> id = fs.Stat(*s.staging, kNextDir);
      if (!id.ok()) return id.status();
      target = **id;
    }
  }
  if (!lost.empty()) {
    if (resend != nullptr) *resend = lost;
    return absl::UnavailableError(absl::StrCat(
        "cannot publish ", dest_desc, " yet: ", lost.size(),
        " file(s) must be sent again (their staged or unchanged copy is gone); the destination "
        "was not touched"));
  }

  // ---- 3: the point of no return.
  absl::StatusOr<bool> past = PastPointOfNoReturn();
  if (!past.ok()) return past.status();
  if (!*past) {
    if (options.before_install) options.before_install();
    if (absl::Status st = WriteFileAtomically(fs, *s.staging, kInstallRecord, FormatIdentity(*target));
        !st.ok()) {
      return st;
    }
  }

  // ---- 4: install, unless an earlier run did.
  absl::StatusOr<std::optional<FileInfo>> now = fs.Stat(**dest_parent, base);
  if (!now.ok()) return now.status();
  bool installed = now->has_value() && (*now)->SameObject(*target);
  if (!installed && resumed) {
    // What an earlier run recorded is no longer in staging: it was
    // installed, and a newer version has replaced it at the destination
    // since (a publish whose record could not be journaled, or whose old
    // version could not be removed yet, then another publish). Only the
    // install moves the recorded object out of next/: after an exchange
    // next/ holds the old version, another object.
    absl::StatusOr<std::optional<FileInfo>> staged =
        options.single_file ? fs.Stat(*s.files, "0") : fs.Stat(*s.staging, kNextDir);
    if (!staged.ok()) return staged.status();
    installed = !staged->has_value() || !(*staged)->SameObject(*target);
  }
  if (!installed && options.single_file) {
    absl::StatusOr<std::optional<FileInfo>> st = fs.Stat(*s.files, "0");
    if (!st.ok()) return st.status();
    if (!st->has_value() || !(*st)->SameObject(*target)) {
      return absl::DataLossError(absl::StrCat("staged file ", s.dir, "/f/0 changed under publish"));
    }
    // The rename drops the old file's name: another name keeps it for the trash.
    if (!options.trash_entry.empty() && now->has_value() && (*now)->is_regular()) {
      if (absl::Status st2 = RemoveTree(fs, *s.staging, kOldDir); !st2.ok()) return st2;
      if (absl::Status st2 = fs.Link(**dest_parent, base, *s.staging, kOldDir); !st2.ok()) {
        return st2;
      }
      if (absl::Status st2 = fs.SyncDir(*s.staging); !st2.ok()) return st2;
    }
    if (absl::Status st2 = fs.Rename(*s.files, "0", **dest_parent, base, RenameMode::kReplace);
        !st2.ok()) {
      return st2;
    }
  } else if (!installed) {
    absl::StatusOr<std::optional<FileInfo>> st = fs.Stat(*s.staging, kNextDir);
    if (!st.ok()) return st.status();
    if (!st->has_value() || !(*st)->SameObject(*target)) {
      return absl::DataLossError(
          absl::StrCat("the new version in ", s.dir, "/next changed under publish"));
    }
    absl::Status r = absl::OkStatus();
    if (!now->has_value()) {
      r = fs.Rename(*s.staging, kNextDir, **dest_parent, base, RenameMode::kNoReplace);
    }
    if (now->has_value() || absl::IsAlreadyExists(r)) {
      r = fs.Rename(*s.staging, kNextDir, **dest_parent, base, RenameMode::kExchange);
      if (absl::IsUnimplemented(r)) {
        spdlog::info("staging {}: {} has no RENAME_EXCHANGE; moving the old version away first",
                     s.dir, dest_desc);
        absl::StatusOr<std::unique_ptr<Directory>> old =
            fs.OpenDir(**dest_parent, base, /*create=*/false, kDirMode);
        if (!old.ok()) return old.status();
        if (absl::Status st2 = UnlinkMarkers(fs, **old, "", options.commit_last); !st2.ok()) {
          return st2;
        }
        if (absl::Status st2 = RemoveTree(fs, *s.staging, kOldDir); !st2.ok()) return st2;
        if (absl::Status st2 = fs.Rename(**dest_parent, base, *s.staging, kOldDir,
                                         RenameMode::kReplace);
            !st2.ok()) {
          return st2;
        }
        r = fs.Rename(*s.staging, kNextDir, **dest_parent, base, RenameMode::kReplace);
      }
    }
    if (!r.ok()) return r;
  }
  if (absl::Status st = fs.SyncDir(**dest_parent); !st.ok()) return st;
  if (absl::Status st = fs.SyncDir(*s.staging); !st.ok()) return st;

  // ---- 5: the old version goes to the trash, or is removed. next/ is the
  // old version after an exchange; it is never moved while it is the
  // installed one.
  absl::StatusOr<std::optional<FileInfo>> leftover = fs.Stat(*s.staging, kNextDir);
  if (!leftover.ok()) return leftover.status();
  for (const char* old_name : {kNextDir, kOldDir}) {
    if (old_name == kNextDir && (!leftover->has_value() || (*leftover)->SameObject(*target))) {
      continue;
    }
    absl::StatusOr<std::optional<FileInfo>> old_st = fs.Stat(*s.staging, old_name);
    if (!old_st.ok()) return old_st.status();
    if (!old_st->has_value()) continue;
    if (options.report != nullptr) {
      if (absl::Status st = ReportReplaced(fs, manifest, options, *s.staging, old_name); !st.ok()) {
        return st;
      }
    }
    if (options.trash_entry.empty()) {
      if (absl::Status st = RemoveTree(fs, *s.staging, old_name); !st.ok()) return st;
      continue;
    }
    absl::StatusOr<std::unique_ptr<Directory>> entry =
        OpenTrashEntry(fs, *s.root, options.trash_entry, s.dest.relative);
    if (!entry.ok()) return entry.status();
    if (absl::Status st =
            fs.Rename(*s.staging, old_name, **entry, kTrashVersion, RenameMode::kNoReplace);
        !st.ok()) {
      return st;
    }
    if (absl::Status st = fs.SyncDir(**entry); !st.ok()) return st;
    if (options.report != nullptr) {
      options.report->set_trash(absl::StrCat(kTrashRel, "/", options.trash_entry));
    }
  }
  {
    absl::MutexLock lock(&s.mu);
    s.open_files.clear();
    s.files.reset();
  }
  if (absl::Status st = RemoveTree(fs, *s.staging, kFilesDir); !st.ok()) return st;
  return fs.SyncDir(*s.staging);
}

// ------------------------------------------------------------------ sync ----

absl::StatusOr<bool> PublishedFileMatches(FileSystem& fs, const ResolvedDestination& dest,
                                          bool single_file, const v1::ManifestFile& file,
                                          bool compare_content) {
  const std::string rel =
      single_file ? dest.relative : absl::StrCat(dest.relative, "/", file.path());
  auto [parent, base] = SplitParent(rel);
  absl::StatusOr<std::unique_ptr<Directory>> root = fs.OpenRoot(dest.export_root);
  if (!root.ok()) return root.status();
  absl::StatusOr<std::unique_ptr<Directory>> dir =
      OpenDirBeneath(fs, **root, parent, /*create=*/false);
  if (!dir.ok()) {
    if (absl::IsNotFound(dir.status()) || absl::IsFailedPrecondition(dir.status())) return false;
    return dir.status();
  }
  if (compare_content) return ContentMatches(fs, **dir, std::string(base), file);
  absl::StatusOr<std::optional<FileInfo>> st = fs.Stat(**dir, std::string(base));
  if (!st.ok()) return st.status();
  return st->has_value() && (*st)->is_regular() && (*st)->size == file.size() &&
         StoredMtimeMatches((*st)->mtime_ns, file.mtime_ns());
}

absl::StatusOr<std::optional<std::string>> DestinationDiffers(FileSystem& fs,
                                                              const ResolvedDestination& dest,
                                                              bool single_file,
                                                              const v1::Manifest& manifest) {
  auto [parent_rel, base_sv] = SplitParent(dest.relative);
  const std::string base(base_sv);
  absl::StatusOr<std::unique_ptr<Directory>> root = fs.OpenRoot(dest.export_root);
  if (!root.ok()) return root.status();
  absl::StatusOr<std::unique_ptr<Directory>> parent =
      OpenDirBeneath(fs, **root, parent_rel, /*create=*/false);
  if (absl::IsNotFound(parent.status())) return std::nullopt;
  if (!parent.ok()) return parent.status();
  absl::StatusOr<std::optional<FileInfo>> st = fs.Stat(**parent, base);
  if (!st.ok()) return st.status();
  if (!st->has_value()) return std::nullopt;
  if (single_file) {
    if (!(*st)->is_regular()) return std::string("it exists and is not a file");
    absl::StatusOr<bool> same = PublishedFileMatches(fs, dest, true, manifest.files(0));
    if (!same.ok()) return same.status();
    if (!*same) return std::string("it holds another file");
    return std::nullopt;
  }
  if (!(*st)->is_directory()) return std::string("it exists and is not a directory");
  absl::StatusOr<std::vector<std::string>> there = ListVersion(fs, **parent, base);
  if (!there.ok()) return there.status();
  absl::flat_hash_map<std::string, int> files;
  for (int i = 0; i < manifest.files_size(); ++i) files[manifest.files(i).path()] = i;
  absl::flat_hash_map<std::string, std::string> links;
  for (const v1::ManifestSymlink& l : manifest.symlinks()) links[l.path()] = l.target();
  const std::string other = "it holds another tree";
  if (there->size() != files.size() + links.size()) return other;
  absl::StatusOr<std::unique_ptr<Directory>> top =
      fs.OpenDir(**parent, base, /*create=*/false, kDirMode);
  if (!top.ok()) return top.status();
  for (const std::string& rel : *there) {
    if (auto l = links.find(rel); l != links.end()) {
      auto [prel, name] = SplitParent(rel);
      absl::StatusOr<std::unique_ptr<Directory>> dir =
          OpenDirBeneath(fs, **top, prel, /*create=*/false);
      if (!dir.ok()) return dir.status();
      absl::StatusOr<std::string> target = fs.ReadLink(**dir, std::string(name));
      if (!target.ok() || *target != l->second) return other;
      continue;
    }
    auto f = files.find(rel);
    if (f == files.end()) return other;
    absl::StatusOr<bool> same = PublishedFileMatches(fs, dest, false, manifest.files(f->second));
    if (!same.ok()) return same.status();
    if (!*same) return other;
  }
  return std::nullopt;
}

}  // namespace longhaul::storage
