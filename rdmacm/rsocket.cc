// rsockets (rsocket(7)): byte streams over RC QPs that rdma_cm connects, for programs written against sockets
// (rstream). uroce-to-uroce only: the framing below is ours, not rdma-core's rsocket protocol.
//
// A stream rsocket is a connection id with one RC QP and one CQ. Each side pre-posts kSlots receive buffers of
// kSlotBytes; a send copies up to kSlotBytes into one of kSlots send buffers and posts a SEND. A SEND's immediate
// data says what it is (MessageKind) and hands back credits; data that hands none back goes without (PostMessage).
// The receiver posts a buffer again once the application has read it (a control message's at once), and each such
// buffer is a credit for the peer: a SEND is posted only against a credit -- a receive the peer is known to have
// posted -- so a sender that outruns its reader waits for credits instead of meeting RNR NAKs (each of which also
// costs the packets in flight behind it, dropped out of sequence and sent again). Credits go back on every SEND, and
// in a zero-length kCredits SEND once half the receive buffers are owed. The end of a stream is a zero-length kFin
// SEND (rshutdown SHUT_WR, rclose). Progress needs no thread of ours: the engine moves the data, and every call
// polls the CQ; a blocking call (and rpoll) polls for a while, then sleeps on the CQ's completion channel
// (WaitUntil).
//
// riomap announces a registered buffer to the peer (a kIomap SEND); riowrite is then RDMA WRITEs into it (they
// consume no receive and need no credit). Datagram rsockets are UD QPs found through the host's port registry
// (below), uroce-to-uroce on one host.
// Not supported (README): datagrams to other hosts, librspreload's fork support.
// rpoll and rselect take ordinary descriptors as poll(2) and select(2) do; rdmacm-utils' common code uses them so.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <rdma/rdma_cma.h>
#include <rdma/rsocket.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/select.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdarg>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "rdmacm/internal.h"
#include "rdmacm/port_registry.h"
#include "wire/address.h"

namespace {

using uroce::rdmacm::PortBinding;

constexpr int kSlots = 32;
constexpr uint32_t kSlotBytes = 16384;

// A stream SEND's immediate data: the kind of message in the top byte, the credits it hands back below it.
enum class MessageKind : uint32_t {
  kData = 0,     // bytes of the stream
  kFin = 1,      // the end of the stream (zero-length)
  kIomap = 2,    // an IomapAd: a buffer the peer riomap'ed
  kCredits = 3,  // credits only (zero-length)
};
constexpr int kKindShift = 24;
constexpr uint32_t kCreditsMask = (1u << kKindShift) - 1;
// Flow control (above). The last credit is kept for a kCredits SEND: with both sides sending, one whose reader has
// freed buffers must still be able to say so, or each would wait for the other's credits for ever. Credits go back
// once half the receive buffers are owed, and at most kMaxCreditSendsInFlight kCredits SENDs are outstanding (they
// take no send slot; the send queue has room for them).
constexpr int kReservedCredits = 1;
constexpr int kMaxCreditSendsInFlight = 4;

// What riomap tells the peer: its RDMA WRITEs to [offset, offset + length) land at addr with rkey.
struct IomapAd {
  uint64_t offset;
  uint64_t addr;
  uint32_t rkey;
  uint32_t length;
};
// 0.01 ms (IBTA table 45). Credits keep a sender from outrunning our receives; should one (a bug) it retries soon.
constexpr uint8_t kShortestRnrTimer = 1;

// What the two sides of a stream connection say in its REQ and REP private data: that they speak this framing
// (uroce's, not rdma-core's rsocket protocol), and how many receive buffers each posts -- the other's first credits.
// A request without it (rdma-core's rsockets on another host, an rdma_cm program dialling the port) is rejected: it
// would otherwise connect and then exchange what neither side understands.
struct StreamHello {
  char magic[4];
  uint8_t version;
  uint8_t reserved;
  uint16_t slots;  // big-endian
};
constexpr char kStreamMagic[4] = {'u', 'r', 's', 'k'};
constexpr uint8_t kStreamVersion = 1;

StreamHello HelloFor(int slots) {
  StreamHello h{};
  std::memcpy(h.magic, kStreamMagic, sizeof h.magic);
  h.version = kStreamVersion;
  h.slots = htons(uint16_t(slots));
  return h;
}

// The receive buffers a peer's hello announces; 0 when `data` is not one (then the connection is refused).
int PeerSlots(const void* data, uint8_t len) {
  if (data == nullptr || len < sizeof(StreamHello)) return 0;
  StreamHello h;
  std::memcpy(&h, data, sizeof h);
  if (std::memcmp(h.magic, kStreamMagic, sizeof h.magic) != 0 || h.version != kStreamVersion) return 0;
  return ntohs(h.slots);
}
constexpr uint64_t kRecvFlag = 1ull << 32;

template <typename R = int>
R Fail(int err) {
  errno = err;
  return static_cast<R>(-1);
}

struct RSocket {
  int fd = -1;  // the descriptor the application holds (an eventfd nobody signals)
  int family = AF_INET;
  bool nonblocking = false;
  bool listening = false;
  bool connected = false;
  bool peer_fin = false;
  bool cm_disconnected = false;  // the connection's DISCONNECTED event was taken (TakeCmEvents)
  bool fin_sent = false;
  bool read_shut = false;  // rshutdown SHUT_RD: a receive with nothing ready returns 0
  int error = 0;
  sockaddr_storage bound{};
  bool has_bound = false;
  rdma_event_channel* channel = nullptr;
  rdma_cm_id* id = nullptr;
  ibv_cq* cq = nullptr;
  ibv_comp_channel* cq_channel = nullptr;  // where a blocked call sleeps (WaitUntil); non-blocking descriptor
  ibv_mr* recv_mr = nullptr;
  ibv_mr* send_mr = nullptr;
  int slots = kSlots;                 // send and receive buffers, each of slot_bytes
  uint32_t slot_bytes = kSlotBytes;
  std::vector<uint8_t> recv_buf, send_buf;
  std::vector<int> free_send;                   // send slots not in flight
  int credits = 0;                              // receives the peer has posted that our SENDs may consume
  int credits_owed = 0;                         // receives posted again since the peer was last told
  int credit_sends_in_flight = 0;               // kCredits SENDs not completed yet
  bool fin_wanted = false;                      // rshutdown / rclose asked for the end of stream (sent once a
                                                // credit allows)
  std::deque<std::pair<int, uint32_t>> ready;  // received slots, in order, with their lengths
  uint32_t ready_offset = 0;                   // bytes of ready.front() already read
  std::map<std::pair<int, int>, int> options;  // (level, name) -> value, for rgetsockopt
  std::map<void*, ibv_mr*> local_maps;         // riomap'ed buffers, by address
  std::vector<IomapAd> peer_maps;              // what the peer riomap'ed
  // Datagram rsockets: a UD QP of their own, published in the host's port registry with its QPN.
  bool dgram = false;
  ibv_pd* pd = nullptr;
  ibv_qp* ud_qp = nullptr;
  PortBinding binding;
  uroce::wire::IpAddress device;
  size_t max_dgram = 0;                  // the largest datagram: the port's MTU less our header
  std::optional<sockaddr_storage> peer;  // rconnect's destination
  std::map<std::pair<uroce::wire::IpAddress, uint32_t>, ibv_ah*> ahs;
  std::map<uint16_t, uroce::rdmacm::PortOwner> owners;  // by port: who held it when last looked up (OwnerOf)
  uroce::rdmacm::PortOwnerProbe owner_probe;
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

