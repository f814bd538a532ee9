#include "wire/uring_transport.h"

#include <arpa/inet.h>
#include <errno.h>
#include <liburing.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <mutex>
#include <thread>

#include "wire/bytes.h"
#include "wire/clock.h"
#include "wire/event_fd.h"

namespace uroce::wire {
namespace {

// user_data tags on the receive ring (high 32 bits); the low 32 bits hold a fallback slot index.
constexpr uint64_t kTagMultishot = 1ull << 32;
constexpr uint64_t kTagFallback = 2ull << 32;
constexpr uint64_t kTagCancel = 3ull << 32;
constexpr uint64_t kTagMask = 0xffffffffull << 32;
constexpr uint16_t kBufferGroup = 0;
constexpr size_t kControlBytes = kReceiveControlBytes;
constexpr unsigned kReapBatch = 64;

// Runs `work` on a thread made for it and returns what it returned (file comment: why rings are set up and torn
// down away from the caller's thread).
int OnOwnThread(const std::function<int()>& work) {
  int result = 0;
  std::thread([&] { result = work(); }).join();
  return result;
}

// liburing maps and unmaps a ring's memory with system calls of its own, so a new ring may get the addresses of one
// just torn down on another thread, with nothing in between that ThreadSanitizer can see: it would take the new
// ring's first accesses for races with the old ring's last. Rings are mapped (and initialised) and unmapped holding
// this lock, which orders the two: a few system calls, never a wait for the kernel's completions.
std::mutex ring_memory_handover;

// When this process last tore a ring down (steady clock, ns; 0: never). The kernel gives a ring's memory back from a
// worker after io_uring_queue_exit returns, so a process that closes and reopens its device at once (libfabric's
// fi_getinfo does, several times) can find that memory still charged and be refused with ENOMEM while its own
// freed ring is on its way back. Within kRingMemoryReturnNs of a teardown, Create waits for it instead.
std::atomic<int64_t> last_ring_teardown_ns{0};
constexpr int64_t kRingMemoryReturnNs = 1'000'000'000;

int64_t SteadyNowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
}  // namespace

struct UringTransport::ReceiveSlot {
  msghdr msg{};
  iovec iov{};
  sockaddr_storage addr{};
  alignas(cmsghdr) uint8_t control[kControlBytes]{};
  uint8_t* buffer = nullptr;
};

int UringTransport::Create(const UdpEndpoint& bind, const Options& options, std::unique_ptr<UringTransport>* out) {
  if (options.ring_entries == 0 || options.max_datagram == 0 ||
      options.fallback_receives == 0 || options.receive_buffers == 0) {
    return -EINVAL;
  }
  // Only a teardown before the first try counts (a failed try tears down a ring of its own), and the wait is bounded.
  const int64_t first_try = SteadyNowNs();
  const bool ring_memory_returning =
      first_try - last_ring_teardown_ns.load(std::memory_order_relaxed) < kRingMemoryReturnNs;
  for (;;) {
    std::unique_ptr<UringTransport> t(new UringTransport());
    const int r = OnOwnThread([&] { return t->Init(bind, options); });
    if (r == 0) {
      *out = std::move(t);
      return 0;
    }
    t.reset();  // the destructor tears down what Init set up
    if (r != -ENOMEM || !ring_memory_returning || SteadyNowNs() - first_try >= kRingMemoryReturnNs) return r;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

int UringTransport::Init(const UdpEndpoint& bind, const Options& options) {
  options_ = options;
  options_.fallback_receives = std::min(options_.fallback_receives, options_.ring_entries);  // one chain per submit
  family_ = SocketFamily(bind);

  fd_ = OpenRoceUdpSocket(bind, options_.socket_buffer_bytes, &local_);
  if (fd_ < 0) return fd_;
  if (options_.udp_offloads) {
    bool gso = false;
    EnableUdpOffloads(fd_, &gso, &gro_);
    gso_ = gso;
  }
  receive_bytes_ = ReceiveBufferBytes(options_.max_datagram, gro_);

  // Receive ring, woken through an eventfd.
  receive_ring_ = std::make_unique<io_uring>();
  io_uring_params params{};
  params.flags = IORING_SETUP_CQSIZE;
  params.cq_entries = std::max(options_.ring_entries, std::max(options_.receive_buffers, options_.fallback_receives)) * 4;
  {
    std::lock_guard handover(ring_memory_handover);
    // EINVAL here is a kernel without IORING_SETUP_CQSIZE (before Linux 5.5): io_uring exists but cannot serve us,
    // which the caller takes as a refusal (-EOPNOTSUPP), like EPERM or ENOSYS, and falls back to sockets.
    if (int r = io_uring_queue_init_params(options_.ring_entries, receive_ring_.get(), &params); r < 0)
      return r == -EINVAL ? -EOPNOTSUPP : r;
  }
  receive_ring_ready_ = true;
  ring_event_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (ring_event_fd_ < 0 || wake_fd_ < 0) return -errno;
  if (int r = io_uring_register_eventfd(receive_ring_.get(), ring_event_fd_); r < 0) return r;

  if (!options_.force_fallback_receive && SetUpMultishot() == 0) {
    multishot_ = true;
  }
  // Fallback slots are set up either way: they take over if the kernel rejects multishot recvmsg at the first Poll.
  receive_slots_.resize(options_.fallback_receives);
  for (uint32_t i = 0; i < options_.fallback_receives; ++i) idle_receive_slots_.push_back(i);
  return 0;
}

// Provided-buffer ring (IORING_REGISTER_PBUF_RING, Linux 5.19) for multishot recvmsg (Linux 6.0). liburing 2.3
// lacks io_uring_setup_buf_ring(), so the ring memory is mapped here and registered with io_uring_register_buf_ring.
int UringTransport::SetUpMultishot() {
  io_uring_probe* probe = io_uring_get_probe_ring(receive_ring_.get());
  if (!probe) return -ENOSYS;
  const bool recvmsg = io_uring_opcode_supported(probe, IORING_OP_RECVMSG);
  io_uring_free_probe(probe);
  if (!recvmsg) return -ENOSYS;

  unsigned count = 1;
  // With UDP_GRO each buffer holds a whole run (64 KiB): at most 64 of them, 4 MiB. When they are all taken the
  // multishot receive ends (-ENOBUFS) and is re-armed once the Poll has handed them back; the socket buffer holds
  // what arrives meanwhile.
  const unsigned wanted = gro_ ? std::min(options_.receive_buffers, 64u) : options_.receive_buffers;
  while (count < wanted && count < 32768) count <<= 1;
  buf_count_ = count;
  // Each buffer holds io_uring_recvmsg_out, the source address, the control messages, then the payload.
  buf_size_ = AlignUp(sizeof(io_uring_recvmsg_out) + sizeof(sockaddr_storage) + kControlBytes + receive_bytes_, 64);
  buf_ring_bytes_ = AlignUp(sizeof(io_uring_buf) * buf_count_, 4096);
  void* ring_mem = mmap(nullptr, buf_ring_bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (ring_mem == MAP_FAILED) return -ENOMEM;
  buf_ring_ = static_cast<io_uring_buf_ring*>(ring_mem);
  receive_buffers_bytes_ = AlignUp(buf_size_ * buf_count_, 4096);
  void* bufs = mmap(nullptr, receive_buffers_bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (bufs == MAP_FAILED) return -ENOMEM;
  receive_buffers_ = static_cast<uint8_t*>(bufs);

  io_uring_buf_reg reg{};
  reg.ring_addr = reinterpret_cast<uintptr_t>(buf_ring_);
  reg.ring_entries = buf_count_;
  reg.bgid = kBufferGroup;
  if (int r = io_uring_register_buf_ring(receive_ring_.get(), &reg, 0); r < 0) return r;
  buf_ring_registered_ = true;
  io_uring_buf_ring_init(buf_ring_);
  const int mask = io_uring_buf_ring_mask(buf_count_);
  for (unsigned i = 0; i < buf_count_; ++i) {
    io_uring_buf_ring_add(buf_ring_, receive_buffers_ + i * buf_size_, unsigned(buf_size_), uint16_t(i), mask, int(i));
  }
  io_uring_buf_ring_advance(buf_ring_, int(buf_count_));

  // The template multishot recvmsg reads: only the name and control lengths matter (io_uring_prep_recvmsg_multishot).
  multishot_msg_ = std::make_unique<msghdr>();
  multishot_msg_->msg_namelen = sizeof(sockaddr_storage);
  multishot_msg_->msg_controllen = kControlBytes;
  return 0;
}

UringTransport::~UringTransport() {
  // Torn down on a thread of its own, as it was set up (file comment): the kernel's notification to the ring's users
  // then reaches no thread of the application.
  OnOwnThread([this] {
    TearDown();
    return 0;
  });
}

void UringTransport::TearDown() {
  if (receive_ring_ready_) {
    CancelReceives();
    if (buf_ring_registered_) io_uring_unregister_buf_ring(receive_ring_.get(), kBufferGroup);
    {
      std::lock_guard handover(ring_memory_handover);
      io_uring_queue_exit(receive_ring_.get());
    }
    last_ring_teardown_ns.store(SteadyNowNs(), std::memory_order_relaxed);
    receive_ring_ready_ = false;
  }
  if (fd_ >= 0) close(fd_);
  if (ring_event_fd_ >= 0) close(ring_event_fd_);
  if (wake_fd_ >= 0) close(wake_fd_);
  fd_ = ring_event_fd_ = wake_fd_ = -1;
  for (ReceiveSlot& s : receive_slots_) delete[] s.buffer;
  receive_slots_.clear();
  if (receive_buffers_) munmap(receive_buffers_, receive_buffers_bytes_);
  if (buf_ring_) munmap(buf_ring_, buf_ring_bytes_);
  receive_buffers_ = nullptr;
  buf_ring_ = nullptr;
}

void UringTransport::CountEndedReceive(const Completion& c) {
  const uint64_t tag = c.user_data & kTagMask;
  if (tag == kTagMultishot && !(c.flags & IORING_CQE_F_MORE)) {
    multishot_armed_ = false;
    --outstanding_receives_;
  } else if (tag == kTagFallback) {
    --outstanding_receives_;
  }
}

// Cancels outstanding receives and waits for their final completions, so the kernel never writes into buffers
// after they are freed (ring teardown alone cancels asynchronously).
void UringTransport::CancelReceives(std::vector<Completion>* keep) {
  io_uring* ring = receive_ring_.get();
  if (outstanding_receives_ == 0) return;
  if (io_uring_sqe* sqe = io_uring_get_sqe(ring)) {
    io_uring_prep_cancel_fd(sqe, fd_, IORING_ASYNC_CANCEL_ALL);
    io_uring_sqe_set_data64(sqe, kTagCancel);
    io_uring_submit(ring);
  }
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  while (outstanding_receives_ > 0 && std::chrono::steady_clock::now() < give_up) {
    io_uring_cqe* cqe = nullptr;
    __kernel_timespec ts{0, 100'000'000};
    if (io_uring_wait_cqe_timeout(ring, &cqe, &ts) < 0) continue;
    unsigned head;
    unsigned seen = 0;
    io_uring_for_each_cqe(ring, head, cqe) {
      ++seen;
      const uint64_t tag = cqe->user_data & kTagMask;
      if (tag == kTagCancel) continue;
      const Completion c{cqe->user_data, cqe->res, cqe->flags};
      // Counted here, so that a later Cancel or re-arm sees the truth before the kept completions are handled
      // (ProcessReceives is told they are counted).
      CountEndedReceive(c);
      if (keep) keep->push_back(c);
    }
    io_uring_cq_advance(ring, seen);
  }
}

int UringTransport::Send(std::span<const OutDatagram> batch) {
  // From any thread, with no lock, as SocketTransport sends: what a full send buffer refuses waits for room in the
  // caller's sendmmsg. Queued on a ring instead, it would have to be submitted from the caller's thread, which would
  // make that thread a user of the ring (file comment). On loopback, veth and tap the send buffer is released as a
  // datagram is handed on (the devices orphan it), so a sender waits only where a NIC's queue is full.
  return SendDatagrams(fd_, family_, local_.addr, batch, options_.max_datagram, kMaxSendChunk, gso_, counters_, 0);
}

int UringTransport::ArmReceives() {
  io_uring* ring = receive_ring_.get();
  if (multishot_ && !multishot_armed_) {
    io_uring_sqe* sqe = io_uring_get_sqe(ring);
    if (!sqe) return -EAGAIN;
    io_uring_prep_recvmsg_multishot(sqe, fd_, multishot_msg_.get(), 0);
    sqe->flags |= IOSQE_BUFFER_SELECT;
    sqe->buf_group = kBufferGroup;
    io_uring_sqe_set_data64(sqe, kTagMultishot);
    multishot_armed_ = true;
    ++outstanding_receives_;
  }
  if (!multishot_ && outstanding_receives_ == 0) {
    // Independent single-shot receives parked on one socket may complete out of arrival order, which would make
    // loopback traffic look reordered. Linked into one chain (IOSQE_IO_LINK) they run one after the other, so
    // completions keep the socket's order; the chain is re-armed once all of it has completed.
    std::sort(idle_receive_slots_.begin(), idle_receive_slots_.end(), std::greater<>());
    while (!idle_receive_slots_.empty()) {
      io_uring_sqe* sqe = io_uring_get_sqe(ring);
      if (!sqe) break;
      const uint32_t index = idle_receive_slots_.back();
      idle_receive_slots_.pop_back();
      ReceiveSlot& slot = receive_slots_[index];
      if (!slot.buffer) slot.buffer = new uint8_t[receive_bytes_];
      slot.iov = iovec{slot.buffer, receive_bytes_};
      slot.msg = msghdr{};
      slot.msg.msg_name = &slot.addr;
      slot.msg.msg_namelen = sizeof slot.addr;
      slot.msg.msg_iov = &slot.iov;
      slot.msg.msg_iovlen = 1;
      std::memset(slot.control, 0, sizeof slot.control);
      slot.msg.msg_control = slot.control;
      slot.msg.msg_controllen = sizeof slot.control;
      io_uring_prep_recvmsg(sqe, fd_, &slot.msg, 0);
      io_uring_sqe_set_data64(sqe, kTagFallback | index);
      if (!idle_receive_slots_.empty()) sqe->flags |= IOSQE_IO_LINK;
      ++outstanding_receives_;
    }
  }
  const int r = io_uring_submit(ring);
  armed_ = true;
  return r < 0 ? r : 0;
}

int UringTransport::ReapReceives(const DatagramHandler& handler) {
  io_uring* ring = receive_ring_.get();
  io_uring_cqe* cqes[kReapBatch];
  const unsigned n = io_uring_peek_batch_cqe(ring, cqes, kReapBatch);
  if (n == 0) return 0;
  // Copy the completions out and release the CQ slots first; buffers stay ours until handed back below.
  Completion done[kReapBatch];
  for (unsigned i = 0; i < n; ++i) done[i] = Completion{cqes[i]->user_data, cqes[i]->res, cqes[i]->flags};
  io_uring_cq_advance(ring, n);
  return ProcessReceives({done, n}, handler, false);
}

int UringTransport::ProcessReceives(std::span<const Completion> done, const DatagramHandler& handler,
                                    bool counted) {
  const unsigned n = unsigned(done.size());
  size_t bytes = 0;
  for (const Completion& c : done) bytes += c.res > 0 ? size_t(c.res) : 0;
  const bool congested = bytes >= kCongestionProbeBytes && ReceiveQueueCongested(fd_);
  const ClockBatch batch;  // one reading of the clock for the device's handling of the run (wire/clock.h)
  int delivered = 0;
  const int mask = buf_ring_ ? io_uring_buf_ring_mask(buf_count_) : 0;
  int returned = 0;
  bool fall_back = false;
  for (unsigned i = 0; i < n; ++i) {
    const Completion& c = done[i];
    const uint64_t tag = c.user_data & kTagMask;
    if (!counted) CountEndedReceive(c);
    if (tag == kTagMultishot) {
      if (c.flags & IORING_CQE_F_BUFFER) {
        const uint16_t bid = uint16_t(c.flags >> IORING_CQE_BUFFER_SHIFT);
        uint8_t* buf = receive_buffers_ + size_t(bid) * buf_size_;
        if (c.res >= 0) {
          multishot_delivered_ = true;
          io_uring_recvmsg_out* out = io_uring_recvmsg_validate(buf, c.res, multishot_msg_.get());
          if (!out) {
            counters_.ReceiveFailed();
          } else {
            msghdr msg{};
            msg.msg_name = io_uring_recvmsg_name(out);
            msg.msg_namelen = std::min<socklen_t>(out->namelen, multishot_msg_->msg_namelen);
            // The control messages follow the name area, whose size the template fixed.
            msg.msg_control = static_cast<uint8_t*>(io_uring_recvmsg_name(out)) + multishot_msg_->msg_namelen;
            msg.msg_controllen = out->controllen;
            const size_t len = io_uring_recvmsg_payload_length(out, c.res, multishot_msg_.get());
            // The kernel sets MSG_TRUNC in out->flags and payloadlen to the datagram's full length.
            const auto* payload = static_cast<const uint8_t*>(io_uring_recvmsg_payload(out, multishot_msg_.get()));
            delivered += DeliverReceived(handler, msg, {payload, len}, int(out->flags), local_, options_.max_datagram,
                                         options_.responses_first, counters_, congested);
          }
        }
        io_uring_buf_ring_add(buf_ring_, buf, unsigned(buf_size_), bid, mask, returned++);
      } else if (c.res < 0) {
        if (c.res == -EINVAL && !multishot_delivered_) {
          fall_back = true;  // kernel before 6.0: no multishot recvmsg
        } else if (c.res != -ENOBUFS && c.res != -ECANCELED) {
          counters_.ReceiveFailed();
        }
      }
    } else if (tag == kTagFallback) {
      const uint32_t index = uint32_t(c.user_data);
      ReceiveSlot& slot = receive_slots_[index];
      if (c.res >= 0) {
        delivered += DeliverReceived(handler, slot.msg, {slot.buffer, size_t(c.res)}, slot.msg.msg_flags, local_,
                                     options_.max_datagram, options_.responses_first, counters_, congested);
      } else if (c.res != -ECANCELED) {
        counters_.ReceiveFailed();
      }
      idle_receive_slots_.push_back(index);
    }
  }
  if (returned > 0) io_uring_buf_ring_advance(buf_ring_, returned);
  if (fall_back) multishot_ = false;
  // Re-arm: a multishot that ended (ENOBUFS, cancelled by an exiting submitter thread), fallback slots consumed.
  if (want_armed_ && ((multishot_ && !multishot_armed_) || (!multishot_ && outstanding_receives_ == 0))) {
    if (int r = ArmReceives(); r < 0 && delivered == 0) return r;
  }
  return delivered;
}

void UringTransport::SetReceiveArmed(bool armed) {
  if (armed == want_armed_) return;
  want_armed_ = armed;
  if (armed) {
    if (int r = ArmReceives(); r < 0) counters_.ReceiveFailed();  // the next Poll tries again
    return;
  }
  armed_ = false;
  // What the cancelled receives had already taken came before anything still in the socket: the next Poll delivers
  // it first.
  CancelReceives(&stashed_);
}

int UringTransport::Poll(const DatagramHandler& handler, int64_t timeout_ns) {
  if (!stashed_.empty()) {
    std::vector<Completion> stashed;
    stashed.swap(stashed_);
    if (const int n = ProcessReceives(stashed, handler, true); n != 0) return n;
  }
  if (!want_armed_) {
    // Receives are not armed in the kernel: take what the ring still holds, then what waits in the socket.
    if (const int n = ReapReceives(handler); n != 0) return n;
    return PollSocketDirectly(handler, timeout_ns);
  }
  if (!armed_) {
    if (int r = ArmReceives(); r < 0) return r;
  }
  const auto deadline = timeout_ns > 0 ? std::chrono::steady_clock::now() + std::chrono::nanoseconds(timeout_ns)
                                       : std::chrono::steady_clock::time_point{};
  while (true) {
    const int n = ReapReceives(handler);
    if (n != 0) return n;
    if (io_uring_cq_ready(receive_ring_.get()) > 0) continue;  // completions without data (re-arm, errors)
    if (timeout_ns == 0) return 0;  // a Wake() stays pending for the next poll that would block
    uint64_t v;
    if (read(wake_fd_, &v, sizeof v) == sizeof v) return 0;
    // Clear the ring's eventfd before the last look at the CQ: a completion after that look signals it again.
    DrainEventFd(ring_event_fd_);
    if (io_uring_cq_ready(receive_ring_.get()) > 0) continue;
    timespec ts{};
    timespec* tsp = nullptr;
    if (timeout_ns > 0) {
      const int64_t left =
          std::chrono::duration_cast<std::chrono::nanoseconds>(deadline - std::chrono::steady_clock::now()).count();
      if (left <= 0) return ReapReceives(handler);
      ts.tv_sec = left / 1'000'000'000;
      ts.tv_nsec = left % 1'000'000'000;
      tsp = &ts;
    }
    pollfd fds[2] = {{ring_event_fd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
    const int r = ppoll(fds, 2, tsp, nullptr);
    if (r < 0 && errno != EINTR) return -errno;
  }
}

int UringTransport::PollSocketDirectly(const DatagramHandler& handler, int64_t timeout_ns) {
  if (!direct_ready_) {
    if (int r = direct_.Init(32, options_.max_datagram, gro_, options_.responses_first); r < 0) return r;
    direct_ready_ = true;
  }
  return direct_.Poll(fd_, wake_fd_, handler, local_, counters_, timeout_ns);
}

void UringTransport::Wake() { SignalEventFd(wake_fd_); }

UdpCounters UringTransport::counters() const { return counters_.Snapshot(); }

}  // namespace uroce::wire

