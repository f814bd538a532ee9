#include "rdmacm/peer_watch.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

namespace uroce::rdmacm {
namespace {

sockaddr_un NameOf(const wire::IpAddress& device, socklen_t* len) {
  const std::string name = "uroce/cm/v1/device/" + device.ToString();
  sockaddr_un sun{};
  sun.sun_family = AF_UNIX;
  const size_t n = std::min(name.size(), sizeof(sun.sun_path) - 1);
  std::memcpy(sun.sun_path + 1, name.data(), n);  // sun_path[0] == 0: the abstract namespace
  *len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + n);
  return sun;
}

}  // namespace

int PeerWatch::Start(const wire::IpAddress& self, std::function<void(const wire::IpAddress&)> on_gone) {
  self_ = self;
  on_gone_ = std::move(on_gone);
  announce_fd_ = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  if (announce_fd_ < 0) return errno;
  socklen_t len;
  sockaddr_un sun = NameOf(self, &len);
  // Watchers connect and are never accepted: the backlog only bounds how many may wait in the queue.
  if (bind(announce_fd_, reinterpret_cast<sockaddr*>(&sun), len) != 0 || listen(announce_fd_, SOMAXCONN) != 0)
    return errno;
  wake_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake_fd_ < 0) return errno;
  thread_ = std::thread([this] { Run(); });
  thread_.detach();  // lives as long as the process: the library is never unloaded
  return 0;
}

void PeerWatch::Watch(const wire::IpAddress& peer) {
  if (peer == self_ || wake_fd_ < 0) return;
  std::lock_guard lock(mu_);
  if (watched_.count(peer)) return;
  const int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return;
  socklen_t len;
  sockaddr_un sun = NameOf(peer, &len);
  if (connect(fd, reinterpret_cast<sockaddr*>(&sun), len) != 0) {
    close(fd);  // not a uroce device of this host (ECONNREFUSED), or its queue is full (EAGAIN): not watched
    return;
  }
  watched_[peer] = fd;
  const uint64_t one = 1;
  (void)!write(wake_fd_, &one, sizeof one);
}

void PeerWatch::Run() {
  for (;;) {
    std::vector<pollfd> fds{{wake_fd_, POLLIN, 0}};
    std::vector<wire::IpAddress> peers{wire::IpAddress()};
    {
      std::lock_guard lock(mu_);
      for (const auto& [peer, fd] : watched_) {
        fds.push_back({fd, POLLRDHUP, 0});
        peers.push_back(peer);
      }
    }
    if (poll(fds.data(), fds.size(), -1) < 0) continue;
    if (fds[0].revents) {
      uint64_t v;
      (void)!read(wake_fd_, &v, sizeof v);
    }
    for (size_t i = 1; i < fds.size(); ++i) {
      if (!(fds[i].revents & (POLLHUP | POLLRDHUP | POLLERR))) continue;
      {
        std::lock_guard lock(mu_);
        watched_.erase(peers[i]);
      }
      close(fds[i].fd);
      on_gone_(peers[i]);
    }
  }
}

}  // namespace uroce::rdmacm
