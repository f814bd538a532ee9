// LeaseLength: 1 ms on an ordinary machine; stretched on an emulated one only while no packet came for a second.
#include "verbs_api/lease_length.h"

#include <gtest/gtest.h>

#include "verbs_api/poll_pattern.h"

namespace uroce::verbs {
namespace {

constexpr uint64_t kMs = 1'000'000;
constexpr uint64_t kStart = 5'000 * kMs;

TEST(LeaseLengthTest, AnOrdinaryMachineKeepsOneMillisecond) {
  LeaseLength lease;
  EXPECT_EQ(lease.At(kStart), LeaseLength::kLeaseNs);
  lease.SetTimeScale(PollPattern::kEmulatedScale - 1);  // slow, not emulated
  EXPECT_EQ(lease.At(kStart), LeaseLength::kLeaseNs);
  lease.OnPacket();
  EXPECT_EQ(lease.At(kStart + 2'000 * kMs), LeaseLength::kLeaseNs);
  EXPECT_FALSE(lease.IsQuiet(lease.At(kStart + 4'000 * kMs)));
}

TEST(LeaseLengthTest, AnEmulatedMachineStretchesItWhileNoPacketComes) {
  LeaseLength lease;
  lease.SetTimeScale(20);
  const uint64_t stretched = 20 * LeaseLength::kLeaseNs;
  // Direct paths only from the start: stretched.
  EXPECT_EQ(lease.At(kStart), stretched);
  EXPECT_TRUE(lease.IsQuiet(stretched));
  // A packet: 1 ms from the renewal that sees it, for a second.
  lease.OnPacket();
  EXPECT_EQ(lease.At(kStart + 1 * kMs), LeaseLength::kLeaseNs);
  EXPECT_EQ(lease.At(kStart + 1 * kMs + LeaseLength::kQuietNs - 1), LeaseLength::kLeaseNs);
  EXPECT_EQ(lease.At(kStart + 1 * kMs + LeaseLength::kQuietNs), stretched);
  // More packets keep it short: the second counts from the last renewal that saw one.
  lease.OnPacket();
  const uint64_t later = kStart + 3'000 * kMs;
  EXPECT_EQ(lease.At(later), LeaseLength::kLeaseNs);
  lease.OnPacket();
  EXPECT_EQ(lease.At(later + 900 * kMs), LeaseLength::kLeaseNs);
  EXPECT_EQ(lease.At(later + 1'800 * kMs), LeaseLength::kLeaseNs);  // 900 ms after the last one seen
  EXPECT_EQ(lease.At(later + 1'900 * kMs), stretched);
}

}  // namespace
}  // namespace uroce::verbs
