// Loopback throughput of UringTransport against plain sendmmsg/recvmmsg sockets (batch 32) and against UDP GSO + GRO
// (the machine's ceiling for a stream of datagrams), in one run, so that `uroce bench wire` and `uroce bench rc` show
// what the io_uring path costs or gains on this machine. One thread sends, another
// receives; the sender keeps at most `window` datagrams in flight (a credit scheme), because loopback UDP silently
// drops what overflows the receive buffer, and that would measure the drop path instead of the transport.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "wire/address.h"

namespace uroce::wire {

// One stream's figures: what the sender sent and the receiver got in time.
struct StreamFigures {
  double pps = 0;   // datagrams (GSO: segments) received per second
  double gbps = 0;  // payload gigabits received per second
  uint64_t sent = 0, received = 0;
  double loss = 0;  // 1 - received / sent, after a short drain
};

struct TransportBenchResult {
  size_t frame_bytes = 0;  // UDP payload bytes per datagram
  double seconds = 0;      // measured duration of each half
  size_t window = 0;       // datagrams allowed in flight

  StreamFigures uring;  // UringTransport (multishot receive when the kernel has it)
  bool uring_multishot = false;
  StreamFigures raw;    // plain sockets, sendmmsg / recvmmsg, batch 32
  // Plain sockets with UDP GSO and GRO: each send is up to 64 KiB of `frame_bytes` segments (UDP_SEGMENT), which
  // the receiver takes back as coalesced buffers (UDP_GRO). Counted in segments, so comparable with the two above:
  // the loopback ceiling for a stream of packets of this size (RunGsoBench only).
  StreamFigures gso;
  // The same stream sent by io_uring without copying (IORING_OP_SENDMSG_ZC, RunGsoZeroCopyBench only), and how many
  // of its sends the kernel reported done and, of those, copied after all (it copies what it delivers to a socket of
  // this host).
  StreamFigures gso_zero_copy;
  uint64_t zero_copy_notifications = 0, zero_copy_copied = 0;

  int error = 0;  // -errno when a half could not be set up (its figures stay 0)

  std::string ToString() const;  // one human-readable paragraph
};

TransportBenchResult RunTransportBench(size_t frame_bytes = 4096, double seconds = 1.0, size_t window = 512);

// Only the GSO + GRO half (fills the gso_* fields; error when the kernel refuses UDP_SEGMENT or UDP_GRO).
TransportBenchResult RunGsoBench(size_t frame_bytes, double seconds, size_t window = 512);

// A socket for a stream between two places the caller chooses instead of two sockets on 127.0.0.1: opened as the
// loopback ones are (uroce's UDP socket, 8 MiB buffers) and bound to `at` port 0, in the network namespace the calling
// thread is in (a caller that moves between namespaces with setns(2) can open the two ends in two of them). The fd,
// with its bound endpoint in *bound, or -errno.
int OpenStreamSocket(const IpAddress& at, UdpEndpoint* bound);

// The GSO + GRO stream (as RunGsoBench) from `tx` to `rx`, bound at `rx_at`: e.g. across a veth pair between two
// network namespaces, the kernel's own ceiling for that path. Neither socket is closed here.
TransportBenchResult RunGsoBenchBetween(int rx, const UdpEndpoint& rx_at, int tx, size_t frame_bytes, double seconds,
                                        size_t window = 512);

// The GSO + GRO stream with zero-copy sends (fills gso_zero_copy and the zero_copy_* counts; error when the kernel
// refuses io_uring or IORING_OP_SENDMSG_ZC, before 6.1).
TransportBenchResult RunGsoZeroCopyBench(size_t frame_bytes, double seconds, size_t window = 512);

}  // namespace uroce::wire
