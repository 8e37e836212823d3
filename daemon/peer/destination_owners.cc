#include "daemon/peer/destination_owners.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/fmt_absl.h"
#include "spdlog/spdlog.h"

namespace longhaul::peer {
namespace {

// A journaled dest_path as storage::ResolveDestination cleans it ("" and
// "." components dropped); "" when it could never have been accepted.
std::string CleanRelative(const std::string& dest_path) {
  std::vector<absl::string_view> comps;
  for (absl::string_view comp : absl::StrSplit(dest_path, '/')) {
    if (comp.empty() || comp == ".") continue;
    if (comp == "..") return "";
    comps.push_back(comp);
  }
  return absl::StrJoin(comps, "/");
}

std::string RelativeOf(const std::string& key) { return key.substr(key.find('\0') + 1); }

}  // namespace

DestinationOwners::DestinationOwners(Loader load, ExistsFn exists)
    : load_(std::move(load)), exists_(std::move(exists)) {}

std::string DestinationOwners::Publisher::ToString() const {
  return requester.empty() ? site : absl::StrCat(site, " on ", requester, "'s request");
}

std::string DestinationOwners::Key(const std::string& export_name, const std::string& relative) {
  return absl::StrCat(export_name, std::string(1, '\0'), relative);
}

absl::Status DestinationOwners::LoadLocked() {
  if (loaded_) return absl::OkStatus();
  absl::StatusOr<std::vector<v1::IncomingTransfer>> records = load_();
  if (!records.ok()) {
    return absl::UnavailableError(absl::StrCat(
        "cannot read from the journal which site published what: ", records.status().message()));
  }
  std::stable_sort(records->begin(), records->end(),
                   [](const v1::IncomingTransfer& a, const v1::IncomingTransfer& b) {
                     return a.created_unix_ms() < b.created_unix_ms();
                   });
  for (const v1::IncomingTransfer& r : *records) {
    if (r.state() != v1::IncomingTransfer::PUBLISHED || r.export_name().empty()) continue;
    const std::string relative = CleanRelative(r.dest_path());
    if (relative.empty()) continue;
    owners_[Key(r.export_name(), relative)] = {r.source_site(), r.requested_by()};
  }
  loaded_ = true;
  return absl::OkStatus();
}

absl::Status DestinationOwners::CheckLocked(const std::string& export_name,
                                            const std::string& relative,
                                            const Publisher& publisher) {
  if (absl::Status s = LoadLocked(); !s.ok()) return s;
  const std::string site = publisher.ToString();
  // The refusal goes to the asking sites: another publisher is named only
  // to a site that is part of it. This site's log names it always.
  auto name_for_asker = [&](const Publisher& other) {
    const bool shared = other.site == publisher.site || other.site == publisher.requester ||
                        (!other.requester.empty() && (other.requester == publisher.site ||
                                                      other.requester == publisher.requester));
    return shared ? other.ToString() : std::string("another site");
  };
  auto denied = [&](const Publisher& owner, const std::string& theirs) {
    spdlog::info("{} may not publish {}:{}: {}:{} was published by {}", site, export_name, relative,
                 export_name, theirs, owner.ToString());
    return absl::PermissionDeniedError(
        absl::StrCat(site, " may not publish ", export_name, ":", relative, ": ", export_name, ":",
                     theirs, " was published by ", name_for_asker(owner),
                     ", and a site replaces or writes inside only what it "
                     "published itself"));
  };
  auto busy = [&](const Publisher& other, const std::string& theirs) {
    return absl::UnavailableError(absl::StrCat(name_for_asker(other), " is publishing ",
                                               export_name, ":", theirs, " now; ", site,
                                               " may try again once it is done"));
  };
  // The destination itself and every directory above it.
  std::vector<std::string> above;
  for (size_t slash = relative.find('/'); slash != std::string::npos;
       slash = relative.find('/', slash + 1)) {
    above.push_back(relative.substr(0, slash));
  }
  above.push_back(relative);
  for (const std::string& path : above) {
    const std::string key = Key(export_name, path);
    if (auto it = claims_.find(key); it != claims_.end() && !(it->second.first == publisher)) {
      return busy(it->second.first, path);
    }
    auto it = owners_.find(key);
    if (it == owners_.end() || it->second == publisher) continue;
    if (exists_(export_name, path)) return denied(it->second, path);
    owners_.erase(it);  // gone: nobody holds that path any more
  }
  // Everything below it.
  const std::string from = Key(export_name, relative + "/");
  const std::string to = Key(export_name, relative + "0");
  for (auto it = claims_.lower_bound(from); it != claims_.end() && it->first < to; ++it) {
    if (!(it->second.first == publisher)) return busy(it->second.first, RelativeOf(it->first));
  }
  for (auto it = owners_.lower_bound(from); it != owners_.end() && it->first < to;) {
    if (it->second == publisher) {
      ++it;
      continue;
    }
    const std::string theirs = RelativeOf(it->first);
    if (exists_(export_name, theirs)) return denied(it->second, theirs);
    it = owners_.erase(it);
  }
  return absl::OkStatus();
}

absl::Status DestinationOwners::Check(const std::string& export_name, const std::string& relative,
                                      const std::string& site, const std::string& requester) {
  absl::MutexLock lock(&mu_);
  return CheckLocked(export_name, relative, {site, requester});
}

absl::Status DestinationOwners::Claim(const std::string& export_name, const std::string& relative,
                                      const std::string& site, const std::string& requester) {
  absl::MutexLock lock(&mu_);
  const Publisher publisher{site, requester};
  if (absl::Status s = CheckLocked(export_name, relative, publisher); !s.ok()) return s;
  auto& claim = claims_[Key(export_name, relative)];
  claim.first = publisher;
  ++claim.second;
  return absl::OkStatus();
}

void DestinationOwners::Release(const std::string& export_name, const std::string& relative,
                                const std::string& site, const std::string& requester) {
  absl::MutexLock lock(&mu_);
  auto it = claims_.find(Key(export_name, relative));
  if (it == claims_.end() || !(it->second.first == Publisher{site, requester})) return;
  if (--it->second.second == 0) claims_.erase(it);
}

void DestinationOwners::Published(const std::string& export_name, const std::string& relative,
                                  const std::string& site, const std::string& requester) {
  absl::MutexLock lock(&mu_);
  // Loading now reads this publish from the journal too; either way the
  // entry ends up naming the publisher.
  LoadLocked().IgnoreError();
  owners_[Key(export_name, relative)] = {site, requester};
}

void DestinationOwners::Forget(const std::string& export_name, const std::string& relative) {
  absl::MutexLock lock(&mu_);
  owners_.erase(Key(export_name, relative));
}

bool DestinationOwners::Owns(const std::string& export_name, const std::string& relative,
                             const std::string& site, const std::string& requester) {
  absl::MutexLock lock(&mu_);
  if (!LoadLocked().ok()) return false;
  const Publisher publisher{site, requester};
  for (size_t end = relative.find('/');; end = relative.find('/', end + 1)) {
    auto it = owners_.find(Key(export_name, relative.substr(0, end)));
    if (it != owners_.end() && it->second == publisher) return true;
    if (end == std::string::npos) return false;
  }
}

absl::StatusOr<absl::flat_hash_set<std::string>> DestinationOwners::OwnedBelow(
    const std::string& export_name, const std::string& parent_relative, const std::string& site,
    const std::string& requester) {
  absl::MutexLock lock(&mu_);
  if (absl::Status s = LoadLocked(); !s.ok()) return s;
  const std::string prefix = parent_relative.empty() ? "" : parent_relative + "/";
  const std::string from = Key(export_name, prefix);
  absl::flat_hash_set<std::string> names;
  for (auto it = owners_.lower_bound(from);
       it != owners_.end() && it->first.compare(0, from.size(), from) == 0; ++it) {
    const std::string name = it->first.substr(from.size());
    if (name.empty() || name.find('/') != std::string::npos ||
        !(it->second == Publisher{site, requester})) {
      continue;
    }
    names.insert(name);
  }
  return names;
}

}  // namespace longhaul::peer
