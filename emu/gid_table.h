// The port's GID table (IBTA 4.1.1; RoCEv2, annex A17.8: a GID is an IPv6 address or an IPv4-mapped one). Each
// populated entry is a local address the device receives at and sends from; a QP's address vector names its source
// by index (ibv_modify_qp(3), ah_attr.grh.sgid_index). Entry 0 is the device's own address. The others follow the
// host's addresses: an address that stays keeps its index, one that goes leaves its entry empty, one that comes takes
// the lowest empty entry (the kernel's GID cache does the same), so an index a QP or AH holds never comes to name
// another address while it is in use. Thread-safe: the data path reads what a QP resolved when it was given its
// address vector, so the table's lock is never on the way of a packet.
#pragma once

#include <array>
#include <cstdint>
#include <mutex>
#include <optional>
#include <span>
#include <vector>

#include "wire/address.h"

namespace uroce::emu {

class GidTable {
 public:
  // ibv_port_attr.gid_tbl_len: the entries a program may ask for (ibv_query_gid), populated or not.
  static constexpr uint32_t kEntries = 16;

  explicit GidTable(const wire::IpAddress& first) { entries_[0] = first; }

  // The address at `index`; nullopt for an empty entry or one past the table.
  std::optional<wire::IpAddress> At(uint32_t index) const;
  // The index of `address`; nullopt when the table lacks it.
  std::optional<uint32_t> IndexOf(const wire::IpAddress& address) const;
  // The populated entries' addresses, by index.
  std::vector<std::pair<uint32_t, wire::IpAddress>> Populated() const;

  // Makes entries 1.. hold exactly `others` (entry 0 and duplicates of it are left as they are) by the rule above;
  // what does not fit stays out. Returns whether any entry changed (IBV_EVENT_GID_CHANGE is then due).
  bool Update(std::span<const wire::IpAddress> others);
  // Every entry, by index (nullopt: empty).
  std::array<std::optional<wire::IpAddress>, kEntries> Entries() const;
  // Takes entries 1.. from `entries` as they are (another's table, kept by the rule above: the host device's
  // service's, wire/shared_gid_table.h); entry 0 stays. Returns whether any entry changed.
  bool Assign(const std::array<std::optional<wire::IpAddress>, kEntries>& entries);

 private:
  mutable std::mutex mu_;
  std::array<std::optional<wire::IpAddress>, kEntries> entries_;
};

}  // namespace uroce::emu
