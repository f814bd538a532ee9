// The ibv_wr_* send-ops API (ibv_create_qp_ex(3) with IBV_QP_INIT_ATTR_SEND_OPS_FLAGS, ibv_wr_post(3)) end to end in
// one process on the real engine: UD and UC QPs talk to each other over this process's loopback address.
//
// "Nothing was posted" is observed without waiting for silence: UD and UC complete a send when it leaves, in posting
// order, so after a batch that must post nothing we post a marker batch and check that the marker is the first
// completion (and the first message received).
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <infiniband/verbs.h>

#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "verbs_api/verbs_test_env.h"

namespace {

constexpr uint32_t kQkey = 0x1234;
constexpr unsigned kGrh = 40;  // a UD receive buffer starts with the GRH (ibv_post_recv(3))

using Env = uroce::verbs::testing::VerbsEnv;

ibv_qp* CreateQpEx(Env& e, ibv_cq* cq, ibv_qp_type type, uint64_t send_ops, uint32_t max_send_sge = 1) {
  ibv_qp_init_attr_ex init{};
  init.send_cq = init.recv_cq = cq;
  init.qp_type = type;
  init.cap = {64, 64, max_send_sge, 1, 64};
  init.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
  init.pd = e.pd;
  init.send_ops_flags = send_ops;
  return ibv_create_qp_ex(e.ctx, &init);
}

bool ToRtsUd(ibv_qp* qp) {
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.port_num = 1;
  a.qkey = kQkey;
  if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY)) return false;
  a.qp_state = IBV_QPS_RTR;
  if (ibv_modify_qp(qp, &a, IBV_QP_STATE)) return false;
  a.qp_state = IBV_QPS_RTS;
  a.sq_psn = 1;
  return ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN) == 0;
}

// Connects a UC or RC QP to `peer_qpn` on our own GID (IBTA 10.3: RESET→INIT→RTR→RTS with each type's required
// attributes). 0 or the errno of the failing modify.
int Connect(Env& e, ibv_qp* qp, uint32_t peer_qpn) {
  const bool rc = qp->qp_type == IBV_QPT_RC;
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.port_num = 1;
  a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | (rc ? IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC : 0);
  if (int err = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
    return err;
  a = {};
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = IBV_MTU_1024;
  a.dest_qp_num = peer_qpn;
  a.rq_psn = 100;
  a.ah_attr.is_global = 1;
  a.ah_attr.grh.dgid = e.gid;
  a.ah_attr.grh.hop_limit = 64;
  a.ah_attr.port_num = 1;
  int mask = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN;
  if (rc) {
    a.max_dest_rd_atomic = 4;
    a.min_rnr_timer = 12;
    mask |= IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
  }
  if (int err = ibv_modify_qp(qp, &a, mask)) return err;
  a = {};
  a.qp_state = IBV_QPS_RTS;
  a.sq_psn = 100;
  mask = IBV_QP_STATE | IBV_QP_SQ_PSN;
  if (rc) {
    a.timeout = 14;
    a.retry_cnt = 7;
    a.rnr_retry = 7;
    a.max_rd_atomic = 4;
    mask |= IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC;
  }
  return ibv_modify_qp(qp, &a, mask);
}

ibv_ah* AhToSelf(Env& e) {
  ibv_ah_attr ah{};
  ah.is_global = 1;
  ah.grh.dgid = e.gid;
  ah.grh.hop_limit = 64;
  ah.port_num = 1;
  return ibv_create_ah(e.pd, &ah);
}

// Polls until n completions arrived or 5 s passed (a bound on a wait for an event, not a sleep).
std::vector<ibv_wc> PollN(ibv_cq* cq, size_t n) {
  std::vector<ibv_wc> out;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (out.size() < n && std::chrono::steady_clock::now() < deadline) {
    ibv_wc wc[8];
    const int got = ibv_poll_cq(cq, 8, wc);
    out.insert(out.end(), wc, wc + got);
  }
  return out;
}

void PostRecv(ibv_qp* qp, ibv_mr* mr, size_t offset, uint32_t len, uint64_t id) {
  ibv_sge sge{reinterpret_cast<uintptr_t>(mr->addr) + offset, len, mr->lkey};
  ibv_recv_wr wr{}, *bad = nullptr;
  wr.wr_id = id;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  ASSERT_EQ(ibv_post_recv(qp, &wr, &bad), 0);
}

// A UD pair with send ops: `a` sends to `b`; separate send and receive CQs so each side's completions are counted.
struct UdPair {
  Env& e;
  ibv_cq* scq = nullptr;
  ibv_cq* rcq = nullptr;
  ibv_qp* a = nullptr;
  ibv_qp* b = nullptr;
  ibv_qp_ex* ax = nullptr;
  ibv_ah* ah = nullptr;
  std::vector<uint8_t> src, dst;
  ibv_mr* smr = nullptr;
  ibv_mr* dmr = nullptr;

  UdPair(Env& env, uint32_t max_send_sge = 1, unsigned cqe = 64) : e(env), src(4096), dst(8 * 4096) {
    scq = ibv_create_cq(e.ctx, cqe, nullptr, nullptr, 0);
    rcq = ibv_create_cq(e.ctx, cqe, nullptr, nullptr, 0);
    a = CreateQpEx(e, scq, IBV_QPT_UD, IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM, max_send_sge);
    b = CreateQpEx(e, rcq, IBV_QPT_UD, IBV_QP_EX_WITH_SEND);
    if (!a || !b || !ToRtsUd(a) || !ToRtsUd(b)) return;
    ax = ibv_qp_to_qp_ex(a);
    ah = AhToSelf(e);
    for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 7 + 3);
    smr = ibv_reg_mr(e.pd, src.data(), src.size(), IBV_ACCESS_LOCAL_WRITE);
    dmr = ibv_reg_mr(e.pd, dst.data(), dst.size(), IBV_ACCESS_LOCAL_WRITE);
  }
  bool ok() const { return ax && ah && smr && dmr; }
  ~UdPair() {
    if (ah) ibv_destroy_ah(ah);
    if (a) ibv_destroy_qp(a);
    if (b) ibv_destroy_qp(b);
    if (smr) ibv_dereg_mr(smr);
    if (dmr) ibv_dereg_mr(dmr);
    ibv_destroy_cq(scq);
    ibv_destroy_cq(rcq);
  }
  uint64_t saddr(size_t off = 0) const { return reinterpret_cast<uintptr_t>(src.data()) + off; }
  // Receive slot i: GRH + up to 4096 - 40 bytes.
  void PostSlot(unsigned i, uint64_t id) { PostRecv(b, dmr, i * 4096, 4096, id); }
  const uint8_t* Payload(unsigned i) const { return dst.data() + i * 4096 + kGrh; }
  void SetAddr() { ibv_wr_set_ud_addr(ax, ah, b->qp_num, kQkey); }
  // One signaled SEND of src[0, len) as a batch of its own.
  int SendMarker(uint64_t id, uint32_t len) {
    ibv_wr_start(ax);
    ax->wr_id = id;
    ax->wr_flags = IBV_SEND_SIGNALED;
    ibv_wr_send(ax);
    ibv_wr_set_sge(ax, smr->lkey, saddr(), len);
    SetAddr();
    return ibv_wr_complete(ax);
  }
};

