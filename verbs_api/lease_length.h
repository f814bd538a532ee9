// LeaseLength: how long one renewal of the receive side by a polling application lasts (verbs_api/engine.h,
// docs/ARCHITECTURE.md "Progress: who receives"). Lock-free; any thread may ask, one (the receive side's holder)
// reports packets.
//
// kLeaseNs everywhere but on an emulated machine (time scale PollPattern::kEmulatedScale or more) whose device has
// received no packet for kQuietNs: there every peer is on the host device's direct paths, where nothing waits for a
// lease to end (a WRITE lands without a receiver, a SEND's record waits in the ring for the poll that wants it), and
// the lease stretches by the time scale as the other thresholds do. In a TCG guest a polling thread loses its vCPU
// for a millisecond or more several times a second; with 1 ms, each time the lease ran out and the progress thread
// woke twice on busy vCPUs, to take the receive side back and to hand it over again. Over packets it stays 1 ms: a
// packet that comes while the holder waits elsewhere (ib_write_lat spinning on memory) waits for the lease's end,
// and stretched that was ib_write_lat's p99.9 in the guest (16 ms).
#pragma once

#include <atomic>
#include <cstdint>

namespace uroce::verbs {

class LeaseLength {
 public:
  static constexpr uint64_t kLeaseNs = 1'000'000;
  static constexpr uint64_t kQuietNs = 1'000'000'000;  // no packet for this long: a quiet device

  // On a machine `scale` times slower than an ordinary one (verbs_api/time_scale.h). Call before the first At.
  void SetTimeScale(double scale);
  // A packet (not a record of the host device's direct paths) reached the device. From the receive side's holder
  // (one writer: no read-modify-write needed); counted only where the lease can stretch, as nothing else reads it.
  void OnPacket() {
    if (quiet_ns_ != kLeaseNs)
      packets_.store(packets_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  }
  // The lease a renewal at `now_ns` takes.
  uint64_t At(uint64_t now_ns);
  // Whether `lease_ns` (from At) is the stretched one: a quiet device on an emulated machine.
  bool IsQuiet(uint64_t lease_ns) const { return lease_ns != kLeaseNs; }

 private:
  uint64_t quiet_ns_ = kLeaseNs;
  std::atomic<uint64_t> packets_{0};
  // What At last saw of packets_, and when it saw it change (0: never).
  std::atomic<uint64_t> packets_seen_{0}, changed_ns_{0};
};

}  // namespace uroce::verbs
