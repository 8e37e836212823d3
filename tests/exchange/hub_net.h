#ifndef LONGHAUL_TESTS_EXCHANGE_HUB_NET_H_
#define LONGHAUL_TESTS_EXCHANGE_HUB_NET_H_

// ExchangeHubs of several sites in one process, linked by socketpair
// channels instead of TLS, and the helpers the hub tests share to run
// all-reduces on them and to write raw messages as a hostile site would.

#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <future>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "daemon/exchange/exchange_hub.h"
#include "daemon/peer/rate_limiter.h"
#include "daemon/wire/messaging.h"
#include "gtest/gtest.h"

namespace longhaul::exchange {

// One end of a socketpair as a peer channel. What it reports as not yet
// sent is `unsent` (the test's to set), if given.
class SocketChannel final : public transport::Channel {
 public:
  SocketChannel(int fd, std::string peer_site, const std::atomic<uint64_t>* unsent = nullptr)
      : socket_(std::make_shared<Socket>(fd)),
        fd_(fd),
        peer_site_(std::move(peer_site)),
        unsent_(unsent) {}

  // The descriptor, closed with its last owner: the channel, or a Net::Cut
  // that is shutting it down.
  struct Socket {
    explicit Socket(int fd) : fd(fd) {}
    ~Socket() { close(fd); }
    const int fd;
    std::atomic<int64_t> pacing_bps{0};  // the last LimitPacingRate; 0: never paced
  };
  std::weak_ptr<Socket> socket() const { return socket_; }

  absl::Status Write(absl::Span<const absl::Span<const uint8_t>> parts) override {
    for (auto part : parts) {
      size_t done = 0;
      while (done < part.size()) {
        ssize_t n = send(fd_, part.data() + done, part.size() - done, MSG_NOSIGNAL);
        if (n <= 0) return absl::UnavailableError(absl::StrCat("write to ", peer_site_, " failed"));
        done += n;
      }
    }
    return absl::OkStatus();
  }
  absl::Status ReadExactly(absl::Span<uint8_t> out) override {
    size_t done = 0;
    while (done < out.size()) {
      ssize_t n = recv(fd_, out.data() + done, out.size() - done, 0);
      if (n <= 0) return absl::UnavailableError(absl::StrCat(peer_site_, " closed the connection"));
      done += n;
    }
    return absl::OkStatus();
  }
  void Abort() override { shutdown(fd_, SHUT_RDWR); }
  const std::string& peer_site() const override { return peer_site_; }
  const std::string& peer_address() const override { return address_; }
  transport::LinkStats Stats() const override { return {}; }
  uint64_t UnsentBytes() const override { return unsent_ != nullptr ? unsent_->load() : 0; }
  void LimitPacingRate(Bandwidth rate) override { socket_->pacing_bps = rate.ToBitsPerSecond(); }

 private:
  std::shared_ptr<Socket> socket_;
  int fd_;
  std::string peer_site_;
  const std::atomic<uint64_t>* unsent_;
  std::string address_ = "socketpair";
};

// Sites site-a, site-b, ... each with a hub; every hub may dial every other.
class Net {
 public:
  // `limiter` (may be null) is every hub's rate limiter; every hub gets
  // `options` and, if `budget_bytes` is not 0, a PeerMemoryBudget of its own
  // of that many bytes per peer; every hub reads `clock`.
  explicit Net(int sites, peer::RateLimiter* limiter = nullptr, HubOptions options = {},
               uint64_t budget_bytes = 0, const Clock& clock = RealClock::Get()) {
    for (int i = 0; i < sites; ++i)
      names_.push_back(std::string("site-") + static_cast<char>('a' + i));
    for (const auto& name : names_) {
      std::vector<std::string> peers;
      for (const auto& other : names_) {
        if (other != name) peers.push_back(other);
      }
      HubOptions hub_options = options;
      if (budget_bytes > 0) {
        budgets_[name] = std::make_unique<peer::PeerMemoryBudget>(budget_bytes);
        hub_options.memory_budget = budgets_[name].get();
      }
      hubs_[name] = std::make_unique<ExchangeHub>(
          name, peers, [this, name](const std::string& site) { return Dial(name, site); }, &gate_,
          hub_options, limiter, clock);
    }
  }
  ~Net() {
    for (auto& [name, hub] : hubs_) hub->Shutdown();
    absl::MutexLock lock(&mu_);
    for (auto& t : threads_) t.join();
  }

  // Breaks every link dialed so far to or from `site` (real or raw), both
  // directions, as a network partition would: every hub sees it lost. The
  // hubs stay up; a link dialed afterwards works, so `site` can Join again.
  void Cut(const std::string& site) {
    absl::MutexLock lock(&mu_);
    for (const Link& l : links_) {
      if (l.from != site && l.to != site) continue;
      if (auto socket = l.socket.lock()) shutdown(socket->fd, SHUT_RDWR);
    }
  }

  ExchangeHub& hub(const std::string& site) { return *hubs_.at(site); }
  peer::PeerMemoryBudget& budget(const std::string& site) { return *budgets_.at(site); }
  peer::PriorityGate& gate() { return gate_; }
  // What every outbound channel reports as not yet sent.
  void SetUnsent(uint64_t bytes) { unsent_ = bytes; }
  const std::vector<std::string>& names() const { return names_; }

