// What a real device survives without a crash, a hang or unbounded memory (issue "no crash on a bad day"): an
// async-event queue nobody reads, an allocation the system refuses (ENOMEM, never an exception through the C ABI),
// and a process that exits with its device open and a packet in flight.
#include <infiniband/verbs.h>
#include <gtest/gtest.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
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

// A work request whose num_sge exceeds the QP's (or SRQ's) capacity is EINVAL, decided before sg_list is read: the
// caller's one-entry array ends at a guard page here, so reading a second entry would crash the test.
TEST(BadDay, MoreSgesThanTheQueueTakesIsEinvalBeforeTheListIsRead) {
  VerbsEnv env;
  ASSERT_NE(env.ctx, nullptr);
  const size_t page = size_t(sysconf(_SC_PAGESIZE));
  auto* pages = static_cast<uint8_t*>(mmap(nullptr, 2 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  ASSERT_NE(pages, MAP_FAILED);
  ASSERT_EQ(mprotect(pages + page, page, PROT_NONE), 0);
  static char buf[64];
  ibv_mr* mr = ibv_reg_mr(env.pd, buf, sizeof buf, IBV_ACCESS_LOCAL_WRITE);
  ASSERT_NE(mr, nullptr);
  auto* sge = reinterpret_cast<ibv_sge*>(pages + page - sizeof(ibv_sge));  // the last entry before the guard page
  *sge = ibv_sge{reinterpret_cast<uintptr_t>(buf), 8, mr->lkey};
  ibv_cq* cq = ibv_create_cq(env.ctx, 8, nullptr, nullptr, 0);
  ASSERT_NE(cq, nullptr);
  ibv_qp_init_attr init{};
  init.send_cq = init.recv_cq = cq;
  init.qp_type = IBV_QPT_RC;
  init.cap = {4, 4, 1, 1, 0};
  ibv_qp* qp = ibv_create_qp(env.pd, &init);
  ASSERT_NE(qp, nullptr);
  ibv_send_wr swr{};
  swr.opcode = IBV_WR_SEND;
  swr.sg_list = sge;
  swr.num_sge = 1000;
  ibv_send_wr* bad_send = nullptr;
  EXPECT_EQ(ibv_post_send(qp, &swr, &bad_send), EINVAL);
  EXPECT_EQ(bad_send, &swr);
  swr.send_flags = IBV_SEND_INLINE;  // inline or not, the count is checked first
  EXPECT_EQ(ibv_post_send(qp, &swr, &bad_send), EINVAL);
  ibv_recv_wr rwr{};
  rwr.sg_list = sge;
  rwr.num_sge = 1000;
  ibv_recv_wr* bad_recv = nullptr;
  EXPECT_EQ(ibv_post_recv(qp, &rwr, &bad_recv), EINVAL);
  EXPECT_EQ(bad_recv, &rwr);
  ibv_srq_init_attr srq_init{};
  srq_init.attr = {8, 1, 0};
  ibv_srq* srq = ibv_create_srq(env.pd, &srq_init);
  ASSERT_NE(srq, nullptr);
  EXPECT_EQ(ibv_post_srq_recv(srq, &rwr, &bad_recv), EINVAL);
  EXPECT_EQ(ibv_destroy_srq(srq), 0);
  EXPECT_EQ(ibv_destroy_qp(qp), 0);
  EXPECT_EQ(ibv_destroy_cq(cq), 0);
  EXPECT_EQ(ibv_dereg_mr(mr), 0);
  munmap(pages, 2 * page);
}

// ibv_reg_mr(3) pins the range; a range the process does not map (or not with the rights the access asks for) is
// EFAULT, one that wraps around the address space EINVAL, as the kernel's pinning answers, and nothing is registered.
TEST(BadDay, RegisteringMemoryTheProcessDoesNotMapIsEfault) {
  VerbsEnv env;
  ASSERT_NE(env.ctx, nullptr);
  const size_t page = size_t(sysconf(_SC_PAGESIZE));
  auto* pages = static_cast<uint8_t*>(mmap(nullptr, 16 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  ASSERT_NE(pages, MAP_FAILED);
  const int rw = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
  auto expect_refused = [&](void* addr, size_t length, int access, int err) {
    errno = 0;
    ibv_mr* mr = ibv_reg_mr(env.pd, addr, length, access);
    EXPECT_EQ(mr, nullptr) << addr << "+" << length;
    EXPECT_EQ(errno, err) << addr << "+" << length;
    if (mr != nullptr) ibv_dereg_mr(mr);
  };
  expect_refused(reinterpret_cast<void*>(uintptr_t(0x1000)), 4096, rw, EFAULT);  // nothing there
  expect_refused(pages, size_t(1) << 40, rw, EFAULT);                            // 1 TiB over a 64 KiB mapping
  expect_refused(pages + page, SIZE_MAX - 2 * page, rw, EINVAL);                 // wraps around
  ASSERT_EQ(mprotect(pages + 4 * page, page, PROT_NONE), 0);                     // a hole in the middle
  expect_refused(pages, 8 * page, rw, EFAULT);
  expect_refused(pages + 4 * page, page, IBV_ACCESS_REMOTE_READ, EFAULT);
  ASSERT_EQ(mprotect(pages + 8 * page, 8 * page, PROT_READ), 0);                 // read-only: no write access
  expect_refused(pages + 8 * page, 8 * page, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE, EFAULT);
  // What the mapping allows registers, including a range over two mappings that meet.
  ibv_mr* readable = ibv_reg_mr(env.pd, pages + 8 * page, 8 * page, IBV_ACCESS_REMOTE_READ);
  EXPECT_NE(readable, nullptr) << errno;
  ibv_mr* writable = ibv_reg_mr(env.pd, pages, 4 * page, rw);
  EXPECT_NE(writable, nullptr) << errno;
  ibv_mr* across = ibv_reg_mr(env.pd, pages + 5 * page, 11 * page, IBV_ACCESS_REMOTE_READ);
  EXPECT_NE(across, nullptr) << errno;
  for (ibv_mr* mr : {readable, writable, across})
    if (mr != nullptr) EXPECT_EQ(ibv_dereg_mr(mr), 0);
  munmap(pages, 16 * page);
}

// ibv_reg_mr(3) of a real device pins the range, which faults its pages in: registered, they are resident (mincore(2)),
// so a transfer's first pass over them takes no page fault. Not an on-demand region: nothing of it is pinned.
TEST(BadDay, RegisteringMemoryFaultsItsPagesInAsPinningDoes) {
  VerbsEnv env;
  ASSERT_NE(env.ctx, nullptr);
  const size_t page = size_t(sysconf(_SC_PAGESIZE)), pages = 32;
  auto resident = [&](void* at) {
    unsigned char in[pages];
    EXPECT_EQ(mincore(at, pages * page, in), 0);
    size_t n = 0;
    for (unsigned char c : in) n += c & 1;
    return n;
  };
  void* untouched = mmap(nullptr, pages * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(untouched, MAP_FAILED);
  ASSERT_EQ(resident(untouched), 0u);
  ibv_mr* mr = ibv_reg_mr(env.pd, untouched, pages * page, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  ASSERT_NE(mr, nullptr) << errno;
  EXPECT_EQ(resident(untouched), pages);
  EXPECT_EQ(ibv_dereg_mr(mr), 0);
  void* on_demand = mmap(nullptr, pages * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(on_demand, MAP_FAILED);
  mr = ibv_reg_mr(env.pd, on_demand, pages * page, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_ON_DEMAND);
  ASSERT_NE(mr, nullptr) << errno;
  EXPECT_EQ(resident(on_demand), 0u);
  EXPECT_EQ(ibv_dereg_mr(mr), 0);
  munmap(untouched, pages * page);
  munmap(on_demand, pages * page);
}

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
// after `limit` is killed, so a hang is a failure, never a hung test. `parent`, if given, runs meanwhile in this
// process. The fork happens before this process starts any thread of its own: a child of a multi-threaded process
// may find a lock (the sanitizers' allocator's) held forever by a thread it does not have.
int RunChild(const std::function<int()>& child, std::chrono::seconds limit,
             const std::function<void()>& parent = nullptr) {
  const pid_t pid = fork();
  if (pid == 0) _exit(child());
  if (pid < 0) return -1;
  if (parent) parent();
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
        // Leave 32 MiB of address space: a CQ of 1M entries needs more than that. Measured once the mapping has
        // held still for 50 ms: the engine's threads starting up map and unmap (glibc reserves 128 MiB for a new
        // thread's arena and trims it to 64), and a transient counted in the base left room for the CQ (1 CI run).
        uint64_t base = VirtualMemoryBytes();
        for (int i = 0; i < 40; ++i) {
          std::this_thread::sleep_for(std::chrono::milliseconds(50));
          const uint64_t now = VirtualMemoryBytes();
          if (now == base) break;
          base = now;
        }
        const rlimit limit{base + (32u << 20), RLIM_INFINITY};
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

// A UD QP in RTS on the process's device, receiving into `buf` (registered as `mr`), with one CQ for both queues.
struct UdEndpoint {
  ibv_context* ctx = nullptr;
  ibv_pd* pd = nullptr;
  ibv_cq* cq = nullptr;
  ibv_mr* mr = nullptr;
  ibv_qp* qp = nullptr;
  ibv_ah* ah = nullptr;  // the latest PostSendTo's
  ibv_gid gid{};

  // What a test process (not a child that exits with it open) destroys at its end.
  void Close() {
    if (qp) ibv_destroy_qp(qp);
    if (ah) ibv_destroy_ah(ah);
    if (mr) ibv_dereg_mr(mr);
    if (cq) ibv_destroy_cq(cq);
    if (pd) ibv_dealloc_pd(pd);
    if (ctx) ibv_close_device(ctx);
    *this = UdEndpoint();
  }
};
constexpr uint32_t kQkey = 0x11111111;

// 0, or the step that failed (10..14): a child's exit status.
int OpenUdEndpoint(void* buf, size_t len, int recv_depth, UdEndpoint* e) {
  ibv_device** list = ibv_get_device_list(nullptr);
  e->ctx = list && list[0] ? ibv_open_device(list[0]) : nullptr;
  if (list) ibv_free_device_list(list);
  if (e->ctx == nullptr) return 10;
  e->pd = ibv_alloc_pd(e->ctx);
  e->cq = ibv_create_cq(e->ctx, 2 * recv_depth, nullptr, nullptr, 0);
  e->mr = e->pd ? ibv_reg_mr(e->pd, buf, len, IBV_ACCESS_LOCAL_WRITE) : nullptr;
  ibv_qp_init_attr init{};
  init.send_cq = init.recv_cq = e->cq;
  init.qp_type = IBV_QPT_UD;
  init.cap = {uint32_t(recv_depth), uint32_t(recv_depth), 1, 1, 0};
  e->qp = e->pd && e->cq && e->mr ? ibv_create_qp(e->pd, &init) : nullptr;
  if (e->qp == nullptr) return 11;
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.port_num = 1;
  a.qkey = kQkey;
  if (ibv_modify_qp(e->qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY)) return 12;
  a.qp_state = IBV_QPS_RTR;
  if (ibv_modify_qp(e->qp, &a, IBV_QP_STATE)) return 13;
  a.qp_state = IBV_QPS_RTS;
  if (ibv_modify_qp(e->qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN)) return 14;
  ibv_query_gid(e->ctx, 1, 0, &e->gid);
  return 0;
}

// Posts a receive of `len` bytes at `at`. 0 or 15.
int PostReceive(const UdEndpoint& e, void* at, uint32_t len) {
  ibv_sge sge{reinterpret_cast<uintptr_t>(at), len, e.mr->lkey};
  ibv_recv_wr wr{};
  wr.sg_list = &sge;
  wr.num_sge = 1;
  ibv_recv_wr* bad = nullptr;
  return ibv_post_recv(e.qp, &wr, &bad) ? 15 : 0;
}

// Posts a signaled SEND of `len` bytes from `at` to QP `qpn` at `gid` (an AH made for the first one). 0 or 16/17.
int PostSendTo(UdEndpoint& e, void* at, uint32_t len, const ibv_gid& gid, uint32_t qpn) {
  if (e.ah == nullptr) {
    ibv_ah_attr ah_attr{};
    ah_attr.is_global = 1;
    ah_attr.grh.dgid = gid;
    ah_attr.port_num = 1;
    e.ah = ibv_create_ah(e.pd, &ah_attr);
    if (e.ah == nullptr) return 16;
  }
  ibv_sge sge{reinterpret_cast<uintptr_t>(at), len, e.mr->lkey};
  ibv_send_wr wr{};
  wr.opcode = IBV_WR_SEND;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.wr.ud = {e.ah, qpn, kQkey};
  ibv_send_wr* bad = nullptr;
  return ibv_post_send(e.qp, &wr, &bad) ? 17 : 0;
}

TEST(BadDay, ProcessExitingWithItsDeviceOpenAndAPacketInFlightExitsCleanly) {
#if defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "ThreadSanitizer cannot start threads in the child of a multi-threaded fork";
#endif
  const int status = RunChild(
      [] {
        static char buf[4096];
        UdEndpoint e;
        if (int step = OpenUdEndpoint(buf, sizeof buf, 4, &e)) return step;
        if (int step = PostReceive(e, buf, 64)) return step;
        if (int step = PostSendTo(e, buf, 64, e.gid, e.qp->qp_num)) return step;
        exit(0);  // no destroy, no close: the library must not crash or hang on the way out
      },
      std::chrono::seconds(30));
  ASSERT_TRUE(WIFEXITED(status)) << "killed by signal " << (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

// A UDP socket on 127.0.0.1 and a port the kernel chose: what a process that had UROCE_ADDR a moment ago leaves.
int HoldLoopbackPort(uint16_t* port) {
  const int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0)
    return -1;
  *port = ntohs(a.sin_port);
  return fd;
}

// The child opens the device on 127.0.0.1:`port` (UROCE_ADDR, UROCE_PORT), closing its copy of `held` first.
// Exit status: 0 opened, 30 + errno class otherwise (31 EADDRINUSE, 32 other), and how long the open took in
// `*elapsed_ms` (through a pipe).
int OpenOnHeldPort(int held, uint16_t port, std::chrono::milliseconds release_after, int64_t* elapsed_ms) {
  int fds[2];
  if (pipe(fds) != 0) return -1;
  const int status = RunChild(
      [&] {
        close(held);
        close(fds[0]);
        setenv("UROCE_ADDR", "127.0.0.1", 1);
        setenv("UROCE_PORT", std::to_string(port).c_str(), 1);
        const auto start = std::chrono::steady_clock::now();
        ibv_device** list = ibv_get_device_list(nullptr);
        errno = 0;
        ibv_context* ctx = list && list[0] ? ibv_open_device(list[0]) : nullptr;
        const int err = errno;
        const int64_t ms =
            std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start).count();
        if (write(fds[1], &ms, sizeof ms) != sizeof ms) return 33;
        if (list) ibv_free_device_list(list);
        if (ctx != nullptr) return ibv_close_device(ctx) == 0 ? 0 : 34;
        return err == EADDRINUSE ? 31 : 32;
      },
      std::chrono::seconds(30),
      [&] {
        close(fds[1]);
        if (release_after.count() > 0) {
          std::this_thread::sleep_for(release_after);
          close(held);
        }
        if (read(fds[0], elapsed_ms, sizeof *elapsed_ms) != sizeof *elapsed_ms) *elapsed_ms = -1;
        close(fds[0]);
      });
  return status;
}

// Programs run one after another on one UROCE_ADDR: the second may start while the first's socket is still held
// (io_uring releases it from a kernel worker after the process has gone); it waits for the address instead of
// failing with EADDRINUSE. An address held for good still fails, after a bounded wait. Runs a child that opens the
// device on a port held until `release_after` (0: for good) and checks its exit status and how long the open took.
void ExpectOpenOnHeldPort(std::chrono::milliseconds release_after, int want_status, int64_t min_ms, int64_t max_ms) {
  uint16_t port = 0;
  const int held = HoldLoopbackPort(&port);
  ASSERT_GE(held, 0) << strerror(errno);
  int64_t ms = 0;
  const int status = OpenOnHeldPort(held, port, release_after, &ms);
  if (release_after.count() == 0) close(held);
  ASSERT_TRUE(WIFEXITED(status)) << "killed by signal " << (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  EXPECT_EQ(WEXITSTATUS(status), want_status);
  EXPECT_GE(ms, min_ms);
  EXPECT_LT(ms, max_ms);
}

TEST(BadDay, AConfiguredAddressReleasedAMomentLaterIsWaitedFor) {
#if defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "ThreadSanitizer cannot start threads in the child of a multi-threaded fork";
#endif
  ExpectOpenOnHeldPort(std::chrono::milliseconds(150), 0, 100, 10'000);  // opened, once released
}

TEST(BadDay, AConfiguredAddressHeldByAnotherProgramFailsWithEaddrinuseAfterABoundedWait) {
#if defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "ThreadSanitizer cannot start threads in the child of a multi-threaded fork";
#endif
  ExpectOpenOnHeldPort(std::chrono::milliseconds(0), 31, 900, 10'000);  // EADDRINUSE after the 1 s wait
}

// What the exit handlers registered before the device was opened do -- the destructors of a program's global objects
// among them -- runs after the library's own: they may free registered memory while a peer still sends. A real
// HCA's pinned pages would take the datagrams; the library must not write there any more (a udpong server died so,
// its progress thread scattering into a buffer its rsocket table had just freed).
int g_exit_pipe = -1;
void* g_exit_buffer = nullptr;
constexpr size_t kExitBufferBytes = 64 * 1024;
constexpr int kExitReceives = 32;

void UnmapRegisteredBufferAtExit() {
  munmap(g_exit_buffer, kExitBufferBytes);
  const char exiting = 'x';
  if (write(g_exit_pipe, &exiting, 1) != 1) _exit(20);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the peer's datagrams arrive meanwhile
}

TEST(BadDay, ProcessFreeingRegisteredMemoryAtExitWhileItsPeerSendsExitsCleanly) {
#if defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "ThreadSanitizer cannot start threads in the child of a multi-threaded fork";
#endif
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  int sent = 0;
  const int status = RunChild(
      [&] {
        close(fds[0]);
        g_exit_pipe = fds[1];
        // Registered before the device is opened: runs after the library's exit handler.
        if (std::atexit(UnmapRegisteredBufferAtExit) != 0) return 9;
        g_exit_buffer = mmap(nullptr, kExitBufferBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (g_exit_buffer == MAP_FAILED) return 9;
        UdEndpoint e;
        if (int step = OpenUdEndpoint(g_exit_buffer, kExitBufferBytes, kExitReceives, &e)) return step;
        constexpr uint32_t kSlot = kExitBufferBytes / kExitReceives;
        for (int i = 0; i < kExitReceives; ++i)
          if (int step = PostReceive(e, static_cast<char*>(g_exit_buffer) + i * kSlot, kSlot)) return step;
        if (write(fds[1], &e.gid, sizeof e.gid) != sizeof e.gid) return 18;
        if (write(fds[1], &e.qp->qp_num, sizeof e.qp->qp_num) != sizeof e.qp->qp_num) return 18;
        exit(0);
      },
      std::chrono::seconds(30),
      [&] {
        // The peer: learns the child's address and QPN, and once the child is exiting sends it a datagram per
        // receive it posted.
        close(fds[1]);  // a child that fails before writing ends the reads
        static char peer_buf[4096];
        UdEndpoint peer;
        ibv_gid gid{};
        uint32_t qpn = 0;
        char exiting = 0;
        if (OpenUdEndpoint(peer_buf, sizeof peer_buf, kExitReceives, &peer) == 0 &&
            read(fds[0], &gid, sizeof gid) == sizeof gid && read(fds[0], &qpn, sizeof qpn) == sizeof qpn &&
            read(fds[0], &exiting, 1) == 1) {
          for (; sent < kExitReceives; ++sent) {
            if (PostSendTo(peer, peer_buf, 256, gid, qpn) != 0) break;
            ibv_wc wc{};
            int n = 0;
            while ((n = ibv_poll_cq(peer.cq, 1, &wc)) == 0) {
            }
            if (n < 0 || wc.status != IBV_WC_SUCCESS) break;
          }
        }
        close(fds[0]);
        peer.Close();
      });
  ASSERT_TRUE(WIFEXITED(status)) << "killed by signal " << (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_EQ(sent, kExitReceives);  // the datagrams did leave while the child was exiting
}

}  // namespace
}  // namespace uroce::verbs
