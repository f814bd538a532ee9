#include "emu/memory.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <vector>

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

MemoryRegion KeyTable::Register(MemoryRegion mr) {
  uint32_t index = next_index_ & 0xffffff;
  while (index == 0 || regions_.count(index)) index = (index + 1) & 0xffffff;
  next_index_ = index + 1;
  generation_ = static_cast<uint8_t>(generation_ * 5 + 1);
  mr.lkey = mr.rkey = (index << 8) | generation_;
  regions_[index] = mr;
  return mr;
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
  return {AccessError::kNone, host};
}

AccessResult KeyTable::CheckRemote(uint32_t rkey, const ProtectionDomain* pd, uint64_t va, uint64_t len,
                                   uint32_t needed) const {
  // A zero-length RDMA operation carries no R_Key check (IBTA 9.4.3 / 9.4.4: "if the DMA length is zero... the R_Key
  // is not validated").
  if (len == 0) return {AccessError::kNone, nullptr};
  const MemoryRegion* mr = Find(rkey);
  if (mr == nullptr) return {AccessError::kBadKey};
  if (mr->pd != pd) return {AccessError::kWrongPd};
  if ((mr->access & needed) != needed) return {AccessError::kNoPermission};
  uint8_t* host = mr->Translate(va, len);
  if (host == nullptr) return {AccessError::kOutOfBounds};
  return {AccessError::kNone, host};
}

}  // namespace uroce::emu
