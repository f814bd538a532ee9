// What a UDP_SEGMENT run really puts on a link, where the kernel splits it in software as it would for a NIC without
// UDP segmentation offload: every segment a datagram of its own with IPv4 Identification k (k = 0, 1, ... within the
// run), and every RoCE packet's ICRC correct for the Identification it carries. On loopback a run normally crosses
// whole, so this test runs in a network namespace of its own (CLONE_NEWNET: as root, as CI is; skipped otherwise)
// whose lo has tx-udp-segmentation switched off (the SIOCETHTOOL equivalent of `ethtool -K lo
// tx-udp-segmentation off`), and reads the segments with a packet socket there.
#include <arpa/inet.h>
#include <linux/ethtool.h>
#include <linux/sockios.h>
#include <net/if.h>
#include <netinet/ip.h>
#include <netinet/udp.h>
#include <poll.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "wire/icrc.h"
#include "wire/socket_transport.h"
#include "wire/udp_test_util.h"
#include "wire/uring_transport.h"

namespace uroce::wire {
namespace {

// Brings lo up and switches off its UDP segmentation offload. Returns "" or why not.
std::string PrepareLoopback() {
  const int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return std::string("socket: ") + strerror(errno);
  std::string error;
  ifreq ifr{};
  std::strncpy(ifr.ifr_name, "lo", IFNAMSIZ - 1);
  if (ioctl(fd, SIOCGIFFLAGS, &ifr) < 0) error = std::string("SIOCGIFFLAGS: ") + strerror(errno);
  ifr.ifr_flags |= IFF_UP;
  if (error.empty() && ioctl(fd, SIOCSIFFLAGS, &ifr) < 0) error = std::string("SIOCSIFFLAGS: ") + strerror(errno);
  // The feature's bit is found by name in the ETH_SS_FEATURES string set.
  uint32_t count = 0;
  if (error.empty()) {
    // ethtool_sset_info ends in a flexible array: one uint32_t for the one set asked about.
    alignas(ethtool_sset_info) uint8_t buf[sizeof(ethtool_sset_info) + sizeof(uint32_t)] = {};
    auto* sset = reinterpret_cast<ethtool_sset_info*>(buf);
    sset->cmd = ETHTOOL_GSSET_INFO;
    sset->sset_mask = 1ull << ETH_SS_FEATURES;
    ifr.ifr_data = reinterpret_cast<char*>(sset);
    if (ioctl(fd, SIOCETHTOOL, &ifr) < 0 || sset->sset_mask == 0) {
      error = std::string("ETHTOOL_GSSET_INFO: ") + strerror(errno);
    }
    std::memcpy(&count, buf + sizeof(ethtool_sset_info), sizeof count);
  }
  int bit = -1;
  if (error.empty()) {
    std::vector<uint8_t> buf(sizeof(ethtool_gstrings) + size_t(count) * ETH_GSTRING_LEN);
    auto* strings = reinterpret_cast<ethtool_gstrings*>(buf.data());
    strings->cmd = ETHTOOL_GSTRINGS;
    strings->string_set = ETH_SS_FEATURES;
    strings->len = count;
    ifr.ifr_data = reinterpret_cast<char*>(strings);
    if (ioctl(fd, SIOCETHTOOL, &ifr) < 0) error = std::string("ETHTOOL_GSTRINGS: ") + strerror(errno);
    for (uint32_t i = 0; error.empty() && i < count; ++i) {
      if (std::strncmp(reinterpret_cast<const char*>(strings->data) + size_t(i) * ETH_GSTRING_LEN,
                       "tx-udp-segmentation", ETH_GSTRING_LEN) == 0) {
        bit = int(i);
      }
    }
    if (error.empty() && bit < 0) error = "the kernel names no tx-udp-segmentation feature";
  }
  if (error.empty()) {
    const uint32_t blocks = (count + 31) / 32;
    std::vector<uint8_t> buf(sizeof(ethtool_sfeatures) + blocks * sizeof(ethtool_set_features_block));
    auto* set = reinterpret_cast<ethtool_sfeatures*>(buf.data());
    set->cmd = ETHTOOL_SFEATURES;
    set->size = blocks;
    set->features[bit / 32].valid = 1u << (bit % 32);
    set->features[bit / 32].requested = 0;
    ifr.ifr_data = reinterpret_cast<char*>(set);
    if (ioctl(fd, SIOCETHTOOL, &ifr) < 0) error = std::string("ETHTOOL_SFEATURES: ") + strerror(errno);
  }
  close(fd);
  return error;
}

std::string SetLoopbackMtu(int mtu) {
  const int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return std::string("socket: ") + strerror(errno);
  ifreq ifr{};
  std::strncpy(ifr.ifr_name, "lo", IFNAMSIZ - 1);
  ifr.ifr_mtu = mtu;
  std::string error;
  if (ioctl(fd, SIOCSIFMTU, &ifr) < 0) error = std::string("SIOCSIFMTU: ") + strerror(errno);
  close(fd);
  return error;
}

class SegmentedWireTest : public testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (unshare(CLONE_NEWNET) != 0) {
      skip_ = std::string("cannot create a network namespace: ") + strerror(errno);
      return;
    }
    skip_ = PrepareLoopback();
  }
  void SetUp() override {
    if (!skip_.empty()) GTEST_SKIP() << skip_;
  }

