#include "wire/clock.h"

#include <time.h>

namespace uroce::wire {

uint64_t SystemClock::NowNs() const {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1'000'000'000u + uint64_t(ts.tv_nsec);
}

SystemClock& SystemClock::Instance() {
  static SystemClock clock;
  return clock;
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
