#include "daemon/transport/tcp_info.h"

#include <linux/tcp.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cstddef>
#include <cstring>

namespace longhaul::transport {

bool ReadKernelTcpInfo(int fd, KernelTcpInfo* out) {
  struct tcp_info info;
  std::memset(&info, 0, sizeof info);
  socklen_t len = sizeof info;
  if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &info, &len) != 0) return false;
  out->rtt_ms = info.tcpi_rtt / 1000.0;
  out->total_retrans = info.tcpi_total_retrans;
  // Older kernels return a shorter struct without the delivery rate.
  if (len >= offsetof(struct tcp_info, tcpi_delivery_rate) + sizeof info.tcpi_delivery_rate) {
    out->delivery_rate_mbit = static_cast<double>(info.tcpi_delivery_rate) * 8 / 1e6;
  }
  return true;
}

}  // namespace longhaul::transport
