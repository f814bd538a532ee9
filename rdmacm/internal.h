// librdmacm's private state: the library's wrapper of every rdma_cm_id, its event channels and events, and the
// process-wide state (the device, its default PD, the connection manager of the engine).
//
// The rdma_cm layer lives here, as the kernel's rdma_cm does above its ib_cm: ports and port spaces, the cma_hdr,
// listener matching, events and their accounting, and the QP transitions. The ib_cm protocol (MADs, retransmission,
// time-wait) runs in the engine (emu/connection_manager.h), which calls back with CmEvents on the progress thread.
//
// The engine's CM is reached through the C table of verbs_api/cm_export.h (EngineCm, rdmacm/engine_cm.h), checked
// when the library first needs the device (GetLib): a libibverbs.so.1 of another build is refused with EPROTO.
//
// Locking: one library mutex (Lib::mu) guards every id, channel and event. It may be held while calling the
// engine's CM or a verb (they never call back into the library with their own locks held), never while blocking:
// waits use condition variables or poll(2) with the mutex released.
#pragma once

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "emu/connection_manager.h"
#include "rdmacm/engine_cm.h"
#include "rdmacm/peer_watch.h"
#include "rdmacm/port_registry.h"
#include "wire/address.h"
#include "wire/cm_mad.h"

