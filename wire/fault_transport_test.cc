#include "wire/fault_transport.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <thread>
#include <tuple>
#include <vector>

#include "wire/sim_network.h"

namespace uroce::wire {
namespace {

UdpEndpoint Ep(uint32_t v4, uint16_t port = kRoceV2UdpPort) { return UdpEndpoint{IpAddress::V4(v4), port}; }

std::vector<uint8_t> Numbered(uint32_t n) {
  std::vector<uint8_t> p(24);
  for (size_t i = 0; i < p.size(); ++i) p[i] = uint8_t(n * 13 + i);
  std::memcpy(p.data(), &n, sizeof n);
  return p;
}

std::vector<uint8_t> Flipped(std::vector<uint8_t> p, int bit) {
  FlipBit(p, bit);
  return p;
}

struct Fixture {
  ManualClock clock{1'000'000};
  SimNetwork net{clock};
  UdpEndpoint a = Ep(0x0a000001), b = Ep(0x0a000002);
};

// Send-side faults around a SimNetwork: every decision of the decorator's model is visible at the receiver, with
// held (delayed / reordered) datagrams released at their time, before the datagram sent at that instant.
TEST(FaultInjectingTransportTest, SendFaultsAreExactlyTheModelsDecisions) {
  Fixture f;
  FaultConfig c = *FaultConfig::Parse("loss=0.05,dup=0.05,reorder=0.1,corrupt=0.05,delay_ns=2000,"
                                      "reorder_delay_ns=7000,seed=21");
  FaultInjectingTransport ta(f.net.Attach(f.a), f.clock, c, FaultConfig{}, 77);
  auto tb = f.net.Attach(f.b);
  EXPECT_EQ(ta.local(), f.a);
  EXPECT_EQ(ta.OutgoingFlow(f.b, 0xC00F).src, (UdpEndpoint{f.a.addr, 0xC00F}));

  constexpr uint32_t kCount = 2000;
  // key: (release time, released-from-hold first, send sequence)
  std::vector<std::tuple<uint64_t, int, uint64_t, std::vector<uint8_t>>> expected;
  FaultCounters expected_counters;
  uint64_t seq = 0;
  std::vector<std::vector<uint8_t>> got;
  auto collect = [&](const InDatagram& in) { got.emplace_back(in.payload.begin(), in.payload.end()); };
  for (uint32_t i = 0; i < kCount; ++i) {
    const std::vector<uint8_t> p = Numbered(i);
    const std::vector<uint8_t> before = p;
    OutDatagram dg{f.b, 0, p};
    ASSERT_EQ(ta.Send({&dg, 1}), 1);
    EXPECT_EQ(p, before);  // the caller's buffer is never modified
    const FaultDecision d = FaultModel(c, 77).Decide(i, p.size());
    EXPECT_EQ(d, ta.send_model().Decide(i, p.size()));
    expected_counters.Count(d);
    for (int copy = 0; copy < (d.drop ? 0 : d.copies); ++copy) {
      expected.emplace_back(f.clock.NowNs() + d.extra_delay_ns, d.extra_delay_ns ? 0 : 1, seq++,
                            copy == 0 ? Flipped(p, d.corrupt_bit) : p);
    }
    tb->Poll(collect, 0);
    f.clock.Advance(1000);
  }
  while (ta.held_sends() > 0) {
    ASSERT_EQ(ta.Poll([](const InDatagram&) {}, 0), 0);
    tb->Poll(collect, 0);
    f.clock.Advance(1000);
  }
  tb->Poll(collect, 0);
  std::sort(expected.begin(), expected.end());
  ASSERT_EQ(got.size(), expected.size());
  for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], std::get<3>(expected[i])) << i;
  EXPECT_EQ(ta.send_counters(), expected_counters);
  EXPECT_GT(expected_counters.dropped, 50u);
  EXPECT_GT(expected_counters.reordered, 100u);
  EXPECT_EQ(ta.receive_counters(), FaultCounters{});
}

TEST(FaultInjectingTransportTest, ReceiveFaultsAreExactlyTheModelsDecisions) {
  Fixture f;
  FaultConfig rc = *FaultConfig::Parse("loss=0.1,dup=0.1,corrupt=0.1,seed=5");
  auto ta = f.net.Attach(f.a);
  FaultInjectingTransport tb(f.net.Attach(f.b), f.clock, FaultConfig{}, rc, 9);
  std::vector<std::vector<uint8_t>> expected, got;
  FaultCounters counters;
  for (uint32_t i = 0; i < 1000; ++i) {
    const auto p = Numbered(i);
    OutDatagram dg{f.b, 0, p};
    ASSERT_EQ(ta->Send({&dg, 1}), 1);
    const FaultDecision d = tb.receive_model().Decide(i, p.size());
    EXPECT_EQ(d, FaultModel(rc, 10).Decide(i, p.size()));
    counters.Count(d);
    for (int copy = 0; copy < (d.drop ? 0 : d.copies); ++copy) expected.push_back(copy ? p : Flipped(p, d.corrupt_bit));
  }
  int n;
  while ((n = tb.Poll([&](const InDatagram& in) { got.emplace_back(in.payload.begin(), in.payload.end()); }, 0)) > 0) {
  }
  EXPECT_EQ(n, 0);
  EXPECT_EQ(got, expected);
  EXPECT_EQ(tb.receive_counters(), counters);
}

