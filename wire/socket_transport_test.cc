// What only SocketTransport has: its options and its batching of recvmmsg / sendmmsg. The cases every UDP transport
// passes are in udp_transport_test.cc.
#include "wire/socket_transport.h"

#include <cerrno>
#include <memory>
#include <vector>

#include <gtest/gtest.h>

#include "wire/udp_test_util.h"

namespace uroce::wire {
namespace {

TEST(SocketTransportTest, BadOptions) {
  std::unique_ptr<SocketTransport> t;
  SocketTransport::Options bad;
  bad.batch = 0;
  EXPECT_EQ(SocketTransport::Create(kLoopbackAnyPort, bad, &t), -EINVAL);
  bad = {};
  bad.max_datagram = 0;
  EXPECT_EQ(SocketTransport::Create(kLoopbackAnyPort, bad, &t), -EINVAL);
  EXPECT_FALSE(t);
}

// A Poll delivers at most one recvmmsg batch; the next Poll takes the rest, in order.
TEST(SocketTransportTest, PollDeliversOneBatchAtATime) {
  SocketTransport::Options o;
  o.batch = 4;
  o.udp_offloads = false;  // one datagram per receive (with UDP_GRO, one receive may return all ten)
  std::unique_ptr<SocketTransport> rx, tx;
  ASSERT_EQ(SocketTransport::Create(kLoopbackAnyPort, o, &rx), 0);
  ASSERT_EQ(SocketTransport::Create(kLoopbackAnyPort, o, &tx), 0);
  std::vector<std::vector<uint8_t>> ps;
  for (uint32_t i = 0; i < 10; ++i) ps.push_back(Numbered(i, 32));
  std::vector<OutDatagram> batch;
  for (auto& p : ps) batch.push_back({rx->local(), 0, p});
  ASSERT_EQ(tx->Send(batch), 10);  // three sendmmsg calls of at most 4
  std::vector<uint32_t> order;
  const int first = rx->Poll([&](const InDatagram& in) { order.push_back(NumberOf(in.payload)); }, 1'000'000'000);
  EXPECT_GE(first, 1);
  EXPECT_LE(first, 4);
  for (const Received& r : ReceiveN(*rx, 10 - order.size())) order.push_back(NumberOf(r.payload));
  ASSERT_EQ(order.size(), 10u);
  for (uint32_t i = 0; i < 10; ++i) EXPECT_EQ(order[i], i);
  EXPECT_EQ(tx->counters().packets_sent, 10u);
  EXPECT_EQ(tx->counters().bytes_sent, 320u);
}

// A datagram the kernel refuses in the middle of a batch is counted and skipped; the ones after it still leave.
TEST(SocketTransportTest, RefusedDatagramInABatchIsCountedAndTheRestSent) {
  std::unique_ptr<SocketTransport> rx, tx;
  ASSERT_EQ(SocketTransport::Create(kLoopbackAnyPort, &rx), 0);
  ASSERT_EQ(SocketTransport::Create(kLoopbackAnyPort, &tx), 0);
  const auto p0 = Numbered(0, 16), p1 = Numbered(1, 16), p2 = Numbered(2, 16);
  // Broadcast without SO_BROADCAST: EACCES (udp(7)).
  OutDatagram batch[3] = {{rx->local(), 0, p0}, {UdpEndpoint{IpAddress::V4(0xffffffff), 9}, 0, p1}, {rx->local(), 0, p2}};
  ASSERT_EQ(tx->Send(batch), 3);
  auto got = ReceiveN(*rx, 2);
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].payload, p0);
  EXPECT_EQ(got[1].payload, p2);
  const UdpCounters c = tx->counters();
  EXPECT_EQ(c.packets_sent, 2u);
  EXPECT_EQ(c.send_errors, 1u);
  EXPECT_EQ(c.last_send_error, -EACCES);
}

}  // namespace
}  // namespace uroce::wire
