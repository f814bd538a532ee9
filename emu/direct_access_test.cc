// Direct access as the HCA drives it (DeviceConfig::direct, wire/direct_access.h), on the simulated network: what a
// device publishes and withdraws as its QPs and regions change, which work requests the requester carries out
// directly (completed at once, no packet) and which it leaves to packets (then the responder's answer decides).
// Each node has a real DirectTable; "directly" here is a memcpy within this process, checked by the peer's table.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>

#include "emu/test_fabric.h"
#include "wire/direct_access.h"

namespace uroce::emu {
namespace {

using testing::Buffer;
using testing::Drain;
using testing::Node;

// One node's side: its own table, which it publishes into, and the other node's, which its requester checks.
class TableAccess final : public wire::DirectAccess {
 public:
  TableAccess() {
    int fd = -1;
    EXPECT_EQ(wire::DirectTable::Create(&own_, &fd), 0);
    close(fd);
  }
  TableAccess* peer = nullptr;
  bool refuse_copies = false;  // as a kernel that forbids cross-memory attach

  bool Write(const wire::UdpEndpoint&, uint32_t dest_qpn, uint32_t src_qpn, uint32_t rkey, uint64_t va,
             std::span<const std::span<const uint8_t>> pieces, uint64_t length) override {
    peer->own_->Enter(1, getpid());
    const uint64_t host = peer->own_->Check(dest_qpn, src_qpn, rkey, va, length, wire::direct_rights::kWrite);
    if (host != 0 && !refuse_copies) {
      auto* to = reinterpret_cast<uint8_t*>(host);
      for (auto p : pieces) to = static_cast<uint8_t*>(std::memcpy(to, p.data(), p.size())) + p.size();
    }
    peer->own_->Leave(1);
    return host != 0 && !refuse_copies;
  }
  bool Read(const wire::UdpEndpoint&, uint32_t dest_qpn, uint32_t src_qpn, uint32_t rkey, uint64_t va,
            std::span<const std::span<uint8_t>> pieces, uint64_t length) override {
    peer->own_->Enter(1, getpid());
    const uint64_t host = peer->own_->Check(dest_qpn, src_qpn, rkey, va, length, wire::direct_rights::kRead);
    if (host != 0 && !refuse_copies) {
      const auto* from = reinterpret_cast<const uint8_t*>(host);
      for (auto p : pieces) {
        std::memcpy(p.data(), from, p.size());
        from += p.size();
      }
    }
    peer->own_->Leave(1);
    return host != 0 && !refuse_copies;
  }
  void PublishQp(const QpEntry& qp) override { own_->PublishQp(qp); }
  void WithdrawQp(uint32_t qpn) override { own_->WithdrawQp(qpn); }
  void PublishRegion(const Region& r) override { own_->PublishRegion(r); }
  void WithdrawRegion(uint32_t rkey) override { own_->WithdrawRegion(rkey); }

 private:
  std::unique_ptr<wire::DirectTable> own_;
};

constexpr uint32_t kAllRemote = access::kRemoteWrite | access::kRemoteRead | access::kRemoteAtomic;
constexpr uint32_t kMrAll = access::kLocalWrite | kAllRemote;

// Two nodes of "one host": a initiates, b is the target.
struct DirectPair {
  TableAccess access_a, access_b;
  testing::Fabric fabric;
  Node *a, *b;
  ProtectionDomain *pa, *pb;
  CompletionQueue *ca, *cb;
  QueuePair *qa, *qb;
  Buffer local, target;

  explicit DirectPair(uint32_t b_qp_access = kAllRemote, uint32_t target_access = kMrAll) {
    access_a.peer = &access_b;
    access_b.peer = &access_a;
    fabric.configure_node = [this](size_t i, DeviceConfig& c) { c.direct = i == 0 ? &access_a : &access_b; };
    a = &fabric.AddNode(Mtu::k1024);
    b = &fabric.AddNode(Mtu::k1024);
    pa = a->device->AllocPd();
    pb = b->device->AllocPd();
    EXPECT_EQ(a->device->CreateCq(256, &ca), 0);
    EXPECT_EQ(b->device->CreateCq(256, &cb), 0);
    QpInitAttributes init;
    init.type = QpType::kRc;
    init.cap = {64, 64, 4, 4, 64};
    init.pd = pa;
    init.send_cq = init.recv_cq = ca;
    EXPECT_EQ(a->device->CreateQp(init, &qa), 0);
    init.pd = pb;
    init.send_cq = init.recv_cq = cb;
    EXPECT_EQ(b->device->CreateQp(init, &qb), 0);
    testing::RcAttributes rc;
    rc.timeout = 10;
    rc.retry_cnt = 1;
    rc.access = 0;
    testing::ConnectRc(*a->device, qa, *b->device, qb->qpn(), rc);
    rc.access = b_qp_access;
    testing::ConnectRc(*b->device, qb, *a->device, qa->qpn(), rc);
    local = testing::Register(*a->device, pa, 8192, access::kLocalWrite);
    target = testing::Register(*b->device, pb, 8192, target_access);
    for (size_t i = 0; i < local.bytes.size(); ++i) local.bytes[i] = uint8_t(i * 5 + 3);
    a->transport->record = true;
  }

