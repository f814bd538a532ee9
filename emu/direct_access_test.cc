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
  // A direct SEND goes into the peer's "ring": `ring`, which the test hands to the peer's device (DeliverRing) where
  // the peer's thread would read it.
  bool SendMessage(const wire::UdpEndpoint&, wire::DirectSend& send, std::span<const std::span<const uint8_t>> pieces,
                   uint64_t) override {
    peer->own_->Enter(1, getpid());
    uint32_t slot = 0;
    const bool claimed = !refuse_copies && peer->own_->ClaimReceive(&send, TotalOf(pieces), &slot);
    if (claimed) {
      std::vector<uint8_t> record(wire::DirectSend::kSize);
      send.Encode(record.data());
      for (auto p : pieces) record.insert(record.end(), p.begin(), p.end());
      peer->ring.push_back(std::move(record));
      peer->own_->CountSend(slot);
    }
    peer->own_->Leave(1);
    return claimed;
  }
  void PublishQp(const QpEntry& qp) override { own_->PublishQp(qp); }
  void WithdrawQp(uint32_t qpn) override { own_->WithdrawQp(qpn); }
  void PublishRegion(const Region& r) override { own_->PublishRegion(r); }
  void WithdrawRegion(uint32_t rkey) override { own_->WithdrawRegion(rkey); }
  void OpenReceives(uint32_t qpn, uint32_t epoch) override { own_->OpenReceives(qpn, epoch); }
  void PublishReceives(uint32_t qpn, uint64_t packets_taken, uint64_t first,
                       std::span<const uint32_t> lengths) override {
    own_->PublishReceives(qpn, packets_taken, first, lengths);
  }
  uint64_t DirectSends(uint32_t qpn) override { return own_->DirectSends(qpn); }
  void CloseReceives(uint32_t qpn) override { own_->CloseReceives(qpn); }

  // What peers sent into our ring, oldest first; handed to `device` as the polling thread would.
  std::vector<std::vector<uint8_t>> ring;
  void DeliverRing(Device& device) { testing::DeliverRing(device, wire::RingRecord::kDirectSend, ring); }

 private:
  static uint64_t TotalOf(std::span<const std::span<const uint8_t>> pieces) {
    uint64_t n = 0;
    for (auto p : pieces) n += p.size();
    return n;
  }

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
  void PostReceive(uint64_t id, uint64_t offset, uint32_t length) {
    RecvWr r;
    r.wr_id = id;
    r.sg_list = {target.At(offset, length)};
    ASSERT_EQ(b->device->PostRecv(qb, std::move(r)), 0);
  }
  SendWr Send(uint64_t id, uint64_t offset, uint32_t length, SendOpcode op = SendOpcode::kSend) {
    SendWr wr = Op(id, op, {local.At(offset, length)}, 0);
    wr.imm_data = 0x01020304;
    return wr;
  }
  // b's thread reads its ring.
  void DeliverDirect() { access_b.DeliverRing(*b->device); }
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
  // A receive for the WRITE with immediate (never direct), which stays outstanding until its ACK: the WRITE behind
  // it must not overtake it.
  RecvWr r;
  r.wr_id = 9;
  ASSERT_EQ(p.b->device->PostRecv(p.qb, std::move(r)), 0);
  SendWr send = p.Op(1, SendOpcode::kRdmaWriteWithImm, {p.local.At(0, 32)}, 0);
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

TEST(DirectSend, ASendIntoAPostedReceiveCompletesAtOnceAndTheTargetPlacesItWhenItReadsItsRing) {
  DirectPair p;
  p.PostReceive(7, 256, 128);
  ASSERT_EQ(p.a->device->PostSend(p.qa, p.Send(1, 40, 100, SendOpcode::kSendWithImm)), 0);
  // Completed by the post itself, without a packet.
  auto done = Drain(p.ca);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].wr_id, 1u);
  EXPECT_EQ(done[0].status, WcStatus::kSuccess);
  EXPECT_TRUE(p.a->transport->log().empty());
  EXPECT_EQ(p.a->device->counters().rc_direct_sends, 1u);
  EXPECT_TRUE(Drain(p.cb).empty());  // not before b has read it
  p.DeliverDirect();
  done = Drain(p.cb);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].wr_id, 7u);
  EXPECT_EQ(done[0].status, WcStatus::kSuccess);
  EXPECT_EQ(done[0].opcode, WcOpcode::kRecv);
  EXPECT_EQ(done[0].byte_len, 100u);
  EXPECT_EQ(done[0].src_qp, p.qa->qpn());
  EXPECT_EQ(done[0].qp_num, p.qb->qpn());
  EXPECT_EQ(done[0].imm_data, 0x01020304u);
  EXPECT_TRUE(done[0].wc_flags & wc_flags::kWithImm);
  EXPECT_EQ(std::memcmp(p.target.bytes.data() + 256, p.local.bytes.data() + 40, 100), 0);
  EXPECT_EQ(p.b->device->counters().rc_direct_sends_received, 1u);
}

