// Memory windows (IBTA 10.6.7) on RC: type 1 and type 2 binds, access through the window's R_Key only within its
// range and rights, type 2 confined to its QP, LOCAL_INV and SEND with invalidate.
#include <gtest/gtest.h>

#include <cstring>

#include "emu/test_fabric.h"

namespace uroce::emu {
namespace {

using testing::Buffer;
using testing::Drain;
using testing::Fabric;
using testing::Node;

constexpr uint32_t kAll = access::kLocalWrite | access::kRemoteWrite | access::kRemoteRead | access::kRemoteAtomic;

struct RcPair {
  Fabric fabric;
  Node *a, *b;
  ProtectionDomain *pa, *pb;
  CompletionQueue *ca, *cb;
  QueuePair *qa, *qb;
  Buffer src, target;

  explicit RcPair(uint32_t target_access = kAll | access::kMwBind) {
    a = &fabric.AddNode();
    b = &fabric.AddNode();
    pa = a->device->AllocPd();
    pb = b->device->AllocPd();
    EXPECT_EQ(a->device->CreateCq(64, &ca), 0);
    EXPECT_EQ(b->device->CreateCq(64, &cb), 0);
    qa = testing::CreateConnectedQp(*a->device, QpType::kRc, pa, ca, nullptr, 0);
    qb = testing::CreateConnectedQp(*b->device, QpType::kRc, pb, cb, nullptr, 0);
    testing::Connect(*a->device, qa, *b->device, qb->qpn(), kAll);
    testing::Connect(*b->device, qb, *a->device, qa->qpn(), kAll);
    src = testing::Register(*a->device, pa, 4096, kAll);
    target = testing::Register(*b->device, pb, 4096, target_access);
    for (size_t i = 0; i < src.bytes.size(); ++i) src.bytes[i] = static_cast<uint8_t>(i * 13 + 1);
  }

  // Binds window `rkey` on B's QP to target[offset, offset+len) with `rights`; returns the new rkey.
  uint32_t Bind(uint32_t rkey, uint64_t offset, uint64_t len, uint32_t rights, WcStatus want = WcStatus::kSuccess) {
    SendWr wr;
    wr.wr_id = 900;
    wr.opcode = SendOpcode::kBindMw;
    wr.flags = send_flags::kSignaled;
    wr.bind = {rkey, (rkey & ~0xffu) | ((rkey + 1) & 0xff), target.mr.lkey, target.mr.iova + offset, len, rights};
    EXPECT_EQ(b->device->PostSend(qb, std::move(wr)), 0);
    fabric.Pump();
    auto c = Drain(cb);
    EXPECT_EQ(c.size(), 1u);
    if (!c.empty()) {
      EXPECT_EQ(c[0].status, want);
      if (want == WcStatus::kSuccess) EXPECT_EQ(c[0].opcode, WcOpcode::kBindMw);
    }
    return (rkey & ~0xffu) | ((rkey + 1) & 0xff);
  }

