#include "tests/wanem/emulator.h"

#include <unistd.h>

#include <cstdint>
#include <iostream>

namespace longhaul::wanem {

void StopThreadsAndDeleteSites(int& stop_fd, absl::Span<std::thread> threads,
                               absl::Span<int> tun_fds, absl::Span<const SiteSpec> sites) {
  if (stop_fd >= 0) {
    const uint64_t one = 1;
    [[maybe_unused]] ssize_t n = write(stop_fd, &one, sizeof(one));
  }
  for (std::thread& t : threads) {
    if (t.joinable()) t.join();
  }
  for (int& fd : tun_fds) {
    if (fd >= 0) close(fd);
    fd = -1;
  }
  for (const SiteSpec& site : sites) {
    if (absl::Status s = DeleteNamespace(site.ns); !s.ok()) {
      std::cerr << "longhaul-wanem: " << s.message() << "\n";
    }
  }
  if (stop_fd >= 0) close(stop_fd);
  stop_fd = -1;
}

}  // namespace longhaul::wanem
