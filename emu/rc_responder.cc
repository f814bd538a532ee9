// The RC responder (rc_responder.h): PSN checks, execution exactly once, NAKs and RNR NAKs, saved READ/atomic
// answers for duplicates, and ACKs sent at once or held (AckTiming).
#include "emu/rc_responder.h"

#include "emu/host_memory.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <shared_mutex>

#include "emu/device_core.h"
#include "emu/out_batch.h"
#include "emu/queue_pair.h"
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

void RcResponder::SendAck(uint32_t psn, const wire::Aeth& aeth, OutBatch& out) {
  // A held ACK is covered: this ACK or NAK names a PSN no older than the held one (the newest received, or the one
  // expected).
  DropHeldAck();
  wire::PacketSpec spec;
  spec.bth.opcode = wire::opcode::kRcAcknowledge;
  spec.bth.dest_qp = qp_.attributes().dest_qp_num;
  spec.bth.psn = psn;
  spec.aeth = aeth;
  ToQpTransport(qp_, nullptr, spec);  // XRC opcodes and XRCETH
  out.Add(core_.transport, spec, {}, qp_.peer(), qp_.source_port());
}

void RcResponder::Acknowledge(uint32_t psn, bool one_packet, OutBatch& out) {
  RcResponderState& R = state_;
  if (core_.ack_timing == AckTiming::kNow) {
    SendAck(psn, wire::Aeth::Ack(wire::kInvalidCredits, R.msn), out);
    return;
  }
  const uint64_t due = core_.Now() + (one_packet && !R.ack_held ? kAckHoldNs : kAckCoalesceNs);
  R.held_due_ns = R.ack_held ? std::min(R.held_due_ns, due) : due;
  R.ack_held = true;
  R.held_psn = psn;
  R.held_msn = R.msn;
  core_.NoteAckHeld(qp_.qpn(), R.held_due_ns);
}

void RcResponder::SendHeldAck(OutBatch& out) {
  const RcResponderState& R = state_;
  if (!R.ack_held) return;
  if (qp_.attributes().qp_state == QpState::kErr) {
    DropHeldAck();  // a QP in the error state sends nothing (IBTA 10.3.1.9); its peer's retries decide
    return;
  }
  SendAck(R.held_psn, wire::Aeth::Ack(wire::kInvalidCredits, R.held_msn), out);
}

void RcResponder::DropHeldAck() {
  RcResponderState& R = state_;
  if (!R.ack_held) return;
  R.ack_held = false;
  core_.ForgetAckHeld(qp_.qpn());
}

void RcResponder::Reset() {
  DropHeldAck();
  state_ = RcResponderState{};
}

void RcResponder::FatalNak(wire::NakCode code, OutBatch& out) { FatalNakAt(qp_.attributes().rq_psn, code, out); }

void RcResponder::FatalNakAt(uint32_t psn, wire::NakCode code, OutBatch& out) {
  SendAck(psn, wire::Aeth::Nak(code, state_.msn), out);
  core_.EnterError(qp_);
}

void RcResponder::SendAtomicAck(uint32_t psn, uint32_t msn, uint64_t original, OutBatch& out) {
  wire::PacketSpec spec;
  spec.bth.opcode = wire::opcode::kRcAtomicAcknowledge;
  spec.bth.dest_qp = qp_.attributes().dest_qp_num;
  spec.bth.psn = psn;
  spec.aeth = wire::Aeth::Ack(wire::kInvalidCredits, msn);
  spec.atomic_ack = wire::AtomicAckEth{original};
  ToQpTransport(qp_, nullptr, spec);  // XRC opcodes and XRCETH
  out.Add(core_.transport, spec, {}, qp_.peer(), qp_.source_port());
}

