#ifndef LONGHAUL_DAEMON_TRANSPORT_TCP_TLS_CHANNEL_H_
#define LONGHAUL_DAEMON_TRANSPORT_TCP_TLS_CHANNEL_H_

// One tcp transport channel: a TLS 1.3 stream over a kernel TCP socket, with
// the bookkeeping the transport's connection caps, idle sweep and trust
// reloads need (the TcpTlsRegistry every channel of a transport shares).
// Internal to the tcp transport (tcp_tls_transport.cc makes and owns them).

#include <openssl/ssl.h>
#include <openssl/x509.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

// After <utility>: Debian's Boost.Asio uses std::exchange without including it.
#include <boost/asio.hpp>
#include <boost/asio/ssl.hpp>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "common/clock.h"
#include "daemon/transport/tls_trust.h"
#include "daemon/transport/transport.h"

namespace longhaul::transport {

namespace asio = boost::asio;
namespace ssl = boost::asio::ssl;
using tcp = asio::ip::tcp;

class TcpTlsChannel;

// Operations (reads and writes) on the channels of one peer site, counted
// by the channels and read by the idle sweep. Thread-safe.
struct SiteActivity {
  std::atomic<uint64_t> operations{0};
};

// The trust material new channels take, the authenticated channels a reload
// must re-check, and what the connection caps count. Shared by the
// transport and its channels, so that a channel may outlive the transport.
// Thread-safe.
struct TcpTlsRegistry {
  // `clock` times the sites' activity and the handshake deadlines; it must outlive the registry.
  explicit TcpTlsRegistry(const Clock& clock) : clock(clock) {}

  struct Site {
    std::shared_ptr<SiteActivity> activity = std::make_shared<SiteActivity>();
    uint32_t accepted = 0;  // authenticated accepted channels open
    uint64_t seen = 0;      // activity->operations at the last sweep
    Timestamp active;       // when they last changed
  };

  const Clock& clock;

  absl::Mutex mu;
  std::shared_ptr<TrustContext> trust ABSL_GUARDED_BY(mu);
  absl::flat_hash_set<TcpTlsChannel*> live ABSL_GUARDED_BY(mu);
  // Accepted connections before their HELLO, in total and by source IP.
  uint32_t pending ABSL_GUARDED_BY(mu) = 0;
  absl::flat_hash_map<std::string, uint32_t> pending_per_address ABSL_GUARDED_BY(mu);
  absl::flat_hash_map<std::string, Site> sites ABSL_GUARDED_BY(mu);

  Site& SiteLocked(const std::string& name) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    auto [it, inserted] = sites.try_emplace(name);
    if (inserted) it->second.active = clock.Now();
    return it->second;
  }
};

// The TCP socket under a channel's TLS stream. Boost.Asio's TLS stream reads
// and writes its lower layer one record (at most 16 KiB of payload) at a
// time: a system call per record, and on loopback a wake-up of the other
// side per record. Here a blocking read takes what the socket holds, up to
// kReadBytes, and serves the records from that; and the records of one
// Channel::Write (between BeginBatch and EndBatch) leave kWriteBytes at a
// time, the rest when the batch ends. The buffers are made at first use, so
// a connection that only handshakes holds none. Writes outside a batch (the handshake,
// TLS's own messages during a read) go straight out. Asynchronous operations
// (the handshake and the first read of an accepted channel, on the io
// thread) go straight to the socket; they all come before the first
// blocking read, so nothing read ahead is ever skipped. Not thread-safe,
// like the TLS stream above it.
class BatchingSocket {
 public:
  using executor_type = tcp::socket::executor_type;
  using lowest_layer_type = tcp::socket::lowest_layer_type;
  static constexpr size_t kReadBytes = 64u << 10;
  static constexpr size_t kWriteBytes = 256u << 10;

  explicit BatchingSocket(tcp::socket socket) : socket_(std::move(socket)) {}

