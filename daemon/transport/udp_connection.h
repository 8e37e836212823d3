#ifndef LONGHAUL_DAEMON_TRANSPORT_UDP_CONNECTION_H_
#define LONGHAUL_DAEMON_TRANSPORT_UDP_CONNECTION_H_

// UdpConnection: one flow of the udp transport, a Channel over one connected
// UDP socket (proto/UDP.md). The byte stream is cut into STREAM frames, each
// packet sealed with AES-256-GCM; ACK ranges drive RFC 9002 loss detection
// (udp_loss.h) and a congestion::Controller sets cwnd and the pacing rate.
//
// Threading: Write/ReadExactly follow the Channel contract (one caller
// thread); Abort and Stats may be called from any thread. A private I/O
// thread owns the socket, the keys, the loss detector and the pacer; it and
// the caller share only the ring buffers' indices, under `mu_`. The
// controller may be shared with sibling flows (AggregateController), so every
// call into it holds `*controller_mu`.
//
// Memory: the send ring and the receive ring are `window_bytes` each and are
// allocated once; packets are built in and received into preallocated batch
// buffers, so nothing is allocated per packet.
//
// Copies: Write copies into the send ring; each packet is sealed from the
// ring straight into the batch buffer (no plaintext copy). A ReadExactly of at
// least kDirectReadBytes lends its buffer to the I/O thread, which decrypts
// the stream data for that range straight from the received datagram into it
// (what had arrived before, out of order, is copied over from the receive
// ring once); smaller reads and data beyond the lent range go through the ring.

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "congestion/controller.h"
#include "congestion/pacer.h"
#include "daemon/transport/transport.h"
#include "daemon/transport/udp_crypto.h"
#include "daemon/transport/udp_loss.h"
#include "daemon/transport/udp_packet.h"

namespace longhaul::transport::udp {

// Sends `datagrams` (equal-sized datagrams of `segment` bytes, the last one
// maybe shorter) as one UDP_SEGMENT (GSO) batch on the connected socket
// `fd`; sendmsg(2)'s result.
ssize_t SendSegmented(int fd, absl::Span<const uint8_t> datagrams, uint16_t segment);

struct UdpConnectionParams {
  int fd = -1;  // a connected UDP socket; the connection owns and closes it
  uint64_t local_connection_id = 0;
  uint64_t peer_connection_id = 0;
  DirectionKeys send_keys;
  DirectionKeys receive_keys;
  uint64_t key_update_interval = kDefaultKeyUpdateInterval;
  size_t max_datagram = 1472;
  uint64_t window_bytes = 4 << 20;       // our receive window and our send buffer
  uint64_t peer_window_bytes = 4 << 20;  // the credit the peer granted in the handshake
  bool gso = true;                       // send batches with UDP_SEGMENT
  std::string peer_site;
  std::string peer_address;
  std::unique_ptr<congestion::Controller> controller;
  std::shared_ptr<absl::Mutex> controller_mu;
  std::string congestion_control_name;
  const Clock* clock = nullptr;
  TimeDelta idle_timeout = TimeDelta::Seconds(30);
  int io_thread_nice = 0;  // see UdpOptions::io_thread_nice
  TimeDelta keepalive = TimeDelta::Seconds(5);
  // Test hook: silently drops every Nth datagram received (0: none).
  uint32_t drop_every_nth_received = 0;
  // Called from the destructor (the transport's registry), once the
  // connection's thread has ended and before its descriptors are closed:
  // other threads may call Abort until it returns, never after.
  std::function<void()> on_destroy;
};

class UdpConnection final : public Channel, private FrameVisitor {
 public:
  explicit UdpConnection(UdpConnectionParams params);
  ~UdpConnection() override;

  absl::Status Write(absl::Span<const absl::Span<const uint8_t>> parts) override;
  absl::Status ReadExactly(absl::Span<uint8_t> out) override;
  void Abort() override;
  const std::string& peer_site() const override { return params_.peer_site; }
  const std::string& peer_address() const override { return params_.peer_address; }
  LinkStats Stats() const override;

