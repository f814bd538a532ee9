#include "wire/icrc_bench.h"

#include <gtest/gtest.h>

namespace uroce::wire {
namespace {

TEST(IcrcBench, ReportsPositiveRates) {
  IcrcBenchResult r = RunIcrcBench(4096, 0.05);
  EXPECT_EQ(r.packet_bytes, 4096u);
  EXPECT_GT(r.icrc_gbps, 0);
  EXPECT_GT(r.memcpy_gbps, 0);
  EXPECT_GT(r.crc_slice8_gbps, 0);
  EXPECT_TRUE(r.fold_bits == 0 || r.fold_bits == 128 || r.fold_bits == 256 || r.fold_bits == 512) << r.fold_bits;
  EXPECT_EQ(r.fold_bits != 0, r.clmul);
  std::printf("ICRC %.2f GB/s (clmul=%d, folding on %u-bit registers), memcpy %.2f GB/s, slicing-by-8 %.2f GB/s\n",
              r.icrc_gbps, r.clmul, r.fold_bits, r.memcpy_gbps, r.crc_slice8_gbps);
}

TEST(IcrcBench, ClampsTinyPackets) { EXPECT_EQ(RunIcrcBench(1, 0.01).packet_bytes, 16u); }

}  // namespace
}  // namespace uroce::wire
