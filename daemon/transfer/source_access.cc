#include "daemon/transfer/source_access.h"

#include <grp.h>
#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "common/errno_status.h"
#include "daemon/transfer/local_paths.h"

namespace longhaul::daemon {
namespace {

// The resolved path of `path`, or the errno of realpath(3).
absl::StatusOr<std::string> Resolve(const std::string& path, int* err) {
  char* resolved = realpath(path.c_str(), nullptr);
  if (resolved == nullptr) {
    *err = errno;
    return ErrnoError(*err, absl::StrCat("cannot resolve ", path));
  }
  std::string out(resolved);
  free(resolved);
  return out;
}

}  // namespace

Caller Caller::LocalUser(uid_t uid, gid_t gid) {
  Caller c;
  c.kind = Kind::kLocalUser;
  c.uid = uid;
  c.gid = gid;
  return c;
}

Caller Caller::Token(ControlRole role, std::string address) {
  Caller c;
  c.kind = Kind::kToken;
  c.role = role;
  c.address = std::move(address);
  return c;
}

Caller Caller::PeerSite(std::string site) {
  Caller c;
  c.kind = Kind::kPeerSite;
  c.address = std::move(site);
  return c;
}

std::string Caller::ToString() const {
  if (kind == Kind::kPeerSite) return absl::StrCat("peer site ", address);
  if (kind == Kind::kToken)
    return absl::StrCat(address, " (token role ", ControlRoleName(role), ")");
  return absl::StrCat("uid ", uid, " (", UserName(uid), ")");
}

std::string Caller::RequesterKey() const {
  switch (kind) {
    case Kind::kPeerSite:
      return absl::StrCat("site:", address);
    case Kind::kToken:
      return absl::StrCat("token:", ControlRoleName(role));
    case Kind::kLocalUser:
      break;
  }
  return absl::StrCat("uid:", uid);
}

std::optional<Caller> Caller::FromRequesterKey(absl::string_view key, gid_t gid) {
  if (absl::ConsumePrefix(&key, "uid:")) {
    uint32_t uid = 0;
    if (!absl::SimpleAtoi(key, &uid)) return std::nullopt;
    return LocalUser(static_cast<uid_t>(uid), gid);
  }
  if (absl::ConsumePrefix(&key, "token:")) {
    for (ControlRole role : {ControlRole::kOperator, ControlRole::kViewer}) {
      if (key == ControlRoleName(role)) return Token(role, "");
    }
    return std::nullopt;
  }
  if (absl::ConsumePrefix(&key, "site:") && !key.empty()) return PeerSite(std::string(key));
  return std::nullopt;
}

std::vector<SourceAccessForbidden> DaemonSecrets(const DaemonConfig& config) {
  // The directories of the TLS files hold more than they name:
  // deploy/pki.sh (longhaul-pki) keeps the CA's private key next to ca.pem
  // and every site's key next to this one, and no export should ship them.
  auto directory_of = [](const std::string& file) {
    std::string::size_type slash = file.rfind('/');
    return slash == std::string::npos || slash == 0 ? std::string() : file.substr(0, slash);
  };
  std::vector<SourceAccessForbidden> secrets = {
      {config.tls.key, "this site's TLS private key"},
      {config.state_dir, "this daemon's state_dir"},
  };
  std::vector<std::string> pki_dirs = {directory_of(config.tls.key)};
  if (pki_dirs[0] != directory_of(config.tls.ca)) pki_dirs.push_back(directory_of(config.tls.ca));
  for (const std::string& dir : pki_dirs) {
    if (dir.empty()) continue;
    secrets.push_back({dir, "this site's PKI directory (that of tls.key or tls.ca)"});
  }
  for (const ControlToken& t : config.control_tokens) {
    secrets.push_back({t.file, "a control token"});
  }
  return secrets;
}

std::vector<gid_t> SystemGroupsOf(uid_t uid) {
  struct passwd pw;
  struct passwd* found = nullptr;
  char buffer[4096];
  if (getpwuid_r(uid, &pw, buffer, sizeof(buffer), &found) != 0 || found == nullptr) return {};
  int count = 32;
  std::vector<gid_t> groups;
  for (int attempt = 0; attempt < 8; ++attempt) {
    groups.resize(count);
    int n = count;
    if (getgrouplist(found->pw_name, found->pw_gid, groups.data(), &n) >= 0) {
      groups.resize(n);
      return groups;
    }
    count = std::max(n, count * 2);
  }
  return {found->pw_gid};
}

// One check: the caller, its groups, the exports resolved once, and the
// verdicts on directories already judged.
class SourceAccess::Check {
 public:
  Check(const SourceAccess& access, const Caller& caller)
      : caller_(caller), privileged_(caller.kind != Caller::Kind::kLocalUser || caller.uid == 0) {
    std::vector<std::string> shown;
    for (const ExportConfig& e : access.exports_) {
      shown.push_back(absl::StrCat(e.name, ": ", e.path));
      int err = 0;
      if (auto r = Resolve(e.path, &err); r.ok()) exports_.push_back(*std::move(r));
    }
    exports_shown_ = shown.empty() ? "this site has no exports" : absl::StrJoin(shown, ", ");
    for (const Forbidden& f : access.forbidden_) {
      int err = 0;
      if (auto r = Resolve(f.path, &err); r.ok()) forbidden_.push_back({*std::move(r), f.what});
    }
    if (!privileged_) {
      groups_ = access.groups_of_(caller.uid);
      groups_.push_back(caller.gid);
    }
  }

