// The emulated HCA. One Device is one RoCEv2 port with one GID (its IP address): it owns every verbs object (PDs,
// MRs, CQs, QPs, AHs), runs the transport protocols — requester for work requests going out, responder for requests
// coming in — and reports through completions and asynchronous events.
//
// Pure C++: packets go out through a wire::Transport and come in through OnDatagram(); time comes from a wire::Clock.
// It does not know sockets, threads or libibverbs structs, so tests drive it on a SimNetwork with a ManualClock.
//
// Thread-safety: every public method may be called from any thread. One mutex guards the protocol state; CQs have
// their own (completion_queue.h). Callbacks (async events, CQ notifiers) run with the device lock held and must not
// call back into the Device.
//
// Errors follow the verbs convention: 0 or a positive errno value (EINVAL, ENOMEM, EBUSY, EOPNOTSUPP, ...).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <unordered_map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "emu/completion_queue.h"
#include "emu/congestion.h"
#include "emu/connection_manager.h"
#include "emu/memory.h"
#include "emu/queue_pair.h"
#include "emu/srq.h"
#include "emu/types.h"
#include "emu/work_request.h"
#include "wire/address.h"
#include "wire/clock.h"
#include "wire/packet.h"
#include "wire/transport.h"

namespace uroce::emu {

struct DeviceConfig {
  std::string name = "uroce0";
  wire::IpAddress address;  // the port's GID 0 (IPv4-mapped for IPv4)
  Mtu active_mtu = Mtu::k4096;
  uint64_t node_guid = 0;
  DeviceLimits limits;
  // IBTA C9-141: retry_cnt counts retries, so a dead peer fails the WR with RETRY_EXC_ERR after retry_cnt + 1
  // timeouts. Kernel rxe instead treats retry_cnt 7 as "forever"; true reproduces that (UROCE_RETRY_FOREVER=1).
  bool retry_cnt_7_infinite = false;
  // A requester that has heard nothing for a few round trips (Device::kProbeRoundTrips times its path's smoothed RTT,
  // at least Device::kMinProbeNs) goes back to its oldest unacknowledged packet at once instead of waiting out the local
  // ACK timeout (4.096 us x 2^timeout: 67 ms for perftest's 14). Resending is always safe in RC: the responder
  // acknowledges or answers a duplicate again and never executes it twice. This resend spends no retry, so the
  // timeout still decides when a dead peer fails the WR (RETRY_EXC_ERR after retry_cnt + 1 timeouts). What it
  // recovers fast: a lost sequence NAK (the responder NAKs a gap once and then drops what follows in silence) and a
  // lost last ACK or READ response. false: only the timeout, as rxe.
  bool early_retransmit = true;
};

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
  uint64_t rx_wrong_peer = 0;           // RC/UC/XRC packet from an address other than the QP's peer
  uint64_t rx_unknown_qp = 0;
  uint64_t rx_wrong_transport = 0;  // opcode's transport differs from the QP type
  uint64_t rx_bad_state = 0;        // QP not able to receive (RESET, INIT, ERR)
  uint64_t rx_bad_pkey = 0;
  uint64_t rx_bad_qkey = 0;
  uint64_t rx_no_receive_wqe = 0;   // UD/UC: dropped for want of a posted receive
  uint64_t rx_out_of_sequence = 0;  // UC: PSN gap, message dropped (IBTA 9.7.6.1.3)
  uint64_t rx_remote_access_denied = 0;
  uint64_t rx_cnp = 0;
  uint64_t tx_errors = 0;
  uint64_t cq_overflows = 0;
  uint64_t rc_retransmit_timeouts = 0;  // local ACK timeouts that resent
  uint64_t rc_early_retransmits = 0;    // go-back-N before the timeout, spending no retry (early_retransmit)
  uint64_t rc_duplicates = 0;           // duplicate requests answered again (or dropped)
  uint64_t rc_rnr_naks_sent = 0;
  uint64_t rc_path_waits = 0;          // a requester stopped because the window towards its peer was full
  uint64_t rc_congestion_signals = 0;  // losses, timeouts and CNPs that cut a path's window
  CmCounters cm;  // the connection manager's, filled in by Device::counters()
};

