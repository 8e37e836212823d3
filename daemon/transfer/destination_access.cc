#include "daemon/transfer/destination_access.h"

#include <fcntl.h>
#include <grp.h>
#include <pwd.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "common/errno_status.h"
#include "daemon/transfer/local_paths.h"
#include "storage/exports.h"

namespace longhaul::daemon {
namespace {

// The exit codes of the kernel judge's child; kCannotSearch + i: the i-th
// directory on the way may not be searched.
enum ChildVerdict : int {
  kMayWrite = 0,
  kCannotWrite = 1,
  kReadOnly = 2,
  kSticky = 3,
  kChanged = 4,
  kNoCredentials = 5,
  kCannotSearch = 16,
};
constexpr size_t kMaxDepth = 200;  // kCannotSearch + kMaxDepth < 256

// "(owner root, group root, mode 0755)" of `path`, as this daemon sees it.
std::string Described(const std::string& path) {
  struct stat st;
  if (lstat(path.c_str(), &st) != 0) return "";
  return absl::StrFormat(" (owner %s, group %s, mode %04o)", UserName(st.st_uid),
                         GroupName(st.st_gid), st.st_mode & 07777);
}

// What a write of a path needs: write and search permission on `dir`, the
// directories on the way to it searchable, and, when `existing` is set (the
// path exists), the sticky rule of `dir` for it.
struct WritePlan {
  std::string dir;
  std::string existing;
  std::vector<std::string> on_the_way;  // "/", ..., dir
};

absl::StatusOr<WritePlan> PlanOf(const std::string& path) {
  if (path.empty() || path.front() != '/') {
    return absl::InvalidArgumentError(absl::StrCat("'", path, "' is not an absolute path"));
  }
  WritePlan plan;
  struct stat st;
  if (lstat(path.c_str(), &st) == 0) {
    plan.dir = ParentOf(path);
    plan.existing = path;
  } else if (errno != ENOENT) {
    return ErrnoError(errno, "cannot look at", path);
  } else {
    for (std::string dir = ParentOf(path);; dir = ParentOf(dir)) {
      if (lstat(dir.c_str(), &st) == 0) {
        if (!S_ISDIR(st.st_mode)) {
          return absl::FailedPreconditionError(absl::StrCat(dir, " is not a directory"));
        }
        plan.dir = dir;
        break;
      }
      if (errno != ENOENT || dir == "/") return ErrnoError(errno, "cannot look at", dir);
    }
  }
  plan.on_the_way.push_back("/");
  for (size_t slash = plan.dir.find('/', 1); plan.dir != "/";
       slash = plan.dir.find('/', slash + 1)) {
    plan.on_the_way.push_back(plan.dir.substr(0, slash));
    if (slash == std::string::npos) break;
  }
  if (plan.on_the_way.size() > kMaxDepth) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, " is more than ", kMaxDepth, " directories deep"));
  }
  return plan;
}

absl::Status Refusal(int verdict, const WritePlan& plan, const UserCredentials& user) {
  switch (verdict) {
    case kMayWrite:
      return absl::OkStatus();
    case kCannotWrite:
      return absl::PermissionDeniedError(
          absl::StrCat("no write permission on directory ", plan.dir, Described(plan.dir)));
    case kReadOnly:
      return absl::PermissionDeniedError(
          absl::StrCat("directory ", plan.dir, " is on a read-only file system"));
    case kSticky:
      return absl::PermissionDeniedError(
          absl::StrCat("directory ", plan.dir, Described(plan.dir), " is sticky and uid ", user.uid,
                       " owns neither it nor ", plan.existing, Described(plan.existing)));
    case kChanged:
      return absl::AbortedError(absl::StrCat(plan.existing, " changed while it was looked at"));
    default:
      break;
  }
  const size_t depth = static_cast<size_t>(verdict - kCannotSearch);
  if (verdict >= kCannotSearch && depth < plan.on_the_way.size()) {
    const std::string& dir = plan.on_the_way[depth];
    return absl::PermissionDeniedError(
        absl::StrCat("no search permission on directory ", dir, Described(dir)));
  }
  return absl::InternalError(absl::StrCat("unknown verdict ", verdict));
}

