#include "daemon/transfer/relay.h"

#include <utility>

#include "common/fmt_absl.h"
#include "daemon/transfer/session_options.h"
#include "spdlog/spdlog.h"

namespace longhaul::daemon {

Relays::Relays(const DaemonConfig& config, const transport::TransportSet& transports,
               peer::PriorityGate& gate, storage::Journal& journal, peer::Receiver& receiver)
    : config_(config),
      transports_(transports),
      gate_(gate),
      journal_(journal),
      receiver_(receiver) {}

Relays::~Relays() { Shutdown(); }

void Relays::Set(const std::string& transfer_id, const v1::RelayTarget& target) {
  absl::MutexLock lock(&mu_);
  if (shut_down_) return;
  ReapFinishedLocked();
  auto it = relays_.find(transfer_id);
  std::shared_ptr<Relay> previous;
  if (it != relays_.end()) {
    const v1::RelayTarget& running = it->second->target;
    if (running.site() == target.site() && running.transfer_id() == target.transfer_id() &&
        !it->second->stopped && !it->second->finished.load()) {
      return;
    }
    it->second->stopped = true;
    if (it->second->sender) it->second->sender->Stop();
    if (target.site().empty()) return;  // reaped once it has stopped
    previous = std::move(it->second);
    relays_.erase(it);
  }
  if (target.site().empty()) return;
  auto relay = std::make_shared<Relay>();
  relay->target = target;
  Relay* raw = relay.get();
  relays_[transfer_id] = relay;
  raw->thread = std::thread([this, transfer_id, raw, previous = std::move(previous)]() mutable {
    Run(transfer_id, raw, std::move(previous));
  });
}

void Relays::ReapFinishedLocked() {
  for (auto it = relays_.begin(); it != relays_.end();) {
    auto next = std::next(it);
    if (it->second->finished.load()) {
      it->second->thread.join();
      relays_.erase(it);
    }
    it = next;
  }
}

void Relays::Run(const std::string& transfer_id, Relay* relay, std::shared_ptr<Relay> previous) {
  struct MarkFinished {
    Relay* relay;
    ~MarkFinished() { relay->finished.store(true); }
  } mark_finished{relay};
  if (previous) previous->thread.join();
  previous.reset();
  const v1::RelayTarget& target = relay->target;
  auto incoming = journal_.GetIncoming(transfer_id);
  if (!incoming.ok() || !*incoming) {
    spdlog::warn("relay of {} to {}: the transfer is not recorded here", transfer_id,
                 target.site());
    return;
  }
  v1::OutgoingTransfer record;
  record.set_id(target.transfer_id());
  record.mutable_spec()->set_dest_site(target.site());
  *record.mutable_manifest() = (*incoming)->manifest();
  record.set_single_file((*incoming)->single_file());

  peer::SenderOptions options = SenderOptionsFor(config_, target.site());
  options.relay_source = [this, transfer_id] {
    return std::make_unique<peer::Receiver::RelayReader>(receiver_, transfer_id);
  };
  options.relay_owner = (*incoming)->source_site();
  transport::Transport* control = transport::FindTransport(transports_, "tcp");
  transport::Transport* data = control;
  if (const PeerConfig* peer = config_.FindPeer(target.site())) {
    if (transport::Transport* t = transport::FindTransport(transports_, peer->transport)) data = t;
  }
  {
    absl::MutexLock lock(&mu_);
    if (shut_down_ || relay->stopped) {
      return;  // replaced or stopped before it started
    }
    relay->sender =
        std::make_unique<peer::TransferSender>(std::move(options), *control, *data, gate_, journal_,
                                               std::move(record), relay->progress, nullptr);
  }
  spdlog::info("transfer {}: relaying its chunks to {} (transfer {}) as they become durable",
               transfer_id, target.site(), target.transfer_id());
  const absl::Status result = relay->sender->Run();
  if (result.ok()) {
    spdlog::info("transfer {}: relay to {} done", transfer_id, target.site());
  } else if (!absl::IsCancelled(result)) {
    spdlog::warn("transfer {}: relay to {} ended: {}; the source sends to it directly", transfer_id,
                 target.site(), result.message());
  }
}

void Relays::Shutdown() {
  absl::flat_hash_map<std::string, std::shared_ptr<Relay>> relays;
  {
    absl::MutexLock lock(&mu_);
    if (shut_down_) return;
    shut_down_ = true;
    for (auto& [id, relay] : relays_) {
      if (relay->sender) relay->sender->Stop();
    }
    relays.swap(relays_);
  }
  for (auto& [id, relay] : relays) {
    if (relay->thread.joinable()) relay->thread.join();
  }
}

}  // namespace longhaul::daemon
