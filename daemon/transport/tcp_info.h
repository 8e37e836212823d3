#ifndef LONGHAUL_DAEMON_TRANSPORT_TCP_INFO_H_
#define LONGHAUL_DAEMON_TRANSPORT_TCP_INFO_H_

#include <cstdint>

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

}  // namespace longhaul::transport

#endif  // LONGHAUL_DAEMON_TRANSPORT_TCP_INFO_H_
