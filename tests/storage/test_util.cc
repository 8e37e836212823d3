#include "tests/storage/test_util.h"

#include <linux/magic.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/vfs.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <system_error>

#include "gtest/gtest.h"

namespace longhaul::storage::testing {

TempDir::TempDir() {
  const char* base = getenv("TEST_TMPDIR");
  std::string tmpl = std::string(base != nullptr ? base : "/tmp") + "/longhaul-storage-XXXXXX";
  char* p = mkdtemp(tmpl.data());
  if (p == nullptr) ADD_FAILURE() << "mkdtemp failed";
  path_ = tmpl;
}

TempDir::~TempDir() {
  std::error_code ec;
  // Restore permissions a test may have removed, so removal works.
  for (auto it = std::filesystem::recursive_directory_iterator(path_, ec);
       !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec)) {
    if (it->is_directory(ec) && !it->is_symlink(ec)) {
      std::filesystem::permissions(it->path(), std::filesystem::perms::owner_all,
                                   std::filesystem::perm_options::add, ec);
    }
  }
  std::filesystem::remove_all(path_, ec);
}

bool IsTmpfs(const std::string& path) {
  struct statfs st;
  return statfs(path.c_str(), &st) == 0 && st.f_type == TMPFS_MAGIC;
}

ShmDir::ShmDir() {
  char tmpl[] = "/dev/shm/longhaul-storage-XXXXXX";
  if (IsTmpfs("/dev/shm") && mkdtemp(tmpl) != nullptr) path_ = tmpl;
}

ShmDir::~ShmDir() {
  std::error_code ignored;
  if (!path_.empty()) std::filesystem::remove_all(path_, ignored);
}

std::vector<uint8_t> Bytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> out(n);
  for (auto& b : out) b = static_cast<uint8_t>(rng());
  return out;
}

void WriteFile(const std::string& path, const std::vector<uint8_t>& data) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(data.data()), static_cast<std::streamsize>(data.size()));
  ASSERT_TRUE(f.good()) << path;
}

void WriteFile(const std::string& path, const std::string& data) {
  WriteFile(path, std::vector<uint8_t>(data.begin(), data.end()));
}

std::string ReadFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

void MakeDirs(const std::string& path) {
  std::error_code ec;
  std::filesystem::create_directories(path, ec);
  ASSERT_FALSE(ec) << path << ": " << ec.message();
}

bool Exists(const std::string& path) {
  struct stat st;
  return lstat(path.c_str(), &st) == 0;
}

absl::StatusOr<std::unique_ptr<FileIo>> FileIoUnderTest(bool io_uring) {
  if (!io_uring) return std::make_unique<PosixFileIo>();
  auto ring = IoUringFileIo::Create();
  if (!ring.ok()) return ring.status();
  return std::unique_ptr<FileIo>(*std::move(ring));
}

}  // namespace longhaul::storage::testing
