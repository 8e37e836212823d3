#ifndef LONGHAUL_DAEMON_EXCHANGE_MEMBERSHIP_H_
#define LONGHAUL_DAEMON_EXCHANGE_MEMBERSHIP_H_

// The groups this site belongs to: their members, generations and the peers
// each generation lost, and the rule for whose messages a group takes
// (proto/EXCHANGE.md, Groups and Membership). No I/O, no threads, no clock:
// the join round that sends JOIN and waits for the peers' is in
// Operations::Join, and link loss reaches here as PeerLost.
//
// Not thread-safe. The hub keeps it under its state mutex (HubState::mu)
// together with the mailbox, because a message's admission and its filing
// must be one step against a Join forming the group.

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "longhaul/v1/exchange.pb.h"

namespace longhaul::exchange {

struct Group {
  std::string name;
  std::vector<std::string> members;  // sorted, local site included
  uint64_t generation = 0;
  bool formed = false;
  // The sites of a Join in progress here (sorted), else empty.
  std::vector<std::string> joining;
  // The peer whose loss ended each generation, and why.
  absl::flat_hash_map<uint64_t, std::pair<std::string, std::string>> lost_after;
  // All-reduce sequence numbers already finished here: late messages for
  // them are dropped, not kept.
  absl::flat_hash_set<uint64_t> finished;

  bool HasMember(absl::string_view site) const;
};

// The loss that moved a group past a generation.
struct LostPeer {
  absl::Status status;  // Unavailable, naming the peer and the group's new state
  std::string lost_peer;
};

class Membership {
 public:
  explicit Membership(std::string local_site) : local_site_(std::move(local_site)) {}

  const std::string& local_site() const { return local_site_; }

  // The group, or null when this site never joined it (or left).
  Group* Find(absl::string_view group);
  const Group* Find(absl::string_view group) const;
  // The group formed here, or null.
  const Group* Formed(absl::string_view group) const;

  // A Join of `sites` (sorted) begins: from now on their messages for the
  // group are taken. Returns this site's proposed generation.
  uint64_t BeginJoin(const std::string& group, const std::vector<std::string>& sites);
  // The Join of `sites` ended without forming the group.
  void EndJoin(const std::string& group, const std::vector<std::string>& sites);
  // The group formed with `sites` at `generation` (the largest proposal).
  const Group& Form(const std::string& group, const std::vector<std::string>& sites,
                    uint64_t generation);
  void Leave(const std::string& group);

  // Whether a message from `from` with `header` may be kept: JOIN from a
  // site its proposal names along with this one; anything else from a
  // member of the group as formed or joining here, or for a group not known
  // yet (the Join to come sorts it out).
  bool Admits(const std::string& from, const v1::ExchangePeerMessage& header) const;

  // `site`'s link broke: every formed group holding it drops it and moves
  // to the next generation.
  void PeerLost(const std::string& site, const std::string& reason);

  v1::GroupView ViewOf(const Group& g) const;
  // The error of an op `what` that saw `g` move past `generation`.
  LostPeer LostResult(const std::string& what, const Group& g, uint64_t generation) const;
  // The loss of `peer`, if it was a member of `g` once; else nullopt-like
  // (status ok).
  LostPeer LostMember(const std::string& what, const Group& g, const std::string& peer) const;

 private:
  const std::string local_site_;
  absl::flat_hash_map<std::string, std::unique_ptr<Group>> groups_;
};

// "[a, b, c]".
std::string Members(const std::vector<std::string>& members);
bool Contains(const std::vector<std::string>& sites, const std::string& site);

}  // namespace longhaul::exchange

#endif  // LONGHAUL_DAEMON_EXCHANGE_MEMBERSHIP_H_
