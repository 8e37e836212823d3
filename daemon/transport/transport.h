#ifndef LONGHAUL_DAEMON_TRANSPORT_TRANSPORT_H_
#define LONGHAUL_DAEMON_TRANSPORT_TRANSPORT_H_

// The data-plane seam. A Transport makes authenticated, encrypted channels to
// peer sites; everything above it (frames, sessions, the journal) is the same
// whichever transport carries the bytes. Implementations: tcp_tls_transport
// (N TLS 1.3 connections); a udp transport plugs in here too.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/clock.h"
#include "common/units.h"
#include "daemon/wire/byte_stream.h"

namespace longhaul::transport {

// The verified certificate chain a channel's peer presented at its TLS
// handshake. Defined by the TLS transport and opaque elsewhere: a transport
// that keys its channels from a TLS channel keeps it, to ask
// Transport::CheckPeer about it later. Immutable; shared across threads.
class PeerCertificate;
struct TlsIdentity;

// What the kernel (or our own controller) reports about one channel's path.
struct LinkStats {
  std::string congestion_control;  // e.g. "bbr", or "cubic" after a fallback
  std::string congestion_state;    // udp: the controller's state now, e.g. "Startup"; tcp: empty
  double rtt_ms = 0;
  double delivery_rate_mbit = 0;
  uint64_t retransmits = 0;         // segments/packets retransmitted so far
  uint64_t socket_buffer_bytes = 0;  // send buffer granted by the kernel
  uint64_t max_pacing_rate_bytes_per_second = 0;  // LimitPacingRate's cap; 0: none
};

// A reliable, ordered, encrypted byte stream to one authenticated peer site:
// Write, ReadExactly and peer_site come from wire::ByteStream.
// Not thread-safe: one thread reads and writes it. Abort() is the exception:
// any thread may call it to fail the channel's pending and future calls, which
// is how sessions are cancelled and daemons shut down.
class Channel : public wire::ByteStream {
 public:
  virtual void Abort() = 0;

  // "host:port" of the peer, for logs.
  virtual const std::string& peer_address() const = 0;
  virtual LinkStats Stats() const = 0;

  // Caps the bytes written to this channel that the transport has not yet
  // put on the wire (TCP_NOTSENT_LOWAT for tcp). A bulk stream sets it so
  // that its large send buffer holds what is in flight, not a backlog: when
  // it pauses (to let an exchange go first), its share of the link frees up
  // at once instead of after its queued megabytes drain. Best effort; the
  // default does nothing.
  virtual void LimitUnsentBytes(uint64_t bytes) {}

  // Bytes written to this channel that the transport has not yet put on the
  // wire (for tcp the unsent part of the socket's send queue, SIOCOUTQNSD).
  // Unlike the rest of the channel, any thread may call it. 0 when the
  // transport cannot tell.
  virtual uint64_t UnsentBytes() const { return 0; }

  // Caps the rate at which the transport puts this channel's bytes on the
  // wire (SO_MAX_PACING_RATE for tcp), whatever its congestion control
  // would allow. Best effort; the default does nothing. Unlike the other
  // calls it may come from any thread (a sibling stream's sender).
  virtual void LimitPacingRate(Bandwidth rate) {}

  // Called just before a burst (a collective) on a channel that may have
  // been idle: if nothing is unacknowledged or unsent, restarts the
  // congestion control's timers so that none fires mid-burst (for tcp,
  // RestartCongestionControlIfIdle in tcp_info.h). Any thread may call it.
  // Best effort; the default does nothing.
  virtual void RestartCongestionControlIfIdle() {}

  // The certificate the peer proved at the TLS handshake that authenticated
  // this channel; nullptr for channels without one.
  virtual std::shared_ptr<const PeerCertificate> peer_certificate() const { return nullptr; }

  // RFC 5705 / RFC 8446 §7.5 exporter over the channel's TLS session, for
  // keys of protocols keyed by this handshake (the udp transport). Channels
  // without a TLS session return Unimplemented.
  virtual absl::StatusOr<std::vector<uint8_t>> ExportKeyingMaterial(absl::string_view label,
                                                                    size_t length) {
    return absl::UnimplementedError("this channel has no TLS session to export keys from");
  }

  // Called by whoever serves an accepted channel once the peer's first
  // message (its HELLO) has arrived: the handshake deadline
  // (ConnectionLimits::handshake_timeout, counted from the TCP accept) stops
  // applying and the channel no longer counts as a pending handshake. An
  // accepted channel that never gets this call is aborted at that deadline.
  // Dialed channels ignore it. Any thread.
  virtual void EndHandshake() {}
  // Called for an accepted channel whose silence is expected: an exchange
  // link between group members carries nothing between rounds, and closing
  // it would fail the group's next operation. The idle timeout does not
  // close it; max_connections_per_peer still bounds such channels. Any thread.
  virtual void KeepWhenIdle() {}
};

using ChannelHandler = std::function<void(std::unique_ptr<Channel>)>;

// What a listening transport refused or closed since it started, for
// metrics; and the handshakes pending now.
struct ConnectionCounters {
  uint64_t refused_too_many_pending = 0;       // past max_pending_handshakes
  uint64_t refused_too_many_from_address = 0;  // past max_pending_handshakes_per_address
  uint64_t refused_too_many_for_peer = 0;      // past max_connections_per_peer
  uint64_t refused_no_thread = 0;              // a thread could not be created
  uint64_t refused_no_fd = 0;                  // accept failed: out of file descriptors
  uint64_t handshakes_failed = 0;              // TLS or certificate refused
  uint64_t handshakes_timed_out = 0;           // TLS plus HELLO past handshake_timeout
  uint64_t idle_closed = 0;                    // authenticated, past idle_timeout
  uint64_t pending_handshakes = 0;             // now: accepted, HELLO not yet received
};

// Makes and accepts channels. Thread-safe.
class Transport {
 public:
  virtual ~Transport() = default;

