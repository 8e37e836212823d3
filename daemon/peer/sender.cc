#include "daemon/peer/sender.h"

#include <unistd.h>

#include <algorithm>
#include <future>
#include <thread>
#include <tuple>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/clock.h"
#include "common/fmt_absl.h"
#include "daemon/peer/messaging.h"
#include "daemon/wire/frames.h"
#include "daemon/wire/messaging.h"
#include "spdlog/spdlog.h"
#include "storage/chunk_io.h"
#include "storage/chunk_plan.h"
#include "storage/file_io.h"
#include "storage/file_system.h"
#include "storage/manifest.h"

namespace longhaul::peer {

v1::OpenRequest OpenRequestFor(const v1::OutgoingTransfer& record, const std::string& local_site) {
  const v1::TransferSpec& spec = record.spec();
  v1::OpenRequest open;
  open.set_transfer_id(record.id());
  open.set_source_site(local_site);
  open.set_export_name(spec.dest_export());
  open.set_dest_path(spec.dest_path());
  *open.mutable_manifest() = record.manifest();
  *open.mutable_commit_last() = record.commit_last();
  open.set_skip_unchanged(spec.sync());
  open.set_single_file(record.single_file());
  open.set_keep_checkpoints(spec.keep_checkpoints());
  open.set_checkpoint_marker(spec.checkpoint_marker());
  open.set_requested_by(spec.requested_by());
  open.set_refuse_different(!spec.sync() && !spec.replace());
  open.set_keep_deleted(spec.sync() && spec.no_delete());
  open.set_durable_pieces(true);
  return open;
}

namespace {

constexpr absl::Duration kMaxBackoff = absl::Seconds(30);
// Per stream, the most bytes sent and not yet acknowledged, in chunk sizes,
// to a destination that acknowledges whole chunks only (see StreamLoop).
constexpr uint64_t kMaxUnackedChunkSizesWithoutPieces = 2;
// The smallest durable piece a destination may announce: pieces are slices
// the sender writes and waits for, and tiny ones would cost a round trip each.
constexpr uint64_t kMinDurablePiece = 64u << 10;
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

}  // namespace

bool SendWindow::Fits(uint64_t bytes) const {
  return unacked_ == 0 || (unacked_ + bytes <= limit_ && entries_.size() <= kMaxChunks);
}

void SendWindow::Begin(uint32_t file_index, uint32_t chunk_index, uint64_t size, uint64_t start) {
  entries_.push_back({file_index, chunk_index, size, start, start, start});
}

void SendWindow::Sent(uint64_t bytes) {
  entries_.back().sent += bytes;
  unacked_ += bytes;
}

absl::StatusOr<uint64_t> SendWindow::Progress(const wire::ChunkProgress& progress) {
  if (entries_.empty() || entries_.front().file_index != progress.file_index ||
      entries_.front().chunk_index != progress.chunk_index) {
    return absl::InvalidArgumentError(absl::StrCat(
        "reported progress on chunk ", progress.chunk_index, " of file ", progress.file_index,
        ", which is not the chunk it is receiving"));
  }
  Entry& e = entries_.front();
  if (progress.durable_bytes <= e.durable || progress.durable_bytes >= e.size ||
      progress.durable_bytes > e.sent) {
    return absl::InvalidArgumentError(absl::StrCat(
        "reported ", progress.durable_bytes, " bytes of chunk ", e.chunk_index, " of file ",
        e.file_index, " durable, where ", e.durable, " were and ", e.sent, " of its ", e.size,
        " are sent"));
  }
  const uint64_t added = progress.durable_bytes - e.durable;
  e.durable = progress.durable_bytes;
  unacked_ -= added;
  return added;
}

absl::StatusOr<SendWindow::Entry> SendWindow::Ack(const wire::ChunkAck& ack) {
  if (entries_.empty() || entries_.front().file_index != ack.file_index ||
      entries_.front().chunk_index != ack.chunk_index) {
    return absl::InvalidArgumentError(
        absl::StrCat("acknowledged chunk ", ack.chunk_index, " of file ", ack.file_index,
                     ", which was not sent"));
  }
  const Entry e = entries_.front();
  const bool whole = ack.result == wire::ChunkAck::Result::kDurable ||
                     ack.result == wire::ChunkAck::Result::kHashMismatch;
  if (whole && e.sent != e.size) {
    return absl::InvalidArgumentError(
        absl::StrCat("acknowledged chunk ", e.chunk_index, " of file ", e.file_index, " after ",
                     e.sent, " of its ", e.size, " bytes"));
  }
  entries_.pop_front();
  unacked_ -= e.sent - e.durable;
  return e;
}

TransferSender::TransferSender(SenderOptions options, transport::Transport& control,
                               transport::Transport& data, PriorityGate& gate,
                               storage::Journal& journal, v1::OutgoingTransfer record,
                               TransferProgress& progress, LinkObserver observer)
    : options_(std::move(options)),
      clock_(options_.clock != nullptr ? *options_.clock : RealClock::Get()),
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
  RetryNow();
}

