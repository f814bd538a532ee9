// SRQ and XRC through the verbs API, in one process on the real engine: what verbs.h's inlines reach through the
// function tables (create_srq_ex, post_srq_recv, get_srq_num, open_xrcd, close_xrcd, open_qp), the exported SRQ
// verbs, and every failure the seeds and man pages document, with the errno they give.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <infiniband/verbs.h>
#include <poll.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "verbs_api/verbs_test_env.h"

namespace {

// The shared environment plus one CQ every test here uses.
struct Env : uroce::verbs::testing::VerbsEnv {
  ibv_cq* cq = nullptr;
  Env() { cq = ibv_create_cq(ctx, 256, nullptr, nullptr, 0); }
  ~Env() {
    if (cq) ibv_destroy_cq(cq);
  }
};

ibv_srq* BasicSrq(Env& e, uint32_t max_wr = 16) {
  ibv_srq_init_attr a{};
  a.attr.max_wr = max_wr;
  a.attr.max_sge = 1;
  return ibv_create_srq(e.pd, &a);
}

// An RC QP on the environment's CQ, taking its receives from `srq` (nullptr: a send-only one of its own).
ibv_qp* RcQp(Env& e, ibv_srq* srq) {
  ibv_qp_init_attr qa{};
  qa.send_cq = qa.recv_cq = e.cq;
  qa.cap = {16, 0, 1, 0, 0};
  qa.qp_type = IBV_QPT_RC;
  qa.srq = srq;
  return ibv_create_qp(e.pd, &qa);
}

int PostSrq(ibv_srq* srq, ibv_mr* mr, uint32_t len, uint64_t id) {
  ibv_sge sge{reinterpret_cast<uintptr_t>(mr->addr), len, mr->lkey};
  ibv_recv_wr wr{}, *bad = nullptr;
  wr.wr_id = id;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  return ibv_post_srq_recv(srq, &wr, &bad);
}

// RESET -> RTS towards `remote` on this process's own address, with the masks perftest uses for its QP type.
void Connect(Env& e, ibv_qp* qp, uint32_t remote) {
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.port_num = 1;
  a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_LOCAL_WRITE;
  ASSERT_EQ(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS), 0);
  a = {};
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = IBV_MTU_1024;
  a.dest_qp_num = remote;
  a.rq_psn = 7;
  a.max_dest_rd_atomic = 1;
  a.min_rnr_timer = 1;
  a.ah_attr.is_global = 1;
  a.ah_attr.grh.dgid = e.gid;
  a.ah_attr.grh.hop_limit = 64;
  a.ah_attr.port_num = 1;
  // perftest passes the RC mask for XRC QPs too; uverbs drops what an XRC QP does not have.
  ASSERT_EQ(ibv_modify_qp(qp, &a,
                          IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                              IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER),
            0);
  a.qp_state = IBV_QPS_RTS;
  a.sq_psn = 7;
  a.timeout = 14;
  a.retry_cnt = 7;
  a.rnr_retry = 7;
  a.max_rd_atomic = 1;
  ASSERT_EQ(ibv_modify_qp(qp, &a,
                          IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                              IBV_QP_MAX_QP_RD_ATOMIC),
            0);
}

std::vector<ibv_wc> PollN(ibv_cq* cq, size_t n) {
  std::vector<ibv_wc> out;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (out.size() < n && std::chrono::steady_clock::now() < deadline) {
    ibv_wc wc[8];
    const int got = ibv_poll_cq(cq, 8, wc);
    out.insert(out.end(), wc, wc + got);
  }
  return out;
}

