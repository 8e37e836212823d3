// The in-memory channel pair and transport keep the Channel and Transport
// contracts the tests built on them rely on.
#include "tests/test_tools/fake_channel.h"

#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "tests/test_tools/fake_transport.h"

namespace longhaul::transport::testing {
namespace {

absl::Status WriteString(Channel& channel, const std::string& s) {
  return channel.Write({absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(s.data()), s.size())});
}

absl::StatusOr<std::string> ReadString(Channel& channel, size_t n) {
  std::string out(n, '\0');
  absl::Status s =
      channel.ReadExactly(absl::MakeSpan(reinterpret_cast<uint8_t*>(out.data()), out.size()));
  if (!s.ok()) return s;
  return out;
}

TEST(FakeChannelTest, BytesArriveInOrderThenAHalfCloseEndsTheStream) {
  ChannelPair pair = MakeChannelPair("site-b", "site-a");
  EXPECT_EQ(pair.a->peer_site(), "site-b");
  EXPECT_EQ(pair.b->peer_site(), "site-a");
  ASSERT_TRUE(WriteString(*pair.a, "hello ").ok());
  ASSERT_TRUE(WriteString(*pair.a, "world").ok());
  pair.a->Close();
  EXPECT_EQ(*ReadString(*pair.b, 8), "hello wo");
  absl::StatusOr<std::string> short_read = ReadString(*pair.b, 4);
  EXPECT_TRUE(absl::IsUnavailable(short_read.status())) << short_read.status();
  EXPECT_NE(short_read.status().message().find("site-a"), std::string::npos);
  // The closed end still reads; its own writes are a bug of the test.
  ASSERT_TRUE(WriteString(*pair.b, "answer").ok());
  EXPECT_EQ(*ReadString(*pair.a, 6), "answer");
  EXPECT_EQ(WriteString(*pair.a, "late").code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(pair.a->bytes_written(), 11u);
  EXPECT_EQ(pair.b->bytes_read(), 8u);
  EXPECT_EQ(pair.b->read_sizes(), (std::vector<size_t>{8, 4}));
}

TEST(FakeChannelTest, ADestroyedEndIsAClosedConnection) {
  ChannelPair pair = MakeChannelPair("site-b", "site-a");
  ASSERT_TRUE(WriteString(*pair.b, "last").ok());
  pair.b.reset();
  EXPECT_EQ(*ReadString(*pair.a, 4), "last");
  EXPECT_TRUE(absl::IsUnavailable(ReadString(*pair.a, 1).status()));
  EXPECT_TRUE(absl::IsUnavailable(WriteString(*pair.a, "x")));
}

TEST(FakeChannelTest, AbortUnblocksReadsOnBothEnds) {
  ChannelPair pair = MakeChannelPair("site-b", "site-a");
  absl::Status a_read, b_read;
  std::thread reader_a([&] { a_read = ReadString(*pair.a, 1).status(); });
  std::thread reader_b([&] { b_read = ReadString(*pair.b, 1).status(); });
  ASSERT_TRUE(pair.a->WaitForBlockedRead(absl::Seconds(30)));
  ASSERT_TRUE(pair.b->WaitForBlockedRead(absl::Seconds(30)));
  pair.b->Abort();
  reader_a.join();
  reader_b.join();
  EXPECT_TRUE(absl::IsCancelled(b_read)) << b_read;  // the aborting end
  EXPECT_TRUE(absl::IsUnavailable(a_read)) << a_read;
  EXPECT_TRUE(absl::IsCancelled(WriteString(*pair.b, "x")));
  EXPECT_TRUE(absl::IsUnavailable(WriteString(*pair.a, "x")));
}

TEST(FakeChannelTest, ACutDeliversTheBytesBeforeItAndFailsBothEnds) {
  ChannelPair pair = MakeChannelPair("site-b", "site-a");
  pair.a->CutAfterWrittenBytes(6);
  ASSERT_TRUE(WriteString(*pair.a, "abcd").ok());
  absl::Status crossing = WriteString(*pair.a, "efgh");
  EXPECT_TRUE(absl::IsUnavailable(crossing)) << crossing;
  EXPECT_NE(crossing.message().find("was cut"), std::string::npos) << crossing;
  EXPECT_EQ(pair.a->bytes_written(), 6u);
  EXPECT_EQ(*ReadString(*pair.b, 6), "abcdef");
  EXPECT_TRUE(absl::IsUnavailable(ReadString(*pair.b, 1).status()));
  EXPECT_TRUE(absl::IsUnavailable(WriteString(*pair.b, "x")));
  EXPECT_TRUE(absl::IsUnavailable(ReadString(*pair.a, 1).status()));
}

TEST(FakeTransportTest, ADialReachesTheListenerOnAThreadOfItsOwn) {
  FakeTransport transport("site-a");
  // Written by the handler before it answers, so read once the answer is in.
  std::string seen_site, seen_bytes;
  ASSERT_TRUE(transport
                  .Listen("127.0.0.1:0",
                          [&](std::unique_ptr<Channel> channel) {
                            seen_site = channel->peer_site();
                            seen_bytes = ReadString(*channel, 2).value_or("");
                            (void)WriteString(*channel, "ok");
                          })
                  .ok());
  const std::string address = "127.0.0.1:" + std::to_string(transport.listen_port());
  auto channel = transport.Dial("site-b", address);
  ASSERT_TRUE(channel.ok()) << channel.status();
  EXPECT_EQ((*channel)->peer_site(), "site-b");
  EXPECT_EQ((*channel)->peer_address(), address);
  ASSERT_TRUE(WriteString(**channel, "hi").ok());
  EXPECT_EQ(*ReadString(**channel, 2), "ok");
  EXPECT_EQ(seen_site, "site-a");
  EXPECT_EQ(seen_bytes, "hi");

  EXPECT_TRUE(absl::IsUnavailable(transport.Dial("site-b", "127.0.0.1:1").status()));
  transport.RefuseDials(absl::PermissionDeniedError("wrong certificate"));
  EXPECT_EQ(transport.Dial("site-b", address).status().message(), "wrong certificate");
  transport.RefuseDials(absl::OkStatus());
  EXPECT_TRUE(transport.Dial("site-b", address).ok());
  EXPECT_EQ(transport.dials(), 4);
}

TEST(FakeTransportTest, ShutdownAbortsOpenChannelsAndWaitsForTheirHandlers) {
  FakeTransport transport("site-a");
  absl::Status handler_read;
  ASSERT_TRUE(transport
                  .Listen("127.0.0.1:7700",
                          [&](std::unique_ptr<Channel> channel) {
                            handler_read = ReadString(*channel, 1).status();
                          })
                  .ok());
  auto channel = transport.Dial("site-b", "127.0.0.1:7700");
  ASSERT_TRUE(channel.ok());
  transport.Shutdown();
  EXPECT_TRUE(absl::IsCancelled(handler_read)) << handler_read;
  EXPECT_TRUE(absl::IsCancelled(ReadString(**channel, 1).status()));
  EXPECT_FALSE(transport.Dial("site-b", "127.0.0.1:7700").ok());
}

}  // namespace
}  // namespace longhaul::transport::testing
