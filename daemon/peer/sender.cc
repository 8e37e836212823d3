#include "daemon/peer/sender.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <future>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/clock.h"
#include "common/fmt_absl.h"
#include "daemon/peer/messaging.h"
#include "spdlog/spdlog.h"
#include "storage/chunk_io.h"
#include "storage/content_check.h"
#include "storage/file_io.h"
#include "storage/file_system.h"
#include "storage/manifest.h"

namespace longhaul::peer {
namespace {

constexpr absl::Duration kMinBackoff = absl::Milliseconds(500);
constexpr absl::Duration kMaxBackoff = absl::Seconds(30);
// Per stream, the most chunks sent and not yet acknowledged (see StreamLoop).
constexpr size_t kMaxPipelinedChunks = 64;
// Per stream, the most bytes sent and not yet acknowledged, in chunk sizes (see StreamLoop).
constexpr uint64_t kMaxUnackedChunkSizes = 2;
// Read size when hashing whole source files for sync --checksum.
constexpr size_t kDigestReadSize = size_t{8} << 20;
// The share of the configured link a transfer's streams pace at, together
// (see StreamPacingLimit).
constexpr double kBulkLinkShare = 0.95;

// Errors after which trying again later can succeed without an operator.
bool IsRetryable(const absl::Status& s) {
  switch (s.code()) {
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kResourceExhausted:
    case absl::StatusCode::kAborted:
    case absl::StatusCode::kDeadlineExceeded:
    case absl::StatusCode::kCancelled:  // a channel aborted under us
    case absl::StatusCode::kUnknown:
      return true;
    default:
      return false;
  }
}

uint64_t ChunkKey(uint32_t file_index, uint32_t chunk_index) {
  return (static_cast<uint64_t>(file_index) << 32) | chunk_index;
}

}  // namespace

TransferSender::TransferSender(const daemon::DaemonConfig& config, transport::Transport& control,
                               transport::Transport& data, PriorityGate& gate,
                               storage::Journal& journal, v1::OutgoingTransfer record,
                               TransferProgress& progress, LinkObserver observer)
    : config_(config),
      control_transport_(control),
      data_transport_(data),
      gate_(gate),
      journal_(journal),
      progress_(progress),
      observer_(std::move(observer)),
      record_(std::move(record)) {
  // Bytes sent before a crash were counted in the journal just before they
  // left; take them over so resent bytes stay honest across restarts.
  auto counters = journal_.GetOutgoingCounters(record_.id());
  if (counters.ok() && *counters && (*counters)->bytes_sent() > record_.bytes_sent()) {
    record_.set_bytes_sent((*counters)->bytes_sent());
  }
}

v1::OutgoingTransfer TransferSender::record() const {
  absl::MutexLock lock(&mu_);
  return record_;
}

void TransferSender::Drain() {
  drain_.store(true);
  if (!wake_.HasBeenNotified()) wake_.Notify();
}

void TransferSender::Stop() {
  stop_.store(true);
  if (!wake_.HasBeenNotified()) wake_.Notify();
  AbortChannels();
}

void TransferSender::AbortChannels() {
  absl::MutexLock lock(&mu_);
  for (transport::Channel* c : channels_) c->Abort();
}

absl::Status TransferSender::Run() {
  int failures = 0;
  // The give-up deadline is on the monotonic clock: a wall-clock step
  // neither fails a transfer early nor keeps a dead one going.
  const Clock& clock = RealClock::Get();
  Timestamp last_progress = clock.Now();
  uint64_t best_done = progress_.Get().bytes_done;
  while (true) {
    if (stopping()) return absl::CancelledError("stopped");
    uint32_t attempts;
    {
      absl::MutexLock lock(&mu_);
      record_.set_attempts(record_.attempts() + 1);
      attempts = record_.attempts();
    }
    progress_.Update([&](TransferProgress::Snapshot& s) { s.attempts = attempts; });
    absl::Status status = RunAttempt();
    if (status.ok()) {
      progress_.Update([](TransferProgress::Snapshot& s) { s.error.clear(); });
      return status;
    }
    if (stopping()) return absl::CancelledError("stopped");

    std::optional<uint32_t> changed;
    {
      absl::MutexLock lock(&mu_);
      changed.swap(changed_file_);
    }
    if (changed) {
      // Not a failure: re-send that file whole under a new generation.
      if (absl::Status s = RefreshChangedFile(*changed); !s.ok()) return s;
      failures = 0;
      continue;
    }

    progress_.Update(
        [&](TransferProgress::Snapshot& s) { s.error = std::string(status.message()); });
    if (!IsRetryable(status)) return status;

    uint64_t done = progress_.Get().bytes_done;
    if (done > best_done) {
      best_done = done;
      failures = 0;
      last_progress = clock.Now();
    }
    const TimeDelta stalled = clock.Now() - last_progress;
    if (config_.transfer.give_up_after_us > 0 &&
        stalled >
            TimeDelta::Microseconds(static_cast<int64_t>(config_.transfer.give_up_after_us))) {
      return absl::DeadlineExceededError(absl::StrCat(
          "no progress for ", absl::FormatDuration(absl::Nanoseconds(stalled.ToNanoseconds())),
          "; last error: ", status.message()));
    }
    absl::Duration backoff = std::min(kMaxBackoff, kMinBackoff * (1 << std::min(failures, 6)));
    ++failures;
    spdlog::warn("transfer {}: {}; retrying in {}", record().id(), status.message(),
                 absl::FormatDuration(backoff));
    wake_.WaitForNotificationWithTimeout(backoff);
  }
}

absl::Status TransferSender::RunAttempt() {
  if (this->record().spec().checksum()) {
    if (absl::Status s = DigestSources(); !s.ok()) return s;
  }
  const v1::OutgoingTransfer record = this->record();
  const v1::TransferSpec& spec = record.spec();
  const daemon::PeerConfig* peer = config_.FindPeer(spec.dest_site());
  if (peer == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("site ", spec.dest_site(), " is not a configured peer of ", config_.site));
  }
  const uint64_t session_id = SessionIdFor(record.id());
  const v1::Manifest& manifest = record.manifest();
  const uint64_t chunk_size = manifest.chunk_size();

