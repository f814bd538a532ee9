// The Reliable Connection protocol end to end on the simulated network (IBTA vol1 9.7): every operation's completions,
// the bytes it leaves in memory and the packets it puts on the wire; each NAK kind; RNR and local ACK timeout retry
// budgets and timing on the ManualClock; duplicates answered without executing twice; max_rd_atomic; SQ drain.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <iostream>
#include <numeric>
#include <regex>
#include <string>

#include "emu/test_fabric.h"
#include "wire/headers.h"
#include "wire/packet.h"

namespace uroce::emu {
namespace {

using testing::Buffer;
using testing::Drain;
using testing::Node;
using testing::RcAttributes;
using testing::RcPair;

// RC opcodes (IBTA table 38).
namespace rcop {
constexpr uint8_t kSendFirst = 0x00, kSendMiddle = 0x01, kSendLast = 0x02, kSendLastImm = 0x03, kSendOnly = 0x04,
                  kSendOnlyImm = 0x05, kWriteFirst = 0x06, kWriteMiddle = 0x07, kWriteLast = 0x08,
                  kWriteLastImm = 0x09, kWriteOnly = 0x0A, kReadRequest = 0x0C, kReadResponseFirst = 0x0D,
                  kReadResponseMiddle = 0x0E, kReadResponseLast = 0x0F, kReadResponseOnly = 0x10,
                  kAcknowledge = 0x11, kAtomicAcknowledge = 0x12, kCompareSwap = 0x13, kFetchAdd = 0x14,
                  kSendLastInv = 0x16, kSendOnlyInv = 0x17;
}

constexpr uint32_t kAllRemote = access::kRemoteWrite | access::kRemoteRead | access::kRemoteAtomic;
constexpr uint32_t kMrAll = access::kLocalWrite | kAllRemote;
constexpr uint64_t AckTimeoutNs(uint8_t t) { return uint64_t{4096} << t; }  // IBTA 9.7.6.1.3: 4.096 us * 2^t
constexpr uint64_t kRnr12Ns = 640'000;                                         // RNR timer code 12 (table 45)

void Fill(std::vector<uint8_t>& b, uint8_t seed) {
  for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<uint8_t>(seed + i * 13 + (i >> 8));
}

// One packet a node sent, decoded.
struct Pkt {
  uint8_t opcode = 0;
  uint32_t psn = 0;
  bool ack_req = false;
  bool dropped = false;
  uint64_t time_ns = 0;
  std::optional<wire::Aeth> aeth;
  std::optional<wire::Reth> reth;
  std::optional<wire::AtomicEth> atomic;
  std::optional<wire::AtomicAckEth> atomic_ack;
  std::optional<wire::ImmDt> imm;
  std::optional<wire::Ieth> ieth;
  std::vector<uint8_t> payload;
};

std::vector<Pkt> Wire(const Node& n) {
  std::vector<Pkt> out;
  for (const auto& s : n.transport->log()) {
    auto p = s.Parse();
    EXPECT_TRUE(p.has_value());
    if (!p) continue;
    Pkt k;
    k.opcode = p->bth.opcode;
    k.psn = p->bth.psn;
    k.ack_req = p->bth.ack_req;
    k.dropped = s.dropped;
    k.time_ns = s.time_ns;
    k.aeth = p->aeth;
    k.reth = p->reth;
    k.atomic = p->atomic;
    k.atomic_ack = p->atomic_ack;
    k.imm = p->imm;
    k.ieth = p->ieth;
    k.payload.assign(p->payload.begin(), p->payload.end());
    out.push_back(std::move(k));
  }
  return out;
}

std::vector<uint8_t> Opcodes(const std::vector<Pkt>& v) {
  std::vector<uint8_t> o;
  for (const Pkt& p : v) o.push_back(p.opcode);
  return o;
}

size_t CountOpcode(const std::vector<Pkt>& v, uint8_t op) {
  return std::count_if(v.begin(), v.end(), [op](const Pkt& p) { return p.opcode == op; });
}

bool IsAck(const Pkt& p) { return p.opcode == rcop::kAcknowledge && p.aeth && p.aeth->kind() == wire::AethKind::kAck; }
bool IsNak(const Pkt& p, wire::NakCode code) {
  return p.opcode == rcop::kAcknowledge && p.aeth && p.aeth->kind() == wire::AethKind::kNak &&
         p.aeth->nak_code() == code;
}
bool IsRnrNak(const Pkt& p) {
  return p.opcode == rcop::kAcknowledge && p.aeth && p.aeth->kind() == wire::AethKind::kRnrNak;
}

// A fixture with packet capture on both nodes.
struct Rc : RcPair {
  explicit Rc(Mtu mtu = Mtu::k1024) : RcPair(mtu) { Record(); }
  Rc(const RcAttributes& rc_a, const RcAttributes& rc_b, Mtu mtu = Mtu::k1024, DeviceConfig device = {})
      : RcPair(mtu, rc_a, rc_b, {64, 64, 4, 4, 0}, 1024, std::move(device)) {
    Record();
  }
  void Record() {
    a->transport->record = true;
    b->transport->record = true;
  }
  uint64_t now() { return fabric.clock().NowNs(); }
};

RcAttributes Attrs(uint32_t access = kAllRemote) {
  RcAttributes rc;
  rc.access = access;
  return rc;
}

SendWr Wr(uint64_t id, SendOpcode op, std::vector<Sge> sges, bool signaled = true) {
  SendWr wr;
  wr.wr_id = id;
  wr.opcode = op;
  wr.flags = signaled ? send_flags::kSignaled : 0;
  wr.sg_list = std::move(sges);
  return wr;
}

SendWr Rdma(uint64_t id, SendOpcode op, std::vector<Sge> sges, uint64_t remote_addr, uint32_t rkey,
            bool signaled = true) {
  SendWr wr = Wr(id, op, std::move(sges), signaled);
  wr.remote_addr = remote_addr;
  wr.rkey = rkey;
  return wr;
}

SendWr Atomic(uint64_t id, SendOpcode op, Sge local, uint64_t remote_addr, uint32_t rkey, uint64_t compare_add,
              uint64_t swap = 0) {
  SendWr wr = Rdma(id, op, {local}, remote_addr, rkey);
  wr.compare_add = compare_add;
  wr.swap = swap;
  return wr;
}

void ExpectCompletion(const Completion& c, uint64_t wr_id, WcStatus status, WcOpcode opcode, uint32_t byte_len,
                      uint32_t qpn) {
  EXPECT_EQ(c.wr_id, wr_id);
  EXPECT_EQ(c.status, status) << ToString(c.status);
  EXPECT_EQ(c.opcode, opcode);
  EXPECT_EQ(c.byte_len, byte_len);
  EXPECT_EQ(c.qp_num, qpn);
}

uint64_t Word(const std::vector<uint8_t>& b, size_t off) {
  uint64_t v;
  std::memcpy(&v, b.data() + off, 8);
  return v;
}
void SetWord(std::vector<uint8_t>& b, size_t off, uint64_t v) { std::memcpy(b.data() + off, &v, 8); }

// --- data operations -----------------------------------------------------------------------------------------------

TEST(RcData, MultiPacketSendGathersSeveralSgesAndScattersIntoSeveral) {
  Rc t;
  Buffer src = testing::Register(*t.a->device, t.pa, 8192, kMrAll);
  Buffer dst = testing::Register(*t.b->device, t.pb, 8192, kMrAll);
  Fill(src.bytes, 1);
  ASSERT_EQ(t.b->device->PostRecv(t.qb, RecvWr{21, {dst.At(100, 3000), dst.At(4000, 3000)}}), 0);
  // 5000 bytes from three discontiguous pieces: [0,1000) [2000,4500) [6000,7500).
  ASSERT_EQ(t.a->device->PostSend(
                t.qa, Wr(11, SendOpcode::kSend, {src.At(0, 1000), src.At(2000, 2500), src.At(6000, 1500)})),
            0);
  t.fabric.Pump();

  std::vector<uint8_t> msg;
  msg.insert(msg.end(), src.bytes.begin(), src.bytes.begin() + 1000);
  msg.insert(msg.end(), src.bytes.begin() + 2000, src.bytes.begin() + 4500);
  msg.insert(msg.end(), src.bytes.begin() + 6000, src.bytes.begin() + 7500);
  std::vector<uint8_t> want(8192, 0);
  std::copy(msg.begin(), msg.begin() + 3000, want.begin() + 100);
  std::copy(msg.begin() + 3000, msg.end(), want.begin() + 4000);
  EXPECT_EQ(dst.bytes, want);

  auto s = Drain(t.sa);
  ASSERT_EQ(s.size(), 1u);
  ExpectCompletion(s[0], 11, WcStatus::kSuccess, WcOpcode::kSend, 5000, t.qa->qpn());
  auto r = Drain(t.rb);
  ASSERT_EQ(r.size(), 1u);
  ExpectCompletion(r[0], 21, WcStatus::kSuccess, WcOpcode::kRecv, 5000, t.qb->qpn());
  EXPECT_EQ(r[0].src_qp, t.qa->qpn());
  EXPECT_EQ(r[0].wc_flags, 0u);

  auto wa = Wire(*t.a);
  EXPECT_EQ(Opcodes(wa), (std::vector<uint8_t>{rcop::kSendFirst, rcop::kSendMiddle, rcop::kSendMiddle,
                                                rcop::kSendMiddle, rcop::kSendLast}));
  for (uint32_t i = 0; i < wa.size(); ++i) {
    EXPECT_EQ(wa[i].psn, i);
    EXPECT_EQ(wa[i].ack_req, i == 4) << i;  // AckReq on the last packet only
    EXPECT_EQ(wa[i].payload.size(), i < 4 ? 1024u : 904u);
  }
  auto wb = Wire(*t.b);
  ASSERT_EQ(wb.size(), 1u);  // one coalesced ACK for the message
  EXPECT_TRUE(IsAck(wb[0]));
  EXPECT_EQ(wb[0].psn, 4u);
  EXPECT_EQ(wb[0].aeth->msn, 1u);
}

TEST(RcData, InlineSendCarriesTheBytesCopiedAtPostTime) {
  Rc t;
  Buffer dst = testing::Register(*t.b->device, t.pb, 512, kMrAll);
  ASSERT_EQ(t.b->device->PostRecv(t.qb, RecvWr{3, {dst.At(0, 512)}}), 0);
  std::vector<uint8_t> data(200);
  Fill(data, 9);
  SendWr wr = Wr(4, SendOpcode::kSend, {});
  wr.flags |= send_flags::kInline;
  wr.inline_data = data;
  ASSERT_EQ(t.a->device->PostSend(t.qa, std::move(wr)), 0);
  t.fabric.Pump();
  EXPECT_EQ(0, std::memcmp(dst.bytes.data(), data.data(), 200));
  EXPECT_TRUE(std::all_of(dst.bytes.begin() + 200, dst.bytes.end(), [](uint8_t x) { return x == 0; }));
  auto s = Drain(t.sa);
  ASSERT_EQ(s.size(), 1u);
  ExpectCompletion(s[0], 4, WcStatus::kSuccess, WcOpcode::kSend, 200, t.qa->qpn());
  auto r = Drain(t.rb);
  ASSERT_EQ(r.size(), 1u);
  ExpectCompletion(r[0], 3, WcStatus::kSuccess, WcOpcode::kRecv, 200, t.qb->qpn());
  auto wa = Wire(*t.a);
  ASSERT_EQ(wa.size(), 1u);
  EXPECT_EQ(wa[0].opcode, rcop::kSendOnly);
  EXPECT_EQ(wa[0].payload, data);
}

TEST(RcData, SendWithImmediate) {
  Rc t;
  Buffer src = testing::Register(*t.a->device, t.pa, 8192, kMrAll);
  Buffer dst = testing::Register(*t.b->device, t.pb, 8192, kMrAll);
  Fill(src.bytes, 2);
  for (uint64_t i = 0; i < 2; ++i) ASSERT_EQ(t.b->device->PostRecv(t.qb, RecvWr{100 + i, {dst.At(i * 4096, 4096)}}), 0);
  SendWr w1 = Wr(1, SendOpcode::kSendWithImm, {src.At(0, 100)});
  w1.imm_data = 0x04030201;
  SendWr w2 = Wr(2, SendOpcode::kSendWithImm, {src.At(0, 2500)});  // FIRST, MIDDLE, LAST_WITH_IMMEDIATE
  w2.imm_data = 0xa0b0c0d0;
  ASSERT_EQ(t.a->device->PostSend(t.qa, std::move(w1)), 0);
  ASSERT_EQ(t.a->device->PostSend(t.qa, std::move(w2)), 0);
  t.fabric.Pump();

  auto s = Drain(t.sa);
  ASSERT_EQ(s.size(), 2u);
  ExpectCompletion(s[0], 1, WcStatus::kSuccess, WcOpcode::kSend, 100, t.qa->qpn());
  ExpectCompletion(s[1], 2, WcStatus::kSuccess, WcOpcode::kSend, 2500, t.qa->qpn());
  auto r = Drain(t.rb);
  ASSERT_EQ(r.size(), 2u);
  ExpectCompletion(r[0], 100, WcStatus::kSuccess, WcOpcode::kRecv, 100, t.qb->qpn());
  ExpectCompletion(r[1], 101, WcStatus::kSuccess, WcOpcode::kRecv, 2500, t.qb->qpn());
  EXPECT_EQ(r[0].wc_flags, wc_flags::kWithImm);
  EXPECT_EQ(r[0].imm_data, 0x04030201u);
  EXPECT_EQ(r[1].wc_flags, wc_flags::kWithImm);
  EXPECT_EQ(r[1].imm_data, 0xa0b0c0d0u);
  EXPECT_EQ(0, std::memcmp(dst.bytes.data(), src.bytes.data(), 100));
  EXPECT_EQ(0, std::memcmp(dst.bytes.data() + 4096, src.bytes.data(), 2500));
  auto wa = Wire(*t.a);
  EXPECT_EQ(Opcodes(wa),
            (std::vector<uint8_t>{rcop::kSendOnlyImm, rcop::kSendFirst, rcop::kSendMiddle, rcop::kSendLastImm}));
  ASSERT_TRUE(wa[0].imm && wa[3].imm);
  EXPECT_EQ(wa[0].imm->imm, 0x04030201u);
  EXPECT_EQ(wa[3].imm->imm, 0xa0b0c0d0u);
}

// SEND with invalidate names a type 2 memory window bound to the responder's QP (IBTA 10.6.7.2.3): the receive
// completes with IBV_WC_WITH_INV and the R_Key, and the window no longer grants access.
TEST(RcData, SendWithInvalidateInvalidatesTheWindowAndReportsItsRkey) {
  Rc t;
  Buffer src = testing::Register(*t.a->device, t.pa, 4096, kMrAll);
  Buffer dst = testing::Register(*t.b->device, t.pb, 8192, kMrAll | access::kMwBind);
  Fill(src.bytes, 22);
  uint32_t mw = 0;
  ASSERT_EQ(t.b->device->AllocMw(t.pb, 2, &mw), 0);
  const uint32_t rkey = (mw & ~0xffu) | ((mw + 1) & 0xff);
  SendWr bind = Wr(70, SendOpcode::kBindMw, {});
  bind.bind = {mw, rkey, dst.mr.lkey, dst.mr.iova, 4096, access::kRemoteWrite};
  ASSERT_EQ(t.b->device->PostSend(t.qb, std::move(bind)), 0);
  t.fabric.Pump();
  auto sb = Drain(t.sb);
  ASSERT_EQ(sb.size(), 1u);
  EXPECT_EQ(sb[0].status, WcStatus::kSuccess);
  EXPECT_EQ(sb[0].opcode, WcOpcode::kBindMw);

  ASSERT_EQ(t.b->device->PostRecv(t.qb, RecvWr{100, {dst.At(4096, 4096)}}), 0);
  SendWr inv = Wr(1, SendOpcode::kSendWithInv, {src.At(0, 2049)});  // FIRST, MIDDLE, LAST_WITH_INVALIDATE
  inv.invalidate_rkey = rkey;
  ASSERT_EQ(t.a->device->PostSend(t.qa, std::move(inv)), 0);
  t.fabric.Pump();
  auto s = Drain(t.sa);
  ASSERT_EQ(s.size(), 1u);
  ExpectCompletion(s[0], 1, WcStatus::kSuccess, WcOpcode::kSend, 2049, t.qa->qpn());
  auto r = Drain(t.rb);
  ASSERT_EQ(r.size(), 1u);
  ExpectCompletion(r[0], 100, WcStatus::kSuccess, WcOpcode::kRecv, 2049, t.qb->qpn());
  EXPECT_EQ(r[0].wc_flags, wc_flags::kWithInv);
  EXPECT_EQ(r[0].imm_data, rkey);  // ibv_wc.invalidated_rkey
  EXPECT_EQ(0, std::memcmp(dst.bytes.data() + 4096, src.bytes.data(), 2049));
  auto wa = Wire(*t.a);
  EXPECT_EQ(Opcodes(wa), (std::vector<uint8_t>{rcop::kSendFirst, rcop::kSendMiddle, rcop::kSendLastInv}));
  ASSERT_TRUE(wa[2].ieth.has_value());
  EXPECT_EQ(wa[2].ieth->rkey, rkey);

  // The window is invalid now: a WRITE through it is refused and writes nothing.
  ASSERT_EQ(t.a->device->PostSend(t.qa, Rdma(2, SendOpcode::kRdmaWrite, {src.At(0, 16)}, dst.mr.iova, rkey)), 0);
  t.fabric.Pump();
  s = Drain(t.sa);
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].status, WcStatus::kRemAccessErr);
  EXPECT_TRUE(std::all_of(dst.bytes.begin(), dst.bytes.begin() + 4096, [](uint8_t x) { return x == 0; }));
}

