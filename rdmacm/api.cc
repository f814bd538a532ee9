// The exported rdma_* calls of librdmacm.so.1 (RDMACM_1.0-1.3). Semantics: rdma_cm(7) and the rdma_*(3) man pages;
// where they are silent, the kernel's rdma_cm as librdmacm presents it (the project's rdmacm.md, section 3).
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <chrono>
#include <random>
#include <thread>

#include "rdmacm/internal.h"

using namespace uroce;
using namespace uroce::rdmacm;

namespace {

uint8_t MaxResponder(const Lib& lib) { return static_cast<uint8_t>(lib.device_attr.max_qp_rd_atom); }
uint8_t MaxInitiator(const Lib& lib) { return static_cast<uint8_t>(lib.device_attr.max_qp_init_rd_atom); }

void SetPort(sockaddr* sa, uint16_t port) {
  if (sa->sa_family == AF_INET) reinterpret_cast<sockaddr_in*>(sa)->sin_port = htons(port);
  if (sa->sa_family == AF_INET6) reinterpret_cast<sockaddr_in6*>(sa)->sin6_port = htons(port);
}

// Whether this id may use its device's resources: a "this host" bind has no device in the kernel until it resolves
// or receives a request; ours has one device, which we give as soon as an address is known.
void AttachDevice(Lib& lib, IdPriv* p) {
  p->id.verbs = lib.verbs;
  p->id.port_num = 1;
  if (p->id.pd == nullptr) p->id.pd = lib.default_pd;
}

// Frees an event the application never saw; the engine connections to destroy (outside the library's lock: the
// connection manager's Destroy waits for a delivery in progress, whose sink takes that lock) are added to the list.
void DiscardEvent(Lib& lib, Event* e, std::vector<uint32_t>* cm_ids_to_destroy);

}  // namespace

// --- QP attributes (rdma_init_qp_attr; rdmacm.md 3.6) ------------------------------------------------------------

namespace {

void InitAttr(const IdPriv* p, ibv_qp_attr* a, int* mask) {
  a->pkey_index = 0;
  a->port_num = 1;
  *mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT;
  if (p->id.qp_type == IBV_QPT_UD) {
    a->qkey = RDMA_UDP_QKEY;
    *mask |= IBV_QP_QKEY;
    return;
  }
  // Remote READ and atomics only when this side offers responder resources (cma_init_qp_attr).
  a->qp_access_flags = p->conn.valid ? IBV_ACCESS_REMOTE_WRITE : 0;
  if (p->conn.valid && p->conn.responder_resources > 0)
    a->qp_access_flags |= IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
  *mask |= IBV_QP_ACCESS_FLAGS;
}

int RtrAttr(const IdPriv* p, ibv_qp_attr* a, int* mask) {
  const ibv_qp_type t = p->id.qp_type;
  *mask = IBV_QP_STATE;
  if (t == IBV_QPT_UD) return 0;
  if (!p->conn.valid) return EINVAL;
  std::memset(&a->ah_attr, 0, sizeof a->ah_attr);
  a->ah_attr.is_global = 1;
  std::memcpy(a->ah_attr.grh.dgid.raw, p->conn.peer_gid.data(), 16);
  a->ah_attr.grh.sgid_index = p->sgid_index;
  a->ah_attr.grh.hop_limit = kHopLimit;
  a->ah_attr.grh.traffic_class = p->tos;
  a->ah_attr.grh.flow_label = p->conn.flow_label;
  a->ah_attr.port_num = 1;
  a->path_mtu = static_cast<ibv_mtu>(p->conn.path_mtu);
  a->dest_qp_num = p->conn.peer_qpn;
  a->rq_psn = p->seq_num;
  *mask |= IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN;
  if (t == IBV_QPT_RC || t == IBV_QPT_XRC_RECV) {
    a->max_dest_rd_atomic = p->conn.responder_resources;
    a->min_rnr_timer = 0;
    *mask |= IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
  }
  return 0;
}

int RtsAttr(const IdPriv* p, ibv_qp_attr* a, int* mask) {
  const ibv_qp_type t = p->id.qp_type;
  *mask = IBV_QP_STATE | IBV_QP_SQ_PSN;
  if (t == IBV_QPT_UD) {
    a->sq_psn = 0;
    return 0;
  }
  if (!p->conn.valid) return EINVAL;
  a->sq_psn = p->conn.peer_psn;
  a->timeout = p->ack_timeout.value_or(p->conn.local_ack_timeout ? p->conn.local_ack_timeout : kLocalAckTimeout);
  if (t == IBV_QPT_RC || t == IBV_QPT_XRC_SEND) {
    a->retry_cnt = p->conn.retry_count;
    a->rnr_retry = p->conn.rnr_retry_count;
    a->max_rd_atomic = p->conn.initiator_depth;
    *mask |= IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC;
  } else if (t == IBV_QPT_XRC_RECV) {
    *mask |= IBV_QP_TIMEOUT;
  }
  return 0;
}

}  // namespace

int uroce::rdmacm::InitQpAttr(Lib& lib, IdPriv* p, ibv_qp_attr* a, int* mask) {
  (void)lib;
  switch (a->qp_state) {
    case IBV_QPS_INIT:
      InitAttr(p, a, mask);
      return 0;
    case IBV_QPS_RTR:
      return RtrAttr(p, a, mask);
    case IBV_QPS_RTS:
      return RtsAttr(p, a, mask);
    default:
      return EINVAL;
  }
}

