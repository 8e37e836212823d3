#include "daemon/exchange/exchange_hub.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <thread>

#include "absl/cleanup/cleanup.h"
#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "common/clock.h"
#include "common/fmt_absl.h"
#include "daemon/exchange/reduce.h"
#include "daemon/peer/messaging.h"
#include "spdlog/spdlog.h"

namespace longhaul::exchange {
namespace {

using Msg = v1::ExchangePeerMessage;

// Every deadline and elapsed time in the hub is on the monotonic clock, as an
// absl::Time counted from the Unix epoch but never read as a date, so a step
// of the wall clock neither fires nor postpones one. Mutex waits are given
// the remaining time (AwaitWithTimeout), never such a deadline.
absl::Time MonotonicNow() {
  return absl::UnixEpoch() + absl::Nanoseconds(RealClock::Get().Now().ToNanoseconds());
}

// How often a waiting op looks at things no mutex guards (its client).
constexpr absl::Duration kPoll = absl::Milliseconds(50);
// After an op gives up, how long its senders may take to reach a segment
// boundary before their links are cut.
constexpr absl::Duration kSenderGrace = absl::Seconds(2);
// A segment read into a waiting Recv's buffer goes in pieces of this size: a
// Recv that ends mid-message waits for the piece being read, so unless the
// link is below ~1 Mbit/s that takes well under kSenderGrace, after which
// the link would be cut.
constexpr uint64_t kInPlacePieceBytes = 256 << 10;
// How often the hub looks whether a finished Send's bytes are all sent (a
// few per cent of a long-haul RTT), and how long it keeps bulk traffic
// paused for them at most: a link that has not drained by then is stalled,
// and bulk traffic may as well use the time.
constexpr absl::Duration kDrainPoll = absl::Milliseconds(1);
constexpr absl::Duration kDrainLimit = absl::Seconds(2);
// Refusals to and from one peer are logged at most this often.
constexpr absl::Duration kRefusalLogEvery = absl::Seconds(10);

bool Contains(const std::vector<std::string>& sites, const std::string& site) {
  return std::find(sites.begin(), sites.end(), site) != sites.end();
}

std::string Members(const std::vector<std::string>& members) {
  return absl::StrCat("[", absl::StrJoin(members, ", "), "]");
}

// A broken internal invariant (STYLE.md, Errors); Debian's abseil has no absl/log.
[[noreturn]] void Broken(const char* what) {
  spdlog::critical("exchange hub: {}", what);
  std::abort();
}

std::string DurationText(absl::Duration d) { return absl::FormatDuration(absl::Trunc(d, absl::Milliseconds(1))); }

// Waits until the client of a streamed Send has written the first `end` of
// its `total` buffer bytes (longhaul/shm_progress.h). The client writes at
// memory speed, far ahead of the link, so this waits only for the first
// segment unless the client stalls: it naps from 20 us up to 1 ms. Cancelled
// once `stop` is set; DeadlineExceeded at `deadline`; Aborted once
// `client_gone` (asked every kPoll) says the client has gone away.
absl::Status WaitFilled(const shm::ProgressWord& word, uint64_t end, uint64_t total,
                        absl::Time deadline, const std::atomic<bool>& stop,
                        const std::function<bool()>& client_gone) {
  absl::Duration nap = absl::Microseconds(20);
  absl::Time next_look = MonotonicNow() + kPoll;
  while (true) {
    const uint64_t ready = word.Ready();
    if (ready >= end) return absl::OkStatus();
    if (stop.load()) return absl::CancelledError("stopped");
    const absl::Time now = MonotonicNow();
    if (now >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "its client had written only ", ready, " of the ", total, " bytes of the buffer"));
    }
    if (client_gone && now >= next_look) {
      if (client_gone()) {
        return absl::AbortedError(absl::StrCat("its client went away after writing ", ready,
                                               " of the ", total, " bytes of the buffer"));
      }
      next_look = now + kPoll;
    }
    absl::SleepFor(std::min(nap, deadline - now));
    nap = std::min(nap * 2, absl::Milliseconds(1));
  }
}

}  // namespace

struct ExchangeHub::Outbound {
  std::unique_ptr<transport::Channel> channel;
  absl::Mutex write_mu;
  std::atomic<bool> broken{false};
};

struct ExchangeHub::Draining {
  std::shared_ptr<Outbound> link;
  peer::PriorityGate::Scope scope;
  absl::Time until;
};

struct ExchangeHub::PeerUse {
  std::atomic<uint32_t> messages{0};
  // Refusals of this peer's messages (by the limit on messages, by bytes),
  // and of ours by it, not yet logged, and when each was last logged.
  // Guarded by the hub's mu_.
  uint64_t refused[2] = {0, 0};
  absl::Time refused_logged[2] = {absl::InfinitePast(), absl::InfinitePast()};
  uint64_t refusals = 0;
  absl::Time refusals_logged = absl::InfinitePast();
};

// One unclaimed message's share of its sender's limits, returned when it
// goes (thread-safe: no hub lock needed).
class ExchangeHub::Unclaimed {
 public:
  Unclaimed() = default;
  Unclaimed(peer::MemoryReservation bytes, std::shared_ptr<PeerUse> use)
      : bytes_(std::move(bytes)), use_(std::move(use)) {
    use_->messages.fetch_add(1);
  }
  Unclaimed(Unclaimed&& other) noexcept = default;
  Unclaimed& operator=(Unclaimed&& other) noexcept {
    if (this != &other) {
      Reset();
      bytes_ = std::move(other.bytes_);
      use_ = std::move(other.use_);
    }
    return *this;
  }
  ~Unclaimed() { Reset(); }

  void Reset() {
    if (use_) use_->messages.fetch_sub(1);
    use_.reset();
    bytes_ = {};
  }

 private:
  peer::MemoryReservation bytes_;
  std::shared_ptr<PeerUse> use_;
};

struct ExchangeHub::Sending {
  std::string to;
  std::string refusal;  // guarded by the hub's mu_; set by a REFUSED notice
};

struct ExchangeHub::Message {
  std::string from;
  Msg header;
  Payload payload;
  Unclaimed claim;
};

struct ExchangeHub::Group {
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
};

struct ExchangeHub::Op {
  std::atomic<bool> stop{false};
  bool cancelled = false;  // guarded by the hub's mu_
};

// A waiting Recv's buffer, offered to the next message under its key so the
// inbound reader fills it in place. Every field is guarded by the hub's mu_.
//
// Lifetime contract (the Recv unmaps `out` once it returns):
//  - The reader writes into `out` only while `writing` is set (one piece of
//    at most kInPlacePieceBytes), and sets it only in kFilling, under mu_.
//  - Only the Recv moves the landing out of kWaiting into kHandingOver or
//    kWithdrawn (Withdraw). From kHandingOver on, the reader starts no write
//    into `out` and waits for kWithdrawn before it touches the message again;
//    the Recv waits for `writing` to clear before it returns.
// So once Withdraw has returned, nothing but the Recv's thread uses `out`.
struct ExchangeHub::Landing {
  enum class State {
    kWaiting,      // in waiting_, no message bound
    kFilling,      // bound to a message whose segments are arriving
    kComplete,     // the whole bound message is in `out`
    kHandingOver,  // the Recv is leaving; the reader must not start a write
    kWithdrawn,    // the Recv left; the reader continues in `spill`
  };
  std::string key;
  absl::Span<uint8_t> out;
  State state = State::kWaiting;
  std::string from;                       // sender of the bound message
  Msg header;                             // of the bound message
  uint64_t filled = 0;                    // bytes of the bound message in `out`
  // Where the Recv's client learns what has landed (same lifetime as
  // `out`), and the epoch of the bound message there: a new one for every
  // message bound, since a message that replaces an unbound one rewrites
  // `out` from its start.
  std::optional<shm::ProgressWord> progress;
  uint32_t epoch = 0;
  bool writing = false;                   // the reader is reading a segment into `out`
  transport::Channel* channel = nullptr;  // that reader's link; valid while `writing`
  // kWithdrawn: the bytes that arrived and room for the rest (counted in
  // buffered_bytes_); empty when the memory limit dropped the message.
  std::optional<Payload> spill;
  Unclaimed spill_claim;  // the spilled message's share of its sender's limits

