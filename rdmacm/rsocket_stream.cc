// Stream rsockets (rsocket.h): one connection id with one RC QP and one CQ each. Each side pre-posts kSlots receive
// buffers of kSlotBytes; a send copies up to kSlotBytes into one of kSlots send buffers and posts a SEND. A SEND's
// immediate data says what it is (MessageKind) and hands back credits; data that hands none back goes without
// (PostMessage). The receiver posts a buffer again once the application has read it (a control message's at once),
// and each such buffer is a credit for the peer: a SEND is posted only against a credit -- a receive the peer is
// known to have posted -- so a sender that outruns its reader waits for credits instead of meeting RNR NAKs (each of
// which also costs the packets in flight behind it, dropped out of sequence and sent again). Credits go back on
// every SEND, and in a zero-length kCredits SEND once half the receive buffers are owed. The end of a stream is a
// zero-length kFin SEND (rshutdown SHUT_WR, rclose).
//
// riomap announces a registered buffer to the peer (a kIomap SEND); riowrite is then RDMA WRITEs into it (they
// consume no receive and need no credit).
#include <arpa/inet.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/eventfd.h>

#include <algorithm>
#include <cstring>

#include "rdmacm/rsocket.h"

namespace uroce::rdmacm::rsockets {
namespace {

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
// once half the receive buffers are owed, and at most kMaxCreditSendsInFlight kCredits SENDs are outstanding.
constexpr int kReservedCredits = 1;
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

// The connection parameters of both sides, `hello` their private data.
rdma_conn_param ConnParam(const StreamHello& hello) {
  rdma_conn_param param{};
  param.private_data = &hello;
  param.private_data_len = sizeof hello;
  param.retry_count = 7;
  param.rnr_retry_count = 7;  // credits keep RNR NAKs away; should one come, it is retried
  return param;
}

// Checks that `e` (acknowledged here) is `want`. 0 or errno. `peer_slots`: the receive buffers the event's private
// data announces (PeerSlots).
int Check(rdma_cm_event* e, rdma_cm_event_type want, int* peer_slots) {
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

// Waits for the next event of `rs`'s own channel (blocking) and checks it is `want` (Check).
int Expect(RSocket* rs, rdma_cm_event_type want) {
  rdma_cm_event* e = nullptr;
  if (rdma_get_cm_event(rs->stream.channel, &e) != 0) return errno;
  return Check(e, want, nullptr);
}

// A stream SEND's work request ids: a send slot's index, or one of these for the SENDs that take none.
uint64_t FinWrId(const RSocket* rs) { return uint64_t(rs->slots); }
uint64_t CreditsWrId(const RSocket* rs) { return uint64_t(rs->slots) + 1; }

// The QP, CQ and buffers of a connection id, receives posted. 0 or errno.
int SetUpQueues(RSocket* rs) {
  if (int err = CreateCq(rs, rs->stream.id->verbs)) return err;
  ibv_qp_init_attr attr{};
  attr.send_cq = rs->cq;
  attr.recv_cq = rs->cq;
  attr.qp_type = IBV_QPT_RC;
  attr.cap.max_send_wr = rs->slots + 1 + kMaxCreditSendsInFlight;  // data, the end of stream, credits
  attr.cap.max_recv_wr = rs->slots;
  attr.cap.max_send_sge = attr.cap.max_recv_sge = 1;
  attr.sq_sig_all = 1;
  if (rdma_create_qp(rs->stream.id, nullptr, &attr) != 0) return errno;
  return SetUpBuffers(rs, rs->stream.id->pd);
}

// Once connected: our responder's RNR timer as short as it goes (the QP is in RTS; no state change).
void Connected(RSocket* rs) {
  ibv_qp_attr a{};
  a.min_rnr_timer = kShortestRnrTimer;
  ibv_modify_qp(rs->stream.id->qp, &a, IBV_QP_MIN_RNR_TIMER);
  rs->stream.connected = true;
  // From now on its channel is only looked at (TakeCmEvents), never waited on.
  const int fd = rs->stream.channel->fd;
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
}

void TearDown(RSocket* rs) {
  StreamState& s = rs->stream;
  if (s.id) {
    if (s.connected) rdma_disconnect(s.id);
    if (s.id->qp) ibv_destroy_qp(s.id->qp);
    s.id->qp = nullptr;
  }
  for (auto& [addr, mr] : s.local_maps) ibv_dereg_mr(mr);
  s.local_maps.clear();
  if (rs->recv_mr) ibv_dereg_mr(rs->recv_mr);
  if (rs->send_mr) ibv_dereg_mr(rs->send_mr);
  if (rs->cq) ibv_destroy_cq(rs->cq);
  DestroyCqChannel(rs);
  if (s.id) rdma_destroy_id(s.id);
  if (s.channel) rdma_destroy_event_channel(s.channel);
  s.id = nullptr;
  s.channel = nullptr;
  rs->cq = nullptr;
  rs->recv_mr = rs->send_mr = nullptr;
}

// Posts a SEND of `kind` on a stream rsocket's QP against one credit, handing back the credits owed. 0 or errno.
// Data that hands back no credit goes without immediate data (a SEND without it is data with none): the immediate
// makes a message's last packet 4 bytes longer than the others, so the message no longer leaves as one run of
// equal packets (one UDP GSO send); rstream's 64 KiB transfers lost ~10-20% with an immediate on every SEND.
int PostMessage(RSocket* rs, MessageKind kind, uint64_t wr_id, ibv_sge* sge) {
  StreamState& s = rs->stream;
  ibv_send_wr wr{}, *bad = nullptr;
  wr.wr_id = wr_id;
  wr.sg_list = sge;
  wr.num_sge = sge ? 1 : 0;
  wr.opcode = kind == MessageKind::kData && s.credits_owed == 0 ? IBV_WR_SEND : IBV_WR_SEND_WITH_IMM;
  wr.imm_data = htonl(uint32_t(kind) << kKindShift | uint32_t(s.credits_owed));
  if (int err = ibv_post_send(s.id->qp, &wr, &bad)) return err;
  --s.credits;
  s.credits_owed = 0;
  return 0;
}

// A stream receive buffer taken (read by the application, or a control message handled) goes back to the QP and is
// owed to the peer as a credit.
void Repost(RSocket* rs, int slot) {
  if (rs->error || PostRecv(rs, slot) != 0) return;
  ++rs->stream.credits_owed;
}

// A received SEND: its credits, then data to `ready` or a control message handled (its buffer posted again).
void OnStreamReceive(RSocket* rs, const ibv_wc& wc) {
  const int slot = int(wc.wr_id & 0xFFFFFFFF);
  const uint32_t imm = (wc.wc_flags & IBV_WC_WITH_IMM) ? ntohl(wc.imm_data) : 0;
  rs->stream.credits += int(imm & kCreditsMask);
  switch (MessageKind(imm >> kKindShift)) {
    case MessageKind::kData:
      rs->ready.emplace_back(slot, wc.byte_len);
      return;
    case MessageKind::kFin:
      rs->peer_fin = true;
      break;
    case MessageKind::kIomap:
      if (wc.byte_len == sizeof(IomapAd)) {
        IomapAd ad;
        std::memcpy(&ad, rs->recv_buf.data() + size_t(slot) * rs->slot_bytes, sizeof ad);
        rs->stream.peer_maps.push_back(ad);
      }
      break;
    default:  // kCredits
      break;
  }
  Repost(rs, slot);
}

// The end of our direction: a zero-length kFin SEND, once, as soon as a credit allows.
void SendFin(RSocket* rs) {
  if (rs->stream.fin_wanted || !rs->stream.connected || rs->error) return;
  rs->stream.fin_wanted = true;
  PollCq(rs);
  SendWhatCreditsAllow(rs);
}

}  // namespace

bool HasCreditForData(const RSocket* rs) { return rs->stream.credits > kReservedCredits; }

void OnStreamCompletion(RSocket* rs, const ibv_wc& wc) {
  const bool recv = wc.wr_id & kRecvFlag;
  if (!recv && (wc.wr_id & 0xFFFFFFFF) == CreditsWrId(rs)) --rs->stream.credit_sends_in_flight;
  if (!TookSendOrFailure(rs, wc)) OnStreamReceive(rs, wc);
}

// The end of stream, and the credits owed once they are half the receive buffers (no SEND of ours carried them
// meanwhile).
void SendWhatCreditsAllow(RSocket* rs) {
  StreamState& s = rs->stream;
  if (rs->dgram || !s.connected || rs->error) return;
  if (s.fin_wanted && !s.fin_sent && HasCreditForData(rs) &&
      PostMessage(rs, MessageKind::kFin, FinWrId(rs), nullptr) == 0)
    s.fin_sent = true;
  if (s.credits_owed >= rs->slots / 2 && s.credits > 0 && s.credit_sends_in_flight < kMaxCreditSendsInFlight &&
      PostMessage(rs, MessageKind::kCredits, CreditsWrId(rs), nullptr) == 0)
    ++s.credit_sends_in_flight;
}

// The connection's own CM events, looked at when a call is about to sleep and when it wakes. A DISCONNECTED without
// the peer's end of stream means its process died or it dropped the connection (uroce's CM speaks for a dead
// process with a DREQ, as the kernel does): what arrived before is still read, then the stream ends, and sends fail
// with ECONNRESET -- TCP's behaviour once its peer is gone -- where every call on it used to wait for ever.
int CmWatchFd(const RSocket* rs) {
  const StreamState& s = rs->stream;
  return !rs->dgram && s.connected && s.channel != nullptr && !s.cm_disconnected ? s.channel->fd : -1;
}

void TakeCmEvents(RSocket* rs) {
  if (CmWatchFd(rs) < 0) return;
  rdma_cm_event* e = nullptr;
  while (rdma_get_cm_event(rs->stream.channel, &e) == 0) {
    if (e->event == RDMA_CM_EVENT_DISCONNECTED) rs->stream.cm_disconnected = true;
    rdma_ack_cm_event(e);
  }
  if (!rs->stream.cm_disconnected) return;
  PollCq(rs);  // its end of stream, if it sent one, may be among the completions not taken yet
  if (!rs->peer_fin) {
    rs->peer_fin = true;
    if (!rs->error) rs->error = ECONNRESET;
  }
}

// --- connecting -------------------------------------------------------------------------------------------------

int StreamListen(RSocket* rs, int backlog) {
  StreamState& s = rs->stream;
  s.channel = rdma_create_event_channel();
  if (s.channel == nullptr || rdma_create_id(s.channel, &s.id, rs, RDMA_PS_TCP) != 0) return -1;
  if (rs->has_bound && rdma_bind_addr(s.id, reinterpret_cast<sockaddr*>(&rs->bound)) != 0) return -1;
  if (rdma_listen(s.id, backlog) != 0) return -1;
  // The listener's channel answers EAGAIN when nothing waits, so raccept can be non-blocking.
  fcntl(s.channel->fd, F_SETFL, fcntl(s.channel->fd, F_GETFL) | O_NONBLOCK);
  s.listening = true;
  return 0;
}

namespace {

// The next connection request of a listener, waiting for one unless it is non-blocking: the child id and the
// receive buffers its hello announces. 0 or errno. A request that is not one of ours (StreamHello) is refused, and
// the application never sees it, as accept(2) never sees a handshake that failed.
int TakeConnectRequest(RSocket* ls, std::unique_lock<std::mutex>& lock, rdma_cm_id** child, int* peer_slots) {
  for (;;) {
    rdma_cm_event* e = nullptr;
    if (rdma_get_cm_event(ls->stream.channel, &e) != 0) {
      if (errno != EAGAIN) return errno;
      if (ls->nonblocking) return EAGAIN;
      if (int err = WaitForCmEvent(ls, lock)) return err;  // closed meanwhile, or no eventfd
      continue;
    }
    if (e->event != RDMA_CM_EVENT_CONNECT_REQUEST) {
      rdma_ack_cm_event(e);
      return ECONNABORTED;
    }
    *peer_slots = PeerSlots(e->param.conn.private_data, e->param.conn.private_data_len);
    *child = e->id;
    rdma_ack_cm_event(e);
    if (*peer_slots > 0) return 0;
    rdma_reject(*child, nullptr, 0);
    rdma_destroy_id(*child);
  }
}

// Accepts `child` into `rs`: its own channel, queues and the REP. 0 or errno.
int AcceptChild(RSocket* rs, rdma_cm_id* child, int peer_slots) {
  rs->fd = eventfd(0, EFD_CLOEXEC);
  rs->stream.id = child;
  rs->stream.channel = rdma_create_event_channel();
  int err = rs->fd < 0 || rs->stream.channel == nullptr ? (errno ? errno : ENOMEM) : 0;
  if (!err && rdma_migrate_id(child, rs->stream.channel) != 0) err = errno;
  if (!err) err = SetUpQueues(rs);
  rs->stream.credits = peer_slots;  // posted before its REQ left
  const StreamHello hello = HelloFor(rs->slots);
  rdma_conn_param param = ConnParam(hello);
  if (!err && rdma_accept(child, &param) != 0) err = errno;
  return err;
}

}  // namespace

// The listener's lock is held until the child has its own channel: the child's CM events are queued on the
// listener's channel until rdma_migrate_id, so an rclose of the listener must not destroy that channel before.
std::shared_ptr<RSocket> StreamAccept(RSocket* ls, std::unique_lock<std::mutex>& lock) {
  rdma_cm_id* child = nullptr;
  int peer_slots = 0;
  if (int err = TakeConnectRequest(ls, lock, &child, &peer_slots)) {
    errno = err;
    return nullptr;
  }
  auto rs = std::make_shared<RSocket>(/*datagram=*/false);
  rs->family = ls->family;
  int err = AcceptChild(rs.get(), child, peer_slots);
  lock.unlock();  // the handshake's last step arrives on the engine's thread; nobody else knows `rs` yet
  if (!err) err = Expect(rs.get(), RDMA_CM_EVENT_ESTABLISHED);
  lock.lock();
  if (err) {
    if (!rs->stream.channel) rdma_reject(child, nullptr, 0);
    TearDown(rs.get());
    if (rs->fd >= 0) close(rs->fd);
    errno = err;
    return nullptr;
  }
  Connected(rs.get());
  return rs;
}

namespace {

// One step of rconnect's handshake: waits (the lock released) for the next CM event and checks it is `want`. 0 or
// errno; EBADF when another thread closes the rsocket meanwhile. The channel does not block: the lock is held only
// while an event is taken (rdma_get_cm_event may send a REQ refused for want of a listener again after 10 ms,
// RetriedForListener in api.cc).
int HandshakeStep(RSocket* rs, std::unique_lock<std::mutex>& lock, rdma_cm_event_type want,
                  int* peer_slots = nullptr) {
  for (;;) {
    rdma_cm_event* e = nullptr;
    if (rdma_get_cm_event(rs->stream.channel, &e) == 0) return Check(e, want, peer_slots);
    if (errno != EAGAIN) return errno;
    if (int err = WaitForCmEvent(rs, lock)) return err;
  }
}

// rconnect's handshake: address, route, queues, the REQ and its answer. 0 or errno.
int Handshake(RSocket* rs, std::unique_lock<std::mutex>& lock, sockaddr_storage& dst) {
  StreamState& s = rs->stream;
  sockaddr* src = rs->has_bound ? reinterpret_cast<sockaddr*>(&rs->bound) : nullptr;
  int err = 0;
  if (rdma_resolve_addr(s.id, src, reinterpret_cast<sockaddr*>(&dst), 2000) != 0) err = errno;
  if (!err) err = HandshakeStep(rs, lock, RDMA_CM_EVENT_ADDR_RESOLVED);
  if (!err && rdma_resolve_route(s.id, 2000) != 0) err = errno;
  if (!err) err = HandshakeStep(rs, lock, RDMA_CM_EVENT_ROUTE_RESOLVED);
  if (!err) err = SetUpQueues(rs);
  const StreamHello hello = HelloFor(rs->slots);
  rdma_conn_param param = ConnParam(hello);
  if (!err && rdma_connect(s.id, &param) != 0) err = errno;
  int peer_slots = 0;
  if (!err) err = HandshakeStep(rs, lock, RDMA_CM_EVENT_ESTABLISHED, &peer_slots);
  if (!err && peer_slots == 0) err = ECONNREFUSED;  // the acceptor is not one of ours (StreamHello)
  s.credits = peer_slots;  // posted before its REP left
  return err;
}

}  // namespace

// The whole handshake happens here, also for a non-blocking rsocket (which then never reports EINPROGRESS). Its
// waits release the lock; an rclose meanwhile ends it with EBADF and frees what it made.
int StreamConnect(RSocket* rs, std::unique_lock<std::mutex>& lock, const sockaddr* addr, socklen_t addrlen) {
  StreamState& s = rs->stream;
  if (s.connecting) return EALREADY;
  s.channel = rdma_create_event_channel();
  if (s.channel == nullptr || rdma_create_id(s.channel, &s.id, rs, RDMA_PS_TCP) != 0) return errno;
  fcntl(s.channel->fd, F_SETFL, fcntl(s.channel->fd, F_GETFL) | O_NONBLOCK);  // HandshakeStep
  sockaddr_storage dst{};
  std::memcpy(&dst, addr, std::min<size_t>(addrlen, sizeof dst));
  s.connecting = true;
  const int err = Handshake(rs, lock, dst);
  s.connecting = false;
  if (err == EBADF && rs->closing) return err;  // rclose tears it down
  if (err) {
    TearDown(rs);
    rs->error = err;
    return err;
  }
  Connected(rs);
  return 0;
}

// --- data ---------------------------------------------------------------------------------------------------------

// A blocking send returns when all of it is on its way, as send(2) on a blocking TCP socket and rdma-core's rsend
// do (rcopy sends a whole file in one rsend and takes a short count for an error); a non-blocking one sends what the
// credits allow.
ssize_t StreamSend(RSocket* rs, std::unique_lock<std::mutex>& lock, const void* buf, size_t len, int flags) {
  if (!rs->stream.connected) return Fail<ssize_t>(ENOTCONN);
  if (rs->stream.fin_sent) return Fail<ssize_t>(EPIPE);
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

namespace {

// Copies what is ready into buf[done, len); a buffer read to its end goes back to the QP. The new `done`.
size_t ReadReady(RSocket* rs, uint8_t* buf, size_t done, size_t len) {
  while (done < len && !rs->ready.empty()) {
    auto& [slot, bytes] = rs->ready.front();
    const uint32_t n = uint32_t(std::min<size_t>(bytes - rs->ready_offset, len - done));
    std::memcpy(buf + done, rs->recv_buf.data() + size_t(slot) * rs->slot_bytes + rs->ready_offset, n);
    done += n;
    rs->ready_offset += n;
    if (rs->ready_offset == bytes) {
      const int s = slot;
      rs->ready.pop_front();
      rs->ready_offset = 0;
      Repost(rs, s);
    }
  }
  return done;
}

}  // namespace

ssize_t StreamRecv(RSocket* rs, std::unique_lock<std::mutex>& lock, void* buf, size_t len, int flags) {
  if (!rs->stream.connected) return Fail<ssize_t>(ENOTCONN);
  const bool wait = !rs->nonblocking && !(flags & MSG_DONTWAIT);
  size_t done = 0;
  for (;;) {
    PollCq(rs);
    done = ReadReady(rs, static_cast<uint8_t*>(buf), done, len);
    SendWhatCreditsAllow(rs);
    if (done == len || (done > 0 && !(flags & MSG_WAITALL))) return ssize_t(done);
    if (rs->ready.empty() && rs->stream.read_shut) return ssize_t(done);  // rshutdown SHUT_RD: the end of stream
    if (rs->ready.empty() && rs->peer_fin) {
      if (done > 0) return ssize_t(done);
      return rs->error && rs->error != ECONNRESET ? Fail<ssize_t>(rs->error) : 0;  // end of stream
    }
    if (!wait) return done ? ssize_t(done) : Fail<ssize_t>(EAGAIN);
    const bool readable = WaitUntil(rs, lock, [&] {
      PollCq(rs);
      return Readable(rs);
    });
    if (!readable) return done ? ssize_t(done) : Fail<ssize_t>(EBADF);  // closed meanwhile
  }
}

// The end of stream needs a credit like data (SendWhatCreditsAllow): rshutdown waits until it is posted, also on a
// non-blocking rsocket, as rdma-core's does -- with no thread of ours, nothing would send it once the application
// stops calling. It waits only while the peer's reader holds every buffer we filled.
int StreamShutdown(RSocket* rs, std::unique_lock<std::mutex>& lock, int how) {
  if (!rs->stream.connected) return ENOTCONN;
  if (how != SHUT_RD && how != SHUT_WR && how != SHUT_RDWR) return EINVAL;
  if (how == SHUT_RD || how == SHUT_RDWR) {
    // As shutdown(2) on a TCP socket: what is ready is still read, then receives return 0, a blocked one at once.
    rs->stream.read_shut = true;
    WakeWaiters(rs);
  }
  if (how == SHUT_WR || how == SHUT_RDWR) {
    SendFin(rs);
    if (!WaitUntil(rs, lock, [&] {
          PollCq(rs);
          return rs->stream.fin_sent || rs->error;
        }))
      return EBADF;  // closed meanwhile
  }
  return 0;
}

// The end of stream (and what precedes it) leaves before the QP goes to ERR, within a second.
void StreamClose(RSocket* rs, std::unique_lock<std::mutex>& lock) {
  SendFin(rs);
  WaitUntil(
      rs, lock,
      [&] {
        PollCq(rs);
        return !rs->stream.fin_wanted || rs->error ||
               (rs->stream.fin_sent && rs->free_send.size() == size_t(rs->slots));
      },
      std::chrono::steady_clock::now() + std::chrono::seconds(1));
  TearDown(rs);
}

// --- riomap / riowrite --------------------------------------------------------------------------------------------

// The buffer is registered for remote writes and announced to the peer (a SEND with immediate kIomap, ordered
// before whatever the application sends next), whose riowrite then lands in it.
off_t StreamIomap(RSocket* rs, std::unique_lock<std::mutex>& lock, void* buf, size_t len, int prot, off_t offset) {
  if (!rs->stream.connected) return Fail<off_t>(ENOTCONN);
  if (buf == nullptr || len == 0 || len > UINT32_MAX || !(prot & PROT_WRITE)) return Fail<off_t>(EINVAL);
  if (offset == -1) offset = 0;  // our choice of offset: the buffer's start
  ibv_mr* mr = ibv_reg_mr(rs->stream.id->pd, buf, len, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
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
  rs->stream.local_maps[buf] = mr;
  return offset;
}

namespace {

// What the peer riomap'ed at `at`, or nullptr.
const IomapAd* PeerMapAt(const RSocket* rs, uint64_t at) {
  const IomapAd* map = nullptr;
  for (const IomapAd& m : rs->stream.peer_maps)
    if (at >= m.offset && at < m.offset + m.length) map = &m;
  return map;
}

// One RDMA WRITE of up to a send buffer of `buf` into the peer's `map` at `at`: the bytes posted, or -errno.
ssize_t PostWrite(RSocket* rs, int slot, const uint8_t* buf, size_t count, const IomapAd& map, uint64_t at) {
  const uint32_t n = uint32_t(std::min<uint64_t>({rs->slot_bytes, count, map.offset + map.length - at}));
  uint8_t* src = rs->send_buf.data() + size_t(slot) * rs->slot_bytes;
  std::memcpy(src, buf, n);
  ibv_sge sge{reinterpret_cast<uintptr_t>(src), n, rs->send_mr->lkey};
  ibv_send_wr wr{}, *bad = nullptr;
  wr.wr_id = uint32_t(slot);
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_RDMA_WRITE;
  wr.wr.rdma.remote_addr = map.addr + (at - map.offset);
  wr.wr.rdma.rkey = map.rkey;
  if (int err = ibv_post_send(rs->stream.id->qp, &wr, &bad)) return -err;
  return n;
}

}  // namespace

// RDMA WRITEs (of at most one send buffer each) into what the peer riomap'ed at `offset`.
size_t StreamIowrite(RSocket* rs, std::unique_lock<std::mutex>& lock, const void* buf, size_t count, off_t offset,
                     int flags) {
  if (!rs->stream.connected) return Fail<size_t>(ENOTCONN);
  const bool wait = !rs->nonblocking && !(flags & MSG_DONTWAIT);
  size_t done = 0;
  while (done < count) {
    const int slot = TakeSendSlot(rs, lock, wait, /*needs_credit=*/false);  // blocking: all of it, as rsend
    if (slot == -EAGAIN) break;
    if (slot < 0) return done ? done : Fail<size_t>(-slot);
    // Looked up after the wait: the peer's maps may have grown meanwhile (PollCq).
    const uint64_t at = uint64_t(offset) + done;
    const IomapAd* map = PeerMapAt(rs, at);
    const ssize_t n = map ? PostWrite(rs, slot, static_cast<const uint8_t*>(buf) + done, count - done, *map, at)
                          : -EINVAL;  // nothing mapped there by the peer
    if (n < 0) {
      rs->free_send.push_back(slot);
      return done ? done : Fail<size_t>(int(-n));
    }
    done += size_t(n);
  }
  return done ? done : Fail<size_t>(EAGAIN);
}

int StreamIounmap(RSocket* rs, void* buf) {
  auto it = rs->stream.local_maps.find(buf);
  if (it == rs->stream.local_maps.end()) return EINVAL;
  ibv_dereg_mr(it->second);
  rs->stream.local_maps.erase(it);
  return 0;
}

}  // namespace uroce::rdmacm::rsockets
