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
