#include "daemon/exchange/exchange_service.h"

#include <fcntl.h>
#include <linux/magic.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <optional>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/errno_status.h"
#include "daemon/unix_listener.h"
#include "spdlog/spdlog.h"

namespace longhaul::exchange {
namespace {

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

// A streamed call's progress word goes to the hub (P2PArgs::progress,
// AllReduceArgs::progress). An empty buffer has nothing to stream.
absl::Status ShareProgress(bool streamed, const ShmMapping& shm,
                           std::optional<shm::ProgressWord>& progress) {
  if (!streamed || shm.bytes().empty()) return absl::OkStatus();
  uint64_t* word = shm.progress_word();
  if (word == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("a streamed buffer must start at least ", shm::kDataOffset,
                     " bytes into its segment (the progress word comes first)"));
  }
  progress.emplace(word);
  return absl::OkStatus();
}

// The hub's arguments of a Send or Recv request (same fields in both).
template <typename Request>
P2PArgs P2PArgsOf(const Request& request, grpc::ServerContext* context) {
  return P2PArgs{request.group(),
                 request.op_id(),
                 request.peer(),
                 request.tag(),
                 Timeout(request.timeout_ms()),
                 [context] { return context->IsCancelled(); }};
}

}  // namespace

absl::Status CheckSealedSegment(int fd) {
  const int seals = fcntl(fd, F_GET_SEALS);
  if (seals < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("the segment is not a memfd made with MFD_ALLOW_SEALING (F_GET_SEALS: ",
                     std::strerror(errno), ")"));
  }
  struct statfs fs;
  if (fstatfs(fd, &fs) != 0) return ErrnoError("fstatfs of a segment");
  if (fs.f_type != TMPFS_MAGIC) {
    return absl::FailedPreconditionError(
        "the segment is not a memfd on tmpfs (a hugetlbfs memfd faults when the huge page pool "
        "runs out)");
  }
  struct stat st;
  if (fstat(fd, &st) != 0) return ErrnoError("fstat of a segment");
  if (!S_ISREG(st.st_mode)) return absl::FailedPreconditionError("the segment is not a memfd");
  if ((seals & F_SEAL_SHRINK) == 0) {
    return absl::FailedPreconditionError(
        "the segment is not a memfd sealed with F_SEAL_SHRINK: its owner could truncate it "
        "while the daemon has it mapped");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<SegmentRegistry>> SegmentRegistry::Start(Options options) {
  auto listener = daemon::ListenOnUnixSocket(options.path, options.mode, "segment socket");
  if (!listener.ok()) return listener.status();
  const int fd = listener->fd;
  const int wake = listener->wake;
  auto registry =
      std::unique_ptr<SegmentRegistry>(new SegmentRegistry(std::move(options), fd, wake));
  registry->thread_ = std::thread([r = registry.get()] { r->Loop(); });
  return registry;
}

SegmentRegistry::SegmentRegistry(Options options, int listen_fd, int wake_fd)
    : options_(std::move(options)), listen_fd_(listen_fd), wake_fd_(wake_fd) {}

SegmentRegistry::~SegmentRegistry() {
  const uint64_t one = 1;
  if (write(wake_fd_, &one, sizeof(one)) != sizeof(one)) {
    spdlog::error("cannot wake the segment socket's thread: {}", std::strerror(errno));
  }
  thread_.join();
  for (Connection& conn : connections_) Drop(conn);
  close(listen_fd_);
  close(wake_fd_);
  unlink(options_.path.c_str());
}

absl::StatusOr<int> SegmentRegistry::Dup(absl::string_view token) const {
  absl::MutexLock lock(&mu_);
  auto it = segments_.find(token);
  if (it == segments_.end()) {
    return absl::NotFoundError(
        absl::StrCat("no segment is registered under token '", token,
                     "' (the client closed its registration, or never made it)"));
  }
  const int fd = fcntl(it->second, F_DUPFD_CLOEXEC, 0);
  if (fd < 0) return ErrnoError("cannot duplicate a segment's fd");
  return fd;
}

void SegmentRegistry::Loop() {
  std::vector<pollfd> fds;
  for (;;) {
    fds.assign({{listen_fd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}});
    for (const Connection& conn : connections_) fds.push_back({conn.fd, POLLIN, 0});
    if (poll(fds.data(), fds.size(), -1) < 0) {
      if (errno == EINTR) continue;
      spdlog::critical("segment socket {}: poll failed: {}; no new segments are taken",
                       options_.path, std::strerror(errno));
      return;
    }
    if (fds[1].revents != 0) return;
    // Connections first: fds[i + 2] is connections_[i] until one is erased.
    size_t kept = 0;
    for (size_t i = 0; i < connections_.size(); ++i) {
      Connection& conn = connections_[i];
      bool open = true;
      if (fds[i + 2].revents != 0) {
        if (conn.token.empty()) {
          open = Register(conn);
        } else {
          // A registered connection has nothing more to say: data or EOF
          // both end it.
          char byte;
          const ssize_t n = recv(conn.fd, &byte, 1, MSG_DONTWAIT);
          open = n < 0 && (errno == EAGAIN || errno == EINTR);
        }
      }
      if (open) {
        connections_[kept++] = conn;
      } else {
        Drop(conn);
      }
    }
    connections_.resize(kept);
    if ((fds[0].revents & POLLIN) == 0) continue;
    const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      if (errno == EAGAIN || errno == EINTR || errno == ECONNABORTED) continue;
      spdlog::error("segment socket {}: accept failed: {}", options_.path, std::strerror(errno));
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        poll(nullptr, 0, 100);
      }
      continue;
    }
    ucred cred{};
    socklen_t len = sizeof(cred);
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0 || len != sizeof(cred)) {
      spdlog::error("segment socket {}: cannot tell who connected (SO_PEERCRED: {})", options_.path,
                    std::strerror(errno));
      close(fd);
      continue;
    }
    const size_t of_user = std::count_if(connections_.begin(), connections_.end(),
                                         [&](const Connection& c) { return c.uid == cred.uid; });
    std::string refusal;
    if (connections_.size() >= options_.max_segments) {
      refusal = absl::StrCat("the daemon holds ", connections_.size(),
                             " segments already, the most it takes");
    } else if (of_user >= options_.max_segments_per_user) {
      refusal = absl::StrCat("the daemon holds ", of_user, " segments of uid ", cred.uid,
                             " already, the most it takes per user");
    }
    if (!refusal.empty()) {
      spdlog::warn("segment socket {}: refused a connection from pid {}: {}", options_.path,
                   cred.pid, refusal);
      const std::string answer = absl::StrCat("error ", refusal, "\n");
      send(fd, answer.data(), answer.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
      close(fd);
      continue;
    }
    connections_.push_back(Connection{fd, cred.uid, ""});
  }
}

