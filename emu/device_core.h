// What the transport objects of every QP (rc_requester.h, rc_completer.h, rc_responder.h, uc.h, ud.h) share: the
// device's configuration, clock and way out, the key table, the counters, the windows towards peers, completions and
// asynchronous events, and the lists the device's timer and held-ACK passes visit. The Device owns one DeviceCore;
// the core holds no QP, so it never demultiplexes.
//
// Locks. There is no device-wide lock on the data path: each QP has its own (QueuePair::mutex(), held while any of
// its transport objects runs), and what QPs share has a lock of its own here, taken for a short step and never while
// waiting for anything else. Order: the Device's object lock (shared on the data path) -> a QP's lock -> keys_mu ->
// paths_mu -> timers_mu or acks_mu -> a CQ's or an SRQ's own lock. A QP's lock is never taken with another QP's held.
// Counters are atomic (Count).
//
// Also the operations that every transport does alike: gathering a send's bytes from registered memory and
// scattering received ones into it, completing work requests, taking receive WQEs (from the QP or its SRQ), and
// moving a QP to the error state with its flush (IBTA 10.3.1).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "emu/completion_queue.h"
#include "emu/out_batch.h"
#include "emu/congestion.h"
#include "emu/connection_manager.h"
#include "emu/gid_table.h"
#include "emu/memory.h"
#include "emu/read_write_lock.h"
#include "emu/thread_annotations.h"
#include "emu/types.h"
#include "emu/work_request.h"
#include "wire/address.h"
#include "wire/clock.h"
#include "wire/direct_access.h"
#include "wire/packet.h"
#include "wire/transport.h"

