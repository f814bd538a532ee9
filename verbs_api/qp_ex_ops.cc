// The ibv_wr_* work request API (man ibv_wr_post(3)) over emu::Device::PostSend.
//
// A batch is the critical region between ibv_wr_start() and ibv_wr_complete()/ibv_wr_abort(): a per-QP mutex is held
// for its whole length (ibv_wr_post(3) CONCURRENCY: the provider locks, so two threads never interleave batches).
// Each builder (ibv_wr_send, ibv_wr_rdma_write, ...) appends one emu::SendWr taking qpx.wr_id and qpx.wr_flags as they
// are at that call; the setters fill the last one. Nothing reaches the device before ibv_wr_complete().
//
// Errors: the builders and setters return nothing (by design of the API, to avoid branching), so a mistake they see
// (a setter with no WR, a data setter on an operation without data, inline data on a READ or atomic) is remembered
// and returned by ibv_wr_complete(). ibv_wr_complete() then checks every WR of the batch against the QP as the device
// would at post time (state, SGE count, inline size, UD address handle) BEFORE posting any: ibv_wr_post(3) RETURN
// VALUE says an error aborts "the entire posting", and real providers post nothing of a failed batch. Only a failure
// the device alone can see (the QP modified by another thread between the check and the post) can surface
// mid-batch; then the WRs before the failing one stay posted — exactly what ibv_post_send() does with the WRs before *bad_wr — and the rest are
// dropped.
#include "verbs_api/qp_ex_ops.h"

#include <infiniband/verbs.h>

#include <atomic>
#include <cerrno>
#include <mutex>
#include <new>
#include <thread>
#include <vector>

#include "emu/work_request.h"
#include "verbs_api/internal.h"

