#include "daemon/transport/tcp_info.h"

#include <linux/sockios.h>
#include <linux/tcp.h>
#include <netinet/in.h>
#include <sys/ioctl.h>
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

bool RestartCongestionControlIfIdle(int fd, const std::string& module) {
  static constexpr char kOther[] = "reno";  // built into every kernel
  if (module.empty() || module == kOther) return false;
  int queued = 0;  // SIOCOUTQ: unacknowledged plus unsent bytes
  if (::ioctl(fd, SIOCOUTQ, &queued) != 0 || queued != 0) return false;
  if (setsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, kOther, sizeof kOther - 1) != 0) return false;
  return setsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, module.data(), module.size()) == 0;
}

}  // namespace longhaul::transport
