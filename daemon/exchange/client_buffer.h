#ifndef LONGHAUL_DAEMON_EXCHANGE_CLIENT_BUFFER_H_
#define LONGHAUL_DAEMON_EXCHANGE_CLIENT_BUFFER_H_

// How an operation reads its client's buffer, which lives in shared memory
// the client can write at any time (proto/EXCHANGE.md, Reading the client's
// buffer).
//
// An all-reduce copies each byte of its contribution out of the segment
// exactly once, a segment (at most kSegmentBytes) at a time, into private
// scratch, and sends and reduces only that copy: a client that rewrites its
// buffer during the op changes at most its own contribution, which every
// member then sees the same. An all-gather and a broadcast do the same with
// the buffer they send to every peer (FanOutReader). Nothing whole-buffer
// sized is copied. With a progress word (streamed buffers,
// longhaul/shm_progress.h) each piece is read only once the client has
// published it as written.

#include <atomic>
#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "common/clock.h"
#include "common/units.h"
#include "daemon/exchange/digest.h"
#include "longhaul/shm_progress.h"

namespace longhaul::exchange {

// The daemon's reading of a streamed buffer's progress word
// (longhaul/shm_progress.h). The client only ever raises the word, up to the
// buffer's length; a word that goes back or past the length is the client's
// error (InvalidArgument), and no byte is read on its say-so. Thread-safe:
// an op's sender threads wait on it at once. Does not own the word.
class FillProgress {
 public:
  FillProgress(shm::ProgressWord word, uint64_t total) : word_(word), total_(total) {}

  // Waits until the client has written the first `end` of the buffer's
  // bytes. The client writes at memory speed, far ahead of the link, so
  // this waits only for the first segment unless the client stalls: it naps
  // from 20 us up to 1 ms, so `clock` is read at least every millisecond.
  // Cancelled once `stop` is set; DeadlineExceeded at `deadline`; Aborted
  // once `client_gone` (asked every 50 ms of naps) says the client has gone
  // away; InvalidArgument once the word goes back or past the length.
  // Counts every look that finds the bytes unwritten in `looks`.
  absl::Status WaitFilled(uint64_t end, const Clock& clock, Timestamp deadline,
                          const std::atomic<bool>& stop, const std::function<bool()>& client_gone,
                          std::atomic<uint64_t>& looks);

 private:
  // What the word says is written, checked against what it said before.
  absl::StatusOr<uint64_t> Load();

  const shm::ProgressWord word_;
  const uint64_t total_;
  absl::Mutex mu_;
  // The largest value loaded so far. Loads are made under mu_, so an honest
  // client's word is seen never to decrease, whichever thread looks.
  uint64_t seen_ ABSL_GUARDED_BY(mu_) = 0;
};

// What the hub counts of its reads of client buffers. Thread-safe.
struct ClientReadCounters {
  std::atomic<uint64_t> bytes{0};     // copied out of client buffers
  std::atomic<uint64_t> largest{0};   // the largest single copy
  std::atomic<uint64_t> unfilled{0};  // looks that found a streamed piece unwritten
};

// The one reader of a collective's client buffer (an all-reduce's, an
// all-gather's input, a broadcast root's buffer). Thread-safe: the op's
// sender threads read disjoint ranges at once. Does not own the buffer, the
// progress word, `stop`, `client_gone` or `counters`; they outlive it.
class ClientBuffer {
 public:
  ClientBuffer(absl::Span<const uint8_t> bytes, std::optional<shm::ProgressWord> progress,
               const Clock& clock, Timestamp deadline, const std::atomic<bool>& stop,
               const std::function<bool()>& client_gone, ClientReadCounters& counters)
      : bytes_(bytes),
        clock_(clock),
        deadline_(deadline),
        stop_(stop),
        client_gone_(client_gone),
        counters_(counters) {
    if (progress) progress_.emplace(*progress, bytes.size());
  }

  uint64_t size() const { return bytes_.size(); }