  // Publishes `filled` to the client. Only while the Recv has not left
  // (state before kWithdrawn), under the hub's mu_.
  void Publish() {
    if (progress) progress->PublishLanded({epoch, filled});
  }
};

// The senders of one operation: one thread per destination, each sending
// the same message. Not thread-safe; owned by the operation's thread.
class SenderSet {
 public:
  using SendFn = std::function<absl::Status(const std::string& site)>;
  SenderSet(const std::vector<std::string>& sites, SendFn send) : sites_(sites) {
    statuses_.resize(sites.size());
    done_ = std::make_unique<std::atomic<bool>[]>(sites.size());
    for (size_t i = 0; i < sites.size(); ++i) {
      done_[i] = false;
      threads_.emplace_back([this, i, send] {
        statuses_[i] = send(sites_[i]);
        absl::MutexLock lock(&mu_);
        done_[i] = true;
        ++finished_;
      });
    }
  }
  ~SenderSet() {
    for (auto& t : threads_) {
      if (t.joinable()) t.join();
    }
  }

  // Waits for every sender until `deadline`; calls `cut(site)` for each one
  // still running then (which must make its write fail), and joins all.
  void Finish(absl::Time deadline, const std::function<void(const std::string&)>& cut) {
    {
      absl::MutexLock lock(&mu_);
      auto all = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return finished_ == threads_.size(); };
      mu_.AwaitWithTimeout(absl::Condition(&all), deadline - MonotonicNow());
    }
    for (size_t i = 0; i < threads_.size(); ++i) {
      if (!done_[i]) cut(sites_[i]);
    }
    for (auto& t : threads_) t.join();
  }

  const std::vector<absl::Status>& statuses() const { return statuses_; }

 private:
  const std::vector<std::string> sites_;
  std::vector<absl::Status> statuses_;
  std::unique_ptr<std::atomic<bool>[]> done_;
  std::vector<std::thread> threads_;
  absl::Mutex mu_;
  size_t finished_ ABSL_GUARDED_BY(mu_) = 0;
};

ExchangeHub::ExchangeHub(std::string local_site, std::vector<std::string> peers, Dialer dialer,
                         peer::PriorityGate* gate, HubOptions options, peer::RateLimiter* limiter)
    : local_site_(std::move(local_site)),
      peers_(std::move(peers)),
      dialer_(std::move(dialer)),
      gate_(gate),
      options_(options),
      limiter_(limiter),
      drain_thread_([this] { DrainLoop(); }) {}

ExchangeHub::~ExchangeHub() {
  Shutdown();
  drain_thread_.join();
}

void ExchangeHub::HoldUntilSent(const std::string& site, peer::PriorityGate::Scope scope) {
  std::shared_ptr<Outbound> link;
  {
    absl::MutexLock lock(&mu_);
    auto it = outbound_.find(site);
    if (it == outbound_.end() || it->second->broken.load()) return;
    link = it->second;
  }
  absl::MutexLock lock(&drain_mu_);
  if (drain_stop_) return;
  draining_.push_back({std::move(link), std::move(scope), MonotonicNow() + kDrainLimit});
}

void ExchangeHub::DrainLoop() {
  absl::MutexLock lock(&drain_mu_);
  auto has_work = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(drain_mu_) {
    return drain_stop_ || !draining_.empty();
  };
  while (true) {
    drain_mu_.Await(absl::Condition(&has_work));
    if (drain_stop_) break;
    const absl::Time now = MonotonicNow();
    for (auto it = draining_.begin(); it != draining_.end();) {
      const bool done = it->link->broken.load() || now >= it->until ||
                        it->link->channel->UnsentBytes() == 0;
      it = done ? draining_.erase(it) : std::next(it);
    }
    if (!draining_.empty()) {
      drain_mu_.AwaitWithTimeout(absl::Condition(&drain_stop_), kDrainPoll);
    }
  }
  draining_.clear();
}

std::string ExchangeHub::Key(absl::string_view group, int kind, absl::string_view from,
                             absl::string_view id) {
  return absl::StrCat(group, "\x1f", kind, "\x1f", from, "\x1f", id);
}

v1::GroupView ExchangeHub::ViewOf(const Group& g) const {
  v1::GroupView view;
  view.set_group(g.name);
  view.set_generation(g.generation);
  for (const auto& m : g.members) view.add_members(m);
  view.set_local_site(local_site_);
  return view;
}

// ---------------------------------------------------------------- links

absl::StatusOr<std::shared_ptr<ExchangeHub::Outbound>> ExchangeHub::LinkTo(const std::string& site) {
  auto existing = [&]() -> std::shared_ptr<Outbound> {
    absl::MutexLock lock(&mu_);
    auto it = outbound_.find(site);
    if (it != outbound_.end() && !it->second->broken.load()) return it->second;
    return nullptr;
  };
  if (auto link = existing()) return link;
  absl::MutexLock dial_lock(&dial_mu_);
  if (auto link = existing()) return link;
  {
    absl::MutexLock lock(&mu_);
    if (shutdown_) return absl::UnavailableError("the daemon is shutting down");
  }
  auto channel = dialer_(site);
  if (!channel.ok()) {
    return absl::UnavailableError(absl::StrCat("cannot reach ", site, ": ", channel.status().message()));
  }
  auto link = std::make_shared<Outbound>();
  link->channel = std::move(*channel);
  absl::MutexLock lock(&mu_);
  if (shutdown_) {
    link->channel->Abort();
    return absl::UnavailableError("the daemon is shutting down");
  }
  outbound_[site] = link;
  return link;
}

absl::Status ExchangeHub::SendMessage(const std::string& site, Msg header,
                                      absl::Span<const uint8_t> payload,
                                      const std::atomic<bool>* stop, absl::Time deadline,
                                      const ReadyFn& ready) {
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
           (deadline != absl::InfiniteFuture() && MonotonicNow() >= deadline);
  };
  uint64_t offset = 0;
  do {
    const uint64_t n = std::min<uint64_t>(kSegmentBytes, payload.size() - offset);
    absl::Status stop_status;
    if (offset > 0) {
      if (std::string why = refusal(); !why.empty()) {
        stop_status = absl::ResourceExhaustedError(absl::StrCat(site, " refused the message: ", why));
      }
    }
    if (stop_status.ok() && ready && n > 0) stop_status = ready(offset + n);
    // The operators' caps, charged per segment like a transfer's chunk.
    bool capped_out = false;
    if (stop_status.ok() && limiter_ != nullptr && n > 0 && !stopped()) {
      capped_out = !limiter_->Acquire(site, v1::EXCHANGE, n, stopped);
    }
    if (stop_status.ok() && (capped_out || stopped())) stop_status = absl::CancelledError("stopped");
    if (!stop_status.ok()) {
      if (offset > 0) {
        // Tell the peer to drop the segments it holds.
        Msg discard;
        discard.set_kind(Msg::DISCARD);
        discard.set_msg_id(header.msg_id());
        absl::MutexLock lock(&(*link)->write_mu);
        peer::SendProto(*(*link)->channel, peer::FrameType::kControl, 0, discard).IgnoreError();
      }
      return stop_status;
    }
    header.set_offset(offset);
    header.set_payload_bytes(n);
    absl::Status s;
    {
      absl::MutexLock lock(&(*link)->write_mu);
      s = peer::SendProto(*(*link)->channel, peer::FrameType::kControl, 0, header);
      if (s.ok() && n > 0) s = (*link)->channel->Write({payload.subspan(offset, n)});
    }
    if (!s.ok()) {
      (*link)->broken = true;
      (*link)->channel->Abort();
      PeerLost(site, std::string(s.message()));
      return absl::UnavailableError(absl::StrCat("sending to ", site, " failed: ", s.message()));
    }
    offset += n;
  } while (offset < payload.size());
  return absl::OkStatus();
}

void ExchangeHub::ServeInbound(std::unique_ptr<transport::Channel> channel) {
  {
    absl::MutexLock lock(&mu_);
    if (shutdown_) return;
    inbound_.insert(channel.get());
  }
  const std::string site = channel->peer_site();
  spdlog::debug("exchange link from {} ({}) open", site, channel->peer_address());
  absl::Status status = ReadLoop(*channel);
  bool shutting_down;
  {
    absl::MutexLock lock(&mu_);
    inbound_.erase(channel.get());
    shutting_down = shutdown_;
  }
  if (!shutting_down) PeerLost(site, std::string(status.message()));
}

