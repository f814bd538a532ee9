#include "emu/device.h"

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "emu/out_batch.h"
#include "emu/qp_state_machine.h"
#include "wire/bytes.h"
#include "wire/frame.h"
#include "wire/headers.h"
#include "wire/icrc.h"
#include "wire/opcode.h"
#include "wire/packet.h"

namespace uroce::emu {
namespace {

// RoCEv2 places the IP header of a received UD datagram in the 40-byte GRH slot at the head of the receive buffer;
// for IPv4 the 20-byte header fills the slot's last 20 bytes (rdma-core's ibv_init_ah_from_wc reads it there).
constexpr size_t kGrhSize = 40;

void BuildGrh(const wire::InDatagram& d, size_t payload_len, uint8_t grh[kGrhSize]) {
  std::memset(grh, 0, kGrhSize);
  wire::Flow flow{d.src, d.dst, d.ip_id.value_or(0)};
  const bool v6 = !d.src.addr.is_v4();
  // An IP header of the right length, addresses and (for IPv4) a valid checksum; the UDP header that
  // BuildIpUdpFrame appends after it is not copied.
  std::vector<uint8_t> frame(wire::IpUdpFrameLength(v6, 0));
  wire::BuildIpUdpFrame(flow, {}, frame);
  if (v6) {
    std::memcpy(grh, frame.data(), 40);
    wire::StoreBe16(grh + 4, static_cast<uint16_t>(payload_len));
  } else {
    std::memcpy(grh + 20, frame.data(), 20);
  }
}

bool PkeyMatches(uint16_t pkey) { return (pkey & 0x7fff) == 0x7fff; }  // only the default partition exists

}  // namespace

Device::Device(DeviceConfig config, wire::Transport& transport, const wire::Clock& clock)
    : config_(std::move(config)),
      transport_(transport),
      clock_(clock),
      cm_(CmConfig{.ca_guid = config_.node_guid}, transport, clock) {}

Device::~Device() = default;

std::string FormatCounters(const DeviceCounters& c) {
  // One table: adding a counter to DeviceCounters means one line here.
  static constexpr std::pair<const char*, uint64_t DeviceCounters::*> kFields[] = {
      {"tx_packets", &DeviceCounters::tx_packets},
      {"tx_bytes", &DeviceCounters::tx_bytes},
      {"tx_errors", &DeviceCounters::tx_errors},
      {"rx_packets", &DeviceCounters::rx_packets},
      {"rx_bytes", &DeviceCounters::rx_bytes},
      {"rx_malformed", &DeviceCounters::rx_malformed},
      {"rx_icrc_errors", &DeviceCounters::rx_icrc_errors},
      {"rx_icrc_ip_id_inferred", &DeviceCounters::rx_icrc_ip_id_inferred},
      {"rx_wrong_peer", &DeviceCounters::rx_wrong_peer},
      {"rx_unknown_qp", &DeviceCounters::rx_unknown_qp},
      {"rx_wrong_transport", &DeviceCounters::rx_wrong_transport},
      {"rx_bad_state", &DeviceCounters::rx_bad_state},
      {"rx_bad_pkey", &DeviceCounters::rx_bad_pkey},
      {"rx_bad_qkey", &DeviceCounters::rx_bad_qkey},
      {"rx_no_receive_wqe", &DeviceCounters::rx_no_receive_wqe},
      {"rx_out_of_sequence", &DeviceCounters::rx_out_of_sequence},
      {"rx_remote_access_denied", &DeviceCounters::rx_remote_access_denied},
      {"rx_cnp", &DeviceCounters::rx_cnp},
      {"cq_overflows", &DeviceCounters::cq_overflows},
      {"rc_retransmit_timeouts", &DeviceCounters::rc_retransmit_timeouts},
      {"rc_early_retransmits", &DeviceCounters::rc_early_retransmits},
      {"rc_duplicates", &DeviceCounters::rc_duplicates},
      {"rc_rnr_naks_sent", &DeviceCounters::rc_rnr_naks_sent},
      {"rc_path_waits", &DeviceCounters::rc_path_waits},
      {"rc_congestion_signals", &DeviceCounters::rc_congestion_signals},
  };
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
  for (const auto& [name, field] : kFields) out += std::string(name) + " " + std::to_string(c.*field) + "\n";
  for (const auto& [name, field] : kCmFields) out += std::string(name) + " " + std::to_string(c.cm.*field) + "\n";
  return out;
}

DeviceCounters Device::counters() const {
  DeviceCounters c;
  {
    std::lock_guard lock(mu_);
    c = counters_;
  }
  c.cm = cm_.counters();  // its own lock, taken without the device's
  return c;
}

std::optional<PathWindow> Device::path_window(const wire::IpAddress& peer) const {
  std::lock_guard lock(mu_);
  auto it = paths_.find(peer);
  if (it == paths_.end()) return std::nullopt;
  return it->second;
}

void Device::set_async_handler(std::function<void(const AsyncEvent&)> handler) {
  std::lock_guard lock(mu_);
  async_handler_ = std::move(handler);
}

// --- objects ----------------------------------------------------------------------------------------------------

ProtectionDomain* Device::AllocPd() {
  std::lock_guard lock(mu_);
  if (pds_.size() >= config_.limits.max_pd) return nullptr;
  const uint32_t handle = next_pd_++;
  auto& pd = pds_[handle];
  pd = std::make_unique<ProtectionDomain>(handle);
  return pd.get();
}

int Device::DeallocPd(ProtectionDomain* pd) {
  std::lock_guard lock(mu_);
  auto it = pds_.find(pd->handle());
  if (it == pds_.end() || it->second.get() != pd) return EINVAL;
  for (auto& [_, qp] : qps_)
    if (qp->init().pd == pd) return EBUSY;
  for (auto& [_, ah] : ahs_)
    if (ah->pd() == pd) return EBUSY;
  for (auto& [_, srq] : srqs_)
    if (srq->pd() == pd) return EBUSY;
  if (keys_.AnyInPd(pd)) return EBUSY;
  pds_.erase(it);
  return 0;
}

int Device::RegisterMr(ProtectionDomain* pd, void* host, uint64_t length, uint64_t iova, uint32_t access,
                       MemoryRegion* out) {
  // IBTA 10.6.3.1 (C10-??): remote write or remote atomic access requires local write access.
  if ((access & (access::kRemoteWrite | access::kRemoteAtomic)) && !(access & access::kLocalWrite)) return EINVAL;
  constexpr uint32_t kKnown = access::kLocalWrite | access::kRemoteWrite | access::kRemoteRead |
                              access::kRemoteAtomic | access::kMwBind | access::kZeroBased | access::kOnDemand |
                              access::kHugetlb | access::kRelaxedOrdering;
  if (access & ~kKnown & 0xfffff) return EINVAL;  // optional bits (>= 1 << 20) may be ignored, per verbs.h
  // Implicit ODP (ibv_reg_mr(3)): addr NULL and length SIZE_MAX with IBV_ACCESS_ON_DEMAND covers the address space.
  const bool implicit = host == nullptr && length == SIZE_MAX && (access & access::kOnDemand);
  if (pd == nullptr || (host == nullptr && length != 0 && !implicit)) return EINVAL;
  std::lock_guard lock(mu_);
  if (keys_.size() >= config_.limits.max_mr) return ENOMEM;
  MemoryRegion mr{pd, static_cast<uint8_t*>(host), implicit ? 0 : iova, length, access, 0, 0};
  mr.implicit = implicit;
  *out = keys_.Register(mr);
  return 0;
}

int Device::ReregisterMr(uint32_t lkey, ProtectionDomain* pd, void* host, uint64_t length, uint64_t iova,
                         uint32_t access, MemoryRegion* out) {
  if ((access & (access::kRemoteWrite | access::kRemoteAtomic)) && !(access & access::kLocalWrite)) return EINVAL;
  std::lock_guard lock(mu_);
  const MemoryRegion* cur = keys_.Find(lkey);
  if (cur == nullptr) return EINVAL;
  MemoryRegion mr{pd, static_cast<uint8_t*>(host), iova, length, access, 0, 0};
  if (!keys_.Update(lkey, mr)) return EINVAL;
  *out = *keys_.Find(lkey);
  return 0;
}

int Device::DeregisterMr(uint32_t lkey) {
  std::lock_guard lock(mu_);
  return keys_.Deregister(lkey) ? 0 : EINVAL;
}

ProtectionDomain* Device::FindPd(uint32_t handle) {
  std::lock_guard lock(mu_);
  auto it = pds_.find(handle);
  return it == pds_.end() ? nullptr : it->second.get();
}

int Device::QueryMrByHandle(uint32_t handle, MemoryRegion* out) const {
  std::lock_guard lock(mu_);
  const MemoryRegion* mr = keys_.FindByHandle(handle);
  if (mr == nullptr) return EINVAL;
  *out = *mr;
  return 0;
}

int Device::QueryMr(uint32_t lkey, MemoryRegion* out) const {
  std::lock_guard lock(mu_);
  const MemoryRegion* mr = keys_.Find(lkey);
  if (mr == nullptr) return EINVAL;
  *out = *mr;
  return 0;
}

int Device::AllocMw(ProtectionDomain* pd, uint8_t type, uint32_t* rkey) {
  if (pd == nullptr || (type != 1 && type != 2)) return EINVAL;
  std::lock_guard lock(mu_);
  *rkey = keys_.AllocateWindow(pd, type);
  return 0;
}

int Device::DeallocMw(uint32_t rkey) {
  std::lock_guard lock(mu_);
  return keys_.DeallocateWindow(rkey);
}

WcStatus Device::ExecuteLocalOpLocked(QueuePair* qp, const SendWr& wr) {
  if (wr.opcode == SendOpcode::kLocalInv) {
    // LOCAL_INV invalidates a type 2 window (regions are not invalidatable here: no fast-register MRs).
    return keys_.InvalidateWindow(wr.invalidate_rkey, 0) == 0 ? WcStatus::kSuccess : WcStatus::kLocQpOpErr;
  }
  const SendWr::Bind& b = wr.bind;
  const MemoryWindow* w = keys_.FindWindow(b.mw_rkey);
  if (w == nullptr) return WcStatus::kMwBindErr;
  // A type 2 window binds to the QP that executes the bind (IBTA 10.6.7.2.2).
  const uint32_t qpn = w->type == 2 ? qp->qpn() : 0;
  return keys_.BindWindow(b.mw_rkey, b.new_rkey, qp->init().pd, b.mr_lkey, b.addr, b.length, b.access, qpn) == 0
             ? WcStatus::kSuccess
             : WcStatus::kMwBindErr;
}

int Device::CreateCq(uint32_t capacity, CompletionQueue** out) {
  if (capacity == 0 || capacity > config_.limits.max_cqe) return EINVAL;
  std::lock_guard lock(mu_);
  if (cqs_.size() >= config_.limits.max_cq) return ENOMEM;
  const uint32_t handle = next_cq_++;
  auto& cq = cqs_[handle];
  cq = std::make_unique<CompletionQueue>(handle, capacity);
  *out = cq.get();
  return 0;
}

int Device::ResizeCq(CompletionQueue* cq, uint32_t capacity) {
  if (capacity == 0 || capacity > config_.limits.max_cqe) return EINVAL;
  return cq->Resize(capacity);
}

int Device::DestroyCq(CompletionQueue* cq) {
  std::lock_guard lock(mu_);
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
  if (!av.is_global || av.sgid_index >= config_.limits.gid_table_len || av.port_num != 1) return EINVAL;
  std::lock_guard lock(mu_);
  if (ahs_.size() >= config_.limits.max_ah) return ENOMEM;
  auto ah = std::make_unique<AddressHandle>(pd, av);
  *out = ah.get();
  ahs_[ah.get()] = std::move(ah);
  return 0;
}

int Device::DestroyAh(AddressHandle* ah) {
  std::lock_guard lock(mu_);
  return ahs_.erase(ah) ? 0 : EINVAL;
}

int Device::CreateQp(QpInitAttributes& init, QueuePair** out) {
  const DeviceLimits& lim = config_.limits;
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
  std::lock_guard lock(mu_);
  if (qps_.size() >= lim.max_qp) return ENOMEM;
  if (int err = AttachSharedReceiveLocked(init)) return err;
  uint32_t qpn = next_qpn_;
  while (qps_.count(qpn)) qpn = (qpn + 1) & 0xffffff;
  next_qpn_ = std::max<uint32_t>((qpn + 1) & 0xffffff, 0x11);
  auto qp = std::make_unique<QueuePair>(qpn, init);
  qp->mutable_attributes().path_mtu = config_.active_mtu;
  *out = qp.get();
  qps_[qpn] = std::move(qp);
  return 0;
}

int Device::ModifyQp(QueuePair* qp, const QpAttributes& attr, uint32_t mask) {
  OutBatch out;
  int err;
  {
    std::lock_guard lock(mu_);
    // A real HCA would have sent a held ACK long before the QP leaves the states that send (AckTiming::kHeld).
    const QpState next = (mask & attr::kState) ? attr.qp_state : qp->state();
    if (next == QpState::kReset || next == QpState::kErr) RcSendHeldAckLocked(qp, out);
    err = ModifyQpLocked(qp, attr, mask);
    // Work posted while the QP could not send (SQD) goes out once it can.
    if (err == 0 && (qp->type() == QpType::kRc || qp->type() == QpType::kXrcSend) && qp->state() == QpState::kRts)
      RcProgressLocked(qp, out);
  }
  Transmit(out);
  return err;
}

int Device::ModifyQpLocked(QueuePair* qp, const QpAttributes& attr, uint32_t mask) {
  const QpState cur = qp->state();
  const QpState next = (mask & attr::kState) ? attr.qp_state : cur;
  if (int err = CheckModify(qp->attributes(), attr, mask, qp->type(), config_.limits, config_.active_mtu)) return err;
  ApplyAttributes(qp->mutable_attributes(), attr, mask);
  QpAttributes& a = qp->mutable_attributes();
  a.qp_state = next;
  a.cur_qp_state = next;
  if (next == QpState::kReset && cur != QpState::kReset) {
    // IBTA 10.3.1: a QP moved to RESET loses its queued work without completions, and (as on mlx4/mlx5) the
    // completions it left in its CQs.
    for (CompletionQueue* cq : {qp->init().send_cq, qp->init().recv_cq})
      if (cq != nullptr) cq->RemoveQp(qp->qpn());
    qp->receive_queue().clear();
    qp->inbound() = InboundMessage{};
    RcChargeLocked(qp);  // nothing of it is in flight any more
    qp->requester() = RcRequester{};
    qp->responder() = RcResponder{};
  }
  if (next == QpState::kRts && cur != QpState::kRts) {
    RcRequester& r = qp->requester();
    r.retries_left = a.retry_cnt;
    r.rnr_retries_left = a.rnr_retry;
    if (cur != QpState::kSqd) r.acked_psn_next = r.sent_psn_next = a.sq_psn;
  }
  if (next == QpState::kSqd && cur == QpState::kRts) {
    // IBTA 11.2.4.2: SQD stops starting new WQEs; IBV_EVENT_SQ_DRAINED once those in flight are done (at once when
    // none are).
    qp->requester().drained_event_pending = a.en_sqd_async_notify;
    a.sq_draining = true;
    RcCompleteInOrderLocked(qp);
  }
  if (cur == QpState::kSqd && next == QpState::kRts) a.sq_draining = false;
  if (next == QpState::kErr && cur != QpState::kErr) FlushLocked(qp);
  return 0;
}

int Device::QueryQp(QueuePair* qp, QpAttributes* attr) {
  std::lock_guard lock(mu_);
  *attr = qp->attributes();
  return 0;
}

int Device::DestroyQp(QueuePair* qp) {
  OutBatch out;
  {
    std::lock_guard lock(mu_);
    auto it = qps_.find(qp->qpn());
    if (it == qps_.end() || it->second.get() != qp) return EINVAL;
    if (--qp->references > 0) return 0;  // an opened XRC target lives on (ibv_open_qp(3))
    // The ACK of the last message received leaves (ibv_rc_pingpong destroys its QP right after that message).
    RcSendHeldAckLocked(qp, out);
    DetachSharedReceiveLocked(qp->init());
    for (auto m = multicast_.begin(); m != multicast_.end();) {
      std::erase(m->second, qp);
      m = m->second.empty() ? multicast_.erase(m) : std::next(m);
    }
    qp->mutable_attributes().qp_state = QpState::kReset;
    RcChargeLocked(qp);  // what it had in flight no longer counts against its path
    qps_.erase(it);
  }
  Transmit(out);
  return 0;
}

static bool IsMulticastGroup(const wire::IpAddress& a) {
  if (a.is_v4()) return (a.v4() >> 28) == 0xE;  // 224.0.0.0/4
  return a.bytes()[0] == 0xFF;                   // ff00::/8
}

int Device::AttachMulticast(QueuePair* qp, const wire::IpAddress& group) {
  if (qp == nullptr || qp->type() != QpType::kUd || !IsMulticastGroup(group)) return EINVAL;
  std::lock_guard lock(mu_);
  std::vector<QueuePair*>& qps = multicast_[group];
  if (std::find(qps.begin(), qps.end(), qp) == qps.end()) qps.push_back(qp);  // attaching twice is one attachment
  return 0;
}

int Device::DetachMulticast(QueuePair* qp, const wire::IpAddress& group) {
  if (qp == nullptr || qp->type() != QpType::kUd) return EINVAL;
  std::lock_guard lock(mu_);
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

// --- completions and events ---------------------------------------------------------------------------------------

void Device::RaiseLocked(const AsyncEvent& e) {
  if (async_handler_) async_handler_(e);
}

void Device::CompleteLocked(CompletionQueue* cq, const Completion& c) {
  if (cq == nullptr) return;  // an XRC QP has no CQ for the direction it does not have
  Completion stamped = c;
  stamped.timestamp_ns = clock_.NowNs();
  if (!cq->Push(stamped)) {
    ++counters_.cq_overflows;
    RaiseLocked({AsyncEventType::kCqErr, nullptr, cq});
  }
}

Completion Device::SendCompletion(const QueuePair& qp, const SendWr& wr, WcStatus status) const {
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

void Device::CompleteSendLocked(QueuePair* qp, const SendWr& wr, WcStatus status) {
  // Unsignaled WRs complete silently unless they fail (IBTA 10.7.2.1; ibv_post_send(3): "sq_sig_all").
  const bool signaled = qp->init().sq_sig_all || (wr.flags & send_flags::kSignaled);
  if (status == WcStatus::kSuccess && !signaled) return;
  CompleteLocked(qp->init().send_cq, SendCompletion(*qp, wr, status));
}

Completion Device::ReceiveError(const QueuePair& qp, uint64_t wr_id, WcStatus status) const {
  Completion c;
  c.wr_id = wr_id;
  c.status = status;
  c.opcode = WcOpcode::kRecv;
  c.qp_num = qp.qpn();
  return c;
}

void Device::FailUnreliableSendLocked(QueuePair* qp, const SendWr& wr, WcStatus status) {
  // A failed UD/UC send moves the send queue to SQE (IBTA 10.3.1.5); receives go on.
  CompleteSendLocked(qp, wr, status);
  QpAttributes& a = qp->mutable_attributes();
  a.qp_state = a.cur_qp_state = QpState::kSqe;
}

void Device::FlushLocked(QueuePair* qp) {
  // A QP that takes its WQEs from an SRQ consumes no more of them once in the error state: the consumer learns it may
  // detach with IBV_EVENT_QP_LAST_WQE_REACHED (IBTA 10.3.1 / 11.6.3.1; the SRQ's own WQEs are not flushed).
  if (qp->init().srq != nullptr || qp->type() == QpType::kXrcRecv)
    RaiseLocked({AsyncEventType::kQpLastWqeReached, qp});
  // IBTA 10.3.1 / ibv_modify_qp(3): in the error state outstanding WRs complete with IBV_WC_WR_FLUSH_ERR.
  auto& rq = qp->receive_queue();
  for (const RecvWr& r : rq) {
    const Completion c = ReceiveError(*qp, r.wr_id, WcStatus::kWrFlushErr);
    CompleteLocked(qp->init().recv_cq, c);
  }
  rq.clear();
  if (qp->inbound().rqe) {
    const Completion c = ReceiveError(*qp, qp->inbound().rqe->wr_id, WcStatus::kWrFlushErr);
    CompleteLocked(qp->init().recv_cq, c);
  }
  qp->inbound() = InboundMessage{};
  // Send WQEs not yet completed (RC) complete flushed, in order (IBTA 10.3.1, 11.4.4).
  RcRequester& rq_state = qp->requester();
  for (SendWqe& w : rq_state.sq) {
    Completion c = SendCompletion(*qp, w.wr, w.status == WcStatus::kSuccess ? WcStatus::kWrFlushErr : w.status);
    CompleteLocked(qp->init().send_cq, c);
  }
  rq_state.sq.clear();
  rq_state.cursor_wqe = 0;
  rq_state.cursor_pkt = 0;
  rq_state.retransmit_deadline_ns = rq_state.rnr_deadline_ns = 0;
  rq_state.rtt_sent_ns = 0;
}

uint8_t* Device::WriteTargetLocked(const QueuePair& qp, const InboundMessage& m, size_t len) {
  const AccessResult acc =
      keys_.CheckRemote(m.write_rkey, qp.init().pd, m.write_va + m.offset, len, access::kRemoteWrite, qp.qpn());
  return acc.ok() ? acc.host : nullptr;
}

void Device::EnterErrorLocked(QueuePair* qp) {
  QpAttributes& a = qp->mutable_attributes();
  if (a.qp_state == QpState::kErr) return;
  a.qp_state = a.cur_qp_state = QpState::kErr;
  RcChargeLocked(qp);
  FlushLocked(qp);
}

// --- data path: requester ------------------------------------------------------------------------------------

WcStatus Device::GatherLocked(const QueuePair& qp, const SendWr& wr, std::vector<uint8_t>& out) {
  out.clear();
  if (wr.flags & send_flags::kInline) {
    out = wr.inline_data;
    return WcStatus::kSuccess;
  }
  out.reserve(wr.TotalLength());
  for (const Sge& sge : wr.sg_list) {
    if (sge.length == 0) continue;
    AccessResult r = keys_.CheckLocal(sge.lkey, qp.init().pd, sge.addr, sge.length, 0);
    if (!r.ok()) return WcStatus::kLocProtErr;
    out.insert(out.end(), r.host, r.host + sge.length);
  }
  return WcStatus::kSuccess;
}

int Device::PostSend(QueuePair* qp, SendWr&& wr) {
  OutBatch out;
  int err = 0;
  {
    std::lock_guard lock(mu_);
    const QpState s = qp->state();
    if (s == QpState::kReset || s == QpState::kInit || s == QpState::kRtr) return EINVAL;
    if (qp->type() == QpType::kXrcRecv) return EINVAL;  // an XRC target has no send queue (Annex A14)
    if (wr.sg_list.size() > qp->attributes().cap.max_send_sge) return EINVAL;
    if ((wr.flags & send_flags::kInline) && wr.inline_data.size() > qp->attributes().cap.max_inline_data)
      return EINVAL;
    if (s == QpState::kErr || s == QpState::kSqe) {
      // Accepted and flushed (IBTA 10.8.3.3, 10.3.1.5).
      CompleteLocked(qp->init().send_cq, SendCompletion(*qp, wr, WcStatus::kWrFlushErr));
      return 0;
    }
    switch (qp->type()) {
      case QpType::kUd:
        err = PostSendUdLocked(qp, wr, out);
        break;
      case QpType::kUc:
        err = PostSendUcLocked(qp, wr, out);
        break;
      case QpType::kRc:
      case QpType::kXrcSend:  // an XRC initiator is an RC requester whose packets name the target SRQ
        err = PostSendRcLocked(qp, wr, out);
        break;
      default:
        err = EOPNOTSUPP;
    }
  }
  Transmit(out);
  return err;
}

int Device::PostSendUdLocked(QueuePair* qp, SendWr& wr, OutBatch& out) {
  if (wr.opcode != SendOpcode::kSend && wr.opcode != SendOpcode::kSendWithImm) return EINVAL;
  if (wr.ah == nullptr || wr.ah->pd() != qp->init().pd) return EINVAL;
  std::vector<uint8_t> payload;
  WcStatus st = GatherLocked(*qp, wr, payload);
  if (st == WcStatus::kSuccess && payload.size() > MtuBytes(config_.active_mtu)) st = WcStatus::kLocLenErr;
  if (st != WcStatus::kSuccess) {
    FailUnreliableSendLocked(qp, wr, st);
    return 0;
  }
  wire::PacketSpec spec;
  spec.bth.opcode = wr.opcode == SendOpcode::kSendWithImm ? wire::opcode::kUdSendOnlyWithImmediate : wire::opcode::kUdSendOnly;
  spec.bth.solicited = wr.flags & send_flags::kSolicited;
  spec.bth.dest_qp = wr.remote_qpn;
  spec.bth.psn = qp->NextSendPsn();
  // IBTA 10.2.4: a Q_Key with the high-order bit set means "use the QP's own Q_Key".
  const uint32_t qkey = (wr.remote_qkey & 0x80000000u) ? qp->attributes().qkey : wr.remote_qkey;
  spec.deth = wire::Deth{qkey, 0, qp->qpn()};
  spec.imm = wire::ImmDt{wr.imm_data};
  const wire::UdpEndpoint dst{wr.ah->destination(), wire::kRoceV2UdpPort};
  out.Add(transport_, spec, payload, dst, wire::RoceSourcePort(qp->qpn(), wr.remote_qpn));
  CompleteSendLocked(qp, wr, WcStatus::kSuccess);
  return 0;
}

int Device::PostSendUcLocked(QueuePair* qp, SendWr& wr, OutBatch& out) {
  if (wr.opcode == SendOpcode::kBindMw || wr.opcode == SendOpcode::kLocalInv) {
    const WcStatus st = ExecuteLocalOpLocked(qp, wr);
    if (st == WcStatus::kSuccess) {
      CompleteSendLocked(qp, wr, st);
    } else {
      FailUnreliableSendLocked(qp, wr, st);
    }
    return 0;
  }
  const bool is_write = wr.opcode == SendOpcode::kRdmaWrite || wr.opcode == SendOpcode::kRdmaWriteWithImm;
  const bool is_send = wr.opcode == SendOpcode::kSend || wr.opcode == SendOpcode::kSendWithImm;
  if (!is_write && !is_send) return EINVAL;  // UC has no READ, atomics or invalidate (IBTA table 39)
  std::vector<uint8_t> payload;
  WcStatus st = GatherLocked(*qp, wr, payload);
  if (st == WcStatus::kSuccess && payload.size() > config_.limits.max_msg_sz) st = WcStatus::kLocLenErr;
  if (st != WcStatus::kSuccess) {
    FailUnreliableSendLocked(qp, wr, st);
    return 0;
  }
  const QpAttributes& a = qp->attributes();
  const size_t mtu = MtuBytes(a.path_mtu);
  const bool imm = wr.opcode == SendOpcode::kSendWithImm || wr.opcode == SendOpcode::kRdmaWriteWithImm;
  const wire::UdpEndpoint dst{wire::IpAddress::FromBytes(a.ah_attr.dgid.data()), wire::kRoceV2UdpPort};
  const uint16_t sport = wire::RoceSourcePort(qp->qpn(), a.dest_qp_num);
  const size_t total = payload.size();
  const size_t packets = total == 0 ? 1 : (total + mtu - 1) / mtu;
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
    spec.bth.psn = qp->NextSendPsn();
    if (is_write && first) spec.reth = wire::Reth{wr.remote_addr, wr.rkey, static_cast<uint32_t>(total)};
    if (imm && last) spec.imm = wire::ImmDt{wr.imm_data};
    const size_t off = i * mtu;
    const size_t len = std::min(mtu, total - std::min(total, off));
    out.Add(transport_, spec, std::span<const uint8_t>(payload).subspan(std::min(off, total), len), dst, sport);
  }
  CompleteSendLocked(qp, wr, WcStatus::kSuccess);
  return 0;
}

int Device::PostRecv(QueuePair* qp, RecvWr&& wr) {
  std::lock_guard lock(mu_);
  if (qp->state() == QpState::kReset) return EINVAL;
  // Receives of a QP on an SRQ are posted to the SRQ; XRC QPs have no receive queue (ibv_post_recv(3), Annex A14).
  if (qp->init().srq != nullptr || qp->type() == QpType::kXrcSend || qp->type() == QpType::kXrcRecv) return EINVAL;
  if (wr.sg_list.size() > qp->attributes().cap.max_recv_sge) return EINVAL;
  if (qp->state() == QpState::kErr) {
    const Completion c = ReceiveError(*qp, wr.wr_id, WcStatus::kWrFlushErr);
    CompleteLocked(qp->init().recv_cq, c);
    return 0;
  }
  if (qp->receive_queue().size() >= qp->attributes().cap.max_recv_wr) return ENOMEM;
  qp->receive_queue().push_back(std::move(wr));
  return 0;
}

void Device::Transmit(OutBatch& out) {
  if (out.packets.empty()) return;
  const SendResult r = SendBatch(out);
  std::lock_guard lock(mu_);
  CountSentLocked(r);
}

void Device::TransmitLocked(OutBatch& out) {
  if (out.packets.empty()) return;
  CountSentLocked(SendBatch(out));
  out.packets.clear();
}

void Device::CountSentLocked(const SendResult& r) {
  counters_.tx_packets += r.sent;
  counters_.tx_bytes += r.bytes;
  counters_.tx_errors += r.failed;
}

Device::SendResult Device::SendBatch(const OutBatch& out) {
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
    const int n = transport_.Send(std::span(batch).subspan(sent));
    if (n < 0) break;
    sent += static_cast<size_t>(n);
  }
  return {sent, batch.size() - sent, bytes};
}

// --- data path: responder ------------------------------------------------------------------------------------

WcStatus Device::ScatterLocked(const QueuePair& qp, std::span<const Sge> sg_list, uint64_t offset,
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
    AccessResult r = keys_.CheckLocal(sge.lkey, qp.init().pd, sge.addr + skip, n, access::kLocalWrite);
    if (!r.ok()) return WcStatus::kLocProtErr;
    std::memcpy(r.host, data.data() + done, n);
    done += n;
    skip = 0;
  }
  return done == data.size() ? WcStatus::kSuccess : WcStatus::kLocLenErr;
}

