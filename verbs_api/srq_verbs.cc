// Shared receive queues and XRC: ibv_create_srq / ibv_modify_srq / ibv_query_srq / ibv_destroy_srq (exported), and
// what verbs.h's inlines reach through the function tables — create_srq_ex, get_srq_num, open_xrcd, close_xrcd and
// open_qp in verbs_context, post_srq_recv in ibv_context_ops. Errnos follow the man pages and, where they are silent,
// the kernel's uverbs answers (ibv_open_xrcd: EBADF, EAGAIN, EINVAL).
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>

#include "verbs_api/internal.h"
#include "verbs_api/verbs_table.h"

using namespace uroce;
using namespace uroce::verbs;

static_assert(emu::srq_attr::kMaxWr == IBV_SRQ_MAX_WR && emu::srq_attr::kLimit == IBV_SRQ_LIMIT);
static_assert(int(emu::SrqType::kXrc) == IBV_SRQT_XRC && int(emu::AsyncEventType::kSrqLimitReached) ==
                                                              IBV_EVENT_SRQ_LIMIT_REACHED);

namespace {


emu::Device& Dev(ibv_context* c) { return ToContext(c)->dev(); }

ibv_srq* NewSrq(ibv_context* context, ibv_pd* pd, emu::SrqType type, ibv_xrcd* xrcd, ibv_cq* cq,
                ibv_srq_attr* attr, void* srq_context) {
  if (pd == nullptr) return Fail<ibv_srq>(EINVAL);
  emu::SrqAttributes a{attr->max_wr, attr->max_sge, attr->srq_limit};
  emu::SharedReceiveQueue* e = nullptr;
  if (int err = Dev(context).CreateSrq(type, ToPd(pd)->emu, xrcd ? ToXrcd(xrcd)->emu : nullptr,
                                       cq ? ToCq(cq)->emu : nullptr, a, &e))
    return Fail<ibv_srq>(err);
  auto* s = static_cast<Srq*>(calloc(1, sizeof(Srq)));
  if (s == nullptr) {
    Dev(context).DestroySrq(e);
    return Fail<ibv_srq>(ENOMEM);
  }
  s->emu = e;
  ibv_srq& q = s->srq;
  q.context = context;
  q.srq_context = srq_context;
  q.pd = pd;
  q.handle = e->srqn();
  pthread_mutex_init(&q.mutex, nullptr);
  pthread_cond_init(&q.cond, nullptr);
  e->owner = &q;
  // ibv_create_srq(3): the attributes are updated to what the SRQ really has.
  attr->max_wr = a.max_wr;
  attr->max_sge = a.max_sge;
  attr->srq_limit = 0;
  return &q;
}

static ibv_srq* CreateSrqExUnguarded(ibv_context* context, ibv_srq_init_attr_ex* a) {
  constexpr uint32_t kKnown =
      IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_XRCD | IBV_SRQ_INIT_ATTR_CQ;
  if (a->comp_mask & ~kKnown) return Fail<ibv_srq>(EOPNOTSUPP);  // tag matching: README table
  const ibv_srq_type type = (a->comp_mask & IBV_SRQ_INIT_ATTR_TYPE) ? a->srq_type : IBV_SRQT_BASIC;
  if (type == IBV_SRQT_TM) return Fail<ibv_srq>(EOPNOTSUPP);
  if (type != IBV_SRQT_BASIC && type != IBV_SRQT_XRC) return Fail<ibv_srq>(EINVAL);
  if (!(a->comp_mask & IBV_SRQ_INIT_ATTR_PD)) return Fail<ibv_srq>(EINVAL);
  if (type == IBV_SRQT_XRC) {
    // An XRC SRQ belongs to a domain and completes on its own CQ (ibv_create_srq_ex(3)).
    constexpr uint32_t kXrcNeeds = IBV_SRQ_INIT_ATTR_XRCD | IBV_SRQ_INIT_ATTR_CQ;
    if ((a->comp_mask & kXrcNeeds) != kXrcNeeds || a->xrcd == nullptr || a->cq == nullptr)
      return Fail<ibv_srq>(EINVAL);
    return NewSrq(context, a->pd, emu::SrqType::kXrc, a->xrcd, a->cq, &a->attr, a->srq_context);
  }
  return NewSrq(context, a->pd, emu::SrqType::kBasic, nullptr, nullptr, &a->attr, a->srq_context);
}

ibv_srq* CreateSrqEx(ibv_context* context, ibv_srq_init_attr_ex* a) {
  return NoThrow<ibv_srq*>(nullptr, [&] { return CreateSrqExUnguarded(context, a); });
}

int GetSrqNum(ibv_srq* srq, uint32_t* srq_num) {
  *srq_num = ToSrq(srq)->emu->srqn();
  return 0;
}

int PostSrqRecv(ibv_srq* srq, ibv_recv_wr* wr, ibv_recv_wr** bad_wr) {
  Engine::VerbTimer timer(*Ctx(srq->context)->engine, /*keeps_lease=*/true, wr != nullptr && wr->next != nullptr);
  emu::Device& dev = Dev(srq->context);
  const uint32_t max_sge = ToSrq(srq)->emu->max_sge();
  for (; wr != nullptr; wr = wr->next) {
    // num_sge within the SRQ's capacity before sg_list is read (qp_verbs.cc's PostSend says why).
    int err = wr->num_sge < 0 || uint32_t(wr->num_sge) > max_sge ? EINVAL : 0;
    if (err == 0) {
      emu::RecvWr e;
      e.wr_id = wr->wr_id;
      e.sg_list.reserve(wr->num_sge);
      for (int i = 0; i < wr->num_sge; ++i)
        e.sg_list.push_back({wr->sg_list[i].addr, wr->sg_list[i].length, wr->sg_list[i].lkey});
      err = dev.PostSrqRecv(ToSrq(srq)->emu, std::move(e));
    }
    if (err) {
      if (bad_wr) *bad_wr = wr;
      return err;
    }
  }
  return 0;
}

ibv_xrcd* OpenXrcd(ibv_context* context, ibv_xrcd_init_attr* a) {
  if (a->comp_mask & ~uint32_t{IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS}) return Fail<ibv_xrcd>(EOPNOTSUPP);
  if (!(a->comp_mask & IBV_XRCD_INIT_ATTR_FD) || !(a->comp_mask & IBV_XRCD_INIT_ATTR_OFLAGS))
    return Fail<ibv_xrcd>(EINVAL);
  std::optional<uint64_t> inode;
  if (a->fd != -1) {
    // ibv_open_xrcd(3): the domain is that of the inode behind fd, whoever opened the file.
    struct stat st;
    if (fstat(a->fd, &st) != 0) return Fail<ibv_xrcd>(EBADF);
    inode = (uint64_t{st.st_dev} << 40) ^ uint64_t{st.st_ino};
  }
  emu::XrcDomain* e = nullptr;
  if (int err = Dev(context).OpenXrcd(inode, a->oflags & O_CREAT, a->oflags & O_EXCL, &e)) return Fail<ibv_xrcd>(err);
  auto* x = static_cast<Xrcd*>(calloc(1, sizeof(Xrcd)));
  if (x == nullptr) {
    Dev(context).CloseXrcd(e);
    return Fail<ibv_xrcd>(ENOMEM);
  }
  x->emu = e;
  x->xrcd.context = context;
  return &x->xrcd;
}

int CloseXrcd(ibv_xrcd* xrcd) {
  if (int err = Dev(xrcd->context).CloseXrcd(ToXrcd(xrcd)->emu)) return err;
  free(ToXrcd(xrcd));
  return 0;
}

std::mutex g_targets_mu;
std::multimap<emu::QueuePair*, Qp*> g_targets;  // every live handle on an XRC target QP

ibv_qp* OpenQp(ibv_context* context, ibv_qp_open_attr* a) {
  constexpr uint32_t kNeeded = IBV_QP_OPEN_ATTR_NUM | IBV_QP_OPEN_ATTR_XRCD | IBV_QP_OPEN_ATTR_TYPE;
  if (a->comp_mask & ~uint32_t{kNeeded | IBV_QP_OPEN_ATTR_CONTEXT}) return Fail<ibv_qp>(EOPNOTSUPP);
  if ((a->comp_mask & kNeeded) != kNeeded || a->xrcd == nullptr) return Fail<ibv_qp>(EINVAL);
  emu::Device& dev = Dev(context);
  emu::QueuePair* e = nullptr;
  if (int err = dev.OpenQp(ToXrcd(a->xrcd)->emu, a->qp_num, static_cast<emu::QpType>(a->qp_type), &e))
    return Fail<ibv_qp>(err);
  auto* qp = static_cast<Qp*>(calloc(1, sizeof(Qp)));
  if (qp == nullptr) {
    dev.DestroyQp(e);
    return Fail<ibv_qp>(ENOMEM);
  }
  qp->emu = e;
  emu::QpAttributes cur;
  dev.QueryQp(e, &cur);
  ibv_qp& q = qp->qpx.qp_base;
  q.context = context;
  q.qp_context = (a->comp_mask & IBV_QP_OPEN_ATTR_CONTEXT) ? a->qp_context : nullptr;
  q.handle = e->qpn();
  q.qp_num = e->qpn();
  q.state = static_cast<ibv_qp_state>(cur.qp_state);
  q.qp_type = IBV_QPT_XRC_RECV;
  pthread_mutex_init(&q.mutex, nullptr);
  pthread_cond_init(&q.cond, nullptr);
  TrackXrcTarget(qp);
  // The first handle here (another process's QP, or ours that only other processes held): its events come to it.
  if (e->owner == nullptr) dev.SetQpOwner(e, &q);
  return &q;
}

}  // namespace

