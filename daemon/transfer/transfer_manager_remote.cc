// TransferManager's pull and third-party copy: the requester's side (a
// remote transfer submitted, asked about and cancelled at its source site)
// and the source's side (ServeRemote and the *ForPeer calls). The protocol
// and the source's checks are in remote_copy.{h,cc}.
#include <algorithm>
#include <optional>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/fmt_absl.h"
#include "daemon/peer/messaging.h"
#include "daemon/peer/peer_errors.h"
#include "daemon/transfer/remote_copy.h"
#include "daemon/transfer/transfer_manager.h"
#include "daemon/wire/messaging.h"
#include "spdlog/spdlog.h"

namespace longhaul::daemon {
namespace {

std::string NewRequestId() {
  absl::BitGen gen;
  return absl::StrFormat("r-%016x%016x", absl::Uniform<uint64_t>(gen),
                         absl::Uniform<uint64_t>(gen));
}

// The idempotency key of a peer's request in this site's journal: scoped by
// the requester, so one site cannot name (and attach to) another's request.
std::string PeerRequestKey(const std::string& requester, const std::string& request_id) {
  return absl::StrCat("peer/", requester, "/", request_id);
}

// What a PeerMessage adds around the status of a RemoteReply, at most: the
// request id and two length-delimited headers.
constexpr size_t kRemoteReplyEnvelope = 32;

bool SameGrant(const v1::TransferSpec& spec, absl::string_view source_site,
               absl::string_view export_name, absl::string_view dest_path) {
  return spec.source_site() == source_site && spec.dest_export() == export_name &&
         spec.dest_path() == dest_path;
}

std::vector<peer::ExportRoot> ExportRootsOf(const DaemonConfig& config) {
  std::vector<std::pair<std::string, std::string>> exports;
  for (const ExportConfig& e : config.exports) exports.emplace_back(e.name, e.path);
  return peer::ResolveExportRoots(exports);
}

}  // namespace

bool TransferManager::IsRemote(const v1::OutgoingTransfer& record) const {
  return !record.spec().source_site().empty() && record.spec().source_site() != config_.site;
}

absl::Status TransferManager::RunsElsewhere(const v1::OutgoingTransfer& record,
                                            absl::string_view what) const {
  return absl::FailedPreconditionError(absl::StrCat(
      "transfer ", record.id(), " is sent by ", record.spec().source_site(),
      " on this site's request; it can be ", what, " there (`longhaul --daemon ADDR ",
      what == "paused"    ? "pause"
      : what == "resumed" ? "resume"
                          : "verify",
      " ", record.id(), "` at ", record.spec().source_site(), "), and cancelled here"));
}

absl::StatusOr<v1::TransferStatus> TransferManager::SubmitRemote(const std::string& request_id,
                                                                 v1::TransferSpec spec,
                                                                 const Caller& caller) {
  if (spec.source_site().empty() || spec.source_export().empty()) {
    return absl::InvalidArgumentError("a remote source is SITE:/EXPORT/PATH");
  }
  if (!spec.requested_by().empty()) {
    return absl::InvalidArgumentError("requested_by is set by a source site only");
  }
  if (spec.sources_size() > 0) {
    return absl::InvalidArgumentError(
        "a copy has either local sources or one remote source, not both");
  }
  if (spec.source_site() == config_.site) {
    // This site is the source: an ordinary push, with the caller's rights.
    const ExportConfig* e = config_.FindExport(spec.source_export());
    if (e == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(config_.site, " has no export '", spec.source_export(), "'"));
    }
    spec.add_sources(RemoteSourcePath(*e, spec));
    spec.clear_source_site();
    spec.clear_source_export();
    spec.clear_source_path();
    return SubmitLocal(request_id, std::move(spec), caller, source_access_);
  }
  const PeerConfig* source = config_.FindPeer(spec.source_site());
  if (source == nullptr) {
    std::vector<std::string> sites;
    for (const PeerConfig& p : config_.peers) sites.push_back(p.site);
    return absl::InvalidArgumentError(absl::StrCat(
        "unknown source site '", spec.source_site(),
        "'; configured peers: ", sites.empty() ? "(none)" : absl::StrJoin(sites, ", ")));
  }
  if (spec.dest_site() == spec.source_site()) {
    return absl::InvalidArgumentError(
        absl::StrCat("source and destination are both at ", spec.dest_site()));
  }
  if (spec.dest_export().empty() || spec.dest_path().empty()) {
    return absl::InvalidArgumentError("the destination must be SITE:/EXPORT/PATH with a path");
  }
  const bool pull = spec.dest_site() == config_.site;
  if (pull && config_.FindExport(spec.dest_export()) == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(config_.site, " has no export '", spec.dest_export(), "' to pull into"));
  }
  // A pull grants its source one path and never pruning (the destination
  // refuses it too): said here, before the source is asked.
  if (pull && spec.keep_checkpoints() > 0) {
    return absl::InvalidArgumentError(
        "a pull never prunes: keep_checkpoints applies to a push or a third-party copy only");
  }
  // The daemon writes a pull's destination with its own rights: only where
  // the caller could write itself, judged before the source is asked.
  if (pull) {
    if (absl::Status s = destination_access_.MayWrite(caller, spec.dest_export(), spec.dest_path());
        !s.ok()) {
      return s;
    }
  }

  // Not under submit_mu_: the source may be slow to answer, and local
  // submits must not wait for it. Two calls with one request id get one
  // transfer all the same: the source answers both with it (below).
  const std::string rid = request_id.empty() ? NewRequestId() : request_id;
  if (auto existing = journal_.LookupRequest(rid); !existing.ok()) {
    return existing.status();
  } else if (*existing) {
    return Get(**existing);
  }
  // Granted before the source is asked: it may open the transfer before it answers.
  const PullGrant grant{spec.source_site(), spec.dest_export(), spec.dest_path(), caller};
  auto drop_grant = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto it = std::find_if(pending_pulls_.begin(), pending_pulls_.end(), [&](const PullGrant& g) {
      return g.source_site == grant.source_site && g.export_name == grant.export_name &&
             g.dest_path == grant.dest_path;
    });
    if (it != pending_pulls_.end()) pending_pulls_.erase(it);
  };
  if (pull) {
    absl::MutexLock lock(&mu_);
    pending_pulls_.push_back(grant);
  }
  v1::PeerMessage request;
  request.mutable_remote_submit()->set_request_id(rid);
  *request.mutable_remote_submit()->mutable_spec() = spec;
  absl::StatusOr<v1::TransferStatus> answer = CallRemote(control_transport_, *source, request);
  absl::Status valid = answer.status();
  if (valid.ok()) {
    const std::string& id = answer->id();
    if (id.empty() || id.size() > 128 || id.find_first_of("/\\") != std::string::npos ||
        id.find('\0') != std::string::npos || id == "." || id == "..") {
      valid = absl::InvalidArgumentError(
          absl::StrCat(source->site, " answered with an invalid transfer id"));
    } else {
      absl::MutexLock lock(&mu_);
      if (auto it = transfers_.find(id); it != transfers_.end()) {
        if (it->second->record.request_id() == rid && IsRemote(it->second->record)) {
          if (pull) drop_grant();
          return StatusOf(*it->second);  // the same request, answered twice
        }
        valid = absl::AlreadyExistsError(absl::StrCat(source->site, " answered with transfer id ",
                                                      id, ", which this site already uses"));
      }
    }
  }
  if (!valid.ok()) {
    absl::MutexLock lock(&mu_);
    if (pull) drop_grant();
    return valid;
  }

  v1::OutgoingTransfer record;
  record.set_id(answer->id());
  record.set_request_id(rid);
  record.set_submitted_by(caller.RequesterKey());
  record.set_submitted_gid(caller.gid);
  *record.mutable_spec() = std::move(spec);
  record.set_state(answer->state());
  record.set_created_unix_ms(absl::ToUnixMillis(clock_.WallNow()));
  absl::Status persisted = journal_.PutOutgoingWithRequest(record, rid);
  absl::MutexLock lock(&mu_);
  if (pull) drop_grant();
  if (!persisted.ok()) return persisted;
  if (auto it = transfers_.find(record.id()); it != transfers_.end()) {
    return StatusOf(*it->second);  // a concurrent call with the same request id won
  }
  std::unique_ptr<Transfer> t = NewTransfer();
  t->record = std::move(record);
  t->remote_status = *answer;
  t->remote_asked = clock_.Now();
  Transfer& ref = *t;
  transfers_[ref.record.id()] = std::move(t);
  spdlog::info("transfer {} submitted at {} for {}: {}:/{}/{} to {}:/{}/{}", ref.record.id(),
               source->site, caller.ToString(), source->site, ref.record.spec().source_export(),
               ref.record.spec().source_path(), ref.record.spec().dest_site(),
               ref.record.spec().dest_export(), ref.record.spec().dest_path());
  ApplyRemoteLocked(ref, *answer);
  return StatusOf(ref);
}