TEST(RcNak, SendWithInvalidateOfAnUnknownRkeyIsAnInvalidRequest) {
  Rc t;
  Buffer src = testing::Register(*t.a->device, t.pa, 4096, kMrAll);
  Buffer dst = testing::Register(*t.b->device, t.pb, 4096, kMrAll);
  ASSERT_EQ(t.b->device->PostRecv(t.qb, RecvWr{100, {dst.At(0, 4096)}}), 0);
  SendWr inv = Wr(1, SendOpcode::kSendWithInv, {src.At(0, 50)});
  inv.invalidate_rkey = 0x12345678;
  ASSERT_EQ(t.a->device->PostSend(t.qa, std::move(inv)), 0);
  t.fabric.Pump();
  auto s = Drain(t.sa);
  ASSERT_EQ(s.size(), 1u);
  ExpectCompletion(s[0], 1, WcStatus::kRemInvReqErr, WcOpcode::kSend, 50, t.qa->qpn());
  auto wa = Wire(*t.a);
  ASSERT_EQ(wa.size(), 1u);
  EXPECT_EQ(wa[0].opcode, rcop::kSendOnlyInv);
  ASSERT_TRUE(wa[0].ieth.has_value());
  EXPECT_EQ(wa[0].ieth->rkey, 0x12345678u);
  auto wb = Wire(*t.b);
  ASSERT_EQ(wb.size(), 1u);
  EXPECT_TRUE(IsNak(wb[0], wire::NakCode::kInvalidRequest));
  EXPECT_EQ(t.qa->state(), QpState::kErr);
  EXPECT_EQ(t.qb->state(), QpState::kErr);
}

TEST(RcData, RdmaWriteMultiPacketStaysWithinTarget) {
  Rc t;
  Buffer src = testing::Register(*t.a->device, t.pa, 4096, kMrAll);
  Buffer dst = testing::Register(*t.b->device, t.pb, 3000 + 128, kMrAll);
  Buffer rdst = testing::Register(*t.b->device, t.pb, 64, kMrAll);
  Fill(src.bytes, 3);
  std::fill(dst.bytes.begin(), dst.bytes.end(), 0xEE);
  ASSERT_EQ(t.b->device->PostRecv(t.qb, RecvWr{77, {rdst.At(0, 64)}}), 0);  // a WRITE must not consume it
  ASSERT_EQ(t.a->device->PostSend(t.qa, Rdma(5, SendOpcode::kRdmaWrite, {src.At(0, 1000), src.At(1000, 2000)},
                                             dst.mr.iova + 64, dst.mr.rkey)),
            0);
  t.fabric.Pump();
  EXPECT_TRUE(std::all_of(dst.bytes.begin(), dst.bytes.begin() + 64, [](uint8_t x) { return x == 0xEE; }));
  EXPECT_EQ(0, std::memcmp(dst.bytes.data() + 64, src.bytes.data(), 3000));
  EXPECT_TRUE(std::all_of(dst.bytes.begin() + 3064, dst.bytes.end(), [](uint8_t x) { return x == 0xEE; }));
  auto s = Drain(t.sa);
  ASSERT_EQ(s.size(), 1u);
  ExpectCompletion(s[0], 5, WcStatus::kSuccess, WcOpcode::kRdmaWrite, 3000, t.qa->qpn());
  EXPECT_TRUE(Drain(t.rb).empty());
  EXPECT_EQ(t.qb->receive_queue().size(), 1u);

  auto wa = Wire(*t.a);
  EXPECT_EQ(Opcodes(wa), (std::vector<uint8_t>{rcop::kWriteFirst, rcop::kWriteMiddle, rcop::kWriteLast}));
  ASSERT_TRUE(wa[0].reth.has_value());
  EXPECT_EQ(wa[0].reth->va, dst.mr.iova + 64);
  EXPECT_EQ(wa[0].reth->rkey, dst.mr.rkey);
  EXPECT_EQ(wa[0].reth->dma_length, 3000u);
  EXPECT_FALSE(wa[1].reth.has_value());
  auto wb = Wire(*t.b);
  ASSERT_EQ(wb.size(), 1u);
  EXPECT_TRUE(IsAck(wb[0]));
  EXPECT_EQ(wb[0].psn, 2u);
}

// Receives with no SGE at all (rsockets and rdma_cm users post them): consumed by an RDMA WRITE WITH IMMEDIATE and by
// a zero-length SEND; a SEND that carries bytes has nowhere to put them: local length error (IBTA 9.9.4 / 10.8).
TEST(RcData, ZeroSgeReceivesTakeWriteWithImmediateAndEmptySendsOnly) {
  Rc t;
  Buffer src = testing::Register(*t.a->device, t.pa, 4096, kMrAll);
  Buffer dst = testing::Register(*t.b->device, t.pb, 4096, kMrAll);
  for (uint64_t id : {41, 42, 43}) ASSERT_EQ(t.b->device->PostRecv(t.qb, RecvWr{id, {}}), 0);
  SendWr wr = Rdma(1, SendOpcode::kRdmaWriteWithImm, {src.At(0, 100)}, dst.mr.iova, dst.mr.rkey);
  wr.imm_data = 7;
  ASSERT_EQ(t.a->device->PostSend(t.qa, std::move(wr)), 0);
  SendWr empty;
  empty.wr_id = 2;
  empty.opcode = SendOpcode::kSend;
  empty.flags = send_flags::kSignaled;
  ASSERT_EQ(t.a->device->PostSend(t.qa, std::move(empty)), 0);
  t.fabric.Pump();
  auto r = Drain(t.rb);
  ASSERT_EQ(r.size(), 2u);
  ExpectCompletion(r[0], 41, WcStatus::kSuccess, WcOpcode::kRecvRdmaWithImm, 100, t.qb->qpn());
  ExpectCompletion(r[1], 42, WcStatus::kSuccess, WcOpcode::kRecv, 0, t.qb->qpn());
  SendWr full;
  full.wr_id = 3;
  full.opcode = SendOpcode::kSend;
  full.flags = send_flags::kSignaled;
  full.sg_list = {src.At(0, 10)};
  ASSERT_EQ(t.a->device->PostSend(t.qa, std::move(full)), 0);
  t.fabric.Pump();
  r = Drain(t.rb);
  ASSERT_FALSE(r.empty());
  EXPECT_EQ(r[0].wr_id, 43u);
  EXPECT_EQ(r[0].status, WcStatus::kLocLenErr);
}

TEST(RcData, RdmaWriteWithImmediateConsumesAReceive) {
  Rc t;
  Buffer src = testing::Register(*t.a->device, t.pa, 4096, kMrAll);
  Buffer dst = testing::Register(*t.b->device, t.pb, 4096, kMrAll);
  Buffer rbuf = testing::Register(*t.b->device, t.pb, 64, kMrAll);
  Fill(src.bytes, 4);
  ASSERT_EQ(t.b->device->PostRecv(t.qb, RecvWr{31, {rbuf.At(0, 64)}}), 0);
  SendWr wr = Rdma(6, SendOpcode::kRdmaWriteWithImm, {src.At(0, 2500)}, dst.mr.iova + 10, dst.mr.rkey);
  wr.imm_data = 0xdeadbeef;
  ASSERT_EQ(t.a->device->PostSend(t.qa, std::move(wr)), 0);
  t.fabric.Pump();
  EXPECT_EQ(0, std::memcmp(dst.bytes.data() + 10, src.bytes.data(), 2500));
  EXPECT_EQ(rbuf.bytes, std::vector<uint8_t>(64, 0));  // the receive's buffer is not written
  auto s = Drain(t.sa);
  ASSERT_EQ(s.size(), 1u);
  ExpectCompletion(s[0], 6, WcStatus::kSuccess, WcOpcode::kRdmaWrite, 2500, t.qa->qpn());
  auto r = Drain(t.rb);
  ASSERT_EQ(r.size(), 1u);
  ExpectCompletion(r[0], 31, WcStatus::kSuccess, WcOpcode::kRecvRdmaWithImm, 2500, t.qb->qpn());
  EXPECT_EQ(r[0].wc_flags, wc_flags::kWithImm);
  EXPECT_EQ(r[0].imm_data, 0xdeadbeefu);
  auto wa = Wire(*t.a);
  EXPECT_EQ(Opcodes(wa), (std::vector<uint8_t>{rcop::kWriteFirst, rcop::kWriteMiddle, rcop::kWriteLastImm}));
  ASSERT_TRUE(wa[2].imm.has_value());
  EXPECT_EQ(wa[2].imm->imm, 0xdeadbeefu);
}

TEST(RcData, RdmaReadMultiPacketScattersAndConsumesOnePsnPerResponse) {
  Rc t;
  Buffer dst = testing::Register(*t.a->device, t.pa, 8192, kMrAll);
  Buffer src = testing::Register(*t.b->device, t.pb, 8192, kMrAll);
  Buffer sbuf = testing::Register(*t.a->device, t.pa, 64, kMrAll);
  Buffer rbuf = testing::Register(*t.b->device, t.pb, 64, kMrAll);
  Fill(src.bytes, 5);
  std::fill(dst.bytes.begin(), dst.bytes.end(), 0x55);
  ASSERT_EQ(t.a->device->PostSend(t.qa, Rdma(7, SendOpcode::kRdmaRead, {dst.At(0, 2000), dst.At(3000, 3000)},
                                             src.mr.iova + 1, src.mr.rkey)),
            0);
  ASSERT_EQ(t.b->device->PostRecv(t.qb, RecvWr{1, {rbuf.At(0, 64)}}), 0);
  ASSERT_EQ(t.a->device->PostSend(t.qa, Wr(8, SendOpcode::kSend, {sbuf.At(0, 8)})), 0);
  t.fabric.Pump();
  std::vector<uint8_t> want(8192, 0x55);
  std::copy(src.bytes.begin() + 1, src.bytes.begin() + 2001, want.begin());
  std::copy(src.bytes.begin() + 2001, src.bytes.begin() + 5001, want.begin() + 3000);
  EXPECT_EQ(dst.bytes, want);
  auto s = Drain(t.sa);
  ASSERT_EQ(s.size(), 2u);
  ExpectCompletion(s[0], 7, WcStatus::kSuccess, WcOpcode::kRdmaRead, 5000, t.qa->qpn());
  ExpectCompletion(s[1], 8, WcStatus::kSuccess, WcOpcode::kSend, 8, t.qa->qpn());

  auto wa = Wire(*t.a);
  ASSERT_EQ(wa.size(), 2u);
  EXPECT_EQ(wa[0].opcode, rcop::kReadRequest);
  EXPECT_EQ(wa[0].psn, 0u);
  EXPECT_TRUE(wa[0].ack_req);
  ASSERT_TRUE(wa[0].reth.has_value());
  EXPECT_EQ(wa[0].reth->va, src.mr.iova + 1);
  EXPECT_EQ(wa[0].reth->dma_length, 5000u);
  EXPECT_EQ(wa[1].opcode, rcop::kSendOnly);
  EXPECT_EQ(wa[1].psn, 5u);  // the READ took PSNs 0..4 (IBTA 9.7.4.1.4)
  auto wb = Wire(*t.b);
  ASSERT_EQ(wb.size(), 6u);
  EXPECT_EQ(Opcodes(wb), (std::vector<uint8_t>{rcop::kReadResponseFirst, rcop::kReadResponseMiddle,
                                                rcop::kReadResponseMiddle, rcop::kReadResponseMiddle,
                                                rcop::kReadResponseLast, rcop::kAcknowledge}));
  for (uint32_t i = 0; i < 5; ++i) {
    EXPECT_EQ(wb[i].psn, i);
    EXPECT_EQ(wb[i].aeth.has_value(), i == 0 || i == 4);  // AETH on FIRST and LAST only (table 38)
    EXPECT_EQ(wb[i].payload.size(), i < 4 ? 1024u : 904u);
  }
  EXPECT_EQ(wb[5].psn, 5u);
}

TEST(RcData, AtomicCompareAndSwapSucceedsOrLeavesTheWord) {
  Rc t;
  Buffer local = testing::Register(*t.a->device, t.pa, 64, kMrAll);
  Buffer words = testing::Register(*t.b->device, t.pb, 64, kMrAll);
  SetWord(words.bytes, 8, 42);
  ASSERT_EQ(t.a->device->PostSend(
                t.qa, Atomic(1, SendOpcode::kAtomicCmpAndSwp, local.At(0, 8), words.mr.iova + 8, words.mr.rkey, 42, 99)),
            0);
  ASSERT_EQ(t.a->device->PostSend(
                t.qa, Atomic(2, SendOpcode::kAtomicCmpAndSwp, local.At(8, 8), words.mr.iova + 8, words.mr.rkey, 7, 1)),
            0);
  t.fabric.Pump();
  EXPECT_EQ(Word(words.bytes, 8), 99u);  // swapped by the first, left alone by the second
  EXPECT_EQ(Word(local.bytes, 0), 42u);  // each returns the value it found
  EXPECT_EQ(Word(local.bytes, 8), 99u);
  for (size_t off : {0, 16, 24}) EXPECT_EQ(Word(words.bytes, off), 0u);
  auto s = Drain(t.sa);
  ASSERT_EQ(s.size(), 2u);
  ExpectCompletion(s[0], 1, WcStatus::kSuccess, WcOpcode::kCompSwap, 8, t.qa->qpn());
  ExpectCompletion(s[1], 2, WcStatus::kSuccess, WcOpcode::kCompSwap, 8, t.qa->qpn());
  auto wa = Wire(*t.a);
  ASSERT_EQ(wa.size(), 2u);
  EXPECT_EQ(wa[0].opcode, rcop::kCompareSwap);
  ASSERT_TRUE(wa[0].atomic.has_value());
  EXPECT_EQ(wa[0].atomic->va, words.mr.iova + 8);
  EXPECT_EQ(wa[0].atomic->rkey, words.mr.rkey);
  EXPECT_EQ(wa[0].atomic->compare, 42u);
  EXPECT_EQ(wa[0].atomic->swap_add, 99u);
  auto wb = Wire(*t.b);
  ASSERT_EQ(wb.size(), 2u);
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(wb[i].opcode, rcop::kAtomicAcknowledge);
    EXPECT_EQ(wb[i].psn, static_cast<uint32_t>(i));
    ASSERT_TRUE(wb[i].atomic_ack.has_value());
  }
  EXPECT_EQ(wb[0].atomic_ack->original, 42u);
  EXPECT_EQ(wb[1].atomic_ack->original, 99u);
}

TEST(RcData, AtomicFetchAndAddReturnsTheOriginal) {
  Rc t;
  Buffer local = testing::Register(*t.a->device, t.pa, 64, kMrAll);
  Buffer words = testing::Register(*t.b->device, t.pb, 64, kMrAll);
  SetWord(words.bytes, 16, 1000);
  ASSERT_EQ(t.a->device->PostSend(
                t.qa, Atomic(1, SendOpcode::kAtomicFetchAndAdd, local.At(0, 8), words.mr.iova + 16, words.mr.rkey, 5)),
            0);
  ASSERT_EQ(t.a->device->PostSend(t.qa, Atomic(2, SendOpcode::kAtomicFetchAndAdd, local.At(8, 8), words.mr.iova + 16,
                                               words.mr.rkey, ~uint64_t{0})),  // adds -1, wrapping
            0);
  t.fabric.Pump();
  EXPECT_EQ(Word(words.bytes, 16), 1004u);
  EXPECT_EQ(Word(local.bytes, 0), 1000u);
  EXPECT_EQ(Word(local.bytes, 8), 1005u);
  auto s = Drain(t.sa);
  ASSERT_EQ(s.size(), 2u);
  ExpectCompletion(s[0], 1, WcStatus::kSuccess, WcOpcode::kFetchAdd, 8, t.qa->qpn());
  ExpectCompletion(s[1], 2, WcStatus::kSuccess, WcOpcode::kFetchAdd, 8, t.qa->qpn());
  auto wa = Wire(*t.a);
  ASSERT_EQ(wa.size(), 2u);
  EXPECT_EQ(wa[0].opcode, rcop::kFetchAdd);
  EXPECT_EQ(wa[0].atomic->swap_add, 5u);
  auto wb = Wire(*t.b);
  ASSERT_EQ(wb.size(), 2u);
  EXPECT_EQ(wb[0].opcode, rcop::kAtomicAcknowledge);
  EXPECT_EQ(wb[0].atomic_ack->original, 1000u);
}

