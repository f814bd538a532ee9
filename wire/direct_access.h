// Direct access: RDMA WRITE and READ between two processes of the host device carried out by the initiator itself,
// in the target's registered memory, without a packet (docs/ARCHITECTURE.md, "Direct access"). This is how the
// kernel's rxe serves two processes of one host (its softirq writes into the target's pages, no thread of the
// target wakes), and what a one-sided operation needs to be fast: the target of an ib_write_lat spins on its buffer
// and calls no verb, so a packet for it waits until its engine's thread is scheduled to take it.
//
// Each process of the host device publishes, in a table of shared memory of its own (DirectTable, a sealed memfd it
// hands to the processes that connect to it with its ring offer), what a remote access through its RC QPs may
// touch: for each QP able to respond (RTR, RTS, SQD) its peer's QPN, PD and remote access rights; for each memory
// region with remote access its R_Key, PD, bounds, rights and host address. The initiator checks a WRITE or READ
// against those exactly as the responder would (IBTA 9.7.5.1.x, 10.6.3.2: QP state and peer, R_Key, PD, bounds,
// rights) and copies with process_vm_writev(2) / process_vm_readv(2). Whatever the table does not allow (a window's
// R_Key, a refused access, a QP in error, the table not yet mapped) goes as packets, so the responder gives the error
// a real device gives: the direct way only ever takes the case that would have succeeded.
//
// Revocation (IBTA 10.6.3.2: after ibv_dereg_mr(3) returns the region is no longer accessed; a QP in the error state
// executes nothing). Every initiator counts, in the target's table, the copies it has entered and left (one pair of
// counters per owner number). An access enters, then looks the entries up; the target withdraws an entry (clears its
// key), then waits until each owner has left as many copies as it had entered when it looked. Both sides use
// sequentially consistent operations (Dekker's pattern): either the initiator sees the key gone, or the target sees
// its entry counted and waits for it. An initiator that died inside a copy is not waited for (its pid, which it
// writes beside its counters, is gone).
//
// SENDs (RC, into a QP's own receive queue) go the same way, but the target still completes them: each QP publishes
// a window of its receive queue (DirectTable's receive slots: the lengths of its next kReceiveWindow WQEs and how
// many it has taken for messages that came as packets); the initiator checks that the WQE its SEND would take exists
// and is long enough, and writes the SEND (a DirectSend and its bytes) into the target's packet ring instead of
// packets; the target takes the WQE, places the bytes and completes it when it reads the ring, in order with the
// packets around it. Like the responder's ACK, the initiator's success then means the target will deliver: what
// could still refuse the message there (the length, no WQE) was checked, and a receive WQE's own keys are the
// target's to keep valid (ibv_dereg_mr(3) of a region with WQEs posted into it is the target's error, and the SEND's
// WQE then completes in error there, IBV_WC_LOC_PROT_ERR).
//
// XRC SRQs (Annex A14) are shared the same way. A target QP may deliver into any XRC SRQ of its domain, and the
// host's processes share a domain by opening it by one file, each with SRQs of its own: so each process publishes its
// XRC SRQs of file domains (number, the file's identity) with a window of their receive WQEs, numbered in the order
// they were posted: how many are shown (`posted`), how many are claimed, and the length of each of the last
// kSrqWindow shown. Whoever takes a WQE from such an SRQ claims the next one first (the owner for its own target QPs,
// another process's target QP for a message naming it): a claim is that one WQE, which the SRQ keeps until its
// claimant's message takes it, and with its length the claimant judges the message as the SRQ's own target would (a
// SEND longer than its WQE: invalid request, 9.7.5.2.x). No WQE left to claim is the responder's RNR NAK
// (9.7.5.2.8), as for any empty SRQ. The owner shows a WQE only once the one kSrqWindow before it is claimed (its
// length slot is then free). The target QP keeps the RC protocol (PSN, ACK) and hands each packet's payload, in
// order, to the SRQ's process through its ring (XrcDelivery), which takes the claimed WQE at the first, places the
// bytes with its own keys and completes it at the last in the SRQ's CQ, as the target's own SRQ would have.
//
// XRC target QPs are shared too (ibv_open_qp(3): another process of the domain opens a handle on a target QP, and
// the QP lives while any handle does). Each process publishes its target QPs of file domains (number, the file's
// identity, the QP's attributes as its HCA keeps them, rewritten under a sequence count at every change) with a set
// of holders: one bit per owner number whose process opened a handle. The opener sets its bit, then looks whether
// the QP is still there; the owner, about to destroy a QP none of its own handles holds, marks it closing, then looks
// at the bits: either the opener sees the mark (its open fails) or the owner sees the bit (the QP stays), never
// neither. A holder whose process is gone (its pid, which it writes beside its copy counters, no longer exists)
// counts no more. The QP runs where it was created: only that process receives its packets. Its state (attributes,
// the responder's MSN and message in progress) is published after every request it executes, and before each piece
// it hands to another process, marked pending (the piece may or may not have arrived); so when that process is gone
// (exited or killed), a holder takes over its owner number at the service (the routes of its QPNs, its peer name)
// and runs the QP from the last state: a piece it hands again that its receiver already has is recognised there by
// its PSN (XrcDelivery::resent) and dropped.
//
// Error contract (as liburing's): functions that can fail return 0 or a count on success, -errno on failure.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <unordered_map>

