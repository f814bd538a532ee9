// UD and UC data paths end to end on the simulated network: bytes delivered, completions and their status, and the
// drops the spec prescribes.
#include <gtest/gtest.h>

#include <cstring>
#include <numeric>

#include "emu/test_fabric.h"
#include "wire/bytes.h"
#include "wire/frame.h"
#include "wire/icrc.h"
#include "wire/packet.h"

namespace uroce::emu {
namespace {

using testing::Buffer;
using testing::Drain;
using testing::Fabric;
using testing::Node;

constexpr uint32_t kQkey = 0x11111111;
constexpr uint32_t kLocalAll = access::kLocalWrite | access::kRemoteWrite | access::kRemoteRead;

void Fill(Buffer& b, uint8_t seed) {
  for (size_t i = 0; i < b.bytes.size(); ++i) b.bytes[i] = static_cast<uint8_t>(seed + i * 7);
}

struct UdPair {
  Fabric fabric;
  Node* a;
  Node* b;
  ProtectionDomain *pa, *pb;
  CompletionQueue *ca, *cb;
  QueuePair *qa, *qb;
  AddressHandle* ah_b;

  UdPair() {
    a = &fabric.AddNode();
    b = &fabric.AddNode();
    pa = a->device->AllocPd();
    pb = b->device->AllocPd();
    EXPECT_EQ(a->device->CreateCq(64, &ca), 0);
    EXPECT_EQ(b->device->CreateCq(64, &cb), 0);
    qa = testing::CreateUdQp(*a->device, pa, ca, kQkey);
    qb = testing::CreateUdQp(*b->device, pb, cb, kQkey);
    AddressVector av;
    av.dgid = b->device->config().address.bytes();
    EXPECT_EQ(a->device->CreateAh(pa, av, &ah_b), 0);
  }

  SendWr Send(const Buffer& buf, uint32_t len, uint32_t qkey = kQkey) {
    SendWr wr;
    wr.wr_id = 7;
    wr.opcode = SendOpcode::kSend;
    wr.flags = send_flags::kSignaled;
    wr.sg_list = {buf.At(0, len)};
    wr.ah = ah_b;
    wr.remote_qpn = qb->qpn();
    wr.remote_qkey = qkey;
    return wr;
  }
};

TEST(Ud, DeliversPayloadAfterGrhWithSourceQpAndImmediate) {
  UdPair t;
  Buffer src = testing::Register(*t.a->device, t.pa, 1000, kLocalAll);
  Buffer dst = testing::Register(*t.b->device, t.pb, 40 + 1000, kLocalAll);
  Fill(src, 3);
  ASSERT_EQ(t.b->device->PostRecv(t.qb, RecvWr{99, {dst.At(0, 1040)}}), 0);
  SendWr wr = t.Send(src, 1000);
  wr.opcode = SendOpcode::kSendWithImm;
  wr.imm_data = 0x0d0c0b0a;
  wr.flags |= send_flags::kSolicited;
  ASSERT_EQ(t.a->device->PostSend(t.qa, std::move(wr)), 0);
  t.fabric.Pump();

  auto sent = Drain(t.ca);
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(sent[0].status, WcStatus::kSuccess);
  EXPECT_EQ(sent[0].opcode, WcOpcode::kSend);
  auto got = Drain(t.cb);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].status, WcStatus::kSuccess);
  EXPECT_EQ(got[0].wr_id, 99u);
  EXPECT_EQ(got[0].opcode, WcOpcode::kRecv);
  EXPECT_EQ(got[0].byte_len, 1040u);
  EXPECT_EQ(got[0].src_qp, t.qa->qpn());
  EXPECT_EQ(got[0].qp_num, t.qb->qpn());
  EXPECT_EQ(got[0].imm_data, 0x0d0c0b0au);
  EXPECT_TRUE(got[0].solicited);
  EXPECT_EQ(got[0].wc_flags, wc_flags::kGrh | wc_flags::kWithImm);
  EXPECT_EQ(0, std::memcmp(dst.bytes.data() + 40, src.bytes.data(), 1000));
  // IPv4 header in the last 20 bytes of the GRH slot: version 4, source = sender's address; wc.sl says IPv4 (2), as
  // mlx5 and hns report a RoCEv2 UD receive's L3 header type (UCX's ud_verbs reads it to find the source GID).
  EXPECT_EQ(got[0].sl, 2);
  EXPECT_EQ(dst.bytes[20] >> 4, 4);
  EXPECT_EQ(wire::LoadBe32(dst.bytes.data() + 20 + 12), t.a->device->config().address.v4());
}

