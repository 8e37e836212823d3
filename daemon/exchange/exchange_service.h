#ifndef LONGHAUL_DAEMON_EXCHANGE_EXCHANGE_SERVICE_H_
#define LONGHAUL_DAEMON_EXCHANGE_EXCHANGE_SERVICE_H_

// The Exchange gRPC service (proto/longhaul/v1/exchange.proto) on the local
// control socket: an adapter from client requests to the ExchangeHub. It maps
// the client's shared-memory segment for the length of one call; the bytes
// never pass through gRPC. Segments are sealed memfds the client registers on
// a segment socket (SegmentRegistry): sealed against shrinking, they cannot
// be truncated under the mapping, so no client can make the daemon fault.
// Errors, including a lost peer, are answered in the response's
// ExchangeError, with the hub's words. A streamed Send, Recv or AllReduce
// shares the segment's progress word with the hub for the call.
//
// Thread-safe (gRPC calls it from its own threads).

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "daemon/exchange/exchange_hub.h"
#include "longhaul/shm_progress.h"
#include "longhaul/v1/exchange.grpc.pb.h"

namespace longhaul::exchange {

// Whether the daemon may keep `fd` mapped whatever its owner does: a memfd
// (on tmpfs: not hugetlbfs, whose faults fail when the pool runs dry) sealed
// with F_SEAL_SHRINK. Otherwise FailedPrecondition saying what is missing.
absl::Status CheckSealedSegment(int fd);

// The sealed memfds that local clients lend the daemon, registered over a
// Unix stream socket with SCM_RIGHTS (the protocol is in exchange.proto,
// ShmRegion). Each connection registers one segment, answered by a random
// 128-bit token; the segment stays registered until the client closes that
// connection. A refused segment gets "error <reason>" and the connection is
// closed. At most `max_segments` connections are open at once, at most
// `max_segments_per_user` of them from one uid (SO_PEERCRED); further ones
// are answered with an error and closed.
//
// Thread-safe. One thread accepts, reads registrations and notices closed
// connections; Dup is called from gRPC threads.
class SegmentRegistry {
 public:
  struct Options {
    std::string path;  // the socket; a stale socket there is replaced
    mode_t mode = 0660;
    size_t max_segments = 1024;
    size_t max_segments_per_user = 256;
  };
  static absl::StatusOr<std::unique_ptr<SegmentRegistry>> Start(Options options);
  ~SegmentRegistry();  // stops the thread, closes every connection and segment
  SegmentRegistry(const SegmentRegistry&) = delete;
  SegmentRegistry& operator=(const SegmentRegistry&) = delete;

  const std::string& path() const { return options_.path; }
  // A new fd of the segment registered under `token` (the caller closes it),
  // or NotFound if no open connection registered it.
  absl::StatusOr<int> Dup(absl::string_view token) const;

 private:
  struct Connection {
    int fd = -1;
    uid_t uid = 0;
    std::string token;  // empty until its segment is registered
  };
  SegmentRegistry(Options options, int listen_fd, int wake_fd);
  void Loop();
  // Reads one registration from `conn`; false if the connection is done.
  bool Register(Connection& conn);
  void Drop(Connection& conn);

  const Options options_;
  const int listen_fd_;
  const int wake_fd_;
  std::thread thread_;
  std::vector<Connection> connections_;  // owned by thread_
  mutable absl::Mutex mu_;
  std::map<std::string, int, std::less<>> segments_ ABSL_GUARDED_BY(mu_);  // token -> memfd
};

// A mapping of a region of a client's registered segment. Move-only; unmaps
// on destruction. The mapping stays valid whatever the client does with its
// segment meanwhile.
class ShmMapping {
 public:
  // Checks that the region names a segment of `registry` (a request naming
  // a POSIX shm_open segment is refused: it could be truncated under the
  // mapping), that length is at most `max_length` (mapping populates the
  // pages, charged to the daemon) and that the segment holds offset +
  // length bytes. With
  // `populate`, maps every page up front (one call instead of a fault per
  // page while the call copies).
  static absl::StatusOr<ShmMapping> Open(const SegmentRegistry* registry,
                                         const v1::ShmRegion& region, uint64_t max_length,
                                         bool writable, bool populate = true);
  ShmMapping(ShmMapping&& other) noexcept;
  ShmMapping& operator=(ShmMapping&&) = delete;
  ~ShmMapping();

