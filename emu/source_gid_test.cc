// A device with several GIDs (one per address of its host): each QP's and AH's packets leave from the address its
// source GID index names, the peer answers to it, and the table's entries come and go as the host's addresses do.
#include <gtest/gtest.h>

#include <cstring>

#include "emu/test_fabric.h"
#include "wire/bytes.h"

namespace uroce::emu {
namespace {

using testing::Buffer;
using testing::Drain;
using testing::Fabric;
using testing::Node;

constexpr uint32_t kAll = access::kLocalWrite | access::kRemoteWrite | access::kRemoteRead;
const wire::IpAddress kSecond = wire::IpAddress::V4(0x0a000101);  // node a's host's second address

// Moves an RC QP to RTS towards `peer_gid` / `peer_qpn`, its packets leaving from GID `sgid_index`. The modify to RTR
// returns what the device said.
int ConnectFrom(Device& dev, QueuePair* qp, uint8_t sgid_index, const wire::IpAddress& peer_gid, uint32_t peer_qpn) {
  QpAttributes a;
  a.qp_state = QpState::kInit;
  a.port_num = 1;
  a.qp_access_flags = kAll;
  if (int err = dev.ModifyQp(qp, a, attr::kState | attr::kPkeyIndex | attr::kPort | attr::kAccessFlags)) return err;
  a.qp_state = QpState::kRtr;
  a.path_mtu = Mtu::k1024;
  a.dest_qp_num = peer_qpn;
  a.ah_attr.dgid = peer_gid.bytes();
  a.ah_attr.sgid_index = sgid_index;
  a.ah_attr.is_global = true;
  a.ah_attr.port_num = 1;
  a.max_dest_rd_atomic = 1;
  a.min_rnr_timer = 12;
  if (int err = dev.ModifyQp(qp, a, attr::kState | attr::kAv | attr::kPathMtu | attr::kDestQpn | attr::kRqPsn |
                                        attr::kMaxDestRdAtomic | attr::kMinRnrTimer))
    return err;
  a.qp_state = QpState::kRts;
  a.timeout = 14;
  a.retry_cnt = 7;
  a.rnr_retry = 7;
  a.max_rd_atomic = 1;
  return dev.ModifyQp(qp, a, attr::kState | attr::kSqPsn | attr::kTimeout | attr::kRetryCnt | attr::kRnrRetry |
                                 attr::kMaxQpRdAtomic);
}

struct TwoHosts {
  Fabric fabric;
  Node* a;  // 10.0.0.1 (GID 0) and kSecond (GID 1)
  Node* b;  // 10.0.0.2
  ProtectionDomain *pa, *pb;
  CompletionQueue *ca, *cb;

