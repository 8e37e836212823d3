#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "absl/strings/str_split.h"
#include "client/cli/output.h"

namespace longhaul::cli {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

v1::TransferStatus Running() {
  v1::TransferStatus s;
  s.set_id("t-0123456789abcdef");
  s.set_state(v1::RUNNING);
  s.set_bytes_total(40ull << 30);
  s.set_bytes_done(13ull << 30);
  s.set_rate_bytes_per_sec(1.2e9);
  s.set_active_streams(16);
  s.set_seconds(12);
  return s;
}

TEST(ProgressBarTest, FitsEveryWidthFromTwentyColumns) {
  v1::TransferStatus s = Running();
  v1::TransferStatus retrying = Running();
  retrying.set_error(std::string(300, 'e'));
  for (int width = 20; width <= 240; ++width) {
    for (const v1::TransferStatus* status : {&s, &retrying}) {
      const std::string bar = ProgressBar(*status, width);
      EXPECT_LT(bar.size(), static_cast<size_t>(width)) << width << ": " << bar;
      EXPECT_EQ(bar.find('\n'), std::string::npos);
      EXPECT_EQ(bar.front(), '[');
    }
  }
}

TEST(ProgressBarTest, WideTerminalShowsEveryField) {
  const std::string bar = ProgressBar(Running(), 200);
  EXPECT_THAT(bar, HasSubstr("32.5%"));
  EXPECT_THAT(bar, HasSubstr("9600 Mbit/s"));
  EXPECT_THAT(bar, HasSubstr("13.0 GiB / 40.0 GiB"));
  EXPECT_THAT(bar, HasSubstr("ETA "));
  EXPECT_THAT(bar, HasSubstr("16 streams"));
}

TEST(ProgressBarTest, CutErrorNamesWhereTheWholeTextIs) {
  v1::TransferStatus s = Running();
  s.set_error("peer site-b: connection reset by peer while sending chunk 4711 of shard_00017.bin");
  const std::string bar = ProgressBar(s, 100);
  EXPECT_THAT(bar, HasSubstr("retrying: peer site-b"));
  EXPECT_THAT(bar, HasSubstr("... (longhaul status t-0123456789abcdef)"));
  EXPECT_LT(bar.size(), 100u);
  // Wide enough, the whole error shows.
  EXPECT_THAT(ProgressBar(s, 240), HasSubstr("shard_00017.bin (longhaul status"));
}

TEST(RateTest, FailedTransferThatMovedNothingShowsNoRate) {
  v1::TransferStatus s = Running();
  s.set_state(v1::FAILED);
  s.set_bytes_done(0);
  s.set_rate_bytes_per_sec(1.16e9);  // a stale sample
  s.set_error("no space left on device");
  EXPECT_EQ(RateText(s), "");
  EXPECT_THAT(ProgressLine(s), Not(HasSubstr("Mbit/s")));
  EXPECT_THAT(ProgressBar(s, 120), Not(HasSubstr("Mbit/s")));
  EXPECT_THAT(TransferJson(s).str(), HasSubstr("\"goodput_mbit\": 0.000"));
}

TEST(RateTest, PausedTransferShowsNoRate) {
  v1::TransferStatus s = Running();
  s.set_state(v1::PAUSED);
  EXPECT_EQ(RateText(s), "");
  EXPECT_THAT(ProgressLine(s), Not(HasSubstr("Mbit/s")));
  EXPECT_THAT(ProgressBar(s, 120), Not(HasSubstr("ETA")));
}

TEST(RateTest, EndedTransferShowsItsAverage) {
  v1::TransferStatus s = Running();
  s.set_state(v1::FAILED);
  s.set_bytes_done(1'500'000'000);
  s.set_seconds(10);
  EXPECT_EQ(RateText(s), "avg 1200 Mbit/s");
}

TEST(StatusTextTest, NamesSourceDestinationAndLastError) {
  v1::TransferStatus s = Running();
  s.mutable_spec()->add_sources("/data/ckpt/step-100");
  s.mutable_spec()->set_dest_site("site-b");
  s.mutable_spec()->set_dest_export("ckpt");
  s.mutable_spec()->set_dest_path("step-100");
  s.set_error("peer site-b unreachable");
  const std::string text = StatusText(s);
  EXPECT_THAT(text, HasSubstr("source:      /data/ckpt/step-100"));
  EXPECT_THAT(text, HasSubstr("destination: site-b:/ckpt/step-100"));
  EXPECT_THAT(text, HasSubstr("last error:  peer site-b unreachable"));
}

TEST(FoldTest, BreaksLongLinesAfterSeparators) {
  const std::string summary =
      "t-0123456789abcdef completed: 3.0 MiB in 1 files, 0.12 s, 213 Mbit/s, resent 0 B\n  skipped "
      "x: y";
  for (int width : {40, 80}) {
    const std::string folded = Fold(summary, width);
    for (absl::string_view line : absl::StrSplit(folded, '\n')) {
      EXPECT_LT(line.size(), static_cast<size_t>(width)) << line;
    }
  }
  EXPECT_EQ(Fold(summary, 40),
            "t-0123456789abcdef completed: 3.0 MiB\n    in 1 files, 0.12 s, 213 Mbit/s,\n    "
            "resent 0 B\n  skipped x: y");
  const std::string path(100, 'p');
  for (absl::string_view line : absl::StrSplit(Fold(path, 40), '\n')) EXPECT_LT(line.size(), 40u);
  EXPECT_EQ(Fold(summary, 200), summary);
}

}  // namespace
}  // namespace longhaul::cli
