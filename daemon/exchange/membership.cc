#include "daemon/exchange/membership.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/fmt_absl.h"
#include "spdlog/spdlog.h"

namespace longhaul::exchange {

using Msg = v1::ExchangePeerMessage;

bool Contains(const std::vector<std::string>& sites, const std::string& site) {
  return std::find(sites.begin(), sites.end(), site) != sites.end();
}

std::string Members(const std::vector<std::string>& members) {
  return absl::StrCat("[", absl::StrJoin(members, ", "), "]");
}

bool Group::HasMember(absl::string_view site) const {
  return std::find(members.begin(), members.end(), site) != members.end();
}

Group* Membership::Find(absl::string_view group) {
  auto it = groups_.find(group);
  return it == groups_.end() ? nullptr : it->second.get();
}

const Group* Membership::Find(absl::string_view group) const {
  auto it = groups_.find(group);
  return it == groups_.end() ? nullptr : it->second.get();
}

const Group* Membership::Formed(absl::string_view group) const {
  const Group* g = Find(group);
  return g != nullptr && g->formed ? g : nullptr;
}

uint64_t Membership::BeginJoin(const std::string& group, const std::vector<std::string>& sites) {
  auto& g = groups_[group];
  if (!g) {
    g = std::make_unique<Group>();
    g->name = group;
  }
  g->joining = sites;
  return g->generation + 1;
}

void Membership::EndJoin(const std::string& group, const std::vector<std::string>& sites) {
  if (Group* g = Find(group); g != nullptr && g->joining == sites) g->joining.clear();
}

const Group& Membership::Form(const std::string& group, const std::vector<std::string>& sites,
                              uint64_t generation) {
  Group& g = *groups_[group];
  g.members = sites;
  g.generation = generation;
  g.formed = true;
  g.finished.clear();
  g.joining.clear();
  return g;
}

void Membership::Leave(const std::string& group) { groups_.erase(group); }

bool Membership::Admits(const std::string& from, const Msg& header) const {
  if (header.kind() == Msg::JOIN) {
    const std::vector<std::string> sites(header.members().begin(), header.members().end());
    return Contains(sites, from) && Contains(sites, local_site_);
  }
  const Group* g = Find(header.group());
  if (g == nullptr) return true;
  if (Contains(g->joining, from)) return true;
  if (g->formed) return Contains(g->members, from);
  return g->joining.empty();
}

void Membership::PeerLost(const std::string& site, const std::string& reason) {
  for (auto& [name, g] : groups_) {
    if (!g->formed) continue;
    auto m = std::find(g->members.begin(), g->members.end(), site);
    if (m == g->members.end()) continue;
    g->members.erase(m);
    g->lost_after[g->generation] = {site, reason};
    ++g->generation;
    g->finished.clear();
    spdlog::warn("exchange group {}: lost {} ({}); now generation {} with {}", name, site, reason,
                 g->generation, Members(g->members));
  }
}

v1::GroupView Membership::ViewOf(const Group& g) const {
  v1::GroupView view;
  view.set_group(g.name);
  view.set_generation(g.generation);
  for (const auto& m : g.members) view.add_members(m);
  view.set_local_site(local_site_);
  return view;
}

LostPeer Membership::LostResult(const std::string& what, const Group& g,
                                uint64_t generation) const {
  std::string lost = "a peer";
  std::string why = "its link closed";
  for (uint64_t gen = generation; gen < g.generation; ++gen) {
    if (auto it = g.lost_after.find(gen); it != g.lost_after.end()) {
      lost = it->second.first;
      why = it->second.second;
      break;
    }
  }
  LostPeer r;
  r.lost_peer = lost;
  r.status = absl::UnavailableError(
      absl::StrCat(what, ": peer ", lost, " was lost (", why, "); group ", g.name,
                   " is now generation ", g.generation, " with ", Members(g.members), "; retry"));
  return r;
}

LostPeer Membership::LostMember(const std::string& what, const Group& g,
                                const std::string& peer) const {
  for (const auto& [gen, lost] : g.lost_after) {
    if (lost.first == peer) return LostResult(what, g, gen);
  }
  return {};
}

}  // namespace longhaul::exchange
