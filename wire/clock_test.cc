#include "wire/clock.h"

#include <gtest/gtest.h>

#include <time.h>

#include <algorithm>
#include <atomic>
#include <optional>
#include <thread>
#include <vector>
#if defined(__x86_64__)
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>
#include <x86intrin.h>
#endif

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

// --- TickClock: a fake counter and a reference that counts its readings ---

std::atomic<uint64_t> g_ticks{0};
uint64_t FakeTicks() { return g_ticks.load(std::memory_order_relaxed); }

class CountingClock final : public Clock {
 public:
  uint64_t NowNs() const override {
    readings.fetch_add(1, std::memory_order_relaxed);
    return manual.NowNs();
  }
  ManualClock manual{1'000'000'000};
  mutable std::atomic<int> readings{0};
};

// Moves the reference by `ns` and the counter by `ticks_per_ns` ticks for each nanosecond.
void Advance(CountingClock& ref, uint64_t ns, uint64_t ticks_per_ns = 3) {
  ref.manual.Advance(ns);
  g_ticks.fetch_add(ns * ticks_per_ns);
}

// Reads the clock every `step` for `total` nanoseconds of reference time, expecting it within `within` of the
// reference and never going back.
void FollowFor(const TickClock& clock, CountingClock& ref, uint64_t total, uint64_t step, uint64_t within) {
  uint64_t last = 0;
  for (uint64_t t = 0; t < total; t += step) {
    Advance(ref, step);
    const uint64_t now = clock.NowNs();
    const uint64_t want = ref.manual.NowNs();
    EXPECT_LE(now > want ? now - want : want - now, within) << "at " << t;
    EXPECT_GE(now, last);
    last = now;
  }
}

// A TickClock on the fake counter that has just calibrated (3 ticks a nanosecond from `first_ticks`).
class CalibratedTickClock : public ::testing::Test {
 protected:
  void Calibrate(uint64_t first_ticks) {
    g_ticks = first_ticks;
    clock_.emplace(ref_, FakeTicks);
    Advance(ref_, TickClock::kCalibrateNs);
    clock_->NowNs();
    ASSERT_TRUE(clock_->calibrated());
  }
  CountingClock ref_;
  std::optional<TickClock> clock_;
};

TEST(TickClock, ReadsTheReferenceUntilCalibratedThenTheCounterAlone) {
  g_ticks = 5'000;
  CountingClock ref;
  const TickClock clock(ref, FakeTicks);
  EXPECT_EQ(clock.NowNs(), ref.manual.NowNs());
  EXPECT_FALSE(clock.calibrated());
  Advance(ref, TickClock::kCalibrateNs);
  EXPECT_EQ(clock.NowNs(), ref.manual.NowNs());  // this reading calibrates
  ASSERT_TRUE(clock.calibrated());
  const int readings = ref.readings.load();
  FollowFor(clock, ref, TickClock::kCalibrateNs / 2, 100, 1);  // 3 ticks a nanosecond: exact
  EXPECT_EQ(ref.readings.load(), readings);  // 10,000 readings, none of them the reference's
  EXPECT_TRUE(clock.trusted());
}

TEST_F(CalibratedTickClock, ReanchorsEveryIntervalAndKeepsFollowing) {
  Calibrate(0);
  const int readings = ref_.readings.load();
  FollowFor(*clock_, ref_, 10 * TickClock::kReanchorNs, 100'000, 1);
  // Re-anchorings after 2, 4, 8, 16, 32 ms, then one per interval (each reads the reference three times to take
  // the tightest reading), not one per reading.
  EXPECT_GE(ref_.readings.load() - readings, 3 * 12);
  EXPECT_LE(ref_.readings.load() - readings, 3 * 16);
  EXPECT_TRUE(clock_->trusted());
}

TEST_F(CalibratedTickClock, ACounterWhoseRateMovesIsGivenUp) {
  Calibrate(0);
  // The counter now runs at twice its rate: until the next re-anchoring the clock runs ahead, then it is given up.
  uint64_t last = 0;
  for (uint64_t t = 0; t < 2 * TickClock::kReanchorNs; t += 1'000'000) {
    Advance(ref_, 1'000'000, 6);
    const uint64_t now = clock_->NowNs();
    EXPECT_GE(now, last);
    last = now;
  }
  EXPECT_FALSE(clock_->trusted());
  // From then on the reference's time, never earlier than what was read before.
  Advance(ref_, TickClock::kReanchorNs, 6);
  EXPECT_EQ(clock_->NowNs(), ref_.manual.NowNs());
}

TEST_F(CalibratedTickClock, ACounterThatGoesBackIsGivenUp) {
  Calibrate(1'000'000'000);
  const uint64_t before = clock_->NowNs();
  g_ticks = 1'000;  // another CPU's counter, far behind
  ref_.manual.Advance(1'000);
  EXPECT_EQ(clock_->NowNs(), ref_.manual.NowNs());
  EXPECT_GE(ref_.manual.NowNs(), before);
  EXPECT_FALSE(clock_->trusted());
}

#if defined(__x86_64__)
uint64_t Tsc() { return __rdtsc(); }

// This machine's own counter against its own clock, read from four threads at once across several re-anchorings.
TEST(TickClock, TheTimeStampCounterFollowsTheSystemClock) {
  const Clock& system = SystemClock::Instance();
  const TickClock clock(system, Tsc);
  const uint64_t end = system.NowNs() + 4 * TickClock::kReanchorNs;
  std::atomic<uint64_t> worst_off{0};
  std::atomic<int> went_back{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&] {
      uint64_t last = 0;
      for (uint64_t before = system.NowNs(); before < end; before = system.NowNs()) {
        const uint64_t now = clock.NowNs();
        const uint64_t after = system.NowNs();
        if (now < last) went_back.fetch_add(1);
        last = now;
        // Within tolerance of the system's readings around it (a reading may be up to the last one returned).
        const uint64_t off = now < before ? before - now : now > after ? now - after : 0;
        uint64_t worst = worst_off.load();
        while (off > worst && !worst_off.compare_exchange_weak(worst, off)) {
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_TRUE(clock.calibrated());
  EXPECT_TRUE(clock.trusted());
  EXPECT_EQ(went_back.load(), 0);
  EXPECT_LT(worst_off.load(), TickClock::kToleranceNs + TickClock::kReanchorNs / TickClock::kToleranceParts);
}
#endif

#if defined(__x86_64__)
TEST(SystemClock, AProcessWhoseTickCounterFaultsKeepsTheKernelsClock) {
  EXPECT_TRUE(SystemClock::TickCounterAllowed());
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    if (prctl(PR_SET_TSC, PR_TSC_SIGSEGV) != 0) _exit(2);
    _exit(SystemClock::TickCounterAllowed() ? 1 : 0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
}
#endif

TEST(SystemClock, ReadsTheKernelsClockWhereItIsCheap) {
  // What a CLOCK_MONOTONIC reading costs here, at its cheapest.
  uint64_t cheapest = UINT64_MAX;
  for (int i = 0; i < 16; ++i) {
    timespec a{}, b{};
    clock_gettime(CLOCK_MONOTONIC, &a);
    clock_gettime(CLOCK_MONOTONIC, &b);
    cheapest = std::min<uint64_t>(cheapest, uint64_t(b.tv_sec - a.tv_sec) * 1'000'000'000u + b.tv_nsec - a.tv_nsec);
  }
  if (cheapest >= SystemClock::kSlowReadingNs / 2) {
    GTEST_SKIP() << "the kernel's clock costs " << cheapest << " ns a reading here";
  }
  EXPECT_FALSE(SystemClock::ReadsTickCounter());
}

}  // namespace
}  // namespace uroce::wire