void TransferManager::RefreshRemote(const std::string& id) {
  std::string site;
  {
    absl::MutexLock lock(&mu_);
    auto found = FindLocked(id);
    if (!found.ok()) return;
    Transfer& t = **found;
    if (!IsRemote(t.record) || IsEndState(t.record.state())) return;
    const Timestamp now = clock_.Now();
    if (t.remote_asked && now - *t.remote_asked <
                              TimeDelta::Microseconds(absl::ToInt64Microseconds(kRemoteRefresh))) {
      return;
    }
    t.remote_asked = now;  // one question at a time, also from concurrent Gets
    site = t.record.spec().source_site();
  }
  absl::StatusOr<v1::TransferStatus> answer =
      absl::FailedPreconditionError(absl::StrCat(site, " is no longer a configured peer"));
  if (const PeerConfig* peer = config_.FindPeer(site); peer != nullptr) {
    v1::PeerMessage request;
    request.mutable_remote_get()->set_transfer_id(id);
    answer = CallRemote(control_transport_, *peer, request);
  }
  absl::MutexLock lock(&mu_);
  Transfer& t = *transfers_.at(id);  // records are never removed
  if (answer.ok() && answer->id() == id) {
    t.remote_error.clear();
    ApplyRemoteLocked(t, *answer);
  } else if (absl::IsNotFound(answer.status())) {
    // The source lost or never had it (its journal was reset): it will not end by itself.
    t.remote_error.clear();
    t.record.set_state(v1::FAILED);
    t.record.set_error(std::string(answer.status().message()));
    t.record.set_finished_unix_ms(absl::ToUnixMillis(clock_.WallNow()));
    PersistLocked(t).IgnoreError();  // logged
  } else {
    t.remote_error = absl::StrCat(
        "cannot ask ", site, " for the transfer's state: ",
        answer.ok() ? "it answered about another transfer" : answer.status().message());
    NoteChange();
  }
}

