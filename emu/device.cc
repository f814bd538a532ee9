#include "emu/device.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <shared_mutex>
#include <type_traits>

#include "emu/out_batch.h"
#include "emu/qp_state_machine.h"
#include "wire/bytes.h"
#include "wire/direct_access.h"
#include "wire/frame.h"
#include "wire/headers.h"
#include "wire/icrc.h"
#include "wire/opcode.h"
#include "wire/packet.h"
#include "wire/service_protocol.h"
#include "wire/scratch_list.h"

namespace uroce::emu {
namespace {

bool PkeyMatches(uint16_t pkey) { return (pkey & 0x7fff) == 0x7fff; }  // only the default partition exists

}  // namespace

Device::Device(DeviceConfig config, wire::Transport& transport, const wire::Clock& clock)
    : core_(std::move(config), transport, clock),
      cm_(CmConfig{.ca_guid = core_.config.node_guid,
                   .id_seed = core_.config.id_seed,
                   .owner = core_.config.owner,
                   .address = core_.config.address,
                   .gids = &core_.gids},
          transport, clock) {
  // QPNs from 0x11 (QPN 0 and 1 are the special QPs, SMI and GSI; rxe also starts at 17), or from where the seed
  // says (DeviceConfig::id_seed).
  if (core_.config.id_seed != 0) next_qpn_ = 0x11 + uint32_t((core_.config.id_seed >> 40) % (0xffffff - 0x11));
  // SRQ numbers likewise: two processes' devices are two HCAs, and a request one's target receives naming the
  // other's SRQ must find no SRQ of that number (invalid request), not its own first one, which every device
  // numbering from 1 would have.
  if (core_.config.id_seed != 0) next_srqn_ = 1 + uint32_t((core_.config.id_seed >> 16) % 0xfffffe);
}

Device::~Device() = default;

DeviceCounters Device::counters() const {
  DeviceCounters c = core_.Counters();
  c.cm = cm_.counters();  // its own lock
  return c;
}

std::optional<PathWindow> Device::path_window(const wire::IpAddress& peer) const {
  MutexLock lock(core_.paths_mu());
  auto it = core_.paths().find(peer);
  if (it == core_.paths().end()) return std::nullopt;
  return it->second;
}

void Device::set_async_handler(std::function<void(const AsyncEvent&)> handler) {
  std::unique_lock lock(objects_mu_);
  core_.async_handler = std::move(handler);
}

// --- objects ----------------------------------------------------------------------------------------------------

ProtectionDomain* Device::AllocPd() {
  std::unique_lock lock(objects_mu_);
  if (pds_.size() >= core_.config.limits.max_pd) return nullptr;
  const uint32_t handle = next_pd_++;
  auto& pd = pds_[handle];
  pd = std::make_unique<ProtectionDomain>(handle);
  if (core_.config.exports != nullptr) core_.config.exports->ExportPd(handle);
  return pd.get();
}

int Device::DeallocPd(ProtectionDomain* pd) {
  std::unique_lock lock(objects_mu_);
  auto it = pds_.find(pd->handle());
  if (it == pds_.end() || it->second.get() != pd) return EINVAL;
  for (auto& [_, qp] : qps_)
    if (qp->init().pd == pd) return EBUSY;
  for (auto& [_, ah] : ahs_)
    if (ah->pd() == pd) return EBUSY;
  for (auto& [_, srq] : srqs_)
    if (srq->pd() == pd) return EBUSY;
  ReaderLock keys(core_.keys_mu());
  if (core_.keys().AnyInPd(pd)) return EBUSY;
  if (core_.config.exports != nullptr) core_.config.exports->WithdrawPd(pd->handle());
  pds_.erase(it);
  return 0;
}

int Device::RegisterMr(ProtectionDomain* pd, void* host, uint64_t length, uint64_t iova, uint32_t access,
                       MemoryRegion* out) {
  // ibv_reg_mr(3): IBV_ACCESS_REMOTE_WRITE or IBV_ACCESS_REMOTE_ATOMIC without IBV_ACCESS_LOCAL_WRITE is EINVAL.
  if ((access & (access::kRemoteWrite | access::kRemoteAtomic)) && !(access & access::kLocalWrite)) return EINVAL;
  constexpr uint32_t kKnown = access::kLocalWrite | access::kRemoteWrite | access::kRemoteRead |
                              access::kRemoteAtomic | access::kMwBind | access::kZeroBased | access::kOnDemand |
                              access::kHugetlb | access::kRelaxedOrdering;
  if (access & ~kKnown & 0xfffff) return EINVAL;  // optional bits (>= 1 << 20) may be ignored, per verbs.h
  // Implicit ODP (ibv_reg_mr(3)): addr NULL and length SIZE_MAX with IBV_ACCESS_ON_DEMAND covers the address space.
  const bool implicit = host == nullptr && length == SIZE_MAX && (access & access::kOnDemand);
  if (pd == nullptr || (host == nullptr && length != 0 && !implicit)) return EINVAL;
  std::unique_lock lock(objects_mu_);
  WriterLock keys(core_.keys_mu());
  if (core_.keys().size() >= core_.config.limits.max_mr) return ENOMEM;
  MemoryRegion mr{pd, static_cast<uint8_t*>(host), implicit ? 0 : iova, length, access, 0, 0};
  mr.implicit = implicit;
  *out = core_.mutable_keys().Register(mr);
  if (out->lkey == 0) return ENOMEM;
  core_.PublishRegion(*out);
  return 0;
}

int Device::ImportMr(ProtectionDomain* pd, MemoryRegion theirs) {
  if (pd == nullptr || theirs.foreign == nullptr || theirs.implicit || theirs.lkey == 0) return EINVAL;
  theirs.pd = pd;
  std::unique_lock lock(objects_mu_);
  WriterLock keys(core_.keys_mu());
  if (core_.keys().size() >= core_.config.limits.max_mr) return ENOMEM;
  return core_.mutable_keys().Adopt(theirs);
}

int Device::ReregisterMr(uint32_t lkey, ProtectionDomain* pd, void* host, uint64_t length, uint64_t iova,
                         uint32_t access, MemoryRegion* out) {
  if ((access & (access::kRemoteWrite | access::kRemoteAtomic)) && !(access & access::kLocalWrite)) return EINVAL;
  std::unique_lock lock(objects_mu_);
  WriterLock keys(core_.keys_mu());
  const MemoryRegion* cur = core_.keys().Find(lkey);
  if (cur == nullptr) return EINVAL;
  if (cur->foreign != nullptr) return EOPNOTSUPP;  // its process's to change
  MemoryRegion mr{pd, static_cast<uint8_t*>(host), iova, length, access, 0, 0};
  // Other processes stop reaching the old region before it changes (ibv_rereg_mr(3): as a deregistration).
  core_.WithdrawRegion(*cur);
  if (!core_.mutable_keys().Update(lkey, mr)) return EINVAL;
  *out = *core_.keys().Find(lkey);
  core_.PublishRegion(*out);
  return 0;
}

int Device::DeregisterMr(uint32_t lkey) {
  std::unique_lock lock(objects_mu_);
  WriterLock keys(core_.keys_mu());
  // IBTA 10.6.3.2: once deregistered, the region is no longer accessed, by another process's copy either.
  if (const MemoryRegion* mr = core_.keys().Find(lkey)) core_.WithdrawRegion(*mr);
  return core_.mutable_keys().Deregister(lkey) ? 0 : EINVAL;
}

ProtectionDomain* Device::FindPd(uint32_t handle) {
  std::unique_lock lock(objects_mu_);
  auto it = pds_.find(handle);
  return it == pds_.end() ? nullptr : it->second.get();
}

int Device::QueryMrByHandle(uint32_t handle, MemoryRegion* out) const {
  std::unique_lock lock(objects_mu_);
  ReaderLock keys(core_.keys_mu());
  const MemoryRegion* mr = core_.keys().FindByHandle(handle);
  if (mr == nullptr) return EINVAL;
  *out = *mr;
  return 0;
}

int Device::QueryMr(uint32_t lkey, MemoryRegion* out) const {
  std::unique_lock lock(objects_mu_);
  ReaderLock keys(core_.keys_mu());
  const MemoryRegion* mr = core_.keys().Find(lkey);
  if (mr == nullptr) return EINVAL;
  *out = *mr;
  return 0;
}

int Device::AllocMw(ProtectionDomain* pd, uint8_t type, uint32_t* rkey) {
  if (pd == nullptr || (type != 1 && type != 2)) return EINVAL;
  std::unique_lock lock(objects_mu_);
  WriterLock keys(core_.keys_mu());
  *rkey = core_.mutable_keys().AllocateWindow(pd, type);
  return *rkey != 0 ? 0 : ENOMEM;
}

int Device::DeallocMw(uint32_t rkey) {
  std::unique_lock lock(objects_mu_);
  WriterLock keys(core_.keys_mu());
  return core_.mutable_keys().DeallocateWindow(rkey);
}

int Device::CreateCq(uint32_t capacity, CompletionQueue** out) {
  if (capacity == 0 || capacity > core_.config.limits.max_cqe) return EINVAL;
  std::unique_lock lock(objects_mu_);
  if (cqs_.size() >= core_.config.limits.max_cq) return ENOMEM;
  const uint32_t handle = next_cq_++;
  auto& cq = cqs_[handle];
  cq = std::make_unique<CompletionQueue>(handle, capacity);
  *out = cq.get();
  return 0;
}

int Device::ResizeCq(CompletionQueue* cq, uint32_t capacity) {
  if (capacity == 0 || capacity > core_.config.limits.max_cqe) return EINVAL;
  return cq->Resize(capacity);
}

int Device::DestroyCq(CompletionQueue* cq) {
  std::unique_lock lock(objects_mu_);
  for (auto& [_, qp] : qps_)
    if (qp->init().send_cq == cq || qp->init().recv_cq == cq) return EBUSY;
  for (auto& [_, srq] : srqs_)
    if (srq->cq() == cq) return EBUSY;  // an XRC SRQ completes there
  auto it = cqs_.find(cq->handle());
  if (it == cqs_.end() || it->second.get() != cq) return EINVAL;
  cqs_.erase(it);
  return 0;
}

int Device::CreateAh(ProtectionDomain* pd, const AddressVector& av, AddressHandle** out) {
  if (pd == nullptr) return EINVAL;
  // RoCE carries a GRH in every packet: an AH without one, or naming a GID we don't have, is invalid.
  if (!av.is_global || av.sgid_index >= core_.config.limits.gid_table_len || av.port_num != 1) return EINVAL;
  const std::optional<AddressVector> resolved = core_.Resolve(av);
  if (!resolved) return EINVAL;
  std::unique_lock lock(objects_mu_);
  if (ahs_.size() >= core_.config.limits.max_ah) return ENOMEM;
  auto ah = std::make_unique<AddressHandle>(pd, StoredAddressVector(*resolved));
  *out = ah.get();
  ahs_[ah.get()] = std::move(ah);
  return 0;
}

int Device::DestroyAh(AddressHandle* ah) {
  std::unique_lock lock(objects_mu_);
  return ahs_.erase(ah) ? 0 : EINVAL;
}

int Device::CreateQp(QpInitAttributes& init, QueuePair** out) {
  const DeviceLimits& lim = core_.config.limits;
  switch (init.type) {
    case QpType::kRc:
    case QpType::kUc:
    case QpType::kUd:
    case QpType::kXrcSend:
    case QpType::kXrcRecv:
      break;
    default:
      return EOPNOTSUPP;  // raw packet QPs: see README's support table
  }
  if (int err = CheckSharedReceiveInit(init)) return err;  // SRQ and XRC rules (xrc.cc)
  const bool xrc = init.type == QpType::kXrcSend || init.type == QpType::kXrcRecv;
  if (!xrc && (init.pd == nullptr || init.send_cq == nullptr || init.recv_cq == nullptr)) return EINVAL;
  QpCapabilities& cap = init.cap;
  if (cap.max_send_wr > lim.max_qp_wr || cap.max_recv_wr > lim.max_qp_wr || cap.max_send_sge > lim.max_sge ||
      cap.max_recv_sge > lim.max_sge || cap.max_inline_data > lim.max_inline_data)
    return EINVAL;
  // Report at least what was asked (ibv_create_qp(3): "the actual values ... may be greater than or equal").
  cap.max_send_sge = std::max<uint32_t>(cap.max_send_sge, 1);
  cap.max_recv_sge = std::max<uint32_t>(cap.max_recv_sge, 1);
  cap.max_inline_data = lim.max_inline_data;
  if (init.srq != nullptr || xrc) cap.max_recv_wr = cap.max_recv_sge = 0;  // no receive queue of its own
  if (init.type == QpType::kXrcRecv) cap = QpCapabilities{};              // nor a send queue
  std::unique_lock lock(objects_mu_);
  if (qps_.size() >= lim.max_qp) return ENOMEM;
  if (int err = AttachSharedReceiveLocked(init)) return err;
  const uint8_t owner = core_.config.owner;
  uint32_t qpn = owner != 0 ? wire::WithOwner24(owner, next_qpn_) : next_qpn_;
  while (qps_.count(qpn)) qpn = owner != 0 ? wire::WithOwner24(owner, qpn + 1) : (qpn + 1) & 0xffffff;
  next_qpn_ = std::max<uint32_t>((qpn + 1) & 0xffffff, 0x11);
  auto qp = std::make_unique<QueuePair>(core_, qpn, init);
  qp->mutable_attributes().path_mtu = core_.config.active_mtu;
  if (core_.SharesTarget(*qp)) core_.PublishDirect(*qp);  // other processes of its domain may open it from now on
  *out = qp.get();
  qps_[qpn] = std::move(qp);
  return 0;
}

int Device::ModifyQp(QueuePair* qp, const QpAttributes& attr, uint32_t mask) {
  // A handle on another process's target QP: that process modifies it, asked through its ring (ibv_open_qp(3): any
  // handle may); no lock of ours is held while it answers.
  if (qp->runs_elsewhere) {
    if (core_.config.shared_xrc == nullptr) return EOPNOTSUPP;
    static_assert(std::is_trivially_copyable_v<QpAttributes>);
    const auto* bytes = reinterpret_cast<const uint8_t*>(&attr);
    return core_.config.shared_xrc->ModifyXrcTarget(qp->qpn(), {bytes, sizeof attr}, mask);
  }
  OutBatch out;
  int err;
  {
    std::shared_lock objects(objects_mu_);
    err = ModifyQpHeld(qp, attr, mask, out);
  }
  Transmit(out);
  return err;
}

int Device::ModifyQpHeld(QueuePair* qp, const QpAttributes& attr, uint32_t mask, OutBatch& out) {
  std::lock_guard lock(qp->mutex());
  // A real HCA would have sent a held ACK long before the QP leaves the states that send (AckTiming::kHeld).
  const QpState next = (mask & attr::kState) ? attr.qp_state : qp->state();
  if (next == QpState::kReset || next == QpState::kErr) qp->responder().SendHeldAck(out);
  const int err = ModifyQpLocked(qp, attr, mask);
  // Work posted while the QP could not send (SQD) goes out once it can.
  if (err == 0 && (qp->type() == QpType::kRc || qp->type() == QpType::kXrcSend) && qp->state() == QpState::kRts)
    qp->requester().Progress(out);
  return err;
}

void Device::ModifyForHolder(const wire::InDatagram& d) {
  const std::optional<wire::XrcTargetModify> m = wire::XrcTargetModify::Decode(d.payload);
  if (!m || m->answer || core_.config.shared_xrc == nullptr) return;
  const std::span<const uint8_t> bytes = d.payload.subspan(wire::XrcTargetModify::kSize);
  int err = EINVAL;  // no such target QP here, or the requester holds no handle on it
  OutBatch out;
  if (bytes.size() == sizeof(QpAttributes) && core_.config.shared_xrc->HoldsXrcTarget(m->qpn, m->from)) {
    QpAttributes attr;
    std::memcpy(&attr, bytes.data(), sizeof attr);
    std::shared_lock objects(objects_mu_);
    auto it = qps_.find(m->qpn);
    if (it != qps_.end() && core_.SharesTarget(*it->second)) err = ModifyQpHeld(it->second.get(), attr, m->mask, out);
  }
  Transmit(out);
  core_.config.shared_xrc->AnswerXrcTargetModify(m->from, m->request, err);
}

void Device::Fail() {
  {
    std::shared_lock objects(objects_mu_);
    for (auto& [qpn, qp] : qps_) {
      std::lock_guard lock(qp->mutex());
      core_.EnterError(*qp);
    }
  }
  {
    // IBTA 10.3.1 leaves an SRQ's WQEs queued when one of its QPs enters the error state: its other QPs may still
    // take them. A lost device has no other QPs, and a program waiting for a receive posted to an SRQ would wait for
    // ever (ibv_srq_pingpong and ibv_xsrq_pingpong did, after the host's device service died), so they complete
    // with IBV_WC_WR_FLUSH_ERR as the QPs' own receives do.
    std::unique_lock objects(objects_mu_);
    failed_ = true;
    for (auto& [srqn, srq] : srqs_) FlushSrqLocked(*srq);
    EndHandedMessagesLocked([](uint32_t, uint64_t) { return true; });  // what other processes were handing over
    for (auto& [_, qp] : opened_targets_) qp->gone_elsewhere = true;  // other processes' target QPs: out of reach
  }
  core_.Raise(AsyncEvent{AsyncEventType::kDeviceFatal});
}

bool Device::UpdateGids(std::span<const wire::IpAddress> others, bool announce) {
  if (!core_.gids.Update(others)) return false;
  if (announce) AnnounceGidChange();
  return true;
}

bool Device::AssignGids(const std::array<std::optional<wire::IpAddress>, GidTable::kEntries>& entries, bool announce) {
  if (!core_.gids.Assign(entries)) return false;
  if (announce) AnnounceGidChange();
  return true;
}

void Device::AnnounceGidChange() {
  std::shared_lock objects(objects_mu_);  // async_handler is set under it (set_async_handler)
  core_.Raise(AsyncEvent{.type = AsyncEventType::kGidChange, .port = 1});
}

void Device::FlushSrqLocked(SharedReceiveQueue& srq) {
  const QueuePair* lowest = nullptr;  // of the QPs that take from the SRQ
  for (const auto& [qpn, qp] : qps_) {
    const bool takes = srq.type() == SrqType::kXrc ? qp->type() == QpType::kXrcRecv && qp->init().xrcd == srq.xrcd()
                                                   : qp->init().srq == &srq;
    if (takes && (lowest == nullptr || qpn < lowest->qpn())) lowest = qp.get();
  }
  if (srq.type() != SrqType::kXrc && lowest == nullptr) return;
  CompletionQueue* cq = srq.type() == SrqType::kXrc ? srq.cq() : lowest->init().recv_cq;
  const uint32_t qpn = lowest != nullptr ? lowest->qpn() : 0;
  for (const RecvWr& wr : srq.TakeAll())
    core_.Complete(cq, DeviceCore::ReceiveError(qpn, wr.wr_id, WcStatus::kWrFlushErr));
}

int Device::ModifyQpLocked(QueuePair* qp, const QpAttributes& attr, uint32_t mask) {
  const QpState cur = qp->state();
  const QpState next = (mask & attr::kState) ? attr.qp_state : cur;
  if (int err = CheckModify(qp->attributes(), attr, mask, qp->type(), core_.config.limits, core_.config.active_mtu))
    return err;
  if (mask & attr::kAv) {
    // The source GID must be populated (an empty entry of the table is as invalid as one past it).
    const std::optional<AddressVector> resolved = core_.Resolve(attr.ah_attr);
    if (!resolved) return EINVAL;
    QpAttributes with_source = attr;
    with_source.ah_attr = *resolved;
    ApplyAttributes(qp->mutable_attributes(), with_source, mask);
  } else {
    ApplyAttributes(qp->mutable_attributes(), attr, mask);
  }
  QpAttributes& a = qp->mutable_attributes();
  a.qp_state = next;
  a.cur_qp_state = next;
  if (next == QpState::kReset && cur != QpState::kReset) {
    // IBTA 10.3.1: a QP moved to RESET loses its queued work without completions, and (as on mlx4/mlx5) the
    // completions it left in its CQs.
    CleanCqsLocked(*qp);
    qp->receive_queue().clear();
    qp->held_sends().clear();
    if (qp->inbound().relay_srqn != 0) core_.AbandonHandedMessage(*qp, WcStatus::kWrFlushErr);
    qp->inbound() = InboundMessage{};
    qp->requester().Reset();
    qp->responder().Reset();
  }
  if (next == QpState::kRts && cur != QpState::kRts) qp->requester().Start(/*from_sqd=*/cur == QpState::kSqd);
  if (next == QpState::kSqd && cur == QpState::kRts) qp->requester().StartDraining(a.en_sqd_async_notify);
  if (cur == QpState::kSqd && next == QpState::kRts) a.sq_draining = false;
  core_.PublishDirect(*qp);  // its state, peer or rights may have changed
  if (next == QpState::kErr && cur != QpState::kErr) {
    // What it had in flight no longer counts against its path's window (as DeviceCore::EnterError does): otherwise
    // the other requesters towards that peer wait for room until this QP is reset or destroyed.
    qp->requester().Charge();
    core_.Flush(*qp);
  }
  return 0;
}

void Device::CleanCqsLocked(QueuePair& qp) {
  std::vector<Completion> removed;
  for (CompletionQueue* cq : {qp.init().send_cq, qp.init().recv_cq})
    if (cq != nullptr) cq->RemoveQp(qp.qpn(), &removed);
  auto& kept = qp.srq_completed();
  SharedReceiveQueue* srq = qp.init().srq;
  if (srq != nullptr) {
    // The receive WQEs behind the receive completions dropped go back to the SRQ, as if never taken (mlx5 frees
    // them in its CQ clean): the application's buffers stay posted, rather than lost with completions it can no
    // longer poll. They are the newest the QP completed, in order: the last of those it kept.
    std::vector<uint64_t> ids;
    for (const Completion& c : removed)
      if (c.opcode == WcOpcode::kRecv || c.opcode == WcOpcode::kRecvRdmaWithImm) ids.push_back(c.wr_id);
    if (ids.size() <= kept.size()) {
      const size_t first = kept.size() - ids.size();
      bool same = true;
      for (size_t i = 0; i < ids.size(); ++i) same = same && kept[first + i].wr_id == ids[i];
      for (size_t i = 0; same && i < ids.size(); ++i) srq->Post(std::move(kept[first + i]));
    }
  }
  kept.clear();
}

int Device::QueryQp(QueuePair* qp, QpAttributes* attr) {
  std::shared_lock objects(objects_mu_);
  std::lock_guard lock(qp->mutex());
  if (qp->runs_elsewhere) {
    // What its process published last; a QP whose process is gone went with it.
    if (qp->gone_elsewhere || !core_.config.shared_xrc->ReadXrcTarget(
                                  qp->qpn(), {reinterpret_cast<uint8_t*>(&qp->mutable_attributes()), sizeof *attr}))
      qp->mutable_attributes().qp_state = qp->mutable_attributes().cur_qp_state = QpState::kErr;
  }
  *attr = qp->attributes();
  return 0;
}

int Device::DestroyQp(QueuePair* qp, std::vector<wire::IpAddress>* left_groups) {
  if (qp->runs_elsewhere) return CloseElsewhere(qp);
  OutBatch out;
  {
    std::unique_lock lock(objects_mu_);
    auto it = qps_.find(qp->qpn());
    if (it == qps_.end() || it->second.get() != qp) return EINVAL;
    if (--qp->references > 0) return 0;  // an opened XRC target lives on (ibv_open_qp(3))
    if (core_.SharesTarget(*qp) && !core_.config.shared_xrc->ReleaseXrcTarget(qp->qpn())) {
      // Another process holds a handle on it: it lives on, its events for nobody here (RunTimers ends it).
      qp->owner = nullptr;
      unheld_targets_.push_back(qp->qpn());
      return 0;
    }
    DestroyQpLocked(it, left_groups, out);
  }
  Transmit(out);
  return 0;
}

void Device::DestroyQpLocked(std::unordered_map<uint32_t, std::unique_ptr<QueuePair>>::iterator it,
                             std::vector<wire::IpAddress>* left_groups, OutBatch& out) {
  QueuePair* qp = it->second.get();
  // The ACK of the last message received leaves (ibv_rc_pingpong destroys its QP right after that message).
  qp->responder().SendHeldAck(out);
  DetachSharedReceiveLocked(qp->init());
  for (auto m = multicast_.begin(); m != multicast_.end();) {
    if (std::erase(m->second, qp) > 0 && left_groups) left_groups->push_back(m->first);
    m = m->second.empty() ? multicast_.erase(m) : std::next(m);
  }
  qp->mutable_attributes().qp_state = QpState::kReset;
  core_.PublishDirect(*qp, /*gone=*/true);
  qp->requester().Charge();  // what it had in flight no longer counts against its path
  // The completions it left in its CQs go with it, as on mlx4/mlx5 (their destroy_qp cleans both CQs): once
  // ibv_destroy_qp(3) returns, an application may have freed what their wr_ids point to, and a program that
  // keeps polling a CQ it shares with other QPs would be handed them.
  CleanCqsLocked(*qp);
  if (qp->inbound().relay_srqn != 0) core_.AbandonHandedMessage(*qp, WcStatus::kWrFlushErr);
  XrcDomain* xrcd = qp->type() == QpType::kXrcRecv ? qp->init().xrcd : nullptr;
  qps_.erase(it);
  if (xrcd != nullptr && xrcd->references == 0) ForgetXrcdIfUnusedLocked(xrcd);  // closed while the QP lived on
}

void Device::ReceiveDirectSendLocked(const wire::InDatagram& d) {
  const std::optional<wire::DirectSend> h = wire::DirectSend::Decode(d.payload);
  QueuePair* found = h ? FindQpLocked(h->dest_qpn) : nullptr;
  if (found == nullptr) {
    core_.Count(&DeviceCounters::rc_direct_sends_dropped);
    return;
  }
  QueuePair& qp = *found;
  std::lock_guard lock(qp.mutex());
  DirectReceives& w = qp.direct_receives();
  const QpState s = qp.state();
  // Checked against this incarnation's window by the QP's peer, as the next WQE (DirectTable::ClaimReceive); in the
  // error state only those the flush waits for.
  const bool taking = ReceivesInState(s) || (s == QpState::kErr && w.flush_waiting && w.direct_taken < w.flush_after);
  if (!w.open || w.epoch != h->epoch || !taking || h->src_qpn != qp.attributes().dest_qp_num ||
      h->index != w.packets_taken + w.direct_taken || qp.receive_queue().empty()) {
    core_.Count(&DeviceCounters::rc_direct_sends_dropped);
    return;
  }
  RecvWr wr = std::move(qp.receive_queue().front());
  qp.receive_queue().pop_front();
  ++w.direct_taken;
  const std::span<const uint8_t> bytes = d.payload.subspan(wire::DirectSend::kSize);
  const WcStatus status = core_.Scatter(qp, wr.sg_list, 0, bytes);
  Completion c;
  if (status == WcStatus::kSuccess) {
    c = DeviceCore::MessageCompletion(qp, bytes.size(), h->solicited,
                                      h->with_imm ? std::optional<uint32_t>(h->imm) : std::nullopt);
    c.wr_id = wr.wr_id;
    c.opcode = WcOpcode::kRecv;
  } else {
    // Its own keys refused the bytes: as for a packet's (RcResponder::PlaceSend), the WQE completes in error and the
    // QP enters the error state; the initiator, told success already, learns it from its next message.
    c = DeviceCore::ReceiveError(qp, wr.wr_id, status);
  }
  core_.Complete(qp.init().recv_cq, c);
  core_.Count(&DeviceCounters::rc_direct_sends_received);
  if (w.flush_waiting && w.direct_taken >= w.flush_after) {
    w.flush_waiting = false;
    core_.FlushReceiveQueue(qp);
  } else if (status != WcStatus::kSuccess) {
    core_.EnterError(qp);
  } else {
    core_.PublishReceives(qp);
  }
}

static bool IsMulticastGroup(const wire::IpAddress& a) {
  if (a.is_v4()) return (a.v4() >> 28) == 0xE;  // 224.0.0.0/4
  return a.bytes()[0] == 0xFF;                   // ff00::/8
}

int Device::AttachMulticast(QueuePair* qp, const wire::IpAddress& group, bool* new_attachment) {
  if (new_attachment) *new_attachment = false;
  if (qp == nullptr || qp->type() != QpType::kUd || !IsMulticastGroup(group)) return EINVAL;
  const DeviceLimits& limits = core_.config.limits;
  std::unique_lock lock(objects_mu_);
  auto it = multicast_.find(group);
  if (it != multicast_.end() && std::find(it->second.begin(), it->second.end(), qp) != it->second.end())
    return 0;  // attaching twice is one attachment
  if (it == multicast_.end() && multicast_.size() >= limits.max_mcast_grp) return ENOMEM;
  if (it != multicast_.end() && it->second.size() >= limits.max_mcast_qp_attach) return ENOMEM;
  size_t attachments = 0;  // a few hundred groups at most: counted when needed rather than kept
  for (const auto& [g, qps] : multicast_) attachments += qps.size();
  if (attachments >= limits.max_total_mcast_qp_attach) return ENOMEM;
  multicast_[group].push_back(qp);
  if (new_attachment) *new_attachment = true;
  return 0;
}

int Device::DetachMulticast(QueuePair* qp, const wire::IpAddress& group) {
  if (qp == nullptr || qp->type() != QpType::kUd) return EINVAL;
  std::unique_lock lock(objects_mu_);
  auto it = multicast_.find(group);
  if (it == multicast_.end() || std::find(it->second.begin(), it->second.end(), qp) == it->second.end())
    return EINVAL;
  std::erase(it->second, qp);
  if (it->second.empty()) multicast_.erase(it);
  return 0;
}

QueuePair* Device::FindQpLocked(uint32_t qpn) {
  auto it = qps_.find(qpn);
  return it == qps_.end() ? nullptr : it->second.get();
}

// --- data path: work requests to the QP's transport ------------------------------------------------------------

int Device::PostSend(QueuePair* qp, SendWr&& wr) {
  OutBatch out;
  int err = 0;
  {
    std::shared_lock objects(objects_mu_);
    std::lock_guard lock(qp->mutex());
    const QpState s = qp->state();
    if (s == QpState::kReset || s == QpState::kInit || s == QpState::kRtr) return EINVAL;
    if (qp->type() == QpType::kXrcRecv) return EINVAL;  // an XRC target has no send queue (Annex A14)
    if (wr.sg_list.size() > qp->attributes().cap.max_send_sge) return EINVAL;
    if ((wr.flags & send_flags::kInline) && wr.inline_data.size() > qp->attributes().cap.max_inline_data)
      return EINVAL;
    if (s == QpState::kErr || s == QpState::kSqe) {
      // Accepted and flushed (IBTA 10.8.3.3, 10.3.1.5).
      core_.Complete(qp->init().send_cq, core_.SendCompletion(*qp, wr, WcStatus::kWrFlushErr));
      return 0;
    }
    switch (qp->type()) {
      case QpType::kUd:
        err = qp->ud().Post(wr, out);
        break;
      case QpType::kUc:
        err = qp->uc().Post(wr, out);
        break;
      case QpType::kRc:
      case QpType::kXrcSend:  // an XRC initiator is an RC requester whose packets name the target SRQ
        err = qp->requester().Post(wr, out);
        break;
      default:
        err = EOPNOTSUPP;
    }
  }
  Transmit(out);
  return err;
}

int Device::PostRecv(QueuePair* qp, RecvWr&& wr) {
  std::shared_lock objects(objects_mu_);
  std::lock_guard lock(qp->mutex());
  if (qp->state() == QpState::kReset) return EINVAL;
  // Receives of a QP on an SRQ are posted to the SRQ; XRC QPs have no receive queue (ibv_post_recv(3), Annex A14).
  if (qp->init().srq != nullptr || qp->type() == QpType::kXrcSend || qp->type() == QpType::kXrcRecv) return EINVAL;
  if (wr.sg_list.size() > qp->attributes().cap.max_recv_sge) return EINVAL;
  // Posted in the error state: flushed at once, unless the flush waits for direct SENDs (then it takes this too).
  if (qp->state() == QpState::kErr && !qp->direct_receives().flush_waiting) {
    const Completion c = DeviceCore::ReceiveError(*qp, wr.wr_id, WcStatus::kWrFlushErr);
    core_.Complete(qp->init().recv_cq, c);
    return 0;
  }
  if (qp->receive_queue().size() >= qp->attributes().cap.max_recv_wr) return ENOMEM;
  qp->receive_queue().push_back(std::move(wr));
  if (qp->direct_receives().open) core_.PublishReceives(*qp);
  return 0;
}

void Device::Transmit(OutBatch& out) {
  if (out.packets.empty()) return;
  core_.CountSent(core_.SendBatch(out));
}

// --- data path: packets to QPs ---------------------------------------------------------------------------------

void Device::OnDatagram(const wire::InDatagram& d, AckTiming acks) {
  // A holder's request to modify one of our target QPs: as ModifyQp, which takes the locks it needs.
  if (d.record == wire::RingRecord::kXrcTargetModify) return ModifyForHolder(d);
  OutBatch out;
  std::optional<GsiMad> gsi;
  HeldNotifications events;  // delivered once `out` has left (completion_queue.h)
  {
    std::shared_lock objects(objects_mu_);
    out.ack_timing = acks;
    OnDatagramLocked(d, out, gsi);
    // An event is about to wake an application, which may answer at once: the ACKs held for what it received leave
    // first, as an HCA's would have on arrival.
    if (acks == AckTiming::kNow || !events.handles().empty()) {
      if (core_.next_held_ack_due_ns.load(std::memory_order_relaxed) != 0) SendHeldAcksLocked(UINT64_MAX, out);
    } else {
      const uint64_t due = core_.next_held_ack_due_ns.load(std::memory_order_relaxed);
      if (due != 0) {
        const uint64_t now = core_.Now();
        if (due <= now) SendHeldAcksLocked(now, out);
      }
    }
  }
  Transmit(out);
  if (!events.handles().empty()) {
    std::shared_lock objects(objects_mu_);
    for (uint32_t handle : events.handles())
      if (auto it = cqs_.find(handle); it != cqs_.end()) it->second->Notify();  // unless destroyed meanwhile
  }
  if (gsi) cm_.OnMad(gsi->peer, gsi->qkey, gsi->src_qp, gsi->mad, gsi->local);
}

void Device::OnDatagramLocked(const wire::InDatagram& d, OutBatch& out, std::optional<GsiMad>& gsi) {
  if (d.record == wire::RingRecord::kDirectSend) return ReceiveDirectSendLocked(d);
  if (d.record == wire::RingRecord::kXrcDelivery) return ReceiveXrcDeliveryLocked(d);
  if (d.record == wire::RingRecord::kXrcTargetEvent) return ReceiveXrcTargetEventLocked(d);
  core_.Count(&DeviceCounters::rx_packets);
  core_.Count(&DeviceCounters::rx_bytes, d.payload.size());
  auto parsed = wire::ParsePacket(d.payload);
  if (!parsed) {
    core_.Count(&DeviceCounters::rx_malformed);
    return;
  }
  const wire::PacketView& p = *parsed;
  if (!IcrcVerifies(d)) return;
  if (p.info->transport == wire::TransportKind::kCnp) return ReceiveCnpLocked(d, p);
  if (p.bth.dest_qp == wire::kGsiQpn) return ReceiveGsiLocked(d, p, gsi);
  if (p.bth.dest_qp == wire::kMulticastQpn) return ReceiveMulticastLocked(d, p);
  QueuePair* qp = FindQpLocked(p.bth.dest_qp);
  if (qp == nullptr) {
    core_.Count(&DeviceCounters::rx_unknown_qp);
    return;
  }
  std::unique_lock lock(qp->mutex());
  if (!AcceptedByQp(*qp, d, p)) return;
  // Our queue is filling with what an unreliable sender sends (DeviceCore::kCnpIntervalNs): ask it to slow down.
  if (d.congestion_experienced && qp->type() == QpType::kUd && p.deth) {
    NotifyCongestionLocked(d.dst.addr, d.src.addr, p.deth->src_qp, out);
  } else if (d.congestion_experienced && qp->type() == QpType::kUc) {
    NotifyCongestionLocked(d.dst.addr, d.src.addr, qp->attributes().dest_qp_num, out);
  }
  DeliverToQpLocked(qp, lock, d, p, out);
}

// IBTA A17.3.3: a packet whose ICRC does not verify is silently dropped. A UDP socket cannot see the IPv4
// Identification the ICRC covers. uroce peers send ID 0 (DF from an unconnected socket), but kernel rxe and RoCE NICs
// send changing IDs, so with the ID unknown the ICRC is checked over everything else (RecoverIpId): a recovered ID of
// 0 is a full 32-bit check; any other ID leaves 16 bits of check, and is counted.
bool Device::IcrcVerifies(const wire::InDatagram& d) {
  if (d.icrc_vouched) {  // sealed by a process of this host, unaltered since (wire::InDatagram)
    core_.Count(&DeviceCounters::rx_icrc_vouched);
    return true;
  }
  if (d.ip_id.has_value() || !d.src.addr.is_v4()) {
    if (wire::VerifyIcrc(wire::Flow{d.src, d.dst, d.ip_id.value_or(0)}, d.payload).ok) return true;
    core_.Count(&DeviceCounters::rx_icrc_errors);
    return false;
  }
  const std::optional<uint16_t> id = wire::RecoverIpId(wire::Flow{d.src, d.dst, 0}, d.payload);
  if (!id) {
    core_.Count(&DeviceCounters::rx_icrc_errors);
    return false;
  }
  if (*id != 0) core_.Count(&DeviceCounters::rx_icrc_ip_id_inferred);
  return true;
}

// A CNP: the peer saw congestion marks on what the QP it names sent it (RoCEv2 Annex A17.9). Unreliable sending
// towards the peer is paced (PathWindow::OnUnreliableCnp); otherwise the RC window towards it is cut.
void Device::ReceiveCnpLocked(const wire::InDatagram& d, const wire::PacketView& p) {
  core_.Count(&DeviceCounters::rx_cnp);
  const QueuePair* named = FindQpLocked(p.bth.dest_qp);  // its type never changes: no lock needed to read it
  MutexLock lock(core_.paths_mu());
  if (named != nullptr && (named->type() == QpType::kUd || named->type() == QpType::kUc)) {
    core_.paths()[d.src.addr].OnUnreliableCnp(core_.Now());
  } else if (auto it = core_.paths().find(d.src.addr); it != core_.paths().end()) {
    it->second.OnCongestion();
    core_.Count(&DeviceCounters::rc_congestion_signals);
  }
}

// QP1, the GSI: CM MADs for the connection manager (rdmacm.md 4.1), which checks Q_Key and source QP itself.
void Device::ReceiveGsiLocked(const wire::InDatagram& d, const wire::PacketView& p, std::optional<GsiMad>& gsi) {
  if (!PkeyMatches(p.bth.pkey)) {
    core_.Count(&DeviceCounters::rx_bad_pkey);
  } else if (p.info->transport != wire::TransportKind::kUd || !p.deth) {
    core_.Count(&DeviceCounters::rx_wrong_transport);
  } else {
    gsi = GsiMad{d.src.addr, d.dst.addr, p.deth->qkey, p.deth->src_qp,
                 std::vector<uint8_t>(p.payload.begin(), p.payload.end())};
  }
}

// IBTA 10.5.2.3: a UD packet to the multicast QPN goes to every QP attached to its destination group.
void Device::ReceiveMulticastLocked(const wire::InDatagram& d, const wire::PacketView& p) {
  auto m = multicast_.find(d.dst.addr);
  if (m == multicast_.end() || p.info->transport != wire::TransportKind::kUd || !PkeyMatches(p.bth.pkey)) {
    core_.Count(&DeviceCounters::rx_unknown_qp);
    return;
  }
  for (QueuePair* member : m->second) {
    std::lock_guard lock(member->mutex());
    if (ReceivesInState(member->state())) {
      member->ud().Receive(d, p);
    } else {
      core_.Count(&DeviceCounters::rx_bad_state);
    }
  }
}

// IBTA 10.3.1: a QP in RESET, INIT or ERR drops what arrives.
bool Device::ReceivesInState(QpState s) {
  return s == QpState::kRtr || s == QpState::kRts || s == QpState::kSqd || s == QpState::kSqe;
}

// Transport header validation (IBTA 9.6) for the QP the BTH names, with its lock held: the opcode's transport is the
// QP's, a connected QP hears only its path's peer, the QP is in a state that receives, the P_Key matches.
bool Device::AcceptedByQp(const QueuePair& qp, const wire::InDatagram& d, const wire::PacketView& p) {
  const bool xrc = qp.type() == QpType::kXrcSend || qp.type() == QpType::kXrcRecv;
  const wire::TransportKind want = qp.type() == QpType::kUd   ? wire::TransportKind::kUd
                                   : qp.type() == QpType::kUc ? wire::TransportKind::kUc
                                   : xrc                      ? wire::TransportKind::kXrc
                                                              : wire::TransportKind::kRc;
  uint64_t DeviceCounters::*refused = nullptr;
  if (p.info->transport != want) {
    refused = &DeviceCounters::rx_wrong_transport;
  } else if (qp.type() != QpType::kUd && d.src.addr != qp.peer().addr) {
    // The UDP source port is the flow hash, not the peer's identity: the address is.
    refused = &DeviceCounters::rx_wrong_peer;
  } else if (!ReceivesInState(qp.state())) {
    refused = &DeviceCounters::rx_bad_state;
  } else if (!PkeyMatches(p.bth.pkey)) {
    refused = &DeviceCounters::rx_bad_pkey;
  }
  if (refused != nullptr) core_.Count(refused);
  return refused == nullptr;
}

// The QP's transport object takes the packet (`lock` holds the QP's lock; RC may release it to wake path waiters).
void Device::DeliverToQpLocked(QueuePair* qp, std::unique_lock<std::mutex>& lock, const wire::InDatagram& d,
                               const wire::PacketView& p, OutBatch& out) {
  switch (qp->type()) {
    case QpType::kUd:
      qp->ud().Receive(d, p);
      break;
    case QpType::kUc:
      qp->uc().Receive(p);
      break;
    case QpType::kRc:
    case QpType::kXrcSend:
      // An initiator only requests: what it receives are responses (Annex A14).
      if (qp->type() == QpType::kXrcSend && p.info->is_request) {
        core_.Count(&DeviceCounters::rx_wrong_transport);
        break;
      }
      if (ReceiveRcLocked(qp, p, out)) {
        // Requesters of other QPs waiting for the window this response opened resume, each under its own lock.
        const wire::IpAddress peer = qp->peer().addr;
        lock.unlock();
        WakePathWaitersLocked(peer, out);
      }
      break;
    case QpType::kXrcRecv:
      ReceiveXrcTargetLocked(qp, p, out);  // xrc.cc
      break;
    default:
      break;
  }
}

void Device::NotifyCongestionLocked(const wire::IpAddress& local, const wire::IpAddress& peer, uint32_t peer_qpn,
                                    OutBatch& out) {
  const uint64_t now = core_.Now();
  {
    MutexLock lock(core_.paths_mu());
    PathWindow& path = core_.paths()[peer];
    if (path.last_cnp_sent_ns != 0 && now - path.last_cnp_sent_ns < DeviceCore::kCnpIntervalNs) return;
    path.last_cnp_sent_ns = now;
  }
  // A17.9.2: BTH with opcode CNP, the BECN bit, the notified QP, PSN 0, then 16 reserved bytes.
  wire::PacketSpec spec;
  spec.bth.opcode = wire::opcode::kCnp;
  spec.bth.becn = true;
  spec.bth.dest_qp = peer_qpn;
  static constexpr uint8_t kReserved[16] = {};
  out.Add(core_.transport, spec, kReserved, local, {peer, wire::kRoceV2UdpPort}, wire::RoceSourcePort(peer_qpn, peer_qpn));
  core_.Count(&DeviceCounters::tx_cnp);
}

uint64_t Device::SendHeldLocked(QueuePair& qp, uint64_t now, OutBatch& out) {
  auto& held = qp.held_sends();
  while (!held.empty()) {
    if (qp.state() == QpState::kSqe || qp.state() == QpState::kErr) {
      // A send that failed moved the send queue to SQE: what waited behind it is flushed (IBTA 10.3.1.5).
      for (const HeldSend& h : held) core_.CompleteSend(qp, h.wr, WcStatus::kWrFlushErr);
      held.clear();
      break;
    }
    const uint64_t at = core_.UnreliableSendAt(held.front().peer);
    if (at > now) return at;
    const HeldSend h = std::move(held.front());
    held.pop_front();
    if (qp.type() == QpType::kUd) {
      qp.ud().Send(h.wr, h.peer, out);
    } else {
      qp.uc().Send(h.wr, out);
    }
  }
  return 0;
}

void Device::SendHeldAcks(uint64_t due_by_ns) {
  const uint64_t due = core_.next_held_ack_due_ns.load(std::memory_order_relaxed);
  if (due == 0 || due > due_by_ns) return;
  OutBatch out;
  {
    std::shared_lock objects(objects_mu_);
    SendHeldAcksLocked(due_by_ns, out);
  }
  Transmit(out);
}

// RunTimers' steps, with the object lock held shared and no QP's lock. Each returns the earliest deadline it leaves
// armed (0: none).

// Requesters waiting for room freed outside the completer first: what they send arms timers counted after.
void Device::WakeAllPathWaitersLocked(OutBatch& out) {
  std::vector<wire::IpAddress> peers;
  {
    MutexLock lock(core_.paths_mu());
    for (auto& [peer, path] : core_.paths())
      if (!path.waiting().empty()) peers.push_back(peer);
  }
  for (const wire::IpAddress& peer : peers) WakePathWaitersLocked(peer, out);
}

// UC/UD sends held for a peer's pause: those whose pause ended leave, in order; the rest wait for theirs.
uint64_t Device::SendHeldUnreliableLocked(uint64_t now, OutBatch& out) {
  uint64_t next = 0;
  std::vector<uint32_t> held;
  {
    MutexLock lock(core_.timers_mu());
    held.swap(core_.held_qps());
  }
  for (uint32_t qpn : held) {
    QueuePair* qp = FindQpLocked(qpn);
    if (qp == nullptr) continue;
    std::lock_guard lock(qp->mutex());
    if (const uint64_t until = SendHeldLocked(*qp, now, out)) {
      next = wire::EarlierDeadline(next, until);
      MutexLock timers(core_.timers_mu());
      core_.held_qps().push_back(qpn);
    }
  }
  return next;
}

// The RC requesters with a timer armed, each under its own lock. Those that still have one afterwards are listed
// again; a timer armed meanwhile (another QP's progress, another thread) lists its QP in core_.timed_qps() already.
uint64_t Device::RunRequesterTimersLocked(uint64_t now, OutBatch& out) {
  wire::ScratchList<uint32_t> timed;  // as SendHeldAcksLocked's list: storage exchanged, not allocated
  {
    MutexLock lock(core_.timers_mu());
    timed->swap(core_.timed_qps());
  }
  for (uint32_t qpn : *timed) {
    QueuePair* qp = FindQpLocked(qpn);
    if (qp == nullptr) continue;
    std::lock_guard lock(qp->mutex());
    RcRequester& requester = qp->requester();
    requester.set_timer_listed(false);
    if (qp->type() != QpType::kRc && qp->type() != QpType::kXrcSend) continue;
    requester.OnTimers(now, out);
    if (requester.NextDeadline() != 0 && !requester.timer_listed()) {
      requester.set_timer_listed(true);
      core_.ListTimed(qpn);
    }
  }
  {
    MutexLock lock(core_.timers_mu());
    timed->assign(core_.timed_qps().begin(), core_.timed_qps().end());
  }
  uint64_t next = 0;
  for (uint32_t qpn : *timed) {
    if (QueuePair* qp = FindQpLocked(qpn)) {
      std::lock_guard lock(qp->mutex());
      next = wire::EarlierDeadline(next, qp->requester().NextDeadline());
    }
  }
  return next;
}

// A requester that failed in RunRequesterTimersLocked may have left room for others: come back at once for them.
bool Device::PathWaitersMayWakeLocked() {
  MutexLock lock(core_.paths_mu());
  for (auto& [peer, path] : core_.paths())
    if (path.MayWake() && !path.waiting().empty()) return true;
  return false;
}

uint64_t Device::RunTimers(uint64_t poller_returns_by_ns) {
  OutBatch out;
  uint64_t next = 0;
  bool unheld_targets = false;
  {
    std::shared_lock objects(objects_mu_);
    const uint64_t now = core_.Now();
    // Held ACKs whose time is up leave (AckTiming::kHeld); the poller comes back for the next one.
    SendHeldAcksLocked(now, out);
    next = core_.next_held_ack_due_ns.load(std::memory_order_relaxed);
    WakeAllPathWaitersLocked(out);
    next = wire::EarlierDeadline(next, SendHeldUnreliableLocked(now, out));
    next = wire::EarlierDeadline(next, RunRequesterTimersLocked(now, out));
    next = wire::EarlierDeadline(next, FlushOverdueReceivesLocked(now));
    if (PathWaitersMayWakeLocked()) next = now;
    // Our target QPs other processes hold handles on: asked again whether they still do.
    unheld_targets = !unheld_targets_.empty();
    if (unheld_targets) next = wire::EarlierDeadline(next, now + kUnheldTargetLookNs);
    next = wire::EarlierDeadline(next, EndOrphanedMessagesLocked(now));
    MutexLock lock(core_.timers_mu());
    core_.poller_deadline() = wire::EarlierDeadline(next, poller_returns_by_ns);
  }
  if (unheld_targets) EndUnheldTargets(out);  // (it takes the object lock exclusively to destroy them)
  Transmit(out);
  return wire::EarlierDeadline(next, cm_.RunTimers());
}

uint64_t Device::FlushOverdueReceivesLocked(uint64_t now) {
  std::vector<uint32_t> qpns;
  {
    MutexLock lock(core_.timers_mu());
    if (core_.flush_waiting_qps().empty()) return 0;
    qpns.swap(core_.flush_waiting_qps());
  }
  std::vector<uint32_t> still;
  uint64_t next = 0;
  for (uint32_t qpn : qpns) {
    QueuePair* found = FindQpLocked(qpn);
    if (found == nullptr) continue;  // destroyed since
    QueuePair& qp = *found;
    std::lock_guard lock(qp.mutex());
    DirectReceives& w = qp.direct_receives();
    if (!w.flush_waiting) continue;  // what it waited for came
    if (now < w.flush_deadline_ns) {
      still.push_back(qpn);
      next = wire::EarlierDeadline(next, w.flush_deadline_ns);
      continue;
    }
    // Counted, never read: what they stood for is lost with them, and the receive queue's flush goes on.
    core_.Count(&DeviceCounters::rc_direct_sends_dropped, w.flush_after - w.direct_taken);
    w.flush_waiting = false;
    core_.FlushReceiveQueue(qp);
  }
  if (!still.empty()) {
    MutexLock lock(core_.timers_mu());
    auto& waiting = core_.flush_waiting_qps();
    waiting.insert(waiting.end(), still.begin(), still.end());
  }
  return next;
}

uint64_t SendWr::TotalLength() const {
  if (flags & send_flags::kInline) return inline_data.size();
  uint64_t n = 0;
  for (const Sge& s : sg_list) n += s.length;
  return n;
}

uint64_t RecvWr::TotalLength() const {
  uint64_t n = 0;
  for (const Sge& s : sg_list) n += s.length;
  return n;
}

}  // namespace uroce::emu
