// The IB Communication Manager (IBTA vol. 1 ch. 12) of one device: the ib_cm layer of the Linux kernel, talking
// MADs on QP1 (wire/cm_mad.h). It owns the connection state machines — REQ/REP/RTU, REJ, MRA, DREQ/DREP, SIDR —
// with their retransmissions, duplicate handling and time-wait, and answers by itself what needs no consumer: a REQ
// or SIDR_REQ for a service nobody listens on gets REJ 8 / SIDR_REP "unsupported" at once, a duplicate REQ an MRA,
// a duplicate REP an RTU again, a DREQ for a connection it no longer has a DREP.
//
// It never touches QPs: the consumer (librdmacm, rdmacm/) moves its QP through INIT/RTR/RTS with the values the
// messages carry, as the kernel's rdma_cm does; the consumer also owns the rdma_cm layer (ports, cma_hdr, events).
//
// Threads: every method may be called from any thread (own mutex). Events are delivered to the sink on the thread
// that processed the packet or timer (the engine's progress thread), after the CM's lock is released, so the sink
// may call back into the ConnectionManager. The Device hands it every packet for QP1 (after ICRC and P_Key checks)
// and calls RunTimers from its own.
//
// The public methods are virtual so that librdmacm.so, a separate library, calls them through the vtable of the
// instance libibverbs.so owns, without exported C++ symbols.
//
// Errors: 0 or a positive errno (EINVAL for a wrong state or unknown id, EADDRINUSE for a second listener of one
// service ID, ENOMEM).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <thread>
#include <utility>
#include <vector>

#include "wire/address.h"
#include "wire/clock.h"
#include "wire/cm_mad.h"
#include "wire/transport.h"

namespace uroce::emu {

// The ib_cm states (the kernel's enum ib_cm_state, IBTA 12.9.2), each with a printable name.
enum class CmState : uint8_t {
  kIdle,
  kListen,
  kReqSent,
  kReqRcvd,
  kMraReqSent,
  kMraReqRcvd,
  kRepSent,
  kRepRcvd,
  kMraRepSent,
  kMraRepRcvd,
  kEstablished,
  kDreqSent,
  kDreqRcvd,
  kTimewait,
  kSidrReqSent,
  kSidrReqRcvd,
};
const char* ToString(CmState s);

// What the consumer hears. `id` names the connection (its local communication ID); `context` is what the consumer
// attached to it (Listen / SendReq / SendSidrReq / SetContext); a new connection made by a REQ or SIDR_REQ carries
// its listener's `listen_id` and context until the consumer calls SetContext.
enum class CmEventType : uint8_t {
  kReqReceived,       // passive: new id in REQ_RCVD; `req` set. Answer with SendRep, SendRej or Drop
  kRepReceived,       // active: REP_RCVD; `rep` set. Answer with SendRtu (or SendRej)
  kRtuReceived,       // passive: ESTABLISHED
  kRejReceived,       // `rej` set; the id is done (IDLE or TIMEWAIT, which ends with kTimewaitExit)
  kReqTimeout,        // active: no REP after max_cm_retries retransmissions (UNREACHABLE, -ETIMEDOUT)
  kRepTimeout,        // passive: no RTU after the REQ's max_cm_retries (the kernel reports UNREACHABLE)
  kDreqReceived,      // DREQ_RCVD: answer with SendDrep (the consumer's rdma_disconnect). After crossing DREQs
                      // (ours was out) the CM has already answered and the id is in TIMEWAIT: SendDrep gives EINVAL
  kDrepReceived,      // our DREQ was answered: TIMEWAIT
  kDreqTimeout,       // our DREQ went unanswered: TIMEWAIT (DISCONNECTED with -ETIMEDOUT)
  kTimewaitExit,      // TIMEWAIT over: the id is IDLE and may be destroyed
  kSidrReqReceived,   // passive: new id in SIDR_REQ_RCVD; `sidr_req` set. Answer with SendSidrRep or Drop
  kSidrRepReceived,   // active: `sidr_rep` set; the id is done
  kSidrReqTimeout,    // active: no SIDR_REP (UNREACHABLE)
};
const char* ToString(CmEventType t);

struct CmEvent {
  CmEventType type;
  uint32_t id = 0;
  uint32_t listen_id = 0;  // kReqReceived, kSidrReqReceived
  void* context = nullptr;
  wire::IpAddress peer;    // the address the message came from (its QP1)
  // The message that caused the event, when one did (the others are default).
  wire::CmReq req;
  wire::CmRep rep;
  wire::CmRej rej;
  wire::CmSidrReq sidr_req;
  wire::CmSidrRep sidr_rep;
};

class CmEventSink {
 public:
  virtual ~CmEventSink() = default;
  virtual void OnCmEvent(const CmEvent& event) = 0;
};

class GidTable;

struct CmConfig {
  uint64_t ca_guid = 0;          // our Local CA GUID (never 0)
  uint8_t target_ack_delay = 15;  // REP Target ACK Delay = the device's local_ca_ack_delay (as rxe)
  // The first local communication ID (IDs then increase, skipping 0 and those in use); 0 picks one from the clock
  // and ca_guid.
  uint32_t comm_id_seed = 0;
  // Non-zero: the IDs handed out are the counter XORed with a value drawn from it (the kernel's cm XORs its IDs with
  // a random operand), so that a peer that saw one ID cannot name the next (DeviceConfig::id_seed).
  uint64_t id_seed = 0;
  // Non-zero: comm IDs (and SIDR request IDs) carry it in their top byte, as the host's device service routes
  // replies by them (DeviceConfig::owner).
  uint8_t owner = 0;
  // The local address MADs leave from unless a connection has another: the device's GID 0.
  wire::IpAddress address;
  // The device's GID table (the Device's own; may be null: `address` alone). An active connection may leave from any
  // address in it (SendReq / SendSidrReq `local`), as the kernel's CM sends from the path's SGID.
  const GidTable* gids = nullptr;
};

// Counters for `uroce run --stats`.
struct CmCounters {
  uint64_t mads_sent = 0, mads_received = 0;
  uint64_t retransmits = 0;
  uint64_t duplicates = 0;        // duplicate REQ/REP/DREQ/SIDR_REQ answered again or ignored
  uint64_t dropped_malformed = 0;  // not a CM MAD we accept (ParseCmMad error), or wrong Q_Key / source QP
  uint64_t dropped_unmatched = 0;  // message for no connection of ours (stale, or after destroy)
  uint64_t rejected_no_listener = 0;
};

class ConnectionManager {
 public:
  ConnectionManager(CmConfig config, wire::Transport& transport, const wire::Clock& clock);
  virtual ~ConnectionManager();
  ConnectionManager(const ConnectionManager&) = delete;
  ConnectionManager& operator=(const ConnectionManager&) = delete;