namespace uroce::verbs {

void TrackXrcTarget(Qp* qp) {
  std::lock_guard lock(g_targets_mu);
  g_targets.emplace(qp->emu, qp);
}

void UntrackXrcTarget(Qp* qp) {
  std::lock_guard lock(g_targets_mu);
  auto [lo, hi] = g_targets.equal_range(qp->emu);
  Qp* other = nullptr;
  for (auto it = lo; it != hi;) {
    if (it->second == qp) {
      it = g_targets.erase(it);
    } else {
      other = it->second;
      ++it;
    }
  }
  // The QP outlives this handle: its events go to another one.
  ibv_qp* self = &qp->qpx.qp_base;
  if (other != nullptr && qp->emu->owner == self)
    Dev(self->context).SetQpOwner(qp->emu, &other->qpx.qp_base);
}

void FillSrqOps(verbs_context* v) {
  v->context.ops.post_srq_recv = PostSrqRecv;
  v->create_srq_ex = CreateSrqEx;
  v->get_srq_num = GetSrqNum;
  v->open_xrcd = OpenXrcd;
  v->close_xrcd = CloseXrcd;
  v->open_qp = OpenQp;
}

}  // namespace uroce::verbs

extern "C" {

#undef ibv_create_srq
static ibv_srq* CreateSrqUnguarded(ibv_pd* pd, ibv_srq_init_attr* attr) {
  if (pd == nullptr || attr == nullptr) return Fail<ibv_srq>(EINVAL);
  return NewSrq(pd->context, pd, emu::SrqType::kBasic, nullptr, nullptr, &attr->attr, attr->srq_context);
}

ibv_srq* ibv_create_srq(ibv_pd* pd, ibv_srq_init_attr* attr) {
  return NoThrow<ibv_srq*>(nullptr, [&] { return CreateSrqUnguarded(pd, attr); });
}

#undef ibv_modify_srq
int ibv_modify_srq(ibv_srq* srq, ibv_srq_attr* attr, int mask) {
  emu::SrqAttributes a{attr->max_wr, attr->max_sge, attr->srq_limit};
  return Dev(srq->context).ModifySrq(ToSrq(srq)->emu, a, static_cast<uint32_t>(mask));
}

#undef ibv_query_srq
int ibv_query_srq(ibv_srq* srq, ibv_srq_attr* attr) {
  emu::SrqAttributes a;
  if (int err = Dev(srq->context).QuerySrq(ToSrq(srq)->emu, &a)) return err;
  attr->max_wr = a.max_wr;
  attr->max_sge = a.max_sge;
  attr->srq_limit = a.srq_limit;
  return 0;
}

#undef ibv_destroy_srq
int ibv_destroy_srq(ibv_srq* srq) {
  if (int err = Dev(srq->context).DestroySrq(ToSrq(srq)->emu)) return err;  // EBUSY while a QP uses it
  WaitForAcknowledgements(&srq->mutex, &srq->cond, srq->events_completed,
                          WithdrawEvents(Ctx(srq->context)->async_events, srq, ToSrq(srq)->events_reported));
  pthread_cond_destroy(&srq->cond);
  pthread_mutex_destroy(&srq->mutex);
  free(ToSrq(srq));
  return 0;
}

}  // extern "C"
