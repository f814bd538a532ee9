// The Device's shared receive queues and XRC (IBTA Annex A14): SRQ and XRC domain objects, which receive queue a QP
// takes its WQEs from, and the XRC target, which is an RC responder whose PD, CQ and WQEs come per request from the
// SRQ the XRCETH names.
#include <algorithm>
#include <cerrno>
#include <mutex>
#include <shared_mutex>
#include <type_traits>

#include "emu/device.h"
#include "emu/out_batch.h"
#include "wire/headers.h"
#include "wire/opcode.h"
#include "wire/service_protocol.h"

namespace uroce::emu {

// --- QPs on SRQs ------------------------------------------------------------------------------------------------

int Device::CheckSharedReceiveInit(QpInitAttributes& init) {
  // ibv_create_qp(3) NOTES: only RC and UD QPs may be created on an SRQ (an XRC target names its SRQ per message).
  if (init.srq != nullptr && init.type != QpType::kRc && init.type != QpType::kUd) return EINVAL;
  // ... and such a QP ignores max_recv_wr and max_recv_sge, as does every XRC QP (it has no receive queue).
  if (init.srq != nullptr || init.type == QpType::kXrcSend || init.type == QpType::kXrcRecv)
    init.cap.max_recv_wr = init.cap.max_recv_sge = 0;
  switch (init.type) {
    case QpType::kXrcRecv:
      // ibv_create_qp_ex(3): a target QP belongs to an XRC domain and has no PD, CQs or work queues of its own.
      if (init.xrcd == nullptr) return EINVAL;
      init.pd = nullptr;
      init.send_cq = init.recv_cq = nullptr;
      init.cap = QpCapabilities{};
      break;
    case QpType::kXrcSend:
      // An initiator has a send queue only (Annex A14).
      if (init.pd == nullptr || init.send_cq == nullptr) return EINVAL;
      init.recv_cq = nullptr;
      init.xrcd = nullptr;
      break;
    default:
      init.xrcd = nullptr;
  }
  return 0;
}

int Device::AttachSharedReceiveLocked(const QpInitAttributes& init) {
  if (init.xrcd != nullptr && xrcds_.count(init.xrcd) == 0) return EINVAL;
  if (init.srq != nullptr) {
    SharedReceiveQueue* found = nullptr;
    for (auto& [_, srq] : srqs_)
      if (srq.get() == init.srq) found = srq.get();
    if (found == nullptr || found->type() != SrqType::kBasic) return EINVAL;  // an XRC SRQ serves XRC targets only
    ++found->users;
  }
  return 0;
}

void Device::DetachSharedReceiveLocked(const QpInitAttributes& init) {
  if (init.srq != nullptr) --init.srq->users;
}

// --- XRC on the wire ----------------------------------------------------------------------------------------------

void ToQpTransport(const QueuePair& qp, const SendWr* wr, wire::PacketSpec& spec) {
  if (qp.type() != QpType::kXrcSend && qp.type() != QpType::kXrcRecv) return;
  // Annex A14: XRC has RC's operations under transport code 101 (0xA0 | the RC opcode's low 5 bits), responses
  // included; every request carries the XRCETH naming the SRQ at the target.
  spec.bth.opcode = wire::opcode::kXrcBase | (spec.bth.opcode & 0x1f);
  if (wr != nullptr) spec.xrc = wire::XrcEth{0, wr->remote_srqn & 0xffffff};
}

void Device::ReceiveXrcTargetLocked(QueuePair* qp, const wire::PacketView& p, OutBatch& out) {
  ExecuteXrcTargetLocked(qp, p, out);
  if (qp->resend_pending && PsnDiff(qp->attributes().rq_psn, qp->resend_psn) > 0) qp->resend_pending = false;
  // Its state as it is now, for a process that may take the QP over (wire/direct_access.h).
  if (core_.SharesTarget(*qp)) core_.PublishTargetState(*qp, /*pending=*/false);
}

void Device::ExecuteXrcTargetLocked(QueuePair* qp, const wire::PacketView& p, OutBatch& out) {
  if (!p.info->is_request || !p.xrc) {
    core_.Count(&DeviceCounters::rx_wrong_transport);  // a target only responds; responses to it make no sense
    return;
  }
  // The PSN is judged first, as for any RC request (rxe's responder: check_psn before check_resource), so that no
  // packet outside the window can put the target in the error state (a forged one with a random PSN and a wrong SRQ
  // number did): a gap gets the responder's sequence NAK without its SRQ being looked at, and a duplicate naming
  // no valid SRQ is dropped.
  const int32_t d = PsnDiff(p.bth.psn, qp->attributes().rq_psn);
  if (d > 0) {
    qp->responder().OnRequest(p, out);
    return;
  }
  SharedReceiveQueue* srq = nullptr;
  if (auto it = srqs_.find(p.xrc->srqn); it != srqs_.end()) srq = it->second.get();
  if (srq == nullptr && MayBeSharedXrcSrq(*qp, p.xrc->srqn)) {
    // Another process's SRQ of the domain we share with it: the target keeps the protocol and hands the message
    // over (RcResponder::HandSend). Until that process can be asked (-EAGAIN) no WQE of it can be claimed, and the
    // request is not ready (RNR NAK) rather than refused. A SEND's bytes only: what WRITE, READ and atomics would
    // reach is that process's memory, under its SRQ's PD, which this process cannot check (refused as a remote
    // access error; README).
    if (d == 0 && p.info->op != wire::Operation::kSend) {
      core_.Count(&DeviceCounters::rx_remote_access_denied);
      qp->responder().FatalNak(wire::NakCode::kRemoteAccessError, out);
      return;
    }
    qp->packet_remote_srqn = p.xrc->srqn;
    qp->responder().OnRequest(p, out);
    qp->packet_remote_srqn = 0;
    return;
  }
  if (srq == nullptr || srq->type() != SrqType::kXrc || srq->xrcd() != qp->init().xrcd) {
    if (d < 0) {
      core_.Count(&DeviceCounters::rc_duplicates);
      return;
    }
    // Annex A14: a request naming an SRQ that is not an XRC SRQ of the target's domain is an invalid request: NAK it,
    // and the target QP enters the error state as for any invalid request (IBTA 9.7.5.2.4).
    core_.Count(&DeviceCounters::rx_remote_access_denied);
    qp->responder().FatalNak(wire::NakCode::kInvalidRequest, out);
    return;
  }
  // The target executes the request as an RC responder would, with the PD (memory checks), CQ (completions, with the
  // target QP's number) and WQEs of that SRQ.
  QpInitAttributes& init = qp->mutable_init();
  init.pd = srq->pd();
  init.recv_cq = srq->cq();
  qp->packet_srq = srq;
  qp->responder().OnRequest(p, out);
  init.pd = nullptr;
  init.recv_cq = nullptr;
  qp->packet_srq = nullptr;
}

bool Device::MayBeSharedXrcSrq(const QueuePair& target, uint32_t srqn) const {
  const std::optional<uint64_t>& file = target.init().xrcd->inode();
  if (core_.config.shared_xrc == nullptr || !file || wire::OwnerOf24(srqn) == core_.config.owner) return false;
  return core_.config.shared_xrc->XrcSrqInDomain(srqn, *file) != 0;  // yes, or not known yet (-EAGAIN)
}

void Device::ReceiveXrcTargetEventLocked(const wire::InDatagram& d) {
  const std::optional<wire::XrcTargetEvent> e = wire::XrcTargetEvent::Decode(d.payload);
  if (!e) return;
  // Only what a QP raises (ibv_get_async_event(3): the events whose element is a QP).
  const auto type = static_cast<AsyncEventType>(e->event);
  if (ElementOf(type) != EventElement::kQp) return;
  auto it = opened_targets_.find(e->qpn);
  if (it == opened_targets_.end() || it->second->gone_elsewhere) return;  // not held here (any more)
  core_.Raise({type, it->second.get()});
}

void Device::ReceiveXrcDeliveryLocked(const wire::InDatagram& d) {
  const std::optional<wire::XrcDelivery> h = wire::XrcDelivery::Decode(d.payload);
  SharedReceiveQueue* srq = nullptr;
  if (h) {
    if (auto it = srqs_.find(h->srqn); it != srqs_.end() && it->second->shared) srq = it->second.get();
  }
  if (srq == nullptr) {
    core_.Count(&DeviceCounters::xrc_pieces_dropped);  // destroyed since (its WQEs with it), or not one
    return;
  }
  core_.Count(&DeviceCounters::xrc_pieces_received);
  const std::span<const uint8_t> bytes = d.payload.subspan(wire::XrcDelivery::kSize);
  auto take = [&]() {
    bool limit_reached = false;
    std::optional<RecvWr> wr = srq->TakeAt(h->index, &limit_reached);  // the one the target claimed
    if (limit_reached) core_.Raise({AsyncEventType::kSrqLimitReached, nullptr, nullptr, 0, srq});
    core_.ShowSharedWqes(*srq);
    return wr;
  };
  MutexLock lock(xrc_inbound_mu_);
  const uint64_t key = uint64_t{h->srqn} << 32 | h->target_qpn;
  auto it = xrc_inbound_.find(key);
  if (h->abort) {
    xrc_last_psn_.erase(h->target_qpn);
    // The target abandoned the message (its QP left RTR/RTS, or the message was longer than the WQE): the WQE it
    // claimed completes with the status it says, as the target's own receive would have (IBTA 10.3.1, 9.7.5.2.x).
    std::optional<RecvWr> wr;
    if (it != xrc_inbound_.end() && it->second.index == h->index) {
      wr = std::move(it->second.wr);
      xrc_inbound_.erase(it);
    } else {
      wr = take();  // abandoned before its first piece came
    }
    const WcStatus status =
        h->status == uint8_t(WcStatus::kLocLenErr) ? WcStatus::kLocLenErr : WcStatus::kWrFlushErr;  // nothing else
    if (wr) core_.Complete(srq->cq(), DeviceCore::ReceiveError(h->target_qpn, wr->wr_id, status));
    return;
  }
  // The last PSN each target handed us: a piece handed again by the process that took a gone target over, which we
  // have already (wire::XrcDelivery::resent), is dropped.
  auto [last, fresh] = xrc_last_psn_.try_emplace(h->target_qpn, h->psn);
  if (!fresh && h->resent && PsnDiff(h->psn, last->second) <= 0) {
    core_.Count(&DeviceCounters::xrc_pieces_dropped);
    return;
  }
  last->second = h->psn;
  if (h->first) {
    // A message of this target still open here was left without a word (its abandonment found the ring full).
    if (it != xrc_inbound_.end()) {
      core_.Complete(srq->cq(), DeviceCore::ReceiveError(h->target_qpn, it->second.wr.wr_id, WcStatus::kWrFlushErr));
      xrc_inbound_.erase(it);
    }
    std::optional<RecvWr> wr = take();
    if (!wr) {
      core_.Count(&DeviceCounters::xrc_pieces_dropped);  // flushed since (Fail)
      return;
    }
    it = xrc_inbound_.emplace(key, XrcInbound{std::move(*wr), h->index}).first;
  }
  if (it == xrc_inbound_.end()) {
    core_.Count(&DeviceCounters::xrc_pieces_dropped);  // a piece of a message flushed here
    return;
  }
  XrcInbound& m = it->second;
  m.orphaned_ns = 0;  // its target runs (on)
  // The target checked the length against the WQE's (HandSend); our keys may still refuse the buffers.
  if (m.status == WcStatus::kSuccess) m.status = core_.Scatter(srq->pd(), m.wr.sg_list, m.offset, bytes);
  m.offset += bytes.size();
  if (!h->last) return;
  // The completion the target's own SRQ would have given (RcResponder::CompleteMessage): in the SRQ's CQ, with the
  // target QP's number. A receive buffer our keys refuse completes in error here; the initiator, acknowledged
  // already, is not told (README: XRC between processes).
  Completion c;
  if (m.status == WcStatus::kSuccess) {
    c = DeviceCore::MessageCompletion(h->target_qpn, h->src_qpn, m.offset, h->solicited,
                                      h->with_imm ? std::optional<uint32_t>(h->imm) : std::nullopt);
    c.wr_id = m.wr.wr_id;
    c.opcode = WcOpcode::kRecv;
  } else {
    c = DeviceCore::ReceiveError(h->target_qpn, m.wr.wr_id, m.status);
  }
  core_.Complete(srq->cq(), c);
  xrc_inbound_.erase(it);
}

void Device::EndHandedMessagesLocked(const std::function<bool(uint32_t target_qpn, uint64_t orphaned_ns)>& ends) {
  MutexLock lock(xrc_inbound_mu_);
  for (auto it = xrc_inbound_.begin(); it != xrc_inbound_.end();) {
    const auto srqn = uint32_t(it->first >> 32), target_qpn = uint32_t(it->first);
    auto srq = srqs_.find(srqn);
    if (!ends(target_qpn, it->second.orphaned_ns) || srq == srqs_.end()) {
      ++it;
      continue;
    }
    core_.Complete(srq->second->cq(), DeviceCore::ReceiveError(target_qpn, it->second.wr.wr_id, WcStatus::kWrFlushErr));
    it = xrc_inbound_.erase(it);
  }
}

uint64_t Device::EndOrphanedMessagesLocked(uint64_t now) {
  if (!orphaned_messages_.load(std::memory_order_acquire)) return 0;  // the common case: one load
  uint64_t next = 0;
  bool waiting = false;
  EndHandedMessagesLocked([&](uint32_t, uint64_t since) {
    if (since == 0) return false;
    if (now - since >= kOrphanedMessageWaitNs) return true;
    waiting = true;
    next = wire::EarlierDeadline(next, since + kOrphanedMessageWaitNs);
    return false;
  });
  orphaned_messages_.store(waiting, std::memory_order_release);
  return next;
}

void Device::AdoptTargetsOf(uint8_t owner, bool* taken_elsewhere) {
  *taken_elsewhere = false;
  struct Gone {
    uint32_t qpn;
    SharedTargetState state;
    uint64_t holders[4];
  };
  std::vector<Gone> gone;
  {
    std::shared_lock objects(objects_mu_);
    if (core_.config.shared_xrc == nullptr) return;
    for (auto& [qpn, qp] : opened_targets_) {
      if (wire::OwnerOf24(qpn) != owner || qp->gone_elsewhere) continue;
      Gone g{qpn, {}, {}};
      std::span<uint8_t> bytes(reinterpret_cast<uint8_t*>(&g.state), sizeof g.state);
      if (core_.config.shared_xrc->ReadGoneXrcTarget(qpn, bytes, g.holders)) gone.push_back(g);
    }
  }
  if (gone.empty()) return;
  // Its number becomes ours at the service (without our lock: the service may make us wait for its leaving).
  if (const int rc = core_.config.shared_xrc->AdoptOwner(owner); rc != 0) {
    *taken_elsewhere = rc == -EALREADY;  // another holder runs them: our handles reach them there
    return;
  }
  std::unique_lock lock(objects_mu_);
  for (Gone& g : gone) {
    auto it = opened_targets_.find(g.qpn);
    if (it == opened_targets_.end()) continue;  // its last handle went meanwhile
    std::unique_ptr<QueuePair> qp = std::move(it->second);
    opened_targets_.erase(it);
    {
      std::lock_guard qp_lock(qp->mutex());
      RunOnFromLocked(*qp, g.state);
      // Published as ours, held by the other processes that held it (our own handles are counted here).
      const uint8_t me = core_.config.owner;
      g.holders[me / 64] &= ~(uint64_t{1} << (me % 64));
      core_.PublishTargetState(*qp, /*pending=*/false, g.holders);
    }
    core_.Count(&DeviceCounters::xrc_targets_adopted);
    qps_[g.qpn] = std::move(qp);
  }
}

void Device::RunOnFromLocked(QueuePair& qp, const SharedTargetState& t) {
  qp.runs_elsewhere = false;
  qp.mutable_attributes() = t.attributes;
  qp.responder().state().msn = t.msn;
  qp.responder().state().comm_established = true;
  InboundMessage& in = qp.inbound();
  in = InboundMessage{};
  const uint32_t at = t.attributes.rq_psn;
  // A pending first piece was handed before its message counted as open (RcResponder::ExecuteMessagePacket keeps
  // the claim for its retransmission, as after an RNR NAK).
  const bool open = t.in_message && !(t.pending && t.offset == 0);
  if (t.relay_srqn == 0) return;  // nothing in progress, or into the gone process's own SRQ (gone with it)
  if (wire::OwnerOf24(t.relay_srqn) != core_.config.owner) {
    // Another process's SRQ: handed on from where the gone process stopped; the pending piece again, resent.
    in.kind = open ? InboundMessage::Kind::kSend : InboundMessage::Kind::kNone;
    in.rqe = RecvWr{};
    in.relay_srqn = t.relay_srqn;
    in.relay_index = t.relay_index;
    in.relay_length = t.relay_length;
    in.offset = t.offset;
    qp.resend_pending = t.pending;
    qp.resend_psn = at;
    return;
  }
  // Ours: what reached us decides. The pending piece did if it is the last we were handed by this target.
  MutexLock inbound(xrc_inbound_mu_);
  auto last = xrc_last_psn_.find(qp.qpn());
  const bool arrived = t.pending && last != xrc_last_psn_.end() && last->second == at;
  auto mine = xrc_inbound_.find(uint64_t(t.relay_srqn) << 32 | qp.qpn());
  if (mine != xrc_inbound_.end()) {
    // A message whose WQE we took at its first piece goes on here as the QP's own.
    in.kind = InboundMessage::Kind::kSend;
    in.rqe = std::move(mine->second.wr);
    in.offset = mine->second.offset;
    xrc_inbound_.erase(mine);
    if (arrived) qp.mutable_attributes().rq_psn = PsnAdd(at, 1);
    return;
  }
  if (arrived && t.in_message) {
    // It was the message's last piece: completed here.
    qp.mutable_attributes().rq_psn = PsnAdd(at, 1);
    qp.responder().state().msn = PsnAdd(t.msn, 1);
    return;
  }
  // A claim on our SRQ whose first piece never came: the WQE goes back (the QP, ours now, takes its WQEs itself).
  auto srq = srqs_.find(t.relay_srqn);
  if (srq == srqs_.end()) return;
  bool limit_reached = false;
  if (std::optional<RecvWr> wr = srq->second->TakeAt(t.relay_index, &limit_reached)) srq->second->Post(std::move(*wr));
  core_.ShowSharedWqes(*srq->second);
}

void Device::OnPeerProcessGone(const wire::IpAddress& peer, uint8_t owner) {
  cm_.OnPeerProcessGone(peer, owner);
  // Its target QPs we hold run here from now on, from the state it last published (or in another holder's process).
  bool taken_elsewhere = false;
  AdoptTargetsOf(owner, &taken_elsewhere);
  std::shared_lock objects(objects_mu_);
  // The messages its target QPs were handing to our SRQs end (their WQEs flushed), but those of a target another
  // process holds, which that process may run on: they wait for its pieces (EndOrphanedMessagesLocked).
  std::vector<uint32_t> targets;
  {
    MutexLock lock(xrc_inbound_mu_);
    for (const auto& [key, m] : xrc_inbound_)
      if (wire::OwnerOf24(uint32_t(key)) == owner) targets.push_back(uint32_t(key));
  }
  std::vector<uint32_t> held;
  for (uint32_t target : targets) {
    uint64_t holders[4] = {};
    if (core_.config.shared_xrc != nullptr && core_.config.shared_xrc->ReadGoneXrcTarget(target, {}, holders) &&
        (holders[0] | holders[1] | holders[2] | holders[3]) != 0)
      held.push_back(target);
  }
  const uint64_t now = core_.Now();
  {
    MutexLock lock(xrc_inbound_mu_);
    for (auto& [key, m] : xrc_inbound_)
      if (std::find(held.begin(), held.end(), uint32_t(key)) != held.end() && m.orphaned_ns == 0) m.orphaned_ns = now;
    if (!held.empty()) orphaned_messages_.store(true, std::memory_order_release);
  }
  EndHandedMessagesLocked([&](uint32_t target_qpn, uint64_t) {
    return wire::OwnerOf24(target_qpn) == owner && std::find(held.begin(), held.end(), target_qpn) == held.end();
  });
  if (taken_elsewhere) return;
  // The others went with it (its kernel's would have lived on: README, XRC): the QP's catastrophic error (IBTA
  // 11.6.3.1) tells the holder.
  for (auto& [qpn, qp] : opened_targets_) {
    if (wire::OwnerOf24(qpn) != owner || qp->gone_elsewhere) continue;
    std::lock_guard lock(qp->mutex());
    qp->gone_elsewhere = true;
    core_.Raise({AsyncEventType::kQpFatal, qp.get()});
  }
}

// --- SRQ objects ------------------------------------------------------------------------------------------------

int Device::CreateSrq(SrqType type, ProtectionDomain* pd, XrcDomain* xrcd, CompletionQueue* cq, SrqAttributes& attr,
                      SharedReceiveQueue** out) {
  const DeviceLimits& lim = core_.config.limits;
  if (pd == nullptr) return EINVAL;
  if (type == SrqType::kXrc && (xrcd == nullptr || cq == nullptr)) return EINVAL;
  if (attr.max_wr == 0 || attr.max_wr > lim.max_srq_wr || attr.max_sge > lim.max_srq_sge) return EINVAL;
  attr.max_sge = std::max<uint32_t>(attr.max_sge, 1);
  attr.srq_limit = 0;  // ibv_create_srq(3): the limit is irrelevant at creation; ibv_modify_srq arms it
  std::unique_lock lock(objects_mu_);
  if (pds_.count(pd->handle()) == 0 || pds_.at(pd->handle()).get() != pd) return EINVAL;
  if (type == SrqType::kXrc) {
    if (xrcds_.count(xrcd) == 0) return EINVAL;
    auto it = cqs_.find(cq->handle());
    if (it == cqs_.end() || it->second.get() != cq) return EINVAL;
  } else {
    xrcd = nullptr;
    cq = nullptr;
  }
  if (srqs_.size() >= lim.max_srq) return ENOMEM;
  // SRQ numbers are 24 bits (the XRCETH field), from where the seed says (Device::Device); a process of the host
  // device has its owner byte in them, as in its QPNs (README: XRC between processes).
  const uint8_t owner = core_.config.owner;
  uint32_t srqn = owner != 0 ? wire::WithOwner24(owner, next_srqn_) : next_srqn_;
  while (srqs_.count(srqn) || srqn == 0) srqn = owner != 0 ? wire::WithOwner24(owner, srqn + 1) : (srqn + 1) & 0xffffff;
  next_srqn_ = (srqn + 1) & 0xffffff;
  auto srq = std::make_unique<SharedReceiveQueue>(srqn, type, pd, attr, xrcd, cq);
  // An XRC SRQ of a domain opened by a file is the host's other processes' to reach too (ibv_open_xrcd(3): processes
  // share a domain by opening the same file).
  if (type == SrqType::kXrc && xrcd->inode() && core_.config.shared_xrc != nullptr && owner != 0)
    srq->shared = core_.config.shared_xrc->PublishXrcSrq(srqn, *xrcd->inode());
  *out = srq.get();
  srqs_[srqn] = std::move(srq);
  return 0;
}

int Device::ModifySrq(SharedReceiveQueue* srq, const SrqAttributes& attr, uint32_t mask) {
  std::shared_lock objects(objects_mu_);  // the SRQ locks itself
  return srq->Modify(attr, mask, core_.config.limits.max_srq_wr);
}

int Device::QuerySrq(SharedReceiveQueue* srq, SrqAttributes* attr) {
  std::shared_lock objects(objects_mu_);  // the SRQ locks itself
  *attr = srq->Query();
  return 0;
}

int Device::DestroySrq(SharedReceiveQueue* srq) {
  std::unique_lock lock(objects_mu_);
  auto it = srqs_.find(srq->srqn());
  if (it == srqs_.end() || it->second.get() != srq) return EINVAL;
  if (srq->users > 0) return EBUSY;  // ibv_destroy_srq(3) NOTES: fails while a QP is associated with it
  if (srq->shared) {
    core_.config.shared_xrc->WithdrawXrcSrq(srq->srqn());
    MutexLock inbound(xrc_inbound_mu_);
    std::erase_if(xrc_inbound_, [&](const auto& e) { return uint32_t(e.first >> 32) == srq->srqn(); });
  }
  srqs_.erase(it);
  return 0;
}

int Device::PostSrqRecv(SharedReceiveQueue* srq, RecvWr&& wr) {
  std::shared_lock objects(objects_mu_);  // the SRQ locks itself
  if (int err = srq->Post(std::move(wr)); err != 0) return err;
  if (srq->shared) core_.ShowSharedWqes(*srq);
  if (!failed_) return 0;
  FlushSrqLocked(*srq);  // a lost device takes no more (Fail)
  return 0;
}

// --- XRC domains and shared target QPs ------------------------------------------------------------------------------

int Device::OpenXrcd(std::optional<uint64_t> inode, bool create, bool exclusive, XrcDomain** out) {
  std::unique_lock lock(objects_mu_);
  if (inode) {
    for (auto& [ptr, d] : xrcds_) {
      if (d->inode() != inode) continue;
      // ibv_open_xrcd(3): with O_EXCL (and O_CREAT) opening fails when a domain exists for the inode (EINVAL, as the
      // kernel's uverbs answers).
      if (exclusive) return EINVAL;
      ++d->references;
      *out = d.get();
      return 0;
    }
    if (!create) return EAGAIN;  // no domain for this inode and no O_CREAT (the kernel's uverbs errno)
  }
  auto d = std::make_unique<XrcDomain>(next_xrcd_++, inode);
  *out = d.get();
  xrcds_[d.get()] = std::move(d);
  return 0;
}

bool Device::IsUnheldTargetLocked(uint32_t qpn) const {
  return std::find(unheld_targets_.begin(), unheld_targets_.end(), qpn) != unheld_targets_.end();
}

int Device::CloseXrcd(XrcDomain* xrcd) {
  std::unique_lock lock(objects_mu_);
  auto it = xrcds_.find(xrcd);
  if (it == xrcds_.end() || xrcd->references == 0) return EINVAL;
  if (xrcd->references > 1) {
    --xrcd->references;
    return 0;
  }
  // The last close destroys the domain, which it may not while SRQs or target QPs of ours belong to it
  // (ibv_open_xrcd(3)). A target QP only other processes hold keeps it (as the kernel's domain of a file is one for
  // the host, which this process's close leaves): forgotten with the QP.
  for (auto& [_, srq] : srqs_)
    if (srq->xrcd() == xrcd) return EBUSY;
  bool kept = false;
  for (auto& [qpn, qp] : qps_) {
    if (qp->init().xrcd != xrcd) continue;
    if (!IsUnheldTargetLocked(qpn)) return EBUSY;
    kept = true;
  }
  for (auto& [_, qp] : opened_targets_)
    if (qp->init().xrcd == xrcd) return EBUSY;
  if (kept) {
    xrcd->references = 0;
    return 0;
  }
  xrcds_.erase(it);
  return 0;
}

void Device::ForgetXrcdIfUnusedLocked(XrcDomain* xrcd) {
  for (auto& [_, qp] : qps_)
    if (qp->init().xrcd == xrcd) return;
  xrcds_.erase(xrcd);
}

int Device::OpenQp(XrcDomain* xrcd, uint32_t qpn, QpType type, QueuePair** out) {
  {
    std::unique_lock lock(objects_mu_);
    if (xrcd == nullptr || xrcds_.count(xrcd) == 0 || xrcd->references == 0) return EINVAL;
    // ibv_open_qp(3) NOTES: fails unless a QP of that number and type exists within the xrcd; only XRC targets are
    // shareable.
    if (type != QpType::kXrcRecv) return EINVAL;
    if (QueuePair* qp = FindQpLocked(qpn)) {
      if (qp->type() != type || qp->init().xrcd != xrcd) return EINVAL;
      if (++qp->references == 1) std::erase(unheld_targets_, qpn);  // ours again
      *out = qp;
      return 0;
    }
    if (auto it = opened_targets_.find(qpn); it != opened_targets_.end()) {
      if (it->second->init().xrcd != xrcd || it->second->gone_elsewhere) return EINVAL;
      ++it->second->references;
      *out = it->second.get();
      return 0;
    }
    // Another process's target QP of the domain we opened by the same file (on the host device).
    const uint8_t owner = core_.config.owner;
    if (core_.config.shared_xrc == nullptr || owner == 0 || !xrcd->inode() || wire::OwnerOf24(qpn) == owner)
      return EINVAL;
  }
  // Asked without our lock: a process we never talked to offers its table when its thread accepts us.
  if (int rc = core_.config.shared_xrc->OpenXrcTarget(qpn, *xrcd->inode()); rc < 0) return -rc;
  std::unique_lock lock(objects_mu_);
  if (xrcds_.count(xrcd) == 0 || xrcd->references == 0) {
    core_.config.shared_xrc->CloseXrcTarget(qpn);
    return EINVAL;  // the domain was closed meanwhile
  }
  auto [it, added] = opened_targets_.try_emplace(qpn);
  if (added) {
    QpInitAttributes init;
    init.type = QpType::kXrcRecv;
    init.xrcd = xrcd;
    it->second = std::make_unique<QueuePair>(core_, qpn, init);
    it->second->runs_elsewhere = true;
  } else {
    ++it->second->references;  // opened meanwhile by another thread: the one holder bit stands for both
  }
  *out = it->second.get();
  return 0;
}

int Device::CloseElsewhere(QueuePair* qp) {
  std::unique_lock lock(objects_mu_);
  auto it = opened_targets_.find(qp->qpn());
  if (it == opened_targets_.end() || it->second.get() != qp) return EINVAL;
  if (--qp->references > 0) return 0;
  if (!qp->gone_elsewhere) core_.config.shared_xrc->CloseXrcTarget(qp->qpn());
  opened_targets_.erase(it);
  return 0;
}

void Device::EndUnheldTargets(OutBatch& out) {
  std::vector<uint32_t> released;
  {
    std::shared_lock objects(objects_mu_);
    for (uint32_t qpn : unheld_targets_)
      if (core_.config.shared_xrc->ReleaseXrcTarget(qpn)) released.push_back(qpn);
  }
  if (released.empty()) return;
  std::unique_lock lock(objects_mu_);
  for (uint32_t qpn : released) {
    auto it = qps_.find(qpn);
    if (it == qps_.end()) continue;
    if (!IsUnheldTargetLocked(qpn)) {
      // Opened here again meanwhile: others may open it again too.
      std::lock_guard qp_lock(it->second->mutex());
      core_.PublishDirect(*it->second);
      continue;
    }
    std::erase(unheld_targets_, qpn);
    DestroyQpLocked(it, nullptr, out);
  }
}

void Device::SetQpOwner(QueuePair* qp, void* owner) {
  std::unique_lock lock(objects_mu_);
  qp->owner = owner;
}

}  // namespace uroce::emu
