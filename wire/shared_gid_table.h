// The host device's GID table as its service keeps it, in shared memory that every process of the host maps
// read-only: one table for the host, as a real device has one for all its users, so that an index names the same
// address in every process, and it lists only the addresses the service receives on (one whose UDP 4791 another
// program holds, kernel rxe's, stays out). The service is the one writer, under a sequence lock: it makes `seq` odd,
// changes the entries, makes it even again and wakes every process that sleeps on it (a futex on the shared page).
// The file is sealed against writable mappings but the service's (F_SEAL_FUTURE_WRITE): a process cannot change the
// table under the others.
//
// Error contract (as liburing's): 0 on success, -errno on failure.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>

#include "wire/address.h"

namespace uroce::wire {

class SharedGidTable {
 public:
  static constexpr size_t kEntries = 16;  // ibv_port_attr.gid_tbl_len (emu::GidTable::kEntries)
  using Entries = std::array<std::optional<IpAddress>, kEntries>;

  ~SharedGidTable();
  SharedGidTable(const SharedGidTable&) = delete;
  SharedGidTable& operator=(const SharedGidTable&) = delete;

  // The service's table, empty: a new memfd (fd(), the service's to hand out) mapped for writing.
  static int Create(std::unique_ptr<SharedGidTable>* out);
  // A process's view of the service's table `fd` (not taken: the caller closes it), mapped read-only. -EINVAL when
  // the file is not such a table.
  static int Attach(int fd, std::unique_ptr<SharedGidTable>* out);

  int fd() const { return fd_; }  // the service's memfd (-1 in a process)

  // The service: the table becomes `entries`, and every process waiting in WaitForChange wakes.
  void Publish(const Entries& entries);
  // The entries as they are, and the sequence they were read at: even, or odd when the writer left in the middle of a
  // change (waited for up to a second; the entries may then be torn).
  uint32_t Read(Entries* entries) const;
  // Sleeps until the sequence is no longer `seen` or Wake is called (or a signal comes): the caller reads again.
  void WaitForChange(uint32_t seen) const;
  // Wakes every thread in WaitForChange, of this process and any other.
  void Wake() const;

 private:
  struct Layout;
  SharedGidTable(Layout* layout, int fd) : layout_(layout), fd_(fd) {}
  Layout* layout_;
  int fd_;
};

}  // namespace uroce::wire
