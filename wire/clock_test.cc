#include "wire/clock.h"

#include <gtest/gtest.h>

#include <thread>

namespace uroce::wire {
namespace {

// The system clock's next reading after `t` (CLOCK_MONOTONIC moves on within nanoseconds to microseconds).
uint64_t SystemAfter(uint64_t t) {
  uint64_t now;
  while ((now = SystemClock::Instance().NowNs()) <= t) {
  }
  return now;
}

TEST(ClockBatch, WithoutABatchEveryReadingIsFresh) {
  const BatchedClock& clock = BatchedClock::Instance();
  const uint64_t first = clock.NowNs();
  const uint64_t later = SystemAfter(first);
  EXPECT_GE(clock.NowNs(), later);
}

TEST(ClockBatch, ABatchReadsOnceAtFirstUse) {
  const BatchedClock& clock = BatchedClock::Instance();
  const uint64_t before = SystemClock::Instance().NowNs();
  uint64_t first;
  {
    const ClockBatch batch;
    first = clock.NowNs();
    EXPECT_GE(first, before);
    SystemAfter(first);
    EXPECT_EQ(clock.NowNs(), first);  // the system clock moved on; the batch's time did not
  }
  EXPECT_GT(clock.NowNs(), first);  // closed: fresh again
}

TEST(ClockBatch, ASeededBatchStartsFromTheCallersReading) {
  const uint64_t seed = SystemClock::Instance().NowNs();
  SystemAfter(seed);
  const ClockBatch batch(seed);
  EXPECT_EQ(BatchedClock::Instance().NowNs(), seed);
}

TEST(ClockBatch, NestedBatchesShareTheOutermostReading) {
  const BatchedClock& clock = BatchedClock::Instance();
  const uint64_t seed = SystemClock::Instance().NowNs();
  const ClockBatch outer(seed);
  SystemAfter(seed);
  {
    const ClockBatch inner(SystemClock::Instance().NowNs());  // its own reading is ignored: the outer one stands
    EXPECT_EQ(clock.NowNs(), seed);
    const ClockBatch lazy;
    EXPECT_EQ(clock.NowNs(), seed);
  }
  EXPECT_EQ(clock.NowNs(), seed);  // an inner batch's end does not close the outer one
}

TEST(ClockBatch, RenewReadsAgainForTheRestOfTheBatch) {
  const BatchedClock& clock = BatchedClock::Instance();
  const uint64_t seed = SystemClock::Instance().NowNs();
  const ClockBatch batch(seed);
  SystemAfter(seed);
  const uint64_t renewed = ClockBatch::Renew();
  EXPECT_GT(renewed, seed);
  EXPECT_EQ(clock.NowNs(), renewed);
}

TEST(ClockBatch, RenewWithoutABatchIsAFreshReading) {
  const uint64_t before = SystemClock::Instance().NowNs();
  EXPECT_GE(ClockBatch::Renew(), before);
  const uint64_t later = SystemAfter(before);
  EXPECT_GE(BatchedClock::Instance().NowNs(), later);  // Renew opened nothing
}

TEST(ClockBatch, ABatchBelongsToItsThread) {
  const uint64_t seed = SystemClock::Instance().NowNs();
  const ClockBatch batch(seed);
  const uint64_t later = SystemAfter(seed);
  uint64_t other = 0;
  std::thread([&] { other = BatchedClock::Instance().NowNs(); }).join();
  EXPECT_GE(other, later);
  EXPECT_EQ(BatchedClock::Instance().NowNs(), seed);
}

TEST(ClockBatch, TheSystemClockAndCalibrationsIgnoreBatches) {
  const uint64_t seed = SystemClock::Instance().NowNs();
  const ClockBatch batch(seed);
  EXPECT_GT(SystemAfter(seed), seed);
  // CheapestNs times real work even inside a batch (the ICRC's choice may be made inside one).
  volatile uint64_t sink = 0;
  const uint64_t took = CheapestNs(SystemClock::Instance(), 3, [&] {
    const uint64_t start = SystemClock::Instance().NowNs();
    SystemAfter(start);
    sink = sink + 1;
  });
  EXPECT_GT(took, 0u);
}

}  // namespace
}  // namespace uroce::wire
