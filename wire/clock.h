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

// CLOCK_MONOTONIC. Where the kernel cannot serve it from the vDSO (a reading costs at least kSlowReadingNs: QEMU/TCG's
// HPET, ~1 us, a system call each) and the CPU has a tick counter, from a TickClock on that counter instead.
class SystemClock final : public Clock {
 public:
  uint64_t NowNs() const override;
  static SystemClock& Instance();
  static constexpr uint64_t kSlowReadingNs = 300;  // the vDSO's readings cost 20-50 ns
  // Whether readings come from the tick counter now: the kernel's were found slow, and the counter is still trusted.
  static bool ReadsTickCounter();
  // Whether this process may read the tick counter: an x86 CPU, and RDTSC not made to fault for it (prctl
  // PR_SET_TSC, PR_TSC_SIGSEGV: such a process keeps the kernel's clock, however slow).
  static bool TickCounterAllowed();
};

// CLOCK_MONOTONIC read from a free-running tick counter (x86's TSC), calibrated against a reference clock: a reading
// is a counter read and a multiplication. Why: in an emulated VM the kernel's clocksource is one the vDSO cannot read
// (the guest kernel marks the emulated TSC unstable and falls back to the HPET), so each reading was a system call of
// ~1 us, and a spinning application's poll read the clock once per look: most of its time was those calls.
// The counter is trusted on evidence, not on CPUID (TCG does not announce an invariant TSC): readings of the
// reference re-anchor it after 2, 4, 8... ms and then every kReanchorNs, and if the counter's prediction was off by
// more than kToleranceNs plus 1/kToleranceParts of the span (its rate moved, or another CPU's counter runs apart), it
// is given up for good and every reading is the reference's. Readings never go back, across the process's threads.
class TickClock final : public Clock {
 public:
  using TickSource = uint64_t (*)();
  // `reference` and `ticks` must outlive the clock; both are read from any thread.
  TickClock(const Clock& reference, TickSource ticks);
  uint64_t NowNs() const override;
  // Until the first kCalibrateNs of reference time have passed, readings are the reference's.
  bool calibrated() const { return mult_.load(std::memory_order_acquire) != 0; }
  // False once a re-anchoring found the counter out of line: then every reading is the reference's.
  bool trusted() const { return !untrusted_.load(std::memory_order_relaxed); }

  static constexpr uint64_t kCalibrateNs = 2'000'000;
  static constexpr uint64_t kReanchorNs = 50'000'000;
  static constexpr uint64_t kToleranceNs = 100'000;
  static constexpr uint64_t kToleranceParts = 50;  // 2% of the span since the last anchor

 private:
  struct Anchor {
    uint64_t ns;
    uint64_t ticks;
    uint64_t mult;  // nanoseconds per tick, 32.32 fixed point; 0: not calibrated
  };
  Anchor ReadAnchor() const;  // a consistent copy (a sequence lock: re-anchoring writes it rarely)
  // Takes a reference reading (and re-anchors, by whoever gets there first); returns it.
  uint64_t Reanchor() const;
  void SetAnchor(uint64_t ns, uint64_t ticks) const;  // by the thread re-anchoring only
  uint64_t NoEarlierThanBefore(uint64_t ns) const;

  const Clock& reference_;
  const TickSource ticks_;
  const uint64_t first_ns_;
  const uint64_t first_ticks_;
  mutable std::atomic<uint32_t> seq_{0};  // odd while the anchor is being written
  mutable std::atomic<uint64_t> anchor_ns_{0};
  mutable std::atomic<uint64_t> anchor_ticks_{0};
  mutable std::atomic<uint64_t> mult_{0};
  mutable std::atomic<uint64_t> reanchor_ticks_{UINT64_MAX};  // ticks past the anchor at which to re-anchor
  mutable std::atomic<uint64_t> slack_ticks_{0};  // how far behind the anchor a reading may be (kToleranceNs)
  mutable std::atomic<uint64_t> max_bracket_ticks_{0};  // a re-anchoring's reference reading took longer: skipped
  mutable std::atomic<bool> anchoring_{false};
  mutable std::atomic<bool> untrusted_{false};
  mutable std::atomic<uint64_t> last_{0};  // the latest reading returned
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
