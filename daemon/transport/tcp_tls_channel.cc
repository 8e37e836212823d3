#include "daemon/transport/tcp_tls_channel.h"

#include <linux/sockios.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <sys/ioctl.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstring>

#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "daemon/transport/tcp_info.h"

namespace longhaul::transport {
namespace {

// The SSL ex_data slot that points from an SSL to its TcpTlsChannel, for the
// verify callback.
int ChannelSlot() {
  static const int slot = SSL_get_ex_new_index(0, nullptr, nullptr, nullptr, nullptr);
  return slot;
}

}  // namespace

TcpTlsChannel::TcpTlsChannel(tcp::socket socket, std::shared_ptr<TrustContext> trust,
                             std::shared_ptr<TcpTlsRegistry> registry, bool dialed)
    : trust_(std::move(trust)),
      registry_(std::move(registry)),
      dialed_(dialed),
      stream_(std::move(socket), trust_->ssl()) {
  SSL_set_ex_data(stream_.native_handle(), ChannelSlot(), this);
}

TcpTlsChannel::~TcpTlsChannel() {
  {
    absl::MutexLock lock(&registry_->mu);
    registry_->live.erase(this);
    ReleasePendingLocked();
    if (!counted_site_.empty()) --registry_->SiteLocked(counted_site_).accepted;
  }
  boost::system::error_code ec;
  stream_.lowest_layer().close(ec);
}

void TcpTlsChannel::KeepWhenIdle() {
  absl::MutexLock lock(&registry_->mu);
  keep_when_idle_ = true;
}

void TcpTlsChannel::EndHandshake() {
  absl::MutexLock lock(&registry_->mu);
  if (!pending_) return;
  ReleasePendingLocked();
  if (!counted_site_.empty()) {
    registry_->SiteLocked(counted_site_).active = registry_->clock.Now();
  }
}

absl::Status TcpTlsChannel::Write(absl::Span<const absl::Span<const uint8_t>> parts) {
  absl::InlinedVector<asio::const_buffer, 4> buffers;
  for (absl::Span<const uint8_t> part : parts) buffers.emplace_back(part.data(), part.size());
  Touch();
  boost::system::error_code ec;
  stream_.next_layer().BeginBatch();
  asio::write(stream_, buffers, ec);
  boost::system::error_code flushed;
  stream_.next_layer().EndBatch(flushed);
  if (!ec) ec = flushed;
  Touch();
  return ToStatus(ec, "write");
}

absl::Status TcpTlsChannel::ReadExactly(absl::Span<uint8_t> out) {
  Touch();
  size_t buffered = std::min(out.size(), prefix_end_ - prefix_at_);
  if (buffered > 0) {
    std::memcpy(out.data(), prefix_.data() + prefix_at_, buffered);
    prefix_at_ += buffered;
    out = out.subspan(buffered);
    if (out.empty()) return absl::OkStatus();
  }
  boost::system::error_code ec;
  asio::read(stream_, asio::buffer(out.data(), out.size()), ec);
  Touch();
  return ToStatus(ec, "read");
}

void TcpTlsChannel::Abort() {
  aborted_.store(true);
  ::shutdown(stream_.lowest_layer().native_handle(), SHUT_RDWR);
}

absl::StatusOr<std::vector<uint8_t>> TcpTlsChannel::ExportKeyingMaterial(absl::string_view label,
                                                                         size_t length) {
  std::vector<uint8_t> out(length);
  if (SSL_export_keying_material(stream_.native_handle(), out.data(), out.size(), label.data(),
                                 label.size(), nullptr, 0, 0) != 1) {
    return absl::InternalError(absl::StrCat("TLS key export failed: ", OpenSslErrors()));
  }
  return out;
}

void TcpTlsChannel::LimitUnsentBytes(uint64_t bytes) {
  int lowat = static_cast<int>(std::min<uint64_t>(bytes, 1u << 30));
  setsockopt(stream_.lowest_layer().native_handle(), IPPROTO_TCP, TCP_NOTSENT_LOWAT, &lowat,
             sizeof lowat);
}

void TcpTlsChannel::LimitPacingRate(Bandwidth rate) {
  uint64_t bytes_per_second = static_cast<uint64_t>(std::max<int64_t>(rate.ToBytesPerSecond(), 1));
  setsockopt(stream_.lowest_layer().native_handle(), SOL_SOCKET, SO_MAX_PACING_RATE,
             &bytes_per_second, sizeof bytes_per_second);
}

void TcpTlsChannel::RestartCongestionControlIfIdle() {
  transport::RestartCongestionControlIfIdle(stream_.lowest_layer().native_handle(),
                                            congestion_control_);
}

uint64_t TcpTlsChannel::UnsentBytes() const {
  int fd = const_cast<TlsStream&>(stream_).lowest_layer().native_handle();
  int unsent = 0;
  if (::ioctl(fd, SIOCOUTQNSD, &unsent) != 0 || unsent < 0) return 0;
  return static_cast<uint64_t>(unsent);
}

LinkStats TcpTlsChannel::Stats() const {
  LinkStats stats;
  stats.congestion_control = congestion_control_;
  int fd = const_cast<TlsStream&>(stream_).lowest_layer().native_handle();
  KernelTcpInfo info;
  if (ReadKernelTcpInfo(fd, &info)) {
    stats.rtt_ms = info.rtt_ms;
    stats.delivery_rate_mbit = info.delivery_rate_mbit;
    stats.retransmits = info.total_retrans;
  }
  int sndbuf = 0;
  socklen_t len = sizeof sndbuf;
  if (getsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sndbuf, &len) == 0) stats.socket_buffer_bytes = sndbuf;
  uint64_t max_pacing = 0;
  len = sizeof max_pacing;
  if (getsockopt(fd, SOL_SOCKET, SO_MAX_PACING_RATE, &max_pacing, &len) == 0 &&
      len == sizeof max_pacing && max_pacing != ~uint64_t{0}) {
    stats.max_pacing_rate_bytes_per_second = max_pacing;
  }
  return stats;
}

