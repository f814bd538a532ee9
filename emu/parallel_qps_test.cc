// QPs in parallel: several application threads post and poll on their own QPs of one Device while a progress thread
// per device processes packets and timers, and another thread creates, registers and destroys objects meanwhile --
// the shapes of a multi-threaded RDMA program. Each QP's bytes and completions must come out as if it ran alone. Run
// under --config=tsan, this is where a data race between QPs, or between the data path and the object verbs, shows.
#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "emu/device.h"
#include "emu/test_fabric.h"
#include "wire/clock.h"
#include "wire/sim_network.h"

namespace uroce::emu {
namespace {

using testing::Drain;
using testing::Register;

constexpr int kQps = 4;
constexpr int kWritesPerQp = 300;
constexpr uint32_t kChunk = 3000;  // bytes per WRITE: not a multiple of the 1024 MTU, so messages span packets
constexpr uint32_t kAccess = access::kLocalWrite | access::kRemoteWrite | access::kRemoteRead;

struct Side {
  std::unique_ptr<wire::Transport> transport;
  std::unique_ptr<Device> device;
  ProtectionDomain* pd = nullptr;
};

Side MakeSide(wire::SimNetwork& net, uint32_t ip) {
  Side s;
  const wire::UdpEndpoint ep{wire::IpAddress::V4(ip), wire::kRoceV2UdpPort};
  s.transport = net.Attach(ep);
  DeviceConfig cfg;
  cfg.address = ep.addr;
  cfg.active_mtu = Mtu::k1024;
  cfg.node_guid = ip;
  s.device = std::make_unique<Device>(cfg, *s.transport, wire::SystemClock::Instance());
  s.pd = s.device->AllocPd();
  return s;
}

// The progress thread of one device: receives, and runs the timers, until told to stop.
void Progress(Side& side, const std::atomic<bool>& stop) {
  Device& dev = *side.device;
  while (!stop.load()) {
    side.transport->Poll([&](const wire::InDatagram& d) { dev.OnDatagram(d, Device::AckTiming::kHeld); },
                         200'000);
    dev.SendHeldAcks();
    dev.RunTimers();
  }
}

TEST(ParallelQps, ApplicationThreadsOnTheirOwnQpsDeliverEveryByteWhileObjectsComeAndGo) {
  wire::SimNetwork net(wire::SystemClock::Instance());
  Side a = MakeSide(net, 0x0a000001);
  Side b = MakeSide(net, 0x0a000002);

  struct Pair {
    CompletionQueue *cq_a = nullptr, *cq_b = nullptr;
    QueuePair *qa = nullptr, *qb = nullptr;
    testing::Buffer src, dst;
  };
  std::vector<Pair> pairs(kQps);
  for (Pair& p : pairs) {
    ASSERT_EQ(a.device->CreateCq(1024, &p.cq_a), 0);
    ASSERT_EQ(b.device->CreateCq(1024, &p.cq_b), 0);
    p.qa = testing::CreateConnectedQp(*a.device, QpType::kRc, a.pd, p.cq_a, nullptr, 0);
    p.qb = testing::CreateConnectedQp(*b.device, QpType::kRc, b.pd, p.cq_b, nullptr, 0);
    ASSERT_NE(p.qa, nullptr);
    ASSERT_NE(p.qb, nullptr);
    testing::Connect(*a.device, p.qa, *b.device, p.qb->qpn(), kAccess);
    testing::Connect(*b.device, p.qb, *a.device, p.qa->qpn(), kAccess);
    p.src = Register(*a.device, a.pd, size_t{kChunk} * kWritesPerQp, kAccess);
    p.dst = Register(*b.device, b.pd, size_t{kChunk} * kWritesPerQp, kAccess);
  }
  for (int q = 0; q < kQps; ++q)
    for (size_t i = 0; i < pairs[q].src.bytes.size(); ++i) pairs[q].src.bytes[i] = static_cast<uint8_t>(i * 7 + q);

  std::atomic<bool> stop{false};
  std::thread progress_a([&] { Progress(a, stop); });
  std::thread progress_b([&] { Progress(b, stop); });

  // Meanwhile another thread creates and destroys CQs, QPs and MRs on the same device (the verbs that take the
  // device's object lock exclusively) and queries the busy QPs.
  std::atomic<int> churned{0};
  std::thread churn([&] {
    std::vector<uint8_t> scratch(4096);
    while (!stop.load()) {
      CompletionQueue* cq = nullptr;
      ASSERT_EQ(a.device->CreateCq(16, &cq), 0);
      QueuePair* qp = testing::CreateConnectedQp(*a.device, QpType::kRc, a.pd, cq, nullptr, 0);
      ASSERT_NE(qp, nullptr);
      MemoryRegion mr;
      ASSERT_EQ(a.device->RegisterMr(a.pd, scratch.data(), scratch.size(), reinterpret_cast<uint64_t>(scratch.data()),
                                     kAccess, &mr),
                0);
      QpAttributes attr;
      ASSERT_EQ(a.device->QueryQp(pairs[churned % kQps].qa, &attr), 0);
      EXPECT_EQ(attr.qp_state, QpState::kRts);
      ASSERT_EQ(a.device->DeregisterMr(mr.lkey), 0);
      ASSERT_EQ(a.device->DestroyQp(qp), 0);
      ASSERT_EQ(a.device->DestroyCq(cq), 0);
      ++churned;
    }
  });

  // One application thread per QP: WRITEs with a window of 16 outstanding, each signaled, polled on its own CQ.
  std::vector<int> completed(kQps, 0), failed(kQps, 0);
  std::vector<std::thread> apps;
  for (int q = 0; q < kQps; ++q) {
    apps.emplace_back([&, q] {
      Pair& p = pairs[q];
      int posted = 0;
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
      while (completed[q] + failed[q] < kWritesPerQp && std::chrono::steady_clock::now() < deadline) {
        while (posted < kWritesPerQp && posted - completed[q] - failed[q] < 16) {
          SendWr wr;
          wr.wr_id = static_cast<uint64_t>(posted);
          wr.opcode = SendOpcode::kRdmaWrite;
          wr.flags = send_flags::kSignaled;
          wr.sg_list = {p.src.At(uint64_t{kChunk} * posted, kChunk)};
          wr.remote_addr = p.dst.mr.iova + uint64_t{kChunk} * posted;
          wr.rkey = p.dst.mr.rkey;
          ASSERT_EQ(a.device->PostSend(p.qa, std::move(wr)), 0);
          ++posted;
        }
        for (const Completion& c : Drain(p.cq_a)) {
          EXPECT_EQ(c.qp_num, p.qa->qpn());
          (c.status == WcStatus::kSuccess ? completed[q] : failed[q])++;
        }
        std::this_thread::yield();
      }
    });
  }
  for (std::thread& t : apps) t.join();
  stop = true;
  churn.join();
  progress_a.join();
  progress_b.join();

  for (int q = 0; q < kQps; ++q) {
    EXPECT_EQ(completed[q], kWritesPerQp) << "QP " << q;
    EXPECT_EQ(failed[q], 0) << "QP " << q;
    EXPECT_EQ(std::memcmp(pairs[q].src.bytes.data(), pairs[q].dst.bytes.data(), pairs[q].src.bytes.size()), 0)
        << "QP " << q << ": bytes differ at the target";
  }
  EXPECT_GT(churned.load(), 0);  // the object verbs got their turn while the data path ran
}

}  // namespace
}  // namespace uroce::emu
