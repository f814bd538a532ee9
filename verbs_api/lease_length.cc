#include "verbs_api/lease_length.h"

#include "verbs_api/poll_pattern.h"

namespace uroce::verbs {

void LeaseLength::SetTimeScale(double scale) {
  quiet_ns_ = scale >= PollPattern::kEmulatedScale ? uint64_t(double(kLeaseNs) * scale) : kLeaseNs;
}

uint64_t LeaseLength::At(uint64_t now) {
  if (quiet_ns_ == kLeaseNs) return kLeaseNs;
  // Races between renewing threads are harmless: each sees the count move, and the later time stands.
  const uint64_t packets = packets_.load(std::memory_order_relaxed);
  if (packets != packets_seen_.load(std::memory_order_relaxed)) {
    packets_seen_.store(packets, std::memory_order_relaxed);
    changed_ns_.store(now, std::memory_order_relaxed);
  }
  const uint64_t changed = changed_ns_.load(std::memory_order_relaxed);
  return changed != 0 && now - changed < kQuietNs ? kLeaseNs : quiet_ns_;
}

}  // namespace uroce::verbs
