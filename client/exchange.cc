#include "longhaul/exchange.h"

#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/random/random.h"
#include "absl/strings/cord.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "client/deadline.h"
#include "client/exchange_testing.h"
#include "common/fd_passing.h"
#include "longhaul/shm_progress.h"
#include "longhaul/v1/exchange.grpc.pb.h"

namespace longhaul {
namespace {

constexpr absl::string_view kPeerLostPayload = "type.longhaul.dev/exchange.peer-lost";
// Headroom for the daemon to answer after its own deadline passed.
constexpr absl::Duration kRpcSlack = absl::Seconds(30);
constexpr size_t kMaxFreeSegments = 4;
// A streamed Send or AllReduce writes its buffer into the segment in pieces
// of this size, publishing each: the daemon's first 4 MiB wire segment is
// ready after a millisecond instead of after the whole copy.
constexpr size_t kFillPieceBytes = 1 << 20;
// How often a streamed Recv copies out what has landed while the rest
// arrives (the link brings ~125 KB per millisecond at 1 Gbit/s).
constexpr absl::Duration kDrainPoll = absl::Milliseconds(1);

v1::ExchangeDType ToProto(DType d) {
  switch (d) {
    case DType::kBFloat16:
      return v1::BFLOAT16;
    case DType::kFloat16:
      return v1::FLOAT16;
    default:
      return v1::FLOAT32;
  }
}

uint32_t Millis(absl::Duration d) {
  if (d == absl::InfiniteDuration()) return UINT32_MAX;
  return static_cast<uint32_t>(std::clamp<int64_t>(absl::ToInt64Milliseconds(d), 1, UINT32_MAX));
}

absl::Status FromExchangeGrpc(const grpc::Status& status, absl::string_view address) {
  if (status.ok()) return absl::OkStatus();
  if (status.error_code() == grpc::StatusCode::UNAVAILABLE) {
    return absl::UnavailableError(
        absl::StrCat("cannot reach longhauld at ", address, ": ", status.error_message()));
  }
  if (status.error_code() == grpc::StatusCode::UNIMPLEMENTED) {
    return absl::UnimplementedError(
        absl::StrCat("longhauld at ", address, " has no exchange service (too old?)"));
  }
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
}

absl::Status FromExchangeError(const v1::ExchangeError& e) {
  if (e.code() == 0) return absl::OkStatus();
  absl::Status s(static_cast<absl::StatusCode>(e.code()), e.message());
  if (!e.lost_peer().empty()) s.SetPayload(kPeerLostPayload, absl::Cord(e.lost_peer()));
  return s;
}

std::string RandomHex() {
  absl::BitGen gen;
  return absl::StrFormat("%016x%016x", absl::Uniform<uint64_t>(gen), absl::Uniform<uint64_t>(gen));
}

// The daemon's segment socket as this process reaches it: beside the
// control socket at `address`, under the name the daemon advertised. The
// two processes may see that directory at different paths (containers of
// one pod sharing a volume); an address that is not a Unix path takes the
// advertised path as it is.
std::string SegmentSocketPath(absl::string_view address, const std::string& advertised) {
  if (advertised.empty() || !absl::ConsumePrefix(&address, "unix:")) return advertised;
  if (absl::StartsWith(address, "//")) address.remove_prefix(2);
  const size_t name_at = advertised.rfind('/');
  const absl::string_view name = name_at == std::string::npos
                                     ? absl::string_view(advertised)
                                     : absl::string_view(advertised).substr(name_at + 1);
  const size_t dir_end = address.rfind('/');
  if (dir_end == absl::string_view::npos) return std::string(name);
  return absl::StrCat(address.substr(0, dir_end + 1), name);
}

// Sends `memfd` to the daemon's segment socket at `socket_path`; returns
// the connection (its registration lasts as long as it stays open) and the
// token the daemon answered.
absl::StatusOr<std::pair<int, std::string>> RegisterSegment(const std::string& socket_path,
                                                            int memfd) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (socket_path.empty() || socket_path.size() >= sizeof(addr.sun_path)) {
    return absl::FailedPreconditionError(
        absl::StrCat("the daemon's segment socket path '", socket_path, "' is unusable"));
  }
  std::memcpy(addr.sun_path, socket_path.data(), socket_path.size());
  const int conn = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (conn < 0) {
    return absl::ResourceExhaustedError(absl::StrCat("socket: ", std::strerror(errno)));
  }
  auto fail = [conn](absl::Status status) {
    close(conn);
    return status;
  };
  // The daemon answers at once; this bounds a daemon that hangs.
  const timeval timeout{10, 0};
  setsockopt(conn, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  if (connect(conn, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0) {
    return fail(absl::UnavailableError(absl::StrCat("cannot reach the daemon's segment socket ",
                                                    socket_path, ": ", std::strerror(errno))));
  }
  if (SendByteWithFd(conn, 'S', memfd, MSG_NOSIGNAL) != 1) {
    return fail(absl::UnavailableError(
        absl::StrCat("cannot register a segment with the daemon: ", std::strerror(errno))));
  }
  std::string answer;
  char buf[256];
  while (answer.find('\n') == std::string::npos && answer.size() < 4096) {
    const ssize_t n = read(conn, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      return fail(absl::UnavailableError(
          absl::StrCat("the daemon did not answer the segment registration: ",
                       n == 0 ? "connection closed" : std::strerror(errno))));
    }
    answer.append(buf, n);
  }
  answer = answer.substr(0, answer.find('\n'));
  if (!absl::StartsWith(answer, "ok ")) {
    return fail(absl::FailedPreconditionError(
        absl::StrCat("the daemon refused the segment: ", absl::StripPrefix(answer, "error "))));
  }
  return std::make_pair(conn, answer.substr(3));
}

// A sealed memfd segment lent to the daemon (exchange.proto, ShmRegion).
// Owned by one group. Sealed against shrinking and growing, so the daemon's
// mapping of it stays valid whatever happens here. Laid out as
// longhaul/shm_progress.h says: the progress word, then the buffer (`base`,
// `capacity` bytes) at shm::kDataOffset.
struct Segment {
  std::string token;      // names it in requests
  int registration = -1;  // the connection to the segment socket; open while registered
  uint8_t* mapping = nullptr;
  uint8_t* base = nullptr;
  size_t capacity = 0;

  shm::ProgressWord progress() { return shm::ProgressWord(reinterpret_cast<uint64_t*>(mapping)); }
  size_t mapped() const { return shm::kDataOffset + capacity; }

  static absl::StatusOr<std::unique_ptr<Segment>> Create(size_t bytes,
                                                         const std::string& socket_path) {
    if (socket_path.empty()) {
      return absl::FailedPreconditionError(
          "longhauld takes no sealed shared-memory segments (too old?)");
    }
    auto seg = std::make_unique<Segment>();
    seg->capacity = std::max<size_t>(bytes, 4096);
    const int fd = memfd_create("longhaul-segment", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0) {
      return absl::ResourceExhaustedError(
          absl::StrCat("cannot create a memfd segment: ", std::strerror(errno)));
    }
    auto fail = [fd](absl::Status status) {
      close(fd);
      return status;
    };
    if (ftruncate(fd, seg->mapped()) != 0) {
      return fail(absl::ResourceExhaustedError(absl::StrCat(
          "cannot size a memfd segment to ", seg->mapped(), " bytes: ", std::strerror(errno))));
    }
    if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
      return fail(
          absl::InternalError(absl::StrCat("cannot seal a memfd segment: ", std::strerror(errno))));
    }
    void* base = mmap(nullptr, seg->mapped(), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED) {
      return fail(absl::ResourceExhaustedError(
          absl::StrCat("cannot map a memfd segment: ", std::strerror(errno))));
    }
    seg->mapping = static_cast<uint8_t*>(base);
    seg->base = seg->mapping + shm::kDataOffset;
    auto registered = RegisterSegment(socket_path, fd);
    close(fd);  // the mapping and the daemon hold the memory from here on
    if (!registered.ok()) return registered.status();
    seg->registration = registered->first;
    seg->token = std::move(registered->second);
    return seg;
  }

  // Names `bytes` of the buffer in a request.
  void Describe(size_t bytes, v1::ShmRegion* region) const {
    region->set_segment(token);
    region->set_offset(shm::kDataOffset);
    region->set_length(bytes);
  }

  ~Segment() {
    if (mapping != nullptr) munmap(mapping, mapped());
    if (registration >= 0) close(registration);
  }
};

}  // namespace

size_t ElementSize(DType dtype) { return dtype == DType::kFloat32 ? 4 : 2; }

bool IsPeerLost(const absl::Status& status) {
  return status.GetPayload(kPeerLostPayload).has_value();
}

std::string LostPeer(const absl::Status& status) {
  auto p = status.GetPayload(kPeerLostPayload);
  return p ? std::string(*p) : std::string();
}

struct ExchangeGroup::Impl {
  std::string address;
  std::string name;
  std::string local_site;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::Exchange::Stub> stub;
  // The daemon said at Join that it takes streamed Send and Recv buffers
  // (JoinResponse.streamed_buffers), and streamed all-reduce buffers
  // (JoinResponse.streamed_all_reduce).
  bool streamed = false;
  bool streamed_all_reduce = false;
  // Where the daemon takes segments (JoinResponse.segment_socket, as seen
  // from here).
  std::string segment_socket;