TEST(SrqVerbs, CreateQueryModifyDestroyAndDocumentedFailures) {
  Env e;
  ibv_device_attr da;
  ASSERT_EQ(ibv_query_device(e.ctx, &da), 0);
  EXPECT_TRUE(da.device_cap_flags & IBV_DEVICE_XRC);
  EXPECT_TRUE(da.device_cap_flags & IBV_DEVICE_SRQ_RESIZE);
  ibv_srq_init_attr_ex ex{};
  ex.attr.max_wr = 8;
  ex.attr.max_sge = 2;
  ex.comp_mask = IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_TYPE;
  ex.srq_type = IBV_SRQT_BASIC;
  ex.pd = e.pd;
  ibv_srq* srq = ibv_create_srq_ex(e.ctx, &ex);  // the inline routes a basic SRQ to ibv_create_srq
  ASSERT_NE(srq, nullptr);
  EXPECT_GE(ex.attr.max_wr, 8u);
  ibv_srq_attr q{};
  ASSERT_EQ(ibv_query_srq(srq, &q), 0);
  EXPECT_EQ(q.srq_limit, 0u);
  q.srq_limit = 4;
  ASSERT_EQ(ibv_modify_srq(srq, &q, IBV_SRQ_LIMIT), 0);
  ASSERT_EQ(ibv_query_srq(srq, &q), 0);
  EXPECT_EQ(q.srq_limit, 4u);
  q.max_wr = 32;
  ASSERT_EQ(ibv_modify_srq(srq, &q, IBV_SRQ_MAX_WR), 0);
  q.srq_limit = 1000;
  EXPECT_EQ(ibv_modify_srq(srq, &q, IBV_SRQ_LIMIT), EINVAL);  // above max_wr: nothing changes
  // ibv_create_qp(3) NOTES: a QP other than RC or UD on an SRQ fails.
  ibv_qp_init_attr qa{};
  qa.send_cq = qa.recv_cq = e.cq;
  qa.srq = srq;
  qa.cap = {4, 4, 1, 1, 0};
  qa.qp_type = IBV_QPT_UC;
  errno = 0;
  EXPECT_EQ(ibv_create_qp(e.pd, &qa), nullptr);
  EXPECT_EQ(errno, EINVAL);
  qa.qp_type = IBV_QPT_RC;
  qa.cap.max_recv_wr = 1u << 30;  // ignored on an SRQ
  ibv_qp* qp = ibv_create_qp(e.pd, &qa);
  ASSERT_NE(qp, nullptr);
  EXPECT_EQ(qp->srq, srq);
  // ibv_destroy_srq(3) NOTES: fails while a QP is associated with it.
  EXPECT_EQ(ibv_destroy_srq(srq), EBUSY);
  std::vector<uint8_t> buf(64);
  ibv_mr* mr = ibv_reg_mr(e.pd, buf.data(), buf.size(), IBV_ACCESS_LOCAL_WRITE);
  ibv_sge sge{reinterpret_cast<uintptr_t>(buf.data()), 64, mr->lkey};
  ibv_recv_wr wr{}, *bad = nullptr;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  EXPECT_EQ(ibv_post_recv(qp, &wr, &bad), EINVAL);  // its receives belong to the SRQ
  EXPECT_EQ(bad, &wr);
  ASSERT_EQ(ibv_destroy_qp(qp), 0);
  ASSERT_EQ(ibv_dereg_mr(mr), 0);
  EXPECT_EQ(ibv_destroy_srq(srq), 0);
  // Tag matching is not offered; an XRC SRQ needs its domain and CQ.
  ex.comp_mask = IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_TYPE;
  ex.srq_type = IBV_SRQT_TM;
  errno = 0;
  EXPECT_EQ(ibv_create_srq_ex(e.ctx, &ex), nullptr);
  EXPECT_EQ(errno, EOPNOTSUPP);
  ex.srq_type = IBV_SRQT_XRC;
  errno = 0;
  EXPECT_EQ(ibv_create_srq_ex(e.ctx, &ex), nullptr);
  EXPECT_EQ(errno, EINVAL);
}

