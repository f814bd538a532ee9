// The RC responder (rc_responder.h): PSN checks, execution exactly once, NAKs and RNR NAKs, saved READ/atomic
// answers for duplicates, and ACKs sent at once or held (AckTiming).
#include "emu/rc_responder.h"

#include "emu/host_memory.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <iterator>
#include <mutex>
#include <shared_mutex>
#include <string>

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
  out.Add(core_.transport, spec, {}, core_.SourceOf(qp_.attributes().ah_attr), qp_.peer(), qp_.source_port());
}

void RcResponder::Acknowledge(uint32_t psn, bool one_packet, OutBatch& out) {
  RcResponderState& R = state_;
  if (out.ack_timing == AckTiming::kNow) {
    SendAck(psn, wire::Aeth::Ack(wire::kInvalidCredits, R.msn), out);
    return;
  }
  const uint64_t hold = one_packet && !R.ack_held ? kAckHoldNs : kAckCoalesceNs;
  const uint64_t due = core_.Now() + uint64_t(double(hold) * core_.config.time_scale);
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
  out.Add(core_.transport, spec, {}, core_.SourceOf(qp_.attributes().ah_attr), qp_.peer(), qp_.source_port());
}

void RcResponder::SendReadResponses(const ResponderResource& res, uint32_t from_psn, OutBatch& out) {
  const uint32_t mtu = MtuBytes(qp_.attributes().path_mtu);
  ReaderLock keys(core_.keys_mu());  // the region is read until the last response is built
  AccessResult acc =
      core_.keys().CheckRemote(res.rkey, qp_.init().pd, res.va, res.length, access::kRemoteRead, qp_.qpn());
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
    std::span<const uint8_t> payload(acc.host ? acc.host + off : nullptr, len);
    bool read = true;
    if (acc.foreign != nullptr) {  // an imported region: its bytes copied here first
      static thread_local std::vector<uint8_t> bounce;
      bounce.resize(len);
      AccessResult at = acc;
      at.host += off;
      read = ReadRegion(at, bounce.data(), len);
      payload = bounce;
    }
    if (!read ||
        !out.Add(core_.transport, spec, payload, core_.SourceOf(qp_.attributes().ah_attr), qp_.peer(), qp_.source_port())) {
      // The region's memory was unmapped since its registration: as any access outside a valid region (9.7.5.2.5),
      // named by the response that could not be built -- a PSN the requester is waiting for.
      keys.Unlock();
      core_.Count(&DeviceCounters::rx_remote_access_denied);
      FatalNakAt(spec.bth.psn, wire::NakCode::kRemoteAccessError, out);
      return;
    }
  }
}

// --- the request's way through the responder: one step each, in the order rxe's responder judges --------------

namespace {

// What the responder does once a step has decided (IBTA 9.7.5.2): nothing more (the step answered itself, or the
// request was carried out), an RNR NAK, or a NAK that ends the connection.
enum class Answer : uint8_t { kNone, kRnrNak, kFatalNak };

struct OutcomeInfo {
  RequestOutcome outcome;
  std::string_view name;
  Answer answer;
  wire::NakCode nak;                    // kFatalNak: its code
  uint64_t DeviceCounters::*counter;  // what counts it (nullptr: nothing)
};

// Every outcome once: its name, the answer and the counter (indexed by the enum's value).
constexpr OutcomeInfo kOutcomes[] = {
    {RequestOutcome::kPass, "pass", Answer::kNone, {}, nullptr},
    {RequestOutcome::kExecuted, "executed", Answer::kNone, {}, nullptr},
    {RequestOutcome::kDuplicate, "duplicate", Answer::kNone, {}, &DeviceCounters::rc_duplicates},
    {RequestOutcome::kSequenceGap, "sequence gap", Answer::kNone, {}, &DeviceCounters::rx_out_of_sequence},
    {RequestOutcome::kInvalidOpcode, "invalid opcode", Answer::kFatalNak, wire::NakCode::kInvalidRequest,
     &DeviceCounters::rc_invalid_requests},
    {RequestOutcome::kOutOfSequenceOpcode, "opcode out of sequence", Answer::kFatalNak,
     wire::NakCode::kInvalidRequest, &DeviceCounters::rc_invalid_requests},
    {RequestOutcome::kReceiverNotReady, "receiver not ready", Answer::kRnrNak, {}, &DeviceCounters::rc_rnr_naks_sent},
    {RequestOutcome::kLengthError, "length error", Answer::kFatalNak, wire::NakCode::kInvalidRequest,
     &DeviceCounters::rx_length_errors},
    {RequestOutcome::kAccessDenied, "access denied", Answer::kFatalNak, wire::NakCode::kRemoteAccessError,
     &DeviceCounters::rx_remote_access_denied},
    {RequestOutcome::kMisalignedAtomic, "misaligned atomic", Answer::kFatalNak, wire::NakCode::kInvalidRequest,
     &DeviceCounters::rc_invalid_requests},
    {RequestOutcome::kReceiveTooSmall, "receive too small", Answer::kFatalNak, wire::NakCode::kInvalidRequest,
     &DeviceCounters::rc_invalid_requests},
    {RequestOutcome::kReceiveUnusable, "receive unusable", Answer::kFatalNak,
     wire::NakCode::kRemoteOperationalError, nullptr},
    {RequestOutcome::kInvalidateRefused, "invalidate refused", Answer::kFatalNak, wire::NakCode::kInvalidRequest,
     &DeviceCounters::rc_invalid_requests},
};
static_assert(std::size(kOutcomes) == size_t(RequestOutcome::kInvalidateRefused) + 1);

constexpr bool OutcomesInOrder() {
  for (size_t i = 0; i < std::size(kOutcomes); ++i)
    if (size_t(kOutcomes[i].outcome) != i) return false;
  return true;
}
static_assert(OutcomesInOrder(), "kOutcomes is indexed by RequestOutcome");

bool IsMessage(wire::Operation op) { return op == wire::Operation::kSend || op == wire::Operation::kRdmaWrite; }
bool IsAtomic(wire::Operation op) { return op == wire::Operation::kCompareSwap || op == wire::Operation::kFetchAdd; }

}  // namespace