  // `resolved` (the resolution of `named`) lies inside an export and is
  // none of the daemon's secrets.
  absl::Status Confine(const std::string& named, const std::string& resolved) const {
    if (!InsideAnExport(resolved)) {
      if (!privileged_) {
        return absl::PermissionDeniedError(
            absl::StrCat("source ", named, " does not exist or is outside this site's exports (",
                         exports_shown_, "); only files inside an export can be sent"));
      }
      return absl::PermissionDeniedError(absl::StrCat(
          "source ", named, named == resolved ? "" : absl::StrCat(" (resolves to ", resolved, ")"),
          " is outside this site's exports (", exports_shown_,
          "); only files inside an export can be sent"));
    }
    for (const auto& [path, what] : forbidden_) {
      if (IsWithin(resolved, path)) {
        return absl::PermissionDeniedError(absl::StrCat("source ", named, " is ", what, " (", path,
                                                        "); the daemon never sends it"));
      }
    }
    return absl::OkStatus();
  }

  // The caller could read `resolved` (a directory when `is_dir`: list and
  // search it) and search every directory on the way; the directories at or
  // below `tree_root` must also be listable (the walk lists them).
  absl::Status Readable(const std::string& resolved, const std::string& tree_root, bool is_dir) {
    if (privileged_) return absl::OkStatus();
    if (absl::Status s = SearchPath(resolved, tree_root, /*include_last=*/false, resolved);
        !s.ok()) {
      return s;
    }
    return Judge(resolved, is_dir ? (kRead | kSearch) : kRead, is_dir, resolved);
  }

  // Why `named` cannot be sent when it does not resolve. A non-root caller
  // learns no more than it could by looking itself: inside an export, the
  // first directory on the way it may not search, as for a path that
  // exists; elsewhere, that the path does not exist or is outside the
  // exports, as for one outside them.
  absl::Status Unresolvable(const std::string& named, int err) {
    if (privileged_) {
      return absl::InvalidArgumentError(
          absl::StrCat("cannot resolve source ", named, ": ", std::strerror(err)));
    }
    for (std::string ancestor = ParentOf(named);; ancestor = ParentOf(ancestor)) {
      int ancestor_err = 0;
      if (auto r = Resolve(ancestor, &ancestor_err); r.ok()) {
        if (!InsideAnExport(*r)) break;
        absl::Status s = SearchPath(*r, /*tree_root=*/"", /*include_last=*/true, named);
        if (absl::IsPermissionDenied(s)) return s;
        break;
      }
      if (ancestor == "/") break;
    }
    return absl::PermissionDeniedError(
        absl::StrCat("source ", named, " does not exist or is outside this site's exports (",
                     exports_shown_, "); only files inside an export can be sent"));
  }

