// uroce never interrupts an application's blocking calls. io_uring notifies the threads that used a ring, when the
// ring is torn down, with a signal-like task_work (TWA_SIGNAL) that makes a blocking call they are in return EINTR
// although no signal was sent (wire/uring_transport.h): libfabric's fi_getinfo opens and closes the device several
// times, and fi_pingpong's fi_eq_sread then failed. These tests block application threads in recv with SO_RCVTIMEO,
// epoll_wait, poll and read on an eventfd while devices are opened, used and closed, by those same threads before
// they block and by others meanwhile, on both transports; every wait must last its whole timeout.
#include <netinet/in.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>
#include <infiniband/verbs.h>

#include <gtest/gtest.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;
// Each blocking call's timeout: 1.5 s, or UROCE_EINTR_WAIT_MS (the reproduction waits 5000).
const std::chrono::milliseconds kWait(std::getenv("UROCE_EINTR_WAIT_MS") ? std::atol(std::getenv("UROCE_EINTR_WAIT_MS"))
                                                                          : 1500);

// Opens uroce0, sends one UD datagram to itself through a QP in RTS, polls its completions, and closes everything:
// what fi_getinfo and a short-lived user of the device do. Returns false if any step failed.
bool OpenUseAndClose() {
  ibv_device** list = ibv_get_device_list(nullptr);
  if (list == nullptr || list[0] == nullptr) return false;
  ibv_context* ctx = ibv_open_device(list[0]);
  ibv_free_device_list(list);
  if (ctx == nullptr) return false;
  bool ok = false;
  ibv_pd* pd = ibv_alloc_pd(ctx);
  ibv_cq* cq = pd ? ibv_create_cq(ctx, 16, nullptr, nullptr, 0) : nullptr;
  static char buffer[64 + 40];
  ibv_mr* mr = cq ? ibv_reg_mr(pd, buffer, sizeof buffer, IBV_ACCESS_LOCAL_WRITE) : nullptr;
  ibv_qp* qp = nullptr;
  ibv_ah* ah = nullptr;
  if (mr) {
    ibv_qp_init_attr init{};
    init.send_cq = init.recv_cq = cq;
    init.qp_type = IBV_QPT_UD;
    init.cap = {4, 4, 1, 1, 0};
    qp = ibv_create_qp(pd, &init);
  }
  if (qp) {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_INIT;
    a.port_num = 1;
    a.qkey = 0x11;
    bool moved = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY) == 0;
    a.qp_state = IBV_QPS_RTR;
    moved = moved && ibv_modify_qp(qp, &a, IBV_QP_STATE) == 0;
    a.qp_state = IBV_QPS_RTS;
    moved = moved && ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN) == 0;
    ibv_ah_attr ah_attr{};
    ah_attr.is_global = 1;
    ah_attr.port_num = 1;
    if (moved && ibv_query_gid(ctx, 1, 0, &ah_attr.grh.dgid) == 0) ah = ibv_create_ah(pd, &ah_attr);
  }
  if (ah) {
    ibv_sge recv_sge{reinterpret_cast<uintptr_t>(buffer), sizeof buffer, mr->lkey};
    ibv_recv_wr rwr{};
    rwr.sg_list = &recv_sge;
    rwr.num_sge = 1;
    ibv_recv_wr* bad_recv = nullptr;
    ibv_sge send_sge{reinterpret_cast<uintptr_t>(buffer), 8, mr->lkey};
    ibv_send_wr swr{};
    swr.sg_list = &send_sge;
    swr.num_sge = 1;
    swr.opcode = IBV_WR_SEND;
    swr.send_flags = IBV_SEND_SIGNALED;
    swr.wr.ud.ah = ah;
    swr.wr.ud.remote_qpn = qp->qp_num;
    swr.wr.ud.remote_qkey = 0x11;
    ibv_send_wr* bad_send = nullptr;
    if (ibv_post_recv(qp, &rwr, &bad_recv) == 0 && ibv_post_send(qp, &swr, &bad_send) == 0) {
      int completions = 0;
      const auto give_up = Clock::now() + std::chrono::seconds(5);
      ibv_wc wc[2];
      while (completions < 2 && Clock::now() < give_up) {
        const int n = ibv_poll_cq(cq, 2, wc);
        for (int i = 0; i < n; ++i) completions += wc[i].status == IBV_WC_SUCCESS;
      }
      ok = completions == 2;
    }
  }
  if (ah) ibv_destroy_ah(ah);
  if (qp) ibv_destroy_qp(qp);
  if (mr) ibv_dereg_mr(mr);
  if (cq) ibv_destroy_cq(cq);
  if (pd) ibv_dealloc_pd(pd);
  ibv_close_device(ctx);
  return ok;
}

// A blocking call with a timeout of kWait: what it returned and how long it took.
struct Blocked {
  std::string what;
  std::function<int()> call;  // returns -1 with errno on failure, as the system call does
};