TEST(Ud, CountersNameEveryDropAndFormatAsNameValueLines) {
  UdPair t;
  Buffer src = testing::Register(*t.a->device, t.pa, 64, kLocalAll);
  ASSERT_EQ(t.a->device->PostSend(t.qa, t.Send(src, 64)), 0);  // nothing posted at B: dropped, counted
  t.fabric.Pump();
  const std::string a = FormatCounters(t.a->device->counters());
  const std::string b = FormatCounters(t.b->device->counters());
  EXPECT_NE(a.find("tx_packets 1\n"), std::string::npos) << a;
  EXPECT_NE(b.find("rx_packets 1\n"), std::string::npos) << b;
  EXPECT_NE(b.find("rx_no_receive_wqe 1\n"), std::string::npos) << b;
}

// A receiver whose queue is filling (the datagram marked congestion_experienced by its transport) answers the sender
// QP with a CNP (RoCEv2 A17.9), at most one per DeviceCore::kCnpIntervalNs for each peer.
TEST(Ud, ACongestedReceiverSendsOneCnpPerIntervalToTheSender) {
  UdPair t;
  Buffer src = testing::Register(*t.a->device, t.pa, 64, kLocalAll);
  Buffer dst = testing::Register(*t.b->device, t.pb, 4 * 104, kLocalAll);
  for (int i = 0; i < 3; ++i) ASSERT_EQ(t.b->device->PostRecv(t.qb, RecvWr{uint64_t(i), {dst.At(i * 104, 104)}}), 0);
  t.a->transport->record = true;
  ASSERT_EQ(t.a->device->PostSend(t.qa, t.Send(src, 64)), 0);
  ASSERT_EQ(t.a->transport->log().size(), 1u);
  const auto& sent = t.a->transport->log()[0];
  wire::InDatagram d;
  d.src = {t.a->device->config().address, wire::RoceSourcePort(t.qa->qpn(), t.qb->qpn())};  // as the ICRC covers it
  d.dst = {t.b->device->config().address, wire::kRoceV2UdpPort};
  d.payload = sent.bytes;
  d.ip_id = 0;
  d.congestion_experienced = true;
  t.b->transport->record = true;
  t.b->device->OnDatagram(d);
  t.b->device->OnDatagram(d);  // within the interval: no second CNP
  t.fabric.clock().Advance(DeviceCore::kCnpIntervalNs);
  d.congestion_experienced = false;
  t.b->device->OnDatagram(d);  // not marked: no CNP
  std::vector<wire::PacketView> cnps;
  for (const auto& s : t.b->transport->log())
    if (auto p = s.Parse(); p && p->bth.opcode == wire::opcode::kCnp) cnps.push_back(*p);
  ASSERT_EQ(cnps.size(), 1u);
  EXPECT_EQ(cnps[0].bth.dest_qp, t.qa->qpn());
  EXPECT_TRUE(cnps[0].bth.becn);
  EXPECT_EQ(cnps[0].payload.size(), 16u);
  EXPECT_EQ(t.b->device->counters().tx_cnp, 1u);
  EXPECT_EQ(Drain(t.cb).size(), 3u) << "the datagrams themselves are delivered";
}

// A CNP for a UD QP paces its sends towards that peer: what may not leave yet waits in the QP, uncompleted, and
// leaves (and completes) in order from the timer pass once the pace allows; a full send queue refuses more (ENOMEM).
TEST(Ud, ACnpPacesTheSenderSendsWaitAndLeaveInOrder) {
  UdPair t;
  Buffer src = testing::Register(*t.a->device, t.pa, 1000, kLocalAll);
  Buffer dst = testing::Register(*t.b->device, t.pb, 8 * 1040, kLocalAll);
  for (int i = 0; i < 8; ++i)
    ASSERT_EQ(t.b->device->PostRecv(t.qb, RecvWr{uint64_t(i), {dst.At(i * 1040, 1040)}}), 0);
  wire::PacketSpec cnp;
  cnp.bth.opcode = wire::opcode::kCnp;
  cnp.bth.becn = true;
  cnp.bth.dest_qp = t.qa->qpn();
  const uint8_t reserved[16] = {};
  t.fabric.Inject(*t.b, *t.a, cnp, reserved);
  t.fabric.Pump();
  EXPECT_EQ(t.a->device->counters().rx_cnp, 1u);
  for (uint64_t i = 0; i < 3; ++i) {
    SendWr wr = t.Send(src, 1000);
    wr.wr_id = 100 + i;
    ASSERT_EQ(t.a->device->PostSend(t.qa, std::move(wr)), 0);
  }
  // The first leaves at once (1000 bytes at 1 byte/ns: the next in 1 us); the others wait, not completed.
  auto c = Drain(t.ca);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].wr_id, 100u);
  EXPECT_EQ(t.a->device->counters().unreliable_sends_held, 2u);
  t.fabric.Pump();  // runs the timers as the clock moves: the held sends leave
  c = Drain(t.ca);
  ASSERT_EQ(c.size(), 2u);
  EXPECT_EQ(c[0].wr_id, 101u);
  EXPECT_EQ(c[1].wr_id, 102u);
  EXPECT_EQ(Drain(t.cb).size(), 3u);
  // While sends wait, the send queue's depth bounds them.
  const uint32_t depth = t.qa->attributes().cap.max_send_wr;
  int refused = 0;
  for (uint32_t i = 0; i <= depth + 1; ++i) refused += t.a->device->PostSend(t.qa, t.Send(src, 1000)) == ENOMEM;
  EXPECT_GT(refused, 0);
  // Moved to the error state, what still waits completes flushed.
  QpAttributes err;
  err.qp_state = QpState::kErr;
  ASSERT_EQ(t.a->device->ModifyQp(t.qa, err, attr::kState), 0);
  c = Drain(t.ca);
  ASSERT_FALSE(c.empty());
  EXPECT_EQ(c.back().status, WcStatus::kWrFlushErr);
}

