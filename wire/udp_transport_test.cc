// The cases every UDP transport must pass (the Transport contract of wire/transport.h on a real socket), run
// against each implementation: UringTransport with multishot and with single-shot receives, and SocketTransport.
#include <arpa/inet.h>
#include <linux/filter.h>
#include <linux/if_packet.h>
#include <net/ethernet.h>
#include <net/if.h>
#include <netinet/ip.h>
#include <netinet/udp.h>
#include <poll.h>
#include <pthread.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include <gtest/gtest.h>

#include "wire/icrc.h"
#include "wire/socket_transport.h"
#include "wire/udp_test_util.h"
#include "wire/uring_transport.h"

namespace uroce::wire {
namespace {

// How to make each implementation; Create skips (sets *skip) where the kernel lacks what the kind needs.
struct UringMultishot {
  using Type = UringTransport;
  static int Create(const UdpEndpoint& bind, size_t max_datagram, std::unique_ptr<Type>* out, std::string* skip) {
    return CreateUring(bind, max_datagram, false, out, skip);
  }
  static int CreateUring(const UdpEndpoint& bind, size_t max_datagram, bool fallback, std::unique_ptr<Type>* out,
                         std::string* skip) {
    UringTransport::Options o;
    o.max_datagram = max_datagram;
    o.force_fallback_receive = fallback;
    const int r = UringTransport::Create(bind, o, out);
    if (r == -ENOSYS || r == -EPERM) *skip = "io_uring unavailable: " + std::string(strerror(-r));
    if (r == 0 && !fallback && !(*out)->multishot_active()) {
      *skip = "kernel lacks multishot recvmsg / provided buffer rings";
      out->reset();
    }
    if (r == 0 && *out) EXPECT_EQ((*out)->multishot_active(), !fallback);
    return r;
  }
};
// Linked single-shot receives.
struct UringSingleShot {
  using Type = UringTransport;
  static int Create(const UdpEndpoint& bind, size_t max_datagram, std::unique_ptr<Type>* out, std::string* skip) {
    return UringMultishot::CreateUring(bind, max_datagram, true, out, skip);
  }
};
struct Socket {
  using Type = SocketTransport;
  static int Create(const UdpEndpoint& bind, size_t max_datagram, std::unique_ptr<Type>* out, std::string*) {
    SocketTransport::Options o;
    o.max_datagram = max_datagram;
    return SocketTransport::Create(bind, o, out);
  }
};

struct KindNames {
  template <typename Kind>
  static std::string GetName(int) {
    if (std::is_same_v<Kind, UringMultishot>) return "UringMultishot";
    if (std::is_same_v<Kind, UringSingleShot>) return "UringSingleShot";
    return "Socket";
  }
};

template <typename Kind>
class UdpTransportTest : public testing::Test {
 protected:
  using T = typename Kind::Type;
  // Creates a transport; nullptr with skip_ set when the kernel lacks what this kind needs.
  std::unique_ptr<T> Make(const UdpEndpoint& bind = kLoopbackAnyPort, size_t max_datagram = 9216) {
    std::unique_ptr<T> t;
    const int r = Kind::Create(bind, max_datagram, &t, &skip_);
    if (skip_.empty()) EXPECT_EQ(r, 0) << strerror(-r);
    return t;
  }
  int CreateResult(const UdpEndpoint& bind) {
    std::unique_ptr<T> t;
    std::string skip;
    return Kind::Create(bind, 9216, &t, &skip);
  }
  std::string skip_;
};

using Kinds = testing::Types<UringMultishot, UringSingleShot, Socket>;
TYPED_TEST_SUITE(UdpTransportTest, Kinds, KindNames);

#define MAKE_OR_SKIP(var, ...)                               \
  auto var = this->Make(__VA_ARGS__);                        \
  if (!var) {                                                \
    if (!this->skip_.empty()) GTEST_SKIP() << this->skip_;   \
    FAIL();                                                  \
  }

TYPED_TEST(UdpTransportTest, DatagramsBothWays) {
  MAKE_OR_SKIP(a);
  MAKE_OR_SKIP(b);
  EXPECT_NE(a->local().port, 0);
  EXPECT_EQ(a->local().addr, IpAddress::V4(0x7f000001));
  const Flow flow = a->OutgoingFlow(b->local(), 0xC123);
  EXPECT_EQ(flow.src, a->local());  // a UDP socket sends from its bound port
  EXPECT_EQ(flow.dst, b->local());
  EXPECT_EQ(flow.ip_id, 0);

  const auto p = Numbered(7, 300);
  ExpectOneDatagramArrives(*a, *b, p, 0xC123);

  // The handler may Send (no lock held while it runs): b answers from inside its handler.
  MAKE_OR_SKIP(c);
  OutDatagram to_c{c->local(), 0, p};
  ASSERT_EQ(a->Send({&to_c, 1}), 1);
  OutDatagram to_b{b->local(), 0, p};
  ASSERT_EQ(c->Send({&to_b, 1}), 1);
  int answered = 0;
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (answered == 0 && std::chrono::steady_clock::now() < give_up) {
    b->Poll([&](const InDatagram& in) {
      OutDatagram back{in.src, 0, in.payload};
      EXPECT_EQ(b->Send({&back, 1}), 1);
      ++answered;
    }, 100'000'000);
  }
  EXPECT_EQ(answered, 1);
  EXPECT_EQ(ReceiveN(*c, 2).size(), 2u);  // from a, and b's answer
  EXPECT_EQ(a->counters().packets_sent, 2u);
  EXPECT_EQ(b->counters().packets_received, 2u);
}

TYPED_TEST(UdpTransportTest, ThousandBatchedFourKiBDatagramsArriveIntactAndInOrder) {
  MAKE_OR_SKIP(a);
  MAKE_OR_SKIP(b);
  constexpr uint32_t kCount = 1000, kBatch = 100;
  constexpr size_t kSize = 4096;
  std::vector<std::vector<uint8_t>> payloads;
  for (uint32_t i = 0; i < kCount; ++i) payloads.push_back(Numbered(i, kSize));
  std::vector<Received> got;
  // Lock-step per batch, so the receive buffer never overflows (loopback UDP drops when it does).
  for (uint32_t first = 0; first < kCount; first += kBatch) {
    std::vector<OutDatagram> batch;
    // Opaque bytes (no ICRC to re-seal), so that they arrive exactly as sent whether or not they travel as a run.
    for (uint32_t i = first; i < first + kBatch; ++i) batch.push_back({b->local(), 0, payloads[i], false});
    ASSERT_EQ(SendAll(*a, batch), batch.size());
    // Sends copied the payloads: scribbling on them now changes nothing on the wire.
    std::vector<std::vector<uint8_t>> saved(payloads.begin() + first, payloads.begin() + first + kBatch);
    for (uint32_t i = first; i < first + kBatch; ++i) std::fill(payloads[i].begin(), payloads[i].end(), 0xEE);
    auto part = ReceiveN(*b, kBatch);
    ASSERT_EQ(part.size(), kBatch);
    for (uint32_t i = 0; i < kBatch; ++i) payloads[first + i] = saved[i];
    got.insert(got.end(), part.begin(), part.end());
  }
  ASSERT_EQ(got.size(), kCount);
  for (uint32_t i = 0; i < kCount; ++i) ASSERT_EQ(got[i].payload, payloads[i]) << i;
  const UdpCounters sent = a->counters(), recv = b->counters();
  EXPECT_EQ(sent.packets_sent, kCount);
  EXPECT_EQ(sent.bytes_sent, kCount * kSize);
  EXPECT_EQ(sent.send_errors, 0u);
  EXPECT_EQ(recv.packets_received, kCount);
  EXPECT_EQ(recv.bytes_received, kCount * kSize);
  EXPECT_EQ(recv.receive_truncations, 0u);
}

// Application-driven progress: with receives disarmed, another thread's non-blocking Polls take every datagram —
// those the armed receive had already taken first, then those that waited in the socket — in order, and re-arming
// hands the socket back to a blocking Poll.
TYPED_TEST(UdpTransportTest, DisarmedReceivesArePolledFromAnotherThreadInOrder) {
  MAKE_OR_SKIP(a);
  MAKE_OR_SKIP(b);
  constexpr uint32_t kEach = 20;
  std::vector<std::vector<uint8_t>> payloads;
  for (uint32_t i = 0; i < 3 * kEach; ++i) payloads.push_back(Numbered(i, 512));
  auto send = [&](uint32_t first) {
    for (uint32_t i = first; i < first + kEach; ++i) {
      OutDatagram dg{b->local(), 0, payloads[i]};
      ASSERT_EQ(a->Send({&dg, 1}), 1);
    }
  };
  std::vector<std::vector<uint8_t>> got;
  auto keep = [&](const InDatagram& in) { got.emplace_back(in.payload.begin(), in.payload.end()); };
  EXPECT_EQ(b->Poll(keep, 0), 0);  // arms
  send(0);
  b->SetReceiveArmed(false);
  send(kEach);
  std::thread app([&] {
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (got.size() < 2 * kEach && std::chrono::steady_clock::now() < give_up) ASSERT_GE(b->Poll(keep, 0), 0);
  });
  app.join();
  ASSERT_EQ(got.size(), 2 * kEach);
  b->SetReceiveArmed(true);
  send(2 * kEach);
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (got.size() < 3 * kEach && std::chrono::steady_clock::now() < give_up) ASSERT_GE(b->Poll(keep, 100'000'000), 0);
  ASSERT_EQ(got.size(), 3 * kEach);
  for (uint32_t i = 0; i < 3 * kEach; ++i) EXPECT_EQ(got[i], payloads[i]) << i;
  EXPECT_EQ(b->counters().packets_received, 3 * kEach);
}

// Disarming consumes the cancelled receives' last completions itself: a transport destroyed before any Poll handled
// them has nothing left to cancel (it used to wait for the 2 s cancel give-up), and re-arming right away works.
TYPED_TEST(UdpTransportTest, DisarmedThenDestroyedOrRearmedBeforeAnyPoll) {
  MAKE_OR_SKIP(a);
  MAKE_OR_SKIP(b);
  MAKE_OR_SKIP(c);
  const auto p = Numbered(3, 100);
  for (auto* t : {b.get(), c.get()}) {
    EXPECT_EQ(t->Poll([](const InDatagram&) {}, 0), 0);  // arms
    OutDatagram dg{t->local(), 0, p};
    ASSERT_EQ(a->Send({&dg, 1}), 1);
    t->SetReceiveArmed(false);
  }
  c->SetReceiveArmed(true);
  OutDatagram again{c->local(), 0, p};
  ASSERT_EQ(a->Send({&again, 1}), 1);
  EXPECT_EQ(ReceiveN(*c, 2).size(), 2u);
  const auto t0 = std::chrono::steady_clock::now();
  b.reset();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(1));
}

TYPED_TEST(UdpTransportTest, IPv6Loopback) {
  const UdpEndpoint v6{*IpAddress::Parse("::1"), 0};
  const int r = this->CreateResult(v6);
  if (r == -EADDRNOTAVAIL || r == -EAFNOSUPPORT) GTEST_SKIP() << "no IPv6 loopback: " << strerror(-r);
  MAKE_OR_SKIP(a, v6);
  MAKE_OR_SKIP(b, v6);
  EXPECT_EQ(a->local().addr, *IpAddress::Parse("::1"));
  const auto p = Numbered(9, 1000);
  ExpectOneDatagramArrives(*a, *b, p);
  OutDatagram dg{b->local(), 0, p};
  // An IPv4 socket cannot reach an IPv6 destination.
  MAKE_OR_SKIP(v4);
  EXPECT_EQ(v4->Send({&dg, 1}), -EAFNOSUPPORT);
}

TYPED_TEST(UdpTransportTest, DestinationAddressComesFromPktinfo) {
  // Bound to the wildcard address, the socket learns from IP_PKTINFO which address a datagram was sent to.
  MAKE_OR_SKIP(any, UdpEndpoint{IpAddress::V4(0), 0});
  MAKE_OR_SKIP(a);
  EXPECT_EQ(any->local().addr, IpAddress::V4(0));
  const auto p = Numbered(1, 64);
  OutDatagram dg{UdpEndpoint{IpAddress::V4(0x7f000001), any->local().port}, 0, p};
  ASSERT_EQ(a->Send({&dg, 1}), 1);
  auto got = ReceiveN(*any, 1);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].dst, (UdpEndpoint{IpAddress::V4(0x7f000001), any->local().port}));
  EXPECT_EQ(got[0].src, a->local());
}