void TransferSender::Stop() {
  stop_.store(true);
  RetryNow();
  AbortChannels();
}

void TransferSender::RetryNow() {
  absl::MutexLock lock(&wake_mu_);
  woken_ = true;
}

void TransferSender::AbortChannels() { channels_.AbortAll(); }

absl::Status TransferSender::Persist(const v1::OutgoingTransfer& record, bool sync) {
  return options_.persist ? options_.persist(record, sync) : journal_.PutOutgoing(record, sync);
}

void TransferSender::BypassRelay() { bypass_relay_.store(true); }

std::optional<absl::flat_hash_set<uint32_t>> TransferSender::unchanged_at_destination() const {
  absl::MutexLock lock(&mu_);
  return unchanged_at_destination_;
}

void TransferSender::StopRelaying() {
  absl::MutexLock lock(&mu_);
  record_.clear_relay_to();
}

absl::Status TransferSender::Run() {
  int failures = 0;
  // The give-up deadline is on the monotonic clock: a wall-clock step
  // neither fails a transfer early nor keeps a dead one going.
  Timestamp last_progress = clock_.Now();
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
    if (options_.on_attempt_failed) options_.on_attempt_failed(status);
    if (bypass_relay_.load()) {
      bool was_relayed;
      {
        absl::MutexLock lock(&mu_);
        was_relayed = !record_.relay_by().empty();
        record_.clear_relay_by();
      }
      if (was_relayed) {
        // Not a failure: the next attempt sends what the relay did not.
        spdlog::warn("transfer {}: {}; sending directly", record().id(), status.message());
        failures = 0;
        continue;
      }
    }

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
      last_progress = clock_.Now();
    }
    const TimeDelta stalled = clock_.Now() - last_progress;
    if (options_.give_up_after > TimeDelta::Zero() && stalled > options_.give_up_after) {
      return absl::DeadlineExceededError(absl::StrCat(
          "no progress for ", absl::FormatDuration(absl::Nanoseconds(stalled.ToNanoseconds())),
          "; last error: ", status.message()));
    }
    const absl::Duration first = absl::Nanoseconds(options_.first_retry_backoff.ToNanoseconds());
    const absl::Duration backoff =
        std::min(std::max(kMaxBackoff, first), first * (1 << std::min(failures, 6)));
    ++failures;
    spdlog::warn("transfer {}: {}; retrying in {}", record().id(), status.message(),
                 absl::FormatDuration(backoff));
    absl::MutexLock lock(&wake_mu_);
    wake_mu_.AwaitWithTimeout(absl::Condition(&woken_), backoff);
    woken_ = stopping();  // a stop stays; a retry request is spent
  }
}

