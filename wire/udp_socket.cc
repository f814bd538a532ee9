#include "wire/udp_socket.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/udp.h>
#include <poll.h>
#include <linux/sock_diag.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>

#include "wire/bytes.h"
#include "wire/clock.h"
#include "wire/icrc.h"
#include "wire/opcode.h"

namespace uroce::wire {
namespace {

void SetBuffer(int fd, int force_opt, int opt, int bytes) {
  if (bytes <= 0) return;
  if (setsockopt(fd, SOL_SOCKET, force_opt, &bytes, sizeof bytes) == 0) return;  // CAP_NET_ADMIN only
  setsockopt(fd, SOL_SOCKET, opt, &bytes, sizeof bytes);                        // capped at net.core.*mem_max
}

// `pktinfo`: ask for each datagram's destination address (a wildcard bind). A socket bound to one address receives
// only datagrams sent to it, and the control message costs every receive ~0.2 us (a 20-byte ping-pong on loopback:
// 3.56 against 3.35 us per half round trip), so it is asked for only where it can tell something.
int SetOptions(int fd, int family, int buffer_bytes, bool pktinfo) {
  const int one = 1;
  const int pmtu = IP_PMTUDISC_DO;
  if (family == AF_INET) {
    if (setsockopt(fd, IPPROTO_IP, IP_MTU_DISCOVER, &pmtu, sizeof pmtu) < 0) return -errno;
    if (pktinfo && setsockopt(fd, IPPROTO_IP, IP_PKTINFO, &one, sizeof one) < 0) return -errno;
  } else {
    const int pmtu6 = IPV6_PMTUDISC_DO;
    if (setsockopt(fd, IPPROTO_IPV6, IPV6_MTU_DISCOVER, &pmtu6, sizeof pmtu6) < 0) return -errno;
    if (pktinfo && setsockopt(fd, IPPROTO_IPV6, IPV6_RECVPKTINFO, &one, sizeof one) < 0) return -errno;
    // A dual-stack socket also carries IPv4 (mapped) traffic; these apply to it. Best effort.
    setsockopt(fd, IPPROTO_IP, IP_MTU_DISCOVER, &pmtu, sizeof pmtu);
    if (pktinfo) setsockopt(fd, IPPROTO_IP, IP_PKTINFO, &one, sizeof one);
  }
  SetBuffer(fd, SO_RCVBUFFORCE, SO_RCVBUF, buffer_bytes);
  SetBuffer(fd, SO_SNDBUFFORCE, SO_SNDBUF, buffer_bytes);
  // Receives then say how many datagrams the full receive buffer made the kernel drop (only once some were).
  setsockopt(fd, SOL_SOCKET, SO_RXQ_OVFL, &one, sizeof one);
  return 0;
}

}  // namespace

void UdpCounterSet::Sent(size_t bytes, uint64_t packets) {
  packets_sent_.fetch_add(packets, std::memory_order_relaxed);
  bytes_sent_.fetch_add(bytes, std::memory_order_relaxed);
}

void UdpCounterSet::SendFailed(int negative_errno) {
  send_errors_.fetch_add(1, std::memory_order_relaxed);
  last_send_error_.store(negative_errno, std::memory_order_relaxed);
}

void UdpCounterSet::Received(size_t bytes) {
  packets_received_.fetch_add(1, std::memory_order_relaxed);
  bytes_received_.fetch_add(bytes, std::memory_order_relaxed);
}

UdpCounters UdpCounterSet::Snapshot() const {
  UdpCounters c;
  c.segmented_sends = segmented_sends_.load();
  c.coalesced_receives = coalesced_receives_.load();
  c.packets_sent = packets_sent_.load();
  c.bytes_sent = bytes_sent_.load();
  c.send_errors = send_errors_.load();
  c.last_send_error = last_send_error_.load();
  c.packets_received = packets_received_.load();
  c.bytes_received = bytes_received_.load();
  c.receive_truncations = receive_truncations_.load();
  c.receive_errors = receive_errors_.load();
  c.receive_overflows = receive_overflows_.load();
  return c;
}

void UdpCounterSet::Overflowed(uint32_t total) {
  uint64_t seen = receive_overflows_.load(std::memory_order_relaxed);
  while (total > seen && !receive_overflows_.compare_exchange_weak(seen, total, std::memory_order_relaxed)) {
  }
}

int OpenKernelUdpSocket(int family, int extra_flags) {
  return static_cast<int>(syscall(SYS_socket, family, SOCK_DGRAM | SOCK_CLOEXEC | extra_flags, IPPROTO_UDP));
}

int OpenRoceUdpSocket(const UdpEndpoint& bind, int buffer_bytes, UdpEndpoint* local, bool reuse_port) {
  const int family = SocketFamily(bind);
  sockaddr_storage sa;
  socklen_t sa_len;
  if (int r = ToSockaddr(bind, family, &sa, &sa_len); r < 0) return r;
  const int fd = OpenKernelUdpSocket(family);
  if (fd < 0) return -errno;
  int r = SetOptions(fd, family, buffer_bytes, bind.addr.is_unspecified());
  const int one = 1;
  if (r == 0 && reuse_port && setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof one) < 0) r = -errno;
  if (r == 0 && ::bind(fd, reinterpret_cast<sockaddr*>(&sa), sa_len) < 0) r = -errno;
  sa_len = sizeof sa;
  if (r == 0 && getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &sa_len) < 0) r = -errno;
  if (r == 0 && !FromSockaddr(&sa, sa_len, local)) r = -EAFNOSUPPORT;
  if (r == 0 && local->addr.is_v4()) {
    // UD multicast leaves as IP multicast from the device's own interface (loopback for 127.x: without this the
    // kernel would pick the default route's), looped back to this host's members (IP_MULTICAST_LOOP, the default).
    in_addr ifaddr{};
    ifaddr.s_addr = htonl(local->addr.v4());
    if (family == AF_INET) setsockopt(fd, IPPROTO_IP, IP_MULTICAST_IF, &ifaddr, sizeof ifaddr);
  }
  if (r < 0) {
    close(fd);
    return r;
  }
  return fd;
}

