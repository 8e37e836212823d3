#ifndef LONGHAUL_DAEMON_TRANSPORT_UDP_CHECK_H_
#define LONGHAUL_DAEMON_TRANSPORT_UDP_CHECK_H_

// Broken internal invariants of the udp transport are fatal (STYLE.md,
// Errors). Debian's abseil has no absl/log, so this is a minimal CHECK.

#include <cstdio>
#include <cstdlib>

#define UDP_CHECK(condition)                                                           \
  do {                                                                                 \
    if (!(condition)) {                                                                \
      std::fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #condition); \
      std::abort();                                                                    \
    }                                                                                  \
  } while (0)

#endif  // LONGHAUL_DAEMON_TRANSPORT_UDP_CHECK_H_
