#include "wire/service_protocol.h"

#include <gtest/gtest.h>

#include <vector>

#include "wire/cm_mad.h"
#include "wire/headers.h"

namespace uroce::wire {
namespace {

std::vector<uint8_t> DataPacket(uint32_t dest_qp) {
  std::vector<uint8_t> p(Bth::kSize + 4 + 4, 0);
  Bth bth;
  bth.opcode = 0x04;  // RC SEND only
  bth.dest_qp = dest_qp;
  bth.Encode(p.data());
  return p;
}

std::vector<uint8_t> MadPacket(const CmMessage& m) {
  std::vector<uint8_t> p(Bth::kSize + Deth::kSize);
  Bth bth;
  bth.opcode = 0x64;  // UD SEND only
  bth.dest_qp = kGsiQpn;
  bth.Encode(p.data());
  const auto mad = EncodeCmMad(CmMad{0x1234, 0, m});
  p.insert(p.end(), mad.begin(), mad.end());
  p.resize(p.size() + 4);  // ICRC
  return p;
}

TEST(ServiceProtocol, OwnerBytesSitWhereTheServiceLooks) {
  EXPECT_EQ(WithOwner24(7, 0x12345), 0x072345u);
  EXPECT_EQ(OwnerOf24(WithOwner24(200, 0xffff)), 200);
  EXPECT_EQ(WithOwner32(9, 0xabcdef12), 0x09cdef12u);
  EXPECT_EQ(OwnerOf32(WithOwner32(255, 1)), 255);
}

TEST(ServiceProtocol, DataPacketsRouteByTheDestinationQpnsOwner) {
  const PacketRoute r = RouteOf(DataPacket(WithOwner24(42, 0x11)));
  EXPECT_EQ(r.kind, PacketRoute::Kind::kOwner);
  EXPECT_EQ(r.owner, 42);
  // QPNs below 0x10000 belong to no process of a host device (owner 0), nor does the multicast QPN.
  EXPECT_EQ(RouteOf(DataPacket(0x11)).kind, PacketRoute::Kind::kUnroutable);
  EXPECT_EQ(RouteOf(DataPacket(0xffffff)).kind, PacketRoute::Kind::kUnroutable);
  EXPECT_EQ(RouteOf(std::vector<uint8_t>(11, 0)).kind, PacketRoute::Kind::kUnroutable);
}

TEST(ServiceProtocol, ANewConnectionRoutesByServiceIdAndTheRestByOurCommId) {
  CmReq req;
  req.local_comm_id = 0x55000001;  // the peer's: says nothing about us
  req.service_id = ServiceIdOf(kPortSpaceTcp, 7471);
  const PacketRoute r = RouteOf(MadPacket(req));
  EXPECT_EQ(r.kind, PacketRoute::Kind::kListener);
  EXPECT_EQ(r.service_id, req.service_id);

  CmRep rep;
  rep.local_comm_id = 0x66000002;
  rep.remote_comm_id = WithOwner32(17, 0x123456);
  EXPECT_EQ(RouteOf(MadPacket(rep)).owner, 17);
  CmDreq dreq;
  dreq.remote_comm_id = WithOwner32(3, 9);
  EXPECT_EQ(RouteOf(MadPacket(dreq)).owner, 3);
  CmSidrRep sidr_rep;
  sidr_rep.request_id = WithOwner32(5, 1);
  EXPECT_EQ(RouteOf(MadPacket(sidr_rep)).owner, 5);
  CmSidrReq sidr_req;
  sidr_req.service_id = ServiceIdOf(kPortSpaceUdp, 9000);
  EXPECT_EQ(RouteOf(MadPacket(sidr_req)).kind, PacketRoute::Kind::kListener);

  auto truncated = MadPacket(rep);
  truncated.resize(Bth::kSize + Deth::kSize + 100);
  EXPECT_EQ(RouteOf(truncated).kind, PacketRoute::Kind::kUnroutable);
}

TEST(ServiceProtocol, ForwardHeaderRoundTrips) {
  ForwardHeader h;
  h.src = {*IpAddress::Parse("10.1.2.3"), 0xc123};
  h.dst = {*IpAddress::Parse("fe80::1"), kRoceV2UdpPort};
  h.congestion_experienced = true;
  uint8_t bytes[ForwardHeader::kSize];
  h.Encode(bytes);
  auto back = ForwardHeader::Decode(bytes);
  ASSERT_TRUE(back);
  EXPECT_EQ(back->src, h.src);
  EXPECT_EQ(back->dst, h.dst);
  EXPECT_TRUE(back->congestion_experienced);
  EXPECT_FALSE(back->icrc_vouched);
  h.congestion_experienced = false;
  h.icrc_vouched = true;
  h.Encode(bytes);
  back = ForwardHeader::Decode(bytes);
  ASSERT_TRUE(back);
  EXPECT_FALSE(back->congestion_experienced);
  EXPECT_TRUE(back->icrc_vouched);
  EXPECT_EQ(back->record, RingRecord::kPacket);
  for (RingRecord r : {RingRecord::kDirectSend, RingRecord::kXrcDelivery, RingRecord::kXrcTargetEvent,
                       RingRecord::kXrcTargetModify}) {
    h.record = r;
    h.Encode(bytes);
    back = ForwardHeader::Decode(bytes);
    ASSERT_TRUE(back);
    EXPECT_EQ(back->record, r);
    EXPECT_TRUE(back->icrc_vouched);
  }
  bytes[1] = uint8_t((bytes[1] & 3) | (uint8_t(kLastRingRecord) + 1) << 2);  // no such record
  EXPECT_FALSE(ForwardHeader::Decode(bytes));
  bytes[1] = 1 << 6;  // a flag that does not exist
  EXPECT_FALSE(ForwardHeader::Decode(bytes));
  bytes[0] = 2;
  EXPECT_FALSE(ForwardHeader::Decode(bytes));
  EXPECT_FALSE(ForwardHeader::Decode(std::span<const uint8_t>(bytes, 10)));
}

TEST(ServiceProtocol, ControlMessagesRoundTripAndStrangersAreRefused) {
  uint8_t bytes[kControlSize];
  ControlMessage{ControlType::kListen, -3, 0x0106'1d2f}.Encode(bytes);
  auto m = ControlMessage::Decode(bytes);
  ASSERT_TRUE(m);
  EXPECT_EQ(m->type, ControlType::kListen);
  EXPECT_EQ(m->status, -3);
  EXPECT_EQ(m->value, 0x0106'1d2fu);
  EXPECT_FALSE(ControlMessage::Decode(std::span<const uint8_t>(bytes, kControlSize - 1)));
  bytes[6] = 99;  // unknown type
  EXPECT_FALSE(ControlMessage::Decode(bytes));
  bytes[6] = 1;
  bytes[0] ^= 1;  // wrong magic
  EXPECT_FALSE(ControlMessage::Decode(bytes));
}

}  // namespace
}  // namespace uroce::wire
