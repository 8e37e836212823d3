#ifndef LONGHAUL_DAEMON_TRANSFER_FANOUT_SENDER_H_
#define LONGHAUL_DAEMON_TRANSFER_FANOUT_SENDER_H_

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "daemon/config.h"
#include "daemon/peer/priority_gate.h"
#include "daemon/peer/sender.h"
#include "daemon/peer/source_digests.h"
#include "daemon/transport/transport.h"
#include "longhaul/v1/journal.pb.h"
#include "storage/journal.h"

namespace longhaul::daemon {

// Ids of a fan-out's destinations: the first keeps the transfer's id, the
// others get "<id>.<n>".
std::string FanoutLegId(const std::string& transfer_id, int leg);

// The legs of a fan-out of `spec` (TransferSpec.also set, every destination
// at another site) under transfer id `transfer_id`, in chain order: the
// first is sent by the source, each other is relayed by the one before it.
std::vector<v1::FanoutLeg> PlanFanoutLegs(const std::string& transfer_id,
                                          const v1::TransferSpec& spec);

// Drives a fan-out transfer (record.legs): one peer::TransferSender per
// destination not yet published, all at once. The first destination gets
// the chunks from the source; every other is opened by the source naming
// the destination before it as its relay, and gets them from there (see
// daemon/transfer/relay.h). When a leg's attempt fails, the legs it relays to are
// bypassed: the source sends to them directly from then on, and they keep
// what the relay delivered. A relayed leg also bypasses its relay when it
// stalls (TransferSender::kRelayStall). Each destination publishes on its
// own when it holds everything; the transfer completes when all have.
// The source hands each relayed destination, over its own session, the
// digest of every chunk as it read it (peer::SourceDigests); a destination
// takes a relayed chunk only when it matches, and refuses the relay, which
// is then bypassed, when one does not.
//
// `progress` shows the destinations summed: bytes_total and bytes_done
// over all of them, bytes_sent what the source put on the wire for all.
class FanoutSender : public peer::OutgoingRun {
 public:
  // Everything referenced must outlive the sender.
  FanoutSender(const DaemonConfig& config, const transport::TransportSet& transports,
               peer::PriorityGate& gate, storage::Journal& journal, v1::OutgoingTransfer record,
               peer::TransferProgress& progress, peer::LinkObserver observer, const Clock& clock);
  ~FanoutSender() override;

  absl::Status Run() override;
  void Drain() override;
  void Stop() override;
  v1::OutgoingTransfer record() const override;
  std::vector<v1::FanoutLeg> legs() const override;
  void set_rate_limiter(peer::RateLimiter* limiter) override { rate_limiter_ = limiter; }

 private:
  struct Leg {
    explicit Leg(std::function<void()> on_change) : progress(std::move(on_change)) {}
    peer::TransferProgress progress;
    std::unique_ptr<peer::TransferSender> sender;
  };

  // The record leg `index` is sent under (its destination, id and relay).
  v1::OutgoingTransfer LegRecordLocked(int index) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Leg `index`'s attempt failed: the legs it relays to go direct.
  void OnLegAttemptFailed(int index, const absl::Status& status);
  // The files leg `index`'s relay destination took as unchanged (see
  // SenderOptions::relay_unchanged_files).
  std::optional<absl::flat_hash_set<uint32_t>> RelayUnchangedFiles(int index) const;
  // Sums the legs' progress into progress_.
  void Aggregate();
  // Leg `index` in the record, with its live progress.
  v1::FanoutLeg LegNowLocked(int index) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const DaemonConfig& config_;
  const transport::TransportSet transports_;
  peer::PriorityGate& gate_;
  storage::Journal& journal_;
  peer::TransferProgress& progress_;
  const peer::LinkObserver observer_;
  const Clock& clock_;
  peer::RateLimiter* rate_limiter_ = nullptr;
  // The chunk digests the legs read from the source, which the relayed legs
  // hand to their destinations so that a relay cannot forge a chunk.
  peer::SourceDigests source_digests_;
  std::atomic<bool> drain_{false};
  std::atomic<bool> stop_{false};

  mutable absl::Mutex mu_;
  v1::OutgoingTransfer record_ ABSL_GUARDED_BY(mu_);
  // By leg index; created in Run, never resized after.
  std::vector<std::unique_ptr<Leg>> legs_;
};

}  // namespace longhaul::daemon

#endif  // LONGHAUL_DAEMON_TRANSFER_FANOUT_SENDER_H_
