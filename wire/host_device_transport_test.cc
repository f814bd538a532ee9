#include "wire/host_device_transport.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <random>
#include <vector>

#include "wire/cm_mad.h"
#include "wire/headers.h"
#include "wire/service_protocol.h"

namespace uroce::wire {
namespace {

// The UDP side, recorded: what would have left for the network.
class RecordingSender final : public Transport {
 public:
  explicit RecordingSender(UdpEndpoint local) : local_(local) {}
  UdpEndpoint local() const override { return local_; }
  Flow OutgoingFlow(const UdpEndpoint& dst, uint16_t) const override { return Flow{local_, dst, 0}; }
  int Send(std::span<const OutDatagram> batch) override {
    for (const OutDatagram& d : batch) sent.emplace_back(d.payload.begin(), d.payload.end());
    return int(batch.size());
  }
  int Poll(const DatagramHandler&, int64_t) override { return 0; }
  void Wake() override {}
  std::vector<std::vector<uint8_t>> sent;

 private:
  UdpEndpoint local_;
};

std::vector<uint8_t> DataPacket(uint32_t dest_qp, uint8_t tag) {
  std::vector<uint8_t> p(Bth::kSize + 8, tag);
  Bth bth;
  bth.opcode = 0x04;
  bth.dest_qp = dest_qp;
  bth.Encode(p.data());
  return p;
}

struct Member {
  RecordingSender* sender = nullptr;
  int service_end = -1;  // the service's end of the forward pair
  std::unique_ptr<HostDeviceTransport> transport;
  ~Member() {
    if (service_end >= 0) close(service_end);
  }
};

class HostDeviceTransportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::random_device rd;  // an address of our own: tests run in parallel
    address_ = IpAddress::V4(0x7f000000u | (150u + rd() % 50) << 16 | (rd() % 250 + 1) << 8 | (rd() % 250 + 1));
  }
  void Join(Member& m, uint8_t owner, uint16_t sender_port) {
    int pair[2];
    ASSERT_EQ(socketpair(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0, pair), 0);
    m.service_end = pair[1];
    auto sender = std::make_unique<RecordingSender>(UdpEndpoint{address_, sender_port});
    m.sender = sender.get();
    m.transport = std::make_unique<HostDeviceTransport>(std::move(sender), UdpEndpoint{address_, kRoceV2UdpPort},
                                                        owner, pair[0], -1, nullptr);
    ASSERT_EQ(m.transport->Init(), 0);
  }
  static std::vector<InDatagram> PollAll(HostDeviceTransport& t, std::vector<std::vector<uint8_t>>* payloads) {
    std::vector<InDatagram> got;
    for (int i = 0; i < 50 && got.empty(); ++i) {
      t.Poll(
          [&](const InDatagram& d) {
            got.push_back(d);
            payloads->emplace_back(d.payload.begin(), d.payload.end());
          },
          100'000'000);
    }
    return got;
  }
  IpAddress address_;
};

TEST_F(HostDeviceTransportTest, APacketForAnotherProcessOfTheHostGoesStraightToIt) {
  Member a, b;
  Join(a, 1, 40001);
  Join(b, 2, 40002);
  const auto packet = DataPacket(WithOwner24(2, 0x11), 7);
  const OutDatagram out{{address_, kRoceV2UdpPort}, 0xc000, packet};
  ASSERT_EQ(a.transport->Send({&out, 1}), 1);
  std::vector<std::vector<uint8_t>> payloads;
  const auto got = PollAll(*b.transport, &payloads);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(payloads[0], packet);
  EXPECT_EQ(got[0].src, (UdpEndpoint{address_, 40001}));  // the flow A's ICRC was sealed for
  EXPECT_EQ(got[0].dst, (UdpEndpoint{address_, kRoceV2UdpPort}));
  EXPECT_TRUE(a.sender->sent.empty());  // nothing through UDP (and so nothing through the service)
  EXPECT_EQ(a.transport->peer_sent(), 1u);
}

TEST_F(HostDeviceTransportTest, OtherHostsAndCmMadsGoByUdpAndAnAbsentProcessIsADrop) {
  Member a;
  Join(a, 1, 40001);
  const auto remote = DataPacket(WithOwner24(2, 0x11), 1);
  const auto gsi = DataPacket(kGsiQpn, 2);
  const auto absent = DataPacket(WithOwner24(9, 0x11), 3);
  const OutDatagram batch[] = {{{*IpAddress::Parse("10.1.2.3"), kRoceV2UdpPort}, 0xc000, remote},
                               {{address_, kRoceV2UdpPort}, 0xc000, gsi},
                               {{address_, kRoceV2UdpPort}, 0xc000, absent}};
  ASSERT_EQ(a.transport->Send(batch), 3);
  ASSERT_EQ(a.sender->sent.size(), 2u);
  EXPECT_EQ(a.sender->sent[0], remote);
  EXPECT_EQ(a.sender->sent[1], gsi);  // the service routes MADs by comm ID or service ID
  EXPECT_EQ(a.transport->peer_drops(), 1u);
}

TEST_F(HostDeviceTransportTest, WhatTheServiceForwardsIsDelivered) {
  Member a;
  Join(a, 1, 40001);
  const auto packet = DataPacket(WithOwner24(1, 0x12), 4);
  ForwardHeader h;
  h.src = {*IpAddress::Parse("10.1.2.3"), 0xc123};
  h.dst = {address_, kRoceV2UdpPort};
  std::vector<uint8_t> bytes(ForwardHeader::kSize);
  h.Encode(bytes.data());
  bytes.insert(bytes.end(), packet.begin(), packet.end());
  ASSERT_EQ(send(a.service_end, bytes.data(), bytes.size(), 0), ssize_t(bytes.size()));
  const uint8_t junk[] = {9, 9, 9};
  ASSERT_EQ(send(a.service_end, junk, sizeof junk, 0), ssize_t(sizeof junk));
  ASSERT_EQ(send(a.service_end, bytes.data(), bytes.size(), 0), ssize_t(bytes.size()));
  std::vector<std::vector<uint8_t>> payloads;
  std::vector<InDatagram> got;
  for (int i = 0; i < 50 && got.size() < 2; ++i) {
    a.transport->Poll(
        [&](const InDatagram& d) {
          got.push_back(d);
          payloads.emplace_back(d.payload.begin(), d.payload.end());
        },
        100'000'000);
  }
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].src, h.src);
  EXPECT_EQ(payloads[1], packet);
  EXPECT_EQ(a.transport->malformed(), 1u);
}

}  // namespace
}  // namespace uroce::wire