  RSocket() = default;
  RSocket(const RSocket&) = delete;
  RSocket& operator=(const RSocket&) = delete;
  ~RSocket() {
    if (wake_fd >= 0) close(wake_fd);
  }
};

std::mutex g_mu;
std::map<int, std::unique_ptr<RSocket>> g_sockets;

RSocket* Find(int fd) {
  auto it = g_sockets.find(fd);
  return it == g_sockets.end() ? nullptr : it->second.get();
}

// Waits for the next event of `rs`'s own channel (blocking) and checks it is `want`. 0 or errno. `peer_slots`: the
// receive buffers the event's private data announces (PeerSlots).
int Expect(RSocket* rs, rdma_cm_event_type want, int* peer_slots = nullptr) {
  rdma_cm_event* e = nullptr;
  if (rdma_get_cm_event(rs->channel, &e) != 0) return errno;
  const rdma_cm_event_type got = e->event;
  const int status = e->status;
  if (peer_slots) *peer_slots = PeerSlots(e->param.conn.private_data, e->param.conn.private_data_len);
  rdma_ack_cm_event(e);
  if (got == want) return 0;
  if (got == RDMA_CM_EVENT_REJECTED) return ECONNREFUSED;
  if (got == RDMA_CM_EVENT_UNREACHABLE || got == RDMA_CM_EVENT_ADDR_ERROR || got == RDMA_CM_EVENT_ROUTE_ERROR)
    return status < 0 ? -status : EHOSTUNREACH;
  return ECONNABORTED;
}

// A stream SEND's work request ids: a send slot's index, or one of these for the SENDs that take none.
uint64_t FinWrId(const RSocket* rs) { return uint64_t(rs->slots); }
uint64_t CreditsWrId(const RSocket* rs) { return uint64_t(rs->slots) + 1; }

int PostRecv(RSocket* rs, int slot) {
  ibv_sge sge{reinterpret_cast<uintptr_t>(rs->recv_buf.data()) + uint64_t(slot) * rs->slot_bytes, rs->slot_bytes,
              rs->recv_mr->lkey};
  ibv_recv_wr wr{}, *bad = nullptr;
  wr.wr_id = kRecvFlag | uint32_t(slot);
  wr.sg_list = &sge;
  wr.num_sge = 1;
  return ibv_post_recv(rs->dgram ? rs->ud_qp : rs->id->qp, &wr, &bad);
}

// The send and receive buffers of an rsocket whose QP exists, every receive posted. 0 or errno.
int SetUpBuffers(RSocket* rs, ibv_pd* pd) {
  rs->recv_buf.resize(size_t(rs->slots) * rs->slot_bytes);
  rs->send_buf.resize(size_t(rs->slots) * rs->slot_bytes);
  rs->recv_mr = ibv_reg_mr(pd, rs->recv_buf.data(), rs->recv_buf.size(), IBV_ACCESS_LOCAL_WRITE);
  rs->send_mr = ibv_reg_mr(pd, rs->send_buf.data(), rs->send_buf.size(), 0);
  if (rs->recv_mr == nullptr || rs->send_mr == nullptr) return errno ? errno : ENOMEM;
  for (int i = 0; i < rs->slots; ++i) {
    rs->free_send.push_back(i);
    if (int err = PostRecv(rs, i)) return err;
  }
  return 0;
}

// The rsocket's CQ with a completion channel of its own, whose descriptor does not block (WaitUntil drains it
// after poll(2) says it is readable, perhaps after another thread did). 0 or errno.
int CreateCq(RSocket* rs, ibv_context* verbs) {
  rs->cq_channel = ibv_create_comp_channel(verbs);
  if (rs->cq_channel == nullptr) return errno ? errno : ENOMEM;
  fcntl(rs->cq_channel->fd, F_SETFL, fcntl(rs->cq_channel->fd, F_GETFL) | O_NONBLOCK);
  rs->cq = ibv_create_cq(verbs, 2 * rs->slots + 2 + kMaxCreditSendsInFlight, nullptr, rs->cq_channel, 0);
  return rs->cq == nullptr ? (errno ? errno : ENOMEM) : 0;
}

// After the CQ is destroyed (every event it raised was acknowledged as it was taken).
void DestroyCqChannel(RSocket* rs) {
  if (rs->cq_channel) ibv_destroy_comp_channel(rs->cq_channel);
  rs->cq_channel = nullptr;
}

// The QP, CQ and buffers of a connection id, receives posted. 0 or errno.
int SetUpQueues(RSocket* rs) {
  if (int err = CreateCq(rs, rs->id->verbs)) return err;
  ibv_qp_init_attr attr{};
  attr.send_cq = rs->cq;
  attr.recv_cq = rs->cq;
  attr.qp_type = IBV_QPT_RC;
  attr.cap.max_send_wr = rs->slots + 1 + kMaxCreditSendsInFlight;  // data, the end of stream, credits
  attr.cap.max_recv_wr = rs->slots;
  attr.cap.max_send_sge = attr.cap.max_recv_sge = 1;
  attr.sq_sig_all = 1;
  if (rdma_create_qp(rs->id, nullptr, &attr) != 0) return errno;
  return SetUpBuffers(rs, rs->id->pd);
}

// Once connected: our responder's RNR timer as short as it goes (the QP is in RTS; no state change).
void Connected(RSocket* rs) {
  ibv_qp_attr a{};
  a.min_rnr_timer = kShortestRnrTimer;
  ibv_modify_qp(rs->id->qp, &a, IBV_QP_MIN_RNR_TIMER);
  rs->connected = true;
  // From now on its channel is only looked at (TakeCmEvents), never waited on.
  fcntl(rs->channel->fd, F_SETFL, fcntl(rs->channel->fd, F_GETFL) | O_NONBLOCK);
}

void TearDown(RSocket* rs) {
  if (rs->id) {
    if (rs->connected) rdma_disconnect(rs->id);
    if (rs->id->qp) ibv_destroy_qp(rs->id->qp);
    rs->id->qp = nullptr;
  }
  for (auto& [addr, mr] : rs->local_maps) ibv_dereg_mr(mr);
  rs->local_maps.clear();
  if (rs->recv_mr) ibv_dereg_mr(rs->recv_mr);
  if (rs->send_mr) ibv_dereg_mr(rs->send_mr);
  if (rs->cq) ibv_destroy_cq(rs->cq);
  DestroyCqChannel(rs);
  if (rs->id) rdma_destroy_id(rs->id);
  if (rs->channel) rdma_destroy_event_channel(rs->channel);
  rs->id = nullptr;
  rs->channel = nullptr;
  rs->cq = nullptr;
  rs->recv_mr = rs->send_mr = nullptr;
}

// The rsocket's wake_fd, made on first use; -1 (errno set) when no eventfd can be made.
int WakeFd(RSocket* rs) {
  if (rs->wake_fd < 0) rs->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  return rs->wake_fd;
}

// Makes the threads blocked on `rs` (WaitUntil, WaitForConnectRequest) look again.
void WakeWaiters(RSocket* rs) {
  if (rs->waiters > 0) rs->changed.notify_all();
  if (rs->wake_fd >= 0 && (rs->channel_sleeper || (rs->listening && rs->waiters > 0))) {
    const uint64_t one = 1;
    [[maybe_unused]] ssize_t n = write(rs->wake_fd, &one, sizeof one);
  }
}

// Posts a SEND of `kind` on a stream rsocket's QP against one credit, handing back the credits owed. 0 or errno.
// Data that hands back no credit goes without immediate data (a SEND without it is data with none): the immediate
// makes a message's last packet 4 bytes longer than the others, so the message no longer leaves as one run of
// equal packets (one UDP GSO send); rstream's 64 KiB transfers lost ~10-20% with an immediate on every SEND.
int PostMessage(RSocket* rs, MessageKind kind, uint64_t wr_id, ibv_sge* sge) {
  ibv_send_wr wr{}, *bad = nullptr;
  wr.wr_id = wr_id;
  wr.sg_list = sge;
  wr.num_sge = sge ? 1 : 0;
  wr.opcode = kind == MessageKind::kData && rs->credits_owed == 0 ? IBV_WR_SEND : IBV_WR_SEND_WITH_IMM;
  wr.imm_data = htonl(uint32_t(kind) << kKindShift | uint32_t(rs->credits_owed));
  if (int err = ibv_post_send(rs->id->qp, &wr, &bad)) return err;
  --rs->credits;
  rs->credits_owed = 0;
  return 0;
}

// Whether a SEND other than kCredits may be posted (the last credit is kept for those).
bool HasCreditForData(const RSocket* rs) { return rs->credits > kReservedCredits; }

// A stream receive buffer taken (read by the application, or a control message handled) goes back to the QP and is
// owed to the peer as a credit.
void Repost(RSocket* rs, int slot) {
  if (rs->error || PostRecv(rs, slot) != 0) return;
  ++rs->credits_owed;
}

// Sends what is waiting for a credit: the end of stream, and the credits owed once they are half the receive
// buffers (no SEND of ours carried them meanwhile).
void SendWhatCreditsAllow(RSocket* rs) {
  if (rs->dgram || !rs->connected || rs->error) return;
  if (rs->fin_wanted && !rs->fin_sent && HasCreditForData(rs) &&
      PostMessage(rs, MessageKind::kFin, FinWrId(rs), nullptr) == 0)
    rs->fin_sent = true;
  if (rs->credits_owed >= rs->slots / 2 && rs->credits > 0 && rs->credit_sends_in_flight < kMaxCreditSendsInFlight &&
      PostMessage(rs, MessageKind::kCredits, CreditsWrId(rs), nullptr) == 0)
    ++rs->credit_sends_in_flight;
}

// Takes what the CQ holds: received slots to `ready`, finished sends back to `free_send`, credits to `credits`.
void PollCq(RSocket* rs) {
  if (rs->cq == nullptr) return;
  ibv_wc wc[16];
  int n;
  bool any = false;
  while ((n = ibv_poll_cq(rs->cq, 16, wc)) > 0) {
    any = true;
    for (int i = 0; i < n; ++i) {
      const bool recv = wc[i].wr_id & kRecvFlag;
      const uint64_t id = wc[i].wr_id & 0xFFFFFFFF;
      const int slot = int(id);
      if (!recv && !rs->dgram && id == CreditsWrId(rs)) --rs->credit_sends_in_flight;
      if (wc[i].status != IBV_WC_SUCCESS) {
        // Flushed after a disconnect, or the peer is gone: the stream has ended.
        if (!rs->peer_fin && !rs->fin_sent) rs->error = ECONNRESET;
        rs->peer_fin = true;
        if (!recv && slot < rs->slots) rs->free_send.push_back(slot);
        continue;
      }
      if (!recv) {
        if (slot < rs->slots) rs->free_send.push_back(slot);  // the end of stream and credits take no slot
        continue;
      }
      if (rs->dgram) {
        rs->ready.emplace_back(slot, wc[i].byte_len);
        continue;
      }
      const uint32_t imm = (wc[i].wc_flags & IBV_WC_WITH_IMM) ? ntohl(wc[i].imm_data) : 0;
      rs->credits += int(imm & kCreditsMask);
      switch (MessageKind(imm >> kKindShift)) {
        case MessageKind::kData:
          rs->ready.emplace_back(slot, wc[i].byte_len);
          break;
        case MessageKind::kFin:
          rs->peer_fin = true;
          Repost(rs, slot);
          break;
        case MessageKind::kIomap:
          if (wc[i].byte_len == sizeof(IomapAd)) {
            IomapAd ad;
            std::memcpy(&ad, rs->recv_buf.data() + size_t(slot) * rs->slot_bytes, sizeof ad);
            rs->peer_maps.push_back(ad);
          }
          Repost(rs, slot);
          break;
        default:  // kCredits
          Repost(rs, slot);
          break;
      }
    }
  }
  if (!any) return;
  SendWhatCreditsAllow(rs);
  WakeWaiters(rs);
}

// The connection's own CM events, looked at when a call is about to sleep and when it wakes. A DISCONNECTED without
// the peer's end of stream means its process died or it dropped the connection (uroce's CM speaks for a dead
// process with a DREQ, as the kernel does): what arrived before is still read, then the stream ends, and sends fail
// with ECONNRESET -- TCP's behaviour once its peer is gone -- where every call on it used to wait for ever.
// The CM channel a wait watches beside the CQ's: a connected stream's, until its DISCONNECTED is taken; else -1.
int CmWatchFd(const RSocket* rs) {
  return !rs->dgram && rs->connected && rs->channel != nullptr && !rs->cm_disconnected ? rs->channel->fd : -1;
}

void TakeCmEvents(RSocket* rs) {
  if (CmWatchFd(rs) < 0) return;
  rdma_cm_event* e = nullptr;
  while (rdma_get_cm_event(rs->channel, &e) == 0) {
    if (e->event == RDMA_CM_EVENT_DISCONNECTED) rs->cm_disconnected = true;
    rdma_ack_cm_event(e);
  }
  if (!rs->cm_disconnected) return;
  PollCq(rs);  // its end of stream, if it sent one, may be among the completions not taken yet
  if (!rs->peer_fin) {
    rs->peer_fin = true;
    if (!rs->error) rs->error = ECONNRESET;
  }
}

bool Readable(RSocket* rs) { return !rs->ready.empty() || rs->peer_fin || rs->error || rs->read_shut; }
bool Writable(RSocket* rs) {
  if (rs->error) return rs->connected || rs->dgram;
  if (rs->dgram) return !rs->free_send.empty();
  return rs->connected && !rs->free_send.empty() && HasCreditForData(rs);
}

// Whether a listener has a connection request waiting (its channel's descriptor is readable).
bool Pending(RSocket* rs) {
  pollfd p{rs->channel->fd, POLLIN, 0};
  return poll(&p, 1, 0) > 0;
}

// How long a blocking call polls before it sleeps. Polling the CQ is what lets the calling thread drive uroce's
// engine: a reply that comes meanwhile is taken at once (a ping-pong's comes within ~10 us), at the price of a CPU;
// past it the thread sleeps on the CQ's completion channel, the engine's progress thread receives and an idle
// connection costs nothing. 50 us is the engine's own polling streak (a poller that looks again within it keeps the
// receive side). rdma-core's rsockets likewise poll for a while (their polling_time) before they sleep.
constexpr auto kPollBeforeSleeping = std::chrono::microseconds(50);

using Deadline = std::chrono::steady_clock::time_point;

// One turn of a polling loop: tells the core it spins (the other hyperthread gets the pipeline meanwhile).
inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// poll(2)'s timeout for `deadline`: -1 for none, else the milliseconds left, rounded up (waking early only loops).
int PollTimeoutMs(Deadline deadline) {
  if (deadline == Deadline::max()) return -1;
  const auto left = deadline - std::chrono::steady_clock::now();
  if (left <= Deadline::duration::zero()) return 0;
  return int(std::chrono::ceil<std::chrono::milliseconds>(left).count());
}

// Takes every event the CQ's channel holds, acknowledging each (ibv_destroy_cq waits for that).
void DrainCqEvents(RSocket* rs) {
  if (rs->cq_channel == nullptr) return;
  ibv_cq* cq = nullptr;
  void* context = nullptr;
  while (ibv_get_cq_event(rs->cq_channel, &cq, &context) == 0) ibv_ack_cq_events(cq, 1);
}

// The descriptor to sleep on until `rs` may have changed: a listener's event channel, else its CQ's completion
// channel with the CQ armed first -- what completes after the arming raises an event, what completed before it
// raises none (ibv_req_notify_cq(3)), so a look at the CQ must follow before the sleep. -1: nothing to sleep on (a
// stream rsocket not connected yet).
int ArmForSleep(RSocket* rs) {
  if (rs->listening) return rs->channel->fd;
  if (rs->cq_channel == nullptr || ibv_req_notify_cq(rs->cq, 0) != 0) return -1;
  return rs->cq_channel->fd;
}

// Blocks, with the lock released, until `ready()` (which polls the CQ) holds -- true -- or `deadline` passes or
// another thread closes the rsocket (RSocket::closing: the caller fails with EBADF) -- false. It polls for
// kPollBeforeSleeping, then arms the CQ, looks once more and sleeps on the completion channel -- or, when another
// thread blocked on the rsocket sleeps there already, on `changed` (RSocket::waiters).
template <typename F>
bool WaitUntil(RSocket* rs, std::unique_lock<std::mutex>& lock, F ready, Deadline deadline = Deadline::max()) {
  const Deadline poll_until = std::chrono::steady_clock::now() + kPollBeforeSleeping;
  ++rs->waiters;
  bool done = true;
  while (!ready()) {
    const Deadline now = std::chrono::steady_clock::now();
    if (now >= deadline || rs->closing) {
      done = false;
      break;
    }
    if (now >= poll_until && rs->channel_sleeper) {
      // That thread signals `changed` when it wakes, as does every thread that takes completions meanwhile.
      if (deadline == Deadline::max()) {
        rs->changed.wait(lock);
      } else {
        rs->changed.wait_until(lock, deadline);
      }
      continue;
    }
    const int fd = now < poll_until ? -1 : ArmForSleep(rs);
    if (fd < 0 || WakeFd(rs) < 0) {
      lock.unlock();  // other calls on other rsockets go on meanwhile
      CpuRelax();
      lock.lock();
      continue;
    }
    TakeCmEvents(rs);
    if (ready()) break;
    rs->channel_sleeper = true;
    lock.unlock();
    // The connection's CM channel too: a peer that dies sends nothing the CQ would hear of.
    pollfd p[3] = {{fd, POLLIN, 0}, {rs->wake_fd, POLLIN, 0}, {CmWatchFd(rs), POLLIN, 0}};
    poll(p, 3, PollTimeoutMs(deadline));
    lock.lock();
    rs->channel_sleeper = false;
    uint64_t wakes;
    [[maybe_unused]] ssize_t n = read(rs->wake_fd, &wakes, sizeof wakes);
    DrainCqEvents(rs);
    TakeCmEvents(rs);
    rs->changed.notify_all();  // the others look again; one of them sleeps on the channel next
  }
  if (--rs->waiters == 0 && rs->closing) rs->changed.notify_all();  // rclose waits for that
  return done;
}

// Blocks, with the lock released, until the listener's channel has a connection request (or another event)
// waiting: 0; EBADF when another thread closes the listener meanwhile, the eventfd's errno when none can be made.
int WaitForConnectRequest(RSocket* ls, std::unique_lock<std::mutex>& lock) {
  if (WakeFd(ls) < 0) return errno;
  ++ls->waiters;  // WakeWaiters signals wake_fd while a listener has waiters
  lock.unlock();
  pollfd p[2] = {{ls->channel->fd, POLLIN, 0}, {ls->wake_fd, POLLIN, 0}};
  poll(p, 2, -1);
  lock.lock();
  const bool closing = ls->closing;
  if (--ls->waiters == 0) {
    uint64_t wakes;
    [[maybe_unused]] ssize_t n = read(ls->wake_fd, &wakes, sizeof wakes);
    if (closing) ls->changed.notify_all();
  }
  return closing ? EBADF : 0;
}

// A free send buffer -- and for a SEND of a stream rsocket (`needs_credit`) a credit for it -- waiting for them
// when `wait`: the buffer's index, or -EAGAIN / -errno (the connection failed).
int TakeSendSlot(RSocket* rs, std::unique_lock<std::mutex>& lock, bool wait, bool needs_credit) {
  auto can_post = [&] { return !rs->free_send.empty() && (!needs_credit || HasCreditForData(rs)); };
  PollCq(rs);
  if (!can_post() && !rs->error && wait) {
    WaitUntil(rs, lock, [&] {
      PollCq(rs);
      return can_post() || rs->error;
    });
    if (rs->closing) return -EBADF;
  }
  if (rs->error && !rs->dgram) return -rs->error;
  if (!can_post()) return rs->error ? -rs->error : -EAGAIN;
  const int slot = rs->free_send.back();
  rs->free_send.pop_back();
  return slot;
}

// --- datagram rsockets ------------------------------------------------------------------------------------------
// Each is a UD QP on the process's device, bound to (port space kDgramPortSpace, port) in the host's registry with
// its QPN as the tag, so a sender on this host finds the QP behind an ip:port. A datagram carries kDgramHeader bytes
// first: the sender's port (be16), its address family, and its device's address, from which rrecvfrom builds the
// source address the application replies to.
constexpr uint16_t kDgramPortSpace = uroce::rdmacm::kRsocketDatagramPortSpace;
constexpr size_t kDgramHeader = 20;
constexpr size_t kGrh = 40;
// A datagram rsocket's receive queue: a UD receiver without a posted receive drops, and udpong's echo client, which
// resends after 1 ms without an answer, filled 32 receives with the answers' duplicates on a busy machine; once the
// one copy of its current request was dropped it resent only older ones, forever.
constexpr int kDgramSlots = 256;

// getsockname(2)'s contract for rgetsockname / rgetpeername: the address is cut to *addrlen bytes (none with a
// length of 0, when `addr` may be NULL: librspreload asks the size that way before it turns an rsocket whose
// rconnect failed into a TCP socket) and *addrlen says its full size. An unbound socket reads as its family's any
// address, port 0. 0 or EFAULT.
int CopyOutAddress(const sockaddr_storage& from, int family, sockaddr* addr, socklen_t* addrlen) {
  if (addrlen == nullptr || (addr == nullptr && *addrlen > 0)) return EFAULT;
  sockaddr_storage a = from;
  if (a.ss_family == AF_UNSPEC) a.ss_family = sa_family_t(family);
  const socklen_t size = a.ss_family == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in);
  if (*addrlen > 0) std::memcpy(addr, &a, std::min(*addrlen, size));
  *addrlen = size;
  return 0;
}

