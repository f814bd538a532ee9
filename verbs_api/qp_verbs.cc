// Queue pairs: create/modify/query/destroy, posting work requests, and the context's function tables.
#include <infiniband/verbs.h>

#include <cerrno>
#include <cstring>
#include <type_traits>
#include <vector>

#include "verbs_api/internal.h"
#include "verbs_api/qp_ex_ops.h"
#include "verbs_api/verbs_table.h"
#include "wire/clock.h"

using namespace uroce;
using namespace uroce::verbs;

// Our enums carry the verbs values so conversions are casts; pin every value we rely on.
static_assert(int(emu::QpState::kErr) == IBV_QPS_ERR && int(emu::QpState::kSqe) == IBV_QPS_SQE);
static_assert(int(emu::QpType::kUd) == IBV_QPT_UD && int(emu::QpType::kXrcRecv) == IBV_QPT_XRC_RECV);
static_assert(emu::attr::kDestQpn == IBV_QP_DEST_QPN && emu::attr::kRateLimit == IBV_QP_RATE_LIMIT);
static_assert(int(emu::SendOpcode::kSendWithInv) == IBV_WR_SEND_WITH_INV);
static_assert(int(emu::WcStatus::kGeneralErr) == IBV_WC_GENERAL_ERR);
static_assert(int(emu::WcOpcode::kRecvRdmaWithImm) == IBV_WC_RECV_RDMA_WITH_IMM);
static_assert(emu::send_flags::kInline == IBV_SEND_INLINE && emu::wc_flags::kWithInv == IBV_WC_WITH_INV);
static_assert(emu::access::kRemoteAtomic == IBV_ACCESS_REMOTE_ATOMIC && emu::access::kOnDemand == IBV_ACCESS_ON_DEMAND);
static_assert(int(emu::AsyncEventType::kGidChange) == IBV_EVENT_GID_CHANGE);