bool SegmentRegistry::Register(Connection& conn) {
  char byte;
  iovec iov{&byte, 1};
  alignas(cmsghdr) char control[CMSG_SPACE(4 * sizeof(int))];
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  const ssize_t n = recvmsg(conn.fd, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
  if (n < 0) return errno == EAGAIN || errno == EINTR;
  if (n == 0) return false;
  std::vector<int> received;
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < count; ++i) {
      int fd;
      std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
      received.push_back(fd);
    }
  }
  absl::Status status = absl::OkStatus();
  if ((msg.msg_flags & MSG_CTRUNC) != 0 || received.size() != 1) {
    status = absl::InvalidArgumentError(absl::StrCat(
        "a registration is one byte carrying exactly one memfd (SCM_RIGHTS); this one carried ",
        received.size(), (msg.msg_flags & MSG_CTRUNC) != 0 ? " or more" : ""));
  } else {
    status = CheckSealedSegment(received[0]);
  }
  std::string token;
  if (status.ok()) {
    uint8_t random[16];
    if (getrandom(random, sizeof(random), 0) != sizeof(random)) {
      status = ErrnoError("getrandom for a segment token");
    } else {
      token = absl::BytesToHexString(
          absl::string_view(reinterpret_cast<const char*>(random), sizeof(random)));
    }
  }
  // Registered before the answer: the client may name the token at once.
  if (status.ok()) {
    absl::MutexLock lock(&mu_);
    segments_.emplace(token, received[0]);
    conn.token = token;
  }
  const std::string answer = status.ok() ? absl::StrCat("ok ", token, "\n")
                                         : absl::StrCat("error ", status.message(), "\n");
  const bool sent = send(conn.fd, answer.data(), answer.size(), MSG_DONTWAIT | MSG_NOSIGNAL) ==
                    static_cast<ssize_t>(answer.size());
  if (!status.ok()) {
    spdlog::warn("segment socket {}: refused a segment: {}", options_.path,
                 std::string(status.message()));
    for (int fd : received) close(fd);
    return false;
  }
  return sent;  // if not, Drop unregisters it
}