void Device::OnDatagram(const wire::InDatagram& d, AckTiming acks) {
  OutBatch out;
  std::optional<GsiMad> gsi;
  {
    std::lock_guard lock(mu_);
    ack_timing_ = acks;
    OnDatagramLocked(d, out, gsi);
    ack_timing_ = AckTiming::kNow;
    if (acks == AckTiming::kNow) {
      if (!acks_held_.empty()) SendHeldAcksLocked(UINT64_MAX, out);
    } else {
      const uint64_t due = next_held_ack_due_ns_.load(std::memory_order_relaxed);
      if (due != 0 && due <= clock_.NowNs()) SendHeldAcksLocked(clock_.NowNs(), out);
    }
  }
  Transmit(out);
  if (gsi) cm_.OnMad(gsi->peer, gsi->qkey, gsi->src_qp, gsi->mad);
}

void Device::OnDatagramLocked(const wire::InDatagram& d, OutBatch& out, std::optional<GsiMad>& gsi) {
  ++counters_.rx_packets;
  counters_.rx_bytes += d.payload.size();
  auto parsed = wire::ParsePacket(d.payload);
  if (!parsed) {
    ++counters_.rx_malformed;
    return;
  }
  const wire::PacketView& p = *parsed;
  // IBTA A17.3.3: a packet whose ICRC does not verify is silently dropped. A UDP socket cannot see the IPv4
  // Identification the ICRC covers. uroce peers send ID 0 (DF from an unconnected socket), but kernel rxe and RoCE
  // NICs send changing IDs, so with the ID unknown the ICRC is checked over everything else (RecoverIpId): a
  // recovered ID of 0 is a full 32-bit check; any other ID leaves 16 bits of check, and is counted.
  if (d.ip_id.has_value() || !d.src.addr.is_v4()) {
    if (!wire::VerifyIcrc(wire::Flow{d.src, d.dst, d.ip_id.value_or(0)}, d.payload).ok) {
      ++counters_.rx_icrc_errors;
      return;
    }
  } else {
    const std::optional<uint16_t> id = wire::RecoverIpId(wire::Flow{d.src, d.dst, 0}, d.payload);
    if (!id) {
      ++counters_.rx_icrc_errors;
      return;
    }
    if (*id != 0) ++counters_.rx_icrc_ip_id_inferred;
  }
  if (p.info->transport == wire::TransportKind::kCnp) {
    // A CNP: the peer saw congestion marks on what we sent it (RoCEv2 Annex A17.9): cut the window towards it.
    ++counters_.rx_cnp;
    if (auto it = paths_.find(d.src.addr); it != paths_.end()) {
      it->second.OnCongestion();
      ++counters_.rc_congestion_signals;
    }
    return;
  }
  if (p.bth.dest_qp == wire::kGsiQpn) {
    // QP1, the GSI: CM MADs for the connection manager (rdmacm.md 4.1), which checks Q_Key and source QP itself.
    if (!PkeyMatches(p.bth.pkey)) {
      ++counters_.rx_bad_pkey;
    } else if (p.info->transport != wire::TransportKind::kUd || !p.deth) {
      ++counters_.rx_wrong_transport;
    } else {
      gsi = GsiMad{d.src.addr, p.deth->qkey, p.deth->src_qp, std::vector<uint8_t>(p.payload.begin(), p.payload.end())};
    }
    return;
  }
  if (p.bth.dest_qp == wire::kMulticastQpn) {
    // IBTA 10.5.2.3: a UD packet to the multicast QPN goes to every QP attached to its destination group.
    auto m = multicast_.find(d.dst.addr);
    if (m == multicast_.end() || p.info->transport != wire::TransportKind::kUd || !PkeyMatches(p.bth.pkey)) {
      ++counters_.rx_unknown_qp;
      return;
    }
    for (QueuePair* member : m->second) {
      const QpState s = member->state();
      if (s == QpState::kRtr || s == QpState::kRts || s == QpState::kSqd || s == QpState::kSqe) {
        ReceiveUdLocked(member, d, p);
      } else {
        ++counters_.rx_bad_state;
      }
    }
    return;
  }
  QueuePair* qp = FindQpLocked(p.bth.dest_qp);
  if (qp == nullptr) {
    ++counters_.rx_unknown_qp;
    return;
  }
  const bool xrc = qp->type() == QpType::kXrcSend || qp->type() == QpType::kXrcRecv;
  const wire::TransportKind want = qp->type() == QpType::kUd   ? wire::TransportKind::kUd
                                   : qp->type() == QpType::kUc ? wire::TransportKind::kUc
                                   : xrc                       ? wire::TransportKind::kXrc
                                                               : wire::TransportKind::kRc;
  if (p.info->transport != want) {
    ++counters_.rx_wrong_transport;
    return;
  }
  // A connected QP talks to one peer, its primary path's DGID (IBTA 9.6, transport header validation: a connected
  // QP accepts the packets of its path only). The UDP source port is the flow hash, not the peer's identity.
  if (qp->type() != QpType::kUd && d.src.addr != PeerOf(*qp).addr) {
    ++counters_.rx_wrong_peer;
    return;
  }
  const QpState s = qp->state();
  if (s != QpState::kRtr && s != QpState::kRts && s != QpState::kSqd && s != QpState::kSqe) {
    ++counters_.rx_bad_state;  // IBTA 10.3.1: a QP in RESET/INIT/ERR drops what arrives
    return;
  }
  if (!PkeyMatches(p.bth.pkey)) {
    ++counters_.rx_bad_pkey;
    return;
  }
  switch (qp->type()) {
    case QpType::kUd:
      ReceiveUdLocked(qp, d, p);
      break;
    case QpType::kUc:
      ReceiveUcLocked(qp, p);
      break;
    case QpType::kRc:
      ReceiveRcLocked(qp, p, out);
      break;
    case QpType::kXrcSend:
      // An initiator only requests: what it receives are responses (Annex A14).
      if (p.info->is_request) {
        ++counters_.rx_wrong_transport;
        break;
      }
      ReceiveRcLocked(qp, p, out);
      break;
    case QpType::kXrcRecv:
      ReceiveXrcTargetLocked(qp, p, out);  // xrc.cc
      break;
    default:
      break;
  }
}