void EnableUdpOffloads(int fd, bool* gso, bool* gro) {
  // UDP_SEGMENT as a socket option sets a default segment size; 0 keeps every send whole unless its control message
  // says otherwise, and the option's acceptance is how to tell that the kernel knows UDP_SEGMENT at all.
  const int zero = 0, one = 1;
  *gso = setsockopt(fd, SOL_UDP, UDP_SEGMENT, &zero, sizeof zero) == 0;
  *gro = setsockopt(fd, SOL_UDP, UDP_GRO, &one, sizeof one) == 0;
}

size_t GsoRunLength(std::span<const OutDatagram> batch) {
  if (batch.empty()) return 0;
  const OutDatagram& first = batch[0];
  const size_t size = first.payload.size();
  if (size == 0) return 1;
  size_t n = 1, bytes = size;
  while (n < batch.size() && n < kMaxGsoSegments) {
    const OutDatagram& next = batch[n];
    const size_t len = next.payload.size();
    if (len == 0 || len > size || next.dst != first.dst || next.src_addr != first.src_addr || bytes + len > kMaxGsoBytes)
      break;
    bytes += len;
    ++n;
    if (len < size) break;  // only the last segment may be shorter
  }
  return n;
}

uint32_t GsoSegmentTrailer(const OutDatagram& dg, size_t k) {
  const size_t size = dg.payload.size();
  const uint32_t stored = size >= 4 ? LoadLe32(dg.payload.data() + size - 4) : 0;
  if (!dg.has_icrc || !dg.dst.addr.is_v4()) return stored;
  return stored ^ IcrcIpIdChange(size, static_cast<uint16_t>(k));  // sealed for ID 0 (Transport::OutgoingFlow)
}

void SetUdpSegmentControl(msghdr* msg, uint8_t* control, uint16_t segment_size) {
  msg->msg_control = control;
  msg->msg_controllen = kUdpSegmentControlBytes;
  cmsghdr* c = CMSG_FIRSTHDR(msg);
  c->cmsg_level = SOL_UDP;
  c->cmsg_type = UDP_SEGMENT;
  c->cmsg_len = CMSG_LEN(sizeof segment_size);
  std::memcpy(CMSG_DATA(c), &segment_size, sizeof segment_size);
}

