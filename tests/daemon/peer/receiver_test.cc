// The Receiver on the fault-injecting file system: what it does at start
// with publishes a crash interrupted.
#include "daemon/peer/receiver.h"

#include <string>

#include "gtest/gtest.h"
#include "storage/staging.h"
#include "tests/storage/fault_injection_fs.h"
#include "tests/storage/test_util.h"

namespace longhaul::peer {
namespace {

using storage::testing::FaultInjectionFileSystem;
using Tree = std::map<std::string, std::string>;

class ReceiverRestartTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // The export exists on disk (destination paths are resolved against its
    // realpath) and, at the same path, in the fake file system that holds
    // its contents.
    export_ = state_.Sub("export");
    storage::testing::MakeDirs(export_);
    ResetFileSystem();
    config_.site = "site-b";
    config_.exports = {{"ckpt", export_}};
    auto journal = storage::Journal::Open(state_.Sub("journal"));
    ASSERT_TRUE(journal.ok()) << journal.status();
    journal_ = std::move(*journal);

    record_.set_id("t1");
    record_.set_source_site("site-a");
    record_.set_export_name("ckpt");
    record_.set_dest_path("ckpt/step");
    record_.set_state(v1::IncomingTransfer::RECEIVING);
    v1::Manifest* m = record_.mutable_manifest();
    m->set_chunk_size(64 << 10);
    for (const char* path : {"shard-0", ".metadata"}) {
      v1::ManifestFile* f = m->add_files();
      f->set_path(path);
      f->set_size(Contents(path).size());
      f->set_mode(0644);
      f->set_mtime_ns(1700000000000000000);
    }
    ASSERT_TRUE(journal_->PutIncoming(record_).ok());
  }

  static std::string Contents(const std::string& path) { return "new " + path; }

  // The export holds the old version only.
  void ResetFileSystem() {
    fs_ = std::make_unique<FaultInjectionFileSystem>();
    fs_->MakeDirs(export_ + "/ckpt");
    fs_->PutFile(export_ + "/ckpt/step/.metadata", "old marker");
  }

  // Stages the new version and runs publish until a crash at `step`.
  void StageAndPublishUntil(uint64_t step) {
    storage::ResolvedDestination dest{export_, "ckpt/step", export_ + "/ckpt/step"};
    auto staging = storage::Staging::Open(*fs_, dest, "t1");
    ASSERT_TRUE(staging.ok()) << staging.status();
    for (int i = 0; i < record_.manifest().files_size(); ++i) {
      const v1::ManifestFile& f = record_.manifest().files(i);
      auto file = staging->OpenFile(i, f);
      ASSERT_TRUE(file.ok()) << file.status();
      const std::string data = Contents(f.path());
      ASSERT_TRUE((*file)->WriteAt(0, absl::MakeConstSpan(
                                          reinterpret_cast<const uint8_t*>(data.data()), data.size()))
                      .ok());
      ASSERT_TRUE((*file)->Sync().ok());
    }
    fs_->CrashAtStep(step);
    EXPECT_FALSE(staging->Publish(record_.manifest(), {}).ok());
    fs_->RestartAfter(FaultInjectionFileSystem::Restart::kProcessCrash);
  }

  storage::testing::TempDir state_;
  std::string export_;
  std::unique_ptr<FaultInjectionFileSystem> fs_;
  daemon::DaemonConfig config_;
  std::unique_ptr<storage::Journal> journal_;
  v1::IncomingTransfer record_;
};

TEST_F(ReceiverRestartTest, FinishesAPublishPastItsPointOfNoReturnWithoutItsSender) {
  // Find the first crash point past the point of no return at which the
  // destination is still the old version.
  bool found = false;
  for (uint64_t step = 1; step < 200 && !found; ++step) {
    ResetFileSystem();
    StageAndPublishUntil(step);
    storage::ResolvedDestination dest{export_, "ckpt/step", export_ + "/ckpt/step"};
    auto staging = storage::Staging::Open(*fs_, dest, "t1");
    ASSERT_TRUE(staging.ok());
    found = *staging->PastPointOfNoReturn() &&
            fs_->Tree(export_ + "/ckpt/step") == std::optional<Tree>(Tree{{".metadata", "old marker"}});
  }
  ASSERT_TRUE(found);

  Receiver receiver(config_, *journal_, *fs_);
  receiver.FinishInterruptedPublishes();
  EXPECT_EQ(fs_->Tree(export_ + "/ckpt/step"),
            std::optional<Tree>(Tree{{"shard-0", "new shard-0"}, {".metadata", "new .metadata"}}));
  auto record = journal_->GetIncoming("t1");
  ASSERT_TRUE(record.ok() && record->has_value());
  EXPECT_EQ((*record)->state(), v1::IncomingTransfer::PUBLISHED);
  EXPECT_EQ(fs_->Tree(export_ + "/.longhaul/staging"), std::optional<Tree>(Tree{}));
}

TEST_F(ReceiverRestartTest, LeavesAPublishBeforeItsPointOfNoReturnToItsSender) {
  StageAndPublishUntil(1);
  Receiver receiver(config_, *journal_, *fs_);
  receiver.FinishInterruptedPublishes();
  EXPECT_EQ(fs_->Tree(export_ + "/ckpt/step"), std::optional<Tree>(Tree{{".metadata", "old marker"}}));
  auto record = journal_->GetIncoming("t1");
  ASSERT_TRUE(record.ok() && record->has_value());
  EXPECT_EQ((*record)->state(), v1::IncomingTransfer::RECEIVING);
}

}  // namespace
}  // namespace longhaul::peer
