#include "daemon/exchange/mailbox.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/check.h"
#include "common/fmt_absl.h"
#include "daemon/exchange/deadline.h"
#include "spdlog/spdlog.h"

namespace longhaul::exchange {
namespace {

using State = Landing::State;

}  // namespace

Unclaimed::Unclaimed(peer::MemoryReservation bytes, std::shared_ptr<PeerUse> use)
    : bytes_(std::move(bytes)), use_(std::move(use)) {
  use_->messages.fetch_add(1);
}

Unclaimed& Unclaimed::operator=(Unclaimed&& other) noexcept {
  if (this != &other) {
    Reset();
    bytes_ = std::move(other.bytes_);
    use_ = std::move(other.use_);
  }
  return *this;
}

void Unclaimed::Reset() {
  if (use_) use_->messages.fetch_sub(1);
  use_.reset();
  bytes_ = {};
}

Payload BufferPool::Take(uint64_t bytes) {
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

void BufferPool::Recycle(Payload payload) {
  if (payload.capacity() < kMinSpareBytes || payload.capacity() > kSpareBytes) return;
  absl::MutexLock lock(&mu_);
  while (!spare_.empty() && spare_bytes_ + payload.capacity() > kSpareBytes) {
    spare_bytes_ -= spare_.front().capacity();
    spare_.erase(spare_.begin());
  }
  spare_bytes_ += payload.capacity();
  spare_.push_back(std::move(payload));
}

std::string Mailbox::Key(absl::string_view group, int kind, absl::string_view from,
                         absl::string_view id) {
  return absl::StrCat(group, "\x1f", kind, "\x1f", from, "\x1f", id);
}

bool Mailbox::Has(const std::string& key) const {
  auto it = messages_.find(key);
  return it != messages_.end() && !it->second.empty();
}

const Message* Mailbox::Front(const std::string& key) const {
  auto it = messages_.find(key);
  return it == messages_.end() || it->second.empty() ? nullptr : &it->second.front();
}

Message Mailbox::Take(const std::string& key) {
  auto it = messages_.find(key);
  LONGHAUL_CHECK(it != messages_.end() && !it->second.empty())
      << "a message taken that is not there";
  Message m = std::move(it->second.front());
  it->second.pop_front();
  if (it->second.empty()) messages_.erase(it);
  buffered_bytes_ -= m.payload.size();
  return m;
}

void Mailbox::File(const std::string& key, Message message) {
  messages_[key].push_back(std::move(message));
}

void Mailbox::Erase(const std::string& key) {
  if (auto m = messages_.find(key); m != messages_.end()) {
    for (const auto& msg : m->second) buffered_bytes_ -= msg.payload.size();
    messages_.erase(m);
  }
}

void Mailbox::DropIf(absl::FunctionRef<bool(const Message&)> drop) {
  for (auto it = messages_.begin(); it != messages_.end();) {
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
    if (queue.empty()) messages_.erase(it);
    it = next;
  }
}

absl::StatusOr<Unclaimed> Mailbox::TryClaim(const std::string& from, uint64_t bytes) {
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
      return absl::ResourceExhaustedError(
          absl::StrCat("a ", bytes, "-byte exchange message from ", from, " would take what ", from,
                       " holds at ", local_site_, " (", options_.memory_budget->used(from),
                       " bytes) past peer_limits.memory_per_peer (",
                       options_.memory_budget->bytes_per_peer(), " bytes)"));
    }
  }
  return Unclaimed(std::move(reserved), use);
}

bool Mailbox::TryBuffer(uint64_t bytes) {
  if (buffered_bytes_ + bytes > options_.max_buffered_bytes) return false;
  buffered_bytes_ += bytes;
  return true;
}

void Mailbox::Offer(std::shared_ptr<Landing> landing) {
  std::string key = landing->key;
  waiting_[key].push_back(std::move(landing));
}

std::shared_ptr<Landing> Mailbox::Bind(const std::string& key, const std::string& from,
                                       const v1::ExchangePeerMessage& header) {
  auto w = waiting_.find(key);
  if (w == waiting_.end() || Has(key) || w->second.front()->out.size() < header.total_bytes()) {
    return nullptr;
  }
  std::shared_ptr<Landing> landing = std::move(w->second.front());
  w->second.pop_front();
  if (w->second.empty()) waiting_.erase(w);
  landing->state = State::kFilling;
  landing->from = from;
  landing->header = header;
  landing->filled = 0;
  ++landing->epoch;
  landing->Publish();
  return landing;
}

size_t Mailbox::waiting() const {
  size_t n = 0;
  for (const auto& [key, queue] : waiting_) n += queue.size();
  return n;
}

