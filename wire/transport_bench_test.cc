#include "wire/transport_bench.h"

#include <gtest/gtest.h>

#include <cerrno>

namespace uroce::wire {
namespace {

TEST(TransportBenchTest, MeasuresBothPathsOverLoopback) {
  const TransportBenchResult r = RunTransportBench(4096, 0.2);
  if (r.error == -ENOSYS || r.error == -EPERM) GTEST_SKIP() << "io_uring unavailable";
  ASSERT_EQ(r.error, 0) << r.ToString();
  std::printf("%s", r.ToString().c_str());
  EXPECT_EQ(r.frame_bytes, 4096u);
  EXPECT_GT(r.uring_pps, 1000);
  EXPECT_GT(r.raw_pps, 1000);
  EXPECT_GT(r.uring_gbps, 0);
  EXPECT_LE(r.uring_received, r.uring_sent);
  EXPECT_LE(r.raw_received, r.raw_sent);
  EXPECT_GE(r.uring_loss, 0);
  EXPECT_LT(r.uring_loss, 0.5);
}

}  // namespace
}  // namespace uroce::wire