  // The data channels are dialed while the control session opens: each dial
  // takes round trips of its own (TCP, TLS and, for udp, the key exchange)
  // that need not wait for the Open answer; only their Hello must, since the
  // peer routes a stream to its open session. This starts the data 3 round
  // trips sooner. Channels the Open answer leaves without chunks (a resumed
  // or synced transfer) are closed unused.
  uint32_t streams = spec.streams() ? spec.streams() : config_.transfer.streams;
  uint64_t manifest_chunks = 0;
  for (const v1::ManifestFile& file : manifest.files()) {
    manifest_chunks += storage::ChunkCount(file, chunk_size);
  }
  streams = static_cast<uint32_t>(std::min<uint64_t>(streams, manifest_chunks));
  std::vector<std::future<absl::StatusOr<std::unique_ptr<transport::Channel>>>> data_dials;
  for (uint32_t i = 0; i < streams; ++i) {
    data_dials.push_back(
        std::async(std::launch::async, [this, site = peer->site, address = peer->address] {
          return data_transport_.Dial(site, address);
        }));
  }

  v1::Hello hello;
  hello.set_role(v1::Hello::CONTROL);
  hello.set_transfer_id(record.id());
  auto control = DialSession(control_transport_, peer->site, peer->address, hello);
  if (!control.ok()) return control.status();
  {
    absl::MutexLock lock(&mu_);
    channels_.insert(control->get());
  }
  struct Unregister {
    TransferSender* self;
    transport::Channel* channel;
    ~Unregister() {
      absl::MutexLock lock(&self->mu_);
      self->channels_.erase(channel);
    }
  } unregister{this, control->get()};
  if (stop_.load()) return absl::CancelledError("stopped");

