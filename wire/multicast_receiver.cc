#include "wire/multicast_receiver.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <vector>

#include "wire/event_fd.h"
#include "wire/udp_socket.h"

namespace uroce::wire {

MulticastReceiver::MulticastReceiver(IpAddress local, uint16_t port, std::function<void(const InDatagram&)> deliver)
    : local_(local), port_(port), deliver_(std::move(deliver)) {
  wake_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  thread_ = std::thread([this] { Run(); });
}

MulticastReceiver::~MulticastReceiver() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  SignalEventFd(wake_fd_);
  thread_.join();
  for (auto& [group, g] : groups_) close(g.fd);
  close(wake_fd_);
}

int MulticastReceiver::Join(const IpAddress& group) {
  if (!group.is_v4() || !local_.is_v4()) return EINVAL;
  std::lock_guard lock(mu_);
  Group& g = groups_[group];
  if (g.joins++ > 0) return 0;
  const int fd = OpenKernelUdpSocket(AF_INET, SOCK_NONBLOCK);
  int err = fd < 0 ? errno : 0;
  const int one = 1;
  sockaddr_in sin{};
  sin.sin_family = AF_INET;
  sin.sin_port = htons(port_);
  sin.sin_addr.s_addr = htonl(group.v4());
  ip_mreq mreq{};
  mreq.imr_multiaddr.s_addr = htonl(group.v4());
  mreq.imr_interface.s_addr = htonl(local_.v4());
  if (!err && (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0 ||
               bind(fd, reinterpret_cast<sockaddr*>(&sin), sizeof sin) != 0 ||
               setsockopt(fd, IPPROTO_IP, IP_ADD_MEMBERSHIP, &mreq, sizeof mreq) != 0))
    err = errno;
  if (err) {
    if (fd >= 0) close(fd);
    groups_.erase(group);
    return err;
  }
  g.fd = fd;
  const uint64_t wake = 1;
  (void)!write(wake_fd_, &wake, sizeof wake);
  return 0;
}

void MulticastReceiver::Leave(const IpAddress& group) {
  std::lock_guard lock(mu_);
  auto it = groups_.find(group);
  if (it == groups_.end() || --it->second.joins > 0) return;
  // The thread may be polling the descriptor: shut it down for reading, and let the thread close it.
  shutdown(it->second.fd, SHUT_RD);
  it->second.joins = 0;
  const uint64_t wake = 1;
  (void)!write(wake_fd_, &wake, sizeof wake);
}

void MulticastReceiver::Run() {
  std::vector<uint8_t> buf(65536);
  for (;;) {
    std::vector<pollfd> fds{{wake_fd_, POLLIN, 0}};
    std::vector<IpAddress> groups{IpAddress()};
    {
      std::lock_guard lock(mu_);
      if (stop_) return;
      for (auto it = groups_.begin(); it != groups_.end();) {
        if (it->second.joins == 0) {  // left: close it here, where nobody polls it
          close(it->second.fd);
          it = groups_.erase(it);
          continue;
        }
        fds.push_back({it->second.fd, POLLIN, 0});
        groups.push_back(it->first);
        ++it;
      }
    }
    if (poll(fds.data(), fds.size(), -1) < 0) continue;
    if (fds[0].revents) {
      uint64_t v;
      (void)!read(wake_fd_, &v, sizeof v);
    }
    for (size_t i = 1; i < fds.size(); ++i) {
      if (!(fds[i].revents & POLLIN)) continue;
      for (;;) {
        sockaddr_in from{};
        socklen_t len = sizeof from;
        const ssize_t n = recvfrom(fds[i].fd, buf.data(), buf.size(), 0, reinterpret_cast<sockaddr*>(&from), &len);
        if (n <= 0) break;
        InDatagram d;
        d.src = UdpEndpoint{IpAddress::V4(ntohl(from.sin_addr.s_addr)), ntohs(from.sin_port)};
        d.dst = UdpEndpoint{groups[i], port_};
        d.payload = std::span<const uint8_t>(buf.data(), static_cast<size_t>(n));
        deliver_(d);  // the IPv4 ID is unknown here (ip_id nullopt): the device solves for it, as for any socket
      }
    }
  }
}

}  // namespace uroce::wire
