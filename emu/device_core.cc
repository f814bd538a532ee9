// DeviceCore (device_core.h): what the transport objects of every QP share.
#include "emu/device_core.h"

#include "emu/host_memory.h"

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <type_traits>
#include <utility>

#include "emu/out_batch.h"
#include "emu/queue_pair.h"

namespace uroce::emu {
namespace {

// Every counter of DeviceCounters but the CM's, by name: adding a counter means one line here.
constexpr std::pair<const char*, uint64_t DeviceCounters::*> kCounterFields[] = {
    {"tx_packets", &DeviceCounters::tx_packets},
    {"tx_bytes", &DeviceCounters::tx_bytes},
    {"tx_errors", &DeviceCounters::tx_errors},
    {"rx_packets", &DeviceCounters::rx_packets},
    {"rx_bytes", &DeviceCounters::rx_bytes},
    {"rx_malformed", &DeviceCounters::rx_malformed},
    {"rx_icrc_errors", &DeviceCounters::rx_icrc_errors},
    {"rx_icrc_ip_id_inferred", &DeviceCounters::rx_icrc_ip_id_inferred},
    {"rx_icrc_vouched", &DeviceCounters::rx_icrc_vouched},
    {"rx_wrong_peer", &DeviceCounters::rx_wrong_peer},
    {"rx_unknown_qp", &DeviceCounters::rx_unknown_qp},
    {"rx_wrong_transport", &DeviceCounters::rx_wrong_transport},
    {"rx_bad_state", &DeviceCounters::rx_bad_state},
    {"rx_bad_pkey", &DeviceCounters::rx_bad_pkey},
    {"rx_bad_qkey", &DeviceCounters::rx_bad_qkey},
    {"rx_no_receive_wqe", &DeviceCounters::rx_no_receive_wqe},
    {"rx_out_of_sequence", &DeviceCounters::rx_out_of_sequence},
    {"rx_remote_access_denied", &DeviceCounters::rx_remote_access_denied},
    {"rx_length_errors", &DeviceCounters::rx_length_errors},
    {"rx_cnp", &DeviceCounters::rx_cnp},
    {"tx_cnp", &DeviceCounters::tx_cnp},
    {"unreliable_sends_held", &DeviceCounters::unreliable_sends_held},
    {"cq_overflows", &DeviceCounters::cq_overflows},
    {"rc_retransmit_timeouts", &DeviceCounters::rc_retransmit_timeouts},
    {"rc_early_retransmits", &DeviceCounters::rc_early_retransmits},
    {"rc_tail_probes", &DeviceCounters::rc_tail_probes},
    {"rc_duplicates", &DeviceCounters::rc_duplicates},
    {"rc_invalid_requests", &DeviceCounters::rc_invalid_requests},
    {"rc_unexpected_responses", &DeviceCounters::rc_unexpected_responses},
    {"rc_rnr_naks_sent", &DeviceCounters::rc_rnr_naks_sent},
    {"rc_path_waits", &DeviceCounters::rc_path_waits},
    {"rc_congestion_signals", &DeviceCounters::rc_congestion_signals},
    {"rc_direct_writes", &DeviceCounters::rc_direct_writes},
    {"rc_direct_reads", &DeviceCounters::rc_direct_reads},
    {"rc_direct_sends", &DeviceCounters::rc_direct_sends},
    {"rc_direct_sends_received", &DeviceCounters::rc_direct_sends_received},
    {"rc_direct_sends_dropped", &DeviceCounters::rc_direct_sends_dropped},
    {"xrc_pieces_handed", &DeviceCounters::xrc_pieces_handed},
    {"xrc_pieces_received", &DeviceCounters::xrc_pieces_received},
    {"xrc_pieces_dropped", &DeviceCounters::xrc_pieces_dropped},
    {"xrc_targets_adopted", &DeviceCounters::xrc_targets_adopted},
};

}  // namespace

std::string FormatCounters(const DeviceCounters& c) {
  static constexpr std::pair<const char*, uint64_t CmCounters::*> kCmFields[] = {
      {"cm_mads_sent", &CmCounters::mads_sent},
      {"cm_mads_received", &CmCounters::mads_received},
      {"cm_retransmits", &CmCounters::retransmits},
      {"cm_duplicates", &CmCounters::duplicates},
      {"cm_dropped_malformed", &CmCounters::dropped_malformed},
      {"cm_dropped_unmatched", &CmCounters::dropped_unmatched},
      {"cm_rejected_no_listener", &CmCounters::rejected_no_listener},
  };
  std::string out;
  for (const auto& [name, field] : kCounterFields) out += std::string(name) + " " + std::to_string(c.*field) + "\n";
  for (const auto& [name, field] : kCmFields) out += std::string(name) + " " + std::to_string(c.cm.*field) + "\n";
  return out;
}

std::string Hex24(uint32_t value) {
  char text[12];
  std::snprintf(text, sizeof text, "0x%06x", value & 0xffffff);
  return text;
}

void DeviceCore::Trace(std::string_view line) const {
  config.trace(config.address.ToString() + " " + std::string(line));
}


PathWindow& DeviceCore::PathOfLocked(const QueuePair& qp) { return paths_[qp.peer().addr]; }

DeviceCounters DeviceCore::Counters() const {
  DeviceCounters c;
  for (const auto& [name, field] : kCounterFields)
    c.*field = std::atomic_ref<uint64_t>(const_cast<uint64_t&>(counters_.*field)).load(std::memory_order_relaxed);
  return c;
}

void DeviceCore::NoteAckHeld(uint32_t qpn, uint64_t due_ns) {
  MutexLock lock(acks_mu_);
  auto it = std::find_if(acks_held_.begin(), acks_held_.end(), [&](const HeldAck& h) { return h.qpn == qpn; });
  if (it == acks_held_.end()) {
    acks_held_.push_back({qpn, due_ns});
  } else {
    it->due_ns = std::min(it->due_ns, due_ns);
  }
  const uint64_t next = next_held_ack_due_ns.load(std::memory_order_relaxed);
  if (next == 0 || due_ns < next) next_held_ack_due_ns.store(due_ns, std::memory_order_relaxed);
}

void DeviceCore::ForgetAckHeld(uint32_t qpn) {
  MutexLock lock(acks_mu_);
  auto it = std::find_if(acks_held_.begin(), acks_held_.end(), [&](const HeldAck& h) { return h.qpn == qpn; });
  if (it != acks_held_.end()) acks_held_.erase(it);
}

void DeviceCore::Complete(CompletionQueue* cq, const Completion& c) {
  if (cq == nullptr) return;  // an XRC QP has no CQ for the direction it does not have
  Completion stamped = c;
  if (cq->timestamps) stamped.timestamp_ns = Now();
  if (!cq->Push(stamped)) {
    Count(&DeviceCounters::cq_overflows);
    Raise({AsyncEventType::kCqErr, nullptr, cq});
  }
}

void DeviceCore::ListTimed(uint32_t qpn) {
  MutexLock lock(timers_mu_);
  timed_qps_.push_back(qpn);
}

void DeviceCore::WakeForTimer(uint64_t deadline) {
  // The progress thread may be blocked until a later deadline.
  {
    MutexLock lock(timers_mu_);
    if (poller_deadline_ != 0 && deadline >= poller_deadline_) return;
    poller_deadline_ = deadline;
  }
  transport.Wake();
}

// --- the way out -----------------------------------------------------------------------------------------------------

DeviceCore::SendResult DeviceCore::SendBatch(const OutBatch& out) {
  // A few datagrams (a ping-pong's request and ACK) are described on the stack; a burst in a vector.
  constexpr size_t kOnStack = 8;
  const size_t n = out.packets.size();
  std::array<wire::OutDatagram, kOnStack> on_stack;
  std::vector<wire::OutDatagram> on_heap(n > kOnStack ? n : 0);
  const std::span<wire::OutDatagram> batch =
      n > kOnStack ? std::span<wire::OutDatagram>(on_heap) : std::span<wire::OutDatagram>(on_stack.data(), n);
  uint64_t bytes = 0;
  for (size_t i = 0; i < n; ++i) {
    const auto& p = out.packets[i];
    batch[i] = p.Datagram();
    bytes += p.bytes.size();
  }
  size_t sent = 0;
  int attempts = 0;
  while (sent < batch.size() && attempts++ < 1000) {
    const int n = transport.Send(std::span<const wire::OutDatagram>(batch).subspan(sent));
    if (n < 0) break;
    sent += static_cast<size_t>(n);
  }
  return {sent, batch.size() - sent, bytes};
}

void DeviceCore::CountSent(const SendResult& r) {
  Count(&DeviceCounters::tx_packets, r.sent);
  Count(&DeviceCounters::tx_bytes, r.bytes);
  Count(&DeviceCounters::tx_errors, r.failed);
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
  ReaderLock lock(keys_mu_);
  for (const Sge& sge : wr.sg_list) {
    if (sge.length == 0) continue;
    AccessResult r = keys_.CheckLocal(sge.lkey, qp.init().pd, sge.addr, sge.length, 0);
    if (!r.ok()) return WcStatus::kLocProtErr;
    const size_t at = out.size();
    out.resize(at + sge.length);
    if (!ReadRegion(r, out.data() + at, sge.length)) return WcStatus::kLocProtErr;  // unmapped since
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
  // An imported region's bytes are copied here first (ForeignMemory); the pieces are consumed before this thread
  // gathers again.
  static thread_local std::vector<uint8_t> bounce;
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
    const uint8_t* at = r.host;
    if (r.foreign != nullptr) {
      if (bounce.size() < len) bounce.resize(len);  // sized once per call: earlier pieces stay where they are
      if (!ReadRegion(r, bounce.data() + got, n)) return false;
      at = bounce.data() + got;
    }
    pieces.emplace_back(at, n);
    got += n;
    skip = 0;
  }
  return got == len;
}

bool DeviceCore::ScatterRange(const QueuePair& qp, std::span<const Sge> sg_list, uint64_t len,
                              std::vector<std::span<uint8_t>>& pieces) {
  pieces.clear();
  uint64_t got = 0;
  for (const Sge& sge : sg_list) {
    if (got == len) break;
    const uint64_t n = std::min<uint64_t>(sge.length, len - got);
    AccessResult r = keys_.CheckLocal(sge.lkey, qp.init().pd, sge.addr, n, access::kLocalWrite);
    if (!r.ok() || r.foreign != nullptr) return false;  // an imported region's memory is not ours to hand out
    pieces.emplace_back(r.host, n);
    got += n;
  }
  return got == len;
}

WcStatus DeviceCore::Scatter(const QueuePair& qp, std::span<const Sge> sg_list, uint64_t offset,
                             std::span<const uint8_t> data) {
  return Scatter(qp.init().pd, sg_list, offset, data);
}

WcStatus DeviceCore::Scatter(const ProtectionDomain* pd, std::span<const Sge> sg_list, uint64_t offset,
                             std::span<const uint8_t> data) {
  ReaderLock lock(keys_mu_);
  size_t done = 0;
  uint64_t skip = offset;
  for (const Sge& sge : sg_list) {
    if (done == data.size()) break;
    if (skip >= sge.length) {
      skip -= sge.length;
      continue;
    }
    const size_t n = std::min<uint64_t>(sge.length - skip, data.size() - done);
    AccessResult r = keys_.CheckLocal(sge.lkey, pd, sge.addr + skip, n, access::kLocalWrite);
    if (!r.ok() || !WriteRegion(r, data.data() + done, n)) return WcStatus::kLocProtErr;
    done += n;
    skip = 0;
  }
  return done == data.size() ? WcStatus::kSuccess : WcStatus::kLocLenErr;
}

bool DeviceCore::MayAccessRemote(const QueuePair& qp, uint32_t rkey, uint64_t va, uint64_t len, uint32_t access) {
  ReaderLock lock(keys_mu_);
  return keys_.CheckRemote(rkey, qp.init().pd, va, len, access, qp.qpn()).ok();
}

bool DeviceCore::WriteInbound(const QueuePair& qp, const InboundMessage& m, std::span<const uint8_t> payload) {
  const AccessResult acc = keys_.CheckRemote(m.write_rkey, qp.init().pd, m.write_va + m.offset, payload.size(),
                                             access::kRemoteWrite, qp.qpn());
  return acc.ok() && WriteRegion(acc, payload.data(), payload.size());
}

WcStatus DeviceCore::ExecuteLocalOp(const QueuePair& qp, const SendWr& wr) {
  WriterLock lock(keys_mu_);
  if (wr.opcode == SendOpcode::kLocalInv) {
    // LOCAL_INV invalidates a type 2 window (regions are not invalidatable here: no fast-register MRs).
    return keys_.InvalidateWindow(wr.invalidate_rkey, 0) == 0 ? WcStatus::kSuccess : WcStatus::kLocQpOpErr;
  }
  const SendWr::Bind& b = wr.bind;
  const MemoryWindow* w = keys_.FindWindow(b.mw_rkey);
  if (w == nullptr) return WcStatus::kMwBindErr;
  // A type 2 window binds to the QP that executes the bind (IBTA 10.6.7.2.2).
  const uint32_t qpn = w->type == 2 ? qp.qpn() : 0;
  return keys_.BindWindow(b.mw_rkey, b.new_rkey, qp.init().pd, b.mr_lkey, b.addr, b.length, b.access, qpn) == 0
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
  const SendOpcodeInfo* info = FindSendOpcode(wr.opcode);
  c.opcode = info ? info->completion : WcOpcode::kSend;
  return c;
}

void DeviceCore::CompleteSend(QueuePair& qp, const SendWr& wr, WcStatus status) {
  // Unsignaled WRs complete silently unless they fail (IBTA 10.7.2.1; ibv_post_send(3): "sq_sig_all").
  const bool signaled = qp.init().sq_sig_all || (wr.flags & send_flags::kSignaled);
  if (status == WcStatus::kSuccess && !signaled) return;
  Complete(qp.init().send_cq, SendCompletion(qp, wr, status));
}

Completion DeviceCore::ReceiveError(const QueuePair& qp, uint64_t wr_id, WcStatus status) {
  return ReceiveError(qp.qpn(), wr_id, status);
}

Completion DeviceCore::ReceiveError(uint32_t qp_num, uint64_t wr_id, WcStatus status) {
  Completion c;
  c.wr_id = wr_id;
  c.status = status;
  c.opcode = WcOpcode::kRecv;
  c.qp_num = qp_num;
  return c;
}

Completion DeviceCore::MessageCompletion(const QueuePair& qp, uint64_t byte_len, bool solicited,
                                         std::optional<uint32_t> imm) {
  return MessageCompletion(qp.qpn(), qp.attributes().dest_qp_num, byte_len, solicited, imm);
}

Completion DeviceCore::MessageCompletion(uint32_t qp_num, uint32_t src_qp, uint64_t byte_len, bool solicited,
                                         std::optional<uint32_t> imm) {
  Completion c;
  c.qp_num = qp_num;
  c.src_qp = src_qp;
  c.byte_len = static_cast<uint32_t>(byte_len);
  c.solicited = solicited;
  if (imm) {
    c.imm_data = *imm;
    c.wc_flags |= wc_flags::kWithImm;
  }
  return c;
}

Completion DeviceCore::MessageCompletion(const QueuePair& qp, uint64_t byte_len, const wire::PacketView& last) {
  // SE on the last packet wakes a solicited-only CQ (IBTA 10.7.2.2).
  Completion c = MessageCompletion(qp, byte_len, last.bth.solicited,
                                   last.imm ? std::optional<uint32_t>(last.imm->imm) : std::nullopt);
  if (last.ieth) {
    c.imm_data = last.ieth->rkey;  // ibv_wc.invalidated_rkey
    c.wc_flags |= wc_flags::kWithInv;
  }
  return c;
}

// --- the receive queue -----------------------------------------------------------------------------------------------

namespace {

// The SRQ `qp` takes receive WQEs from: an XRC target's is the one the request being processed names, another QP's
// the one it was created on; nullptr for a QP with a receive queue of its own (or an XRC target outside a request).
SharedReceiveQueue* ReceiveSrqOf(const QueuePair& qp) {
  return qp.type() == QpType::kXrcRecv ? qp.packet_srq : qp.init().srq;
}

}  // namespace

bool DeviceCore::HasReceiveWqe(QueuePair& qp) {
  if (qp.packet_remote_srqn != 0) return true;  // its claim decides (TakeReceiveWqe)
  SharedReceiveQueue* srq = ReceiveSrqOf(qp);
  if (qp.type() == QpType::kXrcRecv && srq == nullptr) return false;
  return srq != nullptr ? !srq->empty() : !qp.receive_queue().empty();
}

std::optional<RecvWr> DeviceCore::TakeReceiveWqe(QueuePair& qp) {
  if (qp.packet_remote_srqn != 0) {
    // Another process's SRQ: a claimed WQE, which that process takes when the message's first piece reaches it.
    InboundMessage& m = qp.inbound();
    if (!config.shared_xrc->ClaimXrcWqe(qp.packet_remote_srqn, &m.relay_index, &m.relay_length)) return std::nullopt;
    m.relay_srqn = qp.packet_remote_srqn;
    return RecvWr{};
  }
  SharedReceiveQueue* srq = ReceiveSrqOf(qp);
  if (srq != nullptr) {
    bool limit_reached = false;
    std::optional<RecvWr> wr;
    if (srq->shared) {
      // Other processes' target QPs claim from a shared SRQ too: we take the WQE our own claim names.
      uint64_t index = 0;
      uint32_t length = 0;
      if (!config.shared_xrc->ClaimXrcWqe(srq->srqn(), &index, &length)) return std::nullopt;
      wr = srq->TakeAt(index, &limit_reached);
      ShowSharedWqes(*srq);
    } else {
      wr = srq->Take(&limit_reached);
    }
    if (limit_reached) Raise({AsyncEventType::kSrqLimitReached, nullptr, nullptr, 0, srq});
    return wr;
  }
  if (qp.type() == QpType::kXrcRecv) return std::nullopt;
  auto& rq = qp.receive_queue();
  if (rq.empty()) return std::nullopt;
  RecvWr wr = std::move(rq.front());
  rq.pop_front();
  if (qp.direct_receives().open) {
    ++qp.direct_receives().packets_taken;
    PublishReceives(qp);
  }
  return wr;
}

void DeviceCore::ShowSharedWqes(SharedReceiveQueue& srq) {
  const uint32_t srqn = srq.srqn();
  srq.ShowWindow(config.shared_xrc->XrcWqesClaimed(srqn), wire::kSrqWindow,
                 [&](uint64_t first, std::span<const uint32_t> lengths) {
                   config.shared_xrc->ShowXrcWqes(srqn, first, lengths);
                 });
}

void DeviceCore::AbandonHandedMessage(QueuePair& qp, WcStatus status) {
  InboundMessage& m = qp.inbound();
  wire::XrcDelivery abort;
  abort.srqn = m.relay_srqn;
  abort.target_qpn = qp.qpn();
  abort.index = m.relay_index;
  abort.abort = true;
  abort.status = static_cast<uint8_t>(status);
  // With that process's ring full the WQE stays claimed there, unused: rare (a ring holds megabytes), and nothing
  // that process's programs wait for is lost but one receive buffer.
  config.shared_xrc->DeliverXrc(abort, {});
  m = InboundMessage{};
}

void DeviceCore::KeepSrqWqe(QueuePair& qp, RecvWr&& wr) {
  if (qp.init().srq == nullptr || qp.init().recv_cq == nullptr) return;
  auto& kept = qp.srq_completed();
  kept.push_back(std::move(wr));
  // No more of its completions can be in the CQ than the CQ holds now.
  const size_t in_cq = qp.init().recv_cq->depth();
  while (kept.size() > in_cq) kept.pop_front();
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
  PublishDirect(qp);  // the error state executes nothing more (IBTA 10.3.1)
  // A QP that takes its WQEs from an SRQ consumes no more of them once in the error state: the consumer learns it may
  // detach with IBV_EVENT_QP_LAST_WQE_REACHED (IBTA 10.3.1 / 11.6.3.1; the SRQ's own WQEs are not flushed).
  if (qp.init().srq != nullptr || qp.type() == QpType::kXrcRecv)
    Raise({AsyncEventType::kQpLastWqeReached, &qp});
  DirectReceives& w = qp.direct_receives();
  // Direct SENDs their initiators saw succeed may still be in our ring (the withdrawal above waited until no
  // initiator checks against the QP, so the count is final): they complete first, in order, as the ACKed
  // messages they stand for would have, and the flush of the receive side follows them (Device::ReceiveDirectSend).
  if (w.open && !w.flush_waiting) {
    const uint64_t counted = config.direct->DirectSends(qp.qpn());
    if (counted > w.direct_taken) {
      w.flush_waiting = true;
      w.flush_after = counted;
      w.flush_deadline_ns = Now() + uint64_t(double(kDirectFlushWaitNs) * config.time_scale);
      {
        MutexLock lock(timers_mu_);
        flush_waiting_qps_.push_back(qp.qpn());
      }
      WakeForTimer(w.flush_deadline_ns);
    }
  }
  if (!w.flush_waiting) FlushReceiveQueue(qp);
  qp.requester().Flush();  // send WQEs not yet completed (RC)
  for (const HeldSend& h : qp.held_sends()) CompleteSend(qp, h.wr, WcStatus::kWrFlushErr);  // UC/UD, paused
  qp.held_sends().clear();
}

void DeviceCore::FlushReceiveQueue(QueuePair& qp) {
  // IBTA 10.3.1 / ibv_modify_qp(3): in the error state outstanding WRs complete with IBV_WC_WR_FLUSH_ERR, in the
  // order they were posted: the WQE of the message being received left the head of the queue before the others.
  if (qp.inbound().relay_srqn != 0) {
    AbandonHandedMessage(qp, WcStatus::kWrFlushErr);  // the WQE is another process's: flushed there
  } else if (qp.inbound().rqe) {
    const Completion c = ReceiveError(qp, qp.inbound().rqe->wr_id, WcStatus::kWrFlushErr);
    Complete(qp.init().recv_cq, c);
    KeepSrqWqe(qp, std::move(*qp.inbound().rqe));
  }
  qp.inbound() = InboundMessage{};
  auto& rq = qp.receive_queue();
  for (const RecvWr& r : rq) {
    const Completion c = ReceiveError(qp, r.wr_id, WcStatus::kWrFlushErr);
    Complete(qp.init().recv_cq, c);
  }
  rq.clear();
}

bool DeviceCore::HoldUnreliableSend(QueuePair& qp, SendWr& wr, const wire::IpAddress& peer, int* err) {
  *err = 0;
  auto& held = qp.held_sends();
  if (held.empty()) {
    const uint64_t at = UnreliableSendAt(peer);
    if (at <= Now()) return false;
    WakeForTimer(at);
  }
  if (held.size() >= qp.attributes().cap.max_send_wr) {
    *err = ENOMEM;  // the send queue is full (ibv_post_send(3))
    return true;
  }
  if (held.empty()) {
    MutexLock lock(timers_mu_);
    held_qps_.push_back(qp.qpn());
  }
  held.push_back({std::move(wr), peer});
  Count(&DeviceCounters::unreliable_sends_held);
  return true;
}

uint64_t DeviceCore::UnreliableSendAt(const wire::IpAddress& peer) {
  MutexLock lock(paths_mu_);
  auto it = paths_.find(peer);
  return it == paths_.end() ? 0 : it->second.UnreliableSendAt(Now());
}

void DeviceCore::ChargeUnreliable(const wire::IpAddress& peer, uint64_t bytes) {
  MutexLock lock(paths_mu_);
  if (auto it = paths_.find(peer); it != paths_.end()) it->second.ChargeUnreliable(bytes, Now());
}

void DeviceCore::FailUnreliableSend(QueuePair& qp, const SendWr& wr, WcStatus status) {
  // A failed UD/UC send moves the send queue to SQE (IBTA 10.3.1.5); receives go on.
  CompleteSend(qp, wr, status);
  QpAttributes& a = qp.mutable_attributes();
  a.qp_state = a.cur_qp_state = QpState::kSqe;
}

namespace {

// The remote rights of emu access flags, as a direct-access table holds them (atomics are never direct).
uint32_t DirectRights(uint32_t access_flags) {
  return ((access_flags & access::kRemoteWrite) ? wire::direct_rights::kWrite : 0) |
         ((access_flags & access::kRemoteRead) ? wire::direct_rights::kRead : 0);
}

}  // namespace

void DeviceCore::Raise(const AsyncEvent& e) {
  if (async_handler) async_handler(e);
  // ibv_open_qp(3): every handle on a shared XRC target QP gets its events, those of other processes too.
  if (e.qp != nullptr && SharesTarget(*e.qp)) {
    config.shared_xrc->TellXrcTargetHolders(e.qp->qpn(), static_cast<uint8_t>(e.type));
  }
}

bool DeviceCore::SharesTarget(const QueuePair& qp) const {
  return qp.type() == QpType::kXrcRecv && config.shared_xrc != nullptr && config.owner != 0 &&
         qp.init().xrcd != nullptr && qp.init().xrcd->inode().has_value() && !qp.runs_elsewhere;
}

void DeviceCore::PublishTargetState(QueuePair& qp, bool pending, const uint64_t* holders) {
  static_assert(std::is_trivially_copyable_v<SharedTargetState> &&
                sizeof(SharedTargetState) <= wire::kTargetAttributeBytes);
  SharedTargetState t;
  t.attributes = qp.attributes();
  t.msn = qp.responder().state().msn;
  t.pending = pending;
  const InboundMessage& m = qp.inbound();
  if (m.relay_srqn != 0) {
    // A message into our own SRQ is not published: that SRQ goes with us.
    t.in_message = m.kind == InboundMessage::Kind::kSend;
    t.relay_srqn = m.relay_srqn;
    t.relay_length = m.relay_length;
    t.relay_index = m.relay_index;
    t.offset = m.offset;
  }
  config.shared_xrc->PublishXrcTarget(qp.qpn(), *qp.init().xrcd->inode(),
                                      {reinterpret_cast<const uint8_t*>(&t), sizeof t}, holders);
}

void DeviceCore::PublishDirect(QueuePair& qp, bool gone) {
  if (SharesTarget(qp)) {
    if (gone) {
      config.shared_xrc->WithdrawXrcTarget(qp.qpn());
    } else {
      PublishTargetState(qp, /*pending=*/false);
    }
    return;
  }
  if (config.direct == nullptr || qp.type() != QpType::kRc) return;
  const QpAttributes& a = qp.attributes();
  const QpState s = a.qp_state;
  DirectReceives& w = qp.direct_receives();
  // A responder executes requests in RTR, RTS and SQD (IBTA 10.3.1); an RDMA READ needs responder resources.
  uint32_t rights = DirectRights(a.qp_access_flags);
  if (a.max_dest_rd_atomic == 0) rights &= ~wire::direct_rights::kRead;
  if (qp.init().srq == nullptr) rights |= wire::direct_rights::kSend;
  if (gone || rights == 0 || (s != QpState::kRtr && s != QpState::kRts && s != QpState::kSqd)) {
    config.direct->WithdrawQp(qp.qpn());
    // The window outlives the error state (Flush counts what was sent into it), not RESET or the QP itself.
    if (w.open && (gone || s == QpState::kReset)) {
      config.direct->CloseReceives(qp.qpn());
      w = DirectReceives{};
    }
    return;
  }
  if ((rights & wire::direct_rights::kSend) && !w.open) {
    w = DirectReceives{};
    w.open = true;
    w.epoch = direct_epochs_.fetch_add(1, std::memory_order_relaxed) + 1;
    config.direct->OpenReceives(qp.qpn(), w.epoch);
    PublishReceives(qp);
  }
  config.direct->PublishQp({qp.qpn(), a.dest_qp_num, qp.init().pd->handle(), rights});
}

void DeviceCore::PublishReceives(QueuePair& qp) {
  DirectReceives& w = qp.direct_receives();
  if (!w.open) return;
  const auto& rq = qp.receive_queue();
  const uint64_t front = w.packets_taken + w.direct_taken;
  const uint64_t end = front + std::min<uint64_t>(rq.size(), wire::kReceiveWindow);
  uint64_t first = std::max(w.published, front);
  uint32_t lengths[wire::kReceiveWindow];
  size_t n = 0;
  for (uint64_t i = first; i < end; ++i)
    lengths[n++] = uint32_t(std::min<uint64_t>(rq[i - front].TotalLength(), UINT32_MAX));
  config.direct->PublishReceives(qp.qpn(), w.packets_taken, first, {lengths, n});
  w.published = std::max(w.published, end);
}

void DeviceCore::PublishRegion(const MemoryRegion& mr) {
  if (mr.implicit || mr.foreign) return;  // (an imported region is its own process's to publish)
  const auto host = reinterpret_cast<uint64_t>(mr.host);
  if (config.exports != nullptr) {
    config.exports->ExportRegion({mr.lkey, mr.pd->handle(), mr.access, mr.iova, mr.length, host});
  }
  const uint32_t rights = DirectRights(mr.access);
  if (config.direct != nullptr && rights != 0) {
    config.direct->PublishRegion({mr.rkey, mr.pd->handle(), rights, mr.iova, mr.length, mr.host});
  }
}

void DeviceCore::WithdrawRegion(const MemoryRegion& mr) {
  if (config.exports != nullptr) config.exports->WithdrawExportedRegion(mr.lkey);
  if (config.direct != nullptr) config.direct->WithdrawRegion(mr.rkey);
}

}  // namespace uroce::emu
