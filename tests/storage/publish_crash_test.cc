// The proof harness of the publish promise: publish and retention run on
// the fault-injecting file system, crash at every mutating step in turn,
// come back after a process crash or a power loss, and must show a whole
// version at every instant and converge to the new one.
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_join.h"
#include "common/checkpoints.h"
#include "gtest/gtest.h"
#include "spdlog/spdlog.h"
#include "storage/file_system.h"
#include "storage/retention.h"
#include "storage/staging.h"
#include "tests/test_tools/fault_injection_fs.h"

namespace longhaul::storage {
namespace {

using testing::FaultInjectionFileSystem;
using Restart = FaultInjectionFileSystem::Restart;
using Tree = std::map<std::string, std::string>;

constexpr char kExport[] = "/export";
constexpr int64_t kMtime = 1700000000123456789;  // ns precision on purpose
const std::vector<std::string> kMarkers = {".metadata", "*.index.json", "COMPLETE"};

// A tree as FaultInjectionFileSystem::Tree lists it: files with contents,
// and every directory as "dir/".
Tree WithDirs(const Tree& files, const std::vector<std::string>& empty_dirs = {}) {
  Tree out = files;
  auto add_parents = [&](std::string path, bool self) {
    if (self) out[path + "/"] = "";
    for (size_t slash = path.rfind('/'); slash != std::string::npos; slash = path.rfind('/')) {
      path = path.substr(0, slash);
      out[path + "/"] = "";
    }
  };
  for (const auto& [path, contents] : files) add_parents(path, false);
  for (const std::string& d : empty_dirs) add_parents(d, true);
  return out;
}

std::string Show(const std::optional<Tree>& tree) {
  if (!tree) return "(absent)";
  std::vector<std::string> parts;
  for (const auto& [path, contents] : *tree) parts.push_back(path + "=" + contents);
  return "{" + absl::StrJoin(parts, ", ") + "}";
}

enum class Layout { kNewTree, kReplaceTree, kReplaceTreeWithoutExchange, kNewFile, kReplaceFile };

struct Case {
  Layout layout;
  Restart restart;
  bool cancel_after_restart;
  // A tree whose manifest also has hard links (ManifestFile.link_of): one of
  // a staged file, one of an unchanged file linked from the old version.
  bool hard_links = false;
};

std::string CaseName(const ::testing::TestParamInfo<Case>& info) {
  const char* layouts[] = {"NewTree", "ReplaceTree", "ReplaceTreeWithoutExchange", "NewFile",
                           "ReplaceFile"};
  return std::string(layouts[static_cast<int>(info.param.layout)]) +
         (info.param.restart == Restart::kPowerLoss ? "_PowerLoss" : "_ProcessCrash") +
         (info.param.cancel_after_restart ? "_ThenCancel" : "_ThenResume") +
         (info.param.hard_links ? "_HardLinks" : "");
}

class PublishCrashTest : public ::testing::TestWithParam<Case> {
 protected:
  bool single_file() const {
    return GetParam().layout == Layout::kNewFile || GetParam().layout == Layout::kReplaceFile;
  }
  bool has_old() const {
    return GetParam().layout != Layout::kNewTree && GetParam().layout != Layout::kNewFile;
  }
  std::string dest_abs() const { return std::string(kExport) + "/ckpt/step"; }

  void SetUp() override {
    spdlog::set_level(spdlog::level::warn);  // thousands of publishes
    manifest_.set_chunk_size(64 << 10);
    if (single_file()) {
      old_ = {{"", "old weights"}};
      new_ = {{"", "new weights, longer"}};
      Add("weights.bin", new_[""], 0600);
      options_.single_file = true;
    } else {
      old_ = WithDirs({{".metadata", "v1 metadata"},
                       {"shard-0", "v1 shard 0"},
                       {"shard-1", "the same in both versions"},
                       {"sub/shard-2", "v1 shard 2"},
                       {"v1-only", "not in v2"}});
      Add(".metadata", "v2 metadata", 0644);
      Add("shard-0", "v2 shard 0, longer", 0644);
      Add("shard-1", "the same in both versions", 0644);
      Add("sub/shard-2", "v2 shard 2", 0600);
      Add("new/deeper/shard-3", "v2 shard 3", 0644);
      Add("sub/empty-file", "", 0444);
      if (GetParam().hard_links) {
        Add("new/shard-2-again", contents_["sub/shard-2"], 0600)->set_link_of(4);
        Add("shard-1-again", contents_["shard-1"], 0644)->set_link_of(3);
      }
      manifest_.add_empty_dirs("logs/tensorboard");
      Tree files;
      for (const auto& f : manifest_.files()) files[f.path()] = contents_[f.path()];
      new_ = WithDirs(files, {"logs/tensorboard"});
      options_.commit_last = kMarkers;
      if (has_old()) options_.skip_files = {2};  // shard-1: unchanged, linked
    }
  }

