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
// Error contract (as liburing's): functions that can fail return 0 or a count on success, -errno on failure.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <unordered_map>

#include "wire/address.h"

namespace uroce::wire {

// Remote rights, as a table entry holds them.
namespace direct_rights {
inline constexpr uint32_t kWrite = 1u << 0;
inline constexpr uint32_t kRead = 1u << 1;
}  // namespace direct_rights

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

  // Our side. Publishing a QP or region replaces what was published for its number or key. A withdrawal returns once
  // no other process copies through the entry any more; withdrawing what is not published does nothing.
  virtual void PublishQp(const QpEntry& qp) = 0;
  virtual void WithdrawQp(uint32_t qpn) = 0;
  virtual void PublishRegion(const Region& region) = 0;
  virtual void WithdrawRegion(uint32_t rkey) = 0;
};

// One process's table in shared memory. The owner publishes and withdraws; the host's other processes look up and
// count their copies (Enter/Leave). Layout (host byte order; both ends run on one host):
//   0       magic u64, owner's pid i32, QP slots u32, region slots u32
//   64      per owner number 0..255: entered u64, left u64, pid i32 (of the process holding that number), padding
//           (64 bytes each: initiators never share a cache line)
//   then    QP slots: key u32 (1 << 31 | qpn, 0: empty), peer_qpn u32, pd u32, rights u32
//   then    region slots (32 bytes): key u64 (1 << 32 | rkey, 0: empty), pd u32, rights u32, iova u64, length u64,
//           host u64
// An entry lives in the slot its number hashes to or one of the kProbe after it.
class DirectTable {
 public:
  static constexpr uint64_t kMagic = 0x75726f63'44697231ULL;  // "urocDir1"
  static constexpr uint32_t kQpSlots = 4096;
  static constexpr uint32_t kRegionSlots = 8192;
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

  // --- an initiator, owner number `me` (1..255) --------------------------------------------------------------------
  // Brackets every look-up and the copy that follows it: what Check found stays as it was until Leave. `self`: our
  // pid, which the owner looks at when a copy of ours takes long (we may have died inside it).
  void Enter(uint8_t me, pid_t self);
  void Leave(uint8_t me);
  // Whether our QP `src_qpn` may access [va, va+length) with `right` through the owner's QP `dest_qpn` and R_Key
  // `rkey`: the owner's address of va, or 0.
  uint64_t Check(uint32_t dest_qpn, uint32_t src_qpn, uint32_t rkey, uint64_t va, uint64_t length,
                 uint32_t right) const;

 private:
  struct Layout;
  DirectTable(void* base, size_t bytes);
  // Waits until every owner number has left the copies it had entered (as the file comment says).
  void WaitForCopies();
  // Clears the key of `number`'s slot (if published), forgets it, and waits for the copies.
  template <typename Slot>
  void Withdraw(std::unordered_map<uint32_t, uint32_t>& index, Slot* slots, uint32_t number);

  void* base_;
  size_t bytes_;
  // The owner's own index of where each number and key sits (the shared slots are only ever read by others).
  std::mutex mu_;
  std::unordered_map<uint32_t, uint32_t> qp_slot_;      // qpn -> slot
  std::unordered_map<uint32_t, uint32_t> region_slot_;  // rkey -> slot
};

// Copies between our memory and another process's (process_vm_writev(2), process_vm_readv(2)): whether all `length`
// bytes were copied. -errno: EPERM (ptrace rules forbid it: Yama, a seccomp filter, another user), ESRCH (the process
// is gone), EFAULT (an address not mapped), ENOSYS.
int CopyToProcess(pid_t pid, uint64_t remote, std::span<const std::span<const uint8_t>> pieces, uint64_t length);
int CopyFromProcess(pid_t pid, uint64_t remote, std::span<const std::span<uint8_t>> pieces, uint64_t length);

}  // namespace uroce::wire
