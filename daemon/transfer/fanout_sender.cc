#include "daemon/transfer/fanout_sender.h"

#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/fmt_absl.h"
#include "daemon/transfer/session_options.h"
#include "spdlog/spdlog.h"

namespace longhaul::daemon {

std::string FanoutLegId(const std::string& transfer_id, int leg) {
  return leg == 0 ? transfer_id : absl::StrCat(transfer_id, ".", leg);
}

std::vector<v1::FanoutLeg> PlanFanoutLegs(const std::string& transfer_id,
                                          const v1::TransferSpec& spec) {
  std::vector<v1::FanoutLeg> legs;
  v1::Destination first;
  first.set_site(spec.dest_site());
  first.set_export_name(spec.dest_export());
  first.set_path(spec.dest_path());
  std::vector<v1::Destination> destinations = {first};
  destinations.insert(destinations.end(), spec.also().begin(), spec.also().end());
  for (size_t i = 0; i < destinations.size(); ++i) {
    v1::FanoutLeg leg;
    leg.set_transfer_id(FanoutLegId(transfer_id, static_cast<int>(i)));
    *leg.mutable_destination() = destinations[i];
    leg.set_state(v1::QUEUED);
    if (i > 0) leg.set_relay_by(destinations[i - 1].site());
    legs.push_back(std::move(leg));
  }
  return legs;
}

FanoutSender::FanoutSender(const DaemonConfig& config, const transport::TransportSet& transports,
                           peer::PriorityGate& gate, storage::Journal& journal,
                           v1::OutgoingTransfer record, peer::TransferProgress& progress,
                           peer::LinkObserver observer, const Clock& clock)
    : config_(config),
      transports_(transports),
      gate_(gate),
      journal_(journal),
      progress_(progress),
      observer_(std::move(observer)),
      clock_(clock),
      record_(std::move(record)) {}

FanoutSender::~FanoutSender() = default;

v1::OutgoingTransfer FanoutSender::LegRecordLocked(int index) const {
  const v1::FanoutLeg& leg = record_.legs(index);
  v1::OutgoingTransfer r = record_;
  r.clear_legs();
  r.set_id(leg.transfer_id());
  v1::TransferSpec& spec = *r.mutable_spec();
  spec.set_dest_site(leg.destination().site());
  spec.set_dest_export(leg.destination().export_name());
  spec.set_dest_path(leg.destination().path());
  spec.clear_also();
  r.set_relay_by(leg.relay_by());
  r.set_bytes_sent(leg.bytes_sent());
  r.set_bytes_done(leg.bytes_done());
  for (int j = index + 1; j < record_.legs_size(); ++j) {
    const v1::FanoutLeg& next = record_.legs(j);
    if (next.relay_by() == leg.destination().site() && next.state() != v1::COMPLETED) {
      r.mutable_relay_to()->set_site(next.destination().site());
      r.mutable_relay_to()->set_transfer_id(next.transfer_id());
      break;
    }
  }
  return r;
}

absl::Status FanoutSender::Run() {
  int n;
  {
    absl::MutexLock lock(&mu_);
    n = record_.legs_size();
    legs_.clear();
    for (int i = 0; i < n; ++i) legs_.push_back(std::make_unique<Leg>([this] { Aggregate(); }));
    transport::Transport* control = transport::FindTransport(transports_, "tcp");
    transport::Transport* data = transport::FindTransport(transports_, record_.spec().transport());
    if (data == nullptr) data = control;
    // A destination published in an earlier run relays nothing: the legs
    // it relayed go direct.
    for (int i = 0; i < n; ++i) {
      if (record_.legs(i).state() != v1::COMPLETED) continue;
      for (v1::FanoutLeg& leg : *record_.mutable_legs()) {
        if (leg.relay_by() == record_.legs(i).destination().site()) leg.clear_relay_by();
      }
    }
    for (int i = 0; i < n; ++i) {
      if (record_.legs(i).state() == v1::COMPLETED) continue;
      const std::string& site = record_.legs(i).destination().site();
      peer::SenderOptions options = SenderOptionsFor(config_, site);
      options.clock = &clock_;
      options.source_digests = &source_digests_;
      options.on_attempt_failed = [this, i](const absl::Status& s) { OnLegAttemptFailed(i, s); };
      options.relay_unchanged_files = [this, i]() { return RelayUnchangedFiles(i); };
      options.persist = [this](const v1::OutgoingTransfer& leg_record, bool sync) {
        v1::OutgoingTransfer copy;
        {
          absl::MutexLock lock(&mu_);
          *record_.mutable_manifest() = leg_record.manifest();
          copy = record_;
        }
        return journal_.PutOutgoing(copy, sync);
      };
      legs_[i]->sender = std::make_unique<peer::TransferSender>(std::move(options), *control, *data,
                                                                gate_, journal_, LegRecordLocked(i),
                                                                legs_[i]->progress, observer_);
      legs_[i]->sender->set_rate_limiter(rate_limiter_);
      if (stop_.load()) legs_[i]->sender->Stop();
      if (drain_.load()) legs_[i]->sender->Drain();
      record_.mutable_legs(i)->set_state(v1::RUNNING);
    }
  }
  Aggregate();

  std::vector<absl::Status> results(n);
  std::vector<std::thread> threads;
  for (int i = 0; i < n; ++i) {
    if (!legs_[i]->sender) continue;
    threads.emplace_back([this, i, &results] {
      results[i] = legs_[i]->sender->Run();
      absl::MutexLock lock(&mu_);
      v1::FanoutLeg& leg = *record_.mutable_legs(i);
      *record_.mutable_manifest() = legs_[i]->sender->record().manifest();
      if (results[i].ok()) {
        leg.set_state(v1::COMPLETED);
        leg.clear_error();
        spdlog::info("transfer {}: published at {}", record_.id(), leg.destination().site());
      } else if (!absl::IsCancelled(results[i])) {
        leg.set_state(v1::FAILED);
        leg.set_error(std::string(results[i].message()));
      }
    });
  }
  for (std::thread& t : threads) t.join();
  Aggregate();

  absl::Status first = absl::OkStatus();
  bool cancelled = false;
  absl::MutexLock lock(&mu_);
  for (int i = 0; i < n; ++i) {
    if (results[i].ok()) continue;
    if (absl::IsCancelled(results[i])) {
      cancelled = true;
      continue;
    }
    if (first.ok()) {
      first = absl::Status(results[i].code(), absl::StrCat(record_.legs(i).destination().site(),
                                                           ": ", results[i].message()));
    }
  }
  if (!first.ok()) return first;
  if (cancelled) return absl::CancelledError("stopped");
  return absl::OkStatus();
}

void FanoutSender::OnLegAttemptFailed(int index, const absl::Status& status) {
  absl::MutexLock lock(&mu_);
  v1::FanoutLeg& failed = *record_.mutable_legs(index);
  // A relayed leg that fails (its relay stalled, or it cannot reach its
  // destination) goes direct, and its relay stops relaying to it.
  if (!failed.relay_by().empty()) {
    for (int k = 0; k < record_.legs_size(); ++k) {
      if (record_.legs(k).destination().site() == failed.relay_by() && legs_[k]->sender) {
        legs_[k]->sender->StopRelaying();
      }
    }
    spdlog::warn("transfer {}: {} (relayed by {}): {}; the source sends to it directly",
                 record_.id(), failed.destination().site(), failed.relay_by(), status.message());
    failed.clear_relay_by();
    legs_[index]->sender->BypassRelay();
  }
  // The legs it relays to go direct too: a relay that broke may have lost
  // what it was relaying.
  const std::string& site = failed.destination().site();
  for (int j = 0; j < record_.legs_size(); ++j) {
    v1::FanoutLeg& next = *record_.mutable_legs(j);
    if (next.relay_by() != site || !legs_[j]->sender) continue;
    spdlog::warn("transfer {}: relay {} failed ({}); sending to {} directly", record_.id(), site,
                 status.message(), next.destination().site());
    next.clear_relay_by();
    legs_[j]->sender->BypassRelay();
    legs_[index]->sender->StopRelaying();
  }
}

std::optional<absl::flat_hash_set<uint32_t>> FanoutSender::RelayUnchangedFiles(int index) const {
  peer::TransferSender* relay = nullptr;
  {
    absl::MutexLock lock(&mu_);
    const std::string& site = record_.legs(index).relay_by();
    for (int k = 0; k < index; ++k) {
      if (record_.legs(k).destination().site() == site) relay = legs_[k]->sender.get();
    }
  }
  if (relay == nullptr) return std::nullopt;
  return relay->unchanged_at_destination();
}

void FanoutSender::Aggregate() {
  peer::TransferProgress::Snapshot sum;
  {
    absl::MutexLock lock(&mu_);
    for (size_t i = 0; i < legs_.size(); ++i) {
      const v1::FanoutLeg leg = LegNowLocked(static_cast<int>(i));
      sum.bytes_total += leg.bytes_total();
      sum.bytes_done += leg.bytes_done();
      sum.bytes_sent += leg.bytes_sent();
      if (!legs_[i]->sender) continue;
      const peer::TransferProgress::Snapshot s = legs_[i]->progress.Get();
      sum.chunks_total += s.chunks_total;
      sum.chunks_done += s.chunks_done;
      sum.resent_bytes += s.resent_bytes;
      sum.files_unchanged = std::max(sum.files_unchanged, s.files_unchanged);
      sum.active_streams += s.active_streams;
      sum.attempts = std::max(sum.attempts, s.attempts);
      if (sum.error.empty() && !s.error.empty()) {
        sum.error = absl::StrCat(leg.destination().site(), ": ", s.error);
      }
    }
  }
  progress_.Update([&](peer::TransferProgress::Snapshot& s) { s = sum; });
}

v1::FanoutLeg FanoutSender::LegNowLocked(int index) const {
  v1::FanoutLeg leg = record_.legs(index);
  if (index < static_cast<int>(legs_.size()) && legs_[index]->sender) {
    const peer::TransferProgress::Snapshot s = legs_[index]->progress.Get();
    leg.set_bytes_total(s.bytes_total);
    leg.set_bytes_done(s.bytes_done);
    leg.set_bytes_sent(std::max(leg.bytes_sent(), s.bytes_sent));
    if (leg.state() == v1::RUNNING) leg.set_error(s.error);
  }
  return leg;
}

std::vector<v1::FanoutLeg> FanoutSender::legs() const {
  absl::MutexLock lock(&mu_);
  std::vector<v1::FanoutLeg> legs;
  for (int i = 0; i < record_.legs_size(); ++i) legs.push_back(LegNowLocked(i));
  return legs;
}

v1::OutgoingTransfer FanoutSender::record() const {
  absl::MutexLock lock(&mu_);
  v1::OutgoingTransfer r = record_;
  uint64_t sent = 0;
  for (int i = 0; i < r.legs_size(); ++i) {
    *r.mutable_legs(i) = LegNowLocked(i);
    sent += r.legs(i).bytes_sent();
  }
  r.set_bytes_sent(std::max(r.bytes_sent(), sent));
  return r;
}

void FanoutSender::Drain() {
  drain_.store(true);
  absl::MutexLock lock(&mu_);
  for (auto& leg : legs_) {
    if (leg->sender) leg->sender->Drain();
  }
}

void FanoutSender::Stop() {
  stop_.store(true);
  absl::MutexLock lock(&mu_);
  for (auto& leg : legs_) {
    if (leg->sender) leg->sender->Stop();
  }
}

}  // namespace longhaul::daemon
