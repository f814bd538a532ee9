// Datagram rsockets (rsocket(3), SOCK_DGRAM over a UD QP) against the semantics of a UDP socket, in one process.
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <rdma/rsocket.h>

#include <poll.h>
#include <time.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include <gtest/gtest.h>

namespace {

sockaddr_in Loopback(uint16_t port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  return a;
}

// A datagram rsocket bound to an ephemeral loopback port; its port in `port`.
int BoundDatagramSocket(uint16_t* port) {
  const int fd = rsocket(AF_INET, SOCK_DGRAM, 0);
  if (fd < 0) return fd;
  sockaddr_in a = Loopback(0);
  socklen_t len = sizeof a;
  if (rbind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      rgetsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    rclose(fd);
    return -1;
  }
  *port = ntohs(a.sin_port);
  return fd;
}

// The calling thread's CPU time.
std::chrono::nanoseconds ThreadCpuTime() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return std::chrono::seconds(ts.tv_sec) + std::chrono::nanoseconds(ts.tv_nsec);
}

// Runs `wait` (a blocking call) on a thread of its own, sends it a datagram from another rsocket after `idle`, and
// returns the CPU time the waiting thread used meanwhile; `wait` gets the time it was called. Aborts if the datagram
// does not end the wait within 10 s (a wait that never ends would otherwise hang the test).
template <typename F>
std::chrono::nanoseconds CpuOfAWaitEndedByADatagram(uint16_t to, std::chrono::milliseconds idle, F wait) {
  std::atomic<bool> done{false};
  std::chrono::nanoseconds cpu{};
  std::thread waiter([&] {
    const auto before = ThreadCpuTime();
    wait();
    cpu = ThreadCpuTime() - before;
    done = true;
  });
  std::this_thread::sleep_for(idle);
  uint16_t port = 0;
  const int sender = BoundDatagramSocket(&port);
  EXPECT_GE(sender, 0) << strerror(errno);
  const sockaddr_in dst = Loopback(to);
  EXPECT_EQ(rsendto(sender, "wake", 4, 0, reinterpret_cast<const sockaddr*>(&dst), sizeof dst), 4) << strerror(errno);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!done && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  if (!done) {
    ADD_FAILURE() << "the datagram did not end the wait";
    std::abort();
  }
  waiter.join();
  rclose(sender);
  return cpu;
}

// A loopback port that was bound a moment ago and is nobody's now.
uint16_t PortNobodyHolds() {
  uint16_t port = 0;
  const int fd = BoundDatagramSocket(&port);
  if (fd < 0) return 0;
  rclose(fd);
  return port;
}

// A bound datagram rsocket and a loopback port nobody holds.
class DatagramRsocket : public ::testing::Test {
 protected:
  void SetUp() override {
    fd_ = BoundDatagramSocket(&mine_);
    ASSERT_GE(fd_, 0) << strerror(errno);
    const uint16_t gone = PortNobodyHolds();
    ASSERT_NE(gone, 0);
    to_gone_ = Loopback(gone);
  }
  void TearDown() override {
    if (fd_ >= 0) EXPECT_EQ(rclose(fd_), 0);
  }
  const sockaddr* gone() const { return reinterpret_cast<const sockaddr*>(&to_gone_); }

  int fd_ = -1;
  uint16_t mine_ = 0;
  sockaddr_in to_gone_{};
};

// udpong's server answers clients that may have gone: a sendto towards a port nobody holds loses the datagram and
// returns its length, as sendto(2) on an unconnected UDP socket does, and the socket goes on working.
TEST_F(DatagramRsocket, ASendToAPortNobodyHoldsIsLostWithoutAnError) {
  EXPECT_EQ(rsendto(fd_, "lost", 4, 0, gone(), sizeof to_gone_), 4) << strerror(errno);
  const sockaddr_in to_me = Loopback(mine_);
  ASSERT_EQ(rsendto(fd_, "kept", 4, 0, reinterpret_cast<const sockaddr*>(&to_me), sizeof to_me), 4)
      << strerror(errno);
  char buf[16] = {};
  sockaddr_in from{};
  socklen_t from_len = sizeof from;
  ASSERT_EQ(rrecvfrom(fd_, buf, sizeof buf, 0, reinterpret_cast<sockaddr*>(&from), &from_len), 4) << strerror(errno);
  EXPECT_EQ(std::string(buf, 4), "kept");
  EXPECT_EQ(ntohs(from.sin_port), mine_);
}

