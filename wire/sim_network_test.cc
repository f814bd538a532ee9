#include "wire/sim_network.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <thread>
#include <vector>

namespace uroce::wire {
namespace {

UdpEndpoint Ep(uint32_t v4, uint16_t port = kRoceV2UdpPort) { return UdpEndpoint{IpAddress::V4(v4), port}; }

// A 32-byte datagram carrying its number.
std::vector<uint8_t> Numbered(uint32_t n) {
  std::vector<uint8_t> p(32);
  for (size_t i = 0; i < p.size(); ++i) p[i] = uint8_t(n * 7 + i);
  std::memcpy(p.data(), &n, sizeof n);
  return p;
}

struct Got {
  std::vector<uint8_t> payload;
  uint64_t time;
  bool operator==(const Got&) const = default;
};

// Drains `t` by stepping the clock to each next delivery time.
std::vector<Got> DrainAll(SimNetwork& net, ManualClock& clock, Transport& t) {
  std::vector<Got> got;
  while (true) {
    t.Poll([&](const InDatagram& in) { got.push_back({{in.payload.begin(), in.payload.end()}, in.timestamp_ns}); }, 0);
    auto next = net.NextDeliveryNs();
    if (!next) break;
    if (*next > clock.NowNs()) clock.Set(*next);
  }
  return got;
}

TEST(SimNetworkTest, AHostOfSeveralAddressesReceivesAtEachAndSendsFromTheOneNamed) {
  ManualClock clock(1'000'000);
  SimNetwork net(clock);
  const IpAddress second = IpAddress::V4(0x0a000101);
  auto host = net.Attach(Ep(0x0a000001), std::span<const IpAddress>(&second, 1));
  auto peer = net.Attach(Ep(0x0a000002));
  ASSERT_TRUE(host && peer);
  EXPECT_EQ(net.Attach(Ep(0x0a000101)), nullptr);  // taken by the host
  // The peer reaches the host at either address, and the host sees which.
  const auto p0 = Numbered(0), p1 = Numbered(1);
  OutDatagram to_first{Ep(0x0a000001), 0, p0}, to_second{UdpEndpoint{second, kRoceV2UdpPort}, 0, p1};
  OutDatagram both[] = {to_first, to_second};
  ASSERT_EQ(peer->Send(both), 2);
  auto take = [&](Transport& t) {
    std::vector<std::pair<UdpEndpoint, UdpEndpoint>> got;  // (src, dst)
    t.Poll([&](const InDatagram& in) { got.emplace_back(in.src, in.dst); }, 0);
    return got;
  };
  auto at_host = take(*host);
  ASSERT_EQ(at_host.size(), 2u);
  EXPECT_EQ(at_host[0].second, Ep(0x0a000001));
  EXPECT_EQ(at_host[1].second, (UdpEndpoint{second, kRoceV2UdpPort}));
  // The host answers from the address each datagram names; an address it lacks is unroutable.
  OutDatagram from_second{Ep(0x0a000002), 0, p0};
  from_second.src_addr = second;
  OutDatagram from_elsewhere{Ep(0x0a000002), 0, p1};
  from_elsewhere.src_addr = IpAddress::V4(0x0a000202);
  OutDatagram answers[] = {from_second, from_elsewhere};
  EXPECT_EQ(host->Send(answers), 2);
  auto at_peer = take(*peer);
  ASSERT_EQ(at_peer.size(), 1u);
  EXPECT_EQ(at_peer[0].first, (UdpEndpoint{second, kRoceV2UdpPort}));
  EXPECT_EQ(net.unroutable(), 1u);
  EXPECT_EQ(OutgoingFlowFrom(*host, second, Ep(0x0a000002), 0).src, (UdpEndpoint{second, kRoceV2UdpPort}));
  // Gone, the host frees both addresses.
  host.reset();
  EXPECT_NE(net.Attach(Ep(0x0a000101)), nullptr);
}

class SimFaultMixTest : public testing::TestWithParam<const char*> {};

// Sends 2000 numbered datagrams, one every microsecond, and checks that the receiver sees exactly what the link's
// FaultModel prescribes for each index: which are lost, duplicated, corrupted (and which bit), and the order that
// the delays imply.
TEST_P(SimFaultMixTest, DeliversExactlyWhatTheModelPrescribes) {
  auto config = FaultConfig::Parse(GetParam());
  ASSERT_TRUE(config);
  ManualClock clock(1'000'000);
  SimNetwork net(clock);
  const UdpEndpoint a = Ep(0x0a000001), b = Ep(0x0a000002);
  auto ta = net.Attach(a);
  auto tb = net.Attach(b);
  ASSERT_TRUE(ta && tb);
  net.SetFaults(a, b, *config);

  constexpr uint32_t kCount = 2000;
  const FaultModel model(*config, FaultStreamId(a, b));
  std::vector<Got> expected;
  FaultCounters expected_counters;
  auto expect = [&](uint32_t i, uint64_t now) {
    const std::vector<uint8_t> payload = Numbered(i);
    const FaultDecision d = model.Decide(i, payload.size());
    expected_counters.Count(d);
    for (int copy = 0; copy < (d.drop ? 0 : d.copies); ++copy) {
      std::vector<uint8_t> p = payload;
      if (copy == 0 && d.corrupt_bit >= 0) p[size_t(d.corrupt_bit) / 8] ^= uint8_t(0x80 >> (d.corrupt_bit % 8));
      expected.push_back({p, now + d.extra_delay_ns});
    }
  };
  for (uint32_t i = 0; i < kCount;) {
    const std::vector<uint8_t> first = Numbered(i), second = Numbered(i + 1);
    if (i % 5 == 3 && i + 1 < kCount) {
      // A batch of two goes out at one instant and must behave as two single sends.
      std::vector<OutDatagram> batch = {{b, 0, first}, {b, 0, second}};
      ASSERT_EQ(ta->Send(batch), 2);
      expect(i, clock.NowNs());
      expect(i + 1, clock.NowNs());
      i += 2;
    } else {
      OutDatagram dg{b, 0, first};
      ASSERT_EQ(ta->Send({&dg, 1}), 1);
      expect(i, clock.NowNs());
      i += 1;
    }
    clock.Advance(1000);
  }
  // Delivery order is (time, send order); expected was built in send order.
  std::stable_sort(expected.begin(), expected.end(), [](const Got& x, const Got& y) { return x.time < y.time; });

  const std::vector<Got> got = DrainAll(net, clock, *tb);
  ASSERT_EQ(got.size(), expected.size());
  for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], expected[i]) << "delivery " << i;
  EXPECT_EQ(net.counters(a, b), expected_counters);
  EXPECT_EQ(net.counters(a, b).seen, kCount);

