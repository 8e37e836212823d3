#include "daemon/peer/destination_authority.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/fmt_absl.h"
#include "spdlog/spdlog.h"

namespace longhaul::peer {

DestinationAuthority::Change DestinationAuthority::Change::Of(const v1::IncomingTransfer& record,
                                                              const std::string& relative) {
  Change change;
  change.source = record.source_site();
  change.requester = record.requested_by();
  change.export_name = record.export_name();
  change.dest_path = record.dest_path();
  change.relative = relative;
  change.transfer_id = record.id();
  change.prunes = record.keep_checkpoints() > 0 && !record.single_file();
  change.published = record.state() == v1::IncomingTransfer::PUBLISHED;
  return change;
}

DestinationAuthority::DestinationAuthority(Options options, DestinationOwners::Loader load,
                                           DestinationOwners::ExistsFn exists)
    : options_(std::move(options)),
      // Publishes are owned by (source, third-party requester): a pull's
      // requester is this site, whose grant is not ownership.
      owners_(
          [this, load = std::move(load)]() -> absl::StatusOr<std::vector<v1::IncomingTransfer>> {
            absl::StatusOr<std::vector<v1::IncomingTransfer>> records = load();
            if (!records.ok()) return records;
            for (v1::IncomingTransfer& r : *records) {
              r.set_requested_by(OwningRequester(r.source_site(), r.requested_by()));
            }
            return records;
          },
          exists),
      exists_(std::move(exists)) {}

std::string DestinationAuthority::OwningRequester(const std::string& source,
                                                  const std::string& requester) const {
  if (requester == source || requester == options_.local_site) return "";
  return requester;
}

const DestinationAuthority::Options::Export* DestinationAuthority::FindExport(
    const std::string& name) const {
  for (const Options::Export& e : options_.exports) {
    if (e.name == name) return &e;
  }
  return nullptr;
}

bool DestinationAuthority::IsWriter(const std::string& export_name, const std::string& site) const {
  const Options::Export* e = FindExport(export_name);
  return e != nullptr && std::find(e->writers.begin(), e->writers.end(), site) != e->writers.end();
}

bool DestinationAuthority::IsReader(const std::string& export_name, const std::string& site) const {
  const Options::Export* e = FindExport(export_name);
  return e != nullptr && std::find(e->readers.begin(), e->readers.end(), site) != e->readers.end();
}

absl::Status DestinationAuthority::PullGranted(const Change& change) const {
  if (!options_.pull_granted) return absl::NotFoundError("this site issues no pulls");
  return options_.pull_granted(change);
}

absl::Status DestinationAuthority::Refuse(const Change& change, absl::Status status) const {
  spdlog::warn(
      "export {}: refused transfer {} from {}{} into {}: {}", change.export_name,
      change.transfer_id, change.source,
      change.requester.empty() ? "" : absl::StrCat(" (requested by ", change.requester, ")"),
      change.dest_path, status.message());
  if (absl::IsPermissionDenied(status) && options_.refused) {
    options_.refused(change.source, change.export_name);
  }
  return status;
}

absl::Status DestinationAuthority::CheckSource(const Change& change) const {
  if (IsWriter(change.export_name, change.source)) return absl::OkStatus();
  absl::Status granted = PullGranted(change);
  if (granted.ok()) return granted;
  const std::string& local = options_.local_site;
  if (!absl::IsNotFound(granted)) return RefusePull(change, granted);
  // The same words whether the export is missing or does not list the
  // source: the exports a site may not write are not its business. It is
  // told the ones it may write.
  if (FindExport(change.export_name) == nullptr) {
    spdlog::info("export {} named by {} does not exist", change.export_name, change.source);
  }
  std::vector<absl::string_view> writable;
  for (const Options::Export& e : options_.exports) {
    if (IsWriter(e.name, change.source)) writable.push_back(e.name);
  }
  return Refuse(
      change,
      absl::PermissionDeniedError(absl::StrCat(
          change.source, " may not write into export ", change.export_name, " of ", local,
          ": it is not one of the export's writers (exports[].writers in ", local, "'s config)",
          writable.empty() ? ""
                           : absl::StrCat("; ", change.source, " may write into ",
                                          absl::StrJoin(writable, ", ")))));
}

absl::Status DestinationAuthority::MayWriteInto(const Change& change) const {
  return CheckSource(change);
}

absl::Status DestinationAuthority::RefusePull(const Change& change,
                                              const absl::Status& granted) const {
  return Refuse(change,
                absl::Status(granted.code(),
                             absl::StrCat("the pull of ", change.export_name, ":", change.dest_path,
                                          " that ", options_.local_site,
                                          " issued may not write there: ", granted.message())));
}

absl::Status DestinationAuthority::MayRelay(const Change& change, const std::string& relay) const {
  Change relayed = change;
  relayed.source = relay;
  relayed.requester.clear();
  return CheckSource(relayed);
}

absl::Status DestinationAuthority::CheckParties(const Change& change) const {
  // A missing export: refused as one that does not list the source (a pull
  // granted into an export since removed is refused by resolving it).
  if (FindExport(change.export_name) == nullptr) return CheckSource(change);
  const std::string& local = options_.local_site;
  const std::string& source = change.source;
  const std::string& requester = change.requester;
  const std::string where = absl::StrCat("export ", change.export_name, " of ", local);

  // The source, whose authority every change uses.
  if (absl::Status s = CheckSource(change); !s.ok()) return s;
  const bool source_writer = IsWriter(change.export_name, source);

  // The requester it names, whose authority it uses too.
  const bool pull = requester == local && source != local;
  const bool third_party = !requester.empty() && requester != source && !pull;
  const bool requester_writer = third_party && IsWriter(change.export_name, requester);
  // A source that is not a writer had its grant checked already.
  absl::Status granted = pull && source_writer ? PullGranted(change) : absl::OkStatus();
  if (!granted.ok() && !absl::IsNotFound(granted)) return RefusePull(change, granted);
  if (!granted.ok()) {
    return Refuse(
        change, absl::PermissionDeniedError(absl::StrCat(
                    source, " names ", local, " as the requester of transfer ", change.transfer_id,
                    " into ", change.export_name, ":", change.dest_path, ", but ", local,
                    " has no pull of that path from it running; a pull's source writes only "
                    "the path pulled, with the transfer pulled, while the pull runs")));
  }
  if (third_party && !requester_writer && !change.published &&
      exists_(change.export_name, change.relative)) {
    return Refuse(change,
                  absl::PermissionDeniedError(absl::StrCat(
                      requester, " asked ", source, " to copy into ", change.export_name, ":",
                      change.relative, " of ", local, ", which exists; ", requester,
                      " is not one of the export's writers, so a copy on its request may only "
                      "create a path that does not exist yet: copy to a new path, or add ",
                      requester, " to exports[].writers in ", local, "'s config")));
  }

  // Pruning removes what was there: only writers' authority reaches it.
  if (change.prunes) {
    if (!source_writer) {
      return Refuse(change, absl::PermissionDeniedError(absl::StrCat(
                                source, " may not prune old checkpoints in ", where, ": it writes ",
                                change.dest_path,
                                " there as the source of a pull only, which grants that path "
                                "and no pruning; pull without --keep")));
    }
    if (pull) {
      return Refuse(
          change, absl::PermissionDeniedError(absl::StrCat(
                      "a pull into ", where, " may not prune old checkpoints: ", local,
                      "'s pull grants ", source, " one path and no pruning; pull without --keep")));
    }
    if (third_party && !requester_writer) {
      return Refuse(change,
                    absl::PermissionDeniedError(absl::StrCat(
                        requester, " asked ", source, " to prune old checkpoints in ", where,
                        " (--keep), but ", requester,
                        " is not one of the export's writers, so a copy on its request never "
                        "prunes: copy without --keep, or add ",
                        requester, " to exports[].writers in ", local, "'s config")));
    }
  }
  return absl::OkStatus();
}

absl::Status DestinationAuthority::MayWrite(const Change& change) {
  if (absl::Status s = CheckParties(change); !s.ok()) return s;
  if (change.published) return absl::OkStatus();  // nothing is written
  if (absl::Status s = owners_.Check(change.export_name, change.relative, change.source,
                                     OwningRequester(change.source, change.requester));
      !s.ok()) {
    return Refuse(change, s);
  }
  return absl::OkStatus();
}

absl::Status DestinationAuthority::Claim(const Change& change) {
  if (absl::Status s = CheckParties(change); !s.ok()) return s;
  if (absl::Status s = owners_.Claim(change.export_name, change.relative, change.source,
                                     OwningRequester(change.source, change.requester));
      !s.ok()) {
    return Refuse(change, s);
  }
  return absl::OkStatus();
}

void DestinationAuthority::Release(const Change& change) {
  owners_.Release(change.export_name, change.relative, change.source,
                  OwningRequester(change.source, change.requester));
}

void DestinationAuthority::Published(const Change& change) {
  owners_.Published(change.export_name, change.relative, change.source,
                    OwningRequester(change.source, change.requester));
}

absl::StatusOr<absl::flat_hash_set<std::string>> DestinationAuthority::Prunable(
    const Change& change, const std::string& parent) {
  Change published = change;
  published.published = true;  // its own destination exists now
  published.prunes = true;
  if (absl::Status s = CheckParties(published); !s.ok()) return s;
  return owners_.OwnedBelow(change.export_name, parent, change.source,
                            OwningRequester(change.source, change.requester));
}

void DestinationAuthority::Pruned(const std::string& export_name, const std::string& relative) {
  owners_.Forget(export_name, relative);
}

bool DestinationAuthority::MayCompareContent(const Change& change) {
  const std::string owning = OwningRequester(change.source, change.requester);
  if (owning.empty() && PullGranted(change).ok()) return true;
  if (owners_.Owns(change.export_name, change.relative, change.source, owning)) return true;
  return IsReader(change.export_name, change.source) &&
         (owning.empty() || IsReader(change.export_name, owning));
}

bool DestinationAuthority::MayNoteAbort(const std::string& site) const {
  return std::any_of(options_.exports.begin(), options_.exports.end(),
                     [&](const Options::Export& e) { return IsWriter(e.name, site); });
}

}  // namespace longhaul::peer
