// The window shared by every RC requester of a device towards one peer (emu/congestion.h): its arithmetic, and on
// the simulated network that many QPs never put more in flight than it allows, give every packet back to it, and
// finish under loss.
#include "emu/congestion.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "emu/test_fabric.h"
#include "wire/fault_model.h"

namespace uroce::emu {
namespace {

using testing::Buffer;
using testing::Drain;

TEST(PathWindow, SlowStartDoublesPerWindowThenLossHalvesOncePerEpisode) {
  PathWindow w;
  EXPECT_EQ(w.window(), PathWindow::kInitial);
  EXPECT_EQ(w.phase(), PathWindow::Phase::kSlowStart);
  w.Charge(32);
  EXPECT_FALSE(w.MaySend());
  w.OnDelivered(32);
  w.Charge(-32);
  EXPECT_EQ(w.window(), 64);  // one more packet per packet delivered
  EXPECT_TRUE(w.MaySend());
  w.Charge(64);
  w.OnCongestion();
  EXPECT_EQ(w.window(), 32);
  EXPECT_EQ(w.phase(), PathWindow::Phase::kCongestionAvoidance);
  w.OnCongestion();  // the same episode: what was in flight at the first signal has not been delivered yet
  EXPECT_EQ(w.window(), 32);
  EXPECT_EQ(w.decreases(), 1u);
  w.OnDelivered(64);
  w.Charge(-64);
  EXPECT_DOUBLE_EQ(w.window(), 32 + 64.0 / 32);  // additive: one packet per window delivered
  w.OnCongestion();
  EXPECT_EQ(w.decreases(), 2u);
  w.Charge(-w.in_flight());
  for (int i = 0; i < 10; ++i) {
    w.OnDelivered(1);  // nothing in flight: each signal is a new episode
    w.OnCongestion();
  }
  EXPECT_EQ(w.window(), PathWindow::kMin);  // never below
  for (int i = 0; i < 100000; ++i) w.OnDelivered(100);
  EXPECT_EQ(w.window(), PathWindow::kMax);
  w.Charge(-1'000'000);
  EXPECT_EQ(w.in_flight(), 0);  // never negative
  EXPECT_EQ(ToString(PathWindow::Phase::kCongestionAvoidance), "congestion-avoidance");
}

// 64 RC QPs from one device to another, each writing 8 messages of 64 KiB (64 packets each at MTU 1024) at once:
// 32768 packets offered, never more than the shared window in flight, everything delivered, and the path's count
// back to zero at the end.
struct ManyQps {
  static constexpr int kQps = 64;
  static constexpr int kMessages = 8;
  static constexpr uint32_t kLen = 65536;
  testing::Fabric fabric;
  testing::Node *a, *b;
  ProtectionDomain *pa, *pb;
  CompletionQueue *sa, *rb;
  std::vector<QueuePair*> qa, qb;
  Buffer src, dst;

  // `timeout`: every QP's local ACK timeout attribute (4.096 us << timeout).
  explicit ManyQps(const wire::FaultConfig& faults = {}, uint8_t timeout = testing::RcAttributes{}.timeout) {
    a = &fabric.AddNode(Mtu::k1024);
    b = &fabric.AddNode(Mtu::k1024);
    if (faults.any()) fabric.network().SetDefaultFaults(faults);
    pa = a->device->AllocPd();
    pb = b->device->AllocPd();
    EXPECT_EQ(a->device->CreateCq(4096, &sa), 0);
    EXPECT_EQ(b->device->CreateCq(4096, &rb), 0);
    testing::RcAttributes rc;
    rc.access = access::kRemoteWrite;
    rc.timeout = timeout;
    for (int i = 0; i < kQps; ++i) {
      qa.push_back(testing::CreateConnectedQp(*a->device, QpType::kRc, pa, sa, nullptr, 0));
      qb.push_back(testing::CreateConnectedQp(*b->device, QpType::kRc, pb, rb, nullptr, 0));
    }
    for (int i = 0; i < kQps; ++i) {
      testing::ConnectRc(*a->device, qa[i], *b->device, qb[i]->qpn(), rc);
      testing::ConnectRc(*b->device, qb[i], *a->device, qa[i]->qpn(), rc);
    }
    src = testing::Register(*a->device, pa, kLen, access::kLocalWrite);
    dst = testing::Register(*b->device, pb, size_t{kLen} * kQps, access::kLocalWrite | access::kRemoteWrite);
    for (size_t i = 0; i < src.bytes.size(); ++i) src.bytes[i] = uint8_t(i * 7 + 1);
  }

