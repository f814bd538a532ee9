// Shared receive queues and XRC on the emulated HCA: devices on a SimNetwork with a ManualClock.
//
// What is checked: the SRQ limit event fires exactly once per arming; RC and UD QPs on one SRQ share its WQEs;
// an empty SRQ makes an RC sender see RNR NAKs and recover once receives are posted; a QP on an SRQ entering the
// error state raises LAST_WQE_REACHED; destroy is refused while a QP uses the SRQ; one XRC SRQ shared by several
// target QPs receives from several initiator QPs, completions carrying each target's number, packets carrying XRC
// opcodes and the XRCETH; a request naming a foreign SRQ is NAKed; XRC domains by inode; ibv_open_qp's references.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <set>

#include "emu/test_fabric.h"
#include "wire/direct_access.h"
#include "wire/opcode.h"
#include "wire/service_protocol.h"

namespace uroce::emu {
namespace {

using testing::Buffer;
using testing::Drain;
using testing::Fabric;
using testing::Node;
using testing::Register;

constexpr uint32_t kAll = access::kLocalWrite | access::kRemoteWrite | access::kRemoteRead;

int CountEvents(const Node& n, AsyncEventType t) {
  return static_cast<int>(std::count_if(n.events.begin(), n.events.end(),
                                        [t](const AsyncEvent& e) { return e.type == t; }));
}

RecvWr Recv(uint64_t id, const Buffer& b, uint64_t off, uint32_t len) {
  RecvWr r;
  r.wr_id = id;
  r.sg_list.push_back(b.At(off, len));
  return r;
}

SendWr Send(uint64_t id, const Buffer& b, uint64_t off, uint32_t len, uint32_t remote_srqn = 0) {
  SendWr w;
  w.wr_id = id;
  w.opcode = SendOpcode::kSend;
  w.flags = send_flags::kSignaled;
  w.sg_list.push_back(b.At(off, len));
  w.remote_srqn = remote_srqn;
  return w;
}

// Moves a QP of any connected type (RC, XRC_SEND, XRC_RECV) to RTS towards `peer_qpn` with the masks the transition
// table asks of its type (ibv_modify_qp(3); the kernel's qp_state_table).
void Connect(Device& dev, QueuePair* qp, const Device& peer, uint32_t peer_qpn) {
  QpAttributes a;
  a.qp_state = QpState::kInit;
  a.port_num = 1;
  a.qp_access_flags = qp->type() == QpType::kXrcSend ? 0 : kAll;
  ASSERT_EQ(dev.ModifyQp(qp, a, attr::kState | attr::kPkeyIndex | attr::kPort | attr::kAccessFlags), 0);
  a.qp_state = QpState::kRtr;
  a.path_mtu = Mtu::k1024;
  a.dest_qp_num = peer_qpn;
  a.rq_psn = 100;
  a.ah_attr.dgid = peer.config().address.bytes();
  uint32_t mask = attr::kState | attr::kAv | attr::kPathMtu | attr::kDestQpn | attr::kRqPsn;
  if (qp->type() != QpType::kXrcSend) {
    a.max_dest_rd_atomic = 1;
    a.min_rnr_timer = 1;
    mask |= attr::kMaxDestRdAtomic | attr::kMinRnrTimer;
  }
  ASSERT_EQ(dev.ModifyQp(qp, a, mask), 0);
  a.qp_state = QpState::kRts;
  a.sq_psn = 100;
  a.timeout = 14;
  a.retry_cnt = 7;
  a.rnr_retry = 7;
  a.max_rd_atomic = 1;
  mask = attr::kState | attr::kSqPsn | attr::kTimeout;
  if (qp->type() != QpType::kXrcRecv) mask |= attr::kRetryCnt | attr::kRnrRetry | attr::kMaxQpRdAtomic;
  ASSERT_EQ(dev.ModifyQp(qp, a, mask), 0);
}

struct SrqBench {
  Fabric fabric;
  Node* a = nullptr;  // senders
  Node* b = nullptr;  // receivers on the SRQ
  ProtectionDomain *pa = nullptr, *pb = nullptr;
  CompletionQueue *ca = nullptr, *cb = nullptr;
  SharedReceiveQueue* srq = nullptr;

