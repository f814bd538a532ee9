// The verbs API end to end inside one process: two UD QPs on the real engine (io_uring UDP on this process's
// loopback address) exchange datagrams; completion channels, solicited-only arming, ibv_cq_ex with timestamps, CQ
// overrun as an async event, and a forked child opening its own device.
#include <gtest/gtest.h>
#include <infiniband/verbs.h>
#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <vector>

#include "verbs_api/verbs_test_env.h"

namespace {

constexpr uint32_t kQkey = 0x1234;

using Env = uroce::verbs::testing::VerbsEnv;

ibv_qp* UdQp(Env& e, ibv_cq* cq) {
  ibv_qp_init_attr init{};
  init.send_cq = init.recv_cq = cq;
  init.qp_type = IBV_QPT_UD;
  init.cap = {16, 16, 1, 1, 64};
  ibv_qp* qp = ibv_create_qp(e.pd, &init);
  if (!qp) return nullptr;
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.port_num = 1;
  a.qkey = kQkey;
  if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY)) return nullptr;
  a.qp_state = IBV_QPS_RTR;
  if (ibv_modify_qp(qp, &a, IBV_QP_STATE)) return nullptr;
  a.qp_state = IBV_QPS_RTS;
  a.sq_psn = 1;
  if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN)) return nullptr;
  return qp;
}

// Polls until n completions arrived or 5 s passed.
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

void SendUd(Env& e, ibv_qp* from, ibv_ah* ah, uint32_t to_qpn, ibv_mr* mr, uint32_t len, unsigned flags) {
  ibv_sge sge{reinterpret_cast<uintptr_t>(mr->addr), len, mr->lkey};
  ibv_send_wr wr{}, *bad = nullptr;
  wr.wr_id = 1;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_SEND;
  wr.send_flags = flags;
  wr.wr.ud.ah = ah;
  wr.wr.ud.remote_qpn = to_qpn;
  wr.wr.ud.remote_qkey = kQkey;
  ASSERT_EQ(ibv_post_send(from, &wr, &bad), 0);
}

void PostRecv(ibv_qp* qp, ibv_mr* mr, uint32_t len, uint64_t id) {
  ibv_sge sge{reinterpret_cast<uintptr_t>(mr->addr), len, mr->lkey};
  ibv_recv_wr wr{}, *bad = nullptr;
  wr.wr_id = id;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  ASSERT_EQ(ibv_post_recv(qp, &wr, &bad), 0);
}

ibv_ah* AhTo(Env& e) {
  ibv_ah_attr ah{};
  ah.is_global = 1;
  ah.grh.dgid = e.gid;
  ah.grh.hop_limit = 64;
  ah.port_num = 1;
  return ibv_create_ah(e.pd, &ah);
}