size_t Mailbox::held() const {
  size_t n = 0;
  for (const auto& [key, queue] : messages_) n += queue.size();
  return n;
}

uint32_t Mailbox::unclaimed_messages(const std::string& site) const {
  auto it = unclaimed_.find(site);
  return it == unclaimed_.end() ? 0 : it->second->messages.load();
}

bool Mailbox::Withdraw(Landing& l, absl::Mutex& mu) {
  switch (l.state) {
    case State::kComplete:
      return true;
    case State::kWaiting: {
      auto w = waiting_.find(l.key);
      LONGHAUL_CHECK(w != waiting_.end()) << "a waiting receive buffer is not offered";
      auto& queue = w->second;
      auto self = std::find_if(queue.begin(), queue.end(),
                               [&](const std::shared_ptr<Landing>& x) { return x.get() == &l; });
      LONGHAUL_CHECK(self != queue.end()) << "a waiting receive buffer is not in its queue";
      queue.erase(self);
      if (queue.empty()) waiting_.erase(w);
      l.state = State::kWithdrawn;
      return false;
    }
    case State::kFilling:
      break;
    case State::kHandingOver:
    case State::kWithdrawn:
      LONGHAUL_CHECK(false) << "a receive buffer withdrawn twice";
  }
  l.state = State::kHandingOver;
  auto idle = [&l]() { return !l.writing; };
  if (!AwaitUntil(mu, absl::Condition(&idle), clock_, After(clock_.Now(), kSenderGrace))) {
    // The peer stalled inside a segment: cut its link so the read fails.
    // Abort only stops the socket, and the channel lives while its reader
    // is writing, so this is safe under mu (as in Links::Shutdown).
    spdlog::warn("exchange: cutting the link from {}: a segment for a finished receive stalled",
                 l.channel->peer_site());
    l.channel->Abort();
    mu.Await(absl::Condition(&idle));
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
    // Unlocked: the copy may be large. The reader waits while the landing
    // is kHandingOver, so `out` and `filled` are this thread's alone here.
    mu.Unlock();
    spill = pool_->Take(total);
    std::memcpy(spill->data(), l.out.data(), l.filled);
    mu.Lock();
  } else {
    spdlog::warn(
        "dropping a {}-byte exchange message from {} (group {}, tag '{}') whose receive "
        "ended: {}",
        total, l.from, l.header.group(), l.header.tag(), claim.status().message());
  }
  l.spill = std::move(spill);
  l.state = State::kWithdrawn;
  return false;
}

void Mailbox::Settle(Arrival& a, absl::Mutex& mu) {
  if (!a.landing) return;
  Landing* l = a.landing.get();
  mu.Await(absl::Condition(
      +[](Landing* l) { return l->state != State::kHandingOver; }, l));
  if (l->state != State::kWithdrawn) return;
  if (l->spill) {
    a.payload = std::move(*l->spill);
    a.claim = std::move(l->spill_claim);
  } else {
    a.dropped = true;
  }
  l->spill.reset();
  a.landing.reset();
}

std::optional<absl::Span<uint8_t>> Mailbox::Into(Arrival& a, uint64_t received, uint64_t end,
                                                 transport::Channel& channel, absl::Mutex& mu) {
  Settle(a, mu);
  if (a.landing) {
    // Within `out`: the bound message fits it, and `end` is within the message.
    a.landing->writing = true;
    a.landing->channel = &channel;
    return a.landing->out.subspan(received, std::min<uint64_t>(kInPlacePieceBytes, end - received));
  }
  if (a.dropped) return std::nullopt;
  return absl::MakeSpan(a.payload).subspan(received, end - received);
}

uint64_t Mailbox::Read(Arrival& a, uint64_t bytes, bool ok) {
  if (!a.landing) return 0;
  Landing& l = *a.landing;
  l.writing = false;
  l.channel = nullptr;
  if (!ok) return 0;
  l.filled += bytes;
  // The Recv is still there: it waits for `writing` to clear.
  l.Publish();
  // A Recv handing it over sees `filled` reach the total itself.
  if (l.filled == l.header.total_bytes() && l.state == State::kFilling) l.state = State::kComplete;
  return bytes;
}

void Mailbox::Abandon(Arrival& a, absl::Mutex& mu) {
  Settle(a, mu);
  if (a.landing) {
    Landing& l = *a.landing;
    l.state = State::kWaiting;
    l.filled = 0;
    ++l.epoch;  // what the client copied of the unbound message is stale
    l.Publish();
    waiting_[l.key].push_front(std::move(a.landing));
  } else if (!a.dropped) {
    buffered_bytes_ -= a.payload.size();
  }
}

}  // namespace longhaul::exchange
