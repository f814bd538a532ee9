// The RC completer (rc_completer.h): ACKs, NAKs, RNR NAKs, READ responses and atomic ACKs -> WQEs done, completed in
// order by the requester; a NAK or a gap in READ responses sends the requester back.
#include "emu/rc_completer.h"

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "emu/device_core.h"
#include "emu/out_batch.h"
#include "emu/queue_pair.h"
#include "wire/frame.h"
#include "wire/headers.h"
#include "wire/opcode.h"

namespace uroce::emu {
namespace {

// rnr_retry 7 means "retry forever" (IBTA 9.7.5.2.8, ibv_modify_qp(3)); retry_cnt 7 means seven retries (C9-141),
// unless the device is configured as rxe behaves (DeviceConfig::retry_cnt_7_infinite).
constexpr int kInfiniteRnrRetry = 7;

}  // namespace

void RcCompleter::OnResponse(const wire::PacketView& p, OutBatch& out) {
  RcRequester& requester = qp_.requester();
  RcRequesterState& r = requester.state();
  const QpAttributes& a = qp_.attributes();
  const uint32_t psn = p.bth.psn;
  const uint32_t mtu = MtuBytes(a.path_mtu);
  bool progressed = false;
  // A response names a PSN this requester has sent (IBTA 9.7.5.2: the completer checks a response's PSN against
  // what is outstanding; rxe's check_psn). One for a PSN never sent changes nothing: an ACK with a PSN ahead of ours
  // would otherwise complete a WRITE its responder never received (a stopped peer, a forged packet).
  if (PsnDiff(psn, r.sent_psn_next) >= 0) {
    core_.Count(&DeviceCounters::rc_unexpected_responses);
    return;
  }

  // Every WQE wholly before `limit` that needs nothing more than an ACK is acknowledged (IBTA 9.7.5.1.2: an ACK, a
  // READ response or an atomic ACK acknowledges all earlier requests). A READ or atomic before it that got no
  // response has lost it: go back and ask again ("implied NAK", 9.7.5.2.2).
  auto ack_before = [&](uint32_t limit, bool inclusive) {
    for (size_t i = 0; i < r.sq.size(); ++i) {
      SendWqe& w = r.sq[i];
      if (!w.started()) break;
      const int32_t d = PsnDiff(w.last_psn(), limit);
      if (inclusive ? d > 0 : d >= 0) break;
      if (w.done()) continue;
      if (w.is_read()) {
        // Its missing responses were lost: ask for the rest of that segment again, once per gap, and go on -- the
        // requests after it were answered, so going back to resend them all would only multiply the traffic.
        requester.RerequestRead(w, out);
        continue;
      }
      if (w.is_atomic()) {
        requester.GoBack(i, 0);
        break;
      }
      w.state = WqeState::kDone;
      progressed = true;
    }
  };
  auto advance_acked = [&](uint32_t next) {
    if (PsnDiff(next, r.acked_psn_next) > 0) {
      r.acked_psn_next = next;
      progressed = true;
      requester.AckedUpTo(next);
    }
  };

  if (p.info->op == wire::Operation::kAcknowledge && p.aeth) {
    const wire::Aeth& aeth = *p.aeth;
    switch (aeth.kind()) {
      case wire::AethKind::kAck:
        ack_before(psn, /*inclusive=*/true);
        advance_acked(PsnAdd(psn, 1));
        break;
      case wire::AethKind::kRnrNak: {
        ack_before(psn, false);
        advance_acked(psn);
        const size_t i = requester.WqeContaining(psn);
        if (i == r.sq.size()) break;  // stale
        if (r.rnr_retries_left == 0) {
          requester.Fail(i, WcStatus::kRnrRetryExcErr);
          return;
        }
        if (a.rnr_retry != kInfiniteRnrRetry) --r.rnr_retries_left;
        requester.GoBack(i, static_cast<uint32_t>(PsnDiff(psn, r.sq[i].first_psn)));
        r.retransmit_deadline_ns = 0;
        r.rnr_deadline_ns = core_.Now() + uint64_t{wire::RnrTimerMicros(aeth.rnr_timer())} * 1000;
        requester.TimerArmed(r.rnr_deadline_ns);
        requester.CompleteInOrder();
        return;
      }
      case wire::AethKind::kNak: {
        ack_before(psn, false);
        const size_t i = requester.WqeContaining(psn);
        if (aeth.nak_code() == wire::NakCode::kPsnSeqError) {
          // The responder expects `psn`: resend from there at once (9.7.5.2.1), without spending a retry. A packet
          // was lost on the way: the path is congested.
          requester.Congestion();
          advance_acked(psn);
          if (i < r.sq.size()) {
            requester.GoBack(i, static_cast<uint32_t>(PsnDiff(psn, r.sq[i].first_psn)));
            if (r.sq[i].is_read()) r.sq[i].read_next = r.cursor_pkt;
          }
          // The resend re-arms the ACK timer. Only a PSN that advanced (advance_acked) is progress that restores
          // the retry budgets: a NAK repeating the PSN of an RNR-NAKed request must not refill rnr_retry.
          r.retransmit_deadline_ns = 0;
          break;
        }
        if (i == r.sq.size()) break;
        WcStatus st = WcStatus::kRemOpErr;
        switch (aeth.nak_code()) {
          case wire::NakCode::kInvalidRequest: st = WcStatus::kRemInvReqErr; break;
          case wire::NakCode::kRemoteAccessError: st = WcStatus::kRemAccessErr; break;
          case wire::NakCode::kRemoteOperationalError: st = WcStatus::kRemOpErr; break;
          case wire::NakCode::kInvalidRdRequest: st = WcStatus::kRemInvRdReqErr; break;
          default: st = WcStatus::kBadRespErr; break;
        }
        requester.Fail(i, st);
        return;
      }
      default:
        return;  // reserved syndrome: ignored
    }
  } else if (p.info->op == wire::Operation::kReadResponse) {
    const size_t i = requester.WqeContaining(psn);
    if (i == r.sq.size() || !r.sq[i].is_read() || r.sq[i].done()) return;  // duplicate or stale
    SendWqe& w = r.sq[i];
    const uint32_t expected = PsnAdd(w.first_psn, w.read_next);
    if (psn != expected) {
      // A response was lost (9.7.5.2.2): ask again for the rest of the segment, once per gap -- the responses
      // still in flight behind the lost one would otherwise each trigger a whole new answer. Only the READ is
      // asked again: later requests were received, or their own timeout resends them.
      if (PsnDiff(psn, expected) > 0) requester.RerequestRead(w, out);
      return;
    }
    if (p.aeth && p.aeth->kind() != wire::AethKind::kAck) return;
    ack_before(w.first_psn, false);
    const bool last_expected = w.read_next + 1 == ReadSegmentEnd(w, w.read_next);
    const bool is_last = p.info->position == wire::MsgPosition::kLast || p.info->position == wire::MsgPosition::kOnly;
    const uint64_t off = uint64_t{w.read_next} * mtu;
    const uint64_t want = std::min<uint64_t>(mtu, w.length - std::min(off, w.length));
    if (is_last != last_expected || p.payload.size() != want) {
      requester.Fail(i, WcStatus::kBadRespErr);
      return;
    }
    WcStatus st = core_.Scatter(qp_, w.wr.sg_list, off, p.payload);
    if (st != WcStatus::kSuccess) {
      requester.Fail(i, st);
      return;
    }
    ++w.read_next;
    if (w.read_next == w.npsn) w.state = WqeState::kDone;
    advance_acked(PsnAdd(psn, 1));
    if (r.cursor_wqe == i && r.cursor_pkt < w.read_next) r.cursor_pkt = w.read_next;
    progressed = true;
  } else if (p.info->op == wire::Operation::kAtomicAcknowledge) {
    const size_t i = requester.WqeContaining(psn);
    if (i == r.sq.size() || !r.sq[i].is_atomic() || r.sq[i].done()) return;
    if (p.aeth && p.aeth->kind() != wire::AethKind::kAck) return;
    ack_before(psn, false);
    SendWqe& w = r.sq[i];
    uint8_t orig[8];
    std::memcpy(orig, &p.atomic_ack->original, 8);  // host order, as the local buffer holds a uint64_t
    WcStatus st = core_.Scatter(qp_, w.wr.sg_list, 0, orig);
    if (st != WcStatus::kSuccess) {
      requester.Fail(i, st);
      return;
    }
    w.state = WqeState::kDone;
    advance_acked(PsnAdd(psn, 1));
  } else {
    return;
  }
  if (progressed) {
    // Forward progress restores both retry budgets: they bound the retries of one request, not the connection's.
    r.retries_left = a.retry_cnt;
    r.rnr_retries_left = a.rnr_retry;
    r.retransmit_deadline_ns = 0;
  }
  requester.CompleteInOrder();
  if (qp_.state() == QpState::kErr) return;
  requester.Progress(out);
  // Still waiting for something: keep the timer running.
  for (const SendWqe& w : r.sq) {
    if (w.in_flight()) {
      if (r.retransmit_deadline_ns == 0 && r.rnr_deadline_ns == 0) requester.ArmRetransmit();
      break;
    }
  }
}

}  // namespace uroce::emu
