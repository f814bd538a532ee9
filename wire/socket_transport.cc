#include "wire/socket_transport.h"

#include <errno.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

namespace uroce::wire {
namespace {
constexpr size_t kMaxSendChunk = 64;  // datagrams per sendmmsg, whatever Options::batch says (bounds the stack)
}  // namespace

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
  return receiver_.Init(options_.batch, options_.max_datagram);
}

SocketTransport::~SocketTransport() {
  if (fd_ >= 0) close(fd_);
  if (wake_fd_ >= 0) close(wake_fd_);
}

int SocketTransport::Send(std::span<const OutDatagram> batch) {
  // On the caller's stack: senders share nothing but the socket.
  mmsghdr msgs[kMaxSendChunk];
  iovec iovs[kMaxSendChunk];
  sockaddr_storage addrs[kMaxSendChunk];
  const size_t chunk = std::min<size_t>(options_.batch, kMaxSendChunk);
  size_t done = 0;
  int error = 0;
  while (done < batch.size() && error == 0) {
    // Prepare up to `chunk` datagrams, stopping before one this transport cannot send at all.
    size_t n = 0;
    for (; n < chunk && done + n < batch.size(); ++n) {
      const OutDatagram& dg = batch[done + n];
      if (dg.payload.size() > options_.max_datagram) {
        error = -EMSGSIZE;
        break;
      }
      socklen_t len;
      if (int r = ToSockaddr(dg.dst, family_, &addrs[n], &len); r < 0) {
        error = r;
        break;
      }
      iovs[n] = iovec{const_cast<uint8_t*>(dg.payload.data()), dg.payload.size()};
      msgs[n] = mmsghdr{};
      msgs[n].msg_hdr.msg_name = &addrs[n];
      msgs[n].msg_hdr.msg_namelen = len;
      msgs[n].msg_hdr.msg_iov = &iovs[n];
      msgs[n].msg_hdr.msg_iovlen = 1;
    }
    size_t sent = 0;
    while (sent < n) {
      const int r = sendmmsg(fd_, msgs + sent, unsigned(n - sent), 0);
      if (r < 0) {
        if (errno == EINTR) continue;
        // sendmmsg(2) reports an error only for the first datagram; it is lost, as a failed send completion of
        // UringTransport is, and the rest are tried.
        counters_.SendFailed(-errno);
        ++sent;
        continue;
      }
      for (int i = 0; i < r; ++i) counters_.Sent(msgs[sent + size_t(i)].msg_len);
      sent += size_t(r);
    }
    done += n;
  }
  if (done == 0 && error) return error;
  return int(done);
}

int SocketTransport::Poll(const DatagramHandler& handler, int64_t timeout_ns) {
  return receiver_.Poll(fd_, wake_fd_, handler, local_, counters_, timeout_ns);
}

void SocketTransport::Wake() {
  const uint64_t one = 1;
  [[maybe_unused]] ssize_t r = write(wake_fd_, &one, sizeof one);
}

}  // namespace uroce::wire