absl::Status TransferSender::RunAttempt() {
  if (this->record().spec().checksum()) {
    if (absl::Status s = DigestSources(); !s.ok()) return s;
  }
  const v1::OutgoingTransfer record = this->record();
  const v1::TransferSpec& spec = record.spec();
  const std::optional<SenderOptions::Destination>& peer = options_.destination;
  if (!peer.has_value()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "site ", spec.dest_site(), " is not a configured peer of ", options_.local_site));
  }
  const uint64_t session_id = wire::SessionIdFor(record.id());
  const v1::Manifest& manifest = record.manifest();
  const uint64_t chunk_size = manifest.chunk_size();

  // The data channels are dialed while the control session opens: each dial
  // takes round trips of its own (TCP, TLS and, for udp, the key exchange)
  // that need not wait for the Open answer; only their Hello must, since the
  // peer routes a stream to its open session. This starts the data 3 round
  // trips sooner. Channels the Open answer leaves without chunks (a resumed
  // or synced transfer) are closed unused.
  const bool relayed = !record.relay_by().empty();
  const bool relaying = static_cast<bool>(options_.relay_source);
  uint32_t streams = spec.streams() ? spec.streams() : options_.default_streams;
  if (relayed) streams = 0;  // the relay sends the chunks
  uint64_t manifest_chunks = 0;
  storage::ForEachChunk(manifest, [&](storage::ChunkId, uint64_t) { ++manifest_chunks; });
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
  const transport::ChannelRegistry::Registration control_registration = channels_.Add(**control);
  if (stop_.load()) return absl::CancelledError("stopped");

  v1::PeerMessage request;
  if (relaying) {
    request.mutable_relay_attach()->set_transfer_id(record.id());
    request.mutable_relay_attach()->set_owner(options_.relay_owner);
  } else {
    v1::OpenRequest* open = request.mutable_open();
    *open = OpenRequestFor(record, options_.local_site);
    open->set_compare_content(spec.sync() && spec.checksum());
    open->set_relay_by(record.relay_by());
    if (record.has_relay_to()) *open->mutable_relay_to() = record.relay_to();
  }
  auto opened = Call(**control, session_id, request);
  if (!opened.ok()) return opened.status();
  const v1::OpenReply& reply = opened->open_reply();

  absl::flat_hash_set<uint32_t> unchanged(reply.unchanged_files().begin(),
                                          reply.unchanged_files().end());
  if (!relaying) {
    absl::MutexLock lock(&mu_);
    unchanged_at_destination_ = unchanged;
  }
  absl::flat_hash_set<storage::ChunkId> durable;
  for (const v1::ChunkId& id : reply.durable()) durable.insert({id.file_index(), id.chunk_index()});
  // A piece is at most a chunk. One below kMinDurablePiece is the peer's
  // mistake; pieces then are whole chunks, which every destination accepts.
  uint64_t durable_piece = std::min<uint64_t>(reply.durable_piece(), chunk_size);
  if (durable_piece != 0 && durable_piece < std::min(kMinDurablePiece, chunk_size)) {
    spdlog::warn("transfer {}: {} announced durable pieces of {} bytes; using whole chunks",
                 record.id(), spec.dest_site(), durable_piece);
    durable_piece = chunk_size;
  }
  // Durable prefixes: a chunk is sent from there on. One the manifest does
  // not allow is ignored (the chunk is sent whole).
  absl::flat_hash_map<storage::ChunkId, uint64_t> prefixes;
  for (const v1::PartialChunk& p : reply.partial()) {
    if (durable_piece == 0 || p.file_index() >= static_cast<uint32_t>(manifest.files_size())) {
      continue;
    }
    const v1::ManifestFile& file = manifest.files(p.file_index());
    if (p.chunk_index() >= storage::ChunkCount(file, chunk_size) ||
        p.durable_bytes() >= storage::ChunkSize(file, p.chunk_index(), chunk_size)) {
      continue;
    }
    prefixes[{p.file_index(), p.chunk_index()}] = p.durable_bytes();
  }

  // An older receiver expects every chunk of holes, or every linked name
  // whole; a copy of the manifest is made only for one.
  v1::Manifest older;
  const bool as_sent = reply.sparse_files() && reply.hard_links();
  if (!as_sent) {
    older = storage::ManifestAsPlannedBy(manifest, reply.sparse_files(), reply.hard_links());
  }
  const v1::Manifest& plan = as_sent ? manifest : older;

  TransferProgress::Snapshot totals;
  std::deque<Chunk> queue;
  for (int f = 0; f < manifest.files_size(); ++f) {
    if (unchanged.contains(f)) {
      ++totals.files_unchanged;
      continue;
    }
    storage::ForEachChunkOfFile(plan, f, [&](storage::ChunkId id, uint64_t size) {
      totals.bytes_total += size;
      ++totals.chunks_total;
      if (durable.contains(id)) {
        totals.bytes_done += size;
        ++totals.chunks_done;
        return;
      }
      auto prefix = prefixes.find(id);
      const uint64_t start = prefix == prefixes.end() ? 0 : prefix->second;
      totals.bytes_done += start;
      queue.push_back({id.file_index, id.chunk_index, size, start});
    });
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

  if (relayed) {
    if (absl::Status s = AwaitRelayedChunks(**control, session_id, totals, unchanged); !s.ok()) {
      return s;
    }
  }
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
        } else if (absl::Status s = wire::SendHello(**channel, data_hello); !s.ok()) {
          results[i] = s;
        } else {
          results[i] = StreamLoop(i, session_id, durable_piece, std::move(*channel));
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

  // A relay is done once its chunks are durable: the source commits.
  if (relaying) return absl::OkStatus();
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
  if (committed->has_commit_reply() && committed->commit_reply().has_report()) {
    absl::MutexLock lock(&mu_);
    *record_.mutable_publish_report() = committed->commit_reply().report();
  }
  return absl::OkStatus();
}