namespace uroce::verbs {
namespace {

using emu::SendOpcode;

// Per-QP batch state, owned through Qp::send_ops.
struct SendOpsBatch {
  std::mutex critical;                      // held from wr_start to wr_complete/wr_abort
  std::atomic<std::thread::id> owner{};     // the thread inside the critical region, if any
  std::vector<emu::SendWr> wrs;             // the batch so far, in posting order
  int error = 0;                            // first mistake a builder or setter saw in this batch
};

Qp* OfQpx(ibv_qp_ex* x) { return reinterpret_cast<Qp*>(x); }  // qpx is Qp's first member
SendOpsBatch& BatchOf(ibv_qp_ex* x) { return *static_cast<SendOpsBatch*>(OfQpx(x)->send_ops); }

bool InsideBatch(const SendOpsBatch& b) { return b.owner.load(std::memory_order_relaxed) == std::this_thread::get_id(); }

void Remember(SendOpsBatch& b, int err) {
  if (b.error == 0) b.error = err;
}

// Operations whose data comes from the DATA setters (ibv_wr_post(3) table: "DATA" column).
bool CarriesData(SendOpcode op) {
  const emu::SendOpcodeInfo* info = emu::FindSendOpcode(op);
  return info && info->carries_data;
}

// Inline data is "valid only for SEND and RDMA_WRITE" (ibv_wr_post(3), DATA transfer setters).
bool AllowsInline(SendOpcode op) {
  const emu::SendOpcodeInfo* info = emu::FindSendOpcode(op);
  return info && info->allows_inline;
}

// Starts a new WR from the QP's wr_id and wr_flags as they are now; nullptr outside a batch (misuse we cannot report:
// ibv_wr_complete() of a batch not started fails anyway).
emu::SendWr* Begin(ibv_qp_ex* x, SendOpcode op) {
  SendOpsBatch& b = BatchOf(x);
  if (!InsideBatch(b)) return nullptr;
  emu::SendWr& w = b.wrs.emplace_back();
  w.wr_id = x->wr_id;
  w.opcode = op;
  // Whether the data is inline is decided by the setter used, not by IBV_SEND_INLINE in wr_flags.
  w.flags = x->wr_flags & ~static_cast<unsigned>(IBV_SEND_INLINE);
  return &w;
}

// The WR the setters fill: the last one begun. Records EINVAL when there is none.
emu::SendWr* Current(ibv_qp_ex* x) {
  SendOpsBatch& b = BatchOf(x);
  if (!InsideBatch(b)) return nullptr;
  if (b.wrs.empty()) {
    Remember(b, EINVAL);
    return nullptr;
  }
  return &b.wrs.back();
}

// The WR a data setter fills, or nullptr (with the mistake recorded) when the operation takes no such data.
emu::SendWr* CurrentForData(ibv_qp_ex* x, bool is_inline) {
  emu::SendWr* w = Current(x);
  if (w == nullptr) return nullptr;
  if (!CarriesData(w->opcode) || (is_inline && !AllowsInline(w->opcode))) {
    Remember(BatchOf(x), EINVAL);
    return nullptr;
  }
  // A second data setter replaces the first.
  w->sg_list.clear();
  w->inline_data.clear();
  if (is_inline)
    w->flags |= IBV_SEND_INLINE;
  else
    w->flags &= ~static_cast<uint32_t>(IBV_SEND_INLINE);
  return w;
}

// --- critical region -------------------------------------------------------------------------------------------

void WrStart(ibv_qp_ex* x) {
  SendOpsBatch& b = BatchOf(x);
  b.critical.lock();
  b.owner.store(std::this_thread::get_id(), std::memory_order_relaxed);
  b.wrs.clear();
  b.error = 0;
}

void EndBatch(SendOpsBatch& b) {
  b.wrs.clear();
  b.error = 0;
  b.owner.store(std::thread::id{}, std::memory_order_relaxed);
  b.critical.unlock();
}

void WrAbort(ibv_qp_ex* x) {
  SendOpsBatch& b = BatchOf(x);
  if (!InsideBatch(b)) return;
  EndBatch(b);
}

// The post-time checks of Device::PostSend, run on the whole batch before any WR is posted.
int CheckBatch(Qp* qp, const std::vector<emu::SendWr>& wrs) {
  emu::QpAttributes a;
  if (int err = ToContext(qp->qpx.qp_base.context)->dev().QueryQp(qp->emu, &a)) return err;
  // A send queue accepts work in RTS, SQD, SQE and ERR (the last two flush it); not before RTS (IBTA 10.3.1).
  if (a.qp_state == emu::QpState::kReset || a.qp_state == emu::QpState::kInit || a.qp_state == emu::QpState::kRtr)
    return EINVAL;
  const bool ud = qp->qpx.qp_base.qp_type == IBV_QPT_UD;
  for (const emu::SendWr& w : wrs) {
    if (w.sg_list.size() > a.cap.max_send_sge) return EINVAL;
    if ((w.flags & IBV_SEND_INLINE) && w.inline_data.size() > a.cap.max_inline_data) return EINVAL;
    // ibv_wr_post(3) "QP Specific setters": every WR on a UD QP needs ibv_wr_set_ud_addr(), with an AH of the QP's PD.
    if (ud && (w.ah == nullptr || w.ah->pd() != qp->emu->init().pd)) return EINVAL;
  }
  return 0;
}

int WrComplete(ibv_qp_ex* x) {
  Engine& engine = *ToContext(x->qp_base.context)->engine;
  Engine::VerbTimer timer(engine);
  SendOpsBatch& b = BatchOf(x);
  if (!InsideBatch(b)) return EINVAL;  // no ibv_wr_start() on this thread
  Qp* qp = OfQpx(x);
  int err = b.error;
  if (err == 0) err = CheckBatch(qp, b.wrs);
  if (err == 0) {
    emu::Device& dev = ToContext(x->qp_base.context)->dev();
    for (emu::SendWr& w : b.wrs) {
      err = dev.PostSend(qp->emu, std::move(w));
      if (err) break;
    }
  }
  EndBatch(b);
  engine.ReceiveAfterSend();
  return err;
}

// --- builders ----------------------------------------------------------------------------------------------------

void WrSend(ibv_qp_ex* x) { Begin(x, SendOpcode::kSend); }

void WrSendImm(ibv_qp_ex* x, __be32 imm_data) {
  if (emu::SendWr* w = Begin(x, SendOpcode::kSendWithImm)) w->imm_data = imm_data;  // stays in wire order
}

void WrSendInv(ibv_qp_ex* x, uint32_t invalidate_rkey) {
  if (emu::SendWr* w = Begin(x, SendOpcode::kSendWithInv)) w->invalidate_rkey = invalidate_rkey;
}

void WrRdmaWrite(ibv_qp_ex* x, uint32_t rkey, uint64_t remote_addr) {
  if (emu::SendWr* w = Begin(x, SendOpcode::kRdmaWrite)) {
    w->rkey = rkey;
    w->remote_addr = remote_addr;
  }
}

void WrRdmaWriteImm(ibv_qp_ex* x, uint32_t rkey, uint64_t remote_addr, __be32 imm_data) {
  if (emu::SendWr* w = Begin(x, SendOpcode::kRdmaWriteWithImm)) {
    w->rkey = rkey;
    w->remote_addr = remote_addr;
    w->imm_data = imm_data;
  }
}

void WrRdmaRead(ibv_qp_ex* x, uint32_t rkey, uint64_t remote_addr) {
  if (emu::SendWr* w = Begin(x, SendOpcode::kRdmaRead)) {
    w->rkey = rkey;
    w->remote_addr = remote_addr;
  }
}

void WrAtomicCmpSwp(ibv_qp_ex* x, uint32_t rkey, uint64_t remote_addr, uint64_t compare, uint64_t swap) {
  if (emu::SendWr* w = Begin(x, SendOpcode::kAtomicCmpAndSwp)) {
    w->rkey = rkey;
    w->remote_addr = remote_addr;
    w->compare_add = compare;
    w->swap = swap;
  }
}

void WrAtomicFetchAdd(ibv_qp_ex* x, uint32_t rkey, uint64_t remote_addr, uint64_t add) {
  if (emu::SendWr* w = Begin(x, SendOpcode::kAtomicFetchAndAdd)) {
    w->rkey = rkey;
    w->remote_addr = remote_addr;
    w->compare_add = add;
  }
}

void WrLocalInv(ibv_qp_ex* x, uint32_t invalidate_rkey) {
  if (emu::SendWr* w = Begin(x, SendOpcode::kLocalInv)) w->invalidate_rkey = invalidate_rkey;
}

// ibv_wr_bind_mw(3): binds window `mw` (type 2) under its next R_Key `rkey`; the device checks the bind when the
// send queue reaches it and completes it with IBV_WC_MW_BIND_ERR when it is refused.
void WrBindMw(ibv_qp_ex* x, ibv_mw* mw, uint32_t rkey, const ibv_mw_bind_info* bind_info) {
  emu::SendWr* w = Begin(x, SendOpcode::kBindMw);
  if (w == nullptr) return;
  if (mw == nullptr || bind_info == nullptr) {
    Remember(BatchOf(x), EINVAL);
    return;
  }
  w->bind = ToEmuBind(*mw, rkey, *bind_info);
}

// --- setters -----------------------------------------------------------------------------------------------------

void WrSetSge(ibv_qp_ex* x, uint32_t lkey, uint64_t addr, uint32_t length) {
  if (emu::SendWr* w = CurrentForData(x, false)) w->sg_list.push_back({addr, length, lkey});
}

void WrSetSgeList(ibv_qp_ex* x, size_t num_sge, const ibv_sge* sg_list) {
  emu::SendWr* w = CurrentForData(x, false);
  if (w == nullptr) return;
  // Within the QP's capacity before sg_list is read (qp_verbs.cc's PostSend says why); ibv_wr_complete says EINVAL.
  if (num_sge > OfQpx(x)->emu->attributes().cap.max_send_sge) {
    Remember(BatchOf(x), EINVAL);
    return;
  }
  w->sg_list.reserve(num_sge);
  for (size_t i = 0; i < num_sge; ++i) w->sg_list.push_back({sg_list[i].addr, sg_list[i].length, sg_list[i].lkey});
}

// Inline data is copied now: the caller may reuse its buffer as soon as the setter returns (ibv_wr_post(3)).
void WrSetInlineData(ibv_qp_ex* x, void* addr, size_t length) {
  emu::SendWr* w = CurrentForData(x, true);
  if (w == nullptr) return;
  const auto* p = static_cast<const uint8_t*>(addr);
  w->inline_data.assign(p, p + length);
}

void WrSetInlineDataList(ibv_qp_ex* x, size_t num_buf, const ibv_data_buf* buf_list) {
  emu::SendWr* w = CurrentForData(x, true);
  if (w == nullptr) return;
  for (size_t i = 0; i < num_buf; ++i) {
    const auto* p = static_cast<const uint8_t*>(buf_list[i].addr);
    w->inline_data.insert(w->inline_data.end(), p, p + buf_list[i].length);
  }
}

void WrSetUdAddr(ibv_qp_ex* x, ibv_ah* ah, uint32_t remote_qpn, uint32_t remote_qkey) {
  emu::SendWr* w = Current(x);
  if (w == nullptr) return;
  w->ah = ah ? ToAh(ah)->emu : nullptr;
  w->remote_qpn = remote_qpn;
  w->remote_qkey = remote_qkey;
}

void WrSetXrcSrqn(ibv_qp_ex* x, uint32_t remote_srqn) {
  if (emu::SendWr* w = Current(x)) w->remote_srqn = remote_srqn;
}

// The send ops each QP type has (ibv_wr_post(3) table, narrowed by the wire: the UD opcodes are SEND only, UC adds
// RDMA WRITE but has no READ, atomic or SEND-with-Invalidate opcodes — IBTA base transport header opcode table).
// Local invalidate and MW bind are local operations of the send queue, on UC as on RC (the man page's table). TSO
// is an Ethernet offload we do not have.
constexpr uint64_t kUdOps = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM;
constexpr uint64_t kUcOps = kUdOps | IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM |
                            IBV_QP_EX_WITH_LOCAL_INV | IBV_QP_EX_WITH_BIND_MW;
constexpr uint64_t kRcOps = kUcOps | IBV_QP_EX_WITH_RDMA_READ | IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP |
                            IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD | IBV_QP_EX_WITH_SEND_WITH_INV;

}  // namespace

int InstallSendOps(Qp* qp, uint64_t send_ops_flags, ibv_qp_type qp_type) {
  uint64_t allowed = 0;
  switch (qp_type) {
    case IBV_QPT_UD:
      allowed = kUdOps;
      break;
    case IBV_QPT_UC:
      allowed = kUcOps;
      break;
    case IBV_QPT_RC:
    case IBV_QPT_XRC_SEND:
      allowed = kRcOps;
      break;
    default:
      return EOPNOTSUPP;  // XRC_RECV has no send queue; raw packet and driver QPs are not ours
  }
  // "If the QP does not support all the requested work request types then QP creation will fail" (ibv_wr_post(3)).
  if (send_ops_flags & ~allowed) return EOPNOTSUPP;
  auto* batch = new (std::nothrow) SendOpsBatch;
  if (batch == nullptr) return ENOMEM;

  ibv_qp_ex& x = qp->qpx;
  x.wr_start = WrStart;
  x.wr_complete = WrComplete;
  x.wr_abort = WrAbort;
  x.wr_set_sge = WrSetSge;
  x.wr_set_sge_list = WrSetSgeList;
  x.wr_set_inline_data = WrSetInlineData;
  x.wr_set_inline_data_list = WrSetInlineDataList;
  if (qp_type == IBV_QPT_UD) x.wr_set_ud_addr = WrSetUdAddr;
  if (qp_type == IBV_QPT_XRC_SEND) x.wr_set_xrc_srqn = WrSetXrcSrqn;
  // Only the requested builders, as rdma-core's providers do: calling another one is a NULL call, not a silent post.
  if (send_ops_flags & IBV_QP_EX_WITH_SEND) x.wr_send = WrSend;
  if (send_ops_flags & IBV_QP_EX_WITH_SEND_WITH_IMM) x.wr_send_imm = WrSendImm;
  if (send_ops_flags & IBV_QP_EX_WITH_SEND_WITH_INV) x.wr_send_inv = WrSendInv;
  if (send_ops_flags & IBV_QP_EX_WITH_RDMA_WRITE) x.wr_rdma_write = WrRdmaWrite;
  if (send_ops_flags & IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM) x.wr_rdma_write_imm = WrRdmaWriteImm;
  if (send_ops_flags & IBV_QP_EX_WITH_RDMA_READ) x.wr_rdma_read = WrRdmaRead;
  if (send_ops_flags & IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP) x.wr_atomic_cmp_swp = WrAtomicCmpSwp;
  if (send_ops_flags & IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD) x.wr_atomic_fetch_add = WrAtomicFetchAdd;
  if (send_ops_flags & IBV_QP_EX_WITH_LOCAL_INV) x.wr_local_inv = WrLocalInv;
  if (send_ops_flags & IBV_QP_EX_WITH_BIND_MW) x.wr_bind_mw = WrBindMw;
  qp->send_ops = batch;
  return 0;
}

void ReleaseSendOps(Qp* qp) {
  delete static_cast<SendOpsBatch*>(qp->send_ops);
  qp->send_ops = nullptr;
}

}  // namespace uroce::verbs

extern "C" {

// rdma-core hands out the ibv_qp_ex only for a QP created with IBV_QP_INIT_ATTR_SEND_OPS_FLAGS (its verbs_qp carries
// VERBS_QP_EX then) and NULL otherwise.
ibv_qp_ex* ibv_qp_to_qp_ex(ibv_qp* qp) {
  uroce::verbs::Qp* q = uroce::verbs::ToQp(qp);
  if (q->send_ops == nullptr) {
    errno = EOPNOTSUPP;
    return nullptr;
  }
  return &q->qpx;
}

}  // extern "C"