// What the forked child reads: prepared before the fork, so that the child
// allocates nothing.
struct ChildInput {
  uid_t uid;
  gid_t gid;
  const gid_t* groups;
  size_t group_count;
  const char* dir;
  const char* existing;  // nullptr: the path does not exist
  const char* const* on_the_way;
  size_t depth;
};

// Runs in the child of a multithreaded process: async-signal-safe calls
// only. The credentials are set with raw system calls, which change this
// task's alone; glibc's wrappers would signal the parent's other threads.
// faccessat without AT_EACCESS checks the real uid and gid, which are the
// user's now, and the capabilities root had are gone with setresuid.
int JudgeAsUser(const ChildInput& in) {
  if (syscall(SYS_setgroups, in.group_count, in.groups) != 0 ||
      syscall(SYS_setresgid, in.gid, in.gid, in.gid) != 0 ||
      syscall(SYS_setresuid, in.uid, in.uid, in.uid) != 0) {
    return kNoCredentials;
  }
  for (size_t i = 0; i < in.depth; ++i) {
    if (faccessat(AT_FDCWD, in.on_the_way[i], X_OK, 0) != 0) {
      return kCannotSearch + static_cast<int>(i);
    }
  }
  if (faccessat(AT_FDCWD, in.dir, W_OK | X_OK, 0) != 0) {
    return errno == EROFS ? kReadOnly : kCannotWrite;
  }
  if (in.existing != nullptr) {
    struct stat dir, entry;
    if (lstat(in.dir, &dir) != 0 || lstat(in.existing, &entry) != 0) return kChanged;
    // The kernel's check_sticky(): no call asks it without unlinking.
    if ((dir.st_mode & S_ISVTX) != 0 && in.uid != 0 && entry.st_uid != in.uid &&
        dir.st_uid != in.uid) {
      return kSticky;
    }
  }
  return kMayWrite;
}

absl::Status KernelJudge(const UserCredentials& user, const WritePlan& plan, bool* no_credentials) {
  std::vector<const char*> on_the_way;
  for (const std::string& d : plan.on_the_way) on_the_way.push_back(d.c_str());
  const ChildInput in{.uid = user.uid,
                      .gid = user.gid,
                      .groups = user.groups.data(),
                      .group_count = user.groups.size(),
                      .dir = plan.dir.c_str(),
                      .existing = plan.existing.empty() ? nullptr : plan.existing.c_str(),
                      .on_the_way = on_the_way.data(),
                      .depth = on_the_way.size()};
  const pid_t pid = fork();
  if (pid < 0) return ErrnoError(errno, "cannot fork a process to judge a write");
  if (pid == 0) _exit(JudgeAsUser(in));
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) return ErrnoError(errno, "cannot wait for the process judging a write");
  }
  if (!WIFEXITED(status)) {
    return absl::InternalError(
        absl::StrCat("the process judging a write of ", plan.dir, " ended with status ", status));
  }
  if (WEXITSTATUS(status) == kNoCredentials) {
    *no_credentials = true;
    return absl::FailedPreconditionError(
        absl::StrCat("cannot take the credentials of uid ", user.uid, " (gid ", user.gid,
                     ") to judge a write: this process lacks CAP_SETUID and CAP_SETGID"));
  }
  return Refusal(WEXITSTATUS(status), plan, user);
}

// A POSIX access ACL on `path`, which the mode bits do not tell.
bool HasAccessAcl(const std::string& path) {
  return getxattr(path.c_str(), "system.posix_acl_access", nullptr, 0) > 0;
}