  void PostAll() {
    for (int m = 0; m < kMessages; ++m) {
      for (int i = 0; i < kQps; ++i) {
        SendWr wr;
        wr.wr_id = uint64_t(i) * 100 + m;
        wr.opcode = SendOpcode::kRdmaWrite;
        wr.flags = send_flags::kSignaled;
        wr.sg_list = {src.At(0, kLen)};
        wr.remote_addr = dst.mr.iova + uint64_t(i) * kLen;
        wr.rkey = dst.mr.rkey;
        ASSERT_EQ(a->device->PostSend(qa[i], std::move(wr)), 0);
      }
    }
  }

  void ExpectAllDelivered() {
    const auto done = Drain(sa);
    ASSERT_EQ(done.size(), size_t{kQps} * kMessages);
    for (const Completion& c : done) EXPECT_EQ(c.status, WcStatus::kSuccess) << ToString(c.status);
    for (int i = 0; i < kQps; ++i)
      EXPECT_TRUE(std::equal(src.bytes.begin(), src.bytes.end(), dst.bytes.begin() + size_t{kLen} * i)) << i;
    const auto w = a->device->path_window(b->device->config().address);
    ASSERT_TRUE(w.has_value());
    EXPECT_EQ(w->in_flight(), 0);
    EXPECT_TRUE(w->waiting().empty());
  }
};

// Waiters are woken when a burst fits (a quarter of the window here, kWakeBurst in a large one) or nothing is in
// flight, not for each packet an ACK frees.
TEST(PathWindow, WaitersAreWokenForABurstNotForEveryPacket) {
  PathWindow w;
  ASSERT_EQ(w.window(), 32);
  w.Charge(32);
  EXPECT_FALSE(w.MaySend());
  EXPECT_FALSE(w.MayWake());
  w.Charge(-2);
  EXPECT_TRUE(w.MaySend());   // a requester already sending may go on
  EXPECT_FALSE(w.MayWake());  // but 2 packets are no reason to wake the waiters
  w.Charge(-6);
  EXPECT_TRUE(w.MayWake());  // 8 = 32 / 4
  w.Charge(10);
  w.OnDelivered(200);  // slow start: the window grows to 232
  ASSERT_GT(w.window() / 4, PathWindow::kWakeBurst);
  w.Charge(int64_t(w.window()) - w.in_flight() - 15);
  EXPECT_FALSE(w.MayWake());  // 15 free: under one burst
  w.Charge(-1);
  EXPECT_TRUE(w.MayWake());
  PathWindow idle;
  idle.Charge(0);
  EXPECT_TRUE(idle.MayWake());  // nothing in flight: no ACK would come to wake them later
}

// RFC 6298's smoothing: the first sample sets srtt and half of it as rttvar; later ones move srtt by 1/8 of the
// difference and rttvar by 1/4 of the deviation from it.
// Unreliable pacing (DCQCN's reaction point, simplest form): unlimited until a CNP, then kUnreliableInitialRate, halved
// by each later CNP at most once per interval, 1.5 times faster per quiet recovery period, unlimited again at the top.
TEST(PathWindow, UnreliablePacingFollowsCnps) {
  PathWindow w;
  EXPECT_EQ(w.UnreliableSendAt(1000), 0u) << "unlimited before any CNP";
  w.ChargeUnreliable(4096, 1000);
  EXPECT_EQ(w.UnreliableSendAt(1000), 0u);
  w.OnUnreliableCnp(1000);
  EXPECT_DOUBLE_EQ(w.unreliable_rate(), PathWindow::kUnreliableInitialRate);
  w.ChargeUnreliable(1000, 1000);  // 1000 bytes at 1 byte/ns: the next may leave 1000 ns later
  EXPECT_EQ(w.UnreliableSendAt(1000), 2000u);
  w.OnUnreliableCnp(1000 + PathWindow::kUnreliableCnpIntervalNs / 2);  // within the interval: not a new signal
  EXPECT_DOUBLE_EQ(w.unreliable_rate(), PathWindow::kUnreliableInitialRate);
  w.OnUnreliableCnp(1000 + PathWindow::kUnreliableCnpIntervalNs);
  EXPECT_DOUBLE_EQ(w.unreliable_rate(), PathWindow::kUnreliableInitialRate / 2);
  for (int i = 2; i < 20; ++i) w.OnUnreliableCnp(1000 + uint64_t(i) * PathWindow::kUnreliableCnpIntervalNs);
  EXPECT_DOUBLE_EQ(w.unreliable_rate(), PathWindow::kUnreliableMinRate) << "never below the minimum";
  // Quiet: each recovery period multiplies the rate by 1.5 until it is unlimited again.
  const uint64_t quiet = 1000 + 19 * PathWindow::kUnreliableCnpIntervalNs;
  w.UnreliableSendAt(quiet + PathWindow::kUnreliableRecoveryNs);
  EXPECT_DOUBLE_EQ(w.unreliable_rate(), PathWindow::kUnreliableMinRate * 1.5);
  EXPECT_EQ(w.UnreliableSendAt(quiet + 100 * PathWindow::kUnreliableRecoveryNs), 0u);
  EXPECT_EQ(w.unreliable_rate(), 0);
}

TEST(PathWindow, RoundTripSamplesAreSmoothedAsRfc6298) {
  PathWindow w;
  EXPECT_EQ(w.srtt_ns(), 0u);
  w.OnRoundTrip(800);
  EXPECT_EQ(w.srtt_ns(), 800u);
  EXPECT_EQ(w.rttvar_ns(), 400u);
  w.OnRoundTrip(1600);  // deviation 800: rttvar 400 - 100 + 200, srtt 800 - 100 + 200
  EXPECT_EQ(w.rttvar_ns(), 500u);
  EXPECT_EQ(w.srtt_ns(), 900u);
  for (int i = 0; i < 200; ++i) w.OnRoundTrip(1600);  // a steady round trip: srtt converges, rttvar shrinks
  EXPECT_NEAR(double(w.srtt_ns()), 1600.0, 8.0);
  EXPECT_LT(w.rttvar_ns(), 10u);
}

TEST(PathWindowOnTheWire, ManyQpsShareOneWindowAndDeliverEverything) {
  ManyQps t;
  t.PostAll();
  int64_t most = 0;
  while (t.fabric.Step()) {
    const auto w = t.a->device->path_window(t.b->device->config().address);
    ASSERT_TRUE(w.has_value());
    ASSERT_LE(w->in_flight(), int64_t(w->window()) + 1) << "window " << w->window();
    most = std::max(most, w->in_flight());
  }
  t.ExpectAllDelivered();
  EXPECT_GT(most, int64_t(PathWindow::kInitial));  // it grew while nothing was lost
  EXPECT_GT(t.a->device->counters().rc_path_waits, 0u);
  EXPECT_EQ(t.a->device->counters().rc_congestion_signals, 0u);
  EXPECT_EQ(t.a->device->counters().rc_retransmit_timeouts, 0u);
}

TEST(PathWindowOnTheWire, LossCutsTheWindowAndEveryQpStillFinishes) {
  wire::FaultConfig faults;
  faults.loss = 0.01;
  faults.seed = 5;
  ManyQps t(faults);
  t.PostAll();
  t.fabric.Pump(10'000'000);
  t.ExpectAllDelivered();
  EXPECT_GT(t.a->device->counters().rc_congestion_signals, 0u);
  const auto w = t.a->device->path_window(t.b->device->config().address);
  ASSERT_TRUE(w.has_value());
  EXPECT_GT(w->decreases(), 0u);
  // Retransmissions stay a small multiple of what was lost: no storm.
  const uint64_t needed = uint64_t{ManyQps::kQps} * ManyQps::kMessages * 64;
  EXPECT_LT(t.a->device->counters().tx_packets, needed * 3 / 2) << FormatCounters(t.a->device->counters());
}

// Under loss, with QPs queued for the window, a QP's lost tail is found within round trips (RcRequester::
// SilenceMeansLoss), not by the local ACK timeout, which held the whole path meanwhile.
TEST(PathWindowOnTheWire, UnderLossALostTailIsFoundWithoutTheLocalAckTimeout) {
  wire::FaultConfig faults;
  faults.loss = 0.01;
  faults.delay_ns = 20'000;
  for (uint64_t seed = 1; seed <= 4; ++seed) {
    faults.seed = seed;
    ManyQps t(faults);
    t.PostAll();
    t.fabric.Pump(10'000'000);
    t.ExpectAllDelivered();
    const DeviceCounters c = t.a->device->counters();
    EXPECT_GT(c.rc_path_waits, 0u);  // QPs did wait for the window
    EXPECT_GT(c.rc_early_retransmits, 0u) << FormatCounters(c);
    EXPECT_EQ(c.rc_retransmit_timeouts, 0u) << "seed " << seed << "\n" << FormatCounters(c);
  }
}

// A requester that waited for the window for longer than its local ACK timeout resumes with the timer started anew:
// it runs on while the requester only waits (OnTimers re-arms it without spending a retry), and a deadline left from
// the wait fired before the ACK of what the requester had just sent could come back. Here every datagram takes 200 us
// and the timeout is 524 us: each round trip fits, but 64 QPs queue for the window for many of them.
TEST(PathWindowOnTheWire, ARequesterResumingAfterALongWaitGetsAWholeTimeoutForItsAck) {
  wire::FaultConfig faults;
  faults.delay_ns = 200'000;
  ManyQps t(faults, /*timeout=*/7);
  t.PostAll();
  t.fabric.Pump(10'000'000);
  t.ExpectAllDelivered();
  EXPECT_GT(t.a->device->counters().rc_path_waits, 0u);  // QPs did wait for the window
  EXPECT_EQ(t.a->device->counters().rc_retransmit_timeouts, 0u) << FormatCounters(t.a->device->counters());
}

}  // namespace
}  // namespace uroce::emu