  // Where events go (one sink per device: librdmacm). Without a sink, events are dropped. Returns once no other
  // thread is still handing an event to the previous sink.
  virtual void SetSink(CmEventSink* sink);

  // --- passive side --------------------------------------------------------------------------------------------
  // Starts answering REQs and SIDR_REQs for `service_id`; EADDRINUSE when someone already listens on it.
  virtual int Listen(uint64_t service_id, void* context, uint32_t* listen_id);
  // Stops listening and forgets the listen id (as Destroy does); connections it made live on.
  virtual int StopListening(uint32_t listen_id);
  // Accepts a REQ: the REP goes out now (the CM fills comm IDs, CA GUID and Target ACK Delay from CmConfig),
  // retransmitted every ms(REQ Local CM Response Timeout) up to the REQ's Max CM Retries until the RTU.
  virtual int SendRep(uint32_t id, const wire::CmRep& rep);
  // SIDR: answers the SIDR_REQ; the id is done.
  virtual int SendSidrRep(uint32_t id, const wire::CmSidrRep& rep);
  // A new id the consumer will not take (backlog full): forgotten silently, as if the REQ never arrived.
  virtual int Drop(uint32_t id);

  // --- active side ---------------------------------------------------------------------------------------------
  // Sends a REQ to `peer`'s QP1 (the CM fills local comm ID and CA GUID), retransmitted every
  // 2 x CmTimeoutMs(primary.local_ack_timeout - 1) + CmTimeoutMs(remote_cm_response_timeout) up to max_cm_retries
  // times (longer after an MRA).
  // The REQ and every later message of the connection leave from `local` (unspecified: CmConfig::address), which
  // must be one of the device's GIDs (else EADDRNOTAVAIL): the kernel's CM sends from the primary path's SGID.
  virtual int SendReq(const wire::IpAddress& peer, const wire::CmReq& req, void* context, uint32_t* id,
                      const wire::IpAddress& local = {});
  // Completes the handshake after a REP: RTU out, ESTABLISHED.
  virtual int SendRtu(uint32_t id, std::span<const uint8_t> private_data);
  // The CM fills the request ID (= the id); retransmitted every 4096 ms (ms(20), the kernel's
  // CMA_CM_RESPONSE_TIMEOUT) up to 15 times (CMA_MAX_CM_RETRIES), then kSidrReqTimeout.
  // From `local` as SendReq.
  virtual int SendSidrReq(const wire::IpAddress& peer, const wire::CmSidrReq& req, void* context, uint32_t* id,
                          const wire::IpAddress& local = {});