namespace {



// The value stored in an enum field of the caller's struct, read as bytes: fields the mask does not name may be
// uninitialized (ibv_xsrq_pingpong passes a stack ibv_qp_attr it never cleared), and loading such an enum lvalue is
// undefined behaviour (UBSan's -fsanitize=enum).
template <typename E>
uint32_t RawEnum(const E& field) {
  std::underlying_type_t<E> v;
  std::memcpy(&v, &field, sizeof v);
  return static_cast<uint32_t>(v);
}

emu::QpAttributes ToEmu(const ibv_qp_attr& a) {
  emu::QpAttributes e;
  e.qp_state = static_cast<emu::QpState>(RawEnum(a.qp_state));
  e.cur_qp_state = static_cast<emu::QpState>(RawEnum(a.cur_qp_state));
  e.path_mtu = static_cast<emu::Mtu>(RawEnum(a.path_mtu));
  e.path_mig_state = static_cast<emu::MigState>(RawEnum(a.path_mig_state));
  e.qkey = a.qkey;
  e.rq_psn = a.rq_psn;
  e.sq_psn = a.sq_psn;
  e.dest_qp_num = a.dest_qp_num;
  e.qp_access_flags = a.qp_access_flags;
  e.cap = {a.cap.max_send_wr, a.cap.max_recv_wr, a.cap.max_send_sge, a.cap.max_recv_sge, a.cap.max_inline_data};
  e.ah_attr = ToAddressVector(a.ah_attr);
  e.alt_ah_attr = ToAddressVector(a.alt_ah_attr);
  e.pkey_index = a.pkey_index;
  e.alt_pkey_index = a.alt_pkey_index;
  e.en_sqd_async_notify = a.en_sqd_async_notify;
  e.sq_draining = a.sq_draining;
  e.max_rd_atomic = a.max_rd_atomic;
  e.max_dest_rd_atomic = a.max_dest_rd_atomic;
  e.min_rnr_timer = a.min_rnr_timer;
  e.port_num = a.port_num;
  e.timeout = a.timeout;
  e.retry_cnt = a.retry_cnt;
  e.rnr_retry = a.rnr_retry;
  e.alt_port_num = a.alt_port_num;
  e.alt_timeout = a.alt_timeout;
  e.rate_limit = a.rate_limit;
  return e;
}

void FromEmu(const emu::QpAttributes& e, ibv_qp_attr* a) {
  std::memset(a, 0, sizeof *a);
  a->qp_state = static_cast<ibv_qp_state>(e.qp_state);
  a->cur_qp_state = static_cast<ibv_qp_state>(e.cur_qp_state);
  a->path_mtu = static_cast<ibv_mtu>(e.path_mtu);
  a->path_mig_state = static_cast<ibv_mig_state>(e.path_mig_state);
  a->qkey = e.qkey;
  a->rq_psn = e.rq_psn;
  a->sq_psn = e.sq_psn;
  a->dest_qp_num = e.dest_qp_num;
  a->qp_access_flags = e.qp_access_flags;
  a->cap = {e.cap.max_send_wr, e.cap.max_recv_wr, e.cap.max_send_sge, e.cap.max_recv_sge, e.cap.max_inline_data};
  a->ah_attr = FromAddressVector(e.ah_attr);
  a->alt_ah_attr = FromAddressVector(e.alt_ah_attr);
  a->pkey_index = e.pkey_index;
  a->alt_pkey_index = e.alt_pkey_index;
  a->en_sqd_async_notify = e.en_sqd_async_notify;
  a->sq_draining = e.sq_draining;
  a->max_rd_atomic = e.max_rd_atomic;
  a->max_dest_rd_atomic = e.max_dest_rd_atomic;
  a->min_rnr_timer = e.min_rnr_timer;
  a->port_num = e.port_num;
  a->timeout = e.timeout;
  a->retry_cnt = e.retry_cnt;
  a->rnr_retry = e.rnr_retry;
  a->alt_port_num = e.alt_port_num;
  a->alt_timeout = e.alt_timeout;
  a->rate_limit = e.rate_limit;
}

ibv_qp* NewQp(ibv_context* context, ibv_pd* pd, const ibv_qp_init_attr_ex& a, ibv_qp_cap* cap_out) {
  // An XRC target has no PD or CQs, an XRC initiator no receive CQ (Annex A14); emu checks what each type needs.
  if (pd == nullptr && a.qp_type != IBV_QPT_XRC_RECV) return Fail<ibv_qp>(EINVAL);
  emu::QpInitAttributes init;
  init.type = static_cast<emu::QpType>(a.qp_type);
  init.pd = pd ? ToPd(pd)->emu : nullptr;
  init.send_cq = a.send_cq ? ToCq(a.send_cq)->emu : nullptr;
  init.recv_cq = a.recv_cq ? ToCq(a.recv_cq)->emu : nullptr;
  init.srq = a.srq ? ToSrq(a.srq)->emu : nullptr;  // srq_verbs.cc
  init.xrcd = (a.comp_mask & IBV_QP_INIT_ATTR_XRCD) && a.xrcd ? ToXrcd(a.xrcd)->emu : nullptr;
  init.cap = {a.cap.max_send_wr, a.cap.max_recv_wr, a.cap.max_send_sge, a.cap.max_recv_sge, a.cap.max_inline_data};
  init.sq_sig_all = a.sq_sig_all != 0;
  emu::QueuePair* eqp = nullptr;
  if (int err = Ctx(context)->dev().CreateQp(init, &eqp)) return Fail<ibv_qp>(err);
  auto* qp = static_cast<Qp*>(calloc(1, sizeof(Qp)));
  qp->emu = eqp;
  ibv_qp& q = qp->qpx.qp_base;
  q.context = context;
  q.qp_context = a.qp_context;
  q.pd = pd;
  q.send_cq = a.send_cq;
  q.recv_cq = a.recv_cq;
  q.srq = a.srq;
  q.handle = eqp->qpn();
  q.qp_num = eqp->qpn();
  q.state = IBV_QPS_RESET;
  q.qp_type = a.qp_type;
  pthread_mutex_init(&q.mutex, nullptr);
  pthread_cond_init(&q.cond, nullptr);
  eqp->owner = &q;
  if (a.qp_type == IBV_QPT_XRC_RECV) TrackXrcTarget(qp);  // shareable through ibv_open_qp (srq_verbs.cc)
  if (cap_out) {
    cap_out->max_send_wr = init.cap.max_send_wr;
    cap_out->max_recv_wr = init.cap.max_recv_wr;
    cap_out->max_send_sge = init.cap.max_send_sge;
    cap_out->max_recv_sge = init.cap.max_recv_sge;
    cap_out->max_inline_data = init.cap.max_inline_data;
  }
  return &q;
}

int ToEmuSend(const ibv_send_wr& w, ibv_qp_type qp_type, emu::SendWr* out) {
  out->wr_id = w.wr_id;
  out->opcode = static_cast<emu::SendOpcode>(w.opcode);
  out->flags = w.send_flags;
  out->imm_data = w.imm_data;
  if (w.num_sge < 0) return EINVAL;
  if (w.send_flags & IBV_SEND_INLINE) {
    // Inline data is copied now: the caller may reuse its buffers as soon as ibv_post_send returns.
    for (int i = 0; i < w.num_sge; ++i) {
      const auto* p = reinterpret_cast<const uint8_t*>(static_cast<uintptr_t>(w.sg_list[i].addr));
      out->inline_data.insert(out->inline_data.end(), p, p + w.sg_list[i].length);
    }
  } else {
    out->sg_list.reserve(w.num_sge);
    for (int i = 0; i < w.num_sge; ++i)
      out->sg_list.push_back({w.sg_list[i].addr, w.sg_list[i].length, w.sg_list[i].lkey});
  }
  switch (w.opcode) {
    case IBV_WR_RDMA_WRITE:
    case IBV_WR_RDMA_WRITE_WITH_IMM:
    case IBV_WR_RDMA_READ:
      out->remote_addr = w.wr.rdma.remote_addr;
      out->rkey = w.wr.rdma.rkey;
      break;
    case IBV_WR_ATOMIC_CMP_AND_SWP:
    case IBV_WR_ATOMIC_FETCH_AND_ADD:
      out->remote_addr = w.wr.atomic.remote_addr;
      out->rkey = w.wr.atomic.rkey;
      out->compare_add = w.wr.atomic.compare_add;
      out->swap = w.wr.atomic.swap;
      break;
    case IBV_WR_SEND_WITH_INV:
    case IBV_WR_LOCAL_INV:
      out->invalidate_rkey = w.invalidate_rkey;
      break;
    case IBV_WR_BIND_MW:
      if (w.bind_mw.mw == nullptr) return EINVAL;
      out->bind = ToEmuBind(*w.bind_mw.mw, w.bind_mw.rkey, w.bind_mw.bind_info);
      break;
    default:
      break;
  }
  if (qp_type == IBV_QPT_UD) {
    // wr.ud overlays wr.rdma and wr.atomic: only a UD QP's requests carry an address handle.
    out->ah = w.wr.ud.ah ? ToAh(w.wr.ud.ah)->emu : nullptr;
    out->remote_qpn = w.wr.ud.remote_qpn;
    out->remote_qkey = w.wr.ud.remote_qkey;
  }
  out->remote_srqn = w.qp_type.xrc.remote_srqn;
  return 0;
}

}  // namespace