TEST(Ud, WrongQkeyAndMissingReceiveAreDroppedSilently) {
  UdPair t;
  Buffer src = testing::Register(*t.a->device, t.pa, 64, kLocalAll);
  Buffer dst = testing::Register(*t.b->device, t.pb, 200, kLocalAll);
  ASSERT_EQ(t.a->device->PostSend(t.qa, t.Send(src, 64)), 0);  // no receive posted yet
  t.fabric.Pump();
  EXPECT_EQ(t.b->device->counters().rx_no_receive_wqe, 1u);
  ASSERT_EQ(t.b->device->PostRecv(t.qb, RecvWr{1, {dst.At(0, 200)}}), 0);
  ASSERT_EQ(t.a->device->PostSend(t.qa, t.Send(src, 64, kQkey + 1)), 0);
  t.fabric.Pump();
  EXPECT_EQ(t.b->device->counters().rx_bad_qkey, 1u);
  EXPECT_TRUE(Drain(t.cb).empty());
  // A Q_Key with the high bit set means "the sending QP's own Q_Key" (IBTA 10.2.4), which matches.
  ASSERT_EQ(t.a->device->PostSend(t.qa, t.Send(src, 64, 0x80000000)), 0);
  t.fabric.Pump();
  EXPECT_EQ(Drain(t.cb).size(), 1u);
}

TEST(Ud, MessageLongerThanMtuFailsWithLocalLengthErrorAndSqe) {
  UdPair t;
  Buffer src = testing::Register(*t.a->device, t.pa, 8192, kLocalAll);
  ASSERT_EQ(t.a->device->PostSend(t.qa, t.Send(src, 4097)), 0);
  auto c = Drain(t.ca);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].status, WcStatus::kLocLenErr);
  EXPECT_EQ(t.qa->state(), QpState::kSqe);
  // Later sends are flushed.
  ASSERT_EQ(t.a->device->PostSend(t.qa, t.Send(src, 10)), 0);
  c = Drain(t.ca);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].status, WcStatus::kWrFlushErr);
}

TEST(Ud, BadLkeyIsLocalProtectionError) {
  UdPair t;
  Buffer src = testing::Register(*t.a->device, t.pa, 64, kLocalAll);
  SendWr wr = t.Send(src, 64);
  wr.sg_list[0].lkey ^= 0xff00;
  ASSERT_EQ(t.a->device->PostSend(t.qa, std::move(wr)), 0);
  auto c = Drain(t.ca);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].status, WcStatus::kLocProtErr);
}

TEST(Ud, ReceiveTooSmallCompletesWithLocalLengthError) {
  UdPair t;
  Buffer src = testing::Register(*t.a->device, t.pa, 512, kLocalAll);
  Buffer dst = testing::Register(*t.b->device, t.pb, 100, kLocalAll);
  ASSERT_EQ(t.b->device->PostRecv(t.qb, RecvWr{5, {dst.At(0, 100)}}), 0);
  ASSERT_EQ(t.a->device->PostSend(t.qa, t.Send(src, 512)), 0);
  t.fabric.Pump();
  auto c = Drain(t.cb);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].status, WcStatus::kLocLenErr);
}

struct UcPair {
  Fabric fabric;
  Node *a, *b;
  ProtectionDomain *pa, *pb;
  CompletionQueue *ca, *cb;
  QueuePair *qa, *qb;

