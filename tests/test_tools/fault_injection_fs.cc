#include "tests/test_tools/fault_injection_fs.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace longhaul::storage::testing {

namespace {

std::string Join(const std::string& dir, const std::string& name) {
  if (name == ".") return dir;
  return dir == "/" ? "/" + name : dir + "/" + name;
}

}  // namespace

class FaultInjectionFileSystem::MemDirectory : public Directory {
 public:
  MemDirectory(uint64_t ino, std::string path, uint64_t epoch)
      : ino(ino), epoch(epoch), path_(std::move(path)) {}
  const std::string& path() const override { return path_; }
  const uint64_t ino;
  const uint64_t epoch;

 private:
  const std::string path_;
};

class FaultInjectionFileSystem::MemFile : public File {
 public:
  MemFile(FaultInjectionFileSystem* fs, uint64_t ino, std::string path, uint64_t epoch,
          bool writable)
      : fs_(fs), ino_(ino), path_(std::move(path)), epoch_(epoch), writable_(writable) {}
  const std::string& path() const override { return path_; }
  int fd() const override { return -1; }

  absl::Status WriteAt(uint64_t offset, absl::Span<const uint8_t> data) override {
    absl::MutexLock lock(&fs_->mu_);
    if (absl::Status s = Writable(); !s.ok()) return s;
    if (absl::Status s = fs_->Step(absl::StrCat("write ", path_, " @", offset, "+", data.size()));
        !s.ok()) {
      return s;
    }
    std::string& d = fs_->nodes_[ino_].data;
    if (d.size() < offset + data.size()) d.resize(offset + data.size(), '\0');
    std::copy(data.begin(), data.end(), d.begin() + static_cast<ptrdiff_t>(offset));
    return absl::OkStatus();
  }

  absl::StatusOr<size_t> ReadAt(uint64_t offset, absl::Span<uint8_t> data) override {
    absl::MutexLock lock(&fs_->mu_);
    if (absl::Status s = fs_->Live(epoch_); !s.ok()) return s;
    const std::string& d = fs_->nodes_[ino_].data;
    if (offset >= d.size()) return 0;
    size_t n = std::min<size_t>(data.size(), d.size() - offset);
    std::copy(d.begin() + static_cast<ptrdiff_t>(offset),
              d.begin() + static_cast<ptrdiff_t>(offset + n), data.begin());
    return n;
  }

  absl::Status Sync() override {
    absl::MutexLock lock(&fs_->mu_);
    if (absl::Status s = fs_->Live(epoch_); !s.ok()) return s;
    if (absl::Status s = fs_->Step("fsync " + path_); !s.ok()) return s;
    fs_->durable_data_[ino_] = fs_->nodes_[ino_].data;
    fs_->CommitMetadata();
    return absl::OkStatus();
  }

  absl::Status Reserve(uint64_t size) override {
    absl::MutexLock lock(&fs_->mu_);
    if (absl::Status s = Writable(); !s.ok()) return s;
    std::string& d = fs_->nodes_[ino_].data;
    if (d.size() == size) return absl::OkStatus();
    if (absl::Status s = fs_->Step(absl::StrCat("reserve ", path_, " ", size)); !s.ok()) return s;
    fs_->nodes_[ino_].data.resize(size, '\0');
    return absl::OkStatus();
  }

  absl::Status Resize(uint64_t size) override {
    absl::MutexLock lock(&fs_->mu_);
    if (absl::Status s = Writable(); !s.ok()) return s;
    std::string& d = fs_->nodes_[ino_].data;
    if (d.size() == size) return absl::OkStatus();
    if (absl::Status s = fs_->Step(absl::StrCat("resize ", path_, " ", size)); !s.ok()) return s;
    d.resize(size, '\0');
    return absl::OkStatus();
  }

  absl::Status SetMtime(int64_t mtime_ns) override {
    absl::MutexLock lock(&fs_->mu_);
    if (absl::Status s = fs_->Live(epoch_); !s.ok()) return s;
    if (absl::Status s = fs_->Step("set mtime " + path_); !s.ok()) return s;
    const int64_t g = fs_->mtime_granularity_;
    fs_->nodes_[ino_].mtime_ns = mtime_ns - ((mtime_ns % g) + g) % g;
    return absl::OkStatus();
  }

