// The HTTP face of longhauld's metrics: GET /metrics (Prometheus text) and
// GET /healthz, served with Boost.Beast on one thread of its own.
#ifndef LONGHAUL_DAEMON_METRICS_HTTP_SERVER_H_
#define LONGHAUL_DAEMON_METRICS_HTTP_SERVER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/units.h"
#include "prometheus/collectable.h"

namespace longhaul::metrics {

// The bounds of a MetricsServer (the daemon's metrics section).
struct MetricsServerOptions {
  uint32_t max_connections = 16;  // at least 1
  TimeDelta request_timeout = TimeDelta::Seconds(10);
};

// Answers:
//   GET|HEAD /metrics  200, RenderText(metrics) as text/plain; version=0.0.4
//   GET|HEAD /healthz  200 "ok" when `health` returns OK, else 503 and its message
//   other paths        404; other methods 405
// Requests are small and bounded (8 KiB of headers, 4 KiB of body). A
// connection must send each request's headers within
// Options::request_timeout and is closed after that long idle; at most
// Options::max_connections are open at once. At the cap, a new connection
// takes the place of the oldest one that is waiting for a request (partial
// headers or keep-alive idle), so connections that hold partial headers
// cannot lock a scraper out; a connection whose answer is being written is
// never dropped for another.
//
// Thread-safe. `metrics` and `health` must outlive the server; both are
// called on the server's thread, one request at a time.
class MetricsServer {
 public:
  using HealthCheck = std::function<absl::Status()>;

  using Options = MetricsServerOptions;

  // Listens on `address` ("host:port", "[v6]:port"; port 0 picks one) and
  // starts serving. Fails (Unavailable, naming the address) if it cannot bind.
  static absl::StatusOr<std::unique_ptr<MetricsServer>> Start(
      const std::string& address, const prometheus::Collectable& metrics, HealthCheck health,
      Options options = {});
  ~MetricsServer();

  // Stops accepting, closes open connections and joins the thread. Idempotent.
  void Stop();
  // The bound port.
  uint16_t port() const;

 private:
  struct Impl;
  explicit MetricsServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace longhaul::metrics

#endif  // LONGHAUL_DAEMON_METRICS_HTTP_SERVER_H_