  absl::Mutex mu;
  uint64_t generation ABSL_GUARDED_BY(mu) = 0;
  std::vector<std::string> members ABSL_GUARDED_BY(mu);
  uint64_t next_seq ABSL_GUARDED_BY(mu) = 0;
  std::vector<std::unique_ptr<Segment>> free_segments ABSL_GUARDED_BY(mu);

  absl::StatusOr<std::unique_ptr<Segment>> Acquire(size_t bytes) {
    {
      absl::MutexLock lock(&mu);
      auto best = free_segments.end();
      for (auto it = free_segments.begin(); it != free_segments.end(); ++it) {
        if ((*it)->capacity >= bytes &&
            (best == free_segments.end() || (*it)->capacity < (*best)->capacity)) {
          best = it;
        }
      }
      if (best != free_segments.end()) {
        auto seg = std::move(*best);
        free_segments.erase(best);
        return seg;
      }
    }
    return Segment::Create(bytes, segment_socket);
  }

  void Release(std::unique_ptr<Segment> seg) {
    absl::MutexLock lock(&mu);
    free_segments.push_back(std::move(seg));
    if (free_segments.size() > kMaxFreeSegments) {
      // Keep the largest ones: they serve every size.
      std::sort(free_segments.begin(), free_segments.end(),
                [](const auto& a, const auto& b) { return a->capacity > b->capacity; });
      free_segments.resize(kMaxFreeSegments);
    }
  }