TEST(RcData, UnsignaledCompleteSilentlyAndCompletionsFollowPostOrder) {
  Rc t;
  Buffer la = testing::Register(*t.a->device, t.pa, 8192, kMrAll);
  Buffer lb = testing::Register(*t.b->device, t.pb, 8192, kMrAll);
  Fill(la.bytes, 6);
  Fill(lb.bytes, 7);
  SetWord(lb.bytes, 8000, 10);
  for (uint64_t i = 0; i < 3; ++i) ASSERT_EQ(t.b->device->PostRecv(t.qb, RecvWr{50 + i, {lb.At(i * 1000, 1000)}}), 0);
  const std::vector<uint8_t> read_src(lb.bytes.begin() + 5000, lb.bytes.begin() + 5100);
  ASSERT_EQ(t.a->device->PostSend(t.qa, Wr(1, SendOpcode::kSend, {la.At(0, 100)})), 0);
  ASSERT_EQ(t.a->device->PostSend(
                t.qa, Rdma(2, SendOpcode::kRdmaWrite, {la.At(100, 200)}, lb.mr.iova + 4000, lb.mr.rkey, false)),
            0);
  ASSERT_EQ(t.a->device->PostSend(t.qa, Rdma(3, SendOpcode::kRdmaRead, {la.At(4000, 100)}, lb.mr.iova + 5000,
                                             lb.mr.rkey)),
            0);
  SendWr fa = Atomic(4, SendOpcode::kAtomicFetchAndAdd, la.At(8000, 8), lb.mr.iova + 8000, lb.mr.rkey, 3);
  fa.flags = 0;
  ASSERT_EQ(t.a->device->PostSend(t.qa, std::move(fa)), 0);
  ASSERT_EQ(t.a->device->PostSend(t.qa, Rdma(5, SendOpcode::kRdmaWriteWithImm, {la.At(300, 10)}, lb.mr.iova + 4500,
                                             lb.mr.rkey, false)),
            0);
  ASSERT_EQ(t.a->device->PostSend(t.qa, Wr(6, SendOpcode::kSend, {la.At(500, 30)})), 0);
  t.fabric.Pump();

  auto s = Drain(t.sa);
  ASSERT_EQ(s.size(), 3u);
  ExpectCompletion(s[0], 1, WcStatus::kSuccess, WcOpcode::kSend, 100, t.qa->qpn());
  ExpectCompletion(s[1], 3, WcStatus::kSuccess, WcOpcode::kRdmaRead, 100, t.qa->qpn());
  ExpectCompletion(s[2], 6, WcStatus::kSuccess, WcOpcode::kSend, 30, t.qa->qpn());
  auto r = Drain(t.rb);
  ASSERT_EQ(r.size(), 3u);
  ExpectCompletion(r[0], 50, WcStatus::kSuccess, WcOpcode::kRecv, 100, t.qb->qpn());
  ExpectCompletion(r[1], 51, WcStatus::kSuccess, WcOpcode::kRecvRdmaWithImm, 10, t.qb->qpn());
  ExpectCompletion(r[2], 52, WcStatus::kSuccess, WcOpcode::kRecv, 30, t.qb->qpn());
  // The unsignaled ones did their work all the same.
  EXPECT_EQ(0, std::memcmp(lb.bytes.data() + 4000, la.bytes.data() + 100, 200));
  EXPECT_EQ(0, std::memcmp(lb.bytes.data() + 4500, la.bytes.data() + 300, 10));
  EXPECT_EQ(Word(lb.bytes, 8000), 13u);
  EXPECT_EQ(Word(la.bytes, 8000), 10u);
  EXPECT_EQ(0, std::memcmp(la.bytes.data() + 4000, read_src.data(), 100));
  EXPECT_TRUE(t.qa->requester().state().sq.empty());
}

TEST(RcData, CompletionsStayInPostOrderWhenAReadResponseIsLost) {
  Rc t;
  Buffer la = testing::Register(*t.a->device, t.pa, 4096, kMrAll);
  Buffer lb = testing::Register(*t.b->device, t.pb, 4096, kMrAll);
  Fill(lb.bytes, 8);
  ASSERT_EQ(t.b->device->PostRecv(t.qb, RecvWr{9, {lb.At(3000, 100)}}), 0);
  // The READ's only response is lost; the SEND after it is acknowledged first. That ACK implies the READ response
  // was lost (IBTA 9.7.5.2.2): the requester asks again at once, and completes READ, then SEND.
  t.b->transport->drop_if = testing::DropPsn(0, rcop::kReadResponseOnly);
  const uint64_t t0 = t.now();
  ASSERT_EQ(t.a->device->PostSend(t.qa, Rdma(1, SendOpcode::kRdmaRead, {la.At(0, 500)}, lb.mr.iova, lb.mr.rkey)), 0);
  ASSERT_EQ(t.a->device->PostSend(t.qa, Wr(2, SendOpcode::kSend, {la.At(1000, 10)})), 0);
  t.fabric.Pump();
  auto s = Drain(t.sa);
  ASSERT_EQ(s.size(), 2u);
  ExpectCompletion(s[0], 1, WcStatus::kSuccess, WcOpcode::kRdmaRead, 500, t.qa->qpn());
  ExpectCompletion(s[1], 2, WcStatus::kSuccess, WcOpcode::kSend, 10, t.qa->qpn());
  EXPECT_EQ(0, std::memcmp(la.bytes.data(), lb.bytes.data(), 500));
  EXPECT_EQ(Drain(t.rb).size(), 1u);  // the SEND delivered once
  EXPECT_LT(t.now() - t0, AckTimeoutNs(14));
  EXPECT_EQ(t.a->device->counters().rc_retransmit_timeouts, 0u);
  auto wb = Wire(*t.b);
  EXPECT_EQ(CountOpcode(wb, rcop::kReadResponseOnly), 2u);
}

// --- NAKs ----------------------------------------------------------------------------------------------------------

TEST(RcNak, PsnSequenceErrorResendsAtOnceWithoutTimeout) {
  Rc t;
  Buffer src = testing::Register(*t.a->device, t.pa, 8192, kMrAll);
  Buffer dst = testing::Register(*t.b->device, t.pb, 8192, kMrAll);
  Fill(src.bytes, 10);
  ASSERT_EQ(t.b->device->PostRecv(t.qb, RecvWr{1, {dst.At(0, 8192)}}), 0);
  t.a->transport->drop_if = testing::DropPsn(2);  // a middle packet
  const uint64_t t0 = t.now();
  ASSERT_EQ(t.a->device->PostSend(t.qa, Wr(1, SendOpcode::kSend, {src.At(0, 5000)})), 0);
  t.fabric.Pump();
  EXPECT_EQ(t.now(), t0);  // no timer had to fire: the NAK made the requester resend at once
  EXPECT_EQ(0, std::memcmp(dst.bytes.data(), src.bytes.data(), 5000));
  auto s = Drain(t.sa);
  ASSERT_EQ(s.size(), 1u);
  ExpectCompletion(s[0], 1, WcStatus::kSuccess, WcOpcode::kSend, 5000, t.qa->qpn());
  auto r = Drain(t.rb);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].byte_len, 5000u);

  auto wa = Wire(*t.a);
  std::vector<uint32_t> psns;
  for (const Pkt& p : wa) psns.push_back(p.psn);
  EXPECT_EQ(psns, (std::vector<uint32_t>{0, 1, 2, 3, 4, 2, 3, 4}));  // go back to the NAKed PSN
  EXPECT_TRUE(wa[2].dropped);
  auto wb = Wire(*t.b);
  ASSERT_EQ(wb.size(), 2u);
  EXPECT_TRUE(IsNak(wb[0], wire::NakCode::kPsnSeqError));  // one NAK for the gap, not one per later packet
  EXPECT_EQ(wb[0].psn, 2u);
  EXPECT_TRUE(IsAck(wb[1]));
  EXPECT_EQ(wb[1].psn, 4u);
  EXPECT_EQ(t.b->device->counters().rx_out_of_sequence, 2u);
  EXPECT_EQ(t.a->device->counters().rc_retransmit_timeouts, 0u);
}

TEST(RcNak, SendLongerThanTheReceiveIsAnInvalidRequestAndBothQpsFail) {
  Rc t;
  Buffer src = testing::Register(*t.a->device, t.pa, 4096, kMrAll);
  Buffer dst = testing::Register(*t.b->device, t.pb, 4096, kMrAll);
  for (uint64_t i = 0; i < 3; ++i) ASSERT_EQ(t.b->device->PostRecv(t.qb, RecvWr{10 + i, {dst.At(i * 1000, 1000)}}), 0);
  for (uint64_t i = 0; i < 3; ++i)
    ASSERT_EQ(t.a->device->PostSend(t.qa, Wr(1 + i, SendOpcode::kSend, {src.At(0, i == 0 ? 2000 : 10)})), 0);
  t.fabric.Pump();
  auto s = Drain(t.sa);
  ASSERT_EQ(s.size(), 3u);
  ExpectCompletion(s[0], 1, WcStatus::kRemInvReqErr, WcOpcode::kSend, 2000, t.qa->qpn());
  EXPECT_EQ(s[1].wr_id, 2u);
  EXPECT_EQ(s[1].status, WcStatus::kWrFlushErr);
  EXPECT_EQ(s[2].wr_id, 3u);
  EXPECT_EQ(s[2].status, WcStatus::kWrFlushErr);
  auto r = Drain(t.rb);
  ASSERT_EQ(r.size(), 3u);
  EXPECT_EQ(r[0].wr_id, 10u);
  EXPECT_EQ(r[0].status, WcStatus::kLocLenErr);
  EXPECT_EQ(r[1].wr_id, 11u);
  EXPECT_EQ(r[1].status, WcStatus::kWrFlushErr);
  EXPECT_EQ(r[2].wr_id, 12u);
  EXPECT_EQ(r[2].status, WcStatus::kWrFlushErr);
  EXPECT_EQ(t.qa->state(), QpState::kErr);
  EXPECT_EQ(t.qb->state(), QpState::kErr);
  auto wb = Wire(*t.b);
  ASSERT_EQ(wb.size(), 1u);
  EXPECT_TRUE(IsNak(wb[0], wire::NakCode::kInvalidRequest));
  EXPECT_EQ(wb[0].psn, 0u);
  EXPECT_TRUE(t.qa->requester().state().sq.empty());
  EXPECT_TRUE(t.qb->receive_queue().empty());
}

TEST(RcNak, ReceiveWithABadLkeyIsARemoteOperationalError) {
  Rc t;
  Buffer src = testing::Register(*t.a->device, t.pa, 4096, kMrAll);
  Buffer dst = testing::Register(*t.b->device, t.pb, 4096, kMrAll);
  Sge bad = dst.At(0, 1000);
  bad.lkey ^= 0x01;  // another generation: no such key
  ASSERT_EQ(t.b->device->PostRecv(t.qb, RecvWr{10, {bad}}), 0);
  ASSERT_EQ(t.a->device->PostSend(t.qa, Wr(1, SendOpcode::kSend, {src.At(0, 100)})), 0);
  t.fabric.Pump();
  auto s = Drain(t.sa);
  ASSERT_EQ(s.size(), 1u);
  ExpectCompletion(s[0], 1, WcStatus::kRemOpErr, WcOpcode::kSend, 100, t.qa->qpn());
  auto r = Drain(t.rb);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].wr_id, 10u);
  EXPECT_EQ(r[0].status, WcStatus::kLocProtErr);
  EXPECT_EQ(dst.bytes, std::vector<uint8_t>(4096, 0));
  auto wb = Wire(*t.b);
  ASSERT_EQ(wb.size(), 1u);
  EXPECT_TRUE(IsNak(wb[0], wire::NakCode::kRemoteOperationalError));
  EXPECT_EQ(t.qa->state(), QpState::kErr);
  EXPECT_EQ(t.qb->state(), QpState::kErr);
}

// --- remote access errors: not one byte outside the region written or read ---------------------------------------

enum class Op { kWrite, kRead, kCas, kFadd };
enum class Fault { kNone, kBadRkey, kBelowByOne, kAboveByOne, kMrLacksRight, kQpLacksRight };

struct AccessCase {
  Op op;
  Fault fault;
};

std::string CaseName(const ::testing::TestParamInfo<AccessCase>& info) {
  static const char* ops[] = {"Write", "Read", "CmpSwap", "FetchAdd"};
  static const char* faults[] = {"Allowed", "BadRkey", "BelowByOne", "AboveByOne", "MrLacksRight", "QpLacksRight"};
  return std::string(ops[static_cast<int>(info.param.op)]) + faults[static_cast<int>(info.param.fault)];
}

class RcRemoteAccess : public ::testing::TestWithParam<AccessCase> {};

TEST_P(RcRemoteAccess, RefusedWithRemoteAccessErrorTouchingNothing) {
  const auto [op, fault] = GetParam();
  const uint32_t right = op == Op::kWrite ? access::kRemoteWrite
                         : op == Op::kRead ? access::kRemoteRead
                                           : access::kRemoteAtomic;
  const uint32_t qp_access_b = fault == Fault::kQpLacksRight ? (kAllRemote & ~right) : kAllRemote;
  Rc t(Attrs(), Attrs(qp_access_b));

  // The target: 8 KiB of 0xEE on b; the region registered is [1025, 1025 + 3006), so its first byte is odd and its
  // end (exclusive, 4031) is one byte short of an 8-byte boundary: an aligned atomic can stick out by one byte.
  constexpr size_t kStart = 1025, kLen = 3006;
  std::vector<uint8_t> target(8192, 0xEE);
  const uint32_t mr_access = fault == Fault::kMrLacksRight ? (kMrAll & ~right) : kMrAll;
  MemoryRegion mr;
  ASSERT_EQ(t.b->device->RegisterMr(t.pb, target.data() + kStart, kLen,
                                    reinterpret_cast<uint64_t>(target.data() + kStart), mr_access, &mr),
            0);
  const uint64_t base = reinterpret_cast<uint64_t>(target.data());
  ASSERT_EQ(base % 8, 0u);
  const bool atomic = op == Op::kCas || op == Op::kFadd;
  const uint32_t len = atomic ? 8 : 3000;  // 3 packets at MTU 1024
  uint64_t va = atomic ? base + 1032 : mr.iova + 3;
  if (fault == Fault::kBelowByOne) va = atomic ? base + 1024 : mr.iova - 1;
  if (fault == Fault::kAboveByOne) va = atomic ? base + 4024 : mr.iova + kLen - len + 1;
  const uint32_t rkey = fault == Fault::kBadRkey ? mr.rkey ^ 0x01 : mr.rkey;

  Buffer local = testing::Register(*t.a->device, t.pa, 4096, kMrAll);
  Fill(local.bytes, 12);
  const std::vector<uint8_t> local_before = local.bytes;
  SendWr wr;
  WcOpcode wc_op;
  switch (op) {
    case Op::kWrite:
      wr = Rdma(1, SendOpcode::kRdmaWrite, {local.At(0, len)}, va, rkey);
      wc_op = WcOpcode::kRdmaWrite;
      break;
    case Op::kRead:
      wr = Rdma(1, SendOpcode::kRdmaRead, {local.At(0, len)}, va, rkey);
      wc_op = WcOpcode::kRdmaRead;
      break;
    case Op::kCas:
      wr = Atomic(1, SendOpcode::kAtomicCmpAndSwp, local.At(0, 8), va, rkey, 0xEEEEEEEEEEEEEEEEull, 5);
      wc_op = WcOpcode::kCompSwap;
      break;
    case Op::kFadd:
      wr = Atomic(1, SendOpcode::kAtomicFetchAndAdd, local.At(0, 8), va, rkey, 1);
      wc_op = WcOpcode::kFetchAdd;
      break;
  }
  Buffer rbuf = testing::Register(*t.b->device, t.pb, 64, kMrAll);
  ASSERT_EQ(t.b->device->PostRecv(t.qb, RecvWr{7, {rbuf.At(0, 64)}}), 0);
  ASSERT_EQ(t.a->device->PostSend(t.qa, std::move(wr)), 0);
  ASSERT_EQ(t.a->device->PostSend(t.qa, Wr(2, SendOpcode::kSend, {local.At(0, 1)})), 0);
  t.fabric.Pump();

  auto s = Drain(t.sa);
  auto wb = Wire(*t.b);
  const size_t off = va - base;
  if (fault == Fault::kNone) {
    // The control: the geometry above is right, and the same request is allowed.
    ASSERT_GE(s.size(), 1u);
    ExpectCompletion(s[0], 1, WcStatus::kSuccess, wc_op, len, t.qa->qpn());
    std::vector<uint8_t> want(8192, 0xEE);
    if (op == Op::kWrite) std::copy(local.bytes.begin(), local.bytes.begin() + len, want.begin() + off);
    if (op == Op::kCas) SetWord(want, off, 5);
    if (op == Op::kFadd) SetWord(want, off, 0xEEEEEEEEEEEEEEEFull);
    EXPECT_EQ(target, want);
    if (op == Op::kRead) EXPECT_EQ(0, std::memcmp(local.bytes.data(), target.data() + off, len));
    return;
  }
  ASSERT_EQ(s.size(), 2u);
  ExpectCompletion(s[0], 1, WcStatus::kRemAccessErr, wc_op, len, t.qa->qpn());
  EXPECT_EQ(s[1].wr_id, 2u);
  EXPECT_EQ(s[1].status, WcStatus::kWrFlushErr);
  EXPECT_EQ(target, std::vector<uint8_t>(8192, 0xEE));  // not one byte written, inside the region or out
  EXPECT_EQ(local.bytes, local_before);                  // and nothing came back
  ASSERT_EQ(wb.size(), 1u);                              // only the NAK: no READ response, no atomic ACK
  EXPECT_TRUE(IsNak(wb[0], wire::NakCode::kRemoteAccessError));
  EXPECT_EQ(wb[0].psn, 0u);
  EXPECT_EQ(t.b->device->counters().rx_remote_access_denied, 1u);
  EXPECT_EQ(t.qa->state(), QpState::kErr);
  EXPECT_EQ(t.qb->state(), QpState::kErr);
}