  absl::Span<uint8_t> bytes() const { return bytes_; }
  // The progress word of a streamed segment (longhaul/shm_progress.h), at
  // the segment's start; null if the mapping does not hold it apart from the
  // region (an empty region, or one that starts before shm::kDataOffset).
  uint64_t* progress_word() const {
    return base_ != nullptr && bytes_.data() >= static_cast<uint8_t*>(base_) + shm::kDataOffset
               ? static_cast<uint64_t*>(base_)
               : nullptr;
  }

 private:
  ShmMapping(void* base, size_t mapped, absl::Span<uint8_t> bytes)
      : base_(base), mapped_(mapped), bytes_(bytes) {}
  void* base_;
  size_t mapped_;
  absl::Span<uint8_t> bytes_;
};

// Unmaps the mappings of finished calls on its own thread: tearing down the
// page tables of a 64 MiB buffer takes milliseconds, which the call's answer
// need not wait for. Thread-safe.
class MappingReaper {
 public:
  MappingReaper();
  ~MappingReaper();  // unmaps what is left
  MappingReaper(const MappingReaper&) = delete;
  MappingReaper& operator=(const MappingReaper&) = delete;

  // Takes a mapping no one uses any more.
  void Retire(ShmMapping mapping);

 private:
  absl::Mutex mu_;
  std::vector<ShmMapping> retired_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

class ExchangeService final : public v1::Exchange::Service {
 public:
  explicit ExchangeService(ExchangeHub& hub) : hub_(hub) {}

  // Starts the segment socket at `options.path`. Call once, before the
  // service is served: without it every call that needs a buffer fails.
  absl::Status ServeSegments(SegmentRegistry::Options options);

  grpc::Status Join(grpc::ServerContext* context, const v1::JoinRequest* request,
                    v1::JoinResponse* response) override;
  grpc::Status Leave(grpc::ServerContext* context, const v1::LeaveRequest* request,
                     v1::LeaveResponse* response) override;
  grpc::Status Group(grpc::ServerContext* context, const v1::GroupRequest* request,
                     v1::GroupResponse* response) override;
  grpc::Status AllReduce(grpc::ServerContext* context, const v1::AllReduceRequest* request,
                         v1::OpResponse* response) override;
  grpc::Status AllGather(grpc::ServerContext* context, const v1::AllGatherRequest* request,
                         v1::OpResponse* response) override;
  grpc::Status Broadcast(grpc::ServerContext* context, const v1::BroadcastRequest* request,
                         v1::OpResponse* response) override;
  grpc::Status Send(grpc::ServerContext* context, const v1::SendRequest* request,
                    v1::OpResponse* response) override;
  grpc::Status Recv(grpc::ServerContext* context, const v1::RecvRequest* request,
                    v1::OpResponse* response) override;
  grpc::Status Cancel(grpc::ServerContext* context, const v1::CancelOpRequest* request,
                      v1::CancelOpResponse* response) override;

 private:
  ExchangeHub& hub_;
  std::unique_ptr<SegmentRegistry> segments_;  // set before serving, then read-only
  // No buffer can carry more than the largest message the hub takes.
  const uint64_t max_buffer_bytes_ = HubOptions{}.max_message_bytes;
  // An all-gather's output holds one input per member: at most this many.
  static constexpr uint64_t kMaxGatherMembers = 64;
  MappingReaper reaper_;
};

}  // namespace longhaul::exchange

#endif  // LONGHAUL_DAEMON_EXCHANGE_EXCHANGE_SERVICE_H_