void Device::ReceiveUdLocked(QueuePair* qp, const wire::InDatagram& d, const wire::PacketView& p) {
  if (!p.deth || p.deth->qkey != qp->attributes().qkey) {
    ++counters_.rx_bad_qkey;  // IBTA 10.2.4 (C10-15): Q_Key mismatch, silently dropped
    return;
  }
  std::optional<RecvWr> taken = TakeReceiveWqeLocked(qp);  // the QP's own queue or its SRQ
  if (!taken) {
    ++counters_.rx_no_receive_wqe;  // UD has no RNR: the datagram is lost (IBTA 9.7.8)
    return;
  }
  RecvWr rqe = std::move(*taken);
  Completion c;
  c.wr_id = rqe.wr_id;
  c.opcode = WcOpcode::kRecv;
  c.qp_num = qp->qpn();
  c.src_qp = p.deth->src_qp;
  c.byte_len = static_cast<uint32_t>(kGrhSize + p.payload.size());
  c.wc_flags = wc_flags::kGrh;
  c.solicited = p.bth.solicited;
  if (p.imm) {
    c.imm_data = p.imm->imm;
    c.wc_flags |= wc_flags::kWithImm;
  }
  uint8_t grh[kGrhSize];
  BuildGrh(d, p.payload.size(), grh);
  c.status = ScatterLocked(*qp, rqe.sg_list, 0, grh);
  if (c.status == WcStatus::kSuccess) c.status = ScatterLocked(*qp, rqe.sg_list, kGrhSize, p.payload);
  CompleteLocked(qp->init().recv_cq, c);
  if (c.status != WcStatus::kSuccess) EnterErrorLocked(qp);
}