  absl::Status SetMode(uint32_t mode) override {
    absl::MutexLock lock(&fs_->mu_);
    if (absl::Status s = fs_->Live(epoch_); !s.ok()) return s;
    if (absl::Status s = fs_->Step("chmod " + path_); !s.ok()) return s;
    fs_->nodes_[ino_].mode = mode & 07777;
    return absl::OkStatus();
  }

  absl::StatusOr<FileInfo> Stat() override {
    absl::MutexLock lock(&fs_->mu_);
    if (absl::Status s = fs_->Live(epoch_); !s.ok()) return s;
    return fs_->InfoOf(ino_);
  }

 private:
  absl::Status Writable() ABSL_EXCLUSIVE_LOCKS_REQUIRED(fs_->mu_) {
    if (absl::Status s = fs_->Live(epoch_); !s.ok()) return s;
    if (!writable_) return absl::PermissionDeniedError(path_ + " is open read-only");
    return absl::OkStatus();
  }

  FaultInjectionFileSystem* fs_;
  const uint64_t ino_;
  const std::string path_;
  const uint64_t epoch_;
  const bool writable_;
};

FaultInjectionFileSystem::FaultInjectionFileSystem() {
  Node root;
  root.kind = Kind::kDir;
  root.mode = 0755;
  absl::MutexLock lock(&mu_);
  nodes_[1] = root;
  durable_nodes_ = nodes_;
}

void FaultInjectionFileSystem::CrashAtStep(uint64_t n) {
  absl::MutexLock lock(&mu_);
  crash_at_ = n == 0 ? 0 : steps_ + n;
}

bool FaultInjectionFileSystem::crashed() const {
  absl::MutexLock lock(&mu_);
  return crashed_;
}

void FaultInjectionFileSystem::RestartAfter(Restart how) {
  absl::MutexLock lock(&mu_);
  if (how == Restart::kPowerLoss) {
    nodes_ = durable_nodes_;
    for (auto& [ino, node] : nodes_) {
      if (node.kind != Kind::kFile) continue;
      const size_t size = node.data.size();  // the size, as the metadata says
      auto it = durable_data_.find(ino);
      node.data = it == durable_data_.end() ? std::string() : it->second;
      node.data.resize(size, '\0');
    }
    durable_data_.clear();
    for (auto& [ino, node] : nodes_) {
      if (node.kind == Kind::kFile) durable_data_[ino] = node.data;
    }
  }
  crashed_ = false;
  crash_at_ = 0;
  ++epoch_;
  log_.push_back(how == Restart::kPowerLoss ? "-- power loss --" : "-- process crash --");
}

uint64_t FaultInjectionFileSystem::steps() const {
  absl::MutexLock lock(&mu_);
  return steps_;
}

std::vector<std::string> FaultInjectionFileSystem::step_log() const {
  absl::MutexLock lock(&mu_);
  return log_;
}

void FaultInjectionFileSystem::set_exchange_supported(bool supported) {
  absl::MutexLock lock(&mu_);
  exchange_supported_ = supported;
}

void FaultInjectionFileSystem::set_mtime_granularity_ns(int64_t granularity) {
  absl::MutexLock lock(&mu_);
  mtime_granularity_ = std::max<int64_t>(granularity, 1);
}

absl::Status FaultInjectionFileSystem::Step(const std::string& what) {
  if (crashed_) return absl::AbortedError("crashed (injected)");
  ++steps_;
  if (steps_ == crash_at_) {
    crashed_ = true;
    log_.push_back(absl::StrCat("#", steps_, " CRASH before: ", what));
    return absl::AbortedError(absl::StrCat("injected crash at step ", steps_, ": ", what));
  }
  log_.push_back(absl::StrCat("#", steps_, " ", what));
  return absl::OkStatus();
}

