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

}  // namespace longhaul::exchange