namespace uroce::emu {

class QueuePair;
class SharedReceiveQueue;
struct InboundMessage;
struct OutBatch;

struct DeviceConfig {
  std::string name = "uroce0";
  wire::IpAddress address;  // the port's GID 0 (IPv4-mapped for IPv4)
  Mtu active_mtu = Mtu::k4096;
  uint64_t node_guid = 0;
  DeviceLimits limits;
  // IBTA C9-141: retry_cnt counts retries, so a dead peer fails the WR with RETRY_EXC_ERR after retry_cnt + 1
  // timeouts. Kernel rxe instead treats retry_cnt 7 as "forever"; true reproduces that (UROCE_RETRY_FOREVER=1).
  bool retry_cnt_7_infinite = false;
  // A requester that has heard nothing for a few round trips (RcRequester::kProbeRoundTrips times its path's smoothed
  // RTT, at least RcRequester::kMinProbeNs) goes back to its oldest unacknowledged packet at once instead of waiting
  // out the local ACK timeout (4.096 us x 2^timeout: 67 ms for perftest's 14). Resending is always safe in RC: the
  // responder acknowledges or answers a duplicate again and never executes it twice. This resend spends no retry, so
  // the timeout still decides when a dead peer fails the WR (RETRY_EXC_ERR after retry_cnt + 1 timeouts). What it
  // recovers fast: a lost sequence NAK (the responder NAKs a gap once and then drops what follows in silence) and a
  // lost last ACK or READ response. false: only the timeout, as rxe.
  bool early_retransmit = true;
  // Where this device's identifiers start: the first memory key index and its 8-bit key byte, the first QPN and the
  // CM's comm IDs (XORed with a value drawn from it, as the kernel's CM does). Hardware's key byte varies and its
  // numbers depend on what ran before; identical numbers on every run made a peer's keys and QPNs trivially guessed
  // (a spoofed WRITE needs the QPN, PSN, rkey and address). 0: the fixed start tests use (keys from index 1, QPN
  // 0x11). The engine draws it from the system's randomness.
  uint64_t id_seed = 0;
  // Non-zero: this device is one process's share of the host device (docs/ARCHITECTURE.md, "The host device"), and
  // the host's device service routes an arriving packet to its process by the number's top byte: QPNs and XRC SRQ
  // numbers are owner << 16 | n (24 bits), CM comm IDs owner << 24 | n (wire/service_protocol.h). 0: the device
  // owns its address alone and numbers freely.
  uint8_t owner = 0;
  // How many times slower than an ordinary machine this one runs (verbs_api/time_scale.h): how long an ACK is held
  // for a reply to carry it (RcResponder::kAckHoldNs, kAckCoalesceNs) stretches with it, since the reply takes that
  // much longer to come (in a TCG guest a held ACK left alone before the reply, and the peer, which then waited on
  // memory, needed its progress thread woken for the reply); so do the requester's probe floors (RcRequester::
  // kMinProbeNs, kInitialRttNs), which must stay above the hold (in the guest ib_write_lat went back early ~15 times
  // in 5,000 round trips).
  double time_scale = 1;
  // The decision trace: one line per decision of the protocol (which step of a request's or a response's way
  // decided what, what a timer did), for a developer following a packet's fate (UROCE_TRACE=1 prints it on stderr).
  // Empty: off, and nothing is formatted.
  std::function<void(std::string_view line)> trace;
  // Direct access (wire/direct_access.h): RDMA WRITE and READ towards another process of the host device carried out
  // in its memory without a packet, where its published table allows them; and where we publish ours. Null: every
  // operation is packets (the per-process device; captures, fault injection, UROCE_DIRECT=0).
  wire::DirectAccess* direct = nullptr;
  // The host's XRC SRQs shared by its processes (wire/direct_access.h): our XRC SRQs of domains opened by a file are
  // published there, and our target QPs deliver into other processes' of their domain. Null: a target reaches only
  // this device's SRQs (the per-process device).
  wire::SharedXrc* shared_xrc = nullptr;
  // Where our PDs and regions are offered to the host's other processes for import (wire/direct_access.h,
  // ExportedObjects). Null: nothing is (the per-process device).
  wire::ExportedObjects* exports = nullptr;
};

// "0x00abcd": a QPN or PSN as the trace and the counters print them.
std::string Hex24(uint32_t value);

// Values of enum ibv_event_type.
enum class AsyncEventType : uint8_t {
  kCqErr = 0,
  kQpFatal = 1,
  kQpReqErr = 2,
  kQpAccessErr = 3,
  kCommEst = 4,
  kSqDrained = 5,
  kPathMig = 6,
  kPathMigErr = 7,
  kDeviceFatal = 8,
  kPortActive = 9,
  kPortErr = 10,
  kLidChange = 11,
  kPkeyChange = 12,
  kSmChange = 13,
  kSrqErr = 14,
  kSrqLimitReached = 15,
  kQpLastWqeReached = 16,
  kClientReregister = 17,
  kGidChange = 18,
};

// What an async event is about (ibv_get_async_event(3): which member of its `element` names the object): a QP, a CQ,
// an SRQ, or nothing (port and device events).
enum class EventElement : uint8_t { kQp, kCq, kSrq, kPort };
inline EventElement ElementOf(AsyncEventType type) {
  switch (type) {
    case AsyncEventType::kCqErr:
      return EventElement::kCq;
    case AsyncEventType::kQpFatal:
    case AsyncEventType::kQpReqErr:
    case AsyncEventType::kQpAccessErr:
    case AsyncEventType::kCommEst:
    case AsyncEventType::kSqDrained:
    case AsyncEventType::kPathMig:
    case AsyncEventType::kPathMigErr:
    case AsyncEventType::kQpLastWqeReached:
      return EventElement::kQp;
    case AsyncEventType::kSrqErr:
    case AsyncEventType::kSrqLimitReached:
      return EventElement::kSrq;
    default:
      return EventElement::kPort;
  }
}

struct AsyncEvent {
  AsyncEventType type;
  QueuePair* qp = nullptr;
  CompletionQueue* cq = nullptr;
  uint8_t port = 0;
  SharedReceiveQueue* srq = nullptr;  // kSrqLimitReached, kSrqErr
};

// Why the device dropped or refused packets; `uroce stats` prints these.
struct DeviceCounters {
  uint64_t tx_packets = 0, tx_bytes = 0;
  uint64_t rx_packets = 0, rx_bytes = 0;
  uint64_t rx_malformed = 0;
  uint64_t rx_icrc_errors = 0;
  uint64_t rx_icrc_ip_id_inferred = 0;  // IPv4 ID unseen and not 0: ICRC checked with that ID solved for (16 bits)
  uint64_t rx_icrc_vouched = 0;  // ICRC not checked: sealed by a process of this host, unaltered (InDatagram)
  uint64_t rx_wrong_peer = 0;           // RC/UC/XRC packet from an address other than the QP's peer
  uint64_t rx_unknown_qp = 0;
  uint64_t rx_wrong_transport = 0;  // opcode's transport differs from the QP type
  uint64_t rx_bad_state = 0;        // QP not able to receive (RESET, INIT, ERR)
  uint64_t rx_bad_pkey = 0;
  uint64_t rx_bad_qkey = 0;
  uint64_t rx_no_receive_wqe = 0;   // UD/UC: dropped for want of a posted receive
  uint64_t rx_out_of_sequence = 0;  // past the expected PSN: RC NAKs the gap once (9.7.5.1.1), UC drops the message
  uint64_t rx_remote_access_denied = 0;
  uint64_t rx_length_errors = 0;  // RC/UC payload not PMTU-sized for its place in the message (MTUs disagree)
  uint64_t rx_cnp = 0;
  uint64_t tx_cnp = 0;                 // CNPs sent: this device's queue was filling with a peer's UC/UD datagrams
  uint64_t unreliable_sends_held = 0;  // UC/UD sends that waited for a pause a peer's CNP asked for
  uint64_t tx_errors = 0;
  uint64_t cq_overflows = 0;
  uint64_t rc_retransmit_timeouts = 0;  // local ACK timeouts that resent
  uint64_t rc_early_retransmits = 0;    // go-back-N before the timeout, spending no retry (early_retransmit)
  uint64_t rc_tail_probes = 0;          // the newest packet sent again alone first (RcRequester::SendTailProbe)
  uint64_t rc_duplicates = 0;           // duplicate requests answered again (or dropped)
  uint64_t rc_invalid_requests = 0;     // requests NAKed "invalid request": opcode, sequence, alignment, receive length
  uint64_t rc_unexpected_responses = 0;  // responses naming a PSN the requester never sent (dropped)
  uint64_t rc_rnr_naks_sent = 0;
  uint64_t rc_path_waits = 0;          // a requester stopped because the window towards its peer was full
  uint64_t rc_congestion_signals = 0;  // losses, timeouts and CNPs that cut a path's window
  uint64_t rc_direct_writes = 0;  // RDMA WRITEs carried out in another process's memory (DeviceConfig::direct)
  uint64_t rc_direct_reads = 0;   // RDMA READs likewise
  uint64_t rc_direct_sends = 0;   // SENDs put into another process's ring as direct SENDs
  uint64_t rc_direct_sends_received = 0;  // direct SENDs that took a receive WQE here
  uint64_t rc_direct_sends_dropped = 0;   // direct SENDs for a QP reset, destroyed or reopened since (or malformed)
  uint64_t xrc_pieces_handed = 0;    // message pieces our target QPs handed to another process's XRC SRQ
  uint64_t xrc_pieces_received = 0;  // pieces other processes' target QPs handed to ours
  uint64_t xrc_pieces_dropped = 0;   // pieces for an SRQ destroyed since, without a WQE, or malformed
  uint64_t xrc_targets_adopted = 0;  // other processes' XRC target QPs we held and run on since they exited
  CmCounters cm;  // the connection manager's, filled in by Device::counters()
};

// "name value" lines of every counter, for `uroce run --stats` (UROCE_STATS=1).
std::string FormatCounters(const DeviceCounters& c);


// What the host's other processes see of a shared XRC target QP (wire::SharedXrc::PublishXrcTarget): its attributes
// first (a handle's ibv_query_qp reads them), then what a process taking it over needs of its responder. Copied whole
// between processes, which run one build.
struct SharedTargetState {
  QpAttributes attributes;  // rq_psn: the next PSN it expects
  uint32_t msn = 0;
  // A SEND in progress into another process's SRQ (InboundMessage::kind and its relay), or a first packet's claim kept
  // for its retransmission (relay_srqn set, not in_message).
  bool in_message = false;
  // Published just before the piece at attributes.rq_psn was handed to another process: it may have arrived there.
  bool pending = false;
  uint32_t relay_srqn = 0;
  uint32_t relay_length = 0;
  uint64_t relay_index = 0;
  uint64_t offset = 0;
};

class DeviceCore {
 public:
  DeviceCore(DeviceConfig config, wire::Transport& transport, const wire::Clock& clock)
      : config(std::move(config)),
        transport(transport),
        clock(clock),
        keys_(this->config.id_seed, this->config.owner) {}
  DeviceCore(const DeviceCore&) = delete;
  DeviceCore& operator=(const DeviceCore&) = delete;

