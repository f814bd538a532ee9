#include "wire/clock.h"

#include <time.h>

#include <algorithm>
#if defined(__x86_64__)
#include <sys/prctl.h>
#include <x86intrin.h>
#endif

namespace uroce::wire {

namespace {

uint64_t KernelMonotonicNs() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1'000'000'000u + uint64_t(ts.tv_nsec);
}

class KernelClock final : public Clock {
 public:
  uint64_t NowNs() const override { return KernelMonotonicNs(); }
};

#if defined(__x86_64__)
uint64_t ReadTsc() { return __rdtsc(); }
#endif

// The TickClock SystemClock reads from, or nullptr where the kernel's readings are cheap (or there is no counter).
// Chosen once per process; never destroyed (threads may read the clock while the process exits).
const TickClock* ChosenTickClock() {
  static const TickClock* const chosen = []() -> const TickClock* {
#if defined(__x86_64__)
    // Two readings with nothing between them, at their cheapest: what one reading costs.
    const KernelClock kernel;
    if (CheapestNs(kernel, 16, [] {}) >= SystemClock::kSlowReadingNs && SystemClock::TickCounterAllowed()) {
      return new TickClock(*new KernelClock, ReadTsc);
    }
#endif
    return nullptr;
  }();
  return chosen;
}

}  // namespace

uint64_t SystemClock::NowNs() const {
  if (const TickClock* ticks = ChosenTickClock()) return ticks->NowNs();
  return KernelMonotonicNs();
}

SystemClock& SystemClock::Instance() {
  static SystemClock clock;
  return clock;
}

bool SystemClock::TickCounterAllowed() {
#if defined(__x86_64__)
  int tsc_mode = 0;
  return !(prctl(PR_GET_TSC, &tsc_mode) == 0 && tsc_mode == PR_TSC_SIGSEGV);
#else
  return false;
#endif
}

bool SystemClock::ReadsTickCounter() {
  const TickClock* ticks = ChosenTickClock();
  return ticks != nullptr && ticks->trusted();
}

TickClock::TickClock(const Clock& reference, TickSource ticks)
    : reference_(reference), ticks_(ticks), first_ns_(reference.NowNs()), first_ticks_(ticks()) {
  anchor_ns_.store(first_ns_, std::memory_order_relaxed);
  anchor_ticks_.store(first_ticks_, std::memory_order_relaxed);
}

TickClock::Anchor TickClock::ReadAnchor() const {
  Anchor a;
  uint32_t before, after;
  do {
    before = seq_.load(std::memory_order_acquire);
    a.ns = anchor_ns_.load(std::memory_order_relaxed);
    a.ticks = anchor_ticks_.load(std::memory_order_relaxed);
    a.mult = mult_.load(std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_acquire);
    after = seq_.load(std::memory_order_relaxed);
  } while (before != after || (before & 1) != 0);
  return a;
}

uint64_t TickClock::NowNs() const {
  if (untrusted_.load(std::memory_order_relaxed)) return NoEarlierThanBefore(reference_.NowNs());
  const uint64_t t = ticks_();
  const Anchor a = ReadAnchor();
  const int64_t since = static_cast<int64_t>(t - a.ticks);
  // Slightly behind the anchor (it was just taken on another CPU): the anchor's time. Far behind, or due: the
  // reference, which also checks the counter.
  if (a.mult == 0 || since >= static_cast<int64_t>(reanchor_ticks_.load(std::memory_order_relaxed)) ||
      since < -static_cast<int64_t>(slack_ticks_.load(std::memory_order_relaxed))) {
    return NoEarlierThanBefore(Reanchor());
  }
  const uint64_t ahead = since <= 0 ? 0 : static_cast<uint64_t>((static_cast<unsigned __int128>(since) * a.mult) >> 32);
  return NoEarlierThanBefore(a.ns + ahead);
}

