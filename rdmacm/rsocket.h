// rsockets (rsocket(7)): byte streams over RC QPs that rdma_cm connects, for programs written against sockets
// (rstream), and datagrams over UD QPs. uroce-to-uroce only: the framing is ours, not rdma-core's rsocket protocol.
// Not supported (README): datagrams to other hosts, librspreload's fork support.
//
// The files, by concern:
//   rsocket_api.cc     the exported r* functions and the table of rsockets (descriptor -> RSocket);
//   rsocket_stream.cc  stream rsockets: the handshake (StreamHello), credits, the end of stream, riomap / riowrite;
//   rsocket_dgram.cc   datagram rsockets: UD QPs found through the host's port registry;
//   rsocket_queues.cc  what both kinds have: the CQ, the send and receive buffers, taking completions (PollCq);
//   rsocket_wait.cc    blocking: WaitUntil, the listener's wait, rpoll.
//
// Progress needs no thread of ours: the engine moves the data, and every call polls the CQ; a blocking call (and
// rpoll) polls for a while, then sleeps on the CQ's completion channel (WaitUntil).
//
// Locking. Each rsocket has its own mutex (RSocket::mu), which guards all of its state and is held through a call on
// it, except while the call sleeps (WaitUntil, WaitForConnectRequest) or waits for a CM event of a handshake
// (raccept's last step, rconnect's steps). The table's mutex (rsocket_api.cc) guards only the map from descriptors to
// rsockets and is never held while another lock is taken. Order: an rsocket's mu, then librdmacm's library mutex
// and the verbs' own locks (the rdma_* and ibv_* calls it makes); two rsockets' mutexes are never held together
// (rpoll looks at one at a time). An RSocket is shared (std::shared_ptr): a call keeps the one it found alive, and
// finds it `closed` once rclose took it out of the table (EBADF).
#pragma once

#include <infiniband/verbs.h>
#include <poll.h>
#include <rdma/rdma_cma.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <type_traits>
#include <utility>
#include <vector>

#include "rdmacm/port_registry.h"
#include "wire/address.h"

namespace uroce::rdmacm::rsockets {

inline constexpr int kSlots = 32;
inline constexpr uint32_t kSlotBytes = 16384;
// A receive's work request id: kRecvFlag | its slot. A send's: its slot, or one of the stream's ids for SENDs that
// take none (FinWrId, CreditsWrId).
inline constexpr uint64_t kRecvFlag = 1ull << 32;
// At most this many kCredits SENDs of a stream are outstanding (they take no send slot; the send queue has room for
// them). The CQ and the send queue are sized for them.
inline constexpr int kMaxCreditSendsInFlight = 4;

// What riomap tells the peer: its RDMA WRITEs to [offset, offset + length) land at addr with rkey.
struct IomapAd {
  uint64_t offset;
  uint64_t addr;
  uint32_t rkey;
  uint32_t length;
};

using Deadline = std::chrono::steady_clock::time_point;

template <typename R = int>
R Fail(int err) {
  errno = err;
  return static_cast<R>(-1);
}

// What a stream rsocket adds: its connection, the credits of its flow control, the end of each direction, riomap.
struct StreamState {
  bool listening = false;
  bool connecting = false;  // rconnect's handshake is under way (its thread waits without the lock)
  bool connected = false;
  bool cm_disconnected = false;  // the connection's DISCONNECTED event was taken (TakeCmEvents)
  bool fin_sent = false;
  bool fin_wanted = false;  // rshutdown / rclose asked for the end of stream (sent once a credit allows)
  bool read_shut = false;   // rshutdown SHUT_RD: a receive with nothing ready returns 0
  rdma_event_channel* channel = nullptr;
  rdma_cm_id* id = nullptr;
  int credits = 0;                 // receives the peer has posted that our SENDs may consume
  int credits_owed = 0;            // receives posted again since the peer was last told
  int credit_sends_in_flight = 0;  // kCredits SENDs not completed yet
  std::map<void*, ibv_mr*> local_maps;  // riomap'ed buffers, by address
  std::vector<IomapAd> peer_maps;       // what the peer riomap'ed
};

// What a datagram rsocket adds: a UD QP of its own, published in the host's port registry with its QPN.
struct DatagramState {
  ibv_pd* pd = nullptr;
  ibv_qp* qp = nullptr;
  PortBinding binding;
  wire::IpAddress device;
  size_t max_dgram = 0;                  // the largest datagram: the port's MTU less our header
  std::optional<sockaddr_storage> peer;  // rconnect's destination
  std::map<std::pair<wire::IpAddress, uint32_t>, ibv_ah*> ahs;
  std::map<uint16_t, PortOwner> owners;  // by port: who held it when last looked up (OwnerOf)
  PortOwnerProbe owner_probe;
};

struct RSocket {
  explicit RSocket(bool datagram) : dgram(datagram) {}
  RSocket(const RSocket&) = delete;
  RSocket& operator=(const RSocket&) = delete;
  ~RSocket() {
    if (wake_fd >= 0) close(wake_fd);
  }

