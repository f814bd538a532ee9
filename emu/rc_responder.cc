// The RC responder (IBTA vol1 9.7.5): checks each request's PSN (a gap: one sequence NAK; a duplicate: SEND and
// WRITE acknowledged again, READ and atomics answered again from saved state, never executed twice), then executes,
// NAKs or RNR-NAKs it, and acknowledges, at once or held (Device::AckTiming).
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

// The responder hands READ responses to the network in bursts of at most this many packets, so a request for a long
// message (a peer may ask for 2 GiB at once) never has more than one burst built in memory.
constexpr size_t kResponseBurstPackets = 64;
// Saved READ/atomic responses kept for duplicates: at least the device's max_qp_rd_atom (128) outstanding requests
// must be answerable again (IBTA 9.7.5.1.6: responder resources = max_dest_rd_atomic), with room to spare.
constexpr size_t kSavedResponses = 256;
static_assert(kSavedResponses >= DeviceLimits{}.max_qp_rd_atom, "a duplicate of any outstanding request is answered");

}  // namespace

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

}  // namespace uroce::emu