#include "wire/address.h"

namespace uroce::wire {

// Remote rights, as a table entry holds them.
namespace direct_rights {
inline constexpr uint32_t kWrite = 1u << 0;
inline constexpr uint32_t kRead = 1u << 1;
// The QP receives into a queue of its own whose window it publishes (DirectTable::OpenReceives): SENDs may be direct.
inline constexpr uint32_t kSend = 1u << 2;
}  // namespace direct_rights

// How many of a QP's next receive WQEs its window shows.
inline constexpr uint32_t kReceiveWindow = 16;

// A direct SEND as the target's packet ring carries it, ahead of its bytes (kSize bytes, host byte order: both ends
// are on one host).
struct DirectSend {
  static constexpr size_t kSize = 32;
  uint32_t dest_qpn = 0;
  uint32_t src_qpn = 0;
  uint32_t epoch = 0;   // the window's it was checked against (a SEND into another incarnation of the QP is dropped)
  uint64_t index = 0;   // the receive WQE it takes, counted from the window's opening
  uint32_t imm = 0;     // as the IMMDt carries it
  bool with_imm = false;
  bool solicited = false;

  void Encode(uint8_t out[kSize]) const;
  // nullopt for bytes that are not one (short, bad marker).
  static std::optional<DirectSend> Decode(std::span<const uint8_t> in);
};

// An initiator's offer of a WRITE's second half for the owner to copy (DirectTable::OfferCopy), as the owner's ring
// carries its notice (kSize bytes, host byte order): the offer itself waits in the owner's table.
struct CopyOffer {
  static constexpr size_t kSize = 8;
  uint8_t owner = 0;  // the initiator's owner number: its slot in the table

  void Encode(uint8_t out[kSize]) const;
  // nullopt for bytes that are not one (short, bad marker).
  static std::optional<CopyOffer> Decode(std::span<const uint8_t> in);
};

// How many of an XRC SRQ's WQEs its window shows ahead of the claimed ones.
inline constexpr uint32_t kSrqWindow = 64;

// A piece of a message an XRC target QP received for another process's XRC SRQ, as that process's ring carries it,
// ahead of the packet's payload (kSize bytes, host byte order). The pieces of one message come in order, from one
// target QP.
struct XrcDelivery {
  static constexpr size_t kSize = 32;
  uint32_t srqn = 0;        // the SRQ (the XRCETH's)
  uint32_t target_qpn = 0;  // the target QP that received it: the completion's qp_num
  uint32_t src_qpn = 0;     // the initiator's QP: the completion's src_qp
  uint32_t imm = 0;         // as the IMMDt carries it
  uint64_t index = 0;       // the WQE the target claimed (counted from the SRQ's publication)
  uint32_t psn = 0;         // the packet's
  // Handed again by a process that took the target QP over from one that was gone: the receiver may have it already
  // (the last piece it was handed by that target has this PSN or a later one): then it is dropped.
  bool resent = false;
  bool first = false;       // the message's first packet: it takes that WQE
  bool last = false;        // its last: the WQE completes
  bool with_imm = false;
  bool solicited = false;
  // The target QP abandoned the message: the WQE completes with `status` (an IBV_WC_* value: WR_FLUSH_ERR when the
  // target entered the error state, LOC_LEN_ERR when the message was longer than the WQE). No bytes follow.
  bool abort = false;
  uint8_t status = 0;