  explicit SrqBench(uint32_t srq_wr = 64) {
    a = &fabric.AddNode(Mtu::k1024);
    b = &fabric.AddNode(Mtu::k1024);
    pa = a->device->AllocPd();
    pb = b->device->AllocPd();
    EXPECT_EQ(a->device->CreateCq(256, &ca), 0);
    EXPECT_EQ(b->device->CreateCq(256, &cb), 0);
    SrqAttributes sa{srq_wr, 2, 0};
    EXPECT_EQ(b->device->CreateSrq(SrqType::kBasic, pb, nullptr, nullptr, sa, &srq), 0);
  }
  // What creates a QP of `type` on b attached to the SRQ.
  QpInitAttributes InitOnSrq(QpType type) const {
    QpInitAttributes init;
    init.type = type;
    init.cap = {4, 4, 1, 1, 0};
    init.pd = pb;
    init.send_cq = init.recv_cq = cb;
    init.srq = srq;
    return init;
  }
  // An RC pair: the sender on a, the receiver on b attached to the SRQ.
  std::pair<QueuePair*, QueuePair*> RcPairOnSrq() {
    QpInitAttributes init;
    init.type = QpType::kRc;
    init.cap = {16, 16, 2, 2, 0};
    init.pd = pa;
    init.send_cq = init.recv_cq = ca;
    QueuePair *qa = nullptr, *qb = nullptr;
    EXPECT_EQ(a->device->CreateQp(init, &qa), 0);
    init.pd = pb;
    init.send_cq = init.recv_cq = cb;
    init.srq = srq;
    EXPECT_EQ(b->device->CreateQp(init, &qb), 0);
    EXPECT_EQ(init.cap.max_recv_wr, 0u);  // ignored on an SRQ
    Connect(*a->device, qa, *b->device, qb->qpn());
    Connect(*b->device, qb, *a->device, qa->qpn());
    return {qa, qb};
  }
};

TEST(Srq, LimitEventFiresOncePerArming) {
  SrqBench t;
  auto [qa, qb] = t.RcPairOnSrq();
  Buffer src = Register(*t.a->device, t.pa, 4096, kAll);
  Buffer dst = Register(*t.b->device, t.pb, 64 * 64, kAll);
  for (int i = 0; i < 10; ++i) ASSERT_EQ(t.b->device->PostSrqRecv(t.srq, Recv(i, dst, i * 64, 64)), 0);
  ASSERT_EQ(t.b->device->ModifySrq(t.srq, {0, 0, 8}, srq_attr::kLimit), 0);
  SrqAttributes q;
  ASSERT_EQ(t.b->device->QuerySrq(t.srq, &q), 0);
  EXPECT_EQ(q.srq_limit, 8u);
  // 10 -> 9 -> 8 WQEs: not below the limit yet.
  for (int i = 0; i < 2; ++i) ASSERT_EQ(t.a->device->PostSend(qa, Send(i, src, 0, 32)), 0);
  t.fabric.Pump();
  EXPECT_EQ(CountEvents(*t.b, AsyncEventType::kSrqLimitReached), 0);
  // 8 -> 7: fires, once; the SRQ disarms (srq_limit reads 0) and further takes stay silent.
  for (int i = 0; i < 4; ++i) ASSERT_EQ(t.a->device->PostSend(qa, Send(i, src, 0, 32)), 0);
  t.fabric.Pump();
  EXPECT_EQ(CountEvents(*t.b, AsyncEventType::kSrqLimitReached), 1);
  ASSERT_EQ(t.b->device->QuerySrq(t.srq, &q), 0);
  EXPECT_EQ(q.srq_limit, 0u);
  const auto& ev = t.b->events;
  auto it = std::find_if(ev.begin(), ev.end(), [](auto& e) { return e.type == AsyncEventType::kSrqLimitReached; });
  ASSERT_NE(it, ev.end());
  EXPECT_EQ(it->srq, t.srq);
  // Re-arming below the current depth (4 left, limit 5): fires at the next take, once.
  ASSERT_EQ(t.b->device->ModifySrq(t.srq, {0, 0, 5}, srq_attr::kLimit), 0);
  ASSERT_EQ(t.a->device->PostSend(qa, Send(9, src, 0, 32)), 0);
  ASSERT_EQ(t.a->device->PostSend(qa, Send(9, src, 0, 32)), 0);
  t.fabric.Pump();
  EXPECT_EQ(CountEvents(*t.b, AsyncEventType::kSrqLimitReached), 2);
  // Every message arrived, completions on the QP's receive CQ with its number.
  auto wcs = Drain(t.cb);
  ASSERT_EQ(wcs.size(), 8u);
  for (const Completion& c : wcs) {
    EXPECT_EQ(c.status, WcStatus::kSuccess);
    EXPECT_EQ(c.qp_num, qb->qpn());
    EXPECT_EQ(c.byte_len, 32u);
  }
}

TEST(Srq, ModifyAndPostFollowTheManPages) {
  SrqBench t(4);
  Buffer dst = Register(*t.b->device, t.pb, 4096, kAll);
  Device& d = *t.b->device;
  for (int i = 0; i < 4; ++i) ASSERT_EQ(d.PostSrqRecv(t.srq, Recv(i, dst, 0, 64)), 0);
  EXPECT_EQ(d.PostSrqRecv(t.srq, Recv(5, dst, 0, 64)), ENOMEM);  // full
  RecvWr three = Recv(6, dst, 0, 8);
  three.sg_list.push_back(dst.At(8, 8));
  three.sg_list.push_back(dst.At(16, 8));
  EXPECT_EQ(d.PostSrqRecv(t.srq, std::move(three)), EINVAL);  // more SGEs than max_sge (2)
  EXPECT_EQ(d.ModifySrq(t.srq, {3, 0, 0}, srq_attr::kMaxWr), EINVAL);  // below the 4 queued
  // Invalid limit with a valid resize: nothing changes (ibv_modify_srq(3) NOTES).
  EXPECT_EQ(d.ModifySrq(t.srq, {8, 0, 9}, srq_attr::kMaxWr | srq_attr::kLimit), EINVAL);
  SrqAttributes q;
  ASSERT_EQ(d.QuerySrq(t.srq, &q), 0);
  EXPECT_EQ(q.max_wr, 4u);
  EXPECT_EQ(q.max_sge, 2u);
  EXPECT_EQ(d.ModifySrq(t.srq, {8, 0, 0}, srq_attr::kMaxWr), 0);
  EXPECT_EQ(d.PostSrqRecv(t.srq, Recv(7, dst, 0, 64)), 0);
  ASSERT_EQ(d.QuerySrq(t.srq, &q), 0);
  EXPECT_EQ(q.max_wr, 8u);
  EXPECT_EQ(d.ModifySrq(t.srq, {0, 0, 0}, 1u << 5), EINVAL);
  SrqAttributes too_big{d.config().limits.max_srq_wr + 1, 1, 0};
  SharedReceiveQueue* other = nullptr;
  EXPECT_EQ(d.CreateSrq(SrqType::kBasic, t.pb, nullptr, nullptr, too_big, &other), EINVAL);
  SrqAttributes ok{16, 1, 0};
  EXPECT_EQ(d.CreateSrq(SrqType::kBasic, nullptr, nullptr, nullptr, ok, &other), EINVAL);
  EXPECT_EQ(d.CreateSrq(SrqType::kXrc, t.pb, nullptr, t.cb, ok, &other), EINVAL);  // XRC needs a domain
}

TEST(Srq, QpRulesDestroyBusyAndLastWqeReached) {
  SrqBench t;
  Device& d = *t.b->device;
  QpInitAttributes init = t.InitOnSrq(QpType::kUc);
  QueuePair* qp = nullptr;
  EXPECT_EQ(d.CreateQp(init, &qp), EINVAL);  // ibv_create_qp(3) NOTES: only RC and UD on an SRQ
  init.type = QpType::kUd;
  ASSERT_EQ(d.CreateQp(init, &qp), 0);
  Buffer dst = Register(d, t.pb, 4096, kAll);
  EXPECT_EQ(d.PostRecv(qp, Recv(1, dst, 0, 64)), EINVAL);  // INIT or not: its receives go to the SRQ
  EXPECT_EQ(d.DestroySrq(t.srq), EBUSY);
  EXPECT_EQ(d.DeallocPd(t.pb), EBUSY);
  QpAttributes a;
  a.qp_state = QpState::kInit;
  a.qkey = 7;
  ASSERT_EQ(d.ModifyQp(qp, a, attr::kState | attr::kPkeyIndex | attr::kPort | attr::kQkey), 0);
  a.qp_state = QpState::kErr;
  ASSERT_EQ(d.ModifyQp(qp, a, attr::kState), 0);
  EXPECT_EQ(CountEvents(*t.b, AsyncEventType::kQpLastWqeReached), 1);
  ASSERT_FALSE(t.b->events.empty());
  EXPECT_EQ(t.b->events.back().qp, qp);
  ASSERT_EQ(d.DestroyQp(qp), 0);
  EXPECT_EQ(d.DestroySrq(t.srq), 0);
}

// A lost device (Device::Fail, the host's device service gone) leaves nobody to take an SRQ's WQEs: they complete
// with IBV_WC_WR_FLUSH_ERR in the receive CQ of the SRQ's QP, and so does a receive posted afterwards; a program
// blocked on its SRQ's receives must not wait for ever.
TEST(Srq, ALostDeviceFlushesTheReceivesOfItsSrqs) {
  SrqBench t;
  auto [qa, qb] = t.RcPairOnSrq();
  Device& d = *t.b->device;
  // A second QP on the SRQ, numbered after qb: the flush names the lowest.
  QpInitAttributes init = t.InitOnSrq(QpType::kRc);
  QueuePair* later = nullptr;
  ASSERT_EQ(d.CreateQp(init, &later), 0);
  ASSERT_GT(later->qpn(), qb->qpn());
  Buffer dst = Register(d, t.pb, 4096, kAll);
  for (uint64_t id = 1; id <= 3; ++id) ASSERT_EQ(d.PostSrqRecv(t.srq, Recv(id, dst, id * 64, 64)), 0);
  ASSERT_TRUE(Drain(t.cb).empty());

  d.Fail();
  std::vector<Completion> flushed = Drain(t.cb);
  ASSERT_EQ(flushed.size(), 3u);
  for (uint64_t i = 0; i < 3; ++i) {
    EXPECT_EQ(flushed[i].wr_id, i + 1);
    EXPECT_EQ(flushed[i].status, WcStatus::kWrFlushErr);
    EXPECT_EQ(flushed[i].opcode, WcOpcode::kRecv);
    EXPECT_EQ(flushed[i].qp_num, qb->qpn());
  }
  EXPECT_TRUE(t.srq->empty());
  EXPECT_EQ(CountEvents(*t.b, AsyncEventType::kDeviceFatal), 1);

  ASSERT_EQ(d.PostSrqRecv(t.srq, Recv(4, dst, 0, 64)), 0);
  flushed = Drain(t.cb);
  ASSERT_EQ(flushed.size(), 1u);
  EXPECT_EQ(flushed[0].wr_id, 4u);
  EXPECT_EQ(flushed[0].status, WcStatus::kWrFlushErr);
  EXPECT_TRUE(t.srq->empty());
  // Still the man page's limits: a WR with too many SGEs is refused, not flushed.
  RecvWr wide = Recv(5, dst, 0, 8);
  for (int i = 0; i < 4; ++i) wide.sg_list.push_back(dst.At(64 * i, 8));
  EXPECT_EQ(d.PostSrqRecv(t.srq, std::move(wide)), EINVAL);
  EXPECT_TRUE(Drain(t.cb).empty());
}

// An SRQ without a QP has no CQ a program could poll for its receives: they stay queued on a lost device.
TEST(Srq, ALostDeviceKeepsTheReceivesOfAnSrqWithoutQps) {
  SrqBench t;
  Device& d = *t.b->device;
  Buffer dst = Register(d, t.pb, 4096, kAll);
  ASSERT_EQ(d.PostSrqRecv(t.srq, Recv(1, dst, 0, 64)), 0);
  d.Fail();
  ASSERT_EQ(d.PostSrqRecv(t.srq, Recv(2, dst, 64, 64)), 0);
  EXPECT_EQ(t.srq->depth(), 2u);
  EXPECT_TRUE(Drain(t.cb).empty());
}

TEST(Srq, EmptySrqMakesRcSenderRetryAfterRnrNak) {
  SrqBench t;
  auto [qa, qb] = t.RcPairOnSrq();
  Buffer src = Register(*t.a->device, t.pa, 4096, kAll);
  Buffer dst = Register(*t.b->device, t.pb, 4096, kAll);
  std::memset(src.bytes.data(), 0x3c, 100);
  ASSERT_EQ(t.a->device->PostSend(qa, Send(1, src, 0, 100)), 0);
  t.fabric.PumpUntil(t.fabric.clock().NowNs() + 5'000'000);  // a few RNR rounds
  EXPECT_GE(t.b->device->counters().rc_rnr_naks_sent, 1u);
  EXPECT_TRUE(Drain(t.ca).empty());
  ASSERT_EQ(t.b->device->PostSrqRecv(t.srq, Recv(42, dst, 0, 256)), 0);
  t.fabric.Pump();
  auto sent = Drain(t.ca);
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(sent[0].status, WcStatus::kSuccess);
  auto got = Drain(t.cb);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].wr_id, 42u);
  EXPECT_EQ(got[0].qp_num, qb->qpn());
  EXPECT_EQ(dst.bytes[99], 0x3c);
}

TEST(Srq, AQpResetOrDestroyedWithReceivesUnpolledGivesTheirWqesBackToTheSrq) {
  for (bool destroy : {false, true}) {
    SrqBench t;
    auto [qa, qb] = t.RcPairOnSrq();
    auto [qa2, qb2] = t.RcPairOnSrq();  // a second QP on the same SRQ and CQ
    Buffer src = Register(*t.a->device, t.pa, 4096, kAll);
    Buffer dst = Register(*t.b->device, t.pb, 4096, kAll);
    for (int i = 0; i < 4; ++i) ASSERT_EQ(t.b->device->PostSrqRecv(t.srq, Recv(10 + i, dst, i * 256, 256)), 0);
    // qb takes two, qb2 one; nobody polls.
    ASSERT_EQ(t.a->device->PostSend(qa, Send(1, src, 0, 32)), 0);
    ASSERT_EQ(t.a->device->PostSend(qa2, Send(2, src, 0, 32)), 0);
    ASSERT_EQ(t.a->device->PostSend(qa, Send(3, src, 0, 32)), 0);
    t.fabric.Pump();
    EXPECT_EQ(t.srq->depth(), 1u);
    if (destroy) {
      ASSERT_EQ(t.b->device->DestroyQp(qb), 0);
    } else {
      QpAttributes reset;
      reset.qp_state = QpState::kReset;
      ASSERT_EQ(t.b->device->ModifyQp(qb, reset, attr::kState), 0);
    }
    // qb's two completions went with it (as on mlx5), and the WQEs behind them are posted again: none is lost.
    EXPECT_EQ(t.srq->depth(), 3u) << destroy;
    auto left = Drain(t.cb);
    ASSERT_EQ(left.size(), 1u) << destroy;
    EXPECT_EQ(left[0].qp_num, qb2->qpn());
    EXPECT_EQ(left[0].wr_id, 11u);
    // The WQEs given back receive again, in the order the SRQ holds them.
    std::set<uint64_t> ids;
    for (int i = 0; i < 3; ++i) ASSERT_EQ(t.a->device->PostSend(qa2, Send(4 + i, src, 0, 16)), 0);
    t.fabric.Pump();
    for (const Completion& c : Drain(t.cb)) {
      EXPECT_EQ(c.status, WcStatus::kSuccess);
      ids.insert(c.wr_id);
    }
    EXPECT_EQ(ids, (std::set<uint64_t>{10, 12, 13})) << destroy;
  }
}