 private:
  bool InsideAnExport(const std::string& resolved) const {
    for (const std::string& e : exports_) {
      if (IsWithin(resolved, e)) return true;
    }
    return false;
  }

  // Every directory from "/" down to `path`'s parent (down to `path` itself
  // when `include_last`) may be searched, and listed at or below `tree_root`.
  absl::Status SearchPath(const std::string& path, const std::string& tree_root, bool include_last,
                          const std::string& target) {
    for (size_t slash = 0; slash != std::string::npos && slash < path.size();
         slash = path.find('/', slash + 1)) {
      const std::string dir = slash == 0 ? "/" : path.substr(0, slash);
      const int need = IsWithin(dir, tree_root) ? (kRead | kSearch) : kSearch;
      if (absl::Status s = Judge(dir, need, /*is_dir=*/true, target); !s.ok()) return s;
    }
    if (include_last && path != "/") {
      const int need = IsWithin(path, tree_root) ? (kRead | kSearch) : kSearch;
      return Judge(path, need, /*is_dir=*/true, target);
    }
    return absl::OkStatus();
  }

  absl::Status Judge(const std::string& path, int need, bool is_dir, const std::string& target) {
    const std::string key = absl::StrCat(need, ":", path);
    if (is_dir) {
      auto it = verdicts_.find(key);
      if (it != verdicts_.end()) return Mention(it->second, path, target);
    }
    absl::Status verdict = JudgeUncached(path, need, is_dir);
    if (is_dir) verdicts_.emplace(key, verdict);
    return Mention(verdict, path, target);
  }

  absl::Status JudgeUncached(const std::string& path, int need, bool is_dir) const {
    struct stat st;
    if (stat(path.c_str(), &st) != 0) return ErrnoError(absl::StrCat("cannot stat ", path));
    int bits;
    if (st.st_uid == caller_.uid) {
      bits = (st.st_mode >> 6) & 7;
    } else if (std::find(groups_.begin(), groups_.end(), st.st_gid) != groups_.end()) {
      bits = (st.st_mode >> 3) & 7;
    } else {
      bits = st.st_mode & 7;
    }
    if ((bits & need) == need) return absl::OkStatus();
    const char* verb =
        !is_dir ? "read" : ((bits & kSearch) == 0 ? "search directory" : "list directory");
    return absl::PermissionDeniedError(
        absl::StrFormat("%s may not %s %s (owner %s, group %s, mode %04o)", caller_.ToString(),
                        verb, path, UserName(st.st_uid), GroupName(st.st_gid), st.st_mode & 07777));
  }

  static absl::Status Mention(const absl::Status& verdict, const std::string& path,
                              const std::string& target) {
    if (verdict.ok()) return verdict;
    return absl::Status(verdict.code(),
                        absl::StrCat(verdict.message(),
                                     path == target ? "" : absl::StrCat(" on the way to ", target),
                                     "; the daemon sends only what its caller could read"));
  }