namespace {

// Appends to msg's control messages (which `control`, kSendControlBytes, holds) the local address the datagram leaves
// from: IP_PKTINFO's ipi_spec_dst on an IPv4 socket, IPV6_PKTINFO's address on an IPv6 one (IPv4 in its mapped form:
// Linux takes that for an IPv4 destination of a dual-stack socket, ip_cmsg_send). Interface 0: the route decides.
void AppendSourceControl(msghdr* msg, uint8_t* control, int family, const IpAddress& src) {
  const size_t used = msg->msg_control == nullptr ? 0 : msg->msg_controllen;
  msg->msg_control = control;
  const size_t data = family == AF_INET ? sizeof(in_pktinfo) : sizeof(in6_pktinfo);
  msg->msg_controllen = used + CMSG_SPACE(data);
  auto* c = reinterpret_cast<cmsghdr*>(control + used);
  if (family == AF_INET) {
    in_pktinfo pi{};
    pi.ipi_spec_dst.s_addr = htonl(src.v4());
    c->cmsg_level = IPPROTO_IP;
    c->cmsg_type = IP_PKTINFO;
    c->cmsg_len = CMSG_LEN(sizeof pi);
    std::memcpy(CMSG_DATA(c), &pi, sizeof pi);
  } else {
    in6_pktinfo pi{};
    std::memcpy(pi.ipi6_addr.s6_addr, src.bytes().data(), 16);
    c->cmsg_level = IPPROTO_IPV6;
    c->cmsg_type = IPV6_PKTINFO;
    c->cmsg_len = CMSG_LEN(sizeof pi);
    std::memcpy(CMSG_DATA(c), &pi, sizeof pi);
  }
}

}  // namespace

int SendDatagrams(int fd, int family, const IpAddress& bound, std::span<const OutDatagram> batch, size_t max_datagram,
                  size_t chunk, std::atomic<bool>& gso_enabled, UdpCounterSet& counters, int flags) {
  // On the caller's stack. A message is one datagram or one UDP_SEGMENT run; a run's datagram k > 0 takes two
  // iovecs, its bytes before the ICRC and the ICRC re-sealed for its IP ID.
  mmsghdr msgs[kMaxSendChunk];
  size_t runs[kMaxSendChunk];  // datagrams in each message
  iovec iovs[2 * kMaxSendChunk];
  uint32_t trailers[kMaxSendChunk];
  sockaddr_storage addrs[kMaxSendChunk];
  alignas(cmsghdr) uint8_t controls[kMaxSendChunk][kSendControlBytes];
  chunk = std::clamp<size_t>(chunk, 1, kMaxSendChunk);
  size_t done = 0;
  size_t singles_until = 0;  // datagrams before this index go one per message (their run was refused whole)
  int error = 0;
  bool full = false;  // MSG_DONTWAIT and the socket's send buffer is full
  while (done < batch.size() && error == 0 && !full) {
    // Prepare up to `chunk` datagrams, stopping before one that cannot be sent at all.
    const bool gso = gso_enabled.load(std::memory_order_relaxed);
    size_t n = 0, messages = 0, iov_used = 0;
    while (n < chunk && done + n < batch.size()) {
      const OutDatagram& dg = batch[done + n];
      if (dg.payload.size() > max_datagram) {
        error = -EMSGSIZE;
        break;
      }
      socklen_t len;
      if (int r = ToSockaddr(dg.dst, family, &addrs[messages], &len); r < 0) {
        error = r;
        break;
      }
      // The rest of a run is no longer than its first: it fits max_datagram too.
      const size_t run = gso && done + n >= singles_until
                             ? GsoRunLength(batch.subspan(done + n, std::min(chunk - n, batch.size() - done - n)))
                             : 1;
      mmsghdr& m = msgs[messages];
      m = mmsghdr{};
      m.msg_hdr.msg_name = &addrs[messages];
      m.msg_hdr.msg_namelen = len;
      m.msg_hdr.msg_iov = &iovs[iov_used];
      for (size_t k = 0; k < run; ++k) {
        const OutDatagram& d = batch[done + n + k];
        const size_t size = d.payload.size();
        auto* bytes = const_cast<uint8_t*>(d.payload.data());
        const uint32_t trailer = k == 0 ? 0 : GsoSegmentTrailer(d, k);
        if (k == 0 || size < 4 || trailer == LoadLe32(bytes + size - 4)) {
          iovs[iov_used++] = iovec{bytes, size};
        } else {
          StoreLe32(reinterpret_cast<uint8_t*>(&trailers[n + k]), trailer);
          iovs[iov_used++] = iovec{bytes, size - 4};
          iovs[iov_used++] = iovec{&trailers[n + k], 4};
        }
      }
      m.msg_hdr.msg_iovlen = size_t(&iovs[iov_used] - m.msg_hdr.msg_iov);
      if (run > 1) SetUdpSegmentControl(&m.msg_hdr, controls[messages], uint16_t(dg.payload.size()));
      if (!dg.src_addr.is_unspecified() && dg.src_addr != bound) {
        if (family == AF_INET && !dg.src_addr.is_v4()) {
          error = -EAFNOSUPPORT;
          break;
        }
        AppendSourceControl(&m.msg_hdr, controls[messages], family, dg.src_addr);
      }
      runs[messages++] = run;
      n += run;
    }
    size_t sent = 0, sent_datagrams = 0;
    while (sent < messages) {
      const int r = sendmmsg(fd, msgs + sent, unsigned(messages - sent), flags);
      if (r < 0 && errno == EINTR) continue;
      if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) && (flags & MSG_DONTWAIT)) {
        full = true;
        break;
      }
      if (r < 0 && runs[sent] > 1) {
        // A run refused as a whole (EIO: the route cannot checksum segments; EINVAL: a segment above the path MTU,
        // ...): stop here; its datagrams are prepared again one per message, so that each meets the error a lone
        // datagram would.
        if (errno == EIO) gso_enabled = false;
        singles_until = done + sent_datagrams + runs[sent];
        error = 0;  // a datagram that stopped this preparation stops the next one again
        break;
      }
      if (r < 0) {
        // sendmmsg(2) reports an error only for the first message; it is lost, as any refused datagram is on a
        // datagram network, and the rest are tried.
        counters.SendFailed(-errno);
        sent_datagrams += runs[sent++];
        continue;
      }
      for (int i = 0; i < r; ++i, ++sent) {
        if (runs[sent] > 1) counters.SegmentedSend();
        for (size_t k = 0; k < runs[sent]; ++k) counters.Sent(batch[done + sent_datagrams + k].payload.size());
        sent_datagrams += runs[sent];
      }
    }
    done += sent_datagrams;
  }
  if (done == 0 && error) return error;
  if (done == 0 && full) return -EAGAIN;
  return int(done);
}

