#include "daemon/peer/durability_committer.h"

#include <map>
#include <set>

namespace longhaul::peer {

DurabilityCommitter::DurabilityCommitter(storage::Journal& journal)
    : journal_(journal), thread_([this] { Run(); }) {}

DurabilityCommitter::~DurabilityCommitter() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
}

absl::Status DurabilityCommitter::MakeDurable(storage::File& file, const std::string& transfer_id,
                                              const storage::ChunkDurability& chunk) {
  Request request{&file, &transfer_id, &chunk, absl::OkStatus(), false};
  absl::MutexLock lock(&mu_);
  if (stop_) return absl::UnavailableError("daemon is shutting down");
  pending_.push_back(&request);
  mu_.Await(absl::Condition(+[](Request* r) { return r->done; }, &request));
  return request.result;
}

void DurabilityCommitter::Run() {
  while (true) {
    std::vector<Request*> group;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](DurabilityCommitter* self) ABSL_NO_THREAD_SAFETY_ANALYSIS {
            return self->stop_ || !self->pending_.empty();
          },
          this));
      if (pending_.empty()) return;  // stopping, nobody waiting
      group.swap(pending_);
    }

    // Data first: a journal entry must never claim bytes that are not on disk.
    std::map<storage::File*, absl::Status> synced;
    for (Request* r : group) {
      if (!synced.count(r->file)) synced[r->file] = r->file->SyncData();
    }
    std::map<std::string, std::vector<Request*>> by_transfer;
    for (Request* r : group) {
      r->result = synced[r->file];
      if (r->result.ok()) by_transfer[*r->transfer_id].push_back(r);
    }
    for (auto& [transfer_id, requests] : by_transfer) {
      std::vector<storage::ChunkDurability> chunks;
      chunks.reserve(requests.size());
      for (Request* r : requests) chunks.push_back(*r->chunk);
      absl::Status recorded = journal_.RecordDurableChunks(transfer_id, chunks);
      for (Request* r : requests) r->result = recorded;
    }

    absl::MutexLock lock(&mu_);
    for (Request* r : group) r->done = true;
  }
}

}  // namespace longhaul::peer
