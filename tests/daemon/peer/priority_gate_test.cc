#include "daemon/peer/priority_gate.h"

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace longhaul::peer {
namespace {

// Records every Write call (one per slice) and the bytes in order.
class RecordingChannel final : public transport::Channel {
 public:
  absl::Status Write(absl::Span<const absl::Span<const uint8_t>> parts) override {
    absl::MutexLock lock(&mu_);
    uint64_t n = 0;
    for (auto p : parts) {
      bytes_.insert(bytes_.end(), p.begin(), p.end());
      n += p.size();
    }
    writes_.push_back(n);
    return absl::OkStatus();
  }
  absl::Status ReadExactly(absl::Span<uint8_t>) override { return absl::UnimplementedError("write only"); }
  void Abort() override {}
  const std::string& peer_site() const override { return site_; }
  const std::string& peer_address() const override { return site_; }
  transport::LinkStats Stats() const override { return {}; }

  std::vector<uint64_t> writes() {
    absl::MutexLock lock(&mu_);
    return writes_;
  }
  std::vector<uint8_t> bytes() {
    absl::MutexLock lock(&mu_);
    return bytes_;
  }

 private:
  std::string site_ = "site-b";
  absl::Mutex mu_;
  std::vector<uint64_t> writes_ ABSL_GUARDED_BY(mu_);
  std::vector<uint8_t> bytes_ ABSL_GUARDED_BY(mu_);
};

std::vector<uint8_t> Pattern(size_t n, uint8_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(i * 31 + seed);
  return v;
}

constexpr uint64_t kSlice = PriorityGate::kYieldBytes;

TEST(PriorityGateTest, WriteYieldingSendsTheSameBytesInSlices) {
  PriorityGate gate;
  RecordingChannel channel;
  auto a = Pattern(24, 1), b = Pattern(32, 2), c = Pattern(3 * kSlice + 1000, 3);
  std::atomic<bool> stop{false};
  ASSERT_TRUE(gate.WriteYielding(channel, {absl::MakeConstSpan(a), absl::MakeConstSpan(b), absl::MakeConstSpan(c)},
                                 "site-b", v1::CHECKPOINT, stop)
                  .ok());
  EXPECT_EQ(channel.writes(), (std::vector<uint64_t>{kSlice, kSlice, kSlice, 24 + 32 + 1000}));
  std::vector<uint8_t> want = a;
  want.insert(want.end(), b.begin(), b.end());
  want.insert(want.end(), c.begin(), c.end());
  EXPECT_TRUE(channel.bytes() == want);
}

TEST(PriorityGateTest, BulkWriterPausesInsideAChunkWhileAnExchangeIsActive) {
  PriorityGate gate;
  RecordingChannel channel;
  auto chunk = Pattern(4 * kSlice, 5);
  std::atomic<bool> stop{false};
  std::optional<PriorityGate::Scope> exchange;
  exchange.emplace(gate.Enter("site-b", v1::EXCHANGE));
  EXPECT_TRUE(gate.HigherActive("site-b", v1::CHECKPOINT));
  EXPECT_TRUE(gate.HigherActive("site-b", v1::BACKGROUND));
  EXPECT_FALSE(gate.HigherActive("site-b", v1::EXCHANGE));
  EXPECT_FALSE(gate.HigherActive("site-c", v1::CHECKPOINT)) << "another link is not affected";

  auto writer = std::async(std::launch::async, [&] {
    return gate.WriteYielding(channel, {absl::MakeConstSpan(chunk)}, "site-b", v1::CHECKPOINT, stop);
  });
  // The slice already started goes out; the next waits for the exchange.
  for (int i = 0; i < 2000 && channel.writes().empty(); ++i) absl::SleepFor(absl::Milliseconds(5));
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_EQ(channel.writes().size(), 1u);
  EXPECT_EQ(writer.wait_for(std::chrono::seconds(0)), std::future_status::timeout);

  exchange.reset();
  ASSERT_TRUE(writer.get().ok());
  EXPECT_EQ(channel.writes().size(), 4u);
  EXPECT_TRUE(channel.bytes() == chunk);
}

TEST(PriorityGateTest, StopEndsAPausedWrite) {
  PriorityGate gate;
  RecordingChannel channel;
  auto chunk = Pattern(2 * kSlice, 7);
  std::atomic<bool> stop{false};
  auto exchange = gate.Enter("site-b", v1::EXCHANGE);
  auto writer = std::async(std::launch::async, [&] {
    return gate.WriteYielding(channel, {absl::MakeConstSpan(chunk)}, "site-b", v1::BACKGROUND, stop);
  });
  for (int i = 0; i < 2000 && channel.writes().empty(); ++i) absl::SleepFor(absl::Milliseconds(5));
  stop = true;
  EXPECT_EQ(writer.get().code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(channel.writes().size(), 1u);
}

TEST(PriorityGateTest, ExchangeDoesNotWaitForLowerClasses) {
  PriorityGate gate;
  RecordingChannel channel;
  auto bulk = gate.Enter("site-b", v1::CHECKPOINT);
  auto background = gate.Enter("site-b", v1::BACKGROUND);
  auto data = Pattern(3 * kSlice, 9);
  std::atomic<bool> stop{false};
  ASSERT_TRUE(gate.WriteYielding(channel, {absl::MakeConstSpan(data)}, "site-b", v1::EXCHANGE, stop).ok());
  EXPECT_EQ(channel.writes().size(), 3u);
  EXPECT_EQ(gate.ActiveCount("site-b", v1::CHECKPOINT), 1);
  EXPECT_EQ(gate.ActiveCount("site-b", v1::BACKGROUND), 1);
}

int ThreadNice() {
  errno = 0;
  return getpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)));
}

TEST(PriorityGateTest, BulkThreadsRunAtALowerCpuPriorityAndNeverRaiseIt) {
  EXPECT_EQ(PriorityGate::NiceFor(v1::EXCHANGE), 0);
  EXPECT_GT(PriorityGate::NiceFor(v1::CHECKPOINT), 0);
  EXPECT_EQ(PriorityGate::NiceFor(v1::PRIORITY_UNSPECIFIED), PriorityGate::NiceFor(v1::CHECKPOINT));
  EXPECT_GT(PriorityGate::NiceFor(v1::BACKGROUND), PriorityGate::NiceFor(v1::CHECKPOINT));
  const int before = ThreadNice();
  std::thread([&] {
    const int start = ThreadNice();
    PriorityGate::LowerThreadPriority(v1::CHECKPOINT);
    EXPECT_EQ(ThreadNice(), std::max(start, PriorityGate::NiceFor(v1::CHECKPOINT)));
    PriorityGate::LowerThreadPriority(v1::EXCHANGE);  // never raises
    EXPECT_EQ(ThreadNice(), std::max(start, PriorityGate::NiceFor(v1::CHECKPOINT)));
  }).join();
  EXPECT_EQ(ThreadNice(), before) << "only the calling thread changes";
}

}  // namespace
}  // namespace longhaul::peer
