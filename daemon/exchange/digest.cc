#include "daemon/exchange/digest.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "storage/xxh3.h"

namespace longhaul::exchange {

struct StreamingDigest::State {
  XXH3_state_t xxh;
};

StreamingDigest::StreamingDigest() : state_(std::make_unique<State>()) {
  XXH3_INITSTATE(&state_->xxh);
  XXH3_128bits_reset(&state_->xxh);
}
StreamingDigest::~StreamingDigest() = default;
StreamingDigest::StreamingDigest(StreamingDigest&&) noexcept = default;
StreamingDigest& StreamingDigest::operator=(StreamingDigest&&) noexcept = default;

void StreamingDigest::Update(absl::Span<const uint8_t> bytes) {
  if (!bytes.empty()) XXH3_128bits_update(&state_->xxh, bytes.data(), bytes.size());
}

std::string StreamingDigest::Final() const {
  XXH128_canonical_t canonical;
  XXH128_canonicalFromHash(&canonical, XXH3_128bits_digest(&state_->xxh));
  return std::string(reinterpret_cast<const char*>(canonical.digest), sizeof canonical.digest);
}

std::string Digest(absl::Span<const uint8_t> bytes) {
  StreamingDigest d;
  d.Update(bytes);
  return d.Final();
}

absl::Status CompareDigests(const std::string& what, const std::string& local,
                            const FinalDigests& mine, const std::vector<std::string>& peers,
                            const std::vector<std::vector<std::string>>& theirs) {
  std::vector<std::string> blamed;
  std::string first_reason;
  for (size_t i = 0; i < peers.size(); ++i) {
    const std::vector<std::string>& d = theirs[i];
    if (d.empty()) continue;  // a build before digests
    if (d.size() != mine.parts.size()) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": ", peers[i], " sent ", d.size(),
                                                     " digests in its DONE, this site has ",
                                                     mine.parts.size()));
    }
    for (size_t k = 0; k < d.size(); ++k) {
      if (d[k].size() != kDigestBytes) {
        return absl::InvalidArgumentError(absl::StrCat(what, ": ", peers[i], " sent a digest of ",
                                                       d[k].size(), " bytes in its DONE"));
      }
    }
    // Owned parts first: a part no one owns (a result every input shaped)
    // differs because of an owned one when one does.
    bool owned_differs = false;
    for (size_t k = 0; k < d.size(); ++k) {
      const std::string& owner = mine.owners[k];
      if (d[k] == mine.parts[k] || (owner.empty() && owned_differs)) continue;
      owned_differs = owned_differs || !owner.empty();
      std::string culprit = peers[i];
      std::string reason;
      if (owner.empty()) {
        reason = absl::StrCat(peers[i], "'s result differs from this site's");
      } else if (owner == peers[i]) {
        reason = absl::StrCat(peers[i], " holds other bytes of its ", mine.noun,
                              " than it sent this site");
      } else if (owner == local) {
        reason = absl::StrCat(peers[i], " holds other bytes of this site's ", mine.noun,
                              " than this site sent");
      } else {
        culprit = owner;
        reason = absl::StrCat(owner, " sent different members different bytes of its ", mine.noun,
                              " (", peers[i], " holds other bytes than this site)");
      }
      if (first_reason.empty()) first_reason = std::move(reason);
      if (std::find(blamed.begin(), blamed.end(), culprit) == blamed.end())
        blamed.push_back(culprit);
    }
  }
  if (blamed.empty()) return absl::OkStatus();
  std::sort(blamed.begin(), blamed.end());
  return absl::DataLossError(absl::StrCat(what, ": the members' results differ, because of ",
                                          absl::StrJoin(blamed, ", "), ": ", first_reason));
}

}  // namespace longhaul::exchange