  TwoHosts() {
    a = &fabric.AddNode(Mtu::k4096, std::span<const wire::IpAddress>(&kSecond, 1));
    b = &fabric.AddNode();
    a->transport->record = b->transport->record = true;
    pa = a->device->AllocPd();
    pb = b->device->AllocPd();
    EXPECT_EQ(a->device->CreateCq(64, &ca), 0);
    EXPECT_EQ(b->device->CreateCq(64, &cb), 0);
  }
  QueuePair* Qp(Node& n, ProtectionDomain* pd, CompletionQueue* cq, QpType type = QpType::kRc) {
    QpInitAttributes init;
    init.type = type;
    init.cap = {16, 16, 2, 2, 0};
    init.pd = pd;
    init.send_cq = init.recv_cq = cq;
    QueuePair* qp = nullptr;
    EXPECT_EQ(n.device->CreateQp(init, &qp), 0);
    return qp;
  }
};

TEST(SourceGid, TheTableListsTheHostsAddressesAndAnnouncesAChange) {
  TwoHosts t;
  EXPECT_EQ(t.a->device->gids().At(0), wire::IpAddress::V4(0x0a000001));
  EXPECT_EQ(t.a->device->gids().At(1), kSecond);
  EXPECT_EQ(t.a->device->gids().At(2), std::nullopt);
  ASSERT_EQ(t.a->events.size(), 1u);  // adding kSecond
  EXPECT_EQ(t.a->events[0].type, AsyncEventType::kGidChange);
  EXPECT_EQ(t.a->events[0].port, 1);
  EXPECT_FALSE(t.a->device->UpdateGids(std::span<const wire::IpAddress>(&kSecond, 1)));  // no change, no event
  EXPECT_EQ(t.a->events.size(), 1u);
}

TEST(SourceGid, RcPacketsLeaveFromTheNamedGidAndThePeerAnswersThere) {
  TwoHosts t;
  QueuePair* qa = t.Qp(*t.a, t.pa, t.ca);
  QueuePair* qb = t.Qp(*t.b, t.pb, t.cb);
  ASSERT_EQ(ConnectFrom(*t.a->device, qa, 1, t.b->device->config().address, qb->qpn()), 0);
  ASSERT_EQ(ConnectFrom(*t.b->device, qb, 0, kSecond, qa->qpn()), 0);
  Buffer src = testing::Register(*t.a->device, t.pa, 3000, kAll);
  Buffer dst = testing::Register(*t.b->device, t.pb, 3000, kAll);
  Buffer back = testing::Register(*t.a->device, t.pa, 3000, kAll);
  for (size_t i = 0; i < src.bytes.size(); ++i) src.bytes[i] = uint8_t(i * 13 + 1);
  // A WRITE of three packets, a SEND, and a READ back: requests, ACKs and READ responses both ways.
  SendWr write;
  write.wr_id = 1;
  write.opcode = SendOpcode::kRdmaWrite;
  write.flags = send_flags::kSignaled;
  write.sg_list = {src.At(0, 3000)};
  write.remote_addr = dst.mr.iova;
  write.rkey = dst.mr.rkey;
  ASSERT_EQ(t.a->device->PostSend(qa, std::move(write)), 0);
  ASSERT_EQ(t.b->device->PostRecv(qb, RecvWr{5, {dst.At(0, 100)}}), 0);
  SendWr send;
  send.wr_id = 2;
  send.opcode = SendOpcode::kSend;
  send.flags = send_flags::kSignaled;
  send.sg_list = {src.At(0, 100)};
  ASSERT_EQ(t.a->device->PostSend(qa, std::move(send)), 0);
  SendWr read;
  read.wr_id = 3;
  read.opcode = SendOpcode::kRdmaRead;
  read.flags = send_flags::kSignaled;
  read.sg_list = {back.At(0, 3000)};
  read.remote_addr = dst.mr.iova;
  read.rkey = dst.mr.rkey;
  ASSERT_EQ(t.a->device->PostSend(qa, std::move(read)), 0);
  t.fabric.Pump();
  auto done = Drain(t.ca);
  ASSERT_EQ(done.size(), 3u);
  for (const auto& c : done) EXPECT_EQ(c.status, WcStatus::kSuccess) << c.wr_id;
  auto got = Drain(t.cb);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].status, WcStatus::kSuccess);
  EXPECT_EQ(0, std::memcmp(back.bytes.data() + 100, src.bytes.data() + 100, 2900));
  EXPECT_EQ(0, std::memcmp(back.bytes.data(), src.bytes.data(), 100));
  // On the wire: everything of a's left from its second address, everything of b's went there.
  ASSERT_FALSE(t.a->transport->log().empty());
  ASSERT_FALSE(t.b->transport->log().empty());
  for (const auto& s : t.a->transport->log()) EXPECT_EQ(s.src, kSecond) << s.index;
  for (const auto& s : t.b->transport->log()) {
    EXPECT_EQ(s.dst.addr, kSecond) << s.index;
    EXPECT_EQ(s.src, t.b->device->config().address) << s.index;
  }
  EXPECT_EQ(t.a->device->counters().rx_icrc_errors, 0u);
  EXPECT_EQ(t.b->device->counters().rx_icrc_errors, 0u);
}

