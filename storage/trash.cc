#include "storage/trash.h"

#include <algorithm>
#include <optional>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace longhaul::storage {

std::string TrashEntryName(int64_t unix_ms, std::string_view transfer_id) {
  return absl::StrCat(unix_ms, ".", std::string(transfer_id));
}

absl::StatusOr<std::unique_ptr<Directory>> OpenTrashEntry(FileSystem& fs, Directory& root,
                                                          const std::string& entry,
                                                          const std::string& origin) {
  absl::StatusOr<std::unique_ptr<Directory>> trash =
      OpenDirBeneath(fs, root, kTrashRel, /*create=*/true);
  if (!trash.ok()) return trash.status();
  absl::StatusOr<std::unique_ptr<Directory>> dir =
      fs.OpenDir(**trash, entry, /*create=*/true, kDirMode);
  if (!dir.ok()) return dir.status();
  if (absl::Status s = fs.SyncDir(**trash); !s.ok()) return s;
  if (absl::Status s = WriteFileAtomically(fs, **dir, kTrashOrigin, absl::StrCat(origin, "\n"));
      !s.ok()) {
    return s;
  }
  return dir;
}

absl::StatusOr<std::vector<std::string>> ExpireTrash(FileSystem& fs, const std::string& export_root,
                                                     absl::Time now, absl::Duration retention) {
  std::vector<std::string> removed;
  absl::StatusOr<std::unique_ptr<Directory>> root = fs.OpenRoot(export_root);
  if (!root.ok()) return root.status();
  absl::StatusOr<std::unique_ptr<Directory>> trash =
      OpenDirBeneath(fs, **root, kTrashRel, /*create=*/false);
  if (absl::IsNotFound(trash.status())) return removed;
  if (!trash.ok()) return trash.status();
  absl::StatusOr<std::vector<std::string>> names = fs.List(**trash);
  if (!names.ok()) return names.status();
  const int64_t cutoff_ms = absl::ToUnixMillis(now - retention);
  for (const std::string& name : *names) {
    const size_t dot = name.find('.');
    int64_t replaced_ms = 0;
    if (dot == std::string::npos || !absl::SimpleAtoi(name.substr(0, dot), &replaced_ms)) continue;
    if (replaced_ms > cutoff_ms) continue;
    if (absl::Status s = RemoveTree(fs, **trash, name); !s.ok()) return s;
    removed.push_back(name);
  }
  return removed;
}

namespace {

absl::Status ListInto(FileSystem& fs, Directory& dir, const std::string& prefix,
                      std::vector<std::string>& out) {
  absl::StatusOr<std::vector<std::string>> names = fs.List(dir);
  if (!names.ok()) return names.status();
  for (const std::string& name : *names) {
    absl::StatusOr<std::optional<FileInfo>> st = fs.Stat(dir, name);
    if (!st.ok()) return st.status();
    if (!st->has_value()) continue;  // gone meanwhile
    const std::string rel = prefix.empty() ? name : absl::StrCat(prefix, "/", name);
    if (!(*st)->is_directory()) {
      out.push_back(rel);
      continue;
    }
    absl::StatusOr<std::unique_ptr<Directory>> sub =
        fs.OpenDir(dir, name, /*create=*/false, kDirMode);
    if (!sub.ok()) return sub.status();
    if (absl::Status s = ListInto(fs, **sub, rel, out); !s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<std::string>> ListVersion(FileSystem& fs, Directory& dir,
                                                     const std::string& name) {
  std::vector<std::string> out;
  absl::StatusOr<std::optional<FileInfo>> st = fs.Stat(dir, name);
  if (!st.ok()) return st.status();
  if (!st->has_value()) return out;
  if (!(*st)->is_directory()) {
    out.push_back("");
    return out;
  }
  absl::StatusOr<std::unique_ptr<Directory>> top =
      fs.OpenDir(dir, name, /*create=*/false, kDirMode);
  if (!top.ok()) return top.status();
  if (absl::Status s = ListInto(fs, **top, "", out); !s.ok()) return s;
  return out;
}

void CompareVersions(std::vector<std::string> there, const v1::Manifest& manifest, bool single_file,
                     const absl::flat_hash_set<uint32_t>& skip_files, bool keep_deleted,
                     v1::PublishReport& report) {
  std::sort(there.begin(), there.end());
  absl::flat_hash_set<std::string> named, changed;
  for (int i = 0; i < manifest.files_size(); ++i) {
    const std::string path = single_file ? "" : manifest.files(i).path();
    named.insert(path);
    if (!skip_files.contains(static_cast<uint32_t>(i))) changed.insert(path);
  }
  for (const v1::ManifestSymlink& l : manifest.symlinks()) named.insert(l.path());
  for (const std::string& rel : there) {
    if (changed.contains(rel)) {
      report.set_changed_count(report.changed_count() + 1);
      if (report.changed_size() < kReportListed) report.add_changed(rel);
    } else if (!named.contains(rel) && !keep_deleted) {
      report.set_deleted_count(report.deleted_count() + 1);
      if (report.deleted_size() < kReportListed) report.add_deleted(rel);
    }
  }
}

absl::StatusOr<v1::PublishReport> WouldReplace(FileSystem& fs, const ResolvedDestination& dest,
                                               bool single_file, const v1::Manifest& manifest,
                                               const absl::flat_hash_set<uint32_t>& skip_files,
                                               bool keep_deleted) {
  v1::PublishReport report;
  const size_t slash = dest.relative.rfind('/');
  const std::string parent_rel = slash == std::string::npos ? "" : dest.relative.substr(0, slash);
  const std::string base =
      slash == std::string::npos ? dest.relative : dest.relative.substr(slash + 1);
  absl::StatusOr<std::unique_ptr<Directory>> root = fs.OpenRoot(dest.export_root);
  if (!root.ok()) return root.status();
  absl::StatusOr<std::unique_ptr<Directory>> parent =
      OpenDirBeneath(fs, **root, parent_rel, /*create=*/false);
  if (absl::IsNotFound(parent.status())) return report;
  if (!parent.ok()) return parent.status();
  absl::StatusOr<std::optional<FileInfo>> st = fs.Stat(**parent, base);
  if (!st.ok()) return st.status();
  if (!st->has_value()) return report;
  absl::StatusOr<std::vector<std::string>> there = ListVersion(fs, **parent, base);
  if (!there.ok()) return there.status();
  report.set_replaced(true);
  CompareVersions(std::move(*there), manifest, single_file, skip_files, keep_deleted, report);
  return report;
}

}  // namespace longhaul::storage
