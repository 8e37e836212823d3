#include "common/checkpoints.h"

#include <algorithm>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace longhaul {
namespace {

TEST(NaturalOrderTest, DigitRunsCompareAsNumbers) {
  std::vector<std::string> names = {"step-100", "step-9", "step-10", "step-1000", "step-99"};
  std::sort(names.begin(), names.end(), [](const std::string& a, const std::string& b) {
    return NaturalLess(a, b);
  });
  EXPECT_EQ(names, (std::vector<std::string>{"step-9", "step-10", "step-99", "step-100", "step-1000"}));
}

TEST(NaturalOrderTest, TimestampsAndPlainTextKeepTheirOrder) {
  EXPECT_TRUE(NaturalLess("2026-11-30T09", "2026-11-30T10"));
  EXPECT_TRUE(NaturalLess("alpha", "beta"));
  EXPECT_TRUE(NaturalLess("ckpt", "ckpt-1"));
  EXPECT_FALSE(NaturalLess("ckpt-1", "ckpt"));
}

TEST(NaturalOrderTest, IsAStrictOrderWithLeadingZeros) {
  EXPECT_TRUE(NaturalLess("step-01", "step-1"));
  EXPECT_FALSE(NaturalLess("step-1", "step-01"));
  EXPECT_FALSE(NaturalLess("step-1", "step-1"));
  EXPECT_TRUE(NaturalLess("step-007", "step-8"));
  EXPECT_TRUE(NaturalLess("a00", "a0"));
  EXPECT_FALSE(NaturalLess("a0", "a00"));
}

TEST(CheckpointMarkerTest, AcceptsRelativeFilePaths) {
  EXPECT_TRUE(ValidateCheckpointMarker("").ok());
  EXPECT_TRUE(ValidateCheckpointMarker("model.index.json").ok());
  EXPECT_TRUE(ValidateCheckpointMarker(".metadata").ok());
  EXPECT_TRUE(ValidateCheckpointMarker("meta/COMPLETE").ok());
}

TEST(CheckpointMarkerTest, RefusesPathsThatLeaveTheCheckpoint) {
  for (const char* bad : {"/etc/passwd", "../x", "a/../../x", "./x", "dir/", "a//b"}) {
    absl::Status s = ValidateCheckpointMarker(bad);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(s.message().find("must be a file path inside the checkpoint"), absl::string_view::npos);
  }
  EXPECT_FALSE(ValidateCheckpointMarker(std::string_view("a\0b", 3)).ok());
}

TEST(CommitMarkerTest, TheDefaultsMatchTheUsualCheckpointFormats) {
  const std::vector<std::string> defaults(kDefaultCommitMarkers.begin(),
                                          kDefaultCommitMarkers.end());
  for (const char* marker : {".metadata", "model.safetensors.index.json", "COMPLETE",
                             "sub/pytorch_model.bin.index.json"}) {
    EXPECT_TRUE(IsCommitMarker(defaults, marker)) << marker;
  }
  for (const char* other :
       {"__0_0.distcp", "metadata", "index.json.tmp", "COMPLETE/x", "model.pt"}) {
    EXPECT_FALSE(IsCommitMarker(defaults, other)) << other;
  }
}

TEST(CommitMarkerTest, AGlobWithASlashMatchesTheWholePathOnly) {
  EXPECT_TRUE(IsCommitMarker({"meta/*.done"}, "meta/run.done"));
  EXPECT_FALSE(IsCommitMarker({"meta/*.done"}, "meta/deeper/run.done"));
  EXPECT_FALSE(IsCommitMarker({"meta/*.done"}, "run.done"));
  EXPECT_FALSE(IsCommitMarker({}, ".metadata"));
}

TEST(CommitMarkerTest, GlobMatchingOnlyMatchesThatPathAlone) {
  for (const char* path : {".metadata", "step[1]*.json", "a?b\\c", "meta/DONE"}) {
    const std::string glob = GlobMatchingOnly(path);
    EXPECT_TRUE(IsCommitMarker({glob}, path)) << glob;
  }
  EXPECT_FALSE(IsCommitMarker({GlobMatchingOnly("step[1]*.json")}, "step1x.json"));
  EXPECT_FALSE(IsCommitMarker({GlobMatchingOnly("a?b")}, "axb"));
}

}  // namespace
}  // namespace longhaul
