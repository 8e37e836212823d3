// TransferSender's pacing of a transfer's streams.

#include "daemon/peer/sender.h"

#include <gtest/gtest.h>

namespace longhaul::peer {
namespace {

// Whatever the number of streams, together they pace just below the
// configured link, so they cannot keep its bottleneck queue full.
TEST(TransferSenderTest, StreamsTogetherPaceJustBelowTheConfiguredLink) {
  const Bandwidth link = Bandwidth::GbitsPerSecond(1);
  for (uint32_t streams : {1u, 2u, 8u, 32u}) {
    const Bandwidth each = TransferSender::StreamPacingLimit(link, streams);
    const int64_t together = each.ToBitsPerSecond() * streams;
    EXPECT_LT(together, link.ToBitsPerSecond()) << streams << " streams";
    EXPECT_GE(together, link.ToBitsPerSecond() * 9 / 10) << streams << " streams";
  }
  EXPECT_EQ(TransferSender::StreamPacingLimit(link, 0), TransferSender::StreamPacingLimit(link, 1));
}

}  // namespace
}  // namespace longhaul::peer