namespace uroce::verbs {

static int PostSendUnguarded(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad_wr) {
  emu::Device& dev = Ctx(qp->context)->dev();
  // The QP's capacities never change after creation: read without its lock.
  const uint32_t max_sge = ToQp(qp)->emu->attributes().cap.max_send_sge;
  for (; wr != nullptr; wr = wr->next) {
    emu::SendWr e;
    // num_sge is checked before sg_list is read: the array holds num_sge entries only if num_sge is within the QP's
    // capacity (mlx5 checks it first too), and a larger count must be EINVAL, not a read past the caller's array.
    int err = wr->num_sge < 0 || uint32_t(wr->num_sge) > max_sge ? EINVAL : ToEmuSend(*wr, qp->qp_type, &e);
    if (err == 0) err = dev.PostSend(ToQp(qp)->emu, std::move(e));
    if (err) {
      if (bad_wr) *bad_wr = wr;
      return err;
    }
  }
  return 0;
}

int PostSend(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad_wr) {
  Engine& engine = *Ctx(qp->context)->engine;
  const wire::ClockBatch batch;  // one reading for its timer's start and its packets' RTT samples and deadlines
  Engine::VerbTimer timer(engine);
  const int err = NoThrow<int>(ENOMEM, [&] { return PostSendUnguarded(qp, wr, bad_wr); });
  engine.ReceiveAfterSend();
  return err;
}

static int PostRecvUnguarded(ibv_qp* qp, ibv_recv_wr* wr, ibv_recv_wr** bad_wr) {
  emu::Device& dev = Ctx(qp->context)->dev();
  const uint32_t max_sge = ToQp(qp)->emu->attributes().cap.max_recv_sge;  // fixed at creation, as above
  for (; wr != nullptr; wr = wr->next) {
    // A QP on an SRQ has no receive queue (max_recv_sge 0): its post is EINVAL whatever num_sge says.
    int err = wr->num_sge < 0 || uint32_t(wr->num_sge) > max_sge ? EINVAL : 0;
    if (err == 0) {
      emu::RecvWr e;
      e.wr_id = wr->wr_id;
      e.sg_list.reserve(wr->num_sge);
      for (int i = 0; i < wr->num_sge; ++i) e.sg_list.push_back({wr->sg_list[i].addr, wr->sg_list[i].length, wr->sg_list[i].lkey});
      err = dev.PostRecv(ToQp(qp)->emu, std::move(e));
    }
    if (err) {
      if (bad_wr) *bad_wr = wr;
      return err;
    }
  }
  return 0;
}

int PostRecv(ibv_qp* qp, ibv_recv_wr* wr, ibv_recv_wr** bad_wr) {
  // One receive posted is quick; a chain may be long.
  Engine::VerbTimer timer(*Ctx(qp->context)->engine, /*keeps_lease=*/true, wr != nullptr && wr->next != nullptr);
  return NoThrow<int>(ENOMEM, [&] { return PostRecvUnguarded(qp, wr, bad_wr); });
}

static ibv_qp* CreateQpExUnguarded(ibv_context* context, ibv_qp_init_attr_ex* a) {
  constexpr uint32_t kSupported = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_XRCD | IBV_QP_INIT_ATTR_CREATE_FLAGS |
                                  IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
  if (a->comp_mask & ~kSupported) return Fail<ibv_qp>(EOPNOTSUPP);  // RSS and others: README table
  if ((a->comp_mask & IBV_QP_INIT_ATTR_CREATE_FLAGS) && a->create_flags) return Fail<ibv_qp>(EOPNOTSUPP);
  // ibv_create_qp_ex(3): an XRC target names its domain instead of a PD.
  if (a->qp_type == IBV_QPT_XRC_RECV ? !(a->comp_mask & IBV_QP_INIT_ATTR_XRCD) : !(a->comp_mask & IBV_QP_INIT_ATTR_PD))
    return Fail<ibv_qp>(EINVAL);
  if (!(a->comp_mask & IBV_QP_INIT_ATTR_PD)) a->pd = nullptr;
  ibv_qp* q = NewQp(context, a->pd, *a, &a->cap);
  // --- send ops API (ibv_wr_*, qp_ex_ops.cc) ---
  if (q != nullptr && (a->comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS)) {
    if (int err = InstallSendOps(ToQp(q), a->send_ops_flags, a->qp_type)) {
      ibv_destroy_qp(q);
      return Fail<ibv_qp>(err);
    }
  }
  // --- end send ops API ---
  return q;
}

ibv_qp* CreateQpEx(ibv_context* context, ibv_qp_init_attr_ex* a) {
  return NoThrow<ibv_qp*>(nullptr, [&] { return CreateQpExUnguarded(context, a); });
}

void FillContextOps(verbs_context* v) {
  v->context.ops.poll_cq = PollCq;
  v->context.ops.req_notify_cq = ReqNotifyCq;
  v->context.ops.post_send = PostSend;
  v->context.ops.post_recv = PostRecv;
  v->context.ops.alloc_mw = AllocMw;
  v->context.ops.bind_mw = BindMw;
  v->context.ops.dealloc_mw = DeallocMw;
  v->query_port = QueryPort;
  v->query_device_ex = QueryDeviceEx;
  v->create_cq_ex = CreateCqEx;
  v->create_qp_ex = CreateQpEx;
  v->alloc_parent_domain = AllocParentDomain;
  FillMemoryOps(v);
  FillSrqOps(v);  // SRQ and XRC (srq_verbs.cc)
}

}  // namespace uroce::verbs

