// The exchange client (client/exchange.cc) against a fake daemon in this
// process: an Exchange service on a temporary Unix socket, with the daemon's
// segment registry, that records what each AllReduce call finds in the
// client's segment and answers as the test says. Shown: the client streams
// an all-reduce's buffer only to a daemon that advertised it at Join, and
// copies it whole before the call to one that did not; either way a failed
// call leaves the caller's buffer holding its input.

#include <grpcpp/grpcpp.h>
#include <stdlib.h>

#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "client/exchange_testing.h"
#include "daemon/exchange/exchange_service.h"
#include "gtest/gtest.h"
#include "longhaul/exchange.h"
#include "longhaul/shm_progress.h"
#include "longhaul/v1/exchange.grpc.pb.h"
#include "tests/test_tools/eventually.h"

namespace longhaul::exchange {
namespace {

using ::longhaul::testing::Eventually;

// What the fake daemon found in one AllReduce call.
struct Seen {
  bool streamed = false;
  uint64_t offset = 0;
  std::vector<uint8_t> at_arrival;  // the buffer when the call arrived
  std::vector<uint8_t> filled;      // once the client had published all of it
};

class FakeDaemon final : public v1::Exchange::Service {
 public:
  FakeDaemon(const std::string& dir, bool streamed_all_reduce)
      : streamed_all_reduce_(streamed_all_reduce) {
    auto registry = SegmentRegistry::Start({dir + "/control.sock.shm", 0600});
    EXPECT_TRUE(registry.ok()) << registry.status();
    if (registry.ok()) registry_ = *std::move(registry);
  }

  // Answers the next calls with the loss of site-b, after scribbling over
  // the buffer as a failed call may.
  void FailWithLostPeer(bool fail) {
    absl::MutexLock lock(&mu_);
    fail_ = fail;
  }
  std::vector<Seen> seen() {
    absl::MutexLock lock(&mu_);
    return seen_;
  }

  grpc::Status Join(grpc::ServerContext*, const v1::JoinRequest* request,
                    v1::JoinResponse* response) override {
    v1::GroupView* view = response->mutable_view();
    view->set_group(request->group());
    view->set_generation(1);
    for (const auto& s : request->sites()) view->add_members(s);
    view->set_local_site("site-a");
    response->set_streamed_buffers(true);
    response->set_streamed_all_reduce(streamed_all_reduce_);
    response->set_segment_socket(registry_->path());
    return grpc::Status::OK;
  }

  grpc::Status AllReduce(grpc::ServerContext*, const v1::AllReduceRequest* request,
                         v1::OpResponse* response) override {
    auto shm = ShmMapping::Open(registry_.get(), request->buffer(), uint64_t{1} << 30,
                                /*writable=*/true);
    if (!shm.ok()) {
      ADD_FAILURE() << shm.status();
      response->mutable_error()->set_code(static_cast<int>(shm.status().code()));
      return grpc::Status::OK;
    }
    const absl::Span<uint8_t> buffer = shm->bytes();
    Seen seen;
    seen.streamed = request->streamed();
    seen.offset = request->buffer().offset();
    seen.at_arrival.assign(buffer.begin(), buffer.end());
    if (request->streamed()) {
      EXPECT_NE(shm->progress_word(), nullptr);
      const shm::ProgressWord word(shm->progress_word());
      EXPECT_TRUE(Eventually([&] { return word.Ready() == buffer.size(); }));
    }
    seen.filled.assign(buffer.begin(), buffer.end());
    // The "result": every byte complemented.
    for (uint8_t& x : buffer) x = ~x;
    absl::MutexLock lock(&mu_);
    seen_.push_back(std::move(seen));
    if (fail_) {
      v1::ExchangeError* e = response->mutable_error();
      e->set_code(static_cast<int>(absl::StatusCode::kUnavailable));
      e->set_message("all-reduce #0 in group g: lost site-b");
      e->set_lost_peer("site-b");
      e->set_retryable(true);
    }
    return grpc::Status::OK;
  }