TEST(DirectSend, WithoutAReceiveOrIntoOneTooShortItGoesAsPacketsAndGetsTheRespondersAnswer) {
  DirectPair p;
  // No receive posted: packets, and the responder's RNR NAK makes a retry until one is posted.
  SendWr first = p.Send(1, 0, 64);
  ASSERT_EQ(p.a->device->PostSend(p.qa, std::move(first)), 0);
  EXPECT_EQ(p.a->device->counters().rc_direct_sends, 0u);
  EXPECT_FALSE(p.a->transport->log().empty());
  p.PostReceive(8, 0, 64);
  p.fabric.Pump();
  auto done = Drain(p.ca);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].status, WcStatus::kSuccess);
  ASSERT_EQ(Drain(p.cb).size(), 1u);
  // A receive shorter than the message: packets again, and the responder's error on both sides.
  p.PostReceive(9, 0, 16);
  EXPECT_EQ(p.Outcome(p.Send(2, 0, 64)), WcStatus::kRemInvReqErr);
  EXPECT_EQ(p.a->device->counters().rc_direct_sends, 0u);
  done = Drain(p.cb);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].wr_id, 9u);
  EXPECT_EQ(done[0].status, WcStatus::kLocLenErr);
}

TEST(DirectSend, DirectAndPacketMessagesTakeTheReceivesInTheOrderTheyWereSent) {
  DirectPair p;
  for (uint64_t i = 0; i < 24; ++i) p.PostReceive(100 + i, i * 64, 64);
  // 16 direct SENDs fill the window b showed; the 17th finds no WQE shown and goes as packets, which b reads after
  // the ring's records (the order of one ring); a WRITE with immediate (never direct) takes the 18th.
  for (uint64_t i = 0; i < 17; ++i) ASSERT_EQ(p.a->device->PostSend(p.qa, p.Send(i, i * 8, 8)), 0);
  EXPECT_EQ(p.a->device->counters().rc_direct_sends, uint64_t{wire::kReceiveWindow});
  ASSERT_EQ(p.a->device->PostSend(p.qa, p.Op(17, SendOpcode::kRdmaWriteWithImm, {p.local.At(0, 8)}, 4000)), 0);
  p.DeliverDirect();
  p.fabric.Pump();
  // Nothing outstanding, and b's window moved on: direct again.
  ASSERT_EQ(p.a->device->PostSend(p.qa, p.Send(18, 18 * 8, 8)), 0);
  EXPECT_EQ(p.a->device->counters().rc_direct_sends, uint64_t{wire::kReceiveWindow} + 1);
  p.DeliverDirect();
  const auto done = Drain(p.cb);
  ASSERT_EQ(done.size(), 19u);
  for (uint64_t i = 0; i < 19; ++i) {
    EXPECT_EQ(done[i].wr_id, 100 + i) << i;
    EXPECT_EQ(done[i].status, WcStatus::kSuccess) << i;
    EXPECT_EQ(done[i].opcode, i == 17 ? WcOpcode::kRecvRdmaWithImm : WcOpcode::kRecv) << i;
    if (i != 17) EXPECT_EQ(std::memcmp(p.target.bytes.data() + i * 64, p.local.bytes.data() + i * 8, 8), 0) << i;
  }
  EXPECT_EQ(Drain(p.ca).size(), 19u);
  EXPECT_EQ(p.b->device->counters().rc_direct_sends_dropped, 0u);
}

TEST(DirectSend, TheErrorStateCompletesWhatWasSentDirectlyBeforeItFlushesTheRest) {
  DirectPair p;
  for (uint64_t i = 0; i < 4; ++i) p.PostReceive(10 + i, i * 64, 64);
  ASSERT_EQ(p.a->device->PostSend(p.qa, p.Send(1, 0, 32)), 0);
  ASSERT_EQ(p.a->device->PostSend(p.qa, p.Send(2, 32, 32)), 0);
  ASSERT_EQ(Drain(p.ca).size(), 2u);  // a saw both succeed
  QpAttributes err;
  err.qp_state = QpState::kErr;
  ASSERT_EQ(p.b->device->ModifyQp(p.qb, err, attr::kState), 0);
  // The flush of the receives waits for the two in b's ring; a receive posted meanwhile is flushed after them.
  EXPECT_TRUE(Drain(p.cb).empty());
  p.PostReceive(14, 0, 64);
  ASSERT_EQ(p.a->device->PostSend(p.qa, p.Send(3, 0, 8)), 0);  // no longer direct: b's QP withdrew
  EXPECT_EQ(p.a->device->counters().rc_direct_sends, 2u);
  p.DeliverDirect();
  const auto done = Drain(p.cb);
  ASSERT_EQ(done.size(), 5u);
  for (uint64_t i = 0; i < 5; ++i) {
    EXPECT_EQ(done[i].wr_id, 10 + i) << i;
    EXPECT_EQ(done[i].status, i < 2 ? WcStatus::kSuccess : WcStatus::kWrFlushErr) << i;
  }
  EXPECT_EQ(std::memcmp(p.target.bytes.data() + 64, p.local.bytes.data() + 32, 32), 0);
  // Once flushed, a receive posted in the error state is flushed at once.
  p.PostReceive(15, 0, 64);
  ASSERT_EQ(Drain(p.cb).size(), 1u);
}