absl::Status ExchangeHub::ReadLoop(transport::Channel& channel) {
  using State = Landing::State;
  const std::string from = channel.peer_site();
  // Messages from this peer whose segments are still arriving, by msg_id.
  // Only this thread touches them. A payload's bytes are counted in
  // buffered_bytes_; a message read into a Recv's buffer (`landing`) has no
  // payload and is not counted.
  struct Partial {
    Msg header;
    Payload payload;
    uint64_t received = 0;
    bool dropped = false;  // refused or not admitted: read and discarded
    std::shared_ptr<Landing> landing;
    Unclaimed claim;  // while in a hub buffer
  };
  // Brings a partial that fills a Recv's buffer up to date (mu_ held): waits
  // out a Recv that is handing it over, and once the Recv has left, carries
  // on in the buffer it handed over. Afterwards p.landing is null or kFilling.
  auto settle = [&](Partial& p) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!p.landing) return;
    Landing* l = p.landing.get();
    mu_.Await(absl::Condition(
        +[](Landing* l) { return l->state != State::kHandingOver; }, l));
    if (l->state != State::kWithdrawn) return;
    if (l->spill) {
      p.payload = std::move(*l->spill);
      p.claim = std::move(l->spill_claim);
    } else {
      p.dropped = true;
    }
    l->spill.reset();
    p.landing.reset();
  };
  // The message bound to p.landing will not complete (DISCARD, or this link
  // ends): the Recv waits on, first in line for the next message (mu_ held).
  auto unbind = [&](Partial& p) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    Landing& l = *p.landing;
    l.state = State::kWaiting;
    l.filled = 0;
    ++l.epoch;  // what the client copied of the unbound message is stale
    l.Publish();
    waiting_[l.key].push_front(std::move(p.landing));
  };
  absl::flat_hash_map<uint64_t, Partial> partial;
  std::vector<uint8_t> scratch;
  absl::Status result;
  while (true) {
    Msg h;
    if (absl::Status s = peer::ReadProto(channel, peer::FrameType::kControl, 0, &h); !s.ok()) {
      result = s;
      break;
    }
    if (h.total_bytes() == 0) {
      if (h.kind() == Msg::DISCARD) {
        if (auto it = partial.find(h.msg_id()); it != partial.end()) {
          absl::MutexLock lock(&mu_);
          Partial& p = it->second;
          settle(p);
          if (p.landing) {
            unbind(p);
          } else if (!p.dropped) {
            buffered_bytes_ -= p.payload.size();
          }
          partial.erase(it);
        }
        continue;
      }
      absl::Status refused;
      {
        absl::MutexLock lock(&mu_);
        if (h.kind() == Msg::REFUSED) {
          Refused(from, h);
          continue;
        }
        if (!Admits(from, h)) {
          spdlog::debug("exchange: dropping a message for group {} from {}, not a member",
                        h.group(), from);
          continue;
        }
        // A zero-byte message a Recv is waiting for is not unclaimed.
        Unclaimed claim;
        if (h.kind() != Msg::P2P || !waiting_.contains(Key(h.group(), Msg::P2P, from, h.tag()))) {
          auto c = TryClaim(from, 0);
          if (c.ok()) {
            claim = *std::move(c);
          } else {
            refused = c.status();
          }
        }
        if (refused.ok()) Deliver(from, h, {}, std::move(claim));
      }
      if (!refused.ok()) Refuse(from, h.msg_id(), refused);
      continue;
    }
    if (h.payload_bytes() == 0 || h.payload_bytes() > kSegmentBytes ||
        h.total_bytes() > options_.max_message_bytes || h.offset() > h.total_bytes() ||
        h.payload_bytes() > h.total_bytes() - h.offset()) {
      result = absl::InvalidArgumentError(absl::StrCat(
          from, " sent a malformed exchange segment (", h.offset(), "+", h.payload_bytes(), " of ",
          h.total_bytes(), " bytes)"));
      break;
    }
    auto it = partial.find(h.msg_id());
    if (it == partial.end()) {
      if (h.offset() != 0) {
        result = absl::InvalidArgumentError(
            absl::StrCat(from, " sent a segment of an exchange message it never started"));
        break;
      }
      Partial p;
      bool over_memory = false;
      absl::Status refused;
      {
        absl::MutexLock lock(&mu_);
        if (h.kind() == Msg::P2P) {
          // The first Recv waiting under this key takes the message in its
          // own buffer if it fits, unless an earlier message is queued for
          // that Recv to take first.
          const std::string key = Key(h.group(), Msg::P2P, from, h.tag());
          auto w = waiting_.find(key);
          auto queued = mailbox_.find(key);
          if (w != waiting_.end() && (queued == mailbox_.end() || queued->second.empty()) &&
              w->second.front()->out.size() >= h.total_bytes()) {
            p.landing = std::move(w->second.front());
            w->second.pop_front();
            if (w->second.empty()) waiting_.erase(w);
            p.landing->state = State::kFilling;
            p.landing->from = from;
            p.landing->header = h;
            p.landing->filled = 0;
            ++p.landing->epoch;
            p.landing->Publish();
          }
        }
        if (!p.landing) {
          if (!Admits(from, h)) {
            p.dropped = true;
            spdlog::debug("exchange: dropping a message for group {} from {}, not a member",
                          h.group(), from);
          } else if (buffered_bytes_ + h.total_bytes() > options_.max_buffered_bytes) {
            p.dropped = true;
            over_memory = true;
          } else if (auto c = TryClaim(from, h.total_bytes()); !c.ok()) {
            p.dropped = true;
            refused = c.status();
          } else {
            p.claim = *std::move(c);
            buffered_bytes_ += h.total_bytes();
          }
        }
      }
      if (over_memory) {
        spdlog::warn("dropping a {}-byte exchange message from {}: {} bytes already buffered",
                     h.total_bytes(), from, options_.max_buffered_bytes);
      } else if (!refused.ok()) {
        Refuse(from, h.msg_id(), refused);
      } else if (!p.dropped && !p.landing) {
        p.payload = TakeBuffer(h.total_bytes());
      }
      p.header = h;
      it = partial.emplace(h.msg_id(), std::move(p)).first;
    } else if (h.offset() != it->second.received || h.total_bytes() != it->second.header.total_bytes()) {
      result = absl::InvalidArgumentError(
          absl::StrCat(from, " sent exchange segments out of order"));
      break;
    }
    Partial& p = it->second;
    // Into a Recv's buffer the segment is read in short pieces, so a Recv
    // that ends waits for one piece at most; the rest of the segment then
    // follows the message into the hub buffer the Recv hands over.
    const uint64_t end = h.offset() + h.payload_bytes();
    absl::Status read;
    while (read.ok() && p.received < end) {
      absl::Span<uint8_t> into;
      if (p.landing) {
        absl::MutexLock lock(&mu_);
        settle(p);
        if (p.landing) {
          // Within `out`: the bound message fits it, and `end` is within the message.
          into = p.landing->out.subspan(p.received,
                                        std::min<uint64_t>(kInPlacePieceBytes, end - p.received));
          p.landing->writing = true;
          p.landing->channel = &channel;
        }
      }
      if (!p.landing && p.dropped) {
        scratch.resize(end - p.received);
        into = absl::MakeSpan(scratch);
      } else if (!p.landing) {
        into = absl::MakeSpan(p.payload).subspan(p.received, end - p.received);
      }
      read = channel.ReadExactly(into);
      if (p.landing) {
        absl::MutexLock lock(&mu_);
        Landing& l = *p.landing;
        l.writing = false;
        l.channel = nullptr;
        if (read.ok()) {
          l.filled += into.size();
          // The Recv is still there: it waits for `writing` to clear.
          l.Publish();
          bytes_in_place_ += into.size();
          // A Recv handing it over sees `filled` reach the total itself.
          if (l.filled == l.header.total_bytes() && l.state == State::kFilling) {
            l.state = State::kComplete;
          }
        }
      }
      if (read.ok()) p.received += into.size();
    }
    if (!read.ok()) {
      result = read;
      break;
    }
    if (p.received == p.header.total_bytes()) {
      if (!p.dropped && !p.landing) {
        absl::MutexLock lock(&mu_);
        Deliver(from, std::move(p.header), std::move(p.payload), std::move(p.claim));
      }
      partial.erase(it);
    }
  }
  absl::MutexLock lock(&mu_);
  for (auto& [id, p] : partial) {
    settle(p);
    if (p.landing) {
      unbind(p);
    } else if (!p.dropped) {
      buffered_bytes_ -= p.payload.size();
    }
  }
  return result;
}