bool ThisHost(const sockaddr* sa) {
  return uroce::rdmacm::IsAnyOrLoopback(sa);
}

// The UD QP, CQ, buffers and posted receives of a datagram rsocket. 0 or errno.
int DgramSetUp(RSocket* rs) {
  int n = 0;
  ibv_context** devices = rdma_get_devices(&n);
  if (devices == nullptr || n == 0) {
    rdma_free_devices(devices);
    return ENODEV;
  }
  ibv_context* verbs = devices[0];
  rdma_free_devices(devices);
  ibv_gid gid{};
  if (ibv_query_gid(verbs, 1, 0, &gid) != 0) return ENODEV;
  rs->device = uroce::wire::IpAddress::FromBytes(gid.raw);
  ibv_port_attr port{};
  if (ibv_query_port(verbs, 1, &port) != 0) return ENODEV;
  rs->max_dgram = (size_t{128} << port.active_mtu) - kDgramHeader;  // IB MTU enum: 1 = 256 ... 5 = 4096
  rs->slots = kDgramSlots;
  rs->slot_bytes = uint32_t(kGrh + kDgramHeader + rs->max_dgram);
  rs->pd = ibv_alloc_pd(verbs);
  if (rs->pd == nullptr) return errno ? errno : ENOMEM;
  if (int err = CreateCq(rs, verbs)) return err;
  ibv_qp_init_attr attr{};
  attr.send_cq = attr.recv_cq = rs->cq;
  attr.qp_type = IBV_QPT_UD;
  attr.cap.max_send_wr = attr.cap.max_recv_wr = rs->slots;
  attr.cap.max_send_sge = attr.cap.max_recv_sge = 1;
  attr.sq_sig_all = 1;
  rs->ud_qp = ibv_create_qp(rs->pd, &attr);
  if (rs->ud_qp == nullptr) return errno ? errno : ENOMEM;
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.pkey_index = 0;
  a.port_num = 1;
  a.qkey = RDMA_UDP_QKEY;
  int err = ibv_modify_qp(rs->ud_qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY);
  a = {};
  a.qp_state = IBV_QPS_RTR;
  if (!err) err = ibv_modify_qp(rs->ud_qp, &a, IBV_QP_STATE);
  a = {};
  a.qp_state = IBV_QPS_RTS;
  a.sq_psn = 0;
  if (!err) err = ibv_modify_qp(rs->ud_qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN);
  if (err) return err;
  return SetUpBuffers(rs, rs->pd);
}