Bandwidth TransferSender::StreamPacingLimit(Bandwidth link, uint32_t streams) {
  return link * kBulkLinkShare / std::max<uint32_t>(streams, 1);
}

void TransferSender::ChangeSendingStreams(int delta) {
  absl::MutexLock lock(&mu_);
  sending_streams_ += delta;
  const Bandwidth each = StreamPacingLimit(options_.link_bandwidth, sending_streams_);
  channels_.ForEach([each](transport::Channel& channel) { channel.LimitPacingRate(each); });
}

absl::Status TransferSender::AwaitRelayedChunks(transport::Channel& control, uint64_t session_id,
                                                const TransferProgress::Snapshot& totals,
                                                const absl::flat_hash_set<uint32_t>& unchanged) {
  constexpr absl::Duration kPoll = absl::Milliseconds(200);
  // Each entry takes about 30 bytes of a control message.
  constexpr size_t kMaxDigestsPerAsk = 64 * 1024;
  const std::string relay = record().relay_by();
  const int files = record().manifest().files_size();
  uint64_t best_chunks = 0, best_bytes = 0;
  Timestamp last_gain = clock_.Now();
  // Digests of options_.source_digests handed over in this attempt (the
  // destination may have restarted since the last), and those it awaits.
  size_t digests_sent = 0;
  google::protobuf::RepeatedPtrField<v1::ChunkId> awaited;
  absl::flat_hash_set<std::tuple<uint32_t, uint32_t, uint32_t>> vouched_awaited;
  bool vouched = false;  // the last ask handed over digests not handed over before
  std::unique_ptr<storage::AlignedBuffer> chunk_buffer;
  while (true) {
    if (stopping()) return absl::CancelledError("stopped");
    if (bypass_relay_.load()) return absl::AbortedError(absl::StrCat("relay ", relay, " bypassed"));
    // A sync: the relay sends on only what its destination received.
    if (options_.relay_unchanged_files) {
      if (std::optional<absl::flat_hash_set<uint32_t>> skipped = options_.relay_unchanged_files()) {
        for (uint32_t f : *skipped) {
          if (f < static_cast<uint32_t>(files) && !unchanged.contains(f)) {
            bypass_relay_.store(true);
            return absl::AbortedError(absl::StrCat("relay ", relay, " already held file ", f,
                                                   " unchanged and does not send it on"));
          }
        }
      }
    }
    v1::PeerMessage ask;
    ask.mutable_progress()->set_transfer_id(record().id());
    // The destination takes a relayed chunk only as these digests vouch:
    // every one read here since the last ask, and those it waits for.
    if (options_.source_digests != nullptr) {
      std::vector<SourceDigests::Entry> digests =
          options_.source_digests->Since(digests_sent, kMaxDigestsPerAsk);
      digests_sent += digests.size();
      vouched = !digests.empty();
      absl::StatusOr<std::vector<SourceDigests::Entry>> read =
          DigestsOfAwaitedChunks(awaited, chunk_buffer);
      if (!read.ok()) return read.status();
      for (const SourceDigests::Entry& e : *read) {
        digests.push_back(e);
        // One handed over before and awaited still (of another generation
        // there) does not call for asking again at once.
        vouched |=
            vouched_awaited.insert(std::make_tuple(e.file_index, e.chunk_index, e.generation))
                .second;
      }
      for (const SourceDigests::Entry& e : digests) {
        v1::SourceDigest* d = ask.mutable_progress()->add_digests();
        d->set_file_index(e.file_index);
        d->set_chunk_index(e.chunk_index);
        d->set_generation(e.generation);
        const std::array<uint8_t, 16> bytes = e.xxh128.ToBytes();
        d->set_xxh128(bytes.data(), bytes.size());
      }
    }
    auto answer = Call(control, session_id, ask);
    if (!answer.ok()) return answer.status();
    const v1::ProgressReply& reply = answer->progress_reply();
    if (!reply.relay_refused().empty()) {
      bypass_relay_.store(true);
      return absl::AbortedError(absl::StrCat(record().spec().dest_site(), " refused relay ", relay,
                                             ": ", reply.relay_refused()));
    }
    awaited = reply.awaiting_digests();
    if (reply.chunks_durable() > best_chunks || reply.bytes_durable() > best_bytes) {
      best_chunks = std::max(best_chunks, reply.chunks_durable());
      best_bytes = std::max(best_bytes, reply.bytes_durable());
      last_gain = clock_.Now();
      progress_.Update([&](TransferProgress::Snapshot& s) {
        s.chunks_done = std::min(totals.chunks_total, best_chunks);
        s.bytes_done = std::min(totals.bytes_total, best_bytes);
      });
    }
    if (best_chunks >= totals.chunks_total) return absl::OkStatus();
    const TimeDelta stalled = clock_.Now() - last_gain;
    if (stalled.ToNanoseconds() > absl::ToInt64Nanoseconds(kRelayStall)) {
      bypass_relay_.store(true);
      return absl::AbortedError(absl::StrCat("relay ", relay, " delivered nothing for ",
                                             absl::FormatDuration(kRelayStall)));
    }
    // Asked again at once while digests are due, else when the source
    // reads more or kPoll passes.
    if (options_.source_digests == nullptr) {
      absl::SleepFor(kPoll);
    } else if (awaited.empty() || !vouched) {
      options_.source_digests->WaitForMore(digests_sent, kPoll);
    }
  }
}

