#include "emu/gid_table.h"

#include <algorithm>

namespace uroce::emu {

std::optional<wire::IpAddress> GidTable::At(uint32_t index) const {
  if (index >= kEntries) return std::nullopt;
  std::lock_guard lock(mu_);
  return entries_[index];
}

std::optional<uint32_t> GidTable::IndexOf(const wire::IpAddress& address) const {
  std::lock_guard lock(mu_);
  for (uint32_t i = 0; i < kEntries; ++i) {
    if (entries_[i] == address) return i;
  }
  return std::nullopt;
}

std::vector<std::pair<uint32_t, wire::IpAddress>> GidTable::Populated() const {
  std::lock_guard lock(mu_);
  std::vector<std::pair<uint32_t, wire::IpAddress>> out;
  for (uint32_t i = 0; i < kEntries; ++i) {
    if (entries_[i]) out.emplace_back(i, *entries_[i]);
  }
  return out;
}

bool GidTable::Update(std::span<const wire::IpAddress> others) {
  std::lock_guard lock(mu_);
  auto wanted = [&](const wire::IpAddress& a) {
    return a != entries_[0] && std::find(others.begin(), others.end(), a) != others.end();
  };
  bool changed = false;
  for (uint32_t i = 1; i < kEntries; ++i) {
    if (entries_[i] && !wanted(*entries_[i])) {
      entries_[i].reset();
      changed = true;
    }
  }
  for (const wire::IpAddress& a : others) {
    if (a == entries_[0] || std::find(entries_.begin() + 1, entries_.end(), a) != entries_.end()) continue;
    auto empty = std::find(entries_.begin() + 1, entries_.end(), std::nullopt);
    if (empty == entries_.end()) break;
    *empty = a;
    changed = true;
  }
  return changed;
}

std::array<std::optional<wire::IpAddress>, GidTable::kEntries> GidTable::Entries() const {
  std::lock_guard lock(mu_);
  return entries_;
}

bool GidTable::Assign(const std::array<std::optional<wire::IpAddress>, kEntries>& entries) {
  std::lock_guard lock(mu_);
  bool changed = false;
  for (uint32_t i = 1; i < kEntries; ++i) {
    if (entries_[i] == entries[i]) continue;
    entries_[i] = entries[i];
    changed = true;
  }
  return changed;
}

}  // namespace uroce::emu
