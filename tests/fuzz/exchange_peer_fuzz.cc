// Fuzzes the reader of an exchange link (daemon/exchange/peer_reader.h,
// proto/EXCHANGE.md) with bytes as a peer could send them: frames holding
// ExchangePeerMessages, each segment followed by its payload. The channel is
// the input itself, so ReadPeerMessages runs unchanged. Beyond "no crash, no
// sanitizer report", a checking sink asserts the reader's contract: only
// whole messages without payload reach OnMessage; every message with
// payload starts at offset 0, stays within its total and the size limit, is
// read in order with no byte twice, and ends exactly once (Complete after
// its last byte, or Abandon); the reader stops with an error at the end of
// the input. Every REDUCE_DATA and REDUCE_RESULT header that reaches the
// sink also goes through the sharded all-reduce's checks
// (daemon/exchange/shards.h), which must accept exactly a message holding
// the expected shard's bytes and never crash on any field; every GATHER_DATA
// and BCAST_DATA header goes through the all-gather's and broadcast's
// checks (daemon/exchange/gather.h) the same way.

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "daemon/exchange/gather_checks.h"
#include "daemon/exchange/peer_reader.h"
#include "daemon/exchange/shards.h"
#include "daemon/transport/transport.h"

namespace {

using longhaul::exchange::InboundSink;
using Msg = longhaul::v1::ExchangePeerMessage;

constexpr uint64_t kMaxMessageBytes = 16ull << 20;
constexpr uint64_t kSegmentBytes = 4ull << 20;

void Fail(const char* what) {
  std::fprintf(stderr, "exchange_peer_fuzz: contract broken: %s\n", what);
  std::abort();
}

// Runs the sharded all-reduce's checks on a peer's header as a member of a
// 3-site group would (generation 1, 3001 float32 elements, owning shard 1),
// and holds them to their contract.
void CheckShardHeader(const Msg& h) {
  using longhaul::exchange::CheckShardMessage;
  using longhaul::exchange::ReduceCall;
  using longhaul::exchange::ShardOf;
  if (h.kind() != Msg::REDUCE_DATA && h.kind() != Msg::REDUCE_RESULT) return;
  ReduceCall call;
  call.generation = 1;
  call.dtype = longhaul::v1::FLOAT32;
  call.op = longhaul::v1::SUM;
  call.count = 3001;
  call.tag = "";
  call.shards = 3;
  const uint32_t want = 1;
  const absl::Status s = CheckShardMessage("fuzz", "site-b", h, h.total_bytes(), call, want, 0);
  const bool fits = h.generation() == 1 && h.dtype() == call.dtype && h.op() == call.op &&
                    h.count() == call.count && !h.quantized() && h.tag().empty() &&
                    h.shards() == 3 && h.shard() == want && h.piece() == 0 &&
                    h.total_bytes() == 1000 * 4;
  if (s.ok() != fits) Fail("a shard check accepted a wrong header or refused a right one");
  // The shards of any count and number tile the buffer.
  const uint32_t shards = static_cast<uint32_t>(h.shards() % 1024) + 1;
  uint64_t end = 0;
  for (uint32_t k = 0; k < shards; k += std::max<uint32_t>(1, shards / 8)) {
    const auto r = ShardOf(h.count(), shards, k);
    if (r.begin > r.end || r.end > h.count()) Fail("a shard outside the buffer");
    if (k == 0 && r.begin != 0) Fail("shard 0 does not start the buffer");
    end = r.end;
  }
  if (ShardOf(h.count(), shards, shards - 1).end != h.count()) Fail("the last shard ends early");
  // The pieces of a shard tile it, in order (a buffer is far below 2^40
  // elements: its pieces are counted in 32 bits).
  const auto shard = ShardOf(h.count() % (1ull << 40), shards, 0);
  const uint32_t pieces = longhaul::exchange::PieceCount(shard, 4);
  if (longhaul::exchange::PieceOf(shard, 4, 0).begin != shard.begin ||
      longhaul::exchange::PieceOf(shard, 4, pieces - 1).end != shard.end) {
    Fail("the pieces do not tile their shard");
  }
  (void)end;
}

// Runs the all-gather's or broadcast's checks on a peer's header as a
// member would that gathers 4096 bytes per member (or is broadcast 4096
// bytes from site-b) at generation 1, and holds them to their contract.
void CheckGatherHeader(const Msg& h) {
  if (h.kind() != Msg::GATHER_DATA && h.kind() != Msg::BCAST_DATA) return;
  longhaul::exchange::GatherCall call;
  call.kind = h.kind();
  call.generation = 1;
  call.bytes = 4096;
  call.root = h.kind() == Msg::BCAST_DATA ? "site-b" : "";
  const absl::Status s =
      longhaul::exchange::CheckGatherMessage("fuzz", "site-b", h, h.total_bytes(), call);
  const bool fits = h.generation() == 1 && h.tag().empty() && h.count() == 4096 &&
                    h.total_bytes() == 4096 &&
                    (h.kind() == Msg::GATHER_DATA || h.root() == "site-b");
  if (s.ok() != fits) Fail("a gather check accepted a wrong header or refused a right one");
}

// The fuzz input as the inbound channel of site "site-b".
class BytesChannel final : public longhaul::transport::Channel {
 public:
  BytesChannel(const uint8_t* data, size_t size) : data_(data), size_(size) {}