std::vector<AccessCase> AllAccessCases() {
  std::vector<AccessCase> v;
  for (Op op : {Op::kWrite, Op::kRead, Op::kCas, Op::kFadd})
    for (Fault f : {Fault::kNone, Fault::kBadRkey, Fault::kBelowByOne, Fault::kAboveByOne, Fault::kMrLacksRight,
                    Fault::kQpLacksRight})
      v.push_back({op, f});
  return v;
}

INSTANTIATE_TEST_SUITE_P(All, RcRemoteAccess, ::testing::ValuesIn(AllAccessCases()), CaseName);

// --- RNR -----------------------------------------------------------------------------------------------------------

TEST(RcRnr, NakCarriesMinRnrTimerAndTheSendCompletesOnceAReceiveIsPosted) {
  Rc t;
  Buffer src = testing::Register(*t.a->device, t.pa, 4096, kMrAll);
  Buffer dst = testing::Register(*t.b->device, t.pb, 4096, kMrAll);
  Fill(src.bytes, 13);
  const uint64_t t0 = t.now();
  ASSERT_EQ(t.a->device->PostSend(t.qa, Wr(1, SendOpcode::kSend, {src.At(0, 300)})), 0);
  t.fabric.PumpUntil(t0 + 3 * kRnr12Ns + kRnr12Ns / 2);
  auto wa = Wire(*t.a);
  auto wb = Wire(*t.b);
  ASSERT_EQ(wa.size(), 4u);  // t0 and three retries, each min_rnr_timer (0.64 ms) after the NAK
  ASSERT_EQ(wb.size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(wa[i].opcode, rcop::kSendOnly);
    EXPECT_EQ(wa[i].psn, 0u);
    EXPECT_EQ(wa[i].time_ns, t0 + i * kRnr12Ns);
    EXPECT_TRUE(IsRnrNak(wb[i]));
    EXPECT_EQ(wb[i].aeth->rnr_timer(), 12);
    EXPECT_EQ(wb[i].psn, 0u);
  }
  EXPECT_TRUE(Drain(t.sa).empty());
  ASSERT_EQ(t.b->device->PostRecv(t.qb, RecvWr{5, {dst.At(0, 4096)}}), 0);
  t.fabric.Pump();
  auto s = Drain(t.sa);
  ASSERT_EQ(s.size(), 1u);
  ExpectCompletion(s[0], 1, WcStatus::kSuccess, WcOpcode::kSend, 300, t.qa->qpn());
  auto r = Drain(t.rb);
  ASSERT_EQ(r.size(), 1u);
  ExpectCompletion(r[0], 5, WcStatus::kSuccess, WcOpcode::kRecv, 300, t.qb->qpn());
  EXPECT_EQ(0, std::memcmp(dst.bytes.data(), src.bytes.data(), 300));
  wa = Wire(*t.a);
  ASSERT_EQ(wa.size(), 5u);
  EXPECT_EQ(wa[4].time_ns, t0 + 4 * kRnr12Ns);
  EXPECT_EQ(t.b->device->counters().rc_rnr_naks_sent, 4u);
  EXPECT_EQ(t.a->device->counters().rc_retransmit_timeouts, 0u);
}

TEST(RcRnr, FiniteRetryCountExhaustsAfterExactlyRetryPlusOneAttempts) {
  for (uint8_t n = 0; n <= 6; ++n) {
    SCOPED_TRACE(::testing::Message() << "rnr_retry=" << int(n));
    RcAttributes ra = Attrs();
    ra.rnr_retry = n;
    Rc t(ra, Attrs());
    Buffer src = testing::Register(*t.a->device, t.pa, 64, kMrAll);
    const uint64_t t0 = t.now();
    ASSERT_EQ(t.a->device->PostSend(t.qa, Wr(1, SendOpcode::kSend, {src.At(0, 10)})), 0);
    ASSERT_EQ(t.a->device->PostSend(t.qa, Wr(2, SendOpcode::kSend, {src.At(0, 10)})), 0);
    t.fabric.Pump();
    auto s = Drain(t.sa);
    ASSERT_EQ(s.size(), 2u);
    ExpectCompletion(s[0], 1, WcStatus::kRnrRetryExcErr, WcOpcode::kSend, 10, t.qa->qpn());
    EXPECT_EQ(s[1].status, WcStatus::kWrFlushErr);
    auto wa = Wire(*t.a);
    EXPECT_EQ(CountOpcode(wa, rcop::kSendOnly), wa.size());  // only SENDs on the wire
    std::vector<Pkt> first;
    for (const Pkt& p : wa)
      if (p.psn == 0) first.push_back(p);
    EXPECT_EQ(first.size(), n + 1u);
    for (size_t i = 0; i < first.size(); ++i) EXPECT_EQ(first[i].time_ns, t0 + i * kRnr12Ns);
    auto wb = Wire(*t.b);
    EXPECT_EQ(std::count_if(wb.begin(), wb.end(), [](const Pkt& p) { return IsRnrNak(p) && p.psn == 0; }), n + 1);
    EXPECT_EQ(t.qa->state(), QpState::kErr);
    EXPECT_EQ(t.qb->state(), QpState::kRts);  // an RNR is not the responder's error
  }
}

TEST(RcRnr, RetryCountSevenRetriesForever) {
  Rc t;  // rnr_retry 7
  Buffer src = testing::Register(*t.a->device, t.pa, 64, kMrAll);
  Buffer dst = testing::Register(*t.b->device, t.pb, 64, kMrAll);
  const uint64_t t0 = t.now();
  ASSERT_EQ(t.a->device->PostSend(t.qa, Wr(1, SendOpcode::kSend, {src.At(0, 10)})), 0);
  t.fabric.PumpUntil(t0 + 50 * kRnr12Ns + kRnr12Ns / 2);
  EXPECT_EQ(Wire(*t.a).size(), 51u);
  EXPECT_EQ(t.b->device->counters().rc_rnr_naks_sent, 51u);
  EXPECT_TRUE(Drain(t.sa).empty());
  ASSERT_EQ(t.b->device->PostRecv(t.qb, RecvWr{5, {dst.At(0, 64)}}), 0);
  t.fabric.Pump();
  auto s = Drain(t.sa);
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].status, WcStatus::kSuccess);
  EXPECT_EQ(Drain(t.rb).size(), 1u);
}

TEST(RcRnr, RetryBudgetIsRestoredByForwardProgress) {
  // rnr_retry bounds the retries of one request, not of the connection's life: after an ACK the next RNR NAK
  // starts from the full count again (IBTA 9.7.5.2.8; rxe resets it on every ACK too).
  RcAttributes ra = Attrs();
  ra.rnr_retry = 1;
  Rc t(ra, Attrs());
  Buffer src = testing::Register(*t.a->device, t.pa, 64, kMrAll);
  Buffer dst = testing::Register(*t.b->device, t.pb, 64, kMrAll);
  for (uint64_t m = 1; m <= 3; ++m) {
    SCOPED_TRACE(m);
    ASSERT_EQ(t.a->device->PostSend(t.qa, Wr(m, SendOpcode::kSend, {src.At(0, 10)})), 0);
    t.fabric.PumpUntil(t.now() + kRnr12Ns / 2);  // one RNR NAK, waiting out the timer
    ASSERT_EQ(t.b->device->PostRecv(t.qb, RecvWr{m, {dst.At(0, 64)}}), 0);
    t.fabric.Pump();
    auto s = Drain(t.sa);
    ASSERT_EQ(s.size(), 1u);
    EXPECT_EQ(s[0].status, WcStatus::kSuccess) << ToString(s[0].status);
  }
  EXPECT_EQ(t.b->device->counters().rc_rnr_naks_sent, 3u);
}

// --- local ACK timeout -----------------------------------------------------------------------------------------------

// IBTA C9-141: retry_cnt counts retries, 7 included (only rnr_retry 7 means forever): a peer that stopped answering
// fails the oldest WR with RETRY_EXC_ERR after exactly retry_cnt + 1 timeouts, and the rest is flushed.
// The local ACK timeout alone, without early retransmission (DeviceConfig::early_retransmit), as these tests count
// every retransmission.
DeviceConfig TimeoutsOnly() {
  DeviceConfig c;
  c.early_retransmit = false;
  return c;
}

TEST(RcTimeout, RetryCountExhaustsWithRetryExceeded) {
  constexpr uint8_t kTimeout = 10;  // 4.096 us << 10 = 4.19 ms
  const uint64_t T = AckTimeoutNs(kTimeout);
  for (uint8_t n = 0; n <= 7; ++n) {
    SCOPED_TRACE(::testing::Message() << "retry_cnt=" << int(n));
    RcAttributes ra = Attrs();
    ra.timeout = kTimeout;
    ra.retry_cnt = n;
    Rc t(ra, Attrs(), Mtu::k1024, TimeoutsOnly());
    Buffer src = testing::Register(*t.a->device, t.pa, 64, kMrAll);
    Buffer dst = testing::Register(*t.b->device, t.pb, 64, kMrAll);
    ASSERT_EQ(t.b->device->PostRecv(t.qb, RecvWr{5, {dst.At(0, 64)}}), 0);
    t.a->transport->drop_if = [](uint64_t, std::span<const uint8_t>) { return true; };  // the peer is unreachable
    const uint64_t t0 = t.now();
    ASSERT_EQ(t.a->device->PostSend(t.qa, Wr(1, SendOpcode::kSend, {src.At(0, 10)})), 0);
    ASSERT_EQ(t.a->device->PostSend(t.qa, Wr(2, SendOpcode::kSend, {src.At(0, 10)})), 0);
    t.fabric.Pump();
    auto s = Drain(t.sa);
    ASSERT_EQ(s.size(), 2u);
    ExpectCompletion(s[0], 1, WcStatus::kRetryExcErr, WcOpcode::kSend, 10, t.qa->qpn());
    EXPECT_EQ(s[1].status, WcStatus::kWrFlushErr);
    EXPECT_EQ(t.a->device->counters().rc_retransmit_timeouts, n);
    EXPECT_EQ(t.now(), t0 + (n + 1) * T);  // the last timeout is where the WR fails
    std::vector<Pkt> first;
    for (const Pkt& p : Wire(*t.a))
      if (p.psn == 0) first.push_back(p);
    ASSERT_EQ(first.size(), n + 1u);  // the original and n retransmissions
    for (size_t i = 0; i < first.size(); ++i) EXPECT_EQ(first[i].time_ns, t0 + i * T);
    EXPECT_EQ(t.qa->state(), QpState::kErr);
    EXPECT_TRUE(Drain(t.rb).empty());
  }
}

// Kernel rxe's deviation, kept behind a device option (UROCE_RETRY_FOREVER=1): retry_cnt 7 retries forever.
TEST(RcTimeout, RetryCountSevenRetriesForeverWhenConfiguredAsRxe) {
  RcAttributes ra = Attrs();
  ra.timeout = 8;
  DeviceConfig rxe_like = TimeoutsOnly();
  rxe_like.retry_cnt_7_infinite = true;
  Rc t(ra, Attrs(), Mtu::k1024, rxe_like);  // retry_cnt 7
  const uint64_t T = AckTimeoutNs(8);
  Buffer src = testing::Register(*t.a->device, t.pa, 64, kMrAll);
  Buffer dst = testing::Register(*t.b->device, t.pb, 64, kMrAll);
  ASSERT_EQ(t.b->device->PostRecv(t.qb, RecvWr{5, {dst.At(0, 64)}}), 0);
  t.a->transport->drop_if = [](uint64_t, std::span<const uint8_t>) { return true; };
  const uint64_t t0 = t.now();
  ASSERT_EQ(t.a->device->PostSend(t.qa, Wr(1, SendOpcode::kSend, {src.At(0, 10)})), 0);
  t.fabric.PumpUntil(t0 + 50 * T + T / 2);
  EXPECT_EQ(Wire(*t.a).size(), 51u);
  EXPECT_EQ(t.a->device->counters().rc_retransmit_timeouts, 50u);
  EXPECT_TRUE(Drain(t.sa).empty());
  t.a->transport->drop_if = nullptr;
  t.fabric.Pump();
  auto s = Drain(t.sa);
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].status, WcStatus::kSuccess);
  EXPECT_EQ(t.now(), t0 + 51 * T);
  EXPECT_EQ(Drain(t.rb).size(), 1u);
}

TEST(RcTimeout, ZeroMeansNoRetransmissionTimer) {
  RcAttributes ra = Attrs();
  ra.timeout = 0;
  Rc t(ra, Attrs());
  Buffer src = testing::Register(*t.a->device, t.pa, 64, kMrAll);
  Buffer dst = testing::Register(*t.b->device, t.pb, 64, kMrAll);
  ASSERT_EQ(t.b->device->PostRecv(t.qb, RecvWr{5, {dst.At(0, 64)}}), 0);
  t.a->transport->drop_if = [](uint64_t, std::span<const uint8_t>) { return true; };
  const uint64_t t0 = t.now();
  ASSERT_EQ(t.a->device->PostSend(t.qa, Wr(1, SendOpcode::kSend, {src.At(0, 10)})), 0);
  t.fabric.Pump();
  EXPECT_EQ(t.now(), t0);
  EXPECT_EQ(t.a->device->RunTimers(), 0u);  // nothing armed
  EXPECT_EQ(Wire(*t.a).size(), 1u);
  EXPECT_TRUE(Drain(t.sa).empty());
  EXPECT_EQ(t.qa->requester().state().sq.size(), 1u);  // waits for ever
  EXPECT_EQ(t.qa->state(), QpState::kRts);
}

// Every message arms the retransmit timer and its ACK disarms it: arming must not interrupt a poller that comes
// back before that deadline anyway (a wake-up costs a thread switch per message), only one that would sleep past it.
TEST(RcTimeout, ArmingWakesThePollerOnlyWhenItWouldSleepPastTheDeadline) {
  Rc t(Attrs(), Attrs());  // timeout 14: 67 ms
  Buffer src = testing::Register(*t.a->device, t.pa, 64, kMrAll);
  Buffer dst = testing::Register(*t.b->device, t.pb, 64 * 20, kMrAll);
  for (uint64_t i = 0; i < 20; ++i) ASSERT_EQ(t.b->device->PostRecv(t.qb, RecvWr{i, {dst.At(i * 64, 64)}}), 0);
  Device& a = *t.a->device;
  // A poller that sleeps until a packet arrives (no deadline) is woken by the first timer armed.
  EXPECT_EQ(a.RunTimers(), 0u);
  uint64_t wakes = t.a->transport->wakes();
  ASSERT_EQ(a.PostSend(t.qa, Wr(1, SendOpcode::kSend, {src.At(0, 10)})), 0);
  EXPECT_EQ(t.a->transport->wakes(), wakes + 1);
  t.fabric.Pump();
  ASSERT_EQ(Drain(t.sa).size(), 1u);
  // A poller that comes back within 10 ms is not woken for 67 ms deadlines, message after message.
  wakes = t.a->transport->wakes();
  for (uint64_t i = 2; i < 12; ++i) {
    EXPECT_EQ(a.RunTimers(t.now() + 10'000'000), 0u);
    ASSERT_EQ(a.PostSend(t.qa, Wr(i, SendOpcode::kSend, {src.At(0, 10)})), 0);
    t.fabric.Pump();
  }
  EXPECT_EQ(t.a->transport->wakes(), wakes);
  EXPECT_EQ(Drain(t.sa).size(), 10u);
  EXPECT_EQ(Drain(t.rb).size(), 11u);
  // But a deadline before its return wakes it: timeout 8 is ~1 ms.
  RcAttributes fast = Attrs();
  fast.timeout = 8;
  Rc u(fast, Attrs());
  Buffer usrc = testing::Register(*u.a->device, u.pa, 64, kMrAll);
  EXPECT_EQ(u.a->device->RunTimers(u.now() + 10'000'000), 0u);
  wakes = u.a->transport->wakes();
  ASSERT_EQ(u.a->device->PostSend(u.qa, Wr(20, SendOpcode::kRdmaWrite, {usrc.At(0, 10)})), 0);
  EXPECT_EQ(u.a->transport->wakes(), wakes + 1);
}

