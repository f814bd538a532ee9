#include "wire/host_device_transport.h"

#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <future>
#include <random>
#include <thread>
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

// The QPs and R_Key of the shared-WRITE cases (JoinForDirectWrites): A's QP writes through B's into B's region.
constexpr uint32_t kWriterQpn = WithOwner24(1, 0x11), kTargetQpn = WithOwner24(2, 0x22), kTargetRkey = 0x4217;

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
  void Join(Member& m, uint8_t owner, uint16_t sender_port, SameHostPath path = SameHostPath::kSharedMemory,
            std::function<void(uint8_t)> on_peer_gone = nullptr) {
    int pair[2];
    ASSERT_EQ(socketpair(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0, pair), 0);
    m.service_end = pair[1];
    auto sender = std::make_unique<RecordingSender>(UdpEndpoint{address_, sender_port});
    m.sender = sender.get();
    m.transport = std::make_unique<HostDeviceTransport>(std::move(sender), UdpEndpoint{address_, kRoceV2UdpPort},
                                                        owner, pair[0], -1, nullptr, path);
    if (on_peer_gone) m.transport->SetPeerGoneHandler(std::move(on_peer_gone));
    ASSERT_EQ(m.transport->Init(), 0);
  }
  // Polls (at most 50 looks of up to 100 ms) until `want` datagrams have come; all that came, payloads copied.
  static std::vector<InDatagram> PollFor(HostDeviceTransport& t, size_t want,
                                         std::vector<std::vector<uint8_t>>* payloads) {
    std::vector<InDatagram> got;
    for (int i = 0; i < 50 && got.size() < want; ++i) {
      t.Poll(
          [&](const InDatagram& d) {
            got.push_back(d);
            payloads->emplace_back(d.payload.begin(), d.payload.end());
          },
          100'000'000);
    }
    return got;
  }
  // A (owner 1) and B (owner 2) joined with direct access, B's QP kTargetQpn responding to A's kWriterQpn and
  // publishing `target` for remote write under kTargetRkey at address 0; returns once A's connection to B has been
  // answered with B's ring and table (a WRITE went directly).
  void JoinForDirectWrites(Member& a, Member& b, std::span<uint8_t> target) {
    Join(a, 1, 40001);
    Join(b, 2, 40002);
    ASSERT_EQ(a.transport->EnableDirectAccess(), 0);
    ASSERT_EQ(b.transport->EnableDirectAccess(), 0);
    b.transport->PublishQp({kTargetQpn, kWriterQpn, 3, direct_rights::kWrite});
    b.transport->PublishRegion({kTargetRkey, 3, direct_rights::kWrite, 0, target.size(), target.data()});
    const UdpEndpoint device{address_, kRoceV2UdpPort};
    a.transport->ConnectAhead(device, kTargetQpn);
    b.transport->Poll([](const InDatagram&) {}, 0);  // B accepts and offers its ring and table
    const uint8_t probe[1] = {0};
    const std::span<const uint8_t> pieces[] = {probe};
    bool written = false;
    for (int i = 0; i < 100 && !written; ++i) {
      written = a.transport->Write(device, kTargetQpn, kWriterQpn, kTargetRkey, 0, pieces, 1);
      if (!written) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    ASSERT_TRUE(written);
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
  const auto got = PollFor(*b.transport, 1, &payloads);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(payloads[0], packet);
  EXPECT_EQ(got[0].src, (UdpEndpoint{address_, 40001}));  // the flow A's ICRC was sealed for
  EXPECT_EQ(got[0].dst, (UdpEndpoint{address_, kRoceV2UdpPort}));
  EXPECT_TRUE(a.sender->sent.empty());  // nothing through UDP (and so nothing through the service)
  EXPECT_EQ(a.transport->peer_sent(), 1u);
  // A sealed one crossed no network: B need not check its ICRC again. One a fault injector altered it must.
  EXPECT_TRUE(got[0].icrc_vouched);
  OutDatagram altered = out;
  altered.altered = true;
  OutDatagram opaque = out;
  opaque.has_icrc = false;
  for (const OutDatagram* o : {&altered, &opaque}) {
    ASSERT_EQ(a.transport->Send({o, 1}), 1);
    payloads.clear();
    const auto again = PollFor(*b.transport, 1, &payloads);
    ASSERT_EQ(again.size(), 1u);
    EXPECT_FALSE(again[0].icrc_vouched);
  }
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
  h.icrc_vouched = true;  // only a process of this host may vouch: from the service it means nothing
  std::vector<uint8_t> bytes(ForwardHeader::kSize);
  h.Encode(bytes.data());
  bytes.insert(bytes.end(), packet.begin(), packet.end());
  ASSERT_EQ(send(a.service_end, bytes.data(), bytes.size(), 0), ssize_t(bytes.size()));
  const uint8_t junk[] = {9, 9, 9};
  ASSERT_EQ(send(a.service_end, junk, sizeof junk, 0), ssize_t(sizeof junk));
  ASSERT_EQ(send(a.service_end, bytes.data(), bytes.size(), 0), ssize_t(bytes.size()));
  std::vector<std::vector<uint8_t>> payloads;
  const std::vector<InDatagram> got = PollFor(*a.transport, 2, &payloads);
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].src, h.src);
  EXPECT_FALSE(got[0].icrc_vouched);
  EXPECT_EQ(payloads[1], packet);
  EXPECT_EQ(a.transport->malformed(), 1u);
}