// Each kind of blocking call, on descriptors it makes (closed by the caller's cleanup list).
std::vector<Blocked> BlockingCalls(std::vector<int>* fds) {
  std::vector<Blocked> calls;
  const int ms = static_cast<int>(kWait.count());
  // recv on a UDP socket nobody sends to, with SO_RCVTIMEO: EAGAIN after the timeout.
  const int sock = socket(AF_INET, SOCK_DGRAM, 0);
  timeval tv{ms / 1000, (ms % 1000) * 1000};
  setsockopt(sock, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  sockaddr_in any{};
  any.sin_family = AF_INET;
  any.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(sock, reinterpret_cast<sockaddr*>(&any), sizeof any);
  fds->push_back(sock);
  calls.push_back({"recv with SO_RCVTIMEO", [sock] {
                     char b[8];
                     return static_cast<int>(recv(sock, b, sizeof b, 0));
                   }});
  const int ev = eventfd(0, 0);
  fds->push_back(ev);
  const int ep = epoll_create1(0);
  fds->push_back(ep);
  epoll_event e{};
  e.events = EPOLLIN;
  epoll_ctl(ep, EPOLL_CTL_ADD, ev, &e);
  calls.push_back({"epoll_wait", [ep, ms] {
                     epoll_event out;
                     return epoll_wait(ep, &out, 1, ms);
                   }});
  calls.push_back({"poll", [ev, ms] {
                     pollfd p{ev, POLLIN, 0};
                     return poll(&p, 1, ms);
                   }});
  // read on an eventfd nobody writes to: blocks until a helper writes after kWait.
  calls.push_back({"read on an eventfd", [ev] {
                     uint64_t v;
                     return static_cast<int>(read(ev, &v, sizeof v));
                   }});
  return calls;
}

class NoEintr : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override { setenv("UROCE_TRANSPORT", GetParam(), 1); }
  void TearDown() override { unsetenv("UROCE_TRANSPORT"); }
};

// The must-show reproduction: a thread that has opened and closed uroce0 (and so, before the fix, created and
// destroyed its io_uring rings) then blocks in recv with SO_RCVTIMEO while another thread opens and closes the device;
// the recv waits out its timeout.
TEST_P(NoEintr, RecvAfterOpeningAndClosingWaitsItsTimeout) {
  std::vector<int> fds;
  std::vector<Blocked> calls = BlockingCalls(&fds);
  ASSERT_TRUE(OpenUseAndClose());
  std::atomic<bool> done{false};
  std::thread other([&] {
    while (!done) EXPECT_TRUE(OpenUseAndClose());
  });
  const auto start = Clock::now();
  const int r = calls[0].call();
  const int err = errno;
  const auto waited = Clock::now() - start;
  done = true;
  other.join();
  EXPECT_EQ(r, -1);
  EXPECT_EQ(err, EAGAIN) << "recv returned " << strerror(err);
  EXPECT_GE(waited, kWait - std::chrono::milliseconds(50));
  for (int fd : fds) close(fd);
}

// Every kind of blocking call, each on a thread that opened, used and closed the device just before, while two other
// threads keep opening, using and closing it.
TEST_P(NoEintr, EveryBlockingCallWaitsItsTimeoutWhileDevicesComeAndGo) {
  std::vector<int> fds;
  std::vector<Blocked> calls = BlockingCalls(&fds);
  std::atomic<bool> done{false};
  std::vector<std::thread> churn;
  for (int i = 0; i < 2; ++i)
    churn.emplace_back([&] {
      while (!done) EXPECT_TRUE(OpenUseAndClose());
    });
  std::vector<std::thread> blocked;
  std::vector<int> results(calls.size()), errors(calls.size());
  std::vector<Clock::duration> waited(calls.size());
  std::atomic<size_t> finished{0};
  std::atomic<Clock::rep> read_started{0};  // the eventfd read's start (the last call), once it began
  for (size_t i = 0; i < calls.size(); ++i) {
    blocked.emplace_back([&, i] {
      EXPECT_TRUE(OpenUseAndClose());
      const auto start = Clock::now();
      if (i + 1 == calls.size()) read_started = start.time_since_epoch().count();
      results[i] = calls[i].call();
      errors[i] = errno;
      waited[i] = Clock::now() - start;
      ++finished;
    });
  }
  // The eventfd read has no timeout of its own: a write ends it once the other calls have timed out and it has
  // waited kWait itself (the others wait on that eventfd too, so the write must come after them).
  const auto give_up = Clock::now() + std::chrono::seconds(60);
  while ((finished < calls.size() - 1 || read_started == 0 ||
          Clock::now() < Clock::time_point(Clock::duration(read_started.load())) + kWait) &&
         Clock::now() < give_up) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  const uint64_t one = 1;
  ASSERT_EQ(write(fds[1], &one, sizeof one), static_cast<ssize_t>(sizeof one));
  for (auto& t : blocked) t.join();
  done = true;
  for (auto& t : churn) t.join();
  for (size_t i = 0; i < calls.size(); ++i) {
    SCOPED_TRACE(calls[i].what);
    EXPECT_NE(errors[i] == EINTR && results[i] < 0, true) << "interrupted (EINTR)";
    EXPECT_GE(waited[i], kWait - std::chrono::milliseconds(50)) << "returned " << results[i] << " early";
  }
  for (int fd : fds) close(fd);
}

INSTANTIATE_TEST_SUITE_P(Transports, NoEintr, ::testing::Values("uring", "socket"),
                         [](const auto& info) { return std::string(info.param) == "uring" ? "Uring" : "Socket"; });

}  // namespace