  // Large-N sanity: the observed rates are near the configured ones.
  const double n = kCount, kept = double(kCount - expected_counters.dropped);
  auto near = [](double count, double p, double of) { EXPECT_NEAR(count, p * of, 6 * std::sqrt(p * of) + 1); };
  near(double(expected_counters.dropped), config->loss, n);
  near(double(expected_counters.duplicated), config->duplicate, kept);
  near(double(expected_counters.reordered), config->reorder, kept);
  near(double(expected_counters.corrupted), config->corrupt, kept);
  if (config->reorder > 0) {
    // Reordering really happened: some delivery carries a smaller number than the one before it.
    bool out_of_order = false;
    for (size_t i = 1; i < got.size(); ++i) {
      uint32_t x, y;
      std::memcpy(&x, got[i - 1].payload.data(), 4);
      std::memcpy(&y, got[i].payload.data(), 4);
      out_of_order |= y < x;
    }
    EXPECT_TRUE(out_of_order);
  }
}

INSTANTIATE_TEST_SUITE_P(Mixes, SimFaultMixTest,
                         testing::Values("", "loss=0.05,seed=3", "dup=0.05,seed=4", "reorder=0.1,reorder_delay_us=5",
                                         "corrupt=0.05,seed=5",
                                         "loss=0.02,dup=0.01,reorder=0.02,corrupt=0.001,delay_us=50,seed=7",
                                         "loss=0.1,dup=0.1,reorder=0.2,corrupt=0.1,delay_ns=300,"
                                         "reorder_delay_ns=2500,seed=11"));

std::vector<SimTraceEvent> RunScenario(uint64_t seed) {
  ManualClock clock;
  SimNetwork net(clock);
  net.EnableTrace(true);
  FaultConfig c;
  c.loss = 0.05;
  c.duplicate = 0.05;
  c.reorder = 0.1;
  c.corrupt = 0.05;
  c.reorder_delay_ns = 3000;
  c.seed = seed;
  net.SetDefaultFaults(c);
  const UdpEndpoint a = Ep(0x0a000001), b = Ep(0x0a000002);
  auto ta = net.Attach(a);
  auto tb = net.Attach(b);
  // Ping-pong: b echoes everything back to a, so both directions and handler-side sends are exercised.
  for (uint32_t i = 0; i < 300; ++i) {
    auto p = Numbered(i);
    OutDatagram dg{b, uint16_t(0xC000 + i % 7), p};
    ta->Send({&dg, 1});
    clock.Advance(500);
    tb->Poll([&](const InDatagram& in) {
      OutDatagram back{a, 0, in.payload};  // in.src carries the flow port, which nobody listens on
      tb->Send({&back, 1});
    }, 0);
    ta->Poll([](const InDatagram&) {}, 0);
  }
  DrainAll(net, clock, *tb);
  DrainAll(net, clock, *ta);
  return net.trace();
}

