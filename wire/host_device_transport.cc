#include "wire/host_device_transport.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <ctime>

#include "wire/service_protocol.h"

namespace uroce::wire {

namespace {

uint64_t MonotonicNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1'000'000'000u + uint64_t(ts.tv_nsec);
}

}  // namespace

HostDeviceTransport::HostDeviceTransport(std::unique_ptr<Transport> sender, const UdpEndpoint& local, int forward_fd,
                                         int control_fd, std::function<void()> on_service_lost)
    : sender_(std::move(sender)),
      local_(local),
      forward_fd_(forward_fd),
      control_fd_(control_fd),
      on_service_lost_(std::move(on_service_lost)),
      buffers_(size_t{kBatch} * kMaxForwarded) {}

HostDeviceTransport::~HostDeviceTransport() {
  if (forward_fd_ >= 0) close(forward_fd_);
  if (wake_fd_ >= 0) close(wake_fd_);
}

int HostDeviceTransport::Init() {
  wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  return wake_fd_ < 0 ? -errno : 0;
}

void HostDeviceTransport::Wake() {
  const uint64_t one = 1;
  [[maybe_unused]] ssize_t r = write(wake_fd_, &one, sizeof one);
}

int HostDeviceTransport::ReceiveQueued(const DatagramHandler& handler) {
  mmsghdr msgs[kBatch] = {};
  iovec iovs[kBatch];
  for (unsigned i = 0; i < kBatch; ++i) {
    iovs[i] = {buffers_.data() + size_t{i} * kMaxForwarded, kMaxForwarded};
    msgs[i].msg_hdr.msg_iov = &iovs[i];
    msgs[i].msg_hdr.msg_iovlen = 1;
  }
  const int n = recvmmsg(forward_fd_, msgs, kBatch, MSG_DONTWAIT, nullptr);
  if (n < 0) return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR ? 0 : -errno;
  const uint64_t now = MonotonicNs();
  int delivered = 0;
  for (int i = 0; i < n; ++i) {
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

int HostDeviceTransport::Poll(const DatagramHandler& handler, int64_t timeout_ns) {
  int got = ReceiveQueued(handler);
  if (got != 0 || timeout_ns == 0) return got;
  pollfd fds[3] = {{forward_fd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}, {control_fd_, 0, 0}};
  timespec ts{};
  if (timeout_ns > 0) ts = {timeout_ns / 1'000'000'000, timeout_ns % 1'000'000'000};
  const nfds_t nfds = service_lost_ || control_fd_ < 0 ? 2 : 3;
  const int r = ppoll(fds, nfds, timeout_ns < 0 ? nullptr : &ts, nullptr);
  if (r < 0) return errno == EINTR ? 0 : -errno;
  if (fds[1].revents & POLLIN) {
    uint64_t v;
    [[maybe_unused]] ssize_t n = read(wake_fd_, &v, sizeof v);
  }
  if (nfds == 3 && (fds[2].revents & (POLLHUP | POLLERR | POLLNVAL))) {
    service_lost_ = true;
    if (on_service_lost_) on_service_lost_();
  }
  if (fds[0].revents & POLLIN) return ReceiveQueued(handler);
  return 0;
}

}  // namespace uroce::wire
