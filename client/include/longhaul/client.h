#ifndef LONGHAUL_CLIENT_INCLUDE_LONGHAUL_CLIENT_H_
#define LONGHAUL_CLIENT_INCLUDE_LONGHAUL_CLIENT_H_

// The public C++ API of longhaul: talk to the local daemon (longhauld) to
// submit, watch and control transfers. Messages are the control API's
// protobufs (longhaul/v1/control.proto).

#include "absl/strings/string_view.h"
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "longhaul/v1/control.pb.h"

namespace longhaul {

// "site-b:/ckpt/run1/step100" -> {site-b, ckpt, run1/step100}.
struct Destination {
  std::string site;
  std::string export_name;
  std::string path;
};
absl::StatusOr<Destination> ParseDestination(absl::string_view text);
// Whether `text` names a location at a site, SITE:/EXPORT/PATH (a colon
// right before the first slash), rather than a local path. Such a source is
// a pull or third-party copy; ParseDestination parses it.
bool IsRemoteLocation(absl::string_view text);

// Whether a transfer state is final (COMPLETED, FAILED, CANCELLED).
bool IsEndState(v1::TransferState state);

// A connection to one daemon's control socket. Thread-safe: calls may be
// made from several threads at once. Errors keep the daemon's message; a
// daemon that cannot be reached is absl::UnavailableError.
class Client {
 public:
  struct Options {
    // Connect fails if the daemon does not answer within this.
    absl::Duration timeout = absl::Seconds(5);
    // The bearer token of a daemon's TCP control address (its
    // control_token_file); not needed on the Unix socket.
    std::string token;
  };
  // `address` is "unix:/path/to/control.sock", or "HOST:PORT" for a daemon's
  // TCP control address (with `options.token`), or any gRPC target.
  static absl::StatusOr<std::unique_ptr<Client>> Connect(const std::string& address,
                                                         const Options& options);
  static absl::StatusOr<std::unique_ptr<Client>> Connect(const std::string& address,
                                                         absl::Duration timeout = absl::Seconds(5)) {
    return Connect(address, Options{.timeout = timeout, .token = ""});
  }
  ~Client();

  // Idempotent by `request_id` (empty: a fresh transfer every call). A
  // relative local source is taken from this process's working directory,
  // as the CLI takes it.
  absl::StatusOr<v1::TransferStatus> Submit(const v1::TransferSpec& spec,
                                            const std::string& request_id = "");
  absl::StatusOr<v1::TransferStatus> Get(const std::string& id);
  absl::StatusOr<std::vector<v1::TransferStatus>> List(bool all = false);
  absl::StatusOr<v1::TransferStatus> Cancel(const std::string& id);
  absl::StatusOr<v1::TransferStatus> Pause(const std::string& id);
  absl::StatusOr<v1::TransferStatus> Resume(const std::string& id);
  absl::StatusOr<v1::VerifyResponse> Verify(const std::string& id);
  absl::StatusOr<v1::PeersResponse> Peers(bool probe = true);
  // Sets an operator's rate cap on a peer site or a class (0 bits/s removes
  // it); applies to running transfers at their next chunk. Returns every cap
  // now in force.
  absl::StatusOr<std::vector<v1::RateLimit>> SetLimit(const v1::RateLimit& limit);
  absl::StatusOr<std::vector<v1::RateLimit>> GetLimits();

  // Streams progress to `on_update` (on the calling thread) until the
  // transfer ends; returns its final status.
  absl::StatusOr<v1::TransferStatus> Watch(
      const std::string& id, const std::function<void(const v1::TransferStatus&)>& on_update);
  // Waits until the transfer ends or `timeout` passes (DeadlineExceeded).
  absl::StatusOr<v1::TransferStatus> Wait(
      const std::string& id, absl::Duration timeout = absl::InfiniteDuration(),
      const std::function<void(const v1::TransferStatus&)>& on_progress = nullptr);

 private:
  struct Impl;
  explicit Client(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace longhaul

#endif  // LONGHAUL_CLIENT_INCLUDE_LONGHAUL_CLIENT_H_