  explicit UcPair(Mtu mtu = Mtu::k1024) : UcPair(mtu, mtu) {}
  UcPair(Mtu mtu_a, Mtu mtu_b) {
    a = &fabric.AddNode(mtu_a);
    b = &fabric.AddNode(mtu_b);
    pa = a->device->AllocPd();
    pb = b->device->AllocPd();
    EXPECT_EQ(a->device->CreateCq(256, &ca), 0);
    EXPECT_EQ(b->device->CreateCq(256, &cb), 0);
    qa = testing::CreateConnectedQp(*a->device, QpType::kUc, pa, ca, nullptr, 0);
    qb = testing::CreateConnectedQp(*b->device, QpType::kUc, pb, cb, nullptr, 0);
    testing::Connect(*a->device, qa, *b->device, qb->qpn(), access::kRemoteWrite);
    testing::Connect(*b->device, qb, *a->device, qa->qpn(), access::kRemoteWrite);
  }
};

TEST(Uc, SendSegmentsByPathMtuAndReassembles) {
  UcPair t(Mtu::k1024);
  Buffer src = testing::Register(*t.a->device, t.pa, 65536, kLocalAll);
  Buffer dst = testing::Register(*t.b->device, t.pb, 65536, kLocalAll);
  Fill(src, 11);
  // Two SGEs on the receive side, to check scatter across them.
  ASSERT_EQ(t.b->device->PostRecv(t.qb, RecvWr{1, {dst.At(0, 30000), dst.At(30000, 35536)}}), 0);
  SendWr wr;
  wr.wr_id = 2;
  wr.opcode = SendOpcode::kSend;
  wr.flags = send_flags::kSignaled;
  wr.sg_list = {src.At(0, 65536)};
  ASSERT_EQ(t.a->device->PostSend(t.qa, std::move(wr)), 0);
  EXPECT_EQ(t.a->transport->sent(), 64u);  // 65536 / 1024
  t.fabric.Pump();
  auto c = Drain(t.cb);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].status, WcStatus::kSuccess);
  EXPECT_EQ(c[0].byte_len, 65536u);
  EXPECT_EQ(src.bytes, dst.bytes);
}

// A sender whose path MTU is not the receiver's cuts messages into packets of another size: the receiver drops
// such a message (UC cannot NAK) and counts it, and the receive WQE waits for the next message that fits.
TEST(Uc, AMessageCutAtAnotherPathMtuIsDroppedAndItsReceiveReused) {
  UcPair t(Mtu::k4096, Mtu::k1024);
  Buffer src = testing::Register(*t.a->device, t.pa, 8192, kLocalAll);
  Buffer dst = testing::Register(*t.b->device, t.pb, 8192, kLocalAll);
  Fill(src, 5);
  ASSERT_EQ(t.b->device->PostRecv(t.qb, RecvWr{1, {dst.At(0, 8192)}}), 0);
  for (uint32_t len : {3000u, 512u}) {  // one 3000-byte packet (too big at 1024), then one that fits
    SendWr wr;
    wr.wr_id = len;
    wr.opcode = SendOpcode::kSend;
    wr.flags = send_flags::kSignaled;
    wr.sg_list = {src.At(0, len)};
    ASSERT_EQ(t.a->device->PostSend(t.qa, std::move(wr)), 0);
  }
  t.fabric.Pump();
  auto c = Drain(t.cb);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].status, WcStatus::kSuccess);
  EXPECT_EQ(c[0].byte_len, 512u);
  EXPECT_EQ(t.b->device->counters().rx_length_errors, 1u);
}