// One XRC SRQ on node t, three target QPs (one per initiator); three initiators on two other nodes.
TEST(Xrc, OneSrqServesSeveralTargetsFromSeveralInitiators) {
  Fabric f;
  Node& t = f.AddNode(Mtu::k1024);
  Node& i1 = f.AddNode(Mtu::k1024);
  Node& i2 = f.AddNode(Mtu::k1024);
  for (Node* n : {&t, &i1, &i2}) n->transport->record = true;
  Device& td = *t.device;
  XrcDomain* xrcd = nullptr;
  ASSERT_EQ(td.OpenXrcd(std::nullopt, true, false, &xrcd), 0);
  ProtectionDomain* tpd = td.AllocPd();
  CompletionQueue* tcq = nullptr;
  ASSERT_EQ(td.CreateCq(64, &tcq), 0);
  SrqAttributes sa{32, 1, 0};
  SharedReceiveQueue* srq = nullptr;
  ASSERT_EQ(td.CreateSrq(SrqType::kXrc, tpd, xrcd, tcq, sa, &srq), 0);
  Buffer dst = Register(td, tpd, 16 * 256, kAll);
  for (int i = 0; i < 16; ++i) ASSERT_EQ(td.PostSrqRecv(srq, Recv(100 + i, dst, i * 256, 256)), 0);

  struct Initiator {
    Node* node;
    QueuePair* ini;
    QueuePair* tgt;
    CompletionQueue* cq;
    Buffer buf;
  };
  std::vector<Initiator> inis;
  for (Node* n : {&i1, &i2, &i2}) {
    Initiator x{n, nullptr, nullptr, nullptr, {}};
    ProtectionDomain* pd = n->device->AllocPd();
    ASSERT_EQ(n->device->CreateCq(64, &x.cq), 0);
    QpInitAttributes ini;
    ini.type = QpType::kXrcSend;
    ini.pd = pd;
    ini.send_cq = x.cq;
    ini.cap = {16, 0, 1, 0, 0};
    ASSERT_EQ(n->device->CreateQp(ini, &x.ini), 0);
    QpInitAttributes tgt;
    tgt.type = QpType::kXrcRecv;
    tgt.xrcd = xrcd;
    ASSERT_EQ(td.CreateQp(tgt, &x.tgt), 0);
    EXPECT_EQ(tgt.send_cq, nullptr);  // a target has no CQs
    Connect(*n->device, x.ini, td, x.tgt->qpn());
    Connect(td, x.tgt, *n->device, x.ini->qpn());
    x.buf = Register(*n->device, pd, 256, kAll);
    inis.push_back(std::move(x));
  }
  for (size_t k = 0; k < inis.size(); ++k) {
    Initiator& x = inis[k];
    for (int m = 0; m < 2; ++m) {
      std::memset(x.buf.bytes.data(), static_cast<int>(0x10 * (k + 1)), 200);
      ASSERT_EQ(x.node->device->PostSend(x.ini, Send(k * 10 + m, x.buf, 0, 200, srq->srqn())), 0);
      f.Pump();
    }
  }
  for (Initiator& x : inis) {
    auto wcs = Drain(x.cq);
    ASSERT_EQ(wcs.size(), 2u);
    for (const Completion& c : wcs) EXPECT_EQ(c.status, WcStatus::kSuccess);
  }
  // Every message landed in the shared SRQ's WQEs, in order, completed on the SRQ's CQ with the target's number.
  auto got = Drain(tcq);
  ASSERT_EQ(got.size(), 6u);
  for (size_t j = 0; j < got.size(); ++j) {
    EXPECT_EQ(got[j].status, WcStatus::kSuccess);
    EXPECT_EQ(got[j].wr_id, 100 + j);
    EXPECT_EQ(got[j].qp_num, inis[j / 2].tgt->qpn());
    EXPECT_EQ(got[j].byte_len, 200u);
    EXPECT_EQ(dst.bytes[j * 256 + 199], 0x10 * (j / 2 + 1));
  }
  // On the wire: XRC_SEND_ONLY with the XRCETH from the initiators, XRC_ACKNOWLEDGE from the target.
  std::set<uint8_t> from_initiators, from_target;
  for (Node* n : {&i1, &i2})
    for (const auto& s : n->transport->log())
      if (auto p = s.Parse()) {
        from_initiators.insert(p->bth.opcode);
        ASSERT_TRUE(p->xrc.has_value());
        EXPECT_EQ(p->xrc->srqn, srq->srqn());
      }
  for (const auto& s : t.transport->log())
    if (auto p = s.Parse()) from_target.insert(p->bth.opcode);
  EXPECT_EQ(from_initiators, (std::set<uint8_t>{0xA4}));
  EXPECT_EQ(from_target, (std::set<uint8_t>{0xB1}));
  // The SRQ is busy neither through the targets nor the CQ once they are gone; the domain is.
  EXPECT_EQ(td.DestroyCq(tcq), EBUSY);
  EXPECT_EQ(td.CloseXrcd(xrcd), EBUSY);
  for (Initiator& x : inis) ASSERT_EQ(td.DestroyQp(x.tgt), 0);
  ASSERT_EQ(td.DestroySrq(srq), 0);
  EXPECT_EQ(td.CloseXrcd(xrcd), 0);
}

// An XRC target QP in `xrcd` on `td`, and an XRC initiator on `id` (its own PD and CQ) connected to it.
struct XrcLink {
  QueuePair* tq = nullptr;
  ProtectionDomain* ipd = nullptr;
  CompletionQueue* icq = nullptr;
  QueuePair* iq = nullptr;
};

void LinkXrc(Device& td, XrcDomain* xrcd, Device& id, XrcLink* out) {
  QpInitAttributes tgt;
  tgt.type = QpType::kXrcRecv;
  tgt.xrcd = xrcd;
  ASSERT_EQ(td.CreateQp(tgt, &out->tq), 0);
  out->ipd = id.AllocPd();
  ASSERT_EQ(id.CreateCq(16, &out->icq), 0);
  QpInitAttributes ini;
  ini.type = QpType::kXrcSend;
  ini.pd = out->ipd;
  ini.send_cq = out->icq;
  ini.cap = {4, 0, 1, 0, 0};
  ASSERT_EQ(id.CreateQp(ini, &out->iq), 0);
  Connect(id, out->iq, td, out->tq->qpn());
  Connect(td, out->tq, id, out->iq->qpn());
}

// A target device with an XRC domain, a PD, a CQ and an XRC SRQ of 8 WQEs in that domain, and an initiator device.
struct XrcTargetBench {
  Fabric f;
  Node& t = f.AddNode(Mtu::k1024);
  Node& i = f.AddNode(Mtu::k1024);
  Device& td = *t.device;
  XrcDomain* xrcd = nullptr;
  ProtectionDomain* tpd = nullptr;
  CompletionQueue* tcq = nullptr;  // the SRQ's
  SharedReceiveQueue* srq = nullptr;
  XrcTargetBench() {
    EXPECT_EQ(td.OpenXrcd(std::nullopt, true, false, &xrcd), 0);
    tpd = td.AllocPd();
    EXPECT_EQ(td.CreateCq(16, &tcq), 0);
    SrqAttributes sa{8, 1, 0};
    EXPECT_EQ(td.CreateSrq(SrqType::kXrc, tpd, xrcd, tcq, sa, &srq), 0);
  }
};

// On a lost device an XRC SRQ's receives complete in the SRQ's own CQ (Annex A14), naming a target QP of its domain.
TEST(Xrc, ALostDeviceFlushesTheReceivesOfAnXrcSrqIntoItsCq) {
  XrcTargetBench b;
  ASSERT_TRUE(b.srq != nullptr);
  Device& td = b.td;
  CompletionQueue* other_cq = nullptr;
  ASSERT_EQ(td.CreateCq(16, &other_cq), 0);
  XrcLink link;
  ASSERT_NO_FATAL_FAILURE(LinkXrc(td, b.xrcd, *b.i.device, &link));
  Buffer dst = Register(td, b.tpd, 1024, kAll);
  ASSERT_EQ(td.PostSrqRecv(b.srq, Recv(7, dst, 0, 256)), 0);
  ASSERT_EQ(td.PostSrqRecv(b.srq, Recv(8, dst, 256, 256)), 0);

  td.Fail();
  const std::vector<Completion> flushed = Drain(b.tcq);
  ASSERT_EQ(flushed.size(), 2u);
  EXPECT_EQ(flushed[0].wr_id, 7u);
  EXPECT_EQ(flushed[1].wr_id, 8u);
  for (const Completion& c : flushed) {
    EXPECT_EQ(c.status, WcStatus::kWrFlushErr);
    EXPECT_EQ(c.qp_num, link.tq->qpn());
  }
  EXPECT_TRUE(Drain(other_cq).empty());
}

TEST(Xrc, RequestNamingAnotherDomainsSrqIsNaked) {
  Fabric f;
  Node& t = f.AddNode(Mtu::k1024);
  Node& i = f.AddNode(Mtu::k1024);
  Device& td = *t.device;
  XrcDomain *mine = nullptr, *other = nullptr;
  ASSERT_EQ(td.OpenXrcd(std::nullopt, true, false, &mine), 0);
  ASSERT_EQ(td.OpenXrcd(std::nullopt, true, false, &other), 0);
  EXPECT_NE(mine, other);  // fd -1: a private domain each time
  ProtectionDomain* tpd = td.AllocPd();
  CompletionQueue* tcq = nullptr;
  ASSERT_EQ(td.CreateCq(16, &tcq), 0);
  SrqAttributes sa{8, 1, 0};
  SharedReceiveQueue* foreign = nullptr;
  ASSERT_EQ(td.CreateSrq(SrqType::kXrc, tpd, other, tcq, sa, &foreign), 0);
  Buffer dst = Register(td, tpd, 256, kAll);
  ASSERT_EQ(td.PostSrqRecv(foreign, Recv(1, dst, 0, 256)), 0);
  XrcLink link;
  ASSERT_NO_FATAL_FAILURE(LinkXrc(td, mine, *i.device, &link));
  auto [tq, ipd, icq, iq] = link;
  Buffer src = Register(*i.device, ipd, 256, kAll);
  ASSERT_EQ(i.device->PostSend(iq, Send(5, src, 0, 10, foreign->srqn())), 0);
  f.Pump();
  auto wcs = Drain(icq);
  ASSERT_EQ(wcs.size(), 1u);
  EXPECT_EQ(wcs[0].status, WcStatus::kRemInvReqErr);
  EXPECT_TRUE(Drain(tcq).empty());
  EXPECT_EQ(tq->state(), QpState::kErr);
}

// The PSN is judged before the SRQ (rxe's order, check_psn first): one forged XRC SEND with a PSN outside the window
// and a non-existent SRQ number changes nothing at the target, whose real initiator then delivers as usual.
TEST(Xrc, APacketOutsideThePsnWindowCannotFailTheTarget) {
  XrcTargetBench b;
  ASSERT_TRUE(b.srq != nullptr);
  Fabric& f = b.f;
  Node &t = b.t, &i = b.i;
  Device& td = b.td;
  XrcDomain* xrcd = b.xrcd;
  ProtectionDomain* tpd = b.tpd;
  CompletionQueue* tcq = b.tcq;
  SharedReceiveQueue* srq = b.srq;
  Buffer dst = Register(td, tpd, 256, kAll);
  ASSERT_EQ(td.PostSrqRecv(srq, Recv(1, dst, 0, 256)), 0);
  XrcLink link;
  ASSERT_NO_FATAL_FAILURE(LinkXrc(td, xrcd, *i.device, &link));
  auto [tq, ipd, icq, iq] = link;
  // Forged, from the initiator's address: a SEND ONLY with a PSN ahead of the window and an SRQ number that is none.
  wire::PacketSpec forged;
  forged.bth.opcode = 0xA4;  // XRC SEND ONLY (Annex A14)
  forged.bth.dest_qp = tq->qpn();
  forged.bth.psn = (tq->attributes().rq_psn + 0x1234) & 0xffffff;
  forged.xrc = wire::XrcEth{.srqn = 0xabcdef};
  const uint8_t payload[8] = {};
  f.Inject(i, t, forged, payload);
  f.Pump();
  EXPECT_NE(tq->state(), QpState::kErr);
  EXPECT_TRUE(Drain(tcq).empty());
  // The real sender delivers.
  Buffer src = Register(*i.device, ipd, 256, kAll);
  ASSERT_EQ(i.device->PostSend(iq, Send(5, src, 0, 10, srq->srqn())), 0);
  f.Pump();
  auto wcs = Drain(icq);
  ASSERT_EQ(wcs.size(), 1u);
  EXPECT_EQ(wcs[0].status, WcStatus::kSuccess);
  EXPECT_EQ(Drain(tcq).size(), 1u);
}