std::string_view ToString(RequestOutcome outcome) {
  const size_t i = static_cast<size_t>(outcome);
  return i < std::size(kOutcomes) ? kOutcomes[i].name : "?";
}

// One request packet as the steps see it.
struct RcResponder::Request {
  const wire::PacketView& p;
  uint32_t psn;
  wire::Operation op;
  bool starts, ends;  // FIRST or ONLY; LAST or ONLY
  bool needs_rqe;     // a SEND, or the last packet of a WRITE with immediate, consumes a receive WQE
};

// The steps, in order (rxe's responder: check_psn, check_op_seq, check_op_valid, check_resource, check_length,
// check_rkey, execute, acknowledge). Each returns kPass to hand the request on, or the outcome that ends it.
const RcResponder::Step RcResponder::kSteps[] = {
    {"psn", &RcResponder::CheckPsn},
    {"opcode", &RcResponder::CheckOpcode},
    {"sequence", &RcResponder::CheckSequence},
    {"resources", &RcResponder::CheckResources},
    {"length", &RcResponder::CheckLength},
    {"key", &RcResponder::CheckKey},
    {"execute", &RcResponder::Execute},
    {"acknowledge", &RcResponder::AcknowledgeRequest},
};

void RcResponder::OnRequest(const wire::PacketView& p, OutBatch& out) {
  RcResponderState& R = state_;
  if (!R.comm_established) {
    // The first packet on a QP in RTR establishes communication (IBTA 11.6.2: IBV_EVENT_COMM_EST).
    R.comm_established = true;
    if (qp_.attributes().qp_state == QpState::kRtr) core_.Raise({AsyncEventType::kCommEst, &qp_});
  }
  const wire::Operation op = p.info->op;
  // A READ response or atomic ACK answers in PSN order after the ACK held for earlier requests.
  if (R.ack_held && !IsMessage(op)) SendHeldAck(out);
  const wire::MsgPosition pos = p.info->position;
  Request q{p, p.bth.psn, op, pos == wire::MsgPosition::kFirst || pos == wire::MsgPosition::kOnly,
            pos == wire::MsgPosition::kLast || pos == wire::MsgPosition::kOnly, false};
  q.needs_rqe = op == wire::Operation::kSend || (op == wire::Operation::kRdmaWrite && q.ends && p.imm.has_value());
  const bool tracing = core_.tracing();
  std::string trace;
  RequestOutcome outcome = RequestOutcome::kPass;
  for (const Step& step : kSteps) {
    outcome = (this->*step.run)(q, out);
    if (tracing) {
      trace += trace.empty() ? "" : ", ";
      trace += step.name;
      trace += ' ';
      trace += ToString(outcome);
    }
    if (outcome != RequestOutcome::kPass) break;
  }
  Conclude(q, outcome, out);
  if (tracing) TraceRequest(q, outcome, trace);
}

