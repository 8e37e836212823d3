#include "daemon/metrics/http_server.h"

#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <list>
#include <optional>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/host_port.h"
#include "daemon/metrics/exposition.h"

namespace longhaul::metrics {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = boost::beast::http;
using tcp = asio::ip::tcp;

constexpr size_t kMaxHeaderBytes = 8 << 10;
constexpr size_t kMaxBodyBytes = 4 << 10;

using Request = http::request<http::string_body>;
using Response = http::response<http::string_body>;

struct Handler {
  const prometheus::Collectable& metrics;
  MetricsServer::HealthCheck health;

  Response Handle(const Request& request) const {
    Response response;
    response.version(request.version());
    response.set(http::field::server, "longhauld");
    std::string_view target(request.target().data(), request.target().size());
    target = target.substr(0, target.find('?'));
    const bool head = request.method() == http::verb::head;
    if (request.method() != http::verb::get && !head) {
      response.result(http::status::method_not_allowed);
      response.set(http::field::allow, "GET, HEAD");
      response.set(http::field::content_type, "text/plain; charset=utf-8");
      response.body() = "only GET and HEAD are served\n";
    } else if (target == "/metrics") {
      response.result(http::status::ok);
      response.set(http::field::content_type, kExpositionContentType);
      response.body() = RenderText(metrics);
    } else if (target == "/healthz") {
      absl::Status status = health ? health() : absl::OkStatus();
      response.result(status.ok() ? http::status::ok : http::status::service_unavailable);
      response.set(http::field::content_type, "text/plain; charset=utf-8");
      response.body() = status.ok() ? "ok\n" : absl::StrCat(status.message(), "\n");
    } else if (target == "/") {
      response.result(http::status::ok);
      response.set(http::field::content_type, "text/plain; charset=utf-8");
      response.body() = "longhauld: /metrics (Prometheus text), /healthz\n";
    } else {
      response.result(http::status::not_found);
      response.set(http::field::content_type, "text/plain; charset=utf-8");
      response.body() = "not found: try /metrics or /healthz\n";
    }
    response.prepare_payload();
    if (head) {
      // Keep Content-Length of the GET answer; send no body.
      const size_t length = response.body().size();
      response.body().clear();
      response.content_length(length);
    }
    return response;
  }
};

class Session;
// The open sessions, oldest first. Only the server's thread touches it.
using SessionList = std::list<Session*>;

// One HTTP/1.1 connection: read a request, answer, repeat while keep-alive.
// Lives on the server's thread; listed in `sessions` until it is closed.
class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket socket, const Handler& handler, SessionList& sessions,
          std::chrono::steady_clock::duration timeout)
      : stream_(std::move(socket)), handler_(handler), sessions_(sessions), timeout_(timeout) {
    listed_ = sessions_.insert(sessions_.end(), this);
  }
  ~Session() { Unlist(); }

  // True while it waits for (the rest of) a request.
  bool waiting() const { return waiting_; }

  // Closes it to make room for a new connection; its pending read ends.
  void Evict() {
    Unlist();
    Close();
  }

  void Read() {
    parser_.emplace();
    parser_->header_limit(kMaxHeaderBytes);
    parser_->body_limit(kMaxBodyBytes);
    waiting_ = true;
    stream_.expires_after(timeout_);
    http::async_read(
        stream_, buffer_, *parser_,
        [self = shared_from_this()](beast::error_code ec, size_t) { self->OnRead(ec); });
  }

 private:
  void OnRead(beast::error_code ec) {
    waiting_ = false;
    if (ec) {
      Close();  // closed by the client, timed out, or a request we will not parse
      return;
    }
    Request request = parser_->release();
    response_ = handler_.Handle(request);
    response_.keep_alive(request.keep_alive());
    stream_.expires_after(timeout_);
    http::async_write(stream_, response_,
                      [self = shared_from_this()](beast::error_code ec, size_t) {
                        if (ec || !self->response_.keep_alive()) {
                          self->Close();
                          return;
                        }
                        self->Read();
                      });
  }

  void Close() {
    Unlist();
    beast::error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ignored);
    stream_.socket().close(ignored);
  }

  void Unlist() {
    if (listed_ == sessions_.end()) return;
    sessions_.erase(listed_);
    listed_ = sessions_.end();
  }

  beast::tcp_stream stream_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  Response response_;
  const Handler& handler_;
  SessionList& sessions_;
  SessionList::iterator listed_;
  const std::chrono::steady_clock::duration timeout_;
  bool waiting_ = false;
};

}  // namespace

