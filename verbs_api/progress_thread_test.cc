// The engine's progress thread as the process sees it: asleep (no CPU) while nothing happens, awake for a bounded
// time after a QP enters RTR (Engine::QpReadyToReceive), asleep again afterwards, and asleep while an application
// thread polls and so holds the receive side (Engine's lease).
#include <dirent.h>
#include <unistd.h>
#include <infiniband/verbs.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "verbs_api/engine.h"
#include "verbs_api/verbs_test_env.h"

namespace {

using Env = uroce::verbs::testing::VerbsEnv;
using uroce::verbs::Engine;

// The thread named "uroce-progress" in this process, or an empty string.
std::string ProgressThreadDir() {
  DIR* d = opendir("/proc/self/task");
  if (d == nullptr) return "";
  std::string found;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] == '.') continue;
    const std::string dir = std::string("/proc/self/task/") + e->d_name;
    std::ifstream comm(dir + "/comm");
    std::string name;
    if (std::getline(comm, name) && name == "uroce-progress") found = dir;
  }
  closedir(d);
  return found;
}

// Nanoseconds the thread has run on a CPU (schedstat(5)'s first field).
uint64_t CpuNs(const std::string& thread_dir) {
  std::ifstream f(thread_dir + "/schedstat");
  uint64_t ns = 0;
  f >> ns;
  return ns;
}

// Nanoseconds the thread has run on a CPU or waited on a run queue for one (schedstat(5)'s first two fields): the time
// it was awake, whether or not the machine's other threads let it run.
uint64_t AwakeNs(const std::string& thread_dir) {
  std::ifstream f(thread_dir + "/schedstat");
  uint64_t on_cpu = 0, waiting = 0;
  f >> on_cpu >> waiting;
  return on_cpu + waiting;
}

// A count from the thread's /proc status: "voluntary_ctxt_switches" (it slept: each is a sleep and a wake-up after
// it) or "nonvoluntary_ctxt_switches" (it was preempted).
uint64_t StatusCount(const std::string& thread_dir, const std::string& key) {
  std::ifstream f(thread_dir + "/status");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind(key + ":", 0) == 0) return std::stoull(line.substr(key.size() + 1));
  }
  return 0;
}

// The progress thread once it has run: it names itself when it starts, a moment after the device opened, and
// schedstat shows its time once the kernel has accounted for it (not during its first time slice). Empty after 1 s
// without it.
std::string WaitForProgressThread() {
  std::string thread = ProgressThreadDir();
  for (int i = 0; i < 1000 && (thread.empty() || CpuNs(thread) == 0); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    thread = ProgressThreadDir();
  }
  return thread;
}

uint64_t CpuNsOver(const std::string& thread_dir, std::chrono::milliseconds wall) {
  const uint64_t before = CpuNs(thread_dir);
  std::this_thread::sleep_for(wall);
  return CpuNs(thread_dir) - before;
}

TEST(ProgressThread, SpinsForABoundedTimeAfterAQpEntersRtrAndCostsNothingIdle) {
  Env e;
  ASSERT_NE(e.ctx, nullptr);
  ibv_cq* cq = ibv_create_cq(e.ctx, 16, nullptr, nullptr, 0);
  ASSERT_NE(cq, nullptr);
  ibv_qp_init_attr init{};
  init.send_cq = init.recv_cq = cq;
  init.qp_type = IBV_QPT_UD;
  init.cap = {16, 16, 1, 1, 0};
  ibv_qp* qp = ibv_create_qp(e.pd, &init);
  ASSERT_NE(qp, nullptr);
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.port_num = 1;
  a.qkey = 0x1234;
  ASSERT_EQ(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY), 0);
  const std::string thread = WaitForProgressThread();
  ASSERT_NE(thread, "") << "no thread named uroce-progress";
  ASSERT_GT(CpuNs(thread), 0u) << "no schedstat for " << thread;

  const auto window = std::chrono::nanoseconds(Engine::kFirstPacketsSpinNs);
  const auto long_wall = std::chrono::duration_cast<std::chrono::milliseconds>(window * 5);
  // Idle: the thread sleeps in the kernel (a handful of wake-ups at most).
  EXPECT_LT(CpuNsOver(thread, long_wall), Engine::kFirstPacketsSpinNs / 10);

  a.qp_state = IBV_QPS_RTR;
  const uint64_t before = CpuNs(thread), awake_before = AwakeNs(thread);
  ASSERT_EQ(ibv_modify_qp(qp, &a, IBV_QP_STATE), 0);
  std::this_thread::sleep_for(window * 2);
  const uint64_t spent = CpuNs(thread) - before, awake = AwakeNs(thread) - awake_before;
  // Awake for the window (on a CPU or waiting for one: under TSan, with the sanitizer suite's other tests on the
  // machine's two cores, it ran 3.9 ms of its 20), and not on a CPU much beyond it.
  EXPECT_GT(awake, Engine::kFirstPacketsSpinNs / 2);
  EXPECT_LT(spent, Engine::kFirstPacketsSpinNs * 3 / 2);
  // And asleep again once it has passed.
  EXPECT_LT(CpuNsOver(thread, long_wall), Engine::kFirstPacketsSpinNs / 10);

  EXPECT_EQ(ibv_destroy_qp(qp), 0);
  EXPECT_EQ(ibv_destroy_cq(cq), 0);
}

