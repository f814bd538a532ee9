#include "wire/transport_bench.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/udp.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <liburing.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include "wire/udp_socket.h"
#include "wire/uring_transport.h"

// From the kernel's uapi (6.2); liburing 2.3's copy of io_uring.h predates them.
#ifndef IORING_SEND_ZC_REPORT_USAGE
#define IORING_SEND_ZC_REPORT_USAGE (1U << 3)
#endif
#ifndef IORING_NOTIF_USAGE_ZC_COPIED
#define IORING_NOTIF_USAGE_ZC_COPIED (1U << 31)
#endif

namespace uroce::wire {
namespace {

constexpr int kBatch = 32;
constexpr int kBufferBytes = 8 << 20;
// The raw streams' receivers spin, as uroce's receiving thread does while packets flow: the machine's limit is what a
// receiver that never sleeps takes. Blocking in recvmmsg (MSG_WAITFORONE), woken for each batch, the one-datagram-
// at-a-time stream ran at 1.21-1.22 GB/s here against 1.57-1.58 spinning; the GSO + GRO stream, whose batches are
// larger, at 5.71-5.81 against 5.75-5.82 (5 interleaved runs each in the machine's fast mode).
constexpr int kSpinningReceive = MSG_DONTWAIT;
using SteadyClock = std::chrono::steady_clock;

// Received-count shared by the two threads of a half; the sender sleeps on it when out of credit.
struct Credit {
  std::atomic<uint64_t> received{0};
  std::atomic<bool> stop{false};
  std::mutex mu;
  std::condition_variable cv;

  void Add(uint64_t n) {
    received.fetch_add(n, std::memory_order_relaxed);
    cv.notify_one();
  }
  // Waits until fewer than `window - batch` datagrams are in flight (bounded: a lost datagram never returns its
  // credit, so give up after 1 ms and send anyway, which the loss figure then shows).
  void WaitForRoom(uint64_t sent, size_t window) {
    if (sent + kBatch <= received.load(std::memory_order_relaxed) + window) return;
    std::unique_lock lock(mu);
    cv.wait_for(lock, std::chrono::milliseconds(1),
                [&] { return sent + kBatch <= received.load(std::memory_order_relaxed) + window; });
  }
};

struct HalfResult {
  uint64_t sent = 0, received_in_time = 0, received = 0;
  double seconds = 0;

