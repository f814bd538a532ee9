// UringTransport: RoCEv2 datagrams over a UDP socket, received through io_uring (liburing 2.3).
//
//  - Send (from any thread, no lock), as SocketTransport sends: sendmmsg straight from the caller's payloads
//    (wire::SendDatagrams), runs of equal-size datagrams to one destination as one UDP_SEGMENT message; a full send
//    buffer makes the caller wait for room. Errors are counted (send_errors, last_send_error), not lost.
//  - the receive ring belongs to the polling thread: a multishot IORING_OP_RECVMSG with a provided-buffer ring
//    (Linux 6.0+) or, when the kernel lacks it or Options::force_fallback_receive is set, a chain of N linked
//    single-shot recvmsg SQEs (linked so that completions keep the socket's arrival order). With UDP_GRO a receive
//    may return a run of datagrams, split back into datagrams for the handler; its buffers then hold kMaxGroBytes.
//    Poll sleeps in ppoll(2) on an eventfd registered with the ring (io_uring_register_eventfd(3)) plus a wake-up
//    eventfd, so an idle Poll blocks in the kernel, and dispatches the handler holding no lock (the handler may
//    Send). Receives are armed by the first Poll, on the polling thread: io_uring cancels a request when the thread
//    that submitted it exits, so they are re-armed on -ECANCELED too. SetReceiveArmed(false) cancels them for
//    application-driven progress: an armed receive would wake the polling thread for every datagram that an
//    application thread is about to read itself; meanwhile Poll reads the socket directly.
//
// Which threads touch the ring. io_uring_setup(2), and io_uring_enter(2) with submissions, make the calling thread a
// user of the ring; when the ring is torn down, the kernel queues work to each of its users with a signal-like
// notification (task_work, TWA_SIGNAL) that interrupts a blocking system call it is in: recv with SO_RCVTIMEO,
// epoll_wait, poll, read return EINTR although no signal was sent (libfabric's fi_getinfo opens and closes devices
// while its application's threads wait; fi_pingpong died of it). So the ring is set up (Create) and torn down (the
// destructor) on a thread made for it, Send never submits, and only the polling thread does, which the
// transport's owner provides (the engine's progress thread; an application thread that polls while receives are
// not armed reads the socket and submits nothing).
//
// The socket and its options, address conversion and received-datagram parsing are shared with SocketTransport
// (wire/udp_socket.h).
#pragma once

#include <sys/socket.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "wire/address.h"
#include "wire/transport.h"
#include "wire/udp_socket.h"

struct io_uring;
struct io_uring_buf_ring;

namespace uroce::wire {

struct UringTransportOptions {
  unsigned ring_entries = 256;        // SQ entries of the receive ring
  unsigned receive_buffers = 256;     // provided buffers (rounded up to a power of two, max 32768)
  unsigned fallback_receives = 64;    // linked single-shot recvmsg SQEs per chain in fallback mode (<= ring_entries)
  size_t max_datagram = 9216;         // larger received datagrams are truncated: counted and not delivered
  int socket_buffer_bytes = 64 << 20;  // SO_RCVBUF / SO_SNDBUF wanted (0: leave the system default)
  bool force_fallback_receive = false;
  bool udp_offloads = true;           // UDP_SEGMENT sends and UDP_GRO receives where the kernel has them
  bool responses_first = false;       // RoCE responses of a UDP_GRO run before its requests (DeliverReceived)
};

class UringTransport final : public Transport {
 public:
  using Options = UringTransportOptions;

  // Binds a UDP socket to `bind` (port 0: an ephemeral port; local() tells which) and sets up the rings. Returns 0
  // and fills *out, or -errno: -EADDRINUSE, -EADDRNOTAVAIL, -EAFNOSUPPORT, io_uring_queue_init's errors
  // (-ENOSYS / -EPERM when io_uring is unavailable or disabled, -ENOMEM beyond RLIMIT_MEMLOCK), -EOPNOTSUPP for a
  // kernel whose io_uring lacks IORING_SETUP_CQSIZE (before 5.5), -EINVAL for bad options.
  static int Create(const UdpEndpoint& bind, const Options& options, std::unique_ptr<UringTransport>* out);
  static int Create(const UdpEndpoint& bind, std::unique_ptr<UringTransport>* out) {
    return Create(bind, Options{}, out);
  }

  ~UringTransport() override;
  UringTransport(const UringTransport&) = delete;
  UringTransport& operator=(const UringTransport&) = delete;