TEST(QpExOps, UdSendAndSendImmInOneBatchDeliverInOrder) {
  Env e;
  UdPair p(e);
  ASSERT_TRUE(p.ok());
  p.PostSlot(0, 100);
  p.PostSlot(1, 101);

  ibv_wr_start(p.ax);
  p.ax->wr_id = 1;
  p.ax->wr_flags = IBV_SEND_SIGNALED;
  ibv_wr_send(p.ax);
  ibv_wr_set_sge(p.ax, p.smr->lkey, p.saddr(), 300);
  p.SetAddr();
  p.ax->wr_id = 2;  // taken by the next builder; the WR above keeps 1
  ibv_wr_send_imm(p.ax, htonl(0xc0ffee));
  ibv_wr_set_sge(p.ax, p.smr->lkey, p.saddr(300), 200);
  p.SetAddr();
  ASSERT_EQ(ibv_wr_complete(p.ax), 0);

  auto s = PollN(p.scq, 2);
  ASSERT_EQ(s.size(), 2u);
  EXPECT_EQ(s[0].wr_id, 1u);
  EXPECT_EQ(s[1].wr_id, 2u);
  EXPECT_EQ(s[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(s[1].status, IBV_WC_SUCCESS);
  EXPECT_EQ(s[0].opcode, IBV_WC_SEND);

  auto r = PollN(p.rcq, 2);
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[0].wr_id, 100u);
  EXPECT_EQ(r[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(r[0].byte_len, kGrh + 300);
  EXPECT_FALSE(r[0].wc_flags & IBV_WC_WITH_IMM);
  EXPECT_EQ(r[0].src_qp, p.a->qp_num);
  EXPECT_EQ(0, std::memcmp(p.Payload(0), p.src.data(), 300));
  EXPECT_EQ(r[1].wr_id, 101u);
  EXPECT_EQ(r[1].byte_len, kGrh + 200);
  ASSERT_TRUE(r[1].wc_flags & IBV_WC_WITH_IMM);
  EXPECT_EQ(ntohl(r[1].imm_data), 0xc0ffeeu);
  EXPECT_EQ(0, std::memcmp(p.Payload(1), p.src.data() + 300, 200));
}

TEST(QpExOps, InlineDataIsCopiedWhenSet) {
  Env e;
  UdPair p(e);
  ASSERT_TRUE(p.ok());
  p.PostSlot(0, 100);
  p.PostSlot(1, 101);

  char one[] = "inline-single";
  char part1[] = "abc", part2[] = "defgh";
  ibv_wr_start(p.ax);
  p.ax->wr_id = 1;
  p.ax->wr_flags = IBV_SEND_SIGNALED;
  ibv_wr_send(p.ax);
  ibv_wr_set_inline_data(p.ax, one, sizeof one);
  p.SetAddr();
  p.ax->wr_id = 2;
  ibv_wr_send(p.ax);
  const ibv_data_buf bufs[] = {{part1, 3}, {part2, 5}};
  ibv_wr_set_inline_data_list(p.ax, 2, bufs);
  p.SetAddr();
  // The caller may reuse its buffers right after the setters: what was set is what goes out.
  std::memset(one, 'X', sizeof one);
  std::memset(part1, 'X', sizeof part1);
  std::memset(part2, 'X', sizeof part2);
  ASSERT_EQ(ibv_wr_complete(p.ax), 0);

  auto r = PollN(p.rcq, 2);
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[0].byte_len, kGrh + sizeof "inline-single");
  EXPECT_STREQ(reinterpret_cast<const char*>(p.Payload(0)), "inline-single");
  EXPECT_EQ(r[1].byte_len, kGrh + 8);
  EXPECT_EQ(0, std::memcmp(p.Payload(1), "abcdefgh", 8));
  EXPECT_EQ(PollN(p.scq, 2).size(), 2u);
}

TEST(QpExOps, SgeListGathersSeveralBuffersInOrder) {
  Env e;
  UdPair p(e, /*max_send_sge=*/4);
  ASSERT_TRUE(p.ok());
  p.PostSlot(0, 100);
  const ibv_sge sges[] = {
      {p.saddr(1000), 10, p.smr->lkey},
      {p.saddr(0), 5, p.smr->lkey},
      {p.saddr(2000), 100, p.smr->lkey},
  };
  ibv_wr_start(p.ax);
  p.ax->wr_id = 9;
  p.ax->wr_flags = IBV_SEND_SIGNALED;
  ibv_wr_send(p.ax);
  ibv_wr_set_sge_list(p.ax, 3, sges);
  p.SetAddr();
  ASSERT_EQ(ibv_wr_complete(p.ax), 0);

  auto r = PollN(p.rcq, 1);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].status, IBV_WC_SUCCESS);
  ASSERT_EQ(r[0].byte_len, kGrh + 115);
  std::vector<uint8_t> want(p.src.begin() + 1000, p.src.begin() + 1010);
  want.insert(want.end(), p.src.begin(), p.src.begin() + 5);
  want.insert(want.end(), p.src.begin() + 2000, p.src.begin() + 2100);
  EXPECT_EQ(0, std::memcmp(p.Payload(0), want.data(), want.size()));
  auto s = PollN(p.scq, 1);
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].wr_id, 9u);
}