  v1::PeerMessage request;
  v1::OpenRequest* open = request.mutable_open();
  open->set_transfer_id(record.id());
  open->set_source_site(config_.site);
  open->set_export_name(spec.dest_export());
  open->set_dest_path(spec.dest_path());
  *open->mutable_manifest() = record.manifest();
  *open->mutable_commit_last() = record.commit_last();
  open->set_skip_unchanged(spec.sync());
  open->set_single_file(record.single_file());
  open->set_keep_checkpoints(spec.keep_checkpoints());
  open->set_checkpoint_marker(spec.checkpoint_marker());
  open->set_compare_content(spec.sync() && spec.checksum());
  auto opened = Call(**control, session_id, request);
  if (!opened.ok()) return opened.status();
  const v1::OpenReply& reply = opened->open_reply();

  absl::flat_hash_set<uint32_t> unchanged(reply.unchanged_files().begin(),
                                          reply.unchanged_files().end());
  absl::flat_hash_set<uint64_t> durable;
  for (const v1::ChunkId& id : reply.durable())
    durable.insert(ChunkKey(id.file_index(), id.chunk_index()));

  TransferProgress::Snapshot totals;
  std::deque<Chunk> queue;
  for (int f = 0; f < manifest.files_size(); ++f) {
    if (unchanged.contains(f)) {
      ++totals.files_unchanged;
      continue;
    }
    const v1::ManifestFile& file = manifest.files(f);
    totals.bytes_total += file.size();
    uint64_t n = storage::ChunkCount(file, chunk_size);
    totals.chunks_total += n;
    for (uint64_t c = 0; c < n; ++c) {
      uint64_t size = storage::ChunkSize(file, c, chunk_size);
      if (durable.contains(ChunkKey(f, c))) {
        totals.bytes_done += size;
        ++totals.chunks_done;
      } else {
        queue.push_back({static_cast<uint32_t>(f), static_cast<uint32_t>(c), size});
      }
    }
  }
  uint64_t bytes_sent;
  {
    absl::MutexLock lock(&mu_);
    queue_ = std::move(queue);
    in_flight_bytes_ = 0;
    bytes_sent = record_.bytes_sent();
  }
  progress_.Update([&](TransferProgress::Snapshot& s) {
    s.bytes_total = totals.bytes_total;
    s.bytes_done = totals.bytes_done;
    s.chunks_total = totals.chunks_total;
    s.chunks_done = totals.chunks_done;
    s.files_unchanged = totals.files_unchanged;
    s.bytes_sent = bytes_sent;
    s.resent_bytes = bytes_sent > totals.bytes_done ? bytes_sent - totals.bytes_done : 0;
  });

  size_t pending;
  {
    absl::MutexLock lock(&mu_);
    pending = queue_.size();
  }
  streams = static_cast<uint32_t>(std::min<size_t>(streams, pending));
  if (streams > 0) {
    PriorityGate::Scope active = gate_.Enter(peer->site, spec.priority());
    std::vector<absl::Status> results(streams);
    std::vector<std::thread> threads;
    for (uint32_t i = 0; i < streams; ++i) {
      threads.emplace_back([&, i] {
        v1::Hello data_hello;
        data_hello.set_role(v1::Hello::DATA);
        data_hello.set_transfer_id(record.id());
        data_hello.set_stream_index(i);
        auto channel = data_dials[i].get();
        if (!channel.ok()) {
          results[i] = channel.status();
        } else if (absl::Status s = SendHello(**channel, data_hello); !s.ok()) {
          results[i] = s;
        } else {
          results[i] = StreamLoop(i, session_id, std::move(*channel));
        }
        if (!results[i].ok() && !stopping()) AbortChannels();  // fail the attempt fast
      });
    }
    for (std::thread& t : threads) t.join();
    progress_.Update([](TransferProgress::Snapshot& s) { s.active_streams = 0; });
    if (stopping()) return absl::CancelledError("stopped");
    // Report the cause, not the aborts it triggered in sibling streams.
    absl::Status first = absl::OkStatus();
    for (const absl::Status& r : results) {
      if (r.ok()) continue;
      if (first.ok() || first.code() == absl::StatusCode::kCancelled) first = r;
    }
    if (!first.ok()) return first;
  }