TEST(SrqVerbs, RcOnSrqDeliversAndRaisesLimitEventOnAsyncFd) {
  Env e;
  ibv_srq* srq = BasicSrq(e);
  ASSERT_NE(srq, nullptr);
  ibv_qp* sender = RcQp(e, nullptr);
  ibv_qp* receiver = RcQp(e, srq);
  ASSERT_TRUE(sender && receiver);
  Connect(e, sender, receiver->qp_num);
  Connect(e, receiver, sender->qp_num);
  std::vector<uint8_t> buf(4096, 0x42);
  ibv_mr* mr = ibv_reg_mr(e.pd, buf.data(), buf.size(), IBV_ACCESS_LOCAL_WRITE);
  for (int i = 0; i < 4; ++i) ASSERT_EQ(PostSrq(srq, mr, 1024, 10 + i), 0);
  ibv_srq_attr q{};
  q.srq_limit = 3;
  ASSERT_EQ(ibv_modify_srq(srq, &q, IBV_SRQ_LIMIT), 0);
  for (int i = 0; i < 2; ++i) {
    ibv_sge sge{reinterpret_cast<uintptr_t>(buf.data()) + 2048, 100, mr->lkey};
    ibv_send_wr wr{}, *bad = nullptr;
    wr.wr_id = i;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_SEND;
    wr.send_flags = IBV_SEND_SIGNALED;
    ASSERT_EQ(ibv_post_send(sender, &wr, &bad), 0);
  }
  auto wcs = PollN(e.cq, 4);
  ASSERT_EQ(wcs.size(), 4u);
  int recvs = 0;
  for (const ibv_wc& wc : wcs) {
    EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
    if (wc.opcode == IBV_WC_RECV) {
      ++recvs;
      EXPECT_EQ(wc.qp_num, receiver->qp_num);
    }
  }
  EXPECT_EQ(recvs, 2);
  // Exactly one limit event, naming the SRQ.
  pollfd p{e.ctx->async_fd, POLLIN, 0};
  ASSERT_EQ(poll(&p, 1, 5000), 1);
  ibv_async_event ev;
  ASSERT_EQ(ibv_get_async_event(e.ctx, &ev), 0);
  EXPECT_EQ(ev.event_type, IBV_EVENT_SRQ_LIMIT_REACHED);
  EXPECT_EQ(ev.element.srq, srq);
  ibv_ack_async_event(&ev);
  EXPECT_EQ(poll(&p, 1, 0), 0);
  ASSERT_EQ(ibv_query_srq(srq, &q), 0);
  EXPECT_EQ(q.srq_limit, 0u);
  // The receiver entering the error state: LAST_WQE_REACHED.
  ibv_qp_attr err{};
  err.qp_state = IBV_QPS_ERR;
  ASSERT_EQ(ibv_modify_qp(receiver, &err, IBV_QP_STATE), 0);
  ASSERT_EQ(poll(&p, 1, 5000), 1);
  ASSERT_EQ(ibv_get_async_event(e.ctx, &ev), 0);
  EXPECT_EQ(ev.event_type, IBV_EVENT_QP_LAST_WQE_REACHED);
  EXPECT_EQ(ev.element.qp, receiver);
  ibv_ack_async_event(&ev);
  ASSERT_EQ(ibv_destroy_qp(sender), 0);
  ASSERT_EQ(ibv_destroy_qp(receiver), 0);
  ASSERT_EQ(ibv_destroy_srq(srq), 0);
  ASSERT_EQ(ibv_dereg_mr(mr), 0);
}