void TransferManager::ApplyRemoteLocked(Transfer& t, const v1::TransferStatus& status) {
  t.remote_status = status;
  if (status.state() != t.record.state() || status.error() != t.record.error()) {
    t.record.set_state(status.state());
    t.record.set_error(status.error());
    t.record.set_bytes_done(status.bytes_done());
    if (IsEndState(status.state()))
      t.record.set_finished_unix_ms(absl::ToUnixMillis(clock_.WallNow()));
    PersistLocked(t).IgnoreError();  // logged
  }
  NoteChange();
}

v1::TransferStatus TransferManager::RemoteStatusOf(const Transfer& t) const {
  v1::TransferStatus status = t.remote_status.value_or(v1::TransferStatus());
  status.set_id(t.record.id());
  status.set_state(t.record.state());
  *status.mutable_spec() = t.record.spec();
  status.set_created_unix_ms(t.record.created_unix_ms());
  status.set_finished_unix_ms(t.record.finished_unix_ms());
  if (!t.remote_status) status.set_bytes_done(t.record.bytes_done());
  status.set_error(!t.remote_error.empty() && !IsEndState(t.record.state()) ? t.remote_error
                                                                            : t.record.error());
  return status;
}

absl::StatusOr<v1::TransferStatus> TransferManager::CancelRemote(
    const v1::OutgoingTransfer& record) {
  const PeerConfig* peer = config_.FindPeer(record.spec().source_site());
  if (peer == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat(record.spec().source_site(), " is no longer a configured peer"));
  }
  v1::PeerMessage request;
  request.mutable_remote_cancel()->set_transfer_id(record.id());
  absl::StatusOr<v1::TransferStatus> answer = CallRemote(control_transport_, *peer, request);
  absl::MutexLock lock(&mu_);
  Transfer& t = *transfers_.at(record.id());
  t.remote_asked.reset();  // the next Get asks again
  if (!answer.ok()) return answer.status();
  ApplyRemoteLocked(t, *answer);
  return StatusOf(t);
}