TEST(Xrc, DomainsByInodeFollowOpenFlags) {
  Fabric f;
  Device& d = *f.AddNode().device;
  XrcDomain *x = nullptr, *y = nullptr;
  EXPECT_EQ(d.OpenXrcd(uint64_t{77}, false, false, &x), EAGAIN);  // none yet and no O_CREAT
  ASSERT_EQ(d.OpenXrcd(uint64_t{77}, true, false, &x), 0);
  ASSERT_EQ(d.OpenXrcd(uint64_t{77}, false, false, &y), 0);
  EXPECT_EQ(x, y);  // the same inode gives the same domain
  EXPECT_EQ(d.OpenXrcd(uint64_t{77}, true, true, &y), EINVAL);  // O_CREAT | O_EXCL and it exists
  ASSERT_EQ(d.OpenXrcd(uint64_t{78}, true, true, &y), 0);
  EXPECT_NE(x, y);
  EXPECT_EQ(d.CloseXrcd(x), 0);
  EXPECT_EQ(d.CloseXrcd(x), 0);  // the second reference destroys it
  EXPECT_EQ(d.CloseXrcd(x), EINVAL);
  EXPECT_EQ(d.OpenXrcd(uint64_t{77}, false, false, &x), EAGAIN);
  EXPECT_EQ(d.CloseXrcd(y), 0);
}

TEST(Xrc, OpenQpCountsReferences) {
  Fabric f;
  Device& d = *f.AddNode().device;
  XrcDomain *x = nullptr, *other = nullptr;
  ASSERT_EQ(d.OpenXrcd(std::nullopt, true, false, &x), 0);
  ASSERT_EQ(d.OpenXrcd(std::nullopt, true, false, &other), 0);
  QpInitAttributes tgt;
  tgt.type = QpType::kXrcRecv;
  QueuePair* q = nullptr;
  EXPECT_EQ(d.CreateQp(tgt, &q), EINVAL);  // a target needs its domain
  tgt.xrcd = x;
  ASSERT_EQ(d.CreateQp(tgt, &q), 0);
  const uint32_t qpn = q->qpn();
  QueuePair *o1 = nullptr, *o2 = nullptr;
  EXPECT_EQ(d.OpenQp(x, qpn + 1, QpType::kXrcRecv, &o1), EINVAL);  // no such QP
  EXPECT_EQ(d.OpenQp(x, qpn, QpType::kRc, &o1), EINVAL);           // wrong type
  EXPECT_EQ(d.OpenQp(other, qpn, QpType::kXrcRecv, &o1), EINVAL);  // not within that xrcd
  ASSERT_EQ(d.OpenQp(x, qpn, QpType::kXrcRecv, &o1), 0);
  ASSERT_EQ(d.OpenQp(x, qpn, QpType::kXrcRecv, &o2), 0);
  EXPECT_EQ(o1, q);
  EXPECT_EQ(q->references, 3);
  // The creator's destroy and the first opener's close leave the QP; the last reference destroys it.
  ASSERT_EQ(d.DestroyQp(q), 0);
  ASSERT_EQ(d.DestroyQp(o1), 0);
  QueuePair* again = nullptr;
  ASSERT_EQ(d.OpenQp(x, qpn, QpType::kXrcRecv, &again), 0);
  ASSERT_EQ(d.DestroyQp(again), 0);
  EXPECT_EQ(d.CloseXrcd(x), EBUSY);  // o2 still holds the target
  ASSERT_EQ(d.DestroyQp(o2), 0);
  EXPECT_EQ(d.OpenQp(x, qpn, QpType::kXrcRecv, &again), EINVAL);  // gone with the last reference
  EXPECT_EQ(d.CloseXrcd(x), 0);
  EXPECT_EQ(d.CloseXrcd(other), 0);
}

// --- XRC between processes of one host (wire::SharedXrc) ------------------------------------------------------

// The host's processes as their shared XRC SRQs see them: each has a DirectTable its device publishes into and a ring
// of deliveries, handed to its device as its polling thread would (DeliverRing).
struct HostProcesses {
  struct Process final : wire::SharedXrc {
    HostProcesses* host = nullptr;
    std::unique_ptr<wire::DirectTable> table;
    std::vector<std::vector<uint8_t>> ring;
    bool ring_full = false;  // as a ring with no room: deliveries into it fail

    Process* OwnerOf(uint32_t srqn) const { return host->ByOwner(wire::OwnerOf24(srqn)); }
    bool PublishXrcSrq(uint32_t srqn, uint64_t domain) override { return table->PublishSrq(srqn, domain); }
    uint64_t XrcWqesClaimed(uint32_t srqn) override { return table->SrqClaimed(srqn); }
    void ShowXrcWqes(uint32_t srqn, uint64_t first, std::span<const uint32_t> lengths) override {
      table->ShowSrqWqes(srqn, first, lengths);
    }
    void WithdrawXrcSrq(uint32_t srqn) override { table->WithdrawSrq(srqn); }
    int XrcSrqInDomain(uint32_t srqn, uint64_t domain) override {
      Process* p = OwnerOf(srqn);
      return p != nullptr && p->table->SrqInDomain(srqn, domain);
    }
    bool ClaimXrcWqe(uint32_t srqn, uint64_t* index, uint32_t* length) override {
      Process* p = OwnerOf(srqn);
      return p != nullptr && p->table->ClaimSrqWqe(srqn, index, length);
    }
    bool DeliverXrc(const wire::XrcDelivery& d, std::span<const uint8_t> bytes) override {
      Process* p = OwnerOf(d.srqn);
      if (p == nullptr || p == this || p->ring_full) return false;
      std::vector<uint8_t> record(wire::XrcDelivery::kSize);
      d.Encode(record.data());
      record.insert(record.end(), bytes.begin(), bytes.end());
      p->ring.push_back(std::move(record));
      return true;
    }
    uint8_t Me() const { return uint8_t(this - host->procs + 1); }
    bool PublishXrcTarget(uint32_t qpn, uint64_t domain, std::span<const uint8_t> attributes,
                          const uint64_t* holders) override {
      return table->PublishTarget(qpn, domain, attributes, holders);
    }
    bool ReleaseXrcTarget(uint32_t qpn) override { return table->ReleaseTarget(qpn); }
    void WithdrawXrcTarget(uint32_t qpn) override { table->WithdrawTarget(qpn); }
    bool ReadGoneXrcTarget(uint32_t qpn, std::span<uint8_t> attributes, uint64_t holders[4]) override {
      Process* p = host->ByOwner(wire::OwnerOf24(qpn));
      return p != nullptr && p->table->TargetHolders(qpn, holders) && p->table->ReadTarget(qpn, attributes);
    }
    // As the service answers (the fabric's packets still go by address: a test hands the adopter its packets).
    int AdoptOwner(uint8_t) override { return adopt_result; }
    int adopt_result = 0;
    int OpenXrcTarget(uint32_t qpn, uint64_t domain) override {
      Process* p = host->ByOwner(wire::OwnerOf24(qpn));
      return p != nullptr && p != this && p->table->OpenTarget(qpn, domain, Me(), pid) ? 0 : -EINVAL;
    }
    bool ReadXrcTarget(uint32_t qpn, std::span<uint8_t> attributes) override {
      Process* p = host->ByOwner(wire::OwnerOf24(qpn));
      return p != nullptr && p->table->ReadTarget(qpn, attributes);
    }
    void CloseXrcTarget(uint32_t qpn) override {
      if (Process* p = host->ByOwner(wire::OwnerOf24(qpn))) p->table->CloseTarget(qpn, Me());
    }
    void TellXrcTargetHolders(uint32_t qpn, uint8_t event) override {
      uint64_t holders[4];
      if (!table->TargetHolders(qpn, holders)) return;
      for (uint8_t n = 1; n <= 3; ++n) {
        if (n == Me() || !wire::HasHolder(holders, n)) continue;
        std::vector<uint8_t> record(wire::XrcTargetEvent::kSize);
        wire::XrcTargetEvent{qpn, event}.Encode(record.data());
        host->ByOwner(n)->event_ring.push_back(std::move(record));
      }
    }
    std::vector<std::vector<uint8_t>> event_ring;  // the events of target QPs it holds, as its ring carries them
    // A request goes into the running process's ring, which is read at once (its polling thread), and its answer
    // comes back into ours.
    int ModifyXrcTarget(uint32_t qpn, std::span<const uint8_t> attributes, uint32_t mask) override {
      Process* p = host->ByOwner(wire::OwnerOf24(qpn));
      if (p == nullptr || p->device == nullptr) return EINVAL;
      wire::XrcTargetModify m;
      m.request = ++requests;
      m.qpn = qpn;
      m.mask = mask;
      m.from = Me();
      std::vector<std::vector<uint8_t>> ring(1, std::vector<uint8_t>(wire::XrcTargetModify::kSize));
      m.Encode(ring[0].data());
      ring[0].insert(ring[0].end(), attributes.begin(), attributes.end());
      testing::DeliverRing(*p->device, wire::RingRecord::kXrcTargetModify, ring);
      auto it = answers.find(m.request);
      return it == answers.end() ? EAGAIN : it->second;
    }
    void AnswerXrcTargetModify(uint8_t owner, uint32_t request, int result) override {
      if (Process* p = host->ByOwner(owner)) p->answers[request] = result;
    }
    bool HoldsXrcTarget(uint32_t qpn, uint8_t owner) override {
      uint64_t holders[4];
      return table->TargetHolders(qpn, holders) && wire::HasHolder(holders, owner);
    }
    Device* device = nullptr;  // its device, for the requests it receives
    uint32_t requests = 0;
    std::map<uint32_t, int> answers;
    pid_t pid = getpid();  // what it writes beside its holder bits (a test makes it a process that is gone)
    void DeliverRing(Device& device) {
      testing::DeliverRing(device, wire::RingRecord::kXrcDelivery, ring);
      testing::DeliverRing(device, wire::RingRecord::kXrcTargetEvent, event_ring);
    }
  };

  Process procs[3];
  Process* ByOwner(uint8_t owner) { return owner >= 1 && owner <= 3 ? &procs[owner - 1] : nullptr; }
  HostProcesses() {
    for (Process& p : procs) {
      p.host = this;
      int fd = -1;
      EXPECT_EQ(wire::DirectTable::Create(&p.table, &fd), 0);
      close(fd);
    }
  }
};

