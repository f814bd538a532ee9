// Reliable Connection (IBTA vol1 9.7): the requester turns send WQEs into packets and retransmits them (go-back-N
// from the oldest unacknowledged WQE) on a local ACK timeout, a PSN sequence error NAK or after an RNR NAK's delay;
// the completer consumes ACKs, NAKs, READ responses and atomic ACKs and completes WQEs strictly in order; the
// responder executes requests exactly once, NAKs what it must refuse, and answers duplicates — SEND and WRITE are
// acknowledged again, READ and atomics are answered again from saved state, never executed twice.
// The three roles are per-QP objects (rc_requester.h, rc_completer.h, rc_responder.h), their state in rc_state.h;
// this file is the Device's part: it hands a received RC packet to the role it is for, resumes the requesters waiting
// for a path's window, and sends the ACKs the responders hold when their time is up.
#include "emu/device.h"
#include "emu/out_batch.h"
#include "wire/frame.h"
#include "wire/opcode.h"

namespace uroce::emu {

void Device::ReceiveRcLocked(QueuePair* qp, const wire::PacketView& p, OutBatch& out) {
  if (p.info->is_request) {
    qp->responder().OnRequest(p, out);
    return;
  }
  if (qp->state() != QpState::kRts && qp->state() != QpState::kSqd) return;  // responses only matter when sending
  RcRequester& requester = qp->requester();
  const uint32_t acked_before = requester.state().acked_psn_next;
  qp->completer().OnResponse(p, out);
  // What was delivered opens the path's window; others waiting for it resume.
  PathWindow& path = core_.PathOf(*qp);
  const int32_t delivered = PsnDiff(requester.state().acked_psn_next, acked_before);
  if (delivered > 0) path.OnDelivered(static_cast<uint32_t>(delivered));
  requester.Charge(path);
  WakePathWaitersLocked(path, out);
}

void Device::WakePathWaitersLocked(PathWindow& path, OutBatch& out) {
  if (!path.MayWake()) return;
  while (path.MaySend() && !path.waiting().empty()) {
    const uint32_t qpn = path.waiting().front();
    path.waiting().pop_front();
    QueuePair* qp = FindQpLocked(qpn);
    if (qp == nullptr || !qp->requester().TakeWaitingForPath()) continue;  // destroyed or reset since
    qp->requester().Progress(out);
  }
}

void Device::SendHeldAcksLocked(uint64_t due_by_ns, OutBatch& out) {
  std::vector<uint32_t> held;
  held.swap(core_.acks_held);  // what leaves is dropped from core_.acks_held on the way; the rest goes back
  uint64_t next = 0;
  for (const uint32_t qpn : held) {
    QueuePair* qp = FindQpLocked(qpn);
    if (qp == nullptr || !qp->responder().ack_held()) continue;  // destroyed or reset since
    RcResponder& responder = qp->responder();
    if (responder.held_due_ns() <= due_by_ns || qp->state() == QpState::kErr) {
      responder.SendHeldAck(out);
      continue;
    }
    next = wire::EarlierDeadline(next, responder.held_due_ns());
    core_.acks_held.push_back(qpn);
  }
  core_.next_held_ack_due_ns.store(next, std::memory_order_relaxed);
}

}  // namespace uroce::emu
