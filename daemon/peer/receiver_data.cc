// The Receiver's data path: chunk frames on a DATA channel, received into
// budgeted piece buffers, written to staging and made durable piece by piece.
#include <algorithm>
#include <optional>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/fmt_absl.h"
#include "daemon/peer/messaging.h"
#include "daemon/peer/receiver.h"
#include "daemon/peer/receiver_session.h"
#include "daemon/wire/frames.h"
#include "daemon/wire/messaging.h"
#include "spdlog/spdlog.h"
#include "storage/chunk_io.h"
#include "storage/chunk_plan.h"
#include "storage/manifest.h"
#include "storage/staging.h"
#include "storage/xxh3.h"

namespace longhaul::peer {

namespace {

// Feeds the bytes [offset, offset + length) of a staged file to `state`
// (storage::ReadStagedHashing). DataLoss when the file ends first. Reads
// kReadPiece bytes at a time (as much as a stream's scratch for skipped
// payload): it runs once per resumed chunk, and holds nothing beside the
// stream's budgeted piece buffer.
absl::Status HashStagedRange(storage::FileIo& io, storage::File& file, uint64_t offset,
                             uint64_t length, XXH3_state_t& state) {
  storage::AlignedBuffer buffer(std::min<uint64_t>(length, wire::kReadPiece));
  for (uint64_t done = 0; done < length;) {
    const size_t n = std::min<uint64_t>(length - done, buffer.capacity());
    absl::StatusOr<size_t> got =
        storage::ReadStagedHashing(io, file, offset + done, buffer.span(n), state);
    if (!got.ok()) return got.status();
    if (*got != n) {
      return absl::DataLossError(absl::StrCat("staged file ", file.path(), " ends at byte ",
                                              offset + done + *got, ", inside a durable prefix"));
    }
    done += n;
  }
  return absl::OkStatus();
}

}  // namespace

void Receiver::ServeData(transport::Channel& channel, const std::string& transfer_id) {
  auto found = FindSession(transfer_id, channel.peer_site(), /*or_relay=*/true);
  if (!found.ok()) {
    spdlog::warn("data connection from {} refused: {}", channel.peer_site(),
                 found.status().message());
    return;
  }
  std::shared_ptr<Session> session = *found;
  uint64_t chunk_size;
  transport::ChannelRegistry::Registration registration;
  {
    absl::MutexLock lock(&session->mu);
    registration = session->data_channels.Add(channel);
    chunk_size = session->record.manifest().chunk_size();
  }
  const uint64_t session_id = wire::SessionIdFor(transfer_id);
  const std::string& peer_site = channel.peer_site();
  std::unique_ptr<storage::FileIo> io = storage::MakeFileIo();
  // One piece buffer of the shared pool, taken at the first chunk and kept
  // until the channel ends; `held` bytes of the peer's budget cover what a
  // piece may fill of it.
  const std::shared_ptr<storage::BufferPool> pool = piece_buffers_;
  std::optional<storage::BufferPool::Lease> piece_buffer;
  uint64_t held = 0;
  absl::Cleanup release_held = [&] {
    if (held > 0) budget_->Release(peer_site, held);
  };

  auto refuse = [&](const std::string& why) {
    spdlog::warn("transfer {}: refusing frame from {}: {}", transfer_id, channel.peer_site(), why);
    absl::MutexLock lock(&mu_);
    ++stats_.frames_refused;
  };
  auto send_progress = [&](const wire::ChunkHeader& h, uint64_t durable_bytes) {
    std::string bytes =
        wire::EncodeChunkProgress({h.file_index, h.chunk_index, h.generation, durable_bytes});
    absl::Span<const uint8_t> part(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
    return wire::SendFrame(channel, wire::FrameType::kChunkProgress, session_id, {part});
  };
  auto send_ack = [&](const wire::ChunkHeader& h, wire::ChunkAck::Result result,
                      std::string message) {
    wire::ChunkAck ack{h.file_index, h.chunk_index, h.generation, result, std::move(message)};
    std::string bytes = wire::EncodeChunkAck(ack);
    absl::Span<const uint8_t> part(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
    return wire::SendFrame(channel, wire::FrameType::kChunkAck, session_id, {part});
  };

  // Reads and drops a chunk frame's payload, so that its answer is read
  // before the channel closes.
  auto skip_payload = [&](uint64_t length) {
    std::array<uint8_t, wire::kReadPiece> scratch;
    absl::Status skipped = absl::OkStatus();
    for (uint64_t left = length; left > 0 && skipped.ok();) {
      const size_t piece = std::min<uint64_t>(left, scratch.size());
      skipped = channel.ReadExactly(absl::MakeSpan(scratch.data(), piece));
      left -= piece;
    }
    return skipped;
  };

  while (true) {
    auto header =
        wire::ReadFrameHeader(channel, static_cast<uint32_t>(wire::kChunkHeaderSize + chunk_size));
    if (!header.ok()) {
      const absl::Status& s = header.status();
      if (s.code() == absl::StatusCode::kInvalidArgument) {
        refuse(std::string(s.message()));
      } else if (s.code() != absl::StatusCode::kCancelled &&
                 !absl::StrContains(s.message(), "closed the connection")) {
        spdlog::warn("transfer {}: data stream from {} broke: {}", transfer_id, channel.peer_site(),
                     s.message());
      }
      break;
    }
    if (header->type != wire::FrameType::kChunk || header->session_id != session_id ||
        header->payload_length < wire::kChunkHeaderSize) {
      refuse("expected a chunk frame of this session");
      break;
    }
    std::array<uint8_t, wire::kChunkHeaderSize> chunk_header_bytes;
    if (!channel.ReadExactly(absl::MakeSpan(chunk_header_bytes)).ok()) break;
    auto chunk = wire::ParseChunkHeader(chunk_header_bytes);
    if (!chunk.ok()) {
      refuse(std::string(chunk.status().message()));
      break;
    }
    const uint64_t data_length = header->payload_length - wire::kChunkHeaderSize;
    const storage::ChunkId key{chunk->file_index, chunk->chunk_index};

    v1::ManifestFile file;
    uint64_t chunk_bytes = 0;
    bool pieces = false;
    // Fan-out: a chunk not from the owner comes from its relay (ServeData
    // admits no one else) and is taken only as the owner's digest vouches.
    bool relayed = false;
    absl::Status valid = absl::OkStatus();
    {
      absl::MutexLock lock(&session->mu);
      const v1::Manifest& manifest = session->record.manifest();
      pieces = session->durable_pieces;
      relayed = session->record.source_site() != peer_site;
      if (relayed &&
          (session->record.relay_by() != peer_site || session->refused_relay == peer_site)) {
        valid = absl::PermissionDeniedError(
            session->refused_relay == peer_site
                ? session->relay_refused
                : absl::StrCat("transfer ", transfer_id, " is not relayed by ", peer_site));
      } else if (chunk->file_index >= static_cast<uint32_t>(manifest.files_size())) {
        valid = absl::InvalidArgumentError(absl::StrCat("no file ", chunk->file_index));
      } else {
        file = manifest.files(chunk->file_index);
        if (file.link_of() != 0) {
          valid = absl::InvalidArgumentError(
              absl::StrCat("file ", file.path(), " is a hard link and has no chunks"));
        } else if (chunk->chunk_index >= storage::ChunkCount(file, chunk_size)) {
          valid = absl::InvalidArgumentError(
              absl::StrCat("file ", file.path(), " has no chunk ", chunk->chunk_index));
        } else if (chunk->generation != file.generation()) {
          valid = absl::InvalidArgumentError(absl::StrCat("stale generation for ", file.path()));
        } else {
          chunk_bytes = storage::ChunkSize(file, chunk->chunk_index, chunk_size);
          auto prefix = session->partial.find(key);
          valid = wire::CheckChunkExtent(chunk->offset, data_length, chunk_bytes,
                                         prefix == session->partial.end() ? 0 : prefix->second);
          if (!valid.ok()) {
            valid = absl::InvalidArgumentError(absl::StrCat("chunk ", chunk->chunk_index, " of ",
                                                            file.path(), ": ", valid.message()));
          }
        }
      }
    }
    if (valid.ok() && relayed) {
      valid = AwaitOwnerDigest(*session, peer_site, *chunk, file.path());
      if (absl::IsCancelled(valid)) break;  // the owner opened it again: this channel is aborted
      // A forged digest: the relay reads why before its channel closes.
      if (absl::IsPermissionDenied(valid) && !skip_payload(data_length).ok()) break;
    }
    if (!valid.ok() && !absl::IsUnavailable(valid)) {
      refuse(std::string(valid.message()));
      send_ack(*chunk, wire::ChunkAck::Result::kRefused, std::string(valid.message()))
          .IgnoreError();
      break;
    }
    // One piece is held at a time.
    const uint64_t need = std::min(data_length, kDurablePiece);
    std::string why = valid.ok() ? "" : std::string(valid.message());
    if (why.empty() && held < need) {
      // Give back the smaller reservation first, so that two streams each
      // holding part of what they need cannot starve each other.
      budget_->Release(peer_site, held);
      held = 0;
      if (WaitForBudget(peer_site, need)) {
        held = need;
      } else {
        why = absl::StrCat(options_.local_site, " holds ", budget_->used(peer_site),
                           " bytes of receive buffers for ", peer_site, "; a ", need,
                           "-byte piece would pass peer_limits.memory_per_peer (",
                           budget_->bytes_per_peer(), " bytes); retry later");
      }
    }
    if (why.empty() && !piece_buffer) {
      absl::StatusOr<storage::BufferPool::Lease> lease = pool->Acquire(kBudgetWait);
      if (lease.ok()) {
        piece_buffer = std::move(*lease);
      } else {
        why = absl::StrCat(options_.local_site, " has all ", kReceiveBuffers,
                           " receive buffers in use; retry later");
      }
    }
    if (!why.empty()) {
      spdlog::warn("transfer {}: chunk {} of {}: {}", transfer_id, chunk->chunk_index, file.path(),
                   why);
      if (!skip_payload(data_length).ok()) break;
      if (!send_ack(*chunk, wire::ChunkAck::Result::kRetryLater, why).ok()) break;
      continue;
    }

    absl::StatusOr<storage::File*> staged;
    {
      absl::MutexLock lock(&session->mu);
      staged = session->staging ? session->staging->OpenFile(chunk->file_index, file)
                                : absl::UnavailableError("transfer is not receiving");
    }
    absl::Status stored = staged.status();
    const uint64_t chunk_offset = uint64_t{chunk->chunk_index} * chunk_size;
    XXH3_state_t state;
    XXH3_INITSTATE(&state);
    XXH3_128bits_reset(&state);
    // A frame that resumes the chunk: its durable prefix is hashed as it is
    // on disk, so the chunk's digest covers every byte that will be published.
    bool prefix_read = true;
    if (chunk->offset > 0 && stored.ok()) {
      if (absl::Status s = HashStagedRange(*io, **staged, chunk_offset, chunk->offset, state);
          !s.ok()) {
        spdlog::warn("transfer {}: cannot read back the durable prefix of chunk {} of {}: {}",
                     transfer_id, chunk->chunk_index, file.path(), s.message());
        prefix_read = false;
      }
    }
    // Piece by piece: each is hashed, written and, but the last, made
    // durable and reported, so a crash loses at most the piece in flight.
    bool broke = false;
    for (uint64_t pos = chunk->offset; pos < chunk_bytes;) {
      const uint64_t length = std::min(kDurablePiece - pos % kDurablePiece, chunk_bytes - pos);
      const absl::Span<uint8_t> data = piece_buffer->span().first(length);
      if (absl::Status s = channel.ReadExactly(data); !s.ok()) {
        if (s.code() != absl::StatusCode::kCancelled) {
          spdlog::warn("transfer {}: data stream from {} broke mid-chunk: {}", transfer_id,
                       channel.peer_site(), s.message());
        }
        broke = true;
        break;
      }
      XXH3_128bits_update(&state, data.data(), data.size());
      if (stored.ok()) stored = storage::WriteChunk(*io, **staged, chunk_offset + pos, data);
      pos += length;
      if (!pieces || pos == chunk_bytes || !stored.ok() || !prefix_read) continue;
      storage::ChunkDurability piece;
      piece.file_index = chunk->file_index;
      piece.chunk_index = chunk->chunk_index;
      piece.chunk.set_generation(chunk->generation);
      piece.prefix_bytes = pos;
      stored = committer_.MakeDurable(**staged, transfer_id, piece);
      if (!stored.ok()) continue;
      {
        absl::MutexLock lock(&session->mu);
        session->partial[key] = pos;
      }
      if (!send_progress(*chunk, pos).ok()) {
        broke = true;
        break;
      }
    }
    if (broke) break;

    const XXH128_hash_t digest = XXH3_128bits_digest(&state);
    const storage::Xxh128 actual{digest.low64, digest.high64};
    const storage::Xxh128 expected{chunk->xxh128_low, chunk->xxh128_high};
    if (relayed && prefix_read && !(actual == expected)) {
      // The frame carries the owner's digest (AwaitOwnerDigest): the relay
      // sent other bytes. Nothing of this chunk counts, its prefix included.
      absl::Status refused;
      {
        absl::MutexLock lock(&session->mu);
        refused = RefuseRelayLocked(
            *session, peer_site,
            absl::StrCat("relay ", peer_site, " sent chunk ", chunk->chunk_index, " of ",
                         file.path(), " whose bytes do not hash to the digest ",
                         session->record.source_site(), " read"));
        session->partial.erase(key);
      }
      journal_.DeletePartialChunk(transfer_id, chunk->file_index, chunk->chunk_index).IgnoreError();
      refuse(std::string(refused.message()));
      send_ack(*chunk, wire::ChunkAck::Result::kRefused, std::string(refused.message()))
          .IgnoreError();
      break;
    }
    if (!prefix_read || !(actual == expected)) {
      spdlog::warn("transfer {}: chunk {} of {} failed its xxh3-128 check{}; asking for it again",
                   transfer_id, chunk->chunk_index, file.path(),
                   chunk->offset > 0 ? " (with its durable prefix read back)" : "");
      {
        absl::MutexLock lock(&mu_);
        ++stats_.hash_mismatches;
      }
      // It is sent again from byte 0: its prefix is no longer durable data.
      bool had_prefix;
      {
        absl::MutexLock lock(&session->mu);
        had_prefix = session->partial.erase(key) > 0;
      }
      if (had_prefix) {
        if (absl::Status s =
                journal_.DeletePartialChunk(transfer_id, chunk->file_index, chunk->chunk_index);
            !s.ok()) {
          spdlog::warn("transfer {}: cannot drop the durable prefix of chunk {} of {}: {}",
                       transfer_id, chunk->chunk_index, file.path(), s.message());
        }
      }
      if (!send_ack(*chunk, wire::ChunkAck::Result::kHashMismatch, "digest mismatch").ok()) break;
      continue;
    }

    storage::ChunkDurability record;
    record.file_index = chunk->file_index;
    record.chunk_index = chunk->chunk_index;
    auto digest_bytes = actual.ToBytes();
    record.chunk.set_xxh128(digest_bytes.data(), digest_bytes.size());
    record.chunk.set_size(chunk_bytes);
    record.chunk.set_generation(chunk->generation);
    if (stored.ok()) stored = committer_.MakeDurable(**staged, transfer_id, record);
    if (!stored.ok()) {
      spdlog::warn("transfer {}: cannot store chunk {} of {}: {}", transfer_id, chunk->chunk_index,
                   file.path(), stored.message());
      if (!send_ack(*chunk, wire::ChunkAck::Result::kRetryLater, std::string(stored.message()))
               .ok()) {
        break;
      }
      continue;
    }
    uint64_t write;
    {
      absl::MutexLock lock(&session->mu);
      write = session->durable[key] = ++session->writes;
      session->durable_digests[key] = actual;
      session->partial.erase(key);
    }
    {
      absl::MutexLock lock(&mu_);
      ++stats_.chunks_durable;
      stats_.bytes_durable += data_length;
    }
    if (!send_ack(*chunk, wire::ChunkAck::Result::kDurable, "").ok()) break;
    QueueReadBack(session, record, write);
  }
}

bool Receiver::WaitForBudget(const std::string& site, uint64_t bytes) {
  // Waited in slices, so that a shutdown is noticed within one.
  constexpr absl::Duration kSlice = absl::Milliseconds(50);
  for (int64_t slice = 0; slice < kBudgetWait / kSlice; ++slice) {
    if (budget_->Reserve(site, bytes, kSlice)) return true;
    absl::MutexLock lock(&mu_);
    if (shutting_down_) return false;
  }
  return false;
}

}  // namespace longhaul::peer