  struct Counters {
    uint64_t datagrams_sent = 0;
    uint64_t datagrams_received = 0;
    uint64_t auth_failures = 0;  // dropped: failed AEAD authentication
    uint64_t malformed = 0;      // dropped: bad header or wrong connection id
    uint64_t duplicates = 0;
    uint64_t lost = 0;
    uint64_t retransmitted_bytes = 0;
    uint64_t dropped_for_test = 0;
    uint64_t key_updates_sent = 0;
    uint64_t key_updates_received = 0;
    uint64_t gso_batches = 0;
    uint64_t gro_datagrams = 0;  // received coalesced with others in one buffer (UDP GRO)
    // Stream bytes decrypted straight to their place (no copy), and of those the ones that
    // went into a caller's ReadExactly buffer.
    uint64_t stream_bytes_placed = 0;
    uint64_t stream_bytes_placed_in_reader = 0;
  };
  Counters counters() const;

  // Reads at least this long go straight into the caller's buffer.
  static constexpr size_t kDirectReadBytes = 16 << 10;

 private:
  // A caller's buffer for stream bytes [offset, offset + length).
  struct ReadTarget {
    uint64_t offset = 0;
    uint8_t* data = nullptr;
    size_t length = 0;
  };

  // I/O thread.
  void Run();
  void Sync(bool* stop);
  void Receive(Timestamp now);
  void ProcessDatagram(absl::Span<uint8_t> datagram, Timestamp now);
  // Where stream bytes [offset, offset + length) live: the lent read target
  // or the receive ring.
  void Locate(uint64_t offset, size_t length, Scatter* out) const;
  // Decides, before authentication, whether a packet's trailing STREAM data
  // can be decrypted straight into place (it must land only on bytes not yet
  // received).
  Scatter PlaceStream(absl::Span<const uint8_t> head, size_t payload_length);
  void CommitStream(uint64_t start, uint64_t end);
  void AdoptReadTarget() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void OnTimers(Timestamp now);
  void Send(Timestamp now);
  bool HasStreamToSend() const;
  TimeDelta SilenceLimit() const;
  bool NeedMaxData() const;
  size_t BuildPacket(uint8_t* slot, Timestamp now, bool allow_data, bool* short_packet);
  void SendClose(uint16_t code, absl::string_view reason);
  void Flush();
  void HandleLossEvent(Timestamp now);
  void Fail(absl::Status status);
  Timestamp NextWake(Timestamp now) const;
  void Wake();

  absl::Status OnPing() override;
  absl::Status OnAck(const AckFrame& ack) override;
  absl::Status OnStream(const StreamFrame& frame) override;
  absl::Status OnMaxData(uint64_t max_data) override;
  absl::Status OnClose(const CloseFrame& frame) override;

  UdpConnectionParams params_;
  const Clock& clock_;
  const uint64_t window_;
  std::unique_ptr<uint8_t[]> send_ring_;
  std::unique_ptr<uint8_t[]> recv_ring_;
  int event_fd_ = -1;

  mutable absl::Mutex mu_;
  absl::CondVar cv_;
  uint64_t send_written_ ABSL_GUARDED_BY(mu_) = 0;  // caller: end of written data
  uint64_t send_acked_ ABSL_GUARDED_BY(mu_) = 0;    // I/O: everything below is acked
  uint64_t recv_read_ ABSL_GUARDED_BY(mu_) = 0;     // caller: consumed
  uint64_t recv_ready_ ABSL_GUARDED_BY(mu_) = 0;    // I/O: everything below has arrived
  uint64_t writer_wants_ ABSL_GUARDED_BY(mu_) = 0;  // a blocked Write waits for this much room
  bool io_wants_writes_ ABSL_GUARDED_BY(mu_) = true;  // the I/O thread would send new bytes now
  uint64_t reader_wants_ ABSL_GUARDED_BY(mu_) = 0;  // a blocked read waits for this much data
  ReadTarget read_target_ ABSL_GUARDED_BY(mu_);
  bool read_target_set_ ABSL_GUARDED_BY(mu_) = false;   // the reader lends read_target_
  bool read_target_held_ ABSL_GUARDED_BY(mu_) = false;  // the I/O thread may write to it
  absl::Status status_ ABSL_GUARDED_BY(mu_);        // why the channel failed
  bool peer_closed_ ABSL_GUARDED_BY(mu_) = false;
  std::string peer_close_reason_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool io_done_ ABSL_GUARDED_BY(mu_) = false;
  LinkStats stats_ ABSL_GUARDED_BY(mu_);
  Counters counters_ ABSL_GUARDED_BY(mu_);
  std::atomic<bool> aborted_{false};
  std::atomic<uint64_t> advertised_max_data_{0};