TEST(DirectSend, AFlushWaitingForDirectSendsThatNeverComeGoesOnAfterItsTime) {
  DirectPair p;
  for (uint64_t i = 0; i < 3; ++i) p.PostReceive(10 + i, i * 64, 64);
  ASSERT_EQ(p.a->device->PostSend(p.qa, p.Send(1, 0, 32)), 0);
  p.access_b.ring.clear();  // counted, but the record never reaches b (a ring found malformed, a peer that lied)
  QpAttributes err;
  err.qp_state = QpState::kErr;
  ASSERT_EQ(p.b->device->ModifyQp(p.qb, err, attr::kState), 0);
  EXPECT_TRUE(Drain(p.cb).empty());  // the flush waits for it...
  const uint64_t start = p.fabric.clock().NowNs();
  p.fabric.Pump();  // ... until its time is up (the timer moves the simulated clock)
  EXPECT_GE(p.fabric.clock().NowNs() - start, DeviceCore::kDirectFlushWaitNs);
  const auto done = Drain(p.cb);
  ASSERT_EQ(done.size(), 3u);
  for (uint64_t i = 0; i < 3; ++i) {
    EXPECT_EQ(done[i].wr_id, 10 + i);
    EXPECT_EQ(done[i].status, WcStatus::kWrFlushErr);
  }
  EXPECT_EQ(p.b->device->counters().rc_direct_sends_dropped, 1u);
}

TEST(DirectSend, ADirectSendForAQpResetOrDestroyedSinceIsDropped) {
  for (bool destroy : {false, true}) {
    DirectPair p;
    p.PostReceive(10, 0, 64);
    ASSERT_EQ(p.a->device->PostSend(p.qa, p.Send(1, 0, 32)), 0);
    std::vector<uint8_t> before = p.target.bytes;
    if (destroy) {
      ASSERT_EQ(p.b->device->DestroyQp(p.qb), 0);
    } else {
      QpAttributes reset;
      reset.qp_state = QpState::kReset;
      ASSERT_EQ(p.b->device->ModifyQp(p.qb, reset, attr::kState), 0);
    }
    p.DeliverDirect();
    EXPECT_TRUE(Drain(p.cb).empty()) << destroy;
    EXPECT_EQ(p.target.bytes, before) << destroy;
    EXPECT_EQ(p.b->device->counters().rc_direct_sends_dropped, 1u) << destroy;
  }
}

TEST(DirectSend, AReceiveWhoseRegionWasDeregisteredCompletesInErrorAtTheTarget) {
  DirectPair p;
  Buffer other = testing::Register(*p.b->device, p.pb, 256, access::kLocalWrite);
  RecvWr r;
  r.wr_id = 5;
  r.sg_list = {other.At(0, 64)};
  ASSERT_EQ(p.b->device->PostRecv(p.qb, std::move(r)), 0);
  ASSERT_EQ(p.b->device->DeregisterMr(other.mr.lkey), 0);  // b's own error: its WQE names a key gone
  ASSERT_EQ(p.a->device->PostSend(p.qa, p.Send(1, 0, 32)), 0);
  p.DeliverDirect();
  const auto done = Drain(p.cb);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].status, WcStatus::kLocProtErr);
  QpAttributes a;
  ASSERT_EQ(p.b->device->QueryQp(p.qb, &a), 0);
  EXPECT_EQ(a.qp_state, QpState::kErr);
}

TEST(DirectSend, ASendWithInvalidateNeverGoesDirect) {
  DirectPair p;
  p.PostReceive(10, 0, 64);
  SendWr inv = p.Send(1, 0, 8, SendOpcode::kSendWithInv);
  inv.invalidate_rkey = 0x1234;
  ASSERT_EQ(p.a->device->PostSend(p.qa, std::move(inv)), 0);
  EXPECT_EQ(p.a->device->counters().rc_direct_sends, 0u);
  EXPECT_FALSE(p.a->transport->log().empty());
}

}  // namespace
}  // namespace uroce::emu
