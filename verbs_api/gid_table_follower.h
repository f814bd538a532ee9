// Follows the host device's GID table, which its service keeps for the whole host (wire::SharedGidTable), on a thread
// of its own that sleeps on the table's futex until the service changes it, and hands each new table to the engine
// (Engine::ApplyGids): so an index names the same address in every process of the host, as on a real device.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <thread>

#include "wire/shared_gid_table.h"

namespace uroce::verbs {

class GidTableFollower {
 public:
  using Changed = std::function<void(const wire::SharedGidTable::Entries& entries, bool announce)>;
  ~GidTableFollower() { Stop(); }
  // Takes `table`, calls `changed(entries, false)` with it as it is now, here, and then `changed(entries, true)` on the
  // follower's thread after each change. 0 or an errno (the thread could not start).
  int Start(std::unique_ptr<wire::SharedGidTable> table, Changed changed);
  // Ends the thread (idempotent); `changed` is not called after it returns.
  void Stop();

 private:
  void Run(uint32_t seen);

  std::unique_ptr<wire::SharedGidTable> table_;
  Changed changed_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> exited_{false};  // Run has returned
  std::thread thread_;
};

}  // namespace uroce::verbs
