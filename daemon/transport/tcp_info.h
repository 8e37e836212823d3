#ifndef LONGHAUL_DAEMON_TRANSPORT_TCP_INFO_H_
#define LONGHAUL_DAEMON_TRANSPORT_TCP_INFO_H_

#include <cstdint>
#include <string>

namespace longhaul::transport {

// The TCP_INFO figures longhaul reports per link. Kept in its own translation
// unit because <linux/tcp.h> (which has tcpi_delivery_rate) and glibc's
// <netinet/tcp.h> cannot be included together.
struct KernelTcpInfo {
  double rtt_ms = 0;
  double delivery_rate_mbit = 0;
  uint64_t total_retrans = 0;
};

// Returns false when the socket gives no TCP_INFO.
bool ReadKernelTcpInfo(int fd, KernelTcpInfo* out);

// If nothing written to the socket is still unacknowledged or unsent,
// re-initializes its congestion-control module `module` (by selecting
// "reno" and then `module` again) and returns true. For BBRv1 this restarts
// its 10 s min-RTT window: a burst that starts now does not meet PROBE_RTT
// (cwnd of 4 packets for 200 ms) before it is 10 s old. The kernel's own
// 5-minute min-RTT filter seeds the new estimate, so nothing is forgotten
// that a restart from idle would not forget too. Returns false, changing
// nothing, when the socket is busy or `module` is empty or "reno".
bool RestartCongestionControlIfIdle(int fd, const std::string& module);

}  // namespace longhaul::transport

#endif  // LONGHAUL_DAEMON_TRANSPORT_TCP_INFO_H_