TYPED_TEST(UdpTransportTest, ASocketSendsFromTheAddressEachDatagramNames) {
  // A device with a GID per local address: each datagram leaves from the one its QP names (OutDatagram::src_addr,
  // IP_PKTINFO), a UDP_SEGMENT run included, and its ICRC holds for that address; from a socket on the wildcard and
  // from one bound to another of the addresses.
  MAKE_OR_SKIP(any, UdpEndpoint{IpAddress::V4(0), 0});
  MAKE_OR_SKIP(rx);
  // Two of the host's loopback addresses (all of 127.0.0.0/8 is local); the ports are ephemeral, so no other test's.
  const IpAddress first = IpAddress::V4(0x7f000001);
  const IpAddress second = IpAddress::V4(0x7f000001 + 1 + uint32_t(getpid() % 1000) * 256);
  std::vector<std::vector<uint8_t>> ps;
  std::vector<OutDatagram> batch;
  for (uint32_t i = 0; i < 6; ++i) ps.push_back(Numbered(i, 1036));
  for (uint32_t i = 0; i < 6; ++i) {
    OutDatagram dg{rx->local(), 0, ps[i]};
    dg.src_addr = i < 3 ? first : second;
    SealIcrc(OutgoingFlowFrom(*any, dg.src_addr, dg.dst, 0), ps[i]);
    batch.push_back(dg);
  }
  ASSERT_EQ(SendAll(*any, batch), batch.size());
  auto got = ReceiveN(*rx, batch.size());
  ASSERT_EQ(got.size(), batch.size());
  std::sort(got.begin(), got.end(), [](const Received& a, const Received& b) { return a.payload < b.payload; });
  for (uint32_t i = 0; i < 6; ++i) {
    // Each address's three went as one run, whose segment k carries IPv4 ID k and its ICRC re-sealed for it.
    ASSERT_EQ(got[i].payload.size(), ps[i].size());
    EXPECT_TRUE(std::equal(ps[i].begin(), ps[i].end() - 4, got[i].payload.begin())) << i;
    EXPECT_EQ(got[i].src, (UdpEndpoint{i < 3 ? first : second, any->local().port}));
    EXPECT_TRUE(VerifyIcrc(Flow{got[i].src, got[i].dst, uint16_t(i % 3)}, got[i].payload).ok) << i;
  }
  // A socket bound to one address sends from another the datagram names (the kernel takes IP_PKTINFO's over its own).
  MAKE_OR_SKIP(bound_one);
  ASSERT_EQ(bound_one->local().addr, first);
  OutDatagram from_second{rx->local(), 0, ps[5]};
  from_second.src_addr = second;
  ASSERT_EQ(bound_one->Send({&from_second, 1}), 1);
  auto one = ReceiveN(*rx, 1);
  ASSERT_EQ(one.size(), 1u);
  EXPECT_EQ(one[0].src, (UdpEndpoint{second, bound_one->local().port}));
  // An IPv4 socket has no IPv6 source.
  OutDatagram v6_source{rx->local(), 0, ps[0]};
  v6_source.src_addr = *IpAddress::Parse("::1");
  EXPECT_EQ(any->Send({&v6_source, 1}), -EAFNOSUPPORT);
}