  UdpEndpoint local() const override { return local_; }
  // A UDP socket sends from its bound port whatever src_port says; IPv4 DF datagrams leave with ID 0.
  Flow OutgoingFlow(const UdpEndpoint& dst, uint16_t src_port) const override { return Flow{local_, dst, 0}; }
  // Returns the number sent; -EMSGSIZE for a payload above max_datagram, -EAFNOSUPPORT for an IPv6
  // destination from an IPv4 socket (both only when it is the first of the batch; otherwise the count before it).
  int Send(std::span<const OutDatagram> batch) override;
  int Poll(const DatagramHandler& handler, int64_t timeout_ns) override;
  void Wake() override;
  // false: cancels the armed receives (what they had already taken stays for the next Poll), and Poll reads the
  // socket directly (DatagramReceiver) until true re-arms them. Call true from the thread that will keep polling:
  // io_uring cancels a request when the thread that submitted it exits.
  void SetReceiveArmed(bool armed) override;

  // True when receives use multishot recvmsg with a provided-buffer ring. Decided at Create (kernel probe, buffer
  // ring registration, options) and may turn false at the first Poll if the kernel rejects multishot recvmsg.
  bool multishot_active() const { return multishot_.load(std::memory_order_relaxed); }
  UdpCounters counters() const;
  int fd() const { return fd_; }
  bool segmenting() const { return gso_.load(std::memory_order_relaxed); }  // UDP_SEGMENT in use
  bool coalescing() const { return gro_; }                                   // UDP_GRO in use

 private:
  struct ReceiveSlot;
  struct Completion {
    uint64_t user_data;
    int32_t res;
    uint32_t flags;
  };

  UringTransport() = default;
  int Init(const UdpEndpoint& bind, const Options& options);
  int SetUpMultishot();
  void TearDown();  // the destructor's work, on its own thread
  int ArmReceives();
  int ReapReceives(const DatagramHandler& handler);
  // A receive's last completion (a multishot without IORING_CQE_F_MORE, any single-shot one): it is no longer armed.
  void CountEndedReceive(const Completion& c);
  // Delivers the data of receive completions, recycles their buffers and slots, and re-arms while wanted. `counted`:
  // CancelReceives has already taken them off outstanding_receives_ / multishot_armed_.
  int ProcessReceives(std::span<const Completion> done, const DatagramHandler& handler, bool counted);
  int PollSocketDirectly(const DatagramHandler& handler, int64_t timeout_ns);
  // Cancels the armed receives and waits (up to 2 s) for their last completions; with `keep`, the completions that
  // arrive meanwhile (data among them) are appended to it for ProcessReceives, else they are dropped.
  void CancelReceives(std::vector<Completion>* keep = nullptr);

  Options options_;
  UdpEndpoint local_;
  int fd_ = -1;
  int family_ = 0;
  int ring_event_fd_ = -1;
  int wake_fd_ = -1;

  UdpCounterSet counters_;
  // Turned off for good when the kernel refuses a UDP_SEGMENT send with EIO (no checksum offload on the route); the
  // refused run's datagrams are lost, as any refused send's are.
  std::atomic<bool> gso_{false};
  bool gro_ = false;
  size_t receive_bytes_ = 0;  // per receive buffer: max_datagram, or kMaxGroBytes with UDP_GRO

  // Receive side: the polling thread only (and Create / the destructor).
  std::unique_ptr<io_uring> receive_ring_;
  bool receive_ring_ready_ = false;
  std::atomic<bool> multishot_{false};
  bool armed_ = false;
  bool want_armed_ = true;             // SetReceiveArmed
  std::vector<Completion> stashed_;    // receive completions reaped while disarming, delivered by the next Poll
  DatagramReceiver direct_;            // reads the socket while receives are not armed
  bool direct_ready_ = false;
  bool multishot_armed_ = false;
  bool multishot_delivered_ = false;  // a multishot completion has delivered data (so -EINVAL is not "unsupported")
  unsigned outstanding_receives_ = 0;
  io_uring_buf_ring* buf_ring_ = nullptr;
  size_t buf_ring_bytes_ = 0;
  unsigned buf_count_ = 0;
  size_t buf_size_ = 0;
  uint8_t* receive_buffers_ = nullptr;
  size_t receive_buffers_bytes_ = 0;
  bool buf_ring_registered_ = false;
  std::unique_ptr<msghdr> multishot_msg_;
  std::vector<ReceiveSlot> receive_slots_;
  std::vector<uint32_t> idle_receive_slots_;
};

}  // namespace uroce::wire