namespace uroce::rdmacm {

struct IdPriv;

// An event with room for the largest private data (RDMA_MAX_PRIVATE_DATA, rdma_cma_abi.h); `param`'s pointer points
// into `private_data`. `owner` is the id whose accounting the event counts against: the listener for a
// CONNECT_REQUEST, else the id.
struct Event {
  rdma_cm_event event{};
  uint8_t private_data[256]{};
  IdPriv* owner = nullptr;
  // A REP on an id with a QP: rdma_get_cm_event moves the QP to RTR and RTS and sends the RTU before the application
  // sees ESTABLISHED (or CONNECT_ERROR), as librdmacm does.
  bool process_reply = false;
};

// An rdma_event_channel: a queue of events and an eventfd that is readable exactly while the queue is not empty
// (level-triggered), so the application may poll(2) it or make it non-blocking.
struct Channel {
  rdma_event_channel channel{};  // first: the application's pointer is ours
  std::deque<Event*> queue;
  bool signalled = false;  // the eventfd holds a count
  int waiters = 0;         // threads blocked in poll(2) on it (PopEvent)
  bool destroyed = false;  // destroyed while threads waited: the last of them frees it
};

// Where an id stands in the rdma_cm layer (the kernel's enum rdma_cm_state).
enum class IdState : uint8_t {
  kIdle,
  kAddrQuery,
  kAddrResolved,
  kRouteQuery,
  kRouteResolved,
  kConnect,
  kDisconnect,
  kAddrBound,
  kListen,
  kDeviceRemoval,
  kDestroying,
  kConnected,
  kReqReceived,  // a passive child before accept
};
const char* ToString(IdState s);

// What the CM exchange taught an id about its connection: the values rdma_init_qp_attr applies.
struct ConnectionValues {
  wire::IpAddress peer_cm;  // where the CM messages go (the peer device's address)
  wire::Gid peer_gid{};
  uint32_t peer_qpn = 0;
  uint32_t peer_psn = 0;       // the PSN the peer starts sending with: our RQ PSN... no: our SQ PSN is its RQ PSN
  uint8_t path_mtu = 0;        // IB enum of the REQ's path MTU
  uint8_t responder_resources = 0;
  uint8_t initiator_depth = 0;
  uint8_t retry_count = 7;
  uint8_t rnr_retry_count = 7;
  uint8_t local_ack_timeout = 0;
  uint32_t flow_label = 0;
  bool srq = false;
  bool flow_control = false;
  bool valid = false;  // a REQ (passive) or REP (active) was received
};

struct IdPriv {
  rdma_cm_id id{};  // first: the application's pointer is ours
  Channel* channel = nullptr;
  bool sync = false;  // created without a channel: `channel` is private and the calls block (ucma_complete)
  IdState state = IdState::kIdle;
  // Accounting (rdma_destroy_id waits until every event returned to the application is acked).
  uint64_t events_reported = 0;
  uint64_t events_acked = 0;
  // The engine's connection (0: none) and listener (0: none).
  uint32_t cm_id = 0;
  uint32_t listen_id = 0;
  int backlog = 0;
  int backlog_used = 0;  // CONNECT_REQUESTs queued and not yet fetched
  IdPriv* listener = nullptr;  // a child not yet fetched: whose backlog it holds
  bool bound = false;
  bool any_address = true;  // bound to 0.0.0.0, ::, 127/8 or ::1 ("this host")
  PortBinding binding;      // the (port space, port) registration of a bound id
  uint32_t seq_num = 0;     // our random starting PSN (24 bits)
  uint8_t tos = 0;
  std::optional<uint8_t> ack_timeout;  // RDMA_OPTION_ID_ACK_TIMEOUT
  bool reuseaddr = false;
  int afonly = -1;  // -1: unset
  // The device's GID the id uses, as the kernel's id holds an sgid_attr: the route's SGID, the sgid_index
  // rdma_init_qp_attr gives, and `local`, the address its CM messages leave from. GID 0 until the id binds to,
  // resolves from or is dialled at another address of the device (UseGid).
  uint8_t sgid_index = 0;
  wire::IpAddress local;  // unspecified: GID 0's address
  ConnectionValues conn;
  bool established = false;    // ESTABLISHED reached (rdma_disconnect is allowed)
  bool dreq_received = false;  // the peer disconnected first: rdma_disconnect answers with DREP
  bool connect_error = false;  // CONNECT_ERROR delivered: later REJECTED / DISCONNECTED are swallowed
  // rdma_create_ep: the passive id's PD and QP attributes, given to every child rdma_get_request returns.
  ibv_pd* ep_pd = nullptr;
  std::unique_ptr<ibv_qp_init_attr> ep_qp_attr;
  std::vector<uint8_t> connect_prefix;
  // rdma_connect's REQ or SIDR_REQ and when it left: a REJ 8 / SIDR "unsupported" soon after is tried again (a
  // listener about to appear).
  std::unique_ptr<wire::CmReq> connect_req;
  std::unique_ptr<wire::CmSidrReq> connect_sidr;
  std::chrono::steady_clock::time_point connect_start;  // rdma_addrinfo.ai_connect: private data put before the application's
  ibv_ece local_ece{};
  ibv_ece remote_ece{};
  std::vector<struct Multicast*> multicasts;
  std::unique_ptr<ibv_sa_path_rec> path;  // route.path_rec points here
};

struct Multicast {
  IdPriv* id = nullptr;
  void* context = nullptr;
  sockaddr_storage addr{};
  wire::Gid mgid{};
  bool attached = false;
};

// The process-wide state, created by the first call that needs the device.
struct Lib {
  std::mutex mu;
  std::condition_variable cv;  // signalled on every ack and every queued event
  ibv_context* verbs = nullptr;
  ibv_pd* default_pd = nullptr;
  ibv_xrcd* default_xrcd = nullptr;
  ibv_device_attr device_attr{};
  ibv_port_attr port_attr{};
  wire::IpAddress address;  // the device's address (GID 0)
  uint64_t node_guid = 0;
  EngineCm cm;  // the device's connection manager, in the engine
  PeerWatch peers;  // the uroce devices of this host we talk to: their death ends our connections with them
  std::map<uint32_t, IdPriv*> by_cm_id;      // live connections of the engine
  std::map<uint32_t, IdPriv*> by_listen_id;  // listeners
};

// The library, or nullptr with errno set (ENODEV when uroce's device cannot be opened, EPROTO when the
// libibverbs.so.1 loaded is of another build: CheckedCmOps).
Lib* GetLib();
// For tests: where GetLib looks for the engine's CM table (DefaultCmOpsLookup() unless set). Only before the
// library is made.
void SetCmOpsLookupForTesting(CmOpsLookup lookup);

// Channels and events (channel.cc). All with Lib::mu held.
void Enqueue(Lib& lib, Channel* ch, Event* ev);
// Removes from `ch` every queued event of `id` (owner or id), for destroy and migrate; returns them.
std::vector<Event*> RemoveQueued(Channel* ch, IdPriv* id);
void ClearSignal(Channel* ch);
int OpenChannelFd(Channel* ch);  // 0 or errno
// rdma_destroy_event_channel: closes and frees the channel, or, while threads wait on it (rping's CM thread is
// still blocked in rdma_get_cm_event when its main thread destroys the channel), wakes them and leaves the freeing
// to the last one; their rdma_get_cm_event never returns, as on a kernel channel closed under a blocked read(2).
void DestroyChannelLocked(Channel* ch);
// Waits for the next event of `ch` (unless non-blocking: EAGAIN). Returns 0 or errno; the lock is released while
// waiting.
int PopEvent(Lib& lib, std::unique_lock<std::mutex>& lock, Channel* ch, Event** out);

// The engine's events (cma.cc), installed as the CM's sink with the Lib as its context.
void OnCmEvent(void* lib, const emu::CmEvent* e);

// Values the kernel's rdma_cm uses on RoCE (rdmacm.md 4.7), and ours where it leaves a choice.
inline constexpr uint8_t kCmResponseTimeout = 18;  // 4.096 us x 2^18 ~ 1 s (the kernel's 20 is ~4 s)
inline constexpr uint8_t kMaxCmRetries = 15;        // CMA_MAX_CM_RETRIES
inline constexpr uint8_t kLocalAckTimeout = 17;     // cm_ack_timeout(ca_ack_delay 15, packet life time 16), as rxe
inline constexpr uint8_t kPacketLifeTime = 16;      // CMA_IBOE_PACKET_LIFETIME
inline constexpr uint8_t kTargetAckDelay = 15;      // our local_ca_ack_delay, as rxe's
inline constexpr uint8_t kHopLimit = 64;            // IPv4 default hop limit of the route
inline constexpr int kMaxBacklog = 1024;            // net.rdma_ucm.max_backlog

inline int Errno(int err) {
  errno = err;
  return -1;
}
inline IdPriv* Priv(rdma_cm_id* id) { return reinterpret_cast<IdPriv*>(id); }
inline sockaddr* Src(IdPriv* p) { return &p->id.route.addr.src_addr; }
inline sockaddr* Dst(IdPriv* p) { return &p->id.route.addr.dst_addr; }
uint32_t RandomPsn();  // a random 24-bit starting PSN
Event* NewEvent(IdPriv* id, rdma_cm_event_type type, int status);
// `ip` and `port` as a sockaddr of `family` (AF_INET takes an IPv4 address, AF_INET6 any).
void SetSockaddr(sockaddr_storage* out, const wire::IpAddress& ip, uint16_t port, int family);

// The attributes that move `p`'s QP to attr->qp_state (rdma_init_qp_attr(3)); 0 or errno.
int InitQpAttr(Lib& lib, IdPriv* p, ibv_qp_attr* attr, int* mask);

// Addresses (cma.cc).
bool IsAnyOrLoopback(const sockaddr* sa);
// The index of the device's GID that holds `address` (ibv_query_gid), nullopt when none does.
std::optional<uint8_t> GidIndexOf(const Lib& lib, const wire::IpAddress& address);
// The GID a connection to `dst` from an id not bound to one of the device's addresses leaves from: GID 0 for a
// loopback or wildcard destination ("this host" is the device's address); the destination itself when it is one of
// the device's GIDs (a dial to another address of this host); else the GID of the address the host's routing picks
// as the source towards `dst` (the kernel's rdma_resolve_addr: rdma_translate_ip of the route's source), GID 0 when
// the device has none of that address.
std::pair<uint8_t, wire::IpAddress> SourceGidFor(const Lib& lib, const sockaddr* dst);
// Gives `p` the device's GID `index`, holding `address` (IdPriv::sgid_index).
void UseGid(const Lib& lib, IdPriv* p, uint8_t index, const wire::IpAddress& address);
uint16_t PortOfSockaddr(const sockaddr* sa);
socklen_t SockaddrLen(const sockaddr* sa);

}  // namespace uroce::rdmacm