// Sends `count` packets for owner 2 from `a`, numbered from `first` (byte 12 on: the number).
void SendNumbered(HostDeviceTransport& a, const IpAddress& address, uint32_t first, uint32_t count, size_t size) {
  for (uint32_t i = first; i < first + count; ++i) {
    auto packet = DataPacket(WithOwner24(2, 0x11), 0);
    packet.resize(size);
    std::memcpy(packet.data() + 12, &i, 4);
    const OutDatagram out{{address, kRoceV2UdpPort}, 0xc000, packet};
    ASSERT_EQ(a.Send({&out, 1}), 1);
  }
}

// Polls `b` (timeout per poll `timeout_ns`) until `count` packets came or a poll brought none; returns their numbers.
std::vector<uint32_t> ReceiveNumbered(HostDeviceTransport& b, size_t count, int64_t timeout_ns) {
  std::vector<uint32_t> numbers;
  while (numbers.size() < count) {
    const int n = b.Poll(
        [&](const InDatagram& d) {
          uint32_t i = 0;
          if (d.payload.size() >= 16) std::memcpy(&i, d.payload.data() + 12, 4);
          numbers.push_back(i);
        },
        timeout_ns);
    if (n <= 0) break;
  }
  return numbers;
}

TEST_F(HostDeviceTransportTest, OnceTheReceiverOffersItsRingPacketsGoThroughSharedMemoryInOrder) {
  Member a, b;
  Join(a, 1, 40001);
  Join(b, 2, 40002);
  SendNumbered(*a.transport, address_, 0, 3, 100);  // connects; b has not answered yet: on the connection
  EXPECT_EQ(a.transport->ring_sent(), 0u);
  EXPECT_EQ(ReceiveNumbered(*b.transport, 3, 1'000'000'000), (std::vector<uint32_t>{0, 1, 2}));  // b accepts, offers
  SendNumbered(*a.transport, address_, 3, 500, 1100);
  EXPECT_EQ(a.transport->ring_sent(), 500u);
  EXPECT_EQ(a.transport->peer_sent(), 503u);
  EXPECT_EQ(a.transport->peer_drops(), 0u);
  const auto numbers = ReceiveNumbered(*b.transport, 500, 0);
  ASSERT_EQ(numbers.size(), 500u);
  for (uint32_t i = 0; i < 500; ++i) ASSERT_EQ(numbers[i], i + 3);
  EXPECT_EQ(b.transport->malformed(), 0u);
}

TEST_F(HostDeviceTransportTest, ConnectingAheadPutsTheFirstPacketInTheRing) {
  Member a, b, c;
  Join(a, 1, 40001);
  Join(b, 2, 40002);
  Join(c, 3, 40003);
  // A QP of a enters RTR towards a QP of b: a connects now; b accepts and offers its ring at its next look.
  a.transport->ConnectAhead({address_, kRoceV2UdpPort}, WithOwner24(2, 0x11));
  EXPECT_TRUE(ReceiveNumbered(*b.transport, 1, 50'000'000).empty());
  SendNumbered(*a.transport, address_, 0, 1, 100);
  EXPECT_EQ(a.transport->ring_sent(), 1u);  // not on the connection, as a first packet was without
  EXPECT_EQ(ReceiveNumbered(*b.transport, 1, 0), (std::vector<uint32_t>{0}));
  // Another host's address, or the UDP way: nothing to connect to.
  c.transport->ConnectAhead({IpAddress::V4(0x0a000001), kRoceV2UdpPort}, WithOwner24(2, 0x11));
  Member d;
  Join(d, 4, 40004, SameHostPath::kUdp);
  d.transport->ConnectAhead({address_, kRoceV2UdpPort}, WithOwner24(2, 0x11));
  EXPECT_TRUE(ReceiveNumbered(*b.transport, 1, 50'000'000).empty());  // no connection came to accept
  EXPECT_EQ(c.transport->peer_sent() + d.transport->peer_sent(), 0u);
}

TEST_F(HostDeviceTransportTest, AWakeALookThatCouldNotWaitConsumedStillEndsTheNextWait) {
  // An engine stopping sets its flag and calls Wake(); when the polling thread's look that may not wait reads the
  // wake-up first, its next wait must return all the same, or the thread sleeps for ever (the engine's destructor
  // joined it: ibv_import_device of a non-device fd, which starts and drops an engine, hung 1 run in 6).
  Member a;
  Join(a, 1, 40001);
  for (int round = 0; round < 3; ++round) {
    a.transport->Wake();
    EXPECT_EQ(a.transport->Poll([](const InDatagram&) {}, 0), 0);  // reads the wake-up
    auto waited = std::async(std::launch::async, [&] { return a.transport->Poll([](const InDatagram&) {}, -1); });
    const bool returned = waited.wait_for(std::chrono::seconds(10)) == std::future_status::ready;
    EXPECT_TRUE(returned) << "round " << round << ": the wait did not end within 10 s";
    if (!returned) a.transport->Wake();  // let the stuck thread go, so that the test ends
    EXPECT_EQ(waited.get(), 0);
    if (!returned) return;
  }
  // Once that wait returned, the next one waits again: it returns after its timeout, not at once.
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(a.transport->Poll([](const InDatagram&) {}, 50'000'000), 0);
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(40));
}

TEST_F(HostDeviceTransportTest, ASleepingReceiverIsWokenByItsDoorbell) {
  Member a, b;
  Join(a, 1, 40001);
  Join(b, 2, 40002);
  SendNumbered(*a.transport, address_, 0, 1, 100);
  ASSERT_EQ(ReceiveNumbered(*b.transport, 1, 1'000'000'000).size(), 1u);
  SendNumbered(*a.transport, address_, 1, 1, 100);  // takes the offer, writes into the ring
  ASSERT_EQ(a.transport->ring_sent(), 1u);
  ASSERT_EQ(ReceiveNumbered(*b.transport, 1, 0).size(), 1u);
  std::vector<uint32_t> got;
  std::thread receiver([&] { got = ReceiveNumbered(*b.transport, 1, 30'000'000'000); });  // blocks in the kernel
  // Whether it already blocks or not yet: either it finds the record when it looks before blocking, or the sender
  // sees it asleep and rings. Without the doorbell it would sleep the whole 30 s and the test would time out.
  SendNumbered(*a.transport, address_, 2, 1, 100);
  receiver.join();
  EXPECT_EQ(got, (std::vector<uint32_t>{2}));
}

TEST_F(HostDeviceTransportTest, AFullRingDropsAndCountsAndADeadReceiversNumberIsDialledAgain) {
  Member a;
  auto b = std::make_unique<Member>();
  Join(a, 1, 40001);
  Join(*b, 2, 40002);
  SendNumbered(*a.transport, address_, 0, 1, 100);
  ASSERT_EQ(ReceiveNumbered(*b->transport, 1, 1'000'000'000).size(), 1u);
  const uint32_t kMany = 2 * PacketRing::kDefaultDataBytes / 4096;  // twice what the ring holds
  SendNumbered(*a.transport, address_, 1, kMany, 4096);
  const uint64_t in_ring = a.transport->ring_sent();
  EXPECT_GT(in_ring, kMany / 3);
  EXPECT_LT(in_ring, kMany);
  EXPECT_EQ(a.transport->peer_drops(), kMany - in_ring);
  const auto numbers = ReceiveNumbered(*b->transport, in_ring, 0);
  ASSERT_EQ(numbers.size(), in_ring) << "every packet that went into the ring arrives";
  for (size_t i = 0; i < numbers.size(); ++i) ASSERT_EQ(numbers[i], i + 1);
  b.reset();  // the receiver exits: its number becomes free
  SendNumbered(*a.transport, address_, 0, kMany, 4096);  // fills the dead one's ring, then finds it hung up
  Member c;
  Join(c, 2, 40003);  // a newcomer with the same number
  SendNumbered(*a.transport, address_, 7, 1, 100);
  EXPECT_EQ(ReceiveNumbered(*c.transport, 1, 1'000'000'000), (std::vector<uint32_t>{7}));
}

// A process of the host that goes (its connection hangs up, or a packet for its number finds nobody listening) is
// reported once, on the polling thread's next Poll, so that its rdma_cm connections end (emu::ConnectionManager::
// OnPeerProcessGone); a number reported is reported again only after a connection to it succeeded again.
TEST_F(HostDeviceTransportTest, AProcessThatGoesIsReportedOnceByItsNumber) {
  Member a;
  auto b = std::make_unique<Member>();
  std::vector<uint8_t> gone;
  Join(a, 1, 40001, SameHostPath::kSharedMemory, [&](uint8_t owner) { gone.push_back(owner); });
  Join(*b, 2, 40002);
  SendNumbered(*a.transport, address_, 0, 1, 100);
  ASSERT_EQ(ReceiveNumbered(*b->transport, 1, 1'000'000'000).size(), 1u);
  std::vector<std::vector<uint8_t>> payloads;
  PollFor(*a.transport, 0, &payloads);
  EXPECT_TRUE(gone.empty());
  b.reset();  // B exits: its connection hangs up
  for (int i = 0; i < 50 && gone.empty(); ++i) a.transport->Poll([](const InDatagram&) {}, 100'000'000);
  EXPECT_EQ(gone, (std::vector<uint8_t>{2}));
  // Packets for a number nobody listens under: reported once (2 was already), then no more.
  SendNumbered(*a.transport, address_, 0, 3, 100);
  const auto packet = DataPacket(WithOwner24(9, 0x11), 1);
  const OutDatagram to_nobody{{address_, kRoceV2UdpPort}, 0xc000, packet};
  for (int i = 0; i < 3; ++i) ASSERT_EQ(a.transport->Send({&to_nobody, 1}), 1);
  a.transport->Poll([](const InDatagram&) {}, 0);
  EXPECT_EQ(gone, (std::vector<uint8_t>{2, 9}));
  // A newcomer with number 2: once reached, its going is news again.
  auto c = std::make_unique<Member>();
  Join(*c, 2, 40003);
  SendNumbered(*a.transport, address_, 5, 1, 100);
  ASSERT_EQ(ReceiveNumbered(*c->transport, 1, 1'000'000'000).size(), 1u);
  c.reset();
  for (int i = 0; i < 50 && gone.size() < 3; ++i) a.transport->Poll([](const InDatagram&) {}, 100'000'000);
  EXPECT_EQ(gone, (std::vector<uint8_t>{2, 9, 2}));
}

TEST_F(HostDeviceTransportTest, SameHostPathUdpSendsEverythingByUdp) {
  Member a, b;
  Join(a, 1, 40001, SameHostPath::kUdp);
  Join(b, 2, 40002);
  SendNumbered(*a.transport, address_, 0, 2, 100);
  EXPECT_EQ(a.sender->sent.size(), 2u);
  EXPECT_EQ(a.transport->peer_sent(), 0u);
}

TEST_F(HostDeviceTransportTest, AReceiverWithoutRingsKeepsItsSendersOnTheConnection) {
  Member a, b;
  Join(a, 1, 40001);
  Join(b, 2, 40002, SameHostPath::kUnixSocket);
  SendNumbered(*a.transport, address_, 0, 1, 100);
  ASSERT_EQ(ReceiveNumbered(*b.transport, 1, 1'000'000'000).size(), 1u);
  SendNumbered(*a.transport, address_, 1, 10, 100);
  EXPECT_EQ(a.transport->ring_sent(), 0u);
  EXPECT_EQ(ReceiveNumbered(*b.transport, 10, 1'000'000'000).size(), 10u);
}

TEST_F(HostDeviceTransportTest, DirectAccessGoesToATableThatCameWithTheRingOfferUntilItsProcessHangsUp) {
  Member a, b;
  Join(a, 1, 40001);
  Join(b, 2, 40002);
  ASSERT_EQ(a.transport->EnableDirectAccess(), 0);
  ASSERT_EQ(b.transport->EnableDirectAccess(), 0);
  const uint32_t a_qpn = WithOwner24(1, 0x11), b_qpn = WithOwner24(2, 0x22), rkey = 0x4217;
  uint8_t target[64] = {};
  b.transport->PublishQp({b_qpn, a_qpn, 3, direct_rights::kWrite | direct_rights::kRead});
  b.transport->PublishRegion({rkey, 3, direct_rights::kWrite, 0x9000, sizeof target, target});
  const UdpEndpoint device{address_, kRoceV2UdpPort};
  const uint8_t bytes[] = {1, 2, 3, 4};
  const std::span<const uint8_t> pieces[] = {bytes};
  // Before B has answered A's connection there is no table: packets.
  a.transport->ConnectAhead(device, b_qpn);
  EXPECT_FALSE(a.transport->Write(device, b_qpn, a_qpn, rkey, 0x9008, pieces, 4));
  b.transport->Poll([](const InDatagram&) {}, 0);  // B accepts and offers its ring and table
  bool written = false;
  for (int i = 0; i < 100 && !written; ++i) {
    written = a.transport->Write(device, b_qpn, a_qpn, rkey, 0x9008, pieces, 4);
    if (!written) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_TRUE(written);
  EXPECT_EQ(std::memcmp(target + 8, bytes, 4), 0);
  EXPECT_EQ(a.transport->direct_bytes(), 4u);
  // What B's table refuses is not written: another QP of A, a right the region lacks, a window's key; a key withdrawn.
  EXPECT_FALSE(a.transport->Write(device, b_qpn, a_qpn + 1, rkey, 0x9008, pieces, 4));
  uint8_t back[4];
  const std::span<uint8_t> into[] = {back};
  EXPECT_FALSE(a.transport->Read(device, b_qpn, a_qpn, rkey, 0x9008, into, 4));
  EXPECT_FALSE(a.transport->Write(device, b_qpn, a_qpn, rkey + 0x100, 0x9008, pieces, 4));
  // Towards another address, or ourselves: never.
  EXPECT_FALSE(a.transport->Write({address_, 9}, b_qpn, a_qpn, rkey, 0x9008, pieces, 4));
  EXPECT_FALSE(a.transport->Write(device, a_qpn, a_qpn, rkey, 0x9008, pieces, 4));
  b.transport->WithdrawRegion(rkey);
  EXPECT_FALSE(a.transport->Write(device, b_qpn, a_qpn, rkey, 0x9008, pieces, 4));
  b.transport->PublishRegion({rkey, 3, direct_rights::kWrite, 0x9000, sizeof target, target});
  EXPECT_TRUE(a.transport->Write(device, b_qpn, a_qpn, rkey, 0x9000, pieces, 4));
  // B goes: A notices the hang-up of its connection when it looks at its sockets, and uses B's table no more.
  b.transport.reset();
  for (int i = 0; i < 100 && a.transport->Write(device, b_qpn, a_qpn, rkey, 0x9000, pieces, 4); ++i) {
    a.transport->Poll([](const InDatagram&) {}, 1'000'000);
  }
  EXPECT_FALSE(a.transport->Write(device, b_qpn, a_qpn, rkey, 0x9000, pieces, 4));
}

TEST_F(HostDeviceTransportTest, AWriteIsSharedWithATargetThatTakesItsHalfAndEveryByteArrives) {
  Member a, b;
  const UdpEndpoint device{address_, kRoceV2UdpPort};
  // Each WRITE from a buffer of its own to a range of its own, checked once B's thread has ended: both processes
  // are one here, and the table's atomics that order A's and B's copies sit at two addresses (two mappings), which
  // a thread sanitizer does not see as one.
  constexpr size_t kWrites = 16, kBytes = 128 << 10, kCut = 1000;
  std::vector<uint8_t> target(kWrites * kBytes + 64);
  JoinForDirectWrites(a, b, target);
  a.transport->SetOfferTakeNs(10'000'000'000);  // B is never too late: every WRITE is shared
  std::vector<std::vector<uint8_t>> messages(kWrites, std::vector<uint8_t>(kBytes));
  for (size_t k = 0; k < kWrites; ++k)
    for (size_t i = 0; i < kBytes; ++i) messages[k][i] = uint8_t(i * 7 + k);
  std::atomic<bool> stop{false};
  std::atomic<int> delivered{0};
  std::thread b_polls([&] {
    while (!stop.load()) b.transport->Poll([&](const InDatagram&) { delivered.fetch_add(1); }, 0);
  });
  for (size_t k = 0; k < kWrites; ++k) {
    // Two pieces, the second holding the whole second half; ranges at odd offsets.
    const std::span<const uint8_t> pieces[] = {{messages[k].data(), kCut},
                                               {messages[k].data() + kCut, kBytes - kCut}};
    ASSERT_TRUE(a.transport->Write(device, kTargetQpn, kWriterQpn, kTargetRkey, k * kBytes + 8, pieces, kBytes)) << k;
  }
  stop = true;
  b_polls.join();
  for (size_t k = 0; k < kWrites; ++k)
    EXPECT_EQ(std::memcmp(target.data() + k * kBytes + 8, messages[k].data(), kBytes), 0) << "write " << k;
  EXPECT_EQ(a.transport->shared_writes(), kWrites);
  EXPECT_EQ(b.transport->halves_copied(), kWrites);
  EXPECT_EQ(delivered.load(), 0);  // the offers' notices are the transport's, not the device's
}

TEST_F(HostDeviceTransportTest, ATargetThatDoesNotTakeItsHalfInTimeGetsItFromTheInitiator) {
  Member a, b;
  const UdpEndpoint device{address_, kRoceV2UdpPort};
  std::vector<uint8_t> target(256 << 10);
  JoinForDirectWrites(a, b, target);
  // B does not look at its ring: every offer is taken back and A copies it all.
  std::vector<uint8_t> message(128 << 10);
  for (int k = 0; k < 4; ++k) {
    for (size_t i = 0; i < message.size(); ++i) message[i] = uint8_t(i * 13 + k);
    const std::span<const uint8_t> pieces[] = {message};
    ASSERT_TRUE(a.transport->Write(device, kTargetQpn, kWriterQpn, kTargetRkey, 64 + k, pieces, message.size()));
    ASSERT_EQ(std::memcmp(target.data() + 64 + k, message.data(), message.size()), 0) << k;
  }
  EXPECT_EQ(a.transport->shared_writes(), 0u);
  // Their notices, read later, find nothing to take: B copies nothing over what A wrote.
  const std::vector<uint8_t> before = target;
  for (int i = 0; i < 3; ++i) b.transport->Poll([](const InDatagram&) { ADD_FAILURE() << "a datagram"; }, 0);
  EXPECT_EQ(b.transport->halves_copied(), 0u);
  EXPECT_EQ(target, before);
}

TEST_F(HostDeviceTransportTest, ADirectSendGoesIntoTheRingInOrderWithPacketsAndCountsInTheWindow) {
  Member a, b;
  Join(a, 1, 40001);
  Join(b, 2, 40002);
  ASSERT_EQ(a.transport->EnableDirectAccess(), 0);
  ASSERT_EQ(b.transport->EnableDirectAccess(), 0);
  const uint32_t a_qpn = WithOwner24(1, 0x11), b_qpn = WithOwner24(2, 0x22);
  b.transport->PublishQp({b_qpn, a_qpn, 3, direct_rights::kSend});
  b.transport->OpenReceives(b_qpn, 9);
  const uint32_t lengths[] = {16, 16};
  b.transport->PublishReceives(b_qpn, 0, 0, lengths);
  const UdpEndpoint device{address_, kRoceV2UdpPort};
  const uint8_t head[] = {1, 2, 3}, tail[] = {4, 5};
  const std::span<const uint8_t> pieces[] = {head, tail};
  a.transport->ConnectAhead(device, b_qpn);
  b.transport->Poll([](const InDatagram&) {}, 0);  // B accepts and offers its ring and table
  DirectSend send;
  send.dest_qpn = b_qpn;
  send.src_qpn = a_qpn;
  bool sent = false;
  for (int i = 0; i < 100 && !sent; ++i) {
    sent = a.transport->SendMessage(device, send, pieces, 5);
    if (!sent) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_TRUE(sent);
  EXPECT_EQ(send.epoch, 9u);
  EXPECT_EQ(send.index, 0u);
  // A packet after it, then a second SEND: B reads them in that order.
  const auto packet = DataPacket(b_qpn, 0x33);
  const OutDatagram dg{device, 4000, packet};
  ASSERT_EQ(a.transport->Send({&dg, 1}), 1);
  DirectSend second = send;
  ASSERT_TRUE(a.transport->SendMessage(device, second, pieces, 5));
  EXPECT_EQ(second.index, 1u);
  DirectSend third = send;
  EXPECT_FALSE(a.transport->SendMessage(device, third, pieces, 5));  // no third WQE shown
  EXPECT_EQ(b.transport->DirectSends(b_qpn), 2u);
  std::vector<std::vector<uint8_t>> payloads;
  const std::vector<InDatagram> got = PollFor(*b.transport, 3, &payloads);
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(got[0].record, RingRecord::kDirectSend);
  EXPECT_EQ(got[1].record, RingRecord::kPacket);
  EXPECT_EQ(got[2].record, RingRecord::kDirectSend);
  EXPECT_EQ(payloads[1], packet);
  for (size_t k : {size_t{0}, size_t{2}}) {
    const auto d = DirectSend::Decode(payloads[k]);
    ASSERT_TRUE(d);
    EXPECT_EQ(d->index, k == 0 ? 0u : 1u);
    EXPECT_EQ(std::vector<uint8_t>(payloads[k].begin() + DirectSend::kSize, payloads[k].end()),
              (std::vector<uint8_t>{1, 2, 3, 4, 5}));
  }
}

TEST_F(HostDeviceTransportTest, ADirectSendIsMalformedFromTheService) {
  Member a;
  Join(a, 1, 40001);
  ForwardHeader h;
  h.src = {address_, 4791};
  h.dst = {address_, kRoceV2UdpPort};
  h.record = RingRecord::kDirectSend;
  std::vector<uint8_t> bytes(ForwardHeader::kSize + DirectSend::kSize + 4, 0);
  h.Encode(bytes.data());
  DirectSend{}.Encode(bytes.data() + ForwardHeader::kSize);
  ASSERT_EQ(send(a.service_end, bytes.data(), bytes.size(), 0), ssize_t(bytes.size()));
  int delivered = 0;
  for (int i = 0; i < 5; ++i) a.transport->Poll([&](const InDatagram&) { ++delivered; }, 10'000'000);
  EXPECT_EQ(delivered, 0);
  EXPECT_EQ(a.transport->malformed(), 1u);
}

TEST_F(HostDeviceTransportTest, ATableGoesOutOfUseWhenItsProcessExitsThoughAChildHoldsItsConnection) {
  Member a;
  Join(a, 1, 40001);
  ASSERT_EQ(a.transport->EnableDirectAccess(), 0);
  const uint32_t a_qpn = WithOwner24(1, 0x11), b_qpn = WithOwner24(2, 0x22), rkey = 0x4217;
  static uint8_t target[64];
  int go[2], ready[2];
  ASSERT_EQ(pipe(go), 0);
  ASSERT_EQ(pipe(ready), 0);
  const pid_t b_pid = fork();
  ASSERT_GE(b_pid, 0);
  if (b_pid == 0) {
    // Process B: publishes, answers A's connection, and when told, forks a child that keeps every descriptor of B
    // (its end of A's connection among them) and exits.
    Member b;
    Join(b, 2, 40002);
    if (b.transport->EnableDirectAccess() != 0) _exit(2);
    b.transport->PublishQp({b_qpn, a_qpn, 3, direct_rights::kWrite});
    b.transport->PublishRegion({rkey, 3, direct_rights::kWrite, 0x9000, sizeof target, target});
    char c = 'r';
    if (write(ready[1], &c, 1) != 1) _exit(2);
    pollfd p{go[0], POLLIN, 0};
    while (poll(&p, 1, 0) == 0) b.transport->Poll([](const InDatagram&) {}, 1'000'000);
    const pid_t holder = fork();
    if (holder == 0) {
      sleep(10);
      _exit(0);
    }
    if (write(ready[1], &holder, sizeof holder) != sizeof holder) _exit(2);
    _exit(0);
  }
  char c;
  ASSERT_EQ(read(ready[0], &c, 1), 1);
  const UdpEndpoint device{address_, kRoceV2UdpPort};
  const uint8_t bytes[] = {1, 2, 3, 4};
  const std::span<const uint8_t> pieces[] = {bytes};
  a.transport->ConnectAhead(device, b_qpn);
  bool written = false;
  for (int i = 0; i < 2000 && !written; ++i) {
    written = a.transport->Write(device, b_qpn, a_qpn, rkey, 0x9000, pieces, 4);
    if (!written) usleep(1000);
  }
  ASSERT_TRUE(written);
  EXPECT_EQ(a.transport->direct_peers(), 1u);
  ASSERT_EQ(write(go[1], "g", 1), 1);
  pid_t holder = 0;
  ASSERT_EQ(read(ready[0], &holder, sizeof holder), ssize_t(sizeof holder));
  int status = 0;
  ASSERT_EQ(waitpid(b_pid, &status, 0), b_pid);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  // B is gone; its child still holds B's end of the connection, so no hang-up comes: B's exit itself must be seen.
  for (int i = 0; i < 200 && a.transport->direct_peers() > 0; ++i) a.transport->Poll([](const InDatagram&) {}, 10'000'000);
  EXPECT_EQ(a.transport->direct_peers(), 0u);
  EXPECT_FALSE(a.transport->Write(device, b_qpn, a_qpn, rkey, 0x9000, pieces, 4));
  kill(holder, SIGKILL);
  for (int fd : {go[0], go[1], ready[0], ready[1]}) close(fd);
}

TEST_F(HostDeviceTransportTest, OnlyWhatGoesToAnotherProcessOfTheHostMayLeaveItsIcrcUnsealed) {
  Member a, u;
  Join(a, 1, 40001);
  Join(u, 3, 40003, SameHostPath::kUnixSocket);
  const UdpEndpoint device{address_, kRoceV2UdpPort};
  const uint32_t data_qpn = WithOwner24(2, 0x11);
  EXPECT_TRUE(a.transport->IcrcIsRead(device, data_qpn));  // not asked for: sealed
  a.transport->LeaveUnreadIcrcsUnsealed();
  u.transport->LeaveUnreadIcrcsUnsealed();
  EXPECT_FALSE(a.transport->IcrcIsRead(device, data_qpn));
  EXPECT_FALSE(a.transport->IcrcIsRead(device, WithOwner24(1, 0x12)));  // our own: through our ring too
  EXPECT_TRUE(a.transport->IcrcIsRead(device, kGsiQpn));                 // CM MADs: by UDP to the service
  EXPECT_TRUE(a.transport->IcrcIsRead(device, kMulticastQpn));
  EXPECT_TRUE(a.transport->IcrcIsRead(device, 0x11));                    // no owner: not a process of the host
  EXPECT_TRUE(a.transport->IcrcIsRead({address_, 9}, data_qpn));         // another port: another device
  EXPECT_TRUE(u.transport->IcrcIsRead(device, data_qpn));                // only on the shared-memory path
}

// The host's other addresses (SetOtherHostAddresses): a packet to one of them for a process of the host goes straight
// to that process, as one to local() does; once the address is gone from the list it goes by UDP again. The list is
// read without a lock while another thread replaces it (TSan checks the handover).
TEST_F(HostDeviceTransportTest, APacketToAnotherOfTheHostsAddressesGoesStraightToItsProcess) {
  Member a, b;
  Join(a, 1, 40001);
  Join(b, 2, 40002);
  const UdpEndpoint other{IpAddress::V4(address_.v4() ^ 0x00ff0000u), kRoceV2UdpPort};
  const auto packet = DataPacket(WithOwner24(2, 0x11), 7);
  const OutDatagram out{other, 0xc000, packet};
  ASSERT_EQ(a.transport->Send({&out, 1}), 1);
  ASSERT_EQ(a.sender->sent.size(), 1u);  // not one of the host's: by UDP
  a.transport->SetOtherHostAddresses({IpAddress::V4(0x0a000001), other.addr});
  ASSERT_EQ(a.transport->Send({&out, 1}), 1);
  std::vector<std::vector<uint8_t>> payloads;
  const auto got = PollFor(*b.transport, 1, &payloads);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(payloads[0], packet);
  EXPECT_EQ(got[0].dst, other);
  EXPECT_EQ(a.sender->sent.size(), 1u);
  EXPECT_EQ(a.transport->peer_sent(), 1u);
  a.transport->SetOtherHostAddresses({});
  ASSERT_EQ(a.transport->Send({&out, 1}), 1);
  EXPECT_EQ(a.sender->sent.size(), 2u);

  // Each list a change makes is kept until the transport goes: a bounded number of changes.
  a.transport->LeaveUnreadIcrcsUnsealed();
  std::atomic<bool> done{false};
  std::thread changer([&] {
    for (int i = 0; i < 2000; ++i)
      a.transport->SetOtherHostAddresses(i % 2 ? std::vector<IpAddress>{other.addr} : std::vector<IpAddress>{});
    done = true;
  });
  size_t looks = 0;
  while (!done.load()) looks += a.transport->IcrcIsRead(other, WithOwner24(2, 0x11)) ? 1 : 0;
  changer.join();
  EXPECT_FALSE(a.transport->IcrcIsRead(other, WithOwner24(2, 0x11)));  // the last list names it
  (void)looks;
}

TEST_F(HostDeviceTransportTest, NoDirectAccessOnTheUnixOrUdpPaths) {
  Member a, b;
  Join(a, 1, 40001, SameHostPath::kUnixSocket);
  Join(b, 2, 40002, SameHostPath::kUdp);
  EXPECT_EQ(a.transport->EnableDirectAccess(), -ENOTSUP);
  EXPECT_EQ(b.transport->EnableDirectAccess(), -ENOTSUP);
}

}  // namespace
}  // namespace uroce::wire