  // Owned by the I/O thread.
  PacketSealer sealer_;
  PacketOpener opener_;
  LossDetector loss_;
  LossEvent event_;
  congestion::Pacer pacer_;
  absl::InlinedVector<congestion::AckedPacket, 64> cc_acked_;
  absl::InlinedVector<congestion::LostPacket, 16> cc_lost_;
  Counters io_counters_;
  uint64_t next_pn_ = 1;
  // Send side, in stream offsets.
  uint64_t io_written_ = 0;     // snapshot of send_written_
  uint64_t io_send_acked_ = 0;  // contiguous acked prefix
  uint64_t send_next_ = 0;      // next never-sent offset
  uint64_t peer_max_data_ = 0;
  RangeSet acked_above_;  // acked ranges above io_send_acked_
  RangeSet retransmit_;   // ranges declared lost, to send again
  int probes_pending_ = 0;
  bool ping_pending_ = false;
  bool app_limited_reported_ = false;
  // Why the send loop stopped (logged at debug level every 200 ms).
  uint64_t blocked_by_cwnd_ = 0;
  uint64_t blocked_by_pacer_ = 0;
  uint64_t app_limited_events_ = 0;
  Timestamp last_eliciting_sent_;
  // Receive side.
  uint64_t io_recv_read_ = 0;   // snapshot of recv_read_
  uint64_t io_recv_ready_ = 0;  // contiguous received prefix
  RangeSet received_above_;     // stream ranges above io_recv_ready_
  ReadTarget io_target_;        // valid while read_target_held_
  bool io_target_valid_ = false;
  TrailingStream placed_;        // the STREAM frame PlaceStream placed
  size_t placed_in_reader_ = 0;  // how much of it went to io_target_
  RangeSet received_pns_;       // packet numbers, half-open ranges
  uint64_t pn_floor_ = 0;       // packet numbers below this count as duplicates
  uint64_t largest_received_pn_ = 0;
  Timestamp largest_received_time_;
  bool ack_pending_ = false;
  bool ack_now_ = false;
  int unacked_eliciting_ = 0;
  Timestamp ack_deadline_ = Timestamp::Infinite();
  bool max_data_dirty_ = false;
  bool packet_eliciting_ = false;  // the packet being parsed
  Timestamp last_receive_;
  bool io_failed_ = false;
  absl::Status io_status_;
  bool io_peer_closed_ = false;
  std::string io_close_reason_;
  uint16_t io_close_code_ = 0;

  // Batches.
  static constexpr size_t kMaxBatch = 64;
  static constexpr size_t kBatchBytes = 65000;
  std::unique_ptr<uint8_t[]> send_batch_;
  size_t batch_count_ = 0;
  size_t batch_bytes_ = 0;
  size_t batch_segment_ = 0;
  size_t batch_sizes_[kMaxBatch] = {};
  bool gso_ok_;
  size_t min_burst_ = 0;  // bytes; see kMinBurstDatagrams
  static constexpr size_t kRecvBatch = 8;
  static constexpr size_t kRecvBufferSize = 65536;
  std::unique_ptr<uint8_t[]> recv_buffers_;

  std::thread thread_;
};

}  // namespace longhaul::transport::udp

#endif  // LONGHAUL_DAEMON_TRANSPORT_UDP_CONNECTION_H_