// "name value" lines of every counter, for `uroce run --stats` (UROCE_STATS=1).
std::string FormatCounters(const DeviceCounters& c);

struct OutBatch;

class Device {
 public:
  Device(DeviceConfig config, wire::Transport& transport, const wire::Clock& clock);
  ~Device();
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  const DeviceConfig& config() const { return config_; }
  DeviceCounters counters() const;
  // The shared window of the RC requesters towards `peer` (emu/congestion.h), if any has talked to it.
  std::optional<PathWindow> path_window(const wire::IpAddress& peer) const;
  void set_async_handler(std::function<void(const AsyncEvent&)> handler);
  // The IB CM of this port (QP1's MADs go to it; its timers run in RunTimers).
  ConnectionManager& connection_manager() { return cm_; }

  // --- objects ------------------------------------------------------------------------------------------------
  ProtectionDomain* AllocPd();
  int DeallocPd(ProtectionDomain* pd);  // EBUSY while MRs, QPs or AHs use it

  // Registers [host, host+length) visible at `iova`. Fills `out` (keys included). EINVAL on bad flags (remote write or
  // atomic without local write, IBTA 10.6.3.1 C10-??), ENOMEM past max_mr.
  int RegisterMr(ProtectionDomain* pd, void* host, uint64_t length, uint64_t iova, uint32_t access,
                 MemoryRegion* out);
  int ReregisterMr(uint32_t lkey, ProtectionDomain* pd, void* host, uint64_t length, uint64_t iova, uint32_t access,
                   MemoryRegion* out);
  int DeregisterMr(uint32_t lkey);
  int QueryMr(uint32_t lkey, MemoryRegion* out) const;  // EINVAL for an unknown key
  // The PD or MR a handle names, for ibv_import_pd(3) / ibv_import_mr(3): nullptr / EINVAL when none does.
  ProtectionDomain* FindPd(uint32_t handle);
  int QueryMrByHandle(uint32_t handle, MemoryRegion* out) const;

  // Memory windows (IBTA 10.6.7): type 1 or 2. Fills *rkey. Binding goes through PostSend (SendOpcode::kBindMw).
  int AllocMw(ProtectionDomain* pd, uint8_t type, uint32_t* rkey);
  int DeallocMw(uint32_t rkey);

  int CreateCq(uint32_t capacity, CompletionQueue** out);
  int ResizeCq(CompletionQueue* cq, uint32_t capacity);
  int DestroyCq(CompletionQueue* cq);  // EBUSY while a QP uses it

  int CreateAh(ProtectionDomain* pd, const AddressVector& av, AddressHandle** out);
  int DestroyAh(AddressHandle* ah);

  // Creates a QP in RESET. `init.cap` is updated to what the QP really has (at least what was asked).
  int CreateQp(QpInitAttributes& init, QueuePair** out);
  int ModifyQp(QueuePair* qp, const QpAttributes& attr, uint32_t mask);
  int QueryQp(QueuePair* qp, QpAttributes* attr);
  // Drops one handle on the QP (an XRC target opened by OpenQp has several); the QP goes with the last.
  int DestroyQp(QueuePair* qp);

  // --- shared receive queues and XRC (srq.h; IBTA Annex A14) ---------------------------------------------------
  // Creates an SRQ: basic (pd required) or XRC (pd, xrcd and cq required). `attr` is updated to what it really has.
  // EINVAL for a missing object or max_wr/max_sge of 0 or above the device limits, ENOMEM past max_srq.
  int CreateSrq(SrqType type, ProtectionDomain* pd, XrcDomain* xrcd, CompletionQueue* cq, SrqAttributes& attr,
                SharedReceiveQueue** out);
  int ModifySrq(SharedReceiveQueue* srq, const SrqAttributes& attr, uint32_t mask);
  int QuerySrq(SharedReceiveQueue* srq, SrqAttributes* attr);
  int DestroySrq(SharedReceiveQueue* srq);  // EBUSY while a QP uses it
  int PostSrqRecv(SharedReceiveQueue* srq, RecvWr&& wr);
  // Opens the domain of `inode` (a new one when none exists and `create`; EAGAIN when none exists without it; EINVAL
  // when one exists and `exclusive`), or a new private domain when `inode` is nullopt (ibv_open_xrcd(3)).
  int OpenXrcd(std::optional<uint64_t> inode, bool create, bool exclusive, XrcDomain** out);
  int CloseXrcd(XrcDomain* xrcd);  // EBUSY while SRQs or target QPs of this open use it and it is the last
  // ibv_open_qp(3): another handle on the XRC target QP `qpn` of `xrcd`; EINVAL when there is none of that type.
  int OpenQp(XrcDomain* xrcd, uint32_t qpn, QpType type, QueuePair** out);
  void SetQpOwner(QueuePair* qp, void* owner);