void TransferSender::AddBytesSent(uint64_t bytes) {
  if (options_.relay_source) return;  // a relay's bytes are not journaled
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
                                        uint64_t durable_piece,
                                        std::unique_ptr<transport::Channel> channel) {
  const transport::ChannelRegistry::Registration registration = channels_.Add(*channel);
  // While this stream may still send chunks it counts among the streams that
  // share the pacing cap; the rest speed up as streams run out of chunks.
  struct SendingStream {
    TransferSender* self;
    bool sending = true;
    void StopSending() {
      if (!sending) return;
      sending = false;
      self->ChangeSendingStreams(-1);
    }
    ~SendingStream() { StopSending(); }
  } sending_stream{this};
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
  std::unique_ptr<RelayChunkSource> relay =
      options_.relay_source ? options_.relay_source() : nullptr;
  storage::AlignedBuffer buffer(chunk_size);
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

  // Reads the chunk from its source file and returns its digest. The
  // identity is checked before and after the read, so the bytes hashed
  // belong to the file the manifest describes. The whole chunk is read and
  // hashed even when only its end is sent: the digest covers the durable
  // prefix the receiver reads back too.
  auto read_source = [&](const Chunk& chunk, const v1::ManifestFile& file,
                         absl::Span<uint8_t> data) -> absl::StatusOr<storage::Xxh128> {
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
    if (absl::Status s = storage::CheckSourceUnchanged(file, fd); !s.ok()) {
      return s.code() == absl::StatusCode::kAborted ? source_changed(chunk.file_index, s) : s;
    }
    auto hash = storage::ReadChunkHashed(*io, fd, chunk.chunk_index * chunk_size, data);
    if (!hash.ok()) {
      return hash.status().code() == absl::StatusCode::kAborted
                 ? source_changed(chunk.file_index, hash.status())
                 : hash.status();
    }
    if (absl::Status s = storage::CheckSourceUnchanged(file, fd); !s.ok()) {
      return s.code() == absl::StatusCode::kAborted ? source_changed(chunk.file_index, s) : s;
    }
    return hash;
  };

  // Bytes sent on this stream and not acknowledged durable stay within one
  // chunk size, or two pieces where a chunk is smaller than that: a crash
  // re-sends at most that. The window slides by durable pieces
  // (CHUNK_PROGRESS), so while the receiver syncs a piece the rest of the
  // window is on the wire: a chunk frame is written a piece at a time as the
  // window allows, and the next chunk's first pieces leave while the last
  // ones of this chunk are made durable. With one piece in the window the
  // stream would idle for a round trip and an fdatasync per piece (with one
  // chunk, before pieces, the wan-lossy udp run lost ~5 % of its goodput so).
  // A destination that acknowledges whole chunks only gets two chunk sizes.
  // Small chunks (ends of files, small files) do not cost a round trip each
  // either way.
  const uint64_t slice_size = durable_piece > 0 ? durable_piece : chunk_size;
  SendWindow window(durable_piece > 0 ? std::max(chunk_size, 2 * durable_piece)
                                      : kMaxUnackedChunkSizesWithoutPieces * chunk_size);
  auto update_resent = [&] {
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
  };
  // Reads one answer (a progress report or the ack of the oldest chunk)
  // and applies it.
  auto await_answer = [&]() -> absl::Status {
    auto frame = wire::ReadFrameHeader(
        *channel, static_cast<uint32_t>(std::max(wire::kChunkAckFixedSize + wire::kMaxAckMessage,
                                                 wire::kChunkProgressSize)));
    if (!frame.ok()) return frame.status();
    const bool progress_frame = frame->type == wire::FrameType::kChunkProgress && durable_piece > 0;
    if ((frame->type != wire::FrameType::kChunkAck && !progress_frame) ||
        frame->session_id != session_id) {
      return absl::InvalidArgumentError(
          absl::StrCat(channel->peer_site(), " answered a chunk with an unexpected frame"));
    }
    std::vector<uint8_t> bytes(frame->payload_length);
    if (absl::Status s = channel->ReadExactly(absl::MakeSpan(bytes)); !s.ok()) return s;
    if (progress_frame) {
      auto progress = wire::ParseChunkProgress(bytes);
      if (!progress.ok()) return progress.status();
      absl::StatusOr<uint64_t> added = window.Progress(*progress);
      if (!added.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat(channel->peer_site(), " ", added.status().message()));
      }
      {
        absl::MutexLock lock(&mu_);
        in_flight_bytes_ -= *added;
      }
      progress_.Update([&](TransferProgress::Snapshot& s) { s.bytes_done += *added; });
      update_resent();
      return absl::OkStatus();
    }
    auto ack = wire::ParseChunkAck(bytes);
    if (!ack.ok()) return ack.status();
    absl::StatusOr<SendWindow::Entry> acked = window.Ack(*ack);
    if (!acked.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(channel->peer_site(), " ", acked.status().message()));
    }
    const Chunk chunk{acked->file_index, acked->chunk_index, acked->size, 0};
    {
      absl::MutexLock lock(&mu_);
      in_flight_bytes_ -= acked->size - acked->durable;
      if (ack->result == wire::ChunkAck::Result::kHashMismatch) queue_.push_front(chunk);
    }
    switch (ack->result) {
      case wire::ChunkAck::Result::kDurable: {
        progress_.Update([&](TransferProgress::Snapshot& s) {
          s.bytes_done += acked->size - acked->durable;
          ++s.chunks_done;
        });
        if (observer_) observer_(channel->peer_site(), channel->Stats());
        break;
      }
      case wire::ChunkAck::Result::kHashMismatch:
        // Sent again from its first byte: what was durable of it no longer counts.
        progress_.Update([&](TransferProgress::Snapshot& s) { s.bytes_done -= acked->durable; });
        spdlog::warn("transfer {}: {} reports a corrupted chunk {} of {}; sending it again",
                     record.id(), channel->peer_site(), chunk.chunk_index,
                     manifest.files(chunk.file_index).path());
        break;
      case wire::ChunkAck::Result::kRetryLater:
        return absl::ResourceExhaustedError(
            absl::StrCat(channel->peer_site(), " cannot store data: ", ack->message));
      case wire::ChunkAck::Result::kRefused:
        return absl::FailedPreconditionError(
            absl::StrCat(channel->peer_site(), " refused a chunk: ", ack->message));
    }
    update_resent();
    return absl::OkStatus();
  };

  while (!stopping()) {
    bool queue_empty;
    {
      absl::MutexLock lock(&mu_);
      queue_empty = queue_.empty();
    }
    if (queue_empty) {
      sending_stream.StopSending();
      // Done once everything sent here is acknowledged; an ack may requeue
      // a chunk (hash mismatch), which is then sent again.
      if (window.empty()) break;
      if (absl::Status s = await_answer(); !s.ok()) return s;
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
        next_size = queue_.front().size - queue_.front().start;
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
      in_flight_bytes_ += chunk.size - chunk.start;
    }
    const v1::ManifestFile& file = manifest.files(chunk.file_index);
    const absl::Span<uint8_t> data = buffer.span(chunk.size);
    absl::StatusOr<storage::Xxh128> hash =
        relay != nullptr ? relay->Read(chunk.file_index, chunk.chunk_index, file.generation(), data,
                                       [this] { return stopping(); })
                         : read_source(chunk, file, data);
    if (!hash.ok()) return hash.status();
    if (relay == nullptr && options_.source_digests != nullptr) {
      options_.source_digests->Add({chunk.file_index, chunk.chunk_index, file.generation(), *hash});
    }

    wire::ChunkHeader header{chunk.file_index,  chunk.chunk_index,
                             file.generation(), hash->low,
                             hash->high,        static_cast<uint32_t>(chunk.start)};
    std::array<uint8_t, wire::kChunkHeaderSize> header_bytes;
    wire::EncodeChunkHeader(header, header_bytes);
    std::array<uint8_t, wire::kFrameHeaderSize> frame_header;
    wire::EncodeFrameHeader(
        {wire::FrameType::kChunk,
         static_cast<uint32_t>(wire::kChunkHeaderSize + chunk.size - chunk.start), session_id},
        frame_header);
    window.Begin(chunk.file_index, chunk.chunk_index, chunk.size, chunk.start);
    // A slice ends where the receiver's durable pieces do.
    for (uint64_t pos = chunk.start; pos < chunk.size;) {
      const uint64_t length = std::min(slice_size - pos % slice_size, chunk.size - pos);
      while (!window.Fits(length)) {
        if (absl::Status s = await_answer(); !s.ok()) return s;
      }
      // Counted (and journaled) before the bytes leave, so a crash never
      // hides bytes that were sent.
      AddBytesSent(length);
      progress_.Update([&](TransferProgress::Snapshot& s) { s.bytes_sent += length; });
      const absl::Span<const uint8_t> slice(data.data() + pos, length);
      std::vector<absl::Span<const uint8_t>> parts;
      if (pos == chunk.start) {
        parts = {absl::Span<const uint8_t>(frame_header), absl::Span<const uint8_t>(header_bytes),
                 slice};
      } else {
        parts = {slice};
      }
      // Written in slices: an exchange that starts mid-chunk goes first.
      if (absl::Status s = gate_.WriteYielding(*channel, parts, record.spec().dest_site(),
                                               record.spec().priority(), stop_);
          !s.ok()) {
        return s;
      }
      window.Sent(length);
      pos += length;
    }
  }
  // A drain lets what is in flight become durable: closing the channel with
  // answers unread would reset it, and the receiver would drop the pieces
  // still in its socket. Stop aborts the channel, which ends this wait.
  while (!stop_.load() && !window.empty()) {
    if (absl::Status s = await_answer(); !s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace longhaul::peer
