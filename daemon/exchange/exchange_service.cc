#include "daemon/exchange/exchange_service.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/match.h"

namespace longhaul::exchange {
namespace {

constexpr absl::string_view kShmPrefix = "/longhaul-";

absl::Duration Timeout(uint32_t timeout_ms) {
  return timeout_ms == 0 ? absl::Seconds(60) : absl::Milliseconds(timeout_ms);
}

void SetError(const absl::Status& status, const std::string& lost_peer, v1::ExchangeError* error) {
  error->set_code(static_cast<int32_t>(status.code()));
  error->set_message(std::string(status.message()));
  error->set_lost_peer(lost_peer);
  error->set_retryable(!lost_peer.empty() || status.code() == absl::StatusCode::kUnavailable ||
                       status.code() == absl::StatusCode::kAborted);
}

void Answer(OpResult result, v1::OpResponse* response) {
  if (!result.status.ok()) SetError(result.status, result.lost_peer, response->mutable_error());
  *response->mutable_stats() = std::move(result.stats);
  response->set_bytes(result.bytes);
  *response->mutable_view() = std::move(result.view);
}

// A streamed call's progress word goes to the hub. An empty buffer has
// nothing to stream.
absl::Status ShareProgress(bool streamed, const ShmMapping& shm, P2PArgs& args) {
  if (!streamed || shm.bytes().empty()) return absl::OkStatus();
  uint64_t* word = shm.progress_word();
  if (word == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a streamed buffer must start at least ", shm::kDataOffset,
        " bytes into its segment (the progress word comes first)"));
  }
  args.progress.emplace(word);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ShmMapping> ShmMapping::Open(const v1::ShmRegion& region, bool writable,
                                            bool populate) {
  const std::string& name = region.name();
  bool name_ok = absl::StartsWith(name, kShmPrefix) && name.size() > kShmPrefix.size() &&
                 name.size() <= 255;
  for (size_t i = kShmPrefix.size(); name_ok && i < name.size(); ++i) {
    char c = name[i];
    name_ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == '-';
  }
  if (!name_ok) {
    return absl::InvalidArgumentError(
        absl::StrCat("shared-memory name '", name, "' is not /longhaul-[A-Za-z0-9._-]+"));
  }
  if (region.length() == 0) return ShmMapping(nullptr, 0, {});
  int fd = shm_open(name.c_str(), writable ? O_RDWR : O_RDONLY, 0);
  if (fd < 0) {
    return absl::NotFoundError(
        absl::StrCat("cannot open shared memory ", name, ": ", std::strerror(errno)));
  }
  struct stat st;
  if (fstat(fd, &st) != 0) {
    int e = errno;
    close(fd);
    return absl::InternalError(absl::StrCat("fstat of ", name, ": ", std::strerror(e)));
  }
  uint64_t end = region.offset() + region.length();
  if (end < region.offset() || end > static_cast<uint64_t>(st.st_size)) {
    close(fd);
    return absl::InvalidArgumentError(absl::StrCat("shared memory ", name, " holds ", st.st_size,
                                                   " bytes, the request names ", region.offset(),
                                                   "+", region.length()));
  }
  void* base = mmap(nullptr, end, writable ? PROT_READ | PROT_WRITE : PROT_READ,
                    MAP_SHARED | (populate ? MAP_POPULATE : 0), fd, 0);
  int e = errno;
  close(fd);
  if (base == MAP_FAILED) {
    return absl::ResourceExhaustedError(absl::StrCat("cannot map ", name, ": ", std::strerror(e)));
  }
  return ShmMapping(base, end,
                    absl::MakeSpan(static_cast<uint8_t*>(base) + region.offset(), region.length()));
}

ShmMapping::ShmMapping(ShmMapping&& other) noexcept
    : base_(other.base_), mapped_(other.mapped_), bytes_(other.bytes_) {
  other.base_ = nullptr;
}

ShmMapping::~ShmMapping() {
  if (base_ != nullptr) munmap(base_, mapped_);
}

MappingReaper::MappingReaper()
    : thread_([this] {
        absl::MutexLock lock(&mu_);
        auto work = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || !retired_.empty(); };
        while (true) {
          mu_.Await(absl::Condition(&work));
          if (retired_.empty()) return;  // stopping, and nothing left
          std::vector<ShmMapping> batch;
          batch.swap(retired_);
          mu_.Unlock();
          batch.clear();  // unmaps
          mu_.Lock();
        }
      }) {}

MappingReaper::~MappingReaper() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
}

