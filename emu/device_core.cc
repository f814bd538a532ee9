// DeviceCore (device_core.h): what the transport objects of every QP share.
#include "emu/device_core.h"

#include <algorithm>
#include <cstring>

#include "emu/out_batch.h"
#include "emu/queue_pair.h"

namespace uroce::emu {

wire::IpAddress DeviceCore::PeerAddressOf(const QueuePair& qp) { return qp.peer().addr; }

void DeviceCore::Complete(CompletionQueue* cq, const Completion& c) {
  if (cq == nullptr) return;  // an XRC QP has no CQ for the direction it does not have
  Completion stamped = c;
  stamped.timestamp_ns = Now();
  if (!cq->Push(stamped)) {
    ++counters.cq_overflows;
    Raise({AsyncEventType::kCqErr, nullptr, cq});
  }
}

void DeviceCore::WakeForTimer(uint64_t deadline) {
  // Called with the lock held when a timer is armed: the progress thread may be blocked until a later deadline.
  if (poller_deadline == 0 || deadline < poller_deadline) {
    poller_deadline = deadline;
    transport.Wake();
  }
}

// --- the way out -----------------------------------------------------------------------------------------------------

DeviceCore::SendResult DeviceCore::SendBatch(const OutBatch& out) {
  std::vector<wire::OutDatagram> batch;
  batch.reserve(out.packets.size());
  uint64_t bytes = 0;
  for (auto& p : out.packets) {
    batch.push_back({p.dst, p.src_port, p.bytes});
    bytes += p.bytes.size();
  }
  size_t sent = 0;
  int attempts = 0;
  while (sent < batch.size() && attempts++ < 1000) {
    const int n = transport.Send(std::span(batch).subspan(sent));
    if (n < 0) break;
    sent += static_cast<size_t>(n);
  }
  return {sent, batch.size() - sent, bytes};
}

void DeviceCore::CountSent(const SendResult& r) {
  counters.tx_packets += r.sent;
  counters.tx_bytes += r.bytes;
  counters.tx_errors += r.failed;
}

void DeviceCore::TransmitNow(OutBatch& out) {
  if (out.packets.empty()) return;
  CountSent(SendBatch(out));
  out.packets.clear();
}

// --- memory ----------------------------------------------------------------------------------------------------------

WcStatus DeviceCore::Gather(const QueuePair& qp, const SendWr& wr, std::vector<uint8_t>& out) {
  out.clear();
  if (wr.flags & send_flags::kInline) {
    out = wr.inline_data;
    return WcStatus::kSuccess;
  }
  out.reserve(wr.TotalLength());
  for (const Sge& sge : wr.sg_list) {
    if (sge.length == 0) continue;
    AccessResult r = keys.CheckLocal(sge.lkey, qp.init().pd, sge.addr, sge.length, 0);
    if (!r.ok()) return WcStatus::kLocProtErr;
    out.insert(out.end(), r.host, r.host + sge.length);
  }
  return WcStatus::kSuccess;
}

bool DeviceCore::GatherRange(const QueuePair& qp, const SendWr& wr, uint64_t offset, uint64_t len,
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
    AccessResult r = keys.CheckLocal(sge.lkey, qp.init().pd, sge.addr + skip, n, 0);
    if (!r.ok()) return false;
    pieces.emplace_back(r.host, n);
    got += n;
    skip = 0;
  }
  return got == len;
}

WcStatus DeviceCore::Scatter(const QueuePair& qp, std::span<const Sge> sg_list, uint64_t offset,
                             std::span<const uint8_t> data) {
  size_t done = 0;
  uint64_t skip = offset;
  for (const Sge& sge : sg_list) {
    if (done == data.size()) break;
    if (skip >= sge.length) {
      skip -= sge.length;
      continue;
    }
    const size_t n = std::min<uint64_t>(sge.length - skip, data.size() - done);
    AccessResult r = keys.CheckLocal(sge.lkey, qp.init().pd, sge.addr + skip, n, access::kLocalWrite);
    if (!r.ok()) return WcStatus::kLocProtErr;
    std::memcpy(r.host, data.data() + done, n);
    done += n;
    skip = 0;
  }
  return done == data.size() ? WcStatus::kSuccess : WcStatus::kLocLenErr;
}

