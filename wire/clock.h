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

// One clock reading shared by a span of work on one thread: while a ClockBatch is open on a thread, BatchedClock
// reads the system clock there once, at its first use, and then returns that reading until the batch closes or
// Renew() reads again. Why: handling one packet read the clock at ~10 places (a poll's look, the ICRC-checked
// packet's arrival, its ACK's hold, an RTT sample, a completion...). A reading costs ~20 ns on an ordinary machine
// but ~1.6 us in a VM whose clocksource the vDSO cannot read (QEMU/TCG's HPET: a system call each), where those
// readings were a third of an ib_send_lat half round trip. The protocol's timers (microseconds to seconds) lose
// nothing to a time that is as old as one batch of work. Never open one around a wait: time would stand still in
// it. Batches nest: an inner one shares the outermost's reading.
class ClockBatch {
 public:
  ClockBatch();
  // Starts from a reading of SystemClock the caller has just taken (unless an outer batch is open: its reading).
  explicit ClockBatch(uint64_t now_ns);
  ~ClockBatch();
  ClockBatch(const ClockBatch&) = delete;
  ClockBatch& operator=(const ClockBatch&) = delete;
  // Reads the system clock afresh; inside a batch, the batch's later readings return this one. For spans that are
  // measured (the time an application spent inside the library).
  static uint64_t Renew();
};

// SystemClock's time, as of the thread's open ClockBatch if there is one. The device's clock and the data path's.
class BatchedClock final : public Clock {
 public:
  uint64_t NowNs() const override;
  static BatchedClock& Instance();
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
