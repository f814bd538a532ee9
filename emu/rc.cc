// Reliable Connection (IBTA vol1 9.7): the requester turns send WQEs into packets and retransmits them (go-back-N
// from the oldest unacknowledged WQE) on a local ACK timeout, a PSN sequence error NAK or after an RNR NAK's delay;
// the completer consumes ACKs, NAKs, READ responses and atomic ACKs and completes WQEs strictly in order; the
// responder executes requests exactly once, NAKs what it must refuse, and answers duplicates — SEND and WRITE are
// acknowledged again, READ and atomics are answered again from saved state, never executed twice.
// The three roles are in rc_requester.cc, rc_completer.cc and rc_responder.cc, their state in rc_state.h; this file
// hands a received RC packet to the role it is for.
#include "emu/device.h"
#include "emu/out_batch.h"
#include "wire/frame.h"
#include "wire/opcode.h"

namespace uroce::emu {

wire::UdpEndpoint Device::PeerOf(const QueuePair& qp) const {
  return {wire::IpAddress::FromBytes(qp.attributes().ah_attr.dgid.data()), wire::kRoceV2UdpPort};
}

uint16_t Device::SourcePortOf(const QueuePair& qp) const {
  return wire::RoceSourcePort(qp.qpn(), qp.attributes().dest_qp_num);
}

PathWindow& Device::PathOf(const QueuePair& qp) { return paths_[PeerOf(qp).addr]; }

void Device::ReceiveRcLocked(QueuePair* qp, const wire::PacketView& p, OutBatch& out) {
  if (p.info->is_request) {
    RcResponderLocked(qp, p, out);
  } else {
    if (qp->state() != QpState::kRts && qp->state() != QpState::kSqd) return;  // responses only matter when sending
    const uint32_t acked_before = qp->requester().acked_psn_next;
    RcCompleterLocked(qp, p, out);
    // What was delivered opens the path's window; others waiting for it resume.
    PathWindow& path = PathOf(*qp);
    const int32_t delivered = PsnDiff(qp->requester().acked_psn_next, acked_before);
    if (delivered > 0) path.OnDelivered(static_cast<uint32_t>(delivered));
    RcChargeLocked(qp, path);
    RcWakeWaitersLocked(path, out);
  }
}

}  // namespace uroce::emu