  const DeviceConfig config;
  wire::Transport& transport;
  const wire::Clock& clock;
  // The port's GID table: config.address at entry 0, the host's other addresses after it where the layer above adds
  // them (Device::UpdateGids).
  GidTable gids{config.address};
  static_assert(DeviceLimits{}.gid_table_len == GidTable::kEntries);
  // `av` with its source GID filled in (AddressVector::sgid) from the entry sgid_index names; nullopt when that entry
  // is empty, or when the destination GID is of the other IP family (no route joins an IPv4 source to an IPv6
  // destination: the kernel's resolution of such a RoCEv2 AV fails too, rdma_addr_find_l2_eth_by_grh).
  std::optional<AddressVector> Resolve(AddressVector av) const {
    const std::optional<wire::IpAddress> sgid = gids.At(av.sgid_index);
    if (!sgid) return std::nullopt;
    const wire::IpAddress dgid = wire::IpAddress::FromBytes(av.dgid.data());
    if (!dgid.is_unspecified() && dgid.is_v4() != sgid->is_v4()) return std::nullopt;
    av.sgid = sgid->bytes();
    return av;
  }
  // The local address packets of `av` leave from: its resolved source GID (entry 0 for one never resolved, as a QP
  // before RTR has none).
  wire::IpAddress SourceOf(const AddressVector& av) const {
    const wire::IpAddress sgid = wire::IpAddress::FromBytes(av.sgid.data());
    return sgid.is_unspecified() ? config.address : sgid;
  }
  // Set before the device is used (Device::set_async_handler takes the object lock exclusively); read by any thread.
  std::function<void(const AsyncEvent&)> async_handler;