  // Connects to `address` ("host:port") and authenticates: the peer must
  // present a certificate chaining to our CA that names `site`. Errors say
  // which check failed, e.g. "peer at 10.0.0.2:7700 presented a certificate
  // for site-c, expected site-b".
  virtual absl::StatusOr<std::unique_ptr<Channel>> Dial(const std::string& site,
                                                        const std::string& address) = 0;

  // Listens on `address` ("host:port", port 0 picks one). Each channel that
  // authenticates as a configured site is handed to `on_channel` on a thread
  // of its own; refused connections are logged and closed. The tcp
  // transport hands a channel over only once the peer has sent its first
  // bytes; until then (and until Channel::EndHandshake) it counts against
  // the ConnectionLimits the transport was made with.
  virtual absl::Status Listen(const std::string& address, ChannelHandler on_channel) = 0;
  // The bound port once Listen has succeeded.
  virtual uint16_t listen_port() const = 0;

  // Stops accepting and aborts every open channel. Idempotent.
  virtual void Shutdown() = 0;

  // Takes new trust material (a SIGHUP): the TLS transport re-reads the CA,
  // its own certificate and key and the CRL named by `identity` for the
  // handshakes that follow. Then every transport aborts each open channel
  // whose peer a handshake would now refuse (a revoked certificate), and
  // logs it. local_site and peer_sites must be those the transport was made
  // with. On error nothing changes, and the error names the file to fix.
  // A transport keyed by another (udp) loads no files: it re-checks its
  // channels against that transport, which must be reloaded first.
  virtual absl::Status ReloadTrust(const TlsIdentity& identity) { return absl::OkStatus(); }

  // OK if a handshake now would accept the peer that presented `peer`;
  // otherwise PermissionDenied saying why, e.g. "certificate of site-a
  // (serial 1A2B) is revoked by tls.crl /etc/longhaul/tls/crl.pem".
  virtual absl::Status CheckPeer(const PeerCertificate& peer) const { return absl::OkStatus(); }

  // Refusals and closes of accepted connections (all zero for a transport
  // that keeps none). Any thread.
  virtual ConnectionCounters connection_counters() const { return {}; }

  // Another transport that moves data with peer sites (the udp plane, whose
  // control and keying connections are this transport's) names the sites it
  // has live flows with; the idle timeout counts them as active, so a udp
  // transfer's quiet TCP control connection stays open. `source` is called
  // from this transport's threads until RemoveActivitySource(id) returns.
  using ActivitySource = std::function<std::vector<std::string>()>;
  virtual uint64_t AddActivitySource(ActivitySource source) { return 0; }
  virtual void RemoveActivitySource(uint64_t id) {}
};

// The transports a daemon runs, by the name configs use ("tcp", "udp").
// Control connections always use "tcp"; data may use any.
using TransportSet = std::vector<std::pair<std::string, Transport*>>;
inline Transport* FindTransport(const TransportSet& set, absl::string_view name) {
  for (const auto& [n, t] : set) {
    if (n == name) return t;
  }
  return nullptr;
}

// The identity and trust material shared by every transport of a daemon.
struct TlsIdentity {
  std::string ca_file;
  std::string cert_file;
  std::string key_file;
  std::string local_site;
  // Sites allowed to connect to us (the configured peers).
  std::vector<std::string> peer_sites;
  // PEM CRLs issued by the CA in ca_file: a certificate they list is refused
  // at every handshake. "": no revocation list.
  std::string crl_file{};
};

struct TcpTuning {
  // SO_SNDBUF/SO_RCVBUF per connection, sized by the caller from the BDP.
  uint64_t socket_buffer_bytes = 4 << 20;
  // Kernel congestion control requested per socket; on failure the kernel
  // default is kept, logged, and reported in LinkStats.
  std::string congestion_control = "bbr";
};

// Bounds on the connections a listening transport accepts (the daemon's
// peer_limits, deploy/CONFIG.md). A pending handshake is an accepted
// connection whose TLS handshake or first message (HELLO) has not finished;
// it holds no thread. Past a cap a new connection is closed at once.
struct ConnectionLimits {
  // From the TCP accept to Channel::EndHandshake.
  TimeDelta handshake_timeout = TimeDelta::Seconds(10);
  uint32_t max_pending_handshakes = 256;
  uint32_t max_pending_handshakes_per_address = 16;  // per source IP
  // Authenticated accepted connections per peer site.
  uint32_t max_connections_per_peer = 256;
  // An accepted, authenticated connection is closed when no connection to
  // or from its peer site has carried a byte for this long (so the quiet
  // control connection of a busy transfer stays). Zero: never.
  TimeDelta idle_timeout = TimeDelta::Seconds(15 * 60);
  // Times the handshake deadlines, the idle timeout and the refusal log's rate limit; it must
  // outlive the transport and its channels. nullptr: RealClock::Get().
  const Clock* clock = nullptr;
};

// N TLS 1.3 connections over kernel TCP (AES-256-GCM).
absl::StatusOr<std::unique_ptr<Transport>> MakeTcpTlsTransport(const TlsIdentity& identity,
                                                               const TcpTuning& tuning,
                                                               const ConnectionLimits& limits = {});

}  // namespace longhaul::transport

#endif  // LONGHAUL_DAEMON_TRANSPORT_TRANSPORT_H_