TEST(SimNetworkTest, SameSeedSameTraceDifferentSeedDifferentTrace) {
  const auto t1 = RunScenario(42);
  const auto t2 = RunScenario(42);
  const auto t3 = RunScenario(43);
  ASSERT_GT(t1.size(), 600u);
  EXPECT_EQ(t1, t2);
  EXPECT_NE(t1, t3);
  size_t delivered = std::count_if(t1.begin(), t1.end(),
                                   [](const SimTraceEvent& e) { return e.kind == SimTraceEvent::Kind::kDelivered; });
  EXPECT_GT(delivered, 400u);
  EXPECT_FALSE(t1.front().ToString().empty());
}

TEST(SimNetworkTest, DelayAndNextDeliveryWithManualClock) {
  ManualClock clock(1000);
  SimNetwork net(clock);
  const UdpEndpoint a = Ep(0x7f000001, 5000), b = Ep(0x7f000001, 5001);
  auto ta = net.Attach(a);
  auto tb = net.Attach(b);
  FaultConfig c;
  c.delay_ns = 50'000;
  net.SetFaults(a, b, c);
  EXPECT_FALSE(net.NextDeliveryNs());
  auto p = Numbered(1);
  OutDatagram dg{b, 0xC123, p};
  ASSERT_EQ(ta->Send({&dg, 1}), 1);
  ASSERT_EQ(net.NextDeliveryNs(), 51'000u);
  int n = 0;
  InDatagram seen;
  std::vector<uint8_t> bytes;
  auto handler = [&](const InDatagram& in) {
    ++n;
    seen = in;
    bytes.assign(in.payload.begin(), in.payload.end());
  };
  EXPECT_EQ(tb->Poll(handler, 0), 0);
  clock.Set(50'999);
  EXPECT_EQ(tb->Poll(handler, 0), 0);
  clock.Set(51'000);
  EXPECT_EQ(tb->Poll(handler, 0), 1);
  EXPECT_EQ(n, 1);
  EXPECT_EQ(bytes, p);
  EXPECT_EQ(seen.timestamp_ns, 51'000u);
  EXPECT_EQ(seen.src, (UdpEndpoint{a.addr, 0xC123}));  // the requested source port is honoured
  EXPECT_EQ(seen.dst, b);
  EXPECT_EQ(seen.ip_id, std::optional<uint16_t>(0));
  EXPECT_FALSE(net.NextDeliveryNs());
  EXPECT_EQ(net.counters(a, b).delayed, 1u);
  // The reverse direction has no faults.
  OutDatagram back{a, 0, p};
  ASSERT_EQ(tb->Send({&back, 1}), 1);
  EXPECT_EQ(net.NextDeliveryNs(), 51'000u);
  EXPECT_EQ(ta->Poll(handler, 0), 1);
}

TEST(SimNetworkTest, AttachDetachAndUnroutable) {
  ManualClock clock;
  SimNetwork net(clock);
  const UdpEndpoint a = Ep(0x0a000001);
  auto t1 = net.Attach(a);
  ASSERT_TRUE(t1);
  EXPECT_EQ(t1->local(), a);
  EXPECT_FALSE(net.Attach(a));
  auto eph1 = net.Attach(Ep(0x0a000001, 0));
  auto eph2 = net.Attach(Ep(0x0a000001, 0));
  ASSERT_TRUE(eph1 && eph2);
  EXPECT_NE(eph1->local().port, 0);
  EXPECT_NE(eph1->local().port, eph2->local().port);

  // To an endpoint nobody holds: silently dropped, counted.
  auto p = Numbered(0);
  OutDatagram dg{Ep(0x0a000009), 0, p};
  EXPECT_EQ(t1->Send({&dg, 1}), 1);
  EXPECT_EQ(net.unroutable(), 1u);

  // Queued datagrams are discarded on detach, and the endpoint is free again.
  OutDatagram to_a{a, 0, p};
  EXPECT_EQ(eph1->Send({&to_a, 1}), 1);
  EXPECT_TRUE(net.NextDeliveryNs());
  t1.reset();
  EXPECT_FALSE(net.NextDeliveryNs());
  auto t2 = net.Attach(a);
  ASSERT_TRUE(t2);
  EXPECT_EQ(t2->Poll([](const InDatagram&) {}, 0), 0);

  const Flow f = t2->OutgoingFlow(Ep(0x0a000002), 0xC001);
  EXPECT_EQ(f.src, (UdpEndpoint{a.addr, 0xC001}));
  EXPECT_EQ(f.dst, Ep(0x0a000002));
  EXPECT_EQ(f.ip_id, 0);
  EXPECT_EQ(t2->OutgoingFlow(Ep(0x0a000002), 0).src, a);
}

TEST(SimNetworkTest, IPv6HasNoIpId) {
  ManualClock clock;
  SimNetwork net(clock);
  const UdpEndpoint a{*IpAddress::Parse("fd00::1"), 4791}, b{*IpAddress::Parse("fd00::2"), 4791};
  auto ta = net.Attach(a);
  auto tb = net.Attach(b);
  auto p = Numbered(3);
  OutDatagram dg{b, 0, p};
  ta->Send({&dg, 1});
  std::optional<uint16_t> id = 5;
  EXPECT_EQ(tb->Poll([&](const InDatagram& in) { id = in.ip_id; }, 0), 1);
  EXPECT_FALSE(id);
}

TEST(SimNetworkTest, NetworkObjectMayDieBeforeItsTransports) {
  ManualClock clock;
  auto net = std::make_unique<SimNetwork>(clock);
  auto ta = net->Attach(Ep(1));
  auto tb = net->Attach(Ep(2));
  net.reset();
  auto p = Numbered(0);
  OutDatagram dg{Ep(2), 0, p};
  EXPECT_EQ(ta->Send({&dg, 1}), 1);
  EXPECT_EQ(tb->Poll([](const InDatagram&) {}, 0), 1);
}

TEST(SimNetworkTest, BlockingPollWithSystemClock) {
  SimNetwork net(SystemClock::Instance());
  const UdpEndpoint a = Ep(0x0a000001), b = Ep(0x0a000002);
  auto ta = net.Attach(a);
  auto tb = net.Attach(b);

  // Wake() from another thread ends a Poll that would wait forever (and one pending wake is remembered).
  {
    std::thread waker([&] { tb->Wake(); });
    EXPECT_EQ(tb->Poll([](const InDatagram&) {}, -1), 0);
    waker.join();
  }
  // A datagram sent from another thread ends a blocking Poll.
  {
    auto p = Numbered(1);
    std::thread sender([&] {
      OutDatagram dg{b, 0, p};
      ta->Send({&dg, 1});
    });
    int n = 0;
    while (n == 0) n = tb->Poll([](const InDatagram&) {}, -1);
    EXPECT_EQ(n, 1);
    sender.join();
  }
  // A delayed datagram: Poll sleeps until it is due, not until the timeout.
  {
    FaultConfig c;
    c.delay_ns = 20'000'000;
    net.SetFaults(a, b, c);
    auto p = Numbered(2);
    OutDatagram dg{b, 0, p};
    const uint64_t t0 = SystemClock::Instance().NowNs();
    ta->Send({&dg, 1});
    uint64_t stamp = 0;
    EXPECT_EQ(tb->Poll([&](const InDatagram& in) { stamp = in.timestamp_ns; }, 10'000'000'000), 1);
    const uint64_t t1 = SystemClock::Instance().NowNs();
    EXPECT_GE(t1 - t0, 20'000'000u);
    EXPECT_LT(t1 - t0, 5'000'000'000u);
    EXPECT_GE(stamp, t0 + 20'000'000);
  }
  // The timeout is honoured when nothing comes.
  {
    const uint64_t t0 = SystemClock::Instance().NowNs();
    EXPECT_EQ(tb->Poll([](const InDatagram&) {}, 5'000'000), 0);
    EXPECT_GE(SystemClock::Instance().NowNs() - t0, 5'000'000u);
  }
}

TEST(SimNetworkTest, ConcurrentSendersAndPoller) {
  SimNetwork net(SystemClock::Instance());
  const UdpEndpoint b = Ep(0x0a0000ff);
  auto tb = net.Attach(b);
  constexpr int kPerThread = 2000;
  std::vector<std::thread> senders;
  for (uint32_t s = 0; s < 2; ++s) {
    senders.emplace_back([&, s] {
      auto t = net.Attach(Ep(0x0a000001 + s));
      for (uint32_t i = 0; i < kPerThread; ++i) {
        auto p = Numbered(i);
        OutDatagram dg{b, 0, p};
        t->Send({&dg, 1});
      }
    });
  }
  int got = 0;
  while (got < 2 * kPerThread) {
    const int n = tb->Poll([](const InDatagram&) {}, 1'000'000'000);
    ASSERT_GE(n, 0);
    got += n;
  }
  for (auto& t : senders) t.join();
  EXPECT_EQ(got, 2 * kPerThread);
}

}  // namespace
}  // namespace uroce::wire