  // Memory keys. The data path holds keys_mu() shared to check an access and to copy from or into what it names (so a
  // deregistration waits for the copy, IBTA 10.6.3.2: after it the region is no longer accessed); binding or
  // invalidating a window, registering and deregistering hold it exclusively.
  ReadWriteLock& keys_mu() const RETURN_CAPABILITY(keys_mu_) { return keys_mu_; }
  const KeyTable& keys() const REQUIRES_SHARED(keys_mu_) { return keys_; }
  KeyTable& mutable_keys() REQUIRES(keys_mu_) { return keys_; }

  // The windows towards peers (congestion.h), by peer address; every PathWindow in the map is read and changed with
  // paths_mu() held (an entry never moves: a reference stays valid after the lock is let go).
  Mutex& paths_mu() const RETURN_CAPABILITY(paths_mu_) { return paths_mu_; }
  std::map<wire::IpAddress, PathWindow>& paths() REQUIRES(paths_mu_) { return paths_; }
  const std::map<wire::IpAddress, PathWindow>& paths() const REQUIRES(paths_mu_) { return paths_; }

  // Unreliable senders and a receiver that cannot keep up. UC and UD do not retransmit, so a datagram a full socket
  // drops is a lost message, where a lossless RoCE fabric would have held the sender back instead (PFC). So a
  // receiver whose queue is filling (InDatagram::congestion_experienced) answers a peer's UC/UD datagrams with a CNP
  // (RoCEv2 A17.9: the notification point), at most one per kCnpIntervalNs for each peer, and the peer paces its
  // UC/UD sending towards it (PathWindow::OnUnreliableCnp): a send that may not leave yet waits in its QP
  // (QueuePair::held_sends) and leaves from RunTimers, in order, completing then.
  static constexpr uint64_t kCnpIntervalNs = 50'000;
  // Whether `wr`, a UC/UD send towards `peer`, must wait: its pace does not allow it yet, or earlier sends of the QP
  // wait. Then it is queued (*err 0), or refused when the send queue is full (*err ENOMEM). Takes paths_mu and
  // timers_mu.
  bool HoldUnreliableSend(QueuePair& qp, SendWr& wr, const wire::IpAddress& peer, int* err);
  // When the next unreliable message towards `peer` may leave (<= now: at once). Takes paths_mu.
  uint64_t UnreliableSendAt(const wire::IpAddress& peer);
  // An unreliable message of `bytes` left towards `peer`. Takes paths_mu.
  void ChargeUnreliable(const wire::IpAddress& peer, uint64_t bytes);
  // QPNs with held sends, visited by RunTimers.
  std::vector<uint32_t>& held_qps() REQUIRES(timers_mu_) { return held_qps_; }