  // --- multicast (IBTA 10.5, ibv_attach_mcast(3)) ---------------------------------------------------------------
  // A UD QP joins the group of multicast GID `group` (an IPv4-mapped 224.0.0.0/4 or an ff00::/8 address): a UD
  // packet to QPN 0xFFFFFF addressed to the group is delivered to every QP attached to it. EINVAL for another QP
  // type, a GID that is not multicast, or (detach) a QP that is not attached. The network side (receiving the group's
  // datagrams) is the caller's: this only keeps the attachments.
  int AttachMulticast(QueuePair* qp, const wire::IpAddress& group);
  int DetachMulticast(QueuePair* qp, const wire::IpAddress& group);

  // --- data path ----------------------------------------------------------------------------------------------
  // Posts one work request; a post-time error (bad state, too many SGEs, queue full) is returned and nothing is
  // queued. Errors found while executing (bad lkey, message too long) complete the WR with an error status.
  int PostSend(QueuePair* qp, SendWr&& wr);
  int PostRecv(QueuePair* qp, RecvWr&& wr);

  // --- network ------------------------------------------------------------------------------------------------
  // When the RC responder sends the ACK a request asked for (AckReq).
  enum class AckTiming {
    kNow,  // before OnDatagram returns
    // Held until the QP's requester sends (the ACK follows its packets), another ACK, NAK or response of the QP
    // covers or precedes it, SendHeldAcks, or its time is up (kAckHoldNs, kAckCoalesceNs). For a thread whose
    // application may answer at once: a ping-pong's reply then leaves before the ACK of the request it answers, so
    // the peer, polling for that ACK, finds the reply already placed (ib_write_lat, ib_send_lat), and one syscall
    // carries both. ACKs a QP owes meanwhile leave as one (coalesced, IBTA 9.7.5.1.2).
    kHeld,
  };
  // How long the ACK of a one-packet message may wait for a reply to take it along.
  static constexpr uint64_t kAckHoldNs = 20'000;
  // How long the ACK of a longer message, or of a QP whose ACKs are already held, may wait: a stream's requester
  // must see its window move (ib_write_bw 64 KiB lost a third of its rate with 20 us here).
  static constexpr uint64_t kAckCoalesceNs = 3'000;
  // Early retransmission (DeviceConfig::early_retransmit) waits kProbeRoundTrips smoothed round trips of the path
  // without an ACK, or RFC 6298's srtt + 4 rttvar if longer, at least kMinProbeNs (above kAckHoldNs with room),
  // assuming kInitialRttNs before the first sample; the wait doubles after each early retransmission until the
  // timeout. One estimate per path, not per QP: 256 QPs that each timed their own packets (behind the others' whole
  // window) and waited four of their round trips went back early ~1200 times in 5120 messages without a loss.
  static constexpr uint64_t kProbeRoundTrips = 4;
  static constexpr uint64_t kMinProbeNs = 200'000;
  static constexpr uint64_t kInitialRttNs = 250'000;
  // Processes one received datagram (a CM MAD for QP1 goes to the connection manager once the device lock is free).
  void OnDatagram(const wire::InDatagram& datagram, AckTiming acks = AckTiming::kNow);
  // Sends the held ACKs (AckTiming::kHeld) due by `due_by_ns`, all of them by default. Cheap when none is due.
  void SendHeldAcks(uint64_t due_by_ns = UINT64_MAX);
  // Runs expired timers, the connection manager's too; returns the next deadline, or 0 when none is pending.
  // `poller_returns_by_ns` (0: never) is when the caller will call again even if no timer is due: a timer armed for
  // later than that does not wake the poller through Transport::Wake, which keeps wake-ups off the data path (every
  // RC message arms a retransmit timer that its ACK disarms).
  uint64_t RunTimers(uint64_t poller_returns_by_ns = 0);