uint64_t TickClock::Reanchor() const {
  bool expected = false;
  if (!anchoring_.compare_exchange_strong(expected, true, std::memory_order_acquire)) return reference_.NowNs();
  // A reference reading bracketed by two counter readings, whose counter time is their middle; the tightest
  // bracket of a few (in a VM a reading took 1 us, and now and then 10-50 us).
  uint64_t ref = 0, t = 0, bracket = UINT64_MAX;
  for (int i = 0; i < 3; ++i) {
    const uint64_t t0 = ticks_();
    const uint64_t r = reference_.NowNs();
    const uint64_t t1 = ticks_();
    if (t1 < t0) {
      untrusted_.store(true, std::memory_order_relaxed);  // the counter went back on one thread
      break;
    }
    if (t1 - t0 < bracket) {
      bracket = t1 - t0;
      ref = r;
      t = t0 + bracket / 2;
    }
  }
  const Anchor a = ReadAnchor();
  if (untrusted_.load(std::memory_order_relaxed) || t < first_ticks_) {
    untrusted_.store(true, std::memory_order_relaxed);
  } else if (a.mult == 0) {
    // Calibrating: a rate once kCalibrateNs have passed, from a bracket short against the span.
    if (ref - first_ns_ >= kCalibrateNs && bracket * 100 < t - first_ticks_) SetAnchor(ref, t);
  } else if (bracket < max_bracket_ticks_.load(std::memory_order_relaxed)) {  // a preempted one proves nothing
    const int64_t since = static_cast<int64_t>(t - a.ticks);
    const int64_t predicted =
        static_cast<int64_t>(a.ns) + static_cast<int64_t>((static_cast<__int128>(since) * a.mult) >> 32);
    const int64_t off = predicted - static_cast<int64_t>(ref);
    const uint64_t span = ref > a.ns ? ref - a.ns : 0;
    if (static_cast<uint64_t>(off < 0 ? -off : off) > kToleranceNs + span / kToleranceParts) {
      untrusted_.store(true, std::memory_order_relaxed);
    } else {
      SetAnchor(ref, t);
    }
  }
  anchoring_.store(false, std::memory_order_release);
  return ref;
}

void TickClock::SetAnchor(uint64_t ns, uint64_t ticks) const {
  // The rate over everything since the first reading: its error shrinks as the span grows. So the next anchoring
  // comes after as long again as the span so far (2, 4, 8... ms), up to kReanchorNs.
  const uint64_t span = ns - first_ns_;
  const uint64_t mult = static_cast<uint64_t>((static_cast<unsigned __int128>(span) << 32) / (ticks - first_ticks_));
  if (mult == 0) {
    untrusted_.store(true, std::memory_order_relaxed);  // more than 2^32 ticks a nanosecond: not a clock
    return;
  }
  seq_.fetch_add(1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  anchor_ns_.store(ns, std::memory_order_relaxed);
  anchor_ticks_.store(ticks, std::memory_order_relaxed);
  mult_.store(mult, std::memory_order_relaxed);
  seq_.fetch_add(1, std::memory_order_release);
  const auto ticks_for = [mult](uint64_t ns) {
    return static_cast<uint64_t>((static_cast<unsigned __int128>(ns) << 32) / mult);
  };
  reanchor_ticks_.store(ticks_for(std::min(span, kReanchorNs)), std::memory_order_relaxed);
  slack_ticks_.store(ticks_for(kToleranceNs), std::memory_order_relaxed);
  max_bracket_ticks_.store(ticks_for(kToleranceNs / 4), std::memory_order_relaxed);
}

uint64_t TickClock::NoEarlierThanBefore(uint64_t ns) const {
  uint64_t last = last_.load(std::memory_order_relaxed);
  while (ns > last) {
    if (last_.compare_exchange_weak(last, ns, std::memory_order_relaxed)) return ns;
  }
  return last;
}

namespace {

struct OpenBatch {
  uint32_t depth = 0;  // ClockBatches open on this thread
  uint64_t now_ns = 0;  // their reading (0: not read yet)
};
// The default TLS model, not initial-exec: a program that dlopens libibverbs (verbs_api/unload_test) then failed with
// "cannot allocate memory in static TLS block".
thread_local OpenBatch t_batch;

}  // namespace

ClockBatch::ClockBatch() { ++t_batch.depth; }

ClockBatch::ClockBatch(uint64_t now_ns) {
  if (t_batch.depth++ == 0) t_batch.now_ns = now_ns;
}

ClockBatch::~ClockBatch() {
  if (--t_batch.depth == 0) t_batch.now_ns = 0;
}

uint64_t ClockBatch::Renew() {
  const uint64_t now = SystemClock::Instance().NowNs();
  if (t_batch.depth != 0) t_batch.now_ns = now;
  return now;
}

uint64_t BatchedClock::NowNs() const {
  OpenBatch& b = t_batch;
  if (b.depth == 0) return SystemClock::Instance().NowNs();
  if (b.now_ns == 0) b.now_ns = SystemClock::Instance().NowNs();
  return b.now_ns;
}

BatchedClock& BatchedClock::Instance() {
  static BatchedClock clock;
  return clock;
}

}  // namespace uroce::wire