void TcpTlsChannel::ReleasePendingLocked() {
  if (!pending_) return;
  pending_ = false;
  --registry_->pending;
  auto it = registry_->pending_per_address.find(source_ip_);
  if (it != registry_->pending_per_address.end() && --it->second == 0) {
    registry_->pending_per_address.erase(it);
  }
}

absl::Status TcpTlsChannel::ToStatus(const boost::system::error_code& ec,
                                     absl::string_view op) const {
  if (!ec) return absl::OkStatus();
  if (aborted_.load()) return absl::CancelledError(absl::StrCat(op, " aborted"));
  if (ec == asio::error::eof || ec == ssl::error::stream_truncated) {
    return absl::UnavailableError(
        absl::StrCat(peer_site_, " at ", peer_address_, " closed the connection"));
  }
  // TLS 1.3 ends the client's handshake before the server has judged the
  // client's certificate, so the server's verdict arrives on a read.
  if (ec.category() == asio::error::get_ssl_category() &&
      ERR_GET_REASON(ec.value()) == SSL_R_SSLV3_ALERT_CERTIFICATE_REVOKED) {
    return absl::PermissionDeniedError(absl::StrCat(
        peer_site_, " at ", peer_address_,
        " refused our certificate: its tls.crl lists it as revoked (this site needs a new "
        "certificate: deploy/pki.sh DIR SITE)"));
  }
  return absl::UnavailableError(
      absl::StrCat(op, " to ", peer_site_, " at ", peer_address_, " failed: ", ec.message()));
}

int VerifyCallback(int ok, X509_STORE_CTX* store) {
  if (ToleratesOverdueCrl(ok, store)) return 1;
  auto* ssl =
      static_cast<SSL*>(X509_STORE_CTX_get_ex_data(store, SSL_get_ex_data_X509_STORE_CTX_idx()));
  auto* channel =
      ssl != nullptr ? static_cast<TcpTlsChannel*>(SSL_get_ex_data(ssl, ChannelSlot())) : nullptr;
  if (channel != nullptr) channel->NoteRejected(X509_STORE_CTX_get_current_cert(store));
  return 0;
}

}  // namespace longhaul::transport