void RcResponder::SendReadResponses(const ResponderResource& res, uint32_t from_psn, OutBatch& out) {
  const uint32_t mtu = MtuBytes(qp_.attributes().path_mtu);
  std::shared_lock keys(core_.keys_mu);  // the region is read until the last response is built
  AccessResult acc =
      core_.keys.CheckRemote(res.rkey, qp_.init().pd, res.va, res.length, access::kRemoteRead, qp_.qpn());
  if (!acc.ok()) return;  // deregistered since: a duplicate gets no answer; the requester's retries decide
  const auto first = static_cast<uint32_t>(PsnDiff(from_psn, res.psn));
  for (uint32_t k = first; k < res.npsn; ++k) {
    if (out.packets.size() >= kResponseBurstPackets) core_.TransmitNow(out);
    const uint64_t off = uint64_t{k} * mtu;
    const uint64_t len = std::min<uint64_t>(mtu, res.length - std::min<uint64_t>(off, res.length));
    wire::PacketSpec spec;
    const bool f = k == 0, l = k + 1 == res.npsn;
    spec.bth.opcode = *wire::MessageOpcode(wire::TransportKind::kRc, wire::Operation::kReadResponse,
                                           wire::PositionInMessage(k, res.npsn));
    spec.bth.dest_qp = qp_.attributes().dest_qp_num;
    spec.bth.psn = PsnAdd(res.psn, k);
    if (f || l) spec.aeth = wire::Aeth::Ack(wire::kInvalidCredits, res.msn);
    ToQpTransport(qp_, nullptr, spec);  // XRC opcodes and XRCETH
    if (!out.Add(core_.transport, spec, std::span<const uint8_t>(acc.host ? acc.host + off : nullptr, len),
                 qp_.peer(), qp_.source_port())) {
      // The region's memory was unmapped since its registration: as any access outside a valid region (9.7.5.2.5),
      // named by the response that could not be built -- a PSN the requester is waiting for.
      keys.unlock();
      core_.Count(&DeviceCounters::rx_remote_access_denied);
      FatalNakAt(spec.bth.psn, wire::NakCode::kRemoteAccessError, out);
      return;
    }
  }
}

