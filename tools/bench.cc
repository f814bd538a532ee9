// `uroce bench wire`: the wire layer's speed as ratios against baselines measured in the same run — ICRC against
// memcpy of the same 4 KiB packets, and the io_uring UDP transport against raw sendmmsg/recvmmsg on loopback.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "wire/icrc_bench.h"
#include "wire/transport_bench.h"

namespace {

int BenchWire(double seconds) {
  const auto icrc = uroce::wire::RunIcrcBench(4096, seconds);
  std::printf("ICRC, 4 KiB packets:      %7.2f GB/s   (slice-by-8 %5.2f GB/s)\n", icrc.icrc_gbps, icrc.crc_slice8_gbps);
  std::printf("memcpy, same bytes:       %7.2f GB/s\n", icrc.memcpy_gbps);
  std::printf("  ratio ICRC / memcpy:    %7.2f\n", icrc.memcpy_gbps > 0 ? icrc.icrc_gbps / icrc.memcpy_gbps : 0.0);
  const auto t = uroce::wire::RunTransportBench(4096, seconds);
  if (t.error != 0) {
    std::fprintf(stderr, "transport bench failed: %s\n", std::strerror(-t.error));
    return 1;
  }
  std::printf("io_uring UDP, 4 KiB:      %7.0f packets/s  %6.2f Gbit/s  loss %.4f%%  (%s receive)\n", t.uring_pps,
              t.uring_gbps, 100 * t.uring_loss, t.uring_multishot ? "multishot" : "fallback");
  std::printf("sendmmsg/recvmmsg, 4 KiB: %7.0f packets/s  %6.2f Gbit/s  loss %.4f%%\n", t.raw_pps, t.raw_gbps,
              100 * t.raw_loss);
  std::printf("  ratio io_uring / raw:   %7.2f\n", t.raw_pps > 0 ? t.uring_pps / t.raw_pps : 0.0);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  double seconds = 1.0;
  std::string what;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--seconds") == 0 && i + 1 < argc) {
      seconds = std::atof(argv[++i]);
    } else {
      what = argv[i];
    }
  }
  if (what == "wire") return BenchWire(seconds);
  std::fprintf(stderr, "usage: uroce bench wire [--seconds S]\n");
  return 2;
}