  StreamFigures Figures(size_t frame_bytes) const {
    StreamFigures f;
    f.sent = sent;
    f.received = received;
    f.pps = double(received_in_time) / seconds;
    f.gbps = f.pps * double(frame_bytes) * 8 / 1e9;
    f.loss = sent ? 1.0 - double(received) / double(sent) : 0;
    return f;
  }
};

// Drives `send_batch` for `seconds`, then lets the receiver drain briefly.
template <typename SendBatch>
HalfResult DriveSender(Credit& credit, double seconds, size_t window, SendBatch send_batch) {
  HalfResult r;
  const auto t0 = SteadyClock::now();
  const auto end = t0 + std::chrono::duration<double>(seconds);
  while (SteadyClock::now() < end) {
    credit.WaitForRoom(r.sent, window);
    const int n = send_batch();
    if (n > 0) r.sent += uint64_t(n);
  }
  r.received_in_time = credit.received.load();
  r.seconds = std::chrono::duration<double>(SteadyClock::now() - t0).count();
  const auto drain_until = SteadyClock::now() + std::chrono::milliseconds(100);
  while (credit.received.load() < r.sent && SteadyClock::now() < drain_until) std::this_thread::yield();
  r.received = credit.received.load();
  credit.stop = true;
  return r;
}

int RunUring(size_t frame_bytes, double seconds, size_t window, TransportBenchResult* out) {
  UringTransport::Options options;
  options.socket_buffer_bytes = kBufferBytes;
  options.max_datagram = std::max<size_t>(frame_bytes, 64);
  std::unique_ptr<UringTransport> rx, tx;
  const UdpEndpoint loopback{IpAddress::V4(0x7f000001), 0};
  if (int r = UringTransport::Create(loopback, options, &rx); r < 0) return r;
  if (int r = UringTransport::Create(loopback, options, &tx); r < 0) return r;
  out->uring_multishot = rx->multishot_active();

  Credit credit;
  std::thread receiver([&] {
    while (!credit.stop.load(std::memory_order_relaxed)) {
      const int n = rx->Poll([](const InDatagram&) {}, 10'000'000);
      if (n > 0) credit.Add(uint64_t(n));
      if (n < 0) break;
    }
  });
  std::vector<uint8_t> payload(frame_bytes, 0x5a);
  std::vector<OutDatagram> batch(kBatch, OutDatagram{rx->local(), 0, payload});
  const HalfResult h = DriveSender(credit, seconds, window, [&] { return tx->Send(batch); });
  rx->Wake();
  receiver.join();
  out->uring = h.Figures(frame_bytes);
  return 0;
}

}  // namespace

// The same socket the transports use (wire/udp_socket.h), with a receive timeout so that the receiver notices the end.
int OpenStreamSocket(const IpAddress& at, UdpEndpoint* bound) {
  const int fd = OpenRoceUdpSocket({at, 0}, kBufferBytes, bound);
  if (fd < 0) return fd;
  timeval tv{0, 10'000};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  return fd;
}

namespace {

// A receiving and a sending socket, both OpenStreamSocket on 127.0.0.1 (Open) or given (Adopt: not closed with the
// pair).
struct SocketPair {
  int rx = -1, tx = -1;
  sockaddr_storage rx_addr{};
  socklen_t rx_len = 0;
  bool owned = true;
  ~SocketPair() {
    if (!owned) return;
    if (rx >= 0) close(rx);
    if (tx >= 0) close(tx);
  }
  int Open() {
    UdpEndpoint rx_at, tx_at;
    if ((rx = OpenStreamSocket(IpAddress::V4(0x7f000001), &rx_at)) < 0) return rx;
    if ((tx = OpenStreamSocket(IpAddress::V4(0x7f000001), &tx_at)) < 0) return tx;
    return AimAt(rx_at);
  }
  int Adopt(int rx_fd, const UdpEndpoint& rx_at, int tx_fd) {
    owned = false;
    rx = rx_fd;
    tx = tx_fd;
    return AimAt(rx_at);
  }
  // The receiver's address as the sending socket's family names it.
  int AimAt(const UdpEndpoint& rx_at) {
    sockaddr_storage tx_local;
    socklen_t len = sizeof tx_local;
    if (getsockname(tx, reinterpret_cast<sockaddr*>(&tx_local), &len) < 0) return -errno;
    return ToSockaddr(rx_at, tx_local.ss_family, &rx_addr, &rx_len);
  }
  // Fills `msgs` to send `iov` to the receiver.
  void AddressTo(mmsghdr* msgs, int n, iovec* iov) {
    for (int i = 0; i < n; ++i) {
      msgs[i] = mmsghdr{};
      msgs[i].msg_hdr.msg_name = &rx_addr;
      msgs[i].msg_hdr.msg_namelen = rx_len;
      msgs[i].msg_hdr.msg_iov = iov;
      msgs[i].msg_hdr.msg_iovlen = 1;
    }
  }
};

int RunRaw(size_t frame_bytes, double seconds, size_t window, TransportBenchResult* out) {
  SocketPair sockets;
  if (int r = sockets.Open(); r < 0) return r;
  const int rx = sockets.rx, tx = sockets.tx;
  Credit credit;
  std::thread receiver([&] {
    std::vector<uint8_t> buffers(size_t(kBatch) * std::max<size_t>(frame_bytes, 64));
    mmsghdr msgs[kBatch];
    iovec iovs[kBatch];
    while (!credit.stop.load(std::memory_order_relaxed)) {
      for (int i = 0; i < kBatch; ++i) {
        iovs[i] = iovec{buffers.data() + size_t(i) * std::max<size_t>(frame_bytes, 64), std::max<size_t>(frame_bytes, 64)};
        msgs[i] = mmsghdr{};
        msgs[i].msg_hdr.msg_iov = &iovs[i];
        msgs[i].msg_hdr.msg_iovlen = 1;
      }
      const int n = recvmmsg(rx, msgs, kBatch, kSpinningReceive, nullptr);
      if (n > 0) credit.Add(uint64_t(n));
    }
  });
  std::vector<uint8_t> payload(frame_bytes, 0x5a);
  mmsghdr msgs[kBatch];
  iovec iov{payload.data(), payload.size()};
  sockets.AddressTo(msgs, kBatch, &iov);
  const HalfResult h = DriveSender(credit, seconds, window, [&] { return sendmmsg(tx, msgs, kBatch, 0); });
  receiver.join();
  out->raw = h.Figures(frame_bytes);
  return 0;
}

// Receives coalesced (UDP_GRO) datagrams on `rx` until `credit.stop`, crediting the segments each one holds.
void ReceiveCoalesced(int rx, Credit& credit) {
  constexpr size_t kBuffer = 65536;
  std::vector<uint8_t> buffers(size_t(kBatch) * kBuffer);
  mmsghdr msgs[kBatch];
  iovec iovs[kBatch];
  alignas(cmsghdr) uint8_t control[kBatch][CMSG_SPACE(sizeof(int))];
  while (!credit.stop.load(std::memory_order_relaxed)) {
    for (int i = 0; i < kBatch; ++i) {
      iovs[i] = iovec{buffers.data() + size_t(i) * kBuffer, kBuffer};
      msgs[i] = mmsghdr{};
      msgs[i].msg_hdr.msg_iov = &iovs[i];
      msgs[i].msg_hdr.msg_iovlen = 1;
      msgs[i].msg_hdr.msg_control = control[i];
      msgs[i].msg_hdr.msg_controllen = sizeof control[i];
    }
    const int n = recvmmsg(rx, msgs, kBatch, kSpinningReceive, nullptr);
    uint64_t segments = 0;
    for (int i = 0; i < n; ++i) {
      size_t size = msgs[i].msg_len;  // one datagram unless the kernel says it coalesced several
      for (cmsghdr* c = CMSG_FIRSTHDR(&msgs[i].msg_hdr); c; c = CMSG_NXTHDR(&msgs[i].msg_hdr, c)) {
        if (c->cmsg_level == IPPROTO_UDP && c->cmsg_type == UDP_GRO) {
          int s;
          std::memcpy(&s, CMSG_DATA(c), sizeof s);
          size = size_t(s);
        }
      }
      segments += size ? (msgs[i].msg_len + size - 1) / size : 1;
    }
    if (segments > 0) credit.Add(segments);
  }
}

// io_uring zero-copy sends (IORING_OP_SENDMSG_ZC) of `msgs`: the kernel pins the pages instead of copying them into
// socket buffers, and says in a second completion when it no longer needs them -- and, asked to report usage,
// whether it copied them after all (IORING_NOTIF_USAGE_ZC_COPIED), which it does for a datagram it delivers to a
// socket of this host (loopback, or a veth into another namespace of this machine).
class ZeroCopySender {
 public:
  ~ZeroCopySender() {
    if (ready_) io_uring_queue_exit(&ring_);
  }
  int Init() {
    if (int r = io_uring_queue_init(64, &ring_, 0); r < 0) return r;
    ready_ = true;
    return 0;
  }
  // Sends `n` messages and waits for their results; a send's buffer is reused at once (the bench never changes it).
  // The number sent, or -errno.
  int Send(int fd, mmsghdr* msgs, int n) {
    for (int i = 0; i < n; ++i) {
      io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
      io_uring_prep_sendmsg_zc(sqe, fd, &msgs[i].msg_hdr, 0);
      sqe->ioprio |= IORING_SEND_ZC_REPORT_USAGE;
    }
    if (int r = io_uring_submit(&ring_); r < 0) return r;
    int results = 0, sent = 0, error = 0;
    while (results < n || notifications_pending_ > 0) {
      io_uring_cqe* cqe = nullptr;
      // The results come at once; notifications may wait for the receiver: take those that are there.
      if (results >= n && io_uring_peek_cqe(&ring_, &cqe) != 0) break;
      if (cqe == nullptr && io_uring_wait_cqe(&ring_, &cqe) < 0) return -EIO;
      if (cqe->flags & IORING_CQE_F_NOTIF) {
        --notifications_pending_;
        ++notifications;
        if (uint32_t(cqe->res) & IORING_NOTIF_USAGE_ZC_COPIED) ++copied;
      } else {
        ++results;
        if (cqe->res >= 0) ++sent; else error = cqe->res;
        if (cqe->flags & IORING_CQE_F_MORE) ++notifications_pending_;
      }
      io_uring_cqe_seen(&ring_, cqe);
    }
    return sent > 0 ? sent : error;
  }
  uint64_t notifications = 0, copied = 0;

 private:
  io_uring ring_{};
  bool ready_ = false;
  int notifications_pending_ = 0;
};

// UDP GSO + GRO: sends of as many whole `frame_bytes` segments as fit in one 64 KiB datagram, received coalesced;
// with `zero_copy`, sent by io_uring without copying (ZeroCopySender).
int RunGso(SocketPair& sockets, size_t frame_bytes, double seconds, size_t window, bool zero_copy,
           TransportBenchResult* out) {
  const int rx = sockets.rx, tx = sockets.tx;
  const int on = 1;
  const int segment = int(frame_bytes);
  if (setsockopt(rx, IPPROTO_UDP, UDP_GRO, &on, sizeof on) < 0 ||
      setsockopt(tx, IPPROTO_UDP, UDP_SEGMENT, &segment, sizeof segment) < 0) {
    return -errno;
  }
  ZeroCopySender zc;
  if (zero_copy) {
    if (int r = zc.Init(); r < 0) return r;
  }
  const size_t per_send = std::max<size_t>(1, std::min<size_t>(65507 / frame_bytes, 64));  // UDP_MAX_SEGMENTS 64
  Credit credit;
  std::thread receiver([&] { ReceiveCoalesced(rx, credit); });
  std::vector<uint8_t> payload(per_send * frame_bytes, 0x5a);
  mmsghdr msgs[kBatch];
  iovec iov{payload.data(), payload.size()};
  constexpr int kSends = kBatch / 8;  // 4 super-datagrams per sendmmsg
  sockets.AddressTo(msgs, kSends, &iov);
  const HalfResult h = DriveSender(credit, seconds, std::max(window, kSends * per_send + kBatch), [&] {
    const int n = zero_copy ? zc.Send(tx, msgs, kSends) : sendmmsg(tx, msgs, kSends, 0);
    return n > 0 ? int(size_t(n) * per_send) : n;
  });
  receiver.join();
  if (zero_copy) {
    out->gso_zero_copy = h.Figures(frame_bytes);
    out->zero_copy_notifications = zc.notifications;
    out->zero_copy_copied = zc.copied;
  } else {
    out->gso = h.Figures(frame_bytes);
  }
  return 0;
}

}  // namespace

namespace {

TransportBenchResult EmptyResult(size_t frame_bytes, double seconds, size_t window) {
  TransportBenchResult r;
  r.frame_bytes = frame_bytes;
  r.seconds = seconds;
  r.window = std::max<size_t>(window, kBatch);
  return r;
}

}  // namespace

TransportBenchResult RunGsoBench(size_t frame_bytes, double seconds, size_t window) {
  TransportBenchResult r = EmptyResult(frame_bytes, seconds, window);
  SocketPair sockets;
  r.error = sockets.Open();
  if (r.error == 0) r.error = RunGso(sockets, frame_bytes, seconds, r.window, /*zero_copy=*/false, &r);
  return r;
}

TransportBenchResult RunGsoBenchBetween(int rx, const UdpEndpoint& rx_at, int tx, size_t frame_bytes, double seconds,
                                        size_t window) {
  TransportBenchResult r = EmptyResult(frame_bytes, seconds, window);
  SocketPair sockets;
  r.error = sockets.Adopt(rx, rx_at, tx);
  if (r.error == 0) r.error = RunGso(sockets, frame_bytes, seconds, r.window, /*zero_copy=*/false, &r);
  return r;
}

TransportBenchResult RunGsoZeroCopyBench(size_t frame_bytes, double seconds, size_t window) {
  TransportBenchResult r = EmptyResult(frame_bytes, seconds, window);
  SocketPair sockets;
  r.error = sockets.Open();
  if (r.error == 0) r.error = RunGso(sockets, frame_bytes, seconds, r.window, /*zero_copy=*/true, &r);
  return r;
}

TransportBenchResult RunTransportBench(size_t frame_bytes, double seconds, size_t window) {
  TransportBenchResult r = EmptyResult(frame_bytes, seconds, window);
  if (int e = RunUring(frame_bytes, seconds, r.window, &r); e < 0) r.error = e;
  if (int e = RunRaw(frame_bytes, seconds, r.window, &r); e < 0 && r.error == 0) r.error = e;
  return r;
}

std::string TransportBenchResult::ToString() const {
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "UDP loopback, %zu-byte datagrams, %.2f s, window %zu:\n"
                "  io_uring (%s receive): %.0f pkt/s, %.2f Gbit/s, loss %.4f%% (%llu sent)\n"
                "  sendmmsg/recvmmsg x32: %.0f pkt/s, %.2f Gbit/s, loss %.4f%% (%llu sent)\n",
                frame_bytes, seconds, window, uring_multishot ? "multishot" : "single-shot", uring.pps, uring.gbps,
                uring.loss * 100, static_cast<unsigned long long>(uring.sent), raw.pps, raw.gbps, raw.loss * 100,
                static_cast<unsigned long long>(raw.sent));
  std::string s = buf;
  if (error) s += "  error: " + std::string(strerror(-error)) + "\n";
  return s;
}

}  // namespace uroce::wire
