// The Receiver's expiry: the sweep that expires abandoned incoming
// transfers and removes ended records once they are old, and the dropping
// of ended sessions.
#include <algorithm>
#include <thread>

#include "common/fmt_absl.h"
#include "daemon/peer/receiver.h"
#include "daemon/peer/receiver_session.h"
#include "spdlog/spdlog.h"
#include "storage/staging.h"
#include "storage/trash.h"

namespace longhaul::peer {

namespace {

// The first retry after a staging could not be removed; doubled after each
// pass that still leaves one, up to the sweep's interval.
constexpr absl::Duration kFirstStagingRetry = absl::Seconds(5);

// When a RECEIVING record last saw activity that was persisted.
absl::Time LastActive(const v1::IncomingTransfer& r) {
  return absl::FromUnixMillis(std::max(r.active_unix_ms(), r.created_unix_ms()));
}

}  // namespace

absl::Duration Receiver::ExpirySweepInterval(absl::Duration expiry) {
  return std::clamp(expiry / 10, absl::Milliseconds(100), absl::Hours(1));
}

void Receiver::StartExpirySweep() {
  const absl::Duration interval =
      ExpirySweepInterval(std::min(options_.incoming_expiry, options_.trash_retention));
  const absl::Duration first_retry = std::min(interval, kFirstStagingRetry);
  sweep_thread_ = std::thread([this, interval, first_retry] {
    absl::Duration retry = first_retry;
    while (true) {
      ExpireAbandoned();
      RemoveStrayStaging();
      ExpireTrash();
      absl::MutexLock lock(&sweep_mu_);
      if (!staging_left_) {
        retry = first_retry;
        auto woken = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(sweep_mu_) {
          return sweep_stop_ || staging_left_;
        };
        sweep_mu_.AwaitWithTimeout(absl::Condition(&woken), interval);
        if (sweep_stop_) return;
        if (!staging_left_) continue;  // the interval passed
      }
      // A staging is left: the next pass comes after `retry`, so that what
      // made the removal fail has time to pass.
      staging_left_ = false;
      if (sweep_mu_.AwaitWithTimeout(absl::Condition(&sweep_stop_), retry)) return;
      retry = std::min(retry * 2, interval);
    }
  });
}

void Receiver::NoteStagingLeft() {
  absl::MutexLock lock(&sweep_mu_);
  staging_left_ = true;
}

size_t Receiver::ExpireAbandoned() {
  const absl::Duration expiry = options_.incoming_expiry;
  const absl::Time now = clock_.WallNow();
  auto incoming = journal_.ListIncoming();
  if (!incoming.ok()) {
    spdlog::error("cannot list incoming transfers to expire abandoned ones: {}",
                  incoming.status().message());
    return 0;
  }
  size_t changed = 0;
  for (const v1::IncomingTransfer& record : *incoming) {
    switch (record.state()) {
      case v1::IncomingTransfer::RECEIVING:
        changed += ExpireIfAbandoned(record, now, expiry);
        break;
      case v1::IncomingTransfer::ABORTED:
      case v1::IncomingTransfer::EXPIRED:
        changed += RemoveIfAged(record, now, expiry);
        break;
      default:
        break;
    }
  }
  return changed;
}

bool Receiver::ExpireIfAbandoned(const v1::IncomingTransfer& listed, absl::Time now,
                                 absl::Duration expiry) {
  const std::string& id = listed.id();
  std::shared_ptr<Session> session;
  {
    absl::MutexLock lock(&mu_);
    if (auto it = sessions_.find(id); it != sessions_.end()) session = it->second;
  }
  // Without a session only an expiry needs one: none is made for the rest.
  if (!session) {
    if (now - LastActive(listed) < expiry) return false;
    session = SessionFor(id);
  }
  bool expired = false;
  {
    absl::MutexLock lock(&session->mu);
    auto current = journal_.GetIncoming(id);
    if (!current.ok() || !*current || (*current)->state() != v1::IncomingTransfer::RECEIVING) {
      return false;
    }
    v1::IncomingTransfer& record = **current;
    if (!session->data_channels.empty()) {
      // Receiving now: keep the persisted activity fresh enough that a
      // restart does not find it stale.
      if (now - LastActive(record) >= expiry / 2 && session->record.id() == id) {
        session->record.set_active_unix_ms(absl::ToUnixMillis(now));
        if (absl::Status s = journal_.PutIncoming(session->record); !s.ok()) {
          spdlog::warn("transfer {}: cannot record its activity: {}", id, s.message());
        }
      }
      return false;
    }
    if (now - LastActive(record) < expiry) return false;

    auto dest = Resolve(record);
    if (dest.ok()) {
      if (!session->staging) {
        auto staging = storage::Staging::Open(fs_, *dest, id);
        if (!staging.ok()) {
          spdlog::warn("transfer {}: cannot open its staging to expire it: {}", id,
                       staging.status().message());
          return false;
        }
        session->staging.emplace(std::move(*staging));
      }
      absl::StatusOr<bool> past = session->staging->PastPointOfNoReturn();
      if (!past.ok()) return false;
      if (*past) {
        // The new version is complete and durable: finish it, never leave
        // the destination to a half-done publish.
        session->record = record;
        session->dest = *dest;
        if (absl::Status s = PublishLocked(*session); !s.ok()) {
          spdlog::error(
              "transfer {}: abandoned past its point of no return, and its publish "
              "failed: {}",
              id, s.message());
          return false;
        }
        spdlog::info("transfer {}: abandoned past its point of no return; published", id);
        return true;
      }
      if (absl::Status s = session->staging->Remove(); !s.ok()) {
        spdlog::warn("transfer {}: cannot remove its staging to expire it: {}", id, s.message());
        NoteStagingLeft();
        return false;
      }
      session->staging.reset();
    } else {
      spdlog::warn("transfer {}: expiring it without removing its staging: {}", id,
                   dest.status().message());
    }
    if (absl::Status s = journal_.DeleteChunks(id); !s.ok()) {
      spdlog::warn("transfer {}: cannot delete its chunk records to expire it: {}", id,
                   s.message());
      return false;
    }
    v1::IncomingTransfer ended;
    ended.set_id(id);
    ended.set_source_site(record.source_site());
    ended.set_export_name(record.export_name());
    ended.set_dest_path(record.dest_path());
    ended.set_single_file(record.single_file());
    ended.set_created_unix_ms(record.created_unix_ms());
    ended.set_active_unix_ms(record.active_unix_ms());
    ended.set_state(v1::IncomingTransfer::EXPIRED);
    ended.set_ended_unix_ms(absl::ToUnixMillis(now));
    ended.set_expired_files(record.manifest().files_size());
    uint64_t bytes = 0;
    for (const v1::ManifestFile& f : record.manifest().files()) bytes += f.size();
    ended.set_expired_bytes(bytes);
    if (absl::Status s = journal_.PutIncoming(ended); !s.ok()) {
      spdlog::warn("transfer {}: cannot record its expiry: {}", id, s.message());
      return false;
    }
    session->record = ended;
    session->durable.clear();
    session->read_back.clear();
    spdlog::info(
        "transfer {} from {}: expired after {} without activity (last {}); its staging "
        "and chunk records were removed",
        id, record.source_site(), absl::FormatDuration(now - LastActive(record)),
        absl::FormatTime(LastActive(record)));
    expired = true;
  }
  session.reset();
  ForgetEndedSession(id);
  return expired;
}

bool Receiver::RemoveIfAged(const v1::IncomingTransfer& listed, absl::Time now,
                            absl::Duration expiry) {
  const std::string& id = listed.id();
  if (listed.ended_unix_ms() != 0 && now - absl::FromUnixMillis(listed.ended_unix_ms()) < expiry) {
    return false;
  }
  std::shared_ptr<Session> session = SessionFor(id);
  bool removed = false;
  {
    absl::MutexLock lock(&session->mu);
    auto current = journal_.GetIncoming(id);
    if (!current.ok() || !*current) return false;
    v1::IncomingTransfer& record = **current;
    if (record.state() != v1::IncomingTransfer::ABORTED &&
        record.state() != v1::IncomingTransfer::EXPIRED) {
      return false;
    }
    if (record.ended_unix_ms() == 0) {
      // Written by a version that did not date it: it ages from now.
      record.set_ended_unix_ms(absl::ToUnixMillis(now));
      if (absl::Status s = journal_.PutIncoming(record); !s.ok()) {
        spdlog::warn("transfer {}: cannot date its ended record: {}", id, s.message());
      }
      return false;
    }
    if (now - absl::FromUnixMillis(record.ended_unix_ms()) < expiry) return false;
    if (absl::Status s = journal_.DeleteIncoming(id); !s.ok()) {
      spdlog::warn("transfer {}: cannot remove its ended record: {}", id, s.message());
      return false;
    }
    session->record.Clear();
    spdlog::info("transfer {} from {}: removed its {} record after {}", id, record.source_site(),
                 v1::IncomingTransfer::State_Name(record.state()), absl::FormatDuration(expiry));
    removed = true;
  }
  session.reset();
  ForgetEndedSession(id);
  return removed;
}

size_t Receiver::RemoveStrayStaging() {
  size_t removed = 0;
  for (const storage::Export& e : exports_) {
    absl::StatusOr<std::vector<std::string>> ids = storage::Staging::ListStaged(fs_, e.path);
    if (!ids.ok()) {
      spdlog::warn("cannot list the staging of export {} to remove what is left there: {}", e.name,
                   ids.status().message());
      continue;
    }
    for (const std::string& id : *ids) {
      if (!receiver_internal::CheckTransferId(id).ok()) continue;
      removed += RemoveStagingIfStray(e.path, id);
    }
  }
  return removed;
}

size_t Receiver::ExpireTrash() {
  size_t removed = 0;
  for (const storage::Export& e : exports_) {
    absl::StatusOr<std::vector<std::string>> gone =
        storage::ExpireTrash(fs_, e.path, clock_.WallNow(), options_.trash_retention);
    if (!gone.ok()) {
      spdlog::warn("cannot expire the trash of export {}: {}", e.name, gone.status().message());
      continue;
    }
    for (const std::string& name : *gone) {
      spdlog::info("export {}: removed {}/{} after trash_retention {}", e.name, storage::kTrashRel,
                   name, absl::FormatDuration(options_.trash_retention));
    }
    removed += gone->size();
  }
  return removed;
}

bool Receiver::RemoveStagingIfStray(const std::string& export_root, const std::string& id) {
  std::shared_ptr<Session> session = SessionFor(id);
  bool removed = false;
  {
    // Under the session lock no open is half done: an open creates the
    // staging and journals the record under it.
    absl::MutexLock lock(&session->mu);
    auto record = journal_.GetIncoming(id);
    const char* why = nullptr;  // set when the staging is stray
    if (record.ok() && !*record) {
      why = "no transfer here owns it";
    } else if (record.ok()) {
      switch ((*record)->state()) {
        case v1::IncomingTransfer::ABORTED:
          why = "its transfer was cancelled";
          break;
        case v1::IncomingTransfer::EXPIRED:
          why = "its transfer expired";
          break;
        case v1::IncomingTransfer::PUBLISHED:
          why = "its transfer was published";
          break;
        default:
          break;  // still receiving, or resumable: kept
      }
    }
    if (why != nullptr) {
      absl::Status s;
      if (session->staging.has_value()) {
        s = session->staging->Remove();
        session->staging.reset();
      } else {
        storage::ResolvedDestination where;
        where.export_root = export_root;
        s = storage::Staging::RemoveLeftover(fs_, where, id);
      }
      if (s.ok()) {
        spdlog::info("transfer {}: removed its staging left in {} ({})", id, export_root, why);
        removed = true;
      } else {
        spdlog::warn("transfer {}: cannot remove its staging in {} ({}): {}; trying again later",
                     id, export_root, why, s.message());
        NoteStagingLeft();
      }
    }
  }
  session.reset();
  ForgetEndedSession(id);
  return removed;
}

void Receiver::ForgetEndedSession(const std::string& id) {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(id);
  if (it == sessions_.end() || it->second.use_count() > 1) return;
  Session& session = *it->second;
  bool forget;
  {
    absl::MutexLock session_lock(&session.mu);
    const v1::IncomingTransfer::State state = session.record.state();
    const bool ended = session.record.id().empty() || state == v1::IncomingTransfer::ABORTED ||
                       state == v1::IncomingTransfer::EXPIRED;
    forget = ended && !session.staging && session.data_channels.empty();
  }
  // Erased after its lock is released: the erase destroys the session, and
  // nobody else can reach it while mu_ is held and the map owns the only reference.
  if (forget) sessions_.erase(it);
}

}  // namespace longhaul::peer
