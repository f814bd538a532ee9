// Calls back after changes of the host's addresses (wire::OpenAddressChanges), on a thread of its own that sleeps in
// poll(2) until one comes: the host device's GID table follows them (Engine::RefreshGids).
#pragma once

#include <functional>
#include <thread>

namespace uroce::verbs {

class AddressWatcher {
 public:
  ~AddressWatcher() { Stop(); }
  // 0 or an errno (netlink refused: the table stays as it began).
  int Start(std::function<void()> changed);
  // Ends the thread (idempotent); `changed` is not called after it returns.
  void Stop();

 private:
  void Run();

  std::function<void()> changed_;
  int netlink_fd_ = -1;
  int stop_fd_ = -1;  // an eventfd: Stop's word
  std::thread thread_;
};

}  // namespace uroce::verbs