TEST(SourceGid, AnEmptyOrMissingEntryIsInvalidAndAResolvedOneOutlivesItsAddress) {
  TwoHosts t;
  QueuePair* qa = t.Qp(*t.a, t.pa, t.ca);
  // Entry 2 is empty and 16 is past the table: the modify to RTR is EINVAL, as rdma_check_ah_attr finds.
  EXPECT_EQ(ConnectFrom(*t.a->device, qa, 2, t.b->device->config().address, 0x11), EINVAL);
  EXPECT_EQ(qa->state(), QpState::kInit);
  EXPECT_EQ(ConnectFrom(*t.a->device, qa, GidTable::kEntries, t.b->device->config().address, 0x11), EINVAL);
  AddressVector av;
  av.dgid = t.b->device->config().address.bytes();
  av.sgid_index = 2;
  AddressHandle* ah = nullptr;
  EXPECT_EQ(t.a->device->CreateAh(t.pa, av, &ah), EINVAL);
  av.sgid_index = 1;
  ASSERT_EQ(t.a->device->CreateAh(t.pa, av, &ah), 0);
  // The host loses the second address: its entry empties (an event says so); the AH keeps the GID it resolved.
  EXPECT_TRUE(t.a->device->UpdateGids({}));
  EXPECT_EQ(t.a->device->gids().At(1), std::nullopt);
  EXPECT_EQ(t.a->events.back().type, AsyncEventType::kGidChange);
  EXPECT_EQ(wire::IpAddress::FromBytes(ah->av().sgid.data()), kSecond);
  AddressHandle* late = nullptr;
  EXPECT_EQ(t.a->device->CreateAh(t.pa, av, &late), EINVAL);
  // A destination of the other IP family than the source GID's: no route joins them.
  av.sgid_index = 0;
  av.dgid = wire::IpAddress::Parse("fd00::2")->bytes();
  EXPECT_EQ(t.a->device->CreateAh(t.pa, av, &late), EINVAL);
  EXPECT_EQ(ConnectFrom(*t.a->device, qa, 0, *wire::IpAddress::Parse("fd00::2"), 0x11), EINVAL);
  EXPECT_EQ(qa->state(), QpState::kInit);
}

TEST(SourceGid, UdDatagramsCarryTheirAhsSourceInTheReceiversGrh) {
  TwoHosts t;
  QueuePair* qa = testing::CreateUdQp(*t.a->device, t.pa, t.ca, 0x1111);
  QueuePair* qb = testing::CreateUdQp(*t.b->device, t.pb, t.cb, 0x1111);
  AddressVector av;
  av.dgid = t.b->device->config().address.bytes();
  av.sgid_index = 1;
  AddressHandle* ah = nullptr;
  ASSERT_EQ(t.a->device->CreateAh(t.pa, av, &ah), 0);
  Buffer src = testing::Register(*t.a->device, t.pa, 64, kAll);
  Buffer dst = testing::Register(*t.b->device, t.pb, 40 + 64, kAll);
  ASSERT_EQ(t.b->device->PostRecv(qb, RecvWr{9, {dst.At(0, 104)}}), 0);
  SendWr wr;
  wr.wr_id = 4;
  wr.opcode = SendOpcode::kSend;
  wr.flags = send_flags::kSignaled;
  wr.sg_list = {src.At(0, 64)};
  wr.ah = ah;
  wr.remote_qpn = qb->qpn();
  wr.remote_qkey = 0x1111;
  ASSERT_EQ(t.a->device->PostSend(qa, std::move(wr)), 0);
  t.fabric.Pump();
  auto got = Drain(t.cb);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].status, WcStatus::kSuccess);
  // The IPv4 header in the GRH slot's last 20 bytes: its source is the second address.
  EXPECT_EQ(wire::LoadBe32(dst.bytes.data() + 20 + 12), kSecond.v4());
}