namespace {

int ModifyQpTo(Lib& lib, IdPriv* p, ibv_qp_state s) {
  if (p->id.qp == nullptr) return 0;
  ibv_qp_attr a{};
  a.qp_state = s;
  int mask = 0;
  if (const int err = InitQpAttr(lib, p, &a, &mask)) return err;
  return ibv_modify_qp(p->id.qp, &a, mask);
}

int ModifyQpErr(IdPriv* p) {
  if (p->id.qp == nullptr) return 0;
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_ERR;
  return ibv_modify_qp(p->id.qp, &a, IBV_QP_STATE);
}

// INIT (again, with the access the exchange granted), RTR, RTS: both sides, before the RTU / REP goes out.
int ModifyQpRtrRts(Lib& lib, IdPriv* p) {
  if (p->id.qp == nullptr) return 0;
  int err = ModifyQpTo(lib, p, IBV_QPS_INIT);
  if (!err) err = ModifyQpTo(lib, p, IBV_QPS_RTR);
  if (!err) err = ModifyQpTo(lib, p, IBV_QPS_RTS);
  return err;
}

// --- events --------------------------------------------------------------------------------------------------

void DiscardEvent(Lib& lib, Event* e, std::vector<uint32_t>* cm_ids_to_destroy) {
  // A CONNECT_REQUEST nobody fetched takes its unreported child with it (REJ 28 on the wire).
  if (e->event.event == RDMA_CM_EVENT_CONNECT_REQUEST && e->owner != nullptr && e->event.id != &e->owner->id) {
    IdPriv* child = Priv(e->event.id);
    if (child->listener) --child->listener->backlog_used;
    if (child->cm_id) {
      lib.by_cm_id.erase(child->cm_id);
      cm_ids_to_destroy->push_back(child->cm_id);
    }
    // What happened to the child's connection meanwhile (a REJ or a timeout of the REQ) went to the same channel
    // under the child's name: it goes with the child.
    for (Event* later : RemoveQueued(child->channel, child)) delete later;
    delete child;
  }
  delete e;
}

// What the application sees of an event it fetches: a REP on an id with a QP is processed first (RTR, RTS, RTU →
// ESTABLISHED; on failure the QP goes to ERR, the peer gets REJ 28 and the application CONNECT_ERROR), as
// librdmacm's rdma_get_cm_event does.
void Present(Lib& lib, Event* e) {
  IdPriv* p = Priv(e->event.id);
  switch (e->event.event) {
    case RDMA_CM_EVENT_CONNECT_RESPONSE:
      if (e->process_reply && p->id.qp != nullptr) {
        const int err = ModifyQpRtrRts(lib, p);
        if (err == 0 && lib.cm.SendRtu(p->cm_id, {}) == 0) {
          e->event.event = RDMA_CM_EVENT_ESTABLISHED;
          p->established = true;
          p->state = IdState::kConnected;
        } else {
          ModifyQpErr(p);
          lib.cm.SendRej(p->cm_id, static_cast<uint16_t>(wire::CmRejectReason::kConsumerDefined), {});
          e->event.event = RDMA_CM_EVENT_CONNECT_ERROR;
          e->event.status = -(err ? err : EINVAL);
          p->connect_error = true;
        }
      }
      break;
    case RDMA_CM_EVENT_REJECTED:
      ModifyQpErr(p);
      break;
    case RDMA_CM_EVENT_CONNECT_REQUEST:
      if (p->listener) {
        --p->listener->backlog_used;
        p->listener = nullptr;
      }
      break;
    default:
      break;
  }
  ++e->owner->events_reported;
}

wire::IpAddress PeerFor(Lib& lib, IdPriv* p);
void SetPeer(IdPriv* p, const wire::IpAddress& peer);

// A connect refused for want of a listener (REJ 8, or SIDR_REP "unsupported") within this long of rdma_connect is tried again, every 10 ms,
// before the application hears of it. A server that closes one listener and opens the next on the same port
// (perftest -R: first its handshake connection, then the test's) is then found by a client that dials in between;
// perftest's own retry after a REJECTED frees the ids it goes on to use. A dial with no server anywhere is still
// refused within this time.
constexpr std::chrono::milliseconds kListenerGrace{200};

// Whether `e` is such a refusal, and if so sends the REQ again (to the listener's device as known now) and frees `e`.
// Called with the lock; releases it while it waits.
bool RetriedForListener(Lib& lib, std::unique_lock<std::mutex>& lock, Event* e) {
  IdPriv* p = Priv(e->event.id);
  // REJ 8 for a REQ; SIDR_REP "unsupported" (delivered as UNREACHABLE with status 1) for a SIDR_REQ.
  const bool no_listener =
      (e->event.event == RDMA_CM_EVENT_REJECTED && p->connect_req != nullptr &&
       e->event.status == static_cast<int>(wire::CmRejectReason::kInvalidServiceId)) ||
      (e->event.event == RDMA_CM_EVENT_UNREACHABLE && p->connect_sidr != nullptr &&
       e->event.status == static_cast<int>(wire::SidrStatus::kUnsupported));
  if (!no_listener || e->owner != p || std::chrono::steady_clock::now() - p->connect_start >= kListenerGrace)
    return false;
  const uint32_t old_cm_id = p->cm_id;
  lib.by_cm_id.erase(old_cm_id);
  p->cm_id = 0;
  delete e;
  lock.unlock();
  lib.cm.Destroy(old_cm_id);  // without the lock: Destroy waits for a delivery whose sink takes it
  std::this_thread::sleep_for(std::chrono::milliseconds(10));
  lock.lock();
  if (p->state != IdState::kConnect) return true;  // destroyed or moved on meanwhile
  const wire::IpAddress peer = PeerFor(lib, p);
  SetPeer(p, peer);
  uint32_t cm_id = 0;
  int err = 0;
  if (p->connect_req) {
    p->connect_req->primary.remote_gid = p->conn.peer_gid;
    err = lib.cm.SendReq(p->local, peer, *p->connect_req, p, &cm_id);
  } else {
    err = lib.cm.SendSidrReq(p->local, peer, *p->connect_sidr, p, &cm_id);
  }
  if (err == 0) {
    p->cm_id = cm_id;
    lib.by_cm_id[cm_id] = p;
  } else {
    Enqueue(lib, p->channel, NewEvent(p, RDMA_CM_EVENT_UNREACHABLE, -err));
  }
  return true;
}

int GetEvent(Lib& lib, std::unique_lock<std::mutex>& lock, Channel* ch, Event** out) {
  for (;;) {
    if (const int err = PopEvent(lib, lock, ch, out)) return err;
    if (!RetriedForListener(lib, lock, *out)) break;
  }
  Present(lib, *out);
  return 0;
}

void AckLocked(Lib& lib, Event* e) {
  ++e->owner->events_acked;
  lib.cv.notify_all();
  delete e;
}

Event* EventOf(rdma_cm_event* e) { return reinterpret_cast<Event*>(e); }

// Synchronous ids (no channel): the call waits for its outcome (librdmacm's ucma_complete). The previous event is
// acked, the new one kept in id->event; a failure sets errno from the event's status.
int Complete(Lib& lib, std::unique_lock<std::mutex>& lock, IdPriv* p) {
  if (!p->sync) return 0;
  if (p->id.event) {
    AckLocked(lib, EventOf(p->id.event));
    p->id.event = nullptr;
  }
  Event* e = nullptr;
  if (const int err = GetEvent(lib, lock, p->channel, &e)) return Errno(err);
  p->id.event = &e->event;
  if (e->event.status != 0) {
    if (e->event.event == RDMA_CM_EVENT_REJECTED) return Errno(ECONNREFUSED);
    return Errno(e->event.status < 0 ? -e->event.status : e->event.status);
  }
  return 0;
}

Channel* NewChannel() {
  auto* ch = new Channel;
  if (const int err = OpenChannelFd(ch)) {
    delete ch;
    errno = err;
    return nullptr;
  }
  return ch;
}

void DeleteChannel(Channel* ch) {
  Lib* lib = GetLib();
  std::lock_guard lock(lib->mu);
  DestroyChannelLocked(ch);
}

// --- binding ------------------------------------------------------------------------------------------------

int BindLocked(Lib& lib, IdPriv* p, const sockaddr* addr) {
  if (addr->sa_family != AF_INET && addr->sa_family != AF_INET6) return EINVAL;
  if (p->bound || p->state != IdState::kIdle) return EINVAL;
  const auto ip = wire::IpAddressOf(addr);
  const bool any = IsAnyOrLoopback(addr);
  const std::optional<uint8_t> gid_index = GidIndexOf(lib, *ip);
  if (!any && !gid_index) return EADDRNOTAVAIL;  // not an address of an RDMA device here
  uint16_t port = PortOfSockaddr(addr);
  if (port != 0 && port < 1024 && geteuid() != 0) return EACCES;
  if (const int err = p->binding.Bind(static_cast<uint16_t>(p->id.ps), port)) {
    // The kernel's cma_check_port: a conflict with a wildcard binding is EADDRNOTAVAIL.
    return err == EADDRINUSE && any ? EADDRNOTAVAIL : err;
  }
  port = p->binding.port();
  std::memcpy(Src(p), addr, SockaddrLen(addr));
  SetPort(Src(p), port);
  p->bound = true;
  p->any_address = any;
  if (addr->sa_family == AF_INET) p->afonly = 1;
  p->state = IdState::kAddrBound;
  UseGid(lib, p, gid_index.value_or(0), *ip);
  p->id.route.addr.addr.ibaddr.pkey = htons(wire::kDefaultPkey);
  // An id bound to one of the device's addresses has the device, as the kernel's cma_acquire_dev_by_src_ip gives
  // the device whose GID holds the address, also when that address is a loopback one (librpma finds its
  // ibv_context this way). Other addresses of this host and the wildcard name no device: id->verbs stays NULL until
  // the id resolves or connects, as the kernel leaves it for an address no RDMA device holds (libfabric binds
  // "localhost" and then looks for the device's addresses itself).
  if (gid_index) AttachDevice(lib, p);
  return 0;
}

// An active id's implicit binding: the device's address towards `dst` (SourceGidFor) and an ephemeral port (no
// registration: the port only needs to be unique per device, and the kernel's cma_alloc_any_port gives one at
// random).
void BindEphemeral(Lib& lib, IdPriv* p, const sockaddr* dst) {
  static std::mt19937 rng(std::random_device{}());
  const uint16_t port = static_cast<uint16_t>(32768 + rng() % (60999 - 32768 + 1));
  const auto [index, address] = SourceGidFor(lib, dst);
  UseGid(lib, p, index, address);
  SetSockaddr(&p->id.route.addr.src_storage, p->local, port, dst->sa_family);
  p->bound = true;
  p->any_address = false;
}

wire::IpAddress PeerFor(Lib& lib, IdPriv* p) {
  const sockaddr* dst = Dst(p);
  const auto ip = wire::IpAddressOf(dst);
  if (ip && !IsAnyOrLoopback(dst) && *ip != lib.address) return *ip;
  // "This host": whichever uroce device on this host bound (ps, port); if none, our own device, whose CM then
  // answers REJ 8 at once (no listener), as the kernel does for a loopback dial.
  if (auto owner = FindPortOwner(static_cast<uint16_t>(p->id.ps), PortOfSockaddr(dst))) return *owner;
  return lib.address;
}

void SetPeer(IdPriv* p, const wire::IpAddress& peer) {
  p->conn.peer_cm = peer;
  p->conn.peer_gid = p->conn.peer_cm.bytes();
  std::memcpy(p->id.route.addr.addr.ibaddr.dgid.raw, p->conn.peer_gid.data(), 16);
}

// A REQ's or SIDR_REQ's private data: the cma_hdr, rdma_addrinfo's ai_connect prefix, then the application's bytes
// (what is left: 56 bytes in a REQ, 180 in a SIDR_REQ, minus the prefix). False when they do not fit.
template <size_t N>
bool FillRequestPrivateData(std::array<uint8_t, N>& out, const std::array<uint8_t, wire::kCmaHeaderSize>& hdr,
                            const std::vector<uint8_t>& prefix, const rdma_conn_param* param) {
  const size_t user_len = param ? param->private_data_len : 0;
  if (hdr.size() + prefix.size() + user_len > N) return false;
  std::copy(hdr.begin(), hdr.end(), out.begin());
  std::copy(prefix.begin(), prefix.end(), out.begin() + hdr.size());
  if (user_len) std::memcpy(out.data() + hdr.size() + prefix.size(), param->private_data, user_len);
  return true;
}

uint32_t FlowLabel(IdPriv* p) {
  return (uint32_t{PortOfSockaddr(Src(p))} * 31 + PortOfSockaddr(Dst(p))) & 0xFFFFF;
}

// ucma_valid_param: a connected id needs a QP or a QP number; depths within the device's.
bool ValidConnectParam(const Lib& lib, const IdPriv* p, const rdma_conn_param* param) {
  if (p->id.ps != RDMA_PS_TCP && p->id.ps != RDMA_PS_IB) return true;
  if (p->id.qp == nullptr && param == nullptr) return false;
  if (param && param->responder_resources != RDMA_MAX_RESP_RES && param->responder_resources > MaxResponder(lib))
    return false;
  if (param && param->initiator_depth != RDMA_MAX_INIT_DEPTH && param->initiator_depth > MaxInitiator(lib))
    return false;
  return true;
}

// rdma_connect of a UD id: a SIDR_REQ. 0 or errno.
int SendSidrReqFor(Lib& lib, IdPriv* p, uint64_t sid, const std::array<uint8_t, wire::kCmaHeaderSize>& hdr,
                   const rdma_conn_param* param) {
  wire::CmSidrReq req;
  req.service_id = sid;
  if (!FillRequestPrivateData(req.private_data, hdr, p->connect_prefix, param)) return EINVAL;
  uint32_t cm_id = 0;
  if (const int err = lib.cm.SendSidrReq(p->local, p->conn.peer_cm, req, p, &cm_id)) return err;
  p->cm_id = cm_id;
  lib.by_cm_id[cm_id] = p;
  p->connect_sidr = std::make_unique<wire::CmSidrReq>(req);
  return 0;
}

// The transport fields of a connected id's REQ, and the depths this side offers (`rr`, `depth`).
void SetReqTransport(const Lib& lib, const IdPriv* p, const rdma_conn_param* param, wire::CmReq& req, uint8_t* rr,
                     uint8_t* depth) {
  *rr = MaxResponder(lib);
  *depth = MaxInitiator(lib);
  if (param) {
    if (param->responder_resources != RDMA_MAX_RESP_RES) *rr = param->responder_resources;
    if (param->initiator_depth != RDMA_MAX_INIT_DEPTH) *depth = param->initiator_depth;
  }
  const bool xrc = p->id.qp_type == IBV_QPT_XRC_SEND || p->id.qp_type == IBV_QPT_XRC_RECV;
  req.transport = xrc                              ? wire::CmTransport::kExtended
                  : p->id.qp_type == IBV_QPT_UC ? wire::CmTransport::kUc
                                                : wire::CmTransport::kRc;
  req.extended_transport_type = xrc ? 1 : 0;
  if (xrc) {
    req.srq = false;  // an XRC initiator has none (cm_format_req)
    return;
  }
  req.responder_resources = *rr;
  req.initiator_depth = *depth;
  req.retry_count = param ? std::min<uint8_t>(7, param->retry_count) : 7;
  req.rnr_retry_count = param ? std::min<uint8_t>(7, param->rnr_retry_count) : 7;
}

// The primary path of a REQ: RoCE, permissive LIDs, the route's GIDs.
void SetReqPath(const Lib& lib, IdPriv* p, wire::CmReqPath& path) {
  path.local_lid = 0xFFFF;  // permissive on RoCE with a hop limit > 1
  path.remote_lid = 0xFFFF;
  path.local_gid = p->local.bytes();
  path.remote_gid = p->conn.peer_gid;
  path.flow_label = FlowLabel(p);
  path.traffic_class = p->tos;
  path.hop_limit = kHopLimit;
  path.local_ack_timeout = p->ack_timeout.value_or(kLocalAckTimeout);
}

// rdma_connect of a connected id: a REQ. 0 or errno.
int SendReqFor(Lib& lib, IdPriv* p, uint64_t sid, const std::array<uint8_t, wire::kCmaHeaderSize>& hdr,
               const rdma_conn_param* param) {
  wire::CmReq req;
  req.service_id = sid;
  req.local_qpn = p->id.qp ? p->id.qp->qp_num : (param ? param->qp_num : 0);
  req.srq = p->id.qp ? p->id.qp->srq != nullptr : (param && param->srq);
  uint8_t rr = 0, depth = 0;
  SetReqTransport(lib, p, param, req, &rr, &depth);
  req.flow_control = param ? param->flow_control : 0;
  req.starting_psn = p->seq_num;
  req.remote_cm_response_timeout = kCmResponseTimeout;
  req.local_cm_response_timeout = kCmResponseTimeout;
  req.max_cm_retries = kMaxCmRetries;
  req.path_mtu = static_cast<uint8_t>(lib.port_attr.active_mtu);
  req.pkey = wire::kDefaultPkey;
  SetReqPath(lib, p, req.primary);
  if (!FillRequestPrivateData(req.private_data, hdr, p->connect_prefix, param)) return EINVAL;
  // What this side's QP will use once the REP tells the peer's (min'ed with it then).
  p->conn.responder_resources = rr;
  p->conn.initiator_depth = depth;
  p->conn.retry_count = req.retry_count;
  p->conn.path_mtu = req.path_mtu;
  p->conn.local_ack_timeout = req.primary.local_ack_timeout;
  p->conn.flow_label = req.primary.flow_label;
  uint32_t cm_id = 0;
  if (const int err = lib.cm.SendReq(p->local, p->conn.peer_cm, req, p, &cm_id)) return err;
  p->cm_id = cm_id;
  lib.by_cm_id[cm_id] = p;
  p->connect_req = std::make_unique<wire::CmReq>(req);
  return 0;
}

Lib* LibOrErrno() { return GetLib(); }

}  // namespace

