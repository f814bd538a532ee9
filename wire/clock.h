// Time as the HCA sees it. The engine never reads the system clock directly: it is handed a Clock, so tests drive
// every timer (ACK timeout, RNR delay, simulated network delay) deterministically with a ManualClock.
#pragma once

#include <atomic>
#include <cstdint>

namespace uroce::wire {

// The earlier of two deadlines in a Clock's nanoseconds, where 0 means "none" (timers, pollers' returns).
constexpr uint64_t EarlierDeadline(uint64_t a, uint64_t b) { return a == 0 ? b : b == 0 ? a : a < b ? a : b; }

class Clock {
 public:
  virtual ~Clock() = default;
  // Monotonic nanoseconds. Thread-safe.
  virtual uint64_t NowNs() const = 0;
};

// CLOCK_MONOTONIC.
class SystemClock final : public Clock {
 public:
  uint64_t NowNs() const override;
  static SystemClock& Instance();
};

// How long `work` takes at its cheapest of `tries` runs on `clock`, in nanoseconds: a run that was preempted or
// interrupted does not count. For start-up calibrations (verbs_api/time_scale.h, the ICRC's choice in icrc.cc).
template <typename Work>
uint64_t CheapestNs(const Clock& clock, int tries, Work&& work) {
  uint64_t best = UINT64_MAX;
  for (int i = 0; i < tries; ++i) {
    const uint64_t start = clock.NowNs();
    work();
    const uint64_t took = clock.NowNs() - start;
    if (took < best) best = took;
  }
  return best;
}

// A clock that moves only when told to.
class ManualClock final : public Clock {
 public:
  explicit ManualClock(uint64_t start_ns = 0) : now_(start_ns) {}
  uint64_t NowNs() const override { return now_.load(std::memory_order_relaxed); }
  void Set(uint64_t ns) { now_.store(ns, std::memory_order_relaxed); }
  void Advance(uint64_t ns) { now_.fetch_add(ns, std::memory_order_relaxed); }

 private:
  std::atomic<uint64_t> now_;
};

}  // namespace uroce::wire