absl::Status FaultInjectionFileSystem::Live(uint64_t epoch) const {
  if (crashed_) return absl::AbortedError("crashed (injected)");
  if (epoch != epoch_) return absl::FailedPreconditionError("handle from before a restart");
  return absl::OkStatus();
}

void FaultInjectionFileSystem::CommitMetadata() { durable_nodes_ = nodes_; }

uint64_t FaultInjectionFileSystem::NewNode(Kind kind) {
  const uint64_t ino = next_inode_++;
  Node& n = nodes_[ino];
  n.kind = kind;
  n.mode = kind == Kind::kDir ? 0755 : 0600;
  return ino;
}

std::optional<uint64_t> FaultInjectionFileSystem::Walk(const std::string& path) const {
  uint64_t cur = 1;
  for (absl::string_view comp : absl::StrSplit(path, '/', absl::SkipEmpty())) {
    const Node& n = nodes_.at(cur);
    if (n.kind != Kind::kDir) return std::nullopt;
    auto it = n.entries.find(std::string(comp));
    if (it == n.entries.end()) return std::nullopt;
    cur = it->second;
  }
  return cur;
}

FileInfo FaultInjectionFileSystem::InfoOf(uint64_t ino) const {
  const Node& n = nodes_.at(ino);
  FileInfo info;
  info.type = n.kind == Kind::kFile  ? FileInfo::Type::kRegular
              : n.kind == Kind::kDir ? FileInfo::Type::kDirectory
                                     : FileInfo::Type::kSymlink;
  info.size = n.data.size();
  info.mtime_ns = n.mtime_ns;
  info.mode = n.mode;
  info.device = 1;
  info.inode = ino;
  return info;
}

absl::StatusOr<FaultInjectionFileSystem::Node*> FaultInjectionFileSystem::DirOf(Directory& dir) {
  auto& d = static_cast<MemDirectory&>(dir);
  if (absl::Status s = Live(d.epoch); !s.ok()) return s;
  auto it = nodes_.find(d.ino);
  if (it == nodes_.end() || it->second.kind != Kind::kDir) {
    return absl::NotFoundError(d.path() + " is gone");
  }
  return &it->second;
}

void FaultInjectionFileSystem::MakeDirs(const std::string& path) {
  absl::MutexLock lock(&mu_);
  uint64_t cur = 1;
  for (absl::string_view comp : absl::StrSplit(path, '/', absl::SkipEmpty())) {
    auto it = nodes_[cur].entries.find(std::string(comp));
    if (it != nodes_[cur].entries.end()) {
      cur = it->second;
      continue;
    }
    uint64_t ino = NewNode(Kind::kDir);
    nodes_[cur].entries[std::string(comp)] = ino;
    cur = ino;
  }
  CommitMetadata();
}

void FaultInjectionFileSystem::PutFile(const std::string& path, const std::string& contents,
                                       int64_t mtime_ns, uint32_t mode) {
  const size_t slash = path.rfind('/');
  MakeDirs(path.substr(0, slash));
  absl::MutexLock lock(&mu_);
  const uint64_t parent = *Walk(path.substr(0, slash));
  const std::string name = path.substr(slash + 1);
  uint64_t ino;
  if (auto it = nodes_[parent].entries.find(name); it != nodes_[parent].entries.end()) {
    ino = it->second;
  } else {
    ino = NewNode(Kind::kFile);
    nodes_[parent].entries[name] = ino;
  }
  nodes_[ino].data = contents;
  nodes_[ino].mtime_ns = mtime_ns;
  nodes_[ino].mode = mode;
  durable_data_[ino] = contents;
  CommitMetadata();
}

void FaultInjectionFileSystem::PutSymlink(const std::string& path, const std::string& target) {
  const size_t slash = path.rfind('/');
  MakeDirs(path.substr(0, slash));
  absl::MutexLock lock(&mu_);
  const uint64_t parent = *Walk(path.substr(0, slash));
  const uint64_t ino = NewNode(Kind::kSymlink);
  nodes_[ino].data = target;
  nodes_[parent].entries[path.substr(slash + 1)] = ino;
  CommitMetadata();
}