  executor_type get_executor() { return socket_.get_executor(); }
  lowest_layer_type& lowest_layer() { return socket_.lowest_layer(); }
  const lowest_layer_type& lowest_layer() const { return socket_.lowest_layer(); }

  template <typename MutableBuffers>
  size_t read_some(const MutableBuffers& buffers, boost::system::error_code& ec) {
    if (read_at_ == read_end_) {
      if (!read_buffer_) read_buffer_ = std::make_unique_for_overwrite<uint8_t[]>(kReadBytes);
      read_at_ = read_end_ = 0;
      read_end_ = socket_.read_some(asio::buffer(read_buffer_.get(), kReadBytes), ec);
      if (ec) return 0;
    }
    const size_t n = asio::buffer_copy(
        buffers, asio::buffer(read_buffer_.get() + read_at_, read_end_ - read_at_));
    read_at_ += n;
    ec = {};
    return n;
  }

  template <typename ConstBuffers>
  size_t write_some(const ConstBuffers& buffers, boost::system::error_code& ec) {
    if (!batching_) return socket_.write_some(buffers, ec);
    if (write_len_ == kWriteBytes && !Flush(ec)) return 0;
    if (!write_buffer_) write_buffer_ = std::make_unique_for_overwrite<uint8_t[]>(kWriteBytes);
    const size_t n = asio::buffer_copy(
        asio::buffer(write_buffer_.get() + write_len_, kWriteBytes - write_len_), buffers);
    write_len_ += n;
    ec = {};
    return n;
  }

  template <typename MutableBuffers, typename Handler>
  auto async_read_some(const MutableBuffers& buffers, Handler&& handler) {
    return socket_.async_read_some(buffers, std::forward<Handler>(handler));
  }
  template <typename ConstBuffers, typename Handler>
  auto async_write_some(const ConstBuffers& buffers, Handler&& handler) {
    return socket_.async_write_some(buffers, std::forward<Handler>(handler));
  }

  void BeginBatch() { batching_ = true; }
  // Sends what the batch holds; false (with `ec`) when the socket failed.
  bool EndBatch(boost::system::error_code& ec) {
    batching_ = false;
    return Flush(ec);
  }

 private:
  bool Flush(boost::system::error_code& ec) {
    const size_t len = std::exchange(write_len_, 0);
    if (len > 0) asio::write(socket_, asio::buffer(write_buffer_.get(), len), ec);
    return !ec;
  }

  tcp::socket socket_;
  std::unique_ptr<uint8_t[]> read_buffer_;
  size_t read_at_ = 0;
  size_t read_end_ = 0;
  std::unique_ptr<uint8_t[]> write_buffer_;
  size_t write_len_ = 0;
  bool batching_ = false;
};
using TlsStream = ssl::stream<BatchingSocket>;

class TcpTlsChannel final : public Channel {
 public:
  // `socket` is connected; the TLS session uses `trust` for its handshake.
  TcpTlsChannel(tcp::socket socket, std::shared_ptr<TrustContext> trust,
                std::shared_ptr<TcpTlsRegistry> registry, bool dialed);
  ~TcpTlsChannel() override;

  TlsStream& stream() { return stream_; }
  const std::shared_ptr<TrustContext>& trust() const { return trust_; }
  bool dialed() const { return dialed_; }
  void set_identity(std::string site, std::string address) {
    peer_site_ = std::move(site);
    peer_address_ = std::move(address);
  }
  void set_congestion_control(std::string cc) { congestion_control_ = std::move(cc); }
  void set_peer_certificate(std::shared_ptr<const PeerCertificate> cert) {
    peer_certificate_ = std::move(cert);
  }
  std::shared_ptr<const PeerCertificate> peer_certificate() const override {
    return peer_certificate_;
  }

