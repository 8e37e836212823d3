#include "common/host_port.h"

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace longhaul {
namespace {

absl::Status Bad(absl::string_view address, absl::string_view why) {
  return absl::InvalidArgumentError(
      absl::StrCat("address '", address, "' is not host:port or [v6]:port: ", why));
}

}  // namespace

absl::StatusOr<HostPort> ParseHostPort(absl::string_view address) {
  absl::string_view host;
  absl::string_view port;
  if (!address.empty() && address.front() == '[') {
    const size_t close = address.find(']');
    if (close == absl::string_view::npos) return Bad(address, "no closing ']'");
    if (close + 1 >= address.size() || address[close + 1] != ':') {
      return Bad(address, "no ':port' after ']'");
    }
    host = address.substr(1, close - 1);
    port = address.substr(close + 2);
    if (host.find_first_of("[]") != absl::string_view::npos) return Bad(address, "stray bracket");
  } else {
    const size_t colon = address.find(':');
    if (colon == absl::string_view::npos) return Bad(address, "no ':port'");
    host = address.substr(0, colon);
    port = address.substr(colon + 1);
    if (port.find(':') != absl::string_view::npos) {
      return Bad(address, "more than one ':' (an IPv6 address needs brackets)");
    }
    if (host.find_first_of("[]") != absl::string_view::npos) return Bad(address, "stray bracket");
  }
  if (host.empty()) return Bad(address, "empty host");
  if (port.empty()) return Bad(address, "empty port");
  if (port.size() > 5) return Bad(address, "port out of range");
  uint32_t number = 0;
  for (char c : port) {
    if (!absl::ascii_isdigit(static_cast<unsigned char>(c))) {
      return Bad(address, "port is not a decimal number");
    }
    number = number * 10 + static_cast<uint32_t>(c - '0');
  }
  if (number > 65535) return Bad(address, "port out of range");
  return HostPort{std::string(host), static_cast<uint16_t>(number)};
}

}  // namespace longhaul