void MappingReaper::Retire(ShmMapping mapping) {
  absl::MutexLock lock(&mu_);
  retired_.push_back(std::move(mapping));
}

grpc::Status ExchangeService::Join(grpc::ServerContext*, const v1::JoinRequest* request,
                                   v1::JoinResponse* response) {
  std::vector<std::string> sites(request->sites().begin(), request->sites().end());
  auto view = hub_.Join(request->group(), std::move(sites), Timeout(request->timeout_ms()));
  if (!view.ok()) {
    SetError(view.status(), "", response->mutable_error());
  } else {
    *response->mutable_view() = *view;
    response->set_streamed_buffers(true);
  }
  return grpc::Status::OK;
}

grpc::Status ExchangeService::Leave(grpc::ServerContext*, const v1::LeaveRequest* request,
                                    v1::LeaveResponse*) {
  hub_.Leave(request->group());
  return grpc::Status::OK;
}

grpc::Status ExchangeService::Group(grpc::ServerContext*, const v1::GroupRequest* request,
                                    v1::GroupResponse* response) {
  auto view = hub_.View(request->group());
  if (!view.ok()) {
    SetError(view.status(), "", response->mutable_error());
  } else {
    *response->mutable_view() = *view;
  }
  return grpc::Status::OK;
}

grpc::Status ExchangeService::AllReduce(grpc::ServerContext* context,
                                        const v1::AllReduceRequest* request,
                                        v1::OpResponse* response) {
  auto shm = ShmMapping::Open(request->buffer(), /*writable=*/true);
  if (!shm.ok()) {
    SetError(shm.status(), "", response->mutable_error());
    return grpc::Status::OK;
  }
  AllReduceArgs args;
  args.group = request->group();
  args.op_id = request->op_id();
  args.seq = request->seq();
  args.dtype = request->dtype();
  args.op = request->op() == v1::AVG ? v1::AVG : v1::SUM;
  args.quantize_int8 = request->quantize_int8();
  args.tag = request->tag();
  args.timeout = Timeout(request->timeout_ms());
  args.client_gone = [context] { return context->IsCancelled(); };
  Answer(hub_.AllReduce(args, shm->bytes()), response);
  reaper_.Retire(*std::move(shm));
  return grpc::Status::OK;
}

grpc::Status ExchangeService::Send(grpc::ServerContext* context, const v1::SendRequest* request,
                                   v1::OpResponse* response) {
  // A streamed buffer is still being written: its pages fault in as the
  // hub reads each segment, overlapping the transfer, instead of delaying
  // the first segment by populating them all (~5 ms for 64 MiB here).
  auto shm = ShmMapping::Open(request->buffer(), /*writable=*/false,
                              /*populate=*/!request->streamed());
  if (!shm.ok()) {
    SetError(shm.status(), "", response->mutable_error());
    return grpc::Status::OK;
  }
  P2PArgs args{request->group(), request->op_id(), request->peer(), request->tag(),
               Timeout(request->timeout_ms()), [context] { return context->IsCancelled(); }};
  if (absl::Status s = ShareProgress(request->streamed(), *shm, args); !s.ok()) {
    SetError(s, "", response->mutable_error());
    return grpc::Status::OK;
  }
  Answer(hub_.Send(args, shm->bytes()), response);
  reaper_.Retire(*std::move(shm));
  return grpc::Status::OK;
}

grpc::Status ExchangeService::Recv(grpc::ServerContext* context, const v1::RecvRequest* request,
                                   v1::OpResponse* response) {
  auto shm = ShmMapping::Open(request->buffer(), /*writable=*/true);
  if (!shm.ok()) {
    SetError(shm.status(), "", response->mutable_error());
    return grpc::Status::OK;
  }
  P2PArgs args{request->group(), request->op_id(), request->peer(), request->tag(),
               Timeout(request->timeout_ms()), [context] { return context->IsCancelled(); }};
  if (absl::Status s = ShareProgress(request->streamed(), *shm, args); !s.ok()) {
    SetError(s, "", response->mutable_error());
    return grpc::Status::OK;
  }
  Answer(hub_.Recv(args, shm->bytes()), response);
  reaper_.Retire(*std::move(shm));
  return grpc::Status::OK;
}

grpc::Status ExchangeService::Cancel(grpc::ServerContext*, const v1::CancelOpRequest* request,
                                     v1::CancelOpResponse* response) {
  response->set_found(hub_.Cancel(request->op_id()));
  return grpc::Status::OK;
}

}  // namespace longhaul::exchange