TYPED_TEST(UdpTransportTest, WakeAndTimeout) {
  MAKE_OR_SKIP(a);
  std::thread waker([&] { a->Wake(); });
  EXPECT_EQ(a->Poll([](const InDatagram&) {}, -1), 0);
  waker.join();
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(a->Poll([](const InDatagram&) {}, 20'000'000), 0);
  EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(20));
  EXPECT_EQ(a->Poll([](const InDatagram&) {}, 0), 0);
}

TYPED_TEST(UdpTransportTest, TwoSendingThreadsWhilePolling) {
  MAKE_OR_SKIP(rx);
  MAKE_OR_SKIP(tx);  // one transport shared by both sender threads
  constexpr uint32_t kPerThread = 2000;
  std::atomic<uint64_t> received{0};
  std::vector<std::thread> senders;
  for (uint32_t s = 0; s < 2; ++s) {
    senders.emplace_back([&, s] {
      for (uint32_t i = 0; i < kPerThread; i += 10) {
        // Credit: the two senders stay within ~1000 datagrams of the receiver, so its buffer never overflows.
        const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(20);
        while (2 * uint64_t(i) > received.load() + 1000 && std::chrono::steady_clock::now() < give_up) {
          std::this_thread::yield();
        }
        std::vector<std::vector<uint8_t>> ps;
        std::vector<OutDatagram> batch;
        for (uint32_t k = i; k < i + 10; ++k) ps.push_back(Numbered(s << 24 | k, 64));
        for (auto& p : ps) batch.push_back({rx->local(), 0, p});
        ASSERT_EQ(SendAll(*tx, batch), batch.size());
      }
    });
  }
  uint32_t next[2] = {0, 0};
  bool in_order = true;
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (received.load() < 2 * kPerThread && std::chrono::steady_clock::now() < give_up) {
    const int n = rx->Poll([&](const InDatagram& in) {
      const uint32_t v = NumberOf(in.payload);
      const uint32_t s = v >> 24, k = v & 0xffffff;
      if (s > 1 || k != next[s]) in_order = false;
      if (s <= 1) next[s] = k + 1;
    }, 100'000'000);
    ASSERT_GE(n, 0);
    received += uint64_t(n);
  }
  for (auto& t : senders) t.join();
  EXPECT_EQ(received.load(), 2 * kPerThread);
  EXPECT_TRUE(in_order);  // each sender's datagrams arrive in its order
  EXPECT_EQ(tx->counters().packets_sent, 2 * kPerThread);
}

