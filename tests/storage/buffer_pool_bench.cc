// storage_buffer_bench: the CPU cost of durable chunk writes from BufferPool
// buffers, with and without registering the pool with each thread's io_uring
// ring. Not a test (nothing is asserted); run it by hand:
//
//   build/bin/storage_buffer_bench [--dir=DIR] [--total_mib=2048] [--chunk_mib=16]
//                                  [--threads=8] [--rounds=2] [--direct=1] [--thp=1]
//
// Each round runs both modes, in alternating order. In a mode, every thread
// owns one ring and one pool buffer and writes its share of `total_mib` as
// chunks of `chunk_mib` into its own fresh sparse file in DIR (default
// $TEST_TMPDIR or /tmp), through the O_DIRECT descriptor when --direct=1,
// with an fdatasync after each chunk as the receiver does. Prints, per mode
// and round, the wall time, MiB/s and the process's CPU seconds (getrusage:
// user + system, which includes the ring's io-wq workers). --thp=0 keeps the
// pool on 4 KiB pages (MADV_NOHUGEPAGE), where pinning per request costs more.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "storage/buffer_pool.h"
#include "storage/file_io.h"

namespace longhaul::storage {
namespace {

struct Options {
  std::string dir;
  size_t total_mib = 2048;
  size_t chunk_mib = 16;
  int threads = 8;
  int rounds = 2;
  bool direct = true;
  bool thp = true;
};

bool ParseFlag(const char* arg, const char* name, std::string* value) {
  const size_t n = std::strlen(name);
  if (std::strncmp(arg, name, n) != 0 || arg[n] != '=') return false;
  *value = arg + n + 1;
  return true;
}

Options Parse(int argc, char** argv) {
  Options o;
  const char* tmp = std::getenv("TEST_TMPDIR");
  o.dir = tmp != nullptr ? tmp : "/tmp";
  for (int i = 1; i < argc; ++i) {
    std::string v;
    if (ParseFlag(argv[i], "--dir", &v)) {
      o.dir = v;
    } else if (ParseFlag(argv[i], "--total_mib", &v)) {
      o.total_mib = std::stoul(v);
    } else if (ParseFlag(argv[i], "--chunk_mib", &v)) {
      o.chunk_mib = std::stoul(v);
    } else if (ParseFlag(argv[i], "--threads", &v)) {
      o.threads = std::stoi(v);
    } else if (ParseFlag(argv[i], "--rounds", &v)) {
      o.rounds = std::stoi(v);
    } else if (ParseFlag(argv[i], "--direct", &v)) {
      o.direct = v != "0";
    } else if (ParseFlag(argv[i], "--thp", &v)) {
      o.thp = v != "0";
    } else {
      std::fprintf(stderr, "unknown argument %s (see the comment in buffer_pool_bench.cc)\n",
                   argv[i]);
      std::exit(2);
    }
  }
  return o;
}

double CpuSeconds() {
  rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
         static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

// The AnonHugePages line of /proc/self/smaps_rollup: how much of the
// process's anonymous memory (mostly the pool) is on transparent huge pages.
std::string HugePages() {
  FILE* f = std::fopen("/proc/self/smaps_rollup", "r");
  if (f == nullptr) return "AnonHugePages unknown";
  char line[256];
  std::string found = "AnonHugePages unknown";
  while (std::fgets(line, sizeof line, f) != nullptr) {
    if (std::strncmp(line, "AnonHugePages:", 14) == 0) {
      found = line;
      found.erase(found.find_last_not_of(" \n") + 1);
    }
  }
  std::fclose(f);
  return found;
}

[[noreturn]] void Die(const std::string& what, const absl::Status& status) {
  std::fprintf(stderr, "%s: %s\n", what.c_str(), status.ToString().c_str());
  std::exit(1);
}

// One thread's share: its chunks, each written then fdatasync'ed.
void WriteShare(const Options& o, BufferPool& pool, bool registered, int t, size_t chunks) {
  auto io = IoUringFileIo::Create();
  if (!io.ok()) Die("io_uring", io.status());
  if (registered) {
    absl::Status s = (*io)->RegisterBuffers(pool);
    if (!s.ok()) Die("registering the pool", s);
  }
  auto lease = pool.Acquire(absl::InfiniteDuration());
  if (!lease.ok()) Die("lease", lease.status());
  const std::string path =
      o.dir + "/storage_buffer_bench." + std::to_string(getpid()) + "." + std::to_string(t);
  const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) Die(path, absl::ErrnoToStatus(errno, "open"));
  unlink(path.c_str());
  const size_t chunk = lease->size();
  if (ftruncate(fd, static_cast<off_t>(chunks * chunk)) != 0) {
    Die(path, absl::ErrnoToStatus(errno, "ftruncate"));
  }
  int data_fd = fd;
  if (o.direct) {
    data_fd = open(("/proc/self/fd/" + std::to_string(fd)).c_str(), O_RDWR | O_DIRECT | O_CLOEXEC);
    if (data_fd < 0) Die(path, absl::ErrnoToStatus(errno, "open O_DIRECT"));
  }
  for (size_t c = 0; c < chunks; ++c) {
    absl::Status s = (*io)->WriteAt(data_fd, c * chunk, lease->span());
    if (s.ok()) s = (*io)->SyncData(fd);
    if (!s.ok()) Die(path, s);
  }
  const uint64_t expected = registered ? chunks * (chunk / FileIo::kSubBlockSize) : 0;
  if ((*io)->fixed_requests() != expected) {
    std::fprintf(stderr, "thread %d: %llu fixed requests, expected %llu\n", t,
                 static_cast<unsigned long long>((*io)->fixed_requests()),
                 static_cast<unsigned long long>(expected));
    std::exit(1);
  }
  if (data_fd != fd) close(data_fd);
  close(fd);
}

void RunMode(const Options& o, BufferPool& pool, bool registered, int round) {
  const size_t chunk = o.chunk_mib << 20;
  const size_t chunks_per_thread = (o.total_mib << 20) / chunk / static_cast<size_t>(o.threads);
  const double cpu0 = CpuSeconds();
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> threads;
  for (int t = 0; t < o.threads; ++t) {
    threads.emplace_back([&, t] { WriteShare(o, pool, registered, t, chunks_per_thread); });
  }
  for (auto& th : threads) th.join();
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double cpu = CpuSeconds() - cpu0;
  const double mib = static_cast<double>(chunks_per_thread * o.threads * o.chunk_mib);
  std::printf(
      "round %d %-10s %s threads=%d chunk=%zuMiB written=%.0fMiB wall=%.2fs %.0f MiB/s "
      "cpu=%.2fs %.2f cpu-s/GiB\n",
      round, registered ? "registered" : "plain", o.direct ? "O_DIRECT" : "buffered", o.threads,
      o.chunk_mib, mib, wall, mib / wall, cpu, cpu / (mib / 1024));
  std::fflush(stdout);
}

int Main(int argc, char** argv) {
  const Options o = Parse(argc, argv);
  if (o.threads < 1 || o.chunk_mib < 1) {
    std::fprintf(stderr, "--threads and --chunk_mib must be at least 1\n");
    return 2;
  }
  auto pool = BufferPool::Create(static_cast<size_t>(o.threads), o.chunk_mib << 20);
  if (!pool.ok()) Die("pool", pool.status());
  if (!o.thp) madvise((*pool)->base(), (*pool)->region_size(), MADV_NOHUGEPAGE);
  // Touch every page once so that neither mode pays the first zero-fill.
  for (size_t i = 0; i < (*pool)->region_size(); ++i) {
    (*pool)->base()[i] = static_cast<uint8_t>(i * 131 + 7);
  }
  std::printf("pool: %d x %zu MiB, %s\n", o.threads, o.chunk_mib, HugePages().c_str());
  for (int round = 0; round < o.rounds; ++round) {
    const bool registered_first = round % 2 == 1;
    RunMode(o, **pool, registered_first, round);
    RunMode(o, **pool, !registered_first, round);
  }
  return 0;
}

}  // namespace
}  // namespace longhaul::storage

int main(int argc, char** argv) { return longhaul::storage::Main(argc, argv); }
