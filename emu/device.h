// The emulated HCA. One Device is one RoCEv2 port with one GID (its IP address): it owns every verbs object (PDs,
// MRs, CQs, QPs, AHs, SRQs, XRC domains), hands work requests to the QP they are posted on, demultiplexes received
// packets to QPs (O(1), by destination QPN) after the checks every packet gets (ICRC, transport, peer, state, P_Key),
// and runs the timers. The protocols are the QPs' transport objects (queue_pair.h): RC's requester, completer and
// responder, UC's and UD's; what they share lives in the DeviceCore (device_core.h).
//
// Pure C++: packets go out through a wire::Transport and come in through OnDatagram(); time comes from a wire::Clock.
// It does not know sockets, threads or libibverbs structs, so tests drive it on a SimNetwork with a ManualClock.
//
// Thread-safety: every public method may be called from any thread, and QPs run in parallel. The object lock
// (objects_mu_) is held shared by the data path (posting, packets, timers) and exclusively by the verbs that create,
// destroy or register objects; each QP has its own lock, and what QPs share has its own (device_core.h: the locks
// and their order); CQs and SRQs lock themselves. Callbacks (async events, CQ notifiers) run with a QP's lock held
// and must not call back into the Device.
//
// Errors follow the verbs convention: 0 or a positive errno value (EINVAL, ENOMEM, EBUSY, EOPNOTSUPP, ...).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <vector>

#include "emu/completion_queue.h"
#include "emu/congestion.h"
#include "emu/connection_manager.h"
#include "emu/device_core.h"
#include "emu/memory.h"
#include "emu/queue_pair.h"
#include "emu/read_write_lock.h"
#include "emu/srq.h"
#include "emu/types.h"
#include "emu/work_request.h"
#include "wire/address.h"
#include "wire/clock.h"
#include "wire/packet.h"
#include "wire/transport.h"

namespace uroce::emu {

class Device {
 public:
  Device(DeviceConfig config, wire::Transport& transport, const wire::Clock& clock);
  ~Device();
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  const DeviceConfig& config() const { return core_.config; }
  // The port's GID table (ibv_query_gid).
  const GidTable& gids() const { return core_.gids; }
  DeviceCounters counters() const;
  // The shared window of the RC requesters towards `peer` (emu/congestion.h), if any has talked to it.
  std::optional<PathWindow> path_window(const wire::IpAddress& peer) const;
  void set_async_handler(std::function<void(const AsyncEvent&)> handler);
  // The IB CM of this port (QP1's MADs go to it; its timers run in RunTimers).
  ConnectionManager& connection_manager() { return cm_; }
  // A process of this host device at `peer` (owner number `owner`) is gone: its rdma_cm connections end
  // (ConnectionManager::OnPeerProcessGone), and the messages its target QPs were handing to our shared XRC SRQs end
  // with their WQEs flushed, as its kernel's QP going away would leave them.
  void OnPeerProcessGone(const wire::IpAddress& peer, uint8_t owner);
  // A message such a process's target QP was handing to our SRQ, when another process holds that target and may run
  // it on, waits this long for its next piece before its WQE completes flushed: a requester's retransmission timeout
  // (4.3 s at timeout 20) and the taking over.
  static constexpr uint64_t kOrphanedMessageWaitNs = 5'000'000'000;

  // --- objects ------------------------------------------------------------------------------------------------
  ProtectionDomain* AllocPd();
  int DeallocPd(ProtectionDomain* pd);  // EBUSY while MRs, QPs or AHs use it

