#include "wire/host_device_transport.h"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstring>
#include <ctime>

#include "wire/clock.h"
#include "wire/service_protocol.h"
#include "wire/unix_socket.h"

namespace uroce::wire {

namespace {

// What a connection to another process may hold before a packet is dropped: asked for, capped by net.core.wmem_max
// unless we may force it.
constexpr int kPeerBufferBytes = 4 << 20;

// epoll tags of the fixed descriptors; accepted connections are tagged with their descriptor (>= 0).
constexpr uint64_t kTagForward = uint64_t(-1), kTagWake = uint64_t(-2), kTagControl = uint64_t(-3),
                   kTagListen = uint64_t(-4);

}  // namespace

HostDeviceTransport::HostDeviceTransport(std::unique_ptr<Transport> sender, const UdpEndpoint& local, uint8_t owner,
                                         int forward_fd, int control_fd, std::function<void()> on_service_lost)
    : sender_(std::move(sender)),
      local_(local),
      owner_(owner),
      forward_fd_(forward_fd),
      control_fd_(control_fd),
      on_service_lost_(std::move(on_service_lost)),
      buffers_(size_t{kBatch} * kMaxForwarded) {}

HostDeviceTransport::~HostDeviceTransport() {
  for (int fd : {forward_fd_, wake_fd_, epoll_fd_, listen_fd_}) {
    if (fd >= 0) close(fd);
  }
  for (int fd : accepted_) close(fd);
  for (auto& [owner, fd] : peers_) {
    if (fd >= 0) close(fd);
  }
  for (int fd : retired_) close(fd);
}

int HostDeviceTransport::Init() {
  wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wake_fd_ < 0) return -errno;
  epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
  if (epoll_fd_ < 0) return -errno;
  listen_fd_ = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (listen_fd_ < 0) return -errno;
  sockaddr_un sun;
  const socklen_t len = AbstractUnixAddress(HostDevicePeerName(local_.addr, owner_), &sun);
  if (bind(listen_fd_, reinterpret_cast<sockaddr*>(&sun), len) < 0 || listen(listen_fd_, SOMAXCONN) < 0) return -errno;
  auto add = [&](int fd, uint32_t events, uint64_t tag) {
    epoll_event e{};
    e.events = events;
    e.data.u64 = tag;
    return epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &e) == 0 ? 0 : -errno;
  };
  if (int rc = add(forward_fd_, EPOLLIN, kTagForward)) return rc;
  if (int rc = add(wake_fd_, EPOLLIN, kTagWake)) return rc;
  if (int rc = add(listen_fd_, EPOLLIN, kTagListen)) return rc;
  if (control_fd_ >= 0) {
    if (int rc = add(control_fd_, EPOLLRDHUP, kTagControl)) return rc;  // hang-up only: replies are read elsewhere
  }
  return 0;
}

void HostDeviceTransport::Wake() {
  const uint64_t one = 1;
  [[maybe_unused]] ssize_t r = write(wake_fd_, &one, sizeof one);
}

int HostDeviceTransport::ReceiveQueued(int fd, const DatagramHandler& handler, bool* closed) {
  mmsghdr msgs[kBatch] = {};
  iovec iovs[kBatch];
  for (unsigned i = 0; i < kBatch; ++i) {
    iovs[i] = {buffers_.data() + size_t{i} * kMaxForwarded, kMaxForwarded};
    msgs[i].msg_hdr.msg_iov = &iovs[i];
    msgs[i].msg_hdr.msg_iovlen = 1;
  }
  const int n = recvmmsg(fd, msgs, kBatch, MSG_DONTWAIT, nullptr);
  if (n < 0) return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR ? 0 : -errno;
  const uint64_t now = SystemClock::Instance().NowNs();
  int delivered = 0;
  for (int i = 0; i < n; ++i) {
    if (msgs[i].msg_len == 0) {  // a peer connection's end (SOCK_SEQPACKET: EOF)
      if (closed) *closed = true;
      break;
    }
    const std::span<const uint8_t> bytes(static_cast<const uint8_t*>(iovs[i].iov_base), msgs[i].msg_len);
    auto header = ForwardHeader::Decode(bytes);
    if (!header || (msgs[i].msg_hdr.msg_flags & MSG_TRUNC) || bytes.size() <= ForwardHeader::kSize) {
      malformed_.fetch_add(1, std::memory_order_relaxed);
      continue;
    }
    InDatagram d;
    d.src = header->src;
    d.dst = header->dst;
    d.payload = bytes.subspan(ForwardHeader::kSize);
    d.timestamp_ns = now;
    d.congestion_experienced = header->congestion_experienced;
    handler(d);
    ++delivered;
  }
  return delivered;
}

