#include "tests/chaos/faultfs/fault_state.h"

#include <fcntl.h>
#include <linux/falloc.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <iterator>
#include <vector>

namespace longhaul::faultfs {
namespace {

constexpr std::pair<std::string_view, OpKind> kKindNames[] = {
    {"read", OpKind::kRead},     {"write", OpKind::kWrite},   {"fsync", OpKind::kFsync},
    {"create", OpKind::kCreate}, {"rename", OpKind::kRename}, {"unlink", OpKind::kUnlink},
    {"mkdir", OpKind::kMkdir},   {"open", OpKind::kOpen},
};

bool Contains(const char* path, const std::string& substring) {
  return path != nullptr && std::strstr(path, substring.c_str()) != nullptr;
}

int PreadFull(int fd, char* out, size_t size, off_t offset) {
  size_t done = 0;
  while (done < size) {
    ssize_t n = pread(fd, out + done, size - done, offset + static_cast<off_t>(done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return -errno;
    }
    if (n == 0) break;  // past the end: the rest reads as zeros
    done += static_cast<size_t>(n);
  }
  std::memset(out + done, 0, size - done);
  return 0;
}

int PwriteFull(int fd, const char* data, size_t size, off_t offset) {
  size_t done = 0;
  while (done < size) {
    ssize_t n = pwrite(fd, data + done, size - done, offset + static_cast<off_t>(done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return -errno;
    }
    done += static_cast<size_t>(n);
  }
  return 0;
}

}  // namespace

std::string ParseOpKinds(std::string_view list, uint32_t* mask) {
  *mask = 0;
  while (!list.empty()) {
    size_t comma = list.find(',');
    std::string_view name = list.substr(0, comma);
    list = comma == std::string_view::npos ? std::string_view() : list.substr(comma + 1);
    bool known = false;
    for (const auto& [kind_name, kind] : kKindNames) {
      if (name == kind_name) {
        *mask |= static_cast<uint32_t>(kind);
        known = true;
      }
    }
    if (!known) return std::string(name);
  }
  return "";
}

void FaultState::SetSeed(uint64_t seed) {
  std::lock_guard<std::mutex> lock(eio_mu_);
  rng_.seed(seed);
}

void FaultState::SetEio(uint32_t kinds, double probability, std::string path_substring) {
  std::lock_guard<std::mutex> lock(eio_mu_);
  eio_kinds_ = kinds;
  eio_probability_ = probability;
  eio_substring_ = std::move(path_substring);
}

void FaultState::ClearEio() { SetEio(0, 0, ""); }

bool FaultState::CountAndInject(OpKind kind, const char* path, const char* other_path) {
  ops_.fetch_add(1, std::memory_order_relaxed);
  std::lock_guard<std::mutex> lock(eio_mu_);
  if ((eio_kinds_ & static_cast<uint32_t>(kind)) == 0) return false;
  if (!eio_substring_.empty() && !Contains(path, eio_substring_) &&
      !Contains(other_path, eio_substring_)) {
    return false;
  }
  // One draw per candidate operation, so a seed replays the same choices
  // for the same sequence of operations.
  const double draw = std::uniform_real_distribution<double>(0.0, 1.0)(rng_);
  if (draw >= eio_probability_) return false;
  eio_injected_.fetch_add(1, std::memory_order_relaxed);
  return true;
}

FaultState::Undo* FaultState::RecordFor(int fd, int* err) {
  struct stat st;
  if (fstat(fd, &st) != 0) {
    *err = -errno;
    return nullptr;
  }
  const InodeKey key{st.st_dev, st.st_ino};
  auto it = undo_.find(key);
  if (it != undo_.end()) return &it->second;
  // `fd` may be write-only; old bytes are read through a descriptor of our
  // own, which also keeps an unlinked inode reachable until the replay.
  const std::string self = "/proc/self/fd/" + std::to_string(fd);
  int own = open(self.c_str(), O_RDWR | O_CLOEXEC);
  if (own < 0) {
    *err = -errno;
    return nullptr;
  }
  Undo& undo = undo_[key];
  undo.fd = own;
  undo.synced_size = st.st_size;
  return &undo;
}

int FaultState::SaveRange(Undo& undo, off_t offset, off_t length) {
  const off_t end = std::min(offset + length, undo.synced_size);
  off_t pos = offset;
  while (pos < end) {
    auto next = undo.saved.upper_bound(pos);  // first saved range after pos
    if (next != undo.saved.begin()) {
      auto prev = std::prev(next);
      const off_t prev_end = prev->first + static_cast<off_t>(prev->second.size());
      if (prev_end > pos) {  // already saved from an earlier mutation
        pos = prev_end;
        continue;
      }
    }
    const off_t gap_end = next == undo.saved.end() ? end : std::min(end, next->first);
    std::string old(static_cast<size_t>(gap_end - pos), '\0');
    if (int err = PreadFull(undo.fd, old.data(), old.size(), pos); err != 0) return err;
    undo.saved.emplace(pos, std::move(old));
    pos = gap_end;
  }
  return 0;
}

int FaultState::Write(int fd, const void* data, size_t size, off_t offset, bool append,
                      ssize_t* written) {
  std::lock_guard<std::mutex> lock(undo_mu_);
  int err = 0;
  Undo* undo = RecordFor(fd, &err);
  if (undo == nullptr) return err;
  if (append) {  // an O_APPEND descriptor writes at the end, whatever the offset
    struct stat st;
    if (fstat(fd, &st) != 0) return -errno;
    offset = st.st_size;
  }
  if ((err = SaveRange(*undo, offset, static_cast<off_t>(size))) != 0) return err;
  ssize_t n = pwrite(fd, data, size, offset);
  if (n < 0) return -errno;
  *written = n;
  return 0;
}

int FaultState::Truncate(int fd, off_t size) {
  std::lock_guard<std::mutex> lock(undo_mu_);
  int err = 0;
  Undo* undo = RecordFor(fd, &err);
  if (undo == nullptr) return err;
  if (size < undo->synced_size) {
    if ((err = SaveRange(*undo, size, undo->synced_size - size)) != 0) return err;
  }
  return ftruncate(fd, size) == 0 ? 0 : -errno;
}

int FaultState::Fallocate(int fd, int mode, off_t offset, off_t length) {
  std::lock_guard<std::mutex> lock(undo_mu_);
  int err = 0;
  Undo* undo = RecordFor(fd, &err);
  if (undo == nullptr) return err;
  if (mode & (FALLOC_FL_COLLAPSE_RANGE | FALLOC_FL_INSERT_RANGE)) {
    // Everything from `offset` on moves.
    err = SaveRange(*undo, offset, undo->synced_size);
  } else if (mode & (FALLOC_FL_PUNCH_HOLE | FALLOC_FL_ZERO_RANGE)) {
    err = SaveRange(*undo, offset, length);
  }
  if (err != 0) return err;
  return fallocate(fd, mode, offset, length) == 0 ? 0 : -errno;
}

void FaultState::Synced(int fd) {
  struct stat st;
  if (fstat(fd, &st) != 0) return;
  std::lock_guard<std::mutex> lock(undo_mu_);
  auto it = undo_.find({st.st_dev, st.st_ino});
  if (it == undo_.end()) return;
  close(it->second.fd);
  undo_.erase(it);
}

uint64_t FaultState::DropUnsynced(std::string* error) {
  std::lock_guard<std::mutex> lock(undo_mu_);
  uint64_t files = 0;
  for (auto& [key, undo] : undo_) {
    struct stat st;
    int err = fstat(undo.fd, &st) == 0 ? 0 : -errno;
    uint64_t bytes = 0;
    if (err == 0) {
      bytes =
          st.st_size > undo.synced_size ? static_cast<uint64_t>(st.st_size - undo.synced_size) : 0;
      if (ftruncate(undo.fd, undo.synced_size) != 0) err = -errno;
    }
    for (const auto& [offset, old] : undo.saved) {
      if (err != 0) break;
      err = PwriteFull(undo.fd, old.data(), old.size(), offset);
      bytes += old.size();
    }
    if (err == 0 && fsync(undo.fd) != 0) err = -errno;
    if (err != 0) {
      error->append("inode " + std::to_string(key.second) + ": " + std::strerror(-err) + "; ");
    } else {
      ++files;
      bytes_undone_ += bytes;
    }
    close(undo.fd);
  }
  undo_.clear();
  files_undone_ += files;
  return files;
}

Counters FaultState::counters() {
  Counters c;
  c.ops = ops_.load(std::memory_order_relaxed);
  c.eio_injected = eio_injected_.load(std::memory_order_relaxed);
  std::lock_guard<std::mutex> lock(undo_mu_);
  c.bytes_undone = bytes_undone_;
  c.files_undone = files_undone_;
  c.unsynced_files = undo_.size();
  return c;
}

}  // namespace longhaul::faultfs
