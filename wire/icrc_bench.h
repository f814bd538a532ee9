// Throughput of the ICRC next to memcpy over the same bytes, for `uroce bench wire`: the ICRC is computed over every
// packet sent and received, as the packet is copied at least once, so the two rates side by side say what it adds.
#pragma once

#include <cstddef>

namespace uroce::wire {

struct IcrcBenchResult {
  size_t packet_bytes = 0;
  double icrc_gbps = 0;    // ComputeIcrc, gigabytes (1e9 B) of packet per second
  double memcpy_gbps = 0;  // memcpy of the same packet size
  double crc_slice8_gbps = 0;  // the portable slicing-by-8 CRC alone, for comparison
  bool clmul = false;          // whether the CPU has PCLMULQDQ (ComputeIcrc folds where that is faster)
  unsigned fold_bits = 0;      // the widest registers folding uses here: 512 or 256 (VPCLMULQDQ), 128, 0 (none)
};

// Measures for about `seconds` in total (split between the three measurements), single-threaded.
IcrcBenchResult RunIcrcBench(size_t packet_bytes = 4096, double seconds = 1.0);

}  // namespace uroce::wire