constexpr uint64_t kDomainFile = 0x5eed;  // the identity of the file both processes opened their domain by

// An initiator on another host (node 0), and two processes of one host (owners 1 and 2) that share an XRC domain:
// process 1 has the target QP, process 2 an XRC SRQ of 8 WQEs in the domain.
struct SharedXrcBench {
  HostProcesses host;
  Fabric f;
  Node* i = nullptr;
  Node* a = nullptr;  // the target QP's process
  Node* b = nullptr;  // the SRQ's
  XrcDomain *xa = nullptr, *xb = nullptr;
  ProtectionDomain* bpd = nullptr;
  CompletionQueue* bcq = nullptr;
  SharedReceiveQueue* srq = nullptr;
  XrcLink link;
  Buffer src, dst;

  explicit SharedXrcBench(uint64_t b_domain_file = kDomainFile) {
    f.configure_node = [this](size_t index, DeviceConfig& c) {
      if (index == 0) return;
      c.owner = uint8_t(index);
      c.shared_xrc = &host.procs[index - 1];
    };
    i = &f.AddNode(Mtu::k1024);
    a = &f.AddNode(Mtu::k1024);
    b = &f.AddNode(Mtu::k1024);
    host.procs[0].device = a->device.get();
    host.procs[1].device = b->device.get();
    EXPECT_EQ(a->device->OpenXrcd(kDomainFile, true, false, &xa), 0);
    EXPECT_EQ(b->device->OpenXrcd(b_domain_file, true, false, &xb), 0);
    bpd = b->device->AllocPd();
    EXPECT_EQ(b->device->CreateCq(16, &bcq), 0);
    SrqAttributes sa{8, 2, 0};
    EXPECT_EQ(b->device->CreateSrq(SrqType::kXrc, bpd, xb, bcq, sa, &srq), 0);
    EXPECT_EQ(wire::OwnerOf24(srq->srqn()), 2);
    EXPECT_TRUE(srq->shared);
    LinkXrc(*a->device, xa, *i->device, &link);
    src = Register(*i->device, link.ipd, 8192, kAll);
    for (size_t k = 0; k < src.bytes.size(); ++k) src.bytes[k] = uint8_t(k * 7 + 1);
    dst = Register(*b->device, bpd, 8192, kAll);
  }
  // A packet of an XRC SEND through target QP `target_qpn` into b's SRQ, crafted as the initiator's and sent straight
  // to b (which the service routes a gone target process's number to): `position` 0x01 MIDDLE, or 0x02 LAST, which
  // asks for the ACK.
  void InjectSendPiece(uint32_t target_qpn, uint8_t position, uint32_t psn, std::span<const uint8_t> payload) {
    wire::PacketSpec spec;
    spec.bth.dest_qp = target_qpn;
    spec.xrc = wire::XrcEth{.srqn = srq->srqn()};
    spec.bth.opcode = wire::opcode::kXrcBase | position;
    spec.bth.psn = psn & 0xffffff;
    spec.bth.ack_req = position == 0x02;
    f.Inject(*i, *b, spec, payload);
  }
  std::vector<Completion> Run() {
    f.Pump();
    host.procs[1].DeliverRing(*b->device);
    f.Pump();
    return Drain(link.icq);
  }
};

TEST(XrcAcrossProcesses, ATargetQpDeliversIntoAnotherProcesssSrqOfItsDomain) {
  SharedXrcBench x;
  ASSERT_EQ(x.b->device->PostSrqRecv(x.srq, Recv(1, x.dst, 0, 4096)), 0);
  ASSERT_EQ(x.b->device->PostSrqRecv(x.srq, Recv(2, x.dst, 4096, 64)), 0);
  ASSERT_EQ(x.i->device->PostSend(x.link.iq, Send(10, x.src, 0, 3000, x.srq->srqn())), 0);  // 3 packets
  SendWr imm = Send(11, x.src, 100, 20, x.srq->srqn());
  imm.opcode = SendOpcode::kSendWithImm;
  imm.imm_data = 0xfeedbeef;
  imm.flags |= send_flags::kSolicited;
  ASSERT_EQ(x.i->device->PostSend(x.link.iq, std::move(imm)), 0);
  x.f.Pump();
  // Acknowledged once handed over; the SRQ's process completes them when it reads its ring.
  auto sent = Drain(x.link.icq);
  ASSERT_EQ(sent.size(), 2u);
  for (const Completion& c : sent) EXPECT_EQ(c.status, WcStatus::kSuccess);
  EXPECT_TRUE(Drain(x.bcq).empty());
  EXPECT_EQ(x.a->device->counters().xrc_pieces_handed, 4u);
  x.host.procs[1].DeliverRing(*x.b->device);
  auto got = Drain(x.bcq);
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].wr_id, 1u);
  EXPECT_EQ(got[0].status, WcStatus::kSuccess);
  EXPECT_EQ(got[0].opcode, WcOpcode::kRecv);
  EXPECT_EQ(got[0].byte_len, 3000u);
  EXPECT_EQ(got[0].qp_num, x.link.tq->qpn());  // the target QP's number, as for the target's own SRQ
  EXPECT_EQ(std::memcmp(x.dst.bytes.data(), x.src.bytes.data(), 3000), 0);
  EXPECT_EQ(got[1].wr_id, 2u);
  EXPECT_EQ(got[1].byte_len, 20u);
  EXPECT_EQ(got[1].imm_data, 0xfeedbeefu);
  EXPECT_TRUE(got[1].wc_flags & wc_flags::kWithImm);
  EXPECT_TRUE(got[1].solicited);
  EXPECT_EQ(std::memcmp(x.dst.bytes.data() + 4096, x.src.bytes.data() + 100, 20), 0);
  EXPECT_EQ(x.b->device->counters().xrc_pieces_received, 4u);
  EXPECT_EQ(x.b->device->counters().xrc_pieces_dropped, 0u);
  EXPECT_EQ(x.srq->depth(), 0u);
}

// No WQE left unclaimed in the other process's SRQ is the responder's RNR NAK, as for its own empty SRQ; so is a ring
// without room. The sender retries and delivers once both are there.
TEST(XrcAcrossProcesses, AnEmptySrqOrAFullRingOfTheOtherProcessIsReceiverNotReady) {
  SharedXrcBench x;
  ASSERT_EQ(x.i->device->PostSend(x.link.iq, Send(10, x.src, 0, 100, x.srq->srqn())), 0);
  x.f.PumpUntil(x.f.clock().NowNs() + 5'000'000);
  EXPECT_GE(x.a->device->counters().rc_rnr_naks_sent, 1u);
  EXPECT_TRUE(Drain(x.link.icq).empty());
  x.host.procs[1].ring_full = true;
  ASSERT_EQ(x.b->device->PostSrqRecv(x.srq, Recv(1, x.dst, 0, 256)), 0);
  const uint64_t rnr_before = x.a->device->counters().rc_rnr_naks_sent;
  x.f.PumpUntil(x.f.clock().NowNs() + 5'000'000);
  EXPECT_GT(x.a->device->counters().rc_rnr_naks_sent, rnr_before);
  EXPECT_TRUE(Drain(x.link.icq).empty());
  x.host.procs[1].ring_full = false;  // the claim of each refused attempt was given back: the WQE is still there
  auto sent = x.Run();
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(sent[0].status, WcStatus::kSuccess);
  auto got = Drain(x.bcq);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].status, WcStatus::kSuccess);
  EXPECT_EQ(got[0].byte_len, 100u);
}

// Every taker claims: a WQE the other process's target QP claimed is not its own target QP's to take, which then
// finds the SRQ empty (RNR NAK) though the WQE is still queued.
TEST(XrcAcrossProcesses, AClaimedWqeIsNotTakenTwice) {
  SharedXrcBench x;
  XrcLink own;  // a target QP of the SRQ's own process, with its own initiator
  ASSERT_NO_FATAL_FAILURE(LinkXrc(*x.b->device, x.xb, *x.i->device, &own));
  Buffer own_src = Register(*x.i->device, own.ipd, 256, kAll);
  ASSERT_EQ(x.b->device->PostSrqRecv(x.srq, Recv(1, x.dst, 0, 256)), 0);
  ASSERT_EQ(x.i->device->PostSend(x.link.iq, Send(10, x.src, 0, 50, x.srq->srqn())), 0);
  x.f.Pump();  // claimed by process 1's target; the piece waits in process 2's ring
  EXPECT_EQ(x.srq->depth(), 1u);
  ASSERT_EQ(x.i->device->PostSend(own.iq, Send(20, own_src, 0, 60, x.srq->srqn())), 0);
  x.f.PumpUntil(x.f.clock().NowNs() + 2'000'000);
  EXPECT_GE(x.b->device->counters().rc_rnr_naks_sent, 1u);
  EXPECT_TRUE(Drain(own.icq).empty());
  x.host.procs[1].DeliverRing(*x.b->device);
  auto got = Drain(x.bcq);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].byte_len, 50u);
  EXPECT_EQ(got[0].qp_num, x.link.tq->qpn());
  ASSERT_EQ(x.b->device->PostSrqRecv(x.srq, Recv(2, x.dst, 256, 256)), 0);
  x.f.PumpUntil(x.f.clock().NowNs() + 5'000'000);
  auto own_sent = Drain(own.icq);
  ASSERT_EQ(own_sent.size(), 1u);
  EXPECT_EQ(own_sent[0].status, WcStatus::kSuccess);
  got = Drain(x.bcq);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].byte_len, 60u);
  EXPECT_EQ(got[0].qp_num, own.tq->qpn());
}

// Two receives posted to the other process's SRQ (wr_id 1: 4 KiB, 2: 256 B), and the first packet of a 3-packet XRC
// SEND into it, handed over and taken there (the first receive); the rest never comes.
void HandFirstPacketOnly(SharedXrcBench& x) {
  ASSERT_EQ(x.b->device->PostSrqRecv(x.srq, Recv(1, x.dst, 0, 4096)), 0);
  ASSERT_EQ(x.b->device->PostSrqRecv(x.srq, Recv(2, x.dst, 4096, 256)), 0);
  wire::PacketSpec first;
  first.bth.opcode = wire::opcode::kXrcBase | 0x00;  // XRC SEND FIRST (Annex A14)
  first.bth.dest_qp = x.link.tq->qpn();
  first.bth.psn = x.link.tq->attributes().rq_psn;
  first.xrc = wire::XrcEth{.srqn = x.srq->srqn()};
  const std::vector<uint8_t> payload(1024, 0x5a);
  x.f.Inject(*x.i, *x.a, first, payload);
  x.f.Pump();
  x.host.procs[1].DeliverRing(*x.b->device);
}