  // Timers. QPNs of RC requesters with a retransmit or RNR timer armed: Device::RunTimers visits these, not every QP,
  // so a timer pass costs what is armed (thousands of idle QPs cost nothing). A QPN destroyed since is skipped. And
  // when the poller comes back on its own (0: never): the earlier of the deadline RunTimers last reported and the
  // caller's poller_returns_by_ns; arming an earlier timer wakes the poller (WakeForTimer).
  Mutex& timers_mu() const RETURN_CAPABILITY(timers_mu_) { return timers_mu_; }
  std::vector<uint32_t>& timed_qps() REQUIRES(timers_mu_) { return timed_qps_; }
  // QPNs whose receive flush waits for direct SENDs (DirectReceives::flush_waiting), visited by RunTimers. The
  // records are in the ring before they are counted, so they come within a look of the ring; a wait this long
  // (stretched by the time scale) means they never will.
  static constexpr uint64_t kDirectFlushWaitNs = 100'000'000;
  std::vector<uint32_t>& flush_waiting_qps() REQUIRES(timers_mu_) { return flush_waiting_qps_; }
  uint64_t& poller_deadline() REQUIRES(timers_mu_) { return poller_deadline_; }

  // Held ACKs (AckTiming::kHeld): the QPs holding one and when each must leave (a QP reset or destroyed since no
  // longer holds and is skipped), and the earliest of those times (0: none), read without the lock.
  struct HeldAck {
    uint32_t qpn;
    uint64_t due_ns;
  };
  Mutex& acks_mu() const RETURN_CAPABILITY(acks_mu_) { return acks_mu_; }
  std::vector<HeldAck>& acks_held() REQUIRES(acks_mu_) { return acks_held_; }
  std::atomic<uint64_t> next_held_ack_due_ns{0};
  // A responder holds an ACK due at `due_ns`, or its held ACK's time moved earlier.
  void NoteAckHeld(uint32_t qpn, uint64_t due_ns);
  // A responder's held ACK left or was dropped.
  void ForgetAckHeld(uint32_t qpn);

  // The decision trace (DeviceConfig::trace): build a line only when tracing() says it is on. Each line goes out
  // after this device's address.
  bool tracing() const { return static_cast<bool>(config.trace); }
  void Trace(std::string_view line) const;

  // Counters: any thread adds; a reader gets each field whole (Counters).
  void Count(uint64_t DeviceCounters::*field, uint64_t n = 1) {
    std::atomic_ref<uint64_t>(counters_.*field).fetch_add(n, std::memory_order_relaxed);
  }
  DeviceCounters Counters() const;

  uint64_t Now() const { return clock.NowNs(); }
  // Hands an event to the verbs layer; one of a shared XRC target QP also to the other processes holding it.
  void Raise(const AsyncEvent& e);
  // Stamps and queues a completion; an overflow is counted and raises IBV_EVENT_CQ_ERR. No-op without a CQ (an XRC
  // QP has none for the direction it does not have).
  void Complete(CompletionQueue* cq, const Completion& c);
  // The shared window towards `qp`'s peer (congestion.h); with paths_mu held.
  PathWindow& PathOfLocked(const QueuePair& qp) REQUIRES(paths_mu_);
  // A timer was armed for `deadline`: the progress thread may be blocked until later, wake it. Takes timers_mu.
  void WakeForTimer(uint64_t deadline);
  // QP `qpn` has a timer armed: RunTimers visits it. Takes timers_mu.
  void ListTimed(uint32_t qpn);

  // --- the way out --------------------------------------------------------------------------------------------------
  struct SendResult {
    size_t sent, failed;
    uint64_t bytes;
  };
  SendResult SendBatch(const OutBatch& out);  // hands `out` to the transport; touches no other state
  void CountSent(const SendResult& r);
  // Sends what `out` holds now, with a QP's lock held (only where a batch must not grow without bound: long READ
  // answers), and empties it.
  void TransmitNow(OutBatch& out);