  // An accepted channel takes the pending-handshake slot its transport
  // counted for `ip` (in registry_->pending and pending_per_address) and
  // gives it back at EndHandshake or destruction. Before anyone else can
  // see the channel.
  void TakePendingSlot(std::string ip, Timestamp deadline) {
    pending_ = true;
    source_ip_ = std::move(ip);
    deadline_ = deadline;
  }
  // The three below under registry_->mu.
  bool pending() const { return pending_; }
  Timestamp deadline() const { return deadline_; }
  // True the first time only: a channel is closed (and counted) once,
  // whether by the sweep or by its handshake timer.
  bool MarkClosing() { return !std::exchange(closing_, true); }

  // An accepted channel counts against its site's connection cap until it
  // is destroyed. Under registry_->mu.
  void CountForSite(const std::string& site) { counted_site_ = site; }
  void set_activity(std::shared_ptr<SiteActivity> activity) { activity_ = std::move(activity); }

  // Bytes already read from the TLS stream (while the io thread waited for
  // the peer's first bytes): ReadExactly returns them first.
  asio::mutable_buffer prefix_space() { return asio::buffer(prefix_); }
  void set_prefix(size_t bytes) {
    prefix_at_ = 0;
    prefix_end_ = bytes;
  }

  void KeepWhenIdle() override;
  bool keep_when_idle() const { return keep_when_idle_; }  // under registry_->mu

  void EndHandshake() override;

  // Called by the verify callback, during the handshake, with the first
  // certificate that failed verification.
  void NoteRejected(X509* cert) {
    if (rejected_ == nullptr && cert != nullptr && X509_up_ref(cert) == 1) rejected_.reset(cert);
  }
  X509* rejected() const { return rejected_.get(); }

  absl::Status Write(absl::Span<const absl::Span<const uint8_t>> parts) override;
  absl::Status ReadExactly(absl::Span<uint8_t> out) override;

  void Abort() override;
  absl::StatusOr<std::vector<uint8_t>> ExportKeyingMaterial(absl::string_view label,
                                                            size_t length) override;

  const std::string& peer_site() const override { return peer_site_; }
  const std::string& peer_address() const override { return peer_address_; }

  void LimitUnsentBytes(uint64_t bytes) override;
  void LimitPacingRate(Bandwidth rate) override;
  void RestartCongestionControlIfIdle() override;

  uint64_t UnsentBytes() const override;
  LinkStats Stats() const override;

 private:
  void Touch() {
    if (activity_ != nullptr) activity_->operations.fetch_add(1, std::memory_order_relaxed);
  }

  void ReleasePendingLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(registry_->mu);
  absl::Status ToStatus(const boost::system::error_code& ec, absl::string_view op) const;

  // Declared before stream_, which holds an SSL made from it.
  const std::shared_ptr<TrustContext> trust_;
  const std::shared_ptr<TcpTlsRegistry> registry_;
  const bool dialed_;
  TlsStream stream_;
  std::string peer_site_;
  std::string peer_address_;
  std::string congestion_control_;
  std::shared_ptr<const PeerCertificate> peer_certificate_;
  X509Ptr rejected_;
  std::atomic<bool> aborted_{false};
  // Set before the channel is handed over; read-only after.
  std::shared_ptr<SiteActivity> activity_;
  std::array<uint8_t, 64> prefix_{};
  size_t prefix_at_ = 0;
  size_t prefix_end_ = 0;
  // Guarded by registry_->mu (a lock of another object, so not annotated).
  bool pending_ = false;
  bool closing_ = false;
  bool keep_when_idle_ = false;
  std::string source_ip_;
  Timestamp deadline_;  // on registry_->clock
  std::string counted_site_;
};

// OpenSSL's verify callback for the handshakes of TcpTlsChannels (give it to
// TrustContext::Load): applies ToleratesOverdueCrl, and records the first
// certificate that failed on the channel (TcpTlsChannel::rejected()).
int VerifyCallback(int ok, X509_STORE_CTX* store);

}  // namespace longhaul::transport

#endif  // LONGHAUL_DAEMON_TRANSPORT_TCP_TLS_CHANNEL_H_