TEST(QpExOps, AbortPostsNothing) {
  Env e;
  UdPair p(e);
  ASSERT_TRUE(p.ok());
  p.PostSlot(0, 100);
  p.PostSlot(1, 101);
  ibv_wr_start(p.ax);
  p.ax->wr_id = 1;
  p.ax->wr_flags = IBV_SEND_SIGNALED;
  ibv_wr_send(p.ax);
  ibv_wr_set_sge(p.ax, p.smr->lkey, p.saddr(), 64);
  p.SetAddr();
  ibv_wr_send(p.ax);
  ibv_wr_set_sge(p.ax, p.smr->lkey, p.saddr(), 64);
  p.SetAddr();
  ibv_wr_abort(p.ax);
  // After an abort the QP takes a new batch (the critical region was left) and it is the first thing sent.
  ASSERT_EQ(p.SendMarker(77, 33), 0);
  auto s = PollN(p.scq, 1);
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].wr_id, 77u);
  auto r = PollN(p.rcq, 1);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].wr_id, 100u);
  EXPECT_EQ(r[0].byte_len, kGrh + 33);
}

TEST(QpExOps, BadWrInABatchFailsCompleteAndPostsNothingOfIt) {
  Env e;
  UdPair p(e);  // max_send_sge 1
  ASSERT_TRUE(p.ok());
  p.PostSlot(0, 100);
  const ibv_sge two[] = {{p.saddr(0), 8, p.smr->lkey}, {p.saddr(8), 8, p.smr->lkey}};

  // A good WR, one with more SGEs than the QP has, another good one: nothing goes out.
  ibv_wr_start(p.ax);
  p.ax->wr_id = 1;
  p.ax->wr_flags = IBV_SEND_SIGNALED;
  ibv_wr_send(p.ax);
  ibv_wr_set_sge(p.ax, p.smr->lkey, p.saddr(), 16);
  p.SetAddr();
  p.ax->wr_id = 2;
  ibv_wr_send(p.ax);
  ibv_wr_set_sge_list(p.ax, 2, two);
  p.SetAddr();
  p.ax->wr_id = 3;
  ibv_wr_send(p.ax);
  ibv_wr_set_sge(p.ax, p.smr->lkey, p.saddr(), 16);
  p.SetAddr();
  EXPECT_EQ(ibv_wr_complete(p.ax), EINVAL);

  // A UD WR without ibv_wr_set_ud_addr, after a good one.
  ibv_wr_start(p.ax);
  p.ax->wr_id = 4;
  ibv_wr_send(p.ax);
  ibv_wr_set_sge(p.ax, p.smr->lkey, p.saddr(), 16);
  p.SetAddr();
  p.ax->wr_id = 5;
  ibv_wr_send(p.ax);
  EXPECT_EQ(ibv_wr_complete(p.ax), EINVAL);

  // More inline bytes than max_inline_data.
  std::vector<uint8_t> big(4096, 1);
  ibv_wr_start(p.ax);
  p.ax->wr_id = 6;
  ibv_wr_send(p.ax);
  ibv_wr_set_inline_data(p.ax, big.data(), big.size());
  p.SetAddr();
  EXPECT_EQ(ibv_wr_complete(p.ax), EINVAL);

  // A setter before any builder.
  ibv_wr_start(p.ax);
  ibv_wr_set_sge(p.ax, p.smr->lkey, p.saddr(), 16);
  EXPECT_EQ(ibv_wr_complete(p.ax), EINVAL);

  // Completing without ibv_wr_start().
  EXPECT_EQ(ibv_wr_complete(p.ax), EINVAL);

  ASSERT_EQ(p.SendMarker(77, 21), 0);
  auto s = PollN(p.scq, 1);
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].wr_id, 77u);
  auto r = PollN(p.rcq, 1);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].byte_len, kGrh + 21);
}