// Answers as librdmacm does: a REQ with a REP, a REP with an RTU; remembers what it heard.
struct AnsweringSink : CmEventSink {
  explicit AnsweringSink(ConnectionManager& c) : cm(c) { cm.SetSink(this); }
  ~AnsweringSink() override { cm.SetSink(nullptr); }
  void OnCmEvent(const CmEvent& e) override {
    heard.push_back(e.type);
    if (e.type == CmEventType::kReqReceived) {
      wire::CmRep rep;
      rep.local_qpn = 0x22;
      rep.starting_psn = 1;
      cm.SendRep(e.id, rep);
    } else if (e.type == CmEventType::kRepReceived) {
      cm.SendRtu(e.id, {});
    }
  }
  ConnectionManager& cm;
  std::vector<CmEventType> heard;
};

wire::CmReq ReqFor(uint64_t service_id, const wire::IpAddress& from) {
  wire::CmReq r;
  r.service_id = service_id;
  r.local_qpn = 0x11;
  r.starting_psn = 1;
  r.remote_cm_response_timeout = r.local_cm_response_timeout = 20;
  r.max_cm_retries = 15;
  r.path_mtu = 3;
  r.primary.local_gid = from.bytes();
  r.primary.local_ack_timeout = 17;
  return r;
}

// The CM's messages of a connection leave from its GID, as the kernel's CM sends from the path's SGID: an active
// connection from the address it names (one not among the GIDs is EADDRNOTAVAIL), a passive one from the address
// its REQ came to.
TEST(SourceGid, CmMessagesLeaveFromTheConnectionsGid) {
  TwoHosts t;
  AnsweringSink sa(t.a->device->connection_manager()), sb(t.b->device->connection_manager());
  const wire::IpAddress b_address = t.b->device->config().address;
  uint32_t lid = 0, id = 0;
  ASSERT_EQ(sb.cm.Listen(wire::ServiceIdOf(wire::kPortSpaceTcp, 7000), nullptr, &lid), 0);
  EXPECT_EQ(sa.cm.SendReq(b_address, ReqFor(wire::ServiceIdOf(wire::kPortSpaceTcp, 7000), kSecond), nullptr, &id,
                          wire::IpAddress::V4(0x0a090909)),
            EADDRNOTAVAIL);
  ASSERT_EQ(sa.cm.SendReq(b_address, ReqFor(wire::ServiceIdOf(wire::kPortSpaceTcp, 7000), kSecond), nullptr, &id,
                          kSecond),
            0);
  t.fabric.Pump();
  EXPECT_EQ(sa.cm.State(id), CmState::kEstablished);
  EXPECT_EQ(sb.heard, (std::vector<CmEventType>{CmEventType::kReqReceived, CmEventType::kRtuReceived}));
  ASSERT_EQ(t.a->transport->log().size(), 2u);  // REQ, RTU
  for (const auto& s : t.a->transport->log()) EXPECT_EQ(s.src, kSecond) << s.index;
  ASSERT_EQ(t.b->transport->log().size(), 1u);  // REP
  EXPECT_EQ(t.b->transport->log()[0].dst.addr, kSecond);
  // b dials a at its second address: a's REP leaves from there.
  ASSERT_EQ(sa.cm.Listen(wire::ServiceIdOf(wire::kPortSpaceTcp, 7001), nullptr, &lid), 0);
  const size_t a_before = t.a->transport->log().size();
  ASSERT_EQ(sb.cm.SendReq(kSecond, ReqFor(wire::ServiceIdOf(wire::kPortSpaceTcp, 7001), b_address), nullptr, &id), 0);
  t.fabric.Pump();
  EXPECT_EQ(sb.cm.State(id), CmState::kEstablished);
  ASSERT_EQ(t.a->transport->log().size(), a_before + 1);  // REP
  EXPECT_EQ(t.a->transport->log().back().src, kSecond);
  EXPECT_EQ(t.a->transport->log().back().dst.addr, b_address);
}

}  // namespace
}  // namespace uroce::emu
