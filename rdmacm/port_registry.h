// rdma_cm ports of this host, without a daemon, files or privileges: a bound (port space, port) is an abstract UNIX
// socket name held open by the process that bound it (unix(7), "abstract namespace"). The kernel gives the port
// semantics for free: a second bind of the name fails, the name disappears when the process dies, and it is per
// network namespace like the kernel's own port spaces.
//
// Two names per binding: `uroce/cm/v1/<ps>/<port>` makes it exclusive (rdma_bind_addr); `uroce/cm/v1/<ps>/<port>@<device
// address>`, added by rdma_listen, tells a dialler on this host which uroce device listens there (it reads the names
// from the kernel's list of UNIX sockets), because every process owns its own device address (127.0.0.N) and the
// address dialled (127.0.0.1, 0.0.0.0) does not say which. Names held by users we do not trust are passed over
// (abstract_names.h): a stranger cannot send our diallers elsewhere.
#pragma once

#include <cstdint>
#include <optional>

#include "wire/address.h"

namespace uroce::rdmacm {

// Datagram rsockets' port space in the registry: ours, not one of rdma_cm's (0x0002, 0x0106, 0x0111, 0x013F); the
// tag of a binding is the rsocket's UD QPN.
inline constexpr uint16_t kRsocketDatagramPortSpace = 0x1111;

class PortBinding {
 public:
  PortBinding() = default;
  ~PortBinding() { Release(); }
  PortBinding(const PortBinding&) = delete;
  PortBinding& operator=(const PortBinding&) = delete;
  PortBinding(PortBinding&& o) noexcept;
  PortBinding& operator=(PortBinding&& o) noexcept;

  // Binds (ps, port). port 0 picks a free one in 32768-60999 (ip_local_port_range's default).
  // 0, or EADDRINUSE when the port is taken, EMFILE/ENFILE/ENOMEM from socket(2).
  int Bind(uint16_t port_space, uint16_t port);
  // Tells diallers on this host that `device` listens on the bound port, with a number of the binder's (`tag`: a
  // datagram rsocket's QPN). 0 or an errno of socket(2)/bind(2).
  int Publish(const wire::IpAddress& device, std::optional<uint32_t> tag = std::nullopt);
  void Release();
  bool bound() const { return exclusive_fd_ >= 0; }
  uint16_t port() const { return port_; }

 private:
  int exclusive_fd_ = -1;
  int info_fd_ = -1;
  uint16_t port_space_ = 0;
  uint16_t port_ = 0;
};

// The device address of whoever on this host listens on (ps, port), if anyone; and the tag it published.
struct PortOwner {
  wire::IpAddress device;
  std::optional<uint32_t> tag;
};
std::optional<wire::IpAddress> FindPortOwner(uint16_t port_space, uint16_t port);
std::optional<PortOwner> FindPortOwnerWithTag(uint16_t port_space, uint16_t port);

// Whether what FindPortOwnerWithTag found for (ps, port) still stands, without its listing of the host's UNIX sockets (~40 us
// on a host with a few hundred sockets: once per datagram, that was most of a datagram rsocket's send). The name the
// owner published holds its device and tag, so while that name exists, what is addressed to them reaches the port's
// holder; once it is gone, ask FindPortOwnerWithTag again. One system call.
class PortOwnerProbe {
 public:
  PortOwnerProbe() = default;
  ~PortOwnerProbe();
  PortOwnerProbe(const PortOwnerProbe&) = delete;
  PortOwnerProbe& operator=(const PortOwnerProbe&) = delete;

  bool StillPublished(uint16_t port_space, uint16_t port, const PortOwner& owner);

 private:
  int fd_ = -1;  // a datagram socket, connect(2)ed to each name asked about
};

}  // namespace uroce::rdmacm