// A connected datagram socket is told instead, as a connected UDP socket is once the ICMP port unreachable is back.
TEST_F(DatagramRsocket, AConnectedSocketIsRefusedByAPortNobodyHolds) {
  ASSERT_EQ(rconnect(fd_, gone(), sizeof to_gone_), 0) << strerror(errno);
  errno = 0;
  EXPECT_EQ(rsend(fd_, "x", 1, 0), -1);
  EXPECT_EQ(errno, ECONNREFUSED);
}

// A send goes to whoever holds the port now: the owner a sender looked up before is not used once its binding is gone.
TEST_F(DatagramRsocket, ADatagramGoesToWhoeverHoldsThePortNow) {
  uint16_t port = 0;
  const int first = BoundDatagramSocket(&port);
  ASSERT_GE(first, 0) << strerror(errno);
  const sockaddr_in to = Loopback(port);
  const sockaddr* dst = reinterpret_cast<const sockaddr*>(&to);
  char buf[16] = {};
  ASSERT_EQ(rsendto(fd_, "one", 3, 0, dst, sizeof to), 3) << strerror(errno);
  ASSERT_EQ(rrecv(first, buf, sizeof buf, 0), 3) << strerror(errno);
  EXPECT_EQ(std::string(buf, 3), "one");
  ASSERT_EQ(rclose(first), 0);

  const int second = rsocket(AF_INET, SOCK_DGRAM, 0);
  ASSERT_GE(second, 0) << strerror(errno);
  sockaddr_in same = Loopback(port);
  ASSERT_EQ(rbind(second, reinterpret_cast<sockaddr*>(&same), sizeof same), 0) << strerror(errno);
  ASSERT_EQ(rsendto(fd_, "two", 3, 0, dst, sizeof to), 3) << strerror(errno);
  pollfd p{second, POLLIN, 0};
  ASSERT_EQ(rpoll(&p, 1, 5000), 1) << "the datagram went to the port's former holder";
  ASSERT_EQ(rrecv(second, buf, sizeof buf, MSG_DONTWAIT), 3) << strerror(errno);
  EXPECT_EQ(std::string(buf, 3), "two");
  EXPECT_EQ(rclose(second), 0);
}

// A connected socket whose peer was there a moment ago is refused once it is gone.
TEST_F(DatagramRsocket, AConnectedSocketIsRefusedOnceItsPeerHasGone) {
  uint16_t port = 0;
  const int peer = BoundDatagramSocket(&port);
  ASSERT_GE(peer, 0) << strerror(errno);
  const sockaddr_in to = Loopback(port);
  ASSERT_EQ(rconnect(fd_, reinterpret_cast<const sockaddr*>(&to), sizeof to), 0) << strerror(errno);
  ASSERT_EQ(rsend(fd_, "x", 1, 0), 1) << strerror(errno);
  ASSERT_EQ(rclose(peer), 0);
  errno = 0;
  EXPECT_EQ(rsend(fd_, "x", 1, 0), -1);
  EXPECT_EQ(errno, ECONNREFUSED);
}

// A blocking receive with nothing to take sleeps (it polls only a moment, kPollBeforeSleeping) and wakes for the
// datagram: over 300 ms of waiting its thread uses a few ms of CPU at most (spinning would use all 300; polling every
// 50 us, as the wait once did, used ~10% here).
TEST_F(DatagramRsocket, ABlockedReceiveSleepsUntilADatagramComes) {
  char buf[16] = {};
  ssize_t got = -1;
  const auto cpu = CpuOfAWaitEndedByADatagram(mine_, std::chrono::milliseconds(300),
                                              [&] { got = rrecv(fd_, buf, sizeof buf, 0); });
  ASSERT_EQ(got, 4) << strerror(errno);
  EXPECT_EQ(std::string(buf, 4), "wake");
  EXPECT_LT(cpu, std::chrono::milliseconds(15));
}

// rpoll likewise: it sleeps on the rsocket's completion channel and returns when the datagram comes.
TEST_F(DatagramRsocket, RpollSleepsUntilADatagramComes) {
  pollfd p{fd_, POLLIN, 0};
  int ready = -1;
  const auto cpu = CpuOfAWaitEndedByADatagram(mine_, std::chrono::milliseconds(300),
                                              [&] { ready = rpoll(&p, 1, 10000); });
  ASSERT_EQ(ready, 1) << strerror(errno);
  EXPECT_TRUE(p.revents & POLLIN);
  EXPECT_LT(cpu, std::chrono::milliseconds(15));
  char buf[16] = {};
  EXPECT_EQ(rrecv(fd_, buf, sizeof buf, MSG_DONTWAIT), 4) << strerror(errno);
}

}  // namespace