int HostDeviceTransport::ReceiveReady(const DatagramHandler& handler, int timeout_ms) {
  epoll_event events[16];
  const int n = epoll_wait(epoll_fd_, events, 16, timeout_ms);
  if (n < 0) return errno == EINTR ? 0 : -errno;
  int delivered = 0;
  for (int i = 0; i < n; ++i) {
    const uint64_t tag = events[i].data.u64;
    if (tag == kTagWake) {
      uint64_t v;
      [[maybe_unused]] ssize_t r = read(wake_fd_, &v, sizeof v);
    } else if (tag == kTagControl) {
      epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, control_fd_, nullptr);
      if (!service_lost_) {
        service_lost_ = true;
        if (on_service_lost_) on_service_lost_();
      }
    } else if (tag == kTagListen) {
      for (;;) {
        const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) break;
        if (!PeerIsUsOrRoot(fd)) {  // a stranger dialled our name
          close(fd);
          continue;
        }
        epoll_event e{};
        e.events = EPOLLIN;
        e.data.u64 = uint64_t(fd);
        if (epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &e) < 0) {
          close(fd);
          continue;
        }
        accepted_.push_back(fd);
      }
    } else if (tag == kTagForward) {
      const int r = ReceiveQueued(forward_fd_, handler, nullptr);
      if (r > 0) delivered += r;
    } else {
      const int fd = int(tag);
      bool closed = (events[i].events & (EPOLLHUP | EPOLLERR)) != 0 && (events[i].events & EPOLLIN) == 0;
      const int r = ReceiveQueued(fd, handler, &closed);
      if (r > 0) delivered += r;
      if (closed) {
        epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd, nullptr);
        close(fd);
        std::erase(accepted_, fd);
      }
    }
  }
  return delivered;
}

int HostDeviceTransport::Poll(const DatagramHandler& handler, int64_t timeout_ns) {
  const int got = ReceiveReady(handler, 0);
  if (got != 0 || timeout_ns == 0) return got;
  const int timeout_ms = timeout_ns < 0 ? -1 : int(std::min<int64_t>((timeout_ns + 999'999) / 1'000'000, 1 << 30));
  return ReceiveReady(handler, timeout_ms);
}

uint8_t HostDeviceTransport::PeerOwner(const OutDatagram& dg) const {
  if (dg.dst.addr != local_.addr || dg.dst.port != local_.port) return 0;
  const PacketRoute route = RouteOf(dg.payload);
  return route.kind == PacketRoute::Kind::kOwner ? route.owner : 0;
}

int HostDeviceTransport::PeerConnection(uint8_t owner, bool reconnect) {
  std::lock_guard lock(peers_mu_);
  auto it = peers_.find(owner);
  if (it != peers_.end() && !reconnect) return it->second;
  if (it != peers_.end() && it->second >= 0) retired_.push_back(it->second);
  const int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  sockaddr_un sun;
  const socklen_t len = AbstractUnixAddress(HostDevicePeerName(local_.addr, owner), &sun);
  if (fd >= 0 && connect(fd, reinterpret_cast<sockaddr*>(&sun), len) == 0 && PeerIsUsOrRoot(fd)) {  // not a stranger holding its name
    if (setsockopt(fd, SOL_SOCKET, SO_SNDBUFFORCE, &kPeerBufferBytes, sizeof kPeerBufferBytes) < 0) {
      setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &kPeerBufferBytes, sizeof kPeerBufferBytes);
    }
    peers_[owner] = fd;
    return fd;
  }
  if (fd >= 0) close(fd);
  peers_.erase(owner);  // no such process (now): try again with the next packet
  return -1;
}

size_t HostDeviceTransport::SendToPeer(uint8_t owner, std::span<const OutDatagram> run) {
  run = run.first(std::min<size_t>(run.size(), kBatch));
  uint8_t headers[kBatch][ForwardHeader::kSize];
  iovec iovs[kBatch][2];
  mmsghdr msgs[kBatch] = {};
  for (size_t k = 0; k < run.size(); ++k) {
    ForwardHeader h;
    h.src = sender_->OutgoingFlow(run[k].dst, run[k].src_port).src;
    h.dst = run[k].dst;
    h.Encode(headers[k]);
    iovs[k][0] = {headers[k], ForwardHeader::kSize};
    iovs[k][1] = {const_cast<uint8_t*>(run[k].payload.data()), run[k].payload.size()};
    msgs[k].msg_hdr.msg_iov = iovs[k];
    msgs[k].msg_hdr.msg_iovlen = 2;
  }
  size_t sent = 0;
  for (bool reconnect : {false, true}) {
    const int fd = PeerConnection(owner, reconnect);
    if (fd < 0) break;
    const int n = sendmmsg(fd, msgs + sent, unsigned(run.size() - sent), MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n > 0) sent += size_t(n);
    if (sent == run.size()) break;
    // EPIPE / ECONNRESET: that process is gone (its number may come back to a newcomer: connect again once);
    // EAGAIN: its connection is full.
    if (n >= 0 || (errno != EPIPE && errno != ECONNRESET && errno != ENOTCONN)) break;
  }
  peer_sent_.fetch_add(sent, std::memory_order_relaxed);
  peer_drops_.fetch_add(run.size() - sent, std::memory_order_relaxed);
  return run.size();
}

int HostDeviceTransport::Send(std::span<const OutDatagram> batch) {
  size_t i = 0;
  while (i < batch.size()) {
    if (const uint8_t owner = PeerOwner(batch[i]); owner != 0) {
      size_t j = i + 1;
      while (j < batch.size() && PeerOwner(batch[j]) == owner) ++j;
      i += SendToPeer(owner, batch.subspan(i, j - i));
      continue;
    }
    size_t j = i;
    while (j < batch.size() && PeerOwner(batch[j]) == 0) ++j;
    const int r = sender_->Send(batch.subspan(i, j - i));
    if (r < 0) return i > 0 ? int(i) : r;
    i += size_t(r);
    if (size_t(r) < j - (i - size_t(r))) return int(i);
  }
  return int(i);
}

}  // namespace uroce::wire