absl::Status ModeBitsJudge(const UserCredentials& user, const WritePlan& plan) {
  if (user.uid == 0) return absl::OkStatus();
  auto bits_of = [&user](const struct stat& st) {
    if (st.st_uid == user.uid) return static_cast<int>((st.st_mode >> 6) & 7);
    if (st.st_gid == user.gid ||
        std::find(user.groups.begin(), user.groups.end(), st.st_gid) != user.groups.end()) {
      return static_cast<int>((st.st_mode >> 3) & 7);
    }
    return static_cast<int>(st.st_mode & 7);
  };
  auto judge = [&](const std::string& dir, int need, int refusal) -> absl::Status {
    struct stat st;
    if (stat(dir.c_str(), &st) != 0) return ErrnoError(errno, "cannot look at", dir);
    if (HasAccessAcl(dir)) {
      return absl::PermissionDeniedError(
          absl::StrCat("directory ", dir, Described(dir),
                       " has a POSIX ACL, which longhauld judges only when it runs as root"));
    }
    if ((bits_of(st) & need) != need) return Refusal(refusal, plan, user);
    return absl::OkStatus();
  };
  for (size_t i = 0; i < plan.on_the_way.size(); ++i) {
    if (absl::Status s = judge(plan.on_the_way[i], kSearch, kCannotSearch + static_cast<int>(i));
        !s.ok()) {
      return s;
    }
  }
  if (absl::Status s = judge(plan.dir, kWrite | kSearch, kCannotWrite); !s.ok()) return s;
  if (!plan.existing.empty()) {
    struct stat dir, entry;
    if (lstat(plan.dir.c_str(), &dir) != 0 || lstat(plan.existing.c_str(), &entry) != 0) {
      return Refusal(kChanged, plan, user);
    }
    if ((dir.st_mode & S_ISVTX) != 0 && entry.st_uid != user.uid && dir.st_uid != user.uid) {
      return Refusal(kSticky, plan, user);
    }
  }
  return absl::OkStatus();
}

absl::Status Judge(WriteJudge judge, const UserCredentials& user, const std::string& path,
                   bool* no_credentials) {
  absl::StatusOr<WritePlan> plan = PlanOf(path);
  if (!plan.ok()) return plan.status();
  return judge == WriteJudge::kKernel ? KernelJudge(user, *plan, no_credentials)
                                      : ModeBitsJudge(user, *plan);
}

}  // namespace

absl::Status JudgeWrite(WriteJudge judge, const UserCredentials& user, const std::string& path) {
  bool no_credentials = false;
  return Judge(judge, user, path, &no_credentials);
}

DestinationAccess::DestinationAccess(std::vector<ExportConfig> exports,
                                     std::vector<SourceAccessForbidden> forbidden,
                                     GroupsOf groups_of)
    : exports_(std::move(exports)),
      forbidden_(std::move(forbidden)),
      groups_of_(std::move(groups_of)) {}

absl::Status DestinationAccess::MayWrite(const Caller& caller, const std::string& export_name,
                                         const std::string& dest_path) const {
  std::vector<storage::Export> exports;
  for (const ExportConfig& e : exports_) exports.push_back({e.name, e.path});
  absl::StatusOr<storage::ResolvedDestination> dest =
      storage::ResolveDestination(exports, export_name, dest_path);
  if (!dest.ok()) return dest.status();
  const std::string& path = dest->absolute;

  for (const SourceAccessForbidden& f : forbidden_) {
    char* resolved = realpath(f.path.c_str(), nullptr);
    if (resolved == nullptr) continue;
    const std::string secret(resolved);
    free(resolved);
    if (IsWithin(path, secret) || IsWithin(secret, path)) {
      return absl::PermissionDeniedError(
          absl::StrCat("destination ", path, path == secret ? " is " : " holds ", f.what, " (",
                       secret, "); a pull never writes it, whoever asks"));
    }
  }

  switch (caller.kind) {
    case Caller::Kind::kToken:
      if (caller.role == ControlRole::kOperator) return absl::OkStatus();
      [[fallthrough]];
    case Caller::Kind::kPeerSite:
      return absl::PermissionDeniedError(
          absl::StrCat(caller.ToString(), " may not pull into ", path));
    case Caller::Kind::kLocalUser:
      break;
  }
  UserCredentials user{.uid = caller.uid, .gid = caller.gid, .groups = groups_of_(caller.uid)};
  absl::Status verdict;
  bool no_credentials = false;
  if (!kernel_unavailable_.load(std::memory_order_relaxed)) {
    verdict = Judge(WriteJudge::kKernel, user, path, &no_credentials);
    if (no_credentials) kernel_unavailable_.store(true, std::memory_order_relaxed);
  }
  if (no_credentials || kernel_unavailable_.load(std::memory_order_relaxed)) {
    verdict = Judge(WriteJudge::kModeBits, user, path, &no_credentials);
  }
  if (verdict.ok()) return verdict;
  return absl::Status(
      verdict.code(),
      absl::StrCat(caller.ToString(), " may not write ", path, ": ", verdict.message(),
                   "; a pull writes only where the user who asks for it could "
                   "write"));
}

}  // namespace longhaul::daemon