uint8_t* DeviceCore::WriteTarget(const QueuePair& qp, const InboundMessage& m, size_t len) {
  const AccessResult acc =
      keys.CheckRemote(m.write_rkey, qp.init().pd, m.write_va + m.offset, len, access::kRemoteWrite, qp.qpn());
  return acc.ok() ? acc.host : nullptr;
}

WcStatus DeviceCore::ExecuteLocalOp(const QueuePair& qp, const SendWr& wr) {
  if (wr.opcode == SendOpcode::kLocalInv) {
    // LOCAL_INV invalidates a type 2 window (regions are not invalidatable here: no fast-register MRs).
    return keys.InvalidateWindow(wr.invalidate_rkey, 0) == 0 ? WcStatus::kSuccess : WcStatus::kLocQpOpErr;
  }
  const SendWr::Bind& b = wr.bind;
  const MemoryWindow* w = keys.FindWindow(b.mw_rkey);
  if (w == nullptr) return WcStatus::kMwBindErr;
  // A type 2 window binds to the QP that executes the bind (IBTA 10.6.7.2.2).
  const uint32_t qpn = w->type == 2 ? qp.qpn() : 0;
  return keys.BindWindow(b.mw_rkey, b.new_rkey, qp.init().pd, b.mr_lkey, b.addr, b.length, b.access, qpn) == 0
             ? WcStatus::kSuccess
             : WcStatus::kMwBindErr;
}

// --- completions -----------------------------------------------------------------------------------------------------

Completion DeviceCore::SendCompletion(const QueuePair& qp, const SendWr& wr, WcStatus status) {
  Completion c;
  c.wr_id = wr.wr_id;
  c.status = status;
  c.qp_num = qp.qpn();
  // The message length, as rxe reports for every send-queue completion (mlx5 for READ and atomics, which need it).
  c.byte_len = static_cast<uint32_t>(wr.TotalLength());
  switch (wr.opcode) {
    case SendOpcode::kRdmaWrite:
    case SendOpcode::kRdmaWriteWithImm:
      c.opcode = WcOpcode::kRdmaWrite;
      break;
    case SendOpcode::kRdmaRead:
      c.opcode = WcOpcode::kRdmaRead;
      break;
    case SendOpcode::kAtomicCmpAndSwp:
      c.opcode = WcOpcode::kCompSwap;
      break;
    case SendOpcode::kAtomicFetchAndAdd:
      c.opcode = WcOpcode::kFetchAdd;
      break;
    case SendOpcode::kLocalInv:
      c.opcode = WcOpcode::kLocalInv;
      break;
    case SendOpcode::kBindMw:
      c.opcode = WcOpcode::kBindMw;
      break;
    default:
      c.opcode = WcOpcode::kSend;
  }
  return c;
}

void DeviceCore::CompleteSend(QueuePair& qp, const SendWr& wr, WcStatus status) {
  // Unsignaled WRs complete silently unless they fail (IBTA 10.7.2.1; ibv_post_send(3): "sq_sig_all").
  const bool signaled = qp.init().sq_sig_all || (wr.flags & send_flags::kSignaled);
  if (status == WcStatus::kSuccess && !signaled) return;
  Complete(qp.init().send_cq, SendCompletion(qp, wr, status));
}

Completion DeviceCore::ReceiveError(const QueuePair& qp, uint64_t wr_id, WcStatus status) {
  Completion c;
  c.wr_id = wr_id;
  c.status = status;
  c.opcode = WcOpcode::kRecv;
  c.qp_num = qp.qpn();
  return c;
}

