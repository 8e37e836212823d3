#include "daemon/transport/udp_connection.h"

#include <netinet/in.h>
#include <netinet/udp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/check.h"
#include "common/fmt_absl.h"
#include "spdlog/spdlog.h"

#ifndef UDP_GRO
#define UDP_GRO 104
#endif

namespace longhaul::transport::udp {
namespace {

constexpr TimeDelta kMaxAckDelay = TimeDelta::Milliseconds(1);
// An ACK goes out at once after this many ack-eliciting packets (or any packet out of order);
// fewer ACKs mean fewer wake-ups of the sender's I/O thread, and BBR copes with ACK aggregation.
constexpr int kAckElicitingThreshold = 8;
// Once the socket has no more datagrams queued, an ACK goes out at once for this many: a
// sender with only a few packets in flight (a small cwnd share, e.g. on a sub-millisecond path)
// would otherwise wait out max_ack_delay for each round trip.
constexpr int kAckElicitingThresholdWhenDrained = 2;
// Paced bursts are at least this many datagrams (within one GSO batch): a flow of a coupled
// aggregate is paced at 1/N of the model's rate, and one datagram per pacer release costs a
// wake-up and a sendmsg per datagram.
constexpr size_t kMinBurstDatagrams = 8;
// See SilenceLimit().
constexpr TimeDelta kDeadPeerTimeout = TimeDelta::Seconds(5);
constexpr TimeDelta kLinger = TimeDelta::Seconds(2);
constexpr size_t kMaxReceivedRanges = kMaxAckRanges;

}  // namespace

UdpConnection::UdpConnection(UdpConnectionParams params)
    : params_(std::move(params)),
      clock_(params_.clock != nullptr ? *params_.clock : RealClock::Get()),
      window_(params_.window_bytes),
      send_ring_(new uint8_t[params_.window_bytes]),
      recv_ring_(new uint8_t[params_.window_bytes]),
      sealer_(params_.send_keys, params_.key_update_interval),
      opener_(params_.receive_keys),
      loss_(kMaxAckDelay),
      send_batch_(new uint8_t[kBatchBytes]),
      gso_ok_(params_.gso),
      recv_buffers_(new uint8_t[kRecvBatch * kRecvBufferSize]) {
  min_burst_ = std::min(kMinBurstDatagrams * params_.max_datagram,
                        kBatchBytes / params_.max_datagram * params_.max_datagram);
  LONGHAUL_CHECK(params_.fd >= 0);
  LONGHAUL_CHECK(params_.controller != nullptr && params_.controller_mu != nullptr);
  LONGHAUL_CHECK(params_.max_datagram >= size_t{1200});
  LONGHAUL_CHECK(params_.max_datagram <= size_t{65000});
  peer_max_data_ = params_.peer_window_bytes;
  advertised_max_data_.store(window_);
  event_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  LONGHAUL_CHECK(event_fd_ >= 0);
  stats_.congestion_control = params_.congestion_control_name;
  last_receive_ = clock_.Now();
  last_eliciting_sent_ = last_receive_;
  thread_ = std::thread([this] { Run(); });
}

UdpConnection::~UdpConnection() {
  {
    absl::MutexLock lock(&mu_);
    // Linger until what we wrote is acknowledged, like a TCP close.
    const Timestamp deadline = clock_.Now() + kLinger;
    while (!aborted_.load() && status_.ok() && !peer_closed_ && !io_done_ &&
           send_acked_ < send_written_) {
      const TimeDelta left = deadline - clock_.Now();
      if (left <= TimeDelta::Zero() ||
          cv_.WaitWithTimeout(&mu_, absl::Nanoseconds(left.ToNanoseconds()))) {
        break;
      }
    }
    stop_ = true;
  }
  Wake();
  thread_.join();
  // Before the descriptors go: until the hook has taken this connection out
  // of the transport's registry, the transport may still Abort it (a
  // shutdown, a trust reload), and Abort writes to event_fd_, a number that
  // once closed may be any other file's.
  if (params_.on_destroy) params_.on_destroy();
  {
    // A coupled flow's view must leave the shared model under its lock.
    absl::MutexLock lock(params_.controller_mu.get());
    params_.controller.reset();
  }
  ::close(params_.fd);
  ::close(event_fd_);
}

void UdpConnection::Wake() {
  uint64_t one = 1;
  [[maybe_unused]] ssize_t n = ::write(event_fd_, &one, sizeof one);
}

absl::Status UdpConnection::Write(absl::Span<const absl::Span<const uint8_t>> parts) {
  for (absl::Span<const uint8_t> part : parts) {
    size_t done = 0;
    while (done < part.size()) {
      uint64_t offset, space;
      {
        absl::MutexLock lock(&mu_);
        // Wait for a useful amount of room, not for every acknowledged packet.
        const uint64_t want = std::min<uint64_t>(part.size() - done, window_ / 8);
        writer_wants_ = want;
        while (status_.ok() && !peer_closed_ && window_ - (send_written_ - send_acked_) < want) {
          cv_.Wait(&mu_);
        }
        writer_wants_ = 0;
        if (!status_.ok()) return status_;
        if (peer_closed_) {
          return absl::UnavailableError(absl::StrCat(params_.peer_site, " at ",
                                                     params_.peer_address,
                                                     " closed the connection"));
        }
        offset = send_written_;
        space = window_ - (send_written_ - send_acked_);
      }
      // The region [offset, offset + space) is ours until we publish it.
      const size_t n = static_cast<size_t>(std::min<uint64_t>(space, part.size() - done));
      const size_t at = offset % window_;
      const size_t first = std::min<size_t>(n, window_ - at);
      std::memcpy(&send_ring_[at], part.data() + done, first);
      if (first < n) std::memcpy(&send_ring_[0], part.data() + done + first, n - first);
      done += n;
      bool wake;
      {
        absl::MutexLock lock(&mu_);
        send_written_ += n;
        wake = io_wants_writes_;
      }
      // A busy I/O thread (waiting for ACKs, or for the pacer) takes the bytes at its next pass.
      if (wake) Wake();
    }
  }
  return absl::OkStatus();
}

absl::Status UdpConnection::ReadExactly(absl::Span<uint8_t> out) {
  size_t done = 0;
  while (done < out.size()) {
    uint64_t offset, available;
    {
      absl::MutexLock lock(&mu_);
      const size_t left = out.size() - done;
      if (recv_ready_ == recv_read_ && left >= kDirectReadBytes && status_.ok() && !peer_closed_) {
        // Lend the rest of `out` to the I/O thread. At most half a window, so that the peer's
        // credit (at least 3/4 of a window past recv_read_) covers all of it.
        const size_t n = static_cast<size_t>(std::min<uint64_t>(left, window_ / 2));
        read_target_ = {recv_read_, out.data() + done, n};
        read_target_set_ = true;
        const uint64_t end = recv_read_ + n;
        while (status_.ok() && !peer_closed_ && !io_done_ &&
               (read_target_held_ || recv_ready_ < end)) {
          cv_.Wait(&mu_);
        }
        read_target_set_ = false;
        if (!read_target_held_ && recv_ready_ >= end) {
          recv_read_ = end;
          done += n;
          const uint64_t read = recv_read_;
          if (read + window_ >= advertised_max_data_.load() + window_ / 4) Wake();
          continue;
        }
        // Take the buffer back before failing: the I/O thread lets go at its next pass.
        Wake();
        while (read_target_held_ && !io_done_) cv_.Wait(&mu_);
        if (!status_.ok()) return status_;
        return absl::UnavailableError(
            absl::StrCat(params_.peer_site, " at ", params_.peer_address, " closed the connection",
                         peer_close_reason_.empty() ? "" : ": ", peer_close_reason_));
      }
      // Wait for a useful amount of data, not for every packet. The peer may always send
      // window / 8 more than we have read (it has at least 3/4 of a window of credit). A long
      // read takes what has arrived and lends its buffer for the rest.
      reader_wants_ = left >= kDirectReadBytes ? 1 : std::min<uint64_t>(left, window_ / 8);
      while (status_.ok() && !peer_closed_ && recv_ready_ - recv_read_ < reader_wants_) {
        cv_.Wait(&mu_);
      }
      reader_wants_ = 0;
      if (!status_.ok()) return status_;
      if (recv_ready_ == recv_read_) {
        return absl::UnavailableError(
            absl::StrCat(params_.peer_site, " at ", params_.peer_address, " closed the connection",
                         peer_close_reason_.empty() ? "" : ": ", peer_close_reason_));
      }
      offset = recv_read_;
      available = recv_ready_ - recv_read_;
    }
    const size_t n = static_cast<size_t>(std::min<uint64_t>(available, out.size() - done));
    const size_t at = offset % window_;
    const size_t first = std::min<size_t>(n, window_ - at);
    std::memcpy(out.data() + done, &recv_ring_[at], first);
    if (first < n) std::memcpy(out.data() + done + first, &recv_ring_[0], n - first);
    done += n;
    uint64_t read;
    {
      absl::MutexLock lock(&mu_);
      recv_read_ += n;
      read = recv_read_;
    }
    // Tell the I/O thread once a quarter of the window has opened up.
    if (read + window_ >= advertised_max_data_.load() + window_ / 4) Wake();
  }
  return absl::OkStatus();
}

void UdpConnection::Abort() {
  aborted_.store(true);
  {
    absl::MutexLock lock(&mu_);
    if (status_.ok()) status_ = absl::CancelledError("channel aborted");
    cv_.SignalAll();
  }
  Wake();
}

LinkStats UdpConnection::Stats() const {
  std::string_view state;
  {
    absl::MutexLock cc(params_.controller_mu.get());
    state = params_.controller->DebugState().state;
  }
  absl::MutexLock lock(&mu_);
  LinkStats stats = stats_;
  stats.congestion_state = std::string(state);
  return stats;
}

UdpConnection::Counters UdpConnection::counters() const {
  absl::MutexLock lock(&mu_);
  return counters_;
}

void UdpConnection::Fail(absl::Status status) {
  if (io_failed_) return;
  io_failed_ = true;
  io_status_ = std::move(status);
}

// --- I/O thread ----------------------------------------------------------------

void UdpConnection::Sync(bool* stop) {
  absl::MutexLock lock(&mu_);
  io_written_ = send_written_;
  io_recv_read_ = recv_read_;
  bool changed = false;
  // Wake the caller only when what it waits for is there: enough room for a writer, enough data
  // for a reader, or everything acknowledged for a closing connection.
  if (send_acked_ != io_send_acked_) {
    send_acked_ = io_send_acked_;
    if ((writer_wants_ > 0 && window_ - (send_written_ - send_acked_) >= writer_wants_) ||
        send_acked_ == send_written_) {
      changed = true;
    }
  }
  if (read_target_set_ && !io_target_valid_) AdoptReadTarget();
  if (recv_ready_ != io_recv_ready_) {
    recv_ready_ = io_recv_ready_;
    if (reader_wants_ > 0 && recv_ready_ - recv_read_ >= reader_wants_) changed = true;
  }
  if (io_target_valid_ &&
      (!read_target_set_ || io_recv_ready_ >= io_target_.offset + io_target_.length)) {
    io_target_valid_ = false;
    read_target_held_ = false;
    read_target_set_ = false;  // done or taken back: never adopted again
    changed = true;
  }
  if (io_failed_ && status_.ok()) {
    status_ = io_status_;
    changed = true;
  }
  if (io_peer_closed_ && !peer_closed_) {
    peer_closed_ = true;
    if (io_close_code_ != kCloseNoError) peer_close_reason_ = io_close_reason_;
    changed = true;
  }
  const RttStats& rtt = loss_.rtt();
  stats_.rtt_ms = rtt.smoothed.ToMillisecondsF();
  counters_ = io_counters_;
  stats_.retransmits = io_counters_.lost;
  if (changed) cv_.SignalAll();
  *stop = stop_ || aborted_.load();
}

void UdpConnection::AdoptReadTarget() {
  io_target_ = read_target_;
  io_target_valid_ = true;
  read_target_held_ = true;
  // What of the range has arrived is in the ring: the contiguous prefix and any ranges above it.
  const uint64_t start = io_target_.offset;
  const uint64_t end = start + io_target_.length;
  auto copy_from_ring = [&](uint64_t s, uint64_t e) {
    s = std::max(s, start);
    e = std::min(e, end);
    if (s >= e) return;
    const size_t n = static_cast<size_t>(e - s);
    const size_t at = s % window_;
    const size_t first = std::min<size_t>(n, window_ - at);
    uint8_t* out = io_target_.data + (s - start);
    std::memcpy(out, &recv_ring_[at], first);
    if (first < n) std::memcpy(out + first, &recv_ring_[0], n - first);
  };
  copy_from_ring(start, io_recv_ready_);
  for (const auto& [s, e] : received_above_.ranges()) {
    if (s >= end) break;
    copy_from_ring(s, e);
  }
}

void UdpConnection::Run() {
  if (params_.io_thread_nice != 0) {
    // Linux applies PRIO_PROCESS with a thread id to that thread alone.
    const auto tid = static_cast<id_t>(::syscall(SYS_gettid));
    if (::setpriority(PRIO_PROCESS, tid, params_.io_thread_nice) != 0) {
      static std::atomic<bool> warned{false};
      if (!warned.exchange(true)) {
        spdlog::info("udp transport: cannot set the I/O threads' nice value to {} ({}); they "
                     "run at normal priority",
                     params_.io_thread_nice, std::strerror(errno));
      }
    }
  }
  bool stop = false;
  Timestamp last_stats = clock_.Now();
  while (true) {
    Sync(&stop);
    if (stop || io_failed_ || io_peer_closed_) break;
    Timestamp now = clock_.Now();
    Receive(now);
    if (io_failed_ || io_peer_closed_) continue;
    now = clock_.Now();
    OnTimers(now);
    if (io_failed_) continue;
    Sync(&stop);
    Send(now);
    bool write_pending;
    {
      // Whether a Write should wake us: only if its bytes could go out at once.
      absl::MutexLock lock(&mu_);
      io_wants_writes_ = send_next_ >= io_written_ && send_next_ < peer_max_data_;
      write_pending = io_wants_writes_ && send_written_ > io_written_;
    }
    if (now - last_stats > TimeDelta::Milliseconds(200)) {
      last_stats = now;
      absl::MutexLock cc(params_.controller_mu.get());
      const congestion::ControllerState st = params_.controller->DebugState();
      if (spdlog::should_log(spdlog::level::debug)) {
        spdlog::debug(
            "udp to {} fd {}: sent {} received {} lost {} gso {} | cwnd {} in flight {} "
            "pacing {:.0f} Mbit/s bw {:.0f} Mbit/s (max {:.0f} short {:.0f}) {} min_rtt {:.1f} ms "
            "srtt {:.1f} ms | blocked by cwnd {} pacer {}, app-limited {} | written {} acked {} "
            "next {} peer credit {} loss-tolerant {} | received {} gro {}, placed {} in reader {}",
            params_.peer_site, params_.fd, io_counters_.datagrams_sent,
            io_counters_.datagrams_received, io_counters_.lost, io_counters_.gso_batches, st.cwnd,
            loss_.bytes_in_flight(), st.pacing_rate.ToMbitsPerSecondF(),
            st.bw.IsInfinite() ? -1.0 : st.bw.ToMbitsPerSecondF(),
            st.max_bw.IsInfinite() ? -1.0 : st.max_bw.ToMbitsPerSecondF(),
            st.bw_shortterm.IsInfinite() ? -1.0 : st.bw_shortterm.ToMbitsPerSecondF(), st.state,
            st.min_rtt.IsInfinite() ? -1.0 : st.min_rtt.ToMillisecondsF(),
            loss_.rtt().smoothed.ToMillisecondsF(), blocked_by_cwnd_, blocked_by_pacer_,
            app_limited_events_, io_written_, io_send_acked_, send_next_, peer_max_data_,
            st.loss_tolerant, io_recv_ready_, io_counters_.gro_datagrams,
            io_counters_.stream_bytes_placed, io_counters_.stream_bytes_placed_in_reader);
      }
      absl::MutexLock lock(&mu_);
      stats_.delivery_rate_mbit = st.bw.IsInfinite() ? 0 : st.bw.ToMbitsPerSecondF();
      int sndbuf = 0;
      socklen_t len = sizeof sndbuf;
      if (getsockopt(params_.fd, SOL_SOCKET, SO_SNDBUF, &sndbuf, &len) == 0) {
        stats_.socket_buffer_bytes = static_cast<uint64_t>(sndbuf);
      }
    }
    const Timestamp wake = NextWake(clock_.Now());
    const TimeDelta wait = wake - clock_.Now();
    struct pollfd fds[2] = {{params_.fd, POLLIN, 0}, {event_fd_, POLLIN, 0}};
    if (wait > TimeDelta::Zero() && !write_pending) {
      const int64_t ns = std::min<int64_t>(wait.ToNanoseconds(), 1'000'000'000);
      struct timespec ts = {static_cast<time_t>(ns / 1'000'000'000), static_cast<long>(ns % 1'000'000'000)};
      ::ppoll(fds, 2, &ts, nullptr);
      if (fds[1].revents & POLLIN) {
        uint64_t v;
        [[maybe_unused]] ssize_t n = ::read(event_fd_, &v, sizeof v);
      }
    }
  }
  if (!io_peer_closed_) {
    if (io_failed_) {
      SendClose(kCloseProtocolViolation, io_status_.message());
    } else if (aborted_.load()) {
      SendClose(kCloseAborted, "aborted");
    } else {
      SendClose(kCloseNoError, "");
    }
  }
  absl::MutexLock lock(&mu_);
  if (io_failed_ && status_.ok()) status_ = io_status_;
  if (io_peer_closed_) {
    peer_closed_ = true;
    if (io_close_code_ != kCloseNoError) peer_close_reason_ = io_close_reason_;
  }
  if (status_.ok() && !peer_closed_) {
    status_ = absl::UnavailableError(absl::StrCat("connection to ", params_.peer_site, " closed"));
  }
  counters_ = io_counters_;
  io_done_ = true;
  cv_.SignalAll();
}

void UdpConnection::Receive(Timestamp now) {
  struct mmsghdr msgs[kRecvBatch];
  struct iovec iovs[kRecvBatch];
  alignas(struct cmsghdr) uint8_t control[kRecvBatch][CMSG_SPACE(sizeof(int))];
  for (int round = 0; round < 8; ++round) {
    for (size_t i = 0; i < kRecvBatch; ++i) {
      iovs[i] = {&recv_buffers_[i * kRecvBufferSize], kRecvBufferSize};
      std::memset(&msgs[i], 0, sizeof msgs[i]);
      msgs[i].msg_hdr.msg_iov = &iovs[i];
      msgs[i].msg_hdr.msg_iovlen = 1;
      msgs[i].msg_hdr.msg_control = control[i];
      msgs[i].msg_hdr.msg_controllen = sizeof control[i];
    }
    const int n = ::recvmmsg(params_.fd, msgs, kRecvBatch, MSG_DONTWAIT, nullptr);
    if (n <= 0) break;
    for (int i = 0; i < n; ++i) {
      const size_t length = msgs[i].msg_len;
      size_t segment = length;
      for (struct cmsghdr* c = CMSG_FIRSTHDR(&msgs[i].msg_hdr); c != nullptr;
           c = CMSG_NXTHDR(&msgs[i].msg_hdr, c)) {
        if (c->cmsg_level == SOL_UDP && c->cmsg_type == UDP_GRO) {
          int size;
          std::memcpy(&size, CMSG_DATA(c), sizeof size);
          if (size > 0) segment = static_cast<size_t>(size);
        }
      }
      uint8_t* base = &recv_buffers_[i * kRecvBufferSize];
      if (segment < length) io_counters_.gro_datagrams += (length + segment - 1) / segment;
      for (size_t off = 0; off < length; off += segment) {
        ProcessDatagram(absl::MakeSpan(base + off, std::min(segment, length - off)), now);
        if (io_failed_ || io_peer_closed_) return;
      }
    }
    if (static_cast<size_t>(n) < kRecvBatch) break;
  }
  if (ack_pending_ && unacked_eliciting_ >= kAckElicitingThresholdWhenDrained) ack_now_ = true;
}

void UdpConnection::ProcessDatagram(absl::Span<uint8_t> datagram, Timestamp now) {
  ++io_counters_.datagrams_received;
  if (params_.drop_every_nth_received != 0 &&
      io_counters_.datagrams_received % params_.drop_every_nth_received == 0) {
    ++io_counters_.dropped_for_test;
    return;
  }
  PacketHeader header;
  const uint64_t generation = opener_.key_generation();
  Scatter scattered;
  auto payload = opener_.Open(
      params_.local_connection_id, datagram, &header,
      [this](absl::Span<const uint8_t> head, size_t length) { return PlaceStream(head, length); },
      &scattered);
  if (!payload.ok()) {
    if (payload.status().code() == absl::StatusCode::kPermissionDenied) {
      ++io_counters_.auth_failures;
    } else {
      ++io_counters_.malformed;
    }
    return;
  }
  if (opener_.key_generation() != generation) ++io_counters_.key_updates_received;
  const uint64_t pn = header.packet_number;
  if (pn < pn_floor_ || received_pns_.Contains(pn, pn + 1)) {
    ++io_counters_.duplicates;
    return;
  }
  last_receive_ = now;
  packet_eliciting_ = false;
  absl::Status s;
  if (scattered.count > 0) {
    // The trailing STREAM frame's data is in place already; the frames before it are parsed.
    if (placed_.frame_start > 0) s = ParseFrames(payload->subspan(0, placed_.frame_start), *this);
    if (s.ok() && !io_peer_closed_) {
      packet_eliciting_ = true;
      io_counters_.stream_bytes_placed += placed_.length;
      io_counters_.stream_bytes_placed_in_reader += placed_in_reader_;
      CommitStream(placed_.offset, placed_.offset + placed_.length);
    }
  } else {
    s = ParseFrames(*payload, *this);
  }
  if (!s.ok()) {
    Fail(absl::InvalidArgumentError(absl::StrCat(params_.peer_site, " at ", params_.peer_address,
                                                 " broke the udp protocol: ", s.message())));
    return;
  }
  received_pns_.Add(pn, pn + 1);
  while (received_pns_.size() > kMaxReceivedRanges) {
    pn_floor_ = received_pns_.ranges()[0].second;
    received_pns_.RemoveBelow(pn_floor_);
  }
  const bool in_order = pn == largest_received_pn_ + 1;
  if (pn > largest_received_pn_) {
    largest_received_pn_ = pn;
    largest_received_time_ = now;
  }
  if (packet_eliciting_) {
    if (!ack_pending_) ack_deadline_ = now + kMaxAckDelay;
    ack_pending_ = true;
    ++unacked_eliciting_;
    if (!in_order || unacked_eliciting_ >= kAckElicitingThreshold) ack_now_ = true;
  }
}

absl::Status UdpConnection::OnPing() {
  packet_eliciting_ = true;
  return absl::OkStatus();
}

absl::Status UdpConnection::OnAck(const AckFrame& ack) {
  const Timestamp now = clock_.Now();
  if (absl::Status s = loss_.OnAck(ack, now, &event_); !s.ok()) return s;
  HandleLossEvent(now);
  return absl::OkStatus();
}

void UdpConnection::HandleLossEvent(Timestamp now) {
  if (event_.acked.empty() && event_.lost.empty()) return;
  cc_acked_.clear();
  cc_lost_.clear();
  for (const auto& [pn, p] : event_.acked) {
    if (p.stream_length > 0) acked_above_.Add(p.stream_offset, p.stream_offset + p.stream_length);
    if (p.congestion_controlled) cc_acked_.push_back({pn, p.bytes, p.sent_time});
  }
  while (!acked_above_.empty() && acked_above_.ranges()[0].first <= io_send_acked_) {
    io_send_acked_ = acked_above_.PopContiguous(io_send_acked_);
  }
  for (const auto& [pn, p] : event_.lost) {
    ++io_counters_.lost;
    if (p.stream_length > 0 &&
        !acked_above_.Contains(p.stream_offset, p.stream_offset + p.stream_length) &&
        p.stream_offset + p.stream_length > io_send_acked_) {
      retransmit_.Add(std::max(p.stream_offset, io_send_acked_), p.stream_offset + p.stream_length);
    }
    if (p.carries_max_data) max_data_dirty_ = true;
    if (p.congestion_controlled) cc_lost_.push_back({pn, p.bytes});
  }
  if (!cc_acked_.empty() || !cc_lost_.empty()) {
    absl::MutexLock lock(params_.controller_mu.get());
    params_.controller->OnCongestionEvent(now, event_.prior_in_flight, cc_acked_, cc_lost_);
  }
}

absl::Status UdpConnection::OnStream(const StreamFrame& frame) {
  packet_eliciting_ = true;
  uint64_t start = frame.offset;
  const uint64_t end = frame.offset + frame.data.size();
  if (end > io_recv_read_ + window_) {
    return absl::InvalidArgumentError(
        absl::StrCat("STREAM data up to offset ", end, " exceeds the granted window (",
                     io_recv_read_ + window_, ")"));
  }
  if (end <= io_recv_ready_) return absl::OkStatus();
  if (start < io_recv_ready_) start = io_recv_ready_;
  const uint8_t* src = frame.data.data() + (start - frame.offset);
  Scatter where;
  Locate(start, static_cast<size_t>(end - start), &where);
  for (size_t i = 0; i < where.count; ++i) {
    std::memcpy(where.pieces[i].data(), src, where.pieces[i].size());
    src += where.pieces[i].size();
  }
  CommitStream(start, end);
  return absl::OkStatus();
}

void UdpConnection::CommitStream(uint64_t start, uint64_t end) {
  received_above_.Add(start, end);
  while (!received_above_.empty() && received_above_.ranges()[0].first <= io_recv_ready_) {
    io_recv_ready_ = received_above_.PopContiguous(io_recv_ready_);
  }
}

void UdpConnection::Locate(uint64_t offset, size_t length, Scatter* out) const {
  out->count = 0;
  auto add = [out](uint8_t* p, size_t n) {
    if (n > 0) out->pieces[out->count++] = absl::MakeSpan(p, n);
  };
  auto ring = [&](uint64_t s, uint64_t e) {
    if (s >= e) return;
    const size_t n = static_cast<size_t>(e - s);
    const size_t at = s % window_;
    const size_t first = std::min<size_t>(n, window_ - at);
    add(&recv_ring_[at], first);
    add(&recv_ring_[0], n - first);
  };
  const uint64_t s = offset;
  const uint64_t e = offset + length;
  if (!io_target_valid_) {
    ring(s, e);
    return;
  }
  const uint64_t t = io_target_.offset;
  const uint64_t u = t + io_target_.length;
  ring(s, std::min(e, t));
  const uint64_t lo = std::max(s, t);
  const uint64_t hi = std::min(e, u);
  if (lo < hi) add(io_target_.data + (lo - t), static_cast<size_t>(hi - lo));
  ring(std::max(s, u), e);
}

Scatter UdpConnection::PlaceStream(absl::Span<const uint8_t> head, size_t payload_length) {
  Scatter scatter;
  // Unauthenticated bytes: the frame may only land on stream bytes not yet received, inside the
  // window, where a forgery's garbage is overwritten by the real data later.
  if (!FindTrailingStream(head, payload_length, &placed_)) return scatter;
  const uint64_t start = placed_.offset;
  const uint64_t end = start + placed_.length;
  if (start < io_recv_ready_ || end > io_recv_read_ + window_ ||
      received_above_.Overlaps(start, end)) {
    return scatter;
  }
  Locate(start, placed_.length, &scatter);
  scatter.from = placed_.data_start;
  placed_in_reader_ = 0;
  if (io_target_valid_) {
    const uint64_t lo = std::max(start, io_target_.offset);
    const uint64_t hi = std::min(end, io_target_.offset + io_target_.length);
    if (lo < hi) placed_in_reader_ = static_cast<size_t>(hi - lo);
  }
  return scatter;
}

absl::Status UdpConnection::OnMaxData(uint64_t max_data) {
  packet_eliciting_ = true;
  peer_max_data_ = std::max(peer_max_data_, max_data);
  return absl::OkStatus();
}

absl::Status UdpConnection::OnClose(const CloseFrame& frame) {
  io_peer_closed_ = true;
  io_close_code_ = frame.code;
  io_close_reason_ = std::string(frame.reason);
  return absl::OkStatus();
}

void UdpConnection::OnTimers(Timestamp now) {
  if (now - last_receive_ > SilenceLimit()) {
    Fail(absl::UnavailableError(absl::StrCat("no packets from ", params_.peer_site, " at ",
                                             params_.peer_address, " for ",
                                             SilenceLimit().ToSecondsF(), " s")));
    return;
  }
  if (loss_.LossTime() <= now) {
    loss_.OnLossTimer(now, &event_);
    HandleLossEvent(now);
  }
  if (loss_.PtoTime() <= now) {
    // RFC 9002 §6.2.4: send probes, carrying the oldest unacknowledged data.
    loss_.OnPtoFired();
    probes_pending_ = 2;
    uint64_t pn;
    if (const SentPacket* p = loss_.OldestOutstandingStream(&pn); p != nullptr) {
      if (p->stream_offset + p->stream_length > io_send_acked_) {
        retransmit_.Add(std::max(p->stream_offset, io_send_acked_),
                        p->stream_offset + p->stream_length);
      }
    } else {
      ping_pending_ = true;
    }
  }
  if (now - last_eliciting_sent_ >= params_.keepalive) ping_pending_ = true;
}

TimeDelta UdpConnection::SilenceLimit() const {
  // A live peer acknowledges outstanding packets within a few RTTs (and probes go out on every
  // PTO), so silence while packets are outstanding means the peer is gone, e.g. its daemon was
  // killed and restarted (the new one cannot know this flow). Failing the flow then lets the
  // session reconnect and resume instead of waiting out the idle timeout.
  if (loss_.outstanding() > 0) return std::min(params_.idle_timeout, kDeadPeerTimeout);
  return params_.idle_timeout;
}

bool UdpConnection::HasStreamToSend() const {
  return !retransmit_.empty() || send_next_ < std::min(io_written_, peer_max_data_);
}

bool UdpConnection::NeedMaxData() const {
  return max_data_dirty_ || io_recv_read_ + window_ >= advertised_max_data_.load() + window_ / 4;
}

Timestamp UdpConnection::NextWake(Timestamp now) const {
  Timestamp wake = now + TimeDelta::Seconds(1);
  if (HasStreamToSend() || probes_pending_ > 0) {
    ByteCount cwnd;
    Bandwidth pacing_rate;
    {
      absl::MutexLock lock(params_.controller_mu.get());
      cwnd = params_.controller->cwnd();
      pacing_rate = params_.controller->pacing_rate();
    }
    // A pacing rate that rises while the flow waits (a sibling flow's ACKs raise the shared
    // model's) is seen at the next pass, at most a second later.
    if (probes_pending_ > 0 || loss_.bytes_in_flight() < cwnd) {
      wake = std::min(wake, pacer_.EarliestDeparture(pacing_rate));
    }
  }
  if (ack_pending_) wake = std::min(wake, ack_deadline_);
  wake = std::min(wake, loss_.LossTime());
  wake = std::min(wake, loss_.PtoTime());
  wake = std::min(wake, last_eliciting_sent_ + params_.keepalive);
  wake = std::min(wake, last_receive_ + SilenceLimit());
  return wake;
}

}  // namespace longhaul::transport::udp