// A real peer (kernel rxe, a NIC) sends IPv4 datagrams with changing IDs, which a UDP socket does not report
// (InDatagram::ip_id empty): the ICRC is checked with the ID solved for. Packets from an address other than the
// connected QP's peer are dropped.
TEST(Uc, PacketFromUnseenIpIdIsVerifiedAndOneFromAnotherAddressIsDropped) {
  UcPair t(Mtu::k4096);
  Buffer src = testing::Register(*t.a->device, t.pa, 100, kLocalAll);
  Buffer dst = testing::Register(*t.b->device, t.pb, 100, kLocalAll);
  Fill(src, 5);
  t.a->transport->record = true;
  t.a->transport->drop_if = [](uint64_t, std::span<const uint8_t>) { return true; };  // keep it off the network
  SendWr wr;
  wr.opcode = SendOpcode::kSend;
  wr.sg_list = {src.At(0, 100)};
  ASSERT_EQ(t.a->device->PostSend(t.qa, std::move(wr)), 0);
  ASSERT_EQ(t.a->transport->log().size(), 1u);
  std::vector<uint8_t> packet = t.a->transport->log()[0].bytes;
  const wire::UdpEndpoint from{t.a->device->config().address, wire::kRoceSourcePortMin};
  const wire::UdpEndpoint to{t.b->device->config().address, wire::kRoceV2UdpPort};
  wire::SealIcrc(wire::Flow{from, to, 0x5a17}, packet);  // as a peer whose kernel chose IPv4 ID 0x5a17

  auto deliver = [&](const std::vector<uint8_t>& bytes, const wire::UdpEndpoint& source) {
    t.b->device->OnDatagram(wire::InDatagram{source, to, bytes, std::nullopt});
  };
  std::vector<uint8_t> corrupt = packet;
  corrupt[20] ^= 0x01;  // a payload bit
  deliver(corrupt, from);
  EXPECT_EQ(t.b->device->counters().rx_icrc_errors, 1u);

  const wire::UdpEndpoint stranger{wire::IpAddress::V4(0x0a0000fe), wire::kRoceSourcePortMin};
  std::vector<uint8_t> forged = packet;
  wire::SealIcrc(wire::Flow{stranger, to, 0}, forged);
  deliver(forged, stranger);
  EXPECT_EQ(t.b->device->counters().rx_wrong_peer, 1u);

  ASSERT_EQ(t.b->device->PostRecv(t.qb, RecvWr{7, {dst.At(0, 100)}}), 0);
  deliver(packet, from);
  auto c = Drain(t.cb);
  ASSERT_EQ(c.size(), 1u);  // only the genuine packet: the corrupt and the forged ones consumed nothing
  EXPECT_EQ(c[0].status, WcStatus::kSuccess);
  EXPECT_EQ(c[0].wr_id, 7u);
  EXPECT_EQ(src.bytes, dst.bytes);
  EXPECT_EQ(t.b->device->counters().rx_icrc_ip_id_inferred, 1u);
  EXPECT_EQ(t.b->device->counters().rx_icrc_errors, 1u);
}

TEST(Uc, RdmaWriteWithImmediateConsumesReceiveAndWritesTarget) {
  UcPair t(Mtu::k4096);
  Buffer src = testing::Register(*t.a->device, t.pa, 10000, kLocalAll);
  Buffer dst = testing::Register(*t.b->device, t.pb, 10000, kLocalAll);
  Fill(src, 5);
  ASSERT_EQ(t.b->device->PostRecv(t.qb, RecvWr{42, {}}), 0);
  SendWr wr;
  wr.opcode = SendOpcode::kRdmaWriteWithImm;
  wr.flags = send_flags::kSignaled;
  wr.sg_list = {src.At(0, 10000)};
  wr.remote_addr = dst.mr.iova;
  wr.rkey = dst.mr.rkey;
  wr.imm_data = 0x78563412;
  ASSERT_EQ(t.a->device->PostSend(t.qa, std::move(wr)), 0);
  t.fabric.Pump();
  auto c = Drain(t.cb);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].wr_id, 42u);
  EXPECT_EQ(c[0].opcode, WcOpcode::kRecvRdmaWithImm);
  EXPECT_EQ(c[0].byte_len, 10000u);
  EXPECT_EQ(c[0].imm_data, 0x78563412u);
  EXPECT_EQ(src.bytes, dst.bytes);
}

TEST(Uc, LostMiddlePacketDropsThatMessageOnlyAndReusesTheReceive) {
  UcPair t(Mtu::k1024);
  Buffer src = testing::Register(*t.a->device, t.pa, 8192, kLocalAll);
  Buffer dst = testing::Register(*t.b->device, t.pb, 8192, kLocalAll);
  Fill(src, 1);
  t.a->transport->drop_if = testing::DropPsn(2);  // 3rd packet of message 1
  ASSERT_EQ(t.b->device->PostRecv(t.qb, RecvWr{1, {dst.At(0, 8192)}}), 0);
  for (int m = 0; m < 2; ++m) {
    SendWr wr;
    wr.wr_id = 10 + m;
    wr.opcode = SendOpcode::kSend;
    wr.sg_list = {src.At(m * 4096, 4096)};
    ASSERT_EQ(t.a->device->PostSend(t.qa, std::move(wr)), 0);
  }
  t.fabric.Pump();
  auto c = Drain(t.cb);
  ASSERT_EQ(c.size(), 1u);  // only message 2, into the receive WQE message 1 had started to fill
  EXPECT_EQ(c[0].wr_id, 1u);
  EXPECT_EQ(c[0].status, WcStatus::kSuccess);
  EXPECT_EQ(0, std::memcmp(dst.bytes.data(), src.bytes.data() + 4096, 4096));
  EXPECT_GE(t.b->device->counters().rx_out_of_sequence, 1u);
}

