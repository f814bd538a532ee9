#include "wire/socket_transport.h"

#include <errno.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "wire/bytes.h"
#include "wire/event_fd.h"

namespace uroce::wire {
int SocketTransport::Create(const UdpEndpoint& bind, const Options& options, std::unique_ptr<SocketTransport>* out) {
  if (options.batch == 0 || options.max_datagram == 0) return -EINVAL;
  std::unique_ptr<SocketTransport> t(new SocketTransport());
  if (int r = t->Init(bind, options); r < 0) return r;
  *out = std::move(t);
  return 0;
}

int SocketTransport::Init(const UdpEndpoint& bind, const Options& options) {
  options_ = options;
  family_ = SocketFamily(bind);
  fd_ = OpenRoceUdpSocket(bind, options_.socket_buffer_bytes, &local_);
  if (fd_ < 0) return fd_;
  wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wake_fd_ < 0) return -errno;
  if (options_.udp_offloads) {
    bool gso = false;
    EnableUdpOffloads(fd_, &gso, &gro_);
    gso_ = gso;
  }
  return receiver_.Init(options_.batch, options_.max_datagram, gro_, options_.responses_first);
}

SocketTransport::~SocketTransport() {
  if (fd_ >= 0) close(fd_);
  if (wake_fd_ >= 0) close(wake_fd_);
}

int SocketTransport::Send(std::span<const OutDatagram> batch) {
  // On the caller's stack, from any thread: senders share nothing but the socket, which blocks while its send
  // buffer is full.
  return SendDatagrams(fd_, family_, local_.addr, batch, options_.max_datagram, options_.batch, gso_, counters_, 0);
}

int SocketTransport::Poll(const DatagramHandler& handler, int64_t timeout_ns) {
  return receiver_.Poll(fd_, wake_fd_, handler, local_, counters_, timeout_ns);
}

void SocketTransport::Wake() { SignalEventFd(wake_fd_); }

}  // namespace uroce::wire