absl::Status TransferManager::PullGranted(const peer::DestinationAuthority::Change& change) const {
  // The requesters of the pulls that grant the change; more than one when
  // callers pulled the same path at once.
  std::vector<Caller> requesters;
  bool unknown_requester = false;
  {
    absl::MutexLock lock(&mu_);
    for (const PullGrant& g : pending_pulls_) {
      if (g.source_site == change.source && g.export_name == change.export_name &&
          g.dest_path == change.dest_path) {
        requesters.push_back(g.caller);
      }
    }
    auto it = transfers_.find(change.transfer_id);
    if (it != transfers_.end()) {
      const v1::OutgoingTransfer& record = it->second->record;
      if (IsRemote(record) && record.spec().dest_site() == config_.site &&
          !IsEndState(record.state()) &&
          SameGrant(record.spec(), change.source, change.export_name, change.dest_path)) {
        std::optional<Caller> caller =
            Caller::FromRequesterKey(record.submitted_by(), record.submitted_gid());
        if (caller) {
          requesters.push_back(*std::move(caller));
        } else {
          unknown_requester = true;
        }
      }
    }
  }
  if (requesters.empty() && !unknown_requester) {
    return absl::NotFoundError(absl::StrCat(config_.site, " has no pull of ", change.export_name,
                                            ":", change.dest_path, " from ", change.source,
                                            " running as transfer ", change.transfer_id));
  }
  if (change.published) return absl::OkStatus();  // nothing is written
  // Judged outside mu_: the kernel judge forks.
  absl::Status verdict = absl::PermissionDeniedError(
      absl::StrCat("transfer ", change.transfer_id,
                   " was submitted by a version that did not record who asked for it; submit "
                   "the pull again"));
  for (const Caller& caller : requesters) {
    verdict = destination_access_.MayWrite(caller, change.export_name, change.dest_path);
    if (verdict.ok()) break;
  }
  return verdict;
}

// --- The source's side ---

absl::StatusOr<v1::TransferStatus> TransferManager::SubmitForPeer(const std::string& requester,
                                                                  const std::string& request_id,
                                                                  v1::TransferSpec spec) {
  if (request_id.empty()) return absl::InvalidArgumentError("a remote copy needs a request id");
  absl::StatusOr<const ExportConfig*> e = CheckRemoteSubmit(config_, requester, spec);
  if (!e.ok()) return e.status();
  spec.add_sources(RemoteSourcePath(**e, spec));
  spec.clear_source_site();
  spec.set_requested_by(requester);
  // Only the export that lists the requester, never this site's own work in it.
  std::vector<SourceAccess::Forbidden> forbidden = DaemonSecrets(config_);
  forbidden.push_back({absl::StrCat((*e)->path, "/.longhaul"), "this site's staging and trash"});
  const SourceAccess access({**e}, std::move(forbidden));
  return SubmitLocal(PeerRequestKey(requester, request_id), std::move(spec),
                     Caller::PeerSite(requester), access);
}