Completion DeviceCore::MessageCompletion(const QueuePair& qp, uint64_t byte_len, const wire::PacketView& last) {
  Completion c;
  c.qp_num = qp.qpn();
  c.src_qp = qp.attributes().dest_qp_num;
  c.byte_len = static_cast<uint32_t>(byte_len);
  c.solicited = last.bth.solicited;  // SE on the last packet wakes a solicited-only CQ (IBTA 10.7.2.2)
  if (last.imm) {
    c.imm_data = last.imm->imm;
    c.wc_flags |= wc_flags::kWithImm;
  }
  if (last.ieth) {
    c.imm_data = last.ieth->rkey;  // ibv_wc.invalidated_rkey
    c.wc_flags |= wc_flags::kWithInv;
  }
  return c;
}

// --- the receive queue -----------------------------------------------------------------------------------------------

bool DeviceCore::HasReceiveWqe(QueuePair& qp) {
  SharedReceiveQueue* srq = qp.type() == QpType::kXrcRecv ? qp.packet_srq : qp.init().srq;
  if (qp.type() == QpType::kXrcRecv && srq == nullptr) return false;
  return srq != nullptr ? !srq->empty() : !qp.receive_queue().empty();
}

std::optional<RecvWr> DeviceCore::TakeReceiveWqe(QueuePair& qp) {
  SharedReceiveQueue* srq = qp.type() == QpType::kXrcRecv ? qp.packet_srq : qp.init().srq;
  if (srq != nullptr) {
    bool limit_reached = false;
    std::optional<RecvWr> wr = srq->Take(&limit_reached);
    if (limit_reached) Raise({AsyncEventType::kSrqLimitReached, nullptr, nullptr, 0, srq});
    return wr;
  }
  if (qp.type() == QpType::kXrcRecv) return std::nullopt;
  auto& rq = qp.receive_queue();
  if (rq.empty()) return std::nullopt;
  RecvWr wr = std::move(rq.front());
  rq.pop_front();
  return wr;
}

// --- the error state -------------------------------------------------------------------------------------------------

void DeviceCore::EnterError(QueuePair& qp) {
  QpAttributes& a = qp.mutable_attributes();
  if (a.qp_state == QpState::kErr) return;
  a.qp_state = a.cur_qp_state = QpState::kErr;
  qp.requester().Charge();
  Flush(qp);
}

void DeviceCore::Flush(QueuePair& qp) {
  // A QP that takes its WQEs from an SRQ consumes no more of them once in the error state: the consumer learns it may
  // detach with IBV_EVENT_QP_LAST_WQE_REACHED (IBTA 10.3.1 / 11.6.3.1; the SRQ's own WQEs are not flushed).
  if (qp.init().srq != nullptr || qp.type() == QpType::kXrcRecv)
    Raise({AsyncEventType::kQpLastWqeReached, &qp});
  // IBTA 10.3.1 / ibv_modify_qp(3): in the error state outstanding WRs complete with IBV_WC_WR_FLUSH_ERR.
  auto& rq = qp.receive_queue();
  for (const RecvWr& r : rq) {
    const Completion c = ReceiveError(qp, r.wr_id, WcStatus::kWrFlushErr);
    Complete(qp.init().recv_cq, c);
  }
  rq.clear();
  if (qp.inbound().rqe) {
    const Completion c = ReceiveError(qp, qp.inbound().rqe->wr_id, WcStatus::kWrFlushErr);
    Complete(qp.init().recv_cq, c);
  }
  qp.inbound() = InboundMessage{};
  qp.requester().Flush();  // send WQEs not yet completed (RC)
}

void DeviceCore::FailUnreliableSend(QueuePair& qp, const SendWr& wr, WcStatus status) {
  // A failed UD/UC send moves the send queue to SQE (IBTA 10.3.1.5); receives go on.
  CompleteSend(qp, wr, status);
  QpAttributes& a = qp.mutable_attributes();
  a.qp_state = a.cur_qp_state = QpState::kSqe;
}

}  // namespace uroce::emu
