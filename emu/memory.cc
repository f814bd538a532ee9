#include "emu/memory.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <vector>

#include "emu/host_memory.h"

namespace uroce::emu {

namespace {

// Whether every page of [va, va+len) is mapped in this process: mincore(2) fails with ENOMEM on an unmapped page.
// (Used for implicit ODP regions, where a real HCA would take a page fault; a mapped read-only page written through
// such a region is not detected.)
bool IsMapped(uint64_t va, uint64_t len) {
  static const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  if (len == 0) return true;
  if (va + len < va) return false;
  const uint64_t first = va & ~(page - 1);
  const uint64_t end = (va + len + page - 1) & ~(page - 1);
  std::vector<unsigned char> vec((end - first) / page);
  return mincore(reinterpret_cast<void*>(first), end - first, vec.data()) == 0;
}

}  // namespace

uint8_t* MemoryRegion::Translate(uint64_t va, uint64_t len) const {
  if (implicit) return IsMapped(va, len) ? reinterpret_cast<uint8_t*>(va) : nullptr;
  if (va < iova) return nullptr;
  const uint64_t offset = va - iova;
  if (offset > length || len > length - offset) return nullptr;
  return host + offset;
}

KeyTable::KeyTable(uint64_t seed, uint8_t owner) : owner_(owner) {
  if (seed == 0) return;
  next_index_ = uint32_t(seed % 0xfffffe) + 1;  // 24 bits, never 0
  generation_ = uint8_t(seed >> 32);
}

bool ReadRegion(const AccessResult& access, void* into, size_t n) {
  if (n == 0) return true;
  if (access.foreign != nullptr) return access.foreign->Read(reinterpret_cast<uintptr_t>(access.host), into, n);
  return CopyGuarded(into, access.host, n);
}

bool WriteRegion(const AccessResult& access, const void* from, size_t n) {
  if (n == 0) return true;
  if (access.foreign != nullptr) return access.foreign->Write(reinterpret_cast<uintptr_t>(access.host), from, n);
  return CopyGuarded(access.host, from, n);
}

uint32_t KeyTable::NewIndex() {
  // The indices this table may hand out: 24 bits, or the owner's 16 below its byte.
  const uint32_t base = uint32_t(owner_) << 16, mask = owner_ != 0 ? 0xffff : 0xffffff;
  auto in_space = [&](uint32_t n) { return base | (n & mask); };
  if (regions_.size() + windows_.size() >= mask) return 0;  // every index taken
  uint32_t index = in_space(next_index_);
  while ((index & mask) == 0 || regions_.count(index) || windows_.count(index)) index = in_space(index + 1);
  next_index_ = index + 1;
  generation_ = static_cast<uint8_t>(generation_ * 5 + 1);
  return index;
}

MemoryRegion KeyTable::Register(MemoryRegion mr) {
  const uint32_t index = NewIndex();
  if (index == 0) return mr;  // keys 0: none free
  mr.lkey = mr.rkey = (index << 8) | generation_;
  regions_[index] = mr;
  return mr;
}

int KeyTable::Adopt(const MemoryRegion& mr) {
  const uint32_t index = mr.lkey >> 8;
  if (index == 0 || mr.rkey != mr.lkey || regions_.count(index) || windows_.count(index)) return EEXIST;
  regions_[index] = mr;
  return 0;
}

bool KeyTable::AnyInPd(const ProtectionDomain* pd) const {
  for (const auto& [_, mr] : regions_)
    if (mr.pd == pd) return true;
  return false;
}

bool KeyTable::Update(uint32_t lkey, const MemoryRegion& mr) {
  auto it = regions_.find(lkey >> 8);
  if (it == regions_.end() || it->second.lkey != lkey) return false;
  MemoryRegion updated = mr;
  updated.lkey = it->second.lkey;
  updated.rkey = it->second.rkey;
  it->second = updated;
  return true;
}

bool KeyTable::Deregister(uint32_t lkey) {
  auto it = regions_.find(lkey >> 8);
  if (it == regions_.end() || it->second.lkey != lkey) return false;
  regions_.erase(it);
  return true;
}

const MemoryRegion* KeyTable::FindByHandle(uint32_t handle) const {
  auto it = regions_.find(handle);
  return it == regions_.end() ? nullptr : &it->second;
}

const MemoryRegion* KeyTable::Find(uint32_t key) const {
  auto it = regions_.find(key >> 8);
  if (it == regions_.end() || it->second.lkey != key) return nullptr;
  return &it->second;
}

AccessResult KeyTable::CheckLocal(uint32_t lkey, const ProtectionDomain* pd, uint64_t va, uint64_t len,
                                  uint32_t needed) const {
  const MemoryRegion* mr = Find(lkey);
  if (mr == nullptr) return {AccessError::kBadKey};
  if (mr->pd != pd) return {AccessError::kWrongPd};
  if ((mr->access & needed) != needed) return {AccessError::kNoPermission};
  uint8_t* host = mr->Translate(va, len);
  if (host == nullptr) return {AccessError::kOutOfBounds};
  return {AccessError::kNone, host, mr->foreign.get()};
}

AccessResult KeyTable::CheckRemote(uint32_t rkey, const ProtectionDomain* pd, uint64_t va, uint64_t len,
                                   uint32_t needed, uint32_t qpn) const {
  // A zero-length RDMA operation carries no R_Key check (IBTA 9.4.3 / 9.4.4: "if the DMA length is zero... the R_Key
  // is not validated").
  if (len == 0) return {AccessError::kNone, nullptr};
  if (const MemoryWindow* w = FindWindow(rkey)) {
    if (!w->bound) return {AccessError::kBadKey};
    if (w->pd != pd) return {AccessError::kWrongPd};
    if (w->type == 2 && w->qpn != qpn) return {AccessError::kBadKey};  // IBTA 10.6.7.2.2: only the bound QP
    if ((w->access & needed) != needed) return {AccessError::kNoPermission};
    if (va < w->va || va - w->va > w->length || len > w->length - (va - w->va)) return {AccessError::kOutOfBounds};
    const MemoryRegion* under = Find(w->mr_lkey);
    uint8_t* host = under ? under->Translate(va, len) : nullptr;
    if (host == nullptr) return {AccessError::kOutOfBounds};
    return {AccessError::kNone, host, under->foreign.get()};
  }
  const MemoryRegion* mr = Find(rkey);
  if (mr == nullptr) return {AccessError::kBadKey};
  if (mr->pd != pd) return {AccessError::kWrongPd};
  if ((mr->access & needed) != needed) return {AccessError::kNoPermission};
  uint8_t* host = mr->Translate(va, len);
  if (host == nullptr) return {AccessError::kOutOfBounds};
  return {AccessError::kNone, host, mr->foreign.get()};
}

uint32_t KeyTable::AllocateWindow(const ProtectionDomain* pd, uint8_t type) {
  const uint32_t index = NewIndex();
  if (index == 0) return 0;
  MemoryWindow w;
  w.pd = pd;
  w.type = type;
  w.rkey = (index << 8) | generation_;
  windows_[index] = w;
  return w.rkey;
}

const MemoryWindow* KeyTable::FindWindow(uint32_t rkey) const {
  auto it = windows_.find(rkey >> 8);
  if (it == windows_.end() || it->second.rkey != rkey) return nullptr;
  return &it->second;
}

int KeyTable::DeallocateWindow(uint32_t rkey) {
  auto it = windows_.find(rkey >> 8);
  if (it == windows_.end()) return EINVAL;
  windows_.erase(it);
  return 0;
}

int KeyTable::BindWindow(uint32_t rkey, uint32_t new_rkey, const ProtectionDomain* pd, uint32_t mr_lkey, uint64_t va,
                         uint64_t length, uint32_t rights, uint32_t qpn) {
  auto it = windows_.find(rkey >> 8);
  if (it == windows_.end() || it->second.rkey != rkey || (new_rkey >> 8) != (rkey >> 8)) return EINVAL;
  MemoryWindow& w = it->second;
  if (w.pd != pd) return EINVAL;
  if (w.type == 2 && w.bound) return EINVAL;  // a bound type 2 window must be invalidated first (10.6.7.2.2)
  if (length == 0) {
    if (w.type == 2) return EINVAL;
    w.bound = false;
    w.rkey = new_rkey;
    return 0;
  }
  const MemoryRegion* mr = Find(mr_lkey);
  if (mr == nullptr || mr->pd != pd || !(mr->access & access::kMwBind)) return EINVAL;
  if (!mr->implicit && (va < mr->iova || va - mr->iova > mr->length || length > mr->length - (va - mr->iova)))
    return EINVAL;
  constexpr uint32_t kRemote = access::kRemoteRead | access::kRemoteWrite | access::kRemoteAtomic;
  // Local write in a bind is accepted and ignored (rxe, mlx5): a window only ever grants remote access. Zero-based
  // windows are not implemented: refused (as mlx5 refuses them) rather than bound as VA-based.
  if (rights & ~(kRemote | access::kLocalWrite)) return EINVAL;
  if ((rights & (access::kRemoteWrite | access::kRemoteAtomic)) && !(mr->access & access::kLocalWrite)) return EINVAL;
  w.bound = true;
  w.rkey = new_rkey;
  w.mr_lkey = mr_lkey;
  w.va = va;
  w.length = length;
  w.access = rights & kRemote;
  w.qpn = qpn;
  return 0;
}

int KeyTable::InvalidateWindow(uint32_t rkey, uint32_t qpn) {
  auto it = windows_.find(rkey >> 8);
  if (it == windows_.end() || it->second.rkey != rkey) return EINVAL;
  MemoryWindow& w = it->second;
  if (w.type != 2 || !w.bound || (qpn != 0 && w.qpn != qpn)) return EINVAL;
  w.bound = false;
  return 0;
}

}  // namespace uroce::emu
