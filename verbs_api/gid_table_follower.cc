#include "verbs_api/gid_table_follower.h"

#include <cerrno>
#include <chrono>
#include <system_error>

namespace uroce::verbs {

int GidTableFollower::Start(std::unique_ptr<wire::SharedGidTable> table, Changed changed) {
  table_ = std::move(table);
  changed_ = std::move(changed);
  wire::SharedGidTable::Entries entries;
  const uint32_t seen = table_->Read(&entries);
  changed_(entries, /*announce=*/false);
  try {
    thread_ = std::thread([this, seen] { Run(seen); });
  } catch (const std::system_error& e) {
    return e.code().value() != 0 ? e.code().value() : EAGAIN;
  }
  return 0;
}

void GidTableFollower::Stop() {
  if (!thread_.joinable()) return;
  stop_.store(true);
  // Woken until it is out: a wake that came between its look at stop_ and its sleep found nobody asleep. Each wakes
  // every sleeper on the table, other processes' too: theirs read it again, find it unchanged and sleep on.
  while (!exited_.load()) {
    table_->Wake();
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  thread_.join();
}

void GidTableFollower::Run(uint32_t seen) {
  wire::SharedGidTable::Entries entries;
  while (!stop_.load()) {
    table_->WaitForChange(seen);
    if (stop_.load()) break;
    const uint32_t now = table_->Read(&entries);
    if (now == seen) continue;  // woken for another reason (a Stop elsewhere, a signal)
    seen = now;
    if (now & 1) continue;  // torn: its writer left in the middle (SharedGidTable::Read); sleep until it changes
    changed_(entries, /*announce=*/true);
  }
  exited_.store(true);
}

}  // namespace uroce::verbs