void DgramTearDown(RSocket* rs) {
  for (auto& [key, ah] : rs->ahs) ibv_destroy_ah(ah);
  rs->ahs.clear();
  if (rs->ud_qp) ibv_destroy_qp(rs->ud_qp);
  if (rs->recv_mr) ibv_dereg_mr(rs->recv_mr);
  if (rs->send_mr) ibv_dereg_mr(rs->send_mr);
  if (rs->cq) ibv_destroy_cq(rs->cq);
  DestroyCqChannel(rs);
  if (rs->pd) ibv_dealloc_pd(rs->pd);
  rs->ud_qp = nullptr;
  rs->recv_mr = rs->send_mr = nullptr;
  rs->cq = nullptr;
  rs->pd = nullptr;
  rs->binding.Release();
}

// Binds the datagram rsocket to `port` (0: an ephemeral one) and publishes its QPN. 0 or errno.
int DgramBind(RSocket* rs, uint16_t port) {
  if (rs->binding.bound()) return EINVAL;
  if (int err = rs->binding.Bind(kDgramPortSpace, port)) return err;
  return rs->binding.Publish(rs->device, rs->ud_qp->qp_num);
}

// Who holds datagram port `port` on this host: the owner looked up before while the name it published stands (one
// system call), else the registry's answer (a listing of the host's UNIX sockets).
std::optional<uroce::rdmacm::PortOwner> OwnerOf(RSocket* rs, uint16_t port) {
  if (auto it = rs->owners.find(port); it != rs->owners.end()) {
    if (rs->owner_probe.StillPublished(kDgramPortSpace, port, it->second)) return it->second;
    rs->owners.erase(it);
  }
  auto owner = uroce::rdmacm::FindPortOwnerWithTag(kDgramPortSpace, port);
  if (owner && owner->tag) rs->owners[port] = *owner;
  return owner;
}

