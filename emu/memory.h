// Protection domains, memory regions and the key table: every byte the HCA touches on behalf of a work request or a
// remote peer passes one of the checks here first (IBTA vol1 10.6: memory protection; 9.7.5.1.x: remote access
// validation — R_Key, PD, bounds, access rights).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <unordered_map>

#include "emu/types.h"
#include "emu/work_request.h"

namespace uroce::emu {

class ProtectionDomain {
 public:
  explicit ProtectionDomain(uint32_t handle) : handle_(handle) {}
  uint32_t handle() const { return handle_; }

 private:
  uint32_t handle_;
};

// The memory of a region another process registered and this one imported (ibv_import_mr(3) of a handle that came
// with that process's cmd_fd): the HCA reaches it only through these copies, at addresses of that process. Each is
// false when nothing or not all could be copied (the region deregistered there, the process gone, the range unmapped
// since): the caller answers as for an access outside a valid region. Atomics are not offered (they would not be
// atomic against that process's CPU): the caller refuses them. Called from any thread.
class ForeignMemory {
 public:
  virtual ~ForeignMemory() = default;
  virtual bool Read(uint64_t there, void* into, size_t n) = 0;
  virtual bool Write(uint64_t there, const void* from, size_t n) = 0;
};

struct MemoryRegion {
  const ProtectionDomain* pd = nullptr;
  // Where the region's first byte lives in this process; of an imported region (foreign set), in the process that
  // registered it: never dereferenced here then.
  uint8_t* host = nullptr;
  uint64_t iova = 0;        // the address work requests and peers use for that first byte
  uint64_t length = 0;
  uint32_t access = 0;      // emu::access flags
  uint32_t lkey = 0;
  uint32_t rkey = 0;
  // Implicit on-demand paging (IBV_ACCESS_ON_DEMAND over the whole address space, ibv_reg_mr(pd, NULL, SIZE_MAX)):
  // every address is its own host address, and is checked to be mapped when used instead of at registration.
  bool implicit = false;
  std::shared_ptr<ForeignMemory> foreign;  // set for a region imported from another process

  // The host pointer for [va, va+len) if it lies within the region, else nullptr. len 0 is within any region.
  uint8_t* Translate(uint64_t va, uint64_t len) const;
};

// A memory window (IBTA 10.6.7): a remote-access window onto part of a registered region, bound and unbound at run
// time. Type 1 is bound by ibv_bind_mw and usable through any QP of its PD; type 2 is bound by a BIND_MW work request
// to one QP, and only that QP's peer may use it; both are named by an R_Key whose low byte changes with each bind.
struct MemoryWindow {
  const ProtectionDomain* pd = nullptr;
  uint8_t type = 1;
  uint32_t rkey = 0;
  bool bound = false;
  uint32_t mr_lkey = 0;
  uint64_t va = 0;
  uint64_t length = 0;
  uint32_t access = 0;
  uint32_t qpn = 0;  // type 2: the QP it is bound to
};

// Why an access was refused; each maps to a completion status or a NAK at the caller.
enum class AccessError : uint8_t { kNone, kBadKey, kWrongPd, kOutOfBounds, kNoPermission, kMisaligned };

struct AccessResult {
  AccessError error = AccessError::kNone;
  uint8_t* host = nullptr;
  ForeignMemory* foreign = nullptr;  // `host` is another process's address, reached through this (ForeignMemory)
  bool ok() const { return error == AccessError::kNone; }
};

// Copies out of (ReadRegion) or into (WriteRegion) the memory an access was granted, [host, host+n): guarded in our
// own memory (emu/host_memory.h), through ForeignMemory in another process's. False when it could not be done.
bool ReadRegion(const AccessResult& access, void* into, size_t n);
bool WriteRegion(const AccessResult& access, const void* from, size_t n);

// lkey/rkey -> region. Keys are (slot index << 8) | generation, so a stale key of a deregistered region does not
// alias its successor (the low byte is the "key" part of an L_Key/R_Key, IBTA 10.6.3.3).
class KeyTable {
 public:
  // Keys start at index 1 with key byte 0x17 for seed 0, else at an index and key byte drawn from `seed`. A non-zero
  // `owner` (a process's share of the host device, DeviceConfig::owner) confines the indices to owner << 16 | n, so
  // that the keys of the host's processes never collide: the host's one device has one key space.
  explicit KeyTable(uint64_t seed = 0, uint8_t owner = 0);
  // Registers a region; returns it with lkey/rkey filled in (0 when every index is taken).
  MemoryRegion Register(MemoryRegion mr);
  // Registers a region under keys given to it (an imported region keeps the keys its process gave it): EEXIST when
  // another region or window has their index.
  int Adopt(const MemoryRegion& mr);
  bool AnyInPd(const ProtectionDomain* pd) const;
  // Updates a registered region in place (rereg_mr); false if the key is unknown.
  bool Update(uint32_t lkey, const MemoryRegion& mr);
  bool Deregister(uint32_t lkey);
  const MemoryRegion* Find(uint32_t key) const;
  // The region whose keys have index `handle` (key >> 8, the MR's handle in verbs), whatever their key byte.
  const MemoryRegion* FindByHandle(uint32_t handle) const;

  // Validates a local access: lkey names a region of `pd` holding [va, va+len) and allowing `needed` (access flags;
  // local read is always allowed, IBTA 10.6.3.1).
  AccessResult CheckLocal(uint32_t lkey, const ProtectionDomain* pd, uint64_t va, uint64_t len, uint32_t needed) const;
  // Validates a remote access by an incoming request (RDMA WRITE/READ/atomic): rkey, PD, bounds, rights. `qpn` is
  // the QP the request arrived on (a type 2 window answers only its own QP).
  AccessResult CheckRemote(uint32_t rkey, const ProtectionDomain* pd, uint64_t va, uint64_t len, uint32_t needed,
                           uint32_t qpn = 0) const;

  // Memory windows. Allocation returns the window's first R_Key (0 when every index is taken).
  uint32_t AllocateWindow(const ProtectionDomain* pd, uint8_t type);
  // EBUSY for a bound type 2 window (it must be invalidated first), EINVAL for an unknown key.
  int DeallocateWindow(uint32_t rkey);
  const MemoryWindow* FindWindow(uint32_t rkey) const;
  // Binds (length > 0) or unbinds (length 0, type 1) a window (IBTA 10.6.7.2): the region must be of the window's PD,
  // allow MW_BIND, contain [va, va+length); the window grants the remote rights of `access` (remote write or atomic
  // only on a region with local write, C10-75; a local-write bit is ignored; zero-based windows are refused);
  // `new_rkey` differs from the current key only in its low byte. 0 or EINVAL.
  int BindWindow(uint32_t rkey, uint32_t new_rkey, const ProtectionDomain* pd, uint32_t mr_lkey, uint64_t va,
                 uint64_t length, uint32_t access, uint32_t qpn);
  // Invalidates a bound type 2 window (LOCAL_INV, or SEND with invalidate arriving on QP `qpn`; 0 = local). 0 or
  // EINVAL.
  int InvalidateWindow(uint32_t rkey, uint32_t qpn);

  size_t size() const { return regions_.size(); }

 private:
  uint32_t NewIndex();
  std::unordered_map<uint32_t, MemoryRegion> regions_;  // by index (key >> 8)
  std::unordered_map<uint32_t, MemoryWindow> windows_;  // by index, disjoint from regions_'
  uint32_t next_index_ = 1;
  uint8_t generation_ = 0x17;
  uint8_t owner_ = 0;
};

}  // namespace uroce::emu