  // --- memory -------------------------------------------------------------------------------------------------------
  // Gathers a send WR's bytes into `out`; a status other than kSuccess when an SGE is refused (UD, UC). Takes keys_mu.
  WcStatus Gather(const QueuePair& qp, const SendWr& wr, std::vector<uint8_t>& out);
  // Where message bytes [offset, offset+len) of a send WR are: the pieces of registered memory (or inline data) that
  // hold them, in order, valid while keys_mu is held (the caller holds it shared); false if an SGE is refused (RC: no
  // copy before the packet). An imported region's bytes are copied into a buffer of the calling thread first, valid
  // until its next call.
  bool GatherRange(const QueuePair& qp, const SendWr& wr, uint64_t offset, uint64_t len,
                   std::vector<std::span<const uint8_t>>& pieces) REQUIRES_SHARED(keys_mu_);
  // Where the first `len` bytes received into the scatter list `sg_list` go (local write access needed), in order,
  // valid while keys_mu is held (the caller holds it shared); false if an SGE is refused or the list is shorter, or
  // names an imported region (another process's memory: the caller receives as packets instead).
  bool ScatterRange(const QueuePair& qp, std::span<const Sge> sg_list, uint64_t len,
                    std::vector<std::span<uint8_t>>& pieces) REQUIRES_SHARED(keys_mu_);
  // Places `data` at byte `offset` of the scatter list (local write access needed): kSuccess, kLocLenErr or
  // kLocProtErr. Takes keys_mu.
  WcStatus Scatter(const QueuePair& qp, std::span<const Sge> sg_list, uint64_t offset, std::span<const uint8_t> data);
  // The same with the keys of protection domain `pd` (an XRC SRQ's).
  WcStatus Scatter(const ProtectionDomain* pd, std::span<const Sge> sg_list, uint64_t offset,
                   std::span<const uint8_t> data);
  // Places `payload`, the next bytes of the RDMA WRITE `m`, where its key names, checked against the key table now
  // (IBTA 10.6.3.2: a deregistered region is no longer accessible); false when the access is no longer allowed or the
  // memory could not be written. The caller holds keys_mu shared.
  bool WriteInbound(const QueuePair& qp, const InboundMessage& m, std::span<const uint8_t> payload)
      REQUIRES_SHARED(keys_mu_);
  // Whether the QP's peer may access [va, va+len) through `rkey` with `access` (IBTA 10.6.3.2: key, PD, bounds, rights,
  // a window's QP), checked now; for a check that copies nothing. Takes keys_mu.
  bool MayAccessRemote(const QueuePair& qp, uint32_t rkey, uint64_t va, uint64_t len, uint32_t access);
  // Executes a local operation of the send queue (BIND_MW, LOCAL_INV): kSuccess or kMwBindErr / kLocQpOpErr. Takes
  // keys_mu exclusively.
  WcStatus ExecuteLocalOp(const QueuePair& qp, const SendWr& wr);

  // --- completions --------------------------------------------------------------------------------------------------
  static Completion SendCompletion(const QueuePair& qp, const SendWr& wr, WcStatus status);
  // Completes a send WR on the QP's send CQ: a successful unsignaled one silently (IBTA 10.7.2.1).
  void CompleteSend(QueuePair& qp, const SendWr& wr, WcStatus status);
  // A receive WQE completed in error (flushed, or its message failed): no data, just the status.
  static Completion ReceiveError(const QueuePair& qp, uint64_t wr_id, WcStatus status);
  static Completion ReceiveError(uint32_t qp_num, uint64_t wr_id, WcStatus status);  // also without the QP
  // The receive completion of a message ending with packet `last` (UC and RC responders): byte count, source QP,
  // solicited bit, immediate data or invalidated R_Key. The caller sets wr_id and opcode.
  static Completion MessageCompletion(const QueuePair& qp, uint64_t byte_len, const wire::PacketView& last);
  // The same from its parts: the solicited bit, the immediate data (as the IMMDt carries it) if any. A direct SEND's.
  static Completion MessageCompletion(const QueuePair& qp, uint64_t byte_len, bool solicited,
                                      std::optional<uint32_t> imm);
  // ... and by numbers: the QP that received it and its peer (an XRC target of another process's, whose message our
  // SRQ completes).
  static Completion MessageCompletion(uint32_t qp_num, uint32_t src_qp, uint64_t byte_len, bool solicited,
                                      std::optional<uint32_t> imm);

  // --- the receive queue (the QP's own or its SRQ, srq.h) ------------------------------------------------------------
  bool HasReceiveWqe(QueuePair& qp);
  // The next receive WQE (nullopt: none, or another QP took the SRQ's last one); the SRQ's limit event is raised here.
  std::optional<RecvWr> TakeReceiveWqe(QueuePair& qp);
  // A receive WQE whose completion was just queued: kept if it came from the QP's SRQ (QueuePair::srq_completed).
  void KeepSrqWqe(QueuePair& qp, RecvWr&& wr);
  // A shared XRC SRQ's window moves on (SharedReceiveQueue::ShowWindow): after a post, a claim, a take.
  void ShowSharedWqes(SharedReceiveQueue& srq);
  // The message `qp` (an XRC target) was handing to another process's SRQ is abandoned there: the WQE it claimed
  // completes with `status` in that process (wire::XrcDelivery::abort); the QP's inbound message is cleared.
  void AbandonHandedMessage(QueuePair& qp, WcStatus status);