  const bool dgram;  // SOCK_DGRAM: `datagram` is used; else `stream`
  int fd = -1;       // the descriptor the application holds (an eventfd nobody signals); set before it is shared

  std::mutex mu;  // guards everything below
  bool closed = false;  // rclose took it out of the table: a call that still reaches it fails with EBADF
  int family = AF_INET;
  bool nonblocking = false;
  int error = 0;
  bool peer_fin = false;  // nothing more will arrive (end of stream, a failed completion)
  sockaddr_storage bound{};
  bool has_bound = false;
  std::map<std::pair<int, int>, int> options;  // (level, name) -> value, for rgetsockopt

  // The queues (rsocket_queues.cc): one CQ for sends and receives, `slots` buffers of `slot_bytes` each way.
  ibv_cq* cq = nullptr;
  ibv_comp_channel* cq_channel = nullptr;  // where a blocked call sleeps (WaitUntil); non-blocking descriptor
  ibv_mr* recv_mr = nullptr;
  ibv_mr* send_mr = nullptr;
  int slots = kSlots;
  uint32_t slot_bytes = kSlotBytes;
  std::vector<uint8_t> recv_buf, send_buf;
  std::vector<int> free_send;                  // send slots not in flight
  std::deque<std::pair<int, uint32_t>> ready;  // received slots, in order, with their lengths
  uint32_t ready_offset = 0;                   // bytes of ready.front() already read (streams)

  // Threads blocked on this rsocket (WaitUntil; a reader and a writer, say). One sleeps on the CQ's completion
  // channel (channel_sleeper), the others on `changed`. A thread that takes completions from the CQ (PollCq) may take
  // what another waits for -- a credit, a free send slot -- after that one armed the CQ and looked: so it signals
  // `changed`, and `wake_fd`, which the channel sleeper polls beside the channel (an event of the channel wakes one
  // sleeper's look, and whoever drains it first would otherwise leave the other asleep for good).
  int waiters = 0;
  bool channel_sleeper = false;
  bool closing = false;  // rclose is waiting for the blocked threads to leave (they fail with EBADF)
  std::condition_variable changed;
  int wake_fd = -1;  // eventfd, made on the first sleep

  StreamState stream;
  DatagramState datagram;

