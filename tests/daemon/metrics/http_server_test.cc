#include "daemon/metrics/http_server.h"

#include <atomic>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "prometheus/counter.h"
#include "prometheus/gauge.h"
#include "prometheus/registry.h"

namespace longhaul::metrics {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = boost::beast::http;
using tcp = asio::ip::tcp;

struct Reply {
  int status = 0;
  std::string content_type;
  std::string body;
};

// A minimal HTTP/1.1 client over loopback.
class TestClient {
 public:
  explicit TestClient(uint16_t port) : socket_(io_) {
    socket_.connect(tcp::endpoint(asio::ip::make_address("127.0.0.1"), port));
  }

  Reply Send(http::verb verb, const std::string& target, bool keep_alive = false) {
    http::request<http::string_body> request(verb, target, 11);
    request.set(http::field::host, "127.0.0.1");
    request.keep_alive(keep_alive);
    http::write(socket_, request);
    http::response_parser<http::string_body> parser;
    if (verb == http::verb::head) parser.skip(true);
    http::read(socket_, buffer_, parser);
    auto response = parser.release();
    return {static_cast<int>(response.result_int()),
            std::string(response[http::field::content_type]), response.body()};
  }

 private:
  asio::io_context io_;
  tcp::socket socket_;
  beast::flat_buffer buffer_;
};

class MetricsServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    prometheus::BuildCounter()
        .Name("longhaul_bytes_sent_total")
        .Help("Bytes sent.")
        .Register(registry_)
        .Add({})
        .Increment(7);
    auto server = MetricsServer::Start("127.0.0.1:0", registry_, [this]() -> absl::Status {
      if (healthy_.load()) return absl::OkStatus();
      return absl::UnavailableError("journal is not writable");
    });
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    ASSERT_NE(server_->port(), 0);
  }

  prometheus::Registry registry_;
  std::atomic<bool> healthy_{true};
  std::unique_ptr<MetricsServer> server_;
};

TEST_F(MetricsServerTest, ServesMetricsAsPrometheusText) {
  Reply reply = TestClient(server_->port()).Send(http::verb::get, "/metrics");
  EXPECT_EQ(reply.status, 200);
  EXPECT_EQ(reply.content_type, "text/plain; version=0.0.4; charset=utf-8");
  EXPECT_EQ(reply.body,
            "# HELP longhaul_bytes_sent_total Bytes sent.\n"
            "# TYPE longhaul_bytes_sent_total counter\n"
            "longhaul_bytes_sent_total 7\n");
}

TEST_F(MetricsServerTest, EachScrapeSeesCurrentValues) {
  TestClient client(server_->port());
  EXPECT_NE(client.Send(http::verb::get, "/metrics", true).body.find("total 7\n"),
            std::string::npos);
  prometheus::BuildGauge()
      .Name("longhaul_queued_bytes")
      .Help("Queued.")
      .Register(registry_)
      .Add({})
      .Set(3);
  std::string second = client.Send(http::verb::get, "/metrics?x=1", true).body;  // same connection
  EXPECT_NE(second.find("longhaul_queued_bytes 3\n"), std::string::npos) << second;
}

TEST_F(MetricsServerTest, HealthzReflectsTheHealthCheck) {
  Reply ok = TestClient(server_->port()).Send(http::verb::get, "/healthz");
  EXPECT_EQ(ok.status, 200);
  EXPECT_EQ(ok.body, "ok\n");
  healthy_ = false;
  Reply bad = TestClient(server_->port()).Send(http::verb::get, "/healthz");
  EXPECT_EQ(bad.status, 503);
  EXPECT_EQ(bad.body, "journal is not writable\n");
}

TEST_F(MetricsServerTest, HeadAnswersWithoutBody) {
  Reply reply = TestClient(server_->port()).Send(http::verb::head, "/healthz");
  EXPECT_EQ(reply.status, 200);
  EXPECT_EQ(reply.body, "");
}