  SendWr Op(uint64_t id, SendOpcode op, std::vector<Sge> sges, uint64_t remote_offset, uint32_t rkey = 0) {
    SendWr wr;
    wr.wr_id = id;
    wr.opcode = op;
    wr.flags = send_flags::kSignaled;
    wr.sg_list = std::move(sges);
    wr.remote_addr = target.mr.iova + remote_offset;
    wr.rkey = rkey != 0 ? rkey : target.mr.rkey;
    return wr;
  }
  // Posts `wr` on a's QP, lets the fabric run, and returns the status of its one completion.
  WcStatus Outcome(SendWr wr) {
    EXPECT_EQ(a->device->PostSend(qa, std::move(wr)), 0);
    fabric.Pump();
    const auto done = Drain(ca);
    EXPECT_EQ(done.size(), 1u);
    return done.empty() ? WcStatus::kGeneralErr : done[0].status;
  }
  uint64_t Direct(Node* n, bool writes) {
    const DeviceCounters c = n->device->counters();
    return writes ? c.rc_direct_writes : c.rc_direct_reads;
  }
};

TEST(DirectAccess, AWriteAndAReadThatWouldSucceedCompleteAtOnceWithoutAPacket) {
  DirectPair p;
  SendWr two_pieces = p.Op(1, SendOpcode::kRdmaWrite, {p.local.At(0, 100), p.local.At(1000, 50)}, 16);
  ASSERT_EQ(p.a->device->PostSend(p.qa, std::move(two_pieces)), 0);
  // Completed by the post itself: nothing pumped, nothing sent.
  auto done = Drain(p.ca);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].wr_id, 1u);
  EXPECT_EQ(done[0].status, WcStatus::kSuccess);
  EXPECT_EQ(std::memcmp(p.target.bytes.data() + 16, p.local.bytes.data(), 100), 0);
  EXPECT_EQ(std::memcmp(p.target.bytes.data() + 116, p.local.bytes.data() + 1000, 50), 0);
  ASSERT_EQ(p.a->device->PostSend(p.qa, p.Op(2, SendOpcode::kRdmaRead, {p.local.At(4096, 150)}, 16)), 0);
  done = Drain(p.ca);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].status, WcStatus::kSuccess);
  EXPECT_EQ(std::memcmp(p.local.bytes.data() + 4096, p.target.bytes.data() + 16, 150), 0);
  EXPECT_TRUE(p.a->transport->log().empty());
  EXPECT_EQ(p.Direct(p.a, true), 1u);
  EXPECT_EQ(p.Direct(p.a, false), 1u);
}

TEST(DirectAccess, AnOperationPostedBehindOutstandingWorkGoesAsPacketsInOrder) {
  DirectPair p;
  // A receive for the SEND, which stays outstanding until its ACK: the WRITE behind it must not overtake it.
  RecvWr r;
  r.wr_id = 9;
  r.sg_list = {p.target.At(4096, 64)};
  ASSERT_EQ(p.b->device->PostRecv(p.qb, std::move(r)), 0);
  SendWr send = p.Op(1, SendOpcode::kSend, {p.local.At(0, 32)}, 0);
  ASSERT_EQ(p.a->device->PostSend(p.qa, std::move(send)), 0);
  ASSERT_EQ(p.a->device->PostSend(p.qa, p.Op(2, SendOpcode::kRdmaWrite, {p.local.At(0, 32)}, 0)), 0);
  EXPECT_EQ(p.Direct(p.a, true), 0u);
  p.fabric.Pump();
  const auto done = Drain(p.ca);
  ASSERT_EQ(done.size(), 2u);
  EXPECT_EQ(done[0].wr_id, 1u);
  EXPECT_EQ(done[1].wr_id, 2u);
  EXPECT_EQ(done[1].status, WcStatus::kSuccess);
  EXPECT_EQ(std::memcmp(p.target.bytes.data(), p.local.bytes.data(), 32), 0);
  // Nothing outstanding any more: the next one is direct.
  ASSERT_EQ(p.a->device->PostSend(p.qa, p.Op(3, SendOpcode::kRdmaWrite, {p.local.At(0, 8)}, 64)), 0);
  EXPECT_EQ(p.Direct(p.a, true), 1u);
}