  void Observe(const v1::GroupView& view) {
    if (view.group().empty()) return;
    absl::MutexLock lock(&mu);
    generation = view.generation();
    members.assign(view.members().begin(), view.members().end());
  }
};

namespace {

// One operation: the RPC runs on its own thread; the handle waits for it.
class Work final : public ExchangeWork {
 public:
  // `rpc` makes the call (blocking; it may use the segment meanwhile) and
  // returns the daemon's answer; `finish` runs after a successful answer,
  // before the work counts as done (the copy back into the caller's buffer).
  using Rpc = std::function<absl::StatusOr<v1::OpResponse>(grpc::ClientContext*, Segment*)>;
  // With `on_caller`, the call runs to its end in the constructor, on the
  // caller's thread (the blocking helpers: no thread to start and schedule).
  Work(std::shared_ptr<ExchangeGroup::Impl> group, std::string op_id, std::unique_ptr<Segment> seg,
       Rpc rpc, std::function<void(const v1::OpResponse&, Segment&)> finish, bool on_caller = false)
      : group_(std::move(group)),
        op_id_(std::move(op_id)),
        start_(client_internal::MonotonicNow()) {
    auto body = [this, seg = std::move(seg), rpc = std::move(rpc),
                 finish = std::move(finish)]() mutable {
      grpc::ClientContext context;
      auto response = rpc(&context, seg.get());
      absl::Status status =
          response.ok() ? FromExchangeError(response->error()) : response.status();
      if (response.ok()) group_->Observe(response->view());
      if (status.ok() && finish) finish(*response, *seg);
      if (seg) group_->Release(std::move(seg));
      absl::MutexLock lock(&mu_);
      status_ = status;
      if (response.ok()) {
        const v1::OpStats& s = response->stats();
        stats_.bytes_sent = s.bytes_sent();
        stats_.bytes_received = s.bytes_received();
        stats_.peers = s.peers();
        stats_.generation = s.generation();
      }
      stats_.seconds = absl::ToDoubleSeconds(client_internal::MonotonicNow() - start_);
      done_ = true;
    };
    if (on_caller) {
      body();
    } else {
      thread_ = std::thread(std::move(body));
    }
  }

