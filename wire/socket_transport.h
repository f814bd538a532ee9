// SocketTransport: RoCEv2 datagrams over a plain UDP socket with recvmmsg(2) / sendmmsg(2) and poll(2), for where
// io_uring is refused (the default seccomp profile of Docker >= 25 and containerd 2.0, kernel.io_uring_disabled,
// kernels without CONFIG_IO_URING). The same socket and options as UringTransport (wire/udp_socket.h), so a peer
// cannot tell the two apart.
//
//  - Send: sendmmsg in chunks of Options::batch straight from the caller's payloads, from any thread without a lock
//    (the kernel serialises writers of one socket, and a datagram is sent whole or not at all). The socket blocks
//    while its send buffer is full, as UringTransport waits for a free slot. A datagram the kernel refuses
//    (EACCES for broadcast, ENETUNREACH, ...) is counted in send_errors / last_send_error and skipped, as a failed
//    send completion is in UringTransport: this is a datagram network.
//    Runs of equal-size datagrams to one destination leave as one UDP_SEGMENT message (wire/udp_socket.h), with each
//    ICRC re-sealed for the IP ID its segment gets; a run the kernel refuses is sent again one datagram at a time.
//  - Poll: MSG_DONTWAIT receives into transport-owned buffers (each a datagram, or a UDP_GRO run split back into its
//    datagrams): one recvmsg after an empty poll, recvmmsg of up to Options::batch while receives come back full;
//    when nothing is queued, ppoll(2) on the socket and a wake-up eventfd, so an idle Poll blocks in the kernel. The
//    handler runs holding no lock (it may Send).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "wire/address.h"
#include "wire/transport.h"
#include "wire/udp_socket.h"

namespace uroce::wire {

struct SocketTransportOptions {
  unsigned batch = 64;                // most receives per recvmmsg, datagrams per sendmmsg call
  size_t max_datagram = 9216;         // larger received datagrams are truncated: counted and not delivered
  int socket_buffer_bytes = 64 << 20;  // SO_RCVBUF / SO_SNDBUF wanted (0: leave the system default)
  bool udp_offloads = true;           // UDP_SEGMENT sends and UDP_GRO receives where the kernel has them
  bool responses_first = false;       // RoCE responses of a UDP_GRO run before its requests (DeliverReceived)
};

class SocketTransport final : public Transport {
 public:
  using Options = SocketTransportOptions;

  // Binds a UDP socket to `bind` (port 0: an ephemeral port; local() tells which). Returns 0 and fills *out, or
  // -errno: -EADDRINUSE, -EADDRNOTAVAIL, -EAFNOSUPPORT, -EINVAL for bad options.
  static int Create(const UdpEndpoint& bind, const Options& options, std::unique_ptr<SocketTransport>* out);
  static int Create(const UdpEndpoint& bind, std::unique_ptr<SocketTransport>* out) {
    return Create(bind, Options{}, out);
  }

  ~SocketTransport() override;
  SocketTransport(const SocketTransport&) = delete;
  SocketTransport& operator=(const SocketTransport&) = delete;

  UdpEndpoint local() const override { return local_; }
  // A UDP socket sends from its bound port whatever src_port says; IPv4 DF datagrams leave with ID 0.
  Flow OutgoingFlow(const UdpEndpoint& dst, uint16_t src_port) const override { return Flow{local_, dst, 0}; }
  // Returns the number handed to the kernel (refused ones included, counted as send errors); -EMSGSIZE for a
  // payload above max_datagram, -EAFNOSUPPORT for an IPv6 destination from an IPv4 socket (both only when it is the
  // first of the batch; otherwise the count before it).
  int Send(std::span<const OutDatagram> batch) override;
  int Poll(const DatagramHandler& handler, int64_t timeout_ns) override;
  void Wake() override;

  UdpCounters counters() const { return counters_.Snapshot(); }
  int fd() const { return fd_; }
  bool segmenting() const { return gso_.load(std::memory_order_relaxed); }  // UDP_SEGMENT in use
  bool coalescing() const { return gro_; }                                   // UDP_GRO in use

 private:
  SocketTransport() = default;
  int Init(const UdpEndpoint& bind, const Options& options);

  Options options_;
  UdpEndpoint local_;
  int fd_ = -1;
  int family_ = 0;
  int wake_fd_ = -1;
  UdpCounterSet counters_;
  // Turned off for good when the kernel refuses a UDP_SEGMENT send with EIO (no checksum offload on the route).
  std::atomic<bool> gso_{false};
  bool gro_ = false;

  DatagramReceiver receiver_;  // the polling thread only
};

}  // namespace uroce::wire