std::optional<std::map<std::string, std::string>> FaultInjectionFileSystem::Tree(
    const std::string& path) const {
  absl::MutexLock lock(&mu_);
  std::optional<uint64_t> top = Walk(path);
  if (!top) return std::nullopt;
  std::map<std::string, std::string> out;
  std::vector<std::pair<std::string, uint64_t>> todo = {{"", *top}};
  while (!todo.empty()) {
    auto [rel, ino] = todo.back();
    todo.pop_back();
    const Node& n = nodes_.at(ino);
    if (n.kind == Kind::kFile) {
      out[rel] = n.data;
    } else if (n.kind == Kind::kSymlink) {
      out[rel] = n.data.empty() ? "<symlink>" : "-> " + n.data;
    } else {
      if (!rel.empty()) out[rel + "/"] = "";
      for (const auto& [name, child] : n.entries) {
        todo.push_back({rel.empty() ? name : rel + "/" + name, child});
      }
    }
  }
  return out;
}

absl::StatusOr<std::unique_ptr<Directory>> FaultInjectionFileSystem::OpenRoot(
    const std::string& path) {
  absl::MutexLock lock(&mu_);
  if (absl::Status s = Live(epoch_); !s.ok()) return s;
  std::optional<uint64_t> ino = Walk(path);
  if (!ino || nodes_[*ino].kind != Kind::kDir) {
    return absl::NotFoundError(path + " is not a directory");
  }
  return std::make_unique<MemDirectory>(*ino, path, epoch_);
}

absl::StatusOr<std::unique_ptr<Directory>> FaultInjectionFileSystem::OpenDir(
    Directory& dir, const std::string& name, bool create, uint32_t mode) {
  absl::MutexLock lock(&mu_);
  absl::StatusOr<Node*> parent = DirOf(dir);
  if (!parent.ok()) return parent.status();
  const std::string path = Join(dir.path(), name);
  if (name == ".") {
    return std::make_unique<MemDirectory>(static_cast<MemDirectory&>(dir).ino, path, epoch_);
  }
  auto it = (*parent)->entries.find(name);
  if (it == (*parent)->entries.end()) {
    if (!create) return absl::NotFoundError(path + " does not exist");
    if (absl::Status s = Step("mkdir " + path); !s.ok()) return s;
    const uint64_t ino = NewNode(Kind::kDir);
    nodes_[ino].mode = mode & 0777;
    nodes_[static_cast<MemDirectory&>(dir).ino].entries[name] = ino;
    return std::make_unique<MemDirectory>(ino, path, epoch_);
  }
  const Node& n = nodes_[it->second];
  if (n.kind == Kind::kSymlink) return absl::PermissionDeniedError(path + " is a symlink");
  if (n.kind != Kind::kDir) return absl::FailedPreconditionError(path + " is not a directory");
  return std::make_unique<MemDirectory>(it->second, path, epoch_);
}

absl::StatusOr<std::optional<FileInfo>> FaultInjectionFileSystem::Stat(Directory& dir,
                                                                       const std::string& name) {
  absl::MutexLock lock(&mu_);
  absl::StatusOr<Node*> parent = DirOf(dir);
  if (!parent.ok()) return parent.status();
  auto it = (*parent)->entries.find(name);
  if (it == (*parent)->entries.end()) return std::nullopt;
  return InfoOf(it->second);
}

absl::StatusOr<std::unique_ptr<File>> FaultInjectionFileSystem::OpenFile(Directory& dir,
                                                                         const std::string& name,
                                                                         OpenMode mode) {
  absl::MutexLock lock(&mu_);
  absl::StatusOr<Node*> parent = DirOf(dir);
  if (!parent.ok()) return parent.status();
  const std::string path = Join(dir.path(), name);
  auto it = (*parent)->entries.find(name);
  const bool creates = mode == OpenMode::kCreateOrOpen || mode == OpenMode::kCreateExclusive;
  uint64_t ino;
  if (it == (*parent)->entries.end()) {
    if (!creates) return absl::NotFoundError(path + " does not exist");
    if (absl::Status s = Step("create " + path); !s.ok()) return s;
    ino = NewNode(Kind::kFile);
    nodes_[static_cast<MemDirectory&>(dir).ino].entries[name] = ino;
  } else {
    if (mode == OpenMode::kCreateExclusive) return absl::AlreadyExistsError(path + " exists");
    ino = it->second;
    if (nodes_[ino].kind == Kind::kSymlink)
      return absl::PermissionDeniedError(path + " is a symlink");
    if (nodes_[ino].kind != Kind::kFile)
      return absl::FailedPreconditionError(path + " is a directory");
  }
  return std::make_unique<MemFile>(this, ino, path, epoch_, mode != OpenMode::kRead);
}

