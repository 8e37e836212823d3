// Helpers shared by the storage tests: temporary directories and files.
#ifndef LONGHAUL_TESTS_STORAGE_TEST_UTIL_H_
#define LONGHAUL_TESTS_STORAGE_TEST_UTIL_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "storage/file_io.h"

namespace longhaul::storage::testing {

// A fresh directory under $TEST_TMPDIR or /tmp, removed (recursively) on
// destruction.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string Sub(const std::string& rel) const { return path_ + "/" + rel; }

 private:
  std::string path_;
};

// A fresh directory on tmpfs /dev/shm, removed with what it holds.
class ShmDir {
 public:
  ShmDir();
  ~ShmDir();
  ShmDir(const ShmDir&) = delete;
  ShmDir& operator=(const ShmDir&) = delete;
  // Empty when /dev/shm is not a usable tmpfs here.
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Whether `path` is on tmpfs (which keeps file data in memory and, before
// Linux 6.6, refuses O_DIRECT).
bool IsTmpfs(const std::string& path);

// Deterministic pseudo-random bytes.
std::vector<uint8_t> Bytes(size_t n, uint32_t seed);
void WriteFile(const std::string& path, const std::vector<uint8_t>& data);
void WriteFile(const std::string& path, const std::string& data);
std::string ReadFile(const std::string& path);
void MakeDirs(const std::string& path);
bool Exists(const std::string& path);  // lstat

// The FileIo a parameterised test runs on: io_uring (an error where the
// kernel or sandbox does not offer it, for the test to skip on) or pread/pwrite.
absl::StatusOr<std::unique_ptr<FileIo>> FileIoUnderTest(bool io_uring);

}  // namespace longhaul::storage::testing

#endif  // LONGHAUL_TESTS_STORAGE_TEST_UTIL_H_