// An inner transport whose datagrams come vouched for (as a same-host peer's do), and which records whether what it
// is given to send was altered.
class VouchingTransport final : public Transport {
 public:
  UdpEndpoint local() const override { return {}; }
  Flow OutgoingFlow(const UdpEndpoint& dst, uint16_t) const override { return Flow{{}, dst, 0}; }
  int Send(std::span<const OutDatagram> batch) override {
    for (const OutDatagram& d : batch) sent.emplace_back(std::vector<uint8_t>(d.payload.begin(), d.payload.end()), d.altered);
    return int(batch.size());
  }
  int Poll(const DatagramHandler& handler, int64_t) override {
    for (const auto& p : incoming) {
      InDatagram d;
      d.payload = p;
      d.icrc_vouched = true;
      handler(d);
    }
    const int n = int(incoming.size());
    incoming.clear();
    return n;
  }
  void Wake() override {}
  std::vector<std::pair<std::vector<uint8_t>, bool>> sent;  // payload, altered
  std::vector<std::vector<uint8_t>> incoming;
};

// Whatever a fault injector flips stops being vouched for: marked altered on the way out (also when it is held back
// to be sent late), and no longer vouched on the way in. The intact copies keep what they had.
TEST(FaultInjectingTransportTest, ACorruptedDatagramIsNeverVouchedFor) {
  ManualClock clock{1'000'000};
  const FaultConfig faults = *FaultConfig::Parse("corrupt=0.3,dup=0.2,reorder=0.3,reorder_delay_ns=5000,seed=3");
  auto inner = std::make_unique<VouchingTransport>();
  VouchingTransport* in = inner.get();
  FaultInjectingTransport t(std::move(inner), clock, faults, faults, 5);
  size_t copies = 0, received = 0, vouched = 0;
  // Each payload's bytes XOR to 0, so a datagram with one bit flipped is told from an intact one by itself.
  auto with_parity = [](std::vector<uint8_t> p) {
    uint8_t x = 0;
    for (size_t k = 0; k + 1 < p.size(); ++k) x ^= p[k];
    p.back() = x;
    return p;
  };
  auto intact = [](const std::vector<uint8_t>& p) {
    uint8_t x = 0;
    for (uint8_t b : p) x ^= b;
    return x == 0;
  };
  for (uint32_t i = 0; i < 400; ++i) {
    const auto p = with_parity(Numbered(i));
    OutDatagram dg{{}, 0, p};
    ASSERT_EQ(t.Send({&dg, 1}), 1);
    copies += size_t(t.send_model().Decide(i, p.size()).copies);
    clock.Advance(1000);
    in->incoming.push_back(p);
    received += size_t(t.receive_model().Decide(i, p.size()).copies);
  }
  auto check = [&](const InDatagram& d) {
    const std::vector<uint8_t> payload(d.payload.begin(), d.payload.end());
    EXPECT_EQ(d.icrc_vouched, intact(payload));
    vouched += d.icrc_vouched;
    --received;
  };
  ASSERT_GT(t.Poll(check, 0), 0);
  clock.Advance(10'000);
  t.Poll(check, 0);  // sends what was held back, delivers what was held back
  EXPECT_EQ(received, 0u);
  EXPECT_GT(vouched, 200u);
  ASSERT_EQ(t.held_sends(), 0u);
  ASSERT_EQ(in->sent.size(), copies);
  size_t altered = 0;
  for (const auto& [payload, was_altered] : in->sent) {
    EXPECT_EQ(was_altered, !intact(payload));
    altered += was_altered;
  }
  EXPECT_GT(altered, 50u);
}

TEST(FaultInjectingTransportTest, DelayedReceivesAreHeldUntilDue) {
  Fixture f;
  FaultConfig rc;
  rc.delay_ns = 5000;
  rc.reorder = 0.5;
  rc.reorder_delay_ns = 3000;
  auto ta = f.net.Attach(f.a);
  FaultInjectingTransport tb(f.net.Attach(f.b), f.clock, FaultConfig{}, rc);
  std::vector<uint64_t> stamps;
  auto h = [&](const InDatagram& in) { stamps.push_back(in.timestamp_ns); };
  const auto p = Numbered(1);
  OutDatagram dg{f.b, 0, p};
  ta->Send({&dg, 1});
  const uint64_t t0 = f.clock.NowNs();
  EXPECT_EQ(tb.Poll(h, 0), 0);  // taken from the network and held
  EXPECT_EQ(tb.held_receives(), 1u);
  const uint64_t due = *tb.NextReleaseNs();
  EXPECT_EQ(due, t0 + tb.receive_model().Decide(0, p.size()).extra_delay_ns);
  f.clock.Set(due - 1);
  EXPECT_EQ(tb.Poll(h, 0), 0);
  f.clock.Set(due);
  EXPECT_EQ(tb.Poll(h, 0), 1);
  EXPECT_EQ(stamps, std::vector<uint64_t>{due});
  EXPECT_FALSE(tb.NextReleaseNs());
}

// An inner transport with limited room, to check partial sends.
class RoomLimitedTransport final : public Transport {
 public:
  UdpEndpoint local() const override { return {}; }
  Flow OutgoingFlow(const UdpEndpoint& dst, uint16_t) const override { return {{}, dst, 0}; }
  int Send(std::span<const OutDatagram> batch) override {
    if (room == 0) return -ENOBUFS;
    const size_t n = std::min(room, batch.size());
    for (size_t i = 0; i < n; ++i) sent.emplace_back(batch[i].payload.begin(), batch[i].payload.end());
    room -= n;
    return int(n);
  }
  int Poll(const DatagramHandler&, int64_t) override { return 0; }
  void Wake() override {}
  size_t room = 0;
  std::vector<std::vector<uint8_t>> sent;
};

TEST(FaultInjectingTransportTest, PartialInnerSendsKeepDecisionsForTheRetry) {
  ManualClock clock;
  auto inner = std::make_unique<RoomLimitedTransport>();
  RoomLimitedTransport* raw = inner.get();
  FaultConfig c;
  c.duplicate = 0.3;
  c.seed = 3;
  FaultInjectingTransport t(std::move(inner), clock, c);
  std::vector<std::vector<uint8_t>> payloads;
  for (uint32_t i = 0; i < 10; ++i) payloads.push_back(Numbered(i));
  std::vector<OutDatagram> batch;
  for (const auto& p : payloads) batch.push_back({Ep(1), 0, p});

  raw->room = 0;
  EXPECT_EQ(t.Send(batch), -ENOBUFS);
  EXPECT_EQ(t.send_counters().seen, 0u);

  size_t offset = 0;
  while (offset < batch.size()) {
    raw->room = 3;
    const int n = t.Send(std::span(batch).subspan(offset));
    ASSERT_GT(n, 0);
    offset += size_t(n);
  }
  // Every datagram went out with the copies its index prescribes (a duplicate cut by the room limit loses its
  // second copy, as a network may).
  std::vector<std::vector<uint8_t>> firsts;
  for (size_t i = 0; i < raw->sent.size(); ++i) {
    if (i == 0 || raw->sent[i] != raw->sent[i - 1]) firsts.push_back(raw->sent[i]);
  }
  EXPECT_EQ(firsts, payloads);
  EXPECT_EQ(t.send_counters().seen, 10u);
  FaultCounters expected;
  for (uint64_t i = 0; i < 10; ++i) expected.Count(t.send_model().Decide(i, payloads[i].size()));
  EXPECT_EQ(t.send_counters(), expected);
}

TEST(FaultInjectingTransportTest, PollShortensItsWaitToHeldDatagramsWithSystemClock) {
  SimNetwork net(SystemClock::Instance());
  const UdpEndpoint a = Ep(0x0a000001), b = Ep(0x0a000002);
  FaultConfig delay;
  delay.delay_ns = 20'000'000;
  // Receive side: Poll(-1) must come back with the datagram once it is due, though the inner network is idle.
  {
    auto ta = net.Attach(a);
    FaultInjectingTransport tb(net.Attach(b), SystemClock::Instance(), FaultConfig{}, delay);
    const auto p = Numbered(1);
    OutDatagram dg{b, 0, p};
    const uint64_t t0 = SystemClock::Instance().NowNs();
    ta->Send({&dg, 1});
    int n = 0;
    while (n == 0) n = tb.Poll([](const InDatagram&) {}, -1);
    EXPECT_EQ(n, 1);
    EXPECT_GE(SystemClock::Instance().NowNs() - t0, 20'000'000u);
  }
  // Send side: the sender's own Poll releases the held datagram at its time.
  {
    FaultInjectingTransport ta(net.Attach(a), SystemClock::Instance(), delay);
    auto tb = net.Attach(b);
    const auto p = Numbered(2);
    OutDatagram dg{b, 0, p};
    ta.Send({&dg, 1});
    EXPECT_EQ(ta.held_sends(), 1u);
    EXPECT_EQ(tb->Poll([](const InDatagram&) {}, 0), 0);
    EXPECT_EQ(ta.Poll([](const InDatagram&) {}, 60'000'000), 0);
    EXPECT_EQ(ta.held_sends(), 0u);
    EXPECT_EQ(tb->Poll([](const InDatagram&) {}, 0), 1);
  }
}

TEST(FaultInjectingTransportTest, WakeEndsABlockingPoll) {
  SimNetwork net(SystemClock::Instance());
  FaultConfig rc;
  rc.loss = 0.5;
  FaultInjectingTransport t(net.Attach(Ep(1)), SystemClock::Instance(), FaultConfig{}, rc);
  std::thread waker([&] { t.Wake(); });
  EXPECT_EQ(t.Poll([](const InDatagram&) {}, -1), 0);
  waker.join();
}

}  // namespace
}  // namespace uroce::wire