// --- early retransmission (DeviceConfig::early_retransmit) ------------------------------------------------------

// A lost NAK leaves the responder dropping everything after the gap in silence (it NAKs a sequence error once, so
// the tail probes draw nothing either): without early retransmission only the local ACK timeout (67 ms at timeout
// 14) would end it.
TEST(RcEarlyRetransmit, ALostNakIsRecoveredInRoundTripsNotByTheTimeout) {
  Rc t(Attrs(), Attrs());  // timeout 14, retry_cnt 7
  Buffer src = testing::Register(*t.a->device, t.pa, 64, kMrAll);
  Buffer dst = testing::Register(*t.b->device, t.pb, 3 * 64, kMrAll);
  Fill(src.bytes, 21);
  for (uint64_t i = 0; i < 3; ++i) ASSERT_EQ(t.b->device->PostRecv(t.qb, RecvWr{i, {dst.At(i * 64, 64)}}), 0);
  t.a->transport->drop_if = testing::DropPsn(0);
  t.b->transport->drop_if = testing::DropPsn(0, rcop::kAcknowledge);  // the NAK it causes
  const uint64_t t0 = t.now();
  for (uint64_t i = 0; i < 3; ++i)
    ASSERT_EQ(t.a->device->PostSend(t.qa, Wr(i, SendOpcode::kSend, {src.At(0, 64)})), 0);
  t.fabric.Pump();
  auto s = Drain(t.sa);
  ASSERT_EQ(s.size(), 3u);
  for (uint64_t i = 0; i < 3; ++i) ExpectCompletion(s[i], i, WcStatus::kSuccess, WcOpcode::kSend, 64, t.qa->qpn());
  ASSERT_EQ(Drain(t.rb).size(), 3u);
  for (uint64_t i = 0; i < 3; ++i) EXPECT_EQ(0, std::memcmp(dst.bytes.data() + i * 64, src.bytes.data(), 64));
  const auto wb = Wire(*t.b);
  ASSERT_FALSE(wb.empty());
  EXPECT_TRUE(wb[0].dropped);
  EXPECT_TRUE(IsNak(wb[0], wire::NakCode::kPsnSeqError));
  // No RTT sample yet (nothing was ever acknowledged): four assumed round trips, then twice and four times that.
  const uint64_t probe = RcRequester::kProbeRoundTrips * RcRequester::kInitialRttNs;
  static_assert(RcRequester::kTailProbes == 2);
  EXPECT_EQ(t.now(), t0 + 7 * probe);
  const auto wa = Wire(*t.a);
  ASSERT_EQ(wa.size(), 8u);  // PSN 0 (lost), 1, 2, two tail probes (PSN 2), then all three again from PSN 0
  EXPECT_EQ(wa[3].psn, 2u);
  EXPECT_EQ(wa[3].time_ns, t0 + probe);
  EXPECT_EQ(wa[4].psn, 2u);
  EXPECT_EQ(wa[4].time_ns, t0 + 3 * probe);
  EXPECT_EQ(wa[5].psn, 0u);
  EXPECT_EQ(wa[5].time_ns, t0 + 7 * probe);
  EXPECT_EQ(t.a->device->counters().rc_tail_probes, 2u);
  EXPECT_EQ(t.a->device->counters().rc_early_retransmits, 1u);
  EXPECT_EQ(t.a->device->counters().rc_retransmit_timeouts, 0u);
  EXPECT_EQ(t.qa->requester().state().retries_left, 7);  // no retry spent
}

// The wait before an early retransmission follows the measured round trip, and never goes below kMinProbeNs.
TEST(RcEarlyRetransmit, TheWaitFollowsTheMeasuredRoundTrip) {
  Rc t(Attrs(), Attrs());
  Buffer src = testing::Register(*t.a->device, t.pa, 64, kMrAll);
  Buffer dst = testing::Register(*t.b->device, t.pb, 64, kMrAll);
  ASSERT_EQ(t.a->device->PostSend(t.qa, Rdma(1, SendOpcode::kRdmaWrite, {src.At(0, 8)}, dst.mr.iova, dst.mr.rkey)), 0);
  t.fabric.Pump();
  ASSERT_EQ(Drain(t.sa).size(), 1u);
  const auto path = t.a->device->path_window(t.b->device->config().address);
  ASSERT_TRUE(path.has_value());
  const uint64_t srtt = path->srtt_ns();
  EXPECT_GT(srtt, 0u);  // timed: the WRITE's first sending to its ACK
  EXPECT_LT(srtt, RcRequester::kMinProbeNs / RcRequester::kProbeRoundTrips);  // the simulated network is fast
  // Its ACK is lost: the write is sent again (a tail probe, which its ACK answers) after kMinProbeNs, not after four
  // assumed round trips.
  t.b->transport->drop_if = [](uint64_t, std::span<const uint8_t>) { return true; };
  const uint64_t t0 = t.now();
  ASSERT_EQ(t.a->device->PostSend(t.qa, Rdma(2, SendOpcode::kRdmaWrite, {src.At(0, 8)}, dst.mr.iova, dst.mr.rkey)), 0);
  t.fabric.PumpUntil(t0 + RcRequester::kMinProbeNs - 1);  // the ACK is lost; nothing else happens yet
  EXPECT_EQ(Wire(*t.a).size(), 2u);
  t.b->transport->drop_if = nullptr;
  t.fabric.Pump();
  ASSERT_EQ(Drain(t.sa).size(), 1u);
  const auto wa = Wire(*t.a);
  ASSERT_EQ(wa.size(), 3u);
  EXPECT_EQ(wa[2].psn, wa[1].psn);
  EXPECT_EQ(wa[2].time_ns, t0 + RcRequester::kMinProbeNs);
  EXPECT_EQ(t.a->device->counters().rc_tail_probes, 1u);
  EXPECT_EQ(t.a->device->counters().rc_early_retransmits, 0u);
}

// A peer that drops a burst's tail in silence (kernel rxe when its queues overflow: no packet behind the drop, so no
// sequence NAK) is heard from only through early retransmission: the tail probe arrives out of sequence and its NAK
// sends the rest again and cuts the path's window, as a loss must. Without the cut the kernel-rxe interop test's
// uroce clients overran rxe again after each resend and failed with RETRY_EXC_ERR.
TEST(RcEarlyRetransmit, ATailDroppedInSilenceIsFoundByAProbeAndCutsThePathWindow) {
  Rc t(Attrs(), Attrs());  // 1 KiB MTU: a 64 KiB WRITE is 64 packets, the first 32 within the initial window
  Buffer src = testing::Register(*t.a->device, t.pa, 64 * 1024, kMrAll);
  Buffer dst = testing::Register(*t.b->device, t.pb, 64 * 1024, kMrAll);
  Fill(src.bytes, 5);
  t.a->transport->drop_if = testing::DropPsns(8, 32);
  ASSERT_EQ(t.a->device->PostSend(t.qa, Rdma(1, SendOpcode::kRdmaWrite, {src.At(0, 64 * 1024)}, dst.mr.iova,
                                             dst.mr.rkey)),
            0);
  t.fabric.Pump();
  auto s = Drain(t.sa);
  ASSERT_EQ(s.size(), 1u);
  ExpectCompletion(s[0], 1, WcStatus::kSuccess, WcOpcode::kRdmaWrite, 64 * 1024, t.qa->qpn());
  EXPECT_EQ(0, std::memcmp(dst.bytes.data(), src.bytes.data(), 64 * 1024));
  EXPECT_EQ(t.b->device->counters().rx_out_of_sequence, 1u);  // only the probe arrived behind the drop
  EXPECT_EQ(t.a->device->counters().rc_tail_probes, 1u);
  EXPECT_EQ(t.a->device->counters().rc_early_retransmits, 0u);
  EXPECT_EQ(t.a->device->counters().rc_retransmit_timeouts, 0u);
  const auto path = t.a->device->path_window(t.b->device->config().address);
  ASSERT_TRUE(path.has_value());
  EXPECT_EQ(path->decreases(), 1u);  // one loss episode
  EXPECT_EQ(path->phase(), PathWindow::Phase::kCongestionAvoidance);
}

// Others waiting for the path's window hold early retransmission off (their packets may be ahead of ours), but not
// when nothing is delivered on the path at all: here everything in flight is this QP's, the others wait behind it,
// and its silence is a loss (RcRequester::SilenceMeansLoss). Its lost tail held the whole path until the local ACK
// timeout (67 ms here).
TEST(RcEarlyRetransmit, ALostTailIsSentAgainEarlyThoughOthersWaitBehindIt) {
  Rc t(Attrs(), Attrs());  // 1 KiB MTU; the path's window starts at 32 packets
  CompletionQueue *cq_a2 = nullptr, *cq_b2 = nullptr;
  ASSERT_EQ(t.a->device->CreateCq(64, &cq_a2), 0);
  ASSERT_EQ(t.b->device->CreateCq(64, &cq_b2), 0);
  QueuePair* qa2 = testing::CreateConnectedQp(*t.a->device, QpType::kRc, t.pa, cq_a2, nullptr, 0);
  QueuePair* qb2 = testing::CreateConnectedQp(*t.b->device, QpType::kRc, t.pb, cq_b2, nullptr, 0);
  ASSERT_NE(qa2, nullptr);
  ASSERT_NE(qb2, nullptr);
  testing::Connect(*t.a->device, qa2, *t.b->device, qb2->qpn(), kMrAll);  // the same two devices: the same path
  testing::Connect(*t.b->device, qb2, *t.a->device, qa2->qpn(), kMrAll);
  Buffer src = testing::Register(*t.a->device, t.pa, 48 * 1024, kMrAll);
  Buffer dst = testing::Register(*t.b->device, t.pb, 48 * 1024, kMrAll);
  Fill(src.bytes, 7);
  // qa's 32 packets fill the window; the last, the only one that asks for an ACK, is lost.
  t.a->transport->drop_if = testing::DropFirst(1, [&](const wire::PacketView& p) {
    return p.bth.dest_qp == t.qb->qpn() && p.bth.psn == 31;
  });
  const uint64_t t0 = t.now();
  ASSERT_EQ(t.a->device->PostSend(t.qa, Rdma(1, SendOpcode::kRdmaWrite, {src.At(0, 32 * 1024)}, dst.mr.iova,
                                             dst.mr.rkey)),
            0);
  ASSERT_EQ(t.a->device->PostSend(qa2, Rdma(2, SendOpcode::kRdmaWrite, {src.At(32 * 1024, 16 * 1024)},
                                            dst.mr.iova + 32 * 1024, dst.mr.rkey)),
            0);
  EXPECT_EQ(t.a->device->counters().rc_path_waits, 1u);  // qa2 waits for the window
  t.fabric.Pump();
  auto s1 = Drain(t.sa), s2 = Drain(cq_a2);
  ASSERT_EQ(s1.size(), 1u);
  ASSERT_EQ(s2.size(), 1u);
  ExpectCompletion(s1[0], 1, WcStatus::kSuccess, WcOpcode::kRdmaWrite, 32 * 1024, t.qa->qpn());
  ExpectCompletion(s2[0], 2, WcStatus::kSuccess, WcOpcode::kRdmaWrite, 16 * 1024, qa2->qpn());
  EXPECT_EQ(0, std::memcmp(dst.bytes.data(), src.bytes.data(), 48 * 1024));
  // Nothing was acknowledged: at the second early-retransmission probe that finds the path silent
  // (RcRequester::kSilentLooks; no round trip measured yet, so the first waits four assumed ones and the second twice
  // that), not at the local ACK timeout, the lost packet -- the newest -- goes again as a tail probe, and its ACK
  // covers all 32: nothing else is sent twice.
  const auto wa = Wire(*t.a);
  ASSERT_GT(wa.size(), 32u);
  EXPECT_EQ(wa[32].psn, wa[31].psn);
  static_assert(RcRequester::kSilentLooks == 2);
  EXPECT_EQ(wa[32].time_ns, t0 + 3 * RcRequester::kProbeRoundTrips * RcRequester::kInitialRttNs);
  EXPECT_EQ(t.a->device->counters().rc_tail_probes, 1u);
  EXPECT_EQ(t.a->device->counters().rc_early_retransmits, 0u);
  EXPECT_EQ(t.a->device->counters().rc_retransmit_timeouts, 0u);
}

// A dead peer is found exactly as without early retransmission: RETRY_EXC_ERR after retry_cnt + 1 local ACK
// timeouts, the early retransmissions between them spending no retry.
TEST(RcEarlyRetransmit, ADeadPeerStillFailsAfterRetryCountPlusOneTimeouts) {
  constexpr uint8_t kTimeout = 10;  // 4.19 ms
  const uint64_t T = AckTimeoutNs(kTimeout);
  RcAttributes ra = Attrs();
  ra.timeout = kTimeout;
  ra.retry_cnt = 2;
  Rc t(ra, Attrs());
  Buffer src = testing::Register(*t.a->device, t.pa, 64, kMrAll);
  t.a->transport->drop_if = [](uint64_t, std::span<const uint8_t>) { return true; };
  const uint64_t t0 = t.now();
  ASSERT_EQ(t.a->device->PostSend(t.qa, Wr(1, SendOpcode::kSend, {src.At(0, 10)})), 0);
  t.fabric.Pump();
  auto s = Drain(t.sa);
  ASSERT_EQ(s.size(), 1u);
  ExpectCompletion(s[0], 1, WcStatus::kRetryExcErr, WcOpcode::kSend, 10, t.qa->qpn());
  EXPECT_EQ(t.now(), t0 + 3 * T);
  EXPECT_EQ(t.a->device->counters().rc_retransmit_timeouts, 2u);
  // 1 ms, 3 ms after each start of the timer (then 7 ms would pass the timeout): two tail probes per timeout period,
  // no go-back-N.
  EXPECT_EQ(t.a->device->counters().rc_tail_probes, 6u);
  EXPECT_EQ(t.a->device->counters().rc_early_retransmits, 0u);
  EXPECT_EQ(t.qa->state(), QpState::kErr);
}

// A stopped responder and a forged ACK (any source port, the responder's address) naming a PSN the requester never
// sent: nothing completes, the counter says why, and the dead responder still fails the WR after the retries.
TEST(RcHostile, AnAckForAPsnNeverSentCompletesNothing) {
  constexpr uint8_t kTimeout = 10;
  RcAttributes ra = Attrs();
  ra.timeout = kTimeout;
  ra.retry_cnt = 2;
  Rc t(ra, Attrs());
  Buffer src = testing::Register(*t.a->device, t.pa, 64, kMrAll);
  Buffer dst = testing::Register(*t.b->device, t.pb, 64, kMrAll);
  t.a->transport->drop_if = [](uint64_t, std::span<const uint8_t>) { return true; };  // b hears nothing
  const uint32_t sq_psn = t.qa->attributes().sq_psn;
  ASSERT_EQ(t.a->device->PostSend(t.qa, Rdma(1, SendOpcode::kRdmaWrite, {src.At(0, 8)}, dst.mr.iova, dst.mr.rkey)),
            0);
  t.fabric.Step();
  for (uint32_t ahead : {2u, 1000u, 0x7fffffu}) {
    wire::PacketSpec ack;
    ack.bth.opcode = rcop::kAcknowledge;
    ack.bth.dest_qp = t.qa->qpn();
    ack.bth.psn = (sq_psn + ahead) & 0xffffff;
    ack.aeth = wire::Aeth::Ack(wire::kInvalidCredits, 1);
    t.fabric.Inject(*t.b, *t.a, ack);
    t.fabric.Step();
    EXPECT_TRUE(Drain(t.sa).empty()) << "an ACK " << ahead << " PSNs ahead completed the WRITE";
  }
  EXPECT_EQ(t.a->device->counters().rc_unexpected_responses, 3u);
  t.fabric.Pump();
  auto s = Drain(t.sa);
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].status, WcStatus::kRetryExcErr);
  EXPECT_EQ(t.a->device->counters().rc_retransmit_timeouts, 2u);
}