absl::Status FaultInjectionFileSystem::Rename(Directory& from_dir, const std::string& from,
                                              Directory& to_dir, const std::string& to,
                                              RenameMode mode) {
  absl::MutexLock lock(&mu_);
  absl::StatusOr<Node*> src_dir = DirOf(from_dir);
  if (!src_dir.ok()) return src_dir.status();
  absl::StatusOr<Node*> dst_dir = DirOf(to_dir);
  if (!dst_dir.ok()) return dst_dir.status();
  const std::string from_path = Join(from_dir.path(), from);
  const std::string to_path = Join(to_dir.path(), to);
  auto src = (*src_dir)->entries.find(from);
  if (src == (*src_dir)->entries.end()) return absl::NotFoundError(from_path + " does not exist");
  const uint64_t moving = src->second;
  auto dst = (*dst_dir)->entries.find(to);
  const bool target_exists = dst != (*dst_dir)->entries.end();
  if (mode == RenameMode::kExchange && !exchange_supported_) {
    return absl::UnimplementedError("no RENAME_EXCHANGE here");
  }
  if (mode == RenameMode::kExchange && !target_exists) {
    return absl::NotFoundError(to_path + " does not exist");
  }
  if (mode == RenameMode::kNoReplace && target_exists) {
    return absl::AlreadyExistsError(to_path + " exists");
  }
  if (mode == RenameMode::kReplace && target_exists && dst->second != moving) {
    const Node& t = nodes_[dst->second];
    const bool moving_dir = nodes_[moving].kind == Kind::kDir;
    if ((t.kind == Kind::kDir) != moving_dir) {
      return absl::FailedPreconditionError(to_path + " is of another type");
    }
    if (t.kind == Kind::kDir && !t.entries.empty())
      return absl::AlreadyExistsError(to_path + " is not empty");
  }
  const char* how = mode == RenameMode::kExchange    ? "exchange"
                    : mode == RenameMode::kNoReplace ? "rename-noreplace"
                                                     : "rename";
  if (absl::Status s = Step(absl::StrCat(how, " ", from_path, " -> ", to_path)); !s.ok()) return s;
  Node& sd = nodes_[static_cast<MemDirectory&>(from_dir).ino];
  Node& dd = nodes_[static_cast<MemDirectory&>(to_dir).ino];
  if (mode == RenameMode::kExchange) {
    const uint64_t other = dd.entries[to];
    dd.entries[to] = moving;
    sd.entries[from] = other;
    return absl::OkStatus();
  }
  if (target_exists && dd.entries[to] == moving) return absl::OkStatus();  // hard links: no-op
  sd.entries.erase(from);
  dd.entries[to] = moving;
  return absl::OkStatus();
}

absl::Status FaultInjectionFileSystem::Link(Directory& from_dir, const std::string& from,
                                            Directory& to_dir, const std::string& to) {
  absl::MutexLock lock(&mu_);
  absl::StatusOr<Node*> src_dir = DirOf(from_dir);
  if (!src_dir.ok()) return src_dir.status();
  absl::StatusOr<Node*> dst_dir = DirOf(to_dir);
  if (!dst_dir.ok()) return dst_dir.status();
  auto src = (*src_dir)->entries.find(from);
  if (src == (*src_dir)->entries.end()) {
    return absl::NotFoundError(Join(from_dir.path(), from) + " does not exist");
  }
  if (nodes_[src->second].kind != Kind::kFile) {
    return absl::PermissionDeniedError(Join(from_dir.path(), from) + " is not a regular file");
  }
  if ((*dst_dir)->entries.contains(to)) {
    return absl::AlreadyExistsError(Join(to_dir.path(), to) + " exists");
  }
  if (absl::Status s =
          Step(absl::StrCat("link ", Join(from_dir.path(), from), " -> ", Join(to_dir.path(), to)));
      !s.ok()) {
    return s;
  }
  nodes_[static_cast<MemDirectory&>(to_dir).ino].entries[to] = src->second;
  return absl::OkStatus();
}