  // Every chunk is durable. A source file touched after its chunks were read
  // must not be published mixed: check them all once more.
  if (std::optional<uint32_t> changed = FindChangedSource()) {
    absl::MutexLock lock(&mu_);
    changed_file_ = changed;
    return absl::AbortedError("source changed");
  }
  progress_.Update([](TransferProgress::Snapshot& s) { s.error.clear(); });
  v1::PeerMessage commit;
  commit.mutable_commit()->set_transfer_id(record.id());
  auto committed = Call(**control, session_id, commit);
  if (!committed.ok()) return committed.status();
  return absl::OkStatus();
}

Bandwidth TransferSender::StreamPacingLimit(Bandwidth link, uint32_t streams) {
  return link * kBulkLinkShare / std::max<uint32_t>(streams, 1);
}

void TransferSender::ChangeSendingStreams(int delta) {
  absl::MutexLock lock(&mu_);
  sending_streams_ += delta;
  const Bandwidth each = StreamPacingLimit(
      Bandwidth::BitsPerSecond(static_cast<int64_t>(config_.link.bandwidth_bps)), sending_streams_);
  for (transport::Channel* channel : channels_) channel->LimitPacingRate(each);
}

void TransferSender::AddBytesSent(uint64_t bytes) {
  v1::OutgoingCounters counters;
  std::string id;
  {
    absl::MutexLock lock(&mu_);
    record_.set_bytes_sent(record_.bytes_sent() + bytes);
    counters.set_bytes_sent(record_.bytes_sent());
    id = record_.id();
  }
  // Unsynced: it only has to survive a process crash, which it does.
  if (absl::Status s = journal_.PutOutgoingCounters(id, counters); !s.ok()) {
    spdlog::warn("transfer {}: cannot journal counters: {}", id, s.message());
  }
}