TYPED_TEST(UdpTransportTest, TruncatedDatagramsAreCountedNotDelivered) {
  MAKE_OR_SKIP(rx, kLoopbackAnyPort, 100);
  MAKE_OR_SKIP(tx);
  const auto big = Numbered(1, 200), fits = Numbered(2, 100);
  // One UDP_SEGMENT run where the sender has it (a shorter last segment), split again by the receiver.
  OutDatagram batch[2] = {{rx->local(), 0, big, false}, {rx->local(), 0, fits, false}};
  ASSERT_EQ(tx->Send(batch), 2);
  auto got = ReceiveN(*rx, 1);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].payload, fits);
  EXPECT_EQ(rx->counters().receive_truncations, 1u);
  // And a sender refuses what it could not hold.
  EXPECT_EQ(rx->Send({&batch[0], 1}), -EMSGSIZE);
}

TYPED_TEST(UdpTransportTest, FailedSendCompletionsAreCounted) {
  MAKE_OR_SKIP(a);
  // Broadcast without SO_BROADCAST fails with EACCES in the kernel (udp(7)), after Send queued it.
  const auto p = Numbered(1, 10);
  OutDatagram dg{UdpEndpoint{IpAddress::V4(0xffffffff), 9}, 0, p};
  ASSERT_EQ(a->Send({&dg, 1}), 1);
  UdpCounters c = a->counters();
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (c.send_errors == 0 && std::chrono::steady_clock::now() < give_up) {
    a->Poll([](const InDatagram&) {}, 1'000'000);
    c = a->counters();
  }
  EXPECT_EQ(c.send_errors, 1u);
  EXPECT_EQ(c.last_send_error, -EACCES);
  EXPECT_EQ(c.packets_sent, 0u);
}

