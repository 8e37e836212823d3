#include "daemon/exchange/client_buffer.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/check.h"
#include "daemon/exchange/deadline.h"
#include "daemon/exchange/exchange_types.h"

namespace longhaul::exchange {
namespace {

// How often (in time napped) a waiting read asks whether its client left.
constexpr absl::Duration kGonePoll = absl::Milliseconds(50);
// How often a sender waiting for a FanOutReader's piece asks whether its op
// stopped.
constexpr absl::Duration kStopPoll = absl::Milliseconds(50);

}  // namespace

absl::StatusOr<uint64_t> FillProgress::Load() {
  absl::MutexLock lock(&mu_);
  const uint64_t ready = word_.Ready();
  if (ready > total_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "its client says ", ready, " bytes of its buffer of ", total_, " are written"));
  }
  if (ready < seen_) {
    return absl::InvalidArgumentError(absl::StrCat("its client's progress word went back from ",
                                                   seen_, " to ", ready,
                                                   " bytes written (it may only grow)"));
  }
  seen_ = ready;
  return ready;
}

absl::Status FillProgress::WaitFilled(uint64_t end, const Clock& clock, Timestamp deadline,
                                      const std::atomic<bool>& stop,
                                      const std::function<bool()>& client_gone,
                                      std::atomic<uint64_t>& looks) {
  absl::Duration nap = absl::Microseconds(20);
  absl::Duration napped;  // since `client_gone` was last asked
  while (true) {
    const absl::StatusOr<uint64_t> ready = Load();
    if (!ready.ok()) return ready.status();
    if (*ready >= end) return absl::OkStatus();
    ++looks;
    if (stop.load()) return absl::CancelledError("stopped");
    const Timestamp now = clock.Now();
    if (now >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat("its client had written only ", *ready,
                                                      " of the ", total_, " bytes of the buffer"));
    }
    if (client_gone && napped >= kGonePoll) {
      if (client_gone()) {
        return absl::AbortedError(absl::StrCat("its client went away after writing ", *ready,
                                               " of the ", total_, " bytes of the buffer"));
      }
      napped = absl::ZeroDuration();
    }
    const absl::Duration sleep = std::min(nap, ToDuration(deadline - now));
    absl::SleepFor(sleep);
    napped += sleep;
    nap = std::min(nap * 2, absl::Milliseconds(1));
  }
}

absl::Status ClientBuffer::Read(uint64_t offset, absl::Span<uint8_t> out) {
  LONGHAUL_CHECK(out.size() <= kSegmentBytes && offset + out.size() <= bytes_.size())
      << "a read of " << out.size() << " bytes at " << offset << " of " << bytes_.size();
  if (progress_ && !out.empty()) {
    absl::Status s = progress_->WaitFilled(offset + out.size(), clock_, deadline_, stop_,
                                           client_gone_, counters_.unfilled);
    if (!s.ok()) {
      if (s.code() != absl::StatusCode::kCancelled) {
        absl::MutexLock lock(&mu_);
        if (status_.ok()) status_ = s;
      }
      return s;
    }
  }
  // The one read of these bytes: everything downstream uses `out`.
  std::memcpy(out.data(), bytes_.data() + offset, out.size());
  counters_.bytes += out.size();
  uint64_t largest = counters_.largest.load();
  while (out.size() > largest && !counters_.largest.compare_exchange_weak(largest, out.size())) {
  }
  return absl::OkStatus();
}

absl::Status ClientBuffer::ReadPieces(
    uint64_t offset, uint64_t bytes, absl::Span<uint8_t> scratch,
    absl::FunctionRef<void(uint64_t, absl::Span<const uint8_t>)> use) {
  for (uint64_t done = 0; done < bytes;) {
    const uint64_t n = std::min<uint64_t>(scratch.size(), bytes - done);
    absl::Span<uint8_t> piece = scratch.subspan(0, n);
    if (absl::Status s = Read(offset + done, piece); !s.ok()) return s;
    use(offset + done, piece);
    done += n;
  }
  return absl::OkStatus();
}

absl::Status ClientBuffer::status() const {
  absl::MutexLock lock(&mu_);
  return status_;
}

FanOutReader::FanOutReader(ClientBuffer& input, size_t senders,
                           std::vector<absl::Span<uint8_t>> slots, const std::atomic<bool>& stop,
                           StreamingDigest* digest)
    : input_(input), slots_(std::move(slots)), stop_(stop), digest_(digest), at_(senders, 0) {
  LONGHAUL_CHECK(!slots_.empty()) << "a fan-out reader needs a slot";
  for (absl::Span<uint8_t> slot : slots_) {
    LONGHAUL_CHECK(slot.size() == std::min<uint64_t>(kSegmentBytes, input.size()))
        << "a slot of " << slot.size() << " bytes for a buffer of " << input.size();
  }
}

uint64_t FanOutReader::Slowest() const {
  uint64_t slowest = kDone;
  for (uint64_t at : at_) slowest = std::min(slowest, at);
  return slowest;
}

absl::StatusOr<absl::Span<const uint8_t>> FanOutReader::Piece(size_t sender, uint64_t offset,
                                                              uint64_t n) {
  const uint64_t k = offset / kSegmentBytes;
  LONGHAUL_CHECK(offset % kSegmentBytes == 0 && n > 0 &&
                 n == std::min<uint64_t>(kSegmentBytes, input_.size() - offset))
      << "piece of " << n << " bytes at " << offset << " of " << input_.size();
  const uint64_t window = slots_.size();
  absl::MutexLock lock(&mu_);
  // Asking for piece k lets go of piece k - 1. A sender asks for piece k
  // only once it had piece k - 1, so k <= read_.
  at_[sender] = k;
  auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !failed_.ok() || k < read_ || (!reading_ && read_ < Slowest() + window);
  };
  while (true) {
    if (!failed_.ok()) return failed_;
    const absl::Span<uint8_t> slot = slots_[k % window].subspan(0, n);
    // Piece k stays in its slot while this sender holds it: piece k +
    // window, the next one to use the slot, is read only once every sender
    // is past k.
    if (k < read_) return slot;
    if (!reading_ && read_ < Slowest() + window) {
      reading_ = true;
      mu_.Unlock();
      absl::Status s = input_.Read(offset, slot);
      if (s.ok() && digest_ != nullptr) digest_->Update(slot);
      mu_.Lock();
      reading_ = false;
      if (!s.ok()) {
        failed_ = s;
        return s;
      }
      ++read_;
      return slot;
    }
    if (stop_.load()) return absl::CancelledError("stopped");
    mu_.AwaitWithTimeout(absl::Condition(&ready), kStopPoll);
  }
}

void FanOutReader::Done(size_t sender) {
  absl::MutexLock lock(&mu_);
  at_[sender] = kDone;
}

}  // namespace longhaul::exchange