  // --- the error state ---------------------------------------------------------------------------------------------
  // The QP enters the error state and its outstanding work completes flushed (IBTA 10.3.1, 11.6.2).
  void EnterError(QueuePair& qp);
  // The flush alone (ModifyQp to ERR): receive WQEs, the message being received, send WQEs not completed. The
  // receive side waits for the direct SENDs counted into the QP's window (DirectReceives::flush_waiting).
  void Flush(QueuePair& qp);
  // The receive side's flush: the message being received, then the receive queue.
  void FlushReceiveQueue(QueuePair& qp);

  // --- direct access (DeviceConfig::direct) -------------------------------------------------------------------------
  // Publishes what the other processes of the host may do through an RC QP (its state, peer, PD and remote rights) or
  // withdraws it when it may no longer respond (RESET, INIT, ERR, destroyed: `gone`); returns once no other process
  // copies through it any more. With the QP's lock held, after every change of its state or attributes.
  // An RC QP with a receive queue of its own also opens its receive window there (PublishReceives) when it first may
  // respond, and closes it at RESET and when destroyed (not in the error state: see Flush).
  // An XRC target QP that other processes may open (SharesTarget) has its attributes published instead, for their
  // handles' ibv_query_qp (withdrawn when `gone`).
  void PublishDirect(QueuePair& qp, bool gone = false);
  // Whether the host's other processes may open `qp` (ibv_open_qp(3)): an XRC target QP of a domain opened by a file,
  // on the host device.
  bool SharesTarget(const QueuePair& qp) const;
  // Publishes such a QP's state (SharedTargetState) for a process that may take it over: after every request it
  // executes (Device::ReceiveXrcTargetLocked), and `pending` just before it hands a piece at its rq_psn to another
  // process (RcResponder::HandSend); `holders` (null: none) hold it from its first publication on (a QP taken over
  // keeps its holders). With the QP's lock held.
  void PublishTargetState(QueuePair& qp, bool pending, const uint64_t* holders = nullptr);
  // Shows the QP's receive queue as it is now in its window: the lengths of WQEs not yet shown, how many WQEs
  // messages that came as packets have taken. With the QP's lock held, after every post and take.
  void PublishReceives(QueuePair& qp);
  // Likewise for a memory region: published for direct access when it grants remote access, and exported for import
  // (an implicit ODP region and one imported from another process are neither); withdrawn from both before it
  // changes or goes (returns once no other process copies through it).
  void PublishRegion(const MemoryRegion& mr);
  void WithdrawRegion(const MemoryRegion& mr);
  // UD/UC: the WR completes with `status` and the send queue enters SQE (IBTA 10.3.1.5); receives go on.
  void FailUnreliableSend(QueuePair& qp, const SendWr& wr, WcStatus status);

 private:
  // The locks of what the transport objects of all QPs share, and what each guards (the accessors above). Order:
  // keys_mu_ -> paths_mu_ -> timers_mu_ or acks_mu_ (file comment).
  std::atomic<uint32_t> direct_epochs_{0};  // receive windows opened (DirectReceives::epoch)
  mutable ReadWriteLock keys_mu_;
  KeyTable keys_ GUARDED_BY(keys_mu_);
  mutable Mutex paths_mu_;
  std::map<wire::IpAddress, PathWindow> paths_ GUARDED_BY(paths_mu_);
  mutable Mutex timers_mu_;
  std::vector<uint32_t> held_qps_ GUARDED_BY(timers_mu_);
  std::vector<uint32_t> timed_qps_ GUARDED_BY(timers_mu_);
  std::vector<uint32_t> flush_waiting_qps_ GUARDED_BY(timers_mu_);
  uint64_t poller_deadline_ GUARDED_BY(timers_mu_) = 0;
  mutable Mutex acks_mu_;
  std::vector<HeldAck> acks_held_ GUARDED_BY(acks_mu_);
  DeviceCounters counters_;  // every field changed atomically (Count)
};

}  // namespace uroce::emu