TEST(Uc, WriteWithoutRemoteWriteRightIsDroppedNotApplied) {
  UcPair t(Mtu::k1024);
  Buffer src = testing::Register(*t.a->device, t.pa, 100, kLocalAll);
  Buffer dst = testing::Register(*t.b->device, t.pb, 100, access::kLocalWrite);  // no remote write
  Fill(src, 9);
  SendWr wr;
  wr.opcode = SendOpcode::kRdmaWrite;
  wr.sg_list = {src.At(0, 100)};
  wr.remote_addr = dst.mr.iova;
  wr.rkey = dst.mr.rkey;
  ASSERT_EQ(t.a->device->PostSend(t.qa, std::move(wr)), 0);
  t.fabric.Pump();
  EXPECT_EQ(dst.bytes, std::vector<uint8_t>(100, 0));
  EXPECT_EQ(t.b->device->counters().rx_remote_access_denied, 1u);
}

TEST(Uc, ReadAndAtomicsAreRejectedAtPost) {
  UcPair t;
  Buffer src = testing::Register(*t.a->device, t.pa, 64, kLocalAll);
  SendWr wr;
  wr.opcode = SendOpcode::kRdmaRead;
  wr.sg_list = {src.At(0, 8)};
  EXPECT_EQ(t.a->device->PostSend(t.qa, SendWr(wr)), EINVAL);
  wr.opcode = SendOpcode::kAtomicFetchAndAdd;
  EXPECT_EQ(t.a->device->PostSend(t.qa, SendWr(wr)), EINVAL);
}

TEST(Qp, ErrorStateFlushesReceivesAndPostsCompleteFlushed) {
  UcPair t;
  Buffer dst = testing::Register(*t.b->device, t.pb, 64, kLocalAll);
  for (uint64_t i = 0; i < 3; ++i) ASSERT_EQ(t.b->device->PostRecv(t.qb, RecvWr{i, {dst.At(0, 64)}}), 0);
  QpAttributes a;
  a.qp_state = QpState::kErr;
  ASSERT_EQ(t.b->device->ModifyQp(t.qb, a, attr::kState), 0);
  auto c = Drain(t.cb);
  ASSERT_EQ(c.size(), 3u);
  for (uint64_t i = 0; i < 3; ++i) {
    EXPECT_EQ(c[i].wr_id, i);
    EXPECT_EQ(c[i].status, WcStatus::kWrFlushErr);
  }
  ASSERT_EQ(t.b->device->PostRecv(t.qb, RecvWr{9, {dst.At(0, 64)}}), 0);
  c = Drain(t.cb);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].status, WcStatus::kWrFlushErr);
}

// b's CQ holds three flushed receives: two of qb's (wr_id 1 and 3) around one of `other`'s (wr_id 2), a second QP of
// b on the same CQ.
class QpCompletionsInASharedCq : public ::testing::Test {
 protected:
  void SetUp() override {
    other = testing::CreateConnectedQp(*t.b->device, QpType::kUc, t.pb, t.cb, nullptr, 0);
    testing::Connect(*t.b->device, other, *t.a->device, t.qa->qpn(), kLocalAll);
    ASSERT_EQ(t.b->device->PostRecv(t.qb, RecvWr{1, {dst.At(0, 64)}}), 0);
    ASSERT_EQ(t.b->device->PostRecv(other, RecvWr{2, {dst.At(0, 64)}}), 0);
    ASSERT_EQ(t.b->device->PostRecv(t.qb, RecvWr{3, {dst.At(0, 64)}}), 0);
    QpAttributes a;
    a.qp_state = QpState::kErr;
    ASSERT_EQ(t.b->device->ModifyQp(other, a, attr::kState), 0);
    ASSERT_EQ(t.b->device->ModifyQp(t.qb, a, attr::kState), 0);
    ASSERT_EQ(t.cb->depth(), 3u);
  }
  // What is left in the CQ is other's completion alone.
  void ExpectOnlyOthers() {
    auto c = Drain(t.cb);
    ASSERT_EQ(c.size(), 1u);
    EXPECT_EQ(c[0].wr_id, 2u);
    EXPECT_EQ(c[0].qp_num, other->qpn());
  }
  UcPair t;
  Buffer dst = testing::Register(*t.b->device, t.pb, 64, kLocalAll);
  QueuePair* other = nullptr;
};

