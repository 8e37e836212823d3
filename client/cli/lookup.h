#ifndef LONGHAUL_CLIENT_CLI_LOOKUP_H_
#define LONGHAUL_CLIENT_CLI_LOOKUP_H_

// How the CLI finds the daemon and the transfer an operator names, and how
// it tells a refusal from a failure.

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "longhaul/client.h"

namespace longhaul::cli {

// A request the daemon refuses outright (a bad argument, an unknown peer or
// transfer, a source the caller may not send, a transfer in a state that
// does not allow the call, a call its token's role does not allow) is the
// caller's to fix, like a usage error: exit 2. A missing or wrong token
// (Unauthenticated) is not: the caller's credentials are, like any other
// error the daemon reports, exit 1.
bool IsRefusal(const absl::Status& status);

// The gRPC address of `address` as typed: a plain path ("/run/x.sock",
// "./x.sock") is a unix socket. A unix socket that does not exist is an
// Unavailable error at once, naming the path and how to start the daemon.
absl::StatusOr<std::string> ControlAddress(const std::string& address);

// The transfer an operator means by `text`: the id itself, or the one
// transfer whose id starts with it. An ambiguous prefix is refused
// (InvalidArgument), naming the candidates; no match is the daemon's
// NotFound for `text`.
absl::StatusOr<std::string> ResolveId(Client& client, const std::string& text);

// Which transfers `ls` shows: every one not ended, and those that ended
// within `since`; --all: every one the daemon remembers; --failed: only
// FAILED ones (of those).
struct ListFilter {
  bool all = false;
  bool failed = false;
  absl::Duration since = absl::Hours(24);
};
bool Listed(const v1::TransferStatus& status, const ListFilter& filter, absl::Time now);

}  // namespace longhaul::cli

#endif  // LONGHAUL_CLIENT_CLI_LOOKUP_H_