TEST_F(MetricsServerTest, UnknownPathIs404AndOtherMethodsAre405) {
  EXPECT_EQ(TestClient(server_->port()).Send(http::verb::get, "/secrets").status, 404);
  EXPECT_EQ(TestClient(server_->port()).Send(http::verb::post, "/metrics").status, 405);
}

TEST_F(MetricsServerTest, GarbageRequestClosesTheConnectionAndServerKeepsServing) {
  {
    asio::io_context io;
    tcp::socket s(io);
    s.connect(tcp::endpoint(asio::ip::make_address("127.0.0.1"), server_->port()));
    std::string junk(20000, 'A');  // longer than the header limit, no CRLF
    boost::system::error_code ec;
    asio::write(s, asio::buffer(junk), ec);
    char c;
    s.read_some(asio::buffer(&c, 1), ec);
    EXPECT_TRUE(ec) << "the server answered garbage instead of closing";
  }
  EXPECT_EQ(TestClient(server_->port()).Send(http::verb::get, "/healthz").status, 200);
}

TEST_F(MetricsServerTest, StopClosesTheListener) {
  const uint16_t port = server_->port();
  server_->Stop();
  server_->Stop();  // idempotent
  // The port is free again: binding it succeeds. (A connect() probe would
  // be flaky: an ephemeral source port can equal the freed port and the
  // socket then connects to itself.)
  asio::io_context io;
  tcp::acceptor probe(io);
  boost::system::error_code ec;
  // SO_REUSEADDR: connections the server accepted may linger; only another
  // listener on the port makes bind fail.
  probe.open(tcp::v4(), ec);
  probe.set_option(asio::socket_base::reuse_address(true), ec);
  probe.bind(tcp::endpoint(asio::ip::make_address("127.0.0.1"), port), ec);
  if (!ec) probe.listen(1, ec);
  EXPECT_FALSE(ec) << ec.message();
}

TEST(MetricsServerStartTest, PortInUseIsAnErrorNamingTheAddress) {
  prometheus::Registry registry;
  auto first = MetricsServer::Start("127.0.0.1:0", registry, nullptr);
  ASSERT_TRUE(first.ok());
  std::string address = "127.0.0.1:" + std::to_string((*first)->port());
  auto second = MetricsServer::Start(address, registry, nullptr);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(second.status().message().find(address), absl::string_view::npos);
}

// At the connection cap a scrape takes the place of the oldest connection
// that holds partial headers (not of one being answered); the timeout is
// far off, so only that makes room.
TEST(MetricsServerBoundsTest, PartialHeadersAtTheCapDoNotLockOutAScrape) {
  prometheus::Registry registry;
  MetricsServer::Options options;
  options.max_connections = 2;
  options.request_timeout = TimeDelta::Seconds(60);
  auto server = MetricsServer::Start("127.0.0.1:0", registry, nullptr, options);
  ASSERT_TRUE(server.ok()) << server.status();
  asio::io_context io;
  std::vector<tcp::socket> holders;
  for (int i = 0; i < 4; ++i) {
    holders.emplace_back(io);
    holders.back().connect(tcp::endpoint(asio::ip::make_address("127.0.0.1"), (*server)->port()));
    asio::write(holders.back(), asio::buffer(std::string("GET /metrics HTTP/1.1\r\nHost: x\r\n")));
  }
  EXPECT_EQ(TestClient((*server)->port()).Send(http::verb::get, "/healthz").status, 200);
  // The first holder was closed to make room.
  char c;
  boost::system::error_code ec;
  holders.front().read_some(asio::buffer(&c, 1), ec);
  EXPECT_EQ(ec, asio::error::eof);
}

TEST(MetricsServerStartTest, AddressWithoutPortIsInvalid) {
  prometheus::Registry registry;
  auto server = MetricsServer::Start("localhost", registry, nullptr);
  EXPECT_EQ(server.status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace longhaul::metrics