Payload ExchangeHub::TakeBuffer(uint64_t bytes) {
  Payload buffer;
  if (bytes >= kMinSpareBytes) {
    absl::MutexLock lock(&mu_);
    // The smallest spare that fits, if it is not much larger.
    auto best = spare_.end();
    for (auto it = spare_.begin(); it != spare_.end(); ++it) {
      if (it->capacity() >= bytes && it->capacity() <= 2 * bytes &&
          (best == spare_.end() || it->capacity() < best->capacity())) {
        best = it;
      }
    }
    if (best != spare_.end()) {
      buffer = std::move(*best);
      spare_bytes_ -= buffer.capacity();
      spare_.erase(best);
    }
  }
  buffer.resize(bytes);  // no zeroing (DefaultInitAllocator)
  return buffer;
}

void ExchangeHub::Recycle(Payload payload) {
  if (payload.capacity() < kMinSpareBytes || payload.capacity() > kSpareBytes) return;
  while (!spare_.empty() && spare_bytes_ + payload.capacity() > kSpareBytes) {
    spare_bytes_ -= spare_.front().capacity();
    spare_.erase(spare_.begin());
  }
  spare_bytes_ += payload.capacity();
  spare_.push_back(std::move(payload));
}

bool ExchangeHub::Admits(const std::string& from, const Msg& header) const {
  if (header.kind() == Msg::JOIN) {
    const std::vector<std::string> sites(header.members().begin(), header.members().end());
    return Contains(sites, from) && Contains(sites, local_site_);
  }
  auto it = groups_.find(header.group());
  if (it == groups_.end()) return true;  // kept for a Join to come, which sorts it out
  const Group& g = *it->second;
  if (Contains(g.joining, from)) return true;
  if (g.formed) return Contains(g.members, from);
  return g.joining.empty();
}

absl::StatusOr<ExchangeHub::Unclaimed> ExchangeHub::TryClaim(const std::string& from,
                                                             uint64_t bytes) {
  std::shared_ptr<PeerUse>& use = unclaimed_[from];
  if (!use) use = std::make_shared<PeerUse>();
  if (use->messages.load() >= options_.max_unclaimed_messages_per_peer) {
    return absl::ResourceExhaustedError(absl::StrCat(
        local_site_, " already holds ", options_.max_unclaimed_messages_per_peer,
        " exchange messages from ", from,
        " that no call there has asked for (peer_limits.max_unclaimed_messages_per_peer)"));
  }
  peer::MemoryReservation reserved;
  if (options_.memory_budget != nullptr && bytes > 0) {
    reserved = peer::MemoryReservation::TryTake(options_.memory_budget, from, bytes);
    if (reserved.bytes() == 0) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "a ", bytes, "-byte exchange message from ", from, " would take what ", from,
          " holds at ", local_site_, " (", options_.memory_budget->used(from),
          " bytes) past peer_limits.memory_per_peer (", options_.memory_budget->bytes_per_peer(),
          " bytes)"));
    }
  }
  return Unclaimed(std::move(reserved), use);
}