  // A writes `len` bytes at target offset `offset` through `rkey`; returns A's completion status.
  WcStatus Write(uint32_t rkey, uint64_t offset, uint32_t len) {
    SendWr wr;
    wr.wr_id = 1;
    wr.opcode = SendOpcode::kRdmaWrite;
    wr.flags = send_flags::kSignaled;
    wr.sg_list = {src.At(0, len)};
    wr.remote_addr = target.mr.iova + offset;
    wr.rkey = rkey;
    EXPECT_EQ(a->device->PostSend(qa, std::move(wr)), 0);
    fabric.Pump();
    auto c = Drain(ca);
    return c.empty() ? WcStatus::kGeneralErr : c.back().status;
  }
};

TEST(MemoryWindow, UnboundWindowRefusesAccess) {
  RcPair t;
  uint32_t rkey = 0;
  ASSERT_EQ(t.b->device->AllocMw(t.pb, 1, &rkey), 0);
  EXPECT_EQ(t.Write(rkey, 0, 16), WcStatus::kRemAccessErr);  // unbound
}

TEST(MemoryWindow, Type1WriteLandsInsideTheWindowOnly) {
  RcPair t;
  uint32_t rkey = 0;
  ASSERT_EQ(t.b->device->AllocMw(t.pb, 1, &rkey), 0);
  rkey = t.Bind(rkey, 1024, 512, access::kRemoteWrite);
  EXPECT_EQ(t.Write(rkey, 1024, 512), WcStatus::kSuccess);
  EXPECT_EQ(0, std::memcmp(t.target.bytes.data() + 1024, t.src.bytes.data(), 512));
  EXPECT_EQ(t.target.bytes[1023], 0);
  EXPECT_EQ(t.target.bytes[1536], 0);
}

TEST(MemoryWindow, Type1AccessBeyondTheWindowIsRemoteAccessErrorAndWritesNothing) {
  RcPair t;
  uint32_t rkey = 0;
  ASSERT_EQ(t.b->device->AllocMw(t.pb, 1, &rkey), 0);
  rkey = t.Bind(rkey, 1024, 512, access::kRemoteWrite);
  EXPECT_EQ(t.Write(rkey, 1024 + 1, 512), WcStatus::kRemAccessErr);
  EXPECT_EQ(t.target.bytes, std::vector<uint8_t>(4096, 0));
}

TEST(MemoryWindow, OldRkeyStopsWorkingAfterRebind) {
  RcPair t;
  uint32_t rkey = 0;
  ASSERT_EQ(t.b->device->AllocMw(t.pb, 1, &rkey), 0);
  const uint32_t first = t.Bind(rkey, 0, 64, access::kRemoteWrite);
  t.Bind(first, 0, 64, access::kRemoteWrite);
  EXPECT_EQ(t.Write(first, 0, 8), WcStatus::kRemAccessErr);
}

TEST(MemoryWindow, BindBeyondTheRegionOrWithoutMwBindFails) {
  RcPair t;
  uint32_t rkey = 0;
  ASSERT_EQ(t.b->device->AllocMw(t.pb, 1, &rkey), 0);
  t.Bind(rkey, 4000, 200, access::kRemoteWrite, WcStatus::kMwBindErr);
}

// A window's remote rights come from the bind, not from the region: the region needs only MW_BIND, and local write
// when the window grants remote write or atomic (IBTA C10-75). Local rights in a bind are accepted and grant nothing
// remote (rxe and mlx5 accept them; ibv_bind_mw(3)'s remote rights are what the window carries).
TEST(MemoryWindow, WindowGrantsRemoteWriteOnARegionWithOnlyLocalWriteAndMwBind) {
  RcPair t(access::kLocalWrite | access::kMwBind);
  uint32_t rkey = 0;
  ASSERT_EQ(t.b->device->AllocMw(t.pb, 1, &rkey), 0);
  rkey = t.Bind(rkey, 0, 256, access::kRemoteWrite | access::kLocalWrite);
  EXPECT_EQ(t.Write(rkey, 0, 256), WcStatus::kSuccess);
  EXPECT_EQ(0, std::memcmp(t.target.bytes.data(), t.src.bytes.data(), 256));
}

TEST(MemoryWindow, RemoteWriteWindowOnARegionWithoutLocalWriteIsABindError) {
  RcPair t(access::kRemoteRead | access::kMwBind);
  uint32_t rkey = 0;
  ASSERT_EQ(t.b->device->AllocMw(t.pb, 1, &rkey), 0);
  t.Bind(rkey, 0, 256, access::kRemoteWrite, WcStatus::kMwBindErr);  // C10-75
}

TEST(MemoryWindow, ZeroBasedBindIsABindError) {
  RcPair t;
  uint32_t rkey = 0;
  ASSERT_EQ(t.b->device->AllocMw(t.pb, 1, &rkey), 0);
  t.Bind(rkey, 0, 256, access::kRemoteWrite | access::kZeroBased, WcStatus::kMwBindErr);
}

TEST(MemoryWindow, LocalWriteInTheBindGrantsNoRemoteRight) {
  RcPair t(access::kLocalWrite | access::kMwBind);
  uint32_t rkey = 0;
  ASSERT_EQ(t.b->device->AllocMw(t.pb, 1, &rkey), 0);
  rkey = t.Bind(rkey, 0, 256, access::kLocalWrite);
  EXPECT_EQ(t.Write(rkey, 0, 16), WcStatus::kRemAccessErr);
  EXPECT_EQ(t.target.bytes, std::vector<uint8_t>(4096, 0));
}

TEST(MemoryWindow, Type2IsBoundToItsQpAndLocalInvalidateClosesIt) {
  RcPair t;
  uint32_t rkey = 0;
  ASSERT_EQ(t.b->device->AllocMw(t.pb, 2, &rkey), 0);
  rkey = t.Bind(rkey, 0, 256, access::kRemoteWrite | access::kRemoteRead);
  EXPECT_EQ(t.Write(rkey, 0, 256), WcStatus::kSuccess);
  // A bound type 2 window cannot be re-bound or deallocated... it is invalidated first.
  SendWr inv;
  inv.opcode = SendOpcode::kLocalInv;
  inv.flags = send_flags::kSignaled;
  inv.invalidate_rkey = rkey;
  ASSERT_EQ(t.b->device->PostSend(t.qb, std::move(inv)), 0);
  t.fabric.Pump();
  auto c = Drain(t.cb);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].status, WcStatus::kSuccess);
  EXPECT_EQ(c[0].opcode, WcOpcode::kLocalInv);
  EXPECT_EQ(t.Write(rkey, 0, 8), WcStatus::kRemAccessErr);
}

