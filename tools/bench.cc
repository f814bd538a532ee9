// `uroce bench wire`: the wire layer's speed as ratios against baselines measured in the same run — ICRC against
// memcpy of the same 4 KiB packets, the io_uring UDP transport against raw sendmmsg/recvmmsg on loopback, and
// io_uring zero-copy UDP GSO sends against copying ones.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <x86intrin.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <new>
#include <cstdio>
#include <thread>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "wire/icrc_bench.h"
#include "wire/transport_bench.h"
#include "wire/udp_socket.h"

namespace {

int BenchWire(double seconds) {
  const auto icrc = uroce::wire::RunIcrcBench(4096, seconds);
  std::printf("ICRC, 4 KiB packets:      %7.2f GB/s   (slice-by-8 %5.2f GB/s; folding on %u-bit registers)\n",
              icrc.icrc_gbps, icrc.crc_slice8_gbps, icrc.fold_bits);
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
// `busy`: both threads spin on a non-blocking receive, as a polling RDMA application does -- the floor the latency
// goal is measured against; otherwise they block in the kernel and each message pays a thread wake-up.
// `roce`: the same bounce sent the way uroce must send it, for reference: uroce's own sockets (wire/udp_socket.h:
// DF, UDP_GRO), unconnected (a connected socket numbers IPv4 IDs from a random start, and the ICRC covers the ID),
// and each message two 20-byte datagrams -- a SEND and the held ACK of the peer's last one, which a ping-pong's
// requester needs before it completes -- as one UDP_SEGMENT send received as one UDP_GRO run (or one sendmmsg of two
// where the kernel lacks the offloads). What it costs above the floor is the kernel's, before any uroce code runs.
int BenchUdpLatency(double seconds, bool busy, bool roce) {
  using namespace uroce::wire;
  constexpr size_t kSegment = 20;  // BTH + 2-byte payload + pad + ICRC, and BTH + AETH + ICRC
  int a, b;
  UdpEndpoint aa, ba;
  bool gso = false, gro = false;
  if (roce) {
    a = OpenRoceUdpSocket({IpAddress::V4(INADDR_LOOPBACK), 0}, 8 << 20, &aa);
    b = OpenRoceUdpSocket({IpAddress::V4(INADDR_LOOPBACK), 0}, 8 << 20, &ba);
    if (a < 0 || b < 0) {
      std::fprintf(stderr, "socket: %s\n", std::strerror(-(a < 0 ? a : b)));
      return 1;
    }
    bool gso_b, gro_b;
    EnableUdpOffloads(a, &gso, &gro);
    EnableUdpOffloads(b, &gso_b, &gro_b);
    gso = gso && gso_b && gro && gro_b;
  } else {
    a = socket(AF_INET, SOCK_DGRAM, 0);
    b = socket(AF_INET, SOCK_DGRAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof addr;
    sockaddr_in as = addr, bs = addr;
    if (bind(a, reinterpret_cast<sockaddr*>(&as), sizeof as) || bind(b, reinterpret_cast<sockaddr*>(&bs), sizeof bs)) {
      std::perror("bind");
      return 1;
    }
    getsockname(a, reinterpret_cast<sockaddr*>(&as), &len);
    getsockname(b, reinterpret_cast<sockaddr*>(&bs), &len);
    connect(a, reinterpret_cast<sockaddr*>(&bs), sizeof bs);
    connect(b, reinterpret_cast<sockaddr*>(&as), sizeof as);
  }
  const size_t message = roce ? 2 * kSegment : 2;
  std::atomic<bool> stop{false};
  // One receive: spinning on MSG_DONTWAIT (busy) or blocking (bounded, so the echo thread notices the end).
  auto receive_one = [&](int fd, char* buf, size_t size) -> ssize_t {
    while (!stop.load(std::memory_order_relaxed)) {
      if (busy) {
        ssize_t n;
        if (roce) {  // as uroce reads: the sender's address and the GRO control message with it
          sockaddr_storage from;
          alignas(cmsghdr) uint8_t control[kReceiveControlBytes];
          iovec iov{buf, size};
          msghdr m{};
          m.msg_name = &from;
          m.msg_namelen = sizeof from;
          m.msg_iov = &iov;
          m.msg_iovlen = 1;
          m.msg_control = control;
          m.msg_controllen = sizeof control;
          n = recvmsg(fd, &m, MSG_DONTWAIT);
        } else {
          n = recv(fd, buf, size, MSG_DONTWAIT);
        }
        if (n >= 0 || errno != EAGAIN) return n;
      } else {
        pollfd p{fd, POLLIN, 0};
        if (poll(&p, 1, 100) == 1) return recv(fd, buf, size, 0);
      }
    }
    return -1;
  };
  // A whole message: one datagram, one GRO run, or (without the offloads) its two datagrams.
  auto receive = [&](int fd, char* buf, size_t size) -> ssize_t {
    size_t got = 0;
    while (got < message) {
      const ssize_t n = receive_one(fd, buf, size);
      if (n <= 0) return n;
      got += size_t(n);
    }
    return ssize_t(got);
  };
  auto send_message = [&](int fd, const UdpEndpoint& to, char* buf) {
    if (!roce) {
      send(fd, buf, message, 0);
      return;
    }
    sockaddr_storage sa;
    socklen_t sa_len;
    ToSockaddr(to, AF_INET, &sa, &sa_len);
    alignas(cmsghdr) uint8_t control[kUdpSegmentControlBytes];
    iovec iov[2] = {{buf, kSegment}, {buf + kSegment, kSegment}};
    mmsghdr m[2]{};
    for (int i = 0; i < 2; ++i) {
      m[i].msg_hdr.msg_name = &sa;
      m[i].msg_hdr.msg_namelen = sa_len;
      m[i].msg_hdr.msg_iov = &iov[i];
      m[i].msg_hdr.msg_iovlen = 1;
    }
    if (gso) {
      iov[0].iov_len = 2 * kSegment;
      SetUdpSegmentControl(&m[0].msg_hdr, control, kSegment);
    }
    sendmmsg(fd, m, gso ? 1 : 2, 0);
  };
  std::thread echo([&] {
    char buf[64] = {};
    while (!stop.load()) {
      if (receive(b, buf, sizeof buf) > 0) send_message(b, aa, buf);
    }
  });
  char buf[64] = {1, 2};
  uint64_t n = 0;
  const auto t0 = std::chrono::steady_clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
  while (elapsed() < seconds) {
    send_message(a, ba, buf);
    if (receive(a, buf, sizeof buf) != ssize_t(message)) break;
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

// CLOCK_MONOTONIC in nanoseconds: what the floor calibrates its work and the CPU's tick counter against.
double MonotonicNs() {
  timespec t{};
  clock_gettime(CLOCK_MONOTONIC, &t);
  return double(t.tv_sec) * 1e9 + double(t.tv_nsec);
}

// A loop of `rounds` steps that the compiler cannot fold: fixed work, whose time grows by whatever interrupts it.
uint64_t Work(uint64_t rounds, uint64_t seed) {
  for (uint64_t i = 0; i < rounds; ++i) {
    seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
    asm volatile("" : "+r"(seed));
  }
  return seed;
}

// How many Work steps take `us` microseconds here: the fastest of several timings (the others were interrupted).
uint64_t WorkRoundsFor(double us) {
  if (us <= 0) return 0;
  constexpr uint64_t kProbe = 20000;
  double best_ns = 0;
  for (int i = 0; i < 20; ++i) {
    const double start = MonotonicNs();
    Work(kProbe, uint64_t(i));
    const double ns = MonotonicNs() - start;
    if (ns > 0 && (best_ns == 0 || ns < best_ns)) best_ns = ns;
  }
  return best_ns > 0 ? uint64_t(double(kProbe) * us * 1e3 / best_ns) : 0;
}

// The floor under any device's latency tail on this machine: two processes bounce a counter through one shared page,
// each spinning on it and doing `work_us` of fixed work (Work) before it answers, and every half round trip is a
// sample, as perftest's are. No system call, no device, nothing
// but the two processes' CPUs: what is left in the tail is the machine's own (timer interrupts, the host taking a
// vCPU, other threads). `bench vs-rxe` runs it in its guest beside the perftest pairs, where that floor decides
// whether a p99.9 within 10x of the typical latency can be had at all. Prints "TYPICAL P99.9" in us (perftest's
// "typical" is the median). Times are read from the CPU's tick counter (a TCG guest's kernel clock is an emulated
// HPET, a system call per reading), calibrated against CLOCK_MONOTONIC over the whole run.
int BenchSharedMemoryLatency(uint64_t iterations, double work_us) {
  const uint64_t work = WorkRoundsFor(work_us);
  struct alignas(64) Line {
    std::atomic<uint64_t> value{0};
  };
  void* page = mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (page == MAP_FAILED) {
    std::perror("mmap");
    return 1;
  }
  Line* ping = new (page) Line;
  Line* pong = new (static_cast<char*>(page) + 64) Line;
  const pid_t child = fork();
  if (child < 0) {
    std::perror("fork");
    return 1;
  }
  if (child == 0) {  // the echo: answers each ping with its number, until the last
    for (uint64_t i = 1; i <= iterations; ++i) {
      while (ping->value.load(std::memory_order_acquire) != i) _mm_pause();
      Work(work, i);  // the answer's own work
      pong->value.store(i, std::memory_order_release);
    }
    _exit(0);
  }
  std::vector<uint64_t> ticks(iterations);
  const double start_ns = MonotonicNs();
  const uint64_t first = __rdtsc();
  int status = 0;
  for (uint64_t i = 1; i <= iterations; ++i) {
    const uint64_t t0 = __rdtsc();
    Work(work, i);  // the message's own work
    ping->value.store(i, std::memory_order_release);
    for (uint64_t spins = 1; pong->value.load(std::memory_order_acquire) != i; ++spins) {
      _mm_pause();
      // An echo that died (killed, out of memory) never answers: look for it now and then rather than spin forever.
      if (spins % (uint64_t{1} << 20) == 0 && waitpid(child, &status, WNOHANG) == child) {
        std::fprintf(stderr, "shm-lat: the echo process ended at round trip %llu\n",
                     static_cast<unsigned long long>(i));
        munmap(page, 4096);
        return 1;
      }
    }
    ticks[i - 1] = __rdtsc() - t0;
  }
  const uint64_t last = __rdtsc();
  const double ns = MonotonicNs() - start_ns;
  waitpid(child, &status, 0);
  munmap(page, 4096);
  if (iterations == 0 || last <= first || ns <= 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::fprintf(stderr, "shm-lat: no measurement\n");
    return 1;
  }
  const double us_per_tick = ns / double(last - first) / 1e3;
  std::sort(ticks.begin(), ticks.end());
  auto at = [&](double fraction) {  // perftest's percentile: the sample at that place of the sorted run
    const size_t i = std::min(iterations - 1, uint64_t(double(iterations) * fraction));
    return double(ticks[i]) * us_per_tick / 2;  // half a round trip, as perftest's latencies
  };
  std::printf("%.3f %.3f\n", at(0.5), at(0.999));
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

// Moves the calling thread into the network namespace `name` of ip-netns(8) (root), or back into the one `fd` names.
// 0 or -errno.
int EnterNetworkNamespace(const std::string& name) {
  const int fd = open(("/var/run/netns/" + name).c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -errno;
  const int r = setns(fd, CLONE_NEWNET) < 0 ? -errno : 0;
  close(fd);
  return r;
}

// `udp-gbps --between RX_NETNS RX_ADDR TX_NETNS`: the GSO + GRO stream from a socket in one network namespace to one
// bound at RX_ADDR in another (a veth pair's two ends, say): what the kernel itself moves over that path, as the
// loopback stream is for loopback. Each socket is opened in its namespace and keeps it after the thread has left.
int BenchUdpThroughputBetween(const std::string& rx_netns, const std::string& rx_addr, const std::string& tx_netns,
                              double seconds, size_t frame) {
  const auto at = uroce::wire::IpAddress::Parse(rx_addr);
  if (!at) {
    std::fprintf(stderr, "not an address: %s\n", rx_addr.c_str());
    return 2;
  }
  const int home = open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
  if (home < 0) return 1;
  uroce::wire::UdpEndpoint rx_at, tx_at;
  int rx = -1, tx = -1, error = EnterNetworkNamespace(rx_netns);
  if (error == 0 && (rx = uroce::wire::OpenStreamSocket(*at, &rx_at)) < 0) error = rx;
  if (error == 0) error = EnterNetworkNamespace(tx_netns);
  // The wildcard of the receiver's family.
  const auto any = at->is_v4() ? uroce::wire::IpAddress::V4(0) : uroce::wire::IpAddress();
  if (error == 0 && (tx = uroce::wire::OpenStreamSocket(any, &tx_at)) < 0) error = tx;
  if (setns(home, CLONE_NEWNET) < 0 && error == 0) error = -errno;
  close(home);
  uroce::wire::TransportBenchResult gso;
  if (error == 0) gso = uroce::wire::RunGsoBenchBetween(rx, rx_at, tx, frame, seconds);
  if (rx >= 0) close(rx);
  if (tx >= 0) close(tx);
  if (error == 0) error = gso.error;
  if (error != 0) {
    std::fprintf(stderr, "the stream from %s to %s in %s: %s\n", tx_netns.c_str(), rx_addr.c_str(), rx_netns.c_str(),
                 std::strerror(-error));
    return 1;
  }
  std::printf("%.3f\n", gso.gso.gbps / 8);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  double seconds = 1.0;
  size_t frame = 4136;  // a segment the size of a 4 KiB-MTU RoCEv2 packet (BTH + RETH + 4096 + ICRC) with room to spare
  uint64_t iterations = 5000;
  double work_us = 0;
  bool busy = false, roce = false;
  std::string what, between[3];
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--seconds") == 0 && i + 1 < argc) {
      seconds = std::atof(argv[++i]);
    } else if (std::strcmp(argv[i], "--between") == 0 && i + 3 < argc) {
      for (std::string& b : between) b = argv[++i];
    } else if (std::strcmp(argv[i], "--frame") == 0 && i + 1 < argc) {
      frame = size_t(std::atol(argv[++i]));
    } else if (std::strcmp(argv[i], "--iterations") == 0 && i + 1 < argc) {
      iterations = uint64_t(std::atoll(argv[++i]));
    } else if (std::strcmp(argv[i], "--work-us") == 0 && i + 1 < argc) {
      work_us = std::atof(argv[++i]);
    } else if (std::strcmp(argv[i], "--busy") == 0) {
      busy = true;
    } else if (std::strcmp(argv[i], "--roce") == 0) {
      roce = busy = true;
    } else {
      what = argv[i];
    }
  }
  if (what == "wire") return BenchWire(seconds);
  if (what == "udp-lat") return BenchUdpLatency(seconds, busy, roce);
  if (what == "udp-gbps" && !between[0].empty())
    return BenchUdpThroughputBetween(between[0], between[1], between[2], seconds, frame);
  if (what == "udp-gbps") return BenchUdpThroughput(seconds, frame);
  if (what == "shm-lat") return BenchSharedMemoryLatency(iterations, work_us);
  std::fprintf(stderr,
               "usage: uroce_bench wire|udp-lat [--busy|--roce]|"
               "udp-gbps [--frame BYTES] [--seconds S] [--between RX_NETNS RX_ADDR TX_NETNS]|"
               "shm-lat [--iterations N] [--work-us US]\n");
  return 2;
}
