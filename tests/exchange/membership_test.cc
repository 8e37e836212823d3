// Groups, generations and admission (daemon/exchange/membership.h), driven
// directly: no links, no threads.

#include "daemon/exchange/membership.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace longhaul::exchange {
namespace {

using ::testing::HasSubstr;
using Msg = v1::ExchangePeerMessage;

Msg Of(Msg::Kind kind, const std::string& group) {
  Msg m;
  m.set_kind(kind);
  m.set_group(group);
  return m;
}

Msg Join(const std::vector<std::string>& members) {
  Msg m = Of(Msg::JOIN, "g");
  for (const auto& s : members) m.add_members(s);
  return m;
}

const std::vector<std::string> kABC = {"site-a", "site-b", "site-c"};

TEST(MembershipTest, JoinTakenOnlyWhenItNamesTheSenderAndThisSite) {
  Membership m("site-a");
  EXPECT_TRUE(m.Admits("site-b", Join({"site-a", "site-b"})));
  EXPECT_FALSE(m.Admits("site-b", Join({"site-b", "site-c"}))) << "does not name this site";
  EXPECT_FALSE(m.Admits("site-x", Join({"site-a", "site-b"}))) << "does not name its sender";
}

TEST(MembershipTest, BeforeAJoinAnythingIsKeptThenOnlyMembersAndJoiningSites) {
  Membership m("site-a");
  EXPECT_TRUE(m.Admits("site-x", Of(Msg::P2P, "g"))) << "kept for the Join to sort out";
  EXPECT_EQ(m.BeginJoin("g", {"site-a", "site-b"}), 1u);
  EXPECT_TRUE(m.Admits("site-b", Of(Msg::REDUCE_DATA, "g")));
  EXPECT_FALSE(m.Admits("site-x", Of(Msg::REDUCE_DATA, "g")));
  m.Form("g", {"site-a", "site-b"}, 3);
  EXPECT_TRUE(m.Admits("site-b", Of(Msg::DONE, "g")));
  EXPECT_FALSE(m.Admits("site-c", Of(Msg::DONE, "g")));
  // A re-join with site-c takes site-c's messages while it is under way.
  EXPECT_EQ(m.BeginJoin("g", kABC), 4u);
  EXPECT_TRUE(m.Admits("site-c", Of(Msg::REDUCE_DATA, "g")));
  m.EndJoin("g", kABC);
  EXPECT_FALSE(m.Admits("site-c", Of(Msg::REDUCE_DATA, "g")));
}

TEST(MembershipTest, APeerLostMovesEveryGroupHoldingItToTheNextGeneration) {
  Membership m("site-a");
  m.BeginJoin("g", kABC);
  m.Form("g", kABC, 1);
  m.BeginJoin("h", {"site-a", "site-b"});
  m.Form("h", {"site-a", "site-b"}, 5);
  m.Find("g")->finished.insert(7);

  m.PeerLost("site-c", "its link closed: reset");
  const Group& g = *m.Formed("g");
  EXPECT_EQ(g.generation, 2u);
  EXPECT_THAT(g.members, ::testing::ElementsAre("site-a", "site-b"));
  EXPECT_TRUE(g.finished.empty()) << "sequence numbers start over with the generation";
  EXPECT_EQ(m.Formed("h")->generation, 5u) << "site-c was not in h";

  LostPeer lost = m.LostResult("all-reduce #7 in group g", g, 1);
  EXPECT_EQ(lost.lost_peer, "site-c");
  EXPECT_EQ(lost.status.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(lost.status.message()),
              HasSubstr("peer site-c was lost (its link closed: reset); group g is now "
                        "generation 2 with [site-a, site-b]; retry"));
  EXPECT_EQ(m.LostMember("send", g, "site-c").lost_peer, "site-c");
  EXPECT_TRUE(m.LostMember("send", g, "site-x").status.ok()) << "never a member";

  v1::GroupView view = m.ViewOf(g);
  EXPECT_EQ(view.local_site(), "site-a");
  EXPECT_EQ(view.generation(), 2u);
  EXPECT_EQ(view.members_size(), 2);
}

TEST(MembershipTest, LeaveForgetsTheGroup) {
  Membership m("site-a");
  m.BeginJoin("g", {"site-a", "site-b"});
  m.Form("g", {"site-a", "site-b"}, 1);
  m.Leave("g");
  EXPECT_EQ(m.Find("g"), nullptr);
  EXPECT_EQ(m.BeginJoin("g", {"site-a", "site-b"}), 1u) << "a new group starts at generation 1";
}

}  // namespace
}  // namespace longhaul::exchange