// A region whose memory the program unmapped after registering it: a real HCA's pinned pages would take the WRITE
// (or answer the READ, or the atomic) unseen; ours must not make the program fault. Each access is refused as one
// outside a valid region (remote access error) and the process lives on.
TEST(RcHostile, AccessesToARegionUnmappedSinceItsRegistrationAreRemoteAccessErrors) {
  for (SendOpcode op : {SendOpcode::kRdmaWrite, SendOpcode::kRdmaRead, SendOpcode::kAtomicFetchAndAdd}) {
    SCOPED_TRACE(static_cast<int>(op));
    Rc t;
    Buffer src = testing::Register(*t.a->device, t.pa, 64, kMrAll);
    const size_t page = size_t(sysconf(_SC_PAGESIZE));
    void* mapped = mmap(nullptr, page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    ASSERT_NE(mapped, MAP_FAILED);
    MemoryRegion mr;
    ASSERT_EQ(t.b->device->RegisterMr(t.pb, mapped, page, reinterpret_cast<uint64_t>(mapped), kMrAll, &mr), 0);
    // Unmapped, and the address kept from reuse (by a mapping nobody may access) so no other mapping lands there.
    ASSERT_EQ(mmap(mapped, page, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0), mapped);
    SendWr wr = Rdma(1, op, {src.At(0, 8)}, mr.iova, mr.rkey);
    if (op == SendOpcode::kAtomicFetchAndAdd) wr.compare_add = 1;
    ASSERT_EQ(t.a->device->PostSend(t.qa, std::move(wr)), 0);
    t.fabric.Pump();
    auto s = Drain(t.sa);
    ASSERT_EQ(s.size(), 1u);
    EXPECT_EQ(s[0].status, WcStatus::kRemAccessErr);
    EXPECT_GE(t.b->device->counters().rx_remote_access_denied, 1u);
    munmap(mapped, page);
  }
}

// Two ends given different path MTUs (a program's mistake, or two hosts' defaults) cut and count messages
// differently: a packet of another size than the responder's PMTU is an invalid request, and a WRITE the responder
// skipped as a "duplicate" (a READ consumed more PSNs on its side than on ours) must never complete with success.
// Each WRITE that completes successfully has its bytes at the target, whichever end has the larger MTU.
TEST(RcHostile, PathMtusThatDisagreeFailRequestsAndNeverReportAnUnexecutedWrite) {
  for (const auto& [mtu_a, mtu_b] : {std::pair{Mtu::k4096, Mtu::k1024}, std::pair{Mtu::k1024, Mtu::k4096}}) {
    SCOPED_TRACE(MtuBytes(mtu_a));
    for (bool read_first : {false, true}) {
      SCOPED_TRACE(read_first ? "READ then WRITEs" : "WRITEs");
      testing::Fabric fabric;
      testing::Node& a = fabric.AddNode(mtu_a);
      testing::Node& b = fabric.AddNode(mtu_b);
      ProtectionDomain* pa = a.device->AllocPd();
      ProtectionDomain* pb = b.device->AllocPd();
      CompletionQueue *ca = nullptr, *cb = nullptr;
      ASSERT_EQ(a.device->CreateCq(64, &ca), 0);
      ASSERT_EQ(b.device->CreateCq(64, &cb), 0);
      QpInitAttributes init;
      init.type = QpType::kRc;
      init.cap = {16, 16, 1, 1, 0};
      init.pd = pa;
      init.send_cq = init.recv_cq = ca;
      QueuePair *qa = nullptr, *qb = nullptr;
      ASSERT_EQ(a.device->CreateQp(init, &qa), 0);
      init.pd = pb;
      init.send_cq = init.recv_cq = cb;
      ASSERT_EQ(b.device->CreateQp(init, &qb), 0);
      ConnectRc(*a.device, qa, *b.device, qb->qpn(), Attrs());
      ConnectRc(*b.device, qb, *a.device, qa->qpn(), Attrs());
      Buffer src = testing::Register(*a.device, pa, 64 * 1024, kMrAll);
      Buffer dst = testing::Register(*b.device, pb, 64 * 1024, kMrAll);
      for (size_t i = 0; i < src.bytes.size(); ++i) src.bytes[i] = uint8_t(i * 7 + 1);
      uint64_t id = 1;
      if (read_first)
        ASSERT_EQ(a.device->PostSend(qa, Rdma(id++, SendOpcode::kRdmaRead, {src.At(60000, 3000)}, dst.mr.iova,
                                              dst.mr.rkey)),
                  0);
      // Writes of one, three and ten packets (at the smaller MTU), each to its own place.
      const std::vector<std::pair<uint64_t, uint32_t>> writes = {{0, 8}, {1000, 3000}, {8000, 10000}};
      for (const auto& [off, len] : writes)
        ASSERT_EQ(a.device->PostSend(qa, Rdma(id++, SendOpcode::kRdmaWrite, {src.At(off, len)}, dst.mr.iova + off,
                                              dst.mr.rkey)),
                  0);
      fabric.Pump();
      const auto wcs = Drain(ca);
      ASSERT_EQ(wcs.size(), id - 1);
      // The READ, or the first WRITE of more than one packet at the smaller MTU, meets the other MTU.
      EXPECT_NE(wcs[read_first ? 0 : 1].status, WcStatus::kSuccess);
      for (const Completion& c : wcs) {
        if (c.status != WcStatus::kSuccess || c.opcode != WcOpcode::kRdmaWrite) continue;
        const auto& [off, len] = writes[c.wr_id - (read_first ? 2 : 1)];
        EXPECT_TRUE(std::equal(src.bytes.begin() + off, src.bytes.begin() + off + len, dst.bytes.begin() + off))
            << "WRITE " << c.wr_id << " completed with success but its bytes are not at the target";
      }
      EXPECT_EQ(qa->state(), QpState::kErr);
    }
  }
}

// --- the decision trace (DeviceConfig::trace) ------------------------------------------------------------------------

// The trace names, per packet, the step that decided and what it decided, and what each timer did: here a lost ACK
// recovered (the responder executes, its ACK is lost, the requester's silence probe resends the tail, the responder
// answers the duplicate with an ACK that completes the WRITE) and a WRITE to an R_Key the responder does not know
// (the key step denies it, the NAK fails the WQE). The test prints the trace it checks.
TEST(RcTrace, ALostAckRecoveryAndARemoteAccessNakStepByStep) {
  std::vector<std::string> trace;
  DeviceConfig traced;
  traced.trace = [&trace](std::string_view line) { trace.emplace_back(line); };
  Rc t(Attrs(), Attrs(), Mtu::k1024, traced);
  Buffer src = testing::Register(*t.a->device, t.pa, 64, kMrAll);
  Buffer dst = testing::Register(*t.b->device, t.pb, 64, kMrAll);
  bool dropped = false;
  // The first ACK b sends is lost (chosen by what it is, not by its place in the send order).
  t.b->transport->drop_if = [&dropped](uint64_t, std::span<const uint8_t> bytes) {
    const auto p = wire::ParsePacket(bytes);
    if (dropped || !p || p->bth.opcode != rcop::kAcknowledge) return false;
    return dropped = true;
  };
  ASSERT_EQ(t.a->device->PostSend(t.qa, Rdma(1, SendOpcode::kRdmaWrite, {src.At(0, 8)}, dst.mr.iova, dst.mr.rkey)),
            0);
  t.fabric.Pump();
  auto s = Drain(t.sa);
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].status, WcStatus::kSuccess);
  ASSERT_TRUE(dropped);
  const std::vector<std::string> recovery = trace;
  trace.clear();
  ASSERT_EQ(t.a->device->PostSend(t.qa, Rdma(2, SendOpcode::kRdmaWrite, {src.At(0, 8)}, dst.mr.iova, dst.mr.rkey ^ 0x5a)),
            0);
  t.fabric.Pump();
  s = Drain(t.sa);
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].status, WcStatus::kRemAccessErr);
  const std::vector<std::string> nak = trace;

  auto has = [](const std::vector<std::string>& lines, const std::string& pattern) {
    return std::any_of(lines.begin(), lines.end(),
                       [&](const std::string& l) { return std::regex_search(l, std::regex(pattern)); });
  };
  // Each line starts with the address of the device that decided.
  const std::string a = t.a->device->config().address.ToString(), b = t.b->device->config().address.ToString();
  const std::string responder = b + " responder qp " + Hex24(t.qb->qpn());
  const std::string requester = a + " requester qp " + Hex24(t.qa->qpn());
  const std::string completer = a + " completer qp " + Hex24(t.qa->qpn());
  EXPECT_TRUE(has(recovery, "^" + responder + " psn 0x000000 RC_RDMA_WRITE_ONLY: psn pass, opcode pass, "
                            "sequence pass, resources pass, length pass, key pass, execute pass, acknowledge executed$"));
  EXPECT_TRUE(has(recovery, "^" + requester + " psn 0x000000: nothing heard for a few round trips: tail probe"));
  EXPECT_TRUE(has(recovery, "^" + responder + " psn 0x000000 RC_RDMA_WRITE_ONLY: psn duplicate$"));
  EXPECT_TRUE(has(recovery, "^" + completer + " psn 0x000000 RC_ACKNOWLEDGE: ACK -> acknowledged$"));
  EXPECT_TRUE(has(nak, "^" + responder + " psn 0x000001 RC_RDMA_WRITE_ONLY: .* key access denied -> NAK "
                       "remote access error, QP to ERR$"));
  EXPECT_TRUE(has(nak, "^" + completer + " psn 0x000001 RC_ACKNOWLEDGE: NAK \\(remote access error\\) -> "
                       "WQE fails, QP to ERR$"));
  std::cout << "lost ACK recovered:\n";
  for (const std::string& l : recovery) std::cout << "  " << l << "\n";
  std::cout << "remote access error:\n";
  for (const std::string& l : nak) std::cout << "  " << l << "\n";
}

// --- held ACKs (Device::AckTiming::kHeld) ----------------------------------------------------------------------------

// Steps the fabric until `n` has received `packets` datagrams; returns the clock then.
uint64_t StepUntilReceived(Rc& t, const Node& n, uint64_t packets) {
  for (int i = 0; i < 1000 && n.device->counters().rx_packets < packets; ++i) t.fabric.Step();
  EXPECT_GE(n.device->counters().rx_packets, packets);
  return t.now();
}

// b holds its ACKs, and one 8-byte WRITE from a (la[0, 8) to lb[0, 8)) has reached b at `received`: its ACK waits.
class RcHeldAck : public ::testing::Test {
 protected:
  void SetUp() override {
    t.b->ack_timing = Device::AckTiming::kHeld;
    Fill(la.bytes, 3);
    Fill(lb.bytes, 4);
    ASSERT_EQ(t.a->device->PostSend(t.qa, Rdma(1, SendOpcode::kRdmaWrite, {la.At(0, 8)}, lb.mr.iova, lb.mr.rkey)),
              0);
    received = StepUntilReceived(t, *t.b, 1);
  }
  Rc t;
  Buffer la = testing::Register(*t.a->device, t.pa, 64, kMrAll);
  Buffer lb = testing::Register(*t.b->device, t.pb, 64, kMrAll);
  uint64_t received = 0;
};

TEST_F(RcHeldAck, AReplyOnTheSameQpLeavesFirstWithTheAckBehindIt) {
  EXPECT_EQ(0, std::memcmp(lb.bytes.data(), la.bytes.data(), 8));  // placed at once
  EXPECT_TRUE(Wire(*t.b).empty());                                  // the ACK is held
  // b answers, as ib_write_lat does once it sees the bytes: its WRITE leaves, then the ACK of a's.
  ASSERT_EQ(t.b->device->PostSend(t.qb, Rdma(2, SendOpcode::kRdmaWrite, {lb.At(32, 8)}, la.mr.iova + 32, la.mr.rkey)),
            0);
  const auto wb = Wire(*t.b);
  ASSERT_EQ(wb.size(), 2u);
  EXPECT_EQ(wb[0].opcode, rcop::kWriteOnly);
  EXPECT_TRUE(IsAck(wb[1]));
  EXPECT_EQ(wb[1].psn, Wire(*t.a)[0].psn);
  EXPECT_EQ(wb[0].time_ns, wb[1].time_ns);  // in the same batch
  t.fabric.Pump();
  auto sa = Drain(t.sa), sb = Drain(t.sb);
  ASSERT_EQ(sa.size(), 1u);
  ASSERT_EQ(sb.size(), 1u);
  EXPECT_EQ(sa[0].status, WcStatus::kSuccess);
  EXPECT_EQ(sb[0].status, WcStatus::kSuccess);
  EXPECT_EQ(0, std::memcmp(la.bytes.data() + 32, lb.bytes.data() + 32, 8));
  const auto after = Wire(*t.b);
  EXPECT_EQ(std::count_if(after.begin(), after.end(), IsAck), 1);  // not acknowledged twice
}

TEST_F(RcHeldAck, WithoutAReplyTheAckOfAOnePacketMessageLeavesAfterTheHoldTime) {
  t.fabric.Pump();
  const auto wb = Wire(*t.b);
  ASSERT_EQ(wb.size(), 1u);
  EXPECT_TRUE(IsAck(wb[0]));
  EXPECT_EQ(wb[0].time_ns, received + RcResponder::kAckHoldNs);  // not before, and the timer brings it out on time
  ASSERT_EQ(Drain(t.sa).size(), 1u);
  EXPECT_EQ(Wire(*t.a).size(), 1u);  // well inside the requester's ACK timeout: nothing resent
}

// Messages queued behind the path's window leave in passes of several; only the last packet of a pass (where the
// requester stops), and at least every 64th, asks for an ACK (IBTA 9.7.4.1.2 leaves AckReq to the requester): one
// ACK per message cost the receiver a send and the sender a receive for every 16 packets of ib_write_bw.
TEST(RcAckReq, MessagesSentInOnePassAskForOneAckWhereTheRequesterStops) {
  Rc t;  // MTU 1024: 2 packets a message; the path's window starts at 32 packets, so later WRITEs queue
  constexpr uint64_t kMessages = 40;
  Buffer la = testing::Register(*t.a->device, t.pa, kMessages * 2048, kMrAll);
  Buffer lb = testing::Register(*t.b->device, t.pb, kMessages * 2048, kMrAll);
  Fill(la.bytes, 5);
  for (uint64_t i = 0; i < kMessages; ++i)
    ASSERT_EQ(t.a->device->PostSend(t.qa, Rdma(i, SendOpcode::kRdmaWrite, {la.At(i * 2048, 2048)},
                                               lb.mr.iova + i * 2048, lb.mr.rkey)),
              0);
  EXPECT_GT(t.a->device->counters().rc_path_waits, 0u);  // some did queue
  t.fabric.Pump();

  EXPECT_EQ(0, std::memcmp(lb.bytes.data(), la.bytes.data(), kMessages * 2048));
  const auto s = Drain(t.sa);
  ASSERT_EQ(s.size(), kMessages);
  for (uint64_t i = 0; i < kMessages; ++i) ExpectCompletion(s[i], i, WcStatus::kSuccess, WcOpcode::kRdmaWrite, 2048,
                                                            t.qa->qpn());
  const auto wa = Wire(*t.a);
  ASSERT_EQ(wa.size(), 2 * kMessages);  // nothing sent twice
  size_t asks = 0, since_ask = 0;
  for (const Pkt& p : wa) {
    since_ask = p.ack_req ? 0 : since_ask + 1;
    EXPECT_LT(since_ask, 64u);
    if (p.ack_req) ++asks;
  }
  EXPECT_TRUE(wa.back().ack_req);  // the requester stops after its last packet
  EXPECT_LT(asks, kMessages);      // some messages were followed by others in the same pass
  size_t acks = 0;
  for (const Pkt& p : Wire(*t.b)) acks += IsAck(p) ? 1 : 0;
  EXPECT_LE(acks, asks);
  EXPECT_EQ(t.a->device->counters().rc_retransmit_timeouts, 0u);
  EXPECT_EQ(t.a->device->counters().rc_early_retransmits, 0u);
}