TEST(MemoryWindow, SendWithInvalidateClosesTheWindowAndReportsTheKey) {
  RcPair t;
  uint32_t rkey = 0;
  ASSERT_EQ(t.b->device->AllocMw(t.pb, 2, &rkey), 0);
  rkey = t.Bind(rkey, 0, 256, access::kRemoteWrite);
  Buffer rbuf = testing::Register(*t.b->device, t.pb, 64, kAll);
  ASSERT_EQ(t.b->device->PostRecv(t.qb, RecvWr{5, {rbuf.At(0, 64)}}), 0);
  SendWr s;
  s.opcode = SendOpcode::kSendWithInv;
  s.flags = send_flags::kSignaled;
  s.sg_list = {t.src.At(0, 32)};
  s.invalidate_rkey = rkey;
  ASSERT_EQ(t.a->device->PostSend(t.qa, std::move(s)), 0);
  t.fabric.Pump();
  auto rc = Drain(t.cb);
  ASSERT_EQ(rc.size(), 1u);
  EXPECT_EQ(rc[0].status, WcStatus::kSuccess);
  EXPECT_TRUE(rc[0].wc_flags & wc_flags::kWithInv);
  EXPECT_EQ(rc[0].imm_data, rkey);
  Drain(t.ca);
  EXPECT_EQ(t.Write(rkey, 0, 8), WcStatus::kRemAccessErr);
}

TEST(MemoryWindow, SendWithInvalidateOfAKeyThatIsNoWindowIsInvalidRequest) {
  RcPair t;
  Buffer rbuf = testing::Register(*t.b->device, t.pb, 64, kAll);
  ASSERT_EQ(t.b->device->PostRecv(t.qb, RecvWr{5, {rbuf.At(0, 64)}}), 0);
  SendWr s;
  s.opcode = SendOpcode::kSendWithInv;
  s.flags = send_flags::kSignaled;
  s.sg_list = {t.src.At(0, 32)};
  s.invalidate_rkey = t.target.mr.rkey;  // a plain MR: not invalidatable here
  ASSERT_EQ(t.a->device->PostSend(t.qa, std::move(s)), 0);
  t.fabric.Pump();
  auto c = Drain(t.ca);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].status, WcStatus::kRemInvReqErr);
}

}  // namespace
}  // namespace uroce::emu