int ToSockaddr(const UdpEndpoint& ep, int family, sockaddr_storage* sa, socklen_t* len) {
  std::memset(sa, 0, sizeof *sa);
  if (family == AF_INET) {
    if (!ep.addr.is_v4()) return -EAFNOSUPPORT;
    auto* in = reinterpret_cast<sockaddr_in*>(sa);
    in->sin_family = AF_INET;
    in->sin_port = htons(ep.port);
    in->sin_addr.s_addr = htonl(ep.addr.v4());
    *len = sizeof *in;
  } else {
    // IPv4 destinations from an IPv6 socket use the mapped form, which IpAddress already holds.
    auto* in6 = reinterpret_cast<sockaddr_in6*>(sa);
    in6->sin6_family = AF_INET6;
    in6->sin6_port = htons(ep.port);
    std::memcpy(in6->sin6_addr.s6_addr, ep.addr.bytes().data(), 16);
    *len = sizeof *in6;
  }
  return 0;
}

bool FromSockaddr(const void* sa, socklen_t len, UdpEndpoint* ep) {
  sockaddr_storage ss{};
  std::memcpy(&ss, sa, std::min<size_t>(len, sizeof ss));
  if (ss.ss_family == AF_INET && len >= socklen_t(sizeof(sockaddr_in))) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(&ss);
    *ep = UdpEndpoint{IpAddress::V4(ntohl(in->sin_addr.s_addr)), ntohs(in->sin_port)};
    return true;
  }
  if (ss.ss_family == AF_INET6 && len >= socklen_t(sizeof(sockaddr_in6))) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&ss);
    *ep = UdpEndpoint{IpAddress::FromBytes(in6->sin6_addr.s6_addr), ntohs(in6->sin6_port)};
    return true;
  }
  return false;
}

bool ReceiveQueueCongested(int fd) {
  uint32_t meminfo[SK_MEMINFO_VARS] = {};
  socklen_t len = sizeof meminfo;
  if (getsockopt(fd, SOL_SOCKET, SO_MEMINFO, meminfo, &len) != 0 || len <= SK_MEMINFO_RCVBUF * sizeof(uint32_t))
    return false;
  return uint64_t(meminfo[SK_MEMINFO_RMEM_ALLOC]) * 4 > meminfo[SK_MEMINFO_RCVBUF];
}

