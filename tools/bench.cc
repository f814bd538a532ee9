// `uroce bench wire`: the wire layer's speed as ratios against baselines measured in the same run — ICRC against
// memcpy of the same 4 KiB packets, the io_uring UDP transport against raw sendmmsg/recvmmsg on loopback, and
// io_uring zero-copy UDP GSO sends against copying ones.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <errno.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <thread>
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
  std::printf("io_uring UDP, 4 KiB:      %7.0f packets/s  %6.2f Gbit/s  loss %.4f%%  (%s receive)\n", t.uring.pps,
              t.uring.gbps, 100 * t.uring.loss, t.uring_multishot ? "multishot" : "fallback");
  std::printf("sendmmsg/recvmmsg, 4 KiB: %7.0f packets/s  %6.2f Gbit/s  loss %.4f%%\n", t.raw.pps, t.raw.gbps,
              100 * t.raw.loss);
  std::printf("  ratio io_uring / raw:   %7.2f\n", t.raw.pps > 0 ? t.uring.pps / t.raw.pps : 0.0);
  // Zero-copy sends against copying ones, for the segments uroce sends (a 4 KiB-MTU RoCEv2 packet).
  const auto gso = uroce::wire::RunGsoBench(4136, seconds);
  if (gso.error != 0) {
    std::printf("UDP GSO + GRO: refused here (%s)\n", std::strerror(-gso.error));
    return 0;
  }
  std::printf("UDP GSO + GRO, 4136 B:    %7.0f segments/s %6.2f Gbit/s\n", gso.gso.pps, gso.gso.gbps);
  const auto zc = uroce::wire::RunGsoZeroCopyBench(4136, seconds);
  if (zc.error != 0) {
    std::printf("  zero-copy sends: refused here (%s)\n", std::strerror(-zc.error));
    return 0;
  }
  std::printf("  zero-copy (io_uring):   %7.0f segments/s %6.2f Gbit/s  ratio %.2f; the kernel copied %llu of %llu sends\n",
              zc.gso_zero_copy.pps, zc.gso_zero_copy.gbps, gso.gso.pps > 0 ? zc.gso_zero_copy.pps / gso.gso.pps : 0.0,
              static_cast<unsigned long long>(zc.zero_copy_copied),
              static_cast<unsigned long long>(zc.zero_copy_notifications));
  return 0;
}

// Half the round trip of a 2-byte UDP datagram bounced between two threads on loopback: the floor under any
// RoCE-over-UDP latency on this machine (the baseline `uroce bench rc` prints beside ib_send_lat and ib_write_lat).
// `busy`: both threads spin on a non-blocking recv, as a polling RDMA application does — the floor the latency goal
// is measured against; otherwise they block in the kernel and each message pays a thread wake-up.
int BenchUdpLatency(double seconds, bool busy) {
  int a = socket(AF_INET, SOCK_DGRAM, 0), b = socket(AF_INET, SOCK_DGRAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  sockaddr_in aa = addr, ba = addr;
  if (bind(a, reinterpret_cast<sockaddr*>(&aa), sizeof aa) || bind(b, reinterpret_cast<sockaddr*>(&ba), sizeof ba)) {
    std::perror("bind");
    return 1;
  }
  getsockname(a, reinterpret_cast<sockaddr*>(&aa), &len);
  getsockname(b, reinterpret_cast<sockaddr*>(&ba), &len);
  connect(a, reinterpret_cast<sockaddr*>(&ba), sizeof ba);
  connect(b, reinterpret_cast<sockaddr*>(&aa), sizeof aa);
  std::atomic<bool> stop{false};
  // One receive: spinning on MSG_DONTWAIT (busy) or blocking (bounded, so the echo thread notices the end).
  auto receive = [&](int fd, char* buf, size_t size) -> ssize_t {
    while (!stop.load(std::memory_order_relaxed)) {
      if (busy) {
        const ssize_t n = recv(fd, buf, size, MSG_DONTWAIT);
        if (n >= 0 || errno != EAGAIN) return n;
      } else {
        pollfd p{fd, POLLIN, 0};
        if (poll(&p, 1, 100) == 1) return recv(fd, buf, size, 0);
      }
    }
    return -1;
  };
  std::thread echo([&] {
    char buf[16];
    while (!stop.load()) {
      if (receive(b, buf, sizeof buf) > 0) send(b, buf, 2, 0);
    }
  });
  char buf[16] = {1, 2};
  uint64_t n = 0;
  const auto t0 = std::chrono::steady_clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
  while (elapsed() < seconds) {
    send(a, buf, 2, 0);
    if (receive(a, buf, sizeof buf) != 2) break;
    ++n;
  }
  const double t = elapsed();
  stop = true;
  echo.join();
  close(a);
  close(b);
  std::printf("%.2f\n", n ? t / n / 2 * 1e6 : 0.0);
  return 0;
}

// Raw UDP throughput of `frame`-byte datagrams on loopback, two baselines for ib_write_bw, in GB/s on one line:
// one datagram per packet (sendmmsg/recvmmsg) and the ceiling (UDP GSO sends received through UDP GRO).
int BenchUdpThroughput(double seconds, size_t frame) {
  const auto raw = uroce::wire::RunTransportBench(frame, seconds);
  if (raw.error != 0) return 1;
  const auto gso = uroce::wire::RunGsoBench(frame, seconds);
  if (gso.error != 0) {
    std::fprintf(stderr, "UDP GSO/GRO refused here: %s\n", std::strerror(-gso.error));
    return 1;
  }
  std::printf("%.3f %.3f\n", raw.raw.gbps / 8, gso.gso.gbps / 8);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  double seconds = 1.0;
  size_t frame = 4136;  // a segment the size of a 4 KiB-MTU RoCEv2 packet (BTH + RETH + 4096 + ICRC) with room to spare
  bool busy = false;
  std::string what;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--seconds") == 0 && i + 1 < argc) {
      seconds = std::atof(argv[++i]);
    } else if (std::strcmp(argv[i], "--frame") == 0 && i + 1 < argc) {
      frame = size_t(std::atol(argv[++i]));
    } else if (std::strcmp(argv[i], "--busy") == 0) {
      busy = true;
    } else {
      what = argv[i];
    }
  }
  if (what == "wire") return BenchWire(seconds);
  if (what == "udp-lat") return BenchUdpLatency(seconds, busy);
  if (what == "udp-gbps") return BenchUdpThroughput(seconds, frame);
  std::fprintf(stderr, "usage: uroce_bench wire|udp-lat [--busy]|udp-gbps [--frame BYTES] [--seconds S]\n");
  return 2;
}