void RcResponder::OnRequest(const wire::PacketView& p, OutBatch& out) {
  QpAttributes& a = qp_.mutable_attributes();
  RcResponderState& R = state_;
  if (!R.comm_established) {
    // The first packet on a QP in RTR establishes communication (IBTA 11.6.2: IBV_EVENT_COMM_EST).
    R.comm_established = true;
    if (a.qp_state == QpState::kRtr) core_.Raise({AsyncEventType::kCommEst, &qp_});
  }
  const uint32_t psn = p.bth.psn;
  const int32_t d = PsnDiff(psn, a.rq_psn);
  const wire::Operation op = p.info->op;
  // A READ response or atomic ACK answers in PSN order after the ACK held for earlier requests.
  if (R.ack_held && op != wire::Operation::kSend && op != wire::Operation::kRdmaWrite) SendHeldAck(out);
  const uint32_t mtu = MtuBytes(a.path_mtu);
  // Receiver not ready (9.7.5.2.8): the requester waits min_rnr_timer and resends this packet.
  auto rnr_nak = [&] {
    core_.Count(&DeviceCounters::rc_rnr_naks_sent);
    SendAck(psn, wire::Aeth::RnrNak(a.min_rnr_timer, R.msn), out);
  };

  if (d > 0) {
    // A gap: packets were lost. One PSN sequence error NAK per gap (9.7.5.1.1); drop until the expected PSN comes.
    core_.Count(&DeviceCounters::rx_out_of_sequence);
    if (!R.nak_outstanding) {
      R.nak_outstanding = true;
      SendAck(a.rq_psn, wire::Aeth::Nak(wire::NakCode::kPsnSeqError, R.msn), out);
    }
    return;
  }
  if (d < 0) {
    core_.Count(&DeviceCounters::rc_duplicates);
    if (op == wire::Operation::kReadRequest) {
      for (const ResponderResource& res : R.resources)
        if (!res.atomic && PsnDiff(psn, res.psn) >= 0 && PsnDiff(psn, res.psn) < static_cast<int32_t>(res.npsn)) {
          SendReadResponses(res, psn, out);
          return;
        }
    } else if (op == wire::Operation::kCompareSwap || op == wire::Operation::kFetchAdd) {
      for (const ResponderResource& res : R.resources)
        if (res.atomic && res.psn == psn) {
          SendAtomicAck(psn, res.msn, res.original, out);
          return;
        }
    } else if (p.bth.ack_req) {
      // SEND/WRITE already executed: acknowledge again, with the newest PSN (9.7.5.1.3).
      Acknowledge(PsnAdd(a.rq_psn, -1), /*one_packet=*/false, out);
    }
    return;
  }
  R.nak_outstanding = false;
  InboundMessage& m = qp_.inbound();
  const wire::MsgPosition pos = p.info->position;
  const bool starts = pos == wire::MsgPosition::kFirst || pos == wire::MsgPosition::kOnly;
  const bool ends = pos == wire::MsgPosition::kLast || pos == wire::MsgPosition::kOnly;

  if (op == wire::Operation::kSend || op == wire::Operation::kRdmaWrite) {
    const bool is_send = op == wire::Operation::kSend;
    // Opcode sequence (9.7.5.1.2): a FIRST/ONLY while a message is open, or a MIDDLE/LAST of another kind, is an
    // invalid request.
    const auto kind = is_send ? InboundMessage::Kind::kSend : InboundMessage::Kind::kWrite;
    if (starts ? m.kind != InboundMessage::Kind::kNone : m.kind != kind) {
      FatalNak(wire::NakCode::kInvalidRequest, out);
      return;
    }
    const bool needs_rqe = is_send || (ends && p.imm.has_value());
    if (needs_rqe && !m.rqe && !core_.HasReceiveWqe(qp_)) {  // the QP's receive queue or its SRQ
      rnr_nak();
      return;
    }
    if (!wire::PayloadFitsPathMtu(pos, p.payload.size(), mtu)) {
      // The requester cuts messages at another path MTU than ours: taking the packet would let the two ends count
      // different PSNs for what follows, and later requests would be taken for duplicates and dropped unexecuted.
      core_.Count(&DeviceCounters::rx_length_errors);
      FatalNak(wire::NakCode::kInvalidRequest, out);
      return;
    }
    if (starts) {
      m = InboundMessage{};
      m.kind = kind;
      if (!is_send) {
        const wire::Reth& reth = *p.reth;
        const bool granted = core_.MayAccessRemote(qp_, reth.rkey, reth.va, reth.dma_length, access::kRemoteWrite);
        if (!(a.qp_access_flags & access::kRemoteWrite) || !granted) {
          core_.Count(&DeviceCounters::rx_remote_access_denied);
          m = InboundMessage{};
          FatalNak(wire::NakCode::kRemoteAccessError, out);
          return;
        }
        m.write_va = reth.va;
        m.write_rkey = reth.rkey;
        m.write_length = reth.dma_length;
      }
    }
    if (needs_rqe && !m.rqe) {
      m.rqe = core_.TakeReceiveWqe(qp_);
      if (!m.rqe) {
        // Another QP took the SRQ's last WQE since the check above: receiver not ready after all.
        if (starts) m = InboundMessage{};
        rnr_nak();
        return;
      }
    }
    if (is_send) {
      WcStatus st = core_.Scatter(qp_, m.rqe->sg_list, m.offset, p.payload);
      if (st != WcStatus::kSuccess) {
        const Completion c = DeviceCore::ReceiveError(qp_, m.rqe->wr_id, st);
        m = InboundMessage{};
        core_.Complete(qp_.init().recv_cq, c);
        // Too long for the receive buffer is the sender's invalid request; a bad local key our operational error.
        FatalNak(st == WcStatus::kLocLenErr ? wire::NakCode::kInvalidRequest : wire::NakCode::kRemoteOperationalError,
                 out);
        return;
      }
    } else {
      // On an error below the message is abandoned with the QP: the error state flushes the receive WQE a WRITE
      // with immediate took.
      if (m.offset + p.payload.size() > m.write_length || (ends && m.offset + p.payload.size() != m.write_length)) {
        FatalNak(wire::NakCode::kInvalidRequest, out);  // more (or less) data than the RETH announced
        return;
      }
      if (!p.payload.empty()) {
        std::shared_lock keys(core_.keys_mu);
        uint8_t* target = core_.WriteTarget(qp_, m, p.payload.size());
        if (target == nullptr || !CopyGuarded(target, p.payload.data(), p.payload.size())) {
          keys.unlock();
          // The region was deregistered (or its window invalidated, or its memory unmapped) while the message was
          // arriving: the rest is refused like any access outside a valid region (IBTA 9.7.5.2.5, remote access
          // error).
          core_.Count(&DeviceCounters::rx_remote_access_denied);
          FatalNak(wire::NakCode::kRemoteAccessError, out);
          return;
        }
      }
    }
    m.offset += p.payload.size();
    if (ends && p.ieth && [&] {
          std::unique_lock keys(core_.keys_mu);
          return core_.keys.InvalidateWindow(p.ieth->rkey, qp_.qpn()) != 0;
        }()) {
      // SEND with invalidate names an R_Key we cannot invalidate (not a type 2 window bound to this QP): the
      // responder refuses the request (IBTA 9.4.6 / 10.6.7.2.3).
      FatalNak(wire::NakCode::kInvalidRequest, out);
      return;
    }
    a.rq_psn = PsnAdd(a.rq_psn, 1);
    if (ends) {
      R.msn = PsnAdd(R.msn, 1);
      const bool has_imm = p.imm.has_value();
      if (is_send || has_imm) {
        Completion c = DeviceCore::MessageCompletion(qp_, m.offset, p);
        if (is_send) {
          c.wr_id = m.rqe->wr_id;
          c.opcode = WcOpcode::kRecv;
        } else {
          c.wr_id = m.rqe->wr_id;  // taken when the last packet arrived (RDMA WRITE with immediate, IBTA 9.4.3.1)
          c.opcode = WcOpcode::kRecvRdmaWithImm;
        }
        core_.Complete(qp_.init().recv_cq, c);
      }
      m = InboundMessage{};
    }
    if (p.bth.ack_req) Acknowledge(psn, starts && ends, out);
    return;
  }

  if (m.kind != InboundMessage::Kind::kNone) {
    FatalNak(wire::NakCode::kInvalidRequest, out);  // a READ or atomic inside an open SEND/WRITE
    return;
  }
  if (op == wire::Operation::kReadRequest) {
    const wire::Reth& reth = *p.reth;
    const bool granted = core_.MayAccessRemote(qp_, reth.rkey, reth.va, reth.dma_length, access::kRemoteRead);
    if (!(a.qp_access_flags & access::kRemoteRead) || !granted) {
      core_.Count(&DeviceCounters::rx_remote_access_denied);
      FatalNak(wire::NakCode::kRemoteAccessError, out);
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
    SendReadResponses(res, psn, out);
    return;
  }
  if (op == wire::Operation::kCompareSwap || op == wire::Operation::kFetchAdd) {
    const wire::AtomicEth& ae = *p.atomic;
    if (ae.va & 7) {
      FatalNak(wire::NakCode::kInvalidRequest, out);  // misaligned atomic (9.4.5)
      return;
    }
    std::shared_lock keys(core_.keys_mu);  // the word is changed while the key table cannot change
    AccessResult acc = core_.keys.CheckRemote(ae.rkey, qp_.init().pd, ae.va, 8, access::kRemoteAtomic, qp_.qpn());
    if (!(a.qp_access_flags & access::kRemoteAtomic) || !acc.ok()) {
      keys.unlock();
      core_.Count(&DeviceCounters::rx_remote_access_denied);
      FatalNak(wire::NakCode::kRemoteAccessError, out);
      return;
    }
    auto* target = reinterpret_cast<uint64_t*>(acc.host);
    uint64_t original = 0;
    // The application's CPU may touch the word concurrently: a real atomic (IBV_ATOMIC_HCA semantics).
    const bool done = op == wire::Operation::kCompareSwap
                          ? CompareSwapGuarded(target, ae.compare, ae.swap_add, &original)
                          : FetchAddGuarded(target, ae.swap_add, &original);
    keys.unlock();
    if (!done) {  // the word's memory was unmapped since its registration
      core_.Count(&DeviceCounters::rx_remote_access_denied);
      FatalNak(wire::NakCode::kRemoteAccessError, out);
      return;
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
    SendAtomicAck(psn, R.msn, original, out);
    return;
  }
  FatalNak(wire::NakCode::kInvalidRequest, out);  // an opcode RC does not carry
}

}  // namespace uroce::emu
