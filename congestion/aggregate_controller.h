// AggregateController: one BBRv3 model shared by the N flows a transfer opens to one peer.
//
// A UDP transport spreads a transfer over N sockets (so ECMP spreads the packets), but the N
// flows cross the same bottleneck and must together take one fair share, not N. Each flow gets a
// Controller view from AddFlow() and drives it exactly as it would drive its own controller, in
// its own packet-number space. The views map every packet into one aggregate sequence, feed a
// single Bbr3 (so its rate samples, rounds, loss rate and min_rtt pool all flows), and split the
// model's cwnd and pacing rate equally across the flows that have data to send.
//
// A flow is idle from its OnAppLimited() until its next OnPacketSent(). Idle flows give their
// share to the busy ones: a busy flow's cwnd is (model cwnd - bytes in flight of idle flows) /
// busy flows, and its pacing rate the model's rate / busy flows. (A flow that sits idle between
// application writes, e.g. waiting for an end-to-end acknowledgement, would otherwise strand
// 1/N of the pipe; and since the busy flows fill the whole cwnd, the model is rightly not
// app-limited then.) An idle flow that asks is quoted the share it would get as a busy one.
// A flow's cwnd is a whole number of MSS-size datagrams (the transport sends a datagram while any
// of cwnd is left, so a fraction would let each flow hold one more), and at least 2 (so a flow can
// always make progress). The model is told that N flows keep at least 2N datagrams in flight
// (Bbr3::SetSenderFloor), so that ProbeRTT never waits for less.
//
// The model is app-limited only when every flow has reported OnAppLimited() since its last send.
// A flow view may be destroyed at any time; its outstanding packets are then forgotten without a
// congestion signal. Views keep the shared model alive, so they may outlive the
// AggregateController.
//
// Not thread-safe: the AggregateController and all of its views must be driven under one lock
// (the udp transport shares one mutex among the coupled flows of a peer).
#ifndef LONGHAUL_CONGESTION_AGGREGATE_CONTROLLER_H_
#define LONGHAUL_CONGESTION_AGGREGATE_CONTROLLER_H_

#include <memory>

#include "congestion/bbr3.h"
#include "congestion/controller.h"

namespace longhaul::congestion {

class AggregateController {
 public:
  // `random` must outlive the controller and all of its views.
  AggregateController(const Bbr3Params& params, Random& random, Timestamp now);
  ~AggregateController();

  // A new flow of this aggregate. The returned Controller reports the flow's share.
  std::unique_ptr<Controller> AddFlow();

  // The shared model (whole-aggregate cwnd and pacing rate).
  const Controller& model() const;
  int num_flows() const;

  struct Shared;

 private:
  std::shared_ptr<Shared> shared_;
};

}  // namespace longhaul::congestion

#endif  // LONGHAUL_CONGESTION_AGGREGATE_CONTROLLER_H_