  // A work that failed before it started.
  Work(absl::Status failed) : start_(client_internal::MonotonicNow()) {
    status_ = std::move(failed);
    done_ = true;
  }

  ~Work() override {
    if (thread_.joinable()) thread_.join();
  }

  absl::Status Wait(absl::Duration timeout) override {
    absl::MutexLock lock(&mu_);
    auto done = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return done_; };
    if (!mu_.AwaitWithTimeout(absl::Condition(&done), timeout)) {
      return absl::DeadlineExceededError(
          absl::StrCat("exchange operation still running after ", absl::FormatDuration(timeout)));
    }
    return status_;
  }

  bool Test() override {
    absl::MutexLock lock(&mu_);
    return done_;
  }

  void Cancel() override {
    if (!group_) return;
    // The daemon may not have registered the call yet: try for a while.
    for (int attempt = 0; attempt < 100 && !Test(); ++attempt) {
      grpc::ClientContext context;
      context.set_deadline(client_internal::GrpcDeadlineIn(absl::Seconds(5)));
      v1::CancelOpRequest request;
      request.set_op_id(op_id_);
      v1::CancelOpResponse response;
      grpc::Status s = group_->stub->Cancel(&context, request, &response);
      if (!s.ok() || response.found()) return;
      absl::MutexLock lock(&mu_);
      auto done = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return done_; };
      mu_.AwaitWithTimeout(absl::Condition(&done), absl::Milliseconds(20));
    }
  }

  ExchangeStats Stats() override {
    absl::MutexLock lock(&mu_);
    return stats_;
  }

 private:
  std::shared_ptr<ExchangeGroup::Impl> group_;
  std::string op_id_;
  absl::Time start_;  // on the client_internal::MonotonicNow() time line
  std::thread thread_;
  absl::Mutex mu_;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  ExchangeStats stats_ ABSL_GUARDED_BY(mu_);
};

// The RPC's deadline: the operation's timeout plus headroom for the daemon's answer.
void SetOpDeadline(grpc::ClientContext* context, absl::Duration timeout) {
  if (timeout != absl::InfiniteDuration()) {
    context->set_deadline(client_internal::GrpcDeadlineIn(timeout + kRpcSlack));
  }
}

template <typename Request, typename Method>
absl::StatusOr<v1::OpResponse> CallOp(ExchangeGroup::Impl& g, Method method, const Request& request,
                                      absl::Duration timeout, grpc::ClientContext* context) {
  SetOpDeadline(context, timeout);
  v1::OpResponse response;
  grpc::Status s = (g.stub.get()->*method)(context, request, &response);
  if (!s.ok()) return FromExchangeGrpc(s, g.address);
  return response;
}

// As CallOp, but the calling thread works while the call runs: `meanwhile`
// once after the call has started, then `step` every `period` until the
// answer is in (neither is called after that). `prepare` is the stub's
// PrepareAsync method.
template <typename Request, typename Prepare>
absl::StatusOr<v1::OpResponse> CallOpWorking(ExchangeGroup::Impl& g, Prepare prepare,
                                             const Request& request, absl::Duration timeout,
                                             grpc::ClientContext* context,
                                             const std::function<void()>& meanwhile,
                                             const std::function<void()>& step,
                                             absl::Duration period) {
  SetOpDeadline(context, timeout);
  grpc::CompletionQueue cq;
  auto call = (g.stub.get()->*prepare)(context, request, &cq);
  call->StartCall();
  v1::OpResponse response;
  grpc::Status s;
  call->Finish(&response, &s, nullptr);
  if (meanwhile) meanwhile();
  void* tag;
  bool ok;
  while (true) {
    const gpr_timespec next =
        client_internal::GrpcDeadlineIn(step ? period : absl::InfiniteDuration());
    if (cq.AsyncNext(&tag, &ok, next) != grpc::CompletionQueue::TIMEOUT) break;
    step();
  }
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
  if (!s.ok()) return FromExchangeGrpc(s, g.address);
  return response;
}

