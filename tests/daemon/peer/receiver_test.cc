// The Receiver on the fault-injecting file system: what it does at start
// with publishes a crash interrupted, and whom it lets write.
#include "daemon/peer/receiver.h"

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "daemon/peer/memory_budget.h"
#include "daemon/peer/messaging.h"
#include "daemon/wire/frames.h"
#include "daemon/wire/messaging.h"
#include "gtest/gtest.h"
#include "rocksdb/env.h"
#include "storage/chunk_io.h"
#include "storage/staging.h"
#include "tests/storage/fillable_file_system.h"
#include "tests/storage/test_util.h"
#include "tests/test_tools/fake_channel.h"
#include "tests/test_tools/fault_injection_fs.h"

namespace longhaul::peer {
namespace {

using storage::testing::FaultInjectionFileSystem;
using transport::testing::ChannelPair;
using transport::testing::FakeChannel;
using transport::testing::MakeChannelPair;
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
    options_.local_site = "site-b";
    options_.exports.resize(1);
    options_.exports[0].name = "ckpt";
    options_.exports[0].path = export_;
    options_.exports[0].writers = {"site-a"};
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
      ASSERT_TRUE((*file)
                      ->WriteAt(0, absl::MakeConstSpan(
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
  ReceiverOptions options_;
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
    found =
        *staging->PastPointOfNoReturn() &&
        fs_->Tree(export_ + "/ckpt/step") == std::optional<Tree>(Tree{{".metadata", "old marker"}});
  }
  ASSERT_TRUE(found);

  Receiver receiver(options_, *journal_, *fs_);
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
  Receiver receiver(options_, *journal_, *fs_);
  receiver.FinishInterruptedPublishes();
  EXPECT_EQ(fs_->Tree(export_ + "/ckpt/step"),
            std::optional<Tree>(Tree{{".metadata", "old marker"}}));
  auto record = journal_->GetIncoming("t1");
  ASSERT_TRUE(record.ok() && record->has_value());
  EXPECT_EQ((*record)->state(), v1::IncomingTransfer::RECEIVING);
}

// Serves, as `receiver`, a channel from `site` on which `bytes` arrive and
// then the peer's half close; returns the end the receiver answered on.
std::unique_ptr<FakeChannel> ServeBytes(Receiver& receiver, const std::string& site,
                                        const v1::Hello& hello, const std::vector<uint8_t>& bytes) {
  ChannelPair pair = MakeChannelPair("site-b", site);
  EXPECT_TRUE(pair.a->Write({absl::MakeConstSpan(bytes)}).ok());
  pair.a->Close();
  receiver.Serve(std::move(pair.b), hello);
  return std::move(pair.a);
}

class ReceiverAuthorizationTest : public ReceiverRestartTest {
 protected:
  // Serves one control connection from `site` for transfer `id` that sends
  // `request`; returns the receiver's answer.
  v1::PeerMessage Call(Receiver& receiver, const std::string& site, const std::string& id,
                       v1::PeerMessage request) {
    request.set_request_id(7);
    ChannelPair pair = MakeChannelPair("site-b", site);
    EXPECT_TRUE(
        wire::SendProto(*pair.a, wire::FrameType::kControl, wire::SessionIdFor(id), request).ok());
    pair.a->Close();
    v1::Hello hello;
    hello.set_role(v1::Hello::CONTROL);
    hello.set_transfer_id(id);
    receiver.Serve(std::move(pair.b), hello);
    v1::PeerMessage answer;
    EXPECT_TRUE(
        wire::ReadProto(*pair.a, wire::FrameType::kControl, wire::SessionIdFor(id), &answer).ok());
    return answer;
  }

  // Asks, as `site`, to open `id` into ckpt:`dest`.
  v1::PeerMessage OpenAs(Receiver& receiver, const std::string& site, const std::string& id,
                         const std::string& dest) {
    v1::PeerMessage request;
    v1::OpenRequest* open = request.mutable_open();
    open->set_transfer_id(id);
    open->set_export_name("ckpt");
    open->set_dest_path(dest);
    *open->mutable_manifest() = record_.manifest();
    return Call(receiver, site, id, request);
  }
};

TEST_F(ReceiverAuthorizationTest, AReaderThatIsNotAWriterIsRefusedAndNothingIsWritten) {
  const auto before = fs_->Tree(export_);
  Receiver receiver(options_, *journal_, *fs_);
  v1::PeerMessage answer = OpenAs(receiver, "site-c", "t-c", "ckpt/new");
  EXPECT_EQ(answer.error(),
            "site-c may not write into export ckpt of site-b: it is not one of the export's "
            "writers (exports[].writers in site-b's config)");
  EXPECT_EQ(answer.error_code(), static_cast<int>(absl::StatusCode::kPermissionDenied));
  EXPECT_FALSE(answer.retryable());
  EXPECT_EQ(fs_->Tree(export_), before);  // not even a staging directory
  auto record = journal_->GetIncoming("t-c");
  ASSERT_TRUE(record.ok());
  EXPECT_FALSE(record->has_value());
  using Key = std::pair<std::string, std::string>;
  EXPECT_EQ(receiver.stats().access_refused, (std::map<Key, uint64_t>{{{"site-c", "ckpt"}, 1}}));

  // A writer may open there.
  v1::PeerMessage ok = OpenAs(receiver, "site-a", "t-a", "ckpt/new");
  EXPECT_EQ(ok.error(), "");
  EXPECT_TRUE(ok.has_open_reply());
  EXPECT_EQ(receiver.stats().access_refused.size(), 1u);
}

// A pull this site issued lets its source write the one destination pulled,
// with the transfer pulled only, while the pull lasts, though the export
// lists no writers.
TEST_F(ReceiverAuthorizationTest, APullsSourceMayOpenOnlyThePathPulledWhileThePullLasts) {
  bool pull_running = true;
  options_.exports[0].writers.clear();
  options_.pull_granted = [&pull_running](const DestinationAuthority::Change& c) {
    return pull_running && c.source == "site-c" && c.export_name == "ckpt" &&
                   c.dest_path == "pulled" && c.transfer_id == "t-c"
               ? absl::OkStatus()
               : absl::NotFoundError("no such pull");
  };
  Receiver receiver(options_, *journal_, *fs_);
  const int denied = static_cast<int>(absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(OpenAs(receiver, "site-c", "t-c", "other").error_code(), denied);
  EXPECT_EQ(OpenAs(receiver, "site-c", "t-other", "pulled").error_code(), denied);
  EXPECT_EQ(OpenAs(receiver, "site-a", "t-c", "pulled").error_code(), denied);
  v1::PeerMessage ok = OpenAs(receiver, "site-c", "t-c", "pulled");
  EXPECT_EQ(ok.error(), "");
  EXPECT_TRUE(ok.has_open_reply());
  pull_running = false;
  EXPECT_EQ(OpenAs(receiver, "site-c", "t-c", "pulled").error_code(), denied);
}

// A pull's source writes only where the local user who asked for the pull
// may write: when the grant says that user may not write the path, the
// open is refused with the reason, whether or not the source is also one of
// the export's writers, and nothing is written.
TEST_F(ReceiverAuthorizationTest, APullIsRefusedWhereItsRequesterMayNotWrite) {
  options_.exports[0].writers = {"site-a"};
  absl::Status requester_may_write =
      absl::PermissionDeniedError("uid 65534 (nobody) may not write /export/ckpt/pulled");
  options_.pull_granted = [&requester_may_write](const DestinationAuthority::Change& c) {
    return c.dest_path == "pulled" ? requester_may_write : absl::NotFoundError("no such pull");
  };
  const auto before = fs_->Tree(export_);
  Receiver receiver(options_, *journal_, *fs_);
  auto open = [&](const std::string& site, const std::string& id) {
    v1::PeerMessage request;
    request.mutable_open()->set_transfer_id(id);
    request.mutable_open()->set_export_name("ckpt");
    request.mutable_open()->set_dest_path("pulled");
    request.mutable_open()->set_requested_by("site-b");
    *request.mutable_open()->mutable_manifest() = record_.manifest();
    return Call(receiver, site, id, request);
  };
  for (const char* source : {"site-c", "site-a"}) {  // not a writer, and a writer
    v1::PeerMessage refused = open(source, absl::StrCat("t-", source));
    EXPECT_EQ(refused.error_code(), static_cast<int>(absl::StatusCode::kPermissionDenied));
    EXPECT_EQ(refused.error(),
              "the pull of ckpt:pulled that site-b issued may not write there: uid 65534 "
              "(nobody) may not write (a path of this site)")  // not the peer's business
        << source;
  }
  EXPECT_EQ(fs_->Tree(export_), before);  // not even a staging directory

  requester_may_write = absl::OkStatus();
  v1::PeerMessage ok = open("site-c", "t-c");
  EXPECT_EQ(ok.error(), "");
  EXPECT_TRUE(ok.has_open_reply());
}

// What site-a opens on `requester`'s request ("" for its own push) into
// ckpt:`dest`, keeping `keep` checkpoints beside it.
v1::PeerMessage OpenRequested(v1::PeerMessage request, const std::string& requester,
                              uint32_t keep) {
  request.mutable_open()->set_requested_by(requester);
  request.mutable_open()->set_keep_checkpoints(keep);
  request.mutable_open()->set_checkpoint_marker(".metadata");
  return request;
}

// A third-party copy uses the authority of the site that asked for it as
// well as its source's: site-c, no writer here, cannot have site-a (a
// writer) replace site-a's own checkpoint, nor prune beside a new one; it
// may only have it create a path that does not exist yet.
TEST_F(ReceiverAuthorizationTest, AThirdPartyCopyForASiteThatIsNotAWriterOnlyCreatesNewPaths) {
  v1::IncomingTransfer published = record_;
  published.set_id("t-published");
  published.set_state(v1::IncomingTransfer::PUBLISHED);
  ASSERT_TRUE(journal_->PutIncoming(published).ok());  // site-a's ckpt/step, which exists
  Receiver receiver(options_, *journal_, *fs_);
  const auto before = fs_->Tree(export_);
  auto open = [&](const std::string& id, const std::string& dest, uint32_t keep) {
    v1::PeerMessage request;
    request.mutable_open()->set_transfer_id(id);
    request.mutable_open()->set_export_name("ckpt");
    request.mutable_open()->set_dest_path(dest);
    *request.mutable_open()->mutable_manifest() = record_.manifest();
    return Call(receiver, "site-a", id, OpenRequested(request, "site-c", keep));
  };
  const int denied = static_cast<int>(absl::StatusCode::kPermissionDenied);

  v1::PeerMessage replace = open("t-replace", "ckpt/step", 0);
  EXPECT_EQ(replace.error_code(), denied);
  EXPECT_EQ(replace.error(),
            "site-c asked site-a to copy into ckpt:ckpt/step of site-b, which exists; site-c is "
            "not one of the export's writers, so a copy on its request may only create a path "
            "that does not exist yet: copy to a new path, or add site-c to exports[].writers in "
            "site-b's config");
  v1::PeerMessage prune = open("t-prune", "ckpt/step-2", 1);
  EXPECT_EQ(prune.error_code(), denied);
  EXPECT_EQ(prune.error(),
            "site-c asked site-a to prune old checkpoints in export ckpt of site-b (--keep), but "
            "site-c is not one of the export's writers, so a copy on its request never prunes: "
            "copy without --keep, or add site-c to exports[].writers in site-b's config");
  EXPECT_EQ(fs_->Tree(export_), before);  // not even a staging directory
  for (const char* id : {"t-replace", "t-prune"}) {
    auto record = journal_->GetIncoming(id);
    ASSERT_TRUE(record.ok());
    EXPECT_FALSE(record->has_value()) << id;
  }
  using Key = std::pair<std::string, std::string>;
  EXPECT_EQ(receiver.stats().access_refused, (std::map<Key, uint64_t>{{{"site-a", "ckpt"}, 2}}));

  // A path that does not exist yet, without pruning: a copy may create it.
  v1::PeerMessage create = open("t-new", "ckpt/new", 0);
  EXPECT_EQ(create.error(), "");
  EXPECT_TRUE(create.has_open_reply());
}

// A publish on another site's request belongs to both sites: site-c, a
// writer too, cannot have site-a replace what site-a published for itself,
// nor site-a alone replace what it published on site-c's request.
TEST_F(ReceiverAuthorizationTest, AThirdPartyCopyReplacesOnlyWhatTheSameTwoSitesPublished) {
  options_.exports[0].writers = {"site-a", "site-c"};
  v1::IncomingTransfer own = record_;
  own.set_id("t-own");
  own.set_state(v1::IncomingTransfer::PUBLISHED);
  ASSERT_TRUE(journal_->PutIncoming(own).ok());  // site-a's ckpt/step, which exists
  v1::IncomingTransfer copied = own;
  copied.set_id("t-copied");
  copied.set_dest_path("ckpt/copied");
  copied.set_requested_by("site-c");
  ASSERT_TRUE(journal_->PutIncoming(copied).ok());
  fs_->PutFile(export_ + "/ckpt/copied/.metadata", "copied marker");
  Receiver receiver(options_, *journal_, *fs_);
  auto open = [&](const std::string& id, const std::string& dest, const std::string& requester) {
    v1::PeerMessage request;
    request.mutable_open()->set_transfer_id(id);
    request.mutable_open()->set_export_name("ckpt");
    request.mutable_open()->set_dest_path(dest);
    *request.mutable_open()->mutable_manifest() = record_.manifest();
    return Call(receiver, "site-a", id, OpenRequested(request, requester, 0));
  };

  v1::PeerMessage over_own = open("t-1", "ckpt/step", "site-c");
  EXPECT_EQ(over_own.error_code(), static_cast<int>(absl::StatusCode::kPermissionDenied));
  EXPECT_NE(over_own.error().find("ckpt:ckpt/step was published by site-a,"), std::string::npos)
      << over_own.error();
  v1::PeerMessage over_copy = open("t-2", "ckpt/copied", "");
  EXPECT_EQ(over_copy.error_code(), static_cast<int>(absl::StatusCode::kPermissionDenied));
  EXPECT_NE(over_copy.error().find("was published by site-a on site-c's request"),
            std::string::npos)
      << over_copy.error();
  EXPECT_EQ(fs_->Tree(export_ + "/.longhaul"), std::nullopt);

  EXPECT_EQ(open("t-3", "ckpt/copied", "site-c").error(), "");
  EXPECT_EQ(open("t-4", "ckpt/step", "").error(), "");
}

// A pull grants its source one path and one transfer, and never pruning:
// the source cannot open the pull with keep_checkpoints and remove the
// earlier pulls it published here. Nor may a source name this site as the
// requester of a pull it did not issue.
TEST_F(ReceiverAuthorizationTest, APullsSourceMayNotPruneTheEarlierPulls) {
  options_.exports[0].writers = {"site-a"};
  options_.pull_granted = [](const DestinationAuthority::Change& c) {
    return c.source == "site-c" && c.export_name == "ckpt" && c.dest_path == "run/step-3" &&
                   c.transfer_id == "t-3"
               ? absl::OkStatus()
               : absl::NotFoundError("no such pull");
  };
  for (const char* step : {"step-1", "step-2"}) {
    v1::IncomingTransfer pulled = record_;
    pulled.set_id(std::string("t-pulled-") + step);
    pulled.set_source_site("site-c");
    pulled.set_requested_by("site-b");
    pulled.set_dest_path(std::string("run/") + step);
    pulled.set_state(v1::IncomingTransfer::PUBLISHED);
    ASSERT_TRUE(journal_->PutIncoming(pulled).ok());
    fs_->PutFile(export_ + "/run/" + step + "/.metadata", "pulled");
  }
  Receiver receiver(options_, *journal_, *fs_);
  const auto before = fs_->Tree(export_);
  auto open = [&](const std::string& site, const std::string& id, const std::string& requester,
                  uint32_t keep) {
    v1::PeerMessage request;
    request.mutable_open()->set_transfer_id(id);
    request.mutable_open()->set_export_name("ckpt");
    request.mutable_open()->set_dest_path("run/step-3");
    *request.mutable_open()->mutable_manifest() = record_.manifest();
    return Call(receiver, site, id, OpenRequested(request, requester, keep));
  };
  const int denied = static_cast<int>(absl::StatusCode::kPermissionDenied);

  v1::PeerMessage keep = open("site-c", "t-3", "site-b", 1);
  EXPECT_EQ(keep.error_code(), denied);
  EXPECT_EQ(keep.error(),
            "site-c may not prune old checkpoints in export ckpt of site-b: it writes run/step-3 "
            "there as the source of a pull only, which grants that path and no pruning; pull "
            "without --keep");
  // A source that names no requester has the same grant, and no more.
  EXPECT_EQ(open("site-c", "t-3", "", 1).error_code(), denied);
  // A writer naming this site as the requester of a pull it did not issue.
  v1::PeerMessage claimed = open("site-a", "t-a", "site-b", 0);
  EXPECT_EQ(claimed.error_code(), denied);
  EXPECT_NE(claimed.error().find("site-a names site-b as the requester of transfer t-a"),
            std::string::npos)
      << claimed.error();
  EXPECT_EQ(fs_->Tree(export_), before);
  auto record = journal_->GetIncoming("t-3");
  ASSERT_TRUE(record.ok());
  EXPECT_FALSE(record->has_value());

  // The pull itself, without pruning.
  v1::PeerMessage pull = open("site-c", "t-3", "site-b", 0);
  EXPECT_EQ(pull.error(), "");
  EXPECT_TRUE(pull.has_open_reply());
}

// sync --checksum tells the sender which files here hold the content it
// names. A writer learns that only where it could know it anyway: what it
// published itself, or an export it may read. A file placed here by
// someone else is not read for it, so no guessed digest is ever confirmed.
class ReceiverContentCheckTest : public ReceiverAuthorizationTest {
 protected:
  // Opens, as site-a, a single-file sync --checksum of `dest` naming
  // `content`'s digest; returns the files the receiver found unchanged.
  std::vector<uint32_t> CompareAs(Receiver& receiver, const std::string& id,
                                  const std::string& dest, const std::string& content) {
    v1::PeerMessage request;
    v1::OpenRequest* open = request.mutable_open();
    open->set_transfer_id(id);
    open->set_export_name("ckpt");
    open->set_dest_path(dest);
    open->set_single_file(true);
    open->set_skip_unchanged(true);
    open->set_compare_content(true);
    v1::Manifest* m = open->mutable_manifest();
    m->set_chunk_size(64 << 10);
    v1::ManifestFile* f = m->add_files();
    f->set_path(dest.substr(dest.rfind('/') + 1));
    f->set_size(content.size());
    f->set_mode(0644);
    const auto digest =
        storage::HashBytes(
            absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(content.data()), content.size()))
            .ToBytes();
    f->set_content_xxh128(digest.data(), digest.size());
    v1::PeerMessage answer = Call(receiver, "site-a", id, request);
    EXPECT_EQ(answer.error(), "");
    return {answer.open_reply().unchanged_files().begin(),
            answer.open_reply().unchanged_files().end()};
  }

  static constexpr char kSecret[] = "pin 4711";
};

TEST_F(ReceiverContentCheckTest, AWriterLearnsNothingOfAFileItNeitherPublishedNorMayRead) {
  fs_->PutFile(export_ + "/ckpt/secret", kSecret);
  Receiver receiver(options_, *journal_, *fs_);
  EXPECT_TRUE(CompareAs(receiver, "t-guess-1", "ckpt/secret", "pin 0000").empty());
  EXPECT_TRUE(CompareAs(receiver, "t-guess-2", "ckpt/secret", kSecret).empty());
}

TEST_F(ReceiverContentCheckTest, AReaderOfTheExportComparesAnyFile) {
  fs_->PutFile(export_ + "/ckpt/secret", kSecret);
  options_.exports[0].readers = {"site-a"};
  Receiver receiver(options_, *journal_, *fs_);
  EXPECT_TRUE(CompareAs(receiver, "t-1", "ckpt/secret", "pin 0000").empty());
  EXPECT_EQ(CompareAs(receiver, "t-2", "ckpt/secret", kSecret), std::vector<uint32_t>{0});
}

TEST_F(ReceiverContentCheckTest, APublisherComparesWhatItPublished) {
  v1::IncomingTransfer published = record_;
  published.set_id("t-published");
  published.set_dest_path("ckpt/step");
  published.set_state(v1::IncomingTransfer::PUBLISHED);
  ASSERT_TRUE(journal_->PutIncoming(published).ok());  // site-a's ckpt/step, which exists
  Receiver receiver(options_, *journal_, *fs_);
  EXPECT_EQ(CompareAs(receiver, "t-1", "ckpt/step/.metadata", "old marker"),
            std::vector<uint32_t>{0});
  EXPECT_TRUE(CompareAs(receiver, "t-2", "ckpt/step/.metadata", "new marker").empty());
}

// Past its budget of bytes read, a peer's files are sent, not compared.
TEST_F(ReceiverContentCheckTest, FilesPastThePeersBudgetAreSentInsteadOfCompared) {
  fs_->PutFile(export_ + "/ckpt/secret", kSecret);
  options_.exports[0].readers = {"site-a"};
  options_.content_check_bytes_per_second = 1;  // 60 bytes saved up
  FakeClock clock;
  Receiver receiver(options_, *journal_, *fs_, nullptr, clock);
  int compared = 0;
  for (int i = 0; i < 10; ++i) {
    compared += CompareAs(receiver, absl::StrCat("t-", i), "ckpt/secret", kSecret).size();
  }
  EXPECT_EQ(compared, 7);  // 60 bytes hold 7 reads of 8
  clock.Advance(TimeDelta::Seconds(8));
  EXPECT_EQ(CompareAs(receiver, "t-later", "ckpt/secret", kSecret), std::vector<uint32_t>{0});
}

// A refusal tells the peer what to fix in terms of this site's exports; the
// host's own paths (where an export lies, where a symlink points) are not
// the peer's business and stay in this site's log.
TEST_F(ReceiverAuthorizationTest, ARefusalNamesTheExportNeverTheHostPath) {
  storage::testing::MakeDirs(export_ + "/ckpt");
  ASSERT_EQ(::symlink("/etc", (export_ + "/ckpt/link").c_str()), 0);
  Receiver receiver(options_, *journal_, *fs_);
  v1::PeerMessage answer = OpenAs(receiver, "site-a", "t-link", "ckpt/link/x");
  EXPECT_NE(answer.error().find("ckpt:ckpt/link is a symlink"), std::string::npos)
      << answer.error();
  EXPECT_EQ(answer.error().find(export_), std::string::npos) << answer.error();
  EXPECT_EQ(answer.error().find("/etc"), std::string::npos) << answer.error();
}

// Which exports exist is told only as far as a site may write them: a
// missing export is refused in the same words as one that does not list
// the peer, and a refusal lists only the exports the peer may write.
TEST_F(ReceiverAuthorizationTest, AMissingExportIsRefusedLikeOneThatDoesNotListThePeer) {
  options_.exports.push_back({"secret", state_.Sub("secret"), {}, 0755, {}});
  storage::testing::MakeDirs(state_.Sub("secret"));
  Receiver receiver(options_, *journal_, *fs_);
  auto open_into = [&](const std::string& site, const std::string& export_name) {
    v1::PeerMessage request;
    v1::OpenRequest* open = request.mutable_open();
    open->set_transfer_id("t-" + site + "-" + export_name);
    open->set_export_name(export_name);
    open->set_dest_path("x");
    *open->mutable_manifest() = record_.manifest();
    return Call(receiver, site, open->transfer_id(), request);
  };
  const v1::PeerMessage missing = open_into("site-c", "nope");
  const v1::PeerMessage not_listed = open_into("site-c", "secret");
  EXPECT_EQ(missing.error_code(), not_listed.error_code());
  EXPECT_EQ(missing.error(),
            "site-c may not write into export nope of site-b: it is not one of the export's "
            "writers (exports[].writers in site-b's config)");
  EXPECT_EQ(not_listed.error(),
            "site-c may not write into export secret of site-b: it is not one of the export's "
            "writers (exports[].writers in site-b's config)");
  // A writer is told where it may write, and nothing of the rest.
  const v1::PeerMessage typo = open_into("site-a", "nope");
  EXPECT_NE(typo.error().find("site-a may write into ckpt"), std::string::npos) << typo.error();
  EXPECT_EQ(typo.error().find("secret"), std::string::npos) << typo.error();
}

TEST_F(ReceiverAuthorizationTest, AnExportWithoutWritersRefusesEveryone) {
  options_.exports[0].writers.clear();
  Receiver receiver(options_, *journal_, *fs_);
  for (const char* site : {"site-a", "site-c"}) {
    v1::PeerMessage answer = OpenAs(receiver, site, std::string("t-") + site, "ckpt/new");
    EXPECT_NE(answer.error().find(std::string(site) + " may not write into export ckpt"),
              std::string::npos)
        << answer.error();
  }
  EXPECT_EQ(fs_->Tree(export_ + "/.longhaul"), std::nullopt);
}

TEST_F(ReceiverAuthorizationTest, AWriterMayNotOpenInsideAnotherSitesPublishedDestination) {
  options_.exports[0].writers = {"site-a", "site-c"};
  v1::IncomingTransfer published = record_;
  published.set_id("t-published");
  published.set_state(v1::IncomingTransfer::PUBLISHED);
  ASSERT_TRUE(journal_->PutIncoming(published).ok());  // site-a's ckpt/step, which exists
  Receiver receiver(options_, *journal_, *fs_);
  v1::PeerMessage answer = OpenAs(receiver, "site-c", "t-c", "ckpt/step/.metadata");
  EXPECT_EQ(answer.error_code(), static_cast<int>(absl::StatusCode::kPermissionDenied));
  EXPECT_NE(answer.error().find("ckpt:ckpt/step was published by another site"), std::string::npos)
      << answer.error();
  EXPECT_EQ(answer.error().find("site-a"), std::string::npos) << answer.error();
  EXPECT_EQ(fs_->Tree(export_ + "/.longhaul"), std::nullopt);
  EXPECT_EQ(OpenAs(receiver, "site-c", "t-c2", "ckpt/other").error(), "");
}

// Which site owns a transfer is not another opener's business: an open of
// another site's transfer id is refused as its commit, abort and verify are.
TEST_F(ReceiverAuthorizationTest, AnOpenOfAnotherSitesTransferDoesNotNameItsOwner) {
  options_.exports[0].writers = {"site-a", "site-c"};
  Receiver receiver(options_, *journal_, *fs_);
  ASSERT_EQ(OpenAs(receiver, "site-a", "t-a", "ckpt/new").error(), "");
  const auto before = fs_->Tree(export_);
  v1::PeerMessage answer = OpenAs(receiver, "site-c", "t-a", "ckpt/new");
  EXPECT_EQ(answer.error(), "transfer t-a belongs to another site");
  EXPECT_EQ(answer.error_code(), static_cast<int>(absl::StatusCode::kPermissionDenied));
  EXPECT_FALSE(answer.has_open_reply());
  EXPECT_EQ(fs_->Tree(export_), before);
  auto record = journal_->GetIncoming("t-a");
  ASSERT_TRUE(record.ok() && record->has_value());
  EXPECT_EQ((*record)->source_site(), "site-a");
}

// A hostile writer's manifest with a symlink that would point, or make a
// later write go, outside the transferred tree: refused before anything is
// written, and the refusal says which entry.
TEST_F(ReceiverAuthorizationTest, AManifestSymlinkLeavingTheTreeIsRefusedAndNothingIsWritten) {
  Receiver receiver(options_, *journal_, *fs_);
  const auto before = fs_->Tree(export_);
  const std::vector<std::pair<std::string, std::string>> hostile = {{"evil", "../../etc"},
                                                                    {"evil", "/etc/passwd"},
                                                                    {"sub/evil", "../../x"},
                                                                    {"evil", "sub/../../x"}};
  int n = 0;
  for (const auto& [path, target] : hostile) {
    v1::PeerMessage request;
    v1::OpenRequest* open = request.mutable_open();
    const std::string id = absl::StrCat("t-evil-", n++);
    open->set_transfer_id(id);
    open->set_export_name("ckpt");
    open->set_dest_path("ckpt/new");
    *open->mutable_manifest() = record_.manifest();
    v1::ManifestSymlink* link = open->mutable_manifest()->add_symlinks();
    link->set_path(path);
    link->set_target(target);
    v1::PeerMessage answer = Call(receiver, "site-a", id, request);
    EXPECT_EQ(answer.error_code(), static_cast<int>(absl::StatusCode::kInvalidArgument))
        << path << " -> " << target;
    EXPECT_NE(answer.error().find("manifest symlink 0"), std::string::npos) << answer.error();
    EXPECT_FALSE(answer.retryable());
    EXPECT_EQ(fs_->Tree(export_), before);
  }
  // A symlink over the parent of a file of the manifest (a write to the file
  // would go through it).
  v1::PeerMessage request;
  v1::OpenRequest* open = request.mutable_open();
  open->set_transfer_id("t-over");
  open->set_export_name("ckpt");
  open->set_dest_path("ckpt/new");
  *open->mutable_manifest() = record_.manifest();
  v1::ManifestFile* below = open->mutable_manifest()->add_files();
  below->set_path("dir/file");
  v1::ManifestSymlink* link = open->mutable_manifest()->add_symlinks();
  link->set_path("dir");
  link->set_target("shard-0");
  v1::PeerMessage answer = Call(receiver, "site-a", "t-over", request);
  EXPECT_EQ(answer.error_code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
  EXPECT_NE(answer.error().find("is also a symlink"), std::string::npos) << answer.error();
  EXPECT_EQ(fs_->Tree(export_), before);
}

// A hostile writer's manifest whose hard links (ManifestFile.link_of) do not
// name an earlier, ordinary file of the same size and mode: refused at open,
// before anything is written. A well-formed one is accepted, and the answer
// says hard links are made.
TEST_F(ReceiverAuthorizationTest, AHostileHardLinkManifestIsRefusedAndNothingIsWritten) {
  Receiver receiver(options_, *journal_, *fs_);
  const auto before = fs_->Tree(export_);
  // record_: shard-0 (0), .metadata (1, another size); file 2 is shard-0's
  // size and mode, file 3 too.
  auto open_with = [&](const std::string& id, std::vector<uint32_t> link_of) {
    v1::PeerMessage request;
    v1::OpenRequest* open = request.mutable_open();
    open->set_transfer_id(id);
    open->set_export_name("ckpt");
    open->set_dest_path("ckpt/" + id);
    v1::Manifest* m = open->mutable_manifest();
    *m = record_.manifest();
    for (const char* path : {"again/shard-0", "shard-0-too"}) {
      v1::ManifestFile* f = m->add_files();
      *f = m->files(0);
      f->set_path(path);
    }
    for (size_t i = 0; i < link_of.size(); ++i) {
      m->mutable_files(static_cast<int>(i))->set_link_of(link_of[i]);
    }
    return Call(receiver, "site-a", id, request);
  };
  const std::vector<std::pair<std::string, std::vector<uint32_t>>> hostile = {
      {"forward", {3, 0, 0, 0}},         // shard-0 -> again/shard-0, later
      {"itself", {0, 0, 3, 0}},          // again/shard-0 -> itself
      {"chain", {0, 0, 1, 3}},           // shard-0-too -> again/shard-0, a link
      {"out-of-range", {0, 0, 0, 100}},  // no file 99
      {"size", {0, 0, 2, 0}},            // again/shard-0 -> .metadata, another size
  };
  for (const auto& [id, link_of] : hostile) {
    v1::PeerMessage answer = open_with(id, link_of);
    EXPECT_EQ(answer.error_code(), static_cast<int>(absl::StatusCode::kInvalidArgument)) << id;
    EXPECT_NE(answer.error().find("manifest refused: manifest file"), std::string::npos)
        << id << ": " << answer.error();
    EXPECT_NE(answer.error().find("hard link"), std::string::npos) << answer.error();
    EXPECT_FALSE(answer.retryable());
    EXPECT_EQ(fs_->Tree(export_), before) << id;
    auto record = journal_->GetIncoming(id);
    ASSERT_TRUE(record.ok());
    EXPECT_FALSE(record->has_value()) << id;
  }
  v1::PeerMessage good = open_with("linked", {0, 0, 1, 1});
  EXPECT_TRUE(good.error().empty()) << good.error();
  EXPECT_TRUE(good.open_reply().hard_links());
}

TEST_F(ReceiverAuthorizationTest, AnAbortFromASiteThatMayWriteNowhereLeavesNoRecord) {
  Receiver receiver(options_, *journal_, *fs_);
  v1::PeerMessage abort;
  abort.mutable_abort()->set_transfer_id("t-unknown");
  EXPECT_EQ(Call(receiver, "site-c", "t-unknown", abort).error(), "");
  auto record = journal_->GetIncoming("t-unknown");
  ASSERT_TRUE(record.ok());
  EXPECT_FALSE(record->has_value());
  // A writer's abort of a transfer not opened yet leaves its tombstone.
  EXPECT_EQ(Call(receiver, "site-a", "t-unknown", abort).error(), "");
  record = journal_->GetIncoming("t-unknown");
  ASSERT_TRUE(record.ok() && record->has_value());
  EXPECT_EQ((*record)->state(), v1::IncomingTransfer::ABORTED);
}

// Sends chunk 0 of file 0 ("shard-0") of `id` as `site` on a DATA channel;
// returns the receiver's ack.
absl::StatusOr<wire::ChunkAck> SendShard0(Receiver& receiver, const std::string& site,
                                          const std::string& id) {
  const std::string data = "new shard-0";
  absl::Span<const uint8_t> bytes(reinterpret_cast<const uint8_t*>(data.data()), data.size());
  storage::Xxh128 digest = storage::HashBytes(bytes);
  std::array<uint8_t, wire::kChunkHeaderSize> header;
  wire::EncodeChunkHeader({0, 0, 0, digest.low, digest.high}, header);
  ChannelPair pair = MakeChannelPair("site-b", site);
  absl::Span<const uint8_t> header_part(header);
  if (absl::Status s = wire::SendFrame(*pair.a, wire::FrameType::kChunk, wire::SessionIdFor(id),
                                       {header_part, bytes});
      !s.ok()) {
    return s;
  }
  pair.a->Close();
  v1::Hello hello;
  hello.set_role(v1::Hello::DATA);
  hello.set_transfer_id(id);
  receiver.Serve(std::move(pair.b), hello);
  auto frame = wire::ReadFrameHeader(*pair.a, wire::kChunkAckFixedSize + wire::kMaxAckMessage);
  if (!frame.ok()) return frame.status();
  std::vector<uint8_t> payload(frame->payload_length);
  if (absl::Status s = pair.a->ReadExactly(absl::MakeSpan(payload)); !s.ok()) return s;
  return wire::ParseChunkAck(payload);
}

TEST_F(ReceiverAuthorizationTest, AChunkPastThePeersMemoryBudgetIsAnsweredRetryLater) {
  PeerMemoryBudget budget(1 << 20);
  Receiver receiver(options_, *journal_, *fs_, &budget);
  v1::PeerMessage opened = OpenAs(receiver, "site-a", "t-mem", "ckpt/mem");
  ASSERT_TRUE(opened.error().empty()) << opened.error();
  // The peer's other streams hold all but a few bytes of its budget.
  ASSERT_TRUE(budget.TryReserve("site-a", (1 << 20) - 4));

  auto ack = SendShard0(receiver, "site-a", "t-mem");
  ASSERT_TRUE(ack.ok()) << ack.status();
  EXPECT_EQ(ack->result, wire::ChunkAck::Result::kRetryLater);
  EXPECT_NE(ack->message.find("peer_limits.memory_per_peer"), std::string::npos) << ack->message;
  EXPECT_EQ(budget.used("site-a"), (1u << 20) - 4);
  // Another site's budget is its own.
  EXPECT_EQ(budget.used("site-c"), 0u);

  // Once the other streams let go, the chunk is read and stored, and the
  // stream's buffer is given back when it ends.
  budget.Release("site-a", (1 << 20) - 4);
  ack = SendShard0(receiver, "site-a", "t-mem");
  ASSERT_TRUE(ack.ok()) << ack.status();
  EXPECT_EQ(ack->result, wire::ChunkAck::Result::kDurable) << ack->message;
  EXPECT_EQ(budget.used("site-a"), 0u);
}

// Expiry of abandoned transfers and of ended records, on a wall clock the
// test moves.
class ReceiverExpiryTest : public ReceiverAuthorizationTest {
 protected:
  void SetUp() override {
    ReceiverAuthorizationTest::SetUp();
    ASSERT_TRUE(journal_->DeleteIncoming("t1").ok());
    options_.incoming_expiry = kExpiry;
    receiver_ = std::make_unique<Receiver>(options_, *journal_, *fs_, nullptr, clock_);
  }

  std::optional<v1::IncomingTransfer> Record(const std::string& id) {
    auto record = journal_->GetIncoming(id);
    EXPECT_TRUE(record.ok()) << record.status();
    return record.ok() ? *record : std::nullopt;
  }

  bool Staged(const std::string& id) {
    return fs_->Tree(export_ + "/.longhaul/staging/" + id).has_value();
  }

  // Moves the wall clock the receiver dates records by.
  void Pass(absl::Duration d) {
    clock_.Advance(TimeDelta::Nanoseconds(absl::ToInt64Nanoseconds(d)));
  }

  static constexpr absl::Duration kExpiry = absl::Hours(1);
  FakeClock clock_;
  std::unique_ptr<Receiver> receiver_;
};

TEST_F(ReceiverExpiryTest, AnAbandonedTransferExpiresOnlyAfterItsIdleTime) {
  ASSERT_EQ(OpenAs(*receiver_, "site-a", "t-x", "ckpt/new").error(), "");
  storage::ChunkDurability chunk;
  chunk.chunk.set_size(1);
  ASSERT_TRUE(journal_->RecordDurableChunks("t-x", {chunk}).ok());
  ASSERT_TRUE(Staged("t-x"));

  Pass(kExpiry - absl::Minutes(1));
  EXPECT_EQ(receiver_->ExpireAbandoned(), 0u);
  // An open is activity: the expiry counts from it.
  ASSERT_EQ(OpenAs(*receiver_, "site-a", "t-x", "ckpt/new").error(), "");
  Pass(kExpiry - absl::Minutes(1));
  EXPECT_EQ(receiver_->ExpireAbandoned(), 0u);
  EXPECT_EQ(Record("t-x")->state(), v1::IncomingTransfer::RECEIVING);
  EXPECT_TRUE(Staged("t-x"));

  Pass(absl::Minutes(1));
  EXPECT_EQ(receiver_->ExpireAbandoned(), 1u);
  std::optional<v1::IncomingTransfer> expired = Record("t-x");
  ASSERT_TRUE(expired.has_value());
  EXPECT_EQ(expired->state(), v1::IncomingTransfer::EXPIRED);
  EXPECT_EQ(expired->manifest().files_size(), 0);
  EXPECT_EQ(expired->expired_files(), 2u);
  EXPECT_EQ(expired->expired_bytes(),
            record_.manifest().files(0).size() + record_.manifest().files(1).size());
  EXPECT_EQ(expired->ended_unix_ms(), absl::ToUnixMillis(clock_.WallNow()));
  EXPECT_TRUE(journal_->ListDurableChunks("t-x")->empty());
  EXPECT_FALSE(Staged("t-x"));

  // Its sender coming back is told, and nothing is staged for it.
  v1::PeerMessage late = OpenAs(*receiver_, "site-a", "t-x", "ckpt/new");
  EXPECT_EQ(late.error_code(), static_cast<int>(absl::StatusCode::kFailedPrecondition));
  EXPECT_NE(late.error().find("expired at site-b"), std::string::npos) << late.error();
  EXPECT_FALSE(Staged("t-x"));

  // The EXPIRED record goes one expiry later; an open then starts over.
  Pass(kExpiry - absl::Minutes(1));
  EXPECT_EQ(receiver_->ExpireAbandoned(), 0u);
  Pass(absl::Minutes(1));
  EXPECT_EQ(receiver_->ExpireAbandoned(), 1u);
  EXPECT_FALSE(Record("t-x").has_value());
  v1::PeerMessage again = OpenAs(*receiver_, "site-a", "t-x", "ckpt/new");
  EXPECT_EQ(again.error(), "");
  EXPECT_EQ(again.open_reply().durable_size(), 0);
}

TEST_F(ReceiverExpiryTest, ATransferWithADataChannelOpenIsActive) {
  ASSERT_EQ(OpenAs(*receiver_, "site-a", "t-busy", "ckpt/new").error(), "");
  // A data channel on which nothing arrives: the receiver waits in its
  // first read until the sender closes it.
  ChannelPair pair = MakeChannelPair("site-b", "site-a");
  FakeChannel* served = pair.b.get();
  v1::Hello hello;
  hello.set_role(v1::Hello::DATA);
  hello.set_transfer_id("t-busy");
  std::thread serve(
      [&, channel = std::move(pair.b)]() mutable { receiver_->Serve(std::move(channel), hello); });
  ASSERT_TRUE(served->WaitForBlockedRead(absl::Seconds(30)));

  // Busy for two expiries without a new open: never expired, and its
  // activity is persisted so a restart would not find it stale.
  Pass(kExpiry);
  EXPECT_EQ(receiver_->ExpireAbandoned(), 0u);
  EXPECT_EQ(Record("t-busy")->active_unix_ms(), absl::ToUnixMillis(clock_.WallNow()));
  Pass(kExpiry);
  EXPECT_EQ(receiver_->ExpireAbandoned(), 0u);
  EXPECT_EQ(Record("t-busy")->state(), v1::IncomingTransfer::RECEIVING);
  EXPECT_TRUE(Staged("t-busy"));

  pair.a->Close();
  serve.join();
  Pass(kExpiry);
  EXPECT_EQ(receiver_->ExpireAbandoned(), 1u);
  EXPECT_EQ(Record("t-busy")->state(), v1::IncomingTransfer::EXPIRED);
  EXPECT_FALSE(Staged("t-busy"));
}

TEST_F(ReceiverExpiryTest, AbortTombstonesAgeOutAfterTheSameTime) {
  v1::PeerMessage abort;
  abort.mutable_abort()->set_transfer_id("t-gone");
  ASSERT_EQ(Call(*receiver_, "site-a", "t-gone", abort).error(), "");
  ASSERT_EQ(Record("t-gone")->state(), v1::IncomingTransfer::ABORTED);

  Pass(kExpiry - absl::Minutes(1));
  EXPECT_EQ(receiver_->ExpireAbandoned(), 0u);
  EXPECT_NE(OpenAs(*receiver_, "site-a", "t-gone", "ckpt/new").error().find("was cancelled"),
            std::string::npos);
  Pass(absl::Minutes(1));
  EXPECT_EQ(receiver_->ExpireAbandoned(), 1u);
  EXPECT_FALSE(Record("t-gone").has_value());
  EXPECT_EQ(OpenAs(*receiver_, "site-a", "t-gone", "ckpt/new").error(), "");
}

TEST_F(ReceiverExpiryTest, AnUndatedTombstoneAgesFromTheFirstPassThatSeesIt) {
  v1::IncomingTransfer old;
  old.set_id("t-old");
  old.set_source_site("site-a");
  old.set_state(v1::IncomingTransfer::ABORTED);
  ASSERT_TRUE(journal_->PutIncoming(old).ok());
  EXPECT_EQ(receiver_->ExpireAbandoned(), 0u);
  EXPECT_EQ(Record("t-old")->ended_unix_ms(), absl::ToUnixMillis(clock_.WallNow()));
  Pass(kExpiry);
  EXPECT_EQ(receiver_->ExpireAbandoned(), 1u);
  EXPECT_FALSE(Record("t-old").has_value());
}

// A cancel whose staging cannot be removed at once (a full or failing file
// system) is journaled ABORTED all the same, and the sweep removes the
// staging later; so is any staging no live transfer owns.
TEST_F(ReceiverExpiryTest, AnAbortWhoseStagingCannotBeRemovedIsRemovedByTheSweep) {
  ASSERT_EQ(OpenAs(*receiver_, "site-a", "t-full", "ckpt/new").error(), "");
  ASSERT_TRUE(Staged("t-full"));
  fs_->CrashAtStep(1);  // the removal's first step fails, and every one after it
  v1::PeerMessage abort;
  abort.mutable_abort()->set_transfer_id("t-full");
  EXPECT_EQ(Call(*receiver_, "site-a", "t-full", abort).error(), "");
  EXPECT_EQ(Record("t-full")->state(), v1::IncomingTransfer::ABORTED);
  EXPECT_TRUE(journal_->ListDurableChunks("t-full")->empty());
  fs_->RestartAfter(FaultInjectionFileSystem::Restart::kProcessCrash);
  ASSERT_TRUE(Staged("t-full"));

  EXPECT_EQ(receiver_->RemoveStrayStaging(), 1u);
  EXPECT_FALSE(Staged("t-full"));
  EXPECT_EQ(receiver_->RemoveStrayStaging(), 0u);
}

TEST_F(ReceiverExpiryTest, TheSweepRemovesStagingThatNoReceivingTransferOwns) {
  ASSERT_EQ(OpenAs(*receiver_, "site-a", "t-live", "ckpt/live").error(), "");
  // Left by an open that failed before journaling its record.
  fs_->MakeDirs(export_ + "/.longhaul/staging/t-orphan/f");
  fs_->PutFile(export_ + "/.longhaul/staging/t-orphan/f/0", "partial");
  // Left by a crash right after journaling an abort, or a publish.
  for (auto [id, state] : {std::pair{"t-aborted", v1::IncomingTransfer::ABORTED},
                           std::pair{"t-published", v1::IncomingTransfer::PUBLISHED}}) {
    v1::IncomingTransfer ended = record_;
    ended.set_id(id);
    ended.set_state(state);
    ASSERT_TRUE(journal_->PutIncoming(ended).ok());
    fs_->MakeDirs(export_ + "/.longhaul/staging/" + id + "/f");
  }

  EXPECT_EQ(receiver_->RemoveStrayStaging(), 3u);
  EXPECT_FALSE(Staged("t-orphan"));
  EXPECT_FALSE(Staged("t-aborted"));
  EXPECT_FALSE(Staged("t-published"));
  EXPECT_TRUE(Staged("t-live"));  // still receiving: kept
  EXPECT_EQ(Record("t-live")->state(), v1::IncomingTransfer::RECEIVING);
  // The live transfer carries on.
  auto ack = SendShard0(*receiver_, "site-a", "t-live");
  ASSERT_TRUE(ack.ok()) << ack.status();
  EXPECT_EQ(ack->result, wire::ChunkAck::Result::kDurable) << ack->message;
}

// Chunks received in durable pieces on the real file system (direct I/O
// and io_uring paths; ReceiverPowerLossTest runs them on the fault-injecting
// one): a chunk cut after 2 of its 4 pieces, a restart, and the rest sent
// from the durable prefix.
class ReceiverPiecesTest : public ReceiverAuthorizationTest {
 protected:
  static constexpr uint64_t kPiece = Receiver::kDurablePiece;
  static constexpr uint64_t kChunk = 4 * kPiece;

  void SetUp() override {
    ReceiverAuthorizationTest::SetUp();
    data_.resize(kChunk);
    uint64_t x = 0x9E3779B97F4A7C15ull;
    for (uint8_t& b : data_) {
      x ^= x << 13;
      x ^= x >> 7;
      x ^= x << 17;
      b = static_cast<uint8_t>(x);
    }
    digest_ = storage::HashBytes(data_);
    manifest_.set_chunk_size(kChunk);
    v1::ManifestFile* f = manifest_.add_files();
    f->set_path("shard-0");
    f->set_size(kChunk);
    f->set_mode(0644);
    f->set_mtime_ns(1700000000000000000);
  }

  // The journal may write through fillable_env_, which goes first.
  void TearDown() override { journal_.reset(); }

  std::unique_ptr<Receiver> Start() {
    return std::make_unique<Receiver>(options_, *journal_, *pieces_fs_);
  }

  v1::OpenReply Open(Receiver& receiver, bool durable_pieces = true) {
    v1::PeerMessage request;
    v1::OpenRequest* open = request.mutable_open();
    open->set_transfer_id(kId);
    open->set_export_name("ckpt");
    open->set_dest_path("pieces");
    open->set_durable_pieces(durable_pieces);
    *open->mutable_manifest() = manifest_;
    v1::PeerMessage answer = Call(receiver, "site-a", kId, request);
    EXPECT_EQ(answer.error(), "");
    return answer.open_reply();
  }

  // One chunk frame of chunk 0 (of file `file_index`) from byte `offset`
  // with the whole chunk's digest, of which only `sent` payload bytes arrive
  // before the stream ends.
  std::vector<uint8_t> ChunkFrame(uint64_t offset, uint64_t sent, uint32_t file_index = 0) {
    std::array<uint8_t, wire::kChunkHeaderSize> header;
    wire::EncodeChunkHeader(
        {file_index, 0, 0, digest_.low, digest_.high, static_cast<uint32_t>(offset)}, header);
    std::array<uint8_t, wire::kFrameHeaderSize> frame;
    wire::EncodeFrameHeader(
        {wire::FrameType::kChunk, static_cast<uint32_t>(wire::kChunkHeaderSize + kChunk - offset),
         wire::SessionIdFor(kId)},
        frame);
    std::vector<uint8_t> bytes(frame.size() + header.size() + sent);
    auto end = std::copy(frame.begin(), frame.end(), bytes.begin());
    end = std::copy(header.begin(), header.end(), end);
    std::copy_n(data_.begin() + offset, sent, end);
    return bytes;
  }

  // What the receiver answered on a data channel: progress reports (as
  // durable byte counts) and acks, in order.
  struct Answers {
    std::vector<uint64_t> progress;
    std::vector<wire::ChunkAck> acks;
  };
  Answers Serve(Receiver& receiver, std::vector<uint8_t> script) {
    v1::Hello hello;
    hello.set_role(v1::Hello::DATA);
    hello.set_transfer_id(kId);
    std::unique_ptr<FakeChannel> answered = ServeBytes(receiver, "site-a", hello, script);
    Answers answers;
    while (true) {
      auto frame =
          wire::ReadFrameHeader(*answered, wire::kChunkAckFixedSize + wire::kMaxAckMessage);
      if (!frame.ok()) break;
      std::vector<uint8_t> payload(frame->payload_length);
      EXPECT_TRUE(answered->ReadExactly(absl::MakeSpan(payload)).ok());
      if (frame->type == wire::FrameType::kChunkProgress) {
        auto progress = wire::ParseChunkProgress(payload);
        EXPECT_TRUE(progress.ok()) << progress.status();
        if (progress.ok()) answers.progress.push_back(progress->durable_bytes);
      } else {
        auto ack = wire::ParseChunkAck(payload);
        EXPECT_TRUE(ack.ok()) << ack.status();
        if (ack.ok()) answers.acks.push_back(*ack);
      }
    }
    return answers;
  }

  std::string StagedPath() const { return export_ + "/.longhaul/staging/" + kId + "/f/0"; }

  // Opens the transfer and has its one chunk acknowledged durable.
  void ReceiveTheChunk(Receiver& receiver) {
    Open(receiver);
    Answers answers = Serve(receiver, ChunkFrame(0, kChunk));
    ASSERT_EQ(answers.acks.size(), 1u);
    ASSERT_EQ(answers.acks[0].result, wire::ChunkAck::Result::kDurable) << answers.acks[0].message;
  }

  // A publish that ran to its end but whose PUBLISHED record could not be
  // journaled (a full state disk): the journal still says RECEIVING, and the
  // staging holds only its `installing` record.
  void PublishWithoutJournaling() {
    storage::ResolvedDestination dest{export_, "pieces", export_ + "/pieces"};
    auto staging = storage::Staging::Open(*pieces_fs_, dest, kId);
    ASSERT_TRUE(staging.ok()) << staging.status();
    ASSERT_TRUE(staging->Publish(manifest_, {}).ok());
  }

  // The journal again, on a disk the test can fill.
  void UseFillableJournal() {
    fillable_ = std::make_shared<storage::testing::FillableFileSystem>();
    fillable_env_ = rocksdb::NewCompositeEnv(fillable_);
    journal_.reset();
    auto journal = storage::Journal::Open(state_.Sub("journal"), {.env = fillable_env_.get()});
    ASSERT_TRUE(journal.ok()) << journal.status();
    journal_ = std::move(*journal);
  }

  void ExpectPublishedAndStagingGone() {
    auto record = journal_->GetIncoming(kId);
    ASSERT_TRUE(record.ok() && record->has_value());
    EXPECT_EQ((*record)->state(), v1::IncomingTransfer::PUBLISHED);
    EXPECT_FALSE(std::filesystem::exists(export_ + "/.longhaul/staging/" + kId));
  }

  // Cuts the stream after 2 of the chunk's 4 pieces and a bit of the third.
  void SendHalfAndCut() {
    std::unique_ptr<Receiver> receiver = Start();
    v1::OpenReply reply = Open(*receiver);
    EXPECT_EQ(reply.durable_piece(), kPiece);
    EXPECT_EQ(reply.partial_size(), 0);
    Answers answers = Serve(*receiver, ChunkFrame(0, 2 * kPiece + 1000));
    EXPECT_EQ(answers.progress, (std::vector<uint64_t>{kPiece, 2 * kPiece}));
    EXPECT_TRUE(answers.acks.empty());
  }

  static constexpr char kId[] = "t-pieces";
  std::shared_ptr<storage::testing::FillableFileSystem> fillable_;
  std::unique_ptr<rocksdb::Env> fillable_env_;
  storage::FileSystem* pieces_fs_ = &storage::PosixFileSystem();
  v1::Manifest manifest_;
  std::vector<uint8_t> data_;
  storage::Xxh128 digest_;
};

TEST_F(ReceiverPiecesTest, TheSendersOpenAfterAPublishTheJournalMissedFinishesIt) {
  UseFillableJournal();
  std::unique_ptr<Receiver> receiver = Start();
  ReceiveTheChunk(*receiver);
  // The state disk fills as the commit publishes: the version is installed,
  // its PUBLISHED record is not journaled, and the commit fails.
  fillable_->set_full(true);
  v1::PeerMessage commit;
  commit.mutable_commit()->set_transfer_id(kId);
  EXPECT_NE(Call(*receiver, "site-a", kId, commit).error(), "");
  fillable_->set_full(false);
  // The sender opens again once the disk has room: the publish is finished,
  // not received again.
  v1::OpenReply reply = Open(*receiver);
  EXPECT_EQ(reply.durable_size(), 1);
  ExpectPublishedAndStagingGone();
  EXPECT_EQ(Call(*receiver, "site-a", kId, commit).error(), "");
  EXPECT_TRUE(storage::testing::ReadFile(export_ + "/pieces/shard-0") ==
              std::string(data_.begin(), data_.end()));
}

TEST_F(ReceiverPiecesTest, ARestartFinishesAnUnjournaledPublishThatANewerOneReplaced) {
  {
    std::unique_ptr<Receiver> receiver = Start();
    ReceiveTheChunk(*receiver);
  }
  PublishWithoutJournaling();
  // Another transfer publishes a newer version over the same path.
  std::filesystem::remove_all(export_ + "/pieces");
  storage::testing::MakeDirs(export_ + "/pieces");
  storage::testing::WriteFile(export_ + "/pieces/newer", "newer");

  std::unique_ptr<Receiver> receiver = Start();
  receiver->FinishInterruptedPublishes();
  ExpectPublishedAndStagingGone();
  EXPECT_TRUE(std::filesystem::exists(export_ + "/pieces/newer"));
  EXPECT_FALSE(std::filesystem::exists(export_ + "/pieces/shard-0"));
}

TEST_F(ReceiverPiecesTest, AChunkCutAfterTwoPiecesResumesFromItsDurablePrefix) {
  SendHalfAndCut();
  auto partial = journal_->ListPartialChunks(kId);
  ASSERT_TRUE(partial.ok()) << partial.status();
  ASSERT_EQ(partial->size(), 1u);
  EXPECT_EQ((*partial)[0].prefix_bytes, 2 * kPiece);
  auto whole = journal_->ListDurableChunks(kId);
  ASSERT_TRUE(whole.ok());
  EXPECT_TRUE(whole->empty());  // a prefix is never reported as a chunk

  // Restarted: the open reports the prefix, and the rest arrives from there.
  std::unique_ptr<Receiver> receiver = Start();
  v1::OpenReply reply = Open(*receiver);
  EXPECT_EQ(reply.durable_size(), 0);
  ASSERT_EQ(reply.partial_size(), 1);
  EXPECT_EQ(reply.partial(0).durable_bytes(), 2 * kPiece);
  Answers answers = Serve(*receiver, ChunkFrame(2 * kPiece, kChunk - 2 * kPiece));
  EXPECT_EQ(answers.progress, (std::vector<uint64_t>{3 * kPiece}));
  ASSERT_EQ(answers.acks.size(), 1u);
  EXPECT_EQ(answers.acks[0].result, wire::ChunkAck::Result::kDurable) << answers.acks[0].message;

  whole = journal_->ListDurableChunks(kId);
  ASSERT_TRUE(whole.ok());
  ASSERT_EQ(whole->size(), 1u);
  EXPECT_EQ(storage::Xxh128::FromBytes((*whole)[0].chunk.xxh128()), digest_);
  partial = journal_->ListPartialChunks(kId);
  ASSERT_TRUE(partial.ok());
  EXPECT_TRUE(partial->empty());
  const std::string staged = storage::testing::ReadFile(StagedPath());
  EXPECT_TRUE(staged == std::string(data_.begin(), data_.end()));
  // The receiver takes it whole: a commit publishes it.
  v1::PeerMessage commit;
  commit.mutable_commit()->set_transfer_id(kId);
  EXPECT_EQ(Call(*receiver, "site-a", kId, commit).error(), "");
  EXPECT_TRUE(storage::testing::ReadFile(export_ + "/pieces/shard-0") ==
              std::string(data_.begin(), data_.end()));
}

// A hard link (ManifestFile.link_of) has no chunks: one sent for it is
// refused. Its target's chunks make both names, published as one file.
TEST_F(ReceiverPiecesTest, AHardLinkTakesNoChunkAndIsPublishedAsItsTargetsFile) {
  v1::ManifestFile* link = manifest_.add_files();
  *link = manifest_.files(0);
  link->set_path("again/shard-0");
  link->set_link_of(1);
  std::unique_ptr<Receiver> receiver = Start();
  v1::OpenReply reply = Open(*receiver);
  EXPECT_TRUE(reply.hard_links());
  Answers refused = Serve(*receiver, ChunkFrame(0, kChunk, /*file_index=*/1));
  ASSERT_EQ(refused.acks.size(), 1u);
  EXPECT_EQ(refused.acks[0].result, wire::ChunkAck::Result::kRefused);
  EXPECT_NE(refused.acks[0].message.find("hard link"), std::string::npos)
      << refused.acks[0].message;

  Answers answers = Serve(*receiver, ChunkFrame(0, kChunk));
  ASSERT_EQ(answers.acks.size(), 1u);
  EXPECT_EQ(answers.acks[0].result, wire::ChunkAck::Result::kDurable) << answers.acks[0].message;
  v1::PeerMessage commit;
  commit.mutable_commit()->set_transfer_id(kId);
  EXPECT_EQ(Call(*receiver, "site-a", kId, commit).error(), "");
  struct stat target, linked;
  ASSERT_EQ(stat((export_ + "/pieces/shard-0").c_str(), &target), 0);
  ASSERT_EQ(stat((export_ + "/pieces/again/shard-0").c_str(), &linked), 0);
  EXPECT_EQ(linked.st_ino, target.st_ino);
  EXPECT_TRUE(storage::testing::ReadFile(export_ + "/pieces/again/shard-0") ==
              std::string(data_.begin(), data_.end()));
}

TEST_F(ReceiverPiecesTest, ATamperedPrefixFailsTheDigestAndTheChunkIsSentAgainWhole) {
  SendHalfAndCut();
  {
    std::string staged = storage::testing::ReadFile(StagedPath());
    staged[kPiece + 17] ^= 0x40;
    storage::testing::WriteFile(StagedPath(), staged);
  }
  std::unique_ptr<Receiver> receiver = Start();
  v1::OpenReply reply = Open(*receiver);
  ASSERT_EQ(reply.partial_size(), 1);
  Answers answers = Serve(*receiver, ChunkFrame(2 * kPiece, kChunk - 2 * kPiece));
  ASSERT_EQ(answers.acks.size(), 1u);
  EXPECT_EQ(answers.acks[0].result, wire::ChunkAck::Result::kHashMismatch);
  EXPECT_EQ(receiver->stats().hash_mismatches, 1u);
  auto partial = journal_->ListPartialChunks(kId);
  ASSERT_TRUE(partial.ok());
  EXPECT_TRUE(partial->empty());
  auto whole = journal_->ListDurableChunks(kId);
  ASSERT_TRUE(whole.ok());
  EXPECT_TRUE(whole->empty());
  // Nothing is published meanwhile.
  v1::PeerMessage commit;
  commit.mutable_commit()->set_transfer_id(kId);
  EXPECT_NE(Call(*receiver, "site-a", kId, commit).error().find("not durable yet"),
            std::string::npos);
  EXPECT_FALSE(std::filesystem::exists(export_ + "/pieces"));
  // The prefix is gone: resuming from it is refused, sending from 0 is not.
  answers = Serve(*receiver, ChunkFrame(2 * kPiece, kChunk - 2 * kPiece));
  ASSERT_EQ(answers.acks.size(), 1u);
  EXPECT_EQ(answers.acks[0].result, wire::ChunkAck::Result::kRefused);
  answers = Serve(*receiver, ChunkFrame(0, kChunk));
  ASSERT_EQ(answers.acks.size(), 1u);
  EXPECT_EQ(answers.acks[0].result, wire::ChunkAck::Result::kDurable) << answers.acks[0].message;
  EXPECT_EQ(Call(*receiver, "site-a", kId, commit).error(), "");
  EXPECT_TRUE(storage::testing::ReadFile(export_ + "/pieces/shard-0") ==
              std::string(data_.begin(), data_.end()));
}

TEST_F(ReceiverPiecesTest, AFrameStartingElsewhereThanTheDurablePrefixIsRefused) {
  SendHalfAndCut();
  std::unique_ptr<Receiver> receiver = Start();
  Open(*receiver);
  Answers answers = Serve(*receiver, ChunkFrame(kPiece, kChunk - kPiece));
  ASSERT_EQ(answers.acks.size(), 1u);
  EXPECT_EQ(answers.acks[0].result, wire::ChunkAck::Result::kRefused);
  EXPECT_NE(answers.acks[0].message.find("must start at 0 or there"), std::string::npos)
      << answers.acks[0].message;
  EXPECT_TRUE(answers.progress.empty());
  // The prefix is still there for a frame that starts right.
  auto partial = journal_->ListPartialChunks(kId);
  ASSERT_TRUE(partial.ok());
  ASSERT_EQ(partial->size(), 1u);
  EXPECT_EQ((*partial)[0].prefix_bytes, 2 * kPiece);
}

TEST_F(ReceiverPiecesTest, ASenderWithoutPiecesGetsWholeChunkAcksOnly) {
  SendHalfAndCut();  // a prefix is durable
  std::unique_ptr<Receiver> receiver = Start();
  v1::OpenReply reply = Open(*receiver, /*durable_pieces=*/false);
  EXPECT_EQ(reply.durable_piece(), 0u);
  EXPECT_EQ(reply.partial_size(), 0);
  // Resuming is not offered, so a frame from the prefix is refused.
  Answers answers = Serve(*receiver, ChunkFrame(2 * kPiece, kChunk - 2 * kPiece));
  ASSERT_EQ(answers.acks.size(), 1u);
  EXPECT_EQ(answers.acks[0].result, wire::ChunkAck::Result::kRefused);
  answers = Serve(*receiver, ChunkFrame(0, kChunk));
  EXPECT_TRUE(answers.progress.empty());
  ASSERT_EQ(answers.acks.size(), 1u);
  EXPECT_EQ(answers.acks[0].result, wire::ChunkAck::Result::kDurable) << answers.acks[0].message;
}

// The same data path on the fault-injecting file system, whose power loss
// drops every byte not made durable: what the Receiver reported durable, or
// acknowledged, must survive one. (The journal is RocksDB on disk, synced,
// so it keeps its records as a real one would.)
class ReceiverPowerLossTest : public ReceiverPiecesTest {
 protected:
  void SetUp() override {
    ReceiverPiecesTest::SetUp();
    pieces_fs_ = fs_.get();
  }

  void PowerLoss() { fs_->RestartAfter(FaultInjectionFileSystem::Restart::kPowerLoss); }

  // The staged file as the fault file system holds it now ("" if absent).
  std::string Staged() const {
    auto tree = fs_->Tree(export_ + "/.longhaul/staging/" + kId);
    if (!tree) return "";
    auto it = tree->find("f/0");
    return it == tree->end() ? "" : it->second;
  }

  std::string Data(uint64_t from, uint64_t to) const {
    return std::string(data_.begin() + from, data_.begin() + to);
  }
};

TEST_F(ReceiverPowerLossTest, PiecesReportedDurableSurviveAPowerLossAndTheChunkResumesFromThem) {
  SendHalfAndCut();  // reported 2 pieces durable, then the stream broke
  PowerLoss();
  ASSERT_GE(Staged().size(), 2 * kPiece);
  EXPECT_TRUE(Staged().substr(0, 2 * kPiece) == Data(0, 2 * kPiece));

  std::unique_ptr<Receiver> receiver = Start();
  v1::OpenReply reply = Open(*receiver);
  ASSERT_EQ(reply.partial_size(), 1);
  EXPECT_EQ(reply.partial(0).durable_bytes(), 2 * kPiece);
  // The resumed chunk's digest covers the prefix read back from the fault
  // file system: had the prefix been lost, this would be a hash mismatch.
  Answers answers = Serve(*receiver, ChunkFrame(2 * kPiece, kChunk - 2 * kPiece));
  ASSERT_EQ(answers.acks.size(), 1u);
  EXPECT_EQ(answers.acks[0].result, wire::ChunkAck::Result::kDurable) << answers.acks[0].message;
}

TEST_F(ReceiverPowerLossTest, AnAcknowledgedChunkSurvivesAPowerLossAndPublishes) {
  {
    std::unique_ptr<Receiver> receiver = Start();
    Open(*receiver);
    Answers answers = Serve(*receiver, ChunkFrame(0, kChunk));
    ASSERT_EQ(answers.acks.size(), 1u);
    EXPECT_EQ(answers.acks[0].result, wire::ChunkAck::Result::kDurable) << answers.acks[0].message;
  }
  PowerLoss();
  EXPECT_TRUE(Staged() == Data(0, kChunk));

  std::unique_ptr<Receiver> receiver = Start();
  v1::OpenReply reply = Open(*receiver);
  EXPECT_EQ(reply.durable_size(), 1);
  v1::PeerMessage commit;
  commit.mutable_commit()->set_transfer_id(kId);
  EXPECT_EQ(Call(*receiver, "site-a", kId, commit).error(), "");
  receiver.reset();
  PowerLoss();  // a publish that answered is durable too
  auto published = fs_->Tree(export_ + "/pieces");
  ASSERT_TRUE(published.has_value());
  EXPECT_TRUE((*published)["shard-0"] == Data(0, kChunk));
}

TEST(ReceiverExpirySweepTest, SweepsTenTimesPerExpiryWithinBounds) {
  EXPECT_EQ(Receiver::ExpirySweepInterval(absl::Seconds(3)), absl::Milliseconds(300));
  EXPECT_EQ(Receiver::ExpirySweepInterval(absl::Hours(24 * 7)), absl::Hours(1));
  EXPECT_EQ(Receiver::ExpirySweepInterval(absl::Milliseconds(1)), absl::Milliseconds(100));
}

}  // namespace
}  // namespace longhaul::peer
