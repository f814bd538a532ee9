#include "verbs_api/address_watcher.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>

#include "wire/host_addresses.h"

namespace uroce::verbs {

int AddressWatcher::Start(std::function<void()> changed) {
  changed_ = std::move(changed);
  netlink_fd_ = wire::OpenAddressChanges();
  if (netlink_fd_ < 0) return -netlink_fd_;
  stop_fd_ = eventfd(0, EFD_CLOEXEC);
  if (stop_fd_ < 0) return errno;
  thread_ = std::thread([this] { Run(); });
  return 0;
}

void AddressWatcher::Stop() {
  if (thread_.joinable()) {
    const uint64_t one = 1;
    (void)!write(stop_fd_, &one, sizeof one);
    thread_.join();
  }
  if (netlink_fd_ >= 0) close(netlink_fd_);
  if (stop_fd_ >= 0) close(stop_fd_);
  netlink_fd_ = stop_fd_ = -1;
}

void AddressWatcher::Run() {
  while (true) {
    pollfd fds[2] = {{netlink_fd_, POLLIN, 0}, {stop_fd_, POLLIN, 0}};
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (fds[1].revents != 0) return;
    if (wire::TakeAddressChanges(netlink_fd_)) changed_();
  }
}

}  // namespace uroce::verbs
