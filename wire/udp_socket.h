// What the two UDP socket transports (UringTransport, SocketTransport) share: the socket RoCEv2 needs, address
// conversion, reading a received datagram's addresses, and their counters. One place, so that the two cannot
// disagree on what leaves the host (the sender's ICRC depends on it) or on what a receiver reports.
//
// Socket options (OpenRoceUdpSocket): IP_MTU_DISCOVER = IP_PMTUDISC_DO (ip(7)) makes IPv4 datagrams DF, which Linux
// sends from an unconnected socket with IP ID 0, the value the sender's ICRC assumed (DESIGN.md, wire facts);
// IP_PKTINFO / IPV6_RECVPKTINFO (ip(7), ipv6(7)) tell which local address a datagram was sent to, asked for only on
// a wildcard bind (a socket bound to one address receives only what is sent to it); SO_RCVBUFFORCE /
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

// Room for the control messages of one receive: IP_PKTINFO or IPV6_PKTINFO (an IPv6 socket may carry either) and
// UDP_GRO.
inline constexpr size_t kReceiveControlBytes = 128;

// UDP segmentation offload (udp(7)). One sendmsg with a UDP_SEGMENT control message (Linux 4.18) carries a run of
// datagrams of one size (the last may be shorter) to one destination; the kernel sends each as its own datagram, so a
// peer cannot tell, but pays for one system call and one trip through the stack. With UDP_GRO set (Linux 5.0) one
// receive returns such a run whole, with its segment size in a control message. On loopback and veth a run crosses
// whole; where it is split in software or by a NIC, IPv4 segment k carries Identification base + k, base being 0 for
// DF datagrams from an unconnected socket (wire/segmented_wire_test shows it), so a sender re-seals each ICRC for it.
inline constexpr size_t kMaxGsoSegments = 64;  // UDP_MAX_SEGMENTS (later kernels take 128)
inline constexpr size_t kMaxGsoBytes = 65507;  // the largest IPv4 UDP payload: 65535 - 20 (IP) - 8 (UDP)
inline constexpr size_t kMaxGroBytes = 65535;  // room for the largest run one receive can return
inline constexpr size_t kUdpSegmentControlBytes = CMSG_SPACE(sizeof(uint16_t));
// A send's control messages: UDP_SEGMENT and the source address (IP_PKTINFO, or IPV6_PKTINFO's 20 bytes).
inline constexpr size_t kSendControlBytes = kUdpSegmentControlBytes + CMSG_SPACE(20);

// The bytes one receive buffer needs: a datagram of up to max_datagram, or with UDP_GRO a whole run (a run longer
// than its buffer would be truncated, all its datagrams lost). A single datagram above max_datagram is still refused
// (DeliverReceived).
inline size_t ReceiveBufferBytes(size_t max_datagram, bool gro) {
  return gro && max_datagram < kMaxGroBytes ? kMaxGroBytes : max_datagram;
}

// A UDP socket (socket(2): SOCK_DGRAM | SOCK_CLOEXEC | extra_flags), made by system call rather than through the C
// library's `socket`: librspreload (rsocket(7), LD_PRELOAD'ed to run unmodified socket programs over rsockets)
// replaces that symbol and makes every AF_INET / AF_INET6 socket an rsocket -- uroce's own UDP sockets included,
// the first of which is made while the library starts, so the program waited on its own start for ever. The
// descriptor, or -1 with errno.
int OpenKernelUdpSocket(int family, int extra_flags = 0);

struct UdpCounters {
  uint64_t packets_sent = 0;  // datagrams the kernel accepted
  uint64_t bytes_sent = 0;
  uint64_t send_errors = 0;   // datagrams the kernel refused (counted and dropped: a datagram network)
  int last_send_error = 0;    // -errno of the latest refused datagram
  uint64_t packets_received = 0;
  uint64_t bytes_received = 0;
  uint64_t receive_truncations = 0;  // datagrams longer than max_datagram (dropped)
  uint64_t receive_errors = 0;       // receives that failed or carried an unreadable source address
  uint64_t segmented_sends = 0;      // UDP_SEGMENT sends (each carried 2 or more of packets_sent)
  uint64_t coalesced_receives = 0;   // receives that returned a run of 2 or more of packets_received (UDP_GRO)
  // Datagrams the kernel dropped because the socket's receive buffer was full: a sender outran this receiver
  // (SO_RXQ_OVFL, socket(7)).
  uint64_t receive_overflows = 0;
};