// ================================================================================================================

extern "C" {

rdma_event_channel* rdma_create_event_channel(void) {
  if (GetLib() == nullptr) return nullptr;
  Channel* ch = NewChannel();
  return ch ? &ch->channel : nullptr;
}

void rdma_destroy_event_channel(rdma_event_channel* channel) {
  if (channel == nullptr) return;
  DeleteChannel(reinterpret_cast<Channel*>(channel));
}

int rdma_create_id(rdma_event_channel* channel, rdma_cm_id** id, void* context, rdma_port_space ps) {
  Lib* lib = LibOrErrno();
  if (lib == nullptr) return -1;
  if (id == nullptr) return Errno(EINVAL);
  if (ps != RDMA_PS_TCP && ps != RDMA_PS_UDP && ps != RDMA_PS_IB && ps != RDMA_PS_IPOIB) return Errno(EINVAL);
  auto* p = new IdPriv;
  if (channel == nullptr) {
    Channel* ch = NewChannel();
    if (ch == nullptr) {
      delete p;
      return -1;
    }
    p->channel = ch;
    p->sync = true;
  } else {
    p->channel = reinterpret_cast<Channel*>(channel);
  }
  p->id.channel = &p->channel->channel;
  p->id.context = context;
  p->id.ps = ps;
  p->id.qp_type = (ps == RDMA_PS_UDP || ps == RDMA_PS_IPOIB) ? IBV_QPT_UD : IBV_QPT_RC;
  p->seq_num = RandomPsn();
  *id = &p->id;
  return 0;
}

int rdma_destroy_id(rdma_cm_id* id) {
  if (id == nullptr) return Errno(EINVAL);
  Lib* lib = GetLib();
  IdPriv* p = Priv(id);
  std::unique_lock lock(lib->mu);
  if (p->id.event) {
    AckLocked(*lib, EventOf(p->id.event));
    p->id.event = nullptr;
  }
  p->state = IdState::kDestroying;
  // Forget the engine's connection and listener first (the sink then ignores their events), destroy them with the
  // lock released: ConnectionManager::Destroy waits for a delivery in progress, and the sink takes this lock.
  std::vector<uint32_t> destroy;
  if (p->cm_id) {
    lib->by_cm_id.erase(p->cm_id);
    destroy.push_back(p->cm_id);
    p->cm_id = 0;
  }
  if (p->listen_id) {
    lib->by_listen_id.erase(p->listen_id);
    destroy.push_back(p->listen_id);
    p->listen_id = 0;
  }
  for (Multicast* m : p->multicasts) {
    if (m->attached && p->id.qp) {
      ibv_gid g;
      std::memcpy(g.raw, m->mgid.data(), 16);
      ibv_detach_mcast(p->id.qp, &g, 0);
    }
    delete m;
  }
  p->multicasts.clear();
  // Events queued and never returned are discarded (a child's CONNECT_REQUEST sits on its listener's channel).
  for (Event* e : RemoveQueued(p->channel, p)) DiscardEvent(*lib, e, &destroy);
  if (p->listener) {
    --p->listener->backlog_used;
    p->listener = nullptr;
  }
  lock.unlock();
  for (uint32_t cm_id : destroy) lib->cm.Destroy(cm_id);  // a listener id stops listening
  lock.lock();
  // Events returned to the application must be acked first (rdma_destroy_id(3)).
  lib->cv.wait(lock, [&] { return p->events_acked >= p->events_reported; });
  p->binding.Release();
  lock.unlock();
  if (p->sync) DeleteChannel(p->channel);
  delete p;
  return 0;
}

int rdma_bind_addr(rdma_cm_id* id, sockaddr* addr) {
  if (id == nullptr || addr == nullptr) return Errno(EINVAL);
  Lib* lib = GetLib();
  std::lock_guard lock(lib->mu);
  if (const int err = BindLocked(*lib, Priv(id), addr)) return Errno(err);
  return 0;
}

int rdma_resolve_addr(rdma_cm_id* id, sockaddr* src_addr, sockaddr* dst_addr, int timeout_ms) {
  (void)timeout_ms;
  if (id == nullptr || dst_addr == nullptr) return Errno(EINVAL);
  if (dst_addr->sa_family != AF_INET && dst_addr->sa_family != AF_INET6) return Errno(EINVAL);
  if (src_addr && src_addr->sa_family != dst_addr->sa_family && src_addr->sa_family != 0) return Errno(EINVAL);
  Lib* lib = GetLib();
  IdPriv* p = Priv(id);
  std::unique_lock lock(lib->mu);
  if (p->state != IdState::kIdle && p->state != IdState::kAddrBound) return Errno(EINVAL);
  if (!p->bound) {
    if (src_addr && src_addr->sa_family != 0) {
      if (const int err = BindLocked(*lib, p, src_addr)) return Errno(err);
    } else {
      BindEphemeral(*lib, p, dst_addr);
    }
  }
  // A wildcard or loopback source becomes the device's address towards the destination (SourceGidFor), which is
  // what the peer sees; an IPv6 dial from an IPv4 device keeps ::1, as the kernel's loopback resolution does
  // (cma_resolve_loopback), so that the cma_hdr carries two addresses of one family.
  if (p->any_address) {
    const uint16_t port = PortOfSockaddr(Src(p));
    const auto [index, address] = SourceGidFor(*lib, dst_addr);
    UseGid(*lib, p, index, address);
    static const wire::IpAddress kIpv6Loopback = *wire::IpAddress::Parse("::1");
    const bool v6_from_v4 = dst_addr->sa_family == AF_INET6 && p->local.is_v4();
    SetSockaddr(&p->id.route.addr.src_storage, v6_from_v4 ? kIpv6Loopback : p->local, port, dst_addr->sa_family);
  }
  // A destination (not this host) of the other IP family than the GID the id has: the device has no GID to reach it
  // from, as the kernel finds when no device holds the route's source (cma_acquire_dev_by_src_ip: ADDR_ERROR,
  // -ENODEV); the id stays bound.
  if (!IsAnyOrLoopback(dst_addr) && wire::IpAddressOf(dst_addr)->is_v4() != p->local.is_v4()) {
    p->state = IdState::kAddrBound;
    Enqueue(*lib, p->channel, NewEvent(p, RDMA_CM_EVENT_ADDR_ERROR, -ENODEV));
    return Complete(*lib, lock, p);
  }
  std::memcpy(Dst(p), dst_addr, SockaddrLen(dst_addr));
  AttachDevice(*lib, p);
  p->id.route.addr.addr.ibaddr.pkey = htons(wire::kDefaultPkey);
  SetPeer(p, PeerFor(*lib, p));
  p->state = IdState::kAddrResolved;
  Enqueue(*lib, p->channel, NewEvent(p, RDMA_CM_EVENT_ADDR_RESOLVED, 0));
  return Complete(*lib, lock, p);
}

int rdma_resolve_route(rdma_cm_id* id, int timeout_ms) {
  if (id == nullptr || timeout_ms <= 0) return Errno(EINVAL);
  Lib* lib = GetLib();
  IdPriv* p = Priv(id);
  std::unique_lock lock(lib->mu);
  if (p->state != IdState::kAddrResolved) return Errno(EINVAL);
  SetPeer(p, PeerFor(*lib, p));
  // RoCE: one path, built locally (the kernel's cma_resolve_iboe_route).
  p->path = std::make_unique<ibv_sa_path_rec>();
  ibv_sa_path_rec& r = *p->path;
  std::memcpy(r.sgid.raw, p->local.bytes().data(), 16);
  std::memcpy(r.dgid.raw, p->conn.peer_gid.data(), 16);
  r.flow_label = htonl(FlowLabel(p));
  r.hop_limit = kHopLimit;
  r.traffic_class = p->tos;
  r.reversible = htonl(1);
  r.numb_path = 1;
  r.pkey = htons(wire::kDefaultPkey);
  r.mtu_selector = 2;
  r.mtu = static_cast<uint8_t>(lib->port_attr.active_mtu);
  r.rate_selector = 2;
  r.packet_life_time_selector = 2;
  r.packet_life_time = p->ack_timeout ? static_cast<uint8_t>(*p->ack_timeout - 1) : kPacketLifeTime;
  p->id.route.path_rec = p->path.get();
  p->id.route.num_paths = 1;
  p->conn.flow_label = FlowLabel(p);
  p->state = IdState::kRouteResolved;
  Enqueue(*lib, p->channel, NewEvent(p, RDMA_CM_EVENT_ROUTE_RESOLVED, 0));
  return Complete(*lib, lock, p);
}

int rdma_listen(rdma_cm_id* id, int backlog) {
  if (id == nullptr) return Errno(EINVAL);
  Lib* lib = GetLib();
  IdPriv* p = Priv(id);
  std::lock_guard lock(lib->mu);
  if (p->state == IdState::kListen) {
    p->backlog = backlog <= 0 || backlog > kMaxBacklog ? kMaxBacklog : backlog;
    return 0;
  }
  if (!p->bound) {
    sockaddr_in any{};
    any.sin_family = AF_INET;
    if (const int err = BindLocked(*lib, p, reinterpret_cast<sockaddr*>(&any))) return Errno(err);
  }
  if (p->state != IdState::kAddrBound) return Errno(EINVAL);
  const uint64_t sid = wire::ServiceIdOf(static_cast<uint16_t>(p->id.ps), PortOfSockaddr(Src(p)));
  uint32_t lid = 0;
  if (const int err = lib->cm.Listen(sid, p, &lid)) return Errno(err);
  if (const int err = p->binding.Publish(lib->address)) {
    lib->cm.StopListening(lid);
    return Errno(err);
  }
  p->listen_id = lid;
  lib->by_listen_id[lid] = p;
  p->backlog = backlog <= 0 || backlog > kMaxBacklog ? kMaxBacklog : backlog;
  p->state = IdState::kListen;
  return 0;
}

int rdma_connect(rdma_cm_id* id, rdma_conn_param* param) {
  if (id == nullptr) return Errno(EINVAL);
  Lib* lib = GetLib();
  IdPriv* p = Priv(id);
  std::unique_lock lock(lib->mu);
  if (p->state != IdState::kRouteResolved) return Errno(EINVAL);
  if (!ValidConnectParam(*lib, p, param)) return Errno(EINVAL);
  const wire::IpAddress peer = PeerFor(*lib, p);
  lib->peers.Watch(peer);
  SetPeer(p, peer);
  const wire::CmaHeader hdr{PortOfSockaddr(Src(p)), *wire::IpAddressOf(Src(p)), *wire::IpAddressOf(Dst(p))};
  const auto hdr_bytes = wire::EncodeCmaHeader(hdr);
  const uint64_t sid = wire::ServiceIdOf(static_cast<uint16_t>(p->id.ps), PortOfSockaddr(Dst(p)));
  const int err = p->id.qp_type == IBV_QPT_UD ? SendSidrReqFor(*lib, p, sid, hdr_bytes, param)
                                              : SendReqFor(*lib, p, sid, hdr_bytes, param);
  if (err) return Errno(err);
  p->state = IdState::kConnect;
  p->connect_start = std::chrono::steady_clock::now();
  return Complete(*lib, lock, p);
}

int rdma_establish(rdma_cm_id* id) {
  if (id == nullptr || id->qp != nullptr) return Errno(EINVAL);
  Lib* lib = GetLib();
  IdPriv* p = Priv(id);
  std::lock_guard lock(lib->mu);
  if (p->cm_id == 0 || !p->conn.valid) return Errno(EINVAL);
  if (const int err = lib->cm.SendRtu(p->cm_id, {})) return Errno(err);
  p->established = true;
  p->state = IdState::kConnected;
  return 0;
}

int rdma_accept(rdma_cm_id* id, rdma_conn_param* param) {
  if (id == nullptr) return Errno(EINVAL);
  Lib* lib = GetLib();
  IdPriv* p = Priv(id);
  std::unique_lock lock(lib->mu);
  if (p->cm_id == 0 || p->state != IdState::kReqReceived) return Errno(EINVAL);
  const size_t user_len = param ? param->private_data_len : 0;
  if (p->id.qp_type == IBV_QPT_UD) {
    wire::CmSidrRep rep;
    if (user_len > rep.private_data.size()) return Errno(EINVAL);
    rep.status = wire::SidrStatus::kSuccess;
    rep.qpn = p->id.qp ? p->id.qp->qp_num : (param ? param->qp_num : 0);
    rep.qkey = RDMA_UDP_QKEY;
    if (user_len) std::memcpy(rep.private_data.data(), param->private_data, user_len);
    if (const int err = lib->cm.SendSidrRep(p->cm_id, rep)) return Errno(err);
    p->established = true;
    p->state = IdState::kConnected;
    return 0;
  }
  wire::CmRep rep;
  if (user_len > rep.private_data.size()) return Errno(EINVAL);
  if (param) {
    if (param->responder_resources != RDMA_MAX_RESP_RES)
      p->conn.responder_resources = std::min(p->conn.responder_resources, param->responder_resources);
    if (param->initiator_depth != RDMA_MAX_INIT_DEPTH)
      p->conn.initiator_depth = std::min(p->conn.initiator_depth, param->initiator_depth);
  }
  if (const int err = ModifyQpRtrRts(*lib, p)) {
    ModifyQpErr(p);
    lib->cm.SendRej(p->cm_id, static_cast<uint16_t>(wire::CmRejectReason::kConsumerDefined), {});
    return Errno(err);
  }
  const uint32_t qpn = p->id.qp ? p->id.qp->qp_num : (param ? param->qp_num : 0);
  if (p->id.qp_type == IBV_QPT_XRC_RECV) {
    rep.local_eecn = qpn;  // an XRC target's QPN goes in Local EECN (cm_format_rep)
    rep.srq = true;
  } else {
    rep.local_qpn = qpn;
    rep.initiator_depth = p->conn.initiator_depth;
    rep.flow_control = param ? param->flow_control : p->conn.flow_control;
    rep.srq = p->id.qp ? p->id.qp->srq != nullptr : (param && param->srq);
  }
  rep.starting_psn = p->seq_num;
  rep.responder_resources = p->conn.responder_resources;
  rep.target_ack_delay = kTargetAckDelay;
  rep.rnr_retry_count = param ? std::min<uint8_t>(7, param->rnr_retry_count) : 7;
  if (user_len) std::memcpy(rep.private_data.data(), param->private_data, user_len);
  if (const int err = lib->cm.SendRep(p->cm_id, rep)) return Errno(err);
  p->state = IdState::kConnect;
  return Complete(*lib, lock, p);
}

static int RejectWith(rdma_cm_id* id, const void* private_data, uint8_t len, uint16_t reason) {
  if (id == nullptr) return Errno(EINVAL);
  Lib* lib = GetLib();
  IdPriv* p = Priv(id);
  std::lock_guard lock(lib->mu);
  if (p->cm_id == 0) return Errno(EINVAL);
  if (p->id.qp_type == IBV_QPT_UD) {
    wire::CmSidrRep rep;
    if (len > rep.private_data.size()) return Errno(EINVAL);
    rep.status = wire::SidrStatus::kReject;
    if (len) std::memcpy(rep.private_data.data(), private_data, len);
    if (const int err = lib->cm.SendSidrRep(p->cm_id, rep)) return Errno(err);
    return 0;
  }
  if (len > wire::kRejPrivateDataSize) return Errno(EINVAL);
  const int err =
      lib->cm.SendRej(p->cm_id, reason, {static_cast<const uint8_t*>(private_data), private_data ? len : 0u});
  return err ? Errno(err) : 0;
}

int rdma_reject(rdma_cm_id* id, const void* private_data, uint8_t private_data_len) {
  return RejectWith(id, private_data, private_data_len,
                    static_cast<uint16_t>(wire::CmRejectReason::kConsumerDefined));
}

int rdma_reject_ece(rdma_cm_id* id, const void* private_data, uint8_t private_data_len) {
  return RejectWith(id, private_data, private_data_len,
                    static_cast<uint16_t>(wire::CmRejectReason::kVendorOptionNotSupported));
}

int rdma_notify(rdma_cm_id* id, ibv_event_type event) {
  if (id == nullptr) return Errno(EINVAL);
  if (event != IBV_EVENT_COMM_EST) return Errno(EINVAL);
  Lib* lib = GetLib();
  std::lock_guard lock(lib->mu);
  if (Priv(id)->established) return Errno(EISCONN);
  // Our engine's CM sees the RTU or the REP retransmission itself; nothing to force.
  return 0;
}

int rdma_disconnect(rdma_cm_id* id) {
  if (id == nullptr) return Errno(EINVAL);
  Lib* lib = GetLib();
  IdPriv* p = Priv(id);
  std::unique_lock lock(lib->mu);
  if (p->cm_id == 0) return Errno(EINVAL);
  ModifyQpErr(p);  // IB transport: the QP goes to ERR first (flushing what is posted)
  if (p->dreq_received) {
    lib->cm.SendDrep(p->cm_id);
  } else if (p->established) {
    lib->cm.SendDreq(p->cm_id);
  }
  // The kernel ignores the failures of both (an id in the wrong state simply sends nothing).
  return Complete(*lib, lock, p);
}

int rdma_get_cm_event(rdma_event_channel* channel, rdma_cm_event** event) {
  if (channel == nullptr || event == nullptr) return Errno(EINVAL);
  Lib* lib = GetLib();
  std::unique_lock lock(lib->mu);
  Event* e = nullptr;
  if (const int err = GetEvent(*lib, lock, reinterpret_cast<Channel*>(channel), &e)) return Errno(err);
  *event = &e->event;
  return 0;
}

int rdma_ack_cm_event(rdma_cm_event* event) {
  if (event == nullptr) return Errno(EINVAL);
  Lib* lib = GetLib();
  std::lock_guard lock(lib->mu);
  AckLocked(*lib, EventOf(event));
  return 0;
}

int rdma_get_request(rdma_cm_id* listen, rdma_cm_id** id) {
  if (listen == nullptr || id == nullptr) return Errno(EINVAL);
  Lib* lib = GetLib();
  IdPriv* l = Priv(listen);
  std::unique_lock lock(lib->mu);
  if (!l->sync) return Errno(EINVAL);
  if (l->id.event) {
    AckLocked(*lib, EventOf(l->id.event));
    l->id.event = nullptr;
  }
  Event* e = nullptr;
  if (const int err = GetEvent(*lib, lock, l->channel, &e)) return Errno(err);
  if (e->event.status) {
    l->id.event = &e->event;
    return Errno(e->event.event == RDMA_CM_EVENT_REJECTED ? ECONNREFUSED
                 : e->event.status < 0                    ? -e->event.status
                                                          : e->event.status);
  }
  if (e->event.event != RDMA_CM_EVENT_CONNECT_REQUEST) {
    l->id.event = &e->event;
    return Errno(EINVAL);
  }
  IdPriv* c = Priv(e->event.id);
  // The child gets a synchronous channel of its own (ucma_process_conn_req).
  Channel* ch = NewChannel();
  if (ch == nullptr) {
    AckLocked(*lib, e);
    return -1;
  }
  c->channel = ch;
  c->id.channel = &ch->channel;
  c->sync = true;
  if (l->ep_qp_attr) {
    ibv_qp_init_attr attr = *l->ep_qp_attr;
    lock.unlock();
    const int rc = rdma_create_qp(&c->id, l->ep_pd, &attr);
    lock.lock();
    if (rc != 0) {
      const int err = errno;
      AckLocked(*lib, e);
      lock.unlock();
      rdma_destroy_id(&c->id);
      return Errno(err);
    }
  }
  c->id.event = &e->event;
  *id = &c->id;
  return 0;
}

int rdma_migrate_id(rdma_cm_id* id, rdma_event_channel* channel) {
  if (id == nullptr) return Errno(EINVAL);
  Lib* lib = GetLib();
  IdPriv* p = Priv(id);
  Channel* to = nullptr;
  if (channel == nullptr) {
    if (p->sync) return Errno(EINVAL);
    to = NewChannel();
    if (to == nullptr) return -1;
  } else {
    to = reinterpret_cast<Channel*>(channel);
  }
  std::unique_lock lock(lib->mu);
  // A synchronous id keeps its last event in id->event until its next call; leaving the synchronous mode acks it
  // (as rdma-core does), or the wait below would wait for ever: libfabric and librpma resolve an id synchronously
  // and then migrate it with that event unacknowledged.
  if (p->sync && p->id.event) {
    AckLocked(*lib, EventOf(p->id.event));
    p->id.event = nullptr;
  }
  Channel* from = p->channel;
  for (Event* e : RemoveQueued(from, p)) Enqueue(*lib, to, e);
  p->channel = to;
  p->id.channel = &to->channel;
  const bool was_sync = p->sync;
  p->sync = channel == nullptr;
  // Events already reported on the old channel must be acked before the move completes (rdma_migrate_id(3)).
  lib->cv.wait(lock, [&] { return p->events_acked >= p->events_reported; });
  lock.unlock();
  if (was_sync) DeleteChannel(from);
  return 0;
}

int rdma_set_option(rdma_cm_id* id, int level, int optname, void* optval, size_t optlen) {
  if (id == nullptr || optval == nullptr) return Errno(EINVAL);
  Lib* lib = GetLib();
  IdPriv* p = Priv(id);
  std::lock_guard lock(lib->mu);
  if (level == RDMA_OPTION_ID) {
    switch (optname) {
      case RDMA_OPTION_ID_TOS:
        if (optlen != sizeof(uint8_t)) return Errno(EINVAL);
        p->tos = *static_cast<uint8_t*>(optval);
        return 0;
      case RDMA_OPTION_ID_REUSEADDR:
        if (optlen != sizeof(int)) return Errno(EINVAL);
        p->reuseaddr = *static_cast<int*>(optval) != 0;
        return 0;
      case RDMA_OPTION_ID_AFONLY:
        if (optlen != sizeof(int)) return Errno(EINVAL);
        if (p->state != IdState::kIdle && p->state != IdState::kAddrBound) return Errno(EINVAL);
        p->afonly = *static_cast<int*>(optval) != 0;
        return 0;
      case RDMA_OPTION_ID_ACK_TIMEOUT:
        if (optlen != sizeof(uint8_t)) return Errno(EINVAL);
        p->ack_timeout = *static_cast<uint8_t*>(optval);
        return 0;
      default:
        return Errno(ENOSYS);
    }
  }
  // RDMA_OPTION_IB_PATH (paths from an SA or ibacm) has no meaning on our RoCE port.
  return Errno(ENOSYS);
}

int rdma_init_qp_attr(rdma_cm_id* id, ibv_qp_attr* qp_attr, int* qp_attr_mask) {
  if (id == nullptr || qp_attr == nullptr || qp_attr_mask == nullptr) return Errno(EINVAL);
  Lib* lib = GetLib();
  std::lock_guard lock(lib->mu);
  if (const int err = InitQpAttr(*lib, Priv(id), qp_attr, qp_attr_mask)) return Errno(err);
  return 0;
}

__be16 rdma_get_src_port(rdma_cm_id* id) { return htons(PortOfSockaddr(&id->route.addr.src_addr)); }
__be16 rdma_get_dst_port(rdma_cm_id* id) { return htons(PortOfSockaddr(&id->route.addr.dst_addr)); }

ibv_context** rdma_get_devices(int* num_devices) {
  Lib* lib = GetLib();
  if (lib == nullptr) {
    if (num_devices) *num_devices = 0;
    return nullptr;
  }
  auto** list = static_cast<ibv_context**>(calloc(2, sizeof(ibv_context*)));
  if (list == nullptr) return nullptr;
  list[0] = lib->verbs;
  if (num_devices) *num_devices = 1;
  return list;
}

void rdma_free_devices(ibv_context** list) { free(list); }

const char* rdma_event_str(rdma_cm_event_type event) {
  static const char* const kNames[] = {
      "RDMA_CM_EVENT_ADDR_RESOLVED",    "RDMA_CM_EVENT_ADDR_ERROR",      "RDMA_CM_EVENT_ROUTE_RESOLVED",
      "RDMA_CM_EVENT_ROUTE_ERROR",      "RDMA_CM_EVENT_CONNECT_REQUEST", "RDMA_CM_EVENT_CONNECT_RESPONSE",
      "RDMA_CM_EVENT_CONNECT_ERROR",    "RDMA_CM_EVENT_UNREACHABLE",     "RDMA_CM_EVENT_REJECTED",
      "RDMA_CM_EVENT_ESTABLISHED",      "RDMA_CM_EVENT_DISCONNECTED",    "RDMA_CM_EVENT_DEVICE_REMOVAL",
      "RDMA_CM_EVENT_MULTICAST_JOIN",   "RDMA_CM_EVENT_MULTICAST_ERROR", "RDMA_CM_EVENT_ADDR_CHANGE",
      "RDMA_CM_EVENT_TIMEWAIT_EXIT"};
  const unsigned i = static_cast<unsigned>(event);
  return i < sizeof kNames / sizeof *kNames ? kNames[i] : "UNKNOWN EVENT";
}

int rdma_set_local_ece(rdma_cm_id* id, ibv_ece* ece) {
  if (id == nullptr || ece == nullptr || id->qp != nullptr || ece->vendor_id == 0 || ece->comp_mask != 0)
    return Errno(EINVAL);
  Priv(id)->local_ece = *ece;
  return 0;
}

int rdma_get_remote_ece(rdma_cm_id* id, ibv_ece* ece) {
  if (id == nullptr || ece == nullptr || id->qp != nullptr) return Errno(EINVAL);
  *ece = Priv(id)->remote_ece;
  return 0;
}

}  // extern "C"