  v1::ManifestFile* Add(const std::string& path, const std::string& contents, uint32_t mode) {
    v1::ManifestFile* f = manifest_.add_files();
    f->set_path(path);
    f->set_size(contents.size());
    f->set_mode(mode);
    f->set_mtime_ns(kMtime + manifest_.files_size());
    contents_[path] = contents;
    return f;
  }

  // Whether every hard link of the manifest is, at the destination, the
  // same file as its target.
  ::testing::AssertionResult LinksAreOneFile(FaultInjectionFileSystem& fs) const {
    auto stat = [&](const std::string& path) -> absl::StatusOr<std::optional<FileInfo>> {
      const std::string abs = dest_abs() + "/" + path;
      const size_t slash = abs.rfind('/');
      auto dir = fs.OpenRoot(abs.substr(0, slash));
      if (!dir.ok()) return dir.status();
      return fs.Stat(**dir, abs.substr(slash + 1));
    };
    for (const v1::ManifestFile& f : manifest_.files()) {
      if (f.link_of() == 0) continue;
      const std::string& target = manifest_.files(static_cast<int>(f.link_of() - 1)).path();
      auto a = stat(f.path());
      auto b = stat(target);
      if (!a.ok() || !b.ok() || !a->has_value() || !b->has_value() || !(*a)->SameObject(**b)) {
        return ::testing::AssertionFailure() << f.path() << " is not a hard link of " << target;
      }
    }
    return ::testing::AssertionSuccess();
  }

  // A fresh file system: the old version (if any) and the new one staged,
  // every chunk written and synced, as the receiver acknowledges them.
  void Prepare(FaultInjectionFileSystem& fs) {
    fs.MakeDirs(std::string(kExport) + "/ckpt");
    if (GetParam().layout == Layout::kReplaceTreeWithoutExchange) {
      fs.set_exchange_supported(false);
    }
    if (has_old()) {
      for (const auto& [path, contents] : old_) {
        if (path.empty()) {
          fs.PutFile(dest_abs(), contents);
        } else if (path.back() != '/') {
          // shard-1 carries the manifest's mtime: sync found it unchanged.
          const int64_t mtime = path == "shard-1" ? manifest_.files(2).mtime_ns() : 0;
          fs.PutFile(dest_abs() + "/" + path, contents, mtime);
        }
      }
    }
    auto staging = Open(fs);
    ASSERT_TRUE(staging.ok()) << staging.status();
    for (int i = 0; i < manifest_.files_size(); ++i) {
      const v1::ManifestFile& f = manifest_.files(i);
      if (f.size() == 0 || options_.skip_files.contains(i) || f.link_of() != 0) continue;
      auto file = staging->OpenFile(i, f);
      ASSERT_TRUE(file.ok()) << file.status();
      const std::string& data = contents_[f.path()];
      ASSERT_TRUE((*file)->WriteAt(0, absl::MakeConstSpan(
                                          reinterpret_cast<const uint8_t*>(data.data()), data.size()))
                      .ok());
      ASSERT_TRUE((*file)->Sync().ok());
    }
  }

  absl::StatusOr<Staging> Open(FaultInjectionFileSystem& fs) {
    ResolvedDestination dest{kExport, "ckpt/step", dest_abs()};
    return Staging::Open(fs, dest, "t1");
  }

  std::optional<Tree> Destination(const FaultInjectionFileSystem& fs) const {
    return fs.Tree(dest_abs());  // a single file is listed under ""
  }