TEST(QpExOps, UnknownTsoAndWrongTypeFlagsFailCreateWithEopnotsupp) {
  Env e;
  ibv_cq* cq = ibv_create_cq(e.ctx, 4, nullptr, nullptr, 0);
  struct Case {
    ibv_qp_type type;
    uint64_t flags;
  } cases[] = {
      {IBV_QPT_UD, IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_TSO},
      {IBV_QPT_UD, IBV_QP_EX_WITH_SEND | (1ull << 11)},          // no such flag
      {IBV_QPT_UD, IBV_QP_EX_WITH_SEND | (1ull << 40)},          // no such flag
      {IBV_QPT_RC, IBV_QP_EX_WITH_ATOMIC_WRITE},                 // not implemented
      {IBV_QPT_UD, IBV_QP_EX_WITH_RDMA_WRITE},                   // UD has no RDMA
      {IBV_QPT_UD, IBV_QP_EX_WITH_SEND_WITH_INV},
      {IBV_QPT_UC, IBV_QP_EX_WITH_RDMA_READ},                    // UC has no READ
      {IBV_QPT_UC, IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD},
      {IBV_QPT_UC, IBV_QP_EX_WITH_SEND_WITH_INV},
  };
  for (const Case& c : cases) {
    errno = 0;
    EXPECT_EQ(CreateQpEx(e, cq, c.type, c.flags), nullptr) << c.type << " 0x" << std::hex << c.flags;
    EXPECT_EQ(errno, EOPNOTSUPP) << c.type << " 0x" << std::hex << c.flags;
  }
  // The failed creates left no QP behind holding the CQ.
  EXPECT_EQ(ibv_destroy_cq(cq), 0);
}

TEST(QpExOps, OnlyRequestedBuildersAreInstalled) {
  Env e;
  ibv_cq* cq = ibv_create_cq(e.ctx, 4, nullptr, nullptr, 0);
  ibv_qp* ud = CreateQpEx(e, cq, IBV_QPT_UD, IBV_QP_EX_WITH_SEND);
  ASSERT_NE(ud, nullptr);
  ibv_qp_ex* x = ibv_qp_to_qp_ex(ud);
  ASSERT_NE(x, nullptr);
  EXPECT_NE(x->wr_send, nullptr);
  EXPECT_EQ(x->wr_send_imm, nullptr);  // allowed on UD but not requested
  EXPECT_EQ(x->wr_rdma_write, nullptr);
  EXPECT_EQ(x->wr_send_tso, nullptr);
  EXPECT_NE(x->wr_start, nullptr);
  EXPECT_NE(x->wr_complete, nullptr);
  EXPECT_NE(x->wr_abort, nullptr);
  EXPECT_NE(x->wr_set_sge, nullptr);
  EXPECT_NE(x->wr_set_sge_list, nullptr);
  EXPECT_NE(x->wr_set_inline_data, nullptr);
  EXPECT_NE(x->wr_set_inline_data_list, nullptr);
  EXPECT_NE(x->wr_set_ud_addr, nullptr);
  EXPECT_EQ(x->wr_set_xrc_srqn, nullptr);

  ibv_qp* uc = CreateQpEx(e, cq, IBV_QPT_UC, IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM | IBV_QP_EX_WITH_SEND);
  ASSERT_NE(uc, nullptr);
  x = ibv_qp_to_qp_ex(uc);
  ASSERT_NE(x, nullptr);
  EXPECT_NE(x->wr_rdma_write_imm, nullptr);
  EXPECT_NE(x->wr_send, nullptr);
  EXPECT_EQ(x->wr_rdma_write, nullptr);
  EXPECT_EQ(x->wr_rdma_read, nullptr);
  EXPECT_EQ(x->wr_set_ud_addr, nullptr);  // connected: the peer comes from modify_qp
  EXPECT_EQ(x->wr_set_xrc_srqn, nullptr);
  EXPECT_EQ(ibv_destroy_qp(ud), 0);
  EXPECT_EQ(ibv_destroy_qp(uc), 0);
  EXPECT_EQ(ibv_destroy_cq(cq), 0);
}

