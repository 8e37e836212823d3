#ifndef LONGHAUL_DAEMON_EXCHANGE_EXCHANGE_SERVICE_H_
#define LONGHAUL_DAEMON_EXCHANGE_EXCHANGE_SERVICE_H_

// The Exchange gRPC service (proto/longhaul/v1/exchange.proto) on the local
// control socket: an adapter from client requests to the ExchangeHub. It maps
// the client's shared-memory segment for the length of one call; the bytes
// never pass through gRPC. Errors, including a lost peer, are answered in the
// response's ExchangeError, with the hub's words. A streamed Send or Recv
// shares the segment's progress word with the hub for the call.
//
// Thread-safe (gRPC calls it from its own threads).

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "daemon/exchange/exchange_hub.h"
#include "longhaul/shm_progress.h"
#include "longhaul/v1/exchange.grpc.pb.h"

namespace longhaul::exchange {

// A mapping of a client's POSIX shared-memory region. Move-only; unmaps on
// destruction. The client keeps the segment alive for the call.
class ShmMapping {
 public:
  // Checks the name ("/longhaul-" + [A-Za-z0-9._-]) and that the segment
  // holds offset + length bytes. With `populate`, maps every page up front
  // (one call instead of a fault per page while the call copies).
  static absl::StatusOr<ShmMapping> Open(const v1::ShmRegion& region, bool writable,
                                         bool populate = true);
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

  grpc::Status Join(grpc::ServerContext* context, const v1::JoinRequest* request,
                    v1::JoinResponse* response) override;
  grpc::Status Leave(grpc::ServerContext* context, const v1::LeaveRequest* request,
                     v1::LeaveResponse* response) override;
  grpc::Status Group(grpc::ServerContext* context, const v1::GroupRequest* request,
                     v1::GroupResponse* response) override;
  grpc::Status AllReduce(grpc::ServerContext* context, const v1::AllReduceRequest* request,
                         v1::OpResponse* response) override;
  grpc::Status Send(grpc::ServerContext* context, const v1::SendRequest* request,
                    v1::OpResponse* response) override;
  grpc::Status Recv(grpc::ServerContext* context, const v1::RecvRequest* request,
                    v1::OpResponse* response) override;
  grpc::Status Cancel(grpc::ServerContext* context, const v1::CancelOpRequest* request,
                      v1::CancelOpResponse* response) override;

 private:
  ExchangeHub& hub_;
  MappingReaper reaper_;
};

}  // namespace longhaul::exchange

#endif  // LONGHAUL_DAEMON_EXCHANGE_EXCHANGE_SERVICE_H_