TEST(VerbsLoopback, UdDatagramWakesCompletionChannelAndReadsBackThroughCqEx) {
  Env e;
  ibv_comp_channel* ch = ibv_create_comp_channel(e.ctx);
  ASSERT_NE(ch, nullptr);
  ibv_cq_init_attr_ex cqa{};
  cqa.cqe = 16;
  cqa.channel = ch;
  cqa.wc_flags = IBV_WC_STANDARD_FLAGS | IBV_WC_EX_WITH_COMPLETION_TIMESTAMP;
  ibv_cq_ex* rcq = ibv_create_cq_ex(e.ctx, &cqa);
  ASSERT_NE(rcq, nullptr);
  ibv_cq* scq = ibv_create_cq(e.ctx, 16, nullptr, nullptr, 0);
  ibv_qp* a = UdQp(e, scq);
  ibv_qp* b = UdQp(e, ibv_cq_ex_to_cq(rcq));
  ASSERT_TRUE(a && b);
  std::vector<uint8_t> src(512, 0x5a), dst(40 + 512, 0);
  ibv_mr* smr = ibv_reg_mr(e.pd, src.data(), src.size(), IBV_ACCESS_LOCAL_WRITE);
  ibv_mr* dmr = ibv_reg_mr(e.pd, dst.data(), dst.size(), IBV_ACCESS_LOCAL_WRITE);
  ibv_ah* ah = AhTo(e);
  ASSERT_NE(ah, nullptr);
  PostRecv(b, dmr, 40 + 512, 77);
  ASSERT_EQ(ibv_req_notify_cq(ibv_cq_ex_to_cq(rcq), 0), 0);
  SendUd(e, a, ah, b->qp_num, smr, 512, IBV_SEND_SIGNALED);

  pollfd pfd{ch->fd, POLLIN, 0};
  ASSERT_EQ(poll(&pfd, 1, 5000), 1) << "completion channel never became readable";
  ibv_cq* ev_cq = nullptr;
  void* ev_ctx = nullptr;
  ASSERT_EQ(ibv_get_cq_event(ch, &ev_cq, &ev_ctx), 0);
  EXPECT_EQ(ev_cq, ibv_cq_ex_to_cq(rcq));
  ibv_ack_cq_events(ev_cq, 1);

  ibv_poll_cq_attr pa{};
  ASSERT_EQ(ibv_start_poll(rcq, &pa), 0);
  EXPECT_EQ(rcq->status, IBV_WC_SUCCESS);
  EXPECT_EQ(rcq->wr_id, 77u);
  EXPECT_EQ(ibv_wc_read_opcode(rcq), IBV_WC_RECV);
  EXPECT_EQ(ibv_wc_read_byte_len(rcq), 40u + 512u);
  EXPECT_EQ(ibv_wc_read_src_qp(rcq), a->qp_num);
  EXPECT_TRUE(ibv_wc_read_wc_flags(rcq) & IBV_WC_GRH);
  EXPECT_GT(ibv_wc_read_completion_ts(rcq), 0u);
  EXPECT_EQ(ibv_next_poll(rcq), ENOENT);
  ibv_end_poll(rcq);
  EXPECT_EQ(0, std::memcmp(dst.data() + 40, src.data(), 512));
  auto s = PollN(scq, 1);
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].status, IBV_WC_SUCCESS);

  // The reply address built from the receive's GRH points back at us.
  ibv_wc wc{};
  wc.wc_flags = IBV_WC_GRH;
  ibv_ah_attr back{};
  ASSERT_EQ(ibv_init_ah_from_wc(e.ctx, 1, &wc, reinterpret_cast<ibv_grh*>(dst.data()), &back), 0);
  EXPECT_EQ(0, std::memcmp(back.grh.dgid.raw, e.gid.raw, 16));

  // A CQ with a channel attached cannot lose it while in use.
  EXPECT_EQ(ibv_destroy_comp_channel(ch), EBUSY);
  ibv_destroy_ah(ah);
  ibv_destroy_qp(a);
  ibv_destroy_qp(b);
  ibv_dereg_mr(smr);
  ibv_dereg_mr(dmr);
  ibv_destroy_cq(scq);
  ibv_destroy_cq(ibv_cq_ex_to_cq(rcq));
  EXPECT_EQ(ibv_destroy_comp_channel(ch), 0);
}

TEST(VerbsLoopback, CqOverrunRaisesCqErrAsyncEvent) {
  Env e;
  ibv_cq* cq = ibv_create_cq(e.ctx, 2, nullptr, nullptr, 0);
  ibv_qp* a = UdQp(e, cq);
  ASSERT_NE(a, nullptr);
  std::vector<uint8_t> src(16);
  ibv_mr* mr = ibv_reg_mr(e.pd, src.data(), src.size(), IBV_ACCESS_LOCAL_WRITE);
  ibv_ah* ah = AhTo(e);
  for (int i = 0; i < 4; ++i) SendUd(e, a, ah, 0xffffff, mr, 16, IBV_SEND_SIGNALED);
  pollfd pfd{e.ctx->async_fd, POLLIN, 0};
  ASSERT_EQ(poll(&pfd, 1, 5000), 1);
  ibv_async_event ev{};
  ASSERT_EQ(ibv_get_async_event(e.ctx, &ev), 0);
  EXPECT_EQ(ev.event_type, IBV_EVENT_CQ_ERR);
  EXPECT_EQ(ev.element.cq, cq);
  ibv_ack_async_event(&ev);
  EXPECT_EQ(cq->async_events_completed, 1u);
  ibv_destroy_ah(ah);
  ibv_destroy_qp(a);
  ibv_dereg_mr(mr);
  EXPECT_EQ(ibv_destroy_cq(cq), 0);
}

