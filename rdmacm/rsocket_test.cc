// Datagram rsockets (rsocket(3), SOCK_DGRAM over a UD QP) against the semantics of a UDP socket, and stream
// rsockets' flow control, in one process.
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <rdma/rdma_cma.h>
#include <rdma/rsocket.h>

#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "rdmacm/run_with_deadline.h"

namespace {

using uroce::rdmacm::testing::RunWithDeadline;

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

// What a blocking call returned, and errno after it.
struct CallResult {
  long value = 0;
  int err = 0;
};

// Runs `block` (a blocking call) on a thread of its own and, once it has been running for `idle` (asleep by then,
// not polling), `end` on another; what `block` returned. Aborts if they are not done within `deadline`.
CallResult EndABlockedCall(const std::function<long()>& block, const std::function<void()>& end,
                           std::chrono::milliseconds idle, const std::string& what, std::chrono::seconds deadline) {
  CallResult result;
  std::atomic<bool> started{false};
  RunWithDeadline({[&] {
                     started = true;
                     result.value = block();
                     result.err = errno;
                   },
                   [&] {
                     while (!started) std::this_thread::sleep_for(std::chrono::milliseconds(1));
                     std::this_thread::sleep_for(idle);
                     end();
                   }},
                  what, deadline);
  return result;
}

// Runs `wait` (a blocking call) on a thread of its own, sends it a datagram from another rsocket after `idle`, and
// returns the CPU time the waiting thread used meanwhile. Aborts if the datagram does not end the wait within 10 s.
template <typename F>
std::chrono::nanoseconds CpuOfAWaitEndedByADatagram(uint16_t to, std::chrono::milliseconds idle, F wait) {
  std::chrono::nanoseconds cpu{};
  int sender = -1;
  EndABlockedCall(
      [&] {
        const auto before = ThreadCpuTime();
        wait();
        cpu = ThreadCpuTime() - before;
        return 0L;
      },
      [&] {
        uint16_t port = 0;
        sender = BoundDatagramSocket(&port);
        EXPECT_GE(sender, 0) << strerror(errno);
        const sockaddr_in dst = Loopback(to);
        EXPECT_EQ(rsendto(sender, "wake", 4, 0, reinterpret_cast<const sockaddr*>(&dst), sizeof dst), 4)
            << strerror(errno);
      },
      idle, "a wait the datagram should end", std::chrono::seconds(10));
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

// --- stream rsockets' flow control ------------------------------------------------------------------------------
// A SEND goes only against a credit (a receive buffer the peer posted; 32 of 16 KiB each side): a writer that
// outruns its reader waits, and credits come back on the peer's SENDs or in a SEND of their own, the last credit kept
// for that. The transfers below are many times the 512 KiB of receive buffers, so they finish only if the credits
// flow in every case; a deadlock aborts the test (kStreamDeadline) instead of hanging it.
constexpr auto kStreamDeadline = std::chrono::seconds(60);

// Byte `i` of a stream: a pattern whose period (251) is prime to every buffer size, so a lost, repeated or misplaced
// piece shows.
uint8_t PatternByte(size_t i, uint8_t seed) { return uint8_t(i % 251 + seed); }

// Writes `total` pattern bytes in pieces of `piece`; true when all were taken.
bool WritePattern(int fd, size_t total, size_t piece, uint8_t seed) {
  std::vector<uint8_t> buf(piece);
  for (size_t done = 0; done < total;) {
    const size_t n = std::min(piece, total - done);
    for (size_t i = 0; i < n; ++i) buf[i] = PatternByte(done + i, seed);
    for (size_t sent = 0; sent < n;) {
      const ssize_t r = rsend(fd, buf.data() + sent, n - sent, 0);
      if (r <= 0) return false;
      sent += size_t(r);
    }
    done += n;
  }
  return true;
}

// Reads pieces of up to `piece` bytes until the end of the stream or `up_to` bytes: how many matched the pattern of
// `seed` in order (it stops at the first that does not), or -1 on an error. `slowly`: a 500 us pause after every
// 64 KiB, a reader that falls behind its writer.
ssize_t ReadPattern(int fd, size_t piece, uint8_t seed, size_t up_to = SIZE_MAX, bool slowly = false) {
  constexpr size_t kSlowStep = 64 << 10;
  std::vector<uint8_t> buf(piece);
  size_t done = 0;
  while (done < up_to) {
    const ssize_t r = rrecv(fd, buf.data(), std::min(buf.size(), up_to - done), 0);
    if (r < 0) return -1;
    if (r == 0) break;
    for (ssize_t i = 0; i < r; ++i)
      if (buf[size_t(i)] != PatternByte(done + size_t(i), seed)) return ssize_t(done + size_t(i));
    if (slowly && done / kSlowStep != (done + size_t(r)) / kSlowStep)
      std::this_thread::sleep_for(std::chrono::microseconds(500));
    done += size_t(r);
  }
  return ssize_t(done);
}

// A stream rsocket listening on an ephemeral loopback port (its address in `where`), or -1.
int ListeningStreamSocket(int flags, sockaddr_in* where) {
  const int fd = rsocket(AF_INET, SOCK_STREAM | flags, 0);
  if (fd < 0) return -1;
  *where = Loopback(0);
  socklen_t len = sizeof *where;
  if (rbind(fd, reinterpret_cast<sockaddr*>(where), sizeof *where) != 0 || rlisten(fd, 4) != 0 ||
      rgetsockname(fd, reinterpret_cast<sockaddr*>(where), &len) != 0) {
    rclose(fd);
    return -1;
  }
  return fd;
}

// A connected pair of stream rsockets over loopback.
class StreamRsockets : public ::testing::Test {
 protected:
  void SetUp() override {
    sockaddr_in a{};
    const int listener = ListeningStreamSocket(0, &a);
    ASSERT_GE(listener, 0) << strerror(errno);
    int connected = -1;
    std::thread connector([&] {
      const int fd = rsocket(AF_INET, SOCK_STREAM, 0);
      if (fd >= 0 && rconnect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) {
        connected = fd;
      } else if (fd >= 0) {
        rclose(fd);
      }
    });
    a_ = raccept(listener, nullptr, nullptr);
    connector.join();
    b_ = connected;
    rclose(listener);
    ASSERT_GE(a_, 0) << strerror(errno);
    ASSERT_GE(b_, 0);
  }
  void TearDown() override {
    if (a_ >= 0) EXPECT_EQ(rclose(a_), 0);
    if (b_ >= 0) EXPECT_EQ(rclose(b_), 0);
  }

  int a_ = -1, b_ = -1;
};

// rgetsockname / rgetpeername keep getsockname(2)'s contract: the address is cut to the length given, the length
// returned is the address's full size, and a length of 0 with no buffer only asks that size (librspreload does so
// before it turns a socket whose rconnect failed into a TCP one; it got EINVAL).
TEST_F(StreamRsockets, AddressesAreCutToTheLengthGivenWhichSaysTheirSize) {
  for (auto get : {&rgetsockname, &rgetpeername}) {
    socklen_t len = 0;
    EXPECT_EQ(get(a_, nullptr, &len), 0) << strerror(errno);
    EXPECT_EQ(len, socklen_t(sizeof(sockaddr_in)));
    sockaddr_storage ss;
    std::memset(&ss, 0xee, sizeof ss);
    len = 2;  // the family only
    EXPECT_EQ(get(a_, reinterpret_cast<sockaddr*>(&ss), &len), 0);
    EXPECT_EQ(len, socklen_t(sizeof(sockaddr_in)));
    EXPECT_EQ(ss.ss_family, AF_INET);
    EXPECT_EQ(reinterpret_cast<const uint8_t*>(&ss)[2], 0xee);  // nothing past the length given
    len = sizeof ss;
    EXPECT_EQ(get(a_, reinterpret_cast<sockaddr*>(&ss), &len), 0);
    EXPECT_EQ(len, socklen_t(sizeof(sockaddr_in)));
    EXPECT_NE(reinterpret_cast<const sockaddr_in*>(&ss)->sin_port, 0);
    len = 4;
    errno = 0;
    EXPECT_EQ(get(a_, nullptr, &len), -1);  // a length but nowhere to put it
    EXPECT_EQ(errno, EFAULT);
  }
}

// Both sides write 8 MiB while they read the other's: each side's SENDs need the credits the other's reader frees,
// and those travel while both send queues are busy.
TEST_F(StreamRsockets, BothWaysAtOnceEveryByteArrives) {
  constexpr size_t kTotal = 8 << 20;
  ssize_t a_got = -2, b_got = -2;
  RunWithDeadline({[&] { EXPECT_TRUE(WritePattern(a_, kTotal, 100000, 1)); rshutdown(a_, SHUT_WR); },
                   [&] { EXPECT_TRUE(WritePattern(b_, kTotal, 65536, 2)); rshutdown(b_, SHUT_WR); },
                   [&] { a_got = ReadPattern(a_, 7000, 2); },
                   [&] { b_got = ReadPattern(b_, 300000, 1); }},
                  "8 MiB each way (the credits stopped?)", kStreamDeadline);
  EXPECT_EQ(a_got, ssize_t(kTotal));
  EXPECT_EQ(b_got, ssize_t(kTotal));
}

// A reader that takes a little at a time, slowly: the writer waits for its credits and nothing is lost.
TEST_F(StreamRsockets, ASlowReaderHoldsTheWriterBackWithoutLoss) {
  constexpr size_t kTotal = 2 << 20;
  ssize_t got = -2;
  RunWithDeadline({[&] { EXPECT_TRUE(WritePattern(a_, kTotal, 1 << 20, 3)); rshutdown(a_, SHUT_WR); },
                   [&] { got = ReadPattern(b_, 4096, 3, SIZE_MAX, /*slowly=*/true); }},
                  "a slow reader (the credits stopped?)", kStreamDeadline);
  EXPECT_EQ(got, ssize_t(kTotal));
}

// After one side's end of stream (rshutdown SHUT_WR) the other still streams to it: the half-closed side's reader
// frees buffers and its credits must still go back (its last credit was not spent on the end of stream).
TEST_F(StreamRsockets, AHalfClosedSideStillReceivesTheOthersStream) {
  constexpr size_t kFirst = 1 << 20, kSecond = 4 << 20;
  ssize_t b_got = -2, a_got = -2;
  RunWithDeadline({[&] {
                     EXPECT_TRUE(WritePattern(a_, kFirst, 1 << 20, 4));
                     EXPECT_EQ(rshutdown(a_, SHUT_WR), 0);
                   },
                   [&] {
                     b_got = ReadPattern(b_, 65536, 4);
                     EXPECT_TRUE(WritePattern(b_, kSecond, 1 << 20, 5));
                     rshutdown(b_, SHUT_WR);
                   },
                   [&] { a_got = ReadPattern(a_, 65536, 5); }},
                  "streaming to a half-closed side (the credits stopped?)", kStreamDeadline);
  EXPECT_EQ(b_got, ssize_t(kFirst));
  EXPECT_EQ(a_got, ssize_t(kSecond));
}

// A blocking rsend, rwritev or rsendmsg returns once all of it is on its way, as send(2) on a blocking TCP socket:
// 3 MiB, six times the receive buffers, in one call each, the reader slow. A short count here is taken for an error
// by programs such as rcopy, which sends a whole file in one rsend (it returned after the first 480 KiB).
TEST_F(StreamRsockets, ABlockingSendTakesEverything) {
  constexpr size_t kOne = 3 << 20;
  std::vector<uint8_t> data(3 * kOne);
  for (size_t i = 0; i < data.size(); ++i) data[i] = PatternByte(i, 6);
  ssize_t sent = -2, vector_sent = -2, msg_sent = -2, got = -2;
  RunWithDeadline({[&] {
                     sent = rsend(a_, data.data(), kOne, 0);
                     iovec iov[3] = {{data.data() + kOne, 1000}, {data.data() + kOne + 1000, kOne / 2 - 1000},
                                     {data.data() + kOne + kOne / 2, kOne / 2}};
                     vector_sent = rwritev(a_, iov, 3);
                     msghdr msg{};
                     iovec one{data.data() + 2 * kOne, kOne};
                     msg.msg_iov = &one;
                     msg.msg_iovlen = 1;
                     msg_sent = rsendmsg(a_, &msg, 0);
                     rshutdown(a_, SHUT_WR);
                   },
                   [&] { got = ReadPattern(b_, 8192, 6, SIZE_MAX, /*slowly=*/true); }},
                  "blocking sends of 3 MiB each", kStreamDeadline);
  EXPECT_EQ(sent, ssize_t(kOne));
  EXPECT_EQ(vector_sent, ssize_t(kOne));
  EXPECT_EQ(msg_sent, ssize_t(kOne));
  EXPECT_EQ(got, ssize_t(data.size()));
}

// A non-blocking one (MSG_DONTWAIT here) sends what the peer's credits allow and says how much.
TEST_F(StreamRsockets, ANonBlockingSendTakesWhatTheCreditsAllow) {
  std::vector<uint8_t> data(4 << 20, 0x5a);
  const ssize_t sent = rsend(a_, data.data(), data.size(), MSG_DONTWAIT);
  EXPECT_GT(sent, 0);
  EXPECT_LT(sent, ssize_t(data.size()));  // nobody reads: 4 MiB is beyond the receive buffers
  msghdr msg{};
  iovec one{data.data(), data.size()};
  msg.msg_iov = &one;
  msg.msg_iovlen = 1;
  errno = 0;
  EXPECT_EQ(rsendmsg(a_, &msg, MSG_DONTWAIT), -1);  // the credits are spent: rsendmsg honours its flags
  EXPECT_EQ(errno, EAGAIN);
}

// --- closing an rsocket another thread is blocked on -----------------------------------------------------------
// rclose frees the rsocket: a thread blocked on it must leave first, failing with EBADF, rather than wait on freed
// memory for ever (or read it when woken). `block` is the blocking call; the test aborts if it does not return.
void ExpectCloseEndsTheBlockedCall(int fd, const std::function<long()>& block, const char* what) {
  const CallResult r = EndABlockedCall(
      block, [&] { EXPECT_EQ(rclose(fd), 0) << strerror(errno); }, std::chrono::milliseconds(200),
      std::string(what) + " blocked on an rsocket being closed", kStreamDeadline);
  EXPECT_EQ(r.value, -1) << what;
  EXPECT_EQ(r.err, EBADF) << what;
}

TEST_F(StreamRsockets, ClosingEndsAReceiveBlockedOnIt) {
  char buf[16];
  ExpectCloseEndsTheBlockedCall(b_, [&] { return long(rrecv(b_, buf, sizeof buf, 0)); }, "rrecv");
  b_ = -1;  // closed
}

TEST_F(DatagramRsocket, ClosingEndsAReceiveBlockedOnIt) {
  char buf[16];
  ExpectCloseEndsTheBlockedCall(fd_, [&] { return long(rrecv(fd_, buf, sizeof buf, 0)); }, "rrecv");
  fd_ = -1;  // closed
}

// rshutdown(SHUT_RD), as shutdown(2) on a TCP socket: a receive blocked on the rsocket returns 0 at once, and so does
// every later one; the other direction goes on.
TEST_F(StreamRsockets, ShutdownForReadingEndsABlockedReceive) {
  char buf[16];
  const CallResult r = EndABlockedCall(
      [&] { return long(rrecv(b_, buf, sizeof buf, 0)); },
      [&] { EXPECT_EQ(rshutdown(b_, SHUT_RD), 0) << strerror(errno); }, std::chrono::milliseconds(200),
      "rrecv blocked on an rsocket shut down for reading", kStreamDeadline);
  EXPECT_EQ(r.value, 0);
  EXPECT_EQ(rrecv(b_, buf, sizeof buf, MSG_DONTWAIT), 0);
  ASSERT_EQ(rsend(b_, "out", 3, 0), 3) << strerror(errno);
  ASSERT_EQ(rrecv(a_, buf, 3, MSG_WAITALL), 3) << strerror(errno);
  EXPECT_EQ(std::string(buf, 3), "out");
  errno = 0;
  EXPECT_EQ(rshutdown(b_, 42), -1);
  EXPECT_EQ(errno, EINVAL);
}

TEST(ListeningRsocket, ClosingEndsAnAcceptBlockedOnIt) {
  sockaddr_in a{};
  const int listener = ListeningStreamSocket(0, &a);
  ASSERT_GE(listener, 0) << strerror(errno);
  ExpectCloseEndsTheBlockedCall(listener, [&] { return long(raccept(listener, nullptr, nullptr)); }, "raccept");
}

// --- who may connect --------------------------------------------------------------------------------------------
// A stream listener takes only connections that say they speak uroce's rsocket framing (their REQ's private data):
// an rdma_cm program dialling its port -- or rdma-core's rsockets from another host -- is rejected, and raccept never
// returns it; a real rsocket connects after it.
TEST(ListeningRsocket, AConnectionThatIsNotAnRsocketIsRejected) {
  sockaddr_in a{};
  const int listener = ListeningStreamSocket(SOCK_NONBLOCK, &a);
  ASSERT_GE(listener, 0) << strerror(errno);

  std::atomic<int> outcome{-1};  // the stranger's last CM event
  std::atomic<bool> done{false};
  std::thread stranger([&] {
    rdma_event_channel* ch = rdma_create_event_channel();
    rdma_cm_id* id = nullptr;
    rdma_cm_event* e = nullptr;
    auto next = [&](rdma_cm_event_type want) {
      if (rdma_get_cm_event(ch, &e) != 0) return false;
      const rdma_cm_event_type got = e->event;
      outcome = got;
      rdma_ack_cm_event(e);
      return got == want;
    };
    if (ch && rdma_create_id(ch, &id, nullptr, RDMA_PS_TCP) == 0 &&
        rdma_resolve_addr(id, nullptr, reinterpret_cast<sockaddr*>(&a), 2000) == 0 &&
        next(RDMA_CM_EVENT_ADDR_RESOLVED) && rdma_resolve_route(id, 2000) == 0 &&
        next(RDMA_CM_EVENT_ROUTE_RESOLVED)) {
      ibv_qp_init_attr qa{};
      qa.qp_type = IBV_QPT_RC;
      qa.cap.max_send_wr = qa.cap.max_recv_wr = 1;
      qa.cap.max_send_sge = qa.cap.max_recv_sge = 1;
      const char hello[] = "not an rsocket";
      rdma_conn_param param{};
      param.private_data = hello;
      param.private_data_len = sizeof hello;
      if (rdma_create_qp(id, nullptr, &qa) == 0 && rdma_connect(id, &param) == 0) next(RDMA_CM_EVENT_REJECTED);
      if (id->qp) rdma_destroy_qp(id);
    }
    if (id) rdma_destroy_id(id);
    if (ch) rdma_destroy_event_channel(ch);
    done = true;
  });
  // The listener works the CM's events inside raccept: it must keep returning EAGAIN while it refuses the stranger.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (!done && std::chrono::steady_clock::now() < deadline) {
    errno = 0;
    const int fd = raccept(listener, nullptr, nullptr);
    EXPECT_EQ(fd, -1) << "raccept returned a connection that is not an rsocket";
    if (fd >= 0) rclose(fd);
    EXPECT_EQ(errno, EAGAIN);
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_TRUE(done) << "the stranger's connection was neither refused nor accepted";
  stranger.join();
  EXPECT_EQ(outcome, RDMA_CM_EVENT_REJECTED);

  // A real rsocket still connects.
  int client = -1;
  std::thread connector([&] {
    const int fd = rsocket(AF_INET, SOCK_STREAM, 0);
    if (fd >= 0 && rconnect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) client = fd;
  });
  int server = -1;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (server < 0 && std::chrono::steady_clock::now() < until) {
    server = raccept(listener, nullptr, nullptr);
    if (server < 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  connector.join();
  ASSERT_GE(server, 0);
  ASSERT_GE(client, 0);
  char buf[4] = {};
  ASSERT_EQ(rsend(client, "hi", 2, 0), 2) << strerror(errno);
  pollfd p{server, POLLIN, 0};
  ASSERT_EQ(rpoll(&p, 1, 5000), 1);
  ASSERT_EQ(rrecv(server, buf, 2, 0), 2) << strerror(errno);
  EXPECT_EQ(std::string(buf, 2), "hi");
  rclose(client);
  rclose(server);
  rclose(listener);
}

// The path of a program built for this test (its runfiles), or "".
std::string Runfile(const std::string& path) {
  for (const char* var : {"TEST_SRCDIR", "RUNFILES_DIR"}) {
    const char* root = std::getenv(var);
    if (root == nullptr || root[0] == '\0') continue;
    const std::string full = std::string(root) + "/uroce/" + path;
    if (access(full.c_str(), X_OK) == 0) return full;
  }
  return "";
}

// The rsocket_test_peer process in `mode` ("die", "iomap") connected to a listener of ours: its pid and our end.
struct Peer {
  pid_t pid = -1;
  int fd = -1;
};
Peer StartPeer(const std::string& mode, size_t bytes) {
  Peer p;
  const std::string program = Runfile("rdmacm/rsocket_test_peer");
  EXPECT_FALSE(program.empty()) << "rdmacm/rsocket_test_peer is not in the runfiles";
  sockaddr_in where{};
  const int listener = ListeningStreamSocket(0, &where);
  EXPECT_GE(listener, 0) << strerror(errno);
  if (program.empty() || listener < 0) return p;
  const std::string port = std::to_string(ntohs(where.sin_port)), size = std::to_string(bytes);
  char* const argv[] = {const_cast<char*>(program.c_str()), const_cast<char*>(mode.c_str()),
                        const_cast<char*>(port.c_str()), const_cast<char*>(size.c_str()), nullptr};
  EXPECT_EQ(posix_spawn(&p.pid, program.c_str(), nullptr, nullptr, argv, environ), 0);
  RunWithDeadline({[&] { p.fd = raccept(listener, nullptr, nullptr); }}, "raccept of the peer", kStreamDeadline);
  EXPECT_GE(p.fd, 0) << strerror(errno);
  rclose(listener);
  return p;
}

// A peer whose process is killed (SIGKILL: no rclose, no end of stream, no disconnect) ends the stream as TCP's does
// once its peer is gone: what it sent is read, then a blocked rrecv returns 0 and rsend fails with ECONNRESET.
// uroce's connection manager notices the death (its PeerWatch) and speaks for the dead process with a DREQ, as the
// kernel does; the rsocket left the resulting DISCONNECTED unread on its channel, and both calls waited for ever.
TEST(StreamRsocketPeer, ADeadPeersStreamEndsAndSendsFail) {
  constexpr size_t kBytes = 100000;
  const Peer peer = StartPeer("die", kBytes);
  ASSERT_GE(peer.fd, 0);
  ssize_t got = -2, after_death = -2;
  RunWithDeadline({[&] {
                     got = ReadPattern(peer.fd, 8192, 0, kBytes);
                     rsend(peer.fd, "k", 1, 0);  // read: now it dies
                     char b;
                     after_death = rrecv(peer.fd, &b, 1, 0);
                   }},
                  "rrecv on a stream whose peer was killed", kStreamDeadline);
  EXPECT_EQ(got, ssize_t(kBytes));
  EXPECT_EQ(after_death, 0);  // the end of the stream
  int status = 0;
  ASSERT_EQ(waitpid(peer.pid, &status, 0), peer.pid);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << "the peer exited with status " << status;
  errno = 0;
  EXPECT_EQ(rsend(peer.fd, "x", 1, 0), -1);
  EXPECT_EQ(errno, ECONNRESET);
  EXPECT_EQ(rclose(peer.fd), 0);
}

// A blocking riowrite, like a blocking rsend, returns once all of it is on its way (rdma-core's waits for send
// buffers as often as it needs): 2 MiB, four times the send buffers, into the buffer a stopped peer riomap'ed. While
// the peer is stopped (SIGSTOP) nothing is acknowledged and the send buffers run out; it returned 512 KiB then.
TEST(StreamRsocketPeer, ABlockingRiowriteTakesEverything) {
  constexpr size_t kBytes = 2 << 20;
  const Peer peer = StartPeer("iomap", kBytes);
  ASSERT_GE(peer.fd, 0);
  char c = 0;
  ASSERT_EQ(rrecv(peer.fd, &c, 1, 0), 1);  // after its map's announcement on the same QP
  std::vector<uint8_t> data(kBytes);
  for (size_t i = 0; i < kBytes; ++i) data[i] = PatternByte(i, 0);
  ASSERT_EQ(kill(peer.pid, SIGSTOP), 0);
  int status = 0;
  ASSERT_EQ(waitpid(peer.pid, &status, WUNTRACED), peer.pid);  // stopped, all its threads
  ASSERT_TRUE(WIFSTOPPED(status));
  size_t written = 0;
  EndABlockedCall(
      [&] {
        written = riowrite(peer.fd, data.data(), kBytes, 0, 0);
        return long(rsend(peer.fd, "d", 1, 0));  // behind the RDMA WRITEs on the QP
      },
      [&] { kill(peer.pid, SIGCONT); }, std::chrono::milliseconds(100), "a blocking riowrite to a stopped peer",
      kStreamDeadline);
  EXPECT_EQ(written, kBytes);
  ASSERT_EQ(waitpid(peer.pid, &status, 0), peer.pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "the peer found the pattern: exit status " << status;
  EXPECT_EQ(rclose(peer.fd), 0);
}

}  // namespace
