// UdpConnection's send path on the I/O thread: building packets (ACK,
// stream, MAX_DATA, PING and CLOSE frames, sealed), pacing them out and
// writing them in GSO batches.
#include <netinet/in.h>
#include <netinet/udp.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/check.h"
#include "common/fmt_absl.h"
#include "daemon/transport/udp_connection.h"
#include "spdlog/spdlog.h"

#ifndef UDP_SEGMENT
#define UDP_SEGMENT 103
#endif

namespace longhaul::transport::udp {

ssize_t SendSegmented(int fd, absl::Span<const uint8_t> datagrams, uint16_t segment) {
  struct iovec iov = {const_cast<uint8_t*>(datagrams.data()), datagrams.size()};
  alignas(struct cmsghdr) uint8_t control[CMSG_SPACE(sizeof(uint16_t))] = {};
  struct msghdr msg = {};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  struct cmsghdr* c = CMSG_FIRSTHDR(&msg);
  c->cmsg_level = SOL_UDP;
  c->cmsg_type = UDP_SEGMENT;
  c->cmsg_len = CMSG_LEN(sizeof(uint16_t));
  std::memcpy(CMSG_DATA(c), &segment, sizeof segment);
  return ::sendmsg(fd, &msg, 0);
}

size_t UdpConnection::BuildPacket(uint8_t* slot, Timestamp now, bool allow_data,
                                  bool* short_packet) {
  const size_t capacity = params_.max_datagram - kPacketOverhead;
  absl::Span<uint8_t> payload(slot + kHeaderSize, capacity);
  size_t used = 0;
  SentPacket sent;
  sent.sent_time = now;
  absl::Span<const uint8_t> tail[2];
  size_t tail_length = 0;
  if (ack_pending_ && largest_received_pn_ > 0) {
    AckFrame ack;
    const auto& ranges = received_pns_.ranges();
    ack.range_count = std::min(ranges.size(), kMaxAckRanges);
    for (size_t i = 0; i < ack.range_count; ++i) {
      const auto& r = ranges[ranges.size() - 1 - i];
      ack.ranges[i] = {r.first, r.second - 1};
    }
    ack.ack_delay_us = static_cast<uint64_t>(
        std::max<int64_t>(0, (now - largest_received_time_).ToMicroseconds()));
    used += WriteAck(ack, payload.subspan(used));
    ack_pending_ = false;
    ack_now_ = false;
    unacked_eliciting_ = 0;
    ack_deadline_ = Timestamp::Infinite();
  }
  if (NeedMaxData()) {
    const uint64_t max_data = io_recv_read_ + window_;
    used += WriteMaxData(max_data, payload.subspan(used));
    advertised_max_data_.store(max_data);
    max_data_dirty_ = false;
    sent.carries_max_data = true;
    sent.ack_eliciting = true;
  }
  *short_packet = true;
  if (allow_data && capacity - used > kStreamFrameHeaderSize) {
    const size_t room = std::min<size_t>(capacity - used - kStreamFrameHeaderSize, 65535);
    uint64_t offset = 0;
    size_t length = 0;
    bool retransmission = false;
    while (!retransmit_.empty()) {
      auto [s, e] = retransmit_.ranges()[0];
      s = std::max(s, io_send_acked_);
      if (s >= e) {
        retransmit_.RemoveBelow(e);
        continue;
      }
      const size_t n = static_cast<size_t>(std::min<uint64_t>(e - s, room));
      retransmit_.RemoveBelow(s + n);
      if (acked_above_.Contains(s, s + n)) continue;
      offset = s;
      length = n;
      retransmission = true;
      break;
    }
    if (length == 0) {
      const uint64_t limit = std::min(io_written_, peer_max_data_);
      if (send_next_ < limit) {
        offset = send_next_;
        length = static_cast<size_t>(std::min<uint64_t>(limit - send_next_, room));
        send_next_ += length;
      }
    }
    if (length > 0) {
      WriteStreamHeader(offset, static_cast<uint16_t>(length), payload.subspan(used));
      used += kStreamFrameHeaderSize;
      // Sealed straight from the ring (see Seal below).
      const size_t at = offset % window_;
      const size_t first = std::min<size_t>(length, window_ - at);
      tail[0] = absl::MakeConstSpan(&send_ring_[at], first);
      tail[1] = absl::MakeConstSpan(&send_ring_[0], length - first);
      tail_length = length;
      sent.stream_offset = offset;
      sent.stream_length = static_cast<uint32_t>(length);
      sent.ack_eliciting = true;
      sent.congestion_controlled = true;
      if (retransmission) io_counters_.retransmitted_bytes += length;
      *short_packet = used + length < capacity;
    }
  }
  if (ping_pending_ && !sent.ack_eliciting) {
    used += WritePing(payload.subspan(used));
    sent.ack_eliciting = true;
  }
  ping_pending_ = false;
  if (used == 0) return 0;
  const uint64_t pn = next_pn_++;
  auto size =
      sealer_.SealGather(params_.peer_connection_id, pn, absl::MakeSpan(slot, params_.max_datagram),
                         used, absl::MakeConstSpan(tail, tail_length > 0 ? 2 : 0));
  if (!size.ok()) {
    Fail(size.status());
    return 0;
  }
  sent.bytes = static_cast<uint32_t>(*size);
  if (sent.ack_eliciting) {
    last_eliciting_sent_ = now;
    if (sent.congestion_controlled) {
      absl::MutexLock lock(params_.controller_mu.get());
      params_.controller->OnPacketSent(now, pn, sent.bytes, loss_.bytes_in_flight(), true);
      pacer_.OnPacketSent(now, sent.bytes, params_.controller->pacing_rate(),
                          std::max(params_.controller->send_quantum(), min_burst_));
    }
    loss_.OnPacketSent(pn, sent);
  } else {
    loss_.OnUntrackedPacketSent(pn);
  }
  return *size;
}

void UdpConnection::Send(Timestamp now) {
  const uint64_t generation = sealer_.key_generation();
  for (;;) {
    bool allow_data = false;
    if (HasStreamToSend()) {
      if (probes_pending_ > 0) {
        allow_data = true;
      } else {
        ByteCount cwnd;
        Bandwidth pacing_rate;
        {
          absl::MutexLock lock(params_.controller_mu.get());
          cwnd = params_.controller->cwnd();
          pacing_rate = params_.controller->pacing_rate();
        }
        // As TCP counts cwnd in packets, a packet may go while anything of cwnd is left: with
        // jumbo datagrams and a cwnd split across N flows, a flow's share is a few datagrams.
        allow_data = loss_.bytes_in_flight() < cwnd && pacer_.CanSend(now, pacing_rate);
        if (!allow_data) {
          if (loss_.bytes_in_flight() >= cwnd) {
            ++blocked_by_cwnd_;
          } else {
            ++blocked_by_pacer_;
          }
        }
      }
      app_limited_reported_ = false;
    } else if (!app_limited_reported_) {
      ++app_limited_events_;
      app_limited_reported_ = true;
      absl::MutexLock lock(params_.controller_mu.get());
      params_.controller->OnAppLimited();
    }
    const bool ack_due = ack_pending_ && (ack_now_ || now >= ack_deadline_);
    if (!allow_data && !ack_due && !NeedMaxData() && !ping_pending_ && probes_pending_ == 0) break;
    if (probes_pending_ > 0 && !allow_data && !HasStreamToSend()) ping_pending_ = true;
    if (batch_count_ == kMaxBatch || batch_bytes_ + params_.max_datagram > kBatchBytes) Flush();
    bool short_packet = false;
    uint8_t* slot = &send_batch_[batch_bytes_];
    const size_t size = BuildPacket(slot, now, allow_data, &short_packet);
    if (probes_pending_ > 0) --probes_pending_;
    if (size == 0) break;
    if (batch_count_ > 0 && size > batch_segment_) {
      // GSO segments must not grow: send what we have, then move this one to the front.
      const size_t at = batch_bytes_;
      Flush();
      std::memmove(&send_batch_[0], &send_batch_[at], size);
      slot = &send_batch_[0];
    }
    if (batch_count_ == 0) batch_segment_ = size;
    batch_sizes_[batch_count_++] = size;
    batch_bytes_ += size;
    if (size < batch_segment_ || short_packet) Flush();
    if (io_failed_) break;
  }
  Flush();
  if (sealer_.key_generation() != generation) ++io_counters_.key_updates_sent;
}

void UdpConnection::Flush() {
  if (batch_count_ == 0) return;
  io_counters_.datagrams_sent += batch_count_;
  bool sent = false;
  if (gso_ok_ && batch_count_ > 1) {
    if (SendSegmented(params_.fd, absl::MakeConstSpan(&send_batch_[0], batch_bytes_),
                      static_cast<uint16_t>(batch_segment_)) >= 0) {
      sent = true;
      ++io_counters_.gso_batches;
    } else if (errno == EIO || errno == EINVAL || errno == ENOPROTOOPT) {
      spdlog::info("udp to {}: UDP GSO unavailable ({}); sending datagrams one by one",
                   params_.peer_site, std::strerror(errno));
      gso_ok_ = false;
    } else {
      sent = true;  // other errors (e.g. ECONNREFUSED): the datagrams count as lost
    }
  }
  if (!sent) {
    struct mmsghdr msgs[kMaxBatch];
    struct iovec iovs[kMaxBatch];
    size_t at = 0;
    for (size_t i = 0; i < batch_count_; ++i) {
      iovs[i] = {&send_batch_[at], batch_sizes_[i]};
      std::memset(&msgs[i], 0, sizeof msgs[i]);
      msgs[i].msg_hdr.msg_iov = &iovs[i];
      msgs[i].msg_hdr.msg_iovlen = 1;
      at += batch_sizes_[i];
    }
    size_t done = 0;
    while (done < batch_count_) {
      const int n = ::sendmmsg(params_.fd, &msgs[done], batch_count_ - done, 0);
      if (n <= 0) break;  // lost datagrams are recovered like network loss
      done += static_cast<size_t>(n);
    }
  }
  batch_count_ = 0;
  batch_bytes_ = 0;
  batch_segment_ = 0;
}

void UdpConnection::SendClose(uint16_t code, absl::string_view reason) {
  uint8_t* slot = &send_batch_[0];
  const size_t capacity = params_.max_datagram - kPacketOverhead;
  const size_t used = WriteClose(code, reason, absl::MakeSpan(slot + kHeaderSize, capacity));
  if (used == 0) return;
  auto size = sealer_.Seal(params_.peer_connection_id, next_pn_++,
                           absl::MakeSpan(slot, params_.max_datagram), used);
  if (!size.ok()) return;
  // Best effort, twice: a lost CLOSE is covered by the peer's idle timeout.
  for (int i = 0; i < 2; ++i) [[maybe_unused]] ssize_t n = ::send(params_.fd, slot, *size, 0);
}
}  // namespace longhaul::transport::udp
