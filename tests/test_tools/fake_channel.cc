#include "tests/test_tools/fake_channel.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"

namespace longhaul::transport::testing {

class FakeConnection {
 public:
  absl::Status Write(int side, absl::Span<const absl::Span<const uint8_t>> parts,
                     const FakeChannel& end) {
    absl::MutexLock lock(&mu_);
    if (aborted_[side]) return absl::CancelledError("write aborted");
    Direction& out = from_[side];
    if (out.closed) return absl::FailedPreconditionError("write after Close");
    if (cut_) return CutError(end);
    if (aborted_[1 - side] || gone_[1 - side]) return ClosedError(end);
    for (absl::Span<const uint8_t> part : parts) {
      size_t n = part.size();
      if (cap_[side].has_value()) n = std::min<uint64_t>(n, *cap_[side]);
      out.bytes.insert(out.bytes.end(), part.begin(), part.begin() + n);
      written_[side] += n;
      if (cap_[side].has_value()) {
        *cap_[side] -= n;
        if (n < part.size()) {
          cut_ = true;
          return CutError(end);
        }
      }
    }
    return absl::OkStatus();
  }

  absl::Status Read(int side, absl::Span<uint8_t> out, const FakeChannel& end) {
    absl::MutexLock lock(&mu_);
    read_sizes_[side].push_back(out.size());
    Direction& in = from_[1 - side];
    auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return aborted_[side] || in.available() >= out.size() || in.closed || cut_;
    };
    ++blocked_reads_[side];
    mu_.Await(absl::Condition(&ready));
    --blocked_reads_[side];
    if (aborted_[side]) return absl::CancelledError("read aborted");
    if (in.available() >= out.size()) {
      std::copy_n(in.bytes.begin() + in.read_offset, out.size(), out.begin());
      in.read_offset += out.size();
      read_[side] += out.size();
      if (in.read_offset > in.bytes.size() / 2) {
        in.bytes.erase(in.bytes.begin(), in.bytes.begin() + in.read_offset);
        in.read_offset = 0;
      }
      return absl::OkStatus();
    }
    if (cut_) return CutError(end);
    return ClosedError(end);
  }

  void Close(int side) {
    absl::MutexLock lock(&mu_);
    from_[side].closed = true;
  }

  void Destroyed(int side) {
    absl::MutexLock lock(&mu_);
    from_[side].closed = true;
    gone_[side] = true;
  }

  void Abort(int side) {
    absl::MutexLock lock(&mu_);
    aborted_[side] = true;
    from_[side].closed = true;
  }

  void AbortBoth() {
    absl::MutexLock lock(&mu_);
    for (int side : {0, 1}) {
      aborted_[side] = true;
      from_[side].closed = true;
    }
  }

  void CutAfter(int side, uint64_t bytes) {
    absl::MutexLock lock(&mu_);
    if (bytes == 0) {
      cut_ = true;
    } else {
      cap_[side] = bytes;
    }
  }

  uint64_t written(int side) const {
    absl::MutexLock lock(&mu_);
    return written_[side];
  }
  uint64_t read(int side) const {
    absl::MutexLock lock(&mu_);
    return read_[side];
  }
  bool WaitForBlockedRead(int side, absl::Duration timeout) const {
    absl::MutexLock lock(&mu_);
    auto blocked = [this, side]()
                       ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return blocked_reads_[side] > 0; };
    return mu_.AwaitWithTimeout(absl::Condition(&blocked), timeout);
  }
  std::vector<size_t> read_sizes(int side) const {
    absl::MutexLock lock(&mu_);
    return read_sizes_[side];
  }

 private:
  // The bytes one end wrote that the other has not read yet.
  struct Direction {
    std::vector<uint8_t> bytes;
    size_t read_offset = 0;
    bool closed = false;  // the writer closed or aborted: end of stream after `bytes`
    size_t available() const { return bytes.size() - read_offset; }
  };

  static absl::Status ClosedError(const FakeChannel& end) {
    return absl::UnavailableError(
        absl::StrCat(end.peer_site(), " at ", end.peer_address(), " closed the connection"));
  }
  static absl::Status CutError(const FakeChannel& end) {
    return absl::UnavailableError(
        absl::StrCat("connection to ", end.peer_site(), " at ", end.peer_address(), " was cut"));
  }

  mutable absl::Mutex mu_;
  Direction from_[2] ABSL_GUARDED_BY(mu_);  // from_[i]: written by end i
  bool aborted_[2] ABSL_GUARDED_BY(mu_) = {false, false};
  bool gone_[2] ABSL_GUARDED_BY(mu_) = {false, false};
  bool cut_ ABSL_GUARDED_BY(mu_) = false;
  // Bytes end i may still write before the cut; nullopt: no cap.
  std::optional<uint64_t> cap_[2] ABSL_GUARDED_BY(mu_);
  uint64_t written_[2] ABSL_GUARDED_BY(mu_) = {0, 0};
  uint64_t read_[2] ABSL_GUARDED_BY(mu_) = {0, 0};
  std::vector<size_t> read_sizes_[2] ABSL_GUARDED_BY(mu_);
  // ReadExactly calls of end i in Await. One that need not wait never
  // releases mu_, so others see only those that do wait.
  int blocked_reads_[2] ABSL_GUARDED_BY(mu_) = {0, 0};
};

FakeChannel::FakeChannel(std::shared_ptr<FakeConnection> connection, int side,
                         std::string peer_site, std::string peer_address)
    : connection_(std::move(connection)),
      side_(side),
      peer_site_(std::move(peer_site)),
      peer_address_(std::move(peer_address)) {}

FakeChannel::~FakeChannel() { connection_->Destroyed(side_); }

absl::Status FakeChannel::Write(absl::Span<const absl::Span<const uint8_t>> parts) {
  return connection_->Write(side_, parts, *this);
}

absl::Status FakeChannel::ReadExactly(absl::Span<uint8_t> out) {
  return connection_->Read(side_, out, *this);
}

void FakeChannel::Abort() { connection_->Abort(side_); }

void FakeChannel::Close() { connection_->Close(side_); }

void FakeChannel::CutAfterWrittenBytes(uint64_t bytes) { connection_->CutAfter(side_, bytes); }

uint64_t FakeChannel::bytes_written() const { return connection_->written(side_); }

uint64_t FakeChannel::bytes_read() const { return connection_->read(side_); }

std::vector<size_t> FakeChannel::read_sizes() const { return connection_->read_sizes(side_); }

bool FakeChannel::WaitForBlockedRead(absl::Duration timeout) const {
  return connection_->WaitForBlockedRead(side_, timeout);
}

void FakeChannel::AbortConnection(FakeConnection& connection) { connection.AbortBoth(); }

ChannelPair MakeChannelPair(const std::string& peer_site_a, const std::string& peer_site_b) {
  return MakeChannelPair(peer_site_a, "fake:" + peer_site_a, peer_site_b, "fake:" + peer_site_b);
}

ChannelPair MakeChannelPair(const std::string& peer_site_a, const std::string& peer_address_a,
                            const std::string& peer_site_b, const std::string& peer_address_b) {
  auto connection = std::make_shared<FakeConnection>();
  ChannelPair pair;
  pair.a = std::make_unique<FakeChannel>(connection, 0, peer_site_a, peer_address_a);
  pair.b = std::make_unique<FakeChannel>(connection, 1, peer_site_b, peer_address_b);
  return pair;
}

}  // namespace longhaul::transport::testing
