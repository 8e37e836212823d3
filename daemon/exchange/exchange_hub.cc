#include "daemon/exchange/exchange_hub.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/fmt_absl.h"
#include "spdlog/spdlog.h"

namespace longhaul::exchange {

using Msg = v1::ExchangePeerMessage;

ExchangeHub::ExchangeHub(std::string local_site, std::vector<std::string> peers, Dialer dialer,
                         peer::PriorityGate* gate, HubOptions options, peer::RateLimiter* limiter,
                         const Clock& clock)
    : local_site_(std::move(local_site)),
      options_(options),
      state_(local_site_, options_, clock),
      links_(
          local_site_, std::move(dialer), limiter,
          [this](const std::string& site, const std::string& reason) { PeerLost(site, reason); },
          clock, options_.uplink),
      operations_(
          local_site_, std::move(peers), &state_, &links_, gate,
          [this](const std::string& site, const std::string& reason) { PeerLost(site, reason); },
          options_.sharded_all_reduce) {}

ExchangeHub::~ExchangeHub() { Shutdown(); }

void ExchangeHub::ServeInbound(std::unique_ptr<transport::Channel> channel) {
  links_.Serve(std::move(channel), options_.max_message_bytes, *this);
}

void ExchangeHub::PeerLost(const std::string& site, const std::string& reason) {
  absl::MutexLock lock(&state_.mu);
  if (state_.shutdown) return;
  links_.Drop(site);
  state_.membership.PeerLost(site, reason);
}

void ExchangeHub::OnMessage(const std::string& from, const Msg& h) {
  if (h.kind() == Msg::REFUSED) {
    links_.Refused(from, h);
    return;
  }
  absl::Status refused;
  {
    absl::MutexLock lock(&state_.mu);
    if (!state_.membership.Admits(from, h)) {
      spdlog::debug("exchange: dropping a message for group {} from {}, not a member", h.group(),
                    from);
      return;
    }
    // A zero-byte message a Recv is waiting for is not unclaimed.
    Unclaimed claim;
    if (h.kind() != Msg::P2P ||
        !state_.mailbox.HasWaiting(Mailbox::Key(h.group(), Msg::P2P, from, h.tag()))) {
      auto c = state_.mailbox.TryClaim(from, 0);
      if (c.ok()) {
        claim = *std::move(c);
      } else {
        refused = c.status();
      }
    }
    if (refused.ok()) Deliver(from, h, {}, std::move(claim));
  }
  if (!refused.ok()) links_.Refuse(from, h.msg_id(), refused);
}

std::unique_ptr<InboundSink::Incoming> ExchangeHub::Begin(const std::string& from, const Msg& h) {
  auto a = std::make_unique<Arrival>();
  a->from = from;
  a->header = h;
  bool over_memory = false;
  absl::Status refused;
  {
    absl::MutexLock lock(&state_.mu);
    if (h.kind() == Msg::P2P) {
      // The first Recv waiting under this key takes the message in its own
      // buffer if it fits, unless an earlier message is queued for that
      // Recv to take first.
      a->landing = state_.mailbox.Bind(Mailbox::Key(h.group(), Msg::P2P, from, h.tag()), from, h);
    }
    if (!a->landing) {
      if (!state_.membership.Admits(from, h)) {
        a->dropped = true;
        spdlog::debug("exchange: dropping a message for group {} from {}, not a member", h.group(),
                      from);
      } else if (!state_.mailbox.TryBuffer(h.total_bytes())) {
        a->dropped = true;
        over_memory = true;
      } else if (auto c = state_.mailbox.TryClaim(from, h.total_bytes()); !c.ok()) {
        state_.mailbox.Unbuffer(h.total_bytes());
        a->dropped = true;
        refused = c.status();
      } else {
        a->claim = *std::move(c);
      }
    }
  }
  if (over_memory) {
    spdlog::warn("dropping a {}-byte exchange message from {}: {} bytes already buffered",
                 h.total_bytes(), from, options_.max_buffered_bytes);
  } else if (!refused.ok()) {
    links_.Refuse(from, h.msg_id(), refused);
  } else if (!a->dropped && !a->landing) {
    a->payload = state_.pool.Take(h.total_bytes());
  }
  return a;
}

std::optional<absl::Span<uint8_t>> ExchangeHub::Into(Incoming& in, uint64_t received, uint64_t end,
                                                     transport::Channel& channel) {
  absl::MutexLock lock(&state_.mu);
  return state_.mailbox.Into(static_cast<Arrival&>(in), received, end, channel, state_.mu);
}

void ExchangeHub::Read(Incoming& in, uint64_t bytes, bool ok) {
  Arrival& a = static_cast<Arrival&>(in);
  if (!a.landing) return;  // only this reader changes a.landing
  absl::MutexLock lock(&state_.mu);
  bytes_in_place_ += state_.mailbox.Read(a, bytes, ok);
}

void ExchangeHub::Complete(const std::string& from, std::unique_ptr<Incoming> in) {
  Arrival& a = static_cast<Arrival&>(*in);
  if (a.dropped || a.landing) return;  // a landed one is the Recv's already
  absl::MutexLock lock(&state_.mu);
  Deliver(from, std::move(a.header), std::move(a.payload), std::move(a.claim));
}

void ExchangeHub::Abandon(std::unique_ptr<Incoming> in) {
  absl::MutexLock lock(&state_.mu);
  state_.mailbox.Abandon(static_cast<Arrival&>(*in), state_.mu);
}

void ExchangeHub::Deliver(const std::string& from, Msg header, Payload payload, Unclaimed claim) {
  // Delivered payload bytes stay counted as buffered until taken.
  auto drop = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_.mu) {
    state_.mailbox.Unbuffer(payload.size());
  };
  if (!state_.membership.Admits(from, header)) {
    drop();
    return;
  }
  const Group* g = state_.membership.Find(header.group());
  std::string key;
  switch (header.kind()) {
    case Msg::JOIN: {
      // A new JOIN replaces what the site sent before.
      key = Mailbox::Key(header.group(), Msg::JOIN, from, "");
      state_.mailbox.Erase(key);
      break;
    }
    case Msg::REDUCE_DATA:
    case Msg::REDUCE_RESULT:
    case Msg::GATHER_DATA:
    case Msg::BCAST_DATA:
    case Msg::ABORT:
    case Msg::DONE:
      if (g != nullptr && g->formed &&
          (header.generation() < g->generation || g->finished.contains(header.seq()))) {
        drop();  // an op this site already ended, or an older generation's
        return;
      }
      key = Mailbox::Key(header.group(), header.kind(), from, absl::StrCat(header.seq()));
      break;
    case Msg::P2P:
      key = Mailbox::Key(header.group(), Msg::P2P, from, header.tag());
      break;
    default:
      drop();
      return;
  }
  state_.mailbox.File(key, Message{from, std::move(header), std::move(payload), std::move(claim)});
}