void RcResponder::Conclude(const Request& q, RequestOutcome outcome, OutBatch& out) {
  const OutcomeInfo& info = kOutcomes[static_cast<size_t>(outcome)];
  if (info.counter != nullptr) core_.Count(info.counter);
  switch (info.answer) {
    case Answer::kNone:
      break;
    case Answer::kRnrNak:
      // Receiver not ready (9.7.5.2.8): the requester waits min_rnr_timer and sends this packet again.
      SendAck(q.psn, wire::Aeth::RnrNak(qp_.attributes().min_rnr_timer, state_.msn), out);
      break;
    case Answer::kFatalNak:
      FatalNak(info.nak, out);
      break;
  }
}

void RcResponder::TraceRequest(const Request& q, RequestOutcome outcome, const std::string& steps) const {
  const OutcomeInfo& info = kOutcomes[static_cast<size_t>(outcome)];
  std::string line = "responder qp " + Hex24(qp_.qpn()) + " psn " + Hex24(q.psn) + " " +
                     std::string(q.p.info->name) + ": " + steps;
  if (info.answer == Answer::kRnrNak) line += " -> RNR NAK";
  if (info.answer == Answer::kFatalNak) line += " -> NAK " + std::string(wire::ToString(info.nak)) + ", QP to ERR";
  core_.Trace(line);
}

// PSN (9.7.5.1.1 / 9.7.5.1.3): the expected one passes; a later one is a gap, NAKed once; an earlier one a duplicate,
// answered again from what was saved and never executed twice.
RequestOutcome RcResponder::CheckPsn(Request& q, OutBatch& out) {
  RcResponderState& R = state_;
  const QpAttributes& a = qp_.attributes();
  const int32_t d = PsnDiff(q.psn, a.rq_psn);
  if (d > 0) {
    // Packets were lost: drop until the expected PSN comes.
    if (!R.nak_outstanding) {
      R.nak_outstanding = true;
      SendAck(a.rq_psn, wire::Aeth::Nak(wire::NakCode::kPsnSeqError, R.msn), out);
    }
    return RequestOutcome::kSequenceGap;
  }
  if (d < 0) {
    AnswerDuplicate(q, out);
    return RequestOutcome::kDuplicate;
  }
  R.nak_outstanding = false;
  return RequestOutcome::kPass;
}

void RcResponder::AnswerDuplicate(const Request& q, OutBatch& out) {
  const RcResponderState& R = state_;
  if (q.op == wire::Operation::kReadRequest) {
    for (const ResponderResource& res : R.resources)
      if (!res.atomic && PsnDiff(q.psn, res.psn) >= 0 && PsnDiff(q.psn, res.psn) < static_cast<int32_t>(res.npsn)) {
        SendReadResponses(res, q.psn, out);
        return;
      }
  } else if (IsAtomic(q.op)) {
    for (const ResponderResource& res : R.resources)
      if (res.atomic && res.psn == q.psn) {
        SendAtomicAck(q.psn, res.msn, res.original, out);
        return;
      }
  } else if (q.p.bth.ack_req) {
    // SEND/WRITE already executed: acknowledge again, with the newest PSN (9.7.5.1.3).
    Acknowledge(PsnAdd(qp_.attributes().rq_psn, -1), /*one_packet=*/false, out);
  }
}

// An operation RC carries as a request (IBTA table 38: SEND, RDMA WRITE, RDMA READ request, the two atomics).
RequestOutcome RcResponder::CheckOpcode(Request& q, OutBatch&) {
  const bool valid = IsMessage(q.op) || q.op == wire::Operation::kReadRequest || IsAtomic(q.op);
  return valid ? RequestOutcome::kPass : RequestOutcome::kInvalidOpcode;
}

// Opcode sequence (9.7.5.1.2): a FIRST/ONLY while a message is open, a MIDDLE/LAST of another kind (or of none), and
// a READ or atomic inside an open SEND/WRITE are invalid requests.
RequestOutcome RcResponder::CheckSequence(Request& q, OutBatch&) {
  const InboundMessage::Kind open = qp_.inbound().kind;
  bool in_sequence = open == InboundMessage::Kind::kNone;
  if (IsMessage(q.op) && !q.starts) {
    in_sequence = open == (q.op == wire::Operation::kSend ? InboundMessage::Kind::kSend : InboundMessage::Kind::kWrite);
  }
  return in_sequence ? RequestOutcome::kPass : RequestOutcome::kOutOfSequenceOpcode;
}