  // Registers [host, host+length) visible at `iova`. Fills `out` (keys included). EINVAL on bad flags (remote write or
  // atomic without local write, ibv_reg_mr(3)), ENOMEM past max_mr.
  int RegisterMr(ProtectionDomain* pd, void* host, uint64_t length, uint64_t iova, uint32_t access,
                 MemoryRegion* out);
  int ReregisterMr(uint32_t lkey, ProtectionDomain* pd, void* host, uint64_t length, uint64_t iova, uint32_t access,
                   MemoryRegion* out);
  int DeregisterMr(uint32_t lkey);
  // Registers another process's region (ibv_import_mr(3) across processes) in `pd`: `theirs` holds its keys, iova,
  // length, access and address there, and `foreign` the way to its memory; the keys stay theirs (the host device has
  // one key space). EINVAL for a region without a way to its memory or an on-demand one, EEXIST when its keys are
  // registered here already, ENOMEM past max_mr. Deregistered as any (DeregisterMr).
  int ImportMr(ProtectionDomain* pd, MemoryRegion theirs);
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
  // The device is lost (its host's device service died: a catastrophic error, IBTA 11.6.2): every QP enters the
  // error state and its outstanding work completes with IBV_WC_WR_FLUSH_ERR, the receives posted to its SRQs too
  // (FlushSrqLocked; also those posted later), then IBV_EVENT_DEVICE_FATAL is raised.
  void Fail();

  // The host's addresses changed: GID entries 1.. now hold `others` (GidTable::Update's rule), and when an entry
  // changed and `announce`, IBV_EVENT_GID_CHANGE is raised on port 1 (ibv_get_async_event(3)). QPs and AHs keep the
  // source GID they resolved. Returns whether anything changed.
  bool UpdateGids(std::span<const wire::IpAddress> others, bool announce = true);
  // The same with the entries given as they are (the host device's table, which its service keeps by that rule for
  // every process of the host: GidTable::Assign).
  bool AssignGids(const std::array<std::optional<wire::IpAddress>, GidTable::kEntries>& entries, bool announce = true);
  int QueryQp(QueuePair* qp, QpAttributes* attr);
  // Drops one handle on the QP (an XRC target opened by OpenQp has several); the QP goes with the last, detached
  // from its multicast groups, which `*left_groups` (when given) receives: the caller leaves them on the network.
  int DestroyQp(QueuePair* qp, std::vector<wire::IpAddress>* left_groups = nullptr);

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
  // On the host device (DeviceConfig::shared_xrc) that may be another process's target QP of the domain both opened
  // by one file: the handle is then queried from what that process publishes, ModifyQp on it is EOPNOTSUPP, it gets
  // IBV_EVENT_QP_FATAL when that process is gone, and our target QP lives on while another process holds a handle on
  // it (after our last handle is destroyed and our domain closed: RunTimers ends it once nobody does). EAGAIN when
  // the other process cannot be asked yet.
  int OpenQp(XrcDomain* xrcd, uint32_t qpn, QpType type, QueuePair** out);
  void SetQpOwner(QueuePair* qp, void* owner);

  // --- multicast (IBTA 10.5, ibv_attach_mcast(3)) ---------------------------------------------------------------
  // A UD QP joins the group of multicast GID `group` (an IPv4-mapped 224.0.0.0/4 or an ff00::/8 address): a UD
  // packet to QPN 0xFFFFFF addressed to the group is delivered to every QP attached to it. EINVAL for another QP
  // type, a GID that is not multicast, or (detach) a QP that is not attached; ENOMEM past the limits' groups, QPs per
  // group or attachments in all (as rxe). Attaching an attached QP again succeeds and changes nothing
  // (`*new_attachment` tells which). The network side (receiving the group's datagrams) is the caller's: this only
  // keeps the attachments, one network join per attachment.
  int AttachMulticast(QueuePair* qp, const wire::IpAddress& group, bool* new_attachment = nullptr);
  int DetachMulticast(QueuePair* qp, const wire::IpAddress& group);

  // --- data path ----------------------------------------------------------------------------------------------
  // Posts one work request; a post-time error (bad state, too many SGEs, queue full) is returned and nothing is
  // queued. Errors found while executing (bad lkey, message too long) complete the WR with an error status.
  int PostSend(QueuePair* qp, SendWr&& wr);
  int PostRecv(QueuePair* qp, RecvWr&& wr);