  void Encode(uint8_t out[kSize]) const;
  // nullopt for bytes that are not one (short, bad marker).
  static std::optional<XrcDelivery> Decode(std::span<const uint8_t> in);
};

// An asynchronous event of an XRC target QP, as its process tells the processes that hold handles on it (kSize bytes,
// host byte order): ibv_open_qp(3)'s handles all get the events of the QP they share.
struct XrcTargetEvent {
  static constexpr size_t kSize = 8;
  uint32_t qpn = 0;
  uint8_t event = 0;  // an enum ibv_event_type value

  void Encode(uint8_t out[kSize]) const;
  // nullopt for bytes that are not one (short, bad marker).
  static std::optional<XrcTargetEvent> Decode(std::span<const uint8_t> in);
};

// ibv_modify_qp(3) through a handle on another process's XRC target QP: the request to the process running the QP
// (the QP's attributes follow it, opaque here: emu's) and that process's answer (kSize bytes, host byte order).
struct XrcTargetModify {
  static constexpr size_t kSize = 24;
  uint32_t request = 0;  // the requester's number for it, which the answer repeats
  uint32_t qpn = 0;
  uint32_t mask = 0;     // the request's attribute mask
  int32_t result = 0;    // the answer's: 0 or an errno
  uint8_t from = 0;      // the requester's owner number
  bool answer = false;

  void Encode(uint8_t out[kSize]) const;
  // nullopt for bytes that are not one (short, bad marker).
  static std::optional<XrcTargetModify> Decode(std::span<const uint8_t> in);
};

// What the HCA (emu) sees of direct access: DeviceConfig::direct. Every method may be called from any thread.
class DirectAccess {
 public:
  virtual ~DirectAccess() = default;

  // A QP of ours that may respond, as the table publishes it.
  struct QpEntry {
    uint32_t qpn = 0;
    uint32_t peer_qpn = 0;  // the only initiator whose accesses it executes (its dest_qp_num)
    uint32_t pd = 0;        // its protection domain's handle
    uint32_t rights = 0;    // direct_rights of its qp_access_flags
    bool operator==(const QpEntry&) const = default;
  };
  // A memory region of ours with remote access.
  struct Region {
    uint32_t rkey = 0;
    uint32_t pd = 0;
    uint32_t rights = 0;  // direct_rights
    uint64_t iova = 0;    // the address peers name for its first byte
    uint64_t length = 0;
    const uint8_t* host = nullptr;  // where that byte lives in this process
  };

  // An RDMA WRITE of `length` bytes, gathered from `pieces` of our memory, to [va, va+length) of R_Key `rkey` through
  // QP `dest_qpn` at `peer`, on behalf of our QP `src_qpn`. True when every byte is in place; false when it must go as
  // packets (not a process of this host, nothing published that allows it, the copy refused or cut short; nothing
  // is known to have been written then, and the packets write it all).
  virtual bool Write(const UdpEndpoint& peer, uint32_t dest_qpn, uint32_t src_qpn, uint32_t rkey, uint64_t va,
                     std::span<const std::span<const uint8_t>> pieces, uint64_t length) = 0;
  // An RDMA READ of [va, va+length) into `pieces` of our memory; as Write.
  virtual bool Read(const UdpEndpoint& peer, uint32_t dest_qpn, uint32_t src_qpn, uint32_t rkey, uint64_t va,
                    std::span<const std::span<uint8_t>> pieces, uint64_t length) = 0;
  // A SEND (with immediate data when `send.with_imm`) of `length` bytes gathered from `pieces` into QP
  // `send.dest_qpn` at `peer`, from our QP `send.src_qpn`: true when it is in the target's ring and its receive WQE
  // is known to exist and be long enough (Send fills in the epoch and index); false when it must go as packets.
  virtual bool SendMessage(const UdpEndpoint& peer, DirectSend& send,
                           std::span<const std::span<const uint8_t>> pieces, uint64_t length) = 0;