extern "C" {

static ibv_qp* CreateQpUnguarded(ibv_pd* pd, ibv_qp_init_attr* attr) {
  ibv_qp_init_attr_ex ex{};
  ex.qp_context = attr->qp_context;
  ex.send_cq = attr->send_cq;
  ex.recv_cq = attr->recv_cq;
  ex.srq = attr->srq;
  ex.cap = attr->cap;
  ex.qp_type = attr->qp_type;
  ex.sq_sig_all = attr->sq_sig_all;
  ex.comp_mask = IBV_QP_INIT_ATTR_PD;
  ex.pd = pd;
  return NewQp(pd->context, pd, ex, &attr->cap);
}

ibv_qp* ibv_create_qp(ibv_pd* pd, ibv_qp_init_attr* attr) {
  return NoThrow<ibv_qp*>(nullptr, [&] { return CreateQpUnguarded(pd, attr); });
}

int ibv_modify_qp(ibv_qp* qp, ibv_qp_attr* attr, int attr_mask) {
  emu::Device& dev = Ctx(qp->context)->dev();
  uint32_t mask = static_cast<uint32_t>(attr_mask);
  // The kernel's uverbs drops the attributes an XRC QP does not have before the driver checks the mask
  // (modify_qp_mask in drivers/infiniband/core/uverbs_cmd.c); perftest relies on it.
  if (qp->qp_type == IBV_QPT_XRC_SEND) mask &= ~uint32_t{IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER};
  if (qp->qp_type == IBV_QPT_XRC_RECV)
    mask &= ~uint32_t{IBV_QP_MAX_QP_RD_ATOMIC | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY};
  if (int err = dev.ModifyQp(ToQp(qp)->emu, ToEmu(*attr), mask)) return err;
  if (attr_mask & IBV_QP_STATE) qp->state = attr->qp_state;
  if ((attr_mask & IBV_QP_STATE) && attr->qp_state == IBV_QPS_RTR) {
    std::optional<wire::UdpEndpoint> peer;
    if ((attr_mask & IBV_QP_AV) && (attr_mask & IBV_QP_DEST_QPN) && attr->ah_attr.is_global) {
      peer = wire::UdpEndpoint{wire::IpAddress::FromBytes(attr->ah_attr.grh.dgid.raw), wire::kRoceV2UdpPort};
    }
    Ctx(qp->context)->engine->QpReadyToReceive(peer, attr->dest_qp_num);
  }
  return 0;
}

int ibv_query_qp(ibv_qp* qp, ibv_qp_attr* attr, int attr_mask, ibv_qp_init_attr* init_attr) {
  emu::QpAttributes e;
  if (int err = Ctx(qp->context)->dev().QueryQp(ToQp(qp)->emu, &e)) return err;
  FromEmu(e, attr);
  qp->state = attr->qp_state;
  if (init_attr) {
    std::memset(init_attr, 0, sizeof *init_attr);
    init_attr->qp_context = qp->qp_context;
    init_attr->send_cq = qp->send_cq;
    init_attr->recv_cq = qp->recv_cq;
    init_attr->srq = qp->srq;
    init_attr->cap = attr->cap;
    init_attr->qp_type = qp->qp_type;
    init_attr->sq_sig_all = ToQp(qp)->emu->init().sq_sig_all;
  }
  return 0;
}

int ibv_destroy_qp(ibv_qp* qp) {
  if (qp->qp_type == IBV_QPT_XRC_RECV) UntrackXrcTarget(ToQp(qp));  // opened handles (srq_verbs.cc)
  Context* ctx = Ctx(qp->context);
  // A QP destroyed while attached to multicast groups is detached from them, as the kernel's uverbs does before it
  // destroys a QP; the engine then stops receiving the groups nobody else here is attached to.
  std::vector<wire::IpAddress> groups;
  if (int err = ctx->dev().DestroyQp(ToQp(qp)->emu, &groups)) return err;
  for (const wire::IpAddress& group : groups) ctx->engine->LeaveMulticast(group);
  WaitForAcknowledgements(&qp->mutex, &qp->cond, qp->events_completed,
                          WithdrawEvents(ctx->async_events, qp, ToQp(qp)->events_reported));
  ReleaseSendOps(ToQp(qp));  // send ops API (qp_ex_ops.cc)
  pthread_cond_destroy(&qp->cond);
  pthread_mutex_destroy(&qp->mutex);
  free(ToQp(qp));
  return 0;
}

}  // extern "C"
