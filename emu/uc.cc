// The UC transport (uc.h): messages out without acknowledgement, in-sequence assembly in.
#include "emu/uc.h"

#include "emu/host_memory.h"

#include <algorithm>
#include <cstring>
#include <mutex>
#include <shared_mutex>

#include "emu/device_core.h"
#include "emu/out_batch.h"
#include "emu/queue_pair.h"
#include "wire/opcode.h"

namespace uroce::emu {

int UcTransport::Post(SendWr& wr, OutBatch& out) {
  // UC has no READ, atomics or SEND with invalidate (IBTA table 38).
  if (!ValidOn(FindSendOpcode(wr.opcode), QpType::kUc)) return EINVAL;
  int err = 0;
  if (core_.HoldUnreliableSend(qp_, wr, qp_.peer().addr, &err)) return err;
  Send(wr, out);
  return 0;
}

void UcTransport::Send(const SendWr& wr, OutBatch& out) {
  const SendOpcodeInfo& info = *FindSendOpcode(wr.opcode);  // Post let only UC's opcodes through
  if (info.kind == SendOpcodeInfo::Kind::kLocal) {
    const WcStatus st = core_.ExecuteLocalOp(qp_, wr);
    if (st == WcStatus::kSuccess) {
      core_.CompleteSend(qp_, wr, st);
    } else {
      core_.FailUnreliableSend(qp_, wr, st);
    }
    return;
  }
  const bool is_write = info.kind == SendOpcodeInfo::Kind::kWrite;
  const bool is_send = info.kind == SendOpcodeInfo::Kind::kSend;
  std::vector<uint8_t> payload;
  WcStatus st = core_.Gather(qp_, wr, payload);
  if (st == WcStatus::kSuccess && payload.size() > core_.config.limits.max_msg_sz) st = WcStatus::kLocLenErr;
  if (st != WcStatus::kSuccess) {
    core_.FailUnreliableSend(qp_, wr, st);
    return;
  }
  const QpAttributes& a = qp_.attributes();
  const size_t mtu = MtuBytes(a.path_mtu);
  const bool imm = info.immediate;
  const wire::IpAddress src = core_.SourceOf(a.ah_attr);
  const wire::UdpEndpoint dst = qp_.peer();
  const uint16_t sport = qp_.source_port();
  const size_t total = payload.size();
  const size_t packets = PacketsFor(total, mtu);
  for (size_t i = 0; i < packets; ++i) {
    const bool first = i == 0, last = i + 1 == packets;
    wire::PacketSpec spec;
    // UC defines SEND and WRITE, with and without immediate (IBTA table 38); the opcode checks above let no other
    // operation through.
    spec.bth.opcode = *wire::MessageOpcode(wire::TransportKind::kUc,
                                           is_send ? wire::Operation::kSend : wire::Operation::kRdmaWrite,
                                           wire::PositionInMessage(i, packets), imm);
    spec.bth.solicited = last && (wr.flags & send_flags::kSolicited);
    spec.bth.dest_qp = a.dest_qp_num;
    spec.bth.psn = qp_.NextSendPsn();
    if (is_write && first) spec.reth = wire::Reth{wr.remote_addr, wr.rkey, static_cast<uint32_t>(total)};
    if (imm && last) spec.imm = wire::ImmDt{wr.imm_data};
    const size_t off = i * mtu;
    const size_t len = std::min(mtu, total - std::min(total, off));
    out.Add(core_.transport, spec, std::span<const uint8_t>(payload).subspan(std::min(off, total), len), src, dst,
            sport);
  }
  core_.ChargeUnreliable(dst.addr, total);
  core_.CompleteSend(qp_, wr, WcStatus::kSuccess);
}

// The receive steps (IBTA 9.7.6.1): sequence (resynchronise at a gap), length, the message's start (a receive WQE for
// a SEND, the key for a WRITE), placement, completion. A step that drops the message counts why and leaves the QP
// dropping until the next FIRST or ONLY packet.
void UcTransport::Receive(const wire::PacketView& p) {
  const wire::MsgPosition pos = p.info->position;
  const bool starts = pos == wire::MsgPosition::kFirst || pos == wire::MsgPosition::kOnly;
  const bool ends = pos == wire::MsgPosition::kLast || pos == wire::MsgPosition::kOnly;
  if (!InSequence(p, starts)) return;
  if (!wire::PayloadFitsPathMtu(pos, p.payload.size(), MtuBytes(qp_.attributes().path_mtu))) {
    // Cut at another path MTU than ours: dropped, as any UC message the receiver cannot take (9.7.6.1.5).
    return DropMessage(&DeviceCounters::rx_length_errors);
  }
  const InboundMessage::Kind kind =
      p.info->op == wire::Operation::kSend ? InboundMessage::Kind::kSend : InboundMessage::Kind::kWrite;
  if (starts) {
    if (!StartMessage(p, kind == InboundMessage::Kind::kSend)) return;
  } else if (qp_.inbound().kind != kind) {
    // A WRITE packet inside a SEND (or the reverse): out of sequence opcodes, drop the message.
    return DropMessage(&DeviceCounters::rx_out_of_sequence);
  }
  if (!Place(p)) return;
  if (ends) CompleteMessage(p);
}

// IBTA 9.7.6.1.3: a PSN other than the expected one means packets were lost; the message in progress is abandoned
// and the receiver resynchronises on the next FIRST or ONLY packet, whatever its PSN. False: nothing more to do.
bool UcTransport::InSequence(const wire::PacketView& p, bool starts) {
  QpAttributes& a = qp_.mutable_attributes();
  InboundMessage& m = qp_.inbound();
  if (p.bth.psn != a.rq_psn) {
    if (m.kind != InboundMessage::Kind::kNone || !starts) core_.Count(&DeviceCounters::rx_out_of_sequence);
    ReleaseMessage();
    if (!starts) m.dropping = true;
  }
  a.rq_psn = (p.bth.psn + 1) & 0xffffff;
  // The rest of a message not being assembled is passed over.
  return starts || (!m.dropping && m.kind != InboundMessage::Kind::kNone);
}

// Ends the message in progress; its receive WQE, if it took one, waits for a later message.
void UcTransport::ReleaseMessage() {
  InboundMessage& m = qp_.inbound();
  if (m.rqe) qp_.receive_queue().push_front(std::move(*m.rqe));
  m = InboundMessage{};
}

void UcTransport::DropMessage(uint64_t DeviceCounters::*why) {
  core_.Count(why);
  ReleaseMessage();
  qp_.inbound().dropping = true;
}

// A FIRST or ONLY packet: a SEND takes a receive WQE (UC has no RNR NAK: without one the message is dropped,
// 9.7.6.1.5); a WRITE's RETH must name a region the QP may write.
bool UcTransport::StartMessage(const wire::PacketView& p, bool is_send) {
  ReleaseMessage();
  InboundMessage& m = qp_.inbound();
  if (is_send) {
    if (qp_.receive_queue().empty()) {
      DropMessage(&DeviceCounters::rx_no_receive_wqe);
      return false;
    }
    m.kind = InboundMessage::Kind::kSend;
    m.rqe = std::move(qp_.receive_queue().front());
    qp_.receive_queue().pop_front();
    return true;
  }
  const wire::Reth& reth = *p.reth;
  const bool allowed = qp_.attributes().qp_access_flags & access::kRemoteWrite;
  if (!allowed || !core_.MayAccessRemote(qp_, reth.rkey, reth.va, reth.dma_length, access::kRemoteWrite)) {
    DropMessage(&DeviceCounters::rx_remote_access_denied);
    return false;
  }
  m.kind = InboundMessage::Kind::kWrite;
  m.write_va = reth.va;
  m.write_rkey = reth.rkey;
  m.write_length = reth.dma_length;
  return true;
}

// The packet's payload into the receive WQE's buffers (a failure completes the WQE in error and the QP enters the
// error state) or the WRITE's target (more than the RETH announced, or a region gone mid-message, drops the rest).
bool UcTransport::Place(const wire::PacketView& p) {
  InboundMessage& m = qp_.inbound();
  if (m.kind == InboundMessage::Kind::kSend) {
    const WcStatus st = core_.Scatter(qp_, m.rqe->sg_list, m.offset, p.payload);
    m.offset += p.payload.size();
    if (st == WcStatus::kSuccess) return true;
    const Completion c = DeviceCore::ReceiveError(qp_, m.rqe->wr_id, st);
    m = InboundMessage{};
    core_.Complete(qp_.init().recv_cq, c);
    core_.EnterError(qp_);
    return false;
  }
  if (m.offset + p.payload.size() > m.write_length) {
    DropMessage(&DeviceCounters::rx_remote_access_denied);
    return false;
  }
  if (!p.payload.empty()) {
    ReaderLock keys(core_.keys_mu());  // the region is written while the key table cannot change
    if (!core_.WriteInbound(qp_, m, p.payload)) {
      keys.Unlock();
      DropMessage(&DeviceCounters::rx_remote_access_denied);  // deregistered (or unmapped) mid-message
      return false;
    }
  }
  m.offset += p.payload.size();
  return true;
}

// The last packet: a SEND completes its receive WQE; a WRITE with immediate consumes one (IBTA 9.4.3.1; without one
// the message is lost); a plain WRITE completes nothing at the receiver.
void UcTransport::CompleteMessage(const wire::PacketView& p) {
  InboundMessage& m = qp_.inbound();
  if (m.kind == InboundMessage::Kind::kWrite && !p.imm.has_value()) {
    m = InboundMessage{};
    return;
  }
  Completion c = DeviceCore::MessageCompletion(qp_, m.offset, p);
  if (m.kind == InboundMessage::Kind::kSend) {
    c.wr_id = m.rqe->wr_id;
    c.opcode = WcOpcode::kRecv;
  } else {
    if (qp_.receive_queue().empty()) {
      core_.Count(&DeviceCounters::rx_no_receive_wqe);
      m = InboundMessage{};
      return;
    }
    c.wr_id = qp_.receive_queue().front().wr_id;
    qp_.receive_queue().pop_front();
    c.opcode = WcOpcode::kRecvRdmaWithImm;
  }
  m = InboundMessage{};
  core_.Complete(qp_.init().recv_cq, c);
}

}  // namespace uroce::emu
