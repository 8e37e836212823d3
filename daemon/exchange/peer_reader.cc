#include "daemon/exchange/peer_reader.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "daemon/exchange/exchange_types.h"
#include "daemon/wire/messaging.h"

namespace longhaul::exchange {

using Msg = v1::ExchangePeerMessage;

absl::StatusOr<SegmentTracker::Step> SegmentTracker::OnHeader(const Msg& h) {
  if (h.total_bytes() == 0) {
    if (h.kind() != Msg::DISCARD) return Step::kMessage;
    received_.erase(h.msg_id());
    return Step::kDiscard;
  }
  if (h.payload_bytes() == 0 || h.payload_bytes() > kSegmentBytes ||
      h.total_bytes() > max_message_bytes_ || h.offset() > h.total_bytes() ||
      h.payload_bytes() > h.total_bytes() - h.offset()) {
    return absl::InvalidArgumentError(absl::StrCat(from_, " sent a malformed exchange segment (",
                                                   h.offset(), "+", h.payload_bytes(), " of ",
                                                   h.total_bytes(), " bytes)"));
  }
  const uint64_t end = h.offset() + h.payload_bytes();
  auto it = received_.find(h.msg_id());
  Step step = Step::kNext;
  if (it == received_.end()) {
    if (h.offset() != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(from_, " sent a segment of an exchange message it never started"));
    }
    step = Step::kFirst;
    it = received_.emplace(h.msg_id(), Progress{h.total_bytes(), 0}).first;
  } else if (h.offset() != it->second.received || h.total_bytes() != it->second.total) {
    return absl::InvalidArgumentError(absl::StrCat(from_, " sent exchange segments out of order"));
  }
  it->second.received = end;
  if (end == it->second.total) received_.erase(it);
  return step;
}

absl::Status ReadPeerMessages(transport::Channel& channel, uint64_t max_message_bytes,
                              InboundSink& sink) {
  const std::string from = channel.peer_site();
  SegmentTracker tracker(from, max_message_bytes);
  // Messages whose segments are still arriving, by msg_id.
  struct Partial {
    uint64_t total = 0;
    uint64_t received = 0;
    std::unique_ptr<InboundSink::Incoming> in;
  };
  absl::flat_hash_map<uint64_t, Partial> partial;
  std::vector<uint8_t> scratch;
  absl::Status result;
  while (true) {
    Msg h;
    if (absl::Status s =
            wire::ReadProto(channel, wire::FrameType::kControl, 0, kMaxPeerHeaderBytes, &h);
        !s.ok()) {
      result = s;
      break;
    }
    auto step = tracker.OnHeader(h);
    if (!step.ok()) {
      result = step.status();
      break;
    }
    if (*step == SegmentTracker::Step::kMessage) {
      sink.OnMessage(from, h);
      continue;
    }
    if (*step == SegmentTracker::Step::kDiscard) {
      if (auto it = partial.find(h.msg_id()); it != partial.end()) {
        sink.Abandon(std::move(it->second.in));
        partial.erase(it);
      }
      continue;
    }
    if (*step == SegmentTracker::Step::kFirst) {
      partial[h.msg_id()] = Partial{h.total_bytes(), 0, sink.Begin(from, h)};
    }
    Partial& p = partial.at(h.msg_id());
    const uint64_t end = h.offset() + h.payload_bytes();
    absl::Status read;
    while (read.ok() && p.received < end) {
      std::optional<absl::Span<uint8_t>> into = sink.Into(*p.in, p.received, end, channel);
      absl::Span<uint8_t> span;
      if (into && !into->empty()) {
        span = *into;
      } else {
        scratch.resize(end - p.received);
        span = absl::MakeSpan(scratch);
      }
      read = channel.ReadExactly(span);
      sink.Read(*p.in, span.size(), read.ok());
      if (read.ok()) p.received += span.size();
    }
    if (!read.ok()) {
      result = read;
      break;
    }
    if (p.received == p.total) {
      sink.Complete(from, std::move(p.in));
      partial.erase(h.msg_id());
    }
  }
  for (auto& [id, p] : partial) sink.Abandon(std::move(p.in));
  return result;
}

}  // namespace longhaul::exchange