// The hook of client_internal::SetPiecePublishedForTesting; null unless a
// test set one.
ABSL_CONST_INIT absl::Mutex g_hook_mu(absl::kConstInit);
client_internal::PiecePublished* g_piece_published ABSL_GUARDED_BY(g_hook_mu) = nullptr;

// Readies `seg` for a call that reads `bytes` at `data`: a streamed call
// starts with nothing published (FillStreamed writes the buffer once the
// call has started); otherwise the buffer is copied whole now.
void Stage(Segment& seg, const void* data, size_t bytes, bool streamed) {
  if (streamed) {
    seg.progress().PublishReady(0);
  } else if (bytes > 0) {
    std::memcpy(seg.base, data, bytes);
  }
}

// Copies `bytes` at `src` into `seg`'s buffer in pieces of kFillPieceBytes,
// publishing each in the progress word, so the daemon works on the first
// pieces while the rest is copied (a streamed Send or AllReduce).
void FillStreamed(Segment& seg, const uint8_t* src, size_t bytes) {
  client_internal::PiecePublished hook;
  {
    absl::MutexLock lock(&g_hook_mu);
    if (g_piece_published != nullptr) hook = *g_piece_published;
  }
  for (size_t done = 0; done < bytes;) {
    const size_t n = std::min(kFillPieceBytes, bytes - done);
    std::memcpy(seg.base + done, src + done, n);
    done += n;
    seg.progress().PublishReady(done);
    if (hook) hook(done, bytes);
  }
}

// As CallOp, for a call whose buffer was staged as streamed: starts the call,
// then fills the segment from `src` while the daemon works on it.
template <typename Request, typename Prepare>
absl::StatusOr<v1::OpResponse> CallStreamed(ExchangeGroup::Impl& g, Prepare prepare,
                                            const Request& request, absl::Duration timeout,
                                            grpc::ClientContext* context, Segment* seg,
                                            const uint8_t* src, size_t bytes) {
  return CallOpWorking(
      g, prepare, request, timeout, context, [seg, src, bytes] { FillStreamed(*seg, src, bytes); },
      nullptr, absl::ZeroDuration());
}

// Where a streamed Recv's copy out of the segment stands.
struct Drained {
  uint32_t epoch = 0;  // of the bytes copied; 0: none yet
  uint64_t bytes = 0;
};

// Copies out of `seg` what has landed beyond `drained` (up to `capacity`).
void CopyLanded(Segment& seg, uint8_t* out, size_t capacity, Drained& drained) {
  const shm::Landed landed = seg.progress().LoadLanded();
  if (landed.epoch != drained.epoch) drained = {landed.epoch, 0};  // a new message: start over
  const uint64_t upto = std::min<uint64_t>(landed.bytes, capacity);
  if (upto > drained.bytes) {
    std::memcpy(out + drained.bytes, seg.base + drained.bytes, upto - drained.bytes);
    drained.bytes = upto;
  }
}

}  // namespace

void client_internal::SetPiecePublishedForTesting(PiecePublished hook) {
  auto* fresh = hook ? new PiecePublished(std::move(hook)) : nullptr;
  absl::MutexLock lock(&g_hook_mu);
  delete g_piece_published;
  g_piece_published = fresh;
}

ExchangeGroup::ExchangeGroup(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}

ExchangeGroup::~ExchangeGroup() {
  grpc::ClientContext context;
  context.set_deadline(client_internal::GrpcDeadlineIn(absl::Seconds(5)));
  v1::LeaveRequest request;
  request.set_group(impl_->name);
  v1::LeaveResponse response;
  impl_->stub->Leave(&context, request, &response);  // best effort
}