  // Our side. Publishing a QP or region replaces what was published for its number or key. A withdrawal returns once
  // no other process copies through the entry any more; withdrawing what is not published does nothing.
  virtual void PublishQp(const QpEntry& qp) = 0;
  virtual void WithdrawQp(uint32_t qpn) = 0;
  virtual void PublishRegion(const Region& region) = 0;
  virtual void WithdrawRegion(uint32_t rkey) = 0;
  // A QP's receive window (as DirectTable's methods of the same names): opened with counters at 0 for a new
  // incarnation `epoch`; the lengths of WQEs [first, first + lengths.size()) and how many WQEs messages that came as
  // packets have taken; how many direct SENDs initiators have put into our ring for it; closed (returns once no other
  // process looks at it any more).
  virtual void OpenReceives(uint32_t qpn, uint32_t epoch) = 0;
  virtual void PublishReceives(uint32_t qpn, uint64_t packets_taken, uint64_t first,
                               std::span<const uint32_t> lengths) = 0;
  virtual uint64_t DirectSends(uint32_t qpn) = 0;
  virtual void CloseReceives(uint32_t qpn) = 0;
};

// The most bytes of a target QP's attributes a table holds (opaque to it: emu's QpAttributes and progress).
inline constexpr size_t kTargetAttributeBytes = 256;

// What the HCA (emu) sees of the host's XRC SRQs and target QPs (as the file comment says): DeviceConfig::shared_xrc.
// Unlike direct access it replaces no packet (the target QP receives them all), so captures and fault injection
// leave it on. Every method may be called from any thread.
class SharedXrc {
 public:
  virtual ~SharedXrc() = default;

  // Ours: published for the domain of file `domain` (XrcDomain::inode; false
  // when no slot is free, then only our own target QPs reach it); how many of its WQEs are claimed; WQEs
  // [first, first + lengths.size()) shown with those lengths (as DirectTable::ShowSrqWqes); withdrawn.
  virtual bool PublishXrcSrq(uint32_t srqn, uint64_t domain) = 0;
  virtual uint64_t XrcWqesClaimed(uint32_t srqn) = 0;
  virtual void ShowXrcWqes(uint32_t srqn, uint64_t first, std::span<const uint32_t> lengths) = 0;
  virtual void WithdrawXrcSrq(uint32_t srqn) = 0;
  // Any process's, ours included: whether `srqn` is an XRC SRQ published for `domain` (1, 0, or -EAGAIN: its
  // process is there but cannot be asked yet, as before it has offered its table: ask again later); claiming its next
  // receive WQE, whose number and length are stored in *index and *length (false: none shown unclaimed, not
  // published, or not reachable).
  virtual int XrcSrqInDomain(uint32_t srqn, uint64_t domain) = 0;
  virtual bool ClaimXrcWqe(uint32_t srqn, uint64_t* index, uint32_t* length) = 0;
  // A piece of a message for another process's XRC SRQ `delivery.srqn`, with its bytes, into that process's ring:
  // false when it cannot go there (not a process of this host, gone, or its ring full).
  virtual bool DeliverXrc(const XrcDelivery& delivery, std::span<const uint8_t> bytes) = 0;