// A QP moved to RESET takes the completions it left in its CQ with it (as mlx4/mlx5 do): after RESET → RTS the first
// completion an application polls is of the QP's new work, not a flush of the old (pyverbs test_mr's rereg tests).
TEST_F(QpCompletionsInASharedCq, ResetRemovesTheQpsCompletionsAndKeepsOthers) {
  QpAttributes a;
  a.qp_state = QpState::kReset;
  ASSERT_EQ(t.b->device->ModifyQp(t.qb, a, attr::kState), 0);
  ExpectOnlyOthers();
}

// So does a destroyed QP (as mlx4/mlx5's destroy_qp cleans its CQs): the application may have freed what the wr_ids
// point to, while it goes on polling a CQ it shares with other QPs.
TEST_F(QpCompletionsInASharedCq, DestroyRemovesTheQpsCompletionsAndKeepsOthers) {
  ASSERT_EQ(t.b->device->DestroyQp(t.qb), 0);
  ExpectOnlyOthers();
}

TEST(Qp, PostSendBeforeRtsIsEinval) {
  Fabric f;
  Node& n = f.AddNode();
  ProtectionDomain* pd = n.device->AllocPd();
  CompletionQueue* cq;
  ASSERT_EQ(n.device->CreateCq(8, &cq), 0);
  QueuePair* qp = testing::CreateConnectedQp(*n.device, QpType::kUc, pd, cq, nullptr, 0);
  SendWr wr;
  EXPECT_EQ(n.device->PostSend(qp, std::move(wr)), EINVAL);
  RecvWr rwr;
  EXPECT_EQ(n.device->PostRecv(qp, std::move(rwr)), EINVAL);  // RESET
}

// --- UD multicast (IBTA 10.5.2.3; ibv_attach_mcast(3)) ------------------------------------------------------------

// A UD SEND to the multicast QPN of `group`, as it arrives from `src`:50000 (ICRC sealed for that flow, IPv4 ID 0).
std::vector<uint8_t> MulticastSend(const wire::IpAddress& src, const wire::IpAddress& group, uint32_t qkey,
                                   std::span<const uint8_t> payload) {
  wire::PacketSpec spec;
  spec.bth.opcode = 0x64;  // UD SEND_ONLY
  spec.bth.pkey = 0xFFFF;
  spec.bth.dest_qp = wire::kMulticastQpn;
  spec.deth = wire::Deth{qkey, 0, 0x42};
  std::vector<uint8_t> bytes(wire::EncodedLength(spec, payload.size()));
  EXPECT_TRUE(wire::EncodePacket(spec, payload, bytes).has_value());
  wire::SealIcrc(wire::Flow{{src, 50000}, {group, wire::kRoceV2UdpPort}, 0}, bytes);  // the ICRC covers ports
  return bytes;
}

TEST(UdMulticast, AttachedQpsEachGetACopyAndDetachedOnesNone) {
  UdPair t;
  Device& dev = *t.b->device;
  const wire::IpAddress group = *wire::IpAddress::Parse("239.4.5.6");
  QueuePair* second = testing::CreateUdQp(dev, t.pb, t.cb, kQkey);
  QueuePair* detached = testing::CreateUdQp(dev, t.pb, t.cb, kQkey);
  ASSERT_EQ(dev.AttachMulticast(t.qb, group), 0);
  ASSERT_EQ(dev.AttachMulticast(t.qb, group), 0);  // twice is once
  ASSERT_EQ(dev.AttachMulticast(second, group), 0);
  ASSERT_EQ(dev.AttachMulticast(detached, group), 0);
  ASSERT_EQ(dev.DetachMulticast(detached, group), 0);
  Buffer dst = testing::Register(dev, t.pb, 3 * (40 + 64), kLocalAll);
  ASSERT_EQ(dev.PostRecv(t.qb, RecvWr{1, {dst.At(0, 104)}}), 0);
  ASSERT_EQ(dev.PostRecv(second, RecvWr{2, {dst.At(104, 104)}}), 0);
  ASSERT_EQ(dev.PostRecv(detached, RecvWr{3, {dst.At(208, 104)}}), 0);
  std::vector<uint8_t> payload(64, 0x5a);
  const wire::IpAddress src = t.a->device->config().address;
  const std::vector<uint8_t> packet = MulticastSend(src, group, kQkey, payload);
  dev.OnDatagram(wire::InDatagram{{src, 50000}, {group, wire::kRoceV2UdpPort}, packet, 0});
  auto got = Drain(t.cb);
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].wr_id + got[1].wr_id, 3u);  // wr 1 and wr 2, not 3
  for (const auto& c : got) {
    EXPECT_EQ(c.status, WcStatus::kSuccess);
    EXPECT_EQ(c.byte_len, 40u + 64u);
    EXPECT_EQ(c.src_qp, 0x42u);
  }
  // Another group, or a wrong Q_Key, reaches nobody.
  dev.OnDatagram(wire::InDatagram{{src, 50000},
                                  {*wire::IpAddress::Parse("239.4.5.7"), wire::kRoceV2UdpPort},
                                  MulticastSend(src, *wire::IpAddress::Parse("239.4.5.7"), kQkey, payload), 0});
  EXPECT_TRUE(Drain(t.cb).empty());
}

