#include "verbs_api/time_scale.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>

#include "wire/clock.h"

namespace uroce::verbs {

double MeasureTimeScale() {
  std::atomic<uint64_t> counter{0};
  alignas(64) unsigned char from[64] = {}, to[64];
  constexpr int kRounds = 5, kLooks = 2000;
  const wire::Clock& clock = wire::SystemClock::Instance();
  const uint64_t best = wire::CheapestNs(clock, kRounds, [&] {
    uint64_t sum = 0;
    for (int i = 0; i < kLooks; ++i) {
      sum += clock.NowNs();
      counter.fetch_add(1, std::memory_order_relaxed);
      from[i & 63] ^= 1;
      std::memcpy(to, from, sizeof to);
      asm volatile("" : : "r"(to), "r"(sum) : "memory");  // the copy and the readings are used
    }
  });
  return std::clamp(double(best) / kLooks / kReferenceLookNs, 1.0, kMaxTimeScale);
}

}  // namespace uroce::verbs