// The counters a transport updates from any thread.
class UdpCounterSet {
 public:
  void Sent(size_t bytes, uint64_t packets = 1);
  void SendFailed(int negative_errno);
  void SegmentedSend() { segmented_sends_.fetch_add(1, std::memory_order_relaxed); }
  void Received(size_t bytes);
  void CoalescedReceive() { coalesced_receives_.fetch_add(1, std::memory_order_relaxed); }
  void Truncated() { receive_truncations_.fetch_add(1, std::memory_order_relaxed); }
  void ReceiveFailed() { receive_errors_.fetch_add(1, std::memory_order_relaxed); }
  // The socket's drop count so far (SO_RXQ_OVFL's control message holds the total, not the increase).
  void Overflowed(uint32_t total);
  UdpCounters Snapshot() const;

 private:
  std::atomic<uint64_t> packets_sent_{0}, bytes_sent_{0}, send_errors_{0};
  std::atomic<int> last_send_error_{0};
  std::atomic<uint64_t> packets_received_{0}, bytes_received_{0}, receive_truncations_{0}, receive_errors_{0};
  std::atomic<uint64_t> segmented_sends_{0}, coalesced_receives_{0}, receive_overflows_{0};
};

// Opens a UDP socket (blocking, close-on-exec) with the options above, bound to `bind` (port 0: an ephemeral port),
// and stores the bound endpoint in *local. `buffer_bytes` is the SO_RCVBUF / SO_SNDBUF wanted (0: the system
// default). `reuse_port`: SO_REUSEPORT, so that the socket joins the group of those bound to `bind` with it (the
// host's device service and its processes, wire/service_protocol.h's AttachOwnerSteering). Returns the descriptor,
// or -errno (-EADDRINUSE, -EADDRNOTAVAIL, -EAFNOSUPPORT, ...).
int OpenRoceUdpSocket(const UdpEndpoint& bind, int buffer_bytes, UdpEndpoint* local, bool reuse_port = false);

// Asks for UDP_SEGMENT sends and UDP_GRO receives on `fd`; *gso and *gro tell which the kernel has.
void EnableUdpOffloads(int fd, bool* gso, bool* gro);

// How many datagrams from the start of `batch` one UDP_SEGMENT send can carry: the same source address and destination,
// the first's size
// for all but a last that may be shorter, at most kMaxGsoSegments and kMaxGsoBytes. 1: the first goes alone.
size_t GsoRunLength(std::span<const OutDatagram> batch);

// The last 4 bytes datagram k of a UDP_SEGMENT run must carry: its ICRC re-sealed for IPv4 Identification k when it
// has one (OutDatagram::has_icrc, an IPv4 destination), else as given. Little-endian, as stored.
uint32_t GsoSegmentTrailer(const OutDatagram& dg, size_t k);

// Writes the UDP_SEGMENT control message for segments of `segment_size` bytes into `control`
// (kUdpSegmentControlBytes, cmsghdr-aligned) and points `msg` at it.
void SetUdpSegmentControl(msghdr* msg, uint8_t* control, uint16_t segment_size);

// Sends `batch` on `fd` with sendmmsg(2) straight from the datagrams' memory, up to `chunk` datagrams (at most
// kMaxSendChunk) per call; a run of equal-size datagrams to one destination goes as one UDP_SEGMENT message while
// `gso` holds (an EIO refusal turns it off for good), each ICRC re-sealed for its segment's IP ID, and a run refused
// whole goes again one datagram per message. A datagram the kernel refuses (EACCES for broadcast, ENETUNREACH, ...)
// is counted in `counters` and skipped: this is a datagram network. A datagram whose OutDatagram::src_addr is not
// `bound` (the socket's bound address, or the wildcard) leaves from that address (IP_PKTINFO / IPV6_PKTINFO, which
// the kernel takes over the bound one). `flags`: 0 blocks while the socket's send buffer is full; MSG_DONTWAIT stops
// there. Returns the number of datagrams sent or refused, which is less than the batch
// when a datagram cannot be sent at all or the buffer is full; or -EMSGSIZE (a payload above max_datagram),
// -EAFNOSUPPORT (an IPv6 destination or source on an IPv4 socket) or -EAGAIN (MSG_DONTWAIT, full) when that is so for the
// first.
inline constexpr size_t kMaxSendChunk = 64;
int SendDatagrams(int fd, int family, const IpAddress& bound, std::span<const OutDatagram> batch, size_t max_datagram,
                  size_t chunk, std::atomic<bool>& gso, UdpCounterSet& counters, int flags);

