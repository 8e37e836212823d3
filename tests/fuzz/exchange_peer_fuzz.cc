// Fuzzes the reader of an exchange link (daemon/exchange/peer_reader.h,
// proto/EXCHANGE.md) with bytes as a peer could send them: frames holding
// ExchangePeerMessages, each segment followed by its payload. The channel is
// the input itself, so ReadPeerMessages runs unchanged. Beyond "no crash, no
// sanitizer report", a checking sink asserts the reader's contract: only
// whole messages without payload reach OnMessage; every message with
// payload starts at offset 0, stays within its total and the size limit, is
// read in order with no byte twice, and ends exactly once (Complete after
// its last byte, or Abandon); the reader stops with an error at the end of
// the input.

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
#include "daemon/exchange/peer_reader.h"
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
  }
  std::unique_ptr<Incoming> Begin(const std::string& from, const Msg& h) override {
    if (from != "site-b") Fail("Begin from another site than the channel's");
    if (h.total_bytes() == 0 || h.total_bytes() > kMaxMessageBytes) Fail("Begin past the limits");
    if (h.offset() != 0) Fail("a message begun at a segment after its first");
    if (h.payload_bytes() == 0 || h.payload_bytes() > kSegmentBytes ||
        h.payload_bytes() > h.total_bytes()) {
      Fail("a first segment of a size outside (0, segment, total]");
    }
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
