#ifndef LONGHAUL_PROTO_LONGHAUL_SHM_PROGRESS_H_
#define LONGHAUL_PROTO_LONGHAUL_SHM_PROGRESS_H_

// The progress word of a streamed exchange buffer: how a client and its
// daemon share one shared-memory segment while a Send, Recv or AllReduce
// runs, so the client's copy into (or out of) the segment overlaps the
// transfer instead of adding to it (exchange.proto, SendRequest.streamed,
// RecvRequest.streamed, AllReduceRequest.streamed).
//
// Layout of a streamed segment:
//   [0, 8)                 the progress word, a little-endian uint64, 8-aligned
//   [8, kDataOffset)       reserved (zero)
//   [kDataOffset, ...)     the buffer (ShmRegion.offset = kDataOffset)
//
// Send, AllReduce: the word is the number of leading buffer bytes the client
// has written. Only the client stores it, with release order after writing
// the bytes; it never decreases during a call and never exceeds the
// buffer's length (the daemon fails a call whose word does either). The
// daemon loads it with acquire order and reads no buffer byte at or past
// it. An all-reduce's result is written into the buffer after the call's
// last load of the word, and only when the call succeeds.
//
// Recv: the word is Landed{epoch, bytes}, packed as epoch << kLandedBits |
// bytes. Only the daemon stores it, with release order after writing the
// bytes. Within one epoch `bytes` only grows and the daemon never rewrites
// buffer bytes below it, so a client may copy them out as they land. A new
// epoch (a message that stopped arriving and another one that starts over)
// may rewrite every byte, so a copy made under an older epoch is stale.
// Epochs start at 1 in each call; the client zeroes the word before it.
// When the call succeeds, the buffer holds the message; the bytes the client
// copied under the word's final epoch are that message's.
//
// Both sides access the word through std::atomic_ref, which is lock-free and
// address-free for uint64_t on every platform longhaul builds for, so it works
// between processes. Segments are memfds sealed against shrinking
// (exchange.proto, ShmRegion), so neither side can truncate one under the
// other's mapping.

#include <atomic>
#include <cstdint>

namespace longhaul::shm {

inline constexpr uint64_t kDataOffset = 4096;  // the buffer stays page-aligned
inline constexpr int kLandedBits = 40;         // messages up to 1 TiB
inline constexpr uint64_t kLandedMask = (uint64_t{1} << kLandedBits) - 1;

struct Landed {
  uint32_t epoch = 0;  // 0: nothing has landed in this call; below 2^24
  uint64_t bytes = 0;
};

// A view of one progress word; does not own it. Copyable. Thread-safe (the
// word is only accessed atomically).
class ProgressWord {
 public:
  // `word` must be 8-aligned and outlive every access through this view.
  explicit ProgressWord(uint64_t* word) : word_(word) {}
  // The daemon's Send maps the segment read-only: a lock-free atomic load
  // never writes, so the const_cast is never written through.
  explicit ProgressWord(const uint64_t* word) : word_(const_cast<uint64_t*>(word)) {}

  void Reset() const { Ref().store(0, std::memory_order_release); }

  // Send, AllReduce.
  void PublishReady(uint64_t bytes) const { Ref().store(bytes, std::memory_order_release); }
  uint64_t Ready() const { return Ref().load(std::memory_order_acquire); }

  // Recv.
  void PublishLanded(Landed landed) const {
    Ref().store((uint64_t{landed.epoch} << kLandedBits) | (landed.bytes & kLandedMask),
                std::memory_order_release);
  }
  Landed LoadLanded() const {
    const uint64_t w = Ref().load(std::memory_order_acquire);
    return Landed{static_cast<uint32_t>(w >> kLandedBits), w & kLandedMask};
  }

 private:
  std::atomic_ref<uint64_t> Ref() const { return std::atomic_ref<uint64_t>(*word_); }
  static_assert(std::atomic_ref<uint64_t>::is_always_lock_free,
                "the progress word is shared between processes");
  uint64_t* word_;
};

}  // namespace longhaul::shm

#endif  // LONGHAUL_PROTO_LONGHAUL_SHM_PROGRESS_H_