TEST(DirectAccess, WhatTheTargetWouldRefuseGoesAsPacketsAndGetsTheRespondersError) {
  DirectPair p;
  const size_t sent_before = p.a->transport->log().size();
  const uint32_t never_had = p.target.mr.rkey ^ 0x300;
  EXPECT_EQ(p.Outcome(p.Op(1, SendOpcode::kRdmaWrite, {p.local.At(0, 8)}, 0, never_had)), WcStatus::kRemAccessErr);
  EXPECT_GT(p.a->transport->log().size(), sent_before);
  EXPECT_EQ(p.Direct(p.a, true), 0u);
  EXPECT_EQ(p.b->device->counters().rx_remote_access_denied, 1u);
}

TEST(DirectAccess, AReadOfARegionWithoutRemoteReadIsTheRespondersRemoteAccessError) {
  DirectPair p(kAllRemote, access::kLocalWrite | access::kRemoteWrite);
  EXPECT_EQ(p.Outcome(p.Op(1, SendOpcode::kRdmaRead, {p.local.At(0, 8)}, 0)), WcStatus::kRemAccessErr);
  EXPECT_EQ(p.Direct(p.a, false), 0u);
}

TEST(DirectAccess, ADeregisteredRegionIsNoLongerReached) {
  DirectPair p;
  std::vector<uint8_t> before = p.target.bytes;
  ASSERT_EQ(p.b->device->DeregisterMr(p.target.mr.lkey), 0);
  EXPECT_EQ(p.Outcome(p.Op(1, SendOpcode::kRdmaWrite, {p.local.At(0, 8)}, 0)), WcStatus::kRemAccessErr);
  EXPECT_EQ(p.target.bytes, before);
}

TEST(DirectAccess, ATargetQpInTheErrorStateOrDestroyedExecutesNothing) {
  // Moved to ERR by the application, destroyed, or in error with the whole device (IBV_EVENT_DEVICE_FATAL).
  for (int how : {0, 1, 2}) {
    DirectPair p;
    std::vector<uint8_t> before = p.target.bytes;
    if (how == 0) {
      QpAttributes err;
      err.qp_state = QpState::kErr;
      ASSERT_EQ(p.b->device->ModifyQp(p.qb, err, attr::kState), 0);
    } else if (how == 1) {
      ASSERT_EQ(p.b->device->DestroyQp(p.qb), 0);
    } else {
      p.b->device->Fail();
    }
    EXPECT_EQ(p.Outcome(p.Op(1, SendOpcode::kRdmaWrite, {p.local.At(0, 8)}, 0)), WcStatus::kRetryExcErr) << how;
    EXPECT_EQ(p.target.bytes, before) << how;
  }
}

TEST(DirectAccess, AQpPublishesOnlyWhileItMayRespond) {
  // b's QP allows no remote access: nothing published, so nothing direct (the responder NAKs).
  DirectPair p(/*b_qp_access=*/0);
  EXPECT_EQ(p.Outcome(p.Op(1, SendOpcode::kRdmaWrite, {p.local.At(0, 8)}, 0)), WcStatus::kRemAccessErr);
  EXPECT_EQ(p.Direct(p.a, true), 0u);
}

TEST(DirectAccess, ARefusedCopyFallsBackToPackets) {
  DirectPair p;
  p.access_a.refuse_copies = true;
  EXPECT_EQ(p.Outcome(p.Op(1, SendOpcode::kRdmaWrite, {p.local.At(0, 64)}, 128)), WcStatus::kSuccess);
  EXPECT_EQ(std::memcmp(p.target.bytes.data() + 128, p.local.bytes.data(), 64), 0);
  EXPECT_EQ(p.Direct(p.a, true), 0u);
  EXPECT_FALSE(p.a->transport->log().empty());
}

TEST(DirectAccess, AtomicsAndWritesWithImmediateAreNeverDirect) {
  DirectPair p;
  RecvWr r;
  r.wr_id = 9;
  ASSERT_EQ(p.b->device->PostRecv(p.qb, std::move(r)), 0);
  SendWr imm = p.Op(1, SendOpcode::kRdmaWriteWithImm, {p.local.At(0, 8)}, 0);
  ASSERT_EQ(p.a->device->PostSend(p.qa, std::move(imm)), 0);
  p.fabric.Pump();
  SendWr fetch_add = p.Op(2, SendOpcode::kAtomicFetchAndAdd, {p.local.At(0, 8)}, 8);
  fetch_add.compare_add = 1;
  ASSERT_EQ(p.a->device->PostSend(p.qa, std::move(fetch_add)), 0);
  p.fabric.Pump();
  const auto done = Drain(p.ca);
  ASSERT_EQ(done.size(), 2u);
  EXPECT_EQ(done[0].status, WcStatus::kSuccess);
  EXPECT_EQ(done[1].status, WcStatus::kSuccess);
  EXPECT_EQ(p.Direct(p.a, true), 0u);
  EXPECT_EQ(Drain(p.cb).size(), 1u);  // the immediate's receive completion
}

}  // namespace
}  // namespace uroce::emu
