// PacketRing: per-packet records indexed by a monotonically increasing packet number.
//
// A power-of-two ring that holds the records of outstanding packets. Inserting must use packet
// numbers that increase (gaps allowed). Erasing may happen in any order; erased slots at the front
// are reclaimed lazily. The ring doubles only when the span between the oldest live record and the
// newest packet number outgrows it, so in steady state nothing is allocated per packet.
//
// Not thread-safe.
#ifndef LONGHAUL_CONGESTION_PACKET_RING_H_
#define LONGHAUL_CONGESTION_PACKET_RING_H_

#include <cstddef>
#include <cstdint>
#include <vector>

namespace longhaul::congestion {

template <typename T>
class PacketRing {
 public:
  explicit PacketRing(size_t initial_capacity = 1024) {
    size_t cap = 1;
    while (cap < initial_capacity) cap <<= 1;
    slots_.resize(cap);
  }

  // Inserts the record for `pn`, which must be larger than every packet number inserted before.
  // Returns the stored record.
  T& Insert(uint64_t pn, const T& value) {
    if (empty()) {
      head_ = pn;
      end_ = pn;
    }
    while (pn - head_ >= slots_.size()) Grow();
    for (uint64_t i = end_; i < pn; ++i) slots_[i & mask()].live = false;
    Slot& s = slots_[pn & mask()];
    s.live = true;
    s.value = value;
    end_ = pn + 1;
    ++size_;
    return s.value;
  }

  // The record for `pn`, or nullptr if it is not live.
  T* Find(uint64_t pn) {
    if (pn < head_ || pn >= end_) return nullptr;
    Slot& s = slots_[pn & mask()];
    return s.live ? &s.value : nullptr;
  }
  const T* Find(uint64_t pn) const { return const_cast<PacketRing*>(this)->Find(pn); }

  // Erases `pn` if live. Returns whether it was.
  bool Erase(uint64_t pn) {
    if (pn < head_ || pn >= end_) return false;
    Slot& s = slots_[pn & mask()];
    if (!s.live) return false;
    s.live = false;
    --size_;
    while (head_ < end_ && !slots_[head_ & mask()].live) ++head_;
    return true;
  }

  bool empty() const { return size_ == 0; }
  size_t size() const { return size_; }
  // Smallest live packet number (meaningless if empty()).
  uint64_t front_pn() const { return head_; }
  // One past the largest packet number ever inserted.
  uint64_t end_pn() const { return end_; }

 private:
  struct Slot {
    bool live = false;
    T value{};
  };
  size_t mask() const { return slots_.size() - 1; }
  void Grow() {
    std::vector<Slot> bigger(slots_.size() * 2);
    const size_t new_mask = bigger.size() - 1;
    for (uint64_t i = head_; i < end_; ++i) bigger[i & new_mask] = slots_[i & mask()];
    slots_.swap(bigger);
  }

  std::vector<Slot> slots_;
  uint64_t head_ = 0;
  uint64_t end_ = 0;
  size_t size_ = 0;
};

}  // namespace longhaul::congestion

#endif  // LONGHAUL_CONGESTION_PACKET_RING_H_