 private:
  QueuePair* FindQpLocked(uint32_t qpn);
  void CompleteLocked(CompletionQueue* cq, const Completion& c);
  void RaiseLocked(const AsyncEvent& e);
  void EnterErrorLocked(QueuePair* qp);
  // Where the next `len` bytes of the RDMA WRITE `m` go, checked against the key table now (IBTA 10.6.3.2: a
  // deregistered region is no longer accessible); nullptr when the access is no longer allowed.
  uint8_t* WriteTargetLocked(const QueuePair& qp, const InboundMessage& m, size_t len);
  void FlushLocked(QueuePair* qp);
  Completion SendCompletion(const QueuePair& qp, const SendWr& wr, WcStatus status) const;
  void CompleteSendLocked(QueuePair* qp, const SendWr& wr, WcStatus status);
  // A receive WQE completed in error (flushed, or its message failed): no data, just the status.
  Completion ReceiveError(const QueuePair& qp, uint64_t wr_id, WcStatus status) const;
  // UD/UC: the WR completes with `status` and the send queue enters SQE.
  void FailUnreliableSendLocked(QueuePair* qp, const SendWr& wr, WcStatus status);
  // The receive completion of a message ending with packet `last` (UC and RC responders): byte count, source QP,
  // solicited bit, immediate data or invalidated R_Key. The caller sets wr_id and opcode.
  Completion MessageCompletion(const QueuePair& qp, uint64_t byte_len, const wire::PacketView& last) const;
  // Gathers a send WR's bytes; returns a status other than kSuccess when an SGE is refused.
  WcStatus GatherLocked(const QueuePair& qp, const SendWr& wr, std::vector<uint8_t>& out);
  // Places `data` at byte `offset` of the scatter list (local write access needed). Returns kSuccess, kLocLenErr or
  // kLocProtErr.
  WcStatus ScatterLocked(const QueuePair& qp, std::span<const Sge> sg_list, uint64_t offset,
                         std::span<const uint8_t> data);
  int PostSendUdLocked(QueuePair* qp, SendWr& wr, OutBatch& out);
  int PostSendUcLocked(QueuePair* qp, SendWr& wr, OutBatch& out);
  int ModifyQpLocked(QueuePair* qp, const QpAttributes& attr, uint32_t mask);
  // A datagram for QP1, kept for the connection manager: handed over after the device lock is released.
  struct GsiMad {
    wire::IpAddress peer;
    uint32_t qkey = 0, src_qp = 0;
    std::vector<uint8_t> mad;
  };
  void OnDatagramLocked(const wire::InDatagram& d, OutBatch& out, std::optional<GsiMad>& gsi);
  void ReceiveUdLocked(QueuePair* qp, const wire::InDatagram& d, const wire::PacketView& p);
  void ReceiveUcLocked(QueuePair* qp, const wire::PacketView& p);
  void Transmit(OutBatch& out);
  // Sends what `out` holds now, with the device lock held (only where a batch must not grow without bound), and
  // empties it.
  void TransmitLocked(OutBatch& out);
  struct SendResult {
    size_t sent, failed;
    uint64_t bytes;
  };
  SendResult SendBatch(const OutBatch& out);  // hands `out` to the transport; touches no device state
  void CountSentLocked(const SendResult& r);
  // The receive side of a QP with or without an SRQ (srq.h): whether a receive WQE is available, the next one (the
  // SRQ's limit event is raised here), and the CQ its completion goes to.
  // CreateQp's SRQ/XRC rules (ibv_create_qp(3) NOTES, Annex A14): 0 or EINVAL; clears what such a QP ignores.
  static int CheckSharedReceiveInit(QpInitAttributes& init);
  // With the lock: the SRQ and domain named by `init` exist; takes a use of each (released by DestroyQp).
  int AttachSharedReceiveLocked(const QpInitAttributes& init);
  void DetachSharedReceiveLocked(const QpInitAttributes& init);
  bool HasReceiveWqeLocked(QueuePair* qp);
  std::optional<RecvWr> TakeReceiveWqeLocked(QueuePair* qp);
  // XRC target: checks the XRCETH's SRQ and runs the RC responder with that SRQ's PD, CQ and WQEs.
  void ReceiveXrcTargetLocked(QueuePair* qp, const wire::PacketView& p, OutBatch& out);
  // RC opcode -> the same operation on the QP's transport (XRC QPs use 0xA0 | the RC low 5 bits, Annex A14); an XRC
  // initiator's requests also carry the XRCETH naming the target SRQ.
  static void ToQpTransport(const QueuePair& qp, const SendWr* wr, wire::PacketSpec& spec);
  // Executes a local operation of the send queue (BIND_MW, LOCAL_INV): kSuccess or kMwBindErr / kLocQpOpErr.
  WcStatus ExecuteLocalOpLocked(QueuePair* qp, const SendWr& wr);