  // What a reader may see: the old version, the new one, nothing when there
  // was nothing; without RENAME_EXCHANGE also nothing, or the old version
  // without its markers (never a marker beside a mix).
  ::testing::AssertionResult IsWholeVersion(const std::optional<Tree>& seen) const {
    const std::optional<Tree> old = has_old() ? std::optional<Tree>(old_) : std::nullopt;
    if (seen == old || seen == std::optional<Tree>(new_)) return ::testing::AssertionSuccess();
    if (GetParam().layout == Layout::kReplaceTreeWithoutExchange) {
      if (!seen) return ::testing::AssertionSuccess();
      bool old_without_markers = true;
      for (const auto& [path, contents] : *seen) {
        auto it = old_.find(path);
        if (it == old_.end() || it->second != contents || IsCommitMarker(kMarkers, path)) {
          old_without_markers = false;
        }
      }
      if (old_without_markers) return ::testing::AssertionSuccess();
    }
    return ::testing::AssertionFailure() << "a reader sees " << Show(seen) << "; old "
                                         << Show(old) << ", new " << Show(new_);
  }

  v1::Manifest manifest_;
  PublishOptions options_;
  std::map<std::string, std::string> contents_;
  Tree old_;
  Tree new_;
};

TEST_P(PublishCrashTest, EveryStepKeepsOneWholeVersionAndConverges) {
  uint64_t crash_points = 0;
  for (uint64_t step = 1;; ++step) {
    SCOPED_TRACE("crash at mutating step " + std::to_string(step));
    FaultInjectionFileSystem fs;
    Prepare(fs);
    if (HasFatalFailure()) return;
    fs.CrashAtStep(step);
    {
      auto staging = Open(fs);
      ASSERT_TRUE(staging.ok()) << staging.status();
      absl::Status published = staging->Publish(manifest_, options_);
      if (!fs.crashed()) {
        // Publish finished before this step: every step was tried.
        ASSERT_TRUE(published.ok()) << published;
        EXPECT_EQ(Destination(fs), std::optional<Tree>(new_));
        EXPECT_TRUE(LinksAreOneFile(fs));
        break;
      }
      EXPECT_FALSE(published.ok());
    }
    ++crash_points;
    const std::string log = absl::StrJoin(fs.step_log(), "\n");
    // The instant of the crash, then what is left after the restart.
    ASSERT_TRUE(IsWholeVersion(Destination(fs))) << log;
    fs.RestartAfter(GetParam().restart);
    ASSERT_TRUE(IsWholeVersion(Destination(fs))) << log;

    auto staging = Open(fs);
    ASSERT_TRUE(staging.ok()) << staging.status() << "\n" << log;
    absl::StatusOr<bool> past = staging->PastPointOfNoReturn();
    ASSERT_TRUE(past.ok()) << past.status();
    if (Destination(fs) != std::optional<Tree>(new_)) {
      // Every acknowledged chunk is still there, wherever publish left it.
      for (int i = 0; i < manifest_.files_size(); ++i) {
        if (options_.skip_files.contains(i) || manifest_.files(i).size() == 0 ||
            manifest_.files(i).link_of() != 0) {
          continue;
        }
        absl::StatusOr<bool> held = staging->HoldsFile(i, manifest_.files(i));
        ASSERT_TRUE(held.ok()) << held.status();
        EXPECT_TRUE(*held) << manifest_.files(i).path() << " lost\n" << log;
      }
    }
    if (GetParam().cancel_after_restart && !*past) {
      // Before the point of no return a cancel leaves the old version.
      ASSERT_TRUE(staging->Remove().ok());
      EXPECT_EQ(Destination(fs), has_old() ? std::optional<Tree>(old_) : std::nullopt) << log;
    } else {
      // Resumed, or cancelled past the point of no return: publish completes.
      absl::Status again = staging->Publish(manifest_, options_);
      ASSERT_TRUE(again.ok()) << again << "\n" << log;
      EXPECT_EQ(Destination(fs), std::optional<Tree>(new_)) << log;
      EXPECT_TRUE(LinksAreOneFile(fs)) << log;
      ASSERT_TRUE(staging->Remove().ok());
    }
    EXPECT_EQ(fs.Tree(std::string(kExport) + "/.longhaul/staging"), std::optional<Tree>(Tree{}))
        << log;
  }
  // The enumeration reached the interesting steps (stage, record, install,
  // cleanup), not just the first few.
  EXPECT_GE(crash_points, single_file() ? 5u : 20u);
}

// A publish stopped after its install, while the old version still waits in
// staging (an EIO while removing it, a crash), may find the destination
// replaced by a newer version when it resumes: another transfer published
// there meanwhile. The resume must finish its clean-up, not take the old
// version left in next/ for its new one "changed under publish" and fail
// every retry, and must leave the newer version in place.
TEST_P(PublishCrashTest, AResumeAfterTheDestinationWasReplacedAgainFinishes) {
  if (GetParam().restart != Restart::kProcessCrash || GetParam().cancel_after_restart) {
    GTEST_SKIP() << "one restart kind is enough for this case";
  }
  const Tree newer = single_file() ? Tree{{"", "a newer file"}}
                                   : WithDirs({{".metadata", "v3"}, {"shard-0", "v3 shard 0"}});
  uint64_t replaced_after_install = 0;
  for (uint64_t step = 1;; ++step) {
    SCOPED_TRACE("crash at mutating step " + std::to_string(step));
    FaultInjectionFileSystem fs;
    Prepare(fs);
    if (HasFatalFailure()) return;
    fs.CrashAtStep(step);
    {
      auto staging = Open(fs);
      ASSERT_TRUE(staging.ok()) << staging.status();
      (void)staging->Publish(manifest_, options_);  // fails at the crash
      if (!fs.crashed()) break;
    }
    fs.RestartAfter(GetParam().restart);
    if (Destination(fs) != std::optional<Tree>(new_)) continue;  // not installed yet
    // Installed: another publish replaces the destination with a newer version.
    {
      auto root = fs.OpenRoot(std::string(kExport) + "/ckpt");
      ASSERT_TRUE(root.ok()) << root.status();
      ASSERT_TRUE(RemoveTree(fs, **root, "step").ok());
    }
    for (const auto& [path, contents] : newer) {
      if (path.empty()) {
        fs.PutFile(dest_abs(), contents);
      } else if (path.back() != '/') {
        fs.PutFile(dest_abs() + "/" + path, contents);
      }
    }
    ++replaced_after_install;
    auto staging = Open(fs);
    ASSERT_TRUE(staging.ok()) << staging.status();
    absl::Status again = staging->Publish(manifest_, options_);
    ASSERT_TRUE(again.ok()) << again << "\n" << absl::StrJoin(fs.step_log(), "\n");
    EXPECT_EQ(Destination(fs), std::optional<Tree>(newer));
    ASSERT_TRUE(staging->Remove().ok());
    EXPECT_EQ(fs.Tree(std::string(kExport) + "/.longhaul/staging"), std::optional<Tree>(Tree{}));
  }
  EXPECT_GE(replaced_after_install, 1u);
}

INSTANTIATE_TEST_SUITE_P(
    AllLayouts, PublishCrashTest,
    ::testing::ValuesIn([] {
      std::vector<Case> cases;
      for (Layout l : {Layout::kNewTree, Layout::kReplaceTree, Layout::kReplaceTreeWithoutExchange,
                       Layout::kNewFile, Layout::kReplaceFile}) {
        for (Restart r : {Restart::kProcessCrash, Restart::kPowerLoss}) {
          for (bool cancel : {false, true}) cases.push_back({l, r, cancel});
        }
      }
      return cases;
    }()),
    CaseName);

INSTANTIATE_TEST_SUITE_P(TreesWithHardLinks, PublishCrashTest, ::testing::ValuesIn([] {
                           std::vector<Case> cases;
                           for (Layout l : {Layout::kNewTree, Layout::kReplaceTree,
                                            Layout::kReplaceTreeWithoutExchange}) {
                             for (Restart r : {Restart::kProcessCrash, Restart::kPowerLoss}) {
                               for (bool cancel : {false, true})
                                 cases.push_back({l, r, cancel, /*hard_links=*/true});
                             }
                           }
                           return cases;
                         }()),
                         CaseName);

// On a file system that keeps whole seconds, a published tree is still
// recognised as published (sync, and a publish re-run) and replaced cleanly.
TEST(PublishCoarseTimestampsTest, PublishedFilesMatchTheirManifest) {
  FaultInjectionFileSystem fs;
  fs.set_mtime_granularity_ns(1000000000);
  fs.MakeDirs("/export");
  v1::Manifest m;
  m.set_chunk_size(64 << 10);
  for (const char* path : {"a.bin", ".metadata"}) {
    v1::ManifestFile* f = m.add_files();
    f->set_path(path);
    f->set_size(5);
    f->set_mode(0644);
    f->set_mtime_ns(kMtime);
  }
  ResolvedDestination dest{"/export", "ckpt", "/export/ckpt"};
  for (int round = 0; round < 2; ++round) {
    auto staging = Staging::Open(fs, dest, "t" + std::to_string(round));
    ASSERT_TRUE(staging.ok()) << staging.status();
    PublishOptions options;
    options.commit_last = kMarkers;
    for (int i = 0; i < m.files_size(); ++i) {
      auto same = PublishedFileMatches(fs, dest, false, m.files(i));
      ASSERT_TRUE(same.ok()) << same.status();
      EXPECT_EQ(*same, round == 1) << m.files(i).path();
      if (*same) {
        options.skip_files.insert(i);
        continue;
      }
      auto file = staging->OpenFile(i, m.files(i));
      ASSERT_TRUE(file.ok());
      ASSERT_TRUE((*file)->WriteAt(0, absl::MakeConstSpan(
                                          reinterpret_cast<const uint8_t*>("hello"), 5))
                      .ok());
      ASSERT_TRUE((*file)->Sync().ok());
    }
    absl::Status st = staging->Publish(m, options);
    ASSERT_TRUE(st.ok()) << st;
    ASSERT_TRUE(staging->Remove().ok());
    EXPECT_EQ(fs.Tree("/export/ckpt"), std::optional<Tree>(Tree{{"a.bin", "hello"}, {".metadata", "hello"}}));
  }
}

// Retention: every checkpoint is whole or gone at every instant, the newest
// complete ones are never touched, and a re-run finishes the pruning.
class RetentionCrashTest : public ::testing::TestWithParam<Restart> {};

TEST_P(RetentionCrashTest, EveryStepKeepsCheckpointsWholeAndConverges) {
  const std::map<std::string, Tree> checkpoints = {
      {"step-1", WithDirs({{"COMPLETE", ""}, {"shards/0", "one"}})},
      {"step-2", WithDirs({{"COMPLETE", ""}, {"shards/0", "two"}})},
      {"step-3", WithDirs({{"COMPLETE", ""}, {"shards/0", "three"}})},
      {"step-4", WithDirs({{"COMPLETE", ""}, {"shards/0", "four"}})},
      {"step-5", WithDirs({{"shards/0", "five, still being written"}})},
  };
  RetentionPolicy policy;
  policy.keep = 2;
  policy.marker_globs = kMarkers;
  policy.owned = {"step-1", "step-2", "step-3", "step-4", "step-5"};
  uint64_t crash_points = 0;
  for (uint64_t step = 1;; ++step) {
    SCOPED_TRACE("crash at mutating step " + std::to_string(step));
    FaultInjectionFileSystem fs;
    for (const auto& [name, tree] : checkpoints) {
      for (const auto& [path, contents] : tree) {
        if (path.back() != '/') fs.PutFile("/export/run/" + name + "/" + path, contents);
      }
    }
    fs.CrashAtStep(step);
    auto pruned = PruneCheckpoints(fs, "/export", "run", policy);
    if (!fs.crashed()) {
      ASSERT_TRUE(pruned.ok()) << pruned.status();
      EXPECT_EQ(*pruned, (std::vector<std::string>{"step-1", "step-2"}));
      break;
    }
    ++crash_points;
    auto check = [&] {
      for (const auto& [name, tree] : checkpoints) {
        std::optional<Tree> seen = fs.Tree("/export/run/" + name);
        const bool keep = name >= "step-3";
        if (keep || seen) {
          EXPECT_EQ(seen, std::optional<Tree>(tree)) << name;
        }
      }
    };
    check();
    fs.RestartAfter(GetParam());
    check();
    auto again = PruneCheckpoints(fs, "/export", "run", policy);
    ASSERT_TRUE(again.ok()) << again.status();
    for (const char* gone : {"step-1", "step-2"}) {
      EXPECT_EQ(fs.Tree(std::string("/export/run/") + gone), std::nullopt) << gone;
    }
    check();
    EXPECT_EQ(fs.Tree("/export/.longhaul/trash/pruning"), std::optional<Tree>(Tree{}));
  }
  EXPECT_GE(crash_points, 5u);
}

INSTANTIATE_TEST_SUITE_P(BothRestarts, RetentionCrashTest,
                         ::testing::Values(Restart::kProcessCrash, Restart::kPowerLoss),
                         [](const ::testing::TestParamInfo<Restart>& info) {
                           return info.param == Restart::kPowerLoss ? std::string("PowerLoss")
                                                                    : std::string("ProcessCrash");
                         });

}  // namespace
}  // namespace longhaul::storage