absl::StatusOr<v1::GroupView> ExchangeHub::Join(const std::string& group,
                                                std::vector<std::string> sites,
                                                absl::Duration timeout) {
  return operations_.Join(group, std::move(sites), timeout);
}

void ExchangeHub::Leave(const std::string& group) {
  absl::MutexLock lock(&state_.mu);
  state_.membership.Leave(group);
  // What the group's sites sent that no call took is stale now, but a JOIN
  // is not: Join erases the JOINs it formed with, so one held now was sent
  // for the next formation (a site that left and is re-joining already).
  state_.mailbox.DropIf([&](const Message& m) {
    return m.header.group() == group && m.header.kind() != v1::ExchangePeerMessage::JOIN;
  });
}

absl::StatusOr<v1::GroupView> ExchangeHub::View(const std::string& group) {
  absl::MutexLock lock(&state_.mu);
  const Group* g = state_.membership.Formed(group);
  if (g == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat("this site has not joined group ", group));
  }
  return state_.membership.ViewOf(*g);
}

OpResult ExchangeHub::AllReduce(const AllReduceArgs& args, absl::Span<uint8_t> buffer) {
  return operations_.AllReduce(args, buffer);
}

OpResult ExchangeHub::AllGather(const GatherArgs& args, absl::Span<const uint8_t> input,
                                absl::Span<uint8_t> output) {
  return operations_.AllGather(args, input, output);
}

OpResult ExchangeHub::Broadcast(const GatherArgs& args, absl::Span<uint8_t> buffer) {
  return operations_.Broadcast(args, buffer);
}

OpResult ExchangeHub::Send(const P2PArgs& args, absl::Span<const uint8_t> data) {
  return operations_.Send(args, data);
}

OpResult ExchangeHub::Recv(const P2PArgs& args, absl::Span<uint8_t> out) {
  return operations_.Recv(args, out);
}

bool ExchangeHub::Cancel(const std::string& op_id) {
  absl::MutexLock lock(&state_.mu);
  auto it = state_.ops.find(op_id);
  if (it == state_.ops.end()) return false;
  it->second->cancelled = true;
  it->second->stop = true;
  return true;
}

void ExchangeHub::Shutdown() {
  {
    absl::MutexLock lock(&state_.mu);
    if (state_.shutdown) return;
    state_.shutdown = true;
    for (auto& [id, op] : state_.ops) op->stop = true;
  }
  links_.Shutdown();
}

size_t ExchangeHub::receives_waiting() {
  absl::MutexLock lock(&state_.mu);
  return state_.mailbox.waiting();
}

size_t ExchangeHub::messages_held() {
  absl::MutexLock lock(&state_.mu);
  return state_.mailbox.held();
}

uint32_t ExchangeHub::unclaimed_messages(const std::string& site) {
  absl::MutexLock lock(&state_.mu);
  return state_.mailbox.unclaimed_messages(site);
}

}  // namespace longhaul::exchange