  // --- Reliable Connection (rc.cc): requester, responder, completer, timers ---
  int PostSendRcLocked(QueuePair* qp, SendWr& wr, OutBatch& out);
  void RcProgressLocked(QueuePair* qp, OutBatch& out);
  // The shared window towards `qp`'s peer (emu/congestion.h); RcChargeLocked brings the path's count of packets in
  // flight up to date with the QP's (none unless it can send); RcWakeWaitersLocked resumes requesters that stopped
  // for the window while it has room.
  PathWindow& PathOf(const QueuePair& qp);
  void RcChargeLocked(QueuePair* qp);
  void RcChargeLocked(QueuePair* qp, PathWindow& path);  // `path` is PathOf(*qp), already looked up (the data path)
  void RcWakeWaitersLocked(PathWindow& path, OutBatch& out);
  // A READ request for `w`'s response packets from `from_pkt` to the end of that segment.
  void RcSendReadRequestLocked(QueuePair* qp, SendWqe& w, uint32_t from_pkt, OutBatch& out);
  // After a lost READ response: asks again from the first missing one, once per gap, and cuts the path's window.
  void RcRerequestReadLocked(QueuePair* qp, SendWqe& w, OutBatch& out);
  void RcCongestionLocked(QueuePair* qp);  // a loss seen by `qp`'s requester: the path's window is cut
  void ReceiveRcLocked(QueuePair* qp, const wire::PacketView& p, OutBatch& out);
  void RcResponderLocked(QueuePair* qp, const wire::PacketView& p, OutBatch& out);
  void RcCompleterLocked(QueuePair* qp, const wire::PacketView& p, OutBatch& out);
  void RcTimersLocked(QueuePair* qp, uint64_t now, OutBatch& out);
  uint64_t RcNextDeadline(QueuePair* qp) const;
  void RcCompleteInOrderLocked(QueuePair* qp);
  void RcFailLocked(QueuePair* qp, size_t wqe_index, WcStatus status);
  // Sends an ACK or NAK now; it covers an ACK the QP holds, which is dropped.
  void RcSendAck(QueuePair* qp, uint32_t psn, const wire::Aeth& aeth, OutBatch& out);
  // The ACK for requests up to `psn`, of a message of one packet or not: sent now or held, as ack_timing_ says.
  void RcAcknowledgeLocked(QueuePair* qp, uint32_t psn, bool one_packet, OutBatch& out);
  // Sends the ACK `qp` holds, if any (drops it in the error state).
  void RcSendHeldAckLocked(QueuePair* qp, OutBatch& out);
  // `qp` holds no ACK any more (sent, covered, or not to be sent).
  void RcDropHeldAckLocked(QueuePair* qp);
  // Sends the held ACKs due by `due_by_ns`; keeps next_held_ack_due_ns_ current.
  void SendHeldAcksLocked(uint64_t due_by_ns, OutBatch& out);
  void RcSendReadResponses(QueuePair* qp, const ResponderResource& r, uint32_t from_psn, OutBatch& out);
  void RcArmRetransmitLocked(QueuePair* qp);
  // Round-trip timing: `psn` (sent for the first time, asking for an ACK) is timed unless one is already; an ACK up to
  // (not including) `next` ends the timing of a packet before it.
  void RcTimeRoundTripLocked(QueuePair* qp, uint32_t psn);
  void RcAckedUpToLocked(QueuePair* qp, uint32_t next);
  // How long early retransmission waits without an ACK on `path` (kProbeRoundTrips above).
  static uint64_t ProbeWaitNs(const PathWindow& path);
  // Moves the requester's cursor back to packet `packet` of WQE `index` (go-back-N) and drops the timed packet.
  void RcGoBackLocked(QueuePair* qp, size_t index, uint32_t packet);
  // The oldest started WQE not done and, in *packet, its first unacknowledged packet (a READ: the first response
  // missing); sq.size() when nothing is outstanding.
  size_t RcOldestUnacknowledgedLocked(QueuePair* qp, uint32_t* packet) const;
  // Everything sent is acknowledged and the requester waits for room in the path's window, not for its peer.
  bool RcOnlyWaitsForPathLocked(QueuePair* qp) const;
  // Other requesters wait for the window of qp's path: it is full, and qp's packets may sit behind theirs for longer
  // than any round trip measured before, so silence is no sign of a loss and early retransmission holds off (the
  // timeout still runs). Without this, 256 QPs went back early ~1100-1800 times in 5120 messages without a loss.
  bool RcPathQueuesOthersLocked(QueuePair* qp);
  wire::UdpEndpoint PeerOf(const QueuePair& qp) const;
  uint16_t SourcePortOf(const QueuePair& qp) const;
  // Where message bytes [offset, offset+len) of a send WR are: the pieces of registered memory (or inline data) that
  // hold them, in order, valid while the lock is held; false if an SGE is refused.
  bool GatherRangeLocked(const QueuePair& qp, const SendWr& wr, uint64_t offset, uint64_t len,
                         std::vector<std::span<const uint8_t>>& pieces);
  void WakeForTimer(uint64_t deadline);
  // `qp`'s requester armed a timer for `deadline`: RunTimers visits it (timed_qps_) and the poller is woken if it
  // would sleep past it.
  void RcTimerArmedLocked(QueuePair* qp, uint64_t deadline);

