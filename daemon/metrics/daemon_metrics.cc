#include "daemon/metrics/daemon_metrics.h"

#include <map>
#include <utility>

#include "absl/strings/ascii.h"
#include "daemon/metrics/exposition.h"
#include "daemon/peer/rate_limiter.h"
#include "daemon/peer/receiver.h"
#include "daemon/transfer/transfer_manager.h"
#include "daemon/transport/transport.h"
#include "longhaul/v1/control.pb.h"
#include "storage/journal.h"

namespace longhaul::metrics {
namespace {

using Families = std::vector<prometheus::MetricFamily>;

constexpr v1::TransferState kStates[] = {v1::QUEUED,    v1::RUNNING, v1::PAUSED,   v1::PUBLISHING,
                                         v1::COMPLETED, v1::FAILED,  v1::CANCELLED};

template <typename... Builders>
void Append(Families& out, Builders&... families) {
  (out.push_back(families.Build()), ...);
}

// Source side: outgoing transfers, summed over every transfer the daemon
// knows (ended ones included, so the sums only grow while it runs), and
// per-peer link figures as the last acknowledged chunk's connection reported
// them (TCP_INFO for tcp; the transport's own for udp).
void CollectTransfers(daemon::TransferManager* manager, Families& out) {
  auto transfers =
      FamilyBuilder::Gauge("longhaul_transfers", "Outgoing transfers by state.", {"state"});
  auto queued_bytes = FamilyBuilder::Gauge("longhaul_queued_bytes",
                                           "Bytes of unfinished outgoing transfers not yet durable "
                                           "at their destination.");
  auto bytes_sent = FamilyBuilder::Counter("longhaul_bytes_sent_total",
                                           "Chunk bytes sent to peers, re-sends included.");
  auto bytes_resent = FamilyBuilder::Counter("longhaul_bytes_resent_total",
                                             "Chunk bytes sent more than once (lost, corrupted or "
                                             "interrupted before their acknowledgement).");
  auto bytes_acked = FamilyBuilder::Counter("longhaul_bytes_acknowledged_total",
                                            "Bytes of outgoing transfers acknowledged durable by "
                                            "their destination.");
  auto chunks_acked = FamilyBuilder::Counter("longhaul_chunks_acknowledged_total",
                                             "Chunks of outgoing transfers acknowledged durable by "
                                             "their destination.");
  auto peer_sent = FamilyBuilder::Counter(
      "longhaul_peer_bytes_sent_total", "Chunk bytes sent to a peer, re-sends included.", {"peer"});
  auto peer_resent = FamilyBuilder::Counter("longhaul_peer_bytes_resent_total",
                                            "Chunk bytes sent to a peer more than once.", {"peer"});
  auto peer_up = FamilyBuilder::Gauge("longhaul_peer_configured",
                                      "1 for each configured peer site.", {"peer", "transport"});
  auto peer_rtt = FamilyBuilder::Gauge("longhaul_peer_rtt_seconds",
                                       "Smoothed round-trip time to a peer.", {"peer"});
  auto peer_bw =
      FamilyBuilder::Gauge("longhaul_peer_bandwidth_estimate_bytes_per_second",
                           "Delivery rate the congestion controller measured to a peer.", {"peer"});
  auto peer_retrans = FamilyBuilder::Gauge("longhaul_peer_retransmits",
                                           "Segments or packets retransmitted on the most recently "
                                           "observed data connection to a peer (resets with the "
                                           "connection).",
                                           {"peer"});
  auto peer_sockbuf = FamilyBuilder::Gauge(
      "longhaul_peer_socket_buffer_bytes",
      "Send buffer the kernel granted on data connections to a peer.", {"peer"});
  auto peer_streams = FamilyBuilder::Gauge("longhaul_peer_active_streams",
                                           "Data streams currently sending to a peer.", {"peer"});
  auto peer_cc = FamilyBuilder::Gauge("longhaul_peer_congestion_control_info",
                                      "1 for the congestion control algorithm in use to a peer.",
                                      {"peer", "algorithm"});

  if (manager != nullptr) {
    std::map<v1::TransferState, int> by_state;
    double sent = 0, resent = 0, acked = 0, chunks = 0, queued = 0;
    std::map<std::string, std::pair<double, double>> per_peer;  // sent, resent
    for (const v1::TransferStatus& t : manager->List(/*all=*/true, /*with_remote=*/false)) {
      ++by_state[t.state()];
      sent += static_cast<double>(t.bytes_sent());
      resent += static_cast<double>(t.resent_bytes());
      acked += static_cast<double>(t.bytes_done());
      chunks += static_cast<double>(t.chunks_done());
      if (!daemon::IsEndState(t.state()) && t.bytes_total() > t.bytes_done()) {
        queued += static_cast<double>(t.bytes_total() - t.bytes_done());
      }
      auto& p = per_peer[t.spec().dest_site()];
      p.first += static_cast<double>(t.bytes_sent());
      p.second += static_cast<double>(t.resent_bytes());
    }
    for (v1::TransferState s : kStates) {
      transfers.Set({absl::AsciiStrToLower(v1::TransferState_Name(s))}, by_state[s]);
    }
    queued_bytes.Set({}, queued);
    bytes_sent.Set({}, sent);
    bytes_resent.Set({}, resent);
    bytes_acked.Set({}, acked);
    chunks_acked.Set({}, chunks);

    const v1::PeersResponse peers = manager->Peers(/*probe=*/false);
    for (const v1::PeerStatus& p : peers.peers()) {
      peer_up.Set({p.site(), p.transport()}, 1);
      peer_rtt.Set({p.site()}, p.rtt_ms() * 1e-3);
      // Prometheus' base unit is bytes (promtool lints "bits").
      peer_bw.Set({p.site()}, p.delivery_rate_mbit() * 1e6 / 8);
      peer_retrans.Set({p.site()}, static_cast<double>(p.retransmits()));
      peer_sockbuf.Set({p.site()}, static_cast<double>(p.socket_buffer_bytes()));
      peer_streams.Set({p.site()}, p.active_streams());
      if (!p.congestion_control().empty()) peer_cc.Set({p.site(), p.congestion_control()}, 1);
      auto it = per_peer.find(p.site());
      peer_sent.Set({p.site()}, it == per_peer.end() ? 0 : it->second.first);
      peer_resent.Set({p.site()}, it == per_peer.end() ? 0 : it->second.second);
    }
  }
  Append(out, transfers, queued_bytes, bytes_sent, bytes_resent, bytes_acked, chunks_acked,
         peer_sent, peer_resent, peer_up, peer_rtt, peer_bw, peer_retrans, peer_sockbuf,
         peer_streams, peer_cc);
}

// Destination side.
void CollectReceiver(const peer::Receiver* receiver, Families& out) {
  auto chunks_durable = FamilyBuilder::Counter(
      "longhaul_chunks_durable_total", "Chunks received, synced and journaled at this site.");
  auto bytes_durable = FamilyBuilder::Counter(
      "longhaul_bytes_durable_total", "Chunk bytes received, synced and journaled at this site.");
  auto hash_mismatches =
      FamilyBuilder::Counter("longhaul_chunk_hash_mismatches_total",
                             "Received chunks whose bytes did not match their digest.");
  auto read_back = FamilyBuilder::Counter(
      "longhaul_staged_bytes_read_back_total",
      "Staged chunk bytes read back against their digests: while receiving, or before publish.",
      {"when"});
  auto frames_refused = FamilyBuilder::Counter(
      "longhaul_frames_refused_total", "Malformed or unexpected frames refused from peers.");
  auto access_refused = FamilyBuilder::Counter(
      "longhaul_export_access_refused_total",
      "Peer requests refused because the peer may not write there: not one of the export's "
      "writers, or the destination is another site's.",
      {"peer", "export"});

  if (receiver != nullptr) {
    peer::ReceiverStats s = receiver->stats();
    chunks_durable.Set({}, static_cast<double>(s.chunks_durable));
    bytes_durable.Set({}, static_cast<double>(s.bytes_durable));
    hash_mismatches.Set({}, static_cast<double>(s.hash_mismatches));
    frames_refused.Set({}, static_cast<double>(s.frames_refused));
    read_back.Set({"receiving"}, static_cast<double>(s.bytes_read_back_receiving));
    read_back.Set({"publish"}, static_cast<double>(s.bytes_read_back_at_publish));
    for (const auto& [key, n] : s.access_refused) {
      access_refused.Set({key.first, key.second}, static_cast<double>(n));
    }
  }
  Append(out, chunks_durable, bytes_durable, hash_mismatches, read_back, frames_refused,
         access_refused);
}

void CollectJournal(const storage::Journal* journal, Families& out) {
  std::vector<double> bounds;
  for (uint64_t us : storage::kJournalLatencyBoundsUs) {
    bounds.push_back(static_cast<double>(us) / 1e6);
  }
  auto writes = FamilyBuilder::Histogram(
      "longhaul_journal_write_seconds",
      "Latency of synced journal writes (the ones that acknowledge durability).", bounds);
  auto slowest = FamilyBuilder::Gauge("longhaul_journal_write_max_seconds",
                                      "Slowest synced journal write since the daemon started.");
  if (journal != nullptr) {
    storage::JournalStats s = journal->stats();
    writes.SetHistogram({}, s.synced_buckets, static_cast<double>(s.synced_total_us) / 1e6);
    slowest.Set({}, static_cast<double>(s.synced_max_us) / 1e6);
  }
  Append(out, writes, slowest);
}

void CollectLimiter(const peer::RateLimiter* limiter, Families& out) {
  auto limits =
      FamilyBuilder::Gauge("longhaul_rate_limit_bytes_per_second",
                           "Operators' rate caps in force (longhaul limit).", {"scope", "name"});
  auto capped = FamilyBuilder::Counter("longhaul_rate_capped_bytes_total",
                                       "Bytes sent under an operator's cap, charged to it "
                                       "(transfers and exchanges).",
                                       {"scope", "name"});
  if (limiter != nullptr) {
    for (const peer::RateLimiter::Limit& l : limiter->Limits()) {
      if (l.peer.empty()) {
        limits.Set({"class", peer::PriorityClassName(l.priority)},
                   static_cast<double>(l.rate.ToBitsPerSecond()) / 8);
      } else {
        limits.Set({"peer", l.peer}, static_cast<double>(l.rate.ToBitsPerSecond()) / 8);
      }
    }
    for (v1::PriorityClass p : {v1::EXCHANGE, v1::CHECKPOINT, v1::BACKGROUND}) {
      if (ByteCount b = limiter->ChargedToClass(p); b > 0) {
        capped.Set({"class", peer::PriorityClassName(p)}, static_cast<double>(b));
      }
    }
  }
  Append(out, limits, capped);
}

// Refused, timed-out and idle-closed peer connections.
void CollectConnections(const transport::Transport* tcp, Families& out) {
  auto refused = FamilyBuilder::Counter(
      "longhaul_peer_handshakes_refused_total",
      "Peer connections closed before they were served, by reason (a cap of peer_limits, no "
      "thread or descriptor, or a failed TLS handshake)",
      {"reason"});
  auto timed_out = FamilyBuilder::Counter(
      "longhaul_peer_handshakes_timed_out_total",
      "Peer connections closed without TLS and HELLO within peer_limits.handshake_timeout");
  auto idle = FamilyBuilder::Counter(
      "longhaul_peer_connections_idle_closed_total",
      "Authenticated peer connections closed after peer_limits.idle_timeout without traffic");
  auto pending = FamilyBuilder::Gauge("longhaul_peer_handshakes_pending",
                                      "Peer connections accepted whose HELLO has not arrived yet");
  if (tcp != nullptr) {
    const transport::ConnectionCounters c = tcp->connection_counters();
    refused.Set({"too_many_pending"}, c.refused_too_many_pending);
    refused.Set({"too_many_from_address"}, c.refused_too_many_from_address);
    refused.Set({"too_many_for_peer"}, c.refused_too_many_for_peer);
    refused.Set({"no_thread"}, c.refused_no_thread);
    refused.Set({"no_descriptor"}, c.refused_no_fd);
    refused.Set({"handshake_failed"}, c.handshakes_failed);
    timed_out.Set({}, c.handshakes_timed_out);
    idle.Set({}, c.idle_closed);
    pending.Set({}, c.pending_handshakes);
  }
  Append(out, refused, timed_out, idle, pending);
}

}  // namespace

std::vector<prometheus::MetricFamily> DaemonCollector::Collect() const {
  Families out;
  auto build_info = FamilyBuilder::Gauge("longhaul_build_info",
                                         "Always 1; labels name this daemon.", {"site", "version"});
  build_info.Set({sources_.site, "0.1.0"}, 1);
  Append(out, build_info);
  CollectTransfers(sources_.manager, out);
  CollectReceiver(sources_.receiver, out);
  CollectJournal(sources_.journal, out);
  CollectLimiter(sources_.limiter, out);
  CollectConnections(sources_.tcp, out);
  return out;
}

}  // namespace longhaul::metrics