  absl::Status Write(absl::Span<const absl::Span<const uint8_t>>) override {
    return absl::OkStatus();
  }
  absl::Status ReadExactly(absl::Span<uint8_t> out) override {
    if (out.size() > size_ - pos_) {
      pos_ = size_;
      return absl::UnavailableError("site-b closed the connection");
    }
    if (!out.empty()) std::memcpy(out.data(), data_ + pos_, out.size());
    pos_ += out.size();
    return absl::OkStatus();
  }
  void Abort() override {}
  const std::string& peer_site() const override { return site_; }
  const std::string& peer_address() const override { return address_; }
  longhaul::transport::LinkStats Stats() const override { return {}; }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
  std::string site_ = "site-b";
  std::string address_ = "fuzz";
};

class CheckingSink final : public InboundSink {
 public:
  struct Arriving : Incoming {
    explicit Arriving(CheckingSink* sink, uint64_t total) : sink(sink), total(total) {
      ++sink->open;
    }
    ~Arriving() override { --sink->open; }
    CheckingSink* sink;
    uint64_t total;
    uint64_t read = 0;       // bytes read so far, in order
    uint64_t asked_end = 0;  // `end` of the last Into
    bool in_place = false;   // the last Into gave a buffer (not a drop)
    bool ended = false;
  };

  void OnMessage(const std::string& from, const Msg& h) override {
    if (from != "site-b") Fail("a message from another site than the channel's");
    if (h.total_bytes() != 0) Fail("OnMessage for a message with payload");
    if (h.kind() == Msg::DISCARD) Fail("OnMessage for a DISCARD");
    CheckShardHeader(h);
    CheckGatherHeader(h);
  }
  std::unique_ptr<Incoming> Begin(const std::string& from, const Msg& h) override {
    if (from != "site-b") Fail("Begin from another site than the channel's");
    if (h.total_bytes() == 0 || h.total_bytes() > kMaxMessageBytes) Fail("Begin past the limits");
    if (h.offset() != 0) Fail("a message begun at a segment after its first");
    if (h.payload_bytes() == 0 || h.payload_bytes() > kSegmentBytes ||
        h.payload_bytes() > h.total_bytes()) {
      Fail("a first segment of a size outside (0, segment, total]");
    }
    CheckShardHeader(h);
    CheckGatherHeader(h);
    ++begun;
    return std::make_unique<Arriving>(this, h.total_bytes());
  }
  std::optional<absl::Span<uint8_t>> Into(Incoming& in, uint64_t received, uint64_t end,
                                          longhaul::transport::Channel&) override {
    auto& a = static_cast<Arriving&>(in);
    if (a.ended) Fail("Into after the message ended");
    if (received != a.read) Fail("Into skips or repeats bytes");
    if (received >= end || end > a.total) Fail("Into outside the message");
    a.asked_end = end;
    // Alternate between reading in place, in short pieces, and dropping.
    a.in_place = (received / 7 + calls++) % 2 == 0;
    if (!a.in_place) return std::nullopt;
    return absl::MakeSpan(piece_).subspan(0, std::min<uint64_t>(piece_.size(), end - received));
  }
  void Read(Incoming& in, uint64_t bytes, bool ok) override {
    auto& a = static_cast<Arriving&>(in);
    if (!ok) return;
    if (bytes == 0 || a.read + bytes > a.asked_end) Fail("a read past what Into asked for");
    a.read += bytes;
  }
  void Complete(const std::string& from, std::unique_ptr<Incoming> in) override {
    auto& a = static_cast<Arriving&>(*in);
    if (from != "site-b") Fail("Complete from another site than the channel's");
    if (a.read != a.total) Fail("Complete before every byte was read");
    a.ended = true;
    ++completed;
  }
  void Abandon(std::unique_ptr<Incoming> in) override {
    auto& a = static_cast<Arriving&>(*in);
    if (a.read >= a.total) Fail("Abandon of a message read whole");
    a.ended = true;
    ++abandoned;
  }

  int open = 0;
  uint64_t begun = 0;
  uint64_t completed = 0;
  uint64_t abandoned = 0;

 private:
  std::array<uint8_t, 4096> piece_;
  uint64_t calls = 0;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  BytesChannel channel(data, size);
  CheckingSink sink;
  absl::Status s = longhaul::exchange::ReadPeerMessages(channel, kMaxMessageBytes, sink);
  if (s.ok()) Fail("the reader returned OK");
  if (sink.open != 0) Fail("a message neither completed nor abandoned");
  if (sink.begun != sink.completed + sink.abandoned) Fail("a message ended twice or never");
  return 0;
}
