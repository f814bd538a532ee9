// How many times slower than the machines uroce's waiting thresholds were tuned on this machine runs (docs/
// ARCHITECTURE.md, "Progress: who receives"). The thresholds that decide who receives and how long a thread spins
// (PollPattern's, Engine's) are times in nanoseconds measured on ordinary machines; under an emulator such as
// QEMU's TCG, the same work takes ~30 times as long, so an application's think time of a few microseconds becomes a
// hundred, it never counted as polling, and every packet cost a thread's wake-up (ib_write_lat: 240 us in a TCG
// guest where the kernel's rxe takes 17). Scaling the thresholds by how long a fixed piece of work takes keeps the
// policy what it was meant to be: budgets of work, not of time.
#pragma once

namespace uroce::verbs {

// What one look of a polling thread costs, roughly (a clock reading, an atomic add, a 64-byte copy), on the machine
// the thresholds were tuned on (2 vCPUs of a current x86 VM): 33 ns.
inline constexpr double kReferenceLookNs = 33.0;
inline constexpr double kMaxTimeScale = 64.0;

// Times the look: the cheapest of 5 rounds of 2,000 (so a round that was preempted does not count) over
// kReferenceLookNs, clamped to [1, kMaxTimeScale]. ~1 on ordinary machines, ~28 in a TCG guest. Takes ~0.3 ms here.
double MeasureTimeScale();

}  // namespace uroce::verbs