absl::Status FaultInjectionFileSystem::Symlink(const std::string& target, Directory& dir,
                                               const std::string& name) {
  absl::MutexLock lock(&mu_);
  absl::StatusOr<Node*> parent = DirOf(dir);
  if (!parent.ok()) return parent.status();
  if ((*parent)->entries.contains(name)) {
    return absl::AlreadyExistsError(Join(dir.path(), name) + " exists");
  }
  if (absl::Status s = Step(absl::StrCat("symlink ", Join(dir.path(), name), " -> ", target));
      !s.ok()) {
    return s;
  }
  const uint64_t ino = NewNode(Kind::kSymlink);
  nodes_[ino].data = target;
  nodes_[static_cast<MemDirectory&>(dir).ino].entries[name] = ino;
  return absl::OkStatus();
}

absl::StatusOr<std::string> FaultInjectionFileSystem::ReadLink(Directory& dir,
                                                               const std::string& name) {
  absl::MutexLock lock(&mu_);
  absl::StatusOr<Node*> parent = DirOf(dir);
  if (!parent.ok()) return parent.status();
  auto it = (*parent)->entries.find(name);
  if (it == (*parent)->entries.end()) {
    return absl::NotFoundError(Join(dir.path(), name) + " does not exist");
  }
  const Node& n = nodes_[it->second];
  if (n.kind != Kind::kSymlink) {
    return absl::FailedPreconditionError(Join(dir.path(), name) + " is not a symlink");
  }
  return n.data;
}

absl::Status FaultInjectionFileSystem::Unlink(Directory& dir, const std::string& name) {
  return Remove(dir, name, /*directory=*/false);
}

absl::Status FaultInjectionFileSystem::RemoveDir(Directory& dir, const std::string& name) {
  return Remove(dir, name, /*directory=*/true);
}

absl::Status FaultInjectionFileSystem::Remove(Directory& dir, const std::string& name,
                                              bool directory) {
  absl::MutexLock lock(&mu_);
  absl::StatusOr<Node*> parent = DirOf(dir);
  if (!parent.ok()) return parent.status();
  const std::string path = Join(dir.path(), name);
  auto it = (*parent)->entries.find(name);
  if (it == (*parent)->entries.end()) return absl::NotFoundError(path + " does not exist");
  const Node& n = nodes_[it->second];
  if ((n.kind == Kind::kDir) != directory) {
    return absl::FailedPreconditionError(path +
                                         (directory ? " is not a directory" : " is a directory"));
  }
  if (directory && !n.entries.empty()) return absl::FailedPreconditionError(path + " is not empty");
  if (absl::Status s = Step((directory ? "rmdir " : "unlink ") + path); !s.ok()) return s;
  (*parent)->entries.erase(name);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::string>> FaultInjectionFileSystem::List(Directory& dir) {
  absl::MutexLock lock(&mu_);
  absl::StatusOr<Node*> d = DirOf(dir);
  if (!d.ok()) return d.status();
  std::vector<std::string> names;
  for (const auto& [name, ino] : (*d)->entries) names.push_back(name);
  return names;
}

absl::Status FaultInjectionFileSystem::SyncDir(Directory& dir) {
  absl::MutexLock lock(&mu_);
  absl::StatusOr<Node*> d = DirOf(dir);
  if (!d.ok()) return d.status();
  if (absl::Status s = Step("fsync dir " + dir.path()); !s.ok()) return s;
  CommitMetadata();
  return absl::OkStatus();
}

}  // namespace longhaul::storage::testing