// A message that needs a receive WQE finds one on the QP's receive queue or its SRQ (else RNR NAK, 9.7.5.2.8).
RequestOutcome RcResponder::CheckResources(Request& q, OutBatch&) {
  if (q.needs_rqe && !qp_.inbound().rqe && !core_.HasReceiveWqe(qp_)) return RequestOutcome::kReceiverNotReady;
  return RequestOutcome::kPass;
}

// Lengths: each packet of a SEND/WRITE is PMTU-sized for its place (wire::PayloadFitsPathMtu: ends that disagree on
// the path MTU would count different PSNs for what follows), and a WRITE carries exactly the RETH's DMA length.
RequestOutcome RcResponder::CheckLength(Request& q, OutBatch&) {
  if (!IsMessage(q.op)) return RequestOutcome::kPass;
  const size_t payload = q.p.payload.size();
  if (!wire::PayloadFitsPathMtu(q.p.info->position, payload, MtuBytes(qp_.attributes().path_mtu)))
    return RequestOutcome::kLengthError;
  if (q.op == wire::Operation::kRdmaWrite) {
    const InboundMessage& m = qp_.inbound();
    const uint64_t length = q.starts ? q.p.reth->dma_length : m.write_length;
    const uint64_t done = q.starts ? 0 : m.offset;
    if (done + payload > length || (q.ends && done + payload != length)) return RequestOutcome::kLengthError;
  }
  return RequestOutcome::kPass;
}

// Keys and rights (9.7.5.2.5, 10.6.3): a WRITE's first packet, a READ and an atomic name a region the QP may reach
// with this access; an atomic's address is 8-byte aligned (9.4.5).
RequestOutcome RcResponder::CheckKey(Request& q, OutBatch&) {
  const uint32_t allowed = qp_.attributes().qp_access_flags;
  auto may = [&](uint32_t rkey, uint64_t va, uint64_t len, uint32_t access) {
    return (allowed & access) && core_.MayAccessRemote(qp_, rkey, va, len, access);
  };
  if (q.op == wire::Operation::kRdmaWrite && q.starts) {
    const wire::Reth& reth = *q.p.reth;
    if (!may(reth.rkey, reth.va, reth.dma_length, access::kRemoteWrite)) return RequestOutcome::kAccessDenied;
  } else if (q.op == wire::Operation::kReadRequest) {
    const wire::Reth& reth = *q.p.reth;
    if (!may(reth.rkey, reth.va, reth.dma_length, access::kRemoteRead)) return RequestOutcome::kAccessDenied;
  } else if (IsAtomic(q.op)) {
    const wire::AtomicEth& ae = *q.p.atomic;
    if (ae.va & 7) return RequestOutcome::kMisalignedAtomic;
    if (!may(ae.rkey, ae.va, 8, access::kRemoteAtomic)) return RequestOutcome::kAccessDenied;
  }
  return RequestOutcome::kPass;
}

RequestOutcome RcResponder::Execute(Request& q, OutBatch& out) {
  switch (q.op) {
    case wire::Operation::kSend:
    case wire::Operation::kRdmaWrite: return ExecuteMessagePacket(q);
    case wire::Operation::kReadRequest: return ExecuteRead(q, out);
    default: return ExecuteAtomic(q, out);
  }
}

