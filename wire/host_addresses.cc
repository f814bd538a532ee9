#include "wire/host_addresses.h"

#include <ifaddrs.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <net/if.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <utility>

namespace uroce::wire {

std::vector<IpAddress> UsableHostAddresses(std::vector<std::string>* ifnames) {
  std::vector<std::pair<IpAddress, std::string>> found;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) == 0) {
    for (ifaddrs* i = list; i != nullptr; i = i->ifa_next) {
      const auto a = IpAddressOf(i->ifa_addr);
      if (!a || (i->ifa_flags & IFF_UP) == 0 || (i->ifa_flags & IFF_LOOPBACK) != 0 || a->is_loopback()) continue;
      const bool link_local =
          a->is_v4() ? (a->v4() >> 16) == 0xa9fe : a->bytes()[0] == 0xfe && (a->bytes()[1] & 0xc0) == 0x80;
      if (!link_local) found.emplace_back(*a, i->ifa_name);
    }
    freeifaddrs(list);
  }
  std::sort(found.begin(), found.end());
  found.erase(std::unique(found.begin(), found.end(), [](const auto& x, const auto& y) { return x.first == y.first; }),
              found.end());
  std::vector<IpAddress> addresses;
  for (auto& [a, name] : found) {
    addresses.push_back(a);
    if (ifnames != nullptr) ifnames->push_back(std::move(name));
  }
  return addresses;
}

std::vector<IpAddress> OtherGids(const IpAddress& gid0) {
  std::vector<IpAddress> others;
  for (const IpAddress& a : UsableHostAddresses()) {
    if (a != gid0) others.push_back(a);
  }
  return others;
}

int OpenAddressChanges() {
  const int fd = socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC | SOCK_NONBLOCK, NETLINK_ROUTE);
  if (fd < 0) return -errno;
  sockaddr_nl sa{};
  sa.nl_family = AF_NETLINK;
  sa.nl_groups = RTMGRP_IPV4_IFADDR | RTMGRP_IPV6_IFADDR;
  if (bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) < 0) {
    const int err = errno;
    close(fd);
    return -err;
  }
  return fd;
}

bool TakeAddressChanges(int fd) {
  // What the messages say matters not: the list is read again whole.
  alignas(nlmsghdr) char buffer[8192];
  bool any = false;
  while (true) {
    const ssize_t n = recv(fd, buffer, sizeof buffer, 0);
    if (n > 0 || (n < 0 && errno == ENOBUFS)) {
      any = true;
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    return any;
  }
}

}  // namespace uroce::wire