TEST(RcHeldAckStream, AStreamsAcksAreCoalescedIntoOneForAShortTime) {
  Rc t;  // MTU 1024
  t.b->ack_timing = Device::AckTiming::kHeld;
  Buffer la = testing::Register(*t.a->device, t.pa, 16384, kMrAll);
  Buffer lb = testing::Register(*t.b->device, t.pb, 16384, kMrAll);
  Fill(la.bytes, 9);
  for (uint64_t i = 0; i < 3; ++i)
    ASSERT_EQ(t.a->device->PostSend(t.qa, Rdma(i, SendOpcode::kRdmaWrite, {la.At(i * 4096, 4096)},
                                               lb.mr.iova + i * 4096, lb.mr.rkey)),
              0);
  const uint64_t received = StepUntilReceived(t, *t.b, 12);  // three messages of four packets, each asking for an ACK
  EXPECT_TRUE(Wire(*t.b).empty());
  t.fabric.Pump();
  const auto wb = Wire(*t.b);
  ASSERT_EQ(wb.size(), 1u);  // one ACK for all three
  EXPECT_TRUE(IsAck(wb[0]));
  EXPECT_EQ(wb[0].psn, 11u);
  EXPECT_EQ(wb[0].time_ns, received + RcResponder::kAckCoalesceNs);
  EXPECT_EQ(Drain(t.sa).size(), 3u);
  EXPECT_EQ(0, std::memcmp(lb.bytes.data(), la.bytes.data(), 3 * 4096));
}

TEST(RcHeldAckStream, AReadOrAtomicResponseFollowsTheHeldAckAndANakCoversIt) {
  Rc t;
  t.b->ack_timing = Device::AckTiming::kHeld;
  Buffer la = testing::Register(*t.a->device, t.pa, 64, kMrAll);
  Buffer lb = testing::Register(*t.b->device, t.pb, 64, kMrAll);
  ASSERT_EQ(t.a->device->PostSend(t.qa, Rdma(1, SendOpcode::kRdmaWrite, {la.At(0, 8)}, lb.mr.iova, lb.mr.rkey)), 0);
  ASSERT_EQ(t.a->device->PostSend(t.qa, Rdma(2, SendOpcode::kRdmaRead, {la.At(16, 8)}, lb.mr.iova + 16, lb.mr.rkey)),
            0);
  StepUntilReceived(t, *t.b, 2);
  auto wb = Wire(*t.b);
  ASSERT_EQ(wb.size(), 2u);  // at once, in PSN order
  EXPECT_TRUE(IsAck(wb[0]));
  EXPECT_EQ(wb[0].psn, 0u);
  EXPECT_EQ(wb[1].opcode, rcop::kReadResponseOnly);
  EXPECT_EQ(wb[1].psn, 1u);
  t.fabric.Pump();
  EXPECT_EQ(Drain(t.sa).size(), 2u);

  // A held ACK, then a gap: the sequence NAK acknowledges everything before the PSN it names, the held ACK too.
  t.b->transport->ClearLog();
  t.a->transport->drop_if = testing::DropPsn(3);
  ASSERT_EQ(t.a->device->PostSend(t.qa, Rdma(3, SendOpcode::kRdmaWrite, {la.At(0, 8)}, lb.mr.iova, lb.mr.rkey)), 0);
  ASSERT_EQ(t.a->device->PostSend(t.qa, Rdma(4, SendOpcode::kRdmaWrite, {la.At(8, 8)}, lb.mr.iova + 8, lb.mr.rkey)),
            0);
  ASSERT_EQ(t.a->device->PostSend(t.qa, Rdma(5, SendOpcode::kRdmaWrite, {la.At(16, 8)}, lb.mr.iova + 16, lb.mr.rkey)),
            0);
  StepUntilReceived(t, *t.b, 4);  // PSN 2, not 3, then 4
  wb = Wire(*t.b);
  ASSERT_EQ(wb.size(), 1u);
  EXPECT_TRUE(IsNak(wb[0], wire::NakCode::kPsnSeqError));
  EXPECT_EQ(wb[0].psn, 3u);
  t.fabric.Pump();
  EXPECT_EQ(Drain(t.sa).size(), 3u);
}

TEST_F(RcHeldAck, DestroyingTheQpSendsItsHeldAck) {
  ASSERT_TRUE(Wire(*t.b).empty());
  // ibv_rc_pingpong destroys its QP right after the last message: that message's ACK must still leave.
  ASSERT_EQ(t.b->device->DestroyQp(t.qb), 0);
  auto wb = Wire(*t.b);
  ASSERT_EQ(wb.size(), 1u);
  EXPECT_TRUE(IsAck(wb[0]));
  t.fabric.Pump();
  auto sa = Drain(t.sa);
  ASSERT_EQ(sa.size(), 1u);
  EXPECT_EQ(sa[0].status, WcStatus::kSuccess);
}

TEST_F(RcHeldAck, MovingTheQpToErrorSendsItsHeldAckFirst) {
  // An HCA that acknowledges at once would have sent it before the application's modify: so does the held one.
  QpAttributes err;
  err.qp_state = QpState::kErr;
  ASSERT_EQ(t.b->device->ModifyQp(t.qb, err, attr::kState), 0);
  const auto wb = Wire(*t.b);
  ASSERT_EQ(wb.size(), 1u);
  EXPECT_TRUE(IsAck(wb[0]));
  t.fabric.Pump();
  EXPECT_EQ(Wire(*t.b).size(), 1u);  // and nothing from the QP in the error state afterwards
  auto sa = Drain(t.sa);
  ASSERT_EQ(sa.size(), 1u);
  EXPECT_EQ(sa[0].status, WcStatus::kSuccess);
}

// An event wakes an application that may answer at once: the ACK held for what it received leaves before the event
// is delivered, as an HCA's would have on arrival. (perftest's ib_send_lat -e takes the first event on its one
// channel as its send's completion: when the answer overtook the ACK, its peer saw them the other way round and hung.)
TEST(RcHeldAckEvents, AnEventIsDeliveredAfterTheAckOfWhatItReports) {
  Rc t;
  t.b->ack_timing = Device::AckTiming::kHeld;
  Buffer la = testing::Register(*t.a->device, t.pa, 64, kMrAll);
  Buffer lb = testing::Register(*t.b->device, t.pb, 64, kMrAll);
  size_t acks_out_at_event = 0;
  int events = 0;
  t.rb->set_notifier([&](CompletionQueue&) {
    ++events;
    for (const Pkt& p : Wire(*t.b)) acks_out_at_event += IsAck(p);
  });
  ASSERT_EQ(t.rb->RequestNotify(false), 0);
  ASSERT_EQ(t.b->device->PostRecv(t.qb, RecvWr{5, {lb.At(0, 64)}}), 0);
  ASSERT_EQ(t.a->device->PostSend(t.qa, Wr(1, SendOpcode::kSend, {la.At(0, 8)})), 0);
  StepUntilReceived(t, *t.b, 1);
  EXPECT_EQ(events, 1);
  EXPECT_EQ(acks_out_at_event, 1u);
  // Unarmed, the ACK is held as before (it leaves with b's next request or at its time).
  ASSERT_EQ(t.b->device->PostRecv(t.qb, RecvWr{6, {lb.At(0, 64)}}), 0);
  ASSERT_EQ(t.a->device->PostSend(t.qa, Wr(2, SendOpcode::kSend, {la.At(0, 8)})), 0);
  StepUntilReceived(t, *t.b, 2);
  size_t acks = 0;
  for (const Pkt& p : Wire(*t.b)) acks += IsAck(p);
  EXPECT_EQ(acks, 1u);
  t.fabric.Pump();
  EXPECT_EQ(Drain(t.sa).size(), 2u);
  EXPECT_EQ(Drain(t.rb).size(), 2u);
}

// --- duplicates --------------------------------------------------------------------------------------------------

TEST(RcDuplicate, LostReadResponseIsAnsweredAgainFromSavedState) {
  Rc t;
  Buffer la = testing::Register(*t.a->device, t.pa, 4096, kMrAll);
  Buffer lb = testing::Register(*t.b->device, t.pb, 4096, kMrAll);
  Fill(lb.bytes, 14);
  t.b->transport->drop_if = testing::DropPsn(0, rcop::kReadResponseOnly);
  const uint64_t t0 = t.now();
  ASSERT_EQ(t.a->device->PostSend(t.qa, Rdma(1, SendOpcode::kRdmaRead, {la.At(0, 700)}, lb.mr.iova, lb.mr.rkey)), 0);
  t.fabric.Pump();
  auto s = Drain(t.sa);
  ASSERT_EQ(s.size(), 1u);
  ExpectCompletion(s[0], 1, WcStatus::kSuccess, WcOpcode::kRdmaRead, 700, t.qa->qpn());
  EXPECT_EQ(0, std::memcmp(la.bytes.data(), lb.bytes.data(), 700));
  // Only silence could tell: the early retransmission after four assumed round trips (no RTT sample yet), not the
  // local ACK timeout (67 ms).
  EXPECT_EQ(t.now(), t0 + RcRequester::kProbeRoundTrips * RcRequester::kInitialRttNs);
  EXPECT_EQ(t.a->device->counters().rc_early_retransmits, 1u);
  EXPECT_EQ(t.a->device->counters().rc_retransmit_timeouts, 0u);
  EXPECT_EQ(t.b->device->counters().rc_duplicates, 1u);
  auto wa = Wire(*t.a);
  ASSERT_EQ(wa.size(), 2u);
  EXPECT_EQ(wa[1].opcode, rcop::kReadRequest);
  EXPECT_EQ(wa[1].psn, 0u);
  auto wb = Wire(*t.b);
  ASSERT_EQ(wb.size(), 2u);
  EXPECT_TRUE(wb[0].dropped);
  EXPECT_EQ(wb[1].opcode, rcop::kReadResponseOnly);
  EXPECT_EQ(wb[1].psn, 0u);
}

TEST(RcDuplicate, LostMiddleReadResponseIsAskedForFromWhereItWasLost) {
  Rc t;
  Buffer la = testing::Register(*t.a->device, t.pa, 8192, kMrAll);
  Buffer lb = testing::Register(*t.b->device, t.pb, 8192, kMrAll);
  Fill(lb.bytes, 15);
  t.b->transport->drop_if = testing::DropPsn(1);  // the second response
  const uint64_t t0 = t.now();
  ASSERT_EQ(t.a->device->PostSend(t.qa, Rdma(1, SendOpcode::kRdmaRead, {la.At(0, 5000)}, lb.mr.iova, lb.mr.rkey)),
            0);
  t.fabric.Pump();
  auto s = Drain(t.sa);
  ASSERT_EQ(s.size(), 1u);
  ExpectCompletion(s[0], 1, WcStatus::kSuccess, WcOpcode::kRdmaRead, 5000, t.qa->qpn());
  EXPECT_EQ(0, std::memcmp(la.bytes.data(), lb.bytes.data(), 5000));
  EXPECT_EQ(t.now(), t0);  // the gap in response PSNs told the requester at once
  auto wa = Wire(*t.a);
  ASSERT_GE(wa.size(), 2u);
  // The re-issued READ asks for the rest only, at the PSN of the first missing response (IBTA 9.7.4.1.4).
  EXPECT_EQ(wa[1].opcode, rcop::kReadRequest);
  EXPECT_EQ(wa[1].psn, 1u);
  ASSERT_TRUE(wa[1].reth.has_value());
  EXPECT_EQ(wa[1].reth->va, lb.mr.iova + 1024);
  EXPECT_EQ(wa[1].reth->dma_length, 5000u - 1024);
}

// A long READ is requested in segments of 64 response packets, the next once the previous has arrived; a lost
// response costs one request for the rest of its segment, however many responses behind it still arrive.
TEST(RcDuplicate, LostResponseOfALongReadCostsOneRequestNotOnePerLateResponse) {
  Rc t;  // path MTU 1024
  constexpr uint32_t kLen = 1 << 20;  // 1024 response packets
  Buffer la = testing::Register(*t.a->device, t.pa, kLen, kMrAll);
  Buffer lb = testing::Register(*t.b->device, t.pb, kLen, kMrAll);
  Fill(lb.bytes, 21);
  t.b->transport->drop_if = testing::DropPsn(100);  // in segment [64, 128)
  const uint64_t t0 = t.now();
  ASSERT_EQ(t.a->device->PostSend(t.qa, Rdma(1, SendOpcode::kRdmaRead, {la.At(0, kLen)}, lb.mr.iova, lb.mr.rkey)),
            0);
  t.fabric.Pump();
  auto s = Drain(t.sa);
  ASSERT_EQ(s.size(), 1u);
  ExpectCompletion(s[0], 1, WcStatus::kSuccess, WcOpcode::kRdmaRead, kLen, t.qa->qpn());
  EXPECT_EQ(la.bytes, lb.bytes);
  EXPECT_EQ(t.now(), t0);  // recovered from the gap, not by a timeout
  std::vector<Pkt> requests;
  for (const Pkt& p : Wire(*t.a))
    if (p.opcode == rcop::kReadRequest) requests.push_back(p);
  ASSERT_EQ(requests.size(), 16u + 1u);  // 16 segments and one request after the lost response
  for (const Pkt& r : requests) ASSERT_TRUE(r.reth.has_value());
  for (uint32_t k = 0; k < 2; ++k) {
    EXPECT_EQ(requests[k].psn, k * 64);
    EXPECT_EQ(requests[k].reth->va, lb.mr.iova + k * 64 * 1024);
    EXPECT_EQ(requests[k].reth->dma_length, 64u * 1024);
  }
  // The request after the loss: from the lost response to the end of its segment, before the third segment.
  EXPECT_EQ(requests[2].psn, 100u);
  EXPECT_EQ(requests[2].reth->va, lb.mr.iova + 100 * 1024);
  EXPECT_EQ(requests[2].reth->dma_length, 28u * 1024);
  EXPECT_EQ(requests[3].psn, 128u);
  EXPECT_EQ(Wire(*t.b).size(), 1024u + 28u);  // responses: every packet once, the 28 from the loss on twice
  EXPECT_LE(t.b->transport->largest_batch(), 64u);
}

// A peer may ask for a whole long message in one READ request: the responder hands it to the network in bursts, so
// no more than one burst of responses is ever built in memory.
TEST(RcDuplicate, ResponderAnswersOneLongReadRequestInBoundedBursts) {
  Rc t;  // path MTU 1024
  constexpr uint32_t kLen = 1 << 20;
  Buffer lb = testing::Register(*t.b->device, t.pb, kLen, kMrAll);
  wire::PacketSpec spec;
  spec.bth.opcode = rcop::kReadRequest;
  spec.bth.dest_qp = t.qb->qpn();
  spec.bth.psn = 0;  // what qb expects first
  spec.bth.ack_req = true;
  spec.reth = wire::Reth{lb.mr.iova, lb.mr.rkey, kLen};
  t.fabric.Inject(*t.a, *t.b, spec);
  t.fabric.Pump();
  const std::vector<Pkt> wb = Wire(*t.b);
  ASSERT_EQ(wb.size(), 1024u);
  EXPECT_EQ(wb.front().opcode, rcop::kReadResponseFirst);
  EXPECT_EQ(wb.back().opcode, rcop::kReadResponseLast);
  EXPECT_EQ(wb.back().psn, 1023u);
  EXPECT_LE(t.b->transport->largest_batch(), 64u);
}

// The target region of a multi-packet RDMA WRITE is deregistered (and its memory freed) between two of its packets:
// the rest is refused with a remote access error NAK, and nothing is written to the freed memory (ASan checks).
TEST(RcAccess, RegionDeregisteredInTheMiddleOfAWriteRefusesTheRest) {
  Rc t;  // path MTU 1024
  auto* memory = new std::vector<uint8_t>(4096, 0);
  MemoryRegion mr;
  ASSERT_EQ(t.b->device->RegisterMr(t.pb, memory->data(), memory->size(), reinterpret_cast<uint64_t>(memory->data()),
                                    kMrAll, &mr),
            0);
  const std::vector<uint8_t> payload(1024, 0x5a);
  wire::PacketSpec first;
  first.bth.opcode = rcop::kWriteFirst;
  first.bth.dest_qp = t.qb->qpn();
  first.bth.psn = 0;
  first.reth = wire::Reth{mr.iova, mr.rkey, 4096};
  t.fabric.Inject(*t.a, *t.b, first, payload);
  t.fabric.Pump();
  EXPECT_EQ((*memory)[1023], 0x5a);  // the first packet landed
  ASSERT_EQ(t.b->device->DeregisterMr(mr.lkey), 0);
  delete memory;
  wire::PacketSpec middle;
  middle.bth.opcode = rcop::kWriteMiddle;
  middle.bth.dest_qp = t.qb->qpn();
  middle.bth.psn = 1;
  t.fabric.Inject(*t.a, *t.b, middle, payload);
  t.fabric.Pump();
  const std::vector<Pkt> wb = Wire(*t.b);
  ASSERT_EQ(wb.size(), 1u);
  EXPECT_TRUE(IsNak(wb[0], wire::NakCode::kRemoteAccessError));
  EXPECT_EQ(wb[0].psn, 1u);
  EXPECT_EQ(t.b->device->counters().rx_remote_access_denied, 1u);
  EXPECT_EQ(t.qb->state(), QpState::kErr);
}