void Device::ReceiveUcLocked(QueuePair* qp, const wire::PacketView& p) {
  QpAttributes& a = qp->mutable_attributes();
  InboundMessage& m = qp->inbound();
  const wire::MsgPosition pos = p.info->position;
  const bool starts = pos == wire::MsgPosition::kFirst || pos == wire::MsgPosition::kOnly;
  // IBTA 9.7.6.1.3 (UC): a PSN other than the expected one means packets were lost; the message in progress is
  // abandoned and the receiver resynchronises on the next FIRST or ONLY packet, whatever its PSN.
  if (p.bth.psn != a.rq_psn) {
    if (m.kind != InboundMessage::Kind::kNone || !starts) ++counters_.rx_out_of_sequence;
    if (m.rqe) qp->receive_queue().push_front(std::move(*m.rqe));  // the WQE is reused for a later message
    m = InboundMessage{};
    if (!starts) {
      m.dropping = true;
      a.rq_psn = (p.bth.psn + 1) & 0xffffff;
      return;
    }
  }
  a.rq_psn = (p.bth.psn + 1) & 0xffffff;
  if (!starts && (m.dropping || m.kind == InboundMessage::Kind::kNone)) {
    return;  // rest of a message we are not assembling
  }
  const bool is_send = p.info->op == wire::Operation::kSend;
  if (starts) {
    if (m.rqe) qp->receive_queue().push_front(std::move(*m.rqe));
    m = InboundMessage{};
    if (is_send) {
      if (qp->receive_queue().empty()) {
        ++counters_.rx_no_receive_wqe;  // UC has no RNR NAK: the message is dropped (IBTA 9.7.6.1.5)
        m.dropping = true;
        return;
      }
      m.kind = InboundMessage::Kind::kSend;
      m.rqe = std::move(qp->receive_queue().front());
      qp->receive_queue().pop_front();
    } else {
      const wire::Reth& reth = *p.reth;
      const bool allowed = a.qp_access_flags & access::kRemoteWrite;
      AccessResult r = keys_.CheckRemote(reth.rkey, qp->init().pd, reth.va, reth.dma_length, access::kRemoteWrite,
                                         qp->qpn());
      if (!allowed || !r.ok()) {
        ++counters_.rx_remote_access_denied;  // UC cannot NAK: the message is dropped (IBTA 9.7.6.1.5)
        m.dropping = true;
        return;
      }
      m.kind = InboundMessage::Kind::kWrite;
      m.write_va = reth.va;
      m.write_rkey = reth.rkey;
      m.write_length = reth.dma_length;
    }
  } else if ((m.kind == InboundMessage::Kind::kSend) != is_send) {
    // A WRITE packet inside a SEND (or the reverse): out of sequence opcodes, drop the message.
    ++counters_.rx_out_of_sequence;
    if (m.rqe) qp->receive_queue().push_front(std::move(*m.rqe));
    m = InboundMessage{};
    m.dropping = true;
    return;
  }
  const bool ends = pos == wire::MsgPosition::kLast || pos == wire::MsgPosition::kOnly;
  if (m.kind == InboundMessage::Kind::kSend) {
    WcStatus st = ScatterLocked(*qp, m.rqe->sg_list, m.offset, p.payload);
    m.offset += p.payload.size();
    if (st != WcStatus::kSuccess) {
      const Completion c = ReceiveError(*qp, m.rqe->wr_id, st);
      m.rqe.reset();
      CompleteLocked(qp->init().recv_cq, c);
      m = InboundMessage{};
      EnterErrorLocked(qp);
      return;
    }
  } else {
    if (m.offset + p.payload.size() > m.write_length) {
      ++counters_.rx_remote_access_denied;  // more data than the RETH announced
      m = InboundMessage{};
      m.dropping = true;
      return;
    }
    if (!p.payload.empty()) {
      uint8_t* target = WriteTargetLocked(*qp, m, p.payload.size());
      if (target == nullptr) {
        ++counters_.rx_remote_access_denied;  // deregistered mid-message: the rest is dropped (UC cannot NAK)
        m = InboundMessage{};
        m.dropping = true;
        return;
      }
      std::memcpy(target, p.payload.data(), p.payload.size());
    }
    m.offset += p.payload.size();
  }
  if (!ends) return;
  const bool imm = p.imm.has_value();
  if (m.kind == InboundMessage::Kind::kWrite && !imm) {
    m = InboundMessage{};
    return;
  }
  Completion c = MessageCompletion(*qp, m.offset, p);
  if (m.kind == InboundMessage::Kind::kSend) {
    c.wr_id = m.rqe->wr_id;
    c.opcode = WcOpcode::kRecv;
  } else {
    // RDMA WRITE with immediate consumes a receive WQE (IBTA 9.4.3.1); without one the message is lost.
    if (qp->receive_queue().empty()) {
      ++counters_.rx_no_receive_wqe;
      m = InboundMessage{};
      return;
    }
    c.wr_id = qp->receive_queue().front().wr_id;
    qp->receive_queue().pop_front();
    c.opcode = WcOpcode::kRecvRdmaWithImm;
  }
  m = InboundMessage{};
  CompleteLocked(qp->init().recv_cq, c);
}

