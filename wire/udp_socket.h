// What the two UDP socket transports (UringTransport, SocketTransport) share: the socket RoCEv2 needs, address
// conversion, reading a received datagram's addresses, and their counters. One place, so that the two cannot
// disagree on what leaves the host (the sender's ICRC depends on it) or on what a receiver reports.
//
// Socket options (OpenRoceUdpSocket): IP_MTU_DISCOVER = IP_PMTUDISC_DO (ip(7)) makes IPv4 datagrams DF, which Linux
// sends from an unconnected socket with IP ID 0, the value the sender's ICRC assumed (DESIGN.md, wire facts);
// IP_PKTINFO / IPV6_RECVPKTINFO (ip(7), ipv6(7)) tell which local address a datagram was sent to; SO_RCVBUFFORCE /
// SO_SNDBUFFORCE (socket(7), needs CAP_NET_ADMIN) with a silent fall-back to SO_RCVBUF / SO_SNDBUF.
#pragma once

#include <sys/socket.h>
#include <sys/uio.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "wire/address.h"
#include "wire/transport.h"

namespace uroce::wire {

// Room for one IP_PKTINFO and one IPV6_PKTINFO control message (an IPv6 socket may carry either).
inline constexpr size_t kPktinfoControlBytes = 128;

struct UdpCounters {
  uint64_t packets_sent = 0;  // datagrams the kernel accepted
  uint64_t bytes_sent = 0;
  uint64_t send_errors = 0;   // datagrams the kernel refused (counted and dropped: a datagram network)
  int last_send_error = 0;    // -errno of the latest refused datagram
  uint64_t packets_received = 0;
  uint64_t bytes_received = 0;
  uint64_t receive_truncations = 0;  // datagrams longer than max_datagram (dropped)
  uint64_t receive_errors = 0;       // receives that failed or carried an unreadable source address
};

// The counters a transport updates from any thread.
class UdpCounterSet {
 public:
  void Sent(size_t bytes);
  void SendFailed(int negative_errno);
  void Received(size_t bytes);
  void Truncated() { receive_truncations_.fetch_add(1, std::memory_order_relaxed); }
  void ReceiveFailed() { receive_errors_.fetch_add(1, std::memory_order_relaxed); }
  UdpCounters Snapshot() const;

 private:
  std::atomic<uint64_t> packets_sent_{0}, bytes_sent_{0}, send_errors_{0};
  std::atomic<int> last_send_error_{0};
  std::atomic<uint64_t> packets_received_{0}, bytes_received_{0}, receive_truncations_{0}, receive_errors_{0};
};

// Opens a UDP socket (blocking, close-on-exec) with the options above, bound to `bind` (port 0: an ephemeral port),
// and stores the bound endpoint in *local. `buffer_bytes` is the SO_RCVBUF / SO_SNDBUF wanted (0: the system
// default). Returns the descriptor, or -errno (-EADDRINUSE, -EADDRNOTAVAIL, -EAFNOSUPPORT, ...).
int OpenRoceUdpSocket(const UdpEndpoint& bind, int buffer_bytes, UdpEndpoint* local);

// The socket family OpenRoceUdpSocket uses for `bind`.
inline int SocketFamily(const UdpEndpoint& bind) { return bind.addr.is_v4() ? AF_INET : AF_INET6; }

// Fills `sa` for `ep` on a socket of `family`; -EAFNOSUPPORT for an IPv6 endpoint on an IPv4 socket.
int ToSockaddr(const UdpEndpoint& ep, int family, sockaddr_storage* sa, socklen_t* len);
// Reads an AF_INET / AF_INET6 socket address; false for anything else or a short length.
bool FromSockaddr(const void* sa, socklen_t len, UdpEndpoint* ep);

// Hands one received datagram to `handler`: source from msg_name, destination `local` with the address of the
// IP_PKTINFO / IPV6_PKTINFO control message, arrival time on CLOCK_MONOTONIC. A truncated datagram (MSG_TRUNC in
// `msg_flags`) or one with an unreadable source is counted and not delivered. Returns whether it was delivered.
bool DeliverReceived(const DatagramHandler& handler, const msghdr& msg, std::span<const uint8_t> payload,
                     int msg_flags, const UdpEndpoint& local, UdpCounterSet& counters);

// Batched non-blocking receive straight from a UDP socket: one recvmmsg(MSG_DONTWAIT) of up to `batch` datagrams
// into buffers it owns. SocketTransport receives only this way; UringTransport does while its receive side is
// handed to the application (Transport::SetReceiveWatched). One thread at a time uses an instance.
class DatagramReceiver {
 public:
  // 0, -EINVAL for a batch or size of 0, -ENOMEM.
  int Init(unsigned batch, size_t max_datagram);
  // Delivers what is queued on `fd`. Returns the number delivered (0 when every datagram received was dropped as
  // truncated), -EAGAIN when nothing was queued, or -errno.
  int Receive(int fd, const DatagramHandler& handler, const UdpEndpoint& local, UdpCounterSet& counters);
  // Transport::Poll on `fd` alone: Receive, and while nothing is queued sleep in ppoll(2) on `fd` and the eventfd
  // `wake_fd` (whose token, once read, ends the Poll with 0) up to timeout_ns (0: do not wait; negative: no limit).
  int Poll(int fd, int wake_fd, const DatagramHandler& handler, const UdpEndpoint& local, UdpCounterSet& counters,
           int64_t timeout_ns);

 private:
  struct Slot {
    iovec iov{};
    sockaddr_storage addr{};
    alignas(cmsghdr) uint8_t control[kPktinfoControlBytes]{};
  };
  size_t max_datagram_ = 0;
  std::unique_ptr<uint8_t[]> buffers_;
  std::vector<Slot> slots_;
  std::vector<mmsghdr> msgs_;
};

// Reads an eventfd until it is empty (the descriptor must be non-blocking).
void DrainEventFd(int fd);

}  // namespace uroce::wire