absl::StatusOr<std::unique_ptr<ExchangeGroup>> ExchangeGroup::Join(
    const std::string& daemon_address, const std::string& name, std::vector<std::string> sites,
    absl::Duration deadline) {
  auto impl = std::make_shared<Impl>();
  impl->address = daemon_address;
  impl->name = name;
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(64 << 20);
  impl->channel =
      grpc::CreateCustomChannel(daemon_address, grpc::InsecureChannelCredentials(), args);
  const absl::Time until = client_internal::MonotonicNow() + deadline;
  if (!impl->channel->WaitForConnected(client_internal::GrpcDeadlineAt(
          std::min(until, client_internal::MonotonicNow() + absl::Seconds(10))))) {
    return absl::UnavailableError(absl::StrCat("cannot reach longhauld at ", daemon_address));
  }
  impl->stub = v1::Exchange::NewStub(impl->channel);
  v1::JoinRequest request;
  request.set_group(name);
  for (const auto& s : sites) request.add_sites(s);
  request.set_timeout_ms(
      Millis(std::max(until - client_internal::MonotonicNow(), absl::Milliseconds(1))));
  grpc::ClientContext context;
  context.set_deadline(client_internal::GrpcDeadlineAt(until + kRpcSlack));
  v1::JoinResponse response;
  if (absl::Status s =
          FromExchangeGrpc(impl->stub->Join(&context, request, &response), daemon_address);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = FromExchangeError(response.error()); !s.ok()) return s;
  impl->local_site = response.view().local_site();
  impl->streamed = response.streamed_buffers();
  impl->streamed_all_reduce = response.streamed_all_reduce();
  impl->segment_socket = SegmentSocketPath(daemon_address, response.segment_socket());
  impl->Observe(response.view());
  return std::unique_ptr<ExchangeGroup>(new ExchangeGroup(std::move(impl)));
}

std::unique_ptr<ExchangeWork> ExchangeGroup::AllReduce(void* data, size_t count, DType dtype,
                                                       const AllReduceOptions& options) {
  const size_t bytes = count * ElementSize(dtype);
  auto seg = impl_->Acquire(bytes);
  if (!seg.ok()) return std::make_unique<Work>(seg.status());
  // A daemon that takes it reduces and sends the first pieces while the rest
  // is copied in; an older one gets the buffer whole before the call.
  const bool streamed = impl_->streamed_all_reduce && bytes > 0;
  Stage(**seg, data, bytes, streamed);
  v1::AllReduceRequest request;
  request.set_group(impl_->name);
  request.set_op_id(RandomHex());
  {
    absl::MutexLock lock(&impl_->mu);
    request.set_seq(impl_->next_seq++);
  }
  (*seg)->Describe(bytes, request.mutable_buffer());
  request.set_dtype(ToProto(dtype));
  request.set_op(options.op == ReduceOp::kAvg ? v1::AVG : v1::SUM);
  request.set_quantize_int8(options.quantize_int8);
  request.set_timeout_ms(Millis(options.timeout));
  request.set_tag(options.tag);
  request.set_streamed(streamed);
  auto impl = impl_;
  absl::Duration timeout = options.timeout;
  auto src = static_cast<const uint8_t*>(data);
  return std::make_unique<Work>(
      impl_, request.op_id(), std::move(*seg),
      [impl, request, timeout, streamed, src, bytes](grpc::ClientContext* context, Segment* seg) {
        if (!streamed) {
          return CallOp(*impl, &v1::Exchange::Stub::AllReduce, request, timeout, context);
        }
        return CallStreamed(*impl, &v1::Exchange::Stub::PrepareAsyncAllReduce, request, timeout,
                            context, seg, src, bytes);
      },
      // Only after a successful answer: a failed call leaves the caller's
      // buffer holding its input, so a peer-lost all-reduce can be retried
      // with it as it is. The segment holds the result, or whatever a failed
      // call left there.
      [data, bytes](const v1::OpResponse&, Segment& seg) { std::memcpy(data, seg.base, bytes); });
}