  // Our target QPs of file domains: published (or their attributes rewritten) for the domain of file `domain`, held
  // at first by the processes of `holders` (bit n: owner number n; null: none) (false when no slot is free or
  // `attributes` is longer than kTargetAttributeBytes: then no other process can open it); released when none of our
  // handles holds it any more (true: withdrawn, destroy it now; false: another process holds a handle, keep it);
  // withdrawn unconditionally.
  virtual bool PublishXrcTarget(uint32_t qpn, uint64_t domain, std::span<const uint8_t> attributes,
                                const uint64_t* holders) = 0;
  virtual bool ReleaseXrcTarget(uint32_t qpn) = 0;
  virtual void WithdrawXrcTarget(uint32_t qpn) = 0;
  // The process of target QP `qpn` is gone: the last state it published and the QP's holders (false: none
  // published); taking over its owner number, so that its QPs we hold run here: 0 (ours now), -EALREADY (another
  // process of the host took it), -errno.
  virtual bool ReadGoneXrcTarget(uint32_t qpn, std::span<uint8_t> attributes, uint64_t holders[4]) = 0;
  virtual int AdoptOwner(uint8_t owner) = 0;
  // Another process's (ibv_open_qp(3)): a handle opened on its target QP `qpn` of `domain` (0; -EINVAL when there is
  // none, of that domain, or it is being destroyed; -EAGAIN when its process cannot be asked); its attributes
  // (false: it is gone); the handle closed.
  virtual int OpenXrcTarget(uint32_t qpn, uint64_t domain) = 0;
  virtual bool ReadXrcTarget(uint32_t qpn, std::span<uint8_t> attributes) = 0;
  virtual void CloseXrcTarget(uint32_t qpn) = 0;
  // Our target QP `qpn` raised `event` (an enum ibv_event_type value): the other processes holding handles on it (its
  // holder bits) are told, each through its ring (RingRecord::kXrcTargetEvent); one whose ring is full misses it.
  virtual void TellXrcTargetHolders(uint32_t qpn, uint8_t event) = 0;
  // Through our handle on another process's target QP `qpn`: asks that process to modify it (`attributes` opaque
  // here) and waits for its answer: 0 or the errno its ibv_modify_qp gave; EAGAIN when it did not answer in time (or
  // its ring was full), EINVAL when it is gone.
  virtual int ModifyXrcTarget(uint32_t qpn, std::span<const uint8_t> attributes, uint32_t mask) = 0;
  // Our answer `result` to request `request` of the process of owner number `owner`.
  virtual void AnswerXrcTargetModify(uint8_t owner, uint32_t request, int result) = 0;
  // Whether the process of owner number `owner` holds a handle on our target QP `qpn` (its holder bit).
  virtual bool HoldsXrcTarget(uint32_t qpn, uint8_t owner) = 0;
};

// A memory region as its process offers it for import (ibv_import_mr(3) by another process of the host).
struct ExportedRegion {
  uint32_t lkey = 0;    // its keys (lkey == rkey); its handle is lkey >> 8
  uint32_t pd = 0;      // its protection domain's handle
  uint32_t access = 0;  // emu::access flags
  uint64_t iova = 0;
  uint64_t length = 0;
  uint64_t host = 0;    // where its first byte lives in its process
};

// What the HCA (emu) offers the host's other processes to import (DeviceConfig::exports): its PDs and regions, so
// that a process given our cmd_fd (SCM_RIGHTS) reaches them by handle (ibv_import_pd(3), ibv_import_mr(3)). Every
// method may be called from any thread.
class ExportedObjects {
 public:
  virtual ~ExportedObjects() = default;
  virtual void ExportPd(uint32_t handle) = 0;
  virtual void WithdrawPd(uint32_t handle) = 0;
  virtual void ExportRegion(const ExportedRegion& region) = 0;
  // Returns once no importer copies through the region any more (IBTA 10.6.3.2: deregistered, it is not accessed).
  virtual void WithdrawExportedRegion(uint32_t lkey) = 0;
};

// Whether bit `n` of a target QP's holders (DirectTable::TargetHolders) is set: owner number `n` holds a handle.
inline bool HasHolder(const uint64_t holders[4], unsigned n) { return (holders[n / 64] >> (n % 64)) & 1; }

// One process's table in shared memory. The owner publishes and withdraws; the host's other processes look up and
// count their copies (Enter/Leave). Layout (host byte order; both ends run on one host):
//   0       magic u64, owner's pid i32, QP slots u32, region slots u32
//   64      per owner number 0..255: entered u64, left u64, pid i32 (of the process holding that number), offer
//           state u32, offer's R_Key u32, padding u32, offer's source u64, target u64 and length u64 (64 bytes each:
//           initiators never share a cache line)
//   then    QP slots: key u32 (1 << 31 | qpn, 0: empty), peer_qpn u32, pd u32, rights u32
//   then    region slots (40 bytes): key u64 (1 << 32 | rkey, 0: empty), pd u32, rights u32, iova u64, length u64,
//           host u64
//   then    receive slots (192 bytes), for QPs with direct_rights::kSend: key u32 (1 << 31 | qpn), epoch u32,
//           posted u64, packets_taken u64, lengths u32[kReceiveWindow] (the owner's two cache lines); sends u64 (the
//           initiator's line). WQE i (counted from the window's opening) exists when i < posted; its length is
//           lengths[i % kReceiveWindow].
//   then    XRC SRQ slots (384 bytes): key u32 (1 << 31 | srqn), domain u64, posted u64 and lengths u32[kSrqWindow]
//           (the owner's: WQE i is shown when i < posted, its length at lengths[i % kSrqWindow]), claimed u64
//           (every taker's: claimed <= posted <= claimed + kSrqWindow).
//   then    XRC target slots (256 bytes): key u32 (1 << 31 | qpn, with 1 << 30 while the owner is closing it),
//           version u32 (odd while the attributes are rewritten), domain u64, attribute bytes u32, holders u64[4]
//           (bit n: owner number n holds a handle), attributes u64[kTargetAttributeBytes / 8].
//   then    exported PD slots (8 bytes): key u32 (1 << 31 | handle, 0: empty), unused u32
//   then    exported region slots (40 bytes), homed by the region's handle (lkey >> 8): key u64 (1 << 32 | lkey),
//           pd u32, access u32 (emu::access), iova u64, length u64, host u64
// An entry lives in the slot its number hashes to or one of the kProbe after it.
class DirectTable {
 public:
  static constexpr uint64_t kMagic = 0x75726f63'44697236ULL;  // "urocDir6"
  static constexpr uint32_t kQpSlots = 4096;
  static constexpr uint32_t kRegionSlots = 8192;
  static constexpr uint32_t kReceiveSlots = 4096;
  static constexpr uint32_t kSrqSlots = 1024;
  static constexpr uint32_t kTargetSlots = 1024;
  static constexpr uint32_t kPdSlots = 1024;
  static constexpr uint32_t kExportSlots = 8192;
  static constexpr uint32_t kProbe = 32;

