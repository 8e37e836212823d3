#ifndef LONGHAUL_DAEMON_PEER_DESTINATION_OWNERS_H_
#define LONGHAUL_DAEMON_PEER_DESTINATION_OWNERS_H_

#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "longhaul/v1/journal.pb.h"

namespace longhaul::peer {

// Which peer site published each destination of this site's exports, so
// that sites sharing an export as writers cannot touch each other's data.
// A publisher is the sending site and, for a third-party copy, the site on
// whose request it sent (`requester`; "" for the sender's own push and for
// a pull, which this site asked for). The rule: a publisher may publish a
// destination only if no destination that another publisher published, and
// that still exists, is the same path, lies above it (the new one would be
// written inside it) or below it (the new one would replace it). A site
// alone and the same site on another site's request are different
// publishers. The owner of a path is the publisher whose publish there was
// journaled last (IncomingTransfer.source_site and requested_by).
//
// Built from the journal's PUBLISHED records at first use, then kept up to
// date by the receiver (Published). A publish first claims its path
// (Claim), so two sites racing for overlapping paths cannot both pass the
// check.
//
// Thread-safe. The callbacks run under the internal lock and must not call
// back into this object.
class DestinationOwners {
 public:
  // Reads every incoming transfer from the journal.
  using Loader = std::function<absl::StatusOr<std::vector<v1::IncomingTransfer>>()>;
  // Whether destination `relative` of export `export_name` still exists.
  // Must answer true when it cannot tell, so that a doubt refuses.
  using ExistsFn = std::function<bool(const std::string& export_name, const std::string& relative)>;

  DestinationOwners(Loader load, ExistsFn exists);

  // OK when `site` (on `requester`'s request, if not "") may publish at
  // `relative` (clean and '/'-separated, as storage::ResolveDestination
  // gives it) in `export_name`. Otherwise PermissionDenied naming the
  // publisher of the conflicting destination; Unavailable (worth retrying)
  // while another publisher's claim on an overlapping path is held, or when
  // the journal cannot be read.
  absl::Status Check(const std::string& export_name, const std::string& relative,
                     const std::string& site, const std::string& requester = "");

  // Check, and on OK holds the path for the publisher until Release:
  // meanwhile other publishers' checks of overlapping paths answer
  // Unavailable.
  absl::Status Claim(const std::string& export_name, const std::string& relative,
                     const std::string& site, const std::string& requester = "");
  void Release(const std::string& export_name, const std::string& relative, const std::string& site,
               const std::string& requester = "");

  // The publisher published `relative` (journaled PUBLISHED): it owns it now.
  void Published(const std::string& export_name, const std::string& relative,
                 const std::string& site, const std::string& requester = "");
  // The destination is gone (retention removed it).
  void Forget(const std::string& export_name, const std::string& relative);

  // Whether the publisher published `relative` itself or a directory above
  // it, and that publish is still its own (what sync --checksum may compare
  // for it: it sent those bytes). False when the journal cannot be read.
  bool Owns(const std::string& export_name, const std::string& relative, const std::string& site,
            const std::string& requester = "");

  // The names directly below `parent_relative` ("" for the export root) that
  // the publisher owns: what its retention may prune there.
  absl::StatusOr<absl::flat_hash_set<std::string>> OwnedBelow(const std::string& export_name,
                                                              const std::string& parent_relative,
                                                              const std::string& site,
                                                              const std::string& requester = "");

 private:
  // Keys are export name, '\0', relative path: the paths below "a/b" of one
  // export are the keys in ["...a/b/", "...a/b0"), since '0' follows '/'.
  static std::string Key(const std::string& export_name, const std::string& relative);
  absl::Status LoadLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  struct Publisher {
    std::string site;
    std::string requester;
    bool operator==(const Publisher&) const = default;
    // "site-a", or "site-a on site-c's request".
    std::string ToString() const;
  };
  absl::Status CheckLocked(const std::string& export_name, const std::string& relative,
                           const Publisher& publisher) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Loader load_;
  const ExistsFn exists_;
  absl::Mutex mu_;
  bool loaded_ ABSL_GUARDED_BY(mu_) = false;
  std::map<std::string, Publisher> owners_ ABSL_GUARDED_BY(mu_);  // key -> publisher
  // key -> (publisher, number of claims it holds there).
  std::map<std::string, std::pair<Publisher, int>> claims_ ABSL_GUARDED_BY(mu_);
};

}  // namespace longhaul::peer

#endif  // LONGHAUL_DAEMON_PEER_DESTINATION_OWNERS_H_