std::unique_ptr<ExchangeWork> ExchangeGroup::AllGather(const void* data, size_t bytes, void* out,
                                                       size_t out_capacity,
                                                       const CollectiveOptions& options) {
  // One segment: the input, then the output.
  auto seg = impl_->Acquire(bytes + out_capacity);
  if (!seg.ok()) return std::make_unique<Work>(seg.status());
  if (bytes > 0) std::memcpy((*seg)->base, data, bytes);
  v1::AllGatherRequest request;
  request.set_group(impl_->name);
  request.set_op_id(RandomHex());
  {
    absl::MutexLock lock(&impl_->mu);
    request.set_seq(impl_->next_seq++);
  }
  (*seg)->Describe(bytes, request.mutable_input());
  (*seg)->Describe(out_capacity, request.mutable_output());
  request.mutable_output()->set_offset(shm::kDataOffset + bytes);
  request.set_timeout_ms(Millis(options.timeout));
  request.set_tag(options.tag);
  auto impl = impl_;
  absl::Duration timeout = options.timeout;
  return std::make_unique<Work>(
      impl_, request.op_id(), std::move(*seg),
      [impl, request, timeout](grpc::ClientContext* context, Segment*) {
        return CallOp(*impl, &v1::Exchange::Stub::AllGather, request, timeout, context);
      },
      [out, bytes, out_capacity](const v1::OpResponse& response, Segment& seg) {
        const size_t gathered = std::min<size_t>(
            out_capacity, static_cast<size_t>(response.stats().peers() + 1) * bytes);
        if (gathered > 0) std::memcpy(out, seg.base + bytes, gathered);
      });
}

absl::Status ExchangeGroup::AllGatherSync(const void* data, size_t bytes, void* out,
                                          size_t out_capacity, const CollectiveOptions& options) {
  return AllGather(data, bytes, out, out_capacity, options)->Wait();
}

std::unique_ptr<ExchangeWork> ExchangeGroup::Broadcast(void* data, size_t bytes,
                                                       const std::string& root,
                                                       const CollectiveOptions& options) {
  auto seg = impl_->Acquire(bytes);
  if (!seg.ok()) return std::make_unique<Work>(seg.status());
  const bool is_root = root == impl_->local_site;
  if (is_root && bytes > 0) std::memcpy((*seg)->base, data, bytes);
  v1::BroadcastRequest request;
  request.set_group(impl_->name);
  request.set_op_id(RandomHex());
  {
    absl::MutexLock lock(&impl_->mu);
    request.set_seq(impl_->next_seq++);
  }
  request.set_root(root);
  (*seg)->Describe(bytes, request.mutable_buffer());
  request.set_timeout_ms(Millis(options.timeout));
  request.set_tag(options.tag);
  auto impl = impl_;
  absl::Duration timeout = options.timeout;
  std::function<void(const v1::OpResponse&, Segment&)> finish;
  if (!is_root && bytes > 0) {
    finish = [data, bytes](const v1::OpResponse&, Segment& seg) {
      std::memcpy(data, seg.base, bytes);
    };
  }
  return std::make_unique<Work>(
      impl_, request.op_id(), std::move(*seg),
      [impl, request, timeout](grpc::ClientContext* context, Segment*) {
        return CallOp(*impl, &v1::Exchange::Stub::Broadcast, request, timeout, context);
      },
      std::move(finish));
}

absl::Status ExchangeGroup::BroadcastSync(void* data, size_t bytes, const std::string& root,
                                          const CollectiveOptions& options) {
  return Broadcast(data, bytes, root, options)->Wait();
}

absl::Status ExchangeGroup::AllReduceSync(void* data, size_t count, DType dtype,
                                          const AllReduceOptions& options) {
  return AllReduce(data, count, dtype, options)->Wait();
}