struct MetricsServer::Impl {
  Impl(const prometheus::Collectable& metrics, HealthCheck health, Options opts)
      : handler{metrics, std::move(health)},
        options(opts),
        timeout(std::chrono::nanoseconds(opts.request_timeout.ToNanoseconds())),
        acceptor(io),
        retry(io) {}

  void Accept() {
    acceptor.async_accept([this](beast::error_code ec, tcp::socket socket) {
      if (ec) {
        if (ec == asio::error::operation_aborted || !acceptor.is_open()) return;
        // Out of descriptors, say: try again shortly rather than spin.
        retry.expires_after(std::chrono::milliseconds(50));
        retry.async_wait([this](beast::error_code ec) {
          if (!ec) Accept();
        });
        return;
      }
      if (sessions.size() >= std::max<uint32_t>(options.max_connections, 1)) {
        auto oldest = std::find_if(sessions.begin(), sessions.end(),
                                   [](const Session* s) { return s->waiting(); });
        if (oldest != sessions.end()) (*oldest)->Evict();
      }
      if (sessions.size() >= std::max<uint32_t>(options.max_connections, 1)) {
        beast::error_code ignored;
        socket.close(ignored);  // every open connection is being answered
      } else {
        std::make_shared<Session>(std::move(socket), handler, sessions, timeout)->Read();
      }
      Accept();
    });
  }

  // Sessions still queued in `io` when it is destroyed refer to `handler`
  // and `sessions`: both are declared before it.
  Handler handler;
  const Options options;
  const std::chrono::steady_clock::duration timeout;
  SessionList sessions;
  asio::io_context io;
  tcp::acceptor acceptor;
  asio::steady_timer retry;
  uint16_t port = 0;
  std::thread thread;
  std::atomic<bool> stopped{false};
};

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(
    const std::string& address, const prometheus::Collectable& metrics, HealthCheck health,
    Options options) {
  absl::StatusOr<HostPort> host_port = ParseHostPort(address);
  if (!host_port.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("metrics ", host_port.status().message()));
  }
  auto impl = std::make_unique<Impl>(metrics, std::move(health), options);
  beast::error_code ec;
  tcp::resolver resolver(impl->io);
  auto endpoints = resolver.resolve(host_port->host, std::to_string(host_port->port),
                                    tcp::resolver::passive, ec);
  if (ec || endpoints.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics address ", address, ": ", ec ? ec.message() : "no address"));
  }
  tcp::endpoint endpoint = endpoints.begin()->endpoint();
  impl->acceptor.open(endpoint.protocol(), ec);
  if (!ec) impl->acceptor.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) impl->acceptor.bind(endpoint, ec);
  if (!ec) impl->acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    return absl::UnavailableError(
        absl::StrCat("cannot serve metrics on ", address, ": ", ec.message()));
  }
  impl->port = impl->acceptor.local_endpoint().port();
  impl->Accept();
  Impl* raw = impl.get();
  impl->thread = std::thread([raw] { raw->io.run(); });
  return std::unique_ptr<MetricsServer>(new MetricsServer(std::move(impl)));
}

MetricsServer::MetricsServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

MetricsServer::~MetricsServer() { Stop(); }

void MetricsServer::Stop() {
  if (impl_->stopped.exchange(true)) return;
  impl_->io.stop();
  if (impl_->thread.joinable()) impl_->thread.join();
  // The io thread is gone: nothing else touches the acceptor now. Open
  // connections close when `io` is destroyed with their pending handlers.
  beast::error_code ignored;
  // shutdown(2) takes the socket out of LISTEN at once, whatever asio's
  // reactor still holds for it.
  if (impl_->acceptor.is_open()) ::shutdown(impl_->acceptor.native_handle(), SHUT_RDWR);
  impl_->acceptor.close(ignored);
}

uint16_t MetricsServer::port() const { return impl_->port; }

}  // namespace longhaul::metrics
