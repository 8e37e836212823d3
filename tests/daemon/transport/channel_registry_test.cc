#include "daemon/transport/channel_registry.h"

#include <atomic>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"

namespace longhaul::transport {
namespace {

// Counts aborts; every other call fails.
class FakeChannel final : public Channel {
 public:
  absl::Status Write(absl::Span<const absl::Span<const uint8_t>>) override {
    return absl::UnimplementedError("fake");
  }
  absl::Status ReadExactly(absl::Span<uint8_t>) override {
    return absl::UnimplementedError("fake");
  }
  const std::string& peer_site() const override { return site_; }
  const std::string& peer_address() const override { return site_; }
  LinkStats Stats() const override { return {}; }
  void Abort() override {
    ++aborts_;
    if (!aborted_.HasBeenNotified()) aborted_.Notify();
  }

  int aborts() const { return aborts_; }
  void WaitForAbort() { aborted_.WaitForNotification(); }

 private:
  const std::string site_ = "site-b";
  std::atomic<int> aborts_{0};
  absl::Notification aborted_;
};

TEST(ChannelRegistryTest, AbortAllReachesOnlyTheChannelsStillRegistered) {
  ChannelRegistry registry;
  FakeChannel kept, gone;
  ChannelRegistry::Registration keep = registry.Add(kept);
  {
    ChannelRegistry::Registration drop = registry.Add(gone);
    ASSERT_TRUE(drop);
  }
  registry.AbortAll();
  EXPECT_EQ(kept.aborts(), 1);
  EXPECT_EQ(gone.aborts(), 0);
  EXPECT_FALSE(registry.empty());
  keep.Reset();
  EXPECT_TRUE(registry.empty());
}

TEST(ChannelRegistryTest, AbortAllLeavesLaterChannelsAlone) {
  ChannelRegistry registry;
  registry.AbortAll();
  FakeChannel later;
  ChannelRegistry::Registration registration = registry.Add(later);
  EXPECT_TRUE(registration);
  EXPECT_EQ(later.aborts(), 0);
}

TEST(ChannelRegistryTest, AMovedRegistrationRemovesOnce) {
  ChannelRegistry registry;
  FakeChannel a, b;
  ChannelRegistry::Registration first = registry.Add(a);
  ChannelRegistry::Registration moved = std::move(first);
  EXPECT_FALSE(first);  // NOLINT(bugprone-use-after-move): the contract is that it is empty
  ASSERT_TRUE(moved);
  moved = registry.Add(b);  // removes `a`
  int visited = 0;
  registry.ForEach([&](Channel& channel) {
    EXPECT_EQ(&channel, &b);
    ++visited;
  });
  EXPECT_EQ(visited, 1);
  moved.Reset();
  moved.Reset();
  EXPECT_TRUE(registry.empty());
}

TEST(ChannelRegistryTest, CloseAbortsAndRefusesLaterChannels) {
  ChannelRegistry registry;
  FakeChannel open, late;
  ChannelRegistry::Registration registration = registry.Add(open);
  registry.Close();
  EXPECT_EQ(open.aborts(), 1);
  ChannelRegistry::Registration refused = registry.Add(late);
  EXPECT_FALSE(refused);
  EXPECT_EQ(late.aborts(), 0);
  registration.Reset();
  EXPECT_TRUE(registry.empty());
}

TEST(ChannelRegistryTest, WaitUntilEmptyReturnsWhenTheUsersLetGo) {
  ChannelRegistry registry;
  std::vector<FakeChannel> channels(3);
  std::vector<ChannelRegistry::Registration> registrations;
  for (FakeChannel& channel : channels) registrations.push_back(registry.Add(channel));
  std::vector<std::thread> users;
  for (size_t i = 0; i < channels.size(); ++i) {
    // Each user lets go of its channel only once it is aborted.
    users.emplace_back([&channels, i, registration = std::move(registrations[i])]() mutable {
      channels[i].WaitForAbort();
      registration.Reset();
    });
  }
  registry.AbortAll();
  registry.WaitUntilEmpty();
  EXPECT_TRUE(registry.empty());
  for (std::thread& user : users) user.join();
  for (const FakeChannel& channel : channels) EXPECT_EQ(channel.aborts(), 1);
}

}  // namespace
}  // namespace longhaul::transport