  // The owner's side: a new table in a new sealed memfd, whose descriptor (close-on-exec, the caller's) is stored in
  // *fd for passing to the other processes. -errno of memfd_create, ftruncate, fcntl or mmap.
  static int Create(std::unique_ptr<DirectTable>* table, int* fd);
  // Another process's table in memfd `fd` (not taken). -EINVAL when it is not a sealed table of this layout; -errno
  // of fstat or mmap.
  static int Attach(int fd, std::unique_ptr<DirectTable>* table);
  ~DirectTable();
  DirectTable(const DirectTable&) = delete;
  DirectTable& operator=(const DirectTable&) = delete;

  pid_t pid() const;  // the owner's

  // --- the owner ---------------------------------------------------------------------------------------------------
  // false when no slot is free within kProbe of its hash (then nothing is published: its accesses go as packets).
  bool PublishQp(const DirectAccess::QpEntry& qp);
  void WithdrawQp(uint32_t qpn);
  bool PublishRegion(const DirectAccess::Region& region);
  void WithdrawRegion(uint32_t rkey);
  // A receive window for QP `qpn` (counters 0; replaces one it had); false when no slot is free.
  bool OpenReceives(uint32_t qpn, uint32_t epoch);
  // WQEs [first, first + lengths.size()) have those lengths (first + size is the new `posted`; a WQE's length is
  // written before the count that shows it); `packets_taken` WQEs went to messages that came as packets.
  void PublishReceives(uint32_t qpn, uint64_t packets_taken, uint64_t first, std::span<const uint32_t> lengths);
  // The direct SENDs initiators have counted into the window (CountSend).
  uint64_t DirectSends(uint32_t qpn);
  void CloseReceives(uint32_t qpn);
  // An XRC SRQ of domain `domain` (counts 0; replaces one it had); false when no slot is free.
  bool PublishSrq(uint32_t srqn, uint64_t domain);
  // How many of its WQEs are claimed (0 when not published).
  uint64_t SrqClaimed(uint32_t srqn);
  // Shows WQEs [first, first + lengths.size()) with those lengths (`first` is what was shown so far; the caller keeps
  // first + size within SrqClaimed + kSrqWindow and serialises its calls per SRQ; a length is written before the
  // count that shows it).
  void ShowSrqWqes(uint32_t srqn, uint64_t first, std::span<const uint32_t> lengths);
  void WithdrawSrq(uint32_t srqn);
  // An XRC target QP of domain `domain` with `attributes` (at most kTargetAttributeBytes), held by `holders` (null:
  // none), or, when it is published, its attributes rewritten; false when no slot is free or they are too long.
  bool PublishTarget(uint32_t qpn, uint64_t domain, std::span<const uint8_t> attributes,
                     const uint64_t* holders = nullptr);
  // Withdrawn unless a process that still exists holds a handle (true: withdrawn, or not published).
  bool ReleaseTarget(uint32_t qpn);
  void WithdrawTarget(uint32_t qpn);