  const Caller& caller_;
  const bool privileged_;
  std::vector<std::string> exports_;
  std::string exports_shown_;
  std::vector<std::pair<std::string, std::string>> forbidden_;
  std::vector<gid_t> groups_;
  absl::flat_hash_map<std::string, absl::Status> verdicts_;
};

SourceAccess::SourceAccess(std::vector<ExportConfig> exports, std::vector<Forbidden> forbidden,
                           GroupsOf groups_of)
    : exports_(std::move(exports)),
      forbidden_(std::move(forbidden)),
      groups_of_(std::move(groups_of)) {}

absl::StatusOr<std::vector<std::string>> SourceAccess::CheckSources(
    const Caller& caller, const std::vector<std::string>& sources) const {
  Check check(*this, caller);
  std::vector<std::string> resolved;
  for (const std::string& source : sources) {
    int err = 0;
    auto r = Resolve(source, &err);
    if (!r.ok()) return check.Unresolvable(source, err);
    if (absl::Status s = check.Confine(source, *r); !s.ok()) return s;
    struct stat st;
    if (stat(r->c_str(), &st) != 0) return ErrnoError(absl::StrCat("cannot stat source ", source));
    const bool is_dir = S_ISDIR(st.st_mode);
    if (absl::Status s = check.Readable(*r, is_dir ? *r : "", is_dir); !s.ok()) return s;
    resolved.push_back(*std::move(r));
  }
  return resolved;
}

absl::Status SourceAccess::CheckBuild(const Caller& caller, const std::vector<std::string>& sources,
                                      const std::vector<std::string>& resolved,
                                      storage::ManifestBuild* build) const {
  Check check(*this, caller);
  // The walk root that `path` (resolved) was found under: the deepest
  // resolved source holding it.
  auto root_of = [&resolved](const std::string& path) -> const std::string* {
    const std::string* best = nullptr;
    for (const std::string& r : resolved) {
      if (IsWithin(path, r) && (best == nullptr || r.size() > best->size())) best = &r;
    }
    return best;
  };
  // `followed`: reached through a symlink the walk followed, so it may lie
  // outside every source tree; `direct`: that symlink names it itself.
  auto check_one = [&](const std::string& named, bool is_dir, bool followed, bool direct,
                       std::string* out) -> absl::Status {
    int err = 0;
    auto r = Resolve(named, &err);
    if (!r.ok()) return check.Unresolvable(named, err);
    if (absl::Status s = check.Confine(named, *r); !s.ok()) return s;
    const std::string* root = root_of(*r);
    std::string tree_root;
    if (root != nullptr) {
      tree_root = is_dir || *root != *r ? *root : "";
    } else if (followed) {
      tree_root = is_dir ? *r : (direct ? "" : ParentOf(*r));
    } else {
      return absl::AbortedError(absl::StrCat("source ", named, " changed while it was listed (now ",
                                             *r, "); submit the transfer again"));
    }
    if (absl::Status s = check.Readable(*r, tree_root, is_dir); !s.ok()) return s;
    if (out != nullptr) *out = *std::move(r);
    return absl::OkStatus();
  };

  const size_t files = static_cast<size_t>(build->manifest.files_size());
  if (build->source_paths.size() != files ||
      (!build->file_links.empty() && build->file_links.size() != files) ||
      build->empty_dir_paths.size() != static_cast<size_t>(build->manifest.empty_dirs_size()) ||
      (!build->empty_dir_links.empty() &&
       build->empty_dir_links.size() != build->empty_dir_paths.size())) {
    return absl::InternalError("manifest build has source paths that do not match its entries");
  }
  // A symlink whose target the caller may not have sent is skipped with
  // everything reached through it; any other refusal fails the build.
  std::vector<std::string> refused_links;
  absl::flat_hash_map<std::string, std::string> why_refused;
  auto judge = [&](const std::string& link, absl::Status verdict) -> absl::Status {
    if (verdict.ok() || link.empty()) return verdict;
    if (why_refused.emplace(link, verdict.message()).second) refused_links.push_back(link);
    return absl::OkStatus();
  };
  for (size_t i = 0; i < build->source_paths.size(); ++i) {
    const std::string& link = build->file_links.empty() ? "" : build->file_links[i];
    std::string checked;
    absl::Status s = check_one(build->source_paths[i], /*is_dir=*/false, !link.empty(),
                               link == build->manifest.files(static_cast<int>(i)).path(), &checked);
    if (s.ok()) build->source_paths[i] = std::move(checked);
    if (absl::Status j = judge(link, std::move(s)); !j.ok()) return j;
  }
  for (size_t i = 0; i < build->empty_dir_paths.size(); ++i) {
    const std::string& link = build->empty_dir_links.empty() ? "" : build->empty_dir_links[i];
    absl::Status s = check_one(build->empty_dir_paths[i], /*is_dir=*/true, !link.empty(),
                               /*direct=*/false, nullptr);
    if (absl::Status j = judge(link, std::move(s)); !j.ok()) return j;
  }
  storage::DropFollowed(refused_links, *build);
  for (const std::string& link : refused_links) {
    build->skipped.push_back({link, absl::StrCat("symlink not followed: ", why_refused[link])});
  }
  return absl::OkStatus();
}

}  // namespace longhaul::daemon