  // Joins every listed site to `group` concurrently.
  void JoinAll(const std::string& group, const std::vector<std::string>& sites) {
    std::vector<std::future<absl::StatusOr<v1::GroupView>>> joins;
    for (const auto& s : sites) {
      joins.push_back(std::async(std::launch::async,
                                 [&, s] { return hub(s).Join(group, sites, absl::Seconds(10)); }));
    }
    for (auto& j : joins) {
      auto view = j.get();
      ASSERT_TRUE(view.ok()) << view.status();
      EXPECT_EQ(view->members_size(), static_cast<int>(sites.size()));
    }
  }

  // The pacing cap of the last link `from` dialed to `to` (bits/s; 0:
  // never paced, -1: no such link).
  int64_t Pacing(const std::string& from, const std::string& to) {
    absl::MutexLock lock(&mu_);
    for (auto it = links_.rbegin(); it != links_.rend(); ++it) {
      if (it->from != from || it->to != to) continue;
      auto socket = it->socket.lock();
      return socket ? socket->pacing_bps.load() : -1;
    }
    return -1;
  }

  // Feeds raw bytes to `site` as if `from` had dialed it.
  std::unique_ptr<transport::Channel> RawDial(const std::string& from, const std::string& site) {
    return *Dial(from, site);
  }

 private:
  absl::StatusOr<std::unique_ptr<transport::Channel>> Dial(const std::string& from,
                                                           const std::string& to) {
    int fds[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, fds) != 0) return absl::InternalError("socketpair");
    auto server = std::make_unique<SocketChannel>(fds[1], from);
    ExchangeHub* target = hubs_.at(to).get();
    absl::MutexLock lock(&mu_);
    threads_.emplace_back([target, server = std::move(server)]() mutable {
      target->ServeInbound(std::move(server));
    });
    auto client = std::make_unique<SocketChannel>(fds[0], to, &unsent_);
    // Shutting down the dialer's end breaks both directions.
    links_.push_back({from, to, client->socket()});
    return client;
  }

  std::atomic<uint64_t> unsent_{0};
  std::vector<std::string> names_;
  peer::PriorityGate gate_;
  std::map<std::string, std::unique_ptr<peer::PeerMemoryBudget>> budgets_;
  std::map<std::string, std::unique_ptr<ExchangeHub>> hubs_;
  struct Link {
    std::string from;
    std::string to;
    std::weak_ptr<SocketChannel::Socket> socket;
  };
  absl::Mutex mu_;
  std::vector<std::thread> threads_ ABSL_GUARDED_BY(mu_);
  std::vector<Link> links_ ABSL_GUARDED_BY(mu_);
};

inline AllReduceArgs Args(uint64_t seq, v1::ExchangeDType dtype, v1::ReduceOp op = v1::SUM,
                          absl::Duration timeout = absl::Seconds(20)) {
  AllReduceArgs a;
  a.group = "g";
  a.op_id = absl::StrCat("op-", seq, "-", std::rand());
  a.seq = seq;
  a.dtype = dtype;
  a.op = op;
  a.timeout = timeout;
  return a;
}

template <typename T>
absl::Span<uint8_t> Bytes(std::vector<T>& v) {
  return {reinterpret_cast<uint8_t*>(v.data()), v.size() * sizeof(T)};
}

// Runs one all-reduce at each of `sites` concurrently, each on its own buffer.
inline std::map<std::string, OpResult> RunAll(
    Net& net, const std::vector<std::string>& sites, const AllReduceArgs& args,
    std::map<std::string, std::vector<uint8_t>>& buffers) {
  std::map<std::string, std::future<OpResult>> futures;
  for (const auto& s : sites) {
    AllReduceArgs a = args;
    a.op_id = absl::StrCat(args.op_id, "@", s);
    futures[s] = std::async(std::launch::async, [&net, &buffers, s, a] {
      return net.hub(s).AllReduce(a, absl::MakeSpan(buffers[s]));
    });
  }
  std::map<std::string, OpResult> results;
  for (auto& [s, f] : futures) results[s] = f.get();
  return results;
}

inline constexpr uint64_t kMiB = 1 << 20;

// Writes one exchange message on a raw link, as a hostile site would: its
// header and its payload (if any) in one segment.
inline absl::Status Plant(transport::Channel& raw, v1::ExchangePeerMessage h,
                          absl::Span<const uint8_t> payload = {}) {
  static std::atomic<uint64_t> next_id{1};
  h.set_msg_id(next_id++);
  h.set_total_bytes(payload.size());
  h.set_payload_bytes(payload.size());
  h.set_offset(0);
  if (absl::Status s = wire::SendProto(raw, wire::FrameType::kControl, 0, h); !s.ok()) return s;
  if (payload.empty()) return absl::OkStatus();
  return raw.Write({payload});
}

}  // namespace longhaul::exchange

#endif  // LONGHAUL_TESTS_EXCHANGE_HUB_NET_H_