  // Sends a run of 20 RoCE packets of 1036 bytes and a shorter last one from `a` to `b`, and checks each segment on
  // the wire: its own datagram, Identification k, ICRC correct for it; and that `b` receives all of them.
  template <typename T>
  void CheckRun(T& a, T& b) {
    const int ps = CaptureUdpOnLoopback(b.local().port);
    ASSERT_GE(ps, 0) << strerror(-ps);
    constexpr uint32_t kCount = 21;
    const std::vector<std::vector<uint8_t>> packets = SealedRun(a, b.local(), kCount);
    std::vector<OutDatagram> batch;
    for (auto& p : packets) batch.push_back({b.local(), 0, p});
    ASSERT_EQ(a.Send(batch), int(kCount));
    ASSERT_TRUE(a.segmenting()) << "the kernel refused UDP_SEGMENT";
    std::vector<uint16_t> ids;
    while (ids.size() < kCount) {
      pollfd pfd{ps, POLLIN, 0};
      ASSERT_GT(poll(&pfd, 1, 5000), 0) << "captured " << ids.size() << " of " << kCount;
      uint8_t frame[2048];
      const ssize_t n = recv(ps, frame, sizeof frame, 0);
      ASSERT_GE(n, ssize_t(sizeof(iphdr) + sizeof(udphdr)));
      iphdr ip;
      std::memcpy(&ip, frame, sizeof ip);
      const size_t udp_at = ip.ihl * 4u;
      udphdr udp;
      std::memcpy(&udp, frame + udp_at, sizeof udp);
      const std::span<const uint8_t> roce(frame + udp_at + sizeof udp, size_t(n) - udp_at - sizeof udp);
      const uint32_t k = uint32_t(ids.size());
      ASSERT_EQ(roce.size(), packets[k].size()) << "segment " << k << " is not one RoCE packet";
      EXPECT_TRUE(ntohs(ip.frag_off) & IP_DF);
      ids.push_back(ntohs(ip.id));
      const Flow on_wire{{IpAddress::V4(ntohl(ip.saddr)), ntohs(udp.source)},
                         {IpAddress::V4(ntohl(ip.daddr)), ntohs(udp.dest)}, ntohs(ip.id)};
      EXPECT_TRUE(VerifyIcrc(on_wire, roce).ok) << "segment " << k << " with IP ID " << ntohs(ip.id);
      EXPECT_TRUE(std::equal(packets[k].begin(), packets[k].end() - 4, roce.begin())) << k;
    }
    close(ps);
    std::vector<uint16_t> want;
    for (uint16_t k = 0; k < kCount; ++k) want.push_back(k);
    EXPECT_EQ(ids, want);
    EXPECT_EQ(ReceiveN(b, kCount).size(), kCount);
  }

  static std::string skip_;
};
std::string SegmentedWireTest::skip_;

TEST_F(SegmentedWireTest, UringRunSegmentsCarryIdsZeroUpAndMatchingIcrcs) {
  std::unique_ptr<UringTransport> a, b;
  const int r = UringTransport::Create(kLoopbackAnyPort, &a);
  if (r == -ENOSYS || r == -EPERM) GTEST_SKIP() << "io_uring unavailable: " << strerror(-r);
  ASSERT_EQ(r, 0);
  ASSERT_EQ(UringTransport::Create(kLoopbackAnyPort, &b), 0);
  CheckRun(*a, *b);
}

TEST_F(SegmentedWireTest, SocketRunSegmentsCarryIdsZeroUpAndMatchingIcrcs) {
  std::unique_ptr<SocketTransport> a, b;
  ASSERT_EQ(SocketTransport::Create(kLoopbackAnyPort, &a), 0);
  ASSERT_EQ(SocketTransport::Create(kLoopbackAnyPort, &b), 0);
  CheckRun(*a, *b);
}

// A run whose segments exceed the path MTU (lo at 1300 bytes here, DF datagrams of 1400) is refused as a whole
// (EINVAL); SocketTransport then sends its datagrams one at a time so that each meets the error a lone datagram
// would, EMSGSIZE, counted; the transport keeps segmenting the runs that fit.
TEST_F(SegmentedWireTest, SocketRunAboveThePathMtuFailsAsItsDatagramsWould) {
  std::unique_ptr<SocketTransport> a, b;
  ASSERT_EQ(SocketTransport::Create(kLoopbackAnyPort, &a), 0);
  ASSERT_EQ(SocketTransport::Create(kLoopbackAnyPort, &b), 0);
  ASSERT_TRUE(a->segmenting());
  ASSERT_EQ(SetLoopbackMtu(1300), "");
  const auto big = Numbered(1, 1400);
  std::vector<OutDatagram> batch(3, OutDatagram{b->local(), 0, big, false});
  const int sent = a->Send(batch);
  ASSERT_EQ(SetLoopbackMtu(65536), "");
  EXPECT_EQ(sent, 3);
  const UdpCounters c = a->counters();
  EXPECT_EQ(c.packets_sent, 0u);
  EXPECT_EQ(c.send_errors, 3u);
  EXPECT_EQ(c.last_send_error, -EMSGSIZE);
  EXPECT_TRUE(a->segmenting());
  const auto fits = Numbered(2, 1000);
  batch.assign(3, OutDatagram{b->local(), 0, fits, false});
  ASSERT_EQ(a->Send(batch), 3);
  const auto got = ReceiveN(*b, 3);
  ASSERT_EQ(got.size(), 3u);
  for (const auto& r : got) EXPECT_EQ(r.payload, fits);
  EXPECT_EQ(a->counters().segmented_sends, 1u);
}

}  // namespace
}  // namespace uroce::wire