void ExchangeHub::Refuse(const std::string& from, uint64_t msg_id, const absl::Status& why) {
  std::shared_ptr<Outbound> link;
  {
    absl::MutexLock lock(&mu_);
    std::shared_ptr<PeerUse>& use = unclaimed_[from];
    if (!use) use = std::make_shared<PeerUse>();
    const int limit = absl::StrContains(why.message(), "memory_per_peer") ? 1 : 0;
    ++use->refused[limit];
    const absl::Time now = MonotonicNow();
    if (now - use->refused_logged[limit] >= kRefusalLogEvery) {
      spdlog::warn("exchange: refused {} message(s) from {}: {}", use->refused[limit], from,
                   why.message());
      use->refused[limit] = 0;
      use->refused_logged[limit] = now;
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
    s = peer::SendProto(*link->channel, peer::FrameType::kControl, 0, notice);
  }
  link->write_mu.Unlock();
  if (!s.ok()) {
    link->broken = true;
    link->channel->Abort();
    PeerLost(from, std::string(s.message()));
  }
}

void ExchangeHub::Refused(const std::string& from, const Msg& notice) {
  ++refusals_received_;
  const std::string reason(notice.reason().substr(0, 512));
  auto it = sending_.find(notice.refused_msg_id());
  if (it != sending_.end() && it->second->to == from) it->second->refusal = reason;
  std::shared_ptr<PeerUse>& use = unclaimed_[from];
  if (!use) use = std::make_shared<PeerUse>();
  ++use->refusals;
  const absl::Time now = MonotonicNow();
  if (now - use->refusals_logged >= kRefusalLogEvery) {
    spdlog::warn("exchange: {} refused {} message(s) from this site: {}", from, use->refusals,
                 reason);
    use->refusals = 0;
    use->refusals_logged = now;
  }
}

uint32_t ExchangeHub::unclaimed_messages(const std::string& site) {
  absl::MutexLock lock(&mu_);
  auto it = unclaimed_.find(site);
  return it == unclaimed_.end() ? 0 : it->second->messages.load();
}

void ExchangeHub::Deliver(const std::string& from, Msg header, Payload payload, Unclaimed claim) {
  // Delivered payload bytes stay counted in buffered_bytes_ until taken.
  auto drop = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { buffered_bytes_ -= payload.size(); };
  if (!Admits(from, header)) {
    drop();
    return;
  }
  auto git = groups_.find(header.group());
  Group* g = git == groups_.end() ? nullptr : git->second.get();
  std::string key;
  switch (header.kind()) {
    case Msg::JOIN: {
      key = Key(header.group(), Msg::JOIN, from, "");
      mailbox_[key].clear();
      break;
    }
    case Msg::REDUCE_DATA:
    case Msg::ABORT:
    case Msg::DONE:
      if (g != nullptr && g->formed &&
          (header.generation() < g->generation || g->finished.contains(header.seq()))) {
        drop();  // an op this site already ended, or an older generation's
        return;
      }
      key = Key(header.group(), header.kind(), from, absl::StrCat(header.seq()));
      break;
    case Msg::P2P:
      key = Key(header.group(), Msg::P2P, from, header.tag());
      break;
    default:
      drop();
      return;
  }
  mailbox_[key].push_back(Message{from, std::move(header), std::move(payload), std::move(claim)});
}

void ExchangeHub::PeerLost(const std::string& site, const std::string& reason) {
  std::shared_ptr<Outbound> link;
  absl::MutexLock lock(&mu_);
  if (shutdown_) return;
  if (auto it = outbound_.find(site); it != outbound_.end()) {
    link = it->second;
    outbound_.erase(it);
  }
  if (link) {
    link->broken = true;
    link->channel->Abort();
  }
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

void ExchangeHub::SendAborts(const std::string& group, uint64_t generation, uint64_t seq,
                             const std::vector<std::string>& peers, const std::string& reason) {
  Msg abort;
  abort.set_kind(Msg::ABORT);
  abort.set_group(group);
  abort.set_generation(generation);
  abort.set_seq(seq);
  abort.set_reason(reason);
  for (const std::string& p : peers) {
    {
      absl::MutexLock lock(&mu_);
      auto it = outbound_.find(p);
      if (it == outbound_.end() || it->second->broken.load()) continue;  // never reached, or lost
    }
    SendMessage(p, abort, {}, nullptr).IgnoreError();  // best effort: a lost peer needs no abort
  }
}

OpResult ExchangeHub::LostResult(const std::string& what, const Group& g, uint64_t generation) const {
  OpResult r;
  std::string lost = "a peer";
  std::string why = "its link closed";
  for (uint64_t gen = generation; gen < g.generation; ++gen) {
    if (auto it = g.lost_after.find(gen); it != g.lost_after.end()) {
      lost = it->second.first;
      why = it->second.second;
      break;
    }
  }
  r.lost_peer = lost;
  r.status = absl::UnavailableError(absl::StrCat(
      what, ": peer ", lost, " was lost (", why, "); group ", g.name, " is now generation ",
      g.generation, " with ", Members(g.members), "; retry"));
  r.view = ViewOf(g);
  return r;
}

std::shared_ptr<ExchangeHub::Op> ExchangeHub::StartOp(const std::string& op_id) {
  auto op = std::make_shared<Op>();
  if (!op_id.empty()) ops_[op_id] = op;
  return op;
}

void ExchangeHub::EndOp(const std::string& op_id) {
  if (!op_id.empty()) ops_.erase(op_id);
}

bool ExchangeHub::Cancel(const std::string& op_id) {
  absl::MutexLock lock(&mu_);
  auto it = ops_.find(op_id);
  if (it == ops_.end()) return false;
  it->second->cancelled = true;
  it->second->stop = true;
  return true;
}

void ExchangeHub::Shutdown() {
  absl::MutexLock lock(&mu_);
  if (shutdown_) return;
  shutdown_ = true;
  for (auto& [id, op] : ops_) op->stop = true;
  // Abort only stops the socket, so it is safe under mu_; inbound channels
  // stay alive while registered (their readers deregister under mu_).
  for (auto& [site, link] : outbound_) link->channel->Abort();
  for (auto* channel : inbound_) channel->Abort();
  {
    absl::MutexLock drain_lock(&drain_mu_);
    drain_stop_ = true;
  }
  mu_.Await(absl::Condition(+[](absl::flat_hash_set<transport::Channel*>* s) { return s->empty(); },
                            &inbound_));
}

// ---------------------------------------------------------------- groups

absl::StatusOr<v1::GroupView> ExchangeHub::Join(const std::string& group,
                                                std::vector<std::string> sites,
                                                absl::Duration timeout) {
  if (group.empty() || group.size() > 256) {
    return absl::InvalidArgumentError("a group name must have 1 to 256 characters");
  }
  std::sort(sites.begin(), sites.end());
  sites.erase(std::unique(sites.begin(), sites.end()), sites.end());
  if (std::find(sites.begin(), sites.end(), local_site_) == sites.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the sites of group ", group, " ", Members(sites), " do not include this site (",
                     local_site_, ")"));
  }
  std::vector<std::string> others;
  for (const std::string& s : sites) {
    if (s == local_site_) continue;
    if (std::find(peers_.begin(), peers_.end(), s) == peers_.end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          s, " is not a configured peer of ", local_site_, " (peers: ", Members(peers_), ")"));
    }
    others.push_back(s);
  }
  const absl::Time deadline = MonotonicNow() + timeout;
  uint64_t proposal;
  {
    absl::MutexLock lock(&mu_);
    auto& g = groups_[group];
    if (!g) {
      g = std::make_unique<Group>();
      g->name = group;
    }
    proposal = g->generation + 1;
    // From now on the new members' messages are taken (they may form and
    // send before this site has their JOIN).
    g->joining = sites;
  }
  absl::Cleanup not_joining = [&] {
    absl::MutexLock lock(&mu_);
    if (auto it = groups_.find(group); it != groups_.end() && it->second->joining == sites) {
      it->second->joining.clear();
    }
  };
  Msg join;
  join.set_kind(Msg::JOIN);
  join.set_group(group);
  join.set_generation(proposal);
  for (const auto& s : sites) join.add_members(s);
  join.set_join_nonce(absl::Uniform<uint64_t>(absl::BitGen()));
  for (const std::string& p : others) {
    while (true) {
      absl::Status s = SendMessage(p, join, {}, nullptr);
      if (s.ok()) break;
      if (MonotonicNow() + absl::Milliseconds(100) >= deadline) {
        return absl::DeadlineExceededError(absl::StrCat("joining group ", group, ": ", s.message()));
      }
      absl::SleepFor(absl::Milliseconds(100));
    }
  }
  absl::MutexLock lock(&mu_);
  auto joined = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (shutdown_) return true;
    for (const std::string& p : others) {
      auto it = mailbox_.find(Key(group, Msg::JOIN, p, ""));
      if (it == mailbox_.end() || it->second.empty()) return false;
    }
    return true;
  };
  mu_.AwaitWithTimeout(absl::Condition(&joined), deadline - MonotonicNow());
  if (shutdown_) return absl::UnavailableError("the daemon is shutting down");
  std::vector<std::string> missing;
  uint64_t generation = proposal;
  for (const std::string& p : others) {
    auto it = mailbox_.find(Key(group, Msg::JOIN, p, ""));
    if (it == mailbox_.end() || it->second.empty()) {
      missing.push_back(p);
      continue;
    }
    const Msg& theirs = it->second.back().header;
    std::vector<std::string> their_sites(theirs.members().begin(), theirs.members().end());
    std::sort(their_sites.begin(), their_sites.end());
    if (their_sites != sites) {
      mailbox_.erase(it);
      return absl::InvalidArgumentError(absl::StrCat(p, " joined group ", group, " with sites ",
                                                     Members(their_sites), ", this site with ",
                                                     Members(sites)));
    }
    generation = std::max<uint64_t>(generation, theirs.generation());
  }
  if (!missing.empty()) {
    return absl::DeadlineExceededError(
        absl::StrCat("group ", group, ": ", absl::StrJoin(missing, ", "), " did not join within ",
                     DurationText(timeout)));
  }
  for (const std::string& p : others) mailbox_.erase(Key(group, Msg::JOIN, p, ""));
  Group& g = *groups_[group];
  g.members = sites;
  g.generation = generation;
  g.formed = true;
  g.finished.clear();
  g.joining.clear();
  // Drop what non-members and older generations left for this group.
  DropUnclaimedLocked([&](const Message& m) {
    const Msg::Kind kind = m.header.kind();
    const bool stale = (kind == Msg::REDUCE_DATA || kind == Msg::DONE || kind == Msg::ABORT) &&
                       m.header.generation() < generation;
    return m.header.group() == group && (stale || !Contains(sites, m.from));
  });
  spdlog::info("exchange group {} formed: generation {} with {}", group, generation, Members(sites));
  return ViewOf(g);
}

void ExchangeHub::DropUnclaimedLocked(absl::FunctionRef<bool(const Message&)> drop) {
  for (auto it = mailbox_.begin(); it != mailbox_.end();) {
    auto next = std::next(it);
    auto& queue = it->second;
    for (auto m = queue.begin(); m != queue.end();) {
      if (drop(*m)) {
        buffered_bytes_ -= m->payload.size();
        m = queue.erase(m);
      } else {
        ++m;
      }
    }
    if (queue.empty()) mailbox_.erase(it);
    it = next;
  }
}

void ExchangeHub::Leave(const std::string& group) {
  absl::MutexLock lock(&mu_);
  groups_.erase(group);
  // What the group's sites sent that no call took is stale now.
  DropUnclaimedLocked([&](const Message& m) { return m.header.group() == group; });
}

absl::StatusOr<v1::GroupView> ExchangeHub::View(const std::string& group) {
  absl::MutexLock lock(&mu_);
  auto it = groups_.find(group);
  if (it == groups_.end() || !it->second->formed) {
    return absl::FailedPreconditionError(absl::StrCat("this site has not joined group ", group));
  }
  return ViewOf(*it->second);
}

// ---------------------------------------------------------------- operations

const ExchangeHub::Message* ExchangeHub::AbortFrom(const std::string& group,
                                                   const std::string& seq_id,
                                                   const std::vector<std::string>& peers) {
  for (const std::string& p : peers) {
    auto it = mailbox_.find(Key(group, Msg::ABORT, p, seq_id));
    if (it != mailbox_.end() && !it->second.empty()) return &it->second.front();
  }
  return nullptr;
}