  DeviceConfig config_;
  wire::Transport& transport_;
  const wire::Clock& clock_;

  mutable std::mutex mu_;
  DeviceCounters counters_;
  std::function<void(const AsyncEvent&)> async_handler_;
  KeyTable keys_;
  std::map<uint32_t, std::unique_ptr<ProtectionDomain>> pds_;
  std::map<uint32_t, std::unique_ptr<CompletionQueue>> cqs_;
  // Looked up for every packet received (by BTH destination QP, XRCETH SRQ number): hashed, not ordered.
  std::unordered_map<uint32_t, std::unique_ptr<QueuePair>> qps_;
  std::map<wire::IpAddress, PathWindow> paths_;  // by peer address
  std::map<AddressHandle*, std::unique_ptr<AddressHandle>> ahs_;
  std::map<wire::IpAddress, std::vector<QueuePair*>> multicast_;  // group -> attached UD QPs
  std::unordered_map<uint32_t, std::unique_ptr<SharedReceiveQueue>> srqs_;  // by SRQ number
  std::map<XrcDomain*, std::unique_ptr<XrcDomain>> xrcds_;
  uint32_t next_srqn_ = 1;
  uint32_t next_xrcd_ = 1;
  uint32_t next_pd_ = 1;
  uint32_t next_cq_ = 1;
  uint32_t next_qpn_ = 0x11;  // QPN 0 and 1 are the special QPs (SMI, GSI); rxe also starts at 17
  // When the poller comes back on its own (0: never): the earlier of the deadline RunTimers last reported and the
  // caller's poller_returns_by_ns. Arming an earlier timer wakes the poller.
  uint64_t poller_deadline_ = 0;
  AckTiming ack_timing_ = AckTiming::kNow;  // of the datagram being processed
  // QPNs of RC requesters with a retransmit or RNR timer armed: RunTimers visits these, not every QP, so a timer
  // pass costs what is armed (thousands of idle QPs cost nothing). A QPN destroyed since is skipped.
  std::vector<uint32_t> timed_qps_;
  std::vector<uint32_t> acks_held_;  // QPNs holding an ACK (one reset since no longer holds and is skipped)
  // The earliest held_due_ns among them (0: none), or earlier when that ACK has left: read without the lock.
  std::atomic<uint64_t> next_held_ack_due_ns_{0};
  ConnectionManager cm_;  // its own lock, never taken with mu_ held
};

}  // namespace uroce::emu