TEST(QpExOps, QpToQpExOnlyForQpsCreatedWithSendOps) {
  Env e;
  ibv_cq* cq = ibv_create_cq(e.ctx, 4, nullptr, nullptr, 0);
  ibv_qp_init_attr plain{};
  plain.send_cq = plain.recv_cq = cq;
  plain.qp_type = IBV_QPT_UD;
  plain.cap = {4, 4, 1, 1, 0};
  ibv_qp* q1 = ibv_create_qp(e.pd, &plain);
  ASSERT_NE(q1, nullptr);
  EXPECT_EQ(ibv_qp_to_qp_ex(q1), nullptr);

  ibv_qp_init_attr_ex ex{};
  ex.send_cq = ex.recv_cq = cq;
  ex.qp_type = IBV_QPT_UD;
  ex.cap = {4, 4, 1, 1, 0};
  ex.comp_mask = IBV_QP_INIT_ATTR_PD;
  ex.pd = e.pd;
  ex.send_ops_flags = IBV_QP_EX_WITH_SEND;  // ignored: the comp_mask bit is not set
  ibv_qp* q2 = ibv_create_qp_ex(e.ctx, &ex);
  ASSERT_NE(q2, nullptr);
  EXPECT_EQ(ibv_qp_to_qp_ex(q2), nullptr);

  ibv_qp* q3 = CreateQpEx(e, cq, IBV_QPT_UD, 0);  // the bit with no builders: still an ibv_qp_ex
  ASSERT_NE(q3, nullptr);
  ibv_qp_ex* x = ibv_qp_to_qp_ex(q3);
  ASSERT_NE(x, nullptr);
  EXPECT_EQ(&x->qp_base, q3);
  EXPECT_EQ(x->qp_base.qp_num, q3->qp_num);
  EXPECT_EQ(x->wr_send, nullptr);

  EXPECT_EQ(ibv_destroy_qp(q1), 0);
  EXPECT_EQ(ibv_destroy_qp(q2), 0);
  EXPECT_EQ(ibv_destroy_qp(q3), 0);
  EXPECT_EQ(ibv_destroy_cq(cq), 0);
}

// ibv_wr_post(3) CONCURRENCY: ibv_wr_start..ibv_wr_complete is a per-QP critical region, so batches from two threads
// never interleave: each batch's WRs complete next to each other (UD completes in posting order).
TEST(QpExOps, BatchesFromTwoThreadsDoNotInterleave) {
  Env e;
  constexpr int kBatches = 40, kPerBatch = 3;
  UdPair p(e, 1, 2 * kBatches * kPerBatch + 8);
  ASSERT_TRUE(p.ok());
  auto worker = [&](uint64_t t) {
    for (int i = 0; i < kBatches; ++i) {
      ibv_wr_start(p.ax);
      for (int j = 0; j < kPerBatch; ++j) {
        p.ax->wr_id = t << 32 | uint64_t(i) << 8 | uint64_t(j);
        p.ax->wr_flags = IBV_SEND_SIGNALED;
        ibv_wr_send(p.ax);
        ibv_wr_set_sge(p.ax, p.smr->lkey, p.saddr(), 8);
        // No receive is posted at the far end: the datagrams are dropped there, the sends still complete.
        ibv_wr_set_ud_addr(p.ax, p.ah, p.b->qp_num, kQkey);
      }
      ASSERT_EQ(ibv_wr_complete(p.ax), 0);
    }
  };
  std::thread t1(worker, 1), t2(worker, 2);
  t1.join();
  t2.join();
  auto s = PollN(p.scq, 2 * kBatches * kPerBatch);
  ASSERT_EQ(s.size(), size_t{2 * kBatches * kPerBatch});
  for (size_t k = 0; k < s.size(); k += kPerBatch) {
    for (int j = 0; j < kPerBatch; ++j) {
      EXPECT_EQ(s[k + j].status, IBV_WC_SUCCESS);
      EXPECT_EQ(s[k + j].wr_id, s[k].wr_id + j) << "batch starting at completion " << k << " was interleaved";
    }
  }
}