// A SEND or WRITE packet: placed in the receive WQE's buffers or the WRITE's target; the message's last packet
// completes it (a SEND, or a WRITE with immediate, on the receive CQ).
RequestOutcome RcResponder::ExecuteMessagePacket(Request& q) {
  InboundMessage& m = qp_.inbound();
  const bool is_send = q.op == wire::Operation::kSend;
  if (q.starts) {
    // A first packet that could not be handed to another process's SRQ kept its claim (HandSend): its retransmission
    // uses it. Any other claim left over is abandoned.
    const bool keep_claim = m.relay_srqn != 0 && m.offset == 0 && m.relay_srqn == qp_.packet_remote_srqn;
    if (m.relay_srqn != 0 && !keep_claim) core_.AbandonHandedMessage(qp_, WcStatus::kWrFlushErr);
    if (!keep_claim) m = InboundMessage{};
    m.kind = is_send ? InboundMessage::Kind::kSend : InboundMessage::Kind::kWrite;
    if (!is_send) {
      m.write_va = q.p.reth->va;
      m.write_rkey = q.p.reth->rkey;
      m.write_length = q.p.reth->dma_length;
    }
  }
  if (q.needs_rqe && !m.rqe) {
    m.rqe = core_.TakeReceiveWqe(qp_);
    if (!m.rqe) {
      // Another QP took the SRQ's last WQE since CheckResources: receiver not ready after all.
      if (q.starts) m = InboundMessage{};
      return RequestOutcome::kReceiverNotReady;
    }
  }
  const RequestOutcome placed = is_send ? PlaceSend(q) : PlaceWrite(q);
  if (placed != RequestOutcome::kPass) return placed;
  m.offset += q.p.payload.size();
  if (q.ends && q.p.ieth && [&] {
        WriterLock keys(core_.keys_mu());
        return core_.mutable_keys().InvalidateWindow(q.p.ieth->rkey, qp_.qpn()) != 0;
      }()) {
    // SEND with invalidate names an R_Key we cannot invalidate (not a type 2 window bound to this QP): the
    // responder refuses the request (IBTA 9.4.6 / 10.6.7.2.3).
    return RequestOutcome::kInvalidateRefused;
  }
  QpAttributes& a = qp_.mutable_attributes();
  a.rq_psn = PsnAdd(a.rq_psn, 1);
  if (q.ends) CompleteMessage(q);
  return RequestOutcome::kPass;
}

RequestOutcome RcResponder::PlaceSend(const Request& q) {
  InboundMessage& m = qp_.inbound();
  if (m.relay_srqn != 0) return HandSend(q);
  const WcStatus st = core_.Scatter(qp_, m.rqe->sg_list, m.offset, q.p.payload);
  if (st == WcStatus::kSuccess) return RequestOutcome::kPass;
  const Completion c = DeviceCore::ReceiveError(qp_, m.rqe->wr_id, st);
  core_.Complete(qp_.init().recv_cq, c);
  core_.KeepSrqWqe(qp_, std::move(*m.rqe));
  m = InboundMessage{};
  // Too long for the receive buffer is the sender's invalid request; a bad local key our operational error.
  return st == WcStatus::kLocLenErr ? RequestOutcome::kReceiveTooSmall : RequestOutcome::kReceiveUnusable;
}

// A SEND's packet for another process's XRC SRQ: its payload handed to that process in order (wire::SharedXrc),
// which places it with its own keys and completes the WQE our claim kept for it. Where it cannot be handed (that
// process's ring is full, or it is gone) the packet is not executed: receiver not ready, and the requester sends it
// again after the RNR NAK's delay, the claim kept for it.
RequestOutcome RcResponder::HandSend(const Request& q) {
  InboundMessage& m = qp_.inbound();
  if (m.offset + q.p.payload.size() > m.relay_length) {
    // Longer than the WQE it claimed: that WQE completes with LOC_LEN_ERR there, and the sender's request is invalid,
    // as from the SRQ's own target (PlaceSend).
    core_.AbandonHandedMessage(qp_, WcStatus::kLocLenErr);
    return RequestOutcome::kReceiveTooSmall;
  }
  wire::XrcDelivery d;
  d.srqn = m.relay_srqn;
  d.target_qpn = qp_.qpn();
  d.src_qpn = qp_.attributes().dest_qp_num;
  d.index = m.relay_index;
  d.psn = q.psn;
  d.resent = qp_.resend_pending && q.psn == qp_.resend_psn;
  d.first = q.starts;
  d.last = q.ends;
  d.solicited = q.p.bth.solicited;
  if (q.p.imm) {
    d.with_imm = true;
    d.imm = q.p.imm->imm;
  }
  // Our state as it is before the piece leaves: if we die before the state after it is published, whoever takes the
  // QP over hands this piece again, marked resent (wire/direct_access.h).
  if (core_.SharesTarget(qp_)) core_.PublishTargetState(qp_, /*pending=*/true);
  if (core_.config.shared_xrc->DeliverXrc(d, q.p.payload)) {
    core_.Count(&DeviceCounters::xrc_pieces_handed);
    return RequestOutcome::kPass;
  }
  // Not executed: a first packet's message is not open yet (its retransmission is a FIRST again), but keeps its claim.
  if (q.starts) m.kind = InboundMessage::Kind::kNone;
  return RequestOutcome::kReceiverNotReady;
}