absl::Status TransferSender::StreamLoop(uint32_t stream_index, uint64_t session_id,
                                        std::unique_ptr<transport::Channel> channel) {
  {
    absl::MutexLock lock(&mu_);
    channels_.insert(channel.get());
  }
  // While this stream may still send chunks it counts among the streams that
  // share the pacing cap; the rest speed up as streams run out of chunks.
  struct Unregister {
    TransferSender* self;
    transport::Channel* channel;
    bool sending = true;
    void StopSending() {
      if (!sending) return;
      sending = false;
      self->ChangeSendingStreams(-1);
    }
    ~Unregister() {
      StopSending();
      absl::MutexLock lock(&self->mu_);
      self->channels_.erase(channel);
    }
  } unregister{this, channel.get()};
  ChangeSendingStreams(+1);
  if (stop_.load()) return absl::CancelledError("stopped");
  // Hashing and encrypting chunks must not hold the CPU from an exchange,
  // and a paused stream must not leave a backlog queued ahead of one.
  PriorityGate::LowerThreadPriority(this->record().spec().priority());
  channel->LimitUnsentBytes(PriorityGate::kBulkUnsentBytes);
  progress_.Update([](TransferProgress::Snapshot& s) { ++s.active_streams; });

  const v1::OutgoingTransfer record = this->record();
  const v1::Manifest& manifest = record.manifest();
  const uint64_t chunk_size = manifest.chunk_size();
  std::unique_ptr<storage::FileIo> io = storage::MakeFileIo();
  std::vector<uint8_t> buffer(chunk_size);
  int fd = -1;
  uint32_t fd_file = UINT32_MAX;
  struct CloseFd {
    int* fd;
    ~CloseFd() {
      if (*fd >= 0) ::close(*fd);
    }
  } close_fd{&fd};

  auto source_changed = [&](uint32_t file_index, const absl::Status& why) {
    spdlog::info("transfer {}: {}; it will be sent again whole", record.id(), why.message());
    absl::MutexLock lock(&mu_);
    changed_file_ = file_index;
    return absl::AbortedError(why.message());
  };

  // Chunks sent on this stream and not acknowledged yet, oldest first (the
  // receiver answers in order). Up to kMaxUnackedChunkSizes x chunk_size of
  // bytes are pipelined: a stream sends its next chunk while the last one is
  // still on the wire and being made durable (a round trip plus an fdatasync
  // that would otherwise leave it idle for every chunk; with one chunk the
  // wan-lossy udp run lost ~5 % of its goodput so), and small chunks (ends of
  // files, small files) do not cost a round trip each. What a crash can make
  // us re-send stays within streams x kMaxUnackedChunkSizes x chunk_size.
  std::deque<Chunk> unacked;
  uint64_t unacked_bytes = 0;
  auto next_fits = [&] {
    absl::MutexLock lock(&mu_);
    return !queue_.empty() && unacked.size() < kMaxPipelinedChunks &&
           unacked_bytes + queue_.front().size <= kMaxUnackedChunkSizes * chunk_size;
  };
  // Reads the ack of unacked.front() and applies it.
  auto await_ack = [&]() -> absl::Status {
    auto ack_header = ReadFrameHeader(*channel, kChunkAckFixedSize + kMaxAckMessage);
    if (!ack_header.ok()) return ack_header.status();
    if (ack_header->type != FrameType::kChunkAck || ack_header->session_id != session_id) {
      return absl::InvalidArgumentError(
          absl::StrCat(channel->peer_site(), " answered a chunk with an unexpected frame"));
    }
    std::vector<uint8_t> ack_bytes(ack_header->payload_length);
    if (absl::Status s = channel->ReadExactly(absl::MakeSpan(ack_bytes)); !s.ok()) return s;
    auto ack = ParseChunkAck(ack_bytes);
    if (!ack.ok()) return ack.status();
    const Chunk chunk = unacked.front();
    if (ack->file_index != chunk.file_index || ack->chunk_index != chunk.chunk_index) {
      return absl::InvalidArgumentError(
          absl::StrCat(channel->peer_site(), " acknowledged a chunk that was not sent"));
    }
    unacked.pop_front();
    unacked_bytes -= chunk.size;
    {
      absl::MutexLock lock(&mu_);
      in_flight_bytes_ -= chunk.size;
      if (ack->result == ChunkAck::Result::kHashMismatch) queue_.push_front(chunk);
    }
    switch (ack->result) {
      case ChunkAck::Result::kDurable: {
        progress_.Update([&](TransferProgress::Snapshot& s) {
          s.bytes_done += chunk.size;
          ++s.chunks_done;
        });
        if (observer_) observer_(channel->peer_site(), channel->Stats());
        break;
      }
      case ChunkAck::Result::kHashMismatch:
        spdlog::warn("transfer {}: {} reports a corrupted chunk {} of {}; sending it again",
                     record.id(), channel->peer_site(), chunk.chunk_index,
                     manifest.files(chunk.file_index).path());
        break;
      case ChunkAck::Result::kRetryLater:
        return absl::ResourceExhaustedError(
            absl::StrCat(channel->peer_site(), " cannot store data: ", ack->message));
      case ChunkAck::Result::kRefused:
        return absl::FailedPreconditionError(
            absl::StrCat(channel->peer_site(), " refused a chunk: ", ack->message));
    }
    // Bytes that left more than once: everything sent beyond what is durable
    // or still on its way.
    uint64_t in_flight;
    {
      absl::MutexLock lock(&mu_);
      in_flight = in_flight_bytes_;
    }
    progress_.Update([&](TransferProgress::Snapshot& s) {
      uint64_t accounted = s.bytes_done + in_flight;
      s.resent_bytes = s.bytes_sent > accounted ? s.bytes_sent - accounted : 0;
    });
    return absl::OkStatus();
  };

  while (!stopping()) {
    bool queue_empty;
    {
      absl::MutexLock lock(&mu_);
      queue_empty = queue_.empty();
    }
    if (queue_empty) {
      unregister.StopSending();
      // Done once everything sent here is acknowledged; an ack may requeue
      // a chunk (hash mismatch), which is then sent again.
      if (unacked.empty()) break;
      if (absl::Status s = await_ack(); !s.ok()) return s;
      continue;
    }
    // Chunk boundary: a higher class on this link goes first.
    gate_.WaitForTurn(record.spec().dest_site(), record.spec().priority(), stop_);
    if (stopping()) break;
    if (rate_limiter_ != nullptr) {
      // Charged by the size of the next chunk; a sibling stream may take
      // that one, but chunks differ in size only at the end of a file.
      uint64_t next_size;
      {
        absl::MutexLock lock(&mu_);
        if (queue_.empty()) continue;
        next_size = queue_.front().size;
      }
      if (!rate_limiter_->Acquire(record.spec().dest_site(), record.spec().priority(), next_size,
                                  [this] { return stopping(); })) {
        break;
      }
    }
    Chunk chunk;
    {
      absl::MutexLock lock(&mu_);
      if (queue_.empty()) continue;
      chunk = queue_.front();
      queue_.pop_front();
      in_flight_bytes_ += chunk.size;
    }
    const v1::ManifestFile& file = manifest.files(chunk.file_index);
    if (fd_file != chunk.file_index) {
      if (fd >= 0) ::close(fd);
      const std::string& path = record.source_paths(chunk.file_index);
      fd = storage::OpenCheckedSource(path);
      fd_file = chunk.file_index;
      if (fd < 0) {
        if (errno == ENOENT) {
          return absl::FailedPreconditionError(
              absl::StrCat("source file ", path, " was removed during the transfer"));
        }
        return absl::UnavailableError(
            absl::StrCat("cannot open ", path, ": ", std::strerror(errno)));
      }
    }
    // The identity is checked before and after the read, so the bytes we
    // hash belong to the file the manifest describes.
    if (absl::Status s = storage::CheckSourceUnchanged(file, fd); !s.ok()) {
      return s.code() == absl::StatusCode::kAborted ? source_changed(chunk.file_index, s) : s;
    }
    absl::Span<uint8_t> data(buffer.data(), chunk.size);
    auto hash = storage::ReadChunkHashed(*io, fd, chunk.chunk_index * chunk_size, data);
    if (!hash.ok()) {
      return hash.status().code() == absl::StatusCode::kAborted
                 ? source_changed(chunk.file_index, hash.status())
                 : hash.status();
    }
    if (absl::Status s = storage::CheckSourceUnchanged(file, fd); !s.ok()) {
      return s.code() == absl::StatusCode::kAborted ? source_changed(chunk.file_index, s) : s;
    }

    ChunkHeader header{chunk.file_index, chunk.chunk_index, file.generation(), hash->low,
                       hash->high};
    std::array<uint8_t, kChunkHeaderSize> header_bytes;
    EncodeChunkHeader(header, header_bytes);
    AddBytesSent(chunk.size);
    progress_.Update([&](TransferProgress::Snapshot& s) { s.bytes_sent += chunk.size; });
    // Written in slices: an exchange that starts mid-chunk goes first.
    std::array<uint8_t, kFrameHeaderSize> frame_header;
    EncodeFrameHeader(
        {FrameType::kChunk, static_cast<uint32_t>(kChunkHeaderSize + data.size()), session_id},
        frame_header);
    if (absl::Status s =
            gate_.WriteYielding(*channel,
                                {absl::Span<const uint8_t>(frame_header),
                                 absl::Span<const uint8_t>(header_bytes), data},
                                record.spec().dest_site(), record.spec().priority(), stop_);
        !s.ok()) {
      return s;
    }

    unacked.push_back(chunk);
    unacked_bytes += chunk.size;
    // Wait for acks until the next chunk fits the pipeline (or, with the
    // queue empty, until this stream has nothing unacknowledged).
    while (!unacked.empty() && !next_fits()) {
      if (absl::Status s = await_ack(); !s.ok()) return s;
    }
  }
  return absl::OkStatus();
}