 private:
  const bool streamed_all_reduce_;
  std::unique_ptr<SegmentRegistry> registry_;
  absl::Mutex mu_;
  bool fail_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<Seen> seen_ ABSL_GUARDED_BY(mu_);
};

// The fake daemon, advertising a streamed all-reduce (the parameter) or
// not, and a group joined through it.
class ExchangeClientTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/longhaul-exchange-client-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    daemon_ = std::make_unique<FakeDaemon>(dir_, GetParam());
    grpc::ServerBuilder builder;
    builder.AddListeningPort("unix:" + dir_ + "/control.sock", grpc::InsecureServerCredentials());
    builder.RegisterService(daemon_.get());
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    auto group = ExchangeGroup::Join("unix:" + dir_ + "/control.sock", "g", {"site-a", "site-b"},
                                     absl::Seconds(10));
    ASSERT_TRUE(group.ok()) << group.status();
    group_ = *std::move(group);
  }
  void TearDown() override {
    client_internal::SetPiecePublishedForTesting(nullptr);
    group_.reset();
    if (server_) server_->Shutdown();
    server_.reset();
    daemon_.reset();
    std::filesystem::remove_all(dir_);
  }

  static std::vector<uint8_t> Input(size_t bytes) {
    std::vector<uint8_t> v(bytes);
    for (size_t i = 0; i < bytes; ++i) v[i] = static_cast<uint8_t>(i * 13 + (i >> 12));
    return v;
  }
  static std::vector<uint8_t> Complement(std::vector<uint8_t> v) {
    for (uint8_t& x : v) x = ~x;
    return v;
  }

  std::string dir_;
  std::unique_ptr<FakeDaemon> daemon_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<ExchangeGroup> group_;
};

// A daemon that advertised the streamed all-reduce gets a streamed request
// and the buffer piece by piece; one that did not (an older daemon, which
// would read the buffer at once) gets the whole buffer before the call.
TEST_P(ExchangeClientTest, StreamsTheAllReduceOnlyToADaemonThatAdvertisedIt) {
  const bool streaming = GetParam();
  const std::vector<uint8_t> input = Input((5 << 20) + 8);  // six pieces
  std::vector<uint8_t> data = input;
  int pieces = 0;
  client_internal::SetPiecePublishedForTesting([&](size_t, size_t) { ++pieces; });
  absl::Status s = group_->AllReduceSync(data.data(), data.size() / 4, DType::kFloat32);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_TRUE(data == Complement(input)) << "the result was not copied out";
  const std::vector<Seen> seen = daemon_->seen();
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0].streamed, streaming);
  EXPECT_GE(seen[0].offset, shm::kDataOffset);
  EXPECT_TRUE(seen[0].filled == input);
  EXPECT_EQ(pieces, streaming ? 6 : 0);
  if (!streaming) {
    EXPECT_TRUE(seen[0].at_arrival == input) << "the call came before the copy";
  }
}

// Whatever the daemon left in the segment, a failed all-reduce leaves the
// caller's buffer holding its input, and the retry of a peer-lost one with
// that buffer as it is gets the result.
TEST_P(ExchangeClientTest, AFailedAllReduceLeavesTheBufferHoldingItsInput) {
  const std::vector<uint8_t> input = Input(3 << 20);
  std::vector<uint8_t> data = input;
  daemon_->FailWithLostPeer(true);
  absl::Status s = group_->AllReduceSync(data.data(), data.size() / 4, DType::kFloat32);
  ASSERT_TRUE(longhaul::IsPeerLost(s)) << s;
  EXPECT_EQ(longhaul::LostPeer(s), "site-b");
  EXPECT_TRUE(data == input) << "a failed all-reduce changed the caller's buffer";
  daemon_->FailWithLostPeer(false);
  s = group_->AllReduceSync(data.data(), data.size() / 4, DType::kFloat32);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_TRUE(data == Complement(input));
  const std::vector<Seen> seen = daemon_->seen();
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_TRUE(seen[1].filled == input) << "the retry did not send the input";
}

INSTANTIATE_TEST_SUITE_P(DaemonStreams, ExchangeClientTest, ::testing::Bool());

}  // namespace
}  // namespace longhaul::exchange
