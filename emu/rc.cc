// Reliable Connection (IBTA vol1 9.7): the requester turns send WQEs into packets and retransmits them (go-back-N
// from the oldest unacknowledged WQE) on a local ACK timeout, a PSN sequence error NAK or after an RNR NAK's delay;
// the completer consumes ACKs, NAKs, READ responses and atomic ACKs and completes WQEs strictly in order; the
// responder executes requests exactly once, NAKs what it must refuse, and answers duplicates — SEND and WRITE are
// acknowledged again, READ and atomics are answered again from saved state, never executed twice.
// The three roles are per-QP objects (rc_requester.h, rc_completer.h, rc_responder.h), their state in rc_state.h;
// this file is the Device's part: it hands a received RC packet to the role it is for, resumes the requesters waiting
// for a path's window, and sends the ACKs the responders hold when their time is up.
#include "emu/device.h"

#include <mutex>
#include <vector>

#include "emu/out_batch.h"
#include "wire/frame.h"
#include "wire/opcode.h"
#include "wire/scratch_list.h"

namespace uroce::emu {

bool Device::ReceiveRcLocked(QueuePair* qp, const wire::PacketView& p, OutBatch& out) {
  if (p.info->is_request) {
    qp->responder().OnRequest(p, out);
    return false;
  }
  if (qp->state() != QpState::kRts && qp->state() != QpState::kSqd) return false;  // responses matter when sending
  RcRequester& requester = qp->requester();
  const uint32_t acked_before = requester.state().acked_psn_next;
  qp->completer().OnResponse(p, out);
  // What was delivered opens the path's window; others waiting for it resume (the caller wakes them).
  const int32_t delivered = PsnDiff(requester.state().acked_psn_next, acked_before);
  MutexLock lock(core_.paths_mu());
  PathWindow& path = core_.PathOfLocked(*qp);
  if (delivered > 0) path.OnDelivered(static_cast<uint32_t>(delivered));
  requester.ChargeLocked(path);
  return !path.waiting().empty() && path.MayWake();
}

void Device::WakePathWaitersLocked(const wire::IpAddress& peer, OutBatch& out) {
  bool first = true;
  for (;;) {
    uint32_t qpn;
    {
      MutexLock lock(core_.paths_mu());
      auto it = core_.paths().find(peer);
      if (it == core_.paths().end()) return;
      PathWindow& path = it->second;
      if (first && !path.MayWake()) return;
      first = false;
      if (!path.MaySend() || path.waiting().empty()) return;
      qpn = path.waiting().front();
      path.waiting().pop_front();
    }
    QueuePair* qp = FindQpLocked(qpn);
    if (qp == nullptr) continue;  // destroyed since
    std::lock_guard lock(qp->mutex());
    if (!qp->requester().TakeWaitingForPath()) continue;  // reset since
    qp->requester().Progress(out);
  }
}

void Device::SendHeldAcksLocked(uint64_t due_by_ns, OutBatch& out) {
  // This thread's list, whose storage goes to the core in exchange for the core's (NoteAckHeld fills it again):
  // a vector made here per pass was an allocation per ping-pong message.
  wire::ScratchList<DeviceCore::HeldAck> held;
  {
    MutexLock lock(core_.acks_mu());
    held->swap(core_.acks_held());  // what leaves is done with; the rest goes back (NoteAckHeld)
  }
  for (const DeviceCore::HeldAck& h : *held) {
    QueuePair* qp = FindQpLocked(h.qpn);
    if (qp == nullptr) continue;  // destroyed since
    std::lock_guard lock(qp->mutex());
    RcResponder& responder = qp->responder();
    if (!responder.ack_held()) continue;  // sent or reset since
    if (responder.held_due_ns() <= due_by_ns || qp->state() == QpState::kErr) {
      responder.SendHeldAck(out);
      continue;
    }
    core_.NoteAckHeld(h.qpn, responder.held_due_ns());
  }
  MutexLock lock(core_.acks_mu());
  uint64_t next = 0;
  for (const DeviceCore::HeldAck& h : core_.acks_held()) next = wire::EarlierDeadline(next, h.due_ns);
  core_.next_held_ack_due_ns.store(next, std::memory_order_relaxed);
}

}  // namespace uroce::emu
