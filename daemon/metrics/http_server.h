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
#include "daemon/metrics/registry.h"

namespace longhaul::metrics {

// Answers:
//   GET|HEAD /metrics  200, registry.Render() as text/plain; version=0.0.4
//   GET|HEAD /healthz  200 "ok" when `health` returns OK, else 503 and its message
//   other paths        404; other methods 405
// Requests are small and bounded (8 KiB of headers, 4 KiB of body); an idle
// or slow connection is closed after 10 s, and at most 64 connections are
// open at once, so a misbehaving scraper cannot pin the daemon's memory.
//
// Thread-safe. The registry and `health` must outlive the server; both are
// called on the server's thread.
class MetricsServer {
 public:
  using HealthCheck = std::function<absl::Status()>;

  // Listens on `address` ("host:port", "[v6]:port"; port 0 picks one) and
  // starts serving. Fails (Unavailable, naming the address) if it cannot bind.
  static absl::StatusOr<std::unique_ptr<MetricsServer>> Start(const std::string& address,
                                                               Registry& registry,
                                                               HealthCheck health);
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
