// Loopback throughput of UringTransport against plain sendmmsg/recvmmsg sockets (batch 32) and against UDP GSO + GRO
// (the machine's ceiling for a stream of datagrams), in one run, so that `uroce bench wire` and `uroce bench rc` show
// what the io_uring path costs or gains on this machine. One thread sends, another
// receives; the sender keeps at most `window` datagrams in flight (a credit scheme), because loopback UDP silently
// drops what overflows the receive buffer, and that would measure the drop path instead of the transport.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace uroce::wire {

struct TransportBenchResult {
  size_t frame_bytes = 0;  // UDP payload bytes per datagram
  double seconds = 0;      // measured duration of each half
  size_t window = 0;       // datagrams allowed in flight

  // UringTransport (multishot receive when the kernel has it).
  double uring_pps = 0;   // datagrams received per second
  double uring_gbps = 0;  // payload gigabits received per second
  uint64_t uring_sent = 0, uring_received = 0;
  double uring_loss = 0;  // 1 - received / sent, after a short drain
  bool uring_multishot = false;

  // Plain sockets, sendmmsg / recvmmsg, batch 32.
  double raw_pps = 0;
  double raw_gbps = 0;
  uint64_t raw_sent = 0, raw_received = 0;
  double raw_loss = 0;

  // Plain sockets with UDP GSO and GRO: each send is up to 64 KiB of `frame_bytes` segments (UDP_SEGMENT), which
  // the receiver takes back as coalesced buffers (UDP_GRO). Counted in segments, so comparable with the two above:
  // the loopback ceiling for a stream of packets of this size.
  double gso_pps = 0;
  double gso_gbps = 0;
  uint64_t gso_sent = 0, gso_received = 0;
  double gso_loss = 0;

  int error = 0;  // -errno when a half could not be set up (its figures stay 0)

  std::string ToString() const;  // one human-readable paragraph
};

TransportBenchResult RunTransportBench(size_t frame_bytes = 4096, double seconds = 1.0, size_t window = 512);

// Only the GSO + GRO half (fills the gso_* fields; error when the kernel refuses UDP_SEGMENT or UDP_GRO).
TransportBenchResult RunGsoBench(size_t frame_bytes, double seconds, size_t window = 512);

}  // namespace uroce::wire