namespace {

// A streamed Send (the daemon supports it) starts the call first and fills
// the segment while the daemon sends what is filled; otherwise the buffer is
// copied whole before the call.
std::unique_ptr<Work> StartSend(const std::shared_ptr<ExchangeGroup::Impl>& group,
                                const std::string& site, const std::string& tag, const void* data,
                                size_t bytes, absl::Duration timeout, bool on_caller) {
  auto seg = group->Acquire(bytes);
  if (!seg.ok()) return std::make_unique<Work>(seg.status());
  const bool streamed = group->streamed && bytes > 0;
  Stage(**seg, data, bytes, streamed);
  v1::SendRequest request;
  request.set_group(group->name);
  request.set_op_id(RandomHex());
  request.set_peer(site);
  request.set_tag(tag);
  (*seg)->Describe(bytes, request.mutable_buffer());
  request.set_timeout_ms(Millis(timeout));
  request.set_streamed(streamed);
  auto impl = group;
  auto src = static_cast<const uint8_t*>(data);
  return std::make_unique<Work>(
      group, request.op_id(), std::move(*seg),
      [impl, request, timeout, streamed, src, bytes](grpc::ClientContext* context, Segment* seg) {
        if (!streamed) return CallOp(*impl, &v1::Exchange::Stub::Send, request, timeout, context);
        return CallStreamed(*impl, &v1::Exchange::Stub::PrepareAsyncSend, request, timeout, context,
                            seg, src, bytes);
      },
      nullptr, on_caller);
}

// A streamed Recv copies the message out of the segment while it arrives;
// once the call succeeds it copies the rest, or all of it if what it copied
// belongs to a message that did not complete (shm_progress.h).
std::unique_ptr<Work> StartRecv(const std::shared_ptr<ExchangeGroup::Impl>& group,
                                const std::string& site, const std::string& tag, void* data,
                                size_t bytes, absl::Duration timeout, bool on_caller) {
  auto seg = group->Acquire(bytes);
  if (!seg.ok()) return std::make_unique<Work>(seg.status());
  const bool streamed = group->streamed && bytes > 0;
  if (streamed) (*seg)->progress().Reset();
  v1::RecvRequest request;
  request.set_group(group->name);
  request.set_op_id(RandomHex());
  request.set_peer(site);
  request.set_tag(tag);
  (*seg)->Describe(bytes, request.mutable_buffer());
  request.set_timeout_ms(Millis(timeout));
  request.set_streamed(streamed);
  auto impl = group;
  auto out = static_cast<uint8_t*>(data);
  // Shared by the call (which copies out early) and `finish` (the rest).
  auto drained = std::make_shared<Drained>();
  return std::make_unique<Work>(
      group, request.op_id(), std::move(*seg),
      [impl, request, timeout, streamed, out, bytes, drained](grpc::ClientContext* context,
                                                              Segment* seg) {
        if (!streamed) return CallOp(*impl, &v1::Exchange::Stub::Recv, request, timeout, context);
        return CallOpWorking(
            *impl, &v1::Exchange::Stub::PrepareAsyncRecv, request, timeout, context, nullptr,
            [seg, out, bytes, drained] { CopyLanded(*seg, out, bytes, *drained); }, kDrainPoll);
      },
      [out, bytes, streamed, drained](const v1::OpResponse& r, Segment& seg) {
        const size_t n = std::min<size_t>(r.bytes(), bytes);
        size_t from = 0;
        if (streamed && drained->epoch != 0 &&
            seg.progress().LoadLanded().epoch == drained->epoch) {
          from = std::min<size_t>(drained->bytes, n);
        }
        std::memcpy(out + from, seg.base + from, n - from);
      },
      on_caller);
}

}  // namespace

std::unique_ptr<ExchangeWork> ExchangeGroup::SendAsync(const std::string& site,
                                                       const std::string& tag, const void* data,
                                                       size_t bytes, absl::Duration timeout) {
  return StartSend(impl_, site, tag, data, bytes, timeout, /*on_caller=*/false);
}

std::unique_ptr<ExchangeWork> ExchangeGroup::RecvAsync(const std::string& site,
                                                       const std::string& tag, void* data,
                                                       size_t bytes, absl::Duration timeout) {
  return StartRecv(impl_, site, tag, data, bytes, timeout, /*on_caller=*/false);
}

absl::Status ExchangeGroup::Send(const std::string& site, const std::string& tag, const void* data,
                                 size_t bytes, absl::Duration timeout) {
  return StartSend(impl_, site, tag, data, bytes, timeout, /*on_caller=*/true)
      ->Wait(absl::InfiniteDuration());
}

absl::StatusOr<size_t> ExchangeGroup::Recv(const std::string& site, const std::string& tag,
                                           void* data, size_t bytes, absl::Duration timeout) {
  auto work = StartRecv(impl_, site, tag, data, bytes, timeout, /*on_caller=*/true);
  if (absl::Status s = work->Wait(absl::InfiniteDuration()); !s.ok()) return s;
  return static_cast<size_t>(work->Stats().bytes_received);
}

const std::string& ExchangeGroup::name() const { return impl_->name; }
const std::string& ExchangeGroup::local_site() const { return impl_->local_site; }

uint64_t ExchangeGroup::generation() const {
  absl::MutexLock lock(&impl_->mu);
  return impl_->generation;
}

std::vector<std::string> ExchangeGroup::members() const {
  absl::MutexLock lock(&impl_->mu);
  return impl_->members;
}

}  // namespace longhaul