Completion Device::MessageCompletion(const QueuePair& qp, uint64_t byte_len, const wire::PacketView& last) const {
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

void Device::SendHeldAcks(uint64_t due_by_ns) {
  const uint64_t due = next_held_ack_due_ns_.load(std::memory_order_relaxed);
  if (due == 0 || due > due_by_ns) return;
  OutBatch out;
  {
    std::lock_guard lock(mu_);
    SendHeldAcksLocked(due_by_ns, out);
  }
  Transmit(out);
}

uint64_t Device::RunTimers(uint64_t poller_returns_by_ns) {
  OutBatch out;
  uint64_t next = 0;
  {
    std::lock_guard lock(mu_);
    const uint64_t now = clock_.NowNs();
    // Held ACKs whose time is up leave (AckTiming::kHeld); the poller comes back for the next one.
    SendHeldAcksLocked(now, out);
    next = next_held_ack_due_ns_.load(std::memory_order_relaxed);
    // Requesters waiting for room freed outside the completer first: what they send arms timers counted below.
    for (auto& [peer, path] : paths_) RcWakeWaitersLocked(path, out);
    // The RC requesters with a timer armed. Those that still have one afterwards are listed again; a timer armed
    // meanwhile (another QP's progress) lists its QP in timed_qps_ already.
    std::vector<uint32_t> timed;
    timed.swap(timed_qps_);
    for (uint32_t qpn : timed)
      if (QueuePair* qp = FindQpLocked(qpn)) qp->requester().timer_listed = false;
    for (uint32_t qpn : timed) {
      QueuePair* qp = FindQpLocked(qpn);
      if (qp == nullptr || (qp->type() != QpType::kRc && qp->type() != QpType::kXrcSend)) continue;
      RcTimersLocked(qp, now, out);
      if (RcNextDeadline(qp) != 0 && !qp->requester().timer_listed) {
        qp->requester().timer_listed = true;
        timed_qps_.push_back(qpn);
      }
    }
    for (uint32_t qpn : timed_qps_)
      if (QueuePair* qp = FindQpLocked(qpn)) next = wire::EarlierDeadline(next, RcNextDeadline(qp));
    // A requester that failed above may have left room for others: come back at once for them.
    for (auto& [peer, path] : paths_)
      if (path.MayWake() && !path.waiting().empty()) next = now;
    poller_deadline_ = wire::EarlierDeadline(next, poller_returns_by_ns);
  }
  Transmit(out);
  return wire::EarlierDeadline(next, cm_.RunTimers());
}

void Device::WakeForTimer(uint64_t deadline) {
  // Called with the lock held when a timer is armed: the progress thread may be blocked until a later deadline.
  if (poller_deadline_ == 0 || deadline < poller_deadline_) {
    poller_deadline_ = deadline;
    transport_.Wake();
  }
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
