#include "rdmacm/port_registry.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>

#include "rdmacm/abstract_names.h"
#include "wire/unix_socket.h"

namespace uroce::rdmacm {
namespace {

constexpr uint16_t kEphemeralFirst = 32768, kEphemeralLast = 60999;  // Linux's ip_local_port_range default

std::string Prefix(uint16_t ps, uint16_t port) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "uroce/cm/v1/%04x/%u", ps, port);
  return buf;
}

// What rdma_listen and datagram rsockets publish for a binding: the prefix, the device and the tag.
std::string PublishedName(uint16_t ps, uint16_t port, const wire::IpAddress& device, std::optional<uint32_t> tag) {
  std::string name = Prefix(ps, port) + "@" + device.ToString();
  if (tag) name += "#" + std::to_string(*tag);
  return name;
}

// A socket bound to the abstract name `name`; -errno on failure.
int BindAbstract(const std::string& name) {
  const int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -errno;
  sockaddr_un sun;
  const socklen_t len = wire::AbstractUnixAddress(name, &sun);
  if (bind(fd, reinterpret_cast<sockaddr*>(&sun), len) != 0) {
    const int err = errno;
    close(fd);
    return -err;
  }
  return fd;
}

}  // namespace

PortBinding::PortBinding(PortBinding&& o) noexcept { *this = std::move(o); }

PortBinding& PortBinding::operator=(PortBinding&& o) noexcept {
  if (this != &o) {
    Release();
    exclusive_fd_ = o.exclusive_fd_;
    info_fd_ = o.info_fd_;
    port_space_ = o.port_space_;
    port_ = o.port_;
    o.exclusive_fd_ = o.info_fd_ = -1;
    o.port_ = 0;
  }
  return *this;
}

int PortBinding::Bind(uint16_t ps, uint16_t port) {
  Release();
  if (port == 0) {
    // Random start, then every port of the range once, as the kernel's cma_alloc_any_port.
    std::random_device rd;
    const uint32_t span = kEphemeralLast - kEphemeralFirst + 1;
    const uint32_t start = rd() % span;
    for (uint32_t i = 0; i < span; ++i) {
      const uint16_t p = static_cast<uint16_t>(kEphemeralFirst + (start + i) % span);
      const int err = Bind(ps, p);
      if (err != EADDRINUSE) return err;
    }
    return EADDRINUSE;
  }
  const int ex = BindAbstract(Prefix(ps, port));
  if (ex < 0) return -ex;
  exclusive_fd_ = ex;
  port_space_ = ps;
  port_ = port;
  return 0;
}

int PortBinding::Publish(const wire::IpAddress& device, std::optional<uint32_t> tag) {
  if (!bound()) return EINVAL;
  if (info_fd_ >= 0) return 0;
  const int info = BindAbstract(PublishedName(port_space_, port_, device, tag));
  if (info < 0) return -info;
  info_fd_ = info;
  return 0;
}

void PortBinding::Release() {
  if (exclusive_fd_ >= 0) close(exclusive_fd_);
  if (info_fd_ >= 0) close(info_fd_);
  exclusive_fd_ = info_fd_ = -1;
  port_ = 0;
}

std::optional<PortOwner> FindPortOwnerWithTag(uint16_t ps, uint16_t port) {
  // Only a name held by a trusted user (abstract_names.h): anyone may bind "<prefix>@<address>" to send diallers
  // somewhere else, but not as this user.
  const std::string want = Prefix(ps, port) + "@";
  for (const AbstractName& n : AbstractNamesWithPrefix(want)) {
    if (!Trusted(n)) continue;
    std::string addr = n.name.substr(want.size());
    PortOwner owner;
    if (const size_t hash = addr.find('#'); hash != std::string::npos) {
      owner.tag = uint32_t(std::strtoul(addr.c_str() + hash + 1, nullptr, 10));
      addr.resize(hash);
    }
    if (auto ip = wire::IpAddress::Parse(addr)) {
      owner.device = *ip;
      return owner;
    }
  }
  return std::nullopt;
}

PortOwnerProbe::~PortOwnerProbe() {
  if (fd_ >= 0) close(fd_);
}

bool PortOwnerProbe::StillPublished(uint16_t ps, uint16_t port, const PortOwner& owner) {
  if (fd_ < 0) fd_ = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd_ < 0) return false;  // the caller lists the names instead
  sockaddr_un sun;
  const socklen_t len = wire::AbstractUnixAddress(PublishedName(ps, port, owner.device, owner.tag), &sun);
  // A datagram socket's connect(2) only names its peer: it fails with ECONNREFUSED where nobody holds the name.
  return connect(fd_, reinterpret_cast<sockaddr*>(&sun), len) == 0;
}

std::optional<wire::IpAddress> FindPortOwner(uint16_t ps, uint16_t port) {
  if (auto owner = FindPortOwnerWithTag(ps, port)) return owner->device;
  return std::nullopt;
}

}  // namespace uroce::rdmacm