// The target's process dies with a message half handed over: the WQE it took completes flushed in the SRQ's
// process, as when the target QP enters the error state, instead of waiting for pieces that will never come.
TEST(XrcAcrossProcesses, TheDeathOfTheTargetsProcessEndsItsMessage) {
  SharedXrcBench x;
  ASSERT_NO_FATAL_FAILURE(HandFirstPacketOnly(x));
  EXPECT_TRUE(Drain(x.bcq).empty());
  x.b->device->OnPeerProcessGone(x.a->device->config().address, 2);  // another process: nothing of its
  EXPECT_TRUE(Drain(x.bcq).empty());
  x.b->device->OnPeerProcessGone(x.a->device->config().address, 1);
  auto got = Drain(x.bcq);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].wr_id, 1u);
  EXPECT_EQ(got[0].status, WcStatus::kWrFlushErr);
  EXPECT_EQ(got[0].qp_num, x.link.tq->qpn());
  EXPECT_EQ(x.srq->depth(), 1u);
}

// A lost device flushes the WQE of a message another process was handing over, with its queued ones.
TEST(XrcAcrossProcesses, ALostDeviceFlushesTheWqeOfAMessageBeingHandedOver) {
  SharedXrcBench x;
  ASSERT_NO_FATAL_FAILURE(HandFirstPacketOnly(x));
  x.b->device->Fail();
  auto got = Drain(x.bcq);
  ASSERT_EQ(got.size(), 2u);
  std::set<uint64_t> ids;
  for (const Completion& c : got) {
    EXPECT_EQ(c.status, WcStatus::kWrFlushErr);
    ids.insert(c.wr_id);
  }
  EXPECT_EQ(ids, (std::set<uint64_t>{1, 2}));
}

// A SEND longer than the WQE it takes in the other process is the sender's invalid request, and that WQE completes
// with LOC_LEN_ERR there, as from the SRQ's own target (IBTA 9.7.5.2.x); the next WQE stays for the next message.
TEST(XrcAcrossProcesses, ASendLongerThanTheOtherProcesssWqeIsAnInvalidRequest) {
  SharedXrcBench x;
  ASSERT_EQ(x.b->device->PostSrqRecv(x.srq, Recv(1, x.dst, 0, 1500)), 0);
  ASSERT_EQ(x.b->device->PostSrqRecv(x.srq, Recv(2, x.dst, 2048, 4096)), 0);
  ASSERT_EQ(x.i->device->PostSend(x.link.iq, Send(10, x.src, 0, 3000, x.srq->srqn())), 0);  // its 2nd packet overflows
  auto sent = x.Run();
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(sent[0].status, WcStatus::kRemInvReqErr);
  EXPECT_EQ(x.link.tq->state(), QpState::kErr);
  auto got = Drain(x.bcq);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].wr_id, 1u);
  EXPECT_EQ(got[0].status, WcStatus::kLocLenErr);
  EXPECT_EQ(got[0].qp_num, x.link.tq->qpn());
  EXPECT_EQ(x.srq->depth(), 1u);
}

// More messages in flight than the window shows: each takes a WQE of its own, in order, as the window moves on when
// the SRQ's process takes the claimed ones.
TEST(XrcAcrossProcesses, MoreMessagesThanTheWindowShowsEachTakeAWqeOfTheirOwn) {
  SharedXrcBench x;
  constexpr int kMany = int(wire::kSrqWindow) + 20;
  SrqAttributes sa{kMany, 1, 0};
  SharedReceiveQueue* big = nullptr;
  CompletionQueue* cq = nullptr;
  ASSERT_EQ(x.b->device->CreateCq(256, &cq), 0);
  ASSERT_EQ(x.b->device->CreateSrq(SrqType::kXrc, x.bpd, x.xb, cq, sa, &big), 0);
  Buffer dst = Register(*x.b->device, x.bpd, kMany * 64, kAll);
  for (int k = 0; k < kMany; ++k) ASSERT_EQ(x.b->device->PostSrqRecv(big, Recv(k, dst, k * 64, 64)), 0);
  // Four at a time (the initiator's send queue); the SRQ's process reads its ring only when the sender is stuck, so
  // the target claims until the window is used up, and RNR NAKs until that process takes what was claimed.
  std::vector<Completion> sent;
  for (int k = 0; k < kMany; k += 4) {
    for (int j = k; j < std::min(k + 4, kMany); ++j)
      ASSERT_EQ(x.i->device->PostSend(x.link.iq, Send(100 + j, x.src, j, 64 - j % 3, big->srqn())), 0);
    const size_t want = size_t(std::min(k + 4, kMany));
    for (int round = 0; round < 50 && sent.size() < want; ++round) {
      x.f.PumpUntil(x.f.clock().NowNs() + 2'000'000);
      for (const Completion& c : Drain(x.link.icq)) sent.push_back(c);
      if (sent.size() < want) x.host.procs[1].DeliverRing(*x.b->device);
    }
  }
  x.host.procs[1].DeliverRing(*x.b->device);
  ASSERT_EQ(sent.size(), size_t{kMany});
  for (const Completion& c : sent) EXPECT_EQ(c.status, WcStatus::kSuccess);
  auto got = Drain(cq);
  ASSERT_EQ(got.size(), size_t{kMany});
  for (int k = 0; k < kMany; ++k) {
    EXPECT_EQ(got[k].wr_id, uint64_t(k));
    EXPECT_EQ(got[k].status, WcStatus::kSuccess);
    EXPECT_EQ(got[k].byte_len, uint32_t(64 - k % 3));
    EXPECT_EQ(std::memcmp(dst.bytes.data() + k * 64, x.src.bytes.data() + k, 64 - k % 3), 0) << k;
  }
  EXPECT_GE(x.a->device->counters().rc_rnr_naks_sent, 1u);  // the window was used up at times
  EXPECT_EQ(big->depth(), 0u);
}

// Annex A14: an SRQ outside the target's domain is an invalid request, whichever process it belongs to.
TEST(XrcAcrossProcesses, AnotherProcesssSrqOfAnotherDomainIsAnInvalidRequest) {
  SharedXrcBench x(/*b_domain_file=*/kDomainFile + 1);
  ASSERT_EQ(x.b->device->PostSrqRecv(x.srq, Recv(1, x.dst, 0, 256)), 0);
  ASSERT_EQ(x.i->device->PostSend(x.link.iq, Send(10, x.src, 0, 10, x.srq->srqn())), 0);
  auto sent = x.Run();
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(sent[0].status, WcStatus::kRemInvReqErr);
  EXPECT_EQ(x.link.tq->state(), QpState::kErr);
  EXPECT_TRUE(Drain(x.bcq).empty());
}

// What a WRITE through another process's SRQ would reach is that process's memory, under its SRQ's PD: refused.
TEST(XrcAcrossProcesses, AWriteThroughAnotherProcesssSrqIsARemoteAccessError) {
  SharedXrcBench x;
  SendWr w = Send(10, x.src, 0, 10, x.srq->srqn());
  w.opcode = SendOpcode::kRdmaWrite;
  w.remote_addr = x.dst.mr.iova;
  w.rkey = x.dst.mr.rkey;
  ASSERT_EQ(x.i->device->PostSend(x.link.iq, std::move(w)), 0);
  auto sent = x.Run();
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(sent[0].status, WcStatus::kRemAccessErr);
  EXPECT_EQ(x.link.tq->state(), QpState::kErr);
}

// A message the target QP abandons (its QP entered the error state after the first packet) completes flushed in the
// other process, and a piece of it that still came is dropped there.
TEST(XrcAcrossProcesses, AMessageTheTargetAbandonsCompletesFlushedInTheOtherProcess) {
  SharedXrcBench x;
  ASSERT_NO_FATAL_FAILURE(HandFirstPacketOnly(x));
  QpAttributes err;
  err.qp_state = QpState::kErr;
  ASSERT_EQ(x.a->device->ModifyQp(x.link.tq, err, attr::kState), 0);
  x.host.procs[1].DeliverRing(*x.b->device);
  auto got = Drain(x.bcq);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].wr_id, 1u);
  EXPECT_EQ(got[0].status, WcStatus::kWrFlushErr);
  EXPECT_EQ(got[0].qp_num, x.link.tq->qpn());
  EXPECT_EQ(x.srq->depth(), 1u);  // the other WQE stays for the next message
}

// --- XRC target QPs opened by another process of the host (ibv_open_qp(3)) -----------------------------------------

// Another process of the domain opens the target QP (process 1's, owner 1) by its number: its handle reports what
// the target's process publishes, at every change; modifying through it is not offered; a number with no such QP, a
// QP of another domain or another type is EINVAL, and the domain stays busy while the handle is open.
TEST(XrcTargetAcrossProcesses, AnotherProcessOfTheDomainOpensTheTargetQp) {
  SharedXrcBench x;
  const uint32_t qpn = x.link.tq->qpn();
  QueuePair* h = nullptr;
  ASSERT_EQ(x.b->device->OpenQp(x.xb, qpn, QpType::kXrcRecv, &h), 0);
  EXPECT_EQ(h->qpn(), qpn);
  QpAttributes got;
  ASSERT_EQ(x.b->device->QueryQp(h, &got), 0);
  EXPECT_EQ(got.qp_state, QpState::kRts);
  EXPECT_EQ(got.dest_qp_num, x.link.iq->qpn());
  EXPECT_EQ(got.rq_psn, 100u);
  EXPECT_EQ(got.path_mtu, Mtu::k1024);
  EXPECT_EQ(got.max_dest_rd_atomic, 1);
  // Modified through the other process's handle (ibv_open_qp(3): any handle may), as through the creator's: the
  // creator's QP changes, and what the handle reports follows.
  QpAttributes rnr;
  rnr.min_rnr_timer = 21;
  ASSERT_EQ(x.b->device->ModifyQp(h, rnr, attr::kMinRnrTimer), 0);
  EXPECT_EQ(x.link.tq->attributes().min_rnr_timer, 21);
  ASSERT_EQ(x.b->device->QueryQp(h, &got), 0);
  EXPECT_EQ(got.min_rnr_timer, 21);
  QpAttributes bad;  // what the creator's ibv_modify_qp refuses is refused the same: RTS -> RTR
  bad.qp_state = QpState::kRtr;
  EXPECT_EQ(x.b->device->ModifyQp(h, bad, attr::kState), EINVAL);
  QpAttributes err;
  err.qp_state = QpState::kErr;
  ASSERT_EQ(x.b->device->ModifyQp(h, err, attr::kState), 0);
  EXPECT_EQ(x.link.tq->state(), QpState::kErr);
  ASSERT_EQ(x.b->device->QueryQp(h, &got), 0);
  EXPECT_EQ(got.qp_state, QpState::kErr);
  // A process that holds no handle on it cannot (the third process forges a request in the creator's ring).
  {
    wire::XrcTargetModify forged;
    forged.request = 99;
    forged.qpn = qpn;
    forged.mask = attr::kState;
    forged.from = 3;
    QpAttributes reset;
    reset.qp_state = QpState::kReset;
    std::vector<std::vector<uint8_t>> ring(1, std::vector<uint8_t>(wire::XrcTargetModify::kSize));
    forged.Encode(ring[0].data());
    const auto* raw = reinterpret_cast<const uint8_t*>(&reset);
    ring[0].insert(ring[0].end(), raw, raw + sizeof reset);
    testing::DeliverRing(*x.a->device, wire::RingRecord::kXrcTargetModify, ring);
    EXPECT_EQ(x.host.procs[2].answers[99], EINVAL);
    EXPECT_EQ(x.link.tq->state(), QpState::kErr);
  }

  QueuePair* again = nullptr;
  ASSERT_EQ(x.b->device->OpenQp(x.xb, qpn, QpType::kXrcRecv, &again), 0);
  EXPECT_EQ(again, h);  // one handle object, two references
  EXPECT_EQ(x.b->device->OpenQp(x.xb, wire::WithOwner24(1, 0x7777), QpType::kXrcRecv, &again), EINVAL);
  EXPECT_EQ(x.b->device->OpenQp(x.xb, wire::WithOwner24(3, 0x20), QpType::kXrcRecv, &again), EINVAL);
  EXPECT_EQ(x.b->device->OpenQp(x.xb, qpn, QpType::kRc, &again), EINVAL);
  XrcDomain* other = nullptr;
  ASSERT_EQ(x.b->device->OpenXrcd(kDomainFile + 1, true, false, &other), 0);
  EXPECT_EQ(x.b->device->OpenQp(other, qpn, QpType::kXrcRecv, &again), EINVAL);
  EXPECT_EQ(x.b->device->CloseXrcd(other), 0);
  ASSERT_EQ(x.b->device->DestroyQp(h), 0);
  EXPECT_EQ(x.b->device->DestroySrq(x.srq), 0);
  EXPECT_EQ(x.b->device->CloseXrcd(x.xb), EBUSY);  // the second handle is open
  ASSERT_EQ(x.b->device->DestroyQp(h), 0);
  EXPECT_EQ(x.b->device->CloseXrcd(x.xb), 0);
}