// The socket family OpenRoceUdpSocket uses for `bind`.
inline int SocketFamily(const UdpEndpoint& bind) { return bind.addr.is_v4() ? AF_INET : AF_INET6; }

// Fills `sa` for `ep` on a socket of `family`; -EAFNOSUPPORT for an IPv6 endpoint on an IPv4 socket.
int ToSockaddr(const UdpEndpoint& ep, int family, sockaddr_storage* sa, socklen_t* len);
// Reads an AF_INET / AF_INET6 socket address; false for anything else or a short length.
bool FromSockaddr(const void* sa, socklen_t len, UdpEndpoint* ep);

// Hands what one receive returned to `handler`, one datagram at a time (a UDP_GRO run is split at the segment size
// its control message gives): source from msg_name, destination `local` with the address of the IP_PKTINFO /
// IPV6_PKTINFO control message, arrival time on CLOCK_MONOTONIC. A truncated receive (MSG_TRUNC in `msg_flags`), a
// datagram longer than `max_datagram` or an unreadable source is counted and not delivered. With `responses_first`
// the RoCE acknowledgements and READ/atomic responses of a UDP_GRO run are handed over before its requests, each kind
// in its order (why: the definition). Returns how many datagrams were delivered.
int DeliverReceived(const DatagramHandler& handler, const msghdr& msg, std::span<const uint8_t> payload, int msg_flags,
                    const UdpEndpoint& local, size_t max_datagram, bool responses_first, UdpCounterSet& counters,
                    bool congested = false);

// Whether `fd`'s receive queue holds more than half of its receive buffer (SO_MEMINFO): the receiver is falling
// behind its senders, and a datagram taken now is marked InDatagram::congestion_experienced. Asked once per receive
// that returned at least kCongestionProbeBytes (a ping-pong's single datagrams never pay the system call).
inline constexpr size_t kCongestionProbeBytes = 32 * 1024;
bool ReceiveQueueCongested(int fd);

// Batched non-blocking receive straight from a UDP socket: one recvmmsg(MSG_DONTWAIT) of up to `batch` datagrams
// into buffers it owns. SocketTransport receives only this way; UringTransport does while its receive side is
// handed to the application (Transport::SetReceiveWatched). One thread at a time uses an instance.
class DatagramReceiver {
 public:
  // Up to `batch` receives per recvmmsg, each of up to max_datagram bytes, or of a whole UDP_GRO run (kMaxGroBytes)
  // when `gro` (EnableUdpOffloads said the socket has it); `responses_first` as DeliverReceived's. 0, -EINVAL for a
  // batch or size of 0, -ENOMEM.
  int Init(unsigned batch, size_t max_datagram, bool gro, bool responses_first = false);
  // Delivers what is queued on `fd`: after an empty receive one datagram (recvmsg), then twice as many each time a
  // receive came back full, up to `batch` (recvmmsg). Returns the number delivered (0 when every datagram received
  // was dropped as truncated), -EAGAIN when nothing was queued, or -errno.
  int Receive(int fd, const DatagramHandler& handler, const UdpEndpoint& local, UdpCounterSet& counters);
  // Transport::Poll on `fd` alone: Receive, and while nothing is queued sleep in ppoll(2) on `fd` and the eventfd
  // `wake_fd` (whose token, once read, ends the Poll with 0) up to timeout_ns (0: do not wait; negative: no limit).
  int Poll(int fd, int wake_fd, const DatagramHandler& handler, const UdpEndpoint& local, UdpCounterSet& counters,
           int64_t timeout_ns);

 private:
  struct Slot {
    iovec iov{};
    sockaddr_storage addr{};
    alignas(cmsghdr) uint8_t control[kReceiveControlBytes]{};
  };
  size_t max_datagram_ = 0;
  bool responses_first_ = false;
  size_t buffer_bytes_ = 0;  // per receive
  std::unique_ptr<uint8_t[]> buffers_;
  std::vector<Slot> slots_;
  std::vector<mmsghdr> msgs_;
  size_t dirty_ = 0;  // entries of msgs_ the last receive filled (Init sets them all up)
  size_t want_ = 1;   // entries the next receive offers (Receive adapts it; 1: recvmsg)
};

}  // namespace uroce::wire