// UC: two QPs connected to each other; RDMA WRITE with immediate lands in the target MR and consumes a receive.
TEST(QpExOps, UcRdmaWriteImmLandsInTargetBuffer) {
  Env e;
  ibv_cq* scq = ibv_create_cq(e.ctx, 16, nullptr, nullptr, 0);
  ibv_cq* rcq = ibv_create_cq(e.ctx, 16, nullptr, nullptr, 0);
  ibv_qp* a = CreateQpEx(e, scq, IBV_QPT_UC, IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM, 2);
  ibv_qp* b = CreateQpEx(e, rcq, IBV_QPT_UC, IBV_QP_EX_WITH_SEND);
  ASSERT_TRUE(a && b);
  ASSERT_EQ(Connect(e, a, b->qp_num), 0);
  ASSERT_EQ(Connect(e, b, a->qp_num), 0);
  std::vector<uint8_t> src(3000), target(8192, 0), rbuf(16);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i ^ 0x5a);
  ibv_mr* smr = ibv_reg_mr(e.pd, src.data(), src.size(), IBV_ACCESS_LOCAL_WRITE);
  ibv_mr* tmr = ibv_reg_mr(e.pd, target.data(), target.size(), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  ibv_mr* rmr = ibv_reg_mr(e.pd, rbuf.data(), rbuf.size(), IBV_ACCESS_LOCAL_WRITE);
  ASSERT_TRUE(smr && tmr && rmr);
  PostRecv(b, rmr, 0, rbuf.size(), 500);
  ibv_qp_ex* x = ibv_qp_to_qp_ex(a);
  ASSERT_NE(x, nullptr);
  const uint64_t taddr = reinterpret_cast<uintptr_t>(target.data());
  const ibv_sge halves[] = {{reinterpret_cast<uintptr_t>(src.data()), 1500, smr->lkey},
                            {reinterpret_cast<uintptr_t>(src.data()) + 1500, 1500, smr->lkey}};

  ibv_wr_start(x);
  x->wr_id = 1;
  x->wr_flags = IBV_SEND_SIGNALED;
  ibv_wr_rdma_write(x, tmr->rkey, taddr + 5000);  // a plain write first: no receive consumed
  ibv_wr_set_inline_data(x, src.data(), 16);
  x->wr_id = 2;
  ibv_wr_rdma_write_imm(x, tmr->rkey, taddr + 100, htonl(0xabcdef));  // 3000 bytes: three packets at MTU 1024
  ibv_wr_set_sge_list(x, 2, halves);
  ASSERT_EQ(ibv_wr_complete(x), 0);

  auto s = PollN(scq, 2);
  ASSERT_EQ(s.size(), 2u);
  EXPECT_EQ(s[0].wr_id, 1u);
  EXPECT_EQ(s[0].opcode, IBV_WC_RDMA_WRITE);
  EXPECT_EQ(s[1].wr_id, 2u);
  EXPECT_EQ(s[1].status, IBV_WC_SUCCESS);
  auto r = PollN(rcq, 1);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].wr_id, 500u);
  EXPECT_EQ(r[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(r[0].opcode, IBV_WC_RECV_RDMA_WITH_IMM);
  ASSERT_TRUE(r[0].wc_flags & IBV_WC_WITH_IMM);
  EXPECT_EQ(ntohl(r[0].imm_data), 0xabcdefu);
  EXPECT_EQ(r[0].byte_len, 3000u);
  // The write-with-immediate completes after the plain write that preceded it on the same QP, so both have landed.
  EXPECT_EQ(0, std::memcmp(target.data() + 100, src.data(), 3000));
  EXPECT_EQ(0, std::memcmp(target.data() + 5000, src.data(), 16));
  EXPECT_EQ(target[99], 0);
  EXPECT_EQ(target[3100], 0);

  ibv_destroy_qp(a);
  ibv_destroy_qp(b);
  ibv_dereg_mr(smr);
  ibv_dereg_mr(tmr);
  ibv_dereg_mr(rmr);
  ibv_destroy_cq(scq);
  ibv_destroy_cq(rcq);
}

// RC: every builder in one batch. The device has no RC transport yet (posting returns EOPNOTSUPP); the test skips
// then and starts running the day RC lands.
TEST(QpExOps, RcBatchOfWriteReadAtomicsAndSends) {
  Env e;
  ibv_cq* scq = ibv_create_cq(e.ctx, 32, nullptr, nullptr, 0);
  ibv_cq* rcq = ibv_create_cq(e.ctx, 32, nullptr, nullptr, 0);
  constexpr uint64_t kAll = IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM | IBV_QP_EX_WITH_SEND |
                            IBV_QP_EX_WITH_SEND_WITH_IMM | IBV_QP_EX_WITH_RDMA_READ |
                            IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP | IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD |
                            IBV_QP_EX_WITH_LOCAL_INV | IBV_QP_EX_WITH_BIND_MW | IBV_QP_EX_WITH_SEND_WITH_INV;
  ibv_qp* a = CreateQpEx(e, scq, IBV_QPT_RC, kAll, 2);
  if (a == nullptr && errno == EOPNOTSUPP) {
    ibv_destroy_cq(scq);
    ibv_destroy_cq(rcq);
    GTEST_SKIP() << "RC QPs are not supported by the device yet";
  }
  ASSERT_NE(a, nullptr);
  ibv_qp* b = CreateQpEx(e, rcq, IBV_QPT_RC, IBV_QP_EX_WITH_SEND);
  ASSERT_NE(b, nullptr);
  ibv_qp_ex* x = ibv_qp_to_qp_ex(a);
  ASSERT_NE(x, nullptr);
  for (auto* f : {(void*)x->wr_rdma_write, (void*)x->wr_rdma_write_imm, (void*)x->wr_send, (void*)x->wr_send_imm,
                  (void*)x->wr_send_inv, (void*)x->wr_rdma_read, (void*)x->wr_atomic_cmp_swp,
                  (void*)x->wr_atomic_fetch_add, (void*)x->wr_local_inv, (void*)x->wr_bind_mw})
    EXPECT_NE(f, nullptr);
  EXPECT_EQ(x->wr_set_ud_addr, nullptr);
  ASSERT_EQ(Connect(e, a, b->qp_num), 0);
  ASSERT_EQ(Connect(e, b, a->qp_num), 0);

  // Local: src (data to write/send), readback (RDMA READ target), atomic results. Remote (b): target, 2 counters.
  std::vector<uint8_t> src(256), readback(256, 0), rbuf(256, 0), target(512, 0);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(255 - i);
  alignas(8) uint64_t counters[2] = {10, 42};
  alignas(8) uint64_t results[2] = {0, 0};
  const int rw = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
  ibv_mr* smr = ibv_reg_mr(e.pd, src.data(), src.size(), IBV_ACCESS_LOCAL_WRITE);
  ibv_mr* bmr = ibv_reg_mr(e.pd, readback.data(), readback.size(), IBV_ACCESS_LOCAL_WRITE);
  ibv_mr* rmr = ibv_reg_mr(e.pd, rbuf.data(), rbuf.size(), IBV_ACCESS_LOCAL_WRITE);
  ibv_mr* tmr = ibv_reg_mr(e.pd, target.data(), target.size(), rw);
  ibv_mr* cmr = ibv_reg_mr(e.pd, counters, sizeof counters, rw | IBV_ACCESS_REMOTE_ATOMIC);
  ibv_mr* amr = ibv_reg_mr(e.pd, results, sizeof results, IBV_ACCESS_LOCAL_WRITE);
  ASSERT_TRUE(smr && bmr && rmr && tmr && cmr && amr);
  PostRecv(b, rmr, 0, 128, 700);  // for the write-with-immediate
  PostRecv(b, rmr, 128, 128, 701);  // for the send
  const uint64_t t = reinterpret_cast<uintptr_t>(target.data());
  const uint64_t c = reinterpret_cast<uintptr_t>(counters);
  const uint64_t s0 = reinterpret_cast<uintptr_t>(src.data());

  ibv_wr_start(x);
  x->wr_flags = IBV_SEND_SIGNALED;
  x->wr_id = 1;
  ibv_wr_rdma_write(x, tmr->rkey, t);
  ibv_wr_set_sge(x, smr->lkey, s0, 64);
  x->wr_id = 2;
  ibv_wr_rdma_write_imm(x, tmr->rkey, t + 64, htonl(7));
  ibv_wr_set_sge(x, smr->lkey, s0 + 64, 64);
  x->wr_id = 3;
  x->wr_flags = IBV_SEND_SIGNALED | IBV_SEND_FENCE;  // the read must see both writes
  ibv_wr_rdma_read(x, tmr->rkey, t);
  ibv_wr_set_sge(x, bmr->lkey, reinterpret_cast<uintptr_t>(readback.data()), 128);
  x->wr_flags = IBV_SEND_SIGNALED;
  x->wr_id = 4;
  ibv_wr_atomic_fetch_add(x, cmr->rkey, c, 5);
  ibv_wr_set_sge(x, amr->lkey, reinterpret_cast<uintptr_t>(&results[0]), 8);
  x->wr_id = 5;
  ibv_wr_atomic_cmp_swp(x, cmr->rkey, c + 8, 42, 99);
  ibv_wr_set_sge(x, amr->lkey, reinterpret_cast<uintptr_t>(&results[1]), 8);
  x->wr_id = 6;
  ibv_wr_send_imm(x, htonl(8));
  ibv_wr_set_inline_data(x, src.data(), 32);
  const int rc = ibv_wr_complete(x);
  if (rc == EOPNOTSUPP) {
    ibv_destroy_qp(a);
    ibv_destroy_qp(b);
    for (ibv_mr* m : {smr, bmr, rmr, tmr, cmr, amr}) ibv_dereg_mr(m);
    ibv_destroy_cq(scq);
    ibv_destroy_cq(rcq);
    GTEST_SKIP() << "posting on RC returns EOPNOTSUPP: the device has no RC transport yet";
  }
  ASSERT_EQ(rc, 0);

  auto s = PollN(scq, 6);
  ASSERT_EQ(s.size(), 6u);
  for (int i = 0; i < 6; ++i) {
    EXPECT_EQ(s[i].wr_id, uint64_t(i + 1));  // RC completes in order (IBTA 10.8.1)
    EXPECT_EQ(s[i].status, IBV_WC_SUCCESS) << "wr " << i + 1;
  }
  EXPECT_EQ(s[2].opcode, IBV_WC_RDMA_READ);
  EXPECT_EQ(s[3].opcode, IBV_WC_FETCH_ADD);
  EXPECT_EQ(s[4].opcode, IBV_WC_COMP_SWAP);
  auto r = PollN(rcq, 2);
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[0].wr_id, 700u);
  EXPECT_EQ(r[0].opcode, IBV_WC_RECV_RDMA_WITH_IMM);
  EXPECT_EQ(ntohl(r[0].imm_data), 7u);
  EXPECT_EQ(r[1].wr_id, 701u);
  EXPECT_EQ(r[1].opcode, IBV_WC_RECV);
  EXPECT_EQ(ntohl(r[1].imm_data), 8u);
  EXPECT_EQ(r[1].byte_len, 32u);
  EXPECT_EQ(0, std::memcmp(target.data(), src.data(), 128));
  EXPECT_EQ(0, std::memcmp(readback.data(), src.data(), 128));
  EXPECT_EQ(0, std::memcmp(rbuf.data() + 128, src.data(), 32));
  EXPECT_EQ(results[0], 10u);  // fetch-and-add returns the old value
  EXPECT_EQ(results[1], 42u);  // compare-and-swap too
  EXPECT_EQ(counters[0], 15u);
  EXPECT_EQ(counters[1], 99u);

  ibv_destroy_qp(a);
  ibv_destroy_qp(b);
  for (ibv_mr* m : {smr, bmr, rmr, tmr, cmr, amr}) ibv_dereg_mr(m);
  ibv_destroy_cq(scq);
  ibv_destroy_cq(rcq);
}