ssize_t DgramSend(RSocket* rs, std::unique_lock<std::mutex>& lock, const void* buf, size_t len, int flags,
                  const sockaddr* dst) {
  if (dst == nullptr) return Fail<ssize_t>(EDESTADDRREQ);
  if (len > rs->max_dgram) return Fail<ssize_t>(EMSGSIZE);
  if (!rs->binding.bound())
    if (int err = DgramBind(rs, 0)) return Fail<ssize_t>(err);
  // Only rsockets of this host are reachable: their device and QPN are in the registry under the port.
  if (!ThisHost(dst) && uroce::rdmacm::IpOf(dst) != rs->device) return Fail<ssize_t>(EHOSTUNREACH);
  const auto owner = OwnerOf(rs, uroce::rdmacm::PortOfSockaddr(dst));
  if (!owner || !owner->tag) {
    // Nobody holds that port. As UDP's sendto(2), the datagram is lost without an error (udpong's server answers
    // clients that may have gone: it exited on our ECONNREFUSED); a connected socket is told, as UDP's is once the
    // ICMP port unreachable is back.
    const bool connected = rs->peer && dst == reinterpret_cast<const sockaddr*>(&*rs->peer);
    return connected ? Fail<ssize_t>(ECONNREFUSED) : ssize_t(len);
  }
  ibv_ah*& ah = rs->ahs[{owner->device, *owner->tag}];
  if (ah == nullptr) {
    ibv_ah_attr a{};
    a.is_global = 1;
    std::memcpy(a.grh.dgid.raw, owner->device.bytes().data(), 16);
    a.grh.hop_limit = 64;
    a.port_num = 1;
    ah = ibv_create_ah(rs->pd, &a);
    if (ah == nullptr) return -1;
  }
  const int slot = TakeSendSlot(rs, lock, !rs->nonblocking && !(flags & MSG_DONTWAIT), /*needs_credit=*/false);
  if (slot < 0) return Fail<ssize_t>(-slot);
  uint8_t* out = rs->send_buf.data() + size_t(slot) * rs->slot_bytes;
  const uint16_t port = htons(rs->binding.port());
  std::memcpy(out, &port, 2);
  out[2] = rs->device.is_v4() ? 4 : 6;
  out[3] = 0;
  std::memcpy(out + 4, rs->device.bytes().data(), 16);
  std::memcpy(out + kDgramHeader, buf, len);
  ibv_sge sge{reinterpret_cast<uintptr_t>(out), uint32_t(kDgramHeader + len), rs->send_mr->lkey};
  ibv_send_wr wr{}, *bad = nullptr;
  wr.wr_id = uint32_t(slot);
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_SEND;
  wr.wr.ud.ah = ah;
  wr.wr.ud.remote_qpn = *owner->tag;
  wr.wr.ud.remote_qkey = RDMA_UDP_QKEY;
  if (int err = ibv_post_send(rs->ud_qp, &wr, &bad)) {
    rs->free_send.push_back(slot);
    return Fail<ssize_t>(err);
  }
  return ssize_t(len);
}

ssize_t DgramRecv(RSocket* rs, std::unique_lock<std::mutex>& lock, void* buf, size_t len, int flags, sockaddr* src,
                  socklen_t* srclen) {
  const bool wait = !rs->nonblocking && !(flags & MSG_DONTWAIT);
  PollCq(rs);
  if (rs->ready.empty()) {
    if (!wait) return Fail<ssize_t>(EAGAIN);
    if (!WaitUntil(rs, lock, [&] {
          PollCq(rs);
          return !rs->ready.empty();
        }))
      return Fail<ssize_t>(EBADF);  // closed meanwhile
  }
  const auto [slot, bytes] = rs->ready.front();
  rs->ready.pop_front();
  const uint8_t* in = rs->recv_buf.data() + size_t(slot) * rs->slot_bytes + kGrh;
  const size_t payload = bytes >= kGrh + kDgramHeader ? bytes - kGrh - kDgramHeader : 0;
  const size_t n = std::min(len, payload);  // the rest of a longer datagram is discarded, as UDP's
  std::memcpy(buf, in + kDgramHeader, n);
  if (src && srclen) {
    uint16_t port;
    std::memcpy(&port, in, 2);
    const auto from = uroce::wire::IpAddress::FromBytes(in + 4);
    sockaddr_storage ss{};
    uroce::rdmacm::SetSockaddr(&ss, from, ntohs(port), rs->family);
    const socklen_t want = rs->family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
    std::memcpy(src, &ss, std::min(*srclen, want));
    *srclen = want;
  }
  PostRecv(rs, slot);
  return ssize_t(n);
}

ssize_t Send(int fd, const void* buf, size_t len, int flags, const sockaddr* dst = nullptr) {
  std::unique_lock lock(g_mu);
  RSocket* rs = Find(fd);
  if (rs == nullptr) return Fail<ssize_t>(EBADF);
  if (rs->dgram) {
    if (dst == nullptr && rs->peer) dst = reinterpret_cast<const sockaddr*>(&*rs->peer);
    return DgramSend(rs, lock, buf, len, flags, dst);
  }
  if (!rs->connected) return Fail<ssize_t>(ENOTCONN);
  if (rs->fin_sent) return Fail<ssize_t>(EPIPE);
  // A blocking send returns when all of it is on its way, as send(2) on a blocking TCP socket and rdma-core's rsend
  // do (rcopy sends a whole file in one rsend and takes a short count for an error); a non-blocking one sends what the
  // credits allow.
  const bool wait = !rs->nonblocking && !(flags & MSG_DONTWAIT);
  size_t done = 0;
  while (done < len) {
    const int slot = TakeSendSlot(rs, lock, wait, /*needs_credit=*/true);
    if (slot == -EAGAIN) break;
    if (slot < 0) return done ? ssize_t(done) : Fail<ssize_t>(-slot);
    const uint32_t n = uint32_t(std::min<size_t>(rs->slot_bytes, len - done));
    uint8_t* dst = rs->send_buf.data() + size_t(slot) * rs->slot_bytes;
    std::memcpy(dst, static_cast<const uint8_t*>(buf) + done, n);
    ibv_sge sge{reinterpret_cast<uintptr_t>(dst), n, rs->send_mr->lkey};
    if (int err = PostMessage(rs, MessageKind::kData, uint32_t(slot), &sge)) {
      rs->free_send.push_back(slot);
      return done ? ssize_t(done) : Fail<ssize_t>(err);
    }
    done += n;
  }
  return done ? ssize_t(done) : Fail<ssize_t>(EAGAIN);
}

ssize_t Recv(int fd, void* buf, size_t len, int flags, sockaddr* src = nullptr, socklen_t* srclen = nullptr) {
  std::unique_lock lock(g_mu);
  RSocket* rs = Find(fd);
  if (rs == nullptr) return Fail<ssize_t>(EBADF);
  if (rs->dgram) return DgramRecv(rs, lock, buf, len, flags, src, srclen);
  if (!rs->connected) return Fail<ssize_t>(ENOTCONN);
  const bool wait = !rs->nonblocking && !(flags & MSG_DONTWAIT);
  size_t done = 0;
  for (;;) {
    PollCq(rs);
    while (done < len && !rs->ready.empty()) {
      auto& [slot, bytes] = rs->ready.front();
      const uint32_t n = uint32_t(std::min<size_t>(bytes - rs->ready_offset, len - done));
      std::memcpy(static_cast<uint8_t*>(buf) + done,
                  rs->recv_buf.data() + size_t(slot) * rs->slot_bytes + rs->ready_offset, n);
      done += n;
      rs->ready_offset += n;
      if (rs->ready_offset == bytes) {
        const int s = slot;
        rs->ready.pop_front();
        rs->ready_offset = 0;
        Repost(rs, s);
      }
    }
    SendWhatCreditsAllow(rs);
    if (done == len || (done > 0 && !(flags & MSG_WAITALL))) return ssize_t(done);
    if (rs->ready.empty() && rs->read_shut) return ssize_t(done);  // rshutdown SHUT_RD: the end of the stream
    if (rs->ready.empty() && rs->peer_fin) {
      if (done > 0) return ssize_t(done);
      return rs->error && rs->error != ECONNRESET ? Fail<ssize_t>(rs->error) : 0;  // end of stream
    }
    if (!wait) return done ? ssize_t(done) : Fail<ssize_t>(EAGAIN);
    if (!WaitUntil(rs, lock, [&] {
          PollCq(rs);
          return Readable(rs);
        }))
      return done ? ssize_t(done) : Fail<ssize_t>(EBADF);  // closed meanwhile
  }
}

// The end of our direction: a zero-length kFin SEND, once, as soon as a credit allows.
void SendFin(RSocket* rs) {
  if (rs->fin_wanted || !rs->connected || rs->error) return;
  rs->fin_wanted = true;
  PollCq(rs);
  SendWhatCreditsAllow(rs);
}

}  // namespace