absl::Status ExchangeHub::Commit(const AllReduceArgs& args, const std::string& what,
                                 uint64_t generation, const std::vector<std::string>& peers,
                                 std::string* lost_peer) {
  Msg done;
  done.set_kind(Msg::DONE);
  done.set_group(args.group);
  done.set_generation(generation);
  done.set_seq(args.seq);
  for (const std::string& p : peers) {
    // A failed write loses the peer; the wait below reports it.
    SendMessage(p, done, {}, nullptr).IgnoreError();
  }
  const std::string seq_id = absl::StrCat(args.seq);
  std::vector<std::string> keys;
  for (const auto& p : peers) keys.push_back(Key(args.group, Msg::DONE, p, seq_id));
  // Committed: a cancel or the deadline no longer ends the op (a peer may
  // already have finished it); only an abort, a lost peer or shutdown does,
  // or a peer silent long past the deadline.
  const absl::Time give_up = MonotonicNow() + args.timeout + kSenderGrace;
  absl::MutexLock lock(&mu_);
  auto has = [&](const std::string& key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto it = mailbox_.find(key);
    return it != mailbox_.end() && !it->second.empty();
  };
  auto group_moved = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto it = groups_.find(args.group);
    return it == groups_.end() || it->second->generation != generation;
  };
  auto all_done = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (const auto& k : keys) {
      if (!has(k)) return false;
    }
    return true;
  };
  auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return shutdown_ || AbortFrom(args.group, seq_id, peers) != nullptr || all_done() ||
           group_moved();
  };
  mu_.AwaitWithTimeout(absl::Condition(&ready), give_up - MonotonicNow());
  if (const Message* abort = AbortFrom(args.group, seq_id, peers); abort != nullptr) {
    const Message& m = *abort;
    return absl::AbortedError(absl::StrCat(what, ": ", m.from, " gave up on it (", m.header.reason(), ")"));
  }
  if (all_done()) return absl::OkStatus();
  if (shutdown_) return absl::UnavailableError(absl::StrCat(what, ": the daemon is shutting down"));
  if (group_moved()) {
    auto it = groups_.find(args.group);
    if (it == groups_.end()) return absl::CancelledError(absl::StrCat(what, ": this site left the group"));
    OpResult lost = LostResult(what, *it->second, generation);
    *lost_peer = lost.lost_peer;
    return lost.status;
  }
  std::vector<std::string> waiting;
  for (size_t i = 0; i < keys.size(); ++i) {
    if (!has(keys[i])) waiting.push_back(peers[i]);
  }
  return absl::DeadlineExceededError(absl::StrCat(what, " timed out waiting for ",
                                                  absl::StrJoin(waiting, ", "), " to commit"));
}

OpResult ExchangeHub::AllReduce(const AllReduceArgs& args, absl::Span<uint8_t> buffer) {
  const absl::Time start = MonotonicNow();
  const absl::Time deadline = start + args.timeout;
  OpResult result;
  const size_t es = ElementSize(args.dtype);
  if (es == 0) {
    result.status = absl::InvalidArgumentError("all-reduce needs a dtype: float32, bfloat16 or float16");
    return result;
  }
  if (buffer.size() % es != 0) {
    result.status = absl::InvalidArgumentError(
        absl::StrCat("all-reduce buffer of ", buffer.size(), " bytes is not a whole number of ",
                     v1::ExchangeDType_Name(args.dtype), " elements"));
    return result;
  }
  const size_t count = buffer.size() / es;
  const std::string what = absl::StrCat("all-reduce #", args.seq,
                                        args.tag.empty() ? "" : absl::StrCat(" (", args.tag, ")"),
                                        " in group ", args.group);
  std::shared_ptr<Op> op;
  uint64_t generation;
  std::vector<std::string> members;
  {
    absl::MutexLock lock(&mu_);
    auto it = groups_.find(args.group);
    if (it == groups_.end() || !it->second->formed) {
      result.status = absl::FailedPreconditionError(
          absl::StrCat("this site has not joined group ", args.group));
      return result;
    }
    if (ops_.contains(args.op_id)) {
      result.status = absl::AlreadyExistsError(absl::StrCat("operation ", args.op_id, " is already running"));
      return result;
    }
    generation = it->second->generation;
    members = it->second->members;
    op = StartOp(args.op_id);
  }
  std::vector<std::string> peers;
  for (const auto& m : members) {
    if (m != local_site_) peers.push_back(m);
  }
  std::vector<peer::PriorityGate::Scope> scopes;
  if (gate_ != nullptr) {
    for (const auto& p : peers) scopes.push_back(gate_->Enter(p, v1::EXCHANGE));
  }

  std::vector<uint8_t> quantized;
  absl::Span<const uint8_t> own = buffer;
  if (args.quantize_int8) {
    quantized.resize(QuantizedSize(count));
    Quantize(args.dtype, buffer, count, absl::MakeSpan(quantized));
    own = quantized;
  }
  Msg header;
  header.set_kind(Msg::REDUCE_DATA);
  header.set_group(args.group);
  header.set_generation(generation);
  header.set_seq(args.seq);
  header.set_tag(args.tag);
  header.set_dtype(args.dtype);
  header.set_op(args.op);
  header.set_count(count);
  header.set_quantized(args.quantize_int8);
  SenderSet senders(peers, [&](const std::string& site) {
    return SendMessage(site, header, own, &op->stop);
  });

  // Wait for every peer's contribution, or for a reason to stop.
  const std::string seq_id = absl::StrCat(args.seq);
  std::vector<std::string> keys;
  for (const auto& p : peers) keys.push_back(Key(args.group, Msg::REDUCE_DATA, p, seq_id));
  std::vector<Message> taken(peers.size());
  absl::Status failure;
  std::string lost_peer;
  {
    absl::MutexLock lock(&mu_);
    auto has = [&](const std::string& key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      auto it = mailbox_.find(key);
      return it != mailbox_.end() && !it->second.empty();
    };
    auto group_moved = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      auto it = groups_.find(args.group);
      return it == groups_.end() || it->second->generation != generation;
    };
    auto all_here = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      for (const auto& k : keys) {
        if (!has(k)) return false;
      }
      return true;
    };
    auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return shutdown_ || op->cancelled || AbortFrom(args.group, seq_id, peers) != nullptr ||
             all_here() || group_moved();
    };
    while (!ready() && MonotonicNow() < deadline) {
      mu_.AwaitWithTimeout(absl::Condition(&ready), std::min(deadline - MonotonicNow(), kPoll));
      if (!op->cancelled && args.client_gone && args.client_gone()) op->cancelled = true;
    }
    if (const Message* abort = AbortFrom(args.group, seq_id, peers); abort != nullptr) {
      const Message& m = *abort;
      failure = absl::AbortedError(
          absl::StrCat(what, ": ", m.from, " gave up on it (", m.header.reason(), ")"));
    } else if (op->cancelled) {
      failure = absl::CancelledError(absl::StrCat(what, " cancelled"));
    } else if (shutdown_) {
      failure = absl::UnavailableError(absl::StrCat(what, ": the daemon is shutting down"));
    } else if (all_here()) {
      for (size_t i = 0; i < keys.size(); ++i) {
        auto& queue = mailbox_[keys[i]];
        taken[i] = std::move(queue.front());
        queue.pop_front();
        if (queue.empty()) mailbox_.erase(keys[i]);
        buffered_bytes_ -= taken[i].payload.size();
        taken[i].claim.Reset();
      }
    } else if (group_moved()) {
      auto it = groups_.find(args.group);
      if (it == groups_.end()) {
        failure = absl::CancelledError(absl::StrCat(what, ": this site left the group"));
      } else {
        OpResult lost = LostResult(what, *it->second, generation);
        failure = lost.status;
        lost_peer = lost.lost_peer;
      }
    } else {
      std::vector<std::string> waiting;
      for (size_t i = 0; i < keys.size(); ++i) {
        if (!has(keys[i])) waiting.push_back(peers[i]);
      }
      failure = absl::DeadlineExceededError(absl::StrCat(
          what, " timed out after ", DurationText(args.timeout), " waiting for ",
          absl::StrJoin(waiting, ", ")));
    }
  }

  // Check what the peers sent against what this site does.
  for (size_t i = 0; failure.ok() && i < taken.size(); ++i) {
    const Msg& h = taken[i].header;
    if (h.generation() != generation) {
      failure = absl::UnavailableError(absl::StrCat(
          what, ": ", peers[i], " ran it at generation ", h.generation(), ", this site at ",
          generation, "; retry"));
    } else if (h.count() != count || h.dtype() != args.dtype || h.quantized() != args.quantize_int8 ||
               h.op() != args.op || h.tag() != args.tag) {
      failure = absl::FailedPreconditionError(absl::StrCat(
          what, ": ", peers[i], " passed ", h.count(), " ", v1::ExchangeDType_Name(h.dtype()), " ",
          v1::ReduceOp_Name(h.op()), h.quantized() ? " int8" : "", " tag '", h.tag(),
          "', this site ", count, " ", v1::ExchangeDType_Name(args.dtype), " ",
          v1::ReduceOp_Name(args.op), args.quantize_int8 ? " int8" : "", " tag '", args.tag, "'"));
    } else if (taken[i].payload.size() != ContributionSize(args.dtype, args.quantize_int8, count)) {
      failure = absl::InvalidArgumentError(
          absl::StrCat(what, ": ", peers[i], " sent ", taken[i].payload.size(), " bytes"));
    }
  }

  std::vector<float> acc;
  if (failure.ok()) {
    acc.resize(count);
    bool first = true;
    for (const std::string& m : members) {
      absl::Span<const uint8_t> contribution = own;
      if (m != local_site_) {
        size_t i = std::find(peers.begin(), peers.end(), m) - peers.begin();
        contribution = taken[i].payload;
      }
      Accumulate(args.dtype, args.quantize_int8, contribution, first, absl::MakeSpan(acc));
      first = false;
    }
  } else {
    op->stop = true;
  }
  senders.Finish(std::max(deadline, MonotonicNow()) + kSenderGrace,
                 [&](const std::string& site) { PeerLost(site, "it stopped taking data"); });
  uint64_t sent = 0;
  for (size_t i = 0; i < peers.size(); ++i) {
    const absl::Status& s = senders.statuses()[i];
    if (s.ok()) {
      sent += own.size();
    } else if (failure.ok() && s.code() == absl::StatusCode::kResourceExhausted) {
      failure = absl::ResourceExhaustedError(absl::StrCat(what, ": ", s.message()));
    } else if (failure.ok()) {
      // A peer that missed our contribution cannot finish: neither may we.
      absl::MutexLock lock(&mu_);
      auto it = groups_.find(args.group);
      if (it != groups_.end() && it->second->generation != generation) {
        OpResult lost = LostResult(what, *it->second, generation);
        failure = lost.status;
        lost_peer = lost.lost_peer;
      } else {
        failure = absl::UnavailableError(absl::StrCat(what, ": ", s.message()));
        lost_peer = peers[i];
      }
    }
  }
  if (failure.ok()) {
    failure = Commit(args, what, generation, peers, &lost_peer);
  } else if (lost_peer.empty()) {
    SendAborts(args.group, generation, args.seq, peers, std::string(failure.message()));
  }
  if (failure.ok()) Finish(args.dtype, args.op, members.size(), acc, buffer);

  absl::MutexLock lock(&mu_);
  EndOp(args.op_id);
  auto it = groups_.find(args.group);
  if (it != groups_.end()) {
    if (it->second->generation == generation) it->second->finished.insert(args.seq);
    result.view = ViewOf(*it->second);
  }
  for (const auto& p : peers) {
    keys.push_back(Key(args.group, Msg::DONE, p, seq_id));
    keys.push_back(Key(args.group, Msg::ABORT, p, seq_id));
  }
  for (const auto& k : keys) {
    if (auto m = mailbox_.find(k); m != mailbox_.end()) {
      for (const auto& msg : m->second) buffered_bytes_ -= msg.payload.size();
      mailbox_.erase(m);
    }
  }
  result.status = failure;
  result.lost_peer = lost_peer;
  uint64_t received = 0;
  for (auto& m : taken) {
    received += m.payload.size();
    Recycle(std::move(m.payload));
  }
  result.stats.set_bytes_sent(sent);
  result.stats.set_bytes_received(received);
  result.stats.set_peers(peers.size());
  result.stats.set_seconds(absl::ToDoubleSeconds(MonotonicNow() - start));
  result.stats.set_generation(generation);
  return result;
}