// The ICRC covers the IPv4 Identification, so the sender must know it in advance: DF datagrams from an unconnected
// socket with IP_PMTUDISC_DO leave with ID 0 (DESIGN.md). Checked on the wire with a packet socket on lo (needs
// CAP_NET_RAW; skipped without it).
TYPED_TEST(UdpTransportTest, IPv4DatagramsLeaveWithDfAndIdZero) {
  MAKE_OR_SKIP(a);
  MAKE_OR_SKIP(b);
  const int ps = CaptureUdpOnLoopback(b->local().port);
  if (ps < 0) GTEST_SKIP() << "no packet socket on lo: " << strerror(-ps);
  const auto p = Numbered(1, 200);
  OutDatagram dg{b->local(), 0, p};
  std::vector<uint16_t> ids;
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  for (int sent = 0; sent < 3; ++sent) ASSERT_EQ(a->Send({&dg, 1}), 1);
  while (ids.size() < 3 && std::chrono::steady_clock::now() < give_up) {
    pollfd pfd{ps, POLLIN, 0};
    if (poll(&pfd, 1, 200) <= 0) {
      // Nothing for 200 ms: lo under the parallel suite's load lost a capture; every datagram is checked, so send
      // another rather than wait for one that will not come.
      ASSERT_EQ(a->Send({&dg, 1}), 1);
      continue;
    }
    uint8_t frame[2048];
    const ssize_t n = recv(ps, frame, sizeof frame, 0);
    if (n < ssize_t(sizeof(iphdr) + sizeof(udphdr))) continue;
    iphdr ip;
    std::memcpy(&ip, frame, sizeof ip);
    if (ip.protocol != IPPROTO_UDP || size_t(n) < ip.ihl * 4u + sizeof(udphdr)) continue;
    udphdr udp;
    std::memcpy(&udp, frame + ip.ihl * 4, sizeof udp);
    if (ntohs(udp.dest) != b->local().port || ntohs(udp.source) != a->local().port) continue;
    EXPECT_TRUE(ntohs(ip.frag_off) & IP_DF);
    ids.push_back(ntohs(ip.id));
  }
  close(ps);
  const UdpCounters c = a->counters();
  EXPECT_EQ(ids, (std::vector<uint16_t>{0, 0, 0}))
      << "sent " << c.packets_sent << ", send errors " << c.send_errors << " (last " << c.last_send_error << ")";
}