// ibv_wr_bind_mw(3) binds a type 2 window: an RDMA WRITE through the new R_Key lands inside the window on a region
// registered with only LOCAL_WRITE | MW_BIND (the window carries the remote right, IBTA C10-75); a window bound with
// local write only refuses the same WRITE (IBV_WC_REM_ACCESS_ERR, as pyverbs' test_qp_ex_rc_bind_mw expects).
TEST(QpExOps, RcBindMwOpensAWindowWithTheRightsOfTheBind) {
  Env e;
  ibv_cq* scq = ibv_create_cq(e.ctx, 16, nullptr, nullptr, 0);
  ibv_cq* rcq = ibv_create_cq(e.ctx, 16, nullptr, nullptr, 0);
  ibv_qp* a = CreateQpEx(e, scq, IBV_QPT_RC, IBV_QP_EX_WITH_RDMA_WRITE);
  ibv_qp* b = CreateQpEx(e, rcq, IBV_QPT_RC, IBV_QP_EX_WITH_BIND_MW);
  ASSERT_TRUE(a && b);
  ASSERT_EQ(Connect(e, a, b->qp_num), 0);
  ASSERT_EQ(Connect(e, b, a->qp_num), 0);
  std::vector<uint8_t> src(64, 0x5a), target(256, 0);
  ibv_mr* smr = ibv_reg_mr(e.pd, src.data(), src.size(), IBV_ACCESS_LOCAL_WRITE);
  ibv_mr* tmr = ibv_reg_mr(e.pd, target.data(), target.size(), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND);
  ibv_mw* open_mw = ibv_alloc_mw(e.pd, IBV_MW_TYPE_2);
  ibv_mw* closed_mw = ibv_alloc_mw(e.pd, IBV_MW_TYPE_2);
  ASSERT_TRUE(smr && tmr && open_mw && closed_mw);
  const uint64_t t = reinterpret_cast<uintptr_t>(target.data());

  ibv_qp_ex* xb = ibv_qp_to_qp_ex(b);
  const uint32_t open_rkey = ibv_inc_rkey(open_mw->rkey), closed_rkey = ibv_inc_rkey(closed_mw->rkey);
  ibv_mw_bind_info open_info{tmr, t + 64, 128, IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_LOCAL_WRITE};
  ibv_mw_bind_info closed_info{tmr, t, 256, IBV_ACCESS_LOCAL_WRITE};
  ibv_wr_start(xb);
  xb->wr_flags = IBV_SEND_SIGNALED;
  xb->wr_id = 1;
  ibv_wr_bind_mw(xb, open_mw, open_rkey, &open_info);
  xb->wr_id = 2;
  ibv_wr_bind_mw(xb, closed_mw, closed_rkey, &closed_info);
  ASSERT_EQ(ibv_wr_complete(xb), 0);
  auto binds = PollN(rcq, 2);
  ASSERT_EQ(binds.size(), 2u);
  for (const ibv_wc& wc : binds) {
    EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << "bind " << wc.wr_id;
    EXPECT_EQ(wc.opcode, IBV_WC_BIND_MW);
  }

  ibv_qp_ex* xa = ibv_qp_to_qp_ex(a);
  ibv_wr_start(xa);
  xa->wr_flags = IBV_SEND_SIGNALED;
  xa->wr_id = 10;
  ibv_wr_rdma_write(xa, open_rkey, t + 64);
  ibv_wr_set_sge(xa, smr->lkey, reinterpret_cast<uintptr_t>(src.data()), 64);
  ASSERT_EQ(ibv_wr_complete(xa), 0);
  auto w = PollN(scq, 1);
  ASSERT_EQ(w.size(), 1u);
  EXPECT_EQ(w[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(0, std::memcmp(target.data() + 64, src.data(), 64));
  EXPECT_EQ(target[63], 0);

  ibv_wr_start(xa);
  xa->wr_id = 11;
  ibv_wr_rdma_write(xa, closed_rkey, t);
  ibv_wr_set_sge(xa, smr->lkey, reinterpret_cast<uintptr_t>(src.data()), 16);
  ASSERT_EQ(ibv_wr_complete(xa), 0);
  w = PollN(scq, 1);
  ASSERT_EQ(w.size(), 1u);
  EXPECT_EQ(w[0].status, IBV_WC_REM_ACCESS_ERR);
  EXPECT_EQ(target[0], 0);

  // A bound type 2 window is invalidated before it is deallocated.
  for (uint32_t rkey : {open_rkey, closed_rkey}) {
    ibv_send_wr inv{}, *bad = nullptr;
    inv.opcode = IBV_WR_LOCAL_INV;
    inv.send_flags = IBV_SEND_SIGNALED;
    inv.invalidate_rkey = rkey;
    ASSERT_EQ(ibv_post_send(b, &inv, &bad), 0);
  }
  EXPECT_EQ(PollN(rcq, 2).size(), 2u);
  EXPECT_EQ(ibv_dealloc_mw(open_mw), 0);
  EXPECT_EQ(ibv_dealloc_mw(closed_mw), 0);
  ibv_destroy_qp(a);
  ibv_destroy_qp(b);
  ibv_dereg_mr(smr);
  ibv_dereg_mr(tmr);
  ibv_destroy_cq(scq);
  ibv_destroy_cq(rcq);
}

}  // namespace