int DeliverReceived(const DatagramHandler& handler, const msghdr& msg, std::span<const uint8_t> payload, int msg_flags,
                    const UdpEndpoint& local, size_t max_datagram, bool responses_first, UdpCounterSet& counters,
                    bool congested) {
  if (msg_flags & MSG_TRUNC) {
    counters.Truncated();
    return 0;
  }
  InDatagram in;
  if (!FromSockaddr(msg.msg_name, msg.msg_namelen, &in.src)) {
    counters.ReceiveFailed();
    return 0;
  }
  in.dst = local;
  in.congestion_experienced = congested;
  size_t segment = payload.size();
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(const_cast<msghdr*>(&msg), c)) {
    if (c->cmsg_level == IPPROTO_IP && c->cmsg_type == IP_PKTINFO && c->cmsg_len >= CMSG_LEN(sizeof(in_pktinfo))) {
      in_pktinfo pi;
      std::memcpy(&pi, CMSG_DATA(c), sizeof pi);
      in.dst.addr = IpAddress::V4(ntohl(pi.ipi_addr.s_addr));  // the header's destination address
    } else if (c->cmsg_level == IPPROTO_IPV6 && c->cmsg_type == IPV6_PKTINFO &&
               c->cmsg_len >= CMSG_LEN(sizeof(in6_pktinfo))) {
      in6_pktinfo pi;
      std::memcpy(&pi, CMSG_DATA(c), sizeof pi);
      in.dst.addr = IpAddress::FromBytes(pi.ipi6_addr.s6_addr);
    } else if (c->cmsg_level == SOL_UDP && c->cmsg_type == UDP_GRO && c->cmsg_len >= CMSG_LEN(sizeof(int))) {
      int gso_size = 0;
      std::memcpy(&gso_size, CMSG_DATA(c), sizeof gso_size);
      if (gso_size > 0) segment = std::min(segment, size_t(gso_size));
    } else if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SO_RXQ_OVFL && c->cmsg_len >= CMSG_LEN(sizeof(uint32_t))) {
      uint32_t dropped = 0;
      std::memcpy(&dropped, CMSG_DATA(c), sizeof dropped);
      counters.Overflowed(dropped);
    }
  }
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  in.timestamp_ns = uint64_t(ts.tv_sec) * 1'000'000'000u + uint64_t(ts.tv_nsec);
  const bool run = segment < payload.size();
  if (run) counters.CoalescedReceive();
  // A run is what one peer sent in one go. With responses_first its acknowledgements and READ/atomic responses are
  // handed over before its requests: a uroce peer holds the ACK of our request and sends it behind its own next
  // request (one UDP_SEGMENT send), where an HCA would have sent it as soon as our request arrived; taken in the run's
  // order, our send would complete after the receive of the peer's answer -- the reverse of what programs see on
  // hardware (perftest's latency tests with -e take the first event on their one channel as their send's completion,
  // poll once, and hang when it is the receive's). The two kinds belong to independent streams (the peer's responder
  // and its requester, IBTA 9.7), and each keeps its order.
  auto is_response = [](std::span<const uint8_t> p) {
    const OpcodeInfo* op = p.empty() ? nullptr : FindOpcode(p[0]);
    return op != nullptr && !op->is_request;
  };
  const bool two_passes = run && responses_first;
  int delivered = 0;
  for (int pass = two_passes ? 0 : 1; pass < 2; ++pass) {
    size_t at = 0;
    do {  // once for an empty datagram
      in.payload = payload.subspan(at, std::min(segment, payload.size() - at));
      at += in.payload.size();
      if (two_passes && is_response(in.payload) != (pass == 0)) continue;
      if (in.payload.size() > max_datagram) {
        counters.Truncated();
        continue;
      }
      counters.Received(in.payload.size());
      handler(in);
      ++delivered;
    } while (at < payload.size());
  }
  return delivered;
}

int DatagramReceiver::Init(unsigned batch, size_t max_datagram, bool gro, bool responses_first) {
  if (batch == 0 || max_datagram == 0) return -EINVAL;
  max_datagram_ = max_datagram;
  responses_first_ = responses_first;
  buffer_bytes_ = ReceiveBufferBytes(max_datagram, gro);
  // Left uninitialised: the kernel writes a datagram before anything reads it, and untouched pages cost nothing.
  buffers_.reset(new (std::nothrow) uint8_t[size_t(batch) * buffer_bytes_]);
  if (!buffers_) return -ENOMEM;
  slots_.resize(batch);
  msgs_.resize(batch);
  for (unsigned i = 0; i < batch; ++i) slots_[i].iov = iovec{buffers_.get() + size_t(i) * buffer_bytes_, buffer_bytes_};
  dirty_ = batch;
  return 0;
}

