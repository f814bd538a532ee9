#include "wire/icrc_bench.h"

#include <chrono>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "wire/address.h"
#include "wire/bytes.h"
#include "wire/icrc.h"
#include "wire/packet.h"

namespace uroce::wire {
namespace {

using Clock = std::chrono::steady_clock;

// Runs `body` in batches until `seconds` pass; returns bytes-per-iteration * iterations / elapsed, in GB/s.
template <typename Body>
double Measure(size_t bytes_per_iteration, double seconds, Body&& body) {
  const auto start = Clock::now();
  const auto deadline = start + std::chrono::duration<double>(seconds);
  uint64_t iterations = 0;
  auto now = start;
  do {
    for (int i = 0; i < 256; ++i) body();
    iterations += 256;
    now = Clock::now();
  } while (now < deadline);
  const double elapsed = std::chrono::duration<double>(now - start).count();
  return static_cast<double>(bytes_per_iteration) * static_cast<double>(iterations) / elapsed / 1e9;
}

}  // namespace

IcrcBenchResult RunIcrcBench(size_t packet_bytes, double seconds) {
  if (packet_bytes < kMinPacketSize) packet_bytes = kMinPacketSize;
  // The copy's destination lies a whole number of pages after the packet. Two separately allocated vectors put it 16
  // bytes past a page multiple (the allocator's header), and with a destination 1-31 bytes ahead of the source modulo
  // 4 KiB, glibc 2.36's memcpy of more than 2 KiB (REP MOVSB) runs at 1.7-2.9 GB/s on this machine's AMD EPYC
  // against 35-65 GB/s otherwise: that measured the CPU's slow case, not a copy of a packet.
  const size_t page_span = AlignUp(packet_bytes, 4096);
  std::vector<uint8_t> storage(2 * page_span + 4096);
  auto* const base = reinterpret_cast<uint8_t*>(AlignUp(reinterpret_cast<uintptr_t>(storage.data()), 4096));
  std::span<uint8_t> packet(base, packet_bytes), copy(base + page_span, packet_bytes);
  for (size_t i = 0; i < packet_bytes; ++i) packet[i] = static_cast<uint8_t>(i * 131 + 7);
  packet[0] = 0x04;  // RC_SEND_ONLY; the ICRC does not care, but keep the bytes plausible
  Flow flow;
  flow.src = {IpAddress::V4(0x0A000001), 0xC123};
  flow.dst = {IpAddress::V4(0x0A000002), kRoceV2UdpPort};

  const size_t flip = packet_bytes - kIcrcSize - 1;  // a byte the ICRC covers, in bounds for any size

  IcrcBenchResult r;
  r.packet_bytes = packet_bytes;
  r.clmul = HaveClmul();
  r.fold_bits = HaveVpclmul() ? 512 : HaveVpclmul256() ? 256 : r.clmul ? 128 : 0;
  volatile uint32_t sink = 0;
  r.icrc_gbps = Measure(packet_bytes, seconds * 0.4, [&] {
    sink = sink + ComputeIcrc(flow, packet);
    packet[flip] ^= 1;  // keep the compiler from hoisting the work out of the loop
  });
  r.memcpy_gbps = Measure(packet_bytes, seconds * 0.4, [&] {
    std::memcpy(copy.data(), packet.data(), packet_bytes);
    asm volatile("" : : "r"(copy.data()) : "memory");
    packet[flip] ^= 1;
  });
  r.crc_slice8_gbps = Measure(packet_bytes, seconds * 0.2, [&] {
    sink = sink + Crc32SliceBy8(0, packet.data(), packet_bytes);
    packet[flip] ^= 1;
  });
  (void)sink;
  return r;
}

}  // namespace uroce::wire