  // --- both ------------------------------------------------------------------------------------------------------
  // Rejects a received REQ (REQ_RCVD -> IDLE) or REP (REP_RCVD -> TIMEWAIT, then kTimewaitExit).
  virtual int SendRej(uint32_t id, uint16_t reason, std::span<const uint8_t> private_data);
  // ESTABLISHED -> DREQ_SENT (retransmitted; then kDrepReceived or kDreqTimeout).
  virtual int SendDreq(uint32_t id);
  // DREQ_RCVD -> TIMEWAIT (DREP out).
  virtual int SendDrep(uint32_t id);
  virtual int SetContext(uint32_t id, void* context);
  virtual CmState State(uint32_t id) const;  // kIdle for an unknown id
  // The consumer is done with the id (cm_destroy_id): REQ_SENT -> REJ "timeout" with our CA GUID as ARI;
  // REQ_RCVD/REP_SENT/MRA states -> REJ 28; ESTABLISHED -> DREQ (sent, not retransmitted for anyone); DREQ_RCVD ->
  // DREP; SIDR_REQ_RCVD -> SIDR_REP "reject". No event is delivered for the id afterwards: Destroy waits while
  // another thread is handing the sink an event for it (so never call it holding a lock the sink takes; from
  // inside the sink it does not wait). A listener id stops listening.
  virtual int Destroy(uint32_t id);
  virtual CmCounters counters() const;
  // The device at `peer` is gone without a word (its process died; only a device on this host can be known to be).
  // The kernel destroys a dying process's ids and its CM speaks for them; ours cannot, so the connections with
  // `peer` end as if those messages had arrived: ESTABLISHED → a DREQ (kDreqReceived), DREQ_SENT → a DREP
  // (kDrepReceived), REQ_SENT, REQ_RCVD and REP_SENT → a REJ (kRejReceived; PeerLeftLocked says which). Events are
  // delivered on the calling thread.
  virtual void OnPeerGone(const wire::IpAddress& peer);
  // The same for one process of a host device at `peer` (our own address, on the host device, or any other of its
  // GIDs, where it can be dialled too): the connections whose
  // remote comm ID carries its owner number in its top byte (wire/service_protocol.h). A REQ not yet answered has no
  // remote comm ID, and is left to its retries.
  void OnPeerProcessGone(const wire::IpAddress& peer, uint8_t owner);

  // --- from the Device ----------------------------------------------------------------------------------------
  // One packet for QP1 that passed the ICRC and P_Key checks: `qkey` and `src_qp` from its DETH, `mad` its payload,
  // `arrived_at` the local address it came to (unspecified: CmConfig::address). A connection a REQ or SIDR_REQ makes
  // answers from that address, as the kernel's CM answers from the GID a request came to (cm_init_av_for_response).
  void OnMad(const wire::IpAddress& peer, uint32_t qkey, uint32_t src_qp, std::span<const uint8_t> mad,
             const wire::IpAddress& arrived_at = {});
  // Retransmissions and time-wait ends due now; returns the next deadline (ns, the clock's), 0 when none.
  uint64_t RunTimers();

 private:
  struct Connection;
  struct Work;  // what one call sends and reports, handed over after the lock is released (Finish)

  // --- connections and timers (mu_ held) ---
  Connection* FindLocked(uint32_t id);  // nullptr for an unknown or destroyed id
  // The same, and nullptr unless the connection's peer is `peer`: a MAD acts only on a connection with its sender
  // (the kernel's CM knows a connection by its path; any process of a host can send a MAD naming a comm ID).
  Connection* FindFromLocked(uint32_t id, const wire::IpAddress& peer);
  // The connection a peer knows as (its CA GUID, its comm ID): how a duplicate REQ and a REJ "timeout" find theirs.
  Connection* FindByRemoteLocked(uint64_t remote_ca_guid, uint32_t remote_comm_id);
  Connection& AddLocked(CmState state, void* context);
  // A connection of ours that sends first (REQ, SIDR_REQ): its id (also stored in *id) and a new TID.
  Connection& AddActiveLocked(CmState state, const wire::IpAddress& local, const wire::IpAddress& peer,
                              void* context, uint32_t* id);
  // A connection a listener's REQ or SIDR_REQ made: the listener's context, the peer's ID and TID.
  Connection& AddPassiveLocked(CmState state, uint32_t listen_id, const wire::IpAddress& local,
                               const wire::IpAddress& peer, uint32_t remote_comm_id, uint64_t tid);
  // `local` for a new active connection (unspecified: CmConfig::address); nullopt when it is not one of ours.
  std::optional<wire::IpAddress> LocalAddressLocked(const wire::IpAddress& local) const;
  void RemoveLocked(uint32_t id);
  uint32_t NewCommIdLocked();
  uint64_t NewTidLocked(uint32_t id);
  // 0 disarms. Arming earlier than the deadline RunTimers last reported wakes the poller.
  void ArmLocked(Connection& c, uint64_t deadline_ns);
  void EnterTimewaitLocked(Connection& c);
  bool LeaveOnDestroyLocked(Connection& c, Work& w);  // Destroy's message to the peer; true: c stays (TIMEWAIT)
  // OnPeerGone's step: what the dead peer's kernel would have sent for c, handled as received.
  void PeerLeftLocked(const wire::IpAddress& peer, const Connection& c, Work& w);
  // OnPeerGone and OnPeerProcessGone: every live connection with `peer` (owner 0) or with its process `owner`.
  void EndConnectionsWith(const wire::IpAddress& peer, uint8_t owner);
  void ToIdleLocked(Connection& c);
  void OnTimerLocked(Connection& c, Work& w);
  // The event for `c` (id, listen id, context filled), or nullptr once the consumer destroyed it.
  CmEvent* EmitLocked(Connection& c, CmEventType type, Work& w);