  // What the host's other processes may import (ExportedObjects): a PD by handle, a region by its handle (the key's
  // index); false when no slot is free. Withdrawing a region returns once no importer copies through it.
  bool ExportPd(uint32_t handle);
  void WithdrawPd(uint32_t handle);
  bool ExportRegion(const ExportedRegion& region);
  void WithdrawExportedRegion(uint32_t lkey);

  // --- a process importing the owner's PDs and regions --------------------------------------------------------------
  bool HasPd(uint32_t handle) const;
  // The region of handle `handle` as exported (false: none).
  bool FindExportedRegion(uint32_t handle, ExportedRegion* out) const;
  // Whether the region of `lkey` is still exported and holds [there, there + n) (the owner's addresses): between
  // Enter and Leave, the copy that follows stays within it.
  bool Exported(uint32_t lkey, uint64_t there, uint64_t n) const;

  // --- whoever takes from the owner's XRC SRQs (the owner too) -------------------------------------------------------
  bool SrqInDomain(uint32_t srqn, uint64_t domain) const;
  // The next shown WQE of SRQ `srqn` claimed: its number in *index, its length in *length (false when every shown
  // one is claimed, or no such SRQ).
  bool ClaimSrqWqe(uint32_t srqn, uint64_t* index, uint32_t* length);

  // --- a process opening the owner's XRC target QPs, owner number `me` (1..255), pid `self` --------------------------
  // A handle on target QP `qpn` of domain `domain` (false: none such, or it is being destroyed).
  bool OpenTarget(uint32_t qpn, uint64_t domain, uint8_t me, pid_t self);
  // Its attributes as last published, at most attributes.size() bytes (false: not published).
  bool ReadTarget(uint32_t qpn, std::span<uint8_t> attributes) const;
  void CloseTarget(uint32_t qpn, uint8_t me);
  // Its holders (false: not published).
  bool TargetHolders(uint32_t qpn, uint64_t holders[4]) const;
  // The pid the process of owner number `n` wrote beside its counters (0: none); written for it (a holder of a
  // target QP another table had: the adopter's table takes its holders' pids along with their bits).
  pid_t ProcessOf(uint8_t n) const;
  void NoteProcess(uint8_t n, pid_t pid);

  // --- an initiator, owner number `me` (1..255) --------------------------------------------------------------------
  // Brackets every look-up and the copy that follows it: what Check found stays as it was until Leave. `self`: our
  // pid, which the owner looks at when a copy of ours takes long (we may have died inside it).
  void Enter(uint8_t me, pid_t self);
  void Leave(uint8_t me);
  // Whether our QP `src_qpn` may access [va, va+length) with `right` through the owner's QP `dest_qpn` and R_Key
  // `rkey`: the owner's address of va, or 0.
  uint64_t Check(uint32_t dest_qpn, uint32_t src_qpn, uint32_t rkey, uint64_t va, uint64_t length,
                 uint32_t right) const;
  // Whether a SEND of `length` bytes from our QP `send->src_qpn` to the owner's QP `send->dest_qpn` finds a receive
  // WQE that takes it: then its epoch and index are filled in, and the receive slot's number is stored in *slot for
  // CountSend. Only the QP's one peer sends to it, and only with nothing of its own in flight (RC executes in order:
  // every message it sent before has taken its WQE), so the next WQE is packets_taken + sends.
  bool ClaimReceive(DirectSend* send, uint64_t length, uint32_t* slot) const;
  // The SEND ClaimReceive allowed is in the owner's ring: counted, so the next takes the next WQE.
  void CountSend(uint32_t slot);