// An idle Poll sleeps in the kernel (it does not spin): the polling thread uses almost no CPU while it waits, and
// Wake() ends the wait.
TYPED_TEST(UdpTransportTest, IdlePollBlocksInTheKernelUntilWoken) {
  MAKE_OR_SKIP(a);
  std::atomic<bool> ready{false};
  clockid_t poller_clock{};
  int result = -1;
  std::thread poller([&] {
    pthread_getcpuclockid(pthread_self(), &poller_clock);
    ready = true;
    result = a->Poll([](const InDatagram&) {}, -1);
  });
  while (!ready) std::this_thread::yield();
  auto cpu_ns = [&] {
    timespec ts{};
    clock_gettime(poller_clock, &ts);
    return int64_t(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
  };
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // let it reach the wait
  const int64_t before = cpu_ns();
  const auto wall0 = std::chrono::steady_clock::now();
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const int64_t used = cpu_ns() - before;
  const auto wall = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - wall0);
  a->Wake();
  poller.join();
  EXPECT_EQ(result, 0);
  EXPECT_LT(used, wall.count() / 20) << "the idle poller used " << used << " ns of CPU in " << wall.count() << " ns";
}

// A Send of more datagrams than one kernel call takes (64 per sendmmsg, 256 io_uring slots) sends them all, in order.
TYPED_TEST(UdpTransportTest, OneSendOfManyDatagrams) {
  MAKE_OR_SKIP(a);
  MAKE_OR_SKIP(b);
  constexpr uint32_t kCount = 300;
  std::vector<std::vector<uint8_t>> ps;
  for (uint32_t i = 0; i < kCount; ++i) ps.push_back(Numbered(i, 64));
  std::vector<OutDatagram> batch;
  for (auto& p : ps) batch.push_back({b->local(), 0, p});
  ASSERT_EQ(a->Send(batch), int(kCount));
  auto got = ReceiveN(*b, kCount);
  ASSERT_EQ(got.size(), kCount);
  for (uint32_t i = 0; i < kCount; ++i) ASSERT_EQ(NumberOf(got[i].payload), i);
}

