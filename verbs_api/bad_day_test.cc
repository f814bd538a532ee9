// What a real device survives without a crash, a hang or unbounded memory (issue "no crash on a bad day"): an
// async-event queue nobody reads, an allocation the system refuses (ENOMEM, never an exception through the C ABI),
// and a process that exits with its device open and a packet in flight.
#include <infiniband/verbs.h>
#include <gtest/gtest.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <functional>
#include <string>
#include <thread>

#include "verbs_api/internal.h"
#include "verbs_api/verbs_test_env.h"

namespace uroce::verbs {
namespace {

using testing::VerbsEnv;

TEST(BadDay, UnreadAsyncEventsAreBoundedAndCounted) {
  EventQueue<ibv_async_event> q;
  ASSERT_EQ(q.Open(), 0);
  ibv_async_event ev{};
  ev.event_type = IBV_EVENT_COMM_EST;
  for (size_t i = 0; i < EventQueue<ibv_async_event>::kCapacity; ++i) ASSERT_TRUE(q.Push(ev));
  EXPECT_FALSE(q.Push(ev));
  EXPECT_FALSE(q.Push(ev));
  EXPECT_EQ(q.dropped(), 2u);
  // Every queued event is still delivered, then the fd is empty.
  ASSERT_EQ(fcntl(q.fd(), F_SETFL, fcntl(q.fd(), F_GETFL) | O_NONBLOCK), 0);
  size_t delivered = 0;
  ibv_async_event out{};
  while (q.Pop(&out) == 0) ++delivered;
  EXPECT_EQ(delivered, EventQueue<ibv_async_event>::kCapacity);
  EXPECT_EQ(q.Pop(&out), EAGAIN);
  q.Close();
}

// Runs `child` in a forked process (which opens its own device) and returns its wait status; a child still running
// after `limit` is killed, so a hang is a failure, never a hung test.
int RunChild(const std::function<int()>& child, std::chrono::seconds limit) {
  const pid_t pid = fork();
  if (pid == 0) _exit(child());
  if (pid < 0) return -1;
  const auto deadline = std::chrono::steady_clock::now() + limit;
  int status = 0;
  while (waitpid(pid, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      ADD_FAILURE() << "the child hung";
      return status;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return status;
}

uint64_t VirtualMemoryBytes() {
  std::ifstream in("/proc/self/status");
  std::string key;
  uint64_t kb = 0;
  while (in >> key) {
    if (key == "VmSize:") {
      in >> kb;
      return kb * 1024;
    }
  }
  return 0;
}

TEST(BadDay, RefusedAllocationIsEnomemNotAnAbort) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "the sanitizers reserve their shadow memory: an address-space limit cannot be set under them";
#endif
  const int status = RunChild(
      [] {
        VerbsEnv e;
        if (e.ctx == nullptr) return 10;
        // Leave 32 MiB of address space: a CQ of 1M entries needs more than that.
        const rlimit limit{VirtualMemoryBytes() + (32u << 20), RLIM_INFINITY};
        if (setrlimit(RLIMIT_AS, &limit) != 0) return 11;
        errno = 0;
        ibv_cq* cq = ibv_create_cq(e.ctx, 1048575, nullptr, nullptr, 0);
        if (cq != nullptr) return 12;
        if (errno != ENOMEM) return 13;
        // The device still works afterwards.
        ibv_cq* small = ibv_create_cq(e.ctx, 16, nullptr, nullptr, 0);
        if (small == nullptr || ibv_destroy_cq(small) != 0) return 14;
        return 0;
      },
      std::chrono::seconds(60));
  ASSERT_TRUE(WIFEXITED(status)) << "killed by signal " << (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

TEST(BadDay, ProcessExitingWithItsDeviceOpenAndAPacketInFlightExitsCleanly) {
#if defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "ThreadSanitizer cannot start threads in the child of a multi-threaded fork";
#endif
  const int status = RunChild(
      [] {
        ibv_device** list = ibv_get_device_list(nullptr);
        ibv_context* ctx = list && list[0] ? ibv_open_device(list[0]) : nullptr;
        if (list) ibv_free_device_list(list);
        if (ctx == nullptr) return 10;
        ibv_pd* pd = ibv_alloc_pd(ctx);
        ibv_cq* cq = ibv_create_cq(ctx, 16, nullptr, nullptr, 0);
        static char buf[4096];
        ibv_mr* mr = ibv_reg_mr(pd, buf, sizeof buf, IBV_ACCESS_LOCAL_WRITE);
        ibv_qp_init_attr init{};
        init.send_cq = init.recv_cq = cq;
        init.qp_type = IBV_QPT_UD;
        init.cap = {4, 4, 1, 1, 0};
        ibv_qp* qp = pd && cq && mr ? ibv_create_qp(pd, &init) : nullptr;
        if (qp == nullptr) return 11;
        ibv_qp_attr a{};
        a.qp_state = IBV_QPS_INIT;
        a.port_num = 1;
        a.qkey = 0x11111111;
        if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY)) return 12;
        a.qp_state = IBV_QPS_RTR;
        if (ibv_modify_qp(qp, &a, IBV_QP_STATE)) return 13;
        a.qp_state = IBV_QPS_RTS;
        if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN)) return 14;
        ibv_sge sge{reinterpret_cast<uintptr_t>(buf), 64, mr->lkey};
        ibv_recv_wr rwr{};
        rwr.sg_list = &sge;
        rwr.num_sge = 1;
        ibv_recv_wr* bad_r = nullptr;
        if (ibv_post_recv(qp, &rwr, &bad_r)) return 15;
        ibv_gid gid{};
        ibv_query_gid(ctx, 1, 0, &gid);
        ibv_ah_attr ah_attr{};
        ah_attr.is_global = 1;
        ah_attr.grh.dgid = gid;
        ah_attr.port_num = 1;
        ibv_ah* ah = ibv_create_ah(pd, &ah_attr);
        if (ah == nullptr) return 16;
        ibv_send_wr wr{};
        wr.opcode = IBV_WR_SEND;
        wr.send_flags = IBV_SEND_SIGNALED;
        wr.sg_list = &sge;
        wr.num_sge = 1;
        wr.wr.ud = {ah, qp->qp_num, 0x11111111};
        ibv_send_wr* bad = nullptr;
        if (ibv_post_send(qp, &wr, &bad)) return 17;
        exit(0);  // no destroy, no close: the library must not crash or hang on the way out
      },
      std::chrono::seconds(30));
  ASSERT_TRUE(WIFEXITED(status)) << "killed by signal " << (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

}  // namespace
}  // namespace uroce::verbs