  // --- network ------------------------------------------------------------------------------------------------
  using AckTiming = emu::AckTiming;  // device_core.h
  // Processes one received datagram (a CM MAD for QP1 goes to the connection manager once the device's locks are
  // released).
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
  // DestroyQp's work once the QP's last handle is gone, with the lock held exclusively.
  void DestroyQpLocked(std::unordered_map<uint32_t, std::unique_ptr<QueuePair>>::iterator it,
                       std::vector<wire::IpAddress>* left_groups, OutBatch& out);
  // Shared XRC target QPs (OpenQp): a handle on another process's closed; ours that only other processes hold
  // destroyed once none does (RunTimers, every kUnheldTargetLookNs); whether `qpn` is one of those (with the lock);
  // a domain closed while such a QP lived forgotten once none uses it (with the lock held exclusively).
  int CloseElsewhere(QueuePair* qp);
  // The process of `owner` is gone: the target QPs of its we hold become ours (its number taken over at the service,
  // each QP run on from the state it last published). *taken_elsewhere: another holder took them.
  void AdoptTargetsOf(uint8_t owner, bool* taken_elsewhere);
  // A handle of ours becomes the QP, in the state `t` (with its lock and the object lock held exclusively): a SEND in
  // progress into another process's SRQ is handed on (its pending piece again, resent); one into ours goes on from
  // what reached us; a claim on our SRQ whose first piece never came gives its WQE back.
  void RunOnFromLocked(QueuePair& qp, const SharedTargetState& t);
  void EndUnheldTargets(OutBatch& out);
  bool IsUnheldTargetLocked(uint32_t qpn) const;
  void ForgetXrcdIfUnusedLocked(XrcDomain* xrcd);
  static constexpr uint64_t kUnheldTargetLookNs = 10'000'000;
  int ModifyQpLocked(QueuePair* qp, const QpAttributes& attr, uint32_t mask);
  // A datagram for QP1, kept for the connection manager: handed over after the device's locks are released.
  struct GsiMad {
    wire::IpAddress peer;
    wire::IpAddress local;  // the address it came to: the CM answers from it
    uint32_t qkey = 0, src_qp = 0;
    std::vector<uint8_t> mad;
  };
  // The checks every packet gets, then the QP (or multicast group, or the CM) it is for.
  // Sends a CNP to `peer_qpn` at `peer`, unless one went to that peer less than DeviceCore::kCnpIntervalNs ago.
  // From `local`, the address the congested datagram came to.
  void NotifyCongestionLocked(const wire::IpAddress& local, const wire::IpAddress& peer, uint32_t peer_qpn,
                              OutBatch& out);
  // Sends `qp`'s held UC/UD sends whose pace allows them now, in order (with its lock held); when the first still held
  // may go, 0 when none is.
  uint64_t SendHeldLocked(QueuePair& qp, uint64_t now, OutBatch& out);
  void OnDatagramLocked(const wire::InDatagram& d, OutBatch& out, std::optional<GsiMad>& gsi);
  // A direct SEND from another process of the host (wire/direct_access.h): the WQE it was checked against takes it
  // and completes; one for a QP reset, destroyed or reopened since is dropped (counted).
  void ReceiveDirectSendLocked(const wire::InDatagram& d);
  // RunTimers: the receive flushes that waited for direct SENDs past DeviceCore::kDirectFlushWaitNs go on; when the
  // next of those waits ends (0: none). With the object lock held (shared).
  uint64_t FlushOverdueReceivesLocked(uint64_t now);
  // A QP reset or destroyed: the completions it left in its CQs go (as on mlx4/mlx5), and the SRQ WQEs behind its
  // dropped receive completions return to the SRQ (QueuePair::srq_completed). With the QP's lock or the object lock
  // held exclusively.
  void CleanCqsLocked(QueuePair& qp);
  // Its steps: the ICRC (counted when it fails); CNPs, QP1 and multicast; the named QP's validation and delivery.
  bool IcrcVerifies(const wire::InDatagram& d);
  void ReceiveCnpLocked(const wire::InDatagram& d, const wire::PacketView& p);
  void ReceiveGsiLocked(const wire::InDatagram& d, const wire::PacketView& p, std::optional<GsiMad>& gsi);
  void ReceiveMulticastLocked(const wire::InDatagram& d, const wire::PacketView& p);
  static bool ReceivesInState(QpState s);
  bool AcceptedByQp(const QueuePair& qp, const wire::InDatagram& d, const wire::PacketView& p);
  void DeliverToQpLocked(QueuePair* qp, std::unique_lock<std::mutex>& lock, const wire::InDatagram& d,
                         const wire::PacketView& p, OutBatch& out);
  // RC and XRC initiator (rc.cc), with the QP's lock held: a request to the QP's responder, a response to its
  // completer. True when the response opened the path's window: the caller wakes its waiters once the QP's lock is
  // released (WakePathWaitersLocked).
  bool ReceiveRcLocked(QueuePair* qp, const wire::PacketView& p, OutBatch& out);
  // XRC target (xrc.cc): checks the XRCETH's SRQ and runs the QP's RC responder with that SRQ's PD, CQ and WQEs
  // (ExecuteXrcTargetLocked), then publishes the QP's state if other processes may hold it.
  void ReceiveXrcTargetLocked(QueuePair* qp, const wire::PacketView& p, OutBatch& out);
  void ExecuteXrcTargetLocked(QueuePair* qp, const wire::PacketView& p, OutBatch& out);
  // Whether `srqn` is another process's XRC SRQ of `target`'s domain (DeviceConfig::shared_xrc), or may be: that
  // process cannot be asked yet.
  bool MayBeSharedXrcSrq(const QueuePair& target, uint32_t srqn) const;
  // A piece of a message another process's target QP received for one of our shared XRC SRQs (wire::XrcDelivery):
  // the first takes a WQE (the target claimed it), each is placed, the last completes in the SRQ's CQ.
  void ReceiveXrcDeliveryLocked(const wire::InDatagram& d);
  // ModifyQp of our own QP, with objects_mu held shared.
  int ModifyQpHeld(QueuePair* qp, const QpAttributes& attr, uint32_t mask, OutBatch& out);
  // A request of a process holding a handle on one of our target QPs to modify it (wire::XrcTargetModify): carried
  // out as ours, answered through SharedXrc.
  void ModifyForHolder(const wire::InDatagram& d);
  // An event of another process's target QP that we hold a handle on (wire::XrcTargetEvent): raised on our handle.
  void ReceiveXrcTargetEventLocked(const wire::InDatagram& d);
  // Ends the messages being handed to our shared XRC SRQs that `ends` picks, by their target QP and since when they
  // are orphaned (XrcInbound::orphaned_ns, 0: not): their WQEs complete flushed. With the object lock held.
  void EndHandedMessagesLocked(const std::function<bool(uint32_t target_qpn, uint64_t orphaned_ns)>& ends);
  // Resumes requesters that stopped for the window towards `peer` while it has room (rc.cc). With the object lock
  // held shared and no QP's lock: it takes each woken QP's.
  void WakePathWaitersLocked(const wire::IpAddress& peer, OutBatch& out);
  // Sends the held ACKs (AckTiming::kHeld) due by `due_by_ns`; keeps core_.next_held_ack_due_ns current (rc.cc).
  // With the object lock held shared and no QP's lock.
  void SendHeldAcksLocked(uint64_t due_by_ns, OutBatch& out);
  // RunTimers' steps (device.cc), with the object lock held shared and no QP's lock.
  void WakeAllPathWaitersLocked(OutBatch& out);
  uint64_t SendHeldUnreliableLocked(uint64_t now, OutBatch& out);
  uint64_t RunRequesterTimersLocked(uint64_t now, OutBatch& out);
  bool PathWaitersMayWakeLocked();
  // Sends `out` after the lock is released and counts what left.
  void Transmit(OutBatch& out);
  // CreateQp's SRQ/XRC rules (ibv_create_qp(3) NOTES, Annex A14): 0 or EINVAL; clears what such a QP ignores.
  static int CheckSharedReceiveInit(QpInitAttributes& init);
  // With the lock: the SRQ and domain named by `init` exist; takes a use of each (released by DestroyQp).
  int AttachSharedReceiveLocked(const QpInitAttributes& init);
  void DetachSharedReceiveLocked(const QpInitAttributes& init);
  // With the lock, on a failed device: the receives queued on `srq` complete with IBV_WC_WR_FLUSH_ERR where a
  // program polls for them: an XRC SRQ's in its own CQ (qp_num: a target QP of its domain, else 0), a basic SRQ's in
  // the receive CQ of its QP with the lowest number (qp_num: that QP). With no QP on a basic SRQ nobody can poll for
  // them: they stay queued.
  void AnnounceGidChange();  // IBV_EVENT_GID_CHANGE on port 1
  void FlushSrqLocked(SharedReceiveQueue& srq);