TEST(UdMulticast, AttachRules) {
  UdPair t;
  Device& dev = *t.b->device;
  const wire::IpAddress group = *wire::IpAddress::Parse("239.4.5.6");
  QueuePair* rc = testing::CreateConnectedQp(dev, QpType::kRc, t.pb, t.cb, t.a->device.get(), t.qa->qpn());
  EXPECT_EQ(dev.AttachMulticast(rc, group), EINVAL);  // UD only
  EXPECT_EQ(dev.AttachMulticast(t.qb, *wire::IpAddress::Parse("10.1.2.3")), EINVAL);  // not a multicast GID
  EXPECT_EQ(dev.AttachMulticast(t.qb, *wire::IpAddress::Parse("ff0e::1")), 0);  // IPv6 multicast GIDs are groups
  EXPECT_EQ(dev.DetachMulticast(t.qb, group), EINVAL);  // not attached
  EXPECT_EQ(dev.AttachMulticast(t.qb, group), 0);
  EXPECT_EQ(dev.DetachMulticast(t.qb, group), 0);
  EXPECT_EQ(dev.DetachMulticast(t.qb, group), EINVAL);
}

// The limits ibv_query_device reports are the ones attach enforces, with ENOMEM as rxe gives: groups, QPs per
// group, attachments in all. A QP attached twice counts once, and a destroyed QP gives its attachments back.
TEST(UdMulticast, AttachBeyondTheDeviceLimitsIsEnomem) {
  DeviceConfig config;
  config.limits.max_mcast_grp = 2;
  config.limits.max_mcast_qp_attach = 3;
  config.limits.max_total_mcast_qp_attach = 5;
  Fabric fabric(config);
  Device& dev = *fabric.AddNode().device;
  ProtectionDomain* pd = dev.AllocPd();
  CompletionQueue* cq;
  ASSERT_EQ(dev.CreateCq(64, &cq), 0);
  std::vector<QueuePair*> qps;
  for (int i = 0; i < 6; ++i) qps.push_back(testing::CreateUdQp(dev, pd, cq, kQkey));
  const wire::IpAddress g1 = *wire::IpAddress::Parse("239.1.1.1");
  const wire::IpAddress g2 = *wire::IpAddress::Parse("239.1.1.2");
  const wire::IpAddress g3 = *wire::IpAddress::Parse("239.1.1.3");
  bool fresh = false;
  for (int i = 0; i < 3; ++i) {
    ASSERT_EQ(dev.AttachMulticast(qps[i], g1, &fresh), 0);
    EXPECT_TRUE(fresh);
  }
  EXPECT_EQ(dev.AttachMulticast(qps[3], g1), ENOMEM);  // a fourth QP in one group
  EXPECT_EQ(dev.AttachMulticast(qps[0], g1, &fresh), 0);  // again: no new attachment, not refused
  EXPECT_FALSE(fresh);
  ASSERT_EQ(dev.AttachMulticast(qps[3], g2), 0);
  EXPECT_EQ(dev.AttachMulticast(qps[3], g3, &fresh), ENOMEM);  // a third group
  EXPECT_FALSE(fresh);
  ASSERT_EQ(dev.AttachMulticast(qps[4], g2), 0);
  EXPECT_EQ(dev.AttachMulticast(qps[5], g2), ENOMEM);  // a sixth attachment in all
  std::vector<wire::IpAddress> left;
  ASSERT_EQ(dev.DestroyQp(qps[3], &left), 0);  // gives back its attachment, and g2 keeps qps[4]
  EXPECT_EQ(left, (std::vector<wire::IpAddress>{g2}));
  EXPECT_EQ(dev.AttachMulticast(qps[5], g2), 0);
  ASSERT_EQ(dev.DetachMulticast(qps[4], g2), 0);
  ASSERT_EQ(dev.DetachMulticast(qps[5], g2), 0);  // g2 empty: the group is gone, a new one fits
  EXPECT_EQ(dev.AttachMulticast(qps[5], g3), 0);
  left.clear();
  ASSERT_EQ(dev.DestroyQp(qps[4], &left), 0);
  EXPECT_TRUE(left.empty());  // detached from g2 above: nothing left to leave
}

}  // namespace
}  // namespace uroce::emu