// ibv_get_cq_event(3): destroying a CQ withdraws its completion events not yet read from its channel, so that
// nobody is handed a CQ that is gone.
TEST(VerbsLoopback, DestroyingACqWithdrawsItsUnreadCompletionEvents) {
  Env e;
  ibv_comp_channel* ch = ibv_create_comp_channel(e.ctx);
  ASSERT_NE(ch, nullptr);
  ibv_cq* cq = ibv_create_cq(e.ctx, 16, nullptr, ch, 0);
  ibv_qp* a = UdQp(e, cq);
  ASSERT_NE(a, nullptr);
  std::vector<uint8_t> src(16);
  ibv_mr* mr = ibv_reg_mr(e.pd, src.data(), src.size(), IBV_ACCESS_LOCAL_WRITE);
  ibv_ah* ah = AhTo(e);
  ASSERT_EQ(ibv_req_notify_cq(cq, 0), 0);
  SendUd(e, a, ah, 0xffffff, mr, 16, IBV_SEND_SIGNALED);  // its completion raises the event
  pollfd pfd{ch->fd, POLLIN, 0};
  ASSERT_EQ(poll(&pfd, 1, 5000), 1);
  ibv_destroy_ah(ah);
  ASSERT_EQ(ibv_destroy_qp(a), 0);
  ASSERT_EQ(ibv_destroy_cq(cq), 0);  // the event was never read: nothing to wait for
  ASSERT_EQ(fcntl(ch->fd, F_SETFL, fcntl(ch->fd, F_GETFL) | O_NONBLOCK), 0);
  ibv_cq* got = nullptr;
  void* context = nullptr;
  EXPECT_EQ(ibv_get_cq_event(ch, &got, &context), -1);
  EXPECT_EQ(errno, EAGAIN);
  ibv_dereg_mr(mr);
  EXPECT_EQ(ibv_destroy_comp_channel(ch), 0);
}

TEST(VerbsLoopback, DestroyingABusyCqOrPdIsEbusy) {
  Env e;
  ibv_cq* cq = ibv_create_cq(e.ctx, 4, nullptr, nullptr, 0);
  ibv_qp* qp = UdQp(e, cq);
  ASSERT_NE(qp, nullptr);
  EXPECT_EQ(ibv_destroy_cq(cq), EBUSY);
  EXPECT_EQ(ibv_dealloc_pd(e.pd), EBUSY);
  EXPECT_EQ(ibv_destroy_qp(qp), 0);
  EXPECT_EQ(ibv_destroy_cq(cq), 0);
}

// IBVERBS_PRIVATE_34 (rdma-core's driver.h): ibv_devinfo asks each GID slot's type.
extern "C" int ibv_query_gid_type(ibv_context* context, uint8_t port_num, unsigned int index, int* type);

// The port lists a GID table larger than its one address, as rxe and NICs do: slot 0 holds the address, the other
// slots are empty (zero GID and RoCE v1 through the old calls, which rdma-core keeps for empty entries; ENODATA through
// ibv_query_gid_ex), and an index past the table is an error everywhere.
TEST(VerbsLoopback, GidTableHasTheAddressThenEmptySlots) {
  Env e;
  ibv_port_attr port{};
  ASSERT_EQ(ibv_query_port(e.ctx, 1, &port), 0);
  ASSERT_GT(port.gid_tbl_len, 1);
  ibv_gid_entry entry{};
  ASSERT_EQ(ibv_query_gid_ex(e.ctx, 1, 0, &entry, 0), 0);
  EXPECT_EQ(0, std::memcmp(entry.gid.raw, e.gid.raw, 16));
  EXPECT_EQ(entry.gid_type, IBV_GID_TYPE_ROCE_V2);
  int type = -1;
  EXPECT_EQ(ibv_query_gid_type(e.ctx, 1, 0, &type), 0);
  EXPECT_EQ(type, 1);  // RoCE v2
  const int last = port.gid_tbl_len - 1;
  for (int index : {1, last}) {
    EXPECT_EQ(ibv_query_gid_ex(e.ctx, 1, index, &entry, 0), ENODATA) << index;
    ibv_gid gid;
    std::memset(gid.raw, 0xff, sizeof gid.raw);
    EXPECT_EQ(ibv_query_gid(e.ctx, 1, index, &gid), 0) << index;
    EXPECT_EQ(gid.global.subnet_prefix | gid.global.interface_id, 0u) << index;
    EXPECT_EQ(ibv_query_gid_type(e.ctx, 1, index, &type), 0) << index;
    EXPECT_EQ(type, 0) << index;
  }
  ibv_gid gid;
  EXPECT_EQ(ibv_query_gid_ex(e.ctx, 1, port.gid_tbl_len, &entry, 0), EINVAL);
  EXPECT_EQ(ibv_query_gid(e.ctx, 1, port.gid_tbl_len, &gid), -1);
  EXPECT_EQ(ibv_query_gid_type(e.ctx, 1, port.gid_tbl_len, &type), -1);
  // ibv_query_gid_table lists the populated entry only.
  ibv_gid_entry table[32];
  EXPECT_EQ(ibv_query_gid_table(e.ctx, table, 32, 0), 1);
  // An empty slot cannot be a source GID.
  ibv_ah_attr ah{};
  ah.is_global = 1;
  ah.grh.dgid = e.gid;
  ah.grh.sgid_index = 1;
  ah.port_num = 1;
  errno = 0;
  EXPECT_EQ(ibv_create_ah(e.pd, &ah), nullptr);
  EXPECT_EQ(errno, EINVAL);
}