void SegmentRegistry::Drop(Connection& conn) {
  if (!conn.token.empty()) {
    absl::MutexLock lock(&mu_);
    auto it = segments_.find(conn.token);
    if (it != segments_.end()) {
      close(it->second);
      segments_.erase(it);
    }
  }
  close(conn.fd);
  conn.fd = -1;
}

absl::StatusOr<ShmMapping> ShmMapping::Open(const SegmentRegistry* registry,
                                            const v1::ShmRegion& region, uint64_t max_length,
                                            bool writable, bool populate) {
  if (region.segment().empty() && !region.name().empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "shared memory named '", region.name(),
        "' (shm_open) is not accepted: its owner could truncate it under the daemon; the client "
        "must register a sealed memfd on the daemon's segment socket (a client older than the "
        "daemon?)"));
  }
  if (region.length() == 0) return ShmMapping(nullptr, 0, {});
  if (region.length() > max_length) {
    return absl::InvalidArgumentError(absl::StrCat("a buffer of ", region.length(),
                                                   " bytes is larger than the largest exchange "
                                                   "message (",
                                                   max_length, " bytes)"));
  }
  if (registry == nullptr) {
    return absl::FailedPreconditionError("this daemon serves no segment socket");
  }
  absl::StatusOr<int> fd = registry->Dup(region.segment());
  if (!fd.ok()) return fd.status();
  struct stat st;
  if (fstat(*fd, &st) != 0) {
    absl::Status s = ErrnoError("fstat of a segment");
    close(*fd);
    return s;
  }
  uint64_t end = region.offset() + region.length();
  if (end < region.offset() || end > static_cast<uint64_t>(st.st_size)) {
    close(*fd);
    return absl::InvalidArgumentError(absl::StrCat("the segment holds ", st.st_size,
                                                   " bytes, the request names ", region.offset(),
                                                   "+", region.length()));
  }
  void* base = mmap(nullptr, end, writable ? PROT_READ | PROT_WRITE : PROT_READ,
                    MAP_SHARED | (populate ? MAP_POPULATE : 0), *fd, 0);
  int e = errno;
  close(*fd);
  if (base == MAP_FAILED) {
    return absl::ResourceExhaustedError(absl::StrCat("cannot map the segment: ", std::strerror(e)));
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
        auto work = [this]()
                        ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || !retired_.empty(); };
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

absl::Status ExchangeService::ServeSegments(SegmentRegistry::Options options) {
  auto registry = SegmentRegistry::Start(std::move(options));
  if (!registry.ok()) return registry.status();
  segments_ = *std::move(registry);
  return absl::OkStatus();
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
    response->set_streamed_all_reduce(true);
    if (segments_) response->set_segment_socket(segments_->path());
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
  // A streamed buffer's pages fault in as the hub reads it, as a Send's do.
  auto shm = ShmMapping::Open(segments_.get(), request->buffer(), max_buffer_bytes_,
                              /*writable=*/true, /*populate=*/!request->streamed());
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
  if (absl::Status s = ShareProgress(request->streamed(), *shm, args.progress); !s.ok()) {
    SetError(s, "", response->mutable_error());
    return grpc::Status::OK;
  }
  Answer(hub_.AllReduce(args, shm->bytes()), response);
  reaper_.Retire(*std::move(shm));
  return grpc::Status::OK;
}

