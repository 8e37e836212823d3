#ifndef LONGHAUL_COMMON_HOST_PORT_H_
#define LONGHAUL_COMMON_HOST_PORT_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace longhaul {

struct HostPort {
  std::string host;  // a name or an address literal, without brackets
  uint16_t port = 0;
};

// Parses "host:port", or "[v6 address]:port" for an IPv6 literal (the only
// form in which a host may hold a colon). The port is 1 to 5 decimal digits
// and at most 65535; 0 is accepted (callers give it their own meaning, e.g.
// "any port"). Anything else, including an empty host, a missing or signed
// port, an unclosed bracket or text after the port, is InvalidArgument with
// the address and what is wrong in the message. Nothing is resolved.
absl::StatusOr<HostPort> ParseHostPort(absl::string_view address);

}  // namespace longhaul

#endif  // LONGHAUL_COMMON_HOST_PORT_H_