// Descriptors open in this process (the engine receives each multicast group on a socket of its own).
int OpenDescriptors() {
  int n = 0;
  if (DIR* dir = opendir("/proc/self/fd")) {
    while (readdir(dir) != nullptr) ++n;
    closedir(dir);
  }
  return n;
}

// Waits up to 5 s for the engine to close what it no longer receives (its multicast thread closes a group's socket).
bool DescriptorsBackTo(int expected) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (OpenDescriptors() != expected) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    usleep(1000);
  }
  return true;
}

// ibv_query_device reports the multicast limits and memory windows the device has (pyverbs skips its multicast
// tests when max_mcast_grp is 0, and leaves MW_BIND out of its access-flag tests without IBV_DEVICE_MEM_WINDOW); the
// network side follows the attachments: attaching a QP twice is one attachment, and a QP destroyed while attached
// is detached, as the kernel's uverbs does, so the group's socket closes.
TEST(VerbsLoopback, MulticastLimitsReportedAndAttachmentsLeftWithTheirQp) {
  Env e;
  ibv_device_attr attr{};
  ASSERT_EQ(ibv_query_device(e.ctx, &attr), 0);
  EXPECT_GT(attr.max_mcast_grp, 0);
  EXPECT_GT(attr.max_mcast_qp_attach, 0);
  EXPECT_GE(attr.max_total_mcast_qp_attach, attr.max_mcast_grp);
  EXPECT_TRUE(attr.device_cap_flags & IBV_DEVICE_MEM_WINDOW);
  EXPECT_TRUE(attr.device_cap_flags & IBV_DEVICE_MEM_WINDOW_TYPE_2B);
  ibv_cq* cq = ibv_create_cq(e.ctx, 16, nullptr, nullptr, 0);
  ibv_qp* qp = UdQp(e, cq);
  ASSERT_NE(qp, nullptr);
  ibv_gid group{};
  group.raw[10] = group.raw[11] = 0xff;  // ::ffff:239.77.x.y, x.y from our pid (tests run in parallel)
  group.raw[12] = 239;
  group.raw[13] = 77;
  group.raw[14] = static_cast<uint8_t>(getpid() >> 8);
  group.raw[15] = static_cast<uint8_t>(getpid());
  ASSERT_EQ(ibv_attach_mcast(qp, &group, 0), 0);
  const int joined = OpenDescriptors();  // the group's socket (and, the first time, the multicast thread's eventfd)
  ASSERT_EQ(ibv_attach_mcast(qp, &group, 0), 0);
  EXPECT_EQ(OpenDescriptors(), joined);
  ASSERT_EQ(ibv_detach_mcast(qp, &group, 0), 0);
  EXPECT_EQ(ibv_detach_mcast(qp, &group, 0), EINVAL);  // the second attach was the same attachment
  EXPECT_TRUE(DescriptorsBackTo(joined - 1));  // the group's socket closed with its one attachment
  ASSERT_EQ(ibv_attach_mcast(qp, &group, 0), 0);
  EXPECT_EQ(OpenDescriptors(), joined);
  ASSERT_EQ(ibv_destroy_qp(qp), 0);
  EXPECT_TRUE(DescriptorsBackTo(joined - 1));
  EXPECT_EQ(ibv_destroy_cq(cq), 0);
}

TEST(VerbsLoopback, ForkedChildOpensItsOwnDevice) {
#if defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "ThreadSanitizer cannot start threads in the child of a multi-threaded fork";
#endif
  Env parent;
  int pipefd[2];
  ASSERT_EQ(pipe(pipefd), 0);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    close(pipefd[0]);
    ibv_device** list = ibv_get_device_list(nullptr);
    ibv_context* ctx = list ? ibv_open_device(list[0]) : nullptr;
    ibv_gid gid{};
    const bool ok = ctx && ibv_query_gid(ctx, 1, 0, &gid) == 0 && ibv_alloc_pd(ctx) != nullptr;
    if (ok) (void)!write(pipefd[1], gid.raw, 16);
    _exit(ok ? 0 : 1);
  }
  close(pipefd[1]);
  uint8_t child_gid[16] = {};
  const ssize_t n = read(pipefd[0], child_gid, 16);
  int status = 0;
  waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  ASSERT_EQ(n, 16);
  // The child's engine is a new one, on its own address.
  EXPECT_NE(0, std::memcmp(child_gid, parent.gid.raw, 16));
}

}  // namespace