absl::Status TransferSender::DigestSources() {
  const v1::OutgoingTransfer record = this->record();
  const v1::Manifest& manifest = record.manifest();
  std::unique_ptr<storage::FileIo> io;
  std::vector<uint8_t> buffer;
  const Timestamp start = RealClock::Get().Now();
  uint64_t files = 0, bytes = 0;
  for (int f = 0; f < manifest.files_size(); ++f) {
    const v1::ManifestFile& file = manifest.files(f);
    if (!file.content_xxh128().empty()) continue;
    if (stopping()) return absl::CancelledError("stopped");
    if (io == nullptr) {
      io = storage::MakeFileIo();
      buffer.resize(kDigestReadSize);
    }
    const std::string& path = record.source_paths(f);
    const int fd = storage::OpenCheckedSource(path);
    if (fd < 0) {
      if (errno == ENOENT) {
        return absl::FailedPreconditionError(
            absl::StrCat("source file ", path, " was removed during the transfer"));
      }
      return absl::UnavailableError(absl::StrCat("cannot open ", path, ": ", std::strerror(errno)));
    }
    // The identity is checked before and after the read, so the digest
    // belongs to the file the manifest describes.
    auto read_digest = [&]() -> absl::StatusOr<storage::Xxh128> {
      if (absl::Status s = storage::CheckSourceUnchanged(file, fd); !s.ok()) return s;
      absl::StatusOr<storage::Xxh128> d = storage::HashFileContent(
          *io, fd, file.size(), absl::MakeSpan(buffer), [this] { return stopping(); });
      if (!d.ok()) return d;
      if (absl::Status s = storage::CheckSourceUnchanged(file, fd); !s.ok()) return s;
      return d;
    };
    const absl::StatusOr<storage::Xxh128> digest = read_digest();
    ::close(fd);
    if (absl::IsAborted(digest.status())) {
      spdlog::info("transfer {}: {}; it will be hashed again", record.id(),
                   digest.status().message());
      absl::MutexLock lock(&mu_);
      changed_file_ = f;
      return digest.status();
    }
    if (!digest.ok()) return digest.status();
    const std::array<uint8_t, 16> digest_bytes = digest->ToBytes();
    {
      absl::MutexLock lock(&mu_);
      record_.mutable_manifest()->mutable_files(f)->set_content_xxh128(digest_bytes.data(),
                                                                       digest_bytes.size());
    }
    ++files;
    bytes += file.size();
  }
  if (files == 0) return absl::OkStatus();
  spdlog::info("transfer {}: hashed {} files ({} bytes) for --checksum in {:.2f} s", record.id(),
               files, bytes, (RealClock::Get().Now() - start).ToSecondsF());
  // Unsynced: digests lost in a power loss are only computed again.
  if (absl::Status s = journal_.PutOutgoing(this->record(), /*sync=*/false); !s.ok()) {
    spdlog::warn("transfer {}: cannot journal content digests: {}", record.id(), s.message());
  }
  return absl::OkStatus();
}