OpResult ExchangeHub::Send(const P2PArgs& args, absl::Span<const uint8_t> data) {
  const absl::Time start = MonotonicNow();
  OpResult result;
  const std::string what = absl::StrCat("send to ", args.peer, " tag '", args.tag, "' in group ", args.group);
  std::shared_ptr<Op> op;
  uint64_t generation;
  {
    absl::MutexLock lock(&mu_);
    auto it = groups_.find(args.group);
    if (it == groups_.end() || !it->second->formed) {
      result.status = absl::FailedPreconditionError(
          absl::StrCat("this site has not joined group ", args.group));
      return result;
    }
    const auto& members = it->second->members;
    if (args.peer == local_site_ ||
        std::find(members.begin(), members.end(), args.peer) == members.end()) {
      if (it->second->lost_after.empty()) {
        result.status = absl::InvalidArgumentError(
            absl::StrCat(what, ": ", args.peer, " is not another member of ", Members(members)));
        return result;
      }
      for (const auto& [gen, lost] : it->second->lost_after) {
        if (lost.first == args.peer) return LostResult(what, *it->second, gen);
      }
      result.status = absl::InvalidArgumentError(
          absl::StrCat(what, ": ", args.peer, " is not another member of ", Members(members)));
      return result;
    }
    if (ops_.contains(args.op_id)) {
      result.status = absl::AlreadyExistsError(absl::StrCat("operation ", args.op_id, " is already running"));
      return result;
    }
    generation = it->second->generation;
    op = StartOp(args.op_id);
  }
  std::optional<peer::PriorityGate::Scope> scope;
  if (gate_ != nullptr) scope.emplace(gate_->Enter(args.peer, v1::EXCHANGE));
  Msg header;
  header.set_kind(Msg::P2P);
  header.set_group(args.group);
  header.set_generation(generation);
  header.set_tag(args.tag);
  const absl::Time deadline = start + args.timeout;
  ReadyFn filled;
  if (args.progress) {
    filled = [&](uint64_t end) {
      return WaitFilled(*args.progress, end, data.size(), deadline, op->stop, args.client_gone);
    };
  }
  // On this thread: one peer needs no sender thread, and a small message
  // should not wait for one to be scheduled. It stops at a segment boundary
  // once the op is cancelled or late.
  absl::Status s = SendMessage(args.peer, header, data, &op->stop, deadline, filled);
  if (s.ok() && scope) {
    HoldUntilSent(args.peer, *std::move(scope));
    scope.reset();
  }
  absl::MutexLock lock(&mu_);
  EndOp(args.op_id);
  auto it = groups_.find(args.group);
  if (it != groups_.end()) result.view = ViewOf(*it->second);
  if (!s.ok()) {
    if (s.code() == absl::StatusCode::kDeadlineExceeded) {  // its client stalled
      result.status = absl::DeadlineExceededError(
          absl::StrCat(what, " timed out after ", DurationText(args.timeout), ": ", s.message()));
    } else if (s.code() == absl::StatusCode::kAborted) {
      result.status = absl::CancelledError(absl::StrCat(what, ": ", s.message()));
    } else if (s.code() == absl::StatusCode::kResourceExhausted) {
      result.status = absl::ResourceExhaustedError(absl::StrCat(what, ": ", s.message()));
    } else if (s.code() == absl::StatusCode::kCancelled && !op->cancelled && !shutdown_) {
      result.status = absl::DeadlineExceededError(
          absl::StrCat(what, " timed out after ", DurationText(args.timeout)));
    } else if (s.code() == absl::StatusCode::kCancelled) {
      result.status = absl::CancelledError(absl::StrCat(what, " cancelled"));
    } else if (it != groups_.end() && it->second->generation != generation) {
      return LostResult(what, *it->second, generation);
    } else {
      result.status = absl::UnavailableError(absl::StrCat(what, ": ", s.message()));
    }
    return result;
  }
  result.stats.set_bytes_sent(data.size());
  result.stats.set_peers(1);
  result.stats.set_seconds(absl::ToDoubleSeconds(MonotonicNow() - start));
  result.stats.set_generation(generation);
  result.bytes = data.size();
  return result;
}

