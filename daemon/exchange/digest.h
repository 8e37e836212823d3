#ifndef LONGHAUL_DAEMON_EXCHANGE_DIGEST_H_
#define LONGHAUL_DAEMON_EXCHANGE_DIGEST_H_

// The digests of the commit round (proto/EXCHANGE.md, Commit round): every
// member sends in its DONE the xxh3-128 of each part of its final buffer,
// and fails the op when a peer's differ from its own, naming the member
// that sent different members different bytes. So no two members that
// follow the protocol both succeed with different buffers, whatever a third
// one sends them.

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace longhaul::exchange {

// The length of one digest on the wire.
inline constexpr size_t kDigestBytes = 16;

// xxh3-128 of bytes fed in order, as kDigestBytes canonical (big-endian)
// bytes: the same as Digest() of their concatenation. Not thread-safe.
class StreamingDigest {
 public:
  StreamingDigest();
  ~StreamingDigest();
  StreamingDigest(StreamingDigest&&) noexcept;
  StreamingDigest& operator=(StreamingDigest&&) noexcept;

  void Update(absl::Span<const uint8_t> bytes);
  std::string Final() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

std::string Digest(absl::Span<const uint8_t> bytes);

// An op's final buffer as the commit round compares it: the digest of each
// part, and the member whose message put each part's bytes here (the
// owner: a shard's owner, an all-gather part's sender, the broadcast root),
// or "" where every member's input shaped it (the direct all-reduce).
struct FinalDigests {
  std::vector<std::string> parts;
  std::vector<std::string> owners;
  std::string noun;  // what a part is called in errors: "shard", "part"
};

// Compares `mine`, this site's (`local`), with theirs[i], the digests in
// peers[i]'s DONE. A peer that sent none (a build before digests) is not
// compared. A part that differs is blamed on its owner when the owner is
// neither this site nor that peer (both got it from the owner directly),
// else on that peer. DataLoss naming every member blamed; InvalidArgument
// for a DONE with the wrong number of digests or a digest of the wrong
// length. `what` names the op.
absl::Status CompareDigests(const std::string& what, const std::string& local,
                            const FinalDigests& mine, const std::vector<std::string>& peers,
                            const std::vector<std::vector<std::string>>& theirs);

}  // namespace longhaul::exchange

#endif  // LONGHAUL_DAEMON_EXCHANGE_DIGEST_H_