TEST(RcDuplicate, LostAtomicAckIsAnsweredWithTheSavedOriginalNotExecutedTwice) {
  Rc t;
  Buffer la = testing::Register(*t.a->device, t.pa, 64, kMrAll);
  Buffer lb = testing::Register(*t.b->device, t.pb, 64, kMrAll);
  SetWord(lb.bytes, 0, 100);
  t.b->transport->drop_if = testing::DropPsn(0, rcop::kAtomicAcknowledge);
  const uint64_t t0 = t.now();
  ASSERT_EQ(t.a->device->PostSend(
                t.qa, Atomic(1, SendOpcode::kAtomicFetchAndAdd, la.At(0, 8), lb.mr.iova, lb.mr.rkey, 5)),
            0);
  t.fabric.PumpUntil(t0 + RcRequester::kProbeRoundTrips * RcRequester::kInitialRttNs / 2);  // before the early retransmission
  EXPECT_EQ(Word(lb.bytes, 0), 105u);  // executed once
  EXPECT_TRUE(Drain(t.sa).empty());
  // The application on b changes the word before the retry: the duplicate must get the saved result, and must not
  // add again.
  SetWord(lb.bytes, 0, 1000);
  t.fabric.Pump();
  auto s = Drain(t.sa);
  ASSERT_EQ(s.size(), 1u);
  ExpectCompletion(s[0], 1, WcStatus::kSuccess, WcOpcode::kFetchAdd, 8, t.qa->qpn());
  EXPECT_EQ(Word(la.bytes, 0), 100u);
  EXPECT_EQ(Word(lb.bytes, 0), 1000u);
  EXPECT_EQ(t.b->device->counters().rc_duplicates, 1u);
  EXPECT_EQ(t.a->device->counters().rc_early_retransmits, 1u);
  EXPECT_EQ(t.a->device->counters().rc_retransmit_timeouts, 0u);
  auto wa = Wire(*t.a);
  ASSERT_EQ(wa.size(), 2u);
  EXPECT_EQ(wa[1].opcode, rcop::kFetchAdd);
  EXPECT_EQ(wa[1].psn, 0u);
  auto wb = Wire(*t.b);
  ASSERT_EQ(wb.size(), 2u);
  for (const Pkt& p : wb) {
    EXPECT_EQ(p.opcode, rcop::kAtomicAcknowledge);
    EXPECT_EQ(p.atomic_ack->original, 100u);
  }
}

TEST(RcDuplicate, LostCompareSwapAckReturnsTheSavedOriginal) {
  Rc t;
  Buffer la = testing::Register(*t.a->device, t.pa, 64, kMrAll);
  Buffer lb = testing::Register(*t.b->device, t.pb, 64, kMrAll);
  SetWord(lb.bytes, 8, 7);
  t.b->transport->drop_if = testing::DropPsn(0, rcop::kAtomicAcknowledge);
  ASSERT_EQ(t.a->device->PostSend(
                t.qa, Atomic(1, SendOpcode::kAtomicCmpAndSwp, la.At(0, 8), lb.mr.iova + 8, lb.mr.rkey, 7, 8)),
            0);
  t.fabric.Pump();
  // Re-executed, the swap would have failed (8 != 7) and returned 8.
  EXPECT_EQ(Word(la.bytes, 0), 7u);
  EXPECT_EQ(Word(lb.bytes, 8), 8u);
  auto s = Drain(t.sa);
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].status, WcStatus::kSuccess);
}

TEST(RcDuplicate, DuplicatedPacketsAreAcknowledgedAgainAndExecutedOnce) {
  Rc t;
  wire::FaultConfig dup;
  dup.duplicate = 1.0;
  t.fabric.network().SetDefaultFaults(dup);  // every datagram, both ways, arrives twice
  Buffer la = testing::Register(*t.a->device, t.pa, 16384, kMrAll);
  Buffer lb = testing::Register(*t.b->device, t.pb, 16384, kMrAll);
  Fill(la.bytes, 16);
  Fill(lb.bytes, 17);
  SetWord(lb.bytes, 16000, 1);
  const std::vector<uint8_t> b_before = lb.bytes;
  for (uint64_t i = 0; i < 3; ++i) ASSERT_EQ(t.b->device->PostRecv(t.qb, RecvWr{40 + i, {lb.At(i * 3000, 3000)}}), 0);
  ASSERT_EQ(t.a->device->PostSend(t.qa, Wr(1, SendOpcode::kSend, {la.At(0, 2500)})), 0);
  ASSERT_EQ(t.a->device->PostSend(t.qa, Rdma(2, SendOpcode::kRdmaWrite, {la.At(3000, 2100)}, lb.mr.iova + 10000,
                                             lb.mr.rkey)),
            0);
  SendWr wi = Rdma(3, SendOpcode::kRdmaWriteWithImm, {la.At(6000, 100)}, lb.mr.iova + 13000, lb.mr.rkey);
  wi.imm_data = 0x01010101;
  ASSERT_EQ(t.a->device->PostSend(t.qa, std::move(wi)), 0);
  ASSERT_EQ(t.a->device->PostSend(t.qa, Rdma(4, SendOpcode::kRdmaRead, {la.At(8000, 3000)}, lb.mr.iova + 3000,
                                             lb.mr.rkey)),
            0);
  ASSERT_EQ(t.a->device->PostSend(
                t.qa, Atomic(5, SendOpcode::kAtomicFetchAndAdd, la.At(12000, 8), lb.mr.iova + 16000, lb.mr.rkey, 10)),
            0);
  t.fabric.Pump();

  auto s = Drain(t.sa);
  ASSERT_EQ(s.size(), 5u);  // each exactly once, in order
  const WcOpcode ops[] = {WcOpcode::kSend, WcOpcode::kRdmaWrite, WcOpcode::kRdmaWrite, WcOpcode::kRdmaRead,
                          WcOpcode::kFetchAdd};
  const uint32_t lens[] = {2500, 2100, 100, 3000, 8};
  for (int i = 0; i < 5; ++i) ExpectCompletion(s[i], i + 1, WcStatus::kSuccess, ops[i], lens[i], t.qa->qpn());
  auto r = Drain(t.rb);
  ASSERT_EQ(r.size(), 2u);  // SEND and WRITE_WITH_IMM consumed one receive each, not two
  ExpectCompletion(r[0], 40, WcStatus::kSuccess, WcOpcode::kRecv, 2500, t.qb->qpn());
  ExpectCompletion(r[1], 41, WcStatus::kSuccess, WcOpcode::kRecvRdmaWithImm, 100, t.qb->qpn());
  EXPECT_EQ(t.qb->receive_queue().size(), 1u);
  EXPECT_EQ(Word(lb.bytes, 16000), 11u);  // added once
  EXPECT_EQ(Word(la.bytes, 12000), 1u);
  EXPECT_EQ(0, std::memcmp(lb.bytes.data(), la.bytes.data(), 2500));
  EXPECT_EQ(0, std::memcmp(lb.bytes.data() + 10000, la.bytes.data() + 3000, 2100));
  EXPECT_EQ(0, std::memcmp(lb.bytes.data() + 13000, la.bytes.data() + 6000, 100));
  EXPECT_EQ(0, std::memcmp(la.bytes.data() + 8000, b_before.data() + 3000, 3000));
  EXPECT_GE(t.b->device->counters().rc_duplicates, 5u);
  // Every request packet asking for an ACK got one per copy.
  auto wb = Wire(*t.b);
  EXPECT_GE(std::count_if(wb.begin(), wb.end(), IsAck), 6);
  EXPECT_TRUE(t.qa->requester().state().sq.empty());
}

// --- max_rd_atomic ---------------------------------------------------------------------------------------------------

bool IsReadOrAtomicRequest(uint8_t op) {
  return op == rcop::kReadRequest || op == rcop::kCompareSwap || op == rcop::kFetchAdd;
}
bool EndsReadOrAtomicResponse(uint8_t op) {
  return op == rcop::kReadResponseOnly || op == rcop::kReadResponseLast || op == rcop::kAtomicAcknowledge;
}

// Watches a's requests as they are sent: the most READ/atomic requests on the wire at once, counting the responses
// b has sent by then.
struct InFlightProbe {
  size_t requests = 0, max_in_flight = 0;
  void Attach(Rc& t) {
    Node* b = t.b;
    t.a->transport->drop_if = [this, b](uint64_t, std::span<const uint8_t> payload) {
      if (!payload.empty() && IsReadOrAtomicRequest(payload[0])) {
        ++requests;
        size_t responses = 0;
        for (const auto& s : b->transport->log())
          if (!s.bytes.empty() && EndsReadOrAtomicResponse(s.bytes[0])) ++responses;
        max_in_flight = std::max(max_in_flight, requests - responses);
      }
      return false;
    };
  }
};

TEST(RcRdAtomic, MaxRdAtomicOneAllowsOneReadOrAtomicInFlight) {
  Rc t;  // max_rd_atomic 1
  InFlightProbe probe;
  probe.Attach(t);
  Buffer la = testing::Register(*t.a->device, t.pa, 4096, kMrAll);
  Buffer lb = testing::Register(*t.b->device, t.pb, 4096, kMrAll);
  Fill(lb.bytes, 18);
  SetWord(lb.bytes, 4000, 0);
  ASSERT_EQ(t.b->device->PostRecv(t.qb, RecvWr{1, {lb.At(3000, 100)}}), 0);
  ASSERT_EQ(t.a->device->PostSend(t.qa, Rdma(1, SendOpcode::kRdmaRead, {la.At(0, 100)}, lb.mr.iova, lb.mr.rkey)), 0);
  ASSERT_EQ(t.a->device->PostSend(
                t.qa, Atomic(2, SendOpcode::kAtomicFetchAndAdd, la.At(1000, 8), lb.mr.iova + 4000, lb.mr.rkey, 1)),
            0);
  ASSERT_EQ(t.a->device->PostSend(t.qa, Rdma(3, SendOpcode::kRdmaRead, {la.At(200, 100)}, lb.mr.iova + 100,
                                             lb.mr.rkey)),
            0);
  ASSERT_EQ(t.a->device->PostSend(t.qa, Wr(4, SendOpcode::kSend, {la.At(0, 10)})), 0);
  // Only the first READ went out; the rest waits behind it, the SEND included (requests go out in order).
  EXPECT_EQ(Wire(*t.a).size(), 1u);
  t.fabric.Pump();
  EXPECT_EQ(probe.requests, 3u);
  EXPECT_EQ(probe.max_in_flight, 1u);
  auto s = Drain(t.sa);
  ASSERT_EQ(s.size(), 4u);
  for (uint64_t i = 0; i < 4; ++i) {
    EXPECT_EQ(s[i].wr_id, i + 1);
    EXPECT_EQ(s[i].status, WcStatus::kSuccess);
  }
  EXPECT_EQ(Opcodes(Wire(*t.a)),
            (std::vector<uint8_t>{rcop::kReadRequest, rcop::kFetchAdd, rcop::kReadRequest, rcop::kSendOnly}));
  EXPECT_EQ(0, std::memcmp(la.bytes.data() + 200, lb.bytes.data() + 100, 100));
}

TEST(RcRdAtomic, MaxRdAtomicFourAllowsFour) {
  RcAttributes ra = Attrs(), rb = Attrs();
  ra.max_rd_atomic = 4;
  rb.max_dest_rd_atomic = 4;
  Rc t(ra, rb);
  InFlightProbe probe;
  probe.Attach(t);
  Buffer la = testing::Register(*t.a->device, t.pa, 4096, kMrAll);
  Buffer lb = testing::Register(*t.b->device, t.pb, 4096, kMrAll);
  Fill(lb.bytes, 19);
  for (uint64_t i = 0; i < 6; ++i)
    ASSERT_EQ(t.a->device->PostSend(t.qa, Rdma(i, SendOpcode::kRdmaRead, {la.At(i * 100, 100)}, lb.mr.iova + i * 100,
                                               lb.mr.rkey)),
              0);
  EXPECT_EQ(Wire(*t.a).size(), 4u);
  t.fabric.Pump();
  EXPECT_EQ(probe.requests, 6u);
  EXPECT_EQ(probe.max_in_flight, 4u);
  EXPECT_EQ(Drain(t.sa).size(), 6u);
  EXPECT_EQ(0, std::memcmp(la.bytes.data(), lb.bytes.data(), 600));
}

// --- SQ drain --------------------------------------------------------------------------------------------------------

TEST(RcSqd, DrainsWhatIsInFlightRaisesSqDrainedAndStartsNothingUntilRts) {
  Rc t;
  Buffer la = testing::Register(*t.a->device, t.pa, 8192, kMrAll);
  Buffer lb = testing::Register(*t.b->device, t.pb, 8192, kMrAll);
  Fill(lb.bytes, 20);
  Fill(la.bytes, 21);
  ASSERT_EQ(t.b->device->PostRecv(t.qb, RecvWr{9, {lb.At(3000, 2500)}}), 0);
  for (uint64_t i = 0; i < 2; ++i) ASSERT_EQ(t.b->device->PostRecv(t.qb, RecvWr{i, {lb.At(6000 + i * 500, 500)}}), 0);
  // In flight: a 3-packet SEND and a READ. Waiting (max_rd_atomic 1): a second READ, and a SEND behind it.
  ASSERT_EQ(t.a->device->PostSend(t.qa, Wr(1, SendOpcode::kSend, {la.At(0, 2500)}, false)), 0);
  ASSERT_EQ(t.a->device->PostSend(t.qa, Rdma(2, SendOpcode::kRdmaRead, {la.At(4000, 100)}, lb.mr.iova, lb.mr.rkey)),
            0);
  ASSERT_EQ(t.a->device->PostSend(t.qa, Rdma(3, SendOpcode::kRdmaRead, {la.At(4200, 100)}, lb.mr.iova + 100,
                                             lb.mr.rkey)),
            0);
  ASSERT_EQ(t.a->device->PostSend(t.qa, Wr(4, SendOpcode::kSend, {la.At(0, 10)})), 0);
  ASSERT_EQ(Wire(*t.a).size(), 4u);  // SEND (3 packets) and READ

  QpAttributes attr;
  attr.qp_state = QpState::kSqd;
  attr.en_sqd_async_notify = true;
  ASSERT_EQ(t.a->device->ModifyQp(t.qa, attr, attr::kState | attr::kEnSqdAsyncNotify), 0);
  EXPECT_TRUE(t.a->events.empty());  // not drained yet: packets in flight
  ASSERT_EQ(t.a->device->PostSend(t.qa, Wr(5, SendOpcode::kSend, {la.At(0, 20)})), 0);  // posted in SQD
  EXPECT_EQ(Wire(*t.a).size(), 4u);
  t.fabric.Pump();

  auto s = Drain(t.sa);
  ASSERT_EQ(s.size(), 1u);  // the unsignaled SEND silently, then the READ
  ExpectCompletion(s[0], 2, WcStatus::kSuccess, WcOpcode::kRdmaRead, 100, t.qa->qpn());
  EXPECT_EQ(Wire(*t.a).size(), 4u);  // nothing new started in SQD
  std::vector<AsyncEvent> drained;
  for (const AsyncEvent& e : t.a->events)
    if (e.type == AsyncEventType::kSqDrained) drained.push_back(e);
  ASSERT_EQ(drained.size(), 1u);
  EXPECT_EQ(drained[0].qp, t.qa);
  EXPECT_EQ(t.qa->state(), QpState::kSqd);

  attr.qp_state = QpState::kRts;
  ASSERT_EQ(t.a->device->ModifyQp(t.qa, attr, attr::kState), 0);
  t.fabric.Pump();
  s = Drain(t.sa);
  ASSERT_EQ(s.size(), 3u);
  ExpectCompletion(s[0], 3, WcStatus::kSuccess, WcOpcode::kRdmaRead, 100, t.qa->qpn());
  ExpectCompletion(s[1], 4, WcStatus::kSuccess, WcOpcode::kSend, 10, t.qa->qpn());
  ExpectCompletion(s[2], 5, WcStatus::kSuccess, WcOpcode::kSend, 20, t.qa->qpn());
  EXPECT_EQ(0, std::memcmp(la.bytes.data() + 4000, lb.bytes.data(), 100));
  EXPECT_EQ(0, std::memcmp(la.bytes.data() + 4200, lb.bytes.data() + 100, 100));
  EXPECT_EQ(Drain(t.rb).size(), 3u);
  EXPECT_EQ(std::count_if(t.a->events.begin(), t.a->events.end(),
                          [](const AsyncEvent& e) { return e.type == AsyncEventType::kSqDrained; }),
            1);
}

}  // namespace
}  // namespace uroce::emu