  // Copies bytes [offset, offset + out.size()) into `out` (private memory;
  // at most kSegmentBytes), once the client has written them. Each range
  // must be read once. Fails, and remembers it in status() unless the op was
  // stopped, when the client stalls past the deadline, goes away or breaks
  // its progress word (FillProgress).
  absl::Status Read(uint64_t offset, absl::Span<uint8_t> out);

  // Reads bytes [offset, offset + bytes) a piece of at most
  // `scratch.size()` bytes at a time into `scratch` and passes each piece
  // and its offset to `use`; stops at the first failed Read.
  absl::Status ReadPieces(uint64_t offset, uint64_t bytes, absl::Span<uint8_t> scratch,
                          absl::FunctionRef<void(uint64_t, absl::Span<const uint8_t>)> use);

  // The first failure of Read that was the client's doing, else OK.
  absl::Status status() const;

 private:
  const absl::Span<const uint8_t> bytes_;
  std::optional<FillProgress> progress_;  // set once, in the constructor
  const Clock& clock_;
  const Timestamp deadline_;
  const std::atomic<bool>& stop_;
  const std::function<bool()>& client_gone_;
  ClientReadCounters& counters_;
  mutable absl::Mutex mu_;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
};

// One read of a client buffer for several senders of the same bytes (an
// all-gather's input or a broadcast root's buffer, one sender per peer).
// Each piece, kSegmentBytes at offsets Links::Send cuts a message at, is
// copied out of `input` once, by the first sender that asks for it, into one
// of `slots` (private memory), and every sender writes that copy: all peers
// get the same bytes whatever the client writes meanwhile. `digest`, if
// given, is fed each piece as it is read, in order: once every piece was
// read it is the digest of the bytes every peer got. At most
// slots.size() pieces are held at once, so a sender that runs that far
// ahead of the slowest one waits for it.
//
// Thread-safe: each sender calls Piece and Done from its own thread. Does
// not own `input`, the slots or `stop`; they outlive it.
class FanOutReader {
 public:
  // `senders` ask for pieces, as sender 0 .. senders - 1. `slots` holds at
  // least one span of min(kSegmentBytes, input.size()) bytes.
  FanOutReader(ClientBuffer& input, size_t senders, std::vector<absl::Span<uint8_t>> slots,
               const std::atomic<bool>& stop, StreamingDigest* digest = nullptr);

  // Sender `sender`'s copy of bytes [offset, offset + n), one piece, asked
  // for in order; valid until its next Piece or Done. Waits while the piece
  // is being read, or while reading it would overwrite a piece a slower
  // sender still writes. Fails once a read of the input failed, and with
  // Cancelled once `stop` is set while it waits (asked every 50 ms).
  absl::StatusOr<absl::Span<const uint8_t>> Piece(size_t sender, uint64_t offset, uint64_t n);
  // `sender` needs no more pieces (its message is sent, or it stopped).
  void Done(size_t sender);

 private:
  static constexpr uint64_t kDone = ~uint64_t{0};
  // The lowest piece a sender that is not done still holds or asks for.
  uint64_t Slowest() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  ClientBuffer& input_;
  const std::vector<absl::Span<uint8_t>> slots_;
  const std::atomic<bool>& stop_;
  // Fed by the one sender reading a piece (reading_), pieces in order.
  StreamingDigest* const digest_;
  absl::Mutex mu_;
  std::vector<uint64_t> at_ ABSL_GUARDED_BY(mu_);  // each sender's piece, or kDone
  uint64_t read_ ABSL_GUARDED_BY(mu_) = 0;         // pieces [0, read_) have been read
  bool reading_ ABSL_GUARDED_BY(mu_) = false;      // piece read_ is being read
  absl::Status failed_ ABSL_GUARDED_BY(mu_);       // a failed read of the input
};

}  // namespace longhaul::exchange

#endif  // LONGHAUL_DAEMON_EXCHANGE_CLIENT_BUFFER_H_
