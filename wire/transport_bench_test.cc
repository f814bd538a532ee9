#include "wire/transport_bench.h"

#include <gtest/gtest.h>

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>

namespace uroce::wire {
namespace {

TEST(TransportBenchTest, MeasuresBothPathsOverLoopback) {
  const TransportBenchResult r = RunTransportBench(4096, 0.2);
  if (r.error == -ENOSYS || r.error == -EPERM) GTEST_SKIP() << "io_uring unavailable";
  ASSERT_EQ(r.error, 0) << r.ToString();
  std::printf("%s", r.ToString().c_str());
  EXPECT_EQ(r.frame_bytes, 4096u);
  EXPECT_GT(r.uring.pps, 1000);
  EXPECT_GT(r.raw.pps, 1000);
  EXPECT_GT(r.uring.gbps, 0);
  EXPECT_LE(r.uring.received, r.uring.sent);
  EXPECT_LE(r.raw.received, r.raw.sent);
  // How much of a stream a receiver keeps up with depends on the machine's load (a sanitizer build on two busy cores
  // lost 77% of the GSO stream below), so the tests ask only that it flowed and that the loss is what was counted.
  EXPECT_GT(r.uring.received, 0u);
  EXPECT_GE(r.uring.loss, 0);
  EXPECT_DOUBLE_EQ(r.uring.loss, 1.0 - double(r.uring.received) / double(r.uring.sent));
}

TEST(TransportBenchTest, MeasuresTheGsoGroStreamInSegments) {
  const TransportBenchResult r = RunGsoBench(4136, 0.2);
  if (r.error == -ENOPROTOOPT || r.error == -EINVAL) GTEST_SKIP() << "kernel without UDP GSO/GRO";
  ASSERT_EQ(r.error, 0);
  EXPECT_EQ(r.frame_bytes, 4136u);
  EXPECT_GT(r.gso.pps, 1000);
  EXPECT_NEAR(r.gso.gbps, r.gso.pps * 4136 * 8 / 1e9, 1e-6);
  EXPECT_LE(r.gso.received, r.gso.sent);
  EXPECT_EQ(r.gso.sent % 15, 0u);  // whole sends of 15 segments (65507 / 4136)
  EXPECT_GT(r.gso.received, 0u);
  EXPECT_DOUBLE_EQ(r.gso.loss, 1.0 - double(r.gso.received) / double(r.gso.sent));
}

// The stream between two sockets the caller opened (here both on 127.0.0.1; `uroce_bench udp-gbps --between` opens
// them in two network namespaces): it flows from one to the other, and neither socket is closed by the bench.
TEST(TransportBenchTest, MeasuresTheGsoGroStreamBetweenGivenSockets) {
  UdpEndpoint rx_at, tx_at;
  const int rx = OpenStreamSocket(IpAddress::V4(0x7f000001), &rx_at);
  const int tx = OpenStreamSocket(IpAddress::V4(0x7f000001), &tx_at);
  ASSERT_GE(rx, 0);
  ASSERT_GE(tx, 0);
  EXPECT_NE(rx_at.port, 0);
  const TransportBenchResult r = RunGsoBenchBetween(rx, rx_at, tx, 1064, 0.2);
  if (r.error == -ENOPROTOOPT || r.error == -EINVAL) GTEST_SKIP() << "kernel without UDP GSO/GRO";
  ASSERT_EQ(r.error, 0);
  EXPECT_GT(r.gso.pps, 1000);
  EXPECT_LE(r.gso.received, r.gso.sent);
  EXPECT_EQ(r.gso.sent % 61, 0u);  // whole sends of 61 segments (65507 / 1064)
  EXPECT_GE(fcntl(rx, F_GETFD), 0) << "closed by the bench";
  EXPECT_GE(fcntl(tx, F_GETFD), 0) << "closed by the bench";
  close(rx);
  close(tx);
}

// Zero-copy sends over loopback: the stream arrives, every send is reported done, and each was copied all the same
// (the kernel copies what it delivers to a socket of this host), which is why uroce's transports copy.
TEST(TransportBenchTest, ZeroCopySendsOverLoopbackAreCopiedByTheKernel) {
  const TransportBenchResult r = RunGsoZeroCopyBench(4136, 0.2);
  if (r.error == -ENOSYS || r.error == -EPERM || r.error == -EINVAL || r.error == -ENOPROTOOPT)
    GTEST_SKIP() << "io_uring, its zero-copy send or UDP GSO/GRO unavailable: " << r.error;
  ASSERT_EQ(r.error, 0);
  EXPECT_GT(r.gso_zero_copy.pps, 1000);
  EXPECT_LE(r.gso_zero_copy.received, r.gso_zero_copy.sent);
  EXPECT_EQ(r.gso_zero_copy.sent % 15, 0u);
  EXPECT_GT(r.zero_copy_notifications, 0u);
  EXPECT_LE(r.zero_copy_notifications, r.gso_zero_copy.sent / 15);
  EXPECT_EQ(r.zero_copy_copied, r.zero_copy_notifications);
}

}  // namespace
}  // namespace uroce::wire