extern "C" {

int rsocket(int domain, int type, int protocol) {
  if (domain != AF_INET && domain != AF_INET6) return Fail(EAFNOSUPPORT);
  if (protocol != 0 && protocol != IPPROTO_TCP && protocol != IPPROTO_UDP) return Fail(EPROTONOSUPPORT);
  const int kind = type & ~(SOCK_NONBLOCK | SOCK_CLOEXEC);
  if (kind != SOCK_STREAM && kind != SOCK_DGRAM) return Fail(EOPNOTSUPP);
  if ((protocol == IPPROTO_TCP && kind != SOCK_STREAM) || (protocol == IPPROTO_UDP && kind != SOCK_DGRAM))
    return Fail(EPROTONOSUPPORT);
  auto rs = std::make_unique<RSocket>();
  rs->fd = eventfd(0, EFD_CLOEXEC);
  if (rs->fd < 0) return -1;
  rs->family = domain;
  rs->nonblocking = type & SOCK_NONBLOCK;
  rs->dgram = kind == SOCK_DGRAM;
  if (rs->dgram) {
    if (int err = DgramSetUp(rs.get())) {
      DgramTearDown(rs.get());
      close(rs->fd);
      return Fail(err);
    }
  }
  std::lock_guard lock(g_mu);
  const int fd = rs->fd;
  g_sockets[fd] = std::move(rs);
  return fd;
}

int rbind(int socket, const sockaddr* addr, socklen_t addrlen) {
  std::lock_guard lock(g_mu);
  RSocket* rs = Find(socket);
  if (rs == nullptr) return Fail(EBADF);
  if (addr == nullptr || addrlen > sizeof rs->bound) return Fail(EINVAL);
  std::memcpy(&rs->bound, addr, addrlen);
  rs->has_bound = true;
  if (rs->dgram) {
    if (!ThisHost(addr) && uroce::rdmacm::IpOf(addr) != rs->device) return Fail(EADDRNOTAVAIL);
    if (int err = DgramBind(rs, uroce::rdmacm::PortOfSockaddr(addr))) return Fail(err);
  }
  return 0;
}

int rlisten(int socket, int backlog) {
  std::lock_guard lock(g_mu);
  RSocket* rs = Find(socket);
  if (rs == nullptr) return Fail(EBADF);
  rs->channel = rdma_create_event_channel();
  if (rs->channel == nullptr || rdma_create_id(rs->channel, &rs->id, rs, RDMA_PS_TCP) != 0) return -1;
  if (rs->has_bound && rdma_bind_addr(rs->id, reinterpret_cast<sockaddr*>(&rs->bound)) != 0) return -1;
  if (rdma_listen(rs->id, backlog) != 0) return -1;
  // The listener's channel answers EAGAIN when nothing waits, so raccept can be non-blocking.
  fcntl(rs->channel->fd, F_SETFL, fcntl(rs->channel->fd, F_GETFL) | O_NONBLOCK);
  rs->listening = true;
  return 0;
}

int raccept(int socket, sockaddr* addr, socklen_t* addrlen) {
  std::unique_lock lock(g_mu);
  RSocket* ls = Find(socket);
  if (ls == nullptr) return Fail(EBADF);
  if (!ls->listening) return Fail(EINVAL);
  rdma_cm_event* e = nullptr;
  int peer_slots = 0;
  for (;;) {
    if (rdma_get_cm_event(ls->channel, &e) != 0) {
      if (errno != EAGAIN) return -1;
      if (ls->nonblocking) return Fail(EAGAIN);
      if (int err = WaitForConnectRequest(ls, lock)) return Fail(err);  // closed meanwhile, or no eventfd
      continue;
    }
    if (e->event != RDMA_CM_EVENT_CONNECT_REQUEST) {
      rdma_ack_cm_event(e);
      return Fail(ECONNABORTED);
    }
    peer_slots = PeerSlots(e->param.conn.private_data, e->param.conn.private_data_len);
    if (peer_slots > 0) break;
    // Not one of ours (StreamHello): refused, and the application never sees it, as accept(2) never sees a
    // handshake that failed.
    rdma_cm_id* stranger = e->id;
    rdma_ack_cm_event(e);
    rdma_reject(stranger, nullptr, 0);
    rdma_destroy_id(stranger);
  }
  rdma_cm_id* child = e->id;
  rdma_ack_cm_event(e);
  auto rs = std::make_unique<RSocket>();
  rs->fd = eventfd(0, EFD_CLOEXEC);
  rs->family = ls->family;
  rs->id = child;
  rs->channel = rdma_create_event_channel();
  int err = rs->fd < 0 || rs->channel == nullptr ? (errno ? errno : ENOMEM) : 0;
  if (!err && rdma_migrate_id(child, rs->channel) != 0) err = errno;
  if (!err) err = SetUpQueues(rs.get());
  rs->credits = peer_slots;  // posted before its REQ left
  const StreamHello hello = HelloFor(rs->slots);
  rdma_conn_param param{};
  param.private_data = &hello;
  param.private_data_len = sizeof hello;
  param.retry_count = 7;
  param.rnr_retry_count = 7;  // credits keep RNR NAKs away; should one come, it is retried
  if (!err && rdma_accept(child, &param) != 0) err = errno;
  lock.unlock();  // the handshake's last step arrives on the engine's thread
  if (!err) err = Expect(rs.get(), RDMA_CM_EVENT_ESTABLISHED);
  lock.lock();
  if (err) {
    if (!rs->channel) rdma_reject(child, nullptr, 0);
    TearDown(rs.get());
    if (rs->fd >= 0) close(rs->fd);
    return Fail(err);
  }
  Connected(rs.get());
  if (addr && addrlen) {
    CopyOutAddress(child->route.addr.dst_storage, rs->family, addr, addrlen);
  }
  const int fd = rs->fd;
  g_sockets[fd] = std::move(rs);
  return fd;
}

int rconnect(int socket, const sockaddr* addr, socklen_t addrlen) {
  std::unique_lock lock(g_mu);
  RSocket* rs = Find(socket);
  if (rs == nullptr) return Fail(EBADF);
  if (rs->connected || rs->listening) return Fail(EISCONN);
  if (addr == nullptr || addrlen < sizeof(sockaddr_in)) return Fail(EINVAL);
  if (rs->dgram) {  // a datagram rsocket only remembers its default destination (and gets a port)
    sockaddr_storage dst{};
    std::memcpy(&dst, addr, std::min<size_t>(addrlen, sizeof dst));
    rs->peer = dst;
    if (!rs->binding.bound())
      if (int err = DgramBind(rs, 0)) return Fail(err);
    return 0;
  }
  rs->channel = rdma_create_event_channel();
  if (rs->channel == nullptr || rdma_create_id(rs->channel, &rs->id, rs, RDMA_PS_TCP) != 0) return -1;
  sockaddr_storage dst{};
  std::memcpy(&dst, addr, std::min<size_t>(addrlen, sizeof dst));
  // The whole handshake happens here, also for a non-blocking rsocket (which then never reports EINPROGRESS).
  lock.unlock();
  int err = 0;
  if (rdma_resolve_addr(rs->id, rs->has_bound ? reinterpret_cast<sockaddr*>(&rs->bound) : nullptr,
                        reinterpret_cast<sockaddr*>(&dst), 2000) != 0)
    err = errno;
  if (!err) err = Expect(rs, RDMA_CM_EVENT_ADDR_RESOLVED);
  if (!err && rdma_resolve_route(rs->id, 2000) != 0) err = errno;
  if (!err) err = Expect(rs, RDMA_CM_EVENT_ROUTE_RESOLVED);
  if (!err) err = SetUpQueues(rs);
  const StreamHello hello = HelloFor(rs->slots);
  rdma_conn_param param{};
  param.private_data = &hello;
  param.private_data_len = sizeof hello;
  param.retry_count = 7;
  param.rnr_retry_count = 7;
  if (!err && rdma_connect(rs->id, &param) != 0) err = errno;
  int peer_slots = 0;
  if (!err) err = Expect(rs, RDMA_CM_EVENT_ESTABLISHED, &peer_slots);
  if (!err && peer_slots == 0) err = ECONNREFUSED;  // the acceptor is not one of ours (StreamHello)
  rs->credits = peer_slots;  // posted before its REP left
  lock.lock();
  if (err) {
    TearDown(rs);
    rs->error = err;
    return Fail(err);
  }
  Connected(rs);
  return 0;
}

// The end of stream needs a credit like data (SendWhatCreditsAllow): rshutdown waits until it is posted, also on a
// non-blocking rsocket, as rdma-core's does -- with no thread of ours, nothing would send it once the application
// stops calling. It waits only while the peer's reader holds every buffer we filled.
int rshutdown(int socket, int how) {
  std::unique_lock lock(g_mu);
  RSocket* rs = Find(socket);
  if (rs == nullptr) return Fail(EBADF);
  if (!rs->connected) return Fail(ENOTCONN);
  if (how != SHUT_RD && how != SHUT_WR && how != SHUT_RDWR) return Fail(EINVAL);
  if (how == SHUT_RD || how == SHUT_RDWR) {
    // As shutdown(2) on a TCP socket: what is ready is still read, then receives return 0, a blocked one at once.
    rs->read_shut = true;
    WakeWaiters(rs);
  }
  if (how == SHUT_WR || how == SHUT_RDWR) {
    SendFin(rs);
    if (!WaitUntil(rs, lock, [&] {
          PollCq(rs);
          return rs->fin_sent || rs->error;
        }))
      return Fail(EBADF);  // closed meanwhile
  }
  return 0;
}

int rclose(int socket) {
  std::unique_ptr<RSocket> rs;
  {
    std::unique_lock lock(g_mu);
    auto it = g_sockets.find(socket);
    if (it == g_sockets.end()) return Fail(EBADF);
    rs = std::move(it->second);
    g_sockets.erase(it);
    // Threads blocked on it leave first, failing with EBADF: it is freed below. (A recv(2) blocked on a descriptor
    // another thread closes goes on waiting; here it would wait on memory about to be gone.)
    if (rs->waiters > 0) {
      rs->closing = true;
      WakeWaiters(rs.get());
      rs->changed.wait(lock, [&] { return rs->waiters == 0; });
      rs->closing = false;
    }
  }
  if (rs->dgram) {
    DgramTearDown(rs.get());
    close(rs->fd);
    return 0;
  }
  // No longer in the table and nobody blocked on it: nobody else reaches it. The end of stream (and what precedes
  // it) leaves before the QP goes to ERR.
  SendFin(rs.get());
  std::mutex unshared;  // WaitUntil's lock: the rsocket is ours alone now
  std::unique_lock lock(unshared);
  WaitUntil(rs.get(), lock, [&] {
    PollCq(rs.get());
    return !rs->fin_wanted || rs->error || (rs->fin_sent && rs->free_send.size() == size_t(rs->slots));
  }, std::chrono::steady_clock::now() + std::chrono::seconds(1));
  TearDown(rs.get());
  close(rs->fd);
  return 0;
}

ssize_t rrecv(int socket, void* buf, size_t len, int flags) { return Recv(socket, buf, len, flags); }
ssize_t rsend(int socket, const void* buf, size_t len, int flags) { return Send(socket, buf, len, flags); }
ssize_t rread(int socket, void* buf, size_t count) { return Recv(socket, buf, count, 0); }
ssize_t rwrite(int socket, const void* buf, size_t count) { return Send(socket, buf, count, 0); }

// readv/writev over Recv and Send. A read fills the buffers in order and stops at the first one left short (what
// was ready is read; MSG_WAITALL waits for all of it); a write sends every buffer, blocking for each as Send does on
// a blocking socket, and stops at the first short one on a non-blocking socket or with MSG_DONTWAIT.
static ssize_t ReadV(int socket, const iovec* iov, int iovcnt, int flags) {
  ssize_t total = 0;
  for (int i = 0; i < iovcnt; ++i) {
    const int f = i == 0 || (flags & MSG_WAITALL) ? flags : flags | MSG_DONTWAIT;
    const ssize_t n = Recv(socket, iov[i].iov_base, iov[i].iov_len, f);
    if (n < 0) return total ? total : n;
    total += n;
    if (size_t(n) < iov[i].iov_len) break;
  }
  return total;
}

static ssize_t WriteV(int socket, const iovec* iov, int iovcnt, int flags) {
  ssize_t total = 0;
  for (int i = 0; i < iovcnt; ++i) {
    const ssize_t n = Send(socket, iov[i].iov_base, iov[i].iov_len, flags);
    if (n < 0) return total ? total : n;
    total += n;
    if (size_t(n) < iov[i].iov_len) break;
  }
  return total;
}

ssize_t rreadv(int socket, const iovec* iov, int iovcnt) { return ReadV(socket, iov, iovcnt, 0); }
ssize_t rwritev(int socket, const iovec* iov, int iovcnt) { return WriteV(socket, iov, iovcnt, 0); }

ssize_t rrecvmsg(int socket, msghdr* msg, int flags) {
  if (msg == nullptr) return Fail<ssize_t>(EINVAL);
  return ReadV(socket, msg->msg_iov, int(msg->msg_iovlen), flags);
}

ssize_t rsendmsg(int socket, const msghdr* msg, int flags) {
  if (msg == nullptr) return Fail<ssize_t>(EINVAL);
  return WriteV(socket, msg->msg_iov, int(msg->msg_iovlen), flags);
}

ssize_t rrecvfrom(int socket, void* buf, size_t len, int flags, sockaddr* src_addr, socklen_t* addrlen) {
  return Recv(socket, buf, len, flags, src_addr, addrlen);  // a stream leaves the address alone
}

ssize_t rsendto(int socket, const void* buf, size_t len, int flags, const sockaddr* dest_addr, socklen_t) {
  return Send(socket, buf, len, flags, dest_addr);  // a stream ignores the address, as TCP
}

// Looks at every descriptor, polling for kPollBeforeSleeping (as WaitUntil), then sleeps in poll(2) on the
// ordinary descriptors, the rsockets' completion channels (their CQs armed before the look that precedes the sleep)
// and the listeners' event channels, until one of them stirs or the timeout passes.
int rpoll(pollfd* fds, nfds_t nfds, int timeout) {
  const Deadline start = std::chrono::steady_clock::now();
  const Deadline deadline = timeout < 0 ? Deadline::max() : start + std::chrono::milliseconds(timeout);
  const Deadline poll_until = start + kPollBeforeSleeping;
  std::vector<pollfd> others, sleep_on;
  std::vector<nfds_t> other_index;
  for (;;) {
    int ready = 0;
    others.clear();
    other_index.clear();
    sleep_on.clear();
    int look_again_ms = -1;  // a bound on the sleep for rsockets whose changes raise no event rpoll sleeps on
    const bool sleep = timeout != 0 && std::chrono::steady_clock::now() >= poll_until;
    {
      std::lock_guard lock(g_mu);
      for (nfds_t i = 0; i < nfds; ++i) {
        fds[i].revents = 0;
        RSocket* rs = Find(fds[i].fd);
        if (rs == nullptr) {
          others.push_back(fds[i]);
          other_index.push_back(i);
          continue;
        }
        if (sleep) {  // armed before the look that follows
          // A thread blocked on it takes completions rpoll would not hear of (RSocket::waiters): look again soon.
          if (rs->waiters > 0) look_again_ms = 1;
          if (const int fd = ArmForSleep(rs); fd >= 0) {
            sleep_on.push_back({fd, POLLIN, 0});
            TakeCmEvents(rs);
            if (const int cm_fd = CmWatchFd(rs); cm_fd >= 0) sleep_on.push_back({cm_fd, POLLIN, 0});
          } else {
            // Not connected yet: another thread's rconnect would raise no event.
            if (look_again_ms < 0) look_again_ms = 10;
          }
        }
        PollCq(rs);
        if (rs->listening) {
          if ((fds[i].events & POLLIN) && Pending(rs)) fds[i].revents |= POLLIN;
        } else {
          if ((fds[i].events & POLLIN) && Readable(rs)) fds[i].revents |= POLLIN;
          if ((fds[i].events & POLLOUT) && Writable(rs)) fds[i].revents |= POLLOUT;
          if (rs->error) fds[i].revents |= POLLERR;
          if (rs->peer_fin && rs->fin_sent) fds[i].revents |= POLLHUP;  // both directions ended, as TCP
        }
        if (fds[i].revents) ++ready;
      }
    }
    if (!others.empty() && poll(others.data(), others.size(), 0) > 0) {
      for (size_t k = 0; k < others.size(); ++k) {
        fds[other_index[k]].revents = others[k].revents;
        if (others[k].revents) ++ready;
      }
    }
    if (ready > 0 || timeout == 0) return ready;
    if (std::chrono::steady_clock::now() >= deadline) return 0;
    if (!sleep) {
      CpuRelax();
      continue;
    }
    sleep_on.insert(sleep_on.end(), others.begin(), others.end());
    const int wait_ms = PollTimeoutMs(deadline);
    poll(sleep_on.data(), sleep_on.size(),
         look_again_ms >= 0 && (wait_ms < 0 || wait_ms > look_again_ms) ? look_again_ms : wait_ms);
    std::lock_guard lock(g_mu);
    for (nfds_t i = 0; i < nfds; ++i) {
      if (RSocket* rs = Find(fds[i].fd)) {
        DrainCqEvents(rs);
        TakeCmEvents(rs);
      }
    }
  }
}

int rselect(int nfds, fd_set* readfds, fd_set* writefds, fd_set* exceptfds, timeval* timeout) {
  return select(nfds, readfds, writefds, exceptfds, timeout);
}

int rgetpeername(int socket, sockaddr* addr, socklen_t* addrlen) {
  std::lock_guard lock(g_mu);
  RSocket* rs = Find(socket);
  if (rs == nullptr) return Fail(EBADF);
  if (!rs->connected) return Fail(ENOTCONN);
  if (int err = CopyOutAddress(rs->id->route.addr.dst_storage, rs->family, addr, addrlen)) return Fail(err);
  return 0;
}

int rgetsockname(int socket, sockaddr* addr, socklen_t* addrlen) {
  std::lock_guard lock(g_mu);
  RSocket* rs = Find(socket);
  if (rs == nullptr) return Fail(EBADF);
  sockaddr_storage ss{};
  if (rs->dgram)
    uroce::rdmacm::SetSockaddr(&ss, rs->device, rs->binding.port(), rs->family);
  else
    ss = rs->id ? rs->id->route.addr.src_storage : rs->bound;
  if (int err = CopyOutAddress(ss, rs->family, addr, addrlen)) return Fail(err);
  return 0;
}

int rsetsockopt(int socket, int level, int optname, const void* optval, socklen_t optlen) {
  std::lock_guard lock(g_mu);
  RSocket* rs = Find(socket);
  if (rs == nullptr) return Fail(EBADF);
  const bool known = (level == SOL_SOCKET && (optname == SO_REUSEADDR || optname == SO_SNDBUF ||
                                              optname == SO_RCVBUF || optname == SO_KEEPALIVE ||
                                              optname == SO_LINGER || optname == SO_OOBINLINE)) ||
                     (level == IPPROTO_TCP && (optname == TCP_NODELAY || optname == TCP_KEEPIDLE ||
                                               optname == TCP_MAXSEG)) ||
                     (level == SOL_RDMA && optname >= RDMA_SQSIZE && optname <= RDMA_ROUTE);
  if (!known) return Fail(ENOPROTOOPT);
  // Buffers and queues have fixed sizes here; the values are kept for rgetsockopt.
  if (optval != nullptr && optlen >= sizeof(int)) rs->options[{level, optname}] = *static_cast<const int*>(optval);
  return 0;
}

int rgetsockopt(int socket, int level, int optname, void* optval, socklen_t* optlen) {
  std::lock_guard lock(g_mu);
  RSocket* rs = Find(socket);
  if (rs == nullptr) return Fail(EBADF);
  if (optval == nullptr || optlen == nullptr || *optlen < sizeof(int)) return Fail(EINVAL);
  int value = 0;
  if (level == SOL_SOCKET && optname == SO_ERROR) {
    value = rs->error;
    rs->error = 0;
  } else if (auto it = rs->options.find({level, optname}); it != rs->options.end()) {
    value = it->second;
  } else if (level == SOL_SOCKET && (optname == SO_SNDBUF || optname == SO_RCVBUF)) {
    value = int(rs->slots * rs->slot_bytes);
  } else if (!(level == SOL_SOCKET || level == IPPROTO_TCP || level == SOL_RDMA)) {
    return Fail(ENOPROTOOPT);
  }
  *static_cast<int*>(optval) = value;
  *optlen = sizeof(int);
  return 0;
}

int rfcntl(int socket, int cmd, ...) {
  va_list ap;
  va_start(ap, cmd);
  const long arg = cmd == F_SETFL ? va_arg(ap, long) : 0;
  va_end(ap);
  std::lock_guard lock(g_mu);
  RSocket* rs = Find(socket);
  if (rs == nullptr) return Fail(EBADF);
  switch (cmd) {
    case F_GETFL:
      return O_RDWR | (rs->nonblocking ? O_NONBLOCK : 0);
    case F_SETFL:
      rs->nonblocking = arg & O_NONBLOCK;
      return 0;
    default:
      return Fail(EINVAL);
  }
}

// riomap: the buffer is registered for remote writes and announced to the peer (a SEND with immediate kIomap,
// ordered before whatever the application sends next), whose riowrite then lands in it.
off_t riomap(int socket, void* buf, size_t len, int prot, int flags, off_t offset) {
  (void)flags;
  std::unique_lock lock(g_mu);
  RSocket* rs = Find(socket);
  if (rs == nullptr) return Fail<off_t>(EBADF);
  if (!rs->connected) return Fail<off_t>(ENOTCONN);
  if (buf == nullptr || len == 0 || len > UINT32_MAX || !(prot & PROT_WRITE)) return Fail<off_t>(EINVAL);
  if (offset == -1) offset = 0;  // our choice of offset: the buffer's start
  ibv_mr* mr = ibv_reg_mr(rs->id->pd, buf, len, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  if (mr == nullptr) return -1;
  const int slot = TakeSendSlot(rs, lock, !rs->nonblocking, /*needs_credit=*/true);
  if (slot < 0) {
    ibv_dereg_mr(mr);
    return Fail<off_t>(-slot);
  }
  const IomapAd ad{uint64_t(offset), reinterpret_cast<uintptr_t>(buf), mr->rkey, uint32_t(len)};
  uint8_t* dst = rs->send_buf.data() + size_t(slot) * rs->slot_bytes;
  std::memcpy(dst, &ad, sizeof ad);
  ibv_sge sge{reinterpret_cast<uintptr_t>(dst), sizeof ad, rs->send_mr->lkey};
  if (int err = PostMessage(rs, MessageKind::kIomap, uint32_t(slot), &sge)) {
    rs->free_send.push_back(slot);
    ibv_dereg_mr(mr);
    return Fail<off_t>(err);
  }
  rs->local_maps[buf] = mr;
  return offset;
}

int riounmap(int socket, void* buf, size_t len) {
  (void)len;
  std::lock_guard lock(g_mu);
  RSocket* rs = Find(socket);
  if (rs == nullptr) return Fail(EBADF);
  auto it = rs->local_maps.find(buf);
  if (it == rs->local_maps.end()) return Fail(EINVAL);
  ibv_dereg_mr(it->second);
  rs->local_maps.erase(it);
  return 0;
}

// riowrite: RDMA WRITEs (of at most one send buffer each) into what the peer riomap'ed at `offset`.
size_t riowrite(int socket, const void* buf, size_t count, off_t offset, int flags) {
  std::unique_lock lock(g_mu);
  RSocket* rs = Find(socket);
  if (rs == nullptr) return Fail<size_t>(EBADF);
  if (!rs->connected) return Fail<size_t>(ENOTCONN);
  const bool wait = !rs->nonblocking && !(flags & MSG_DONTWAIT);
  size_t done = 0;
  while (done < count) {
    const int slot = TakeSendSlot(rs, lock, wait, /*needs_credit=*/false);  // blocking: all of it, as rsend
    if (slot == -EAGAIN) break;
    if (slot < 0) return done ? done : Fail<size_t>(-slot);
    // Looked up after the wait: the peer's maps may have grown meanwhile (PollCq).
    const uint64_t at = uint64_t(offset) + done;
    const IomapAd* map = nullptr;
    for (const IomapAd& m : rs->peer_maps)
      if (at >= m.offset && at < m.offset + m.length) map = &m;
    if (map == nullptr) {  // nothing mapped there by the peer
      rs->free_send.push_back(slot);
      return done ? done : Fail<size_t>(EINVAL);
    }
    const uint32_t n = uint32_t(std::min<uint64_t>({rs->slot_bytes, count - done, map->offset + map->length - at}));
    uint8_t* src = rs->send_buf.data() + size_t(slot) * rs->slot_bytes;
    std::memcpy(src, static_cast<const uint8_t*>(buf) + done, n);
    ibv_sge sge{reinterpret_cast<uintptr_t>(src), n, rs->send_mr->lkey};
    ibv_send_wr wr{}, *bad = nullptr;
    wr.wr_id = uint32_t(slot);
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_RDMA_WRITE;
    wr.wr.rdma.remote_addr = map->addr + (at - map->offset);
    wr.wr.rdma.rkey = map->rkey;
    if (int err = ibv_post_send(rs->id->qp, &wr, &bad)) {
      rs->free_send.push_back(slot);
      return done ? done : Fail<size_t>(err);
    }
    done += n;
  }
  return done ? done : Fail<size_t>(EAGAIN);
}

}  // extern "C"