// Equal-size RoCE packets to one peer leave as one UDP_SEGMENT run where the kernel has it (a shorter last packet
// ends the run) and arrive as separate datagrams, in order, whole; packet k's ICRC is re-sealed for the IPv4
// Identification Linux gives segment k of a run, k (the kernel's numbering itself is checked where the kernel splits
// the run, by wire/segmented_wire_test). The receiver tells the ID by solving the ICRC for it.
TYPED_TEST(UdpTransportTest, RunsOfPacketsLeaveSegmentedEachSealedForItsIpId) {
  MAKE_OR_SKIP(a);
  MAKE_OR_SKIP(b);
  constexpr uint32_t kCount = 21;
  const std::vector<std::vector<uint8_t>> ps = SealedRun(*a, b->local(), kCount);
  std::vector<OutDatagram> batch;
  for (auto& p : ps) batch.push_back({b->local(), 0, p});
  ASSERT_EQ(a->Send(batch), int(kCount));
  auto got = ReceiveN(*b, kCount);
  ASSERT_EQ(got.size(), kCount);
  const bool segmented = a->segmenting();
  for (uint32_t i = 0; i < kCount; ++i) {
    ASSERT_EQ(got[i].payload.size(), ps[i].size()) << i;
    EXPECT_TRUE(std::equal(ps[i].begin(), ps[i].end() - 4, got[i].payload.begin())) << i;
    const std::optional<uint16_t> id = RecoverIpId(Flow{a->local(), b->local(), 0}, got[i].payload);
    ASSERT_TRUE(id.has_value()) << i;
    EXPECT_EQ(*id, segmented ? i : 0) << i;
  }
  const UdpCounters sent = a->counters(), received = b->counters();
  EXPECT_EQ(sent.packets_sent, kCount);
  EXPECT_EQ(received.packets_received, kCount);
  EXPECT_EQ(sent.segmented_sends, segmented ? 1u : 0u);
  // Loopback hands a run over whole; a receiver with UDP_GRO takes it in one receive.
  EXPECT_EQ(received.coalesced_receives, segmented && b->coalescing() ? 1u : 0u);
  if (!segmented) GTEST_SKIP() << "the kernel lacks UDP_SEGMENT: sent one datagram at a time";
}

// Opaque payloads (has_icrc false) travel in runs unchanged, and a run longer than one UDP_SEGMENT send takes
// (64 segments) is split into several.
TYPED_TEST(UdpTransportTest, LongRunsOfOpaqueDatagramsArriveUnchanged) {
  MAKE_OR_SKIP(a);
  MAKE_OR_SKIP(b);
  constexpr uint32_t kCount = 150;
  std::vector<std::vector<uint8_t>> ps;
  std::vector<OutDatagram> batch;
  for (uint32_t i = 0; i < kCount; ++i) ps.push_back(Numbered(i, 256));
  for (auto& p : ps) batch.push_back({b->local(), 0, p, false});
  ASSERT_EQ(SendAll(*a, batch), batch.size());
  auto got = ReceiveN(*b, kCount);
  ASSERT_EQ(got.size(), kCount);
  for (uint32_t i = 0; i < kCount; ++i) ASSERT_EQ(got[i].payload, ps[i]) << i;
  if (a->segmenting()) EXPECT_GE(a->counters().segmented_sends, 3u);
}

TYPED_TEST(UdpTransportTest, AddressInUse) {
  MAKE_OR_SKIP(a);
  EXPECT_EQ(this->CreateResult(a->local()), -EADDRINUSE);
  EXPECT_EQ(this->CreateResult(UdpEndpoint{*IpAddress::Parse("192.0.2.1"), 0}), -EADDRNOTAVAIL);  // TEST-NET-1
}

}  // namespace
}  // namespace uroce::wire