RequestOutcome RcResponder::PlaceWrite(const Request& q) {
  if (q.p.payload.empty()) return RequestOutcome::kPass;
  // On an error the message is abandoned with the QP: the error state flushes the receive WQE a WRITE with
  // immediate took.
  ReaderLock keys(core_.keys_mu());
  // The region was deregistered (or its window invalidated, or its memory unmapped) while the message was arriving:
  // the rest is refused like any access outside a valid region (IBTA 9.7.5.2.5, remote access error).
  if (!core_.WriteInbound(qp_, qp_.inbound(), q.p.payload)) return RequestOutcome::kAccessDenied;
  return RequestOutcome::kPass;
}

void RcResponder::CompleteMessage(const Request& q) {
  RcResponderState& R = state_;
  InboundMessage& m = qp_.inbound();
  R.msn = PsnAdd(R.msn, 1);
  if (m.rqe && m.relay_srqn == 0) {  // (a WQE of another process's SRQ completes there)
    // A SEND, or a WRITE with immediate: its receive WQE, taken when the last packet arrived (IBTA 9.4.3.1).
    Completion c = DeviceCore::MessageCompletion(qp_, m.offset, q.p);
    c.wr_id = m.rqe->wr_id;
    c.opcode = q.op == wire::Operation::kSend ? WcOpcode::kRecv : WcOpcode::kRecvRdmaWithImm;
    core_.Complete(qp_.init().recv_cq, c);
    core_.KeepSrqWqe(qp_, std::move(*m.rqe));
  }
  m = InboundMessage{};
}

// A READ: saved (to answer a duplicate again, 9.7.5.1.6) and answered, one PSN per response packet (9.7.4.1.4).
RequestOutcome RcResponder::ExecuteRead(Request& q, OutBatch& out) {
  RcResponderState& R = state_;
  const wire::Reth& reth = *q.p.reth;
  ResponderResource res;
  res.psn = q.psn;
  res.npsn = PacketsFor(reth.dma_length, MtuBytes(qp_.attributes().path_mtu));
  res.va = reth.va;
  res.rkey = reth.rkey;
  res.length = reth.dma_length;
  R.msn = PsnAdd(R.msn, 1);
  res.msn = R.msn;
  SaveResource(res);
  qp_.mutable_attributes().rq_psn = PsnAdd(q.psn, res.npsn);
  SendReadResponses(res, q.psn, out);
  return RequestOutcome::kExecuted;
}

// An atomic, on the word while the key table cannot change; saved with its result (9.7.5.1.6) and acknowledged.
RequestOutcome RcResponder::ExecuteAtomic(Request& q, OutBatch& out) {
  RcResponderState& R = state_;
  const wire::AtomicEth& ae = *q.p.atomic;
  ReaderLock keys(core_.keys_mu());
  AccessResult acc = core_.keys().CheckRemote(ae.rkey, qp_.init().pd, ae.va, 8, access::kRemoteAtomic, qp_.qpn());
  if (!acc.ok()) return RequestOutcome::kAccessDenied;  // deregistered since CheckKey
  // Another process's memory (an imported region) takes no atomic of ours: its CPU would not see one.
  if (acc.foreign != nullptr) return RequestOutcome::kAccessDenied;
  auto* target = reinterpret_cast<uint64_t*>(acc.host);
  uint64_t original = 0;
  // The application's CPU may touch the word concurrently: a real atomic (IBV_ATOMIC_HCA semantics).
  const bool done = q.op == wire::Operation::kCompareSwap
                        ? CompareSwapGuarded(target, ae.compare, ae.swap_add, &original)
                        : FetchAddGuarded(target, ae.swap_add, &original);
  keys.Unlock();
  if (!done) return RequestOutcome::kAccessDenied;  // the word's memory was unmapped since its registration
  ResponderResource res;
  res.atomic = true;
  res.psn = q.psn;
  res.original = original;
  R.msn = PsnAdd(R.msn, 1);
  res.msn = R.msn;
  SaveResource(res);
  qp_.mutable_attributes().rq_psn = PsnAdd(q.psn, 1);
  SendAtomicAck(q.psn, R.msn, original, out);
  return RequestOutcome::kExecuted;
}

void RcResponder::SaveResource(const ResponderResource& res) {
  state_.resources.push_back(res);
  if (state_.resources.size() > kSavedResponses) state_.resources.pop_front();
}

// A SEND/WRITE packet that asked for an ACK gets one, now or held (AckTiming).
RequestOutcome RcResponder::AcknowledgeRequest(Request& q, OutBatch& out) {
  if (q.p.bth.ack_req) Acknowledge(q.psn, q.starts && q.ends, out);
  return RequestOutcome::kExecuted;
}

}  // namespace uroce::emu
