#include "emu/connection_manager.h"

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "emu/gid_table.h"
#include "emu/out_batch.h"
#include "wire/bytes.h"
#include "wire/frame.h"
#include "wire/headers.h"
#include "wire/opcode.h"
#include "wire/packet.h"
#include "wire/service_protocol.h"

namespace uroce::emu {
namespace {

constexpr uint64_t kNsPerMs = 1'000'000;
// What the kernel's rdma_cm puts in the MRA it answers a duplicate REQ with: CMA_CM_MRA_SETTING without the
// IB_CM_MRA_FLAG_DELAY bit, 4.096 us x 2^24 (the peer waits ms(24) = 65536 ms more).
constexpr uint8_t kMraServiceTimeout = 24;
// SIDR_REQ retransmission: the kernel's rdma_cm asks ib_cm for timeout_ms = 1 << (CMA_CM_RESPONSE_TIMEOUT - 8) =
// 4096 ms and CMA_MAX_CM_RETRIES = 15 (cma_resolve_ib_udp); CmSidrReq carries neither, so these are fixed.
constexpr uint8_t kSidrResponseTimeout = 20;
constexpr uint8_t kSidrMaxRetries = 15;

uint64_t MixBits(uint64_t x) {  // splitmix64's finaliser: a clock reading into a well-spread first comm ID
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Copies `data` into a message's private-data field (zero-filled); false when it does not fit.
template <size_t N>
bool FillPrivateData(std::array<uint8_t, N>& field, std::span<const uint8_t> data) {
  if (data.size() > N) return false;
  field.fill(0);
  std::copy(data.begin(), data.end(), field.begin());
  return true;
}

}  // namespace

// One ib_cm id: a listener, a connection (either side) or a SIDR exchange.
struct ConnectionManager::Connection {
  uint32_t id = 0;  // our local comm ID (for SIDR_REQ_SENT also the request ID)
  CmState state = CmState::kIdle;
  void* context = nullptr;
  uint32_t listen_id = 0;    // the listener whose REQ or SIDR_REQ made it
  uint64_t service_id = 0;   // a listener's service; a SIDR passive echoes it
  bool active = false;       // we sent the REQ / SIDR_REQ
  bool xrc = false;          // REQ for an XRC target: the peer's QPN comes in the REP's Local EECN
  bool destroyed = false;    // the consumer let go: no more events; lives on only through TIMEWAIT
  wire::IpAddress peer;
  wire::IpAddress local;        // our address its messages leave from and come to
  uint32_t remote_comm_id = 0;  // the peer's comm ID (a SIDR passive: the request ID)
  uint64_t remote_ca_guid = 0;
  uint32_t local_qpn = 0;   // a DREQ naming another QPN is dropped
  uint32_t remote_qpn = 0;  // what our DREQ names
  uint64_t tid = 0;         // the REQ's or SIDR_REQ's: REP, RTU, MRA, REJ, SIDR_REP reuse it
  uint64_t dreq_tid = 0;    // the received DREQ's: the DREP reuses it
  // Retransmission of the last message (REQ, REP, DREQ or SIDR_REQ): every interval_ms (+ extra_wait_ms after an
  // MRA) up to max_retries times.
  uint64_t interval_ms = 0;
  uint64_t extra_wait_ms = 0;
  uint8_t max_retries = 0;
  uint8_t retries = 0;
  uint8_t ack_timeout = 0;  // the REQ's primary Local ACK Timeout: TIMEWAIT lasts ms(ack_timeout)
  uint64_t deadline_ns = 0;  // retransmission or end of TIMEWAIT; 0 when none
  // The last message that may be sent again: REQ, REP, DREQ, SIDR_REQ, or the RTU a duplicate REP is answered with.
  std::array<uint8_t, wire::kMadSize> last_mad{};
};

struct ConnectionManager::Work {
  // OnMad's: the local address the MAD came to, which what is answered without a connection leaves from.
  wire::IpAddress arrived_at;
  OutBatch out;
  std::vector<CmEvent> events;
};

const char* ToString(CmState s) {
  switch (s) {
    case CmState::kIdle: return "IDLE";
    case CmState::kListen: return "LISTEN";
    case CmState::kReqSent: return "REQ_SENT";
    case CmState::kReqRcvd: return "REQ_RCVD";
    case CmState::kMraReqSent: return "MRA_REQ_SENT";
    case CmState::kMraReqRcvd: return "MRA_REQ_RCVD";
    case CmState::kRepSent: return "REP_SENT";
    case CmState::kRepRcvd: return "REP_RCVD";
    case CmState::kMraRepSent: return "MRA_REP_SENT";
    case CmState::kMraRepRcvd: return "MRA_REP_RCVD";
    case CmState::kEstablished: return "ESTABLISHED";
    case CmState::kDreqSent: return "DREQ_SENT";
    case CmState::kDreqRcvd: return "DREQ_RCVD";
    case CmState::kTimewait: return "TIMEWAIT";
    case CmState::kSidrReqSent: return "SIDR_REQ_SENT";
    case CmState::kSidrReqRcvd: return "SIDR_REQ_RCVD";
  }
  return "UNKNOWN";
}

const char* ToString(CmEventType t) {
  switch (t) {
    case CmEventType::kReqReceived: return "REQ_RECEIVED";
    case CmEventType::kRepReceived: return "REP_RECEIVED";
    case CmEventType::kRtuReceived: return "RTU_RECEIVED";
    case CmEventType::kRejReceived: return "REJ_RECEIVED";
    case CmEventType::kReqTimeout: return "REQ_TIMEOUT";
    case CmEventType::kRepTimeout: return "REP_TIMEOUT";
    case CmEventType::kDreqReceived: return "DREQ_RECEIVED";
    case CmEventType::kDrepReceived: return "DREP_RECEIVED";
    case CmEventType::kDreqTimeout: return "DREQ_TIMEOUT";
    case CmEventType::kTimewaitExit: return "TIMEWAIT_EXIT";
    case CmEventType::kSidrReqReceived: return "SIDR_REQ_RECEIVED";
    case CmEventType::kSidrRepReceived: return "SIDR_REP_RECEIVED";
    case CmEventType::kSidrReqTimeout: return "SIDR_REQ_TIMEOUT";
  }
  return "UNKNOWN";
}

ConnectionManager::ConnectionManager(CmConfig config, wire::Transport& transport, const wire::Clock& clock)
    : config_(config), transport_(transport), clock_(clock) {
  next_comm_id_ = config_.comm_id_seed != 0
                      ? config_.comm_id_seed
                      : static_cast<uint32_t>(MixBits(clock_.NowNs() ^ config_.ca_guid));
}

ConnectionManager::~ConnectionManager() = default;

void ConnectionManager::SetSink(CmEventSink* sink) {
  std::unique_lock lock(mu_);
  sink_ = sink;
  WaitForDeliveriesLocked(lock, 0);  // the old sink may go away once this returns
}

CmCounters ConnectionManager::counters() const {
  std::lock_guard lock(mu_);
  return counters_;
}

CmState ConnectionManager::State(uint32_t id) const {
  std::lock_guard lock(mu_);
  auto it = connections_.find(id);
  if (it == connections_.end() || it->second->destroyed) return CmState::kIdle;
  return it->second->state;
}

int ConnectionManager::SetContext(uint32_t id, void* context) {
  std::lock_guard lock(mu_);
  Connection* c = FindLocked(id);
  if (c == nullptr) return EINVAL;
  c->context = context;
  return 0;
}

// --- connections and timers ------------------------------------------------------------------------------------

ConnectionManager::Connection* ConnectionManager::FindLocked(uint32_t id) {
  auto it = connections_.find(id);
  if (it == connections_.end() || it->second->destroyed) return nullptr;
  return it->second.get();
}

ConnectionManager::Connection* ConnectionManager::FindFromLocked(uint32_t id, const wire::IpAddress& peer) {
  Connection* c = FindLocked(id);
  return c != nullptr && c->peer == peer ? c : nullptr;
}

ConnectionManager::Connection* ConnectionManager::FindByRemoteLocked(uint64_t remote_ca_guid, uint32_t remote_comm_id) {
  for (auto& [id, c] : connections_) {
    const bool connection = c->state != CmState::kIdle && c->state != CmState::kListen &&
                            c->state != CmState::kSidrReqSent && c->state != CmState::kSidrReqRcvd;
    if (connection && c->remote_comm_id == remote_comm_id && c->remote_ca_guid == remote_ca_guid) return c.get();
  }
  return nullptr;
}

uint32_t ConnectionManager::NewCommIdLocked() {
  const uint32_t operand = config_.id_seed == 0 ? 0 : uint32_t(MixBits(config_.id_seed));
  for (;;) {
    uint32_t id = next_comm_id_++ ^ operand;
    if (config_.owner != 0) id = wire::WithOwner32(config_.owner, id);
    if (id != 0 && connections_.find(id) == connections_.end()) return id;
  }
}

uint64_t ConnectionManager::NewTidLocked(uint32_t id) { return (uint64_t{++tid_high_} << 32) | id; }

ConnectionManager::Connection& ConnectionManager::AddLocked(CmState state, void* context) {
  auto c = std::make_unique<Connection>();
  c->id = NewCommIdLocked();
  c->state = state;
  c->context = context;
  Connection& ref = *c;
  connections_.emplace(ref.id, std::move(c));
  return ref;
}

ConnectionManager::Connection& ConnectionManager::AddPassiveLocked(CmState state, uint32_t listen_id,
                                                                   const wire::IpAddress& local,
                                                                   const wire::IpAddress& peer,
                                                                   uint32_t remote_comm_id, uint64_t tid) {
  Connection& c = AddLocked(state, connections_.at(listen_id)->context);
  c.listen_id = listen_id;
  c.local = local;
  c.peer = peer;
  c.remote_comm_id = remote_comm_id;
  c.tid = tid;
  return c;
}

ConnectionManager::Connection& ConnectionManager::AddActiveLocked(CmState state, const wire::IpAddress& local,
                                                                  const wire::IpAddress& peer, void* context,
                                                                  uint32_t* id) {
  Connection& c = AddLocked(state, context);
  c.active = true;
  c.local = local;
  c.peer = peer;
  c.tid = NewTidLocked(c.id);
  if (id != nullptr) *id = c.id;
  return c;
}

std::optional<wire::IpAddress> ConnectionManager::LocalAddressLocked(const wire::IpAddress& local) const {
  if (local.is_unspecified() || local == config_.address) return config_.address;
  if (config_.gids != nullptr && config_.gids->IndexOf(local)) return local;
  return std::nullopt;
}

void ConnectionManager::RemoveLocked(uint32_t id) {
  auto it = connections_.find(id);
  if (it == connections_.end()) return;
  ArmLocked(*it->second, 0);
  connections_.erase(it);
}

void ConnectionManager::ArmLocked(Connection& c, uint64_t deadline_ns) {
  if (c.deadline_ns != 0) timers_.erase({c.deadline_ns, c.id});
  c.deadline_ns = deadline_ns;
  if (deadline_ns == 0) return;
  timers_.insert({deadline_ns, c.id});
  // The progress thread may be blocked until a later deadline (or none): as Device::WakeForTimer.
  if (poller_deadline_ == 0 || deadline_ns < poller_deadline_) {
    poller_deadline_ = deadline_ns;
    transport_.Wake();
  }
}

void ConnectionManager::SendRetransmittedLocked(Connection& c, const wire::CmMad& mad, Work& w) {
  SendLocked(c.local, c.peer, mad, w, &c);
  c.retries = 0;
  c.extra_wait_ms = 0;
  ArmLocked(c, clock_.NowNs() + c.interval_ms * kNsPerMs);
}

wire::CmMad ConnectionManager::DreqOf(Connection& c) {
  wire::CmDreq m;
  m.local_comm_id = c.id;
  m.remote_comm_id = c.remote_comm_id;
  m.remote_qpn = c.remote_qpn;
  return wire::CmMad{NewTidLocked(c.id), 0, m};
}

void ConnectionManager::EnterTimewaitLocked(Connection& c) {
  c.state = CmState::kTimewait;
  ArmLocked(c, clock_.NowNs() + wire::CmTimeoutMs(c.ack_timeout) * kNsPerMs);
}

void ConnectionManager::ToIdleLocked(Connection& c) {
  c.state = CmState::kIdle;
  ArmLocked(c, 0);
}

CmEvent* ConnectionManager::EmitLocked(Connection& c, CmEventType type, Work& w) {
  if (c.destroyed) return nullptr;
  CmEvent& e = w.events.emplace_back();
  e.type = type;
  e.id = c.id;
  e.listen_id = c.listen_id;
  e.context = c.context;
  e.peer = c.peer;
  return &e;
}

uint64_t ConnectionManager::RunTimers() {
  Work w;
  uint64_t next = 0;
  {
    std::lock_guard lock(mu_);
    const uint64_t now = clock_.NowNs();
    while (!timers_.empty() && timers_.begin()->first <= now) {
      const uint32_t id = timers_.begin()->second;
      timers_.erase(timers_.begin());
      auto it = connections_.find(id);
      if (it == connections_.end()) continue;
      it->second->deadline_ns = 0;
      OnTimerLocked(*it->second, w);
    }
    if (!timers_.empty()) next = timers_.begin()->first;
    poller_deadline_ = next;
  }
  Finish(w);
  return next;
}

void ConnectionManager::OnTimerLocked(Connection& c, Work& w) {
  switch (c.state) {
    case CmState::kTimewait:
      if (c.destroyed) {
        RemoveLocked(c.id);  // nobody holds the id any more: the time-wait was its last duty
        return;
      }
      c.state = CmState::kIdle;
      EmitLocked(c, CmEventType::kTimewaitExit, w);
      return;
    case CmState::kReqSent:
    case CmState::kMraReqRcvd:
    case CmState::kRepSent:
    case CmState::kMraRepRcvd:
    case CmState::kDreqSent:
    case CmState::kSidrReqSent:
      break;
    default:
      return;  // a stale timer of a state that has none
  }
  if (c.retries < c.max_retries) {
    ++c.retries;
    ++counters_.retransmits;
    SendBytesLocked(c.local, c.peer, c.last_mad, w);
    ArmLocked(c, clock_.NowNs() + (c.interval_ms + c.extra_wait_ms) * kNsPerMs);
    return;
  }
  switch (c.state) {
    case CmState::kReqSent:
    case CmState::kMraReqRcvd:
      ToIdleLocked(c);
      EmitLocked(c, CmEventType::kReqTimeout, w);
      break;
    case CmState::kRepSent:
    case CmState::kMraRepRcvd:
      ToIdleLocked(c);
      EmitLocked(c, CmEventType::kRepTimeout, w);
      break;
    case CmState::kDreqSent:
      EnterTimewaitLocked(c);
      EmitLocked(c, CmEventType::kDreqTimeout, w);
      break;
    default:  // kSidrReqSent
      ToIdleLocked(c);
      EmitLocked(c, CmEventType::kSidrReqTimeout, w);
      break;
  }
}

// --- sending ---------------------------------------------------------------------------------------------------

void ConnectionManager::SendLocked(const wire::IpAddress& local, const wire::IpAddress& peer, const wire::CmMad& mad,
                                   Work& w, Connection* keep) {
  const std::array<uint8_t, wire::kMadSize> bytes = wire::EncodeCmMad(mad);
  if (keep != nullptr) keep->last_mad = bytes;
  SendBytesLocked(local, peer, bytes, w);
}

void ConnectionManager::SendBytesLocked(const wire::IpAddress& local, const wire::IpAddress& peer,
                                        std::span<const uint8_t> mad, Work& w) {
  const wire::PacketSpec spec = wire::GsiMadSpec(gsi_psn_);
  gsi_psn_ = (gsi_psn_ + 1) & 0xFFFFFF;
  w.out.Add(transport_, spec, mad, local.is_unspecified() ? config_.address : local,
            wire::UdpEndpoint{peer, wire::kRoceV2UdpPort},
            wire::RoceSourcePort(wire::kGsiQpn, wire::kGsiQpn));
  ++counters_.mads_sent;
}

void ConnectionManager::SendRejLocked(Connection& c, uint16_t reason, wire::CmMessageRef rejected,
                                      std::span<const uint8_t> ari, std::span<const uint8_t> private_data, Work& w) {
  wire::CmRej rej;
  rej.local_comm_id = c.id;
  rej.remote_comm_id = c.remote_comm_id;
  rej.message_rejected = rejected;
  rej.reason = reason;
  rej.reject_info_length = static_cast<uint8_t>(ari.size());
  FillPrivateData(rej.ari, ari);
  FillPrivateData(rej.private_data, private_data);
  SendLocked(c.local, c.peer, wire::CmMad{c.tid, 0, rej}, w);
}

void ConnectionManager::SendMraLocked(Connection& c, Work& w) {
  wire::CmMra mra;
  mra.local_comm_id = c.id;
  mra.remote_comm_id = c.remote_comm_id;
  mra.message_mraed = wire::CmMessageRef::kReq;
  mra.service_timeout = kMraServiceTimeout;
  SendLocked(c.local, c.peer, wire::CmMad{c.tid, 0, mra}, w);
}

void ConnectionManager::SendDrepLocked(Connection& c, uint64_t tid, Work& w) {
  wire::CmDrep drep;
  drep.local_comm_id = c.id;
  drep.remote_comm_id = c.remote_comm_id;
  SendLocked(c.local, c.peer, wire::CmMad{tid, 0, drep}, w);
}

void ConnectionManager::Finish(Work& w) {
  if (!w.out.packets.empty()) {
    std::vector<wire::OutDatagram> batch;
    batch.reserve(w.out.packets.size());
    for (const auto& p : w.out.packets) batch.push_back(p.Datagram());
    // A datagram network: what the transport has no room for is lost, and the retransmission timers cover it.
    for (size_t sent = 0, attempts = 0; sent < batch.size() && attempts < 1000; ++attempts) {
      const int n = transport_.Send(std::span(batch).subspan(sent));
      if (n < 0) break;
      sent += static_cast<size_t>(n);
    }
  }
  for (const CmEvent& e : w.events) {
    std::unique_lock lock(mu_);
    // Destroyed (or dropped) since it was queued: the consumer said it wants nothing more for the id.
    if (sink_ == nullptr || FindLocked(e.id) == nullptr) continue;
    CmEventSink* sink = sink_;
    const auto me = std::this_thread::get_id();
    delivering_.emplace_back(me, e.id);
    lock.unlock();
    sink->OnCmEvent(e);
    lock.lock();
    delivering_.erase(std::find(delivering_.begin(), delivering_.end(), std::pair(me, e.id)));
    delivered_.notify_all();
  }
}

void ConnectionManager::WaitForDeliveriesLocked(std::unique_lock<std::mutex>& lock, uint32_t id) {
  // The sink may destroy ids itself: a thread never waits for its own delivery.
  const auto me = std::this_thread::get_id();
  delivered_.wait(lock, [&] {
    return std::none_of(delivering_.begin(), delivering_.end(),
                        [&](const auto& d) { return d.first != me && (id == 0 || d.second == id); });
  });
}

// What the dead peer's kernel would have sent when it destroyed its end of `c` (cm_destroy_id), handled as received.
void ConnectionManager::PeerLeftLocked(const wire::IpAddress& peer, const Connection& c, Work& w) {
  switch (c.state) {
    case CmState::kRepSent:
    case CmState::kMraRepRcvd: {
      // It had our REP (REP_RCVD; or not yet: REQ_SENT, whose REJ "timeout" ends the same way): a REJ of the
      // REP. A DREQ here would end a connection the application never saw established.
      wire::CmRej rej;
      rej.local_comm_id = c.remote_comm_id;
      rej.remote_comm_id = c.id;
      rej.message_rejected = wire::CmMessageRef::kRep;
      rej.reason = static_cast<uint16_t>(wire::CmRejectReason::kConsumerDefined);
      HandleLocked(peer, 0, rej, w);
      break;
    }
    case CmState::kReqRcvd:
    case CmState::kMraReqSent: {
      // It died in REQ_SENT: cm_destroy_id's REJ "timeout", naming its comm ID and CA GUID (in the ARI).
      wire::CmRej rej;
      rej.local_comm_id = c.remote_comm_id;
      rej.message_rejected = wire::CmMessageRef::kOther;
      rej.reason = static_cast<uint16_t>(wire::CmRejectReason::kTimeout);
      wire::StoreBe64(rej.ari.data(), c.remote_ca_guid);
      rej.reject_info_length = 8;
      HandleLocked(peer, 0, rej, w);
      break;
    }
    case CmState::kEstablished: {
      wire::CmDreq dreq;
      dreq.local_comm_id = c.remote_comm_id;
      dreq.remote_comm_id = c.id;
      dreq.remote_qpn = c.local_qpn;
      HandleLocked(peer, 0, dreq, w);
      break;
    }
    case CmState::kDreqSent: {
      wire::CmDrep drep;
      drep.local_comm_id = c.remote_comm_id;
      drep.remote_comm_id = c.id;
      HandleLocked(peer, 0, drep, w);
      break;
    }
    case CmState::kReqSent:
    case CmState::kMraReqRcvd: {
      wire::CmRej rej;
      rej.remote_comm_id = c.id;
      rej.message_rejected = wire::CmMessageRef::kReq;
      rej.reason = static_cast<uint16_t>(wire::CmRejectReason::kConsumerDefined);
      HandleLocked(peer, 0, rej, w);
      break;
    }
    default:
      break;
  }
}

void ConnectionManager::OnPeerGone(const wire::IpAddress& peer) { EndConnectionsWith(peer, 0); }

void ConnectionManager::OnPeerProcessGone(const wire::IpAddress& peer, uint8_t owner) {
  if (owner != 0) EndConnectionsWith(peer, owner);
}

void ConnectionManager::EndConnectionsWith(const wire::IpAddress& peer, uint8_t owner) {
  Work w;
  {
    std::lock_guard lock(mu_);
    std::vector<uint32_t> ids;
    // A process of the host device is at every address of the host: a connection may have dialled it at any.
    const auto at_peer = [&](const Connection& c) {
      return c.peer == peer || (owner != 0 && config_.gids != nullptr && config_.gids->IndexOf(c.peer));
    };
    for (const auto& [id, c] : connections_)
      if (at_peer(*c) && !c->destroyed && (owner == 0 || wire::OwnerOf32(c->remote_comm_id) == owner))
        ids.push_back(id);
    for (uint32_t id : ids) {
      Connection* c = FindLocked(id);
      if (c == nullptr) continue;
      PeerLeftLocked(c->peer, *c, w);
    }
  }
  Finish(w);
}

// --- received messages -----------------------------------------------------------------------------------------

void ConnectionManager::OnMad(const wire::IpAddress& peer, uint32_t qkey, uint32_t src_qp,
                              std::span<const uint8_t> mad, const wire::IpAddress& arrived_at) {
  Work w;
  w.arrived_at = arrived_at.is_unspecified() ? config_.address : arrived_at;
  {
    std::lock_guard lock(mu_);
    ++counters_.mads_received;
    // rdmacm.md 4.1: QP1 takes only the GSI Q_Key, from another QP1; the MAD layer drops what is not CM class 2.
    auto parsed = wire::ParseCmMad(mad);
    if (qkey != wire::kGsiQkey || src_qp != wire::kGsiQpn || !parsed) {
      ++counters_.dropped_malformed;
      return;
    }
    std::visit([&](const auto& m) { HandleLocked(peer, parsed->transaction_id, m, w); }, parsed->message);
  }
  Finish(w);
}

void ConnectionManager::HandleLocked(const wire::IpAddress& peer, uint64_t tid, const wire::CmReq& m, Work& w) {
  // A REQ we already hold: the kernel's cm_dup_req_handler, plus a REP again while waiting for the RTU.
  if (Connection* c = FindByRemoteLocked(m.local_ca_guid, m.local_comm_id)) {
    ++counters_.duplicates;
    switch (c->state) {
      case CmState::kReqRcvd:
        SendMraLocked(*c, w);  // the consumer has not answered yet: ask for patience
        break;
      case CmState::kRepSent:
      case CmState::kMraRepRcvd:
        SendBytesLocked(c->local, c->peer, c->last_mad, w);  // our REP was lost
        break;
      case CmState::kTimewait: {
        // cm_format_rej outside REQ_RCVD: our IDs, "other" message.
        wire::CmRej rej;
        rej.local_comm_id = c->id;
        rej.remote_comm_id = c->remote_comm_id;
        rej.message_rejected = wire::CmMessageRef::kOther;
        rej.reason = static_cast<uint16_t>(wire::CmRejectReason::kStaleConnection);
        SendLocked(w.arrived_at, peer, wire::CmMad{tid, 0, rej}, w);
        break;
      }
      default:
        break;
    }
    return;
  }
  auto listener = listeners_.find(m.service_id);
  if (listener == listeners_.end()) {
    ++counters_.rejected_no_listener;
    SendLocked(w.arrived_at, peer, *wire::NoListenerAnswer(wire::CmMad{tid, 0, m}), w);  // REJ 8
    return;
  }
  Connection& c = AddPassiveLocked(CmState::kReqRcvd, listener->second, w.arrived_at, peer, m.local_comm_id, tid);
  c.remote_ca_guid = m.local_ca_guid;
  c.remote_qpn = m.local_qpn;
  // cm_req_handler: the passive's timeout is the REQ's Local CM Response Timeout, its retries the REQ's.
  c.interval_ms = wire::CmTimeoutMs(m.local_cm_response_timeout);
  c.max_retries = m.max_cm_retries;
  c.ack_timeout = m.primary.local_ack_timeout;
  if (CmEvent* e = EmitLocked(c, CmEventType::kReqReceived, w)) e->req = m;
}

void ConnectionManager::HandleLocked(const wire::IpAddress& peer, uint64_t, const wire::CmMra& m, Work&) {
  Connection* c = FindFromLocked(m.remote_comm_id, peer);
  if (c == nullptr) {
    ++counters_.dropped_unmatched;
    return;
  }
  const bool req = m.message_mraed == wire::CmMessageRef::kReq;
  const bool rep = m.message_mraed == wire::CmMessageRef::kRep;
  if (req && (c->state == CmState::kReqSent || c->state == CmState::kMraReqRcvd)) {
    c->state = CmState::kMraReqRcvd;
  } else if (rep && (c->state == CmState::kRepSent || c->state == CmState::kMraRepRcvd)) {
    c->state = CmState::kMraRepRcvd;
  } else {
    ++counters_.duplicates;
    return;
  }
  // cm_mra_handler: the outstanding message's timeout becomes ms(service timeout) + its own, for the rest of its
  // retries.
  c->extra_wait_ms = wire::CmTimeoutMs(m.service_timeout);
  ArmLocked(*c, clock_.NowNs() + (c->interval_ms + c->extra_wait_ms) * kNsPerMs);
}

void ConnectionManager::HandleLocked(const wire::IpAddress& peer, uint64_t, const wire::CmRej& m, Work& w) {
  // cm_acquire_rejected_id: a REJ "timeout" names the sender's CA GUID in its ARI and its own comm ID; a REJ of a
  // REQ may come before the peer had a comm ID of its own; any other must name both IDs. And it comes from the
  // connection's peer: a REJ of a REQ names only our comm ID, which another process learns from one REJ of its own.
  Connection* c = nullptr;
  if (m.reason == static_cast<uint16_t>(wire::CmRejectReason::kTimeout)) {
    c = FindByRemoteLocked(wire::LoadBe64(m.ari.data()), m.local_comm_id);
    if (c != nullptr && c->peer != peer) c = nullptr;
  } else {
    c = FindFromLocked(m.remote_comm_id, peer);
    if (c != nullptr && m.message_rejected != wire::CmMessageRef::kReq && c->remote_comm_id != m.local_comm_id) {
      c = nullptr;
    }
  }
  if (c == nullptr) {
    ++counters_.dropped_unmatched;
    return;
  }
  const bool stale = m.reason == static_cast<uint16_t>(wire::CmRejectReason::kStaleConnection);
  switch (c->state) {
    case CmState::kReqSent:
    case CmState::kMraReqRcvd:
    case CmState::kRepSent:
    case CmState::kMraRepRcvd:
    case CmState::kReqRcvd:
    case CmState::kMraReqSent:
      if (stale) {
        EnterTimewaitLocked(*c);
      } else {
        ToIdleLocked(*c);
      }
      break;
    case CmState::kDreqSent:
    case CmState::kRepRcvd:
    case CmState::kMraRepSent:
    case CmState::kEstablished:
      EnterTimewaitLocked(*c);
      break;
    default:
      ++counters_.duplicates;
      return;
  }
  if (CmEvent* e = EmitLocked(*c, CmEventType::kRejReceived, w)) e->rej = m;
}

void ConnectionManager::HandleLocked(const wire::IpAddress& peer, uint64_t, const wire::CmRep& m, Work& w) {
  Connection* c = FindFromLocked(m.remote_comm_id, peer);
  if (c == nullptr || !c->active) {
    ++counters_.dropped_unmatched;
    return;
  }
  switch (c->state) {
    case CmState::kReqSent:
    case CmState::kMraReqRcvd:
      break;
    case CmState::kEstablished:
      // cm_dup_rep_handler: the passive did not get our RTU; it goes again.
      ++counters_.duplicates;
      if (c->remote_comm_id == m.local_comm_id) SendBytesLocked(c->local, c->peer, c->last_mad, w);
      return;
    default:
      ++counters_.duplicates;
      return;
  }
  c->remote_comm_id = m.local_comm_id;
  c->remote_ca_guid = m.local_ca_guid;
  c->remote_qpn = c->xrc ? m.local_eecn : m.local_qpn;  // an XRC target's QPN sits in Local EECN
  ToIdleLocked(*c);  // disarms the REQ's retransmission
  c->state = CmState::kRepRcvd;
  if (CmEvent* e = EmitLocked(*c, CmEventType::kRepReceived, w)) e->rep = m;
}

void ConnectionManager::HandleLocked(const wire::IpAddress& peer, uint64_t, const wire::CmRtu& m, Work& w) {
  Connection* c = FindFromLocked(m.remote_comm_id, peer);
  if (c == nullptr || c->remote_comm_id != m.local_comm_id) {
    ++counters_.dropped_unmatched;
    return;
  }
  if (c->state != CmState::kRepSent && c->state != CmState::kMraRepRcvd) {
    ++counters_.duplicates;
    return;
  }
  ArmLocked(*c, 0);
  c->state = CmState::kEstablished;
  EmitLocked(*c, CmEventType::kRtuReceived, w);
}

void ConnectionManager::HandleLocked(const wire::IpAddress& peer, uint64_t tid, const wire::CmDreq& m, Work& w) {
  Connection* c = FindFromLocked(m.remote_comm_id, peer);
  if (c != nullptr && c->remote_comm_id != m.local_comm_id) c = nullptr;
  // A destroyed id still in TIMEWAIT answers as TIMEWAIT does (below), without events.
  if (c == nullptr) {
    auto it = connections_.find(m.remote_comm_id);
    if (it != connections_.end() && it->second->remote_comm_id == m.local_comm_id && it->second->peer == peer)
      c = it->second.get();
  }
  if (c == nullptr || c->state == CmState::kIdle) {
    // cm_issue_drep: a DREQ for a connection we no longer have is answered anyway, the IDs swapped.
    wire::CmDrep drep;
    drep.local_comm_id = m.remote_comm_id;
    drep.remote_comm_id = m.local_comm_id;
    SendLocked(w.arrived_at, peer, wire::CmMad{tid, 0, drep}, w);
    return;
  }
  if (m.remote_qpn != c->local_qpn) {
    ++counters_.dropped_unmatched;  // cm_dreq_handler: a DREQ naming another QP is dropped
    return;
  }
  switch (c->state) {
    case CmState::kRepSent:
    case CmState::kMraRepRcvd:
    case CmState::kEstablished:
      break;
    case CmState::kDreqSent:
      // Crossing DREQs: ours is dropped, theirs answered at once (rdmacm.md 4.7); the consumer hears of the
      // disconnection once, as kDreqReceived, and finds the id already in TIMEWAIT.
      c->dreq_tid = tid;
      SendDrepLocked(*c, tid, w);
      EnterTimewaitLocked(*c);
      EmitLocked(*c, CmEventType::kDreqReceived, w);
      return;
    case CmState::kTimewait:
      ++counters_.duplicates;
      SendDrepLocked(*c, tid, w);  // our DREP was lost
      return;
    default:  // kDreqRcvd: the consumer has not answered yet
      ++counters_.duplicates;
      return;
  }
  ArmLocked(*c, 0);
  c->state = CmState::kDreqRcvd;
  c->dreq_tid = tid;
  EmitLocked(*c, CmEventType::kDreqReceived, w);
}

void ConnectionManager::HandleLocked(const wire::IpAddress& peer, uint64_t, const wire::CmDrep& m, Work& w) {
  Connection* c = FindFromLocked(m.remote_comm_id, peer);
  if (c == nullptr || c->remote_comm_id != m.local_comm_id) {
    ++counters_.dropped_unmatched;
    return;
  }
  if (c->state != CmState::kDreqSent) {
    ++counters_.duplicates;
    return;
  }
  EnterTimewaitLocked(*c);
  EmitLocked(*c, CmEventType::kDrepReceived, w);
}

void ConnectionManager::HandleLocked(const wire::IpAddress& peer, uint64_t tid, const wire::CmSidrReq& m, Work& w) {
  // Over RoCE the kernel knows a SIDR_REQ again by its request ID (and sender) while it is unanswered.
  for (auto& [id, c] : connections_) {
    if (c->state == CmState::kSidrReqRcvd && c->remote_comm_id == m.request_id && c->peer == peer) {
      ++counters_.duplicates;
      return;
    }
  }
  auto listener = listeners_.find(m.service_id);
  if (listener == listeners_.end()) {
    ++counters_.rejected_no_listener;
    SendLocked(w.arrived_at, peer, *wire::NoListenerAnswer(wire::CmMad{tid, 0, m}), w);  // SIDR_REP "unsupported"
    return;
  }
  Connection& c = AddPassiveLocked(CmState::kSidrReqRcvd, listener->second, w.arrived_at, peer, m.request_id, tid);
  c.service_id = m.service_id;
  if (CmEvent* e = EmitLocked(c, CmEventType::kSidrReqReceived, w)) e->sidr_req = m;
}

void ConnectionManager::HandleLocked(const wire::IpAddress& peer, uint64_t, const wire::CmSidrRep& m, Work& w) {
  Connection* c = FindFromLocked(m.request_id, peer);
  if (c == nullptr) {
    ++counters_.dropped_unmatched;
    return;
  }
  if (c->state != CmState::kSidrReqSent) {
    ++counters_.duplicates;
    return;
  }
  ToIdleLocked(*c);
  if (CmEvent* e = EmitLocked(*c, CmEventType::kSidrRepReceived, w)) e->sidr_rep = m;
}

// --- the consumer's calls --------------------------------------------------------------------------------------

int ConnectionManager::Listen(uint64_t service_id, void* context, uint32_t* listen_id) {
  std::lock_guard lock(mu_);
  if (listeners_.count(service_id) != 0) return EADDRINUSE;
  Connection& c = AddLocked(CmState::kListen, context);
  c.service_id = service_id;
  listeners_[service_id] = c.id;
  if (listen_id != nullptr) *listen_id = c.id;
  return 0;
}

int ConnectionManager::StopListening(uint32_t listen_id) {
  std::lock_guard lock(mu_);
  Connection* c = FindLocked(listen_id);
  if (c == nullptr || c->state != CmState::kListen) return EINVAL;
  listeners_.erase(c->service_id);
  RemoveLocked(listen_id);
  return 0;
}

template <typename Body>
int ConnectionManager::WithLock(Body body) {
  Work w;
  {
    std::lock_guard lock(mu_);
    if (const int err = body(w); err != 0) return err;
  }
  Finish(w);
  return 0;
}

int ConnectionManager::SendReq(const wire::IpAddress& peer, const wire::CmReq& req, void* context, uint32_t* id,
                               const wire::IpAddress& local) {
  if (req.max_cm_retries > 15) return EINVAL;
  return WithLock([&](Work& w) {
    const std::optional<wire::IpAddress> from = LocalAddressLocked(local);
    if (!from) return EADDRNOTAVAIL;
    Connection& c = AddActiveLocked(CmState::kReqSent, *from, peer, context, id);
    c.xrc = req.transport == wire::CmTransport::kExtended;
    c.local_qpn = req.local_qpn;
    // ib_send_cm_req: 2 x packet life time + the peer's CM response time, packet life time being the path's
    // ACK timeout less one (cm_ack_timeout adds it).
    const uint8_t ack = req.primary.local_ack_timeout;
    c.interval_ms = 2 * wire::CmTimeoutMs(ack > 0 ? ack - 1 : 0) + wire::CmTimeoutMs(req.remote_cm_response_timeout);
    c.max_retries = req.max_cm_retries;
    c.ack_timeout = ack;
    wire::CmReq m = req;
    m.local_comm_id = c.id;
    m.local_ca_guid = config_.ca_guid;
    SendRetransmittedLocked(c, wire::CmMad{c.tid, 0, m}, w);
    return 0;
  });
}

int ConnectionManager::SendSidrReq(const wire::IpAddress& peer, const wire::CmSidrReq& req, void* context,
                                   uint32_t* id, const wire::IpAddress& local) {
  return WithLock([&](Work& w) {
    const std::optional<wire::IpAddress> from = LocalAddressLocked(local);
    if (!from) return EADDRNOTAVAIL;
    Connection& c = AddActiveLocked(CmState::kSidrReqSent, *from, peer, context, id);
    c.service_id = req.service_id;
    c.interval_ms = wire::CmTimeoutMs(kSidrResponseTimeout);
    c.max_retries = kSidrMaxRetries;
    wire::CmSidrReq m = req;
    m.request_id = c.id;
    SendRetransmittedLocked(c, wire::CmMad{c.tid, 0, m}, w);
    return 0;
  });
}

int ConnectionManager::SendRep(uint32_t id, const wire::CmRep& rep) {
  return WithLock([&](Work& w) {
    Connection* c = FindLocked(id);
    if (c == nullptr || (c->state != CmState::kReqRcvd && c->state != CmState::kMraReqSent)) return EINVAL;
    wire::CmRep m = rep;
    m.local_comm_id = c->id;
    m.remote_comm_id = c->remote_comm_id;
    m.local_ca_guid = config_.ca_guid;
    m.target_ack_delay = config_.target_ack_delay;
    c->local_qpn = rep.local_qpn != 0 ? rep.local_qpn : rep.local_eecn;  // an XRC target's QPN is in Local EECN
    c->state = CmState::kRepSent;
    SendRetransmittedLocked(*c, wire::CmMad{c->tid, 0, m}, w);
    return 0;
  });
}

int ConnectionManager::SendRtu(uint32_t id, std::span<const uint8_t> private_data) {
  return WithLock([&](Work& w) {
    Connection* c = FindLocked(id);
    if (c == nullptr || (c->state != CmState::kRepRcvd && c->state != CmState::kMraRepSent)) return EINVAL;
    wire::CmRtu m;
    if (!FillPrivateData(m.private_data, private_data)) return EINVAL;
    m.local_comm_id = c->id;
    m.remote_comm_id = c->remote_comm_id;
    c->state = CmState::kEstablished;
    SendLocked(c->local, c->peer, wire::CmMad{c->tid, 0, m}, w, c);  // kept: a duplicate REP gets it again
    return 0;
  });
}

int ConnectionManager::SendSidrRep(uint32_t id, const wire::CmSidrRep& rep) {
  return WithLock([&](Work& w) {
    Connection* c = FindLocked(id);
    if (c == nullptr || c->state != CmState::kSidrReqRcvd) return EINVAL;
    wire::CmSidrRep m = rep;
    m.request_id = c->remote_comm_id;
    m.service_id = c->service_id;
    ToIdleLocked(*c);
    SendLocked(c->local, c->peer, wire::CmMad{c->tid, 0, m}, w);
    return 0;
  });
}

int ConnectionManager::SendRej(uint32_t id, uint16_t reason, std::span<const uint8_t> private_data) {
  if (private_data.size() > wire::kRejPrivateDataSize) return EINVAL;
  return WithLock([&](Work& w) {
    Connection* c = FindLocked(id);
    if (c == nullptr) return EINVAL;
    switch (c->state) {
      case CmState::kReqRcvd:
      case CmState::kMraReqSent:
        SendRejLocked(*c, reason, wire::CmMessageRef::kReq, {}, private_data, w);
        ToIdleLocked(*c);
        return 0;
      case CmState::kRepRcvd:
      case CmState::kMraRepSent:
        SendRejLocked(*c, reason, wire::CmMessageRef::kRep, {}, private_data, w);
        EnterTimewaitLocked(*c);  // ib_send_cm_rej: a rejected REP leaves a connection behind to wait out
        return 0;
      default:
        return EINVAL;
    }
  });
}

int ConnectionManager::SendDreq(uint32_t id) {
  return WithLock([&](Work& w) {
    Connection* c = FindLocked(id);
    if (c == nullptr || c->state != CmState::kEstablished) return EINVAL;
    c->state = CmState::kDreqSent;
    SendRetransmittedLocked(*c, DreqOf(*c), w);  // the connection's own interval and retries
    return 0;
  });
}

int ConnectionManager::SendDrep(uint32_t id) {
  return WithLock([&](Work& w) {
    Connection* c = FindLocked(id);
    if (c == nullptr || c->state != CmState::kDreqRcvd) return EINVAL;
    SendDrepLocked(*c, c->dreq_tid, w);
    EnterTimewaitLocked(*c);
    return 0;
  });
}

int ConnectionManager::Drop(uint32_t id) {
  std::unique_lock lock(mu_);
  Connection* c = FindLocked(id);
  if (c == nullptr || (c->state != CmState::kReqRcvd && c->state != CmState::kSidrReqRcvd)) return EINVAL;
  RemoveLocked(id);
  WaitForDeliveriesLocked(lock, id);
  return 0;
}

// What a connection destroyed in its state says to the peer (the kernel's cm_destroy_id): a REJ, a DREQ or DREP, a
// SIDR_REP. True when it stays, marked destroyed, to wait out TIMEWAIT (duplicates still answered).
bool ConnectionManager::LeaveOnDestroyLocked(Connection& c, Work& w) {
  bool keep = false;
  switch (c.state) {
    case CmState::kListen:
      listeners_.erase(c.service_id);
      break;
    case CmState::kReqSent:
    case CmState::kMraReqRcvd: {
      // cm_destroy_id: REJ "timeout" with our CA GUID as ARI, by which the passive finds its connection.
      std::array<uint8_t, 8> ari;
      wire::StoreBe64(ari.data(), config_.ca_guid);
      SendRejLocked(c, static_cast<uint16_t>(wire::CmRejectReason::kTimeout), wire::CmMessageRef::kOther, ari,
                    {}, w);
      break;
    }
    case CmState::kReqRcvd:
    case CmState::kMraReqSent:
      SendRejLocked(c, static_cast<uint16_t>(wire::CmRejectReason::kConsumerDefined), wire::CmMessageRef::kReq,
                    {}, {}, w);
      break;
    case CmState::kRepSent:
    case CmState::kMraRepRcvd:
      SendRejLocked(c, static_cast<uint16_t>(wire::CmRejectReason::kConsumerDefined),
                    wire::CmMessageRef::kOther, {}, {}, w);
      break;
    case CmState::kRepRcvd:
    case CmState::kMraRepSent:
      SendRejLocked(c, static_cast<uint16_t>(wire::CmRejectReason::kConsumerDefined), wire::CmMessageRef::kRep,
                    {}, {}, w);
      EnterTimewaitLocked(c);
      keep = true;
      break;
    case CmState::kEstablished:
      SendLocked(c.local, c.peer, DreqOf(c), w);  // once, not retransmitted: nobody would hear how it ends
      EnterTimewaitLocked(c);
      keep = true;
      break;
    case CmState::kDreqSent:
      EnterTimewaitLocked(c);
      keep = true;
      break;
    case CmState::kDreqRcvd:
      SendDrepLocked(c, c.dreq_tid, w);
      EnterTimewaitLocked(c);
      keep = true;
      break;
    case CmState::kTimewait:
      keep = true;
      break;
    case CmState::kSidrReqRcvd: {
      wire::CmSidrRep m;
      m.request_id = c.remote_comm_id;
      m.status = wire::SidrStatus::kReject;
      m.service_id = c.service_id;
      SendLocked(c.local, c.peer, wire::CmMad{c.tid, 0, m}, w);
      break;
    }
    default:  // kIdle, kSidrReqSent
      break;
  }
  return keep;
}

int ConnectionManager::Destroy(uint32_t id) {
  Work w;
  {
    std::unique_lock lock(mu_);
    Connection* c = FindLocked(id);
    if (c == nullptr) return EINVAL;
    const bool keep = LeaveOnDestroyLocked(*c, w);
    if (keep) {
      c->destroyed = true;
    } else {
      RemoveLocked(id);
    }
    WaitForDeliveriesLocked(lock, id);
  }
  Finish(w);
  return 0;
}

}  // namespace uroce::emu
