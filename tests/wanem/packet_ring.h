#ifndef LONGHAUL_TESTS_WANEM_PACKET_RING_H_
#define LONGHAUL_TESTS_WANEM_PACKET_RING_H_

#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/types/span.h"

namespace longhaul::wanem {

// A FIFO of variable-length packets stored back to back in one buffer that is
// allocated once, so the relay's data path never allocates. Packets are read
// from the kernel straight into the slot returned by Reserve(), then either
// committed with their departure time or abandoned.
//
// Each packet takes a 16-byte header plus its length rounded up to 8 bytes.
// A packet is contiguous: when it does not fit before the end of the buffer
// the rest of the end is skipped and it starts over at offset 0.
//
// Not thread-safe; owned by one relay thread. Spans returned point into the
// ring and stay valid until the packet is popped (or the next Reserve).
class PacketRing {
 public:
  // `capacity_bytes` is the buffer size; `max_packet` the largest packet that
  // Reserve() must make room for.
  PacketRing(size_t capacity_bytes, size_t max_packet);

  // Room for one packet of up to max_packet bytes at the tail, or an empty
  // span when the ring is too full. Does not change the ring.
  absl::Span<uint8_t> Reserve();
  // Appends the first `len` bytes of the last Reserve()d slot, to leave at
  // `due_ns`.
  void Commit(size_t len, int64_t due_ns);

  bool empty() const { return count_ == 0; }
  size_t count() const { return count_; }
  // Departure time and bytes of the oldest packet. Requires !empty().
  int64_t FrontDue() const;
  absl::Span<const uint8_t> Front() const;
  void Pop();

 private:
  struct Header {
    int64_t due_ns;
    uint32_t len;
    uint32_t reserved;
  };
  static constexpr size_t kHeader = sizeof(Header);
  static size_t RecordSize(size_t len) { return kHeader + ((len + 7) & ~size_t{7}); }
  // Offset where a record of max size would start, or SIZE_MAX if no room.
  size_t TailSlot() const;

  std::unique_ptr<uint8_t[]> buf_;
  size_t capacity_;
  size_t max_record_;
  size_t head_ = 0;  // Offset of the oldest record.
  size_t tail_ = 0;  // Offset where the next record goes.
  size_t count_ = 0;
  // True when the tail has wrapped to the start of the buffer behind the
  // head: records then live in [head_, wrap_at_) and then [0, tail_).
  bool wrapped_ = false;
  size_t wrap_at_ = 0;
};

}  // namespace longhaul::wanem

#endif  // LONGHAUL_TESTS_WANEM_PACKET_RING_H_
