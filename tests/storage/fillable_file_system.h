// A rocksdb file system that runs out of space on demand, for tests of what
// a full state disk does to the journal and to those who write through it.
#ifndef LONGHAUL_TESTS_STORAGE_FILLABLE_FILE_SYSTEM_H_
#define LONGHAUL_TESTS_STORAGE_FILLABLE_FILE_SYSTEM_H_

#include <atomic>
#include <memory>
#include <string>

#include "rocksdb/file_system.h"

namespace longhaul::storage::testing {

// A file system on the real one that runs out of space on demand. While
// full, an append writes half of its bytes and fails with NoSpace, as
// write(2) does when the disk fills in the middle of a write, and free space
// reads 0 unless `reports_free` says otherwise.
class FillableFileSystem final : public rocksdb::FileSystemWrapper {
 public:
  FillableFileSystem() : FileSystemWrapper(rocksdb::FileSystem::Default()) {}
  const char* Name() const override { return "FillableFileSystem"; }

  void set_full(bool full, bool reports_free = false) {
    full_.store(full);
    reports_free_.store(reports_free);
  }

  rocksdb::IOStatus NewWritableFile(const std::string& name, const rocksdb::FileOptions& options,
                                    std::unique_ptr<rocksdb::FSWritableFile>* file,
                                    rocksdb::IODebugContext* dbg) override {
    rocksdb::IOStatus s = target()->NewWritableFile(name, options, file, dbg);
    if (s.ok()) *file = std::make_unique<File>(std::move(*file), full_);
    return s;
  }

  rocksdb::IOStatus GetFreeSpace(const std::string& path, const rocksdb::IOOptions& options,
                                 uint64_t* free_bytes, rocksdb::IODebugContext* dbg) override {
    if (full_.load() && !reports_free_.load()) {
      *free_bytes = 0;
      return rocksdb::IOStatus::OK();
    }
    return target()->GetFreeSpace(path, options, free_bytes, dbg);
  }

 private:
  class File final : public rocksdb::FSWritableFileOwnerWrapper {
   public:
    File(std::unique_ptr<rocksdb::FSWritableFile> file, const std::atomic<bool>& full)
        : FSWritableFileOwnerWrapper(std::move(file)), full_(full) {}
    rocksdb::IOStatus Append(const rocksdb::Slice& data, const rocksdb::IOOptions& options,
                             rocksdb::IODebugContext* dbg) override {
      if (!full_.load()) return target()->Append(data, options, dbg);
      target()
          ->Append(rocksdb::Slice(data.data(), data.size() / 2), options, dbg)
          .PermitUncheckedError();
      return rocksdb::IOStatus::NoSpace("While appending", "No space left on device");
    }
    rocksdb::IOStatus Append(const rocksdb::Slice& data, const rocksdb::IOOptions& options,
                             const rocksdb::DataVerificationInfo&,
                             rocksdb::IODebugContext* dbg) override {
      return Append(data, options, dbg);
    }

   private:
    const std::atomic<bool>& full_;
  };

  std::atomic<bool> full_{false};
  std::atomic<bool> reports_free_{false};
};

}  // namespace longhaul::storage::testing

#endif  // LONGHAUL_TESTS_STORAGE_FILLABLE_FILE_SYSTEM_H_