absl::StatusOr<v1::TransferStatus> TransferManager::GetForPeer(const std::string& requester,
                                                               const std::string& id) {
  {
    absl::MutexLock lock(&mu_);
    auto found = FindLocked(id);
    if (!found.ok() || (*found)->record.spec().requested_by() != requester) {
      return absl::NotFoundError(
          absl::StrCat(config_.site, " has no transfer ", id, " requested by ", requester));
    }
  }
  return Get(id);
}

absl::StatusOr<v1::TransferStatus> TransferManager::CancelForPeer(const std::string& requester,
                                                                  const std::string& id) {
  if (absl::StatusOr<v1::TransferStatus> s = GetForPeer(requester, id); !s.ok()) return s;
  absl::StatusOr<v1::TransferStatus> cancelled = Cancel(id);
  if (!cancelled.ok() && absl::IsFailedPrecondition(cancelled.status())) {
    // Already ended or published before the cancel: the requester sees the end state.
    spdlog::info("cancel of transfer {} asked by {}: {}", id, requester,
                 cancelled.status().message());
    return Get(id);
  }
  return cancelled;
}

void TransferManager::ServeRemote(transport::Channel& channel) {
  const std::string requester = channel.peer_site();
  // Resolved once per channel: what ForPeer names this host's paths by.
  const std::vector<peer::ExportRoot> roots = ExportRootsOf(config_);
  while (true) {
    v1::PeerMessage request;
    absl::Status read = wire::ReadProto(channel, wire::FrameType::kControl, /*session_id=*/0,
                                        kMaxRemoteMessage, &request);
    if (!read.ok()) {
      if (!absl::IsUnavailable(read)) {
        spdlog::warn("closing remote request channel from {}: {}", requester, read.message());
      }
      return;
    }
    absl::StatusOr<v1::TransferStatus> result;
    switch (request.body_case()) {
      case v1::PeerMessage::kRemoteSubmit:
        result = SubmitForPeer(requester, request.remote_submit().request_id(),
                               request.remote_submit().spec());
        break;
      case v1::PeerMessage::kRemoteGet:
        result = GetForPeer(requester, request.remote_get().transfer_id());
        break;
      case v1::PeerMessage::kRemoteCancel:
        result = CancelForPeer(requester, request.remote_cancel().transfer_id());
        break;
      default:
        result = absl::InvalidArgumentError("unexpected message on a remote request channel");
    }
    // The requester learns the export names, never this host's paths, and
    // every answer fits its kMaxRemoteMessage, envelope included.
    v1::PeerMessage answer;
    if (result.ok()) {
      answer.set_request_id(request.request_id());
      v1::TransferStatus& status = *result;
      for (std::string& source : *status.mutable_spec()->mutable_sources()) {
        source = peer::ForPeer(source, roots);
      }
      status.set_error(peer::ForPeer(status.error(), roots));
      for (v1::SkippedEntry& skipped : *status.mutable_skipped()) {
        skipped.set_why(peer::ForPeer(skipped.why(), roots));
      }
      for (v1::DestinationStatus& d : *status.mutable_destinations()) {
        d.set_error(peer::ForPeer(d.error(), roots));
      }
      FitRemoteStatus(status, kMaxRemoteMessage - kRemoteReplyEnvelope);
      *answer.mutable_remote_reply()->mutable_status() = std::move(status);
    } else {
      answer = peer::ErrorAnswer(
          request.request_id(),
          absl::Status(result.status().code(), peer::ForPeer(result.status().message(), roots)));
      CutText(*answer.mutable_error(), kMaxRemoteError);
      if (request.body_case() == v1::PeerMessage::kRemoteSubmit) {
        spdlog::warn("refused remote copy requested by {}: {}", requester,
                     result.status().message());
      }
    }
    if (!wire::SendProto(channel, wire::FrameType::kControl, 0, answer).ok()) return;
  }
}

}  // namespace longhaul::daemon
