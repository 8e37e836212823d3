#include "daemon/exchange/links.h"

#include <algorithm>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/check.h"
#include "common/fmt_absl.h"
#include "daemon/exchange/deadline.h"
#include "daemon/exchange/exchange_types.h"
#include "daemon/wire/messaging.h"
#include "spdlog/spdlog.h"

namespace longhaul::exchange {
namespace {

using Msg = v1::ExchangePeerMessage;

// How often Links looks whether a finished Send's bytes are all sent (a few
// per cent of a long-haul RTT), and how long it keeps bulk traffic paused
// for them at most: a link that has not drained by then is stalled, and bulk
// traffic may as well use the time.
constexpr absl::Duration kDrainPoll = absl::Milliseconds(1);
constexpr TimeDelta kDrainLimit = TimeDelta::Seconds(2);
// Refusals to and from one peer are logged at most this often.
constexpr TimeDelta kRefusalLogEvery = TimeDelta::Seconds(10);

// Whether a log last written at `logged` (unset: never) may be written again.
bool LogDue(const std::optional<Timestamp>& logged, Timestamp now) {
  return !logged || now - *logged >= kRefusalLogEvery;
}

// The share of the uplink the links of running collectives pace at together.
constexpr double kSharedUplinkHeadroom = 0.9;

}  // namespace

Links::Links(std::string local_site, Dialer dialer, peer::RateLimiter* limiter, LostFn on_lost,
             const Clock& clock, Bandwidth uplink)
    : local_site_(std::move(local_site)),
      dialer_(std::move(dialer)),
      limiter_(limiter),
      on_lost_(std::move(on_lost)),
      clock_(clock),
      uplink_(uplink),
      drain_thread_([this] { DrainLoop(); }) {}

Links::~Links() {
  Shutdown();
  drain_thread_.join();
}

std::shared_ptr<Links::Outbound> Links::Existing(const std::string& site) {
  absl::MutexLock lock(&mu_);
  auto it = outbound_.find(site);
  if (it != outbound_.end() && !it->second->broken.load()) return it->second;
  return nullptr;
}

bool Links::Linked(const std::string& site) { return Existing(site) != nullptr; }

absl::StatusOr<std::shared_ptr<Links::Outbound>> Links::LinkTo(const std::string& site) {
  if (auto link = Existing(site)) return link;
  absl::MutexLock dial_lock(&dial_mu_);
  if (auto link = Existing(site)) return link;
  {
    absl::MutexLock lock(&mu_);
    if (shutdown_) return absl::UnavailableError("the daemon is shutting down");
  }
  auto channel = dialer_(site);
  if (!channel.ok()) {
    return absl::UnavailableError(
        absl::StrCat("cannot reach ", site, ": ", channel.status().message()));
  }
  auto link = std::make_shared<Outbound>();
  link->channel = std::move(*channel);
  absl::MutexLock lock(&mu_);
  if (shutdown_) {
    link->channel->Abort();
    return absl::UnavailableError("the daemon is shutting down");
  }
  if (!uplink_.IsZero()) link->channel->LimitPacingRate(PacingOf(site));
  outbound_[site] = link;
  return link;
}

Links::UplinkShare::UplinkShare(Links& links, std::vector<std::string> sites)
    : links_(links), sites_(std::move(sites)) {
  absl::MutexLock lock(&links_.mu_);
  for (const std::string& site : sites_) ++links_.shares_[site];
  links_.Repace();
  // A collective is a burst of a second or so after an idle gap: the kernel
  // BBR's PROBE_RTT would otherwise stall a link for 200 ms in a round now
  // and then (docs/benchmarks.md, allreduce).
  for (const std::string& site : sites_) {
    auto it = links_.outbound_.find(site);
    if (it != links_.outbound_.end()) it->second->channel->RestartCongestionControlIfIdle();
  }
}

Links::UplinkShare::~UplinkShare() {
  absl::MutexLock lock(&links_.mu_);
  for (const std::string& site : sites_) {
    if (--links_.shares_[site] == 0) links_.shares_.erase(site);
  }
  links_.Repace();
}

Bandwidth Links::PacingOf(const std::string& site) {
  if (!shares_.contains(site)) return uplink_;
  // Together the shared links pace at kSharedUplinkHeadroom of the uplink,
  // so that the uplink's queue drains when its rate dips instead of
  // dropping the tail of a round (docs/benchmarks.md, allreduce).
  return Bandwidth::BitsPerSecond(
      static_cast<int64_t>(static_cast<double>(uplink_.ToBitsPerSecond()) * kSharedUplinkHeadroom /
                           static_cast<double>(shares_.size())));
}

void Links::Repace() {
  if (uplink_.IsZero()) return;
  for (const auto& [site, link] : outbound_) link->channel->LimitPacingRate(PacingOf(site));
}

void Links::Break(Outbound& link, const std::string& site, const absl::Status& why) {
  link.broken = true;
  link.channel->Abort();
  on_lost_(site, std::string(why.message()));
}

absl::Status Links::Send(const std::string& site, Msg header, absl::Span<const uint8_t> payload,
                         const std::atomic<bool>* stop, Timestamp deadline, const ReadyFn& ready,
                         const StageFn& stage) {
  auto link = LinkTo(site);
  if (!link.ok()) return link.status();
  header.set_msg_id(next_msg_id_.fetch_add(1));
  header.set_total_bytes(payload.size());
  // A message of several segments can still be stopped by a REFUSED notice.
  std::shared_ptr<Sending> sending;
  if (payload.size() > kSegmentBytes) {
    sending = std::make_shared<Sending>();
    sending->to = site;
    absl::MutexLock lock(&mu_);
    sending_[header.msg_id()] = sending;
  }
  absl::Cleanup unregister = [&] {
    if (!sending) return;
    absl::MutexLock lock(&mu_);
    sending_.erase(header.msg_id());
  };
  auto refusal = [&]() -> std::string {
    if (!sending) return "";
    absl::MutexLock lock(&mu_);
    return sending->refusal;
  };
  auto stopped = [&] {
    return (stop != nullptr && stop->load()) ||
           (!deadline.IsInfinite() && clock_.Now() >= deadline);
  };
  uint64_t offset = 0;
  do {
    const uint64_t n = std::min<uint64_t>(kSegmentBytes, payload.size() - offset);
    absl::Status stop_status;
    if (offset > 0) {
      if (std::string why = refusal(); !why.empty()) {
        stop_status =
            absl::ResourceExhaustedError(absl::StrCat(site, " refused the message: ", why));
      }
    }
    if (stop_status.ok() && ready && n > 0) stop_status = ready(offset + n);
    absl::Span<const uint8_t> bytes = payload.subspan(offset, n);
    if (stop_status.ok() && stage && n > 0) {
      absl::StatusOr<absl::Span<const uint8_t>> staged = stage(offset, n);
      if (staged.ok()) {
        LONGHAUL_CHECK(staged->size() == n) << "staged " << staged->size() << " of " << n;
        bytes = *staged;
      } else {
        stop_status = staged.status();
      }
    }
    // The operators' caps, charged per segment like a transfer's chunk.
    bool capped_out = false;
    if (stop_status.ok() && limiter_ != nullptr && n > 0 && !stopped()) {
      capped_out = !limiter_->Acquire(site, v1::EXCHANGE, n, stopped);
    }
    if (stop_status.ok() && (capped_out || stopped())) {
      stop_status = absl::CancelledError("stopped");
    }
    if (!stop_status.ok()) {
      if (offset > 0) {
        // Tell the peer to drop the segments it holds.
        Msg discard;
        discard.set_kind(Msg::DISCARD);
        discard.set_msg_id(header.msg_id());
        absl::MutexLock lock(&(*link)->write_mu);
        wire::SendProto(*(*link)->channel, wire::FrameType::kControl, 0, discard).IgnoreError();
      }
      return stop_status;
    }
    header.set_offset(offset);
    header.set_payload_bytes(n);
    absl::Status s;
    {
      absl::MutexLock lock(&(*link)->write_mu);
      s = wire::SendProto(*(*link)->channel, wire::FrameType::kControl, 0, header);
      if (s.ok() && n > 0) s = (*link)->channel->Write({bytes});
    }
    if (!s.ok()) {
      Break(**link, site, s);
      return absl::UnavailableError(absl::StrCat("sending to ", site, " failed: ", s.message()));
    }
    offset += n;
  } while (offset < payload.size());
  return absl::OkStatus();
}

void Links::Serve(std::unique_ptr<transport::Channel> channel, uint64_t max_message_bytes,
                  InboundSink& sink) {
  transport::ChannelRegistry::Registration registration = inbound_.Add(*channel);
  if (!registration) return;  // shut down
  const std::string site = channel->peer_site();
  spdlog::debug("exchange link from {} ({}) open", site, channel->peer_address());
  absl::Status status = ReadPeerMessages(*channel, max_message_bytes, sink);
  bool shutting_down;
  {
    absl::MutexLock lock(&mu_);
    shutting_down = shutdown_;
  }
  registration.Reset();
  if (!shutting_down) on_lost_(site, std::string(status.message()));
}

void Links::Refuse(const std::string& from, uint64_t msg_id, const absl::Status& why) {
  std::shared_ptr<Outbound> link;
  {
    absl::MutexLock lock(&mu_);
    RefusalLog& log = refusal_log_[from];
    const int limit = absl::StrContains(why.message(), "memory_per_peer") ? 1 : 0;
    ++log.refused[limit];
    const Timestamp now = clock_.Now();
    if (LogDue(log.refused_logged[limit], now)) {
      spdlog::warn("exchange: refused {} message(s) from {}: {}", log.refused[limit], from,
                   why.message());
      log.refused[limit] = 0;
      log.refused_logged[limit] = now;
    }
    // Only on a link this site already has: it dials no one for this.
    auto it = outbound_.find(from);
    if (it == outbound_.end() || it->second->broken.load()) return;
    link = it->second;
  }
  // The notice never blocks this reader: it is skipped while another
  // message is being written on the link or the link has bytes unsent (two
  // sites refusing each other's messages while neither reads would
  // otherwise wait on each other for good).
  if (!link->write_mu.TryLock()) return;
  absl::Status s;
  if (link->channel->UnsentBytes() == 0) {
    Msg notice;
    notice.set_kind(Msg::REFUSED);
    notice.set_msg_id(next_msg_id_.fetch_add(1));
    notice.set_refused_msg_id(msg_id);
    notice.set_reason(std::string(why.message()));
    s = wire::SendProto(*link->channel, wire::FrameType::kControl, 0, notice);
  }
  link->write_mu.Unlock();
  if (!s.ok()) Break(*link, from, s);
}

void Links::Refused(const std::string& from, const Msg& notice) {
  ++refusals_received_;
  const std::string reason(notice.reason().substr(0, 512));
  absl::MutexLock lock(&mu_);
  auto it = sending_.find(notice.refused_msg_id());
  if (it != sending_.end() && it->second->to == from) it->second->refusal = reason;
  RefusalLog& log = refusal_log_[from];
  ++log.refusals;
  const Timestamp now = clock_.Now();
  if (LogDue(log.refusals_logged, now)) {
    spdlog::warn("exchange: {} refused {} message(s) from this site: {}", from, log.refusals,
                 reason);
    log.refusals = 0;
    log.refusals_logged = now;
  }
}

void Links::HoldUntilSent(const std::string& site, peer::PriorityGate::Scope scope) {
  std::shared_ptr<Outbound> link = Existing(site);
  if (!link) return;
  absl::MutexLock lock(&drain_mu_);
  if (drain_stop_) return;
  draining_.push_back({std::move(link), std::move(scope), After(clock_.Now(), kDrainLimit)});
}

void Links::DrainLoop() {
  absl::MutexLock lock(&drain_mu_);
  auto has_work = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(drain_mu_) {
    return drain_stop_ || !draining_.empty();
  };
  while (true) {
    drain_mu_.Await(absl::Condition(&has_work));
    if (drain_stop_) break;
    const Timestamp now = clock_.Now();
    for (auto it = draining_.begin(); it != draining_.end();) {
      const bool done =
          it->link->broken.load() || now >= it->until || it->link->channel->UnsentBytes() == 0;
      it = done ? draining_.erase(it) : std::next(it);
    }
    if (!draining_.empty()) {
      drain_mu_.AwaitWithTimeout(absl::Condition(&drain_stop_), kDrainPoll);
    }
  }
  draining_.clear();
}

void Links::Drop(const std::string& site) {
  std::shared_ptr<Outbound> link;
  {
    absl::MutexLock lock(&mu_);
    if (shutdown_) return;
    if (auto it = outbound_.find(site); it != outbound_.end()) {
      link = it->second;
      outbound_.erase(it);
    }
  }
  if (link) {
    link->broken = true;
    link->channel->Abort();
  }
}

void Links::Shutdown() {
  {
    absl::MutexLock lock(&mu_);
    if (shutdown_) return;
    shutdown_ = true;
    // Abort only stops the socket, so it is safe under mu_.
    for (auto& [site, link] : outbound_) link->channel->Abort();
    absl::MutexLock drain_lock(&drain_mu_);
    drain_stop_ = true;
  }
  // Inbound channels stay alive while registered (their readers let go
  // once their channel fails).
  inbound_.Close();
  inbound_.WaitUntilEmpty();
}

}  // namespace longhaul::exchange
