// Windowed max and min filters.
//
// Tracks the best (largest for a max filter, smallest for a min filter) sample seen within a
// sliding window of "time", where time may be a Timestamp or a plain counter such as a round or
// a ProbeBW cycle count. It keeps the best, second-best and third-best samples from successive
// sub-windows, so it answers in O(1) with O(1) state and never allocates.
//
// The answer is exact when the best sample is still inside the window; when it expires, the
// filter falls back to the best sample of a later sub-window, which may slightly understate the
// true windowed best (this is the usual trade of a three-sample filter).
//
// Not thread-safe.
#ifndef LONGHAUL_CONGESTION_WINDOWED_FILTER_H_
#define LONGHAUL_CONGESTION_WINDOWED_FILTER_H_

#include <functional>

namespace longhaul::congestion {

// `Better(a, b)` is true when `a` should replace `b` (std::greater_equal for a max filter).
// `TimeT - TimeT` must yield `DeltaT`, and `TimeT + DeltaT` must be comparable with TimeT.
template <typename T, typename Better, typename TimeT, typename DeltaT>
class WindowedFilter {
 public:
  WindowedFilter(DeltaT window, T zero, TimeT zero_time)
      : window_(window), zero_(zero), zero_time_(zero_time) {
    Reset(zero, zero_time);
  }

  // Adds `sample` taken at `now`. `now` must not go backwards.
  void Update(T sample, TimeT now) {
    if (samples_[0].value == zero_ || Better()(sample, samples_[0].value) ||
        now - samples_[2].time > window_) {
      Reset(sample, now);
      return;
    }
    if (Better()(sample, samples_[1].value)) {
      samples_[1] = {sample, now};
      samples_[2] = samples_[1];
    } else if (Better()(sample, samples_[2].value)) {
      samples_[2] = {sample, now};
    }
    // Expire and shift.
    if (now - samples_[0].time > window_) {
      samples_[0] = samples_[1];
      samples_[1] = samples_[2];
      samples_[2] = {sample, now};
      if (now - samples_[0].time > window_) {
        samples_[0] = samples_[1];
        samples_[1] = samples_[2];
      }
      return;
    }
    // Keep the second and third samples from distinct quarter and half windows, so an expiry of
    // the best one leaves a recent, still representative answer.
    if (samples_[1].value == samples_[0].value && now - samples_[1].time > window_ / 4) {
      samples_[2] = samples_[1] = {sample, now};
      return;
    }
    if (samples_[2].value == samples_[1].value && now - samples_[2].time > window_ / 2) {
      samples_[2] = {sample, now};
    }
  }

  // Forgets everything and starts again from `sample`.
  void Reset(T sample, TimeT now) { samples_[0] = samples_[1] = samples_[2] = {sample, now}; }
  void Clear() { Reset(zero_, zero_time_); }

  T GetBest() const { return samples_[0].value; }
  T GetSecondBest() const { return samples_[1].value; }
  T GetThirdBest() const { return samples_[2].value; }
  void SetWindow(DeltaT window) { window_ = window; }

 private:
  struct Sample {
    T value;
    TimeT time;
  };
  DeltaT window_;
  T zero_;
  TimeT zero_time_;
  Sample samples_[3];
};

template <typename T, typename TimeT, typename DeltaT>
using WindowedMaxFilter = WindowedFilter<T, std::greater_equal<T>, TimeT, DeltaT>;
template <typename T, typename TimeT, typename DeltaT>
using WindowedMinFilter = WindowedFilter<T, std::less_equal<T>, TimeT, DeltaT>;

}  // namespace longhaul::congestion

#endif  // LONGHAUL_CONGESTION_WINDOWED_FILTER_H_