namespace {

// The hub's arguments of an AllGather or Broadcast request.
template <typename Request>
GatherArgs GatherArgsOf(const Request& request, grpc::ServerContext* context) {
  GatherArgs args;
  args.group = request.group();
  args.op_id = request.op_id();
  args.seq = request.seq();
  args.tag = request.tag();
  args.timeout = Timeout(request.timeout_ms());
  args.client_gone = [context] { return context->IsCancelled(); };
  return args;
}

}  // namespace

grpc::Status ExchangeService::AllGather(grpc::ServerContext* context,
                                        const v1::AllGatherRequest* request,
                                        v1::OpResponse* response) {
  auto input = ShmMapping::Open(segments_.get(), request->input(), max_buffer_bytes_,
                                /*writable=*/false);
  if (!input.ok()) {
    SetError(input.status(), "", response->mutable_error());
    return grpc::Status::OK;
  }
  // The output is members x the input: it may pass one message's limit.
  auto output = ShmMapping::Open(segments_.get(), request->output(),
                                 max_buffer_bytes_ * kMaxGatherMembers, /*writable=*/true);
  if (!output.ok()) {
    SetError(output.status(), "", response->mutable_error());
    reaper_.Retire(*std::move(input));
    return grpc::Status::OK;
  }
  Answer(hub_.AllGather(GatherArgsOf(*request, context), input->bytes(), output->bytes()),
         response);
  reaper_.Retire(*std::move(input));
  reaper_.Retire(*std::move(output));
  return grpc::Status::OK;
}

grpc::Status ExchangeService::Broadcast(grpc::ServerContext* context,
                                        const v1::BroadcastRequest* request,
                                        v1::OpResponse* response) {
  auto shm = ShmMapping::Open(segments_.get(), request->buffer(), max_buffer_bytes_,
                              /*writable=*/true);
  if (!shm.ok()) {
    SetError(shm.status(), "", response->mutable_error());
    return grpc::Status::OK;
  }
  GatherArgs args = GatherArgsOf(*request, context);
  args.root = request->root();
  Answer(hub_.Broadcast(args, shm->bytes()), response);
  reaper_.Retire(*std::move(shm));
  return grpc::Status::OK;
}

grpc::Status ExchangeService::Send(grpc::ServerContext* context, const v1::SendRequest* request,
                                   v1::OpResponse* response) {
  // A streamed buffer is still being written: its pages fault in as the
  // hub reads each segment, overlapping the transfer, instead of delaying
  // the first segment by populating them all (~5 ms for 64 MiB here).
  auto shm = ShmMapping::Open(segments_.get(), request->buffer(), max_buffer_bytes_,
                              /*writable=*/false,
                              /*populate=*/!request->streamed());
  if (!shm.ok()) {
    SetError(shm.status(), "", response->mutable_error());
    return grpc::Status::OK;
  }
  P2PArgs args = P2PArgsOf(*request, context);
  if (absl::Status s = ShareProgress(request->streamed(), *shm, args.progress); !s.ok()) {
    SetError(s, "", response->mutable_error());
    return grpc::Status::OK;
  }
  Answer(hub_.Send(args, shm->bytes()), response);
  reaper_.Retire(*std::move(shm));
  return grpc::Status::OK;
}

grpc::Status ExchangeService::Recv(grpc::ServerContext* context, const v1::RecvRequest* request,
                                   v1::OpResponse* response) {
  auto shm = ShmMapping::Open(segments_.get(), request->buffer(), max_buffer_bytes_,
                              /*writable=*/true);
  if (!shm.ok()) {
    SetError(shm.status(), "", response->mutable_error());
    return grpc::Status::OK;
  }
  P2PArgs args = P2PArgsOf(*request, context);
  if (absl::Status s = ShareProgress(request->streamed(), *shm, args.progress); !s.ok()) {
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
