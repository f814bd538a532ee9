// Reliable Connection (IBTA vol1 9.7): the requester turns send WQEs into packets and retransmits them (go-back-N
// from the oldest unacknowledged WQE) on a local ACK timeout, a PSN sequence error NAK or after an RNR NAK's delay;
// the completer consumes ACKs, NAKs, READ responses and atomic ACKs and completes WQEs strictly in order; the
// responder executes requests exactly once, NAKs what it must refuse, and answers duplicates — SEND and WRITE are
// acknowledged again, READ and atomics are answered again from saved state, never executed twice.
#include <algorithm>
#include <cerrno>
#include <cstring>

#include "emu/device.h"
#include "emu/out_batch.h"
#include "wire/frame.h"
#include "wire/headers.h"
#include "wire/opcode.h"

namespace uroce::emu {
namespace {

// Packets in flight per QP beyond the oldest unacknowledged PSN. Bounds what one QP pushes into the peer's socket
// buffer; IBTA leaves the window to the implementation (the PSN space allows 2^23).
constexpr int32_t kWindowPackets = 512;
// AckReq on the last packet of each message and on every 64th packet of a long one (IBTA 9.7.4.1.2).
constexpr uint32_t kAckReqEvery = 64;
// A READ is requested in segments of at most this many response packets, the next one once the previous has
// arrived, so what one READ has in flight towards the requester is bounded like the window of a WRITE. On the wire a
// segment is a READ request for part of the message, as a retried READ is (IBTA 9.7.4.1.4).
constexpr uint32_t kReadSegmentPackets = 64;
// The responder hands READ responses to the network in bursts of at most this many packets, so a request for a long
// message (a peer may ask for 2 GiB at once) never has more than one burst built in memory.
constexpr size_t kResponseBurstPackets = 64;
// rnr_retry 7 means "retry forever" (IBTA 9.7.5.2.8, ibv_modify_qp(3)); retry_cnt 7 means seven retries (C9-141),
// unless the device is configured as rxe behaves (DeviceConfig::retry_cnt_7_infinite).
constexpr int kInfiniteRnrRetry = 7;
// Saved READ/atomic responses kept for duplicates: at least the device's max_qp_rd_atom (128) outstanding requests
// must be answerable again (IBTA 9.7.5.1.6: responder resources = max_dest_rd_atomic), with room to spare.
constexpr size_t kSavedResponses = 256;
static_assert(kSavedResponses >= DeviceLimits{}.max_qp_rd_atom, "a duplicate of any outstanding request is answered");

uint64_t AckTimeoutNs(uint8_t timeout) { return timeout == 0 ? 0 : uint64_t{4096} << timeout; }

uint32_t PacketsFor(uint64_t length, uint32_t mtu) {
  return length == 0 ? 1 : static_cast<uint32_t>((length + mtu - 1) / mtu);
}

// One past the last response packet of the READ segment that holds response packet `k`.
uint32_t ReadSegmentEnd(const SendWqe& w, uint32_t k) {
  return std::min(w.npsn, (k / kReadSegmentPackets + 1) * kReadSegmentPackets);
}

}  // namespace

wire::UdpEndpoint Device::PeerOf(const QueuePair& qp) const {
  return {wire::IpAddress::FromBytes(qp.attributes().ah_attr.dgid.data()), wire::kRoceV2UdpPort};
}

uint16_t Device::SourcePortOf(const QueuePair& qp) const {
  return wire::RoceSourcePort(qp.qpn(), qp.attributes().dest_qp_num);
}

PathWindow& Device::PathOf(const QueuePair& qp) { return paths_[PeerOf(qp).addr]; }

void Device::RcChargeLocked(QueuePair* qp) {
  if (qp->type() != QpType::kRc && qp->type() != QpType::kXrcSend) return;
  RcChargeLocked(qp, PathOf(*qp));
}

void Device::RcChargeLocked(QueuePair* qp, PathWindow& path) {
  RcRequester& r = qp->requester();
  const QpState s = qp->state();
  const int64_t now =
      s == QpState::kRts || s == QpState::kSqd ? std::max(0, PsnDiff(r.sent_psn_next, r.acked_psn_next)) : 0;
  if (now == r.charged) return;
  path.Charge(now - r.charged);
  // Room freed outside the completer (an error, a reset, a destroyed QP): have the timer pass wake the waiters.
  if (now < r.charged && !path.waiting().empty()) WakeForTimer(clock_.NowNs());
  r.charged = now;
}

void Device::RcWakeWaitersLocked(PathWindow& path, OutBatch& out) {
  while (path.MaySend() && !path.waiting().empty()) {
    const uint32_t qpn = path.waiting().front();
    path.waiting().pop_front();
    QueuePair* qp = FindQpLocked(qpn);
    if (qp == nullptr || !qp->requester().waiting_for_path) continue;  // destroyed or reset since
    qp->requester().waiting_for_path = false;
    RcProgressLocked(qp, out);
  }
}

bool Device::GatherRangeLocked(const QueuePair& qp, const SendWr& wr, uint64_t offset, uint64_t len,
                               std::vector<std::span<const uint8_t>>& pieces) {
  pieces.clear();
  if (wr.flags & send_flags::kInline) {
    pieces.emplace_back(wr.inline_data.data() + offset, len);
    return true;
  }
  uint64_t skip = offset, got = 0;
  for (const Sge& sge : wr.sg_list) {
    if (got == len) break;
    if (skip >= sge.length) {
      skip -= sge.length;
      continue;
    }
    const uint64_t n = std::min<uint64_t>(sge.length - skip, len - got);
    AccessResult r = keys_.CheckLocal(sge.lkey, qp.init().pd, sge.addr + skip, n, 0);
    if (!r.ok()) return false;
    pieces.emplace_back(r.host, n);
    got += n;
    skip = 0;
  }
  return got == len;
}

// --- requester ---------------------------------------------------------------------------------------------------

int Device::PostSendRcLocked(QueuePair* qp, SendWr& wr, OutBatch& out) {
  switch (wr.opcode) {
    case SendOpcode::kSend:
    case SendOpcode::kSendWithImm:
    case SendOpcode::kSendWithInv:
    case SendOpcode::kRdmaWrite:
    case SendOpcode::kRdmaWriteWithImm:
      break;
    case SendOpcode::kRdmaRead:
      if (wr.flags & send_flags::kInline) return EINVAL;  // nothing to send inline: the data comes back
      break;
    case SendOpcode::kAtomicCmpAndSwp:
    case SendOpcode::kAtomicFetchAndAdd:
      // IBTA 9.4.5: atomics are 8 bytes on an 8-byte aligned address; the local buffer receives the original value.
      if ((wr.flags & send_flags::kInline) || wr.TotalLength() != 8 || (wr.remote_addr & 7)) return EINVAL;
      break;
    case SendOpcode::kLocalInv:
    case SendOpcode::kBindMw:
      break;  // local operations, executed in order when the send queue reaches them
    default:
      return EINVAL;
  }
  RcRequester& r = qp->requester();
  if (r.sq.size() >= qp->attributes().cap.max_send_wr) return ENOMEM;
  SendWqe w;
  w.wr = std::move(wr);
  r.sq.push_back(std::move(w));
  RcProgressLocked(qp, out);
  return 0;
}

void Device::RcArmRetransmitLocked(QueuePair* qp) {
  const uint64_t t = AckTimeoutNs(qp->attributes().timeout);
  RcRequester& r = qp->requester();
  if (t == 0) {
    r.retransmit_deadline_ns = 0;  // timeout 0: wait forever (IBTA 11.2.4.2)
    return;
  }
  r.retransmit_deadline_ns = clock_.NowNs() + t;
  RcTimerArmedLocked(qp, r.retransmit_deadline_ns);
}

void Device::RcTimerArmedLocked(QueuePair* qp, uint64_t deadline) {
  RcRequester& r = qp->requester();
  if (!r.timer_listed) {
    r.timer_listed = true;
    timed_qps_.push_back(qp->qpn());
  }
  WakeForTimer(deadline);
}

void Device::RcSendReadRequestLocked(QueuePair* qp, SendWqe& w, uint32_t from_pkt, OutBatch& out) {
  const uint32_t mtu = MtuBytes(qp->attributes().path_mtu);
  const uint64_t off = uint64_t{from_pkt} * mtu;
  const uint64_t end = std::min(w.length, uint64_t{ReadSegmentEnd(w, from_pkt)} * mtu);
  wire::PacketSpec spec;
  spec.bth.opcode = wire::opcode::kRcRdmaReadRequest;
  spec.bth.dest_qp = qp->attributes().dest_qp_num;
  spec.bth.psn = PsnAdd(w.first_psn, from_pkt);
  spec.bth.ack_req = true;
  // A re-issued READ asks only for what has not arrived yet (IBTA 9.7.4.1.4), up to the end of its segment.
  spec.reth = wire::Reth{w.wr.remote_addr + off, w.wr.rkey, static_cast<uint32_t>(end - std::min(off, end))};
  ToQpTransport(*qp, &w.wr, spec);  // XRC opcodes and XRCETH
  out.Add(transport_, spec, {}, PeerOf(*qp), SourcePortOf(*qp));
}

void Device::RcCongestionLocked(QueuePair* qp) {
  PathOf(*qp).OnCongestion();
  ++counters_.rc_congestion_signals;
}

void Device::RcRerequestReadLocked(QueuePair* qp, SendWqe& w, OutBatch& out) {
  if (w.rerequested_from == w.read_next) return;  // already asked since this gap opened
  w.rerequested_from = w.read_next;
  RcCongestionLocked(qp);
  RcSendReadRequestLocked(qp, w, w.read_next, out);
}

void Device::RcProgressLocked(QueuePair* qp, OutBatch& out) {
  RcRequester& r = qp->requester();
  QpAttributes& a = qp->mutable_attributes();
  if (a.qp_state != QpState::kRts && a.qp_state != QpState::kSqd) return;
  if (r.rnr_deadline_ns != 0) return;  // waiting out an RNR NAK
  const uint32_t mtu = MtuBytes(a.path_mtu);
  const wire::UdpEndpoint dst = PeerOf(*qp);
  const uint16_t sport = SourcePortOf(*qp);

  auto outstanding_rd_atomic = [&]() {
    uint32_t n = 0;
    for (const SendWqe& w : r.sq)
      if (w.in_flight() && (w.is_read() || w.is_atomic())) ++n;
    return n;
  };

  bool sent = false;
  std::vector<std::span<const uint8_t>> payload;  // the next packet's bytes, in registered memory
  PathWindow& path = PathOf(*qp);
  // Marks PSNs before `next` as sent and charges what is new to the path at once, so the next packet sees the window
  // as it is.
  auto sent_up_to = [&](uint32_t next) {
    if (PsnDiff(next, r.sent_psn_next) > 0) r.sent_psn_next = next;
    RcChargeLocked(qp, path);
  };
  while (r.cursor_wqe < r.sq.size()) {
    SendWqe& w = r.sq[r.cursor_wqe];
    if (!w.started() && (w.wr.opcode == SendOpcode::kBindMw || w.wr.opcode == SendOpcode::kLocalInv)) {
      if (a.qp_state == QpState::kSqd) break;
      // A local operation takes no PSN: it happens when the queue reaches it and completes in order.
      const WcStatus st = ExecuteLocalOpLocked(qp, w.wr);
      if (st != WcStatus::kSuccess) {
        RcFailLocked(qp, r.cursor_wqe, st);
        return;
      }
      w.state = WqeState::kDone;
      w.first_psn = a.sq_psn;
      w.npsn = 0;
      ++r.cursor_wqe;
      r.cursor_pkt = 0;
      RcCompleteInOrderLocked(qp);
      continue;
    }
    if (!w.started()) {
      if (a.qp_state == QpState::kSqd) break;  // SQD: nothing new starts
      if ((w.is_read() || w.is_atomic()) && outstanding_rd_atomic() >= std::max<uint32_t>(a.max_rd_atomic, 1)) break;
      // IBV_SEND_FENCE (IBTA 10.8.3.3): wait until every earlier READ and atomic has completed.
      if ((w.wr.flags & send_flags::kFence) && outstanding_rd_atomic() > 0) break;
      w.length = w.wr.TotalLength();
      if (w.length > config_.limits.max_msg_sz) {
        RcFailLocked(qp, r.cursor_wqe, WcStatus::kLocLenErr);
        return;
      }
      // Validate every local buffer now: a bad lkey is a local protection error (IBTA 10.6.3.1), and a READ or
      // atomic needs local write access to land its data.
      const uint32_t needed = (w.is_read() || w.is_atomic()) ? access::kLocalWrite : 0;
      if (!(w.wr.flags & send_flags::kInline)) {
        for (const Sge& sge : w.wr.sg_list) {
          if (sge.length == 0) continue;
          if (!keys_.CheckLocal(sge.lkey, qp->init().pd, sge.addr, sge.length, needed).ok()) {
            RcFailLocked(qp, r.cursor_wqe, WcStatus::kLocProtErr);
            return;
          }
        }
      }
      w.npsn = w.is_atomic() ? 1 : PacketsFor(w.length, mtu);
      w.first_psn = a.sq_psn;
      a.sq_psn = PsnAdd(a.sq_psn, w.npsn);
      w.state = WqeState::kInFlight;
      r.cursor_pkt = 0;
    }
    const uint32_t psn = PsnAdd(w.first_psn, r.cursor_pkt);
    if (PsnDiff(psn, r.acked_psn_next) >= kWindowPackets) break;  // the QP's window is full
    if (PsnDiff(psn, r.sent_psn_next) >= 0 && !path.MaySend()) {
      // The window shared by every QP towards this peer is full: wait to be woken as it opens (retransmissions of
      // what is already in flight never wait).
      if (!r.waiting_for_path) {
        r.waiting_for_path = true;
        path.waiting().push_back(qp->qpn());
        ++counters_.rc_path_waits;
      }
      break;
    }

    wire::PacketSpec spec;
    spec.bth.dest_qp = a.dest_qp_num;
    spec.bth.psn = psn;
    if (w.is_read()) {
      // What has arrived is never asked for again (go-back-N may pass a READ already answered in full); the next
      // segment waits for the previous one.
      if (w.done()) {
        ++r.cursor_wqe;
        r.cursor_pkt = 0;
        continue;
      }
      r.cursor_pkt = std::max(r.cursor_pkt, w.read_next);
      if (r.cursor_pkt > w.read_next) break;
      const uint32_t end = ReadSegmentEnd(w, r.cursor_pkt);
      RcSendReadRequestLocked(qp, w, r.cursor_pkt, out);
      sent_up_to(PsnAdd(w.first_psn, end));
      if (end == w.npsn) {
        ++r.cursor_wqe;
        r.cursor_pkt = 0;
      } else {
        r.cursor_pkt = end;
      }
    } else if (w.is_atomic()) {
      const bool cas = w.wr.opcode == SendOpcode::kAtomicCmpAndSwp;
      spec.bth.opcode = cas ? wire::opcode::kRcCompareSwap : wire::opcode::kRcFetchAdd;
      spec.bth.ack_req = true;
      spec.atomic = wire::AtomicEth{w.wr.remote_addr, w.wr.rkey, cas ? w.wr.swap : w.wr.compare_add,
                                    cas ? w.wr.compare_add : 0};
      ToQpTransport(*qp, &w.wr, spec);  // XRC opcodes and XRCETH
      out.Add(transport_, spec, {}, dst, sport);
      sent_up_to(PsnAdd(psn, 1));
      ++r.cursor_wqe;
      r.cursor_pkt = 0;
    } else {
      const uint32_t k = r.cursor_pkt;
      const bool first = k == 0, last = k + 1 == w.npsn;
      const bool is_send = w.wr.opcode == SendOpcode::kSend || w.wr.opcode == SendOpcode::kSendWithImm ||
                           w.wr.opcode == SendOpcode::kSendWithInv;
      const bool imm = w.wr.opcode == SendOpcode::kSendWithImm || w.wr.opcode == SendOpcode::kRdmaWriteWithImm;
      const bool inv = w.wr.opcode == SendOpcode::kSendWithInv;
      // Every SEND and WRITE variant is defined on RC (IBTA table 38).
      spec.bth.opcode = *wire::MessageOpcode(wire::TransportKind::kRc,
                                             is_send ? wire::Operation::kSend : wire::Operation::kRdmaWrite,
                                             wire::PositionInMessage(k, w.npsn), imm, inv);
      if (!is_send && first) spec.reth = wire::Reth{w.wr.remote_addr, w.wr.rkey, static_cast<uint32_t>(w.length)};
      spec.bth.solicited = last && (w.wr.flags & send_flags::kSolicited);
      // AckReq where the requester will stop after this packet too -- the QP's window or the path's is full --
      // or nothing would ever acknowledge what it has in flight and it would wait for a timeout.
      const uint32_t next_psn = PsnAdd(psn, 1);
      const bool is_new = PsnDiff(psn, r.sent_psn_next) >= 0;
      const bool stops_after =
          PsnDiff(next_psn, r.acked_psn_next) >= kWindowPackets ||
          (PsnDiff(next_psn, r.sent_psn_next) >= 0 && path.in_flight() + (is_new ? 1 : 0) >= path.window());
      spec.bth.ack_req = last || (k % kAckReqEvery == kAckReqEvery - 1) || stops_after;
      if (last && imm) spec.imm = wire::ImmDt{w.wr.imm_data};
      if (last && inv) spec.ieth = wire::Ieth{w.wr.invalidate_rkey};
      const uint64_t off = uint64_t{k} * mtu;
      const uint64_t len = std::min<uint64_t>(mtu, w.length - std::min(off, w.length));
      if (!GatherRangeLocked(*qp, w.wr, off, len, payload)) {
        // The memory was deregistered after the WQE started.
        RcFailLocked(qp, r.cursor_wqe, WcStatus::kLocProtErr);
        return;
      }
      ToQpTransport(*qp, &w.wr, spec);  // XRC opcodes and XRCETH
      out.AddGathered(transport_, spec, payload, dst, sport);
      sent_up_to(PsnAdd(psn, 1));
      if (++r.cursor_pkt == w.npsn) {
        ++r.cursor_wqe;
        r.cursor_pkt = 0;
      }
    }
    sent = true;
  }
  if (sent && r.retransmit_deadline_ns == 0) RcArmRetransmitLocked(qp);
  // A held ACK of this QP's responder follows the requests just queued (Device::AckTiming::kHeld).
  if (sent && qp->responder().ack_held) RcSendHeldAckLocked(qp, out);
}

void Device::RcFailLocked(QueuePair* qp, size_t index, WcStatus status) {
  RcRequester& r = qp->requester();
  // Everything before `index` has been sent (the cursor is past it): it completes before the failure.
  for (size_t i = 0; i < index && i < r.sq.size(); ++i) r.sq[i].state = WqeState::kDone;
  if (index < r.sq.size()) {
    // A WQE that failed before it started (a bad lkey, a length above max_msg_sz) is completed with its status by
    // the flush below, in order.
    if (r.sq[index].started()) r.sq[index].state = WqeState::kDone;
    r.sq[index].status = status;
  }
  RcCompleteInOrderLocked(qp);
  // A requester error moves the QP to the error state; what is left is flushed (IBTA 10.8.3.3 / 11.6.2).
  EnterErrorLocked(qp);
}

void Device::RcCompleteInOrderLocked(QueuePair* qp) {
  RcRequester& r = qp->requester();
  while (!r.sq.empty() && r.sq.front().done()) {
    SendWqe w = std::move(r.sq.front());
    r.sq.pop_front();
    if (r.cursor_wqe > 0) {
      --r.cursor_wqe;
    } else {
      r.cursor_pkt = 0;  // the cursor was inside the WQE just completed (a late ACK after go-back-N): next one
    }
    CompleteSendLocked(qp, w.wr, w.status);
  }
  QpAttributes& a = qp->mutable_attributes();
  const bool idle = r.sq.empty() || !r.sq.front().started();
  if (idle) r.retransmit_deadline_ns = 0;
  if (idle && a.qp_state == QpState::kSqd && a.sq_draining) {
    a.sq_draining = false;
    if (r.drained_event_pending) {
      r.drained_event_pending = false;
      RaiseLocked({AsyncEventType::kSqDrained, qp});
    }
  }
}

// --- completer ---------------------------------------------------------------------------------------------------

void Device::RcCompleterLocked(QueuePair* qp, const wire::PacketView& p, OutBatch& out) {
  RcRequester& r = qp->requester();
  const QpAttributes& a = qp->attributes();
  const uint32_t psn = p.bth.psn;
  const uint32_t mtu = MtuBytes(a.path_mtu);
  bool progressed = false;

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
        RcRerequestReadLocked(qp, w, out);
        continue;
      }
      if (w.is_atomic()) {
        r.cursor_wqe = i;
        r.cursor_pkt = 0;
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
    }
  };
  auto find_containing = [&](uint32_t q) -> size_t {
    for (size_t i = 0; i < r.sq.size(); ++i) {
      const SendWqe& w = r.sq[i];
      if (!w.started()) break;
      if (PsnDiff(q, w.first_psn) >= 0 && PsnDiff(q, w.last_psn()) <= 0) return i;
    }
    return r.sq.size();
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
        const size_t i = find_containing(psn);
        if (i == r.sq.size()) break;  // stale
        if (r.rnr_retries_left == 0) {
          RcFailLocked(qp, i, WcStatus::kRnrRetryExcErr);
          return;
        }
        if (a.rnr_retry != kInfiniteRnrRetry) --r.rnr_retries_left;
        r.cursor_wqe = i;
        r.cursor_pkt = static_cast<uint32_t>(PsnDiff(psn, r.sq[i].first_psn));
        r.retransmit_deadline_ns = 0;
        r.rnr_deadline_ns = clock_.NowNs() + uint64_t{wire::RnrTimerMicros(aeth.rnr_timer())} * 1000;
        RcTimerArmedLocked(qp, r.rnr_deadline_ns);
        RcCompleteInOrderLocked(qp);
        return;
      }
      case wire::AethKind::kNak: {
        ack_before(psn, false);
        const size_t i = find_containing(psn);
        if (aeth.nak_code() == wire::NakCode::kPsnSeqError) {
          // The responder expects `psn`: resend from there at once (9.7.5.2.1), without spending a retry. A packet
          // was lost on the way: the path is congested.
          RcCongestionLocked(qp);
          advance_acked(psn);
          if (i < r.sq.size()) {
            r.cursor_wqe = i;
            r.cursor_pkt = static_cast<uint32_t>(PsnDiff(psn, r.sq[i].first_psn));
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
        RcFailLocked(qp, i, st);
        return;
      }
      default:
        return;  // reserved syndrome: ignored
    }
  } else if (p.info->op == wire::Operation::kReadResponse) {
    const size_t i = find_containing(psn);
    if (i == r.sq.size() || !r.sq[i].is_read() || r.sq[i].done()) return;  // duplicate or stale
    SendWqe& w = r.sq[i];
    const uint32_t expected = PsnAdd(w.first_psn, w.read_next);
    if (psn != expected) {
      // A response was lost (9.7.5.2.2): ask again for the rest of the segment, once per gap -- the responses
      // still in flight behind the lost one would otherwise each trigger a whole new answer. Only the READ is
      // asked again: later requests were received, or their own timeout resends them.
      if (PsnDiff(psn, expected) > 0) RcRerequestReadLocked(qp, w, out);
      return;
    }
    if (p.aeth && p.aeth->kind() != wire::AethKind::kAck) return;
    ack_before(w.first_psn, false);
    const bool last_expected = w.read_next + 1 == ReadSegmentEnd(w, w.read_next);
    const bool is_last = p.info->position == wire::MsgPosition::kLast || p.info->position == wire::MsgPosition::kOnly;
    const uint64_t off = uint64_t{w.read_next} * mtu;
    const uint64_t want = std::min<uint64_t>(mtu, w.length - std::min(off, w.length));
    if (is_last != last_expected || p.payload.size() != want) {
      RcFailLocked(qp, i, WcStatus::kBadRespErr);
      return;
    }
    WcStatus st = ScatterLocked(*qp, w.wr.sg_list, off, p.payload);
    if (st != WcStatus::kSuccess) {
      RcFailLocked(qp, i, st);
      return;
    }
    ++w.read_next;
    if (w.read_next == w.npsn) w.state = WqeState::kDone;
    advance_acked(PsnAdd(psn, 1));
    if (r.cursor_wqe == i && r.cursor_pkt < w.read_next) r.cursor_pkt = w.read_next;
    progressed = true;
  } else if (p.info->op == wire::Operation::kAtomicAcknowledge) {
    const size_t i = find_containing(psn);
    if (i == r.sq.size() || !r.sq[i].is_atomic() || r.sq[i].done()) return;
    if (p.aeth && p.aeth->kind() != wire::AethKind::kAck) return;
    ack_before(psn, false);
    SendWqe& w = r.sq[i];
    uint8_t orig[8];
    std::memcpy(orig, &p.atomic_ack->original, 8);  // host order, as the local buffer holds a uint64_t
    WcStatus st = ScatterLocked(*qp, w.wr.sg_list, 0, orig);
    if (st != WcStatus::kSuccess) {
      RcFailLocked(qp, i, st);
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
  RcCompleteInOrderLocked(qp);
  if (qp->state() == QpState::kErr) return;
  RcProgressLocked(qp, out);
  // Still waiting for something: keep the timer running.
  for (const SendWqe& w : r.sq) {
    if (w.in_flight()) {
      if (r.retransmit_deadline_ns == 0 && r.rnr_deadline_ns == 0) RcArmRetransmitLocked(qp);
      break;
    }
  }
}

// --- timers ------------------------------------------------------------------------------------------------------

uint64_t Device::RcNextDeadline(QueuePair* qp) const {
  const RcRequester& r = qp->requester();
  return wire::EarlierDeadline(r.retransmit_deadline_ns, r.rnr_deadline_ns);
}

void Device::RcTimersLocked(QueuePair* qp, uint64_t now, OutBatch& out) {
  RcRequester& r = qp->requester();
  if (qp->state() != QpState::kRts && qp->state() != QpState::kSqd) {
    r.retransmit_deadline_ns = r.rnr_deadline_ns = 0;
    return;
  }
  if (r.rnr_deadline_ns != 0 && now >= r.rnr_deadline_ns) {
    r.rnr_deadline_ns = 0;
    RcProgressLocked(qp, out);
    if (r.retransmit_deadline_ns == 0) RcArmRetransmitLocked(qp);
  }
  if (r.retransmit_deadline_ns == 0 || now < r.retransmit_deadline_ns) return;
  r.retransmit_deadline_ns = 0;
  size_t i = 0;
  while (i < r.sq.size() && r.sq[i].done()) ++i;
  if (i == r.sq.size() || !r.sq[i].started()) return;  // nothing outstanding
  if (r.waiting_for_path && PsnDiff(r.sent_psn_next, r.acked_psn_next) <= 0) {
    // Everything it sent is acknowledged and it waits for its turn in the path's window, not for the peer: no retry
    // is spent, the timer just runs again.
    RcArmRetransmitLocked(qp);
    return;
  }
  // Local ACK timeout (IBTA 9.7.6.1.3 / C9-140): spend a retry, then go back to the oldest unacknowledged WQE.
  if (r.retries_left == 0) {
    RcFailLocked(qp, i, WcStatus::kRetryExcErr);
    return;
  }
  if (!(config_.retry_cnt_7_infinite && qp->attributes().retry_cnt == 7)) --r.retries_left;
  ++counters_.rc_retransmit_timeouts;
  RcCongestionLocked(qp);
  r.cursor_wqe = i;
  // Resume at the first unacknowledged PSN within the WQE (a coalesced ACK may have covered its beginning).
  const int32_t into = PsnDiff(r.acked_psn_next, r.sq[i].first_psn);
  r.cursor_pkt = r.sq[i].is_read() ? r.sq[i].read_next
                 : (into > 0 && into < static_cast<int32_t>(r.sq[i].npsn)) ? static_cast<uint32_t>(into)
                                                                            : 0;
  RcProgressLocked(qp, out);
  if (r.retransmit_deadline_ns == 0) RcArmRetransmitLocked(qp);
}

// --- responder ---------------------------------------------------------------------------------------------------

void Device::RcSendAck(QueuePair* qp, uint32_t psn, const wire::Aeth& aeth, OutBatch& out) {
  // A held ACK is covered: this ACK or NAK names a PSN no older than the held one (the newest received, or the one
  // expected).
  RcDropHeldAckLocked(qp);
  wire::PacketSpec spec;
  spec.bth.opcode = wire::opcode::kRcAcknowledge;
  spec.bth.dest_qp = qp->attributes().dest_qp_num;
  spec.bth.psn = psn;
  spec.aeth = aeth;
  ToQpTransport(*qp, nullptr, spec);  // XRC opcodes and XRCETH
  out.Add(transport_, spec, {}, PeerOf(*qp), SourcePortOf(*qp));
}

void Device::RcAcknowledgeLocked(QueuePair* qp, uint32_t psn, bool one_packet, OutBatch& out) {
  RcResponder& R = qp->responder();
  if (ack_timing_ == AckTiming::kNow) {
    RcSendAck(qp, psn, wire::Aeth::Ack(wire::kInvalidCredits, R.msn), out);
    return;
  }
  const uint64_t due = clock_.NowNs() + (one_packet && !R.ack_held ? kAckHoldNs : kAckCoalesceNs);
  if (!R.ack_held) {
    R.ack_held = true;
    R.held_due_ns = due;
    acks_held_.push_back(qp->qpn());
  }
  R.held_due_ns = std::min(R.held_due_ns, due);
  R.held_psn = psn;
  R.held_msn = R.msn;
  const uint64_t next = next_held_ack_due_ns_.load(std::memory_order_relaxed);
  if (next == 0 || R.held_due_ns < next) next_held_ack_due_ns_.store(R.held_due_ns, std::memory_order_relaxed);
}

void Device::RcSendHeldAckLocked(QueuePair* qp, OutBatch& out) {
  const RcResponder& R = qp->responder();
  if (!R.ack_held) return;
  if (qp->attributes().qp_state == QpState::kErr) {
    RcDropHeldAckLocked(qp);  // a QP in the error state sends nothing (IBTA 10.3.1.9); its peer's retries decide
    return;
  }
  RcSendAck(qp, R.held_psn, wire::Aeth::Ack(wire::kInvalidCredits, R.held_msn), out);
}

void Device::RcDropHeldAckLocked(QueuePair* qp) {
  RcResponder& R = qp->responder();
  if (!R.ack_held) return;
  R.ack_held = false;
  if (const auto it = std::find(acks_held_.begin(), acks_held_.end(), qp->qpn()); it != acks_held_.end())
    acks_held_.erase(it);
}

void Device::SendHeldAcksLocked(uint64_t due_by_ns, OutBatch& out) {
  std::vector<uint32_t> held;
  held.swap(acks_held_);  // what leaves is dropped from acks_held_ on the way; the rest goes back
  uint64_t next = 0;
  for (const uint32_t qpn : held) {
    QueuePair* qp = FindQpLocked(qpn);
    if (qp == nullptr || !qp->responder().ack_held) continue;  // destroyed or reset since
    const RcResponder& R = qp->responder();
    if (R.held_due_ns <= due_by_ns || qp->attributes().qp_state == QpState::kErr) {
      RcSendHeldAckLocked(qp, out);
      continue;
    }
    next = wire::EarlierDeadline(next, R.held_due_ns);
    acks_held_.push_back(qpn);
  }
  next_held_ack_due_ns_.store(next, std::memory_order_relaxed);
}

void Device::RcSendReadResponses(QueuePair* qp, const ResponderResource& res, uint32_t from_psn, OutBatch& out) {
  const uint32_t mtu = MtuBytes(qp->attributes().path_mtu);
  AccessResult acc = keys_.CheckRemote(res.rkey, qp->init().pd, res.va, res.length, access::kRemoteRead, qp->qpn());
  if (!acc.ok()) return;  // deregistered since: a duplicate gets no answer; the requester's retries decide
  const auto first = static_cast<uint32_t>(PsnDiff(from_psn, res.psn));
  for (uint32_t k = first; k < res.npsn; ++k) {
    if (out.packets.size() >= kResponseBurstPackets) TransmitLocked(out);
    const uint64_t off = uint64_t{k} * mtu;
    const uint64_t len = std::min<uint64_t>(mtu, res.length - std::min<uint64_t>(off, res.length));
    wire::PacketSpec spec;
    const bool f = k == 0, l = k + 1 == res.npsn;
    spec.bth.opcode = *wire::MessageOpcode(wire::TransportKind::kRc, wire::Operation::kReadResponse,
                                           wire::PositionInMessage(k, res.npsn));
    spec.bth.dest_qp = qp->attributes().dest_qp_num;
    spec.bth.psn = PsnAdd(res.psn, k);
    if (f || l) spec.aeth = wire::Aeth::Ack(wire::kInvalidCredits, res.msn);
    ToQpTransport(*qp, nullptr, spec);  // XRC opcodes and XRCETH
    out.Add(transport_, spec, std::span<const uint8_t>(acc.host ? acc.host + off : nullptr, len), PeerOf(*qp),
            SourcePortOf(*qp));
  }
}

void Device::RcResponderLocked(QueuePair* qp, const wire::PacketView& p, OutBatch& out) {
  QpAttributes& a = qp->mutable_attributes();
  RcResponder& R = qp->responder();
  if (!R.comm_established) {
    // The first packet on a QP in RTR establishes communication (IBTA 11.6.2: IBV_EVENT_COMM_EST).
    R.comm_established = true;
    if (a.qp_state == QpState::kRtr) RaiseLocked({AsyncEventType::kCommEst, qp});
  }
  const uint32_t psn = p.bth.psn;
  const int32_t d = PsnDiff(psn, a.rq_psn);
  const wire::Operation op = p.info->op;
  // A READ response or atomic ACK answers in PSN order after the ACK held for earlier requests.
  if (R.ack_held && op != wire::Operation::kSend && op != wire::Operation::kRdmaWrite) RcSendHeldAckLocked(qp, out);
  const uint32_t mtu = MtuBytes(a.path_mtu);
  auto nak = [&](wire::NakCode code) { RcSendAck(qp, a.rq_psn, wire::Aeth::Nak(code, R.msn), out); };
  // Errors that end the connection: NAK, then the responder's QP enters the error state (IBTA 9.7.5.2.x).
  auto fatal_nak = [&](wire::NakCode code) {
    nak(code);
    EnterErrorLocked(qp);
  };

  if (d > 0) {
    // A gap: packets were lost. One PSN sequence error NAK per gap (9.7.5.1.1); drop until the expected PSN comes.
    ++counters_.rx_out_of_sequence;
    if (!R.nak_outstanding) {
      R.nak_outstanding = true;
      nak(wire::NakCode::kPsnSeqError);
    }
    return;
  }
  if (d < 0) {
    ++counters_.rc_duplicates;
    if (op == wire::Operation::kReadRequest) {
      for (const ResponderResource& res : R.resources)
        if (!res.atomic && PsnDiff(psn, res.psn) >= 0 && PsnDiff(psn, res.psn) < static_cast<int32_t>(res.npsn)) {
          RcSendReadResponses(qp, res, psn, out);
          return;
        }
    } else if (op == wire::Operation::kCompareSwap || op == wire::Operation::kFetchAdd) {
      for (const ResponderResource& res : R.resources)
        if (res.atomic && res.psn == psn) {
          wire::PacketSpec spec;
          spec.bth.opcode = wire::opcode::kRcAtomicAcknowledge;
          spec.bth.dest_qp = a.dest_qp_num;
          spec.bth.psn = psn;
          spec.aeth = wire::Aeth::Ack(wire::kInvalidCredits, res.msn);
          spec.atomic_ack = wire::AtomicAckEth{res.original};
          ToQpTransport(*qp, nullptr, spec);  // XRC opcodes and XRCETH
          out.Add(transport_, spec, {}, PeerOf(*qp), SourcePortOf(*qp));
          return;
        }
    } else if (p.bth.ack_req) {
      // SEND/WRITE already executed: acknowledge again, with the newest PSN (9.7.5.1.3).
      RcAcknowledgeLocked(qp, PsnAdd(a.rq_psn, -1), /*one_packet=*/false, out);
    }
    return;
  }
  R.nak_outstanding = false;
  InboundMessage& m = qp->inbound();
  const wire::MsgPosition pos = p.info->position;
  const bool starts = pos == wire::MsgPosition::kFirst || pos == wire::MsgPosition::kOnly;
  const bool ends = pos == wire::MsgPosition::kLast || pos == wire::MsgPosition::kOnly;

  if (op == wire::Operation::kSend || op == wire::Operation::kRdmaWrite) {
    const bool is_send = op == wire::Operation::kSend;
    // Opcode sequence (9.7.5.1.2): a FIRST/ONLY while a message is open, or a MIDDLE/LAST of another kind, is an
    // invalid request.
    const auto kind = is_send ? InboundMessage::Kind::kSend : InboundMessage::Kind::kWrite;
    if (starts ? m.kind != InboundMessage::Kind::kNone : m.kind != kind) {
      fatal_nak(wire::NakCode::kInvalidRequest);
      return;
    }
    const bool needs_rqe = is_send || (ends && p.imm.has_value());
    if (needs_rqe && !m.rqe && !HasReceiveWqeLocked(qp)) {  // the QP's receive queue or its SRQ
      // Receiver not ready (9.7.5.2.8): the requester waits min_rnr_timer and resends this packet.
      ++counters_.rc_rnr_naks_sent;
      RcSendAck(qp, psn, wire::Aeth::RnrNak(a.min_rnr_timer, R.msn), out);
      return;
    }
    if (starts) {
      m = InboundMessage{};
      m.kind = kind;
      if (!is_send) {
        const wire::Reth& reth = *p.reth;
        AccessResult acc = keys_.CheckRemote(reth.rkey, qp->init().pd, reth.va, reth.dma_length, access::kRemoteWrite,
                                         qp->qpn());
        if (!(a.qp_access_flags & access::kRemoteWrite) || !acc.ok()) {
          ++counters_.rx_remote_access_denied;
          m = InboundMessage{};
          fatal_nak(wire::NakCode::kRemoteAccessError);
          return;
        }
        m.write_va = reth.va;
        m.write_rkey = reth.rkey;
        m.write_length = reth.dma_length;
      }
    }
    if (is_send && !m.rqe) {
      m.rqe = TakeReceiveWqeLocked(qp);
    }
    if (is_send) {
      WcStatus st = ScatterLocked(*qp, m.rqe->sg_list, m.offset, p.payload);
      if (st != WcStatus::kSuccess) {
        const Completion c = ReceiveError(*qp, m.rqe->wr_id, st);
        m = InboundMessage{};
        CompleteLocked(qp->init().recv_cq, c);
        // Too long for the receive buffer is the sender's invalid request; a bad local key our operational error.
        fatal_nak(st == WcStatus::kLocLenErr ? wire::NakCode::kInvalidRequest
                                             : wire::NakCode::kRemoteOperationalError);
        return;
      }
    } else {
      if (m.offset + p.payload.size() > m.write_length || (ends && m.offset + p.payload.size() != m.write_length)) {
        m = InboundMessage{};
        fatal_nak(wire::NakCode::kInvalidRequest);  // more (or less) data than the RETH announced
        return;
      }
      if (!p.payload.empty()) {
        uint8_t* target = WriteTargetLocked(*qp, m, p.payload.size());
        if (target == nullptr) {
          // The region was deregistered (or its window invalidated) while the message was arriving: the rest is
          // refused like any access outside a valid region (IBTA 9.7.5.2.5, remote access error).
          ++counters_.rx_remote_access_denied;
          m = InboundMessage{};
          fatal_nak(wire::NakCode::kRemoteAccessError);
          return;
        }
        std::memcpy(target, p.payload.data(), p.payload.size());
      }
    }
    m.offset += p.payload.size();
    if (ends && p.ieth && keys_.InvalidateWindow(p.ieth->rkey, qp->qpn()) != 0) {
      // SEND with invalidate names an R_Key we cannot invalidate (not a type 2 window bound to this QP): the
      // responder refuses the request (IBTA 9.4.6 / 10.6.7.2.3).
      fatal_nak(wire::NakCode::kInvalidRequest);
      return;
    }
    a.rq_psn = PsnAdd(a.rq_psn, 1);
    if (ends) {
      R.msn = PsnAdd(R.msn, 1);
      const bool has_imm = p.imm.has_value();
      if (is_send || has_imm) {
        Completion c = MessageCompletion(*qp, m.offset, p);
        if (is_send) {
          c.wr_id = m.rqe->wr_id;
          c.opcode = WcOpcode::kRecv;
        } else {
          c.wr_id = TakeReceiveWqeLocked(qp)->wr_id;
          c.opcode = WcOpcode::kRecvRdmaWithImm;
        }
        CompleteLocked(qp->init().recv_cq, c);
      }
      m = InboundMessage{};
    }
    if (p.bth.ack_req) RcAcknowledgeLocked(qp, psn, starts && ends, out);
    return;
  }

  if (m.kind != InboundMessage::Kind::kNone) {
    fatal_nak(wire::NakCode::kInvalidRequest);  // a READ or atomic inside an open SEND/WRITE
    return;
  }
  if (op == wire::Operation::kReadRequest) {
    const wire::Reth& reth = *p.reth;
    AccessResult acc = keys_.CheckRemote(reth.rkey, qp->init().pd, reth.va, reth.dma_length, access::kRemoteRead,
                                         qp->qpn());
    if (!(a.qp_access_flags & access::kRemoteRead) || !acc.ok()) {
      ++counters_.rx_remote_access_denied;
      fatal_nak(wire::NakCode::kRemoteAccessError);
      return;
    }
    ResponderResource res;
    res.psn = psn;
    res.npsn = PacketsFor(reth.dma_length, mtu);
    res.va = reth.va;
    res.rkey = reth.rkey;
    res.length = reth.dma_length;
    R.msn = PsnAdd(R.msn, 1);
    res.msn = R.msn;
    R.resources.push_back(res);
    if (R.resources.size() > kSavedResponses) R.resources.pop_front();
    a.rq_psn = PsnAdd(psn, res.npsn);  // a READ consumes one PSN per response packet (9.7.4.1.4)
    RcSendReadResponses(qp, res, psn, out);
    return;
  }
  if (op == wire::Operation::kCompareSwap || op == wire::Operation::kFetchAdd) {
    const wire::AtomicEth& ae = *p.atomic;
    if (ae.va & 7) {
      fatal_nak(wire::NakCode::kInvalidRequest);  // misaligned atomic (9.4.5)
      return;
    }
    AccessResult acc = keys_.CheckRemote(ae.rkey, qp->init().pd, ae.va, 8, access::kRemoteAtomic, qp->qpn());
    if (!(a.qp_access_flags & access::kRemoteAtomic) || !acc.ok()) {
      ++counters_.rx_remote_access_denied;
      fatal_nak(wire::NakCode::kRemoteAccessError);
      return;
    }
    auto* target = reinterpret_cast<uint64_t*>(acc.host);
    uint64_t original;
    if (op == wire::Operation::kCompareSwap) {
      original = ae.compare;
      // The application's CPU may touch the word concurrently: use a real atomic (IBV_ATOMIC_HCA semantics).
      __atomic_compare_exchange_n(target, &original, ae.swap_add, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
    } else {
      original = __atomic_fetch_add(target, ae.swap_add, __ATOMIC_SEQ_CST);
    }
    ResponderResource res;
    res.atomic = true;
    res.psn = psn;
    res.original = original;
    R.msn = PsnAdd(R.msn, 1);
    res.msn = R.msn;
    R.resources.push_back(res);
    if (R.resources.size() > kSavedResponses) R.resources.pop_front();
    a.rq_psn = PsnAdd(psn, 1);
    wire::PacketSpec spec;
    spec.bth.opcode = wire::opcode::kRcAtomicAcknowledge;
    spec.bth.dest_qp = a.dest_qp_num;
    spec.bth.psn = psn;
    spec.aeth = wire::Aeth::Ack(wire::kInvalidCredits, R.msn);
    spec.atomic_ack = wire::AtomicAckEth{original};
    ToQpTransport(*qp, nullptr, spec);  // XRC opcodes and XRCETH
    out.Add(transport_, spec, {}, PeerOf(*qp), SourcePortOf(*qp));
    return;
  }
  fatal_nak(wire::NakCode::kInvalidRequest);  // an opcode RC does not carry
}

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
