// The rdma_cm layer: ids, addresses and ports, events and their accounting, connect / accept / reject /
// disconnect and the QP attributes they apply (rdma_cm(7), rdmacm.md sections 2-3 of the project's design notes).
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <random>

#include "rdmacm/internal.h"

namespace uroce::rdmacm {
namespace {

wire::IpAddress AddressOfGid(const ibv_gid& g) { return wire::IpAddress::FromBytes(g.raw); }

Lib* g_lib = nullptr;
std::mutex g_init_mu;

void SetConnPrivateData(Event* e, const uint8_t* data, size_t len) {
  std::memcpy(e->private_data, data, len);
  e->event.param.conn.private_data = e->private_data;
  e->event.param.conn.private_data_len = static_cast<uint8_t>(len);
}

void SetUdPrivateData(Event* e, const uint8_t* data, size_t len) {
  std::memcpy(e->private_data, data, len);
  e->event.param.ud.private_data = e->private_data;
  e->event.param.ud.private_data_len = static_cast<uint8_t>(len);
}

// The IB MTU enum the device runs (ibv_mtu has the IB values).
uint8_t DeviceMtu(const Lib& lib) { return static_cast<uint8_t>(lib.port_attr.active_mtu); }

}  // namespace

// --- shared helpers -----------------------------------------------------------------------------------------

uint32_t RandomPsn() {
  static std::mutex mu;
  static std::mt19937 rng(std::random_device{}());
  std::lock_guard lock(mu);
  return rng() & 0xFFFFFF;
}

Event* NewEvent(IdPriv* id, rdma_cm_event_type type, int status) {
  auto* e = new Event;
  e->owner = id;
  e->event.id = &id->id;
  e->event.event = type;
  e->event.status = status;
  return e;
}

void SetSockaddr(sockaddr_storage* out, const wire::IpAddress& ip, uint16_t port, int family) {
  std::memset(out, 0, sizeof *out);
  if (family == AF_INET) {
    auto* sin = reinterpret_cast<sockaddr_in*>(out);
    sin->sin_family = AF_INET;
    sin->sin_port = htons(port);
    sin->sin_addr.s_addr = htonl(ip.is_v4() ? ip.v4() : 0);
  } else {
    auto* sin6 = reinterpret_cast<sockaddr_in6*>(out);
    sin6->sin6_family = AF_INET6;
    sin6->sin6_port = htons(port);
    std::memcpy(&sin6->sin6_addr, ip.bytes().data(), 16);
  }
}

// --- addresses ------------------------------------------------------------------------------------------------

uint16_t PortOfSockaddr(const sockaddr* sa) {
  if (sa->sa_family == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in*>(sa)->sin_port);
  if (sa->sa_family == AF_INET6) return ntohs(reinterpret_cast<const sockaddr_in6*>(sa)->sin6_port);
  return 0;
}

socklen_t SockaddrLen(const sockaddr* sa) {
  return sa->sa_family == AF_INET6 ? sizeof(sockaddr_in6) : sa->sa_family == AF_INET ? sizeof(sockaddr_in) : 0;
}

// The kernel's cma_any_addr: the wildcard or a loopback address.
bool IsAnyOrLoopback(const sockaddr* sa) {
  const auto ip = wire::IpAddressOf(sa);
  if (!ip) return false;
  return ip->is_unspecified() || ip->is_loopback();
}

std::optional<uint8_t> GidIndexOf(const Lib& lib, const wire::IpAddress& address) {
  if (address == lib.address) return 0;
  const int entries = std::min(lib.port_attr.gid_tbl_len, 256);
  for (int i = 1; i < entries; ++i) {
    ibv_gid g{};
    if (ibv_query_gid(lib.verbs, 1, i, &g) == 0 && AddressOfGid(g) == address) return static_cast<uint8_t>(i);
  }
  return std::nullopt;
}

std::pair<uint8_t, wire::IpAddress> SourceGidFor(const Lib& lib, const sockaddr* dst) {
  const auto ip = wire::IpAddressOf(dst);
  if (!ip || IsAnyOrLoopback(dst)) return {0, lib.address};
  if (const auto index = GidIndexOf(lib, *ip)) return {*index, *ip};
  // The source the host's routing would give a datagram to `dst`: what a connected UDP socket is bound to (connect
  // sends nothing).
  const int fd = socket(dst->sa_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return {0, lib.address};
  sockaddr_storage to{};
  std::memcpy(&to, dst, SockaddrLen(dst));
  reinterpret_cast<sockaddr_in*>(&to)->sin_port = htons(wire::kRoceV2UdpPort);  // the same place in sockaddr_in6
  sockaddr_storage from{};
  socklen_t len = sizeof from;
  std::optional<wire::IpAddress> source;
  if (connect(fd, reinterpret_cast<sockaddr*>(&to), SockaddrLen(dst)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&from), &len) == 0)
    source = wire::IpAddressOf(reinterpret_cast<sockaddr*>(&from));
  close(fd);
  if (source) {
    if (const auto index = GidIndexOf(lib, *source)) return {*index, *source};
  }
  return {0, lib.address};
}

void UseGid(const Lib& lib, IdPriv* p, uint8_t index, const wire::IpAddress& address) {
  p->sgid_index = index;
  p->local = index == 0 ? lib.address : address;
  std::memcpy(p->id.route.addr.addr.ibaddr.sgid.raw, p->local.bytes().data(), 16);
}

const char* ToString(IdState s) {
  static const char* const kNames[] = {"IDLE",         "ADDR_QUERY", "ADDR_RESOLVED", "ROUTE_QUERY",
                                       "ROUTE_RESOLVED", "CONNECT",  "DISCONNECT",    "ADDR_BOUND",
                                       "LISTEN",       "DEVICE_REMOVAL", "DESTROYING", "CONNECTED",
                                       "REQ_RECEIVED"};
  const size_t i = static_cast<size_t>(s);
  return i < sizeof kNames / sizeof *kNames ? kNames[i] : "?";
}

// --- the library --------------------------------------------------------------------------------------------

namespace {

CmOpsLookup g_cm_ops_lookup = nullptr;  // guarded by g_init_mu; nullptr: DefaultCmOpsLookup()
bool g_cm_ops_refused = false;          // guarded by g_init_mu: the mismatch was said once (every call fails)

// Opens the process's device (the first: uroce0) into `lib`, with its attributes and default PD. 0 or ENODEV.
int OpenDevice(Lib* lib) {
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  if (list == nullptr || n == 0) {
    if (list) ibv_free_device_list(list);
    return ENODEV;
  }
  lib->verbs = ibv_open_device(list[0]);
  ibv_free_device_list(list);
  if (lib->verbs == nullptr) return ENODEV;
  ibv_gid gid{};
  if (ibv_query_device(lib->verbs, &lib->device_attr) != 0 || ibv_query_port(lib->verbs, 1, &lib->port_attr) != 0 ||
      ibv_query_gid(lib->verbs, 1, 0, &gid) != 0 || (lib->default_pd = ibv_alloc_pd(lib->verbs)) == nullptr) {
    ibv_close_device(lib->verbs);
    return ENODEV;
  }
  lib->address = AddressOfGid(gid);
  lib->node_guid = be64toh(lib->device_attr.node_guid);
  return 0;
}

void CloseDevice(Lib* lib) {
  ibv_dealloc_pd(lib->default_pd);
  ibv_close_device(lib->verbs);
}

// Announces the device to this host's peers (peer_watch.h). Without the watch, connections with a killed process
// on this host would end only by timeouts; the library works without it, and says so.
void StartPeerWatch(Lib* lib) {
  EngineCm* cm = &lib->cm;
  if (const int err = lib->peers.Start(lib->address, [cm](const wire::IpAddress& peer) { cm->OnPeerGone(peer); })) {
    std::fprintf(stderr,
                 "uroce: librdmacm: cannot announce device %s on this host (%s): its peers here will see its exit "
                 "only by timeouts\n",
                 lib->address.ToString().c_str(), std::strerror(err));
  }
}

}  // namespace

void SetCmOpsLookupForTesting(CmOpsLookup lookup) {
  std::lock_guard init(g_init_mu);
  g_cm_ops_lookup = lookup;
  g_cm_ops_refused = false;
}

Lib* GetLib() {
  std::lock_guard init(g_init_mu);
  if (g_lib != nullptr) return g_lib;
  // The engine's table first: with a libibverbs of another build, nothing of it is called (EPROTO).
  const uroce_cm_ops* ops =
      CheckedCmOps(g_cm_ops_lookup ? g_cm_ops_lookup : DefaultCmOpsLookup(), /*quiet=*/g_cm_ops_refused);
  if (ops == nullptr) {
    g_cm_ops_refused = true;
    return nullptr;
  }
  auto lib = std::make_unique<Lib>();
  if (const int err = OpenDevice(lib.get())) {
    errno = err;
    return nullptr;
  }
  if (lib->cm.Open(ops, lib->verbs) != 0 || lib->cm.SetSink(&OnCmEvent, lib.get()) != 0) {
    CloseDevice(lib.get());
    errno = ENODEV;
    return nullptr;
  }
  StartPeerWatch(lib.get());
  g_lib = lib.release();
  return g_lib;
}

// --- events from the engine (progress thread) ----------------------------------------------------------------

namespace {

IdPriv* NewChild(Lib& lib, IdPriv* listener, uint32_t cm_id, const wire::IpAddress& peer) {
  auto* c = new IdPriv;
  c->id.verbs = lib.verbs;
  c->id.context = listener->id.context;
  c->id.ps = listener->id.ps;
  c->id.qp_type = listener->id.qp_type;
  c->id.port_num = 1;
  c->id.pd = lib.default_pd;
  c->channel = listener->channel;
  c->id.channel = &listener->channel->channel;
  c->state = IdState::kReqReceived;
  c->cm_id = cm_id;
  c->listener = listener;
  c->seq_num = RandomPsn();
  c->conn.peer_cm = peer;
  lib.peers.Watch(peer);
  ++listener->backlog_used;
  lib.by_cm_id[cm_id] = c;
  return c;
}

// The child's addresses from the cma_hdr: src = the address dialled and the listener's port, dst = the caller's
// (the kernel's cma_save_ip_info).
void SetChildRoute(Lib& lib, IdPriv* c, const wire::CmaHeader& h, uint16_t port, const wire::Gid& peer_gid) {
  const int family = Src(c->listener)->sa_family == AF_INET6 && !h.src.is_v4() ? AF_INET6 : AF_INET;
  SetSockaddr(&c->id.route.addr.src_storage, h.dst, port, family);
  SetSockaddr(&c->id.route.addr.dst_storage, h.src, h.src_port, family);
  // The GID the request was dialled at (the kernel's child takes the listener's device's GID the REQ came to).
  UseGid(lib, c, GidIndexOf(lib, h.dst).value_or(0), h.dst);
  std::memcpy(c->id.route.addr.addr.ibaddr.dgid.raw, peer_gid.data(), 16);
  c->id.route.addr.addr.ibaddr.pkey = htons(wire::kDefaultPkey);
  c->conn.peer_gid = peer_gid;
}

// Whether a listener takes a request carrying cma_hdr `h` (the kernel's cma_match_private_data): a listener bound
// to a specific address only takes requests dialled to it; an IPv4 listener only IPv4 requests.
bool ListenerMatches(IdPriv* l, const wire::CmaHeader& h) {
  const sockaddr* src = Src(l);
  if (src->sa_family == AF_INET && !h.dst.is_v4()) return false;
  if (src->sa_family == AF_INET6 && l->afonly == 1 && h.dst.is_v4()) return false;
  if (l->any_address) return true;
  return wire::IpAddressOf(src) == h.dst;
}

bool TransportMatches(ibv_qp_type listener, const wire::CmReq& r) {
  switch (r.transport) {
    case wire::CmTransport::kRc:
      return listener == IBV_QPT_RC;
    case wire::CmTransport::kUc:
      return listener == IBV_QPT_UC;
    case wire::CmTransport::kExtended:
      return r.extended_transport_type == 1 && listener == IBV_QPT_XRC_RECV;
    default:
      return false;
  }
}

// What a passive child learns from its REQ.
void LearnFromReq(const Lib& lib, ConnectionValues& v, const wire::CmReq& req) {
  v.peer_qpn = req.local_qpn;
  v.peer_psn = req.starting_psn;
  v.path_mtu = std::min(req.path_mtu, DeviceMtu(lib));
  // Each side's responder resources are the other's initiator depth (cm_format_req_event).
  v.responder_resources =
      std::min<uint32_t>(req.initiator_depth, static_cast<uint8_t>(lib.device_attr.max_qp_rd_atom));
  v.initiator_depth =
      std::min<uint32_t>(req.responder_resources, static_cast<uint8_t>(lib.device_attr.max_qp_init_rd_atom));
  v.retry_count = req.retry_count;
  v.rnr_retry_count = req.rnr_retry_count;
  v.local_ack_timeout = req.primary.local_ack_timeout;
  v.flow_label = req.primary.flow_label;
  v.srq = req.srq;
  v.flow_control = req.flow_control;
  v.valid = true;
}

void OnReq(Lib& lib, const emu::CmEvent& e) {
  auto it = lib.by_listen_id.find(e.listen_id);
  const auto hdr = wire::ParseCmaHeader(e.req.private_data);
  // Any refusal after the service ID matched is REJ 28 (the kernel's rdma_cm, rdmacm.md 4.6).
  if (it == lib.by_listen_id.end() || !hdr || !ListenerMatches(it->second, *hdr) ||
      !TransportMatches(it->second->id.qp_type, e.req)) {
    lib.cm.SendRej(e.id, static_cast<uint16_t>(wire::CmRejectReason::kConsumerDefined), {});
    return;
  }
  IdPriv* l = it->second;
  if (l->backlog_used >= l->backlog) {
    lib.cm.Drop(e.id);  // backlog full: silently, so the caller retransmits (ucma_event_handler)
    return;
  }
  IdPriv* c = NewChild(lib, l, e.id, e.peer);
  SetChildRoute(lib, c, *hdr, wire::PortOf(e.req.service_id), e.req.primary.local_gid);
  LearnFromReq(lib, c->conn, e.req);

  Event* ev = NewEvent(c, RDMA_CM_EVENT_CONNECT_REQUEST, 0);
  ev->owner = l;
  ev->event.listen_id = &l->id;
  SetConnPrivateData(ev, e.req.private_data.data() + wire::kCmaHeaderSize,
                     wire::kReqPrivateDataSize - wire::kCmaHeaderSize);
  rdma_conn_param& p = ev->event.param.conn;
  p.responder_resources = e.req.initiator_depth;
  p.initiator_depth = e.req.responder_resources;
  p.flow_control = e.req.flow_control;
  p.retry_count = e.req.retry_count;
  p.rnr_retry_count = e.req.rnr_retry_count;
  p.srq = e.req.srq;
  p.qp_num = e.req.local_qpn;
  Enqueue(lib, l->channel, ev);
}

void OnSidrReq(Lib& lib, const emu::CmEvent& e) {
  auto it = lib.by_listen_id.find(e.listen_id);
  const auto hdr = wire::ParseCmaHeader(e.sidr_req.private_data);
  if (it == lib.by_listen_id.end() || !hdr || !ListenerMatches(it->second, *hdr) ||
      it->second->id.qp_type != IBV_QPT_UD) {
    wire::CmSidrRep rep;
    rep.status = wire::SidrStatus::kReject;
    lib.cm.SendSidrRep(e.id, rep);
    return;
  }
  IdPriv* l = it->second;
  if (l->backlog_used >= l->backlog) {
    lib.cm.Drop(e.id);
    return;
  }
  IdPriv* c = NewChild(lib, l, e.id, e.peer);
  wire::Gid peer_gid = e.peer.bytes();
  SetChildRoute(lib, c, *hdr, wire::PortOf(e.sidr_req.service_id), peer_gid);
  Event* ev = NewEvent(c, RDMA_CM_EVENT_CONNECT_REQUEST, 0);
  ev->owner = l;
  ev->event.listen_id = &l->id;
  SetUdPrivateData(ev, e.sidr_req.private_data.data() + wire::kCmaHeaderSize,
                   wire::kSidrReqPrivateDataSize - wire::kCmaHeaderSize);
  Enqueue(lib, l->channel, ev);
}

void FillUdAh(const Lib& lib, IdPriv* p, ibv_ah_attr* ah) {
  std::memset(ah, 0, sizeof *ah);
  ah->is_global = 1;
  std::memcpy(ah->grh.dgid.raw, p->conn.peer_gid.data(), 16);
  ah->grh.sgid_index = p->sgid_index;
  ah->grh.hop_limit = kHopLimit;
  ah->grh.traffic_class = p->tos;
  ah->grh.flow_label = p->conn.flow_label;
  ah->port_num = 1;
  (void)lib;
}

// A REP: what it teaches the id, and a CONNECT_RESPONSE that rdma_get_cm_event turns into ESTABLISHED (Present).
Event* RepEvent(IdPriv* p, const wire::CmRep& rep) {
  ConnectionValues& v = p->conn;
  const bool xrc = p->id.qp_type == IBV_QPT_XRC_SEND;
  v.peer_qpn = xrc ? rep.local_eecn : rep.local_qpn;  // an XRC target's QPN travels in Local EECN
  v.peer_psn = rep.starting_psn;
  v.responder_resources = std::min(v.responder_resources, rep.initiator_depth);
  v.initiator_depth = std::min(v.initiator_depth, rep.responder_resources);
  v.rnr_retry_count = rep.rnr_retry_count;  // each QP retries RNR as its peer asked (cm_rep_handler)
  v.srq = rep.srq;
  v.flow_control = rep.flow_control;
  v.valid = true;
  Event* ev = NewEvent(p, RDMA_CM_EVENT_CONNECT_RESPONSE, 0);
  ev->process_reply = true;
  SetConnPrivateData(ev, rep.private_data.data(), wire::kRepPrivateDataSize);
  rdma_conn_param& c = ev->event.param.conn;
  c.responder_resources = rep.initiator_depth;
  c.initiator_depth = rep.responder_resources;
  c.flow_control = rep.flow_control;
  c.rnr_retry_count = rep.rnr_retry_count;
  c.srq = rep.srq;
  c.qp_num = v.peer_qpn;
  return ev;
}

// A SIDR_REP: ESTABLISHED with the peer's QPN, Q_Key and address handle, or UNREACHABLE with its status.
Event* SidrRepEvent(const Lib& lib, IdPriv* p, const wire::CmSidrRep& rep) {
  if (rep.status != wire::SidrStatus::kSuccess) {
    Event* ev = NewEvent(p, RDMA_CM_EVENT_UNREACHABLE, static_cast<int>(rep.status));
    SetUdPrivateData(ev, rep.private_data.data(), wire::kSidrRepPrivateDataSize);
    return ev;
  }
  Event* ev = NewEvent(p, RDMA_CM_EVENT_ESTABLISHED, 0);
  SetUdPrivateData(ev, rep.private_data.data(), wire::kSidrRepPrivateDataSize);
  FillUdAh(lib, p, &ev->event.param.ud.ah_attr);
  ev->event.param.ud.qp_num = rep.qpn;
  ev->event.param.ud.qkey = rep.qkey;
  p->established = true;
  return ev;
}

// DREQ, DREP, DREQ timeout: one DISCONNECTED per id, none after CONNECT_ERROR; nullptr when none is due.
Event* DisconnectedEvent(IdPriv* p, emu::CmEventType type) {
  if (type == emu::CmEventType::kDreqReceived) p->dreq_received = true;
  if (p->connect_error || p->state == IdState::kDisconnect) return nullptr;
  p->state = IdState::kDisconnect;
  return NewEvent(p, RDMA_CM_EVENT_DISCONNECTED, type == emu::CmEventType::kDreqTimeout ? -ETIMEDOUT : 0);
}

// The rdma_cm event an engine event of an id's own connection makes, or nullptr for none.
Event* ConnectionEvent(Lib& lib, IdPriv* p, const emu::CmEvent& e) {
  switch (e.type) {
    case emu::CmEventType::kRepReceived:
      return RepEvent(p, e.rep);
    case emu::CmEventType::kRtuReceived:
      p->established = true;
      p->state = IdState::kConnected;
      return NewEvent(p, RDMA_CM_EVENT_ESTABLISHED, 0);
    case emu::CmEventType::kRejReceived: {
      if (p->connect_error) return nullptr;
      Event* ev = NewEvent(p, RDMA_CM_EVENT_REJECTED, e.rej.reason);
      SetConnPrivateData(ev, e.rej.private_data.data(), wire::kRejPrivateDataSize);
      return ev;
    }
    case emu::CmEventType::kReqTimeout:
    case emu::CmEventType::kRepTimeout:
    case emu::CmEventType::kSidrReqTimeout:
      return NewEvent(p, RDMA_CM_EVENT_UNREACHABLE, -ETIMEDOUT);
    case emu::CmEventType::kDreqReceived:
    case emu::CmEventType::kDrepReceived:
    case emu::CmEventType::kDreqTimeout:
      return DisconnectedEvent(p, e.type);
    case emu::CmEventType::kTimewaitExit:
      return NewEvent(p, RDMA_CM_EVENT_TIMEWAIT_EXIT, 0);
    case emu::CmEventType::kSidrRepReceived:
      return SidrRepEvent(lib, p, e.sidr_rep);
    default:
      return nullptr;
  }
}

}  // namespace

void OnCmEvent(void* context, const emu::CmEvent* event) {
  Lib* lib = static_cast<Lib*>(context);
  const emu::CmEvent& e = *event;
  std::lock_guard lock(lib->mu);
  switch (e.type) {
    case emu::CmEventType::kReqReceived:
      OnReq(*lib, e);
      return;
    case emu::CmEventType::kSidrReqReceived:
      OnSidrReq(*lib, e);
      return;
    default:
      break;
  }
  auto it = lib->by_cm_id.find(e.id);
  if (it == lib->by_cm_id.end()) return;  // the id was destroyed meanwhile
  if (Event* ev = ConnectionEvent(*lib, it->second, e)) Enqueue(*lib, it->second->channel, ev);
}

}  // namespace uroce::rdmacm