// While an application thread keeps polling an empty CQ it holds the receive side, renewing its lease with every
// poll; the progress thread sleeps through the lease instead of waking at each lease's end to find it renewed (every
// 0.5-1 ms, each wake-up a preemption of a polling thread on 2 cores). Counted in 5 ms windows in which the polling
// thread held the receive side throughout: it was not preempted, and the receive side was not handed to applications
// again (a poller that stops polling for a while -- preempted, or held up by interrupts or the hypervisor without a
// context switch, which an ASan run in the clean-clone CI met -- ends its lease and takes a new one: handovers that
// are the design, frequent when other tests load the machine). The progress thread's median count of sleeps there
// must be at most 2 (0 on a quiet machine; waking per lease it was 5 or more).
TEST(ProgressThread, SleepsThroughTheLeaseOfAThreadThatKeepsPolling) {
  Env e;
  ASSERT_NE(e.ctx, nullptr);
  ibv_cq* cq = ibv_create_cq(e.ctx, 16, nullptr, nullptr, 0);
  ASSERT_NE(cq, nullptr);
  const std::string thread = WaitForProgressThread();
  ASSERT_NE(thread, "") << "no thread named uroce-progress";
  const std::string self = "/proc/self/task/" + std::to_string(gettid());
  const std::shared_ptr<Engine> engine = Engine::Acquire();  // the one the context runs on
  ASSERT_NE(engine, nullptr);
  ibv_wc wc;
  auto poll_for = [&](std::chrono::milliseconds wall) {
    const auto end = std::chrono::steady_clock::now() + wall;
    while (std::chrono::steady_clock::now() < end) ASSERT_EQ(ibv_poll_cq(cq, 1, &wc), 0);
  };
  poll_for(std::chrono::milliseconds(20));  // the polling pattern is recognised and the lease taken
  std::vector<uint64_t> clean;  // the progress thread's sleeps in windows where this thread ran throughout
  for (int window = 0; window < 400 && clean.size() < 15; ++window) {
    const uint64_t sleeps = StatusCount(thread, "voluntary_ctxt_switches");
    const uint64_t preempted = StatusCount(self, "nonvoluntary_ctxt_switches");
    const uint64_t handovers = engine->handovers();
    poll_for(std::chrono::milliseconds(5));
    if (StatusCount(self, "nonvoluntary_ctxt_switches") != preempted || engine->handovers() != handovers) continue;
    clean.push_back(StatusCount(thread, "voluntary_ctxt_switches") - sleeps);
  }
  // A thread that arms its CQ to sleep (ibv_req_notify_cq) ends its lease at once: the progress thread wakes to take
  // the receive side back, and progress_lease_wakeups counts it. Tried a few times: a poller preempted for a whole
  // lease has already lost it, and then there is nothing to end.
  bool counted = false;
  for (int attempt = 0; attempt < 20 && !counted; ++attempt) {
    poll_for(std::chrono::milliseconds(5));
    const uint64_t before = engine->lease_wakeups();
    ASSERT_EQ(ibv_req_notify_cq(cq, 0), 0);
    const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(200);
    while (!counted && std::chrono::steady_clock::now() < end) {
      counted = engine->lease_wakeups() > before;
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }
  EXPECT_TRUE(counted) << "the progress thread's wake-up at the end of a lease was never counted";
  EXPECT_EQ(ibv_destroy_cq(cq), 0);
  if (clean.size() < 3) {
    GTEST_SKIP() << "the polling thread lost the receive side in almost every window (a loaded machine)";
  }
  std::sort(clean.begin(), clean.end());
  EXPECT_LE(clean[clean.size() / 2], 2u) << clean.size() << " clean windows, fewest " << clean.front()
                                          << ", most " << clean.back();
}

}  // namespace