  ibv_qp* qp() const { return dgram ? datagram.qp : stream.id->qp; }
};

// --- the table (rsocket_api.cc) ---------------------------------------------------------------------------------
// The rsocket behind descriptor `fd`, or nullptr.
std::shared_ptr<RSocket> Lookup(int fd);

// --- queues (rsocket_queues.cc) ---------------------------------------------------------------------------------
int PostRecv(RSocket* rs, int slot);  // 0 or errno
// The send and receive buffers of an rsocket whose QP exists, every receive posted. 0 or errno.
int SetUpBuffers(RSocket* rs, ibv_pd* pd);
// The rsocket's CQ with a completion channel of its own, whose descriptor does not block (WaitUntil drains it
// after poll(2) says it is readable, perhaps after another thread did). 0 or errno.
int CreateCq(RSocket* rs, ibv_context* verbs);
void DestroyCqChannel(RSocket* rs);  // after the CQ is destroyed
// Takes what the CQ holds: received slots to `ready`, finished sends back to `free_send`, a stream's credits and
// control messages (OnStreamCompletion); wakes the threads blocked on the rsocket when there was something.
void PollCq(RSocket* rs);
// What every rsocket does with a completion other than a successful receive: a finished send frees its slot; a
// failed one ends the rsocket. True when `wc` was one of those.
bool TookSendOrFailure(RSocket* rs, const ibv_wc& wc);

// --- streams (rsocket_stream.cc) --------------------------------------------------------------------------------
// One completion of a stream rsocket's CQ (PollCq).
void OnStreamCompletion(RSocket* rs, const ibv_wc& wc);
// Sends what is waiting for a credit: the end of stream, and the credits owed.
void SendWhatCreditsAllow(RSocket* rs);
bool HasCreditForData(const RSocket* rs);
int StreamListen(RSocket* rs, int backlog);  // -1 with errno, or 0
// raccept: the next connection request of listener `ls` (its lock held through `lock`), as a new connected rsocket.
// nullptr with errno.
std::shared_ptr<RSocket> StreamAccept(RSocket* ls, std::unique_lock<std::mutex>& lock);
// rconnect of a stream rsocket: the whole handshake. 0 or errno.
int StreamConnect(RSocket* rs, std::unique_lock<std::mutex>& lock, const sockaddr* addr, socklen_t addrlen);
ssize_t StreamSend(RSocket* rs, std::unique_lock<std::mutex>& lock, const void* buf, size_t len, int flags);
ssize_t StreamRecv(RSocket* rs, std::unique_lock<std::mutex>& lock, void* buf, size_t len, int flags);
int StreamShutdown(RSocket* rs, std::unique_lock<std::mutex>& lock, int how);  // 0 or errno
// rclose of a stream rsocket nobody else reaches any more: the end of stream, then the connection's resources.
void StreamClose(RSocket* rs, std::unique_lock<std::mutex>& lock);
off_t StreamIomap(RSocket* rs, std::unique_lock<std::mutex>& lock, void* buf, size_t len, int prot, off_t offset);
size_t StreamIowrite(RSocket* rs, std::unique_lock<std::mutex>& lock, const void* buf, size_t count, off_t offset,
                     int flags);
int StreamIounmap(RSocket* rs, void* buf);  // 0 or errno
// The CM channel a wait watches beside the CQ's: a connected stream's, until its DISCONNECTED is taken; else -1.
int CmWatchFd(const RSocket* rs);
// The connection's own CM events (a DISCONNECTED without the peer's end of stream ends the stream).
void TakeCmEvents(RSocket* rs);

// --- datagrams (rsocket_dgram.cc) -------------------------------------------------------------------------------
void OnDatagramCompletion(RSocket* rs, const ibv_wc& wc);  // PollCq
// The UD QP, CQ, buffers and posted receives of a new datagram rsocket; 0 or errno (then DgramTearDown).
int DgramSetUp(RSocket* rs);
void DgramTearDown(RSocket* rs);
int DgramBind(RSocket* rs, const sockaddr* addr);  // 0 or errno
int DgramConnect(RSocket* rs, const sockaddr* addr, socklen_t addrlen);  // 0 or errno
ssize_t DgramSend(RSocket* rs, std::unique_lock<std::mutex>& lock, const void* buf, size_t len, int flags,
                  const sockaddr* dst);
ssize_t DgramRecv(RSocket* rs, std::unique_lock<std::mutex>& lock, void* buf, size_t len, int flags, sockaddr* src,
                  socklen_t* srclen);

// --- waiting (rsocket_wait.cc) ----------------------------------------------------------------------------------
// A condition a wait looks at (with the rsocket's lock held): a reference to a callable, valid for the call.
class Ready {
 public:
  template <typename F, typename = std::enable_if_t<!std::is_same_v<std::decay_t<F>, Ready>>>
  Ready(F&& f) : f_(&f), call_([](void* f) { return bool((*static_cast<std::remove_reference_t<F>*>(f))()); }) {}
  bool operator()() const { return call_(f_); }

 private:
  void* f_;
  bool (*call_)(void*);
};

// Blocks, with the lock released, until `ready()` (which polls the CQ) holds -- true -- or `deadline` passes or
// another thread closes the rsocket (RSocket::closing: the caller fails with EBADF) -- false.
bool WaitUntil(RSocket* rs, std::unique_lock<std::mutex>& lock, Ready ready, Deadline deadline = Deadline::max());
// Blocks, with the lock released, until the stream rsocket's CM channel has an event waiting (a listener's
// connection request, a step of rconnect's handshake): 0; EBADF when another thread closes the rsocket meanwhile
// (the caller counts as one of its waiters while it waits), the eventfd's errno when none can be made.
int WaitForCmEvent(RSocket* rs, std::unique_lock<std::mutex>& lock);
// A free send buffer -- and for a SEND of a stream rsocket (`needs_credit`) a credit for it -- waiting for them
// when `wait`: the buffer's index, or -EAGAIN / -errno (the connection failed).
int TakeSendSlot(RSocket* rs, std::unique_lock<std::mutex>& lock, bool wait, bool needs_credit);
// Whether a receive would not wait (data ready, the end of the stream, an error, SHUT_RD).
bool Readable(const RSocket* rs);
// Makes the threads blocked on `rs` look again.
void WakeWaiters(RSocket* rs);
// rclose: the threads blocked on `rs` leave (failing with EBADF); returns once none is left.
void LetWaitersGo(RSocket* rs, std::unique_lock<std::mutex>& lock);
int Rpoll(pollfd* fds, nfds_t nfds, int timeout);

}  // namespace uroce::rdmacm::rsockets