  // --- a WRITE shared with the owner: its second half copied by the owner's own thread --------------------------------
  // One process_vm_writev(2) of a 64 KiB WRITE keeps one core busy, most of it pinning the target's pages under its
  // page-table lock: a second thread of the initiator copying half of it contends for that lock and is slower. The
  // owner instead copies its half with process_vm_readv(2) from the initiator, pinning the initiator's pages under
  // the initiator's lock, while the initiator copies the first half: two cores, two locks.
  enum class Offer : uint32_t { kNone = 0, kFilling, kOffered, kTaken, kCopied, kFailed };
  // Initiator `me`, between Enter and Leave (so that the region stays registered), with [there, there+length)
  // checked (Check) for R_Key `rkey`, offers the owner to fill it from [src, src+length) of its own memory (it then
  // tells the owner through its ring: CopyOffer). false when an offer of ours is still there (another of our threads).
  bool OfferCopy(uint8_t me, uint32_t rkey, uint64_t src, uint64_t there, uint64_t length);
  Offer OfferOf(uint8_t me) const;
  // Takes the offer back unless the owner took it (true: the owner never copies it; the initiator does).
  bool WithdrawOffer(uint8_t me);
  // After kCopied or kFailed: our slot is free for the next offer.
  void ClearOffer(uint8_t me);
  // The owner: takes initiator n's offer when there is one (false: none, withdrawn, or already taken). One that does
  // not lie inside the published region of its R_Key with remote write access is refused (kFailed; false): the owner
  // writes its own memory only where a remote access may. Then the caller copies and reports with FinishOffer.
  bool TakeOffer(uint8_t n, uint64_t* src, uint64_t* there, uint64_t* length);
  void FinishOffer(uint8_t n, bool copied);

 private:
  struct Layout;
  DirectTable(void* base, size_t bytes);
  // Whether the owner's QP `dest_qpn` executes `right` for our QP `src_qpn` (its peer); its PD in *pd if given.
  bool Responds(uint32_t dest_qpn, uint32_t src_qpn, uint32_t right, uint32_t* pd) const;
  // The exported region slot of handle `handle` (a Layout::ExportSlot), its fields in *out if given; null when none.
  const void* FindExport(uint32_t handle, ExportedRegion* out) const;
  // A target QP's slot (a Layout::TargetSlot) whether or not its owner is closing it; null when not published.
  template <typename Slot>
  Slot* FindTarget(uint32_t qpn) const;
  // Waits until every owner number has left the copies it had entered (as the file comment says).
  void WaitForCopies();
  // Clears the key of `number`'s slot and forgets it; false when it was not published.
  template <typename Slot>
  bool Unpublish(std::unordered_map<uint32_t, uint32_t>& index, Slot* slots, uint32_t number);
  // Unpublish, then (if it was published) wait for the copies.
  template <typename Slot>
  void Withdraw(std::unordered_map<uint32_t, uint32_t>& index, Slot* slots, uint32_t number);

  void* base_;
  size_t bytes_;
  // The owner's own index of where each number and key sits (the shared slots are only ever read by others).
  std::mutex mu_;
  std::unordered_map<uint32_t, uint32_t> qp_slot_;      // qpn -> slot
  std::unordered_map<uint32_t, uint32_t> region_slot_;  // rkey -> slot
  std::unordered_map<uint32_t, uint32_t> receive_slot_;  // qpn -> slot
  std::unordered_map<uint32_t, uint32_t> srq_slot_;      // srqn -> slot
  std::unordered_map<uint32_t, uint32_t> target_slot_;   // qpn -> slot
  std::unordered_map<uint32_t, uint32_t> pd_slot_;       // handle -> slot
  std::unordered_map<uint32_t, uint32_t> export_slot_;   // lkey -> slot
};

// Whether process `pid` is gone (a pid of 0 or less, as a table holds for none written, counts as gone).
bool ProcessGone(pid_t pid);

// Copies between our memory and another process's (process_vm_writev(2), process_vm_readv(2)): whether all `length`
// bytes were copied. -errno: EPERM (ptrace rules forbid it: Yama, a seccomp filter, another user), ESRCH (the process
// is gone), EFAULT (an address not mapped), ENOSYS.
int CopyToProcess(pid_t pid, uint64_t remote, std::span<const std::span<const uint8_t>> pieces, uint64_t length);
int CopyFromProcess(pid_t pid, uint64_t remote, std::span<const std::span<uint8_t>> pieces, uint64_t length);

}  // namespace uroce::wire