  // Shared: the tables below are read and the objects in them stay. Exclusive: the tables change.
  mutable ReadWriteLock objects_mu_;
  DeviceCore core_;
  std::map<uint32_t, std::unique_ptr<ProtectionDomain>> pds_;
  std::map<uint32_t, std::unique_ptr<CompletionQueue>> cqs_;
  // Looked up for every packet received (by BTH destination QP, XRCETH SRQ number): hashed, not ordered.
  std::unordered_map<uint32_t, std::unique_ptr<QueuePair>> qps_;
  std::map<AddressHandle*, std::unique_ptr<AddressHandle>> ahs_;
  std::map<wire::IpAddress, std::vector<QueuePair*>> multicast_;  // group -> attached UD QPs
  std::unordered_map<uint32_t, std::unique_ptr<SharedReceiveQueue>> srqs_;  // by SRQ number
  std::map<XrcDomain*, std::unique_ptr<XrcDomain>> xrcds_;  // a domain with 0 references: kept for unheld targets
  // Handles on other processes' target QPs (OpenQp), by QPN: no packet of theirs comes here.
  std::unordered_map<uint32_t, std::unique_ptr<QueuePair>> opened_targets_;
  // Our target QPs that none of our handles holds, kept while another process holds one (DestroyQp, RunTimers).
  std::vector<uint32_t> unheld_targets_;
  uint32_t next_srqn_ = 1;
  uint32_t next_xrcd_ = 1;
  uint32_t next_pd_ = 1;
  uint32_t next_cq_ = 1;
  // Fail() was called: receives posted to an SRQ from now on complete at once (FlushSrqLocked). Set with objects_mu_
  // held exclusively and read with it shared, so that no post slips in between the drain and the flag.
  bool failed_ = false;
  uint32_t next_qpn_ = 0x11;  // QPN 0 and 1 are the special QPs (SMI, GSI); rxe also starts at 17
  // Messages other processes' target QPs are handing to our shared XRC SRQs (ReceiveXrcDeliveryLocked), by SRQ
  // number << 32 | target QPN: the WQE each took and how far it is filled.
  struct XrcInbound {
    RecvWr wr;
    uint64_t index = 0;  // its number in the SRQ (wire::XrcDelivery::index)
    uint64_t offset = 0;
    WcStatus status = WcStatus::kSuccess;
    // When its target's process went, if another process holds that target and may run it on (0: not orphaned).
    uint64_t orphaned_ns = 0;
  };
  // Ends the orphaned messages that waited that long; when the next would (0: none waits). With the object lock.
  uint64_t EndOrphanedMessagesLocked(uint64_t now);
  std::atomic<bool> orphaned_messages_{false};  // some may be waiting
  Mutex xrc_inbound_mu_;
  std::unordered_map<uint64_t, XrcInbound> xrc_inbound_ GUARDED_BY(xrc_inbound_mu_);
  // By target QPN: the PSN of the last piece it handed us (a resent piece up to it is dropped: wire::XrcDelivery).
  std::unordered_map<uint32_t, uint32_t> xrc_last_psn_ GUARDED_BY(xrc_inbound_mu_);
  ConnectionManager cm_;  // its own lock, never taken with objects_mu_ held
};

}  // namespace uroce::emu