// ibv_open_qp(3): the QP is destroyed with its last handle, whichever process holds it. The target's process
// destroys its handle and closes its domain; the QP goes on receiving (into the other process's SRQ) while that
// process holds a handle; once it lets go the QP is gone: nobody opens it any more, and the initiator's next message
// finds no QP (retries exceeded, as towards any QP that went away).
TEST(XrcTargetAcrossProcesses, TheTargetQpLivesWhileAnotherProcessHoldsIt) {
  SharedXrcBench x;
  const uint32_t qpn = x.link.tq->qpn();
  QueuePair* h = nullptr;
  ASSERT_EQ(x.b->device->OpenQp(x.xb, qpn, QpType::kXrcRecv, &h), 0);
  ASSERT_EQ(x.a->device->DestroyQp(x.link.tq), 0);
  ASSERT_EQ(x.a->device->CloseXrcd(x.xa), 0);
  x.f.PumpUntil(x.f.clock().NowNs() + 50'000'000);  // its timers ask whether it is still held: it is

  ASSERT_EQ(x.b->device->PostSrqRecv(x.srq, Recv(1, x.dst, 0, 256)), 0);
  ASSERT_EQ(x.i->device->PostSend(x.link.iq, Send(10, x.src, 0, 100, x.srq->srqn())), 0);
  // Pumped for a while rather than until quiet: the timers of a device with such a QP never are.
  x.f.PumpUntil(x.f.clock().NowNs() + 50'000'000);
  x.host.procs[1].DeliverRing(*x.b->device);
  auto sent = Drain(x.link.icq);
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(sent[0].status, WcStatus::kSuccess);
  auto got = Drain(x.bcq);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].status, WcStatus::kSuccess);
  EXPECT_EQ(got[0].qp_num, qpn);
  EXPECT_EQ(std::memcmp(x.dst.bytes.data(), x.src.bytes.data(), 100), 0);

  ASSERT_EQ(x.b->device->DestroyQp(h), 0);
  x.f.PumpUntil(x.f.clock().NowNs() + 50'000'000);
  QueuePair* again = nullptr;
  EXPECT_EQ(x.b->device->OpenQp(x.xb, qpn, QpType::kXrcRecv, &again), EINVAL);
  ASSERT_EQ(x.b->device->PostSrqRecv(x.srq, Recv(2, x.dst, 0, 256)), 0);
  ASSERT_EQ(x.i->device->PostSend(x.link.iq, Send(11, x.src, 0, 100, x.srq->srqn())), 0);
  x.f.PumpUntil(x.f.clock().NowNs() + 30'000'000'000);
  sent = Drain(x.link.icq);
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(sent[0].status, WcStatus::kRetryExcErr);
  EXPECT_TRUE(Drain(x.bcq).empty());
}

// ibv_open_qp(3): the events of a shared QP reach every handle on it. The creator moves its target QP to the error
// state: IBV_EVENT_QP_LAST_WQE_REACHED (IBTA 11.6.3.1, a QP on an SRQ) is raised on its handle and on the other
// process's; an event record that names a QP nobody here holds, or an event that is not a QP's, raises nothing.
TEST(XrcTargetAcrossProcesses, EveryHandleGetsTheTargetQpsEvents) {
  SharedXrcBench x;
  const uint32_t qpn = x.link.tq->qpn();
  QueuePair* h = nullptr;
  ASSERT_EQ(x.b->device->OpenQp(x.xb, qpn, QpType::kXrcRecv, &h), 0);
  x.a->events.clear();
  x.b->events.clear();
  QpAttributes err;
  err.qp_state = QpState::kErr;
  ASSERT_EQ(x.a->device->ModifyQp(x.link.tq, err, attr::kState), 0);
  auto is_last_wqe = [](QueuePair* qp) {
    return [qp](const AsyncEvent& e) { return e.type == AsyncEventType::kQpLastWqeReached && e.qp == qp; };
  };
  EXPECT_EQ(std::count_if(x.a->events.begin(), x.a->events.end(), is_last_wqe(x.link.tq)), 1);
  EXPECT_TRUE(x.b->events.empty());  // not before its polling thread reads its ring
  x.host.procs[1].DeliverRing(*x.b->device);
  ASSERT_EQ(x.b->events.size(), 1u);
  EXPECT_TRUE(is_last_wqe(h)(x.b->events[0]));
  // A record for a QP it does not hold, and a device event, are dropped.
  std::vector<std::vector<uint8_t>> ring(2, std::vector<uint8_t>(wire::XrcTargetEvent::kSize));
  wire::XrcTargetEvent{wire::WithOwner24(1, 0x7777), uint8_t(AsyncEventType::kQpFatal)}.Encode(ring[0].data());
  wire::XrcTargetEvent{qpn, uint8_t(AsyncEventType::kDeviceFatal)}.Encode(ring[1].data());
  testing::DeliverRing(*x.b->device, wire::RingRecord::kXrcTargetEvent, ring);
  EXPECT_EQ(x.b->events.size(), 1u);
  // Once it let go of its handle, nothing more reaches it.
  ASSERT_EQ(x.b->device->DestroyQp(h), 0);
  x.b->events.clear();
  QpAttributes reset;
  reset.qp_state = QpState::kReset;
  ASSERT_EQ(x.a->device->ModifyQp(x.link.tq, reset, attr::kState), 0);
  Connect(*x.a->device, x.link.tq, *x.i->device, x.link.iq->qpn());
  x.a->events.clear();
  ASSERT_EQ(x.a->device->ModifyQp(x.link.tq, err, attr::kState), 0);
  EXPECT_EQ(std::count_if(x.a->events.begin(), x.a->events.end(), is_last_wqe(x.link.tq)), 1);
  x.host.procs[1].DeliverRing(*x.b->device);
  EXPECT_TRUE(x.b->events.empty());
}

// The creator opening its QP again after destroying its handle holds it again: the QP stays when the other process
// lets go.
TEST(XrcTargetAcrossProcesses, TheCreatorOpeningItAgainHoldsItAgain) {
  SharedXrcBench x;
  const uint32_t qpn = x.link.tq->qpn();
  QueuePair *h = nullptr, *mine = nullptr;
  ASSERT_EQ(x.b->device->OpenQp(x.xb, qpn, QpType::kXrcRecv, &h), 0);
  ASSERT_EQ(x.a->device->DestroyQp(x.link.tq), 0);
  ASSERT_EQ(x.a->device->OpenQp(x.xa, qpn, QpType::kXrcRecv, &mine), 0);
  EXPECT_EQ(mine, x.link.tq);
  ASSERT_EQ(x.b->device->DestroyQp(h), 0);
  x.f.PumpUntil(x.f.clock().NowNs() + 50'000'000);
  ASSERT_EQ(x.b->device->OpenQp(x.xb, qpn, QpType::kXrcRecv, &h), 0);  // still there, and open to others
  ASSERT_EQ(x.b->device->PostSrqRecv(x.srq, Recv(1, x.dst, 0, 256)), 0);
  ASSERT_EQ(x.i->device->PostSend(x.link.iq, Send(10, x.src, 0, 100, x.srq->srqn())), 0);
  auto sent = x.Run();
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(sent[0].status, WcStatus::kSuccess);
  ASSERT_EQ(Drain(x.bcq).size(), 1u);
}

