#include "wire/socket_transport.h"

#include <errno.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "wire/bytes.h"

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
  if (options_.udp_offloads) {
    bool gso = false;
    EnableUdpOffloads(fd_, &gso, &gro_);
    gso_ = gso;
  }
  return receiver_.Init(options_.batch, options_.max_datagram, gro_);
}

SocketTransport::~SocketTransport() {
  if (fd_ >= 0) close(fd_);
  if (wake_fd_ >= 0) close(wake_fd_);
}

int SocketTransport::Send(std::span<const OutDatagram> batch) {
  // On the caller's stack: senders share nothing but the socket. A message is one datagram or one UDP_SEGMENT run;
  // a run's datagram k > 0 takes two iovecs, its bytes before the ICRC and the ICRC re-sealed for its IP ID.
  mmsghdr msgs[kMaxSendChunk];
  size_t runs[kMaxSendChunk];  // datagrams in each message
  iovec iovs[2 * kMaxSendChunk];
  uint32_t trailers[kMaxSendChunk];
  sockaddr_storage addrs[kMaxSendChunk];
  alignas(cmsghdr) uint8_t controls[kMaxSendChunk][kUdpSegmentControlBytes];
  const size_t chunk = std::min<size_t>(options_.batch, kMaxSendChunk);
  size_t done = 0;
  size_t singles_until = 0;  // datagrams before this index go one per message (their run was refused whole)
  int error = 0;
  while (done < batch.size() && error == 0) {
    // Prepare up to `chunk` datagrams, stopping before one this transport cannot send at all.
    const bool gso = gso_.load(std::memory_order_relaxed);
    size_t n = 0, messages = 0, iov_used = 0;
    while (n < chunk && done + n < batch.size()) {
      const OutDatagram& dg = batch[done + n];
      if (dg.payload.size() > options_.max_datagram) {
        error = -EMSGSIZE;
        break;
      }
      socklen_t len;
      if (int r = ToSockaddr(dg.dst, family_, &addrs[messages], &len); r < 0) {
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
      runs[messages++] = run;
      n += run;
    }
    size_t sent = 0, sent_datagrams = 0;
    while (sent < messages) {
      const int r = sendmmsg(fd_, msgs + sent, unsigned(messages - sent), 0);
      if (r < 0 && errno == EINTR) continue;
      if (r < 0 && runs[sent] > 1) {
        // A run refused as a whole (EIO: the route cannot checksum segments; EINVAL: a segment above the path MTU,
        // ...): stop here; its datagrams are prepared again one per message, so that each meets the error a lone
        // datagram would.
        if (errno == EIO) gso_ = false;
        singles_until = done + sent_datagrams + runs[sent];
        error = 0;  // a datagram that stopped this preparation stops the next one again
        break;
      }
      if (r < 0) {
        // sendmmsg(2) reports an error only for the first message; it is lost, as a failed send completion of
        // UringTransport is, and the rest are tried.
        counters_.SendFailed(-errno);
        sent_datagrams += runs[sent++];
        continue;
      }
      for (int i = 0; i < r; ++i, ++sent) {
        if (runs[sent] > 1) counters_.SegmentedSend();
        for (size_t k = 0; k < runs[sent]; ++k) counters_.Sent(batch[done + sent_datagrams + k].payload.size());
        sent_datagrams += runs[sent];
      }
    }
    done += sent_datagrams;
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