  // --- sending (mu_ held; the packets leave in Finish) ---
  // Encodes `mad` for `peer`'s QP1, from our address `local`; `keep` remembers it as its connection's message to
  // retransmit.
  void SendLocked(const wire::IpAddress& local, const wire::IpAddress& peer, const wire::CmMad& mad, Work& w,
                  Connection* keep = nullptr);
  void SendBytesLocked(const wire::IpAddress& local, const wire::IpAddress& peer, std::span<const uint8_t> mad,
                       Work& w);
  // Sends `mad` for `c` and resends it every interval (+ an MRA's wait) up to its max retries.
  void SendRetransmittedLocked(Connection& c, const wire::CmMad& mad, Work& w);
  wire::CmMad DreqOf(Connection& c);  // a DREQ for `c`, with a new TID
  void SendRejLocked(Connection& c, uint16_t reason, wire::CmMessageRef rejected, std::span<const uint8_t> ari,
                     std::span<const uint8_t> private_data, Work& w);
  void SendMraLocked(Connection& c, Work& w);
  void SendDrepLocked(Connection& c, uint64_t tid, Work& w);

  // --- received messages (mu_ held) ---
  void HandleLocked(const wire::IpAddress& peer, uint64_t tid, const wire::CmReq& m, Work& w);
  void HandleLocked(const wire::IpAddress& peer, uint64_t tid, const wire::CmMra& m, Work& w);
  void HandleLocked(const wire::IpAddress& peer, uint64_t tid, const wire::CmRej& m, Work& w);
  void HandleLocked(const wire::IpAddress& peer, uint64_t tid, const wire::CmRep& m, Work& w);
  void HandleLocked(const wire::IpAddress& peer, uint64_t tid, const wire::CmRtu& m, Work& w);
  void HandleLocked(const wire::IpAddress& peer, uint64_t tid, const wire::CmDreq& m, Work& w);
  void HandleLocked(const wire::IpAddress& peer, uint64_t tid, const wire::CmDrep& m, Work& w);
  void HandleLocked(const wire::IpAddress& peer, uint64_t tid, const wire::CmSidrReq& m, Work& w);
  void HandleLocked(const wire::IpAddress& peer, uint64_t tid, const wire::CmSidrRep& m, Work& w);

  // Without mu_: sends what `w` holds, then delivers its events in order.
  void Finish(Work& w);
  // Runs body(Work&) under mu_, then Finish: its result, 0 or an errno (when nothing is sent).
  template <typename Body>
  int WithLock(Body body);
  // Waits (mu_ held through `lock`) until no other thread is delivering an event for `id` (0: for any id).
  void WaitForDeliveriesLocked(std::unique_lock<std::mutex>& lock, uint32_t id);

  // The implementation's state (connections by local comm ID, listeners by service ID, timers).
  CmConfig config_;
  wire::Transport& transport_;
  const wire::Clock& clock_;
  mutable std::mutex mu_;
  CmEventSink* sink_ = nullptr;
  CmCounters counters_;
  std::map<uint32_t, std::unique_ptr<Connection>> connections_;
  std::map<uint64_t, uint32_t> listeners_;  // service ID -> listen id
  std::set<std::pair<uint64_t, uint32_t>> timers_;  // (deadline ns, comm ID) of every armed connection
  uint32_t next_comm_id_ = 0;
  uint32_t gsi_psn_ = 0;
  uint32_t tid_high_ = 0;  // high half of the next new TID (the low half is the comm ID, as the kernel's)
  uint64_t poller_deadline_ = 0;  // the deadline RunTimers last reported; arming an earlier one wakes the poller
  // Events being handed to the sink right now, by thread: Destroy and SetSink wait for other threads' to finish.
  std::vector<std::pair<std::thread::id, uint32_t>> delivering_;
  std::condition_variable delivered_;
};

}  // namespace uroce::emu
