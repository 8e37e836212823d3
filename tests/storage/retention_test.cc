#include "storage/retention.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "storage/file_system.h"
#include "storage/trash.h"
#include "tests/storage/test_util.h"

namespace longhaul::storage {
namespace {

using testing::Exists;
using testing::MakeDirs;
using testing::TempDir;
using testing::WriteFile;

class RetentionTest : public ::testing::Test {
 protected:
  // A checkpoint directory run1/NAME, complete (with its marker) or not.
  void Checkpoint(const std::string& name, bool complete) {
    MakeDirs(dir_.Sub("run1/" + name + "/shards"));
    WriteFile(dir_.Sub("run1/" + name + "/shards/0.pt"), "weights of " + name);
    if (complete) WriteFile(dir_.Sub("run1/" + name + "/model.index.json"), "{}");
  }
  // Keeps `keep`, tells checkpoints by `marker` or else `globs`, and may
  // prune every name the tests use, as if this site had published them all.
  static RetentionPolicy Policy(uint32_t keep, std::string marker,
                                std::vector<std::string> globs = {}) {
    RetentionPolicy policy;
    policy.keep = keep;
    policy.complete_marker = std::move(marker);
    policy.marker_globs = std::move(globs);
    policy.owned = {"step-0", "step-1",  "step-2",   "step-3",
                    "step-9", "step-10", "step-100", "step-1000"};
    return policy;
  }
  TempDir dir_;
};

TEST_F(RetentionTest, KeepsTheNewestInNaturalOrder) {
  for (const char* n : {"step-9", "step-10", "step-100", "step-1000"}) Checkpoint(n, true);
  auto removed =
      PruneCheckpoints(PosixFileSystem(), dir_.path(), "run1", Policy(2, "model.index.json"));
  ASSERT_TRUE(removed.ok()) << removed.status();
  EXPECT_EQ(*removed, (std::vector<std::string>{"step-9", "step-10"}));
  EXPECT_FALSE(Exists(dir_.Sub("run1/step-9")));
  EXPECT_FALSE(Exists(dir_.Sub("run1/step-10")));
  EXPECT_TRUE(Exists(dir_.Sub("run1/step-100/shards/0.pt")));
  EXPECT_TRUE(Exists(dir_.Sub("run1/step-1000/model.index.json")));
  // The trash is emptied.
  auto again =
      PruneCheckpoints(PosixFileSystem(), dir_.path(), "run1", Policy(2, "model.index.json"));
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(again->empty());
}

TEST_F(RetentionTest, IncompleteDirectoriesAreNeitherCountedNorRemoved) {
  Checkpoint("step-1", true);
  Checkpoint("step-2", false);  // still being written by someone
  Checkpoint("step-3", true);
  auto removed =
      PruneCheckpoints(PosixFileSystem(), dir_.path(), "run1", Policy(1, "model.index.json"));
  ASSERT_TRUE(removed.ok()) << removed.status();
  EXPECT_EQ(*removed, std::vector<std::string>{"step-1"});
  EXPECT_TRUE(Exists(dir_.Sub("run1/step-2/shards/0.pt")));
  EXPECT_TRUE(Exists(dir_.Sub("run1/step-3")));
}

TEST_F(RetentionTest, FilesSymlinksAndDotDirectoriesAreLeftAlone) {
  Checkpoint("step-1", true);
  Checkpoint("step-2", true);
  WriteFile(dir_.Sub("run1/README"), "notes");
  MakeDirs(dir_.Sub("run1/.hidden"));
  MakeDirs(dir_.Sub("elsewhere"));
  ASSERT_EQ(symlink(dir_.Sub("elsewhere").c_str(), dir_.Sub("run1/step-0").c_str()), 0);
  auto removed =
      PruneCheckpoints(PosixFileSystem(), dir_.path(), "run1", Policy(1, "", {"*.index.json"}));
  ASSERT_TRUE(removed.ok()) << removed.status();
  EXPECT_EQ(*removed, std::vector<std::string>{"step-1"});
  EXPECT_TRUE(Exists(dir_.Sub("run1/README")));
  EXPECT_TRUE(Exists(dir_.Sub("run1/.hidden")));
  EXPECT_TRUE(Exists(dir_.Sub("run1/step-0")));
  EXPECT_TRUE(Exists(dir_.Sub("elsewhere")));
}

TEST_F(RetentionTest, KeepZeroKeepsEverything) {
  Checkpoint("step-1", true);
  auto removed = PruneCheckpoints(PosixFileSystem(), dir_.path(), "run1", Policy(0, ""));
  ASSERT_TRUE(removed.ok());
  EXPECT_TRUE(removed->empty());
  EXPECT_TRUE(Exists(dir_.Sub("run1/step-1")));
}

TEST_F(RetentionTest, RefusesASymlinkedParentAndAnEscapingMarker) {
  Checkpoint("step-1", true);
  MakeDirs(dir_.Sub("real"));
  ASSERT_EQ(symlink(dir_.Sub("real").c_str(), dir_.Sub("link").c_str()), 0);
  EXPECT_FALSE(
      PruneCheckpoints(PosixFileSystem(), dir_.path(), "link", Policy(1, "", {"*.index.json"}))
          .ok());
  auto bad = PruneCheckpoints(PosixFileSystem(), dir_.path(), "run1", Policy(1, "../x"));
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(RetentionTest, CountsOnlyCheckpointsThatHoldACommitMarker) {
  Checkpoint("step-1", true);
  Checkpoint("step-2", true);
  Checkpoint("step-3", false);  // being written: no marker yet
  auto removed = PruneCheckpoints(PosixFileSystem(), dir_.path(), "run1",
                                  Policy(1, "", {".metadata", "*.index.json"}));
  ASSERT_TRUE(removed.ok()) << removed.status();
  // The newest complete checkpoint stays; the partial one is neither counted
  // nor removed.
  EXPECT_EQ(*removed, std::vector<std::string>{"step-1"});
  EXPECT_TRUE(Exists(dir_.Sub("run1/step-2/model.index.json")));
  EXPECT_TRUE(Exists(dir_.Sub("run1/step-3/shards/0.pt")));
}

TEST_F(RetentionTest, RefusesWithoutAnyWayToTellACompleteCheckpoint) {
  Checkpoint("step-1", true);
  Checkpoint("step-2", true);
  auto removed = PruneCheckpoints(PosixFileSystem(), dir_.path(), "run1", Policy(1, ""));
  EXPECT_EQ(removed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Exists(dir_.Sub("run1/step-1")));
}

TEST_F(RetentionTest, OnlyWhatTheSourcePublishedIsCountedOrRemoved) {
  // This site published step-1 and step-2; another site published step-0
  // and step-9, and an operator copied in step-5.
  for (const char* n : {"step-0", "step-1", "step-2", "step-5", "step-9"}) Checkpoint(n, true);
  RetentionPolicy policy = Policy(1, "model.index.json");
  policy.owned = {"step-1", "step-2"};
  auto removed = PruneCheckpoints(PosixFileSystem(), dir_.path(), "run1", policy);
  ASSERT_TRUE(removed.ok()) << removed.status();
  // step-2 is this site's newest: the newer ones of others do not count.
  EXPECT_EQ(*removed, std::vector<std::string>{"step-1"});
  for (const char* n : {"step-0", "step-2", "step-5", "step-9"}) {
    EXPECT_TRUE(Exists(dir_.Sub(std::string("run1/") + n + "/shards/0.pt"))) << n;
  }
  // Owning nothing there prunes nothing, whatever keep says.
  policy.owned.clear();
  auto none = PruneCheckpoints(PosixFileSystem(), dir_.path(), "run1", policy);
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_TRUE(none->empty());
  EXPECT_TRUE(Exists(dir_.Sub("run1/step-0")));
}

// A prune empties only its own work directory: the versions publishes kept
// in the trash (storage/trash.h) stay until they expire.
TEST_F(RetentionTest, LeavesThePublishTrashAlone) {
  for (const char* n : {"step-1", "step-2", "step-3"}) Checkpoint(n, true);
  const std::string entry = TrashEntryName(1000, "t1");
  MakeDirs(dir_.Sub(".longhaul/trash/" + entry + "/version"));
  WriteFile(dir_.Sub(".longhaul/trash/" + entry + "/version/x"), "old bytes");
  auto removed =
      PruneCheckpoints(PosixFileSystem(), dir_.path(), "run1", Policy(1, "model.index.json"));
  ASSERT_TRUE(removed.ok()) << removed.status();
  EXPECT_EQ(removed->size(), 2u);
  EXPECT_TRUE(Exists(dir_.Sub(".longhaul/trash/" + entry + "/version/x")));
}

TEST(TrashTest, ExpiresOnlyEntriesOlderThanTheRetention) {
  TempDir dir;
  const absl::Time now = absl::FromUnixMillis(10'000'000);
  const std::string old_entry = TrashEntryName(absl::ToUnixMillis(now - absl::Hours(2)), "old");
  const std::string new_entry = TrashEntryName(absl::ToUnixMillis(now - absl::Minutes(5)), "new");
  MakeDirs(dir.Sub(".longhaul/trash/" + old_entry + "/version/a"));
  WriteFile(dir.Sub(".longhaul/trash/" + old_entry + "/version/a/b"), "x");
  MakeDirs(dir.Sub(".longhaul/trash/" + new_entry));
  WriteFile(dir.Sub(".longhaul/trash/" + new_entry + "/version"), "y");
  MakeDirs(dir.Sub(".longhaul/trash/pruning"));
  auto removed = ExpireTrash(PosixFileSystem(), dir.path(), now, absl::Hours(1));
  ASSERT_TRUE(removed.ok()) << removed.status();
  EXPECT_EQ(*removed, (std::vector<std::string>{old_entry}));
  EXPECT_FALSE(Exists(dir.Sub(".longhaul/trash/" + old_entry)));
  EXPECT_TRUE(Exists(dir.Sub(".longhaul/trash/" + new_entry + "/version")));
  EXPECT_TRUE(Exists(dir.Sub(".longhaul/trash/pruning")));
}

TEST(TrashTest, AnExportWithoutTrashHasNothingToExpire) {
  TempDir dir;
  auto removed = ExpireTrash(PosixFileSystem(), dir.path(), absl::Now(), absl::Hours(1));
  ASSERT_TRUE(removed.ok()) << removed.status();
  EXPECT_TRUE(removed->empty());
}

}  // namespace
}  // namespace longhaul::storage
