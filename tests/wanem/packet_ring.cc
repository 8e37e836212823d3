#include "tests/wanem/packet_ring.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace longhaul::wanem {
namespace {

// A broken invariant of the ring is a bug in the relay: stop at once.
void Check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "PacketRing invariant failed: %s\n", what);
    std::abort();
  }
}

}  // namespace

PacketRing::PacketRing(size_t capacity_bytes, size_t max_packet)
    : capacity_(capacity_bytes & ~size_t{7}), max_record_(RecordSize(max_packet)) {
  Check(capacity_ >= 2 * max_record_, "capacity >= 2 packets");
  buf_ = std::make_unique<uint8_t[]>(capacity_);
}

size_t PacketRing::TailSlot() const {
  if (wrapped_) {
    return head_ - tail_ >= max_record_ ? tail_ : SIZE_MAX;
  }
  if (capacity_ - tail_ >= max_record_) return tail_;
  if (head_ >= max_record_) return 0;
  return SIZE_MAX;
}

absl::Span<uint8_t> PacketRing::Reserve() {
  const size_t slot = TailSlot();
  if (slot == SIZE_MAX) return {};
  return absl::Span<uint8_t>(buf_.get() + slot + kHeader, max_record_ - kHeader);
}

void PacketRing::Commit(size_t len, int64_t due_ns) {
  const size_t slot = TailSlot();
  Check(slot != SIZE_MAX, "Commit() without room");
  Check(RecordSize(len) <= max_record_, "packet larger than max_packet");
  if (slot == 0 && tail_ != 0) {
    wrapped_ = true;
    wrap_at_ = tail_;
  }
  Header h{due_ns, static_cast<uint32_t>(len), 0};
  std::memcpy(buf_.get() + slot, &h, kHeader);
  tail_ = slot + RecordSize(len);
  ++count_;
}

int64_t PacketRing::FrontDue() const {
  Header h;
  std::memcpy(&h, buf_.get() + head_, kHeader);
  return h.due_ns;
}

absl::Span<const uint8_t> PacketRing::Front() const {
  Header h;
  std::memcpy(&h, buf_.get() + head_, kHeader);
  return absl::Span<const uint8_t>(buf_.get() + head_ + kHeader, h.len);
}

void PacketRing::Pop() {
  Check(count_ > 0, "Pop() on an empty ring");
  Header h;
  std::memcpy(&h, buf_.get() + head_, kHeader);
  head_ += RecordSize(h.len);
  --count_;
  if (count_ == 0) {
    head_ = tail_ = 0;
    wrapped_ = false;
  } else if (wrapped_ && head_ == wrap_at_) {
    head_ = 0;
    wrapped_ = false;
  }
}

}  // namespace longhaul::wanem
