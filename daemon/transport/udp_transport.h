#ifndef LONGHAUL_DAEMON_TRANSPORT_UDP_TRANSPORT_H_
#define LONGHAUL_DAEMON_TRANSPORT_UDP_TRANSPORT_H_

// The udp transport (DESIGN.md "Transports", proto/UDP.md): each Channel is
// one flow of our own reliable, encrypted datagram protocol on a UDP socket
// of its own (its own source port, so ECMP spreads a transfer's N flows).
//
// Key agreement rides on the tcp transport: Dial opens a TLS channel through
// `tls_transport`, sends Hello{role: UDP_HANDSHAKE}, exchanges one
// UdpHandshake message each way (connection ids, UDP ports, windows) and
// exports the packet keys from that TLS session (RFC 5705). The listening
// daemon routes that role to AcceptHandshake, which answers and hands the
// resulting Channel to the handler given to Listen().
//
// Revocation: each flow remembers the certificate its keying TLS channel
// proved. ReloadTrust (after the tls transport's) asks `tls_transport` about
// each open flow and aborts those whose peer it no longer accepts.
//
// Ports: the listener's flows all use the UDP port with the number of the
// tcp listener (SO_REUSEPORT, one connected socket per flow, so the kernel
// delivers each flow's datagrams to its own socket); the dialer's flows use
// ephemeral ports. Listen() binds that port and fails if it is taken.
//
// Congestion control: the flows this transport dials to one peer site share
// one congestion::AggregateController (one BBRv3 model, one fair share),
// unless `coupled` is false, when each flow has its own Bbr3. The model lives
// while any of those flows is open; a flow dialed after the last one closed
// starts a fresh one. Accepted flows (which carry acknowledgements back) each
// have their own Bbr3.
//
// Thread-safe.

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "common/clock.h"
#include "common/units.h"
#include "daemon/transport/transport.h"
#include "daemon/transport/udp_crypto.h"

namespace longhaul::transport {

struct UdpOptions {
  // Per flow: the receive window we grant and the send buffer we keep. The
  // daemon sizes it from the link's bandwidth-delay product.
  uint64_t window_bytes = 16ull << 20;
  // SO_SNDBUF / SO_RCVBUF per socket.
  uint64_t socket_buffer_bytes = 8ull << 20;
  // Largest datagram sent; the path MTU the kernel knows lowers it.
  size_t max_datagram = 8972;
  bool coupled = true;
  bool gso = true;
  uint64_t key_update_interval = udp::kDefaultKeyUpdateInterval;
  TimeDelta idle_timeout = TimeDelta::Seconds(30);
  // Nice value for each flow's I/O thread (best effort; raising priority needs CAP_SYS_NICE or
  // RLIMIT_NICE). The I/O thread sends the ACKs and releases paced bursts, work the kernel does in
  // softirq context for TCP; queued behind the daemon's own hashing and disk copies (or anything
  // else on the host) it delays ACKs, which inflates RTT samples and stalls the peer's cwnd.
  // 0 leaves the thread as it is.
  int io_thread_nice = -10;
  // Test hook: every flow drops every Nth datagram it receives (0: none).
  uint32_t drop_every_nth_received_datagram = 0;
  const Clock* clock = nullptr;  // nullptr: RealClock
};

class UdpTransport : public Transport {
 public:
  // Serves one channel that the tcp transport accepted and PeerRouter routed
  // here for Hello{role: UDP_HANDSHAKE}. Runs the flow's handler (the one
  // given to Listen) on the calling thread; returns when it returns.
  virtual void AcceptHandshake(std::unique_ptr<Channel> tls_channel) = 0;
};

// `tls_transport` (the daemon's tcp transport) must outlive the result.
absl::StatusOr<std::unique_ptr<UdpTransport>> MakeUdpTransport(Transport& tls_transport,
                                                               const UdpOptions& options);

}  // namespace longhaul::transport

#endif  // LONGHAUL_DAEMON_TRANSPORT_UDP_TRANSPORT_H_