int DatagramReceiver::Receive(int fd, const DatagramHandler& handler, const UdpEndpoint& local,
                              UdpCounterSet& counters) {
  // Only the entries the last receive filled need their lengths set again: an empty poll (the hot loop of a polling
  // application) rewrites none.
  for (size_t i = 0; i < dirty_; ++i) {
    Slot& slot = slots_[i];
    msghdr& m = msgs_[i].msg_hdr;
    m = msghdr{};
    m.msg_name = &slot.addr;
    m.msg_namelen = sizeof slot.addr;
    m.msg_iov = &slot.iov;
    m.msg_iovlen = 1;
    m.msg_control = slot.control;
    m.msg_controllen = sizeof slot.control;
  }
  int n;
  do {
    if (want_ == 1) {
      const ssize_t len = recvmsg(fd, &msgs_[0].msg_hdr, MSG_DONTWAIT);
      if (len >= 0) msgs_[0].msg_len = unsigned(len);
      n = len < 0 ? -1 : 1;
    } else {
      n = recvmmsg(fd, msgs_.data(), unsigned(want_), MSG_DONTWAIT, nullptr);
    }
  } while (n < 0 && errno == EINTR);
  dirty_ = n > 0 ? size_t(n) : 0;
  // A full vector: more may be queued, so the next receive takes twice as many; an empty poll: the next datagram
  // probably comes alone (a ping-pong), so one recvmsg, cheaper than recvmmsg by ~0.15 us and than a 64-entry one by
  // ~0.3 us of every round trip's latency.
  want_ = n <= 0 ? 1 : size_t(n) == want_ ? std::min(want_ * 2, msgs_.size()) : want_;
  if (n < 0) {
    if (errno == EAGAIN || errno == EWOULDBLOCK) return -EAGAIN;
    const int e = -errno;
    counters.ReceiveFailed();
    return e;
  }
  size_t bytes = 0;
  for (int i = 0; i < n; ++i) bytes += msgs_[size_t(i)].msg_len;
  const bool congested = bytes >= kCongestionProbeBytes && ReceiveQueueCongested(fd);
  const ClockBatch batch;  // one reading of the clock for the device's handling of the run (wire/clock.h)
  int delivered = 0;
  for (int i = 0; i < n; ++i) {
    const msghdr& m = msgs_[size_t(i)].msg_hdr;
    const auto* buffer = static_cast<const uint8_t*>(slots_[size_t(i)].iov.iov_base);
    // With MSG_TRUNC set, msg_len is the datagram's full length: never read past the buffer.
    const size_t len = std::min<size_t>(msgs_[size_t(i)].msg_len, buffer_bytes_);
    delivered += DeliverReceived(handler, m, {buffer, len}, m.msg_flags, local, max_datagram_, responses_first_,
                                 counters, congested);
  }
  return delivered;
}

int DatagramReceiver::Poll(int fd, int wake_fd, const DatagramHandler& handler, const UdpEndpoint& local,
                           UdpCounterSet& counters, int64_t timeout_ns) {
  // A poll that may not wait (an application's, or the spinning progress thread's) reads no clock and leaves a
  // Wake() pending for the next poll that would block: one recvmmsg is all it costs, since its loop is what a
  // packet waits for.
  const auto deadline = timeout_ns > 0 ? std::chrono::steady_clock::now() + std::chrono::nanoseconds(timeout_ns)
                                       : std::chrono::steady_clock::time_point{};
  while (true) {
    const int n = Receive(fd, handler, local, counters);
    if (n > 0) return n;
    if (n == 0) continue;  // datagrams arrived but none was deliverable (truncated): look again
    if (n != -EAGAIN) return n;
    if (timeout_ns == 0) return 0;
    uint64_t v;
    if (read(wake_fd, &v, sizeof v) == sizeof v) return 0;
    timespec ts{};
    timespec* tsp = nullptr;
    if (timeout_ns > 0) {
      const int64_t left =
          std::chrono::duration_cast<std::chrono::nanoseconds>(deadline - std::chrono::steady_clock::now()).count();
      if (left <= 0) return 0;
      ts.tv_sec = left / 1'000'000'000;
      ts.tv_nsec = left % 1'000'000'000;
      tsp = &ts;
    }
    pollfd fds[2] = {{fd, POLLIN, 0}, {wake_fd, POLLIN, 0}};
    if (ppoll(fds, 2, tsp, nullptr) < 0 && errno != EINTR) return -errno;
  }
}

}  // namespace uroce::wire