// A holder whose process is gone (its pid no longer exists) holds nothing: the QP goes once its own process lets go.
TEST(XrcTargetAcrossProcesses, AHolderWhoseProcessIsGoneHoldsNothing) {
  SharedXrcBench x;
  const pid_t gone = fork();
  ASSERT_GE(gone, 0);
  if (gone == 0) _exit(0);
  ASSERT_EQ(waitpid(gone, nullptr, 0), gone);
  x.host.procs[1].pid = gone;
  QueuePair* h = nullptr;
  ASSERT_EQ(x.b->device->OpenQp(x.xb, x.link.tq->qpn(), QpType::kXrcRecv, &h), 0);
  ASSERT_EQ(x.a->device->DestroyQp(x.link.tq), 0);
  x.f.PumpUntil(x.f.clock().NowNs() + 50'000'000);
  ASSERT_EQ(x.b->device->PostSrqRecv(x.srq, Recv(1, x.dst, 0, 256)), 0);
  ASSERT_EQ(x.i->device->PostSend(x.link.iq, Send(10, x.src, 0, 100, x.srq->srqn())), 0);
  x.f.PumpUntil(x.f.clock().NowNs() + 30'000'000'000);
  auto sent = Drain(x.link.icq);
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(sent[0].status, WcStatus::kRetryExcErr);
}

// The target's process gone and its number not to be taken over: the QP went with it. The holder gets the QP's
// catastrophic error event (IBTA 11.6.3.1), its handle reports the error state, and it cannot be opened again.
TEST(XrcTargetAcrossProcesses, TheTargetsProcessGoneIsTheHandlesFatalError) {
  SharedXrcBench x;
  const uint32_t qpn = x.link.tq->qpn();
  QueuePair* h = nullptr;
  ASSERT_EQ(x.b->device->OpenQp(x.xb, qpn, QpType::kXrcRecv, &h), 0);
  x.host.procs[1].adopt_result = -EINVAL;  // its number cannot be taken over
  x.b->device->OnPeerProcessGone(x.a->device->config().address, 1);
  ASSERT_EQ(x.b->events.size(), 1u);
  EXPECT_EQ(x.b->events[0].type, AsyncEventType::kQpFatal);
  EXPECT_EQ(x.b->events[0].qp, h);
  QpAttributes got;
  ASSERT_EQ(x.b->device->QueryQp(h, &got), 0);
  EXPECT_EQ(got.qp_state, QpState::kErr);
  QueuePair* again = nullptr;
  EXPECT_EQ(x.b->device->OpenQp(x.xb, qpn, QpType::kXrcRecv, &again), EINVAL);
  EXPECT_EQ(x.b->device->DestroyQp(h), 0);
}

// The target's process is gone (exited or killed) while another process holds the QP, in the middle of a SEND into
// that process's SRQ: the holder, once it sees the process gone, runs the QP from the state it last published: no
// fatal event, the handle is the QP's own, and the message's next packets (now arriving at the holder, as the
// service routes the gone process's number there) finish it in the WQE it had taken.
TEST(XrcTargetAcrossProcesses, AHolderRunsTheTargetOnAfterItsProcessIsGone) {
  SharedXrcBench x;
  const uint32_t qpn = x.link.tq->qpn();
  QueuePair* h = nullptr;
  ASSERT_EQ(x.b->device->OpenQp(x.xb, qpn, QpType::kXrcRecv, &h), 0);
  ASSERT_NO_FATAL_FAILURE(HandFirstPacketOnly(x));  // 1024 of a 3-packet SEND into b's SRQ, its WQE 1 taken there
  const uint32_t next_psn = x.link.tq->attributes().rq_psn;
  x.b->device->OnPeerProcessGone(x.a->device->config().address, 1);
  EXPECT_TRUE(x.b->events.empty());
  EXPECT_EQ(x.b->device->counters().xrc_targets_adopted, 1u);
  EXPECT_FALSE(h->runs_elsewhere);
  QpAttributes got;
  ASSERT_EQ(x.b->device->QueryQp(h, &got), 0);
  EXPECT_EQ(got.qp_state, QpState::kRts);
  EXPECT_EQ(got.rq_psn, next_psn);
  EXPECT_EQ(got.dest_qp_num, x.link.iq->qpn());

  const std::vector<uint8_t> middle(1024, 0x6b), last(500, 0x7c);
  x.InjectSendPiece(qpn, 0x01, next_psn, middle);  // XRC SEND MIDDLE
  x.InjectSendPiece(qpn, 0x02, next_psn + 1, last);  // XRC SEND LAST
  x.f.PumpUntil(x.f.clock().NowNs() + 5'000'000);
  auto done = Drain(x.bcq);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].wr_id, 1u);
  EXPECT_EQ(done[0].status, WcStatus::kSuccess);
  EXPECT_EQ(done[0].byte_len, 1024u + 1024 + 500);
  EXPECT_EQ(done[0].qp_num, qpn);
  EXPECT_EQ(x.dst.bytes[0], 0x5a);
  EXPECT_EQ(x.dst.bytes[1024], 0x6b);
  EXPECT_EQ(x.dst.bytes[2048 + 499], 0x7c);
  ASSERT_EQ(x.b->device->QueryQp(h, &got), 0);
  EXPECT_EQ(got.rq_psn, (next_psn + 2) & 0xffffff);
  // Ours now: it goes with our last handle (nobody else holds it).
  EXPECT_EQ(x.b->device->DestroyQp(h), 0);
}

// Another holder took the gone process's number first: our handle stays (it reaches the QP there), no fatal event.
// A process that was killed handed nothing over: its QPs went with it (the fatal event, as before).
TEST(XrcTargetAcrossProcesses, AnotherHolderTakesItOrNobodyCan) {
  SharedXrcBench x;
  QueuePair* h = nullptr;
  ASSERT_EQ(x.b->device->OpenQp(x.xb, x.link.tq->qpn(), QpType::kXrcRecv, &h), 0);
  x.host.procs[1].adopt_result = -EALREADY;
  x.b->device->OnPeerProcessGone(x.a->device->config().address, 1);
  EXPECT_TRUE(x.b->events.empty());
  EXPECT_TRUE(h->runs_elsewhere);
  EXPECT_EQ(x.b->device->counters().xrc_targets_adopted, 0u);
  EXPECT_EQ(x.b->device->DestroyQp(h), 0);
}

// The gone process's last state was published just before it handed a piece (pending), which arrived: the holder
// that takes the QP over counts that piece as received (its own SRQ has it) and does not place it twice.
TEST(XrcTargetAcrossProcesses, APieceHandedJustBeforeTheProcessWentIsNotTakenTwice) {
  SharedXrcBench x;
  const uint32_t qpn = x.link.tq->qpn();
  QueuePair* h = nullptr;
  ASSERT_EQ(x.b->device->OpenQp(x.xb, qpn, QpType::kXrcRecv, &h), 0);
  ASSERT_NO_FATAL_FAILURE(HandFirstPacketOnly(x));
  // As if it died between handing the first piece and publishing its state after it.
  SharedTargetState pending;
  pending.attributes = x.link.tq->attributes();
  const uint32_t first_psn = (pending.attributes.rq_psn + 0xffffff) & 0xffffff;
  pending.attributes.rq_psn = first_psn;
  pending.msn = x.link.tq->responder().state().msn;
  pending.in_message = true;
  pending.pending = true;
  pending.relay_srqn = x.srq->srqn();
  pending.relay_index = x.link.tq->inbound().relay_index;
  pending.relay_length = x.link.tq->inbound().relay_length;
  ASSERT_TRUE(x.host.procs[0].table->PublishTarget(qpn, kDomainFile, {reinterpret_cast<const uint8_t*>(&pending),
                                                                        sizeof pending}));
  x.b->device->OnPeerProcessGone(x.a->device->config().address, 1);
  QpAttributes got;
  ASSERT_EQ(x.b->device->QueryQp(h, &got), 0);
  EXPECT_EQ(got.rq_psn, (first_psn + 1) & 0xffffff);
  const std::vector<uint8_t> last(700, 0x7c);
  x.InjectSendPiece(qpn, 0x02, first_psn + 1, last);  // XRC SEND LAST
  x.f.PumpUntil(x.f.clock().NowNs() + 5'000'000);
  auto done = Drain(x.bcq);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].status, WcStatus::kSuccess);
  EXPECT_EQ(done[0].byte_len, 1024u + 700);
  EXPECT_EQ(x.dst.bytes[1023], 0x5a);
  EXPECT_EQ(x.dst.bytes[1024], 0x7c);
  EXPECT_EQ(x.b->device->DestroyQp(h), 0);
}

// A piece a target hands again marked resent (its new runner's first), which the SRQ's process has already, is
// dropped there; one it has not had is placed.
TEST(XrcAcrossProcesses, APieceHandedAgainThatArrivedBeforeIsDropped) {
  SharedXrcBench x;
  ASSERT_NO_FATAL_FAILURE(HandFirstPacketOnly(x));  // first piece placed, WQE 1 taken
  const uint32_t first_psn = (x.link.tq->attributes().rq_psn + 0xffffff) & 0xffffff;
  wire::XrcDelivery again;
  again.srqn = x.srq->srqn();
  again.target_qpn = x.link.tq->qpn();
  again.index = x.link.tq->inbound().relay_index;
  again.psn = first_psn;
  again.first = again.resent = true;
  std::vector<uint8_t> record(wire::XrcDelivery::kSize);
  again.Encode(record.data());
  record.resize(record.size() + 1024, 0x33);
  x.host.procs[1].ring.push_back(record);
  const uint64_t dropped = x.b->device->counters().xrc_pieces_dropped;
  x.host.procs[1].DeliverRing(*x.b->device);
  EXPECT_EQ(x.b->device->counters().xrc_pieces_dropped, dropped + 1);
  EXPECT_EQ(x.dst.bytes[0], 0x5a);  // not overwritten
  EXPECT_TRUE(Drain(x.bcq).empty());  // the message is still open, its WQE not flushed
  EXPECT_EQ(x.srq->depth(), 1u);
}

// The target's process dies with a message half handed over, but another process holds that target (and runs it on,
// elsewhere): the WQE waits for its next pieces, which finish it; one that never comes is flushed after
// Device::kOrphanedMessageWaitNs.
TEST(XrcTargetAcrossProcesses, AMessageOfATargetRunOnElsewhereWaitsForItsPieces) {
  for (const bool comes : {true, false}) {
    SCOPED_TRACE(comes ? "the rest comes" : "nothing comes");
    SharedXrcBench x;
    QueuePair* h = nullptr;
    ASSERT_EQ(x.b->device->OpenQp(x.xb, x.link.tq->qpn(), QpType::kXrcRecv, &h), 0);
    x.host.procs[1].adopt_result = -EALREADY;  // a third process took it over
    ASSERT_NO_FATAL_FAILURE(HandFirstPacketOnly(x));
    const uint32_t next_psn = x.link.tq->attributes().rq_psn;
    x.b->device->OnPeerProcessGone(x.a->device->config().address, 1);
    EXPECT_TRUE(Drain(x.bcq).empty());
    if (comes) {
      wire::XrcDelivery rest;  // as the process that runs the target now hands it
      rest.srqn = x.srq->srqn();
      rest.target_qpn = x.link.tq->qpn();
      rest.index = x.link.tq->inbound().relay_index;
      rest.psn = next_psn;
      rest.last = true;
      std::vector<uint8_t> record(wire::XrcDelivery::kSize);
      rest.Encode(record.data());
      record.resize(record.size() + 300, 0x44);
      x.host.procs[1].ring.push_back(record);
      x.host.procs[1].DeliverRing(*x.b->device);
    }
    x.f.PumpUntil(x.f.clock().NowNs() + Device::kOrphanedMessageWaitNs + 1'000'000'000);
    auto got = Drain(x.bcq);
    ASSERT_EQ(got.size(), 1u);
    EXPECT_EQ(got[0].wr_id, 1u);
    EXPECT_EQ(got[0].status, comes ? WcStatus::kSuccess : WcStatus::kWrFlushErr);
    if (comes) {
      EXPECT_EQ(got[0].byte_len, 1024u + 300);
    }
  }
}

}  // namespace
}  // namespace uroce::emu
