// DatagramReceiver's batch: one recvmsg after an empty poll (a ping-pong's datagram comes alone), doubling while
// receives come back full (a stream).
#include "wire/udp_socket.h"

#include <netinet/udp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <vector>

#include <gtest/gtest.h>

namespace uroce::wire {
namespace {

// What DeliverReceived hands over for one receive of `payload` from 127.0.0.9:4791, split at `gso_size` (0: no
// UDP_GRO control message): each datagram's first byte (its BTH opcode) in delivery order.
std::vector<uint8_t> DeliveredOpcodes(const std::vector<uint8_t>& payload, int gso_size, bool responses_first = true) {
  sockaddr_storage from;
  socklen_t from_len;
  EXPECT_EQ(ToSockaddr({IpAddress::V4(0x7f000009), 4791}, AF_INET, &from, &from_len), 0);
  alignas(cmsghdr) uint8_t control[CMSG_SPACE(sizeof(int))] = {};
  msghdr msg{};
  msg.msg_name = &from;
  msg.msg_namelen = from_len;
  if (gso_size > 0) {
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_UDP;
    c->cmsg_type = UDP_GRO;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(c), &gso_size, sizeof gso_size);
  }
  std::vector<uint8_t> order;
  UdpCounterSet counters;
  const int n = DeliverReceived([&](const InDatagram& d) { order.push_back(d.payload[0]); }, msg, payload, 0,
                                {IpAddress::V4(0x7f000001), 4791}, 9216, responses_first, counters);
  EXPECT_EQ(n, int(order.size()));
  return order;
}

// Datagrams of `size` bytes with these first bytes, back to back (as a UDP_GRO run holds them).
std::vector<uint8_t> BackToBack(std::initializer_list<uint8_t> opcodes, size_t size) {
  std::vector<uint8_t> out;
  for (uint8_t op : opcodes) {
    out.push_back(op);
    out.resize(out.size() + size - 1, 0);
  }
  return out;
}

// With responses_first, in a UDP_GRO run acknowledgements and READ/atomic responses are handed over before requests,
// each kind in its order: a uroce peer sends the ACK it held for our request behind its own next request, and our
// send must complete before the receive of its answer, as on hardware.
TEST(DeliverReceived, ResponsesInARunComeBeforeItsRequests) {
  constexpr uint8_t kSend = 0x04, kWriteOnly = 0x0A, kAck = 0x11, kReadLast = 0x0F, kAtomicAck = 0x12;
  EXPECT_EQ(DeliveredOpcodes(BackToBack({kSend, kAck}, 20), 20), (std::vector<uint8_t>{kAck, kSend}));
  EXPECT_EQ(DeliveredOpcodes(BackToBack({kWriteOnly, kAck, kSend, kReadLast, kAtomicAck}, 40), 40),
            (std::vector<uint8_t>{kAck, kReadLast, kAtomicAck, kWriteOnly, kSend}));
  // The last segment of a run may be shorter: [WRITE 40, ACK 20] as one run.
  std::vector<uint8_t> uneven = BackToBack({kWriteOnly}, 40);
  const std::vector<uint8_t> ack = BackToBack({kAck}, 20);
  uneven.insert(uneven.end(), ack.begin(), ack.end());
  EXPECT_EQ(DeliveredOpcodes(uneven, 40), (std::vector<uint8_t>{kAck, kWriteOnly}));
  // Requests alone keep their order, and a datagram that is not a run is handed over as it is.
  EXPECT_EQ(DeliveredOpcodes(BackToBack({kSend, kWriteOnly, kSend}, 64), 64),
            (std::vector<uint8_t>{kSend, kWriteOnly, kSend}));
  EXPECT_EQ(DeliveredOpcodes(BackToBack({kSend}, 64), 0), (std::vector<uint8_t>{kSend}));
  // Without responses_first (a transport's default) a run keeps its order.
  EXPECT_EQ(DeliveredOpcodes(BackToBack({kSend, kAck}, 20), 20, false), (std::vector<uint8_t>{kSend, kAck}));
}

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
