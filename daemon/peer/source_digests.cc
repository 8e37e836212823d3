#include "daemon/peer/source_digests.h"

#include <algorithm>

namespace longhaul::peer {

void SourceDigests::Add(const Entry& entry) {
  absl::MutexLock lock(&mu_);
  const Key key{entry.file_index, entry.chunk_index, entry.generation};
  if (positions_.contains(key)) return;
  positions_[key] = log_.size();
  log_.push_back(entry);
}

std::optional<storage::Xxh128> SourceDigests::Find(uint32_t file_index, uint32_t chunk_index,
                                                   uint32_t generation) const {
  absl::MutexLock lock(&mu_);
  auto it = positions_.find(Key{file_index, chunk_index, generation});
  if (it == positions_.end()) return std::nullopt;
  return log_[it->second].xxh128;
}

std::vector<SourceDigests::Entry> SourceDigests::Since(size_t from, size_t max) const {
  absl::MutexLock lock(&mu_);
  if (from >= log_.size()) return {};
  const size_t end = from + std::min(max, log_.size() - from);
  return std::vector<Entry>(log_.begin() + from, log_.begin() + end);
}

size_t SourceDigests::size() const {
  absl::MutexLock lock(&mu_);
  return log_.size();
}

void SourceDigests::WaitForMore(size_t known, absl::Duration timeout) const {
  struct More {
    const std::vector<Entry>* log;
    size_t known;
  };
  absl::MutexLock lock(&mu_);
  More more{&log_, known};
  mu_.AwaitWithTimeout(
      absl::Condition(
          +[](More* m) ABSL_NO_THREAD_SAFETY_ANALYSIS { return m->log->size() > m->known; }, &more),
      timeout);
}

}  // namespace longhaul::peer