// ibv_get_async_event(3): destroying a QP withdraws its events not yet read, and waits until those read have been
// acknowledged (the application may still be handling one; the kernel and rdma-core do the same). UCX's async thread
// handles LAST_WQE_REACHED while its endpoints are destroyed.
TEST(SrqVerbs, DestroyingAQpWithdrawsItsUnreadEventsAndWaitsForTheAcknowledgementOfTheRead) {
  Env e;
  ibv_srq* srq = BasicSrq(e);
  ASSERT_NE(srq, nullptr);
  ibv_qp* a = RcQp(e, srq);
  ibv_qp* b = RcQp(e, srq);
  ASSERT_TRUE(a && b);
  Connect(e, a, b->qp_num);
  Connect(e, b, a->qp_num);
  ibv_qp_attr err{};
  err.qp_state = IBV_QPS_ERR;
  ASSERT_EQ(ibv_modify_qp(a, &err, IBV_QP_STATE), 0);  // LAST_WQE_REACHED for a, then for b
  ASSERT_EQ(ibv_modify_qp(b, &err, IBV_QP_STATE), 0);
  ASSERT_EQ(ibv_destroy_qp(a), 0);  // a's event, unread, goes with it: nothing to wait for
  const int flags = fcntl(e.ctx->async_fd, F_GETFL);
  ASSERT_EQ(fcntl(e.ctx->async_fd, F_SETFL, flags | O_NONBLOCK), 0);
  ibv_async_event ev{};
  ASSERT_EQ(ibv_get_async_event(e.ctx, &ev), 0);
  EXPECT_EQ(ev.event_type, IBV_EVENT_QP_LAST_WQE_REACHED);
  EXPECT_EQ(ev.element.qp, b);
  EXPECT_EQ(ibv_get_async_event(e.ctx, &ev), -1);  // a's is not handed out after its QP
  EXPECT_EQ(errno, EAGAIN);
  // b's event is in the application's hands: its destroy waits for the acknowledgement (under ASan, a destroy that
  // freed b at once would make the acknowledgement below a use after free).
  std::atomic<bool> destroyed{false};
  std::thread destroyer([&] {
    EXPECT_EQ(ibv_destroy_qp(b), 0);
    destroyed = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_FALSE(destroyed.load());
  ibv_ack_async_event(&ev);
  destroyer.join();
  EXPECT_TRUE(destroyed.load());
  ASSERT_EQ(fcntl(e.ctx->async_fd, F_SETFL, flags), 0);
  ASSERT_EQ(ibv_destroy_srq(srq), 0);
}

std::string TempFile() {
  const char* dir = getenv("TEST_TMPDIR");
  std::string path = std::string(dir ? dir : "/tmp") + "/xrcd_XXXXXX";
  int fd = mkstemp(path.data());
  close(fd);
  return path;
}

TEST(XrcVerbs, OpenXrcdFollowsFdAndOflags) {
  Env e;
  const std::string path = TempFile();
  int fd = open(path.c_str(), O_RDONLY);
  int fd2 = open(path.c_str(), O_RDONLY);  // another fd, same inode
  ASSERT_GE(fd, 0);
  ibv_xrcd_init_attr a{};
  a.comp_mask = IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS;
  a.fd = fd;
  a.oflags = 0;
  errno = 0;
  EXPECT_EQ(ibv_open_xrcd(e.ctx, &a), nullptr);  // no domain yet and no O_CREAT
  EXPECT_EQ(errno, EAGAIN);
  a.oflags = O_CREAT;
  ibv_xrcd* x1 = ibv_open_xrcd(e.ctx, &a);
  ASSERT_NE(x1, nullptr);
  a.fd = fd2;
  a.oflags = O_CREAT | O_EXCL;
  errno = 0;
  EXPECT_EQ(ibv_open_xrcd(e.ctx, &a), nullptr);  // it exists
  EXPECT_EQ(errno, EINVAL);
  a.oflags = 0;
  ibv_xrcd* x2 = ibv_open_xrcd(e.ctx, &a);  // the same inode: the same domain, another reference
  ASSERT_NE(x2, nullptr);
  a.fd = 12345;
  errno = 0;
  EXPECT_EQ(ibv_open_xrcd(e.ctx, &a), nullptr);
  EXPECT_EQ(errno, EBADF);
  a.fd = -1;
  a.oflags = O_CREAT;
  ibv_xrcd* priv = ibv_open_xrcd(e.ctx, &a);
  ASSERT_NE(priv, nullptr);
  // An SRQ of the domain keeps the last reference from closing it.
  ibv_srq_init_attr_ex sx{};
  sx.attr.max_wr = 4;
  sx.attr.max_sge = 1;
  sx.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_XRCD | IBV_SRQ_INIT_ATTR_CQ | IBV_SRQ_INIT_ATTR_PD;
  sx.srq_type = IBV_SRQT_XRC;
  sx.xrcd = x1;
  sx.cq = e.cq;
  sx.pd = e.pd;
  ibv_srq* srq = ibv_create_srq_ex(e.ctx, &sx);
  ASSERT_NE(srq, nullptr);
  uint32_t srqn = 0;
  ASSERT_EQ(ibv_get_srq_num(srq, &srqn), 0);
  EXPECT_NE(srqn, 0u);
  EXPECT_EQ(ibv_close_xrcd(x2), 0);
  EXPECT_EQ(ibv_close_xrcd(x1), EBUSY);
  ASSERT_EQ(ibv_destroy_srq(srq), 0);
  EXPECT_EQ(ibv_close_xrcd(x1), 0);
  EXPECT_EQ(ibv_close_xrcd(priv), 0);
  close(fd);
  close(fd2);
  unlink(path.c_str());
}

TEST(XrcVerbs, SendThroughTargetIntoSharedSrqAndOpenQpReferences) {
  Env e;
  ibv_xrcd_init_attr xa{};
  xa.comp_mask = IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS;
  xa.fd = -1;
  xa.oflags = O_CREAT;
  ibv_xrcd* xrcd = ibv_open_xrcd(e.ctx, &xa);
  ASSERT_NE(xrcd, nullptr);
  ibv_cq* rcq = ibv_create_cq(e.ctx, 64, nullptr, nullptr, 0);
  ibv_srq_init_attr_ex sx{};
  sx.attr.max_wr = 16;
  sx.attr.max_sge = 1;
  sx.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_XRCD | IBV_SRQ_INIT_ATTR_CQ | IBV_SRQ_INIT_ATTR_PD;
  sx.srq_type = IBV_SRQT_XRC;
  sx.xrcd = xrcd;
  sx.cq = rcq;
  sx.pd = e.pd;
  ibv_srq* srq = ibv_create_srq_ex(e.ctx, &sx);
  ASSERT_NE(srq, nullptr);
  // The target through ibv_create_qp_ex (comp_mask XRCD); the initiator through the inline's ibv_create_qp route.
  ibv_qp_init_attr_ex tx{};
  tx.qp_type = IBV_QPT_XRC_RECV;
  tx.comp_mask = IBV_QP_INIT_ATTR_XRCD;
  tx.xrcd = xrcd;
  ibv_qp* tgt = ibv_create_qp_ex(e.ctx, &tx);
  ASSERT_NE(tgt, nullptr);
  EXPECT_EQ(tgt->send_cq, nullptr);
  EXPECT_EQ(tgt->recv_cq, nullptr);
  ibv_qp_init_attr_ex ix{};
  ix.qp_type = IBV_QPT_XRC_SEND;
  ix.send_cq = e.cq;
  ix.cap.max_send_wr = 8;
  ix.cap.max_send_sge = 1;
  ix.comp_mask = IBV_QP_INIT_ATTR_PD;
  ix.pd = e.pd;
  ibv_qp* ini = ibv_create_qp_ex(e.ctx, &ix);
  ASSERT_NE(ini, nullptr);
  Connect(e, ini, tgt->qp_num);
  Connect(e, tgt, ini->qp_num);
  std::vector<uint8_t> buf(4096, 0);
  ibv_mr* mr = ibv_reg_mr(e.pd, buf.data(), buf.size(), IBV_ACCESS_LOCAL_WRITE);
  ASSERT_EQ(PostSrq(srq, mr, 1024, 99), 0);
  for (int i = 0; i < 100; ++i) buf[2048 + i] = static_cast<uint8_t>(i);
  uint32_t srqn = 0;
  ASSERT_EQ(ibv_get_srq_num(srq, &srqn), 0);
  ibv_sge sge{reinterpret_cast<uintptr_t>(buf.data()) + 2048, 100, mr->lkey};
  ibv_send_wr wr{}, *bad = nullptr;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_SEND;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.qp_type.xrc.remote_srqn = srqn;
  ASSERT_EQ(ibv_post_send(ini, &wr, &bad), 0);
  auto got = PollN(rcq, 1);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(got[0].wr_id, 99u);
  EXPECT_EQ(got[0].qp_num, tgt->qp_num);  // the target QP's number, on the SRQ's CQ
  EXPECT_EQ(got[0].byte_len, 100u);
  EXPECT_EQ(buf[99], 99);
  ASSERT_EQ(PollN(e.cq, 1).size(), 1u);

  // ibv_open_qp(3): a missing number or a wrong type fails; each open is a reference.
  ibv_qp_open_attr oa{};
  oa.comp_mask = IBV_QP_OPEN_ATTR_NUM | IBV_QP_OPEN_ATTR_XRCD | IBV_QP_OPEN_ATTR_TYPE;
  oa.xrcd = xrcd;
  oa.qp_type = IBV_QPT_XRC_RECV;
  oa.qp_num = ini->qp_num;  // exists, but is no target of this domain
  errno = 0;
  EXPECT_EQ(ibv_open_qp(e.ctx, &oa), nullptr);
  EXPECT_EQ(errno, EINVAL);
  oa.qp_num = tgt->qp_num;
  oa.qp_type = IBV_QPT_RC;
  errno = 0;
  EXPECT_EQ(ibv_open_qp(e.ctx, &oa), nullptr);
  EXPECT_EQ(errno, EINVAL);
  oa.qp_type = IBV_QPT_XRC_RECV;
  ibv_qp* opened = ibv_open_qp(e.ctx, &oa);
  ASSERT_NE(opened, nullptr);
  EXPECT_EQ(opened->qp_num, tgt->qp_num);
  EXPECT_EQ(opened->state, IBV_QPS_RTS);
  const uint32_t qpn = tgt->qp_num;
  ASSERT_EQ(ibv_destroy_qp(tgt), 0);  // the creator lets go; the opened handle keeps the QP
  ibv_qp_attr qattr;
  ibv_qp_init_attr qinit;
  ASSERT_EQ(ibv_query_qp(opened, &qattr, IBV_QP_STATE, &qinit), 0);
  EXPECT_EQ(qattr.qp_state, IBV_QPS_RTS);
  EXPECT_EQ(ibv_close_xrcd(xrcd), EBUSY);
  ASSERT_EQ(ibv_destroy_qp(opened), 0);  // the last reference
  oa.qp_num = qpn;
  errno = 0;
  EXPECT_EQ(ibv_open_qp(e.ctx, &oa), nullptr);
  EXPECT_EQ(errno, EINVAL);
  ASSERT_EQ(ibv_destroy_qp(ini), 0);
  ASSERT_EQ(ibv_destroy_srq(srq), 0);
  ASSERT_EQ(ibv_close_xrcd(xrcd), 0);
  ASSERT_EQ(ibv_destroy_cq(rcq), 0);
  ASSERT_EQ(ibv_dereg_mr(mr), 0);
}

}  // namespace
