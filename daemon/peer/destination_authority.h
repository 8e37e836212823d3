#ifndef LONGHAUL_DAEMON_PEER_DESTINATION_AUTHORITY_H_
#define LONGHAUL_DAEMON_PEER_DESTINATION_AUTHORITY_H_

#include <functional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "daemon/peer/destination_owners.h"
#include "longhaul/v1/journal.pb.h"

namespace longhaul::peer {

// The one decision on every change an incoming transfer makes at this site:
// creating or replacing its destination (open, commit), pruning old
// checkpoints beside it (`sync --keep`, after publish) and noting an abort.
// Every Receiver handler asks it; none decides by itself.
//
// A change is checked against every site whose authority it uses:
//  - the source (the peer on the connection, which sends and publishes):
//    one of the export's `writers`, or the source of a pull this site
//    issued, which grants that one destination path, that one transfer and
//    never pruning, and only while the pull's requester (a local user) may
//    write that path itself;
//  - the requester the source names in its open (OpenRequest.requested_by):
//    for a pull, this site, whose authority is the pull's grant (so a pull
//    never prunes either); for a third-party copy, another site, which
//    must be one of the export's writers to replace or prune anything. A
//    requester that is not may only create a path that does not exist yet.
// Naming a requester only adds checks: the source's own rights are always
// needed too. Then DestinationOwners: a publisher (source, and the
// requester of a third-party copy) replaces, writes inside or prunes only
// what the same publisher published.
//
// Refusals are PermissionDenied (Unavailable while another publish holds an
// overlapping path), worded with what to change at which site; each is
// logged and reported to Options::refused.
//
// Thread-safe (the callbacks must be).
class DestinationAuthority {
 public:
  struct Change;
  using PullGrant = std::function<absl::Status(const Change& change)>;

  // One change and the sites whose authority it uses.
  struct Change {
    std::string source{};     // the peer on the connection
    std::string requester{};  // OpenRequest.requested_by; "" for a push
    std::string export_name{};
    std::string dest_path{};  // as opened: what a pull grant names
    std::string relative{};   // as storage::ResolveDestination cleaned it
    std::string transfer_id{};
    bool prunes = false;  // keep_checkpoints on a tree: pruning after publish
    // The transfer's own publish is there already (an open again after its
    // sender missed the commit answer): nothing is written.
    bool published = false;

    // The change `record` makes at `relative`.
    static Change Of(const v1::IncomingTransfer& record, const std::string& relative);
  };

  struct Options {
    // This site, named in refusals and as the requester of its pulls.
    std::string local_site;
    // This site's exports and, for each, the sites that may send into it
    // (`writers`). An export not listed is not decided here: resolving
    // the destination refuses it.
    struct Export {
      std::string name;
      std::vector<std::string> writers;
      std::vector<std::string> readers{};  // may fetch from it (pull)
    };
    std::vector<Export> exports;
    // Whether the change is one of a pull this site issued: OK when
    // transfer `transfer_id` of `source` is a pull into `dest_path` of the
    // export that still runs and whose requester (the local user or token
    // that asked for it) may write there now; NotFound when there is no
    // such pull; PermissionDenied, saying why, when its requester may not
    // write there (a change that is `published` writes nothing: only the
    // pull counts). Null: no pulls.
    PullGrant pull_granted;
    // Told of each PermissionDenied: the source site and the export.
    std::function<void(const std::string& site, const std::string& export_name)> refused;
  };

  // `load` and `exists` are DestinationOwners'.
  DestinationAuthority(Options options, DestinationOwners::Loader load,
                       DestinationOwners::ExistsFn exists);

  // Open, before the destination is resolved: may the source write into the
  // change's export at all (one of its writers, or this path's pull grant)?
  // A missing export is refused in the same words as one that does not
  // list the source, which is told only the exports it may write.
  absl::Status MayWriteInto(const Change& change) const;
  // Open: may the change create or replace its destination (and later prune)?
  absl::Status MayWrite(const Change& change);
  // Commit: MayWrite again (the config or the destination may have changed
  // since the open), and on OK holds the destination for the publish until
  // Release.
  absl::Status Claim(const Change& change);
  void Release(const Change& change);
  // Fan-out: may `relay` send the chunks of the change (one of the
  // export's writers, or granted this transfer by a pull)? It publishes
  // nothing; the change's owner does.
  absl::Status MayRelay(const Change& change, const std::string& relay) const;
  // The change was published (journaled PUBLISHED).
  void Published(const Change& change);
  // After a publish: the names directly below `parent` that its pruning may
  // remove (those its publisher published), or the refusal if the change
  // may not prune (any more).
  absl::StatusOr<absl::flat_hash_set<std::string>> Prunable(const Change& change,
                                                            const std::string& parent);
  // Pruning removed `relative`.
  void Pruned(const std::string& export_name, const std::string& relative);

  // sync --checksum: may the change's parties learn whether the files at
  // its destination hold the content they name? Only where they could
  // know it anyway: a destination its publisher (source, and the requester
  // of a third-party copy) published itself, an export every party may
  // read, or this site's own pull. Otherwise the destination's files are
  // not read for them, and every file is sent.
  bool MayCompareContent(const Change& change);

  // May `site` leave a record of an abort of a transfer never opened here
  // (so that a late open is refused)? Only a site that may write somewhere.
  bool MayNoteAbort(const std::string& site) const;

  // The requester a publish is owned with: a third-party copy's requester;
  // "" for a push and for a pull (this site asked for it).
  std::string OwningRequester(const std::string& source, const std::string& requester) const;

 private:
  // The source's own right to write the change's path: a writer, or this
  // transfer's pull grant.
  absl::Status CheckSource(const Change& change) const;
  // The source's and the requester's rights, and pruning; not ownership.
  absl::Status CheckParties(const Change& change) const;
  const Options::Export* FindExport(const std::string& name) const;
  bool IsWriter(const std::string& export_name, const std::string& site) const;
  bool IsReader(const std::string& export_name, const std::string& site) const;
  // options_.pull_granted's verdict; NotFound without one.
  absl::Status PullGranted(const Change& change) const;
  absl::Status Refuse(const Change& change, absl::Status status) const;
  // Refuses a change whose pull grant refused (`granted`, not NotFound).
  absl::Status RefusePull(const Change& change, const absl::Status& granted) const;

  const Options options_;
  DestinationOwners owners_;
  const DestinationOwners::ExistsFn exists_;
};

}  // namespace longhaul::peer

#endif  // LONGHAUL_DAEMON_PEER_DESTINATION_AUTHORITY_H_
