// DatagramReceiver's batch: one recvmsg after an empty poll (a ping-pong's datagram comes alone), doubling while
// receives come back full (a stream).
#include "wire/udp_socket.h"

#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <vector>

#include <gtest/gtest.h>

namespace uroce::wire {
namespace {

class DatagramReceiverTest : public testing::Test {
 protected:
  void SetUp() override {
    rx_ = OpenRoceUdpSocket({IpAddress::V4(0x7f000001), 0}, 1 << 20, &rx_local_);
    tx_ = OpenRoceUdpSocket({IpAddress::V4(0x7f000001), 0}, 1 << 20, &tx_local_);
    ASSERT_GE(rx_, 0);
    ASSERT_GE(tx_, 0);
    ASSERT_EQ(receiver_.Init(64, 9216, /*gro=*/false), 0);
  }
  void TearDown() override {
    if (rx_ >= 0) close(rx_);
    if (tx_ >= 0) close(tx_);
  }
  // Queues datagrams numbered first .. first + count - 1 on the receiving socket (loopback delivers within sendto).
  void Queue(uint32_t first, uint32_t count) {
    sockaddr_storage to;
    socklen_t to_len;
    ASSERT_EQ(ToSockaddr(rx_local_, AF_INET, &to, &to_len), 0);
    for (uint32_t i = first; i < first + count; ++i) {
      uint8_t payload[64] = {};
      std::memcpy(payload, &i, sizeof i);
      ASSERT_EQ(sendto(tx_, payload, sizeof payload, 0, reinterpret_cast<sockaddr*>(&to), to_len),
                ssize_t(sizeof payload));
    }
  }
  // One Receive; appends the numbers of what it delivered. Returns its result.
  int ReceiveOnce() {
    return receiver_.Receive(
        rx_,
        [&](const InDatagram& in) {
          uint32_t n = 0;
          std::memcpy(&n, in.payload.data(), sizeof n);
          numbers_.push_back(n);
          EXPECT_EQ(in.src, tx_local_);
          EXPECT_EQ(in.dst, rx_local_);  // bound to one address: no IP_PKTINFO needed to know it
        },
        rx_local_, counters_);
  }

  int rx_ = -1, tx_ = -1;
  UdpEndpoint rx_local_, tx_local_;
  DatagramReceiver receiver_;
  UdpCounterSet counters_;
  std::vector<uint32_t> numbers_;
};

TEST_F(DatagramReceiverTest, TakesOneAfterAnEmptyPollAndDoublesWhileReceivesComeBackFull) {
  Queue(0, 100);
  std::vector<int> per_receive;
  while (numbers_.size() < 100) {
    const int n = ReceiveOnce();
    ASSERT_GT(n, 0);
    per_receive.push_back(n);
  }
  EXPECT_EQ(per_receive, (std::vector<int>{1, 2, 4, 8, 16, 32, 37}));  // 64 at most: the batch Init was given
  EXPECT_EQ(ReceiveOnce(), -EAGAIN);
  // After the empty poll, one datagram per receive again, then two.
  Queue(100, 3);
  EXPECT_EQ(ReceiveOnce(), 1);
  EXPECT_EQ(ReceiveOnce(), 2);
  ASSERT_EQ(numbers_.size(), 103u);
  for (uint32_t i = 0; i < 103; ++i) EXPECT_EQ(numbers_[i], i);  // in arrival order, none lost or repeated
}

}  // namespace
}  // namespace uroce::wire
