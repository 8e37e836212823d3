#include "congestion/aggregate_controller.h"

#include <algorithm>

#include "absl/container/inlined_vector.h"
#include "congestion/packet_ring.h"

namespace longhaul::congestion {

// A flow's cwnd is at least this many datagrams, so that every flow makes progress.
constexpr ByteCount kMinFlowCwndDatagrams = 2;

struct AggregateController::Shared {
  Shared(const Bbr3Params& p, Random& random, Timestamp now) : params(p), core(p, random, now) {}
  // The flows together keep at least kMinFlowCwndDatagrams each in flight, whatever the model's
  // cwnd (Bbr3::SetSenderFloor).
  void UpdateSenderFloor() {
    core.SetSenderFloor(static_cast<ByteCount>(num_flows) * kMinFlowCwndDatagrams * params.mss);
  }
  Bbr3Params params;
  Bbr3 core;
  uint64_t next_pn = 1;
  ByteCount total_inflight = 0;
  int num_flows = 0;
  int app_limited_flows = 0;
  // Bytes in flight of the flows that are app-limited (no data to send). The flows that have
  // data share what is left of the model's cwnd.
  ByteCount idle_inflight = 0;
  // Reused per event, so translating an ACK allocates nothing once warm.
  absl::InlinedVector<AckedPacket, 64> acked;
  absl::InlinedVector<LostPacket, 16> lost;
};

namespace {

class FlowView final : public Controller {
 public:
  explicit FlowView(std::shared_ptr<AggregateController::Shared> shared)
      : shared_(std::move(shared)) {
    ++shared_->num_flows;
    shared_->UpdateSenderFloor();
  }
  ~FlowView() override {
    Shared& s = *shared_;
    for (uint64_t pn = packets_.front_pn(); !packets_.empty() && pn < packets_.end_pn(); ++pn) {
      const Mapping* m = packets_.Find(pn);
      if (m == nullptr) continue;
      s.core.ForgetPacket(m->aggregate_pn, m->bytes);
      s.total_inflight -= std::min(s.total_inflight, m->bytes);
    }
    if (app_limited_) {
      --s.app_limited_flows;
      s.idle_inflight -= std::min(s.idle_inflight, inflight_);
    }
    --s.num_flows;
    s.UpdateSenderFloor();
  }

  void OnPacketSent(Timestamp now, uint64_t packet_number, ByteCount bytes,
                    ByteCount bytes_in_flight, bool is_retransmittable) override {
    if (!is_retransmittable) return;
    Shared& s = *shared_;
    if (app_limited_) {
      // The flow has data again: it takes a share of the model from this packet on.
      app_limited_ = false;
      --s.app_limited_flows;
      s.idle_inflight -= std::min(s.idle_inflight, inflight_);
    }
    const uint64_t agg = s.next_pn++;
    packets_.Insert(packet_number, Mapping{agg, bytes});
    s.core.OnPacketSent(now, agg, bytes, s.total_inflight, true);
    s.total_inflight += bytes;
    inflight_ += bytes;
    // This flow is full: the model is cwnd-limited even if the other flows' rounding left the
    // aggregate a few packets short of its cwnd.
    if (inflight_ + s.params.mss > cwnd()) s.core.OnCwndLimited();
  }

  void OnCongestionEvent(Timestamp now, ByteCount prior_in_flight,
                         absl::Span<const AckedPacket> acked,
                         absl::Span<const LostPacket> lost) override {
    Shared& s = *shared_;
    s.acked.clear();
    s.lost.clear();
    ByteCount gone = 0;
    for (const AckedPacket& a : acked) {
      const Mapping* m = packets_.Find(a.packet_number);
      if (m == nullptr) continue;
      s.acked.push_back(AckedPacket{m->aggregate_pn, m->bytes, a.sent_time});
      gone += m->bytes;
      packets_.Erase(a.packet_number);
    }
    for (const LostPacket& l : lost) {
      const Mapping* m = packets_.Find(l.packet_number);
      if (m == nullptr) continue;
      s.lost.push_back(LostPacket{m->aggregate_pn, m->bytes});
      gone += m->bytes;
      packets_.Erase(l.packet_number);
    }
    const ByteCount prior_total = s.total_inflight;
    s.total_inflight -= std::min(s.total_inflight, gone);
    inflight_ -= std::min(inflight_, gone);
    if (app_limited_) s.idle_inflight -= std::min(s.idle_inflight, gone);
    s.core.OnCongestionEvent(now, prior_total, s.acked, s.lost);
  }

  void OnAppLimited() override {
    Shared& s = *shared_;
    if (!app_limited_) {
      app_limited_ = true;
      ++s.app_limited_flows;
      s.idle_inflight += inflight_;
    }
    if (s.app_limited_flows == s.num_flows) s.core.OnAppLimited();
  }

  // The model is split among the flows that have data to send (this one counted as one of them,
  // since it asks because it wants to send): an idle flow's share goes to the busy ones instead of
  // going unused while the idle flow waits for its application.
  ByteCount cwnd() const override {
    const Shared& s = *shared_;
    const ByteCount others_idle =
        s.idle_inflight - (app_limited_ ? std::min(s.idle_inflight, inflight_) : 0);
    const ByteCount model = s.core.cwnd();
    const ByteCount available = model > others_idle ? model - others_idle : 0;
    // Whole datagrams: the transport sends one while any of cwnd is left, so a fraction would let
    // every flow hold a datagram more, and the aggregate more than the model's cwnd.
    const ByteCount datagrams = available / static_cast<ByteCount>(SharingFlows()) / s.params.mss;
    return std::max(datagrams, kMinFlowCwndDatagrams) * s.params.mss;
  }
  Bandwidth pacing_rate() const override { return shared_->core.pacing_rate() / SharingFlows(); }
  ByteCount send_quantum() const override {
    const Shared& s = *shared_;
    return std::max(s.core.send_quantum() / static_cast<ByteCount>(SharingFlows()), s.params.mss);
  }
  ControllerState DebugState() const override {
    ControllerState st = shared_->core.DebugState();
    st.cwnd = cwnd();
    st.pacing_rate = pacing_rate();
    st.bytes_in_flight = inflight_;
    return st;
  }

 private:
  using Shared = AggregateController::Shared;
  // How many flows share the model: those with data to send, and this one.
  int SharingFlows() const {
    const Shared& s = *shared_;
    return std::max(1, s.num_flows - s.app_limited_flows + (app_limited_ ? 1 : 0));
  }
  struct Mapping {
    uint64_t aggregate_pn = 0;
    ByteCount bytes = 0;
  };
  std::shared_ptr<Shared> shared_;
  PacketRing<Mapping> packets_{1024};
  ByteCount inflight_ = 0;
  bool app_limited_ = false;
};

}  // namespace

AggregateController::AggregateController(const Bbr3Params& params, Random& random, Timestamp now)
    : shared_(std::make_shared<Shared>(params, random, now)) {}

AggregateController::~AggregateController() = default;

std::unique_ptr<Controller> AggregateController::AddFlow() {
  return std::make_unique<FlowView>(shared_);
}

const Controller& AggregateController::model() const { return shared_->core; }
int AggregateController::num_flows() const { return shared_->num_flows; }

}  // namespace longhaul::congestion