std::optional<uint32_t> TransferSender::FindChangedSource() {
  const v1::OutgoingTransfer record = this->record();
  for (int f = 0; f < record.manifest().files_size(); ++f) {
    int fd = storage::OpenCheckedSource(record.source_paths(f));
    if (fd < 0) return f;
    absl::Status s = storage::CheckSourceUnchanged(record.manifest().files(f), fd);
    ::close(fd);
    if (!s.ok()) {
      spdlog::info("transfer {}: {}", record.id(), s.message());
      return f;
    }
  }
  return std::nullopt;
}

absl::Status TransferSender::RefreshChangedFile(uint32_t file_index) {
  v1::OutgoingTransfer copy;
  {
    absl::MutexLock lock(&mu_);
    const std::string& path = record_.source_paths(file_index);
    struct stat st;
    if (::stat(path.c_str(), &st) != 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "source file ", path, " changed and can no longer be read: ", std::strerror(errno)));
    }
    if (!S_ISREG(st.st_mode)) {
      return absl::FailedPreconditionError(
          absl::StrCat("source ", path, " is no longer a regular file"));
    }
    v1::ManifestFile* file = record_.mutable_manifest()->mutable_files(file_index);
    storage::RecordSourceIdentity(st, *file);
    file->clear_content_xxh128();
    file->set_generation(file->generation() + 1);
    copy = record_;
  }
  return journal_.PutOutgoing(copy, /*sync=*/true);
}

}  // namespace longhaul::peer
