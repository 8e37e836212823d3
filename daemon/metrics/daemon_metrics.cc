#include "daemon/metrics/daemon_metrics.h"

#include <map>
#include <vector>

#include "absl/strings/ascii.h"
#include "daemon/peer/rate_limiter.h"
#include "daemon/peer/receiver.h"
#include "daemon/transfer_manager.h"
#include "longhaul/v1/control.pb.h"
#include "storage/journal.h"

namespace longhaul::metrics {
namespace {

constexpr v1::TransferState kStates[] = {v1::QUEUED,     v1::RUNNING, v1::PAUSED,
                                         v1::PUBLISHING, v1::COMPLETED, v1::FAILED,
                                         v1::CANCELLED};

std::vector<double> JournalBoundsSeconds() {
  std::vector<double> bounds;
  for (uint64_t us : storage::kJournalLatencyBoundsUs) bounds.push_back(static_cast<double>(us) / 1e6);
  return bounds;
}

}  // namespace

void RegisterDaemonMetrics(Registry& registry, DaemonSources sources) {
  Registry* r = &registry;
  auto& build_info = r->AddGauge("longhaul_build_info", "Always 1; labels name this daemon.",
                                 {"site", "version"});
  build_info.WithLabels({sources.site, "0.1.0"}).Set(1);

  // Source side: outgoing transfers, summed over every transfer the daemon
  // knows (ended ones included, so the sums only grow while it runs).
  auto& transfers = r->AddGauge("longhaul_transfers", "Outgoing transfers by state.", {"state"});
  auto& queued_bytes = r->AddGauge("longhaul_queued_bytes",
                                   "Bytes of unfinished outgoing transfers not yet durable at "
                                   "their destination.");
  auto& bytes_sent = r->AddCounter("longhaul_bytes_sent_total",
                                   "Chunk bytes sent to peers, re-sends included.");
  auto& bytes_resent = r->AddCounter("longhaul_bytes_resent_total",
                                     "Chunk bytes sent more than once (lost, corrupted or "
                                     "interrupted before their acknowledgement).");
  auto& bytes_acked = r->AddCounter("longhaul_bytes_acknowledged_total",
                                    "Bytes of outgoing transfers acknowledged durable by their "
                                    "destination.");
  auto& chunks_acked = r->AddCounter("longhaul_chunks_acknowledged_total",
                                     "Chunks of outgoing transfers acknowledged durable by their "
                                     "destination.");
  auto& peer_sent = r->AddCounter("longhaul_peer_bytes_sent_total",
                                  "Chunk bytes sent to a peer, re-sends included.", {"peer"});
  auto& peer_resent = r->AddCounter("longhaul_peer_bytes_resent_total",
                                    "Chunk bytes sent to a peer more than once.", {"peer"});

  // Per-peer link figures, as the last acknowledged chunk's connection
  // reported them (TCP_INFO for tcp; the transport's own for udp).
  auto& peer_up = r->AddGauge("longhaul_peer_configured", "1 for each configured peer site.",
                              {"peer", "transport"});
  auto& peer_rtt = r->AddGauge("longhaul_peer_rtt_seconds", "Smoothed round-trip time to a peer.",
                               {"peer"});
  auto& peer_bw = r->AddGauge("longhaul_peer_bandwidth_estimate_bits_per_second",
                              "Delivery rate the congestion controller measured to a peer.",
                              {"peer"});
  auto& peer_retrans = r->AddGauge("longhaul_peer_retransmits",
                                   "Segments or packets retransmitted on the most recently "
                                   "observed data connection to a peer (resets with the "
                                   "connection).",
                                   {"peer"});
  auto& peer_sockbuf = r->AddGauge("longhaul_peer_socket_buffer_bytes",
                                   "Send buffer the kernel granted on data connections to a peer.",
                                   {"peer"});
  auto& peer_streams = r->AddGauge("longhaul_peer_active_streams",
                                   "Data streams currently sending to a peer.", {"peer"});
  auto& peer_cc = r->AddGauge("longhaul_peer_congestion_control_info",
                              "1 for the congestion control algorithm in use to a peer.",
                              {"peer", "algorithm"});

  // Destination side.
  auto& chunks_durable = r->AddCounter("longhaul_chunks_durable_total",
                                       "Chunks received, synced and journaled at this site.");
  auto& bytes_durable = r->AddCounter("longhaul_bytes_durable_total",
                                      "Chunk bytes received, synced and journaled at this site.");
  auto& hash_mismatches = r->AddCounter("longhaul_chunk_hash_mismatches_total",
                                        "Received chunks whose bytes did not match their digest.");
  auto& read_back = r->AddCounter(
      "longhaul_staged_bytes_read_back_total",
      "Staged chunk bytes read back against their digests: while receiving, or before publish.",
      {"when"});
  auto& frames_refused = r->AddCounter("longhaul_frames_refused_total",
                                       "Malformed or unexpected frames refused from peers.");
  auto& access_refused = r->AddCounter(
      "longhaul_export_access_refused_total",
      "Peer requests refused because the peer may not write there: not one of the export's "
      "writers, or the destination is another site's.",
      {"peer", "export"});

  auto& journal_writes = r->AddHistogram(
      "longhaul_journal_write_seconds",
      "Latency of synced journal writes (the ones that acknowledge durability).",
      JournalBoundsSeconds());
  auto& journal_max = r->AddGauge("longhaul_journal_write_max_seconds",
                                  "Slowest synced journal write since the daemon started.");

  auto& limits = r->AddGauge("longhaul_rate_limit_bits_per_second",
                             "Operators' rate caps in force (longhaul limit).", {"scope", "name"});
  auto& capped = r->AddCounter("longhaul_rate_capped_bytes_total",
                               "Bytes sent under an operator's cap, charged to it (transfers and "
                               "exchanges).",
                               {"scope", "name"});

  r->AddCollector([=, &transfers, &queued_bytes, &bytes_sent, &bytes_resent, &bytes_acked,
                   &chunks_acked, &peer_sent, &peer_resent, &peer_up, &peer_rtt, &peer_bw,
                   &peer_retrans, &peer_sockbuf, &peer_streams, &peer_cc, &chunks_durable,
                   &bytes_durable, &hash_mismatches, &read_back, &frames_refused, &access_refused,
                   &journal_writes, &journal_max, &limits, &capped] {
    if (sources.manager != nullptr) {
      std::map<v1::TransferState, int> by_state;
      double sent = 0, resent = 0, acked = 0, chunks = 0, queued = 0;
      std::map<std::string, std::pair<double, double>> per_peer;  // sent, resent
      for (const v1::TransferStatus& t : sources.manager->List(/*all=*/true)) {
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
        transfers.WithLabels({absl::AsciiStrToLower(v1::TransferState_Name(s))})
            .Set(by_state[s]);
      }
      queued_bytes.WithLabels({}).Set(queued);
      bytes_sent.WithLabels({}).Set(sent);
      bytes_resent.WithLabels({}).Set(resent);
      bytes_acked.WithLabels({}).Set(acked);
      chunks_acked.WithLabels({}).Set(chunks);

      v1::PeersResponse peers = sources.manager->Peers(/*probe=*/false);
      peer_cc.Clear();
      for (const v1::PeerStatus& p : peers.peers()) {
        peer_up.WithLabels({p.site(), p.transport()}).Set(1);
        peer_rtt.WithLabels({p.site()}).Set(p.rtt_ms() * 1e-3);
        peer_bw.WithLabels({p.site()}).Set(p.delivery_rate_mbit() * 1e6);
        peer_retrans.WithLabels({p.site()}).Set(static_cast<double>(p.retransmits()));
        peer_sockbuf.WithLabels({p.site()}).Set(static_cast<double>(p.socket_buffer_bytes()));
        peer_streams.WithLabels({p.site()}).Set(p.active_streams());
        if (!p.congestion_control().empty()) {
          peer_cc.WithLabels({p.site(), p.congestion_control()}).Set(1);
        }
        auto it = per_peer.find(p.site());
        peer_sent.WithLabels({p.site()}).Set(it == per_peer.end() ? 0 : it->second.first);
        peer_resent.WithLabels({p.site()}).Set(it == per_peer.end() ? 0 : it->second.second);
      }
    }
    if (sources.receiver != nullptr) {
      peer::ReceiverStats s = sources.receiver->stats();
      chunks_durable.WithLabels({}).Set(static_cast<double>(s.chunks_durable));
      bytes_durable.WithLabels({}).Set(static_cast<double>(s.bytes_durable));
      hash_mismatches.WithLabels({}).Set(static_cast<double>(s.hash_mismatches));
      frames_refused.WithLabels({}).Set(static_cast<double>(s.frames_refused));
      read_back.WithLabels({"receiving"}).Set(static_cast<double>(s.bytes_read_back_receiving));
      read_back.WithLabels({"publish"}).Set(static_cast<double>(s.bytes_read_back_at_publish));
      for (const auto& [key, n] : s.access_refused) {
        access_refused.WithLabels({key.first, key.second}).Set(static_cast<double>(n));
      }
    }
    if (sources.journal != nullptr) {
      storage::JournalStats s = sources.journal->stats();
      journal_writes.WithLabels({}).SetCounts(s.synced_buckets,
                                              static_cast<double>(s.synced_total_us) / 1e6);
      journal_max.WithLabels({}).Set(static_cast<double>(s.synced_max_us) / 1e6);
    }
    if (sources.limiter != nullptr) {
      limits.Clear();
      for (const peer::RateLimiter::Limit& l : sources.limiter->Limits()) {
        if (l.peer.empty()) {
          limits.WithLabels({"class", peer::PriorityClassName(l.priority)})
              .Set(static_cast<double>(l.rate.ToBitsPerSecond()));
        } else {
          limits.WithLabels({"peer", l.peer}).Set(static_cast<double>(l.rate.ToBitsPerSecond()));
        }
      }
      for (v1::PriorityClass p : {v1::EXCHANGE, v1::CHECKPOINT, v1::BACKGROUND}) {
        if (ByteCount b = sources.limiter->ChargedToClass(p); b > 0) {
          capped.WithLabels({"class", peer::PriorityClassName(p)}).Set(static_cast<double>(b));
        }
      }
    }
  });
}

}  // namespace longhaul::metrics