size_t ExchangeHub::receives_waiting() {
  absl::MutexLock lock(&mu_);
  size_t n = 0;
  for (const auto& [key, queue] : waiting_) n += queue.size();
  return n;
}

bool ExchangeHub::Withdraw(Landing& l) {
  using State = Landing::State;
  switch (l.state) {
    case State::kComplete:
      return true;
    case State::kWaiting: {
      auto w = waiting_.find(l.key);
      if (w == waiting_.end()) Broken("a waiting receive buffer is not in waiting_");
      auto& queue = w->second;
      auto self = std::find_if(queue.begin(), queue.end(),
                               [&](const std::shared_ptr<Landing>& x) { return x.get() == &l; });
      if (self == queue.end()) Broken("a waiting receive buffer is not in its queue");
      queue.erase(self);
      if (queue.empty()) waiting_.erase(w);
      l.state = State::kWithdrawn;
      return false;
    }
    case State::kFilling:
      break;
    case State::kHandingOver:
    case State::kWithdrawn:
      Broken("a receive buffer withdrawn twice");
  }
  l.state = State::kHandingOver;
  auto idle = [&l]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !l.writing; };
  if (!mu_.AwaitWithTimeout(absl::Condition(&idle), kSenderGrace)) {
    // The peer stalled inside a segment: cut its link so the read fails.
    // Abort only stops the socket, and the channel lives while its reader
    // is writing, so this is safe under mu_ (as in Shutdown).
    spdlog::warn("exchange: cutting the link from {}: a segment for a finished receive stalled",
                 l.channel->peer_site());
    l.channel->Abort();
    mu_.Await(absl::Condition(&idle));
  }
  if (l.filled == l.header.total_bytes()) {
    l.state = State::kComplete;
    return true;
  }
  // Keep the message for the next Recv: the reader carries on in a hub
  // buffer holding what arrived so far.
  const uint64_t total = l.header.total_bytes();
  std::optional<Payload> spill;
  absl::StatusOr<Unclaimed> claim =
      buffered_bytes_ + total <= options_.max_buffered_bytes
          ? TryClaim(l.from, total)
          : absl::ResourceExhaustedError(
                absl::StrCat(options_.max_buffered_bytes, " bytes already buffered"));
  if (claim.ok()) {
    l.spill_claim = *std::move(claim);
    buffered_bytes_ += total;
    // Unlocked: TakeBuffer takes mu_, and the copy may be large. The reader
    // waits while the landing is kHandingOver, so `out` and `filled` are
    // this thread's alone here.
    mu_.Unlock();
    spill = TakeBuffer(total);
    std::memcpy(spill->data(), l.out.data(), l.filled);
    mu_.Lock();
  } else {
    spdlog::warn("dropping a {}-byte exchange message from {} (group {}, tag '{}') whose receive "
                 "ended: {}",
                 total, l.from, l.header.group(), l.header.tag(), claim.status().message());
  }
  l.spill = std::move(spill);
  l.state = State::kWithdrawn;
  return false;
}

OpResult ExchangeHub::Recv(const P2PArgs& args, absl::Span<uint8_t> out) {
  using State = Landing::State;
  const absl::Time start = MonotonicNow();
  const absl::Time deadline = start + args.timeout;
  OpResult result;
  const std::string what =
      absl::StrCat("receive from ", args.peer, " tag '", args.tag, "' in group ", args.group);
  const std::string key = Key(args.group, Msg::P2P, args.peer, args.tag);
  absl::MutexLock lock(&mu_);
  auto it = groups_.find(args.group);
  if (it == groups_.end() || !it->second->formed) {
    result.status =
        absl::FailedPreconditionError(absl::StrCat("this site has not joined group ", args.group));
    return result;
  }
  if (ops_.contains(args.op_id)) {
    result.status = absl::AlreadyExistsError(absl::StrCat("operation ", args.op_id, " is already running"));
    return result;
  }
  const uint64_t generation = it->second->generation;
  {
    const auto& members = it->second->members;
    if (args.peer == local_site_ ||
        std::find(members.begin(), members.end(), args.peer) == members.end()) {
      for (const auto& [gen, lost] : it->second->lost_after) {
        if (lost.first == args.peer) return LostResult(what, *it->second, gen);
      }
      result.status = absl::InvalidArgumentError(
          absl::StrCat(what, ": ", args.peer, " is not another member of ", Members(members)));
      return result;
    }
  }
  std::shared_ptr<Op> op = StartOp(args.op_id);
  auto peer_gone = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto g = groups_.find(args.group);
    if (g == groups_.end()) return true;
    const auto& m = g->second->members;
    return std::find(m.begin(), m.end(), args.peer) == m.end();
  };
  auto queued = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto m = mailbox_.find(key);
    return m != mailbox_.end() && !m->second.empty();
  };
  // Offer `out` to the next message under the key, unless one is already
  // here for this call to take.
  std::shared_ptr<Landing> landing;
  if (!queued()) {
    landing = std::make_shared<Landing>();
    landing->key = key;
    landing->out = out;
    landing->progress = args.progress;
    waiting_[key].push_back(landing);
  }
  auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (shutdown_ || op->cancelled || peer_gone()) return true;
    if (landing && landing->state == State::kComplete) return true;
    // Bound to a message that is arriving: that one is this call's.
    if (landing && landing->state == State::kFilling) return false;
    return queued();
  };
  while (!ready() && MonotonicNow() < deadline) {
    mu_.AwaitWithTimeout(absl::Condition(&ready), std::min(deadline - MonotonicNow(), kPoll));
    if (!op->cancelled && args.client_gone && args.client_gone()) op->cancelled = true;
  }
  EndOp(args.op_id);
  // From here on the hub no longer touches `out` (whatever the outcome).
  const bool landed = landing && Withdraw(*landing);
  auto m = mailbox_.find(key);
  it = groups_.find(args.group);
  if (it != groups_.end()) result.view = ViewOf(*it->second);
  auto succeed = [&](uint64_t bytes) {
    result.bytes = bytes;
    result.stats.set_bytes_received(bytes);
    result.stats.set_peers(1);
    result.stats.set_seconds(absl::ToDoubleSeconds(MonotonicNow() - start));
    result.stats.set_generation(generation);
  };
  if (landed) {
    succeed(landing->header.total_bytes());
    return result;
  }
  if (m != mailbox_.end() && !m->second.empty()) {
    Message msg = std::move(m->second.front());
    m->second.pop_front();
    if (m->second.empty()) mailbox_.erase(m);
    buffered_bytes_ -= msg.payload.size();
    if (msg.payload.size() > out.size()) {
      result.status = absl::InvalidArgumentError(
          absl::StrCat(what, ": the message is ", msg.payload.size(), " bytes, the buffer holds ",
                       out.size(), " (the message is dropped)"));
      return result;
    }
    // A new epoch: whatever the client copied of a message that was bound
    // to `out` earlier is stale.
    const uint32_t epoch = landing ? landing->epoch + 1 : 1;
    // Unlocked: the message is this call's alone now, and the inbound
    // readers should not wait for a large copy.
    mu_.Unlock();
    std::memcpy(out.data(), msg.payload.data(), msg.payload.size());
    if (args.progress) args.progress->PublishLanded({epoch, msg.payload.size()});
    mu_.Lock();
    succeed(msg.payload.size());
    Recycle(std::move(msg.payload));
    return result;
  }
  if (op->cancelled) {
    result.status = absl::CancelledError(absl::StrCat(what, " cancelled"));
  } else if (shutdown_) {
    result.status = absl::UnavailableError(absl::StrCat(what, ": the daemon is shutting down"));
  } else if (peer_gone()) {
    if (it == groups_.end()) {
      result.status = absl::CancelledError(absl::StrCat(what, ": this site left the group"));
    } else {
      return LostResult(what, *it->second, generation);
    }
  } else {
    result.status = absl::DeadlineExceededError(
        absl::StrCat(what, " timed out after ", DurationText(args.timeout)));
  }
  return result;
}

}  // namespace longhaul::exchange
